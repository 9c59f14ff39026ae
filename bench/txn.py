#!/usr/bin/env python3
"""Transactions across nodes (issue 35): what a transaction costs through the module, against
the same transaction on one plain server, in interleaved rounds, as ratios.

Starts three servers with the module (n0 n1 n2, a ketama ring of the three) and one plain
server without it (the same binary). Every client moves money between its own pair of
accounts (the same pairs on both sides, so that neither side has lock or watch contention the
other has not), as a client of an optimistic transaction does: `WATCH a b`, `GET a`, `GET b`
(one write, three replies), then `MULTI`, `DECRBY a 1`, `INCRBY b 1`, `EXEC` (one write);
a nil `EXEC` (or, through the module, a `TRYAGAIN`) is retried from the `WATCH`. The figure is
committed transfers per second; after the run, each pair's two balances must sum to zero on
both sides. The rows:

1. a transfer between two accounts on two owners (n1 and n2), sent to n0 (SHARD.WATCH,
   SHARD.CALL GET twice, SHARD.MULTI, two SHARD.CALLs, SHARD.EXEC: a two-phase commit),
   50 clients, against WATCH/GET/GET/MULTI/DECRBY/INCRBY/EXEC on the plain server;
2. the same transfer with both accounts on one owner, n0 itself (one owner's block), against
   the same plain transfer;
3. plain GET and SET, `redis-benchmark -P 16 -c 50 -r 100000` (both servers first filled
   with the same 100 000 keys), at n1 while 10 clients run transfers through n0 between
   accounts of n1 and n2, against the same GET/SET at the plain server while 10 clients run
   the plain transfers there. Both loads are paced at the same rate (`--load-rate`
   transfers/s in all) and are running (each client has committed one transfer) before
   redis-benchmark starts: what the owner side's checks cost keys no transaction touches,
   not how much the two loads differ. For this row the measured server runs on CPU 0 and
   everything else of the run (redis-benchmark, the load's client, n0 and n2) on CPU 1, as
   bench/run.py pins its server and redis-benchmark: n0 and n2, which the plain side has no
   counterpart of, take no time of the measured server's CPU.

In every round each row's two sides run back to back, in one order in odd rounds and in the
other in even ones. The servers are not pinned; the share of the CPUs that other processes
used during each run is shown (the machine is shared). The clients are this script's asyncio
clients (its CPU is shown: near one core, the client is the bottleneck of a row). Writes the
section "Transactions across nodes" into bench/results.md (replacing an older one) unless
`--no-write`; `python3 bench/txn.py --help` lists the knobs. Standard library only. Do not run
it on a machine others share for long: `--seconds 0.5 --rounds 1` is a smoke test.
"""

import argparse
import asyncio
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as base  # noqa: E402  (servers, redis-benchmark)
from fleet import write_section  # noqa: E402

ROOT = base.ROOT
RESULTS = ROOT / "bench" / "results.md"
SECTION = "## Transactions across nodes (issue 35)"
NAMES = ("n0", "n1", "n2")
GETSET = "GET/SET -P 16 under transactions"


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

    def cpu_ticks(self):
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)


# --------------------------------------------------------------------------- the wire


def encode(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


class ReplyError(str):
    """An error reply (its line)."""


def parse(buf, pos):
    """One reply from `buf` at `pos`: (reply, next position), or None when incomplete."""
    end = buf.find(b"\r\n", pos)
    if end < 0:
        return None
    kind, rest = buf[pos:pos + 1], buf[pos + 1:end]
    pos = end + 2
    if kind in (b"+", b":"):
        return bytes(rest), pos
    if kind == b"-":
        return ReplyError(rest.decode()), pos
    if kind == b"$":
        n = int(rest)
        if n < 0:
            return None, pos
        if len(buf) < pos + n + 2:
            return None
        return bytes(buf[pos:pos + n]), pos + n + 2
    if kind == b"*":
        n = int(rest)
        if n < 0:
            return None, pos
        items = []
        for _ in range(n):
            got = parse(buf, pos)
            if got is None:
                return None
            item, pos = got
            items.append(item)
        return items, pos
    raise ValueError(f"unexpected reply {bytes(buf[pos - 2 - len(rest) - 1:end])!r}")


class Conn:
    """A pipelining connection: write several commands, read that many replies."""

    def __init__(self, reader, writer):
        self.reader, self.writer = reader, writer
        self.buf = bytearray()
        self.pos = 0

    @classmethod
    async def open(cls, port):
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    async def replies(self, request, n):
        self.writer.write(request)
        out = []
        while len(out) < n:
            got = parse(self.buf, self.pos)
            if got is None:
                chunk = await self.reader.read(65536)
                if not chunk:
                    raise ConnectionError("the server closed the connection")
                del self.buf[:self.pos]
                self.pos = 0
                self.buf += chunk
                continue
            reply, self.pos = got
            out.append(reply)
        return out

    def close(self):
        self.writer.close()


# --------------------------------------------------------------------------- the transfer


def requests(a, b, module):
    """A transfer's two writes: the reads under watch, then the block."""
    if module:
        reads = encode("SHARD.WATCH", a, b) + encode("SHARD.CALL", "GET", a) + \
            encode("SHARD.CALL", "GET", b)
        block = encode("SHARD.MULTI") + encode("SHARD.CALL", "DECRBY", a, 1) + \
            encode("SHARD.CALL", "INCRBY", b, 1) + encode("SHARD.EXEC")
    else:
        reads = encode("WATCH", a, b) + encode("GET", a) + encode("GET", b)
        block = encode("MULTI") + encode("DECRBY", a, 1) + encode("INCRBY", b, 1) + encode("EXEC")
    return reads, block


class Tally:
    def __init__(self):
        self.committed = 0
        self.retries = 0
        self.failures = []


async def transfer(conn, reads, block, tally):
    """One transfer, retried until it commits (a nil EXEC, a TRYAGAIN) or fails otherwise."""
    while True:
        got = await conn.replies(reads, 3)
        if any(isinstance(r, ReplyError) for r in got):
            tally.failures.append(next(r for r in got if isinstance(r, ReplyError)))
            return False
        replies = await conn.replies(block, 4)
        last = replies[-1]
        if isinstance(last, list):
            tally.committed += 1
            return True
        if last is None or (isinstance(last, ReplyError) and last.startswith("TRYAGAIN")):
            tally.retries += 1
            continue
        tally.failures.append(last)
        return False


async def transfers(port, pairs, module, seconds, stop=None, started=None, rate=None):
    """Each client of `pairs` transfers between its pair until `seconds` pass (or `stop` is
    set), `rate` transfers/s in all when given; the tally, and the seconds it took."""
    tally = Tally()
    conns = [await Conn.open(port) for _ in pairs]
    ready = [0]
    t0 = time.monotonic()
    deadline = t0 + seconds
    gap = len(pairs) / rate if rate else 0.0

    async def one(conn, pair):
        reads, block = requests(*pair, module)
        n = 0
        while time.monotonic() < deadline and not (stop and stop.is_set()):
            if not await transfer(conn, reads, block, tally):
                await asyncio.sleep(0.01)
            n += 1
            if n == 1:
                ready[0] += 1
                if started and ready[0] == len(pairs):
                    started.set()
            if gap:
                wait = t0 + n * gap - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)

    await asyncio.gather(*(one(c, p) for c, p in zip(conns, pairs)))
    elapsed = time.monotonic() - t0
    for c in conns:
        c.close()
    return tally, elapsed


def run_transfers(*args, **kwargs):
    return asyncio.run(transfers(*args, **kwargs))


def keys_by_owner(client, prefix, wanted):
    """`wanted[owner]` key names of each owner, by asking SHARD.WHEREIS."""
    found = {owner: [] for owner in wanted}
    i = 0
    while any(len(found[o]) < n for o, n in wanted.items()):
        key = f"{prefix}:{i}"
        owner = client.call("SHARD.WHEREIS", key).decode()
        if owner in found and len(found[owner]) < wanted[owner]:
            found[owner].append(key)
        i += 1
        if i > 1_000_000:
            raise RuntimeError(f"not enough keys of {wanted}")
    return found


def balances_sum_to_zero(client, pairs, module):
    """Each pair's balances after the run: a transfer moved 1 from a to b, so they sum to 0."""
    wrong = []
    for a, b in pairs:
        values = [client.call(*(["SHARD.CALL"] if module else []), "GET", k) for k in (a, b)]
        total = sum(int(v or 0) for v in values)
        if total != 0 or values[1] is None:
            wrong.append(f"{a}={values[0]} {b}={values[1]}")
    return wrong


# --------------------------------------------------------------------------- measuring


class Meter:
    """Over one run: the CPU seconds the side's own servers used, this script's CPU and
    redis-benchmark's (each as a share of one core), and the share of both CPUs that processes
    other than the servers, redis-benchmark and this script used."""

    def __init__(self, servers, side):
        self.servers, self.side = servers, side
        self.start = self._sample()

    def _sample(self):
        cpu = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        me, children = (resource.getrusage(who) for who in
                        (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
        return (sum(cpu), sum(cpu) - cpu[3] - cpu[4], sum(s.cpu_ticks() for s in self.servers),
                (me.ru_utime + me.ru_stime) * base.HZ,
                (children.ru_utime + children.ru_stime) * base.HZ,
                sum(s.cpu_ticks() for s in self.side),
                tuple(s.cpu_ticks() for s in self.side))

    def stop(self):
        end = self._sample()
        total, busy, servers, me, children, side = (
            b - a for a, b in zip(self.start[:-1], end[:-1]))
        each = [(b - a) / base.HZ for a, b in zip(self.start[-1], end[-1])]
        core = total / (os.cpu_count() or 1)
        # Children: redis-benchmark only (the servers are reaped when the run ends).
        return {"client": me / core, "bench": children / core, "side_s": side / base.HZ,
                "each_s": each,
                "other": max(0.0, (busy - servers - me - children) / max(1, total))}


def pin(pids, cpus):
    """Runs the processes `pids` on `cpus` (a no-op on a machine of one CPU)."""
    if (os.cpu_count() or 1) < 2:
        return
    for pid in pids:
        try:
            os.sched_setaffinity(pid, cpus)
        except OSError:
            pass


def getset_under_load(node, port_load, pairs, module, seconds, rate, others):
    """redis-benchmark -P 16 GET and SET at `node` while `pairs` run paced transfers. The
    measured server runs on CPU 0 alone of the run's processes; redis-benchmark, this script
    (the load's client) and the `others` servers (the module's coordinator and second owner) on
    CPU 1, so that the load's other servers take no time of the measured server's CPU."""
    every = set(range(os.cpu_count() or 1))
    pin([node.proc.pid], {0})
    pin([0] + [o.proc.pid for o in others], {1})
    try:
        return measure_getset(node, port_load, pairs, module, seconds, rate)
    finally:
        pin([0, node.proc.pid] + [o.proc.pid for o in others], every)


def measure_getset(node, port_load, pairs, module, seconds, rate):
    stop, started = threading.Event(), threading.Event()
    holder = {}
    load = threading.Thread(target=lambda: holder.update(
        out=run_transfers(port_load, pairs, module, 3600, stop, started, rate)))
    load.start()
    try:
        if not started.wait(30):
            raise RuntimeError("the transactions of the load did not start")
        n = max(10_000, int(400_000 * seconds))
        rates = [base.redis_benchmark(node.port, True, ["-t", t, "-r", "100000"], n, 50, 16)
                 for t in ("get", "set")]
    finally:
        stop.set()
        load.join()
    tally, elapsed = holder.get("out", (Tally(), 1.0))
    return statistics.mean(rates), tally, tally.committed / elapsed


class Row:
    def __init__(self, label):
        self.label = label
        self.sides = {"module": [], "plain": []}
        self.ratios = []
        self.retries = {"module": 0, "plain": 0}
        self.failures = {"module": [], "plain": []}
        self.loads = {"module": [], "plain": []}
        self.other = []
        self.client = []
        self.cost = {"module": [], "plain": []}  # servers' CPU µs per transfer (or request)
        self.cost_ratios = []


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--load-rate", type=float, default=1000.0,
                    help="the transfers/s of row 3's load, on both sides")
    ap.add_argument("--rows", default="two,one,getset", help="which rows, by name")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--no-write", action="store_true")
    opts = ap.parse_args()
    wanted = opts.rows.split(",")
    fleet = {n: Node(n) for n in NAMES}
    plain = Node()
    began = time.time()
    print("servers (for a profiler): " + ", ".join(
        f"{n} pid {node.proc.pid} port {node.port}" for n, node in [*fleet.items(), ("plain", plain)]),
        flush=True)
    try:
        ring = []
        for n, node in fleet.items():
            ring += [n, f"127.0.0.1:{node.port}", 1]
        for node in fleet.values():
            node.client.call("SHARD.RING", "SET", "ketama", *ring)
        via = fleet["n0"].client
        c = opts.clients
        acct = keys_by_owner(via, "acct", {"n0": 2 * c, "n1": c, "n2": c})
        other = keys_by_owner(via, "other", {"n1": 10, "n2": 10})
        far = list(zip(acct["n1"], acct["n2"]))
        near = list(zip(acct["n0"][:c], acct["n0"][c:]))
        loaded = list(zip(other["n1"], other["n2"]))
        everyone = [*fleet.values(), plain]
        rows = {}
        if "two" in wanted:
            rows["two owners"] = (Row("two owners (n1, n2), through n0"), far)
        if "one" in wanted:
            rows["one owner"] = (Row("one owner (n0 itself)"), near)
        if "getset" in wanted:
            rows[GETSET] = (Row(GETSET), loaded)
            for server in (fleet["n1"], plain):  # the same 100 000 keys on both sides
                base.redis_benchmark(server.port, False, ["-t", "set", "-r", "100000"],
                                     300_000, 50, 16)
        for rnd in range(opts.rounds):
            order = ("module", "plain") if rnd % 2 == 0 else ("plain", "module")
            for key, (row, pairs) in rows.items():
                figures = {}
                for side in order:
                    module = side == "module"
                    if key == GETSET:
                        mine = [fleet["n1"]] if module else [plain]
                    else:
                        mine = list(fleet.values()) if module else [plain]
                    meter = Meter(everyone, mine)
                    if key == GETSET:
                        node = fleet["n1"] if module else plain
                        port = fleet["n0"].port if module else plain.port
                        others = [fleet["n0"], fleet["n2"]] if module else []
                        rate, tally, load = getset_under_load(node, port, pairs, module,
                                                              opts.seconds, opts.load_rate,
                                                              others)
                        row.loads[side].append(load)
                        done = rate * opts.seconds  # about: redis-benchmark's runs
                    else:
                        port = fleet["n0"].port if module else plain.port
                        tally, elapsed = run_transfers(port, pairs, module, opts.seconds)
                        rate = tally.committed / elapsed
                        done = tally.committed
                    use = meter.stop()
                    figures[side + " cost"] = 1e6 * use["side_s"] / max(done, 1)
                    if module and key != GETSET:
                        each = ", ".join(f"{n} {1e6 * s / max(done, 1):.1f}"
                                         for n, s in zip(NAMES, use["each_s"]))
                        print(f"round {rnd + 1}, {key}: CPU µs per transfer {each}", flush=True)
                    row.cost[side].append(figures[side + " cost"])
                    row.other.append(use["other"])
                    row.client.append(use["client"])
                    figures[side] = rate
                    row.sides[side].append(rate)
                    row.retries[side] += tally.retries
                    row.failures[side] += tally.failures
                row.ratios.append(figures["module"] / max(figures["plain"], 1))
                row.cost_ratios.append(figures["plain cost"] / max(figures["module cost"], 1e-9))
        wrong = {}
        for key, (row, pairs) in rows.items():
            for side, client, module in (("module", via, True), ("plain", plain.client, False)):
                bad = balances_sum_to_zero(client, pairs, module)
                if bad:
                    wrong[f"{row.label}, {side}"] = bad[:3]
        spent = time.time() - began
        other = [o for row, _ in rows.values() for o in row.other]
        lines = [SECTION, "",
                 f"`python3 bench/txn.py` ({' '.join(sys.argv[1:]) or 'defaults'}), "
                 f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, in {spent:.0f} s: "
                 f"{opts.rounds} rounds of {opts.seconds} s per side, interleaved (the sides' "
                 "order swapped every round); each client transfers between its own pair of "
                 "accounts (the same pairs on both sides) and retries a nil EXEC; figures are "
                 "committed transfers/s (GET/SET: requests/s), medians over the rounds; the ratio "
                 "is the median of the rounds' ratios. The servers' CPU per transfer (all three "
                 "servers of the module's side; GET/SET: the measured server's CPU per request, "
                 "the load's included, about) is less sensitive to other work on the machine "
                 "than the rates; its ratio is plain / module (above 1: the module costs less).",
                 "",
                 f"- server: {base.first_line([base.REDIS_SERVER, '--version'])} (the plain "
                 "server is the same binary without the module)",
                 f"- module commit: {base.first_line(['git', '-C', str(ROOT), 'rev-parse', '--short=12', 'HEAD'])}",
                 f"- machine: {os.cpu_count()} cores, shared; CPU used by other processes during "
                 f"the runs: median {base.pct(statistics.median(other))}, largest "
                 f"{base.pct(max(other))}; load average when done "
                 f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}",
                 f"- balances after the run: "
                 f"{'every pair sums to 0 on both sides' if not wrong else wrong}", "",
                 "| row | through the module | plain server | ratio | per round (module / plain) "
                 "| servers' CPU µs per transfer (module / plain) | ratio by CPU "
                 "| retried (module, plain) | failures | this script's CPU |",
                 "|---|---|---|---|---|---|---|---|---|---|"]
        for row, _ in rows.values():
            mod, ref = (statistics.median(row.sides[s]) for s in ("module", "plain"))
            per = ", ".join(f"{m:,.0f}/{p:,.0f}" for m, p in
                            zip(row.sides["module"], row.sides["plain"]))
            bad = row.failures["module"] + row.failures["plain"]
            shown = "; ".join(sorted({str(f)[:80] for f in bad[:3]}))
            label = row.label
            if row.loads["module"]:
                label += (f" (load: {statistics.median(row.loads['module']):,.0f} / "
                          f"{statistics.median(row.loads['plain']):,.0f} transfers/s)")
            lines.append(f"| {label} | {mod:,.0f} | {ref:,.0f} | "
                         f"{statistics.median(row.ratios):.2f} | {per} | "
                         f"{statistics.median(row.cost['module']):.1f} / "
                         f"{statistics.median(row.cost['plain']):.1f} | "
                         f"{statistics.median(row.cost_ratios):.2f} | "
                         f"{row.retries['module']}, {row.retries['plain']} | "
                         f"{len(bad)} {shown} | {base.pct(statistics.median(row.client))} |")
        section = "\n".join(lines) + "\n"
        print(section)
        if not opts.no_write:
            write_section(Path(opts.out), SECTION, section)
    finally:
        for node in [*fleet.values(), plain]:
            node.stop()


if __name__ == "__main__":
    main()
