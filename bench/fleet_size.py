#!/usr/bin/env python3
"""A fleet operation's time against the number of nodes (issue 44): a grow N -> N+1 and the
shrink back, at N = 3 and N = 9, moving the same data.

Each round starts N+1 fresh servers with the module (no replicas, no AOF), a `slots` ring of N
of them, and `--moved` x (N+1) small strings `k:<i>`, each SET at its owner (`SHARD.WHEREIS`,
pipelined), so that the grow, which moves the fewest slots (1/(N+1) of them), moves about
`--moved` keys at either size. Timed: `SHARD.RESHARD START` of the N+1 on n0 until the
coordinator's fleet phase is `done` (fence, begin, copies, settle, commit, cleanups and the
coordinator's own steps to every node), then the same for the shrink back to N. Checked after
each: DBSIZE sums to the keys written, the joining node holds what moved and is empty after the
shrink. The sizes alternate round by round; the medians go into bench/results.md's section
"Fleet operations against the number of nodes" (`--no-write`: printed only). `KEY_INDEX=yes`:
the servers keep the key index (bench/copy.py). Standard library only.
"""

import argparse
import datetime
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as base  # noqa: E402

# bench/copy.py (its start, client, pipelined, fleet_phase), under a name of its own: `copy` is
# the standard library's.
cp = base.bench_copy()

RESULTS = base.ROOT / "bench" / "results.md"
SECTION = "## Fleet operations against the number of nodes (issue 44)"


def slots_ring(nodes):
    return ["slots"] + [x for name, p in nodes for x in (name, f"127.0.0.1:{p.port}", 1)]


def fleet(c):
    st = c.call("SHARD.RESHARD", "STATUS")
    f = dict(zip(st[::2], st[1::2])).get(b"fleet") or []
    return dict(zip(f[::2], f[1::2]))


def wait_done(c, what):
    """Until the coordinator's fleet phase is `done`; returns the seconds it took, then waits
    for the coordinator to let go of the operation (`running` no)."""
    t0 = time.perf_counter()
    deadline = time.monotonic() + 600
    while (phase := fleet(c).get(b"phase")) != b"done":
        if phase == b"cancelled" or time.monotonic() > deadline:
            sys.exit(f"{what}: the fleet ended {phase}")
        time.sleep(0.002)
    took = time.perf_counter() - t0
    while fleet(c).get(b"running") == b"yes":
        time.sleep(0.01)
    return took


def round_(n, moved):
    """A grow n -> n+1 and the shrink back: (grow s, shrink s, keys moved by the grow)."""
    names = [f"n{i}" for i in range(n + 1)]
    procs = []
    try:
        for name in names:
            procs.append(cp.start(base.REDIS_SERVER, name=name))
        cs = [cp.client(p) for p in procs]
        nodes = list(zip(names, procs))
        for c in cs:
            c.call("SHARD.RING", "SET", *slots_ring(nodes[:n]))
        total = moved * (n + 1)
        keys = [f"k:{i}" for i in range(total)]
        owners = []
        for i in range(0, total, 20_000):
            owners += cp.pipelined(cs[0], [("SHARD.WHEREIS", k) for k in keys[i:i + 20_000]])
        by = {name: [] for name in names}
        for k, o in zip(keys, owners):
            by[o.decode()].append(k)
        for name, c in zip(names, cs):
            for i in range(0, len(by[name]), 20_000):
                cp.pipelined(c, [("SET", k, "v" * 16) for k in by[name][i:i + 20_000]])
        t0 = time.perf_counter()
        reply = cs[0].call("SHARD.RESHARD", "START", *slots_ring(nodes))
        if reply not in (b"OK", "OK"):
            sys.exit(f"grow {n}: START said {reply}")
        grow = time.perf_counter() - t0 + wait_done(cs[0], f"grow {n} -> {n + 1}")
        sizes = [c.call("DBSIZE") for c in cs]
        if sum(sizes) != total:
            sys.exit(f"grow {n}: DBSIZE {sizes}, {total} written")
        got = sizes[n]
        t1 = time.perf_counter()
        reply = cs[0].call("SHARD.RESHARD", "START", *slots_ring(nodes[:n]))
        if reply not in (b"OK", "OK"):
            sys.exit(f"shrink {n + 1}: START said {reply}")
        shrink = time.perf_counter() - t1 + wait_done(cs[0], f"shrink {n + 1} -> {n}")
        sizes = [c.call("DBSIZE") for c in cs]
        if sum(sizes) != total or sizes[n] != 0:
            sys.exit(f"shrink {n + 1}: DBSIZE {sizes}, {total} written")
        return grow, shrink, got
    finally:
        for p in procs:
            p.stop()


def build_id():
    try:
        return subprocess.run(["git", "-C", str(base.ROOT), "log", "-1", "--format=%h", "--", "src", "Cargo.toml", "Cargo.lock"],
                              capture_output=True, text=True).stdout.strip() + " (the last commit of src/)"
    except OSError:
        return "?"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--moved", type=int, default=50_000, help="keys a grow moves (default 50000)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sizes", default="3,9", help="the Ns (default 3,9)")
    ap.add_argument("--no-write", action="store_true", help="print only")
    args = ap.parse_args()
    base.TMP.mkdir(parents=True, exist_ok=True)
    sizes = [int(x) for x in args.sizes.split(",")]
    got = {n: [] for n in sizes}
    for r in range(args.rounds):
        for n in (sizes if r % 2 == 0 else sizes[::-1]):
            g, s, m = round_(n, args.moved)
            got[n].append((g, s, m))
            print(f"round {r}: {n} -> {n + 1} {g:.2f} s ({m} keys), back {s:.2f} s", flush=True)
    server = subprocess.run([base.REDIS_SERVER, "--version"], capture_output=True,
                            text=True).stdout.split()[2]
    lines = [SECTION, "",
             f"{datetime.date.today()}, build `{build_id()}`, {server}, `bench/fleet_size.py "
             f"--moved {args.moved} --rounds {args.rounds}`: N + 1 servers with the module on "
             f"this machine ({base.os.cpu_count()} cores), a `slots` ring, {args.moved} keys "
             "moved by the grow at either size; the median of the rounds, from START on n0 to "
             "its fleet phase `done`.", "",
             "| operation | nodes | key index | keys moved | seconds | keys/s |",
             "|---|---|---|---|---|---|"]
    for n in sizes:
        g = statistics.median(x[0] for x in got[n])
        s = statistics.median(x[1] for x in got[n])
        m = int(statistics.median(x[2] for x in got[n]))
        ki = cp.KEY_INDEX
        lines.append(f"| grow {n} -> {n + 1} | {n + 1} | {ki} | {m} | {g:.2f} | {m / g:,.0f} |")
        lines.append(f"| shrink {n + 1} -> {n} | {n + 1} | {ki} | {m} | {s:.2f} | "
                     f"{m / s:,.0f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        old = RESULTS.read_text()
        if SECTION in old:
            head, rest = old.split(SECTION, 1)
            tail = rest[rest.find("\n## "):] if "\n## " in rest else ""
            old = head.rstrip("\n") + "\n\n" + text + tail
        else:
            old = old.rstrip("\n") + "\n\n" + text
        RESULTS.write_text(old)


if __name__ == "__main__":
    main()
