#!/usr/bin/env python3
"""Two builds of the module, the same bench rows, one run (issue 31: "behaviour unchanged").

Issue 31 restructures src/ without changing what the module does; this script says whether the
speed stayed the same. It takes two builds of the module (`--before`, `--after`) and measures
both, side by side in one run on one server binary (REDIS_SERVER, default redis-server), with
the very machinery of the other bench scripts, so that each row is the row `make bench` reports:

- SHARD.GENKEY, -c 50 -P 1 and -P 32, and SHARD.WHEREIS on a ketama and on a slots ring of 1000
  nodes, -P 32: bench/run.py's rows (its Server pinned to CPU 0, redis-benchmark to CPU 1, its
  Row and set_ring), one server per build;
- SHARD.CALL GET via n0, -P 1 and -P 16: bench/fleet.py's rows (a ketama fleet n0 n1 n2 of
  100 000 keys, `-r 100000`, so two keys in three are forwarded by n0), one fleet per build;
- redis-benchmark --cluster GET and SET, -P 16: fleet.py's cluster-client rows (a fleet of three
  on a slots ring with shard.cluster-protocol yes), one fleet per build; the rate is read from
  redis-benchmark's progress ticks, not from its CSV figure (see ClusterRow: that figure is
  `-n` over a whole number of 250 ms ticks);
- SHARD.RESHARD COPY and CLEANUP of `--keys` keys (three quarters of them move): bench/copy.py's
  shard round, fresh servers of the build each time.

Rounds are interleaved: in every round each row runs for one build, then at once for the other,
before the next row; odd rounds run the rows in one order with `before` first, even rounds the
reverse order with `after` first, so a machine that speeds up or slows down favours neither.

For each row: the medians of both builds, the ratio after/before (the median of the rounds'
ratios), the range of those ratios, a 90% confidence interval of that median (the sign test's
order statistics), and the round-to-round spread of one build against itself (the median of
|x(round i+1) / x(round i) - 1| over both builds): how much the same build moves between rounds.
Verdict per row: "within noise" when the confidence interval holds 1.0, or when the shift
|ratio - 1| is under the round-to-round spread of the same build; otherwise how much faster or
slower `after` is.

Writes the section "Before and after the restructure (issue 31)" into bench/results.md (in place
of an older one; other sections are left alone), and exits 1 when a row is not within noise.
bench/run.py rewrites results.md whole, so run this after `make bench`, not before. About seven
minutes on a 2-core machine with the defaults. Standard library only; `--help` lists the knobs.
Example: `python3 bench/compare.py --before /tmp/baseline/libshard.so --before-label 99de2d6`
(after: target/release/libshard.so); the same file twice is a same-build check of the noise.
"""

import argparse
import hashlib
import importlib.util
import math
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import run as base  # noqa: E402  (servers, pinning, redis-benchmark rows, rings, the machine)
import fleet  # noqa: E402  (the fleets, their redis-benchmark rows, write_section)


def _load(name, file):
    """bench/<file> as module `name` (bench/copy.py must not be imported as `copy`: that name
    is the standard library's)."""
    spec = importlib.util.spec_from_file_location(name, HERE / file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


copybench = _load("copy_bench", "copy.py")  # the resharding rounds

ROOT = base.ROOT
RESULTS = ROOT / "bench" / "results.md"
SECTION = "## Before and after the restructure (issue 31)"
WHEREIS_KEY = base.GET_KEY
CONFIDENCE = 0.90
TICKED_SECONDS = 1.5  # the cluster-client runs: six ticks, four of them measured

# Row groups in the order of odd rounds; each group is measured by one step per build.
GROUPS = ["genkey1", "genkey32", "whereis_ketama", "whereis_slots", "call_get1", "call_get16",
          "cluster_get16", "cluster_set16", "copy"]
LOCAL = {"genkey1", "genkey32", "whereis_ketama", "whereis_slots"}
RING_OF = {"whereis_ketama": "ketama", "whereis_slots": "slots"}


class Build:
    """One build of the module and everything started with it."""

    def __init__(self, name, path, label):
        self.name, self.path, self.label = name, Path(path).resolve(), label
        self.server = None  # run.py's Server: the GENKEY and WHEREIS rows
        self.ring = None  # the ring the server holds now
        self.rows = {}  # group -> run.Row or fleet.Row
        self.procs = []  # the fleets' servers

    def use(self):
        """Servers started from now on load this build (run.py, fleet.py and copy.py all read
        run.MODULE when they start a server)."""
        base.MODULE = self.path

    def describe(self):
        data = self.path.read_bytes()
        stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(self.path.stat().st_mtime))
        return (f"`{self.path}` ({self.label or 'no label given'}; sha256 "
                f"{hashlib.sha256(data).hexdigest()[:16]}, {len(data):,} bytes, built {stamp})")

    def stop(self):
        if self.server:
            self.server.stop()
        for p in self.procs:
            p.stop()


class ClusterRow(fleet.Row):
    """fleet.py's cluster-client row, with its rate read from redis-benchmark's progress ticks.

    `redis-benchmark --cluster` runs one thread per master, and a threaded run only notices it
    is done at its next 250 ms tick, so the figure its CSV reports is `-n` over a whole number
    of ticks: fleet.py sizes runs to about 0.25 s and reads 500 k req/s for the fleet and the
    real cluster alike, whatever they do (on this machine such a run goes at about 1.1 M). The
    progress lines it prints every tick carry the rate of that tick; this row's rate is the
    mean of the ticks between the first (connecting) and the last (which ends idle), so a run
    lasts at least TICKED_SECONDS."""

    def ticked(self, n):
        argv = ["redis-benchmark", "-h", "127.0.0.1", "-p", str(self.port), "-c", "50", "-n",
                str(n), "-P", str(self.pipeline), "-r", str(fleet.KEYS)] + self.command
        run = subprocess.run(argv, capture_output=True, text=True)
        if run.returncode != 0:
            self.error = ((run.stderr or run.stdout).strip().splitlines() or ["no output"])[-1]
            return None
        ticks = [float(x) for x in re.findall(r"rps=([0-9.]+) \(overall", run.stdout)]
        return statistics.mean(ticks[1:-1]) if len(ticks) >= 3 else None

    def calibrate(self, seconds):
        n = 100_000
        while True:
            got = self.ticked(n)
            if self.error:
                return
            if got:
                break
            n *= 4
        self.n = max(n, int(got * max(seconds, TICKED_SECONDS)))

    def run(self):
        if self.error:
            return
        got = self.ticked(self.n)
        if got is None and not self.error:
            self.error = f"fewer than three ticks in a run of {self.n} requests"
        if got:
            self.runs.append((got, 0.0, 0.0))


def loaded_path(port):
    """The path of the shard module a server has loaded (MODULE LIST)."""
    c = base.Client(port)
    try:
        for entry in c.call("MODULE", "LIST"):
            fields = dict(zip(entry[::2], entry[1::2]))
            if fields.get(b"name") == b"shard":
                return fields.get(b"path", b"?").decode()
    finally:
        c.close()
    return None


def check_loaded(build, ports):
    for port in ports:
        got = loaded_path(port)
        if got is not None and Path(got).resolve() != build.path:
            sys.exit(f"the {build.name} server on port {port} loaded {got}, not {build.path}")


def start(build, groups, pin):
    """The servers and fleets of one build, for the groups asked for."""
    build.use()
    ports = []
    if groups & LOCAL:
        build.server = base.Server(pin, base.REDIS_SERVER)
        base.set_ring(build.server.port, "ketama", 1000)
        build.ring = "ketama"
        ports.append(build.server.port)
        for key, label, command, pipeline in (
                ("genkey1", "SHARD.GENKEY", ["SHARD.GENKEY"], 1),
                ("genkey32", "SHARD.GENKEY", ["SHARD.GENKEY"], 32),
                ("whereis_ketama", "SHARD.WHEREIS, ketama 1000 nodes",
                 ["SHARD.WHEREIS", WHEREIS_KEY], 32),
                ("whereis_slots", "SHARD.WHEREIS, slots 1000 nodes",
                 ["SHARD.WHEREIS", WHEREIS_KEY], 32)):
            if key in groups:
                build.rows[key] = base.Row(label, command, pipeline)
    if groups & {"call_get1", "call_get16"}:
        nodes, spread = fleet.ketama_fleet(build.procs, tag=f"{build.name}-")
        print(f"{build.name}: ketama fleet n0..n2 holds {spread}", flush=True)
        n0 = nodes["n0"].port
        ports.append(n0)
        get = ["SHARD.CALL", "GET", "key:__rand_int__"]
        for key, pipeline in (("call_get1", 1), ("call_get16", 16)):
            if key in groups:
                build.rows[key] = fleet.Row(f"SHARD.CALL GET via n0, -P {pipeline}", n0, get,
                                            pipeline)
    if groups & {"cluster_get16", "cluster_set16"}:
        proto = fleet.protocol_fleet(build.procs, tag=f"{build.name}-")
        ports.append(proto["n0"].port)
        for key, what in (("cluster_get16", "get"), ("cluster_set16", "set")):
            if key in groups:
                build.rows[key] = ClusterRow(
                    f"redis-benchmark --cluster {what.upper()} over the fleet (cluster protocol), "
                    "-P 16", proto["n0"].port, ["--cluster", "-t", what], 16)
    check_loaded(build, ports)


def calibrate(builds, pin, seconds):
    """Sizes every row on the first build and gives the second the same -n."""
    first, second = builds
    first.use()
    for key, row in first.rows.items():
        if key in RING_OF:
            set_ring(first, RING_OF[key])
        if isinstance(row, base.Row):
            row.calibrate(first.server, pin, seconds)
        else:
            row.calibrate(seconds)
            if row.error:
                sys.exit(f"{row.label} ({first.name}) failed: {row.error}")
        second.rows[key].n = row.n


def set_ring(build, algo):
    if build.ring != algo:
        base.set_ring(build.server.port, algo, 1000)
        build.ring = algo


def step(build, group, pin, keys):
    """One run of a group on one build: {measure: rate}, plus the copy's counts."""
    build.use()
    if group == "copy":
        d = copybench.shard_round(keys)
        return {"copy": d["copied"] / d["copy_s"], "cleanup": d["deleted"] / d["clean_s"],
                "_copied": d["copied"], "_deleted": d["deleted"]}
    row = build.rows[group]
    if isinstance(row, base.Row):
        if group in RING_OF:
            set_ring(build, RING_OF[group])
        return {group: row.run(build.server, pin)}
    row.run()
    if row.error:
        sys.exit(f"{row.label} ({build.name}) failed: {row.error}")
    return {group: row.runs[-1][0]}


# --------------------------------------------------------------------------- statistics


def sign_interval(ratios):
    """The order statistics that bound the median with at least CONFIDENCE (sign test), and the
    coverage they reach; the whole range when there are too few rounds for that."""
    s, n = sorted(ratios), len(ratios)
    k, coverage = 1, 1 - 2 * 0.5 ** n  # (min, max)
    for j in range(2, n // 2 + 1):
        cov = 1 - 2 * sum(math.comb(n, i) for i in range(j)) / 2 ** n
        if cov < CONFIDENCE:
            break
        k, coverage = j, cov
    return s[k - 1], s[n - k], coverage


def round_to_round(series):
    """The median of |x(i+1) / x(i) - 1| over every build's series: how much one build's figure
    moves from one round to the next."""
    steps = [abs(b / a - 1) for xs in series for a, b in zip(xs, xs[1:]) if a > 0]
    return statistics.median(steps) if steps else float("nan")


def verdict(ratio, low, high, spread):
    shift = ratio - 1
    if low <= 1.0 <= high:
        return "within noise"
    if abs(shift) <= spread:
        return f"within noise (shift {100 * shift:+.1f}% under the {100 * spread:.1f}% spread)"
    return f"**NOT within noise: after {100 * abs(shift):.1f}% {'faster' if shift > 0 else 'slower'}**"


# --------------------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default=os.environ.get("BEFORE_MODULE"),
                    help="the module before the change (default: $BEFORE_MODULE)")
    ap.add_argument("--after", default=os.environ.get("AFTER_MODULE") or str(
        ROOT / "target" / "release" / "libshard.so"),
                    help="the module after it (default: $AFTER_MODULE or target/release/libshard.so)")
    ap.add_argument("--before-label", default=os.environ.get("BEFORE_LABEL", ""),
                    help="what the before build is, e.g. its commit (default: $BEFORE_LABEL)")
    ap.add_argument("--after-label", default=os.environ.get("AFTER_LABEL"),
                    help="what the after build is (default: $AFTER_LABEL, or this checkout's "
                         "commit when --after is under target/)")
    ap.add_argument("--rounds", type=int, default=10, help="interleaved rounds (default 10)")
    ap.add_argument("--seconds", type=float, default=1.0,
                    help="length of one redis-benchmark run (default 1)")
    ap.add_argument("--keys", type=int, default=1_000_000,
                    help="keys on the copy's source, three quarters of which move (default 1M)")
    ap.add_argument("--quiet-wait", type=float, default=5,
                    help="before each round, wait up to this many seconds for other processes to "
                         "leave the CPUs idle (default 5)")
    ap.add_argument("--no-pin", action="store_true",
                    help="do not pin the GENKEY/WHEREIS server and its client to CPUs")
    ap.add_argument("--rows", default=",".join(GROUPS),
                    help=f"which rows (comma-separated; default all: {','.join(GROUPS)})")
    ap.add_argument("--out", default=str(RESULTS), help="the results file (default bench/results.md)")
    opts = ap.parse_args()
    if not opts.before:
        ap.error("give the module before the change: --before PATH or BEFORE_MODULE=PATH "
                 "(e.g. /tmp/baseline/libshard.so)")
    groups = set(opts.rows.split(","))
    if groups - set(GROUPS):
        ap.error(f"unknown rows {sorted(groups - set(GROUPS))}; known: {','.join(GROUPS)}")
    if opts.rounds < 2:
        ap.error("at least two rounds")
    for path in (opts.before, opts.after):
        if not Path(path).is_file():
            sys.exit(f"{path} is missing")
    after_label = opts.after_label
    if after_label is None:
        after_label = ""
        if Path(opts.after).resolve().is_relative_to(ROOT / "target"):
            commit = base.first_line(["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"])
            dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "src"],
                                   capture_output=True, text=True).stdout
            after_label = f"this checkout, HEAD {commit}" + (
                " with uncommitted changes in src/" if dirty else "")
    pin = not opts.no_pin
    builds = [Build("before", opts.before, opts.before_label),
              Build("after", opts.after, after_label)]
    same_file = builds[0].path.read_bytes() == builds[1].path.read_bytes()
    started = time.time()
    base.TMP.mkdir(parents=True, exist_ok=True)
    order = [g for g in GROUPS if g in groups]
    rates = {b.name: {} for b in builds}  # build -> measure -> [rate per round]
    counts = {b.name: {"_copied": set(), "_deleted": set()} for b in builds}
    try:
        for b in builds:
            start(b, groups, pin)
        print(f"sizing runs of ~{opts.seconds:g} s on the before build", flush=True)
        calibrate(builds, pin, opts.seconds)
        for r in range(1, opts.rounds + 1):
            base.wait_for_quiet(opts.quiet_wait)
            seq = order if r % 2 else order[::-1]
            pair = builds if r % 2 else builds[::-1]
            for group in seq:
                for b in pair:
                    for k, v in step(b, group, pin, opts.keys).items():
                        if k.startswith("_"):
                            counts[b.name][k].add(v)
                        else:
                            rates[b.name].setdefault(k, []).append(v)
            print(f"round {r}/{opts.rounds} ({time.time() - started:.0f} s): " + "  ".join(
                f"{k}={base.rate(rates['before'][k][-1])}/{base.rate(rates['after'][k][-1])}"
                for k in rates["before"]), flush=True)
    finally:
        for b in builds:
            b.stop()
    elapsed = time.time() - started

    # ------------------------------------------------------------------ the table
    labels = {k: row for k, row in builds[0].rows.items()}
    names = {"copy": f"SHARD.RESHARD COPY of {opts.keys:,} keys (keys/s)",
             "cleanup": "SHARD.RESHARD CLEANUP after it (keys/s)"}
    for k, row in labels.items():
        clients = f"-c {row.clients} " if isinstance(row, base.Row) else ""
        names[k] = (row.label if "-P" in row.label else
                    f"{row.label}, {clients}-P {row.pipeline}") + " (req/s)"
    table, verdicts = [], []
    for k in rates["before"]:
        bef, aft = rates["before"][k], rates["after"][k]
        ratios = [a / b for a, b in zip(aft, bef)]
        ratio = statistics.median(ratios)
        low, high, coverage = sign_interval(ratios)
        spread = round_to_round([bef, aft])
        v = verdict(ratio, low, high, spread)
        verdicts.append(v)
        table.append(f"| {names[k]} | {base.rate(statistics.median(bef))} | "
                     f"{base.rate(statistics.median(aft))} | {ratio:.3f} | "
                     f"{min(ratios):.3f} – {max(ratios):.3f} | {low:.3f} – {high:.3f} "
                     f"({100 * coverage:.0f}%) | ±{100 * spread:.1f}% | {v} |")
    background = [x for b in builds for row in b.rows.values() if isinstance(row, base.Row)
                  for x in row.background]
    copy_note = ""
    if "copy" in groups:
        c = {b.name: (sorted(counts[b.name]["_copied"]), sorted(counts[b.name]["_deleted"]))
             for b in builds}
        same = c["before"] == c["after"]
        counted = {b: " / ".join(", ".join(f"{x:,}" for x in xs) for xs in c[b]) for b in c}
        copy_note = (f" Keys copied / deleted in a copy round: before {counted['before']}, after "
                     f"{counted['after']}" + (" (the same)." if same else " (**they differ**)."))
    machine = [(k, v) for k, v in base.machine() if k not in ("module commit", "module")]
    lines = [SECTION, "",
             f"Written by `bench/compare.py`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
             f"in {elapsed:.0f} s: {opts.rounds} interleaved rounds (each row runs for one build, "
             "then at once for the other; odd rounds run the rows in one order with `before` "
             "first, even rounds the reverse with `after` first), redis-benchmark runs of about "
             f"{opts.seconds:g} s. The rows are `make bench`'s: GENKEY and WHEREIS as bench/run.py "
             "measures them (server " + ("pinned to CPU 0, redis-benchmark to CPU 1" if pin else
                                         "not pinned") +
             "), SHARD.CALL and the cluster clients as bench/fleet.py does (a ketama fleet of "
             "three holding 100 000 keys, `-c 50 -r 100000`, two keys in three forwarded by n0; "
             "a slots fleet of three with the cluster protocol, its rate the mean of "
             "redis-benchmark's 250 ms progress ticks but the first and the last, since the "
             "figure of a threaded `--cluster` run is `-n` over a whole number of ticks), "
             "the copy as bench/copy.py does "
             "(fresh servers each round, three quarters of the keys move)." + copy_note, ""]
    if same_file:
        lines += ["**Same-build check: `before` and `after` are the same file, so every "
                  "difference below is noise.**", ""]
    lines += [f"- before: {builds[0].describe()}", f"- after: {builds[1].describe()}"]
    lines += [f"- {k}: {v}" for k, v in machine]
    if background:
        lines.append(f"- CPU used by other processes during the GENKEY and WHEREIS runs: median "
                     f"{base.pct(statistics.median(background))}, largest "
                     f"{base.pct(max(background))}")
    lines += ["",
              "Ratio: the median of the rounds' after/before ratios. Interval: the sign test's "
              f"interval of that median (at least {100 * CONFIDENCE:.0f}% when the rounds allow). "
              "Spread: how much one build's figure moves from one round to the next (the median "
              "of |x(i+1)/x(i) - 1|, both builds). Within noise: the interval holds 1.0, or the "
              "shift |ratio - 1| is under the spread.", "",
              "| row | before | after | after/before | range of the rounds' ratios | interval "
              "| spread | verdict |", "|---|---|---|---|---|---|---|---|"]
    lines += table
    lines += ["", f"Every run ({', '.join(['before', 'after'])} per round):", "",
              "| row | before | after |", "|---|---|---|"]
    for k in rates["before"]:
        lines.append(f"| {names[k]} | {', '.join(base.rate(x) for x in rates['before'][k])} | "
                     f"{', '.join(base.rate(x) for x in rates['after'][k])} |")
    section = "\n".join(lines) + "\n"
    fleet.write_section(Path(opts.out), SECTION, section)
    print("\n" + section)
    bad = sum(not v.startswith("within noise") for v in verdicts)
    print(f"{len(verdicts) - bad} rows within noise, {bad} not; {elapsed:.0f} s; written to "
          f"{opts.out}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
