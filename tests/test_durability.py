"""Durability (issue 5): the generator's high-water mark and the rings survive a restart from
the RDB or the AOF, reach replicas, and a failover never repeats a key, even when the wall
clock steps back. The tests of keys run for every layout family: snowflake's 63-bit keys, and
the tsid, uuidv7 and ulid IDs of issue 34 (tests/helpers/ids.py reads each).

The wall clock of a server is moved with tests/clockshim.c (an LD_PRELOAD shim that adds the
offset in milliseconds written in a file to CLOCK_REALTIME, gettimeofday and time), so every
restart below happens with the clock set back: without the persisted mark the new keys would be
smaller than the old ones and the tests would fail.
"""

import shutil
import signal
import threading
import time
from pathlib import Path

import pytest
import redis

from helpers.ids import LAYOUTS, Ids
from helpers.ports import free_port
from helpers.server import (AOF, PRIMARY, RedisServer, ServerFailed, as_dict, info_shard, until,
                            wait_in_sync)

BACK = -10_000  # the clock steps back by 10 s
SLACK_MS = 1_000
# Keys issued 10 s ahead of a clock set back need a drift limit above 10 s.
LENIENT = ["max-drift-ms", 60000]

RING1 = ["ketama", "a", "127.0.0.1:7001", 1, "b", "127.0.0.1:7002", 1]
RING2 = ["ketama", "a", "127.0.0.1:7001", 1, "b", "127.0.0.1:7002", 1, "c", "127.0.0.1:7003", 1]
RING3 = ["jedis", "a", "127.0.0.1:7001", 2, "b", "127.0.0.1:7002", 1, "d", "127.0.0.1:7004", 1]


# ---------------------------------------------------------------------------------------------
# The clock shim and servers with a movable clock
# ---------------------------------------------------------------------------------------------


class Clock:
    """The offset file read by the shim: a signed number of milliseconds."""

    def __init__(self, path, shim):
        self.path = Path(path)
        self.shim = shim
        self.server = None  # set once the server exists: set() then waits for it to follow
        self.set(0)

    def set(self, offset_ms):
        # Write then rename: the shim never reads a half-written (empty, so 0) file.
        self.offset_ms = int(offset_ms)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(f"{self.offset_ms}\n")
        tmp.replace(self.path)
        if self.server is not None and self.server.alive():
            self.wait_followed()

    def wait_followed(self, timeout=5.0):
        """Waits until the server's TIME shows the offset. The module reads the shimmed clock
        at every call, but Valkey 9 answers TIME from a cached wall clock that it advances by
        its monotonic clock and re-reads only now and then, so a step forward shows in TIME
        up to a fraction of a second later (a step back shows at once)."""
        client = self.server.client(socket_timeout=5)

        def followed():
            return abs(server_ms(client) - (int(time.time() * 1000) + self.offset_ms)) < SLACK_MS
        until(followed, f"the server's TIME to follow the clock offset {self.offset_ms} ms",
                 timeout)

    def env(self):
        return {"LD_PRELOAD": str(self.shim), "SHARD_CLOCK_OFFSET_FILE": str(self.path)}


@pytest.fixture
def clocked(server_factory, clockshim, tmp_path):
    """`clocked(module_args, config, offset_ms)`: a server whose clock follows `server.clock`."""
    count = [0]

    def make(module_args=(), config=(), offset_ms=0, start=True):
        count[0] += 1
        clock = Clock(tmp_path / f"clock{count[0]}", clockshim)
        clock.set(offset_ms)
        s = server_factory(module_args=module_args, config=config, env=clock.env(), start=False)
        s.clock = clock
        clock.server = s
        if not start:
            return s
        s.start()
        clock.wait_followed()
        return s

    return make


@pytest.fixture
def plain_factory():
    servers = []

    def make(workdir, config=(), port=None, start=True):
        s = RedisServer(workdir, config=config, module=False)  # without the module
        s.port = port
        servers.append(s)
        return s.start() if start else s

    yield make
    for s in servers:
        s.stop(signal.SIGKILL)


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


SNOWFLAKE = Ids("snowflake")


@pytest.fixture(params=LAYOUTS)
def ids(request):
    """The layout a key test runs with (each test runs once per layout)."""
    return Ids(request.param)


def genkeys(client, n=None, ids=SNOWFLAKE):
    """n keys from one SHARD.GENKEY COUNT n (one key without COUNT when n is None), as the
    numbers they hold (whose order is their text order)."""
    if n is None:
        return [ids.value(client.execute_command("SHARD.GENKEY"))]
    return [ids.value(k) for k in client.execute_command("SHARD.GENKEY", "COUNT", n)]


def generate(client, bursts=5, count=2000, singles=50, ids=SNOWFLAKE):
    """Some COUNT bursts and some single calls, in call order."""
    keys = []
    for _ in range(bursts):
        keys += genkeys(client, count, ids)
        for _ in range(singles // bursts):
            keys += genkeys(client, ids=ids)
    return keys


def info_int(client, field):
    return int(info_shard(client)[field])


def server_ms(client):
    sec, usec = client.time()
    return sec * 1000 + usec // 1000


def key_ms(key, ids=SNOWFLAKE):
    return ids.ms(key)


def assert_strictly_increasing(keys, what="keys"):
    bad = next((i for i in range(1, len(keys)) if keys[i] <= keys[i - 1]), None)
    assert bad is None, f"{what} do not strictly increase at {bad}: {keys[bad - 1]} then {keys[bad]}"


def assert_all_after(new, old, what, ids=SNOWFLAKE):
    assert new and old
    assert min(new) > max(old), (
        f"{what}: a new key ({min(new)}, {key_ms(min(new), ids)} ms) is not above the last old "
        f"key ({max(old)}, {key_ms(max(old), ids)} ms): the high-water mark was not carried over"
    )
    repeats = set(new) & set(old)
    assert not repeats, f"{what}: {len(repeats)} keys repeated, e.g. {sorted(repeats)[:3]}"


def log_from(server, pos):
    return server.log()[pos:]


def restart(server, offset_ms=None, sig=signal.SIGTERM):
    """Stops the server and starts it again on the same port and dir, with a new clock offset."""
    server.stop(sig)
    if offset_ms is not None:
        server.clock.set(offset_ms)
    server.start()
    if getattr(server, "clock", None):
        server.clock.wait_followed()
    return server


def assert_clock_is_back(client, old_keys, by_ms=-BACK - SLACK_MS, ids=SNOWFLAKE):
    """The server's clock really is behind the old keys: without the stored mark, new keys
    would be smaller (so the test can fail)."""
    lag = key_ms(max(old_keys), ids) - server_ms(client)
    assert lag >= by_ms, f"the shimmed clock is only {lag} ms behind the last key"


def wait_replicated(master, replica, timeout=10.0):
    """Link up, offsets equal and the same high-water mark on both."""
    wait_in_sync(master, replica, timeout, also=lambda m, r: (
        info_shard(r)["high_water_ms"] == info_shard(m)["high_water_ms"]))


def ring_state(client):
    """(epoch, current digest, previous digest or None) from SHARD.RING GET, checked against
    INFO shard."""
    got = as_dict(client.execute_command("SHARD.RING", "GET"))
    previous = got["previous"]
    prev_digest = None if previous is None else as_dict(previous)["digest"].decode()
    state = (int(got["epoch"]), got["digest"].decode(), prev_digest)
    info = info_shard(client)
    assert (int(info["ring_epoch"]), info["ring_digest"], info["resharding_open"]) == (
        state[0], state[1], "1" if prev_digest else "0"
    )
    return state


def ring(client, sub, *args):
    return client.execute_command("SHARD.RING", sub, *args)


def open_resharding(client):
    """SET, BEGIN, ABORT, BEGIN: current RING3, previous RING1, epoch 4."""
    ring(client, "SET", *RING1)
    ring(client, "BEGIN", *RING2)
    ring(client, "ABORT")
    ring(client, "BEGIN", *RING3)
    state = ring_state(client)
    assert state[0] == 4 and state[2] is not None
    return state


# ---------------------------------------------------------------------------------------------
# The shim itself
# ---------------------------------------------------------------------------------------------


def test_clock_shim_moves_time_and_the_keys_of_a_running_server(clocked):
    s = clocked()
    c = s.client()
    real = int(time.time() * 1000)
    assert abs(server_ms(c) - real) < SLACK_MS
    assert abs(key_ms(genkeys(c)[0]) - real) < SLACK_MS
    s.clock.set(-60_000)
    real = int(time.time() * 1000)
    assert abs(server_ms(c) - (real - 60_000)) < SLACK_MS, "TIME did not follow the shim"
    s.clock.set(+60_000)
    real = int(time.time() * 1000)
    assert abs(server_ms(c) - (real + 60_000)) < SLACK_MS
    assert abs(key_ms(genkeys(c)[0]) - (real + 60_000)) < SLACK_MS, "keys did not follow the shim"


# ---------------------------------------------------------------------------------------------
# 1. RDB
# ---------------------------------------------------------------------------------------------


def test_rdb_restart_with_the_clock_set_back_keeps_keys_increasing(clocked, ids):
    s = clocked(module_args=LENIENT + ids.module_args())
    c = s.client()
    before = generate(c, ids=ids)
    high_water = info_int(c, "high_water_ms")
    assert c.save()
    c.close()

    restart(s, offset_ms=BACK)
    c = s.client()
    assert_clock_is_back(c, before, ids=ids)
    assert info_int(c, "high_water_ms") == high_water, "the RDB's high-water mark was not restored"
    assert info_int(c, "keys_generated") == 0
    after = generate(c, ids=ids)
    assert_strictly_increasing(before + after)
    assert_all_after(after, before, "after a restart from the RDB", ids)
    assert info_int(c, "drift_ms") >= -BACK - SLACK_MS


# ---------------------------------------------------------------------------------------------
# 2. AOF, kill -9 in the middle of a burst
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_aof_kill_9_during_a_burst_then_restart_with_the_clock_set_back(clocked, ids):
    s = clocked(module_args=LENIENT + ids.module_args(), config=AOF)
    received = []  # every key whose reply arrived, in order
    calls = [0]
    errors = []

    def burst():
        c = s.client(socket_timeout=5)
        try:
            while True:
                keys = genkeys(c, 200, ids) if calls[0] % 4 == 0 else genkeys(c, ids=ids)
                received.extend(keys)
                calls[0] += 1
        except (redis.ConnectionError, redis.TimeoutError, ConnectionError):
            return  # the kill
        except Exception as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    thread = threading.Thread(target=burst, daemon=True)
    thread.start()
    # Kill it in the middle of the burst, once it has answered a few thousand calls.
    until(lambda: calls[0] >= 3000 or errors, "3000 SHARD.GENKEY calls of the burst", 30)
    s.stop(signal.SIGKILL)
    thread.join(10)
    assert not thread.is_alive(), "the generating client did not notice the kill"
    assert not errors, f"the burst failed before the kill: {errors[0]!r}"
    before = list(received)
    assert_strictly_increasing(before, "keys before the kill")
    assert len(set(before)) == len(before)

    s.clock.set(BACK)
    s.start()
    c = s.client()
    assert_clock_is_back(c, before, ids=ids)
    assert not (s.workdir / "dump.rdb").exists(), "the state must come from the AOF alone"
    after = generate(c, ids=ids)
    assert_strictly_increasing(after)
    assert_all_after(after, before, "after kill -9 and a restart from the AOF", ids)


def rewrite_aof(client):
    client.bgrewriteaof()

    def done():
        p = client.info("persistence")
        return (p["aof_rewrite_in_progress"] == 0 and p["aof_rewrite_scheduled"] == 0
                and p["aof_last_bgrewrite_status"] == "ok")
    until(done, "the AOF rewrite to finish")


def aof_rewrite_then_restart_with_the_clock_set_back(clocked, preamble):
    s = clocked(module_args=LENIENT, config=[
        ("appendonly", "yes"), ("appendfsync", "always"), ("aof-use-rdb-preamble", preamble),
    ])
    c = s.client()
    state = open_resharding(c)
    before = generate(c)
    rewrite_aof(c)  # the rewrite drops every SHARD.ADVANCE and SHARD.RING line of the AOF
    c.close()
    restart(s, offset_ms=BACK, sig=signal.SIGKILL)
    c = s.client()
    assert_clock_is_back(c, before)
    after = generate(c)
    assert_all_after(after, before, f"after an AOF rewrite (aof-use-rdb-preamble {preamble})")
    assert ring_state(c) == state, "the rings were lost in the AOF rewrite"


def test_aof_rewrite_with_the_rdb_preamble_keeps_the_mark_and_the_rings(clocked):
    """The default: the rewritten AOF's base is an RDB, which holds the module's aux data."""
    aof_rewrite_then_restart_with_the_clock_set_back(clocked, "yes")


@pytest.mark.xfail(strict=True, reason=(
    "known gap: with aof-use-rdb-preamble no, an AOF rewrite (BGREWRITEAOF or the automatic "
    "auto-aof-rewrite-percentage one) writes only keys; the module's aux data has no AOF form, "
    "so the high-water mark and the rings are lost and keys repeat after a restart with the "
    "clock set back. The README's unload procedure relies on this very behaviour."
))
def test_aof_rewrite_without_the_rdb_preamble_keeps_the_mark_and_the_rings(clocked):
    aof_rewrite_then_restart_with_the_clock_set_back(clocked, "no")


# ---------------------------------------------------------------------------------------------
# 3. The clock steps back while the server runs, and while it is down
# ---------------------------------------------------------------------------------------------


def test_clock_set_back_while_running_and_while_down(clocked, ids):
    s = clocked(module_args=LENIENT + ids.module_args())
    c = s.client()
    keys = generate(c, bursts=2, count=1000, ids=ids)
    assert info_int(c, "clock_backsteps") == 0

    s.clock.set(BACK)
    assert_clock_is_back(c, keys, ids=ids)
    running = generate(c, bursts=3, count=3000, ids=ids)
    assert_strictly_increasing(keys + running)
    info = info_shard(c)
    assert int(info["clock_backsteps"]) >= 1
    assert -BACK - SLACK_MS <= int(info["drift_ms"]) <= -BACK + SLACK_MS, info["drift_ms"]
    keys += running
    assert c.save()
    c.close()

    # Another 10 s back while it is down: 20 s behind the real time, and still increasing.
    restart(s, offset_ms=2 * BACK)
    c = s.client()
    assert_clock_is_back(c, keys, by_ms=-2 * BACK - 5_000, ids=ids)
    after = generate(c, bursts=3, count=3000, ids=ids)
    assert_strictly_increasing(keys + after)
    assert_all_after(after, keys, "after a restart with the clock 20 s back", ids)
    assert int(info_shard(c)["drift_ms"]) >= -BACK - SLACK_MS


# ---------------------------------------------------------------------------------------------
# 4. A replica, promoted
# ---------------------------------------------------------------------------------------------


def test_promoted_replica_never_repeats_a_key_of_its_old_master(clocked, ids):
    args = LENIENT + ids.module_args() + ["node-id", 7]
    master = clocked(module_args=args, config=PRIMARY)
    replica = clocked(module_args=args, offset_ms=BACK)  # the same node id
    m, r = master.client(), replica.client()

    old = genkeys(m, 20_000, ids)  # reaches the replica in the full sync's RDB
    r.replicaof("127.0.0.1", master.port)
    wait_replicated(m, r)
    assert info_int(r, "high_water_ms") == info_int(m, "high_water_ms")
    old += generate(m, bursts=10, count=2000, singles=100, ids=ids)  # as SHARD.ADVANCE
    wait_replicated(m, r)

    with pytest.raises(redis.exceptions.ReadOnlyError):  # -READONLY, code stripped by redis-py
        genkeys(r, ids=ids)
    assert info_int(r, "keys_generated") == 0, "the replica generated keys of its own"
    assert_clock_is_back(r, old, ids=ids)

    assert r.replicaof("NO", "ONE")
    new = generate(r, bursts=5, count=2000, ids=ids)
    assert {ids.node(k) for k in new} == {ids.node(k) for k in old} == {7}
    assert_strictly_increasing(new)
    assert_all_after(new, old, "on the promoted replica", ids)


# ---------------------------------------------------------------------------------------------
# 5. The rings and an open resharding
# ---------------------------------------------------------------------------------------------


def test_rings_survive_a_restart_from_the_rdb(server_factory):
    s = server_factory()
    c = s.client()
    state = open_resharding(c)
    assert c.save()
    c.close()
    restart(s)
    c = s.client()
    assert ring_state(c) == state
    # The restored resharding can be closed.
    ring(c, "COMMIT")
    assert ring_state(c) == (5, state[1], None)


def test_rings_survive_a_restart_from_the_aof(server_factory):
    s = server_factory(config=AOF)
    c = s.client()
    state = open_resharding(c)
    c.close()
    restart(s, sig=signal.SIGKILL)
    assert not (s.workdir / "dump.rdb").exists(), "the state must come from the AOF alone"
    c = s.client()
    assert ring_state(c) == state


def test_rings_reach_a_replica(server_factory):
    master, replica = server_factory(config=PRIMARY), server_factory()
    m, r = master.client(), replica.client()
    ring(m, "SET", *RING1)
    ring(m, "BEGIN", *RING2)
    ring(m, "ABORT")  # before the sync: carried by the RDB
    r.replicaof("127.0.0.1", master.port)
    wait_replicated(m, r)
    assert ring_state(r) == ring_state(m)
    ring(m, "BEGIN", *RING3)  # after: replicated verbatim
    wait_replicated(m, r)
    state = ring_state(m)
    assert state[0] == 4 and state[2] is not None
    assert ring_state(r) == state
    ring(m, "COMMIT")
    wait_replicated(m, r)
    assert ring_state(r) == ring_state(m) == (5, state[1], None)


def test_a_replica_restarted_from_its_own_aof_keeps_the_mark_and_the_rings(server_factory):
    """A replica replays its primary's SHARD.ADVANCE and ring commands from the stream; they
    reach the replica's own AOF only if they replicate themselves there (a module command that
    changes no key is not written to the AOF otherwise). Restarted from that AOF alone, the
    replica holds its primary's high-water mark and rings as they were."""
    master, replica = server_factory(config=PRIMARY), server_factory(config=AOF)
    m, r = master.client(), replica.client()
    ring(m, "SET", *RING1)
    r.replicaof("127.0.0.1", master.port)
    wait_replicated(m, r)
    # The AOF's base: the state of the full sync (a replica rewrites its AOF after one).
    until(lambda: r.info("persistence")["aof_rewrite_in_progress"] == 0
          and r.info("persistence")["aof_rewrite_scheduled"] == 0, "the replica's AOF rewrite")
    rewrite_aof(r)
    genkeys(m, 2000)  # each burst replicated as SHARD.ADVANCE
    time.sleep(0.01)
    genkeys(m, 2000)
    ring(m, "BEGIN", *RING3)
    wait_replicated(m, r)
    mark, state = info_int(r, "high_water_ms"), ring_state(r)
    assert mark == info_int(m, "high_water_ms") and state == ring_state(m)
    restart(replica, sig=signal.SIGKILL)  # no `replicaof` in its config: a primary of its own
    r = replica.client()
    assert r.info("replication")["role"] == "master"
    assert info_int(r, "high_water_ms") == mark, "the replica's AOF lacked SHARD.ADVANCE"
    assert ring_state(r) == state


# ---------------------------------------------------------------------------------------------
# 6. Bad persisted state, and SHARD.ADVANCE from a client
# ---------------------------------------------------------------------------------------------

# From src/persist.rs: "SHRD", u8 version, i64 high-water, u64 epoch, u64 length + current ring,
# ... (version 2, written only once a fleet operation is used, adds the returning flag and the
# fleet plan at the end).
VERSION_AT = 4
CURRENT_LEN_AT = 4 + 1 + 8 + 8


@pytest.mark.parametrize(
    "case,message",
    [("version", "unknown format version 99"), ("ring-length", "truncated")],
)
def test_corrupt_module_data_in_the_rdb_is_refused_with_a_log_line(server_factory, case, message):
    # Neither a checksum nor compression: the module's blob can be found and patched in place.
    s = server_factory(config=[("rdbchecksum", "no"), ("rdbcompression", "no")])
    c = s.client()
    ring(c, "SET", *RING1)
    genkeys(c, 10)
    assert c.save()
    c.close()
    s.stop()

    rdb = s.workdir / "dump.rdb"
    data = bytearray(rdb.read_bytes())
    at = data.find(b"SHRD")
    assert at >= 0 and data.find(b"SHRD", at + 1) < 0, "the module's blob is not in dump.rdb once"
    assert data[at + VERSION_AT] == 1
    if case == "version":
        data[at + VERSION_AT] = 99
    else:
        length = int.from_bytes(data[at + CURRENT_LEN_AT:at + CURRENT_LEN_AT + 8], "little")
        assert length > 0  # the ring's text follows
        data[at + CURRENT_LEN_AT:at + CURRENT_LEN_AT + 8] = (2**62).to_bytes(8, "little")
    rdb.write_bytes(bytes(data))

    pos = len(s.log())
    with pytest.raises(ServerFailed):
        s.start()
    log = log_from(s, pos)
    # An exit, not a signal. Its status is 0: after the failed load Redis 7.0 runs its RDB
    # checker, which skips module data, prints "RDB looks OK" and exits 0 (Redis's behaviour).
    assert s.proc.returncode >= 0, f"redis-server died of signal {-s.proc.returncode}:\n{log}"
    assert "shard: refusing to load the RDB" in log, log
    assert message in log, log
    assert "crashed by signal" not in log and "STACK TRACE" not in log, log


def test_shard_advance_is_refused_from_a_client(r):
    with pytest.raises(redis.ResponseError, match="internal"):
        r.execute_command("SHARD.ADVANCE", 123)
    with pytest.raises(redis.ResponseError, match="internal"):
        r.execute_command("SHARD.ADVANCE", 2**62)
    assert info_int(r, "high_water_ms") == 0, "a refused SHARD.ADVANCE moved the generator"


# ---------------------------------------------------------------------------------------------
# 7. Getting rid of the module's data (the README's procedure)
# ---------------------------------------------------------------------------------------------

PLAIN_DATA = {
    "s": b"hello",
    "h": {b"f1": b"v1", b"f2": b"v2"},
    "l": [b"x", b"y", b"z"],
    "z": [(b"m1", 1.0), (b"m2", 2.5)],
}


def write_plain_data(c):
    c.set("s", PLAIN_DATA["s"])
    c.hset("h", mapping=PLAIN_DATA["h"])
    c.rpush("l", *PLAIN_DATA["l"])
    c.zadd("z", dict(PLAIN_DATA["z"]))


def check_plain_data(c):
    assert c.get("s") == PLAIN_DATA["s"]
    assert c.hgetall("h") == PLAIN_DATA["h"]
    assert c.lrange("l", 0, -1) == PLAIN_DATA["l"]
    assert c.zrange("z", 0, -1, withscores=True) == PLAIN_DATA["z"]
    assert c.dbsize() == len(PLAIN_DATA)


def aof_files(workdir):
    """The files the AOF manifest names ("file NAME seq N type b|i|h"), history excluded."""
    folder = Path(workdir) / "appendonlydir"
    manifest = next(folder.glob("*.manifest")).read_text().split("\n")
    names = [line.split()[1] for line in manifest if line.startswith("file ") and " type h" not in line]
    return {name: (folder / name).read_bytes() for name in names}


def test_module_data_blocks_a_server_without_the_module(server_factory, plain_factory, tmp_path):
    """Why the README's procedure exists: an RDB written with the module holds its aux data,
    which a server without the module refuses to load."""
    s = server_factory()
    c = s.client()
    write_plain_data(c)
    genkeys(c, 5)
    assert c.save()
    c.close()
    s.stop()
    plain_dir = tmp_path / "plain-from-rdb"
    plain_dir.mkdir()
    shutil.copy(s.workdir / "dump.rdb", plain_dir / "dump.rdb")
    plain = plain_factory(plain_dir, start=False)
    with pytest.raises(ServerFailed):
        plain.start()
    assert "no matching module 'shard-aux'" in plain.log(), plain.log()


@pytest.mark.parametrize("aof_at_start", ["no", "yes"])
def test_readme_procedure_unloads_the_module_data(server_factory, plain_factory, aof_at_start):
    s = server_factory(config=[("appendonly", aof_at_start)])
    c = s.client()
    write_plain_data(c)
    ring(c, "SET", *RING1)
    ring(c, "BEGIN", *RING2)
    genkeys(c, 1000)
    genkeys(c)  # with the AOF on, these are SHARD.ADVANCE lines in it

    # The procedure, as the README gives it.
    assert c.config_set("aof-use-rdb-preamble", "no")
    if aof_at_start == "no":
        assert c.config_set("appendonly", "yes")
    else:
        c.bgrewriteaof()

    def rewritten():
        p = c.info("persistence")
        return (p["aof_enabled"] == 1 and p["aof_rewrite_in_progress"] == 0
                and p["aof_rewrite_scheduled"] == 0 and p["aof_last_bgrewrite_status"] == "ok")
    until(rewritten, "the AOF rewrite to finish")
    # (writes stop here)
    try:
        c.shutdown()
    except redis.ConnectionError:
        pass
    until(lambda: not s.alive(), "SHUTDOWN to stop the server")

    for name, data in aof_files(s.workdir).items():
        assert not data.startswith(b"REDIS"), f"{name} is an RDB (preamble), with module data"
        assert b"shard.advance" not in data.lower(), f"SHARD.ADVANCE is still in {name}"
        assert b"shard.ring" not in data.lower(), f"SHARD.RING is still in {name}"
        assert b"SHRD" not in data, f"the module's data is still in {name}"

    plain = plain_factory(s.workdir, config=[("appendonly", "yes")], port=free_port())
    pc = plain.client()
    # The server runs without shard (Valkey lists its built-in `lua` module here: only shard's
    # absence matters) and has every key back.
    loaded = [dict(zip(m[::2], m[1::2]))[b"name"] for m in pc.execute_command("MODULE", "LIST")]
    assert b"shard" not in loaded
    check_plain_data(pc)
