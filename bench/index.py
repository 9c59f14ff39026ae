#!/usr/bin/env python3
"""What the key index costs (issue 32), side by side in one run, as ratios:

- memory: a server with the module, a ketama ring of itself, `DEBUG POPULATE <keys>` of names
  of 16 bytes (`kkkkkkkk:<n>`, the longest 16; the mean is printed), `used_memory` with
  `shard.key-index no`, then `yes` once INFO says `key_index:ready`: the bytes a key it costs;
- the build: from `CONFIG SET shard.key-index yes` to ready, while a client pings the server
  every millisecond (the longest PING: no main-thread step of the build may be long);
- writes: `redis-benchmark -P 16` of `SET`, `INCR` and `DEL` on random keys of a 1 000 000-key
  space (`-r`) that exist (made by a pipe first, and again before each DEL run), and `SET` of
  keys that do not exist yet (each makes a key the index adds), two servers with the module
  and a ring, one with the index on and one off, in interleaved rounds (server pinned to CPU
  0, redis-benchmark to CPU 1, as bench/run.py); the medians' ratio on / off.

Prints a section for bench/results.md. Standard library only.
"""

import argparse
import statistics
import subprocess
import sys
import threading
import time

import run as base
from fleet import Proc

NAME_PREFIX = "kkkkkkkk"


def start(name, index, pin=None):
    port = base.free_port()
    log = base.TMP / f"index-{name}.log"
    argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", str(base.TMP), "--logfile", str(log),
            "--enable-debug-command", "yes", "--dbfilename", f"index-{name}.rdb",
            "--loadmodule", str(base.MODULE), "self", "a", "key-index", "yes" if index else "no"]
    argv[0] = base.REDIS_SERVER
    p = Proc(argv, port, pin, log)
    c = base.Client(port)
    c.call("SHARD.RING", "SET", "ketama", "a", f"127.0.0.1:{port}", 1)
    return p, c


def info(c, field, section="shard"):
    text = c.call("INFO", section)
    text = text.decode() if isinstance(text, bytes) else text
    for line in text.splitlines():
        if line.startswith(field + ":"):
            return line.split(":", 1)[1]
    return None


def wait_ready(c, timeout=120):
    deadline = time.monotonic() + timeout
    while info(c, "shard_key_index") != "ready":
        if time.monotonic() > deadline:
            sys.exit("the key index did not get ready")
        time.sleep(0.001)


class Pinger(threading.Thread):
    def __init__(self, port):
        super().__init__(daemon=True)
        self.c = base.Client(port)
        self.stop_event = threading.Event()
        self.worst = 0.0

    def run(self):
        while not self.stop_event.is_set():
            t0 = time.perf_counter()
            self.c.call("PING")
            self.worst = max(self.worst, (time.perf_counter() - t0) * 1000)
            time.sleep(0.001)

    def finish(self):
        self.stop_event.set()
        self.join(10)
        return self.worst


def memory_and_build(keys):
    p, c = start("mem", index=False)
    try:
        c.call("DEBUG", "POPULATE", keys, NAME_PREFIX)
        names = [c.call("RANDOMKEY") for _ in range(2000)]
        mean_len = statistics.mean(len(n) for n in names)
        off = int(info(c, "used_memory", "memory"))
        pinger = Pinger(p.port)
        pinger.start()
        t0 = time.perf_counter()
        c.call("CONFIG", "SET", "shard.key-index", "yes")
        wait_ready(c)
        build_s = time.perf_counter() - t0
        worst_ping = pinger.finish()
        on = int(info(c, "used_memory", "memory"))
        held = int(info(c, "shard_key_index_keys"))
        if held != keys:
            sys.exit(f"the index holds {held} keys, not {keys}")
        return dict(mean_len=mean_len, per_key=(on - off) / keys, build_s=build_s,
                    worst_ping_ms=worst_ping,
                    heap_per_key=int(info(c, "shard_key_index_bytes")) / keys)
    finally:
        p.stop()


WRITES = {
    "SET": ["SET", "key:__rand_int__", "v"],
    "INCR": ["INCR", "ctr:__rand_int__"],
    "DEL": ["DEL", "key:__rand_int__"],
    "SET of new keys": ["SET", "new:__rand_int__", "v"],
}
SPACE = 1_000_000


def fill(port, prefix, value):
    """`prefix:<n>` for n below SPACE, named as redis-benchmark's `-r` names them (12 digits)."""
    data = b"".join(b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (
        len(k), k, len(value), value) for k in (b"%s:%012d" % (prefix, i) for i in range(SPACE)))
    subprocess.run(["redis-cli", "-p", str(port), "--pipe"], input=data, capture_output=True,
                   check=True)


def writes(rounds, n):
    """Medians of (off, on) per row. SET, INCR and DEL write keys that are there (the keys are
    made again before each DEL run); the last row makes new keys (a fresh name space each
    run, the `new:` keys removed first)."""
    servers = {on: start(f"w{int(on)}", index=on, pin=0) for on in (False, True)}
    rates = {(w, on): [] for w in WRITES for on in (False, True)}
    try:
        for p, c in servers.values():
            fill(p.port, b"key", b"v")
            fill(p.port, b"ctr", b"0")
        wait_ready(servers[True][1])
        for r in range(rounds):
            order = [(w, on) for w in WRITES for on in ((False, True) if r % 2 else (True, False))]
            for w, on in order:
                p, c = servers[on]
                if w == "DEL":
                    fill(p.port, b"key", b"v")
                if w.startswith("SET of new"):
                    c.call("EVAL", "for _, k in ipairs(redis.call('KEYS', 'new:*')) do "
                           "redis.call('UNLINK', k) end", 0)
                argv = ["-r", str(SPACE), *WRITES[w]]
                rates[(w, on)].append(base.redis_benchmark(p.port, True, argv, n, 50, 16))
        return {w: (statistics.median(rates[(w, False)]), statistics.median(rates[(w, True)]))
                for w in WRITES}
    finally:
        for p, _ in servers.values():
            p.stop()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=3_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--n", type=int, default=1_000_000, help="requests per write run")
    opts = parser.parse_args()
    base.TMP.mkdir(parents=True, exist_ok=True)
    mem = memory_and_build(opts.keys)
    print(mem, flush=True)
    w = writes(opts.rounds, opts.n)
    lines = [
        "## What the key index costs (issue 32)", "",
        f"`python3 bench/index.py --keys {opts.keys} --rounds {opts.rounds}` on "
        f"{base.first_line([base.REDIS_SERVER, '--version'])}.", "",
        "| figure | value | target |", "|---|---|---|",
        f"| used_memory, index on - off, a key ({opts.keys:,} keys, names of {mem['mean_len']:.1f} "
        f"bytes on average) | {mem['per_key']:.1f} bytes (the index's own count: "
        f"{mem['heap_per_key']:.1f}) | <= 32 |",
        f"| build of the index of {opts.keys:,} keys (CONFIG SET to ready) | "
        f"{mem['build_s']:.2f} s | < 2 s for 1 000 000 |",
        f"| longest PING during the build | {mem['worst_ping_ms']:.1f} ms | < 10 ms |",
    ]
    for name, (off, on) in w.items():
        target = "" if name.startswith("SET of new") else ">= 0.9"
        lines.append(f"| {name} -P 16, index on / off | {on:,.0f} / {off:,.0f} req/s: "
                     f"**{on / off:.2f}** | {target} |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
