#!/usr/bin/env python3
"""Routing for unchanged clients (issue 43, `shard.route-plain yes`), side by side with its
baselines in interleaved rounds, as ratios:

- plain GET and SET of local keys on a server with the module, a ring of itself and
  `route-plain yes`, against the same commands on a server without the module (-P 16);
- plain GET and SET through n0 of a three-node ketama fleet with `route-plain yes` (keys
  spread over the three, two thirds elsewhere), against twemproxy in front of the same three
  (-P 1 and -P 16);
- DBSIZE through n0 of the fleet (answered from every node) against DBSIZE on one plain server.

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


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--out", default=str(fl.RESULTS))
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
        for s in (local, plain):
            c = s.client()
            for i in range(0, fl.KEYS, 1000):
                args = ["MSET"]
                for k in range(i, i + 1000):
                    args += [b"key:%012d" % k, b"xxxxxxxx"]
                c.call(*args)
            c.close()
        n0, tw = nodes["n0"].port, twem.port
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
            "rp_dbsize": Row("route-plain DBSIZE via n0 of three, -P 1", n0, ["DBSIZE"], 1),
            "plain_dbsize": Row("DBSIZE on one plain server, -P 1", plain.port, ["DBSIZE"], 1),
        }
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
    ratio("rp_dbsize", "plain_dbsize", 0.3)

    lines = [SECTION, "",
             f"Written by `make bench` (bench/plain.py), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
             f"in {time.time() - started:.0f} s, {opts.rounds} interleaved rounds of runs of about "
             f"{opts.seconds:g} s, `redis-benchmark -c 50 -r {fl.KEYS}`, no process pinned. "
             "Three servers with the module and `shard.route-plain yes` (a ketama ring n0 n1 n2), "
             "twemproxy (Debian's nutcracker) in front of the same three; for the local rows a "
             "server with the module, a ring of itself and route-plain on, and one without the "
             "module. Ratios are medians of the rounds' ratios; latencies medians of p50 / p99.",
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
