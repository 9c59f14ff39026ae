#!/usr/bin/env python3
"""Routing for unchanged clients (issue 43, `shard.route-plain yes`), side by side with its
baselines in interleaved rounds, as ratios:

- plain GET and SET of local keys on a server with the module, a ring of itself and
  `route-plain yes`, against the same commands on a server without the module (-P 16);
- plain GET and SET through n0 of a three-node ketama fleet with `route-plain yes` (keys
  spread over the three, two thirds elsewhere), against twemproxy in front of the same three
  (-P 1 and -P 16);
- DBSIZE through n0 of the fleet (answered from every node) against DBSIZE on one plain server;
- RENAME between two owners through n0 of the fleet (gathered), against RENAME on one plain
  server, 50 clients each with a pair of its own renamed back and forth (bench/floor/rename.c,
  built here with gcc: redis-benchmark cannot repeat a RENAME); two fleet rows: the pair's
  owners n1 and n2 (n0 owns neither: the general case, the target's row) and n0 and n1.
  `--only rename` runs these rows alone.

The servers, twemproxy and redis-benchmark are bench/fleet.py's (`redis-benchmark -c 50 -r
100000`). Writes the section "Routing for unchanged clients" into bench/results.md.
Standard library only.
"""

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fleet as fl  # noqa: E402  (servers, twemproxy, redis-benchmark rows)
import run as base  # noqa: E402

SECTION = "## Routing for unchanged clients (issue 43)"


def fill_scan(c, prefix, n, routed):
    """n keys `prefix:i` through client `c` (SHARD.CALL MSET, split by owner, when routed)."""
    for i in range(0, n, 1000):
        args = ["SHARD.CALL", "MSET"] if routed else ["MSET"]
        for k in range(i, min(n, i + 1000)):
            args += [f"{prefix}:{k}", "x"]
        c.call(*args)


RENAME_CLIENTS = 50


def build_rename():
    """bench/floor/rename.c, the RENAME driver, built with gcc into bench/tmp."""
    out = base.TMP / "rename"
    done = subprocess.run(["gcc", "-O2", "-o", str(out), str(fl.ROOT / "bench" / "floor" / "rename.c")],
                          capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"rename.c did not build: {done.stderr}")
    return out


def rename_pairs(c0, owners, prefix, n=RENAME_CLIENTS):
    """n pairs (a, b): a owned by owners[0], b by owners[1], as n0 (`c0`) says."""
    found = {o: [] for o in owners}
    i = 0
    while any(len(v) < n for v in found.values()):
        k = f"{prefix}:{i}"
        o = c0.call("SHARD.WHEREIS", k).decode()
        if o in found and len(found[o]) < n:
            found[o].append(k)
        i += 1
    return list(zip(found[owners[0]], found[owners[1]]))


class RenameRow:
    """A row of the RENAME driver: `pairs` renamed back and forth through `port`."""

    def __init__(self, label, port, pairs, driver, name):
        self.label, self.port, self.driver = label, port, driver
        self.pipeline, self.n = 1, 0
        self.file = base.TMP / f"rename-{name}.txt"
        self.file.write_text("".join(f"{a} {b}\n" for a, b in pairs))
        self.runs, self.error, self.seconds = [], None, 1.0

    def calibrate(self, seconds):
        self.seconds = seconds
        self.run()
        self.runs.clear()

    def run(self):
        if self.error:
            return
        argv = [str(self.driver), str(self.port), str(self.seconds), str(self.file)]
        done = subprocess.run(base.pinned(1 if fl.PIN else None, argv), capture_output=True, text=True)
        words = done.stdout.split()
        if done.returncode != 0 or len(words) != 4:
            self.error = (done.stderr or done.stdout).strip() or "no output"
            return
        rps, p50, p99, errors = float(words[0]), float(words[1]), float(words[2]), int(words[3])
        self.n = int(rps * self.seconds)
        if errors > 1:
            # One is expected: a run may start with its pair the other way round.
            print(f"{self.label}: {errors} error replies: {done.stderr.strip()}", flush=True)
        self.runs.append((rps, p50, p99))

    def median(self, i):
        return statistics.median(r[i] for r in self.runs)


def walk(port):
    """Keys per second of one full SCAN COUNT 1000 walk through `port`, and the keys seen."""
    c = base.Client(port)
    seen, cursor, started = 0, b"0", time.perf_counter()
    while True:
        reply = c.call("SCAN", cursor, "COUNT", 1000)
        cursor, keys = reply[0], reply[1]
        seen += len(keys)
        if cursor == b"0":
            break
    elapsed = time.perf_counter() - started
    c.close()
    return seen / elapsed, seen


def scan_rows(n0, plain, keys, rounds):
    """The SCAN row: `keys` more keys in the fleet (through n0) and in the plain server, then
    full walks of each, interleaved; (fleet keys/s, plain keys/s) per round."""
    fill_scan(n0.client(), "scan", keys, routed=True)
    fill_scan(plain.client(), "scan", keys, routed=False)
    out = []
    for r in range(rounds):
        pair = [walk(n0.port), walk(plain.port)] if r % 2 == 0 else \
            list(reversed([walk(plain.port), walk(n0.port)]))
        (f, fn), (p, pn) = pair
        if fn != pn:
            print(f"SCAN saw {fn} keys through the fleet, {pn} on the plain server", flush=True)
        out.append((f, p))
        print(f"scan round {r + 1}/{rounds}: fleet {base.rate(f)} keys/s, one server {base.rate(p)} keys/s", flush=True)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--out", default=str(fl.RESULTS))
    ap.add_argument("--scan-keys", type=int, default=1_000_000)
    ap.add_argument("--scan-rounds", type=int, default=3)
    ap.add_argument("--only", choices=["rename"], help="run only these rows (no table written)")
    opts = ap.parse_args()
    started = time.time()
    if subprocess.run(["which", "nutcracker"], capture_output=True).returncode != 0:
        sys.exit("nutcracker is missing: `make bench` installs it (Debian's nutcracker)")
    base.TMP.mkdir(parents=True, exist_ok=True)
    procs = []
    try:
        nodes, spread = fl.ketama_fleet(procs)
        for s in nodes.values():
            s.client().call("CONFIG", "SET", "shard.route-plain", "yes")
        twem = fl.nutcracker(nodes, 0)
        procs.append(twem)
        local = fl.server("n0", 0)
        plain = fl.server("plain", 0, module=False)
        procs += [local, plain]
        lc = local.client()
        lc.call("SHARD.RING", "SET", "ketama", "n0", f"127.0.0.1:{local.port}", 1)
        lc.call("CONFIG", "SET", "shard.route-plain", "yes")
        for s in (local, plain) if not opts.only else ():
            c = s.client()
            for i in range(0, fl.KEYS, 1000):
                args = ["MSET"]
                for k in range(i, i + 1000):
                    args += [b"key:%012d" % k, b"xxxxxxxx"]
                c.call(*args)
            c.close()
        n0, tw = nodes["n0"].port, twem.port
        # Two keys of two other owners, for the gathered COPY.
        c0 = nodes["n0"].client()
        owned = {}
        for i in range(200):
            k = f"g:{i}"
            owned.setdefault(c0.call("SHARD.WHEREIS", k).decode(), k)
        ka, kb = owned["n1"], owned["n2"]
        c0.call("SET", ka, "xxxxxxxx")
        plain.client().call("SET", ka, "xxxxxxxx")
        get, set_ = ["GET", "key:__rand_int__"], ["SET", "key:__rand_int__", "xxxxxxxx"]
        Row = fl.Row
        rows = {
            "local_get16": Row("route-plain GET, keys all local, -P 16", local.port, get, 16),
            "plain_get16": Row("GET on a server without the module, -P 16", plain.port, get, 16),
            "local_set16": Row("route-plain SET, keys all local, -P 16", local.port, set_, 16),
            "plain_set16": Row("SET on a server without the module, -P 16", plain.port, set_, 16),
            "rp_get1": Row("route-plain GET via n0 of three, -P 1", n0, get, 1),
            "twem_get1": Row("GET via twemproxy, -P 1", tw, get, 1),
            "rp_set1": Row("route-plain SET via n0 of three, -P 1", n0, set_, 1),
            "twem_set1": Row("SET via twemproxy, -P 1", tw, set_, 1),
            "rp_get16": Row("route-plain GET via n0 of three, -P 16", n0, get, 16),
            "twem_get16": Row("GET via twemproxy, -P 16", tw, get, 16),
            "rp_set16": Row("route-plain SET via n0 of three, -P 16", n0, set_, 16),
            "twem_set16": Row("SET via twemproxy, -P 16", tw, set_, 16),
            "rp_copy": Row("route-plain COPY between two other owners (gathered) via n0, -P 1",
                           n0, ["COPY", ka, kb, "REPLACE"], 1),
            "plain_copy": Row("COPY on one plain server, -P 1", plain.port,
                              ["COPY", ka, kb, "REPLACE"], 1),
            "rp_dbsize": Row("route-plain DBSIZE via n0 of three, -P 1", n0, ["DBSIZE"], 1),
            "plain_dbsize": Row("DBSIZE on one plain server, -P 1", plain.port, ["DBSIZE"], 1),
        }
        # RENAME between two owners: each client its own pair.
        driver = build_rename()
        third = rename_pairs(c0, ("n1", "n2"), "rn")
        owner = rename_pairs(c0, ("n0", "n1"), "ro")
        cp = plain.client()
        for a, _ in third + owner:
            c0.call("SET", a, "xxxxxxxx")
        for a, _ in third:
            cp.call("SET", a, "xxxxxxxx")
        renames = {
            "rp_rename": RenameRow("route-plain RENAME between two other owners (n1, n2; gathered) "
                                   f"via n0, {RENAME_CLIENTS} clients, a pair each", n0, third,
                                   driver, "third"),
            "rp_rename_own": RenameRow("route-plain RENAME between n0 and n1 (gathered) via n0, "
                                       f"{RENAME_CLIENTS} clients, a pair each", n0, owner, driver,
                                       "owner"),
            "plain_rename": RenameRow(f"RENAME on one plain server, {RENAME_CLIENTS} clients, a pair each",
                                      plain.port, third, driver, "plain"),
        }
        if opts.only:
            rows = renames
        else:
            rows.update(renames)
        print(f"fleet: n0..n2 hold {spread}; sizing runs of ~{opts.seconds:g} s", flush=True)
        for row in rows.values():
            row.calibrate(opts.seconds)
        order = list(rows)
        for r in range(1, opts.rounds + 1):
            base.wait_for_quiet(10)
            for key in (order if r % 2 else order[::-1]):
                rows[key].run()
            print(f"round {r}/{opts.rounds}: " + "  ".join(
                f"{k}={base.rate(row.runs[-1][0]) if row.runs else 'x'}"
                for k, row in rows.items()), flush=True)
        scans = [] if opts.only else scan_rows(nodes["n0"], plain, opts.scan_keys, opts.scan_rounds)
        if opts.only:
            for key in rows:
                if key != "plain_rename" and rows[key].runs and rows["plain_rename"].runs:
                    r = statistics.median(x[0] / y[0] for x, y in zip(rows[key].runs,
                                                                     rows["plain_rename"].runs))
                    print(f"{key}: {base.rate(rows[key].median(0))} against "
                          f"{base.rate(rows['plain_rename'].median(0))} ops/s: ratio {r:.2f}; "
                          f"p50/p99 {rows[key].median(1):.2f}/{rows[key].median(2):.2f} ms, plain "
                          f"{rows['plain_rename'].median(1):.2f}/{rows['plain_rename'].median(2):.2f} ms")
                elif rows[key].error:
                    print(f"{key}: {rows[key].error}")
            return
    finally:
        for p in procs:
            p.stop()

    table = []

    def ratio(key, against, target=None):
        a, b = rows[key], rows[against]
        if a.error or b.error or not a.runs or not b.runs:
            table.append((a.label, f"refused: {a.error or b.error}", b.label, "", "", "",
                          "" if target is None else f"≥ {target:g}", "MISS" if target else ""))
            return
        r = statistics.median(x[0] / y[0] for x, y in zip(a.runs, b.runs))
        table.append((a.label, f"{base.rate(a.median(0))} req/s", b.label,
                      f"{base.rate(b.median(0))} req/s", f"{r:.2f}",
                      f"{a.median(1):.2f} / {a.median(2):.2f} ms; {b.median(1):.2f} / {b.median(2):.2f} ms",
                      "" if target is None else f"≥ {target:g}",
                      "" if target is None else ("PASS" if r >= target else "MISS")))

    ratio("local_get16", "plain_get16", 0.97)
    ratio("local_set16", "plain_set16", 0.97)
    ratio("rp_get1", "twem_get1", 1.0)
    ratio("rp_set1", "twem_set1", 1.0)
    ratio("rp_get16", "twem_get16")
    ratio("rp_set16", "twem_set16")
    ratio("rp_rename", "plain_rename", 0.4)
    ratio("rp_rename_own", "plain_rename")
    ratio("rp_copy", "plain_copy")
    ratio("rp_dbsize", "plain_dbsize", 0.3)
    fleet_rate = statistics.median(f for f, _ in scans)
    one_rate = statistics.median(p for _, p in scans)
    scan_ratio = statistics.median(f / p for f, p in scans)
    table.append((f"SCAN COUNT 1000 of {opts.scan_keys} keys via n0 of three (route-plain)",
                  f"{base.rate(fleet_rate)} keys/s", "SCAN on one server holding them all",
                  f"{base.rate(one_rate)} keys/s", f"{scan_ratio:.2f}", "", "≥ 0.8",
                  "PASS" if scan_ratio >= 0.8 else "MISS"))

    lines = [SECTION, "",
             f"Written by `make bench` (bench/plain.py), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
             f"in {time.time() - started:.0f} s, {opts.rounds} interleaved rounds of runs of about "
             f"{opts.seconds:g} s, `redis-benchmark -c 50 -r {fl.KEYS}`, no process pinned. "
             "Three servers with the module and `shard.route-plain yes` (a ketama ring n0 n1 n2), "
             "twemproxy (Debian's nutcracker) in front of the same three; for the local rows a "
             "server with the module, a ring of itself and route-plain on, and one without the "
             "module. The RENAME rows are bench/floor/rename.c's (50 clients, each renaming a pair "
             "of keys of its own back and forth, one request in flight per client), not "
             "redis-benchmark's. Ratios are medians of the rounds' ratios; latencies medians of "
             "p50 / p99.",
             "",
             "| what | measured | baseline | baseline figure | ratio | p50 / p99: row; baseline | target | result |",
             "|---|---|---|---|---|---|---|---|"]
    lines += ["| " + " | ".join(t) + " |" for t in table]
    lines += ["", "Every run (requests/s per round):", "",
              "| row | -P | -n | rates |", "|---|---|---|---|"]
    for row in rows.values():
        lines.append(f"| {row.label} | {row.pipeline} | {row.n} | "
                     f"{', '.join(base.rate(x[0]) for x in row.runs) or row.error} |")
    section = "\n".join(lines) + "\n"
    fl.write_section(Path(opts.out), SECTION, section)
    print("\n" + section)
    print(f"{sum(t[-1] == 'PASS' for t in table)} targets pass, "
          f"{sum(t[-1] == 'MISS' for t in table)} miss; written to {opts.out}")


if __name__ == "__main__":
    main()
