#!/usr/bin/env python3
"""Transactions across nodes (issue 35): what a transaction costs through the module, against
the same transaction on one plain server, in interleaved rounds, as ratios.

Starts three servers with the module (n0 n1 n2, a ketama ring of the three) and one plain
server without it. The rows:

1. a transfer between two accounts on two owners (n1 and n2), sent to n0 (SHARD.MULTI, two
   SHARD.CALLs, SHARD.EXEC: a two-phase commit), 50 clients, against MULTI/DECRBY/INCRBY/EXEC
   of two accounts on the plain server;
2. the same transfer with both accounts on one owner, n0 itself (the one-owner block), against
   the plain MULTI/EXEC;
3. plain GET and SET, `redis-benchmark -P 16 -c 50`, at n1 while 10 clients run transfers
   through n0 on other keys (of n1 and n2), against the same GET/SET at the plain server while
   10 clients run plain MULTI/EXEC transfers there (what the owner side's checks cost keys no
   transaction touches).

The transfers are driven by an asyncio client of this script (each transaction's four
commands written at once on its connection, its replies read, the next one sent); a reply that
is not the transaction's (an error, a nil) is counted as a failure and shown. Writes the
section "Transactions across nodes" into bench/results.md (replacing an older one) unless
`--no-write`; `python3 bench/txn.py --help` lists the knobs. Standard library only. Do not run
it on a machine others share for long: `--seconds 0.5 --rounds 1` is a smoke test.
"""

import argparse
import asyncio
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as base  # noqa: E402  (servers, redis-benchmark, pinning)
from fleet import write_section  # noqa: E402

ROOT = base.ROOT
RESULTS = ROOT / "bench" / "results.md"
SECTION = "## Transactions across nodes (issue 35)"
NAMES = ("n0", "n1", "n2")


class Node:
    """A redis-server of its own, with the module (`self` set to `name`) or without it."""

    def __init__(self, name=None):
        base.TMP.mkdir(parents=True, exist_ok=True)
        self.port = base.free_port()
        argv = [base.REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", str(base.TMP),
                "--logfile", str(base.TMP / f"txn-{name or 'plain'}.log")]
        if name:
            argv += ["--loadmodule", str(base.MODULE), "self", name, "call-timeout-ms", "5000"]
        self.proc = subprocess.Popen(argv)
        for _ in range(100):
            try:
                self.client = base.Client(self.port)
                self.client.call("PING")
                return
            except (OSError, base.RedisError):
                time.sleep(0.05)
        sys.exit(f"a server did not start; see {base.TMP}")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)


def encode(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


async def read_reply(reader):
    line = await reader.readline()
    kind, rest = line[:1], line[1:-2]
    if kind in (b"+", b":"):
        return rest
    if kind == b"-":
        return base.RedisError(rest.decode())
    if kind == b"$":
        n = int(rest)
        return None if n < 0 else (await reader.readexactly(n + 2))[:-2]
    if kind == b"*":
        n = int(rest)
        return None if n < 0 else [await read_reply(reader) for _ in range(n)]
    raise base.RedisError(f"unexpected reply {line!r}")


def transfer(a, b, module):
    """One transfer's four commands, written at once."""
    if module:
        return encode("SHARD.MULTI") + encode("SHARD.CALL", "DECRBY", a, 1) + \
            encode("SHARD.CALL", "INCRBY", b, 1) + encode("SHARD.EXEC")
    return encode("MULTI") + encode("DECRBY", a, 1) + encode("INCRBY", b, 1) + encode("EXEC")


async def transfers(port, a, b, module, clients, seconds, stop=None):
    """Transactions per second over `seconds` (or until `stop` is set), and the failures."""
    request = transfer(a, b, module)
    done, failures = 0, []
    deadline = time.monotonic() + seconds

    async def one():
        nonlocal done
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while time.monotonic() < deadline and not (stop and stop.is_set()):
            writer.write(request)
            replies = [await read_reply(reader) for _ in range(4)]
            if isinstance(replies[-1], list):
                done += 1
            else:
                failures.append(replies[-1] if replies[-1] is not None else "nil")
        writer.close()

    start = time.monotonic()
    await asyncio.gather(*(one() for _ in range(clients)))
    return done / (time.monotonic() - start), failures


def run_transfers(*args, **kwargs):
    return asyncio.run(transfers(*args, **kwargs))


def key_on(client, owner, prefix):
    for i in range(100_000):
        key = f"{prefix}:{i}"
        if client.call("SHARD.WHEREIS", key) == owner.encode():
            return key
    raise RuntimeError(f"no key of {owner}")


def getset_under_load(node, port_load, keys, module, clients, seconds):
    """redis-benchmark -P 16 GET and SET at `node` while 10 clients run transfers."""
    stop = threading.Event()
    holder = {}
    load = threading.Thread(target=lambda: holder.update(
        out=run_transfers(port_load, *keys, module, 10, 3600, stop)))
    load.start()
    try:
        n = max(10_000, int(200_000 * seconds))
        rates = [base.redis_benchmark(node.port, False, ["-t", t, "-r", "100000"], n, clients, 16)
                 for t in ("get", "set")]
    finally:
        stop.set()
        load.join()
    return statistics.mean(rates), holder.get("out", (0, []))[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--no-write", action="store_true")
    opts = ap.parse_args()
    fleet = {n: Node(n) for n in NAMES}
    plain = Node()
    try:
        ring = []
        for n, node in fleet.items():
            ring += [n, f"127.0.0.1:{node.port}", 1]
        for node in fleet.values():
            node.client.call("SHARD.RING", "SET", "ketama", *ring)
        via = fleet["n0"].client
        far = (key_on(via, "n1", "acct"), key_on(via, "n2", "acct"))
        near = (key_on(via, "n0", "acct"), key_on(via, "n0", "bcct"))
        other = (key_on(via, "n1", "other"), key_on(via, "n2", "other"))
        rows = {"two owners": [], "one owner (n0)": [], "GET/SET -P 16 under transactions": []}
        failures = {k: [] for k in rows}
        n0 = fleet["n0"].port
        for _ in range(opts.rounds):
            for label, keys in (("two owners", far), ("one owner (n0)", near)):
                mod, bad = run_transfers(n0, *keys, True, 50, opts.seconds)
                ref, bad2 = run_transfers(plain.port, *keys, False, 50, opts.seconds)
                rows[label].append((mod, ref))
                failures[label] += bad + bad2
            mod, bad = getset_under_load(fleet["n1"], n0, other, True, 50, opts.seconds)
            ref, bad2 = getset_under_load(plain, plain.port, other, False, 50, opts.seconds)
            rows["GET/SET -P 16 under transactions"].append((mod, ref))
            failures["GET/SET -P 16 under transactions"] += bad + bad2
        lines = [SECTION, "",
                 f"{opts.rounds} rounds of {opts.seconds} s, interleaved; {base.REDIS_SERVER}; "
                 "medians (transactions/s, or requests/s for GET/SET).", "",
                 "| row | through the module | plain server | ratio | failures |",
                 "|---|---|---|---|---|"]
        for label, pairs in rows.items():
            mod = statistics.median(p[0] for p in pairs)
            ref = statistics.median(p[1] for p in pairs)
            shown = {str(f)[:80] for f in failures[label][:3]}
            lines.append(f"| {label} | {mod:,.0f} | {ref:,.0f} | {mod / max(ref, 1):.2f} | "
                         f"{len(failures[label])} {'; '.join(sorted(shown))} |")
        section = "\n".join(lines) + "\n"
        print(section)
        if not opts.no_write:
            write_section(Path(opts.out), SECTION, section)
    finally:
        for node in [*fleet.values(), plain]:
            node.stop()


if __name__ == "__main__":
    main()
