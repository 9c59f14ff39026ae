#!/usr/bin/env python3
"""A fleet (issues 19 and 22): SHARD.CALL side by side with twemproxy, the blocked-client ceiling
and the plain commands; cluster clients (`redis-benchmark --cluster`) over a fleet with the
cluster protocol, against twemproxy and a real Redis Cluster; in interleaved rounds, as ratios.

Starts three servers with the module (n0 n1 n2, a ketama ring of the three, 100 000 keys
`key:000000000000`... each on its owner), Debian's `nutcracker` in front of the same three with the
same ring (md5, ketama, the node names, `server_connections: 1`), a C module on n0 whose command
blocks its client and unblocks it at once (bench/floor/block.c: the ceiling of any forwarded
call), and two single servers for the local rows (one with the module and a ring of itself, one
without the module). redis-benchmark (`-c 50 -r 100000`) measures every row; each row runs next
to its baseline in every round, in one order in odd rounds and the reverse in even ones.

CPU placement: none by default (five busy processes on two cores: the scheduler places them,
as on a user's machine; the issue's figures were taken that way). `--pin` puts the router (n0
or nutcracker) and the single servers on CPU 0, redis-benchmark and n1, n2 on CPU 1.

A second fleet of three with a `slots` ring and `shard.cluster-protocol yes`, and a real Redis
Cluster of three cluster-mode servers (`redis-cli --cluster create`), serve the cluster-client
rows; `-t get`/`-t set` name their own keys. Two single servers with a slots ring of themselves,
the protocol on and off, measure what the protocol costs a local GET.

Writes the section "A fleet" into bench/results.md (replacing an older one);
`python3 bench/fleet.py --help` lists the knobs. Standard library only.
"""

import argparse
import csv
import io
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as base  # noqa: E402  (the side-by-side helpers: servers, pinning, the floor build)

ROOT = base.ROOT
RESULTS = ROOT / "bench" / "results.md"
SECTION = "## A fleet: SHARD.CALL and cluster clients (issues 19 and 22)"
KEYS = 100_000
PIN = False
NAMES = ("n0", "n1", "n2")
MGET10 = ["MGET"] + ["key:__rand_int__"] * 10


def build(name):
    """Builds bench/floor/<name>.c like run.py builds the floor module."""
    cargo_home = Path(base.os.environ.get("CARGO_HOME", Path.home() / ".cargo"))
    headers = sorted(cargo_home.glob("registry/src/*/redis-module-*/src/include"),
                     key=base.version_key)
    out = base.TMP / f"{name}.so"
    base.TMP.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["gcc", "-O2", "-fPIC", "-shared", f"-I{headers[-1]}", "-o", str(out),
                           str(ROOT / "bench" / "floor" / f"{name}.c")], capture_output=True)
    if done.returncode != 0:
        sys.exit(f"{name}.c did not build: {done.stderr.decode()}")
    return out


class Proc:
    """A server or nutcracker on a free port, pinned, stopped at the end."""

    def __init__(self, argv, port, cpu, log):
        self.port = port
        self.log = log
        self.proc = subprocess.Popen(base.pinned(cpu, argv), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.STDOUT)
        for _ in range(200):
            try:
                c = base.Client(port)
                c.call("PING")
                c.close()
                return
            except (OSError, base.RedisError):
                time.sleep(0.05)
        self.stop()
        sys.exit(f"{argv[0]} on port {port} did not start; see {log}")

    def client(self):
        return base.Client(self.port)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def low_port():
    """A free port a cluster-mode server can use (its bus port is 10000 higher)."""
    while True:
        port = base.free_port()
        if port <= 55535:
            return port


def server(name, cpu, module=True, extra=(), cluster_port=False, config=(), self_name=None):
    port = low_port() if cluster_port else base.free_port()
    log = base.TMP / f"fleet-{name}.log"
    argv = [base.REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", str(base.TMP), "--logfile", str(log)]
    if module:
        argv += ["--loadmodule", str(base.MODULE), "self", self_name or name]
    for m in extra:
        argv += ["--loadmodule", str(m)]
    argv += list(config)
    return Proc(argv, port, cpu if PIN else None, log)


def real_cluster(procs):
    """Three cluster-mode servers (no module) joined by `redis-cli --cluster create`; returns
    the first one's port."""
    members = []
    for i in range(3):
        conf = base.TMP / f"real-cluster-{i}.conf"
        conf.unlink(missing_ok=True)
        s = server(f"real{i}", 0 if i == 0 else 1, module=False, cluster_port=True,
                   config=["--cluster-enabled", "yes", "--cluster-config-file", str(conf)])
        procs.append(s)
        members.append(s)
    made = subprocess.run(["redis-cli", "--cluster", "create",
                           *[f"127.0.0.1:{s.port}" for s in members], "--cluster-yes"],
                          capture_output=True, text=True, timeout=60)
    if made.returncode != 0:
        sys.exit(f"redis-cli --cluster create failed: {made.stdout}{made.stderr}")
    for _ in range(200):
        if all(b"cluster_state:ok" in s.client().call("CLUSTER", "INFO") for s in members):
            return members[0].port
        time.sleep(0.05)
    sys.exit("the real cluster did not reach cluster_state:ok")


def nutcracker(nodes, cpu):
    port, stats = base.free_port(), base.free_port()
    conf = base.TMP / "nutcracker.yml"
    conf.write_text("fleet:\n  listen: 127.0.0.1:%d\n  hash: md5\n  distribution: ketama\n"
                    "  redis: true\n  server_connections: 1\n  servers:\n%s" % (
                        port, "".join(f"   - 127.0.0.1:{s.port}:1 {n}\n" for n, s in nodes.items())))
    log = base.TMP / "nutcracker.log"
    return Proc(["nutcracker", "-c", str(conf), "-s", str(stats), "-o", str(log)], port,
                cpu if PIN else None, log)


def benchmark(port, command, n, pipeline, clients=50):
    """(requests/s, p50 ms, p99 ms) of one redis-benchmark run, or an error text. A command
    starting with an option (`--cluster -t get`) is passed as options, not as a command."""
    argv = ["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-c", str(clients),
            "-n", str(n), "-P", str(pipeline), "-r", str(KEYS), "--csv"] + [str(c) for c in command]
    run = subprocess.run(base.pinned(1 if PIN else None, argv), capture_output=True, text=True)
    rows = [r for r in csv.reader(io.StringIO(run.stdout)) if len(r) > 1 and r[0] != "test"]
    if run.returncode != 0 or not rows:
        return (run.stderr or run.stdout).strip().splitlines()[-1:] or ["no output"]
    r = rows[-1]
    return float(r[1]), float(r[4]), float(r[6])


class Row:
    def __init__(self, label, port, command, pipeline):
        self.label, self.port, self.command, self.pipeline = label, port, command, pipeline
        self.n = 0
        self.runs = []  # (rps, p50, p99)
        self.error = None

    def calibrate(self, seconds):
        n = 2000 * self.pipeline
        while True:
            got = benchmark(self.port, self.command, n, self.pipeline)
            if isinstance(got, list):
                self.error = got[0]
                return
            if n / got[0] >= 0.25:
                break
            n *= 4
        self.n = max(50 * self.pipeline, int(got[0] * seconds))

    def run(self):
        if self.error:
            return
        got = benchmark(self.port, self.command, self.n, self.pipeline)
        if isinstance(got, list):
            self.error = got[0]
        else:
            self.runs.append(got)

    def median(self, i):
        return statistics.median(r[i] for r in self.runs)


def fill(nodes):
    """KEYS keys, each written on its owner (as SHARD.WHEREIS says)."""
    keys = [b"key:%012d" % i for i in range(KEYS)]
    c = nodes["n0"].client()
    owners = []
    for i in range(0, KEYS, 5000):
        chunk = keys[i:i + 5000]
        c.sock.sendall(b"".join(b"*2\r\n$13\r\nSHARD.WHEREIS\r\n$16\r\n%s\r\n" % k for k in chunk))
        owners += [c._read().decode() for _ in chunk]
    c.close()
    for name, s in nodes.items():
        mine = [k for k, o in zip(keys, owners) if o == name]
        cl = s.client()
        for i in range(0, len(mine), 1000):
            args = ["MSET"]
            for k in mine[i:i + 1000]:
                args += [k, b"xxxxxxxx"]
            cl.call(*args)
        cl.close()
    return {n: owners.count(n) for n in nodes}


def ketama_fleet(procs, extra_n0=(), tag=""):
    """Three servers with the module (`self` n0 n1 n2; n0 on CPU 0 with `extra_n0` loaded too),
    a ketama ring of the three, KEYS keys each on its owner. Each server joins `procs` as it
    starts (the caller stops them); `tag` prefixes the log names, so that two fleets (bench/
    compare.py: two builds of the module) can run side by side. Returns (nodes, keys per node)."""
    nodes = {}
    for n in NAMES:
        nodes[n] = server(tag + n, 0 if n == "n0" else 1, extra=extra_n0 if n == "n0" else (),
                          self_name=n)
        procs.append(nodes[n])
    ring = ["SHARD.RING", "SET", "ketama"]
    for n, s in nodes.items():
        ring += [n, f"127.0.0.1:{s.port}", 1]
    for s in nodes.values():
        s.client().call(*ring)
    return nodes, fill(nodes)


def protocol_fleet(procs, tag=""):
    """Three servers with the module (`self` n0 n1 n2) on a slots ring of the three with
    `shard.cluster-protocol yes`, for `redis-benchmark --cluster`; empty. Each joins `procs`
    as it starts; `tag` as in ketama_fleet. Returns {name: Proc}."""
    proto = {}
    for n in NAMES:
        proto[n] = server(f"{tag}c{n}", 0 if n == "n0" else 1, self_name=n)
        procs.append(proto[n])
    slots = ["SHARD.RING", "SET", "slots"]
    for n, s in proto.items():
        slots += [n, f"127.0.0.1:{s.port}", 1]
    for s in proto.values():
        c = s.client()
        c.call(*slots)
        c.call("CONFIG", "SET", "shard.cluster-protocol", "yes")
    return proto


def write_section(out, title, section):
    """Puts `section` (starting with its `title` line) into the results file, in place of an
    older one of the same title."""
    text = out.read_text() if out.exists() else ""
    if title in text:
        head, _, rest = text.partition(title)
        nxt = rest.find("\n## ", 1)
        text = head + section + (rest[nxt + 1:] if nxt >= 0 else "")
    else:
        text = text.rstrip() + "\n\n" + section
    out.write_text(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--pin", action="store_true", help="pin the processes to CPUs (see above)")
    opts = ap.parse_args()
    global PIN
    PIN = opts.pin
    started = time.time()
    if subprocess.run(["which", "nutcracker"], capture_output=True).returncode != 0:
        sys.exit("nutcracker is missing: `make bench` installs it (Debian's nutcracker)")
    block = build("block")
    procs = []
    try:
        nodes, spread = ketama_fleet(procs, extra_n0=[block])
        twem = nutcracker(nodes, 0)
        procs.append(twem)
        local = server("n0", 0)
        plain = server("plain", 0, module=False)
        procs += [local, plain]
        local.client().call("SHARD.RING", "SET", "ketama", "n0", f"127.0.0.1:{local.port}", 1)
        for s in (local, plain):
            c = s.client()
            for i in range(0, KEYS, 1000):
                args = ["MSET"]
                for k in range(i, i + 1000):
                    args += [b"key:%012d" % k, b"xxxxxxxx"]
                c.call(*args)
            c.close()
        # Issue 22: the same three nodes on a slots ring with the cluster protocol on would
        # change the rows above; a second fleet of three, and a real Redis Cluster of three
        # cluster-mode servers, measured with redis-benchmark --cluster.
        proto = protocol_fleet(procs)
        real = real_cluster(procs)
        on, off = server("on", 0, self_name="n0"), server("off", 0, self_name="n0")
        procs += [on, off]
        for s, mode in ((on, "yes"), (off, "no")):
            c = s.client()
            c.call("SHARD.RING", "SET", "slots", "n0", f"127.0.0.1:{s.port}", 1)
            c.call("CONFIG", "SET", "shard.cluster-protocol", mode)
            # One SET per key (an MSET of keys of several slots is CROSSSLOT with the
            # protocol on, as in cluster mode).
            for i in range(0, KEYS, 1000):
                c.sock.sendall(b"".join(b"*3\r\n$3\r\nSET\r\n$16\r\nkey:%012d\r\n$8\r\nxxxxxxxx\r\n" % k
                                        for k in range(i, i + 1000)))
                for _ in range(1000):
                    c._read()
        n0, tw = nodes["n0"].port, twem.port
        get, set_ = ["GET", "key:__rand_int__"], ["SET", "key:__rand_int__", "xxxxxxxx"]
        call = ["SHARD.CALL"]
        rows = {
            "call_get1": Row("SHARD.CALL GET via n0, -P 1", n0, call + get, 1),
            "twem_get1": Row("GET via twemproxy, -P 1", tw, get, 1),
            "call_set1": Row("SHARD.CALL SET via n0, -P 1", n0, call + set_, 1),
            "twem_set1": Row("SET via twemproxy, -P 1", tw, set_, 1),
            "call_get16": Row("SHARD.CALL GET via n0, -P 16", n0, call + get, 16),
            "ceil16": Row("block and unblock at once on n0 (the ceiling), -P 16", n0,
                          ["BLOCK.NOW"], 16),
            "twem_get16": Row("GET via twemproxy, -P 16", tw, get, 16),
            "call_set16": Row("SHARD.CALL SET via n0, -P 16", n0, call + set_, 16),
            "twem_set16": Row("SET via twemproxy, -P 16", tw, set_, 16),
            "call_mget1": Row("SHARD.CALL MGET of 10 keys via n0, -P 1", n0, call + MGET10, 1),
            "twem_mget1": Row("MGET of 10 keys via twemproxy, -P 1", tw, MGET10, 1),
            "call_mget16": Row("SHARD.CALL MGET of 10 keys via n0, -P 16", n0, call + MGET10, 16),
            "twem_mget16": Row("MGET of 10 keys via twemproxy, -P 16", tw, MGET10, 16),
            "local1": Row("SHARD.CALL GET, keys all local (ring of one), -P 1", local.port,
                          call + get, 1),
            "plain_mod1": Row("GET on the same server, -P 1", local.port, get, 1),
            "local16": Row("SHARD.CALL GET, keys all local (ring of one), -P 16", local.port,
                           call + get, 16),
            "plain_mod16": Row("GET on the same server (module loaded, ring set), -P 16",
                               local.port, get, 16),
            "plain16": Row("GET on a server without the module, -P 16", plain.port, get, 16),
            "proto_get16": Row("redis-benchmark --cluster GET over the fleet (cluster protocol), -P 16",
                               proto["n0"].port, ["--cluster", "-t", "get"], 16),
            "real_get16": Row("redis-benchmark --cluster GET on a real 3-node Redis Cluster, -P 16",
                              real, ["--cluster", "-t", "get"], 16),
            "twem_tget16": Row("redis-benchmark -t get through twemproxy, -P 16", tw,
                               ["-t", "get"], 16),
            "proto_set16": Row("redis-benchmark --cluster SET over the fleet (cluster protocol), -P 16",
                               proto["n0"].port, ["--cluster", "-t", "set"], 16),
            "real_set16": Row("redis-benchmark --cluster SET on a real 3-node Redis Cluster, -P 16",
                              real, ["--cluster", "-t", "set"], 16),
            "twem_tset16": Row("redis-benchmark -t set through twemproxy, -P 16", tw,
                               ["-t", "set"], 16),
            "on16": Row("GET of local keys, cluster protocol on, -P 16", on.port, get, 16),
            "off16": Row("GET of local keys, cluster protocol off, -P 16", off.port, get, 16),
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

    def ratio(key, against, target=None, also=None):
        a, b = rows[key], rows[against]
        if a.error or b.error or not a.runs or not b.runs:
            table.append((a.label, f"refused: {a.error or b.error}", b.label, "", "", "",
                          "" if target is None else f"≥ {target:g}", "MISS" if target else ""))
            return
        r = statistics.median(x[0] / y[0] for x, y in zip(a.runs, b.runs))
        extra = ""
        if also:
            c = rows[also]
            if c.runs:
                extra = f" ({statistics.median(x[0] / y[0] for x, y in zip(a.runs, c.runs)):.2f} × {c.label})"
        table.append((a.label, f"{base.rate(a.median(0))} req/s", b.label,
                      f"{base.rate(b.median(0))} req/s", f"{r:.2f}{extra}",
                      f"{a.median(1):.2f} / {a.median(2):.2f} ms; {b.median(1):.2f} / {b.median(2):.2f} ms",
                      "" if target is None else f"≥ {target:g}",
                      "" if target is None else ("PASS" if r >= target else "MISS")))

    ratio("call_get1", "twem_get1", 1.0)
    ratio("call_set1", "twem_set1", 1.0)
    ratio("call_get16", "ceil16", 0.8, also="twem_get16")
    ratio("call_set16", "ceil16", 0.8, also="twem_set16")
    ratio("local1", "plain_mod1", 0.9)
    ratio("local16", "plain_mod16", 0.9)
    ratio("plain_mod16", "plain16", 0.97)
    ratio("call_mget1", "twem_mget1", 1.0)
    ratio("call_mget16", "twem_mget16")
    ratio("twem_get16", "ceil16")
    ratio("proto_get16", "twem_tget16", 2.0, also="real_get16")
    ratio("proto_get16", "real_get16", 0.95)
    ratio("proto_set16", "twem_tset16", 2.0, also="real_set16")
    ratio("proto_set16", "real_set16", 0.95)
    ratio("on16", "off16", 0.9)

    lines = [SECTION, "",
             f"Written by `make bench` (bench/fleet.py), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
             f"in {time.time() - started:.0f} s, {opts.rounds} interleaved rounds of runs of about "
             f"{opts.seconds:g} s, `redis-benchmark -c 50 -r {KEYS}`. Three servers with the module "
             "(a ketama ring n0 n1 n2), twemproxy (Debian's nutcracker, md5/ketama, the same names) "
             "in front of the same three, the blocked-client ceiling on n0. "
             + ("CPU 0: the router (n0 or nutcracker) and the single servers of the local rows; "
                "CPU 1: redis-benchmark, n1, n2. " if PIN else
                "No process pinned to a CPU (five busy processes on two cores). ")
             + "Ratios are medians of the rounds' ratios; latencies are medians of p50 / p99.", "",
             "| what | measured | baseline | baseline figure | ratio | p50 / p99: row; baseline | target | result |",
             "|---|---|---|---|---|---|---|---|"]
    lines += ["| " + " | ".join(t) + " |" for t in table]
    lines += ["", "Every run (requests/s per round):", "",
              "| row | -P | -n | rates |", "|---|---|---|---|"]
    for row in rows.values():
        lines.append(f"| {row.label} | {row.pipeline} | {row.n} | "
                     f"{', '.join(base.rate(x[0]) for x in row.runs) or row.error} |")
    section = "\n".join(lines) + "\n"
    write_section(Path(opts.out), SECTION, section)
    print("\n" + section)
    print(f"{sum(t[-1] == 'PASS' for t in table)} targets pass, "
          f"{sum(t[-1] == 'MISS' for t in table)} miss; written to {opts.out}")


if __name__ == "__main__":
    main()
