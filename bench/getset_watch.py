"""Plain GET and SET while keys are watched (issue 35, bench/findings.md "Plain GET/SET while
transactions run"): one server with the module, a ring of itself, and 20 keys watched by a
`SHARD.WATCH` held open on a connection of its own (the owner's command filter active), against
a plain server of the same binary, in alternating short rounds of
`redis-benchmark -P 16 -c 50 -r 100000 -t get,set`. Prints each round's rates and each server's
CPU per request (its main thread's time on CPU, /proc/<pid>/task/<pid>/schedstat), which the
other work on a shared machine disturbs less than the rates.

    .venv/bin/python bench/getset_watch.py [--rounds 4] [--requests 400000]
    .venv/bin/python bench/getset_watch.py --callgrind [--requests 20000]

`--callgrind` counts instead the instructions each server executes per GET and per SET
(callgrind, everything from reading the request to writing the reply): repeatable figures that
the machine's other load does not disturb, except for the server's lookup of the command's name,
whose cost depends on the process's random hash seed (0 to 200 instructions); the ratios are
printed as counted and with every side's lookup counted as the plain server's.

SHARD_MODULE picks the module build (default target/release/libshard.so), REDIS_SERVER the
server. Several module builds side by side: SHARD_MODULE=a.so,b.so; a build named with
`:idle` after it (SHARD_MODULE=a.so,a.so:idle) watches nothing (the module's cost while no
transaction runs).
"""

import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# (bench/copy.py would shadow the standard library's copy, which redis-py imports.)
sys.path = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
import redis  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SERVER = os.environ.get("REDIS_SERVER") or "redis-server"
MODULES = os.environ.get("SHARD_MODULE", str(ROOT / "target" / "release" / "libshard.so"))
WATCHED = [f"acct:{i}" for i in range(20)]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, workdir, module=None, callgrind=False):
        self.port = free_port()
        self.callgrind = None
        argv = [SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", workdir]
        idle = bool(module) and module.endswith(":idle")
        module = module.removesuffix(":idle") if module else None
        if module:
            argv += ["--loadmodule", module, "self", "n0"]
        if callgrind:
            self.callgrind = tempfile.mkdtemp(prefix="getset-callgrind-")
            argv = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                    f"--callgrind-out-file={self.callgrind}/out", *argv]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.client = redis.Redis(port=self.port)
        for _ in range(600):
            try:
                self.client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        if module:
            self.client.execute_command("SHARD.RING", "SET", "ketama", "n0",
                                        f"127.0.0.1:{self.port}", 1)
            if not idle:
                self.holder = redis.Redis(port=self.port, single_connection_client=True)
                self.watch()

    def watch(self):
        """20 keys watched by a SHARD.WATCH held open (renewed before each round: a watch
        unused for 60 s is dropped)."""
        self.holder.execute_command("SHARD.UNWATCH")
        assert self.holder.execute_command("SHARD.WATCH", *WATCHED) == b"OK"

    def cpu_ns(self):
        text = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/schedstat").read_text()
        return int(text.split()[0])

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)


def bench(port, requests):
    out = subprocess.run(
        ["redis-benchmark", "-p", str(port), "-P", "16", "-c", "50", "-r", "100000",
         "-n", str(requests), "-t", "get,set", "-q"],
        capture_output=True, text=True, check=True).stdout
    rates = {}
    for line in out.replace("\r", "\n").splitlines():
        m = re.match(r"(GET|SET): ([\d.]+) requests per second", line.strip())
        if m:
            rates[m.group(1)] = float(m.group(2))
    return rates


def instructions(server, test, requests):
    """The instructions `server` (under callgrind) executes per request of `test`, and of
    them the server's lookup of the command's name (`lookupCommandLogic`)."""
    pid = str(server.proc.pid)
    bench_one = ["redis-benchmark", "-p", str(server.port), "-P", "16", "-c", "50", "-r",
                 "100000", "-t", test, "-q"]
    subprocess.run([*bench_one, "-n", "2000"], capture_output=True, check=True)
    subprocess.run(["callgrind_control", "-z", pid], capture_output=True, check=True)
    subprocess.run([*bench_one, "-n", str(requests)], capture_output=True, check=True)
    subprocess.run(["callgrind_control", "-d", test, pid], capture_output=True, check=True)
    dumps = sorted(Path(server.callgrind).glob("out.*"), key=lambda p: p.stat().st_mtime)
    total = subprocess.run(["callgrind_annotate", "--inclusive=yes", str(dumps[-1])],
                           capture_output=True, text=True, check=True).stdout
    m = re.search(r"([\d,]+)\s+\(100.0%\)\s+PROGRAM TOTALS", total) or re.search(
        r"([\d,]+)\s+PROGRAM TOTALS", total)
    lookup = re.search(r"([\d,]+)\s+(?:\(\s*[\d.]+%\)\s+)?\S*:lookupCommandLogic ", total)
    return (int(m.group(1).replace(",", "")) / requests,
            int(lookup.group(1).replace(",", "")) / requests if lookup else 0.0)


def fill(server):
    """Every key redis-benchmark -r 100000 names, set beforehand (no table grows while
    counting, and each GET finds its key: the same work on every side)."""
    p = server.client.pipeline(transaction=False)
    for i in range(100_000):
        p.set(f"key:{i:012d}", "xxx")
        if i % 5000 == 4999:
            p.execute()
    p.execute()


def count(requests):
    work = tempfile.mkdtemp(prefix="getset-watch-")
    sides = {"plain": Server(work, callgrind=True)}
    for i, m in enumerate(MODULES.split(",")):
        sides[f"module{i}" if "," in MODULES else "module"] = Server(work, m, callgrind=True)
    try:
        for s in sides.values():
            fill(s)
            subprocess.run(["callgrind_control", "-i", "on", str(s.proc.pid)],
                           capture_output=True, check=True)
        figures = {}
        for n, s in sides.items():
            figures[n] = {t: instructions(s, t, requests) for t in ("set", "get")}
            print(f"{n:8} " + "  ".join(
                f"{t.upper()} {v:7.0f} instructions ({lookup:4.0f} the name's lookup)"
                for t, (v, lookup) in figures[n].items()), flush=True)
        # The server's lookup of a command's name costs a whole number of extra string
        # comparisons, as many as the entries before the name in its bucket of the command table,
        # which the process's random hash seed orders: from one process to another the same
        # GET or SET costs 0 to 200 instructions more. The second figures count every side's
        # lookup as the plain server's (the module's own cost, without that chance).
        for n in list(sides)[1:]:
            plain = figures["plain"]
            print(f"{n}: plain / module " + ", ".join(
                f"{t.upper()} {plain[t][0] / figures[n][t][0]:.3f}" for t in ("set", "get"))
                + "; lookup as plain's: " + ", ".join(
                f"{t.upper()} {plain[t][0] / (figures[n][t][0] - figures[n][t][1] + plain[t][1]):.3f}"
                for t in ("set", "get")))
    finally:
        for s in sides.values():
            s.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--requests", type=int, default=400_000)
    ap.add_argument("--callgrind", action="store_true")
    a = ap.parse_args()
    if a.callgrind:
        return count(min(a.requests, 100_000))
    work = tempfile.mkdtemp(prefix="getset-watch-")
    sides = {"plain": Server(work)}
    for i, m in enumerate(MODULES.split(",")):
        sides[f"module{i}" if "," in MODULES else "module"] = Server(work, m)
    try:
        for s in sides.values():  # the same keys on every side
            bench(s.port, 200_000)
        names = list(sides)
        rate = {n: [] for n in names}
        cost = {n: [] for n in names}
        for rnd in range(a.rounds):
            order = names if rnd % 2 == 0 else names[::-1]
            for n in order:
                s = sides[n]
                if hasattr(s, "holder"):
                    s.watch()
                before = s.cpu_ns()
                r = bench(s.port, a.requests)
                used = s.cpu_ns() - before
                rate[n].append((r["GET"] + r["SET"]) / 2)
                cost[n].append(used / (2 * a.requests))
                print(f"round {rnd} {n:8} GET {r['GET']:>10.0f}/s SET {r['SET']:>10.0f}/s "
                      f"server CPU {cost[n][-1]:.0f} ns/request", flush=True)
        p_rate, p_cost = statistics.median(rate["plain"]), statistics.median(cost["plain"])
        for n in names[1:]:
            print(f"{n}: rate {statistics.median(rate[n]) / p_rate:.3f} of plain, "
                  f"CPU per request {p_cost / statistics.median(cost[n]):.3f} "
                  f"(plain / module; per round "
                  f"{', '.join(f'{pc / mc:.3f}' for pc, mc in zip(cost['plain'], cost[n]))})")
    finally:
        for s in sides.values():
            s.stop()


if __name__ == "__main__":
    sys.exit(main())
