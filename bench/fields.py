#!/usr/bin/env python3
"""Shardjs's field dictionary in the server (issue 17): the memory 1 000 000 hashes of five fields
(the README's subKeys: name, city, password, userid, email) take with and without
`shard.fields`, and what the translation costs `SHARD.CALL HGETALL` (redis-benchmark, side by side
in interleaved rounds, as a ratio). Writes its section into bench/results.md."""

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fleet  # noqa: E402  (servers and redis-benchmark with latency)
import run as base  # noqa: E402

SECTION = "## The field dictionary (issue 17)"
SUB_KEYS = "name:n city:c password:p userid:u email:e"
HASHES = 1_000_000


def fill(server, count):
    """`count` hashes user:%012d of five fields, through SHARD.CALL HSET, pipelined."""
    c = server.client()
    for i in range(0, count, 2000):
        batch = []
        for k in range(i, min(count, i + 2000)):
            args = [b"SHARD.CALL", b"HSET", b"user:%012d" % k, b"name", b"John Smith",
                    b"city", b"London", b"password", b"x" * 12, b"userid", b"%d" % k,
                    b"email", b"john%d@example.com" % k]
            batch.append(b"*%d\r\n" % len(args) + b"".join(
                b"$%d\r\n%s\r\n" % (len(a), a) for a in args))
        c.sock.sendall(b"".join(batch))
        for _ in batch:
            c._read()
    c.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--hashes", type=int, default=HASHES)
    ap.add_argument("--out", default=str(fleet.RESULTS))
    opts = ap.parse_args()
    started = time.time()
    procs = []
    try:
        with_dict = fleet.server("dict", 0, self_name="n0")
        without = fleet.server("nodict", 0, self_name="n0")
        procs += [with_dict, without]
        for s, fields in ((with_dict, SUB_KEYS), (without, "")):
            c = s.client()
            c.call("SHARD.RING", "SET", "ketama", "n0", f"127.0.0.1:{s.port}", 1)
            c.call("CONFIG", "SET", "shard.fields", fields)
        memory = {}
        for name, s in (("with", with_dict), ("without", without)):
            before = int(s.client().info("memory")["used_memory"])
            fill(s, opts.hashes)
            memory[name] = int(s.client().info("memory")["used_memory"]) - before
        get = ["SHARD.CALL", "HGETALL", "user:__rand_int__"]
        rows = {
            "with": fleet.Row("SHARD.CALL HGETALL, dictionary on, -P 16", with_dict.port, get, 16),
            "without": fleet.Row("SHARD.CALL HGETALL, no dictionary, -P 16", without.port, get, 16),
            "with1": fleet.Row("SHARD.CALL HGETALL, dictionary on, -P 1", with_dict.port, get, 1),
            "without1": fleet.Row("SHARD.CALL HGETALL, no dictionary, -P 1", without.port, get, 1),
        }
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

    def ratio(a, b):
        return statistics.median(x[0] / y[0] for x, y in zip(rows[a].runs, rows[b].runs))

    per = {k: v / opts.hashes for k, v in memory.items()}
    lines = [SECTION, "",
             f"Written by `make bench` (bench/fields.py), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
             f"in {time.time() - started:.0f} s: {opts.hashes} hashes `user:%012d` of the five fields "
             "of Shardjs's README (`subKeys`), written through `SHARD.CALL HSET` on a server whose "
             "ring is itself, with `shard.fields \"name:n city:c password:p userid:u email:e\"` and "
             "without; `used_memory` before and after.", "",
             "| what | with the dictionary | without | ratio |", "|---|---|---|---|",
             f"| used_memory of the hashes | {memory['with'] / 1e6:.1f} MB ({per['with']:.0f} B a hash) "
             f"| {memory['without'] / 1e6:.1f} MB ({per['without']:.0f} B a hash) "
             f"| {memory['with'] / memory['without']:.2f} |"]
    for p in ("", "1"):
        a, b = rows["with" + p], rows["without" + p]
        lines.append(f"| {a.label.replace(', dictionary on', '')} (p50 / p99) | "
                     f"{base.rate(a.median(0))} req/s ({a.median(1):.2f} / {a.median(2):.2f} ms) | "
                     f"{base.rate(b.median(0))} req/s ({b.median(1):.2f} / {b.median(2):.2f} ms) | "
                     f"{ratio('with' + p, 'without' + p):.2f} |")
    lines += ["", "Without the dictionary a local `SHARD.CALL HGETALL` is the plain `HGETALL` (the "
              "command filter); with it, the call runs through the module (RedisModule_Call, "
              "then the reply's field names translated), which is what the ratio measures.", ""]
    section = "\n".join(lines)
    fleet.write_section(Path(opts.out), SECTION, section)
    print("\n" + section)


if __name__ == "__main__":
    main()
