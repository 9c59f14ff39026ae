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

Two more rows, on data of their own:

- bigkeys: the shard pair above, empty, then a sorted set of `--big-members` members (score
  i * 0.5, member m<i>) and a hash of as many fields, both with a PEXPIREAT an hour ahead, named
  so that both move (`SHARD.WHEREIS` under the BEGIN ring), filled by a Lua script 1000 elements
  per command. `SHARD.RESHARD COPY` timed until done (the keys travel in pieces: big-key-bytes,
  big-key-elements) while one client pings the source and another the destination; then the
  copy is checked whole: sizes, PEXPIRETIME on both sides, the sorted set by `ZRANGE ...
  WITHSCORES` in chunks of 100 000 and the hash by `HGETALL` on both sides, and `DEBUG
  DIGEST-VALUE` (any mismatch exits non-zero). Valkey: the same two keys, in slots 0-12287 of
  the two-node cluster above, moved by the same `CLUSTER MIGRATESLOTS`, pinged the same way.
- grow: a whole grow 3 -> 4. Three servers with the module (n0 n1 n2, a ketama ring of the
  three) hold 3 x `--grow-keys` small strings between them, each only its own (each populates
  the same `DEBUG POPULATE <3 x grow-keys> key 42`, then `SHARD.RESHARD CLEANUP` leaves it the
  keys the ring gives it), plus an empty n3. Timed as one wall time: `SHARD.RING BEGIN` of the
  four on all four, `SHARD.RESHARD COPY` on n0 n1 n2 at once until all three are done, `SHARD.RING
  COMMIT` on all four, `SHARD.RESHARD CLEANUP` on n0 n1 n2 at once until done; checked after
  (DBSIZE sums to 3 x grow-keys, n3 holds what was copied, 2000 random keys per node are its
  own). Valkey: four cluster-mode servers, slots 0-5460, 5461-10922, 10923-16383 on three of
  them, `--grow-keys` keys each in its own slots (`DEBUG POPULATE` ignores slot ownership, so
  it runs once per owned slot with a hash tag `{t}` of that slot as the prefix), then
  `CLUSTER MIGRATESLOTS` of the top 1365, 1365 and 1366 slots of each (4096 slots, a quarter)
  to the fourth, started at once, timed until `CLUSTER GETSLOTMIGRATIONS` says success on all
  three, and until the sources have dropped the moved keys.
- grow-slots: the same grow on a `slots` ring of n0 n1 n2 (each populated, then cleaned to its
  own keys), by one `SHARD.RESHARD START` of the four on n0, which moves the fewest slots (4096,
  a quarter); timed from START until the coordinator's fleet phase is `done` (copies, commit,
  cleanups and the coordinator's own steps); checked after (DBSIZE sums as before).

Writes the section "Resharding speed" into bench/results.md (only when every row ran).
Standard library only.
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
# `KEY_INDEX=yes`: the servers with the module keep the key index (`shard.key-index`).
KEY_INDEX = os.environ.get("KEY_INDEX") or "no"


def start(binary, module=True, cluster=False, name="s"):
    port = fleet.low_port() if cluster else base.free_port()
    log = base.TMP / f"copy-{name}.log"
    argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
            "no", "--dir", str(base.TMP), "--logfile", str(log), "--enable-debug-command", "yes"]
    if module:
        argv += ["--loadmodule", str(base.MODULE), "self", name]
        if KEY_INDEX == "yes":
            argv += ["key-index", "yes"]
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
    if keys:
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


def valkey_cluster(ranges, name="v"):
    """Cluster-mode valkey-servers, one per entry of `ranges` (a (first, last) slot range to own,
    or None), met and agreeing that the cluster is ok; (procs, clients)."""
    procs = []
    try:
        for i in range(len(ranges)):
            procs.append(start(VALKEY, module=False, cluster=True, name=f"{name}{i}"))
        cs = [client(p) for p in procs]
        for c, r in zip(cs, ranges):
            if r:
                c.call("CLUSTER", "ADDSLOTSRANGE", *r)
        for p in procs[1:]:
            cs[0].call("CLUSTER", "MEET", "127.0.0.1", p.port)
        known = b"cluster_known_nodes:%d" % len(procs)
        for _ in range(400):
            infos = [c.call("CLUSTER", "INFO") for c in cs]
            if all(b"cluster_state:ok" in i and known in i for i in infos):
                break
            time.sleep(0.05)
        else:
            sys.exit(f"the valkey cluster did not agree: {infos}")
        return procs, cs
    except BaseException:
        for p in procs:
            p.stop()
        raise


def wait_migrations(c, timeout=600):
    """Waits until every job `CLUSTER GETSLOTMIGRATIONS` lists at `c` says success."""
    deadline = time.monotonic() + timeout
    while True:
        jobs = c.call("CLUSTER", "GETSLOTMIGRATIONS")
        states = [dict(zip(j[::2], j[1::2])).get(b"state") for j in jobs]
        if states and all(s == b"success" for s in states):
            return
        if any(s in (b"failed", b"cancelled") for s in states) or time.monotonic() > deadline:
            sys.exit(f"valkey migration did not succeed: {jobs}")
        time.sleep(0.002)


def valkey_round(keys):
    (a, b), (ca, cb) = valkey_cluster([(0, 16383), None], name="va")
    try:
        ca.call("DEBUG", "POPULATE", keys, "key", 42)
        target = cb.call("CLUSTER", "MYID").decode()
        pinger = Pinger(a.port)
        pinger.start()
        t0 = time.perf_counter()
        ca.call("CLUSTER", "MIGRATESLOTS", "SLOTSRANGE", 0, 12287, "NODE", target)
        wait_migrations(ca)
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


# --------------------------------------------------------------------------- big keys


FILL_BIG = ("local n = tonumber(ARGV[1]) local kind = ARGV[2] "
            "for i = 1, n, 1000 do local args = {} "
            " for j = i, math.min(n, i + 999) do "
            "  if kind == 'hash' then table.insert(args, 'f' .. j) table.insert(args, 'v' .. j) "
            "  else table.insert(args, j * 0.5) table.insert(args, 'm' .. j) end end "
            " if kind == 'hash' then redis.call('HSET', KEYS[1], unpack(args)) "
            " else redis.call('ZADD', KEYS[1], unpack(args)) end end return 1")


def fill_big(c, zset, hash_, members):
    """The sorted set and the hash of `members` elements each, expiring in about an hour."""
    c.call("EVAL", FILL_BIG, 1, zset, members, "zset")
    c.call("EVAL", FILL_BIG, 1, hash_, members, "hash")
    at = int(time.time() * 1000) + 3_600_000
    c.call("PEXPIREAT", zset, at)
    c.call("PEXPIREAT", hash_, at + 1)
    return at


def check_big(src, dst, zset, hash_, members, who):
    """Exits non-zero unless `dst` holds exactly `src`'s two keys, TTLs included."""
    bad = []
    if dst.call("ZCARD", zset) != members or dst.call("HLEN", hash_) != members:
        bad.append(f"sizes {dst.call('ZCARD', zset)} / {dst.call('HLEN', hash_)}")
    for k in (zset, hash_):
        ta, tb = src.call("PEXPIRETIME", k), dst.call("PEXPIRETIME", k)
        if ta != tb or tb <= 0:
            bad.append(f"PEXPIRETIME of {k}: {ta} at the source, {tb} at the destination")
        da, db = (c.call("DEBUG", "DIGEST-VALUE", k) for c in (src, dst))
        if da != db:
            bad.append(f"DEBUG DIGEST-VALUE of {k} differs")
    for i in range(0, members, 100_000):
        za, zb = (c.call("ZRANGE", zset, i, i + 99_999, "WITHSCORES") for c in (src, dst))
        if za != zb:
            bad.append(f"ZRANGE {i} {i + 99_999} differs")
            break
    ha, hb = (c.call("HGETALL", hash_) for c in (src, dst))
    ha, hb = dict(zip(ha[::2], ha[1::2])), dict(zip(hb[::2], hb[1::2]))
    if ha != hb or len(ha) != members:
        bad.append(f"HGETALL differs ({len(ha)} / {len(hb)} fields)")
    if bad:
        sys.exit(f"{who}: the big keys did not arrive whole: {'; '.join(bad)}")


def shard_bigkeys_round(members):
    """(copy s, source ping p99 and max, destination ping max), the copy checked whole."""
    a, b, ca, cb = shard_pair(0)
    try:
        zset, hash_ = (next(n for n in (f"{kind}:{i}" for i in range(1000))
                            if ca.call("SHARD.WHEREIS", n) == b"b")
                       for kind in ("bigzset", "bighash"))
        fill_big(ca, zset, hash_, members)
        src, dst = Pinger(a.port), Pinger(b.port)
        src.start()
        dst.start()
        t0 = time.perf_counter()
        ca.call("SHARD.RESHARD", "COPY")
        st = wait_status(ca, (b"copying",))
        copy_s = time.perf_counter() - t0
        p99, pmax = src.finish()
        _, dmax = dst.finish()
        if st[b"state"] != b"done" or st[b"copied"] != 2 or st[b"failed"] != 0:
            sys.exit(f"big keys copy failed: {st}")
        check_big(ca, cb, zset, hash_, members, "shard")
        if cb.call("KEYS", "__shard_piece__:*"):
            sys.exit("shard: pieces of the big keys were left behind at the destination")
        return dict(copy_s=copy_s, p99=p99, max=pmax, dmax=dmax)
    finally:
        for p in (a, b):
            p.stop()


def valkey_bigkeys_round(members):
    """The same two keys (in slots that move) under Valkey's slot migration."""
    (a, b), (ca, cb) = valkey_cluster([(0, 16383), None], name="vbig")
    try:
        zset, hash_ = (next(n for n in (f"{kind}:{i}" for i in range(1000))
                            if key_slot(n.encode()) <= 12287)
                       for kind in ("bigzset", "bighash"))
        at = fill_big(ca, zset, hash_, members)
        target = cb.call("CLUSTER", "MYID").decode()
        src, dst = Pinger(a.port), Pinger(b.port)
        src.start()
        dst.start()
        t0 = time.perf_counter()
        ca.call("CLUSTER", "MIGRATESLOTS", "SLOTSRANGE", 0, 12287, "NODE", target)
        wait_migrations(ca)
        copy_s = time.perf_counter() - t0
        p99, pmax = src.finish()
        _, dmax = dst.finish()
        got = [cb.call("ZCARD", zset), cb.call("HLEN", hash_), cb.call("PEXPIRETIME", zset),
               cb.call("PEXPIRETIME", hash_)]
        if got != [members, members, at, at + 1]:
            sys.exit(f"valkey: the big keys did not arrive whole: ZCARD, HLEN, PEXPIRETIMEs {got}")
        return dict(copy_s=copy_s, p99=p99, max=pmax, dmax=dmax)
    finally:
        for p in (a, b):
            p.stop()


# --------------------------------------------------------------------------- a grow 3 -> 4


def crc16_table():
    table = []
    for i in range(256):
        c = i << 8
        for _ in range(8):
            c = ((c << 1) ^ 0x1021) if c & 0x8000 else c << 1
        table.append(c & 0xFFFF)
    return table


CRC16 = crc16_table()


def key_slot(key):
    """The cluster slot of a key without braces (CRC16/XMODEM mod 16384)."""
    crc = 0
    for x in key:
        crc = ((crc << 8) & 0xFFFF) ^ CRC16[((crc >> 8) ^ x) & 0xFF]
    return crc & 16383


def slot_tags():
    """A short hash tag for every slot: keys `{tags[s]}:...` hash to slot s."""
    tags, i = [None] * 16384, 0
    missing = 16384
    while missing:
        t = b"%d" % i
        s = key_slot(t)
        if tags[s] is None:
            tags[s] = t
            missing -= 1
        i += 1
    return tags


def ring(nodes):
    out = ["ketama"]
    for name, proc in nodes:
        out += [name, f"127.0.0.1:{proc.port}", 1]
    return out


def all_at_once(cs, *command):
    """Sends `command` to every client, then reads every reply (the servers work in parallel)."""
    for c in cs:
        c.sock.sendall(resp(*command))
    return [c._read() for c in cs]


def fill_old(old, keys):
    """Every old node gets the same 3 x keys names; a cleanup leaves each only its own. What
    each holds then (3 x keys in all, or the bench stops)."""
    all_at_once(old, "DEBUG", "POPULATE", 3 * keys, "key", 42)
    all_at_once(old, "SHARD.RESHARD", "CLEANUP")
    for c in old:
        st = wait_status(c, (b"cleaning",))
        if st[b"state"] != b"done":
            sys.exit(f"grow setup: cleanup failed: {st}")
    held = [c.call("DBSIZE") for c in old]
    if sum(held) != 3 * keys:
        sys.exit(f"grow setup: the old nodes hold {held} keys, not {3 * keys} in all")
    return held


def shard_grow_round(keys):
    """A grow 3 -> 4 of 3 x `keys` keys: wall, copy and cleanup seconds, keys copied."""
    names = ("n0", "n1", "n2", "n3")
    procs = []
    try:
        for n in names:
            procs.append(start(base.REDIS_SERVER, name=n))
        cs = [client(p) for p in procs]
        old, new = cs[:3], cs
        nodes = list(zip(names, procs))
        for c in cs:
            c.call("SHARD.RING", "SET", *ring(nodes[:3]))
        fill_old(old, keys)
        t0 = time.perf_counter()
        for c in new:
            c.call("SHARD.RING", "BEGIN", *ring(nodes))
        all_at_once(old, "SHARD.RESHARD", "COPY")
        sts = [wait_status(c, (b"copying",)) for c in old]
        t1 = time.perf_counter()
        if any(st[b"state"] != b"done" or st[b"failed"] for st in sts):
            sys.exit(f"grow: a copy failed: {sts}")
        for c in new:
            c.call("SHARD.RING", "COMMIT")
        all_at_once(old, "SHARD.RESHARD", "CLEANUP")
        sts2 = [wait_status(c, (b"cleaning",)) for c in old]
        t2 = time.perf_counter()
        if any(st[b"state"] != b"done" for st in sts2):
            sys.exit(f"grow: a cleanup failed: {sts2}")
        copied = sum(st[b"copied"] for st in sts)
        deleted = sum(st[b"deleted"] for st in sts2)
        print(f"  keys from: copy {[st[b'keys_from'] for st in sts]}, cleanup "
              f"{[st[b'keys_from'] for st in sts2]}", flush=True)
        sizes = [c.call("DBSIZE") for c in cs]
        if sum(sizes) != 3 * keys or sizes[3] != copied or deleted != copied:
            sys.exit(f"grow: DBSIZE {sizes} (want {3 * keys} in all), copied {copied}, "
                     f"deleted {deleted}")
        for name, c in zip(names, cs):
            sample = pipelined(c, [("RANDOMKEY",)] * 2000)
            owners = pipelined(c, [("SHARD.WHEREIS", k) for k in sample])
            strays = [k for k, o in zip(sample, owners) if o != name.encode()]
            if strays:
                sys.exit(f"grow: {name} holds keys of other nodes, e.g. {strays[:3]}")
        return dict(wall_s=t2 - t0, copy_s=t1 - t0, clean_s=t2 - t1, copied=copied, sizes=sizes)
    finally:
        for p in procs:
            p.stop()


def fleet_phase(c):
    """The coordinator's fleet phase (bytes), from SHARD.RESHARD STATUS."""
    st = c.call("SHARD.RESHARD", "STATUS")
    fleet_ = dict(zip(st[::2], st[1::2])).get(b"fleet") or []
    return dict(zip(fleet_[::2], fleet_[1::2])).get(b"phase")


def shard_grow_slots_round(keys):
    """A grow 3 -> 4 of 3 x `keys` keys on a `slots` ring by one `SHARD.RESHARD START` (which
    moves the fewest slots: a quarter): wall seconds from START to the fleet done, keys moved."""
    names = ("n0", "n1", "n2", "n3")
    procs = []
    try:
        for n in names:
            procs.append(start(base.REDIS_SERVER, name=n))
        cs = [client(p) for p in procs]
        old = cs[:3]
        nodes = list(zip(names, procs))
        slots_ring = lambda ns: ["slots"] + [x for name, p in ns  # noqa: E731
                                             for x in (name, f"127.0.0.1:{p.port}", 1)]
        for c in cs:
            c.call("SHARD.RING", "SET", *slots_ring(nodes[:3]))
        held = fill_old(old, keys)
        t0 = time.perf_counter()
        reply = cs[0].call("SHARD.RESHARD", "START", *slots_ring(nodes))
        if reply not in (b"OK", "OK"):
            sys.exit(f"grow-slots: START said {reply}")
        deadline = time.monotonic() + 600
        while (phase := fleet_phase(cs[0])) != b"done":
            if phase == b"cancelled" or time.monotonic() > deadline:
                sys.exit(f"grow-slots: the fleet ended {phase}")
            time.sleep(0.002)
        wall = time.perf_counter() - t0
        sizes = [c.call("DBSIZE") for c in cs]
        if sum(sizes) != sum(held):
            sys.exit(f"grow-slots: DBSIZE {sizes}, held {held} before")
        return dict(wall_s=wall, copied=sizes[3], sizes=sizes)
    finally:
        for p in procs:
            p.stop()


GROW_RANGES = [(0, 5460), (5461, 10922), (10923, 16383), None]
GROW_MOVES = [(4096, 5460), (9558, 10922), (15018, 16383)]  # 1365 + 1365 + 1366 = 4096 slots


def valkey_grow_round(keys, tags):
    """Valkey's share of the same grow: wall seconds until the three migrations succeed, and
    until the sources have dropped the keys they moved; keys moved."""
    procs, cs = valkey_cluster(GROW_RANGES, name="vgrow")
    try:
        # DEBUG POPULATE ignores slot ownership: once per owned slot, its hash tag as prefix.
        for c, (lo, hi) in zip(cs, GROW_RANGES[:3]):
            n = hi - lo + 1
            c.sock.sendall(b"".join(
                resp("DEBUG", "POPULATE", keys // n + (i < keys % n), b"{%s}" % tags[s], 42)
                for i, s in enumerate(range(lo, hi + 1))))
        for c, (lo, hi) in zip(cs, GROW_RANGES[:3]):
            for _ in range(hi - lo + 1):
                c._read()
        held = [c.call("DBSIZE") for c in cs[:3]]
        if held != [keys] * 3:
            sys.exit(f"valkey grow setup: the sources hold {held} keys")
        moving = sum(c.call("CLUSTER", "COUNTKEYSINSLOT", s) for c, (lo, hi) in
                     zip(cs, GROW_MOVES) for s in range(lo, hi + 1))
        target = cs[3].call("CLUSTER", "MYID").decode()
        t0 = time.perf_counter()
        for c, (lo, hi) in zip(cs, GROW_MOVES):
            c.call("CLUSTER", "MIGRATESLOTS", "SLOTSRANGE", lo, hi, "NODE", target)
        for c in cs[:3]:
            wait_migrations(c)
        t1 = time.perf_counter()
        deadline = time.monotonic() + 600
        while sum(c.call("DBSIZE") for c in cs[:3]) != 3 * keys - moving:
            if time.monotonic() > deadline:
                sys.exit("valkey grow: the sources kept the moved keys")
            time.sleep(0.002)
        t2 = time.perf_counter()
        sizes = [c.call("DBSIZE") for c in cs]
        if sizes[3] != moving or sum(sizes) != 3 * keys:
            sys.exit(f"valkey grow: DBSIZE {sizes}, {moving} keys should have moved")
        return dict(wall_s=t1 - t0, trimmed_s=t2 - t0, copied=moving)
    finally:
        for p in procs:
            p.stop()


def millions(n):
    return f"{n // 1_000_000}M" if n >= 1_000_000 and n % 1_000_000 == 0 else f"{n:,}"


ROWS = ["shard", "valkey", "script", "pipes", "gets", "bigkeys", "grow", "grow-slots"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--big-members", type=int, default=1_000_000,
                        help="members of the sorted set and fields of the hash (bigkeys row)")
    parser.add_argument("--grow-keys", type=int, default=1_000_000,
                        help="keys on each of the three old nodes (grow row)")
    parser.add_argument("--rows", default=",".join(ROWS),
                        help="which contenders to run (comma-separated)")
    opts = parser.parse_args()
    wanted = set(opts.rows.split(","))
    if wanted - set(ROWS):
        parser.error(f"unknown rows {sorted(wanted - set(ROWS))}; known: {','.join(ROWS)}")
    base.TMP.mkdir(parents=True, exist_ok=True)
    rows = {k: [] for k in ("shard", "valkey", "script", "ceiling", "unlink", "gets", "bigkeys",
                            "valkey_bigkeys", "grow", "valkey_grow", "grow_slots")}
    tags = slot_tags() if "grow" in wanted and VALKEY else None
    shard_runs = {"bigkeys": lambda: shard_bigkeys_round(opts.big_members),
                  "grow": lambda: shard_grow_round(opts.grow_keys)}
    valkey_runs = {"bigkeys": lambda: valkey_bigkeys_round(opts.big_members),
                   "grow": lambda: valkey_grow_round(opts.grow_keys, tags)}
    for r in range(opts.rounds):
        order = [w for w in ROWS if w in wanted]
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
            elif what == "grow-slots":
                rows["grow_slots"].append(shard_grow_slots_round(opts.grow_keys))
                print(f"  grow_slots: {rows['grow_slots'][-1]}", flush=True)
            elif what == "gets":
                rows["gets"].append(shard_round(opts.keys, with_gets=True))
            elif what in ("bigkeys", "grow"):
                pair = [(what, shard_runs[what])]
                if VALKEY:
                    pair.append((f"valkey_{what}", valkey_runs[what]))
                for key, run in (pair[::-1] if r % 2 else pair):
                    rows[key].append(run())
                    print(f"  {key}: " + ", ".join(
                        f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
                        for k, v in rows[key][-1].items()), flush=True)
    med = statistics.median
    rate = lambda d: d["copied"] / d["copy_s"]  # noqa: E731
    lines = [SECTION, "",
             f"`python3 bench/copy.py --keys {opts.keys} --big-members {opts.big_members} "
             f"--grow-keys {opts.grow_keys} --rounds {opts.rounds}` on "
             f"{base.first_line([base.REDIS_SERVER, '--version'])}; Valkey: "
             f"{base.first_line([VALKEY, '--version']) if VALKEY else 'not run'}. "
             "Medians of the rounds; each round starts fresh servers."]
    if rows["shard"]:
        shard_rate = med(rate(d) for d in rows["shard"])
        clean_rate = med(d["deleted"] / d["clean_s"] for d in rows["shard"])
        copied = med(d["copied"] for d in rows["shard"])
        lines += ["", "| row | keys/s | ratio | target |", "|---|---|---|---|",
                  f"| SHARD.RESHARD COPY ({copied:.0f} of {opts.keys} keys moving) | "
                  f"{shard_rate:,.0f} | | |"]
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
        lines += ["", "| during the copy | PING p99 ms | PING max ms | target |",
                  "|---|---|---|---|"]
        lines.append(f"| shard COPY | {med(d['p99'] for d in rows['shard']):.2f} | "
                     f"{max(d['max'] for d in rows['shard']):.1f} | p99 < 2, max < 10 |")
        lines.append(f"| shard CLEANUP | | {max(d['clean_max'] for d in rows['shard']):.1f} | "
                     "max < 10 |")
        if rows["valkey"]:
            lines.append(f"| Valkey migration | {med(d['p99'] for d in rows['valkey']):.2f} | "
                         f"{max(d['max'] for d in rows['valkey']):.1f} | |")
    g = [d["during"] / d["idle"] for d in rows["gets"] if d["idle"]]
    if g:
        lines += ["", f"GET at the source during COPY / idle: **{med(g):.2f}** (target >= 0.70; "
                  f"{', '.join(f'{x:.2f}' for x in g)})."]
    if rows["bigkeys"]:
        m = millions(opts.big_members)
        worst = max(d["max"] for d in rows["bigkeys"])
        lines += ["", f"| {m}-member zset + {m}-field hash, both moving | copy s | source PING "
                  "p99 / max ms | destination PING max ms | target |", "|---|---|---|---|---|",
                  f"| SHARD.RESHARD COPY (in pieces; every member, score, field and TTL checked) | "
                  f"{med(d['copy_s'] for d in rows['bigkeys']):.2f} | "
                  f"{med(d['p99'] for d in rows['bigkeys']):.2f} / {worst:.1f} | "
                  f"{max(d['dmax'] for d in rows['bigkeys']):.1f} | source max < 10 ms: "
                  f"**{'PASS' if worst < 10 else 'MISS'}** |"]
        vb = rows["valkey_bigkeys"]
        if vb:
            lines.append(f"| Valkey atomic slot migration (the same two keys, 12288 slots) | "
                         f"{med(d['copy_s'] for d in vb):.2f} | {med(d['p99'] for d in vb):.2f} / "
                         f"{max(d['max'] for d in vb):.1f} | {max(d['dmax'] for d in vb):.1f} | |")
        else:
            lines.append("| Valkey atomic slot migration | not run (no VALKEY_SERVER) | | | |")
    if rows["grow"]:
        gr = rows["grow"]
        wall = med(d["wall_s"] for d in gr)
        copy_s = med(d["copy_s"] for d in gr)
        moved = med(d["copied"] for d in gr)
        lines += ["", f"| grow 3 -> 4, {millions(3 * opts.grow_keys)} keys | wall s | copy s / "
                  "cleanup s | keys moved | moved keys/s | ratio |", "|---|---|---|---|---|---|",
                  f"| shard: RING BEGIN, COPY on the three at once, COMMIT, CLEANUP on the three "
                  f"| {wall:.2f} | {copy_s:.2f} / {med(d['clean_s'] for d in gr):.2f} | "
                  f"{moved:,.0f} | {med(d['copied'] / d['wall_s'] for d in gr):,.0f} | |"]
        vg = rows["valkey_grow"]
        if vg:
            vwall, vtrim = med(d["wall_s"] for d in vg), med(d["trimmed_s"] for d in vg)
            lines.append(f"| Valkey: MIGRATESLOTS of 1365 + 1365 + 1366 slots (a quarter) to the "
                         f"fourth, at once | {vwall:.2f} ({vtrim:.2f} until the sources dropped "
                         f"the keys) | | {med(d['copied'] for d in vg):,.0f} | "
                         f"{med(d['copied'] / d['trimmed_s'] for d in vg):,.0f} | shard wall / "
                         f"Valkey's: **{wall / vtrim:.2f}**; shard COPY / Valkey's migration: "
                         f"{copy_s / vwall:.2f} |")
        else:
            lines.append("| Valkey | not run (no VALKEY_SERVER) | | | | |")
    if rows["grow_slots"]:
        gs = rows["grow_slots"]
        swall = med(d["wall_s"] for d in gs)
        vg = rows["valkey_grow"]
        ratio = (f"shard wall / Valkey's: **{swall / med(d['trimmed_s'] for d in vg):.2f}**"
                 if vg else "")
        lines += ["", f"| grow 3 -> 4 on a `slots` ring, {millions(3 * opts.grow_keys)} keys | "
                  "wall s | keys moved | moved keys/s | ratio |", "|---|---|---|---|---|",
                  f"| shard: one SHARD.RESHARD START (the fewest slots move: a quarter) | "
                  f"{swall:.2f} | {med(d['copied'] for d in gs):,.0f} | "
                  f"{med(d['copied'] / d['wall_s'] for d in gs):,.0f} | {ratio} |"]
    section = "\n".join(lines) + "\n"
    print(section)
    if wanted == set(ROWS):
        fleet.write_section(RESULTS, SECTION, section)


if __name__ == "__main__":
    main()
