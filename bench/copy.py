#!/usr/bin/env python3
"""Resharding speed (issue 21): SHARD.RESHARD COPY and CLEANUP side by side with Valkey's atomic
slot migration, the client-side `MIGRATE ... KEYS` method of `redis-cli --cluster reshard`, and
the destination's `RESTORE` ceiling, in interleaved rounds, as ratios.

Each round, for each contender, starts fresh servers and fills the source with `DEBUG POPULATE
<keys> key 42` (small strings), then moves three quarters of them:

- shard: two servers with the module, a ketama ring of the source only, then `SHARD.RING BEGIN`
  of source:1 destination:3 on both; `SHARD.RESHARD COPY` on the source, timed until STATUS says
  done. Then `SHARD.RING COMMIT` and `SHARD.RESHARD CLEANUP` on the source, timed the same way.
- valkey-asm: two `valkey-server` in cluster mode (ports <= 55535), `CLUSTER ADDSLOTSRANGE 0
  16383` on the first, `CLUSTER MEET`, then `CLUSTER MIGRATESLOTS SLOTSRANGE 0 12287 NODE <id>`,
  timed until `CLUSTER GETSLOTMIGRATIONS` says success.
- migrate-script: what `redis-cli --cluster reshard` does, from a client: `SCAN`, the owners
  (`SHARD.WHEREIS`, pipelined), `MIGRATE host port "" 0 5000 COPY KEYS` 10 keys per call (on a
  tenth of the keys: it is slow).
- restore-ceiling: `redis-cli --pipe` of the very `RESTORE ... ABSTTL` commands of the moving keys
  (their `DUMP` payloads) into an empty server with the module.
- unlink-pipe: `redis-cli --pipe` of `UNLINK` of the moving keys (the CLEANUP baseline).

While shard's and Valkey's copies run, a client pings the source in a loop (p99 and max), and in
separate rounds `redis-benchmark -t get` measures the source's GET rate during the copy against
the same source idle.

Writes the section "Resharding speed" into bench/results.md. Standard library only.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as base  # noqa: E402
import fleet  # noqa: E402

ROOT = base.ROOT
RESULTS = ROOT / "bench" / "results.md"
SECTION = "## Resharding speed (issue 21)"
VALKEY = os.environ.get("VALKEY_SERVER") or None


def start(binary, module=True, cluster=False, name="s"):
    port = fleet.low_port() if cluster else base.free_port()
    log = base.TMP / f"copy-{name}.log"
    argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
            "no", "--dir", str(base.TMP), "--logfile", str(log), "--enable-debug-command", "yes"]
    if module:
        argv += ["--loadmodule", str(base.MODULE), "self", name]
    if cluster:
        conf = base.TMP / f"copy-{name}-{port}.conf"
        conf.unlink(missing_ok=True)
        argv += ["--cluster-enabled", "yes", "--cluster-config-file", str(conf)]
    return fleet.Proc(argv, port, None, log)


def client(proc):
    return base.Client(proc.port)


def pipelined(c, commands):
    """Sends every command, then reads every reply (errors as RedisError objects)."""
    c.sock.sendall(b"".join(resp(*cmd) for cmd in commands))
    out = []
    for _ in commands:
        try:
            out.append(c._read())
        except base.RedisError as e:
            out.append(e)
    return out


class Pinger(threading.Thread):
    """PINGs a server every millisecond until stopped; latencies in ms. (A tight loop would eat a
    core of this 2-core machine, and eat it only while the server answers: a stalled server
    would win CPU for its migration.)"""

    def __init__(self, port):
        super().__init__(daemon=True)
        self.c = base.Client(port)
        self.stop_event = threading.Event()
        self.lat = []

    def run(self):
        while not self.stop_event.is_set():
            t0 = time.perf_counter()
            self.c.call("PING")
            self.lat.append((time.perf_counter() - t0) * 1000)
            time.sleep(0.001)

    def finish(self):
        self.stop_event.set()
        self.join(10)
        lat = sorted(self.lat) or [0.0]
        return lat[int(0.99 * (len(lat) - 1))], lat[-1]


def wait_status(c, busy, timeout=600):
    deadline = time.monotonic() + timeout
    while True:
        st = c.call("SHARD.RESHARD", "STATUS")
        st = dict(zip(st[::2], st[1::2]))
        if st[b"state"] not in busy:
            return st
        if time.monotonic() > deadline:
            sys.exit(f"job still running: {st}")
        time.sleep(0.002)


def shard_pair(keys):
    a, b = start(base.REDIS_SERVER, name="a"), start(base.REDIS_SERVER, name="b")
    ca, cb = client(a), client(b)
    ca.call("DEBUG", "POPULATE", keys, "key", 42)
    for c in (ca, cb):
        c.call("SHARD.RING", "SET", "ketama", "a", f"127.0.0.1:{a.port}", 1)
        c.call("SHARD.RING", "BEGIN", "ketama", "a", f"127.0.0.1:{a.port}", 1,
               "b", f"127.0.0.1:{b.port}", 3)
    return a, b, ca, cb


def shard_round(keys, with_gets=False):
    """Copy then cleanup; (copied, copy s, ping p99, ping max, deleted, cleanup s, cleanup max
    ping, gets during / idle)."""
    a, b, ca, cb = shard_pair(keys)
    try:
        idle = gets(a.port) if with_gets else None
        pinger = Pinger(a.port)
        pinger.start()
        t0 = time.perf_counter()
        ca.call("SHARD.RESHARD", "COPY")
        during = gets(a.port) if with_gets else None
        st = wait_status(ca, (b"copying",))
        copy_s = time.perf_counter() - t0
        p99, pmax = pinger.finish()
        if st[b"state"] != b"done":
            sys.exit(f"copy failed: {st}")
        copied = st[b"copied"]
        for c in (ca, cb):
            c.call("SHARD.RING", "COMMIT")
        pinger = Pinger(a.port)
        pinger.start()
        t0 = time.perf_counter()
        ca.call("SHARD.RESHARD", "CLEANUP")
        st2 = wait_status(ca, (b"cleaning",))
        clean_s = time.perf_counter() - t0
        _, cmax = pinger.finish()
        return dict(copied=copied, copy_s=copy_s, p99=p99, max=pmax, deleted=st2[b"deleted"],
                    clean_s=clean_s, clean_max=cmax, during=during, idle=idle)
    finally:
        for p in (a, b):
            p.stop()


def gets(port):
    """GET requests/s at the server (redis-benchmark, 20 clients, about a second)."""
    out = subprocess.run(["redis-benchmark", "-p", str(port), "-t", "get", "-n", "60000", "-c",
                          "20", "-r", "1000000", "--csv"], capture_output=True, text=True,
                         timeout=120).stdout
    for line in out.splitlines():
        if line.startswith('"GET"'):
            return float(line.split(",")[1].strip('"'))
    return 0.0


def valkey_round(keys):
    a = start(VALKEY, module=False, cluster=True, name="va")
    b = start(VALKEY, module=False, cluster=True, name="vb")
    try:
        ca, cb = client(a), client(b)
        ca.call("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
        ca.call("CLUSTER", "MEET", "127.0.0.1", b.port)
        for _ in range(400):
            if all(b"cluster_state:ok" in c.call("CLUSTER", "INFO") and
                   c.call("CLUSTER", "INFO").count(b"cluster_known_nodes:2") for c in (ca, cb)):
                break
            time.sleep(0.05)
        ca.call("DEBUG", "POPULATE", keys, "key", 42)
        target = cb.call("CLUSTER", "MYID").decode()
        pinger = Pinger(a.port)
        pinger.start()
        t0 = time.perf_counter()
        ca.call("CLUSTER", "MIGRATESLOTS", "SLOTSRANGE", 0, 12287, "NODE", target)
        deadline = time.monotonic() + 600
        while True:
            jobs = ca.call("CLUSTER", "GETSLOTMIGRATIONS")
            states = [dict(zip(j[::2], j[1::2])).get(b"state") for j in jobs]
            if states and all(s == b"success" for s in states):
                break
            if any(s in (b"failed", b"cancelled") for s in states) or time.monotonic() > deadline:
                sys.exit(f"valkey migration did not succeed: {jobs}")
            time.sleep(0.002)
        secs = time.perf_counter() - t0
        p99, pmax = pinger.finish()
        moved = cb.call("DBSIZE")
        return dict(copied=moved, copy_s=secs, p99=p99, max=pmax)
    finally:
        for p in (a, b):
            p.stop()


def script_round(keys):
    """The redis-cli --cluster reshard method from a client, on a tenth of the keys."""
    a, b, ca, cb = shard_pair(keys // 10)
    try:
        moved = 0
        t0 = time.perf_counter()
        cursor = b"0"
        while True:
            cursor, names = ca.call("SCAN", cursor, "COUNT", 1000)
            owners = pipelined(ca, [("SHARD.WHEREIS", k) for k in names])
            moving = [k for k, o in zip(names, owners) if o == b"b"]
            for i in range(0, len(moving), 10):
                batch = moving[i:i + 10]
                ca.call("MIGRATE", "127.0.0.1", b.port, "", 0, 5000, "COPY", "KEYS", *batch)
                moved += len(batch)
            if cursor == b"0":
                break
        return dict(copied=moved, copy_s=time.perf_counter() - t0)
    finally:
        for p in (a, b):
            p.stop()


def resp(*args):
    out = [b"*%d\r\n" % len(args)]
    for x in args:
        x = x if isinstance(x, bytes) else str(x).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(x), x))
    return b"".join(out)


def pipe_round(keys):
    """(RESTORE ceiling keys/s, UNLINK pipe keys/s) for the moving keys."""
    a, b, ca, cb = shard_pair(keys)
    try:
        restores, unlinks = [], []
        cursor = b"0"
        while True:
            cursor, names = ca.call("SCAN", cursor, "COUNT", 1000)
            owners = pipelined(ca, [("SHARD.WHEREIS", k) for k in names])
            moving = [k for k, o in zip(names, owners) if o == b"b"]
            for k, payload in zip(moving, pipelined(ca, [("DUMP", k) for k in moving])):
                restores.append(resp("RESTORE", k, 0, payload, "ABSTTL"))
                unlinks.append(resp("UNLINK", k))
            if cursor == b"0":
                break
        rates = []
        for target, commands in ((b, restores), (a, unlinks)):
            with tempfile.NamedTemporaryFile(dir=base.TMP, delete=False) as f:
                f.write(b"".join(commands))
            t0 = time.perf_counter()
            with open(f.name, "rb") as stdin:
                subprocess.run(["redis-cli", "-p", str(target.port), "--pipe"], stdin=stdin,
                               capture_output=True, timeout=600, check=True)
            rates.append(len(commands) / (time.perf_counter() - t0))
            os.unlink(f.name)
        return rates
    finally:
        for p in (a, b):
            p.stop()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", default="shard,valkey,script,pipes,gets",
                        help="which contenders to run (comma-separated)")
    opts = parser.parse_args()
    wanted = set(opts.rows.split(","))
    base.TMP.mkdir(parents=True, exist_ok=True)
    rows = {k: [] for k in ("shard", "valkey", "script", "ceiling", "unlink", "gets")}
    for r in range(opts.rounds):
        order = [w for w in ["shard", "valkey", "script", "pipes", "gets"] if w in wanted]
        if r % 2:
            order.reverse()
        for what in order:
            print(f"round {r + 1}: {what} ...", flush=True)
            if what == "shard":
                rows["shard"].append(shard_round(opts.keys))
            elif what == "valkey" and VALKEY:
                rows["valkey"].append(valkey_round(opts.keys))
            elif what == "script":
                rows["script"].append(script_round(opts.keys))
            elif what == "pipes":
                ceiling, unlink = pipe_round(opts.keys)
                rows["ceiling"].append(ceiling)
                rows["unlink"].append(unlink)
            elif what == "gets":
                rows["gets"].append(shard_round(opts.keys, with_gets=True))
    med = statistics.median
    rate = lambda d: d["copied"] / d["copy_s"]  # noqa: E731
    shard_rate = med(rate(d) for d in rows["shard"])
    clean_rate = med(d["deleted"] / d["clean_s"] for d in rows["shard"])
    lines = [SECTION, "",
             f"`python3 bench/copy.py --keys {opts.keys} --rounds {opts.rounds}` on "
             f"{base.first_line([base.REDIS_SERVER, '--version'])}; Valkey: "
             f"{base.first_line([VALKEY, '--version']) if VALKEY else 'not run'}. "
             "Medians of the rounds; each round starts fresh servers.", "",
             "| row | keys/s | ratio | target |", "|---|---|---|---|"]
    copied = med(d["copied"] for d in rows["shard"])
    lines.append(f"| SHARD.RESHARD COPY ({copied:.0f} of {opts.keys} keys moving) | "
                 f"{shard_rate:,.0f} | | |")
    if rows["valkey"]:
        v = med(rate(d) for d in rows["valkey"])
        lines.append(f"| Valkey atomic slot migration (same keys, 12288 slots) | {v:,.0f} | "
                     f"COPY / it: **{shard_rate / v:.2f}** | >= 0.5 |")
    if rows["script"]:
        s = med(rate(d) for d in rows["script"])
        lines.append(f"| client MIGRATE ... KEYS, 10 per call | {s:,.0f} | COPY / it: "
                     f"{shard_rate / s:.1f} | |")
    if rows["ceiling"]:
        c = med(rows["ceiling"])
        lines.append(f"| RESTORE ceiling (redis-cli --pipe into the destination) | {c:,.0f} | "
                     f"COPY / it: {shard_rate / c:.2f} | |")
        u = med(rows["unlink"])
        lines.append(f"| SHARD.RESHARD CLEANUP | {clean_rate:,.0f} | CLEANUP / UNLINK pipe: "
                     f"**{clean_rate / u:.2f}** | >= 0.7 |")
        lines.append(f"| UNLINK pipe (redis-cli --pipe) | {u:,.0f} | | |")
    lines += ["", "| during the copy | PING p99 ms | PING max ms | target |", "|---|---|---|---|"]
    lines.append(f"| shard COPY | {med(d['p99'] for d in rows['shard']):.2f} | "
                 f"{max(d['max'] for d in rows['shard']):.1f} | p99 < 2, max < 10 |")
    lines.append(f"| shard CLEANUP | | {max(d['clean_max'] for d in rows['shard']):.1f} | max < 10 |")
    if rows["valkey"]:
        lines.append(f"| Valkey migration | {med(d['p99'] for d in rows['valkey']):.2f} | "
                     f"{max(d['max'] for d in rows['valkey']):.1f} | |")
    g = [d["during"] / d["idle"] for d in rows["gets"] if d["idle"]]
    if g:
        lines += ["", f"GET at the source during COPY / idle: **{med(g):.2f}** (target >= 0.70; "
                  f"{', '.join(f'{x:.2f}' for x in g)})."]
    section = "\n".join(lines) + "\n"
    print(section)
    if wanted == {"shard", "valkey", "script", "pipes", "gets"}:
        fleet.write_section(RESULTS, SECTION, section)


if __name__ == "__main__":
    main()
