#!/usr/bin/env python3
"""No stall (issue 44): what held each server's main thread during a grow 3 -> 4 of 3 x
`--grow-keys` keys, by the server's own latency monitor, per event.

Three servers with the module (n0 n1 n2, a ketama ring of the three, `shard.key-index` on unless
`--no-key-index`) hold 3 x grow-keys small strings between them, each only its own (as
bench/copy.py's grow: each populates the same names, a cleanup leaves it its own, then `DEBUG
RELOAD` leaves it the memory of its own keys, as after a restart: else its memory is that of
3 x grow-keys keys, whose page tables every fork copies; `--no-compact` keeps it), plus an
empty n3. Every server runs with `latency-monitor-threshold 5` (`LATENCY RESET` once filled);
one `SHARD.RESHARD START` of the four on n0 grows the fleet (the coordinator's plan, the rings
installed everywhere, the copies, the commit, the cleanups, the key index rebuilt for the new
ring), while a client on each server PINGs it every millisecond. Once the fleet is `done` (and
every index ready again), `LATENCY LATEST` of each server: every event over 5 ms, the module's
own (`shard-...`, `host::latency`) beside the server's (`command`, `fork`, ...), with its worst
and its count of seconds over the threshold; and each server's worst PING wait, a cross-check.
The machine's load average is printed beside them: on this 2-core machine other processes take
the CPU, and a step that waits for it shows longer than it worked.

Writes the section "No stall" into bench/results.md (`--no-write`: print only). Standard
library only.
"""

import argparse
import os
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as base  # noqa: E402
import fleet  # noqa: E402

cp = base.bench_copy()

RESULTS = base.ROOT / "bench" / "results.md"
SECTION = "## No stall: the main thread during a grow (issue 44)"
THRESHOLD_MS = 5


def start(name, key_index, copy_fork=None):
    port = base.free_port()
    log = base.TMP / f"stall-{name}.log"
    rdb = f"stall-{name}.rdb"  # its own, for DEBUG RELOAD (and none left from a run before)
    (base.TMP / rdb).unlink(missing_ok=True)
    argv = [base.REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", str(base.TMP), "--logfile", str(log),
            "--dbfilename", rdb, "--enable-debug-command", "yes", "--loglevel", "verbose",
            "--loadmodule", str(base.MODULE), "self", name]
    if key_index:
        argv += ["key-index", "yes"]
    if copy_fork:
        argv += ["copy-fork", copy_fork]
    return fleet.Proc(argv, port, None, log)


def cpu_pressure():
    """The share of the last 10 s in which some task waited for a CPU (%), or '?'."""
    try:
        line = Path("/proc/pressure/cpu").read_text().splitlines()[0]
        return dict(f.split("=") for f in line.split()[1:])["avg10"] + "%"
    except (OSError, KeyError, IndexError, ValueError):
        return "?"


EXPLAINED = re.compile(r"shard: step (\S+) took (\d+) ms: ([\d.]+) ms on the CPU, preempted (\d+) "
                       r"times, slept (\d+) times")


def explained(name, since):
    """The module's steps at or over the threshold that `name`'s log explains (`host::latency`,
    at the verbose level) from byte `since`: [(event, wall ms, CPU ms, preempted, slept)]."""
    with open(base.TMP / f"stall-{name}.log", "rb") as f:
        f.seek(since)
        text = f.read().decode(errors="replace")
    return [(m[1], int(m[2]), float(m[3]), int(m[4]), int(m[5]))
            for m in EXPLAINED.finditer(text)]


def log_size(name):
    p = base.TMP / f"stall-{name}.log"
    return p.stat().st_size if p.exists() else 0


def latest(c):
    """LATENCY LATEST as {event: (latest ms, max ms)}."""
    out = {}
    for row in c.call("LATENCY", "LATEST") or []:
        name = row[0].decode() if isinstance(row[0], bytes) else row[0]
        out[name] = (int(row[2]), int(row[3]))
    return out


def history_count(c, event):
    """Seconds in which `event` went over the threshold (LATENCY HISTORY keeps 160)."""
    return len(c.call("LATENCY", "HISTORY", event) or [])


def wait_index(cs, timeout=300):
    """Until every server's key index is ready (INFO shard's key_index line), or the time is up."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        phases = [next((v for k, v in c.info("shard").items() if k.endswith("key_index")),
                       "off") for c in cs]
        if all(p.strip() in ("ready", "off") for p in phases):
            return phases
        time.sleep(0.05)
    return phases


def total_forks(c):
    return int(c.info("stats").get("total_forks", 0))


def copy_passes(c):
    """(passes forked, passes in steps) of the node's last copy (INFO shard)."""
    info = {k.removeprefix("shard_"): v for k, v in c.info("shard").items()}
    return (int(info.get("reshard_passes_forked", 0)), int(info.get("reshard_passes_stepped", 0)))


def grow_round(keys, key_index, compact, copy_fork=None):
    names = ("n0", "n1", "n2", "n3")
    procs = []
    try:
        for n in names:
            procs.append(start(n, key_index, copy_fork))
        cs = [p.client() for p in procs]
        nodes = list(zip(names, procs))
        for c in cs:
            c.call("SHARD.RING", "SET", *cp.ring(nodes[:3]))
        held = cp.fill_old(cs[:3], keys)
        wait_index(cs)
        if compact:
            # Each old node populated 3 x keys and deleted two thirds: its memory is as large as
            # 3 x keys' (the survivors are spread over every page), and a fork copies the page
            # tables of all of it. `DEBUG RELOAD` (save, empty, load) leaves the memory of the
            # keys it holds, as a node of `keys` keys has after a restart.
            for c in cs[:3]:
                c.call("DEBUG", "RELOAD")
            wait_index(cs)
        for c in cs:
            c.call("CONFIG", "SET", "latency-monitor-threshold", THRESHOLD_MS)
            c.call("LATENCY", "RESET")
        forks_before = [total_forks(c) for c in cs]
        logs_from = [log_size(n) for n in names]
        pingers = [cp.Pinger(p.port) for p in procs]
        for p in pingers:
            p.start()
        load_before = os.getloadavg()
        psi_before = cpu_pressure()
        t0 = time.perf_counter()
        reply = cs[0].call("SHARD.RESHARD", "START", *cp.ring(nodes))
        if reply not in (b"OK", "OK"):
            sys.exit(f"stall: START said {reply}")
        deadline = time.monotonic() + 900
        passes = [(0, 0)] * len(cs)
        polled = 0.0
        while (phase := cp.fleet_phase(cs[0])) != b"done":
            if phase == b"cancelled" or time.monotonic() > deadline:
                sys.exit(f"stall: the fleet ended {phase}")
            if time.monotonic() - polled > 0.1:
                # (A node's counts are its last job's: the cleanup's replace the copy's.)
                polled = time.monotonic()
                passes = [max(p, copy_passes(c)) for p, c in zip(passes, cs)]
            time.sleep(0.01)
        wall = time.perf_counter() - t0
        phases = wait_index(cs)
        time.sleep(0.5)
        pings = [p.finish() for p in pingers]
        load_after = os.getloadavg()
        psi_after = cpu_pressure()
        sizes = [c.call("DBSIZE") for c in cs]
        if sum(sizes) != sum(held):
            sys.exit(f"stall: DBSIZE {sizes}, held {held} before")
        forks = [(int(c.info("stats").get("latest_fork_usec", 0)) / 1000,
                  int(c.info("memory").get("used_memory_rss", 0)) >> 20,
                  total_forks(c) - before, p) for c, before, p in zip(cs, forks_before, passes)]
        events = {}
        steps = {name: explained(name, since) for name, since in zip(names, logs_from)}
        for name, c in zip(names, cs):
            for event, (_, worst) in latest(c).items():
                why = [s for s in steps[name] if s[0] == event]
                events[(name, event)] = (worst, history_count(c, event),
                                         max(why, key=lambda s: (s[1], s[2])) if why else None)
        return dict(wall_s=wall, sizes=sizes, pings=pings, events=events, phases=phases, forks=forks,
                    steps=[s for n in names for s in steps[n]],
                    load=(load_before[0], load_after[0]), psi=(psi_before, psi_after))
    finally:
        for p in procs:
            p.stop()
        for n in names:
            (base.TMP / f"stall-{n}.rdb").unlink(missing_ok=True)


def report(r, names=("n0", "n1", "n2", "n3")):
    lines = [f"grow of {sum(r['sizes']):,} keys, {r['sizes'][3]:,} moved, {r['wall_s']:.1f} s; "
             f"load average {r['load'][0]:.1f} before, {r['load'][1]:.1f} after (2 cores); "
             f"CPU pressure (some avg10, /proc/pressure/cpu) {r['psi'][0]} before, "
             f"{r['psi'][1]} after", "",
             "| server | event | worst ms | seconds over 5 ms | the worst step: CPU ms, times "
             "preempted, times slept |", "|---|---|---|---|---|"]
    for (name, event), (worst, count, why) in sorted(r["events"].items()):
        how = f"{why[2]:.2f}, {why[3]}, {why[4]}" if why else ""
        lines.append(f"| {name} | {event} | {worst} | {count} | {how} |")
    if not r["events"]:
        lines.append("| all | (none over 5 ms) | | | |")
    steps = [s for s in r["steps"] if s[0] != "shard-timer"]
    if steps:
        lines += ["", f"The module's steps at or over 5 ms (its log; `shard-timer`, which wraps "
                  f"the others, left out): {len(steps)}, the longest {max(s[1] for s in steps)} "
                  f"ms; on the CPU at most {max(s[2] for s in steps):.2f} ms; preempted in "
                  f"{sum(1 for s in steps if s[3])}, asleep (a lock, a blocking call) in "
                  f"{sum(1 for s in steps if s[4])}."]
    lines += ["", "| server | PING p99 ms | PING worst ms | forks during the grow | last fork ms "
              "| copy passes forked / in steps | RSS MB |", "|---|---|---|---|---|---|---|"]
    for name, (p99, worst), (fork_ms, rss, n, (forked, stepped)) in zip(names, r["pings"],
                                                                        r["forks"]):
        lines.append(f"| {name} | {p99:.2f} | {worst:.2f} | {n} | {fork_ms:.1f} | "
                     f"{forked} / {stepped} | {rss} |")
    return lines


def write_section(lines):
    text = RESULTS.read_text() if RESULTS.exists() else ""
    body = SECTION + "\n\n" + "\n".join(lines) + "\n"
    if SECTION in text:
        head, rest = text.split(SECTION, 1)
        nxt = rest.find("\n## ")
        text = head + body + (rest[nxt + 1:] if nxt >= 0 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + body
    RESULTS.write_text(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grow-keys", type=int, default=1_000_000,
                    help="keys on each of the three old nodes")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--no-key-index", action="store_true")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--copy-fork", choices=("yes", "no", "auto"),
                    help="shard.copy-fork on every server (default: the module's, auto)")
    ap.add_argument("--no-compact", action="store_true",
                    help="no DEBUG RELOAD of the old nodes after the fill (their memory stays "
                         "that of 3 x grow-keys keys)")
    opts = ap.parse_args()
    base.TMP.mkdir(parents=True, exist_ok=True)
    out = [f"`python3 bench/stall.py --grow-keys {opts.grow_keys}` on "
           f"{base.first_line([base.REDIS_SERVER, '--version'])}, key index "
           f"{'off' if opts.no_key_index else 'on'}, `shard.copy-fork "
           f"{opts.copy_fork or 'auto'}`: `SHARD.RESHARD START` 3 -> 4 with "
           f"`latency-monitor-threshold {THRESHOLD_MS}` on every server; `LATENCY LATEST` per "
           "server and event (the module's own events are `shard-...`), and a PING every ms. "
           "The last column: where the worst step of the event went, from the module's own log "
           "line (`host::latency`, at `loglevel verbose`): its CPU time, the times the kernel "
           "preempted it, the times it slept (bench/findings.md, \"No stall\"). Earlier runs "
           "are in git history."]
    for i in range(opts.rounds):
        print(f"round {i + 1} ...", flush=True)
        r = grow_round(opts.grow_keys, not opts.no_key_index, not opts.no_compact, opts.copy_fork)
        lines = report(r)
        print("\n".join(lines), flush=True)
        out += ["", f"Round {i + 1}:", ""] + lines
    if not opts.no_write:
        write_section(out)


if __name__ == "__main__":
    main()
