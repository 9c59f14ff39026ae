"""The copy job's forked passes (issue 21): a child ships pipelined RESTOREs while the server
serves; keys written during a pass are copied by the next; progress; faults mid-copy."""

import threading
import time

import pytest
import redis

from helpers.fleet import owners, ring_args, start_fleet
from helpers.reshard import status, wait_job
from helpers.server import command_calls, until

KEYS = 200_000


def fill(client, n=KEYS, prefix="k"):
    """n string keys of about 40 bytes, in MSET batches."""
    pipe = client.pipeline(transaction=False)
    for start in range(0, n, 1000):
        pipe.mset({f"{prefix}:{i}": f"value-{i:012d}-" + "x" * 20 for i in range(start, min(n, start + 1000))})
    pipe.execute()


def two_nodes(server_factory, n=KEYS):
    """a holds n keys; a resharding to a:1 b:3 is open on both. (SHARD.CALL's timeout is 10 s:
    a copy-before-write from a source that is busy copying, on a busy machine, takes its time.)"""
    servers = start_fleet(server_factory, ["a", "b"], ring=["a"],
                          module_args=["call-timeout-ms", 10_000])
    a, b = servers["a"].client(), servers["b"].client()
    fill(a, n)
    servers.ring({"a": 1, "b": 3}, verb="BEGIN")
    return servers, a, b


def moving_keys(a, n=KEYS, prefix="k"):
    keys = [f"{prefix}:{i}" for i in range(n)]
    return [k for k, o in zip(keys, owners(a, keys)) if o == "b"]


@pytest.mark.slow
def test_progress_fields_and_every_moving_key_arrives(server_factory):
    servers, a, b = two_nodes(server_factory)
    assert a.execute_command("SHARD.RESHARD", "COPY") == b"OK"
    seen = status(a)
    assert seen["keys_total"] == KEYS and 0 <= seen["percent"] <= 99
    st = wait_job(a)
    moving = moving_keys(a)
    assert st["state"] == b"done" and st["failed"] == 0, st
    assert st["copied"] == len(moving) == b.dbsize()
    assert st["percent"] == 100 and st["in_flight"] == 0 and st["passes"] == 1
    assert st["bytes_sent"] > 40 * len(moving)
    assert a.dbsize() == KEYS, "COPY never deletes"
    sample = moving[:: max(1, len(moving) // 2000)]
    assert b.mget(sample) == a.mget(sample)


def test_keys_written_at_the_source_during_a_pass_are_copied_by_the_next(server_factory):
    servers, a, b = two_nodes(server_factory)
    late = moving_keys(a, 3000, prefix="late")
    assert a.execute_command("SHARD.RESHARD", "COPY") == b"OK"
    # Clients that still write to the old owner directly, while the first pass runs (its child
    # has begun to walk: on a loaded machine, or while a key index is built, 50 ms may not do).
    until(lambda: status(a)["scanned"] > 0, "the copy's first pass to walk")
    first = status(a)
    assert first["passes"] == 1 and first["state"] == b"copying", first
    a.mset({k: f"late-{k}" for k in late})
    st = wait_job(a)
    assert st["state"] == b"done" and st["failed"] == 0, st
    assert st["passes"] >= 2, st
    assert b.mget(late) == [f"late-{k}".encode() for k in late]


def test_clients_writing_the_moving_keys_all_along_leave_their_last_value(server_factory):
    servers, a, b = two_nodes(server_factory)
    counters = moving_keys(a, 400, prefix="n")
    a.mset({k: 1000 for k in counters})
    last = {}
    errors = []
    stop = threading.Event()

    def writer():
        c = servers["a"].client()  # any node: SHARD.CALL runs each INCR at the key's owner
        i = 0
        while not stop.is_set():
            k = counters[i % len(counters)]
            try:
                last[k] = c.execute_command("SHARD.CALL", "INCR", k)
            except redis.RedisError as e:
                errors.append(repr(e))
            i += 1

    t = threading.Thread(target=writer)
    t.start()
    try:
        time.sleep(0.1)
        a.execute_command("SHARD.RESHARD", "COPY")
        st = wait_job(a)
        # Every counter written at least once (the copy may end before one round of them).
        deadline = time.monotonic() + 20
        while len(last) < len(counters) and time.monotonic() < deadline and not errors:
            time.sleep(0.02)
        time.sleep(0.1)
    finally:
        stop.set()
        t.join(30)
    assert not errors, errors[:3]
    assert st["state"] == b"done", st
    assert len(last) == len(counters)
    assert b.mget(counters) == [str(last[k]).encode() for k in counters]


@pytest.mark.slow
def test_a_destination_killed_mid_copy_gets_every_key_from_a_second_copy(server_factory):
    servers, a, b = two_nodes(server_factory, n=400_000)
    a.execute_command("SHARD.RESHARD", "COPY", "TIMEOUT", 500)
    deadline = time.monotonic() + 30
    while status(a)["copied"] == 0:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    port = servers["b"].port
    servers["b"].stop(sig=9)
    st = wait_job(a)
    assert st["state"] == b"failed" and st["failed"] > 0, st
    assert f"127.0.0.1:{port}".encode() in st["last_error"], st
    servers["b"].port = port
    servers["b"].start()
    b = servers["b"].client()
    assert b.dbsize() == 0  # no persistence: it lost what it had received
    assert a.execute_command("SHARD.RESHARD", "COPY") == b"OK"
    st2 = wait_job(a)
    moving = moving_keys(a, 400_000)
    assert st2["state"] == b"done" and st2["failed"] == 0, st2
    assert b.dbsize() == len(moving) == st2["copied"]


def copied_over(client, seconds):
    """Keys copied during `seconds`, from STATUS."""
    first = status(client)["copied"]
    time.sleep(seconds)
    return status(client)["copied"] - first


def rates(client, low, tries=4):
    """Keys a second copied over 2 s windows, until one reaches `low` (at most `tries`): the
    copy's child runs under SCHED_IDLE, and on a loaded machine (CI) it may get no CPU for a
    while (one window copied nothing there); no window may go over the rate."""
    seen = []
    while len(seen) < tries and not (seen and seen[-1] >= low):
        seen.append(copied_over(client, 2.0) / 2.0)
    return seen


@pytest.mark.serial
def test_throttle_holds_the_rate_and_maxrate_starts_with_it(server_factory):
    servers, a, b = two_nodes(server_factory)
    assert a.execute_command("SHARD.RESHARD", "COPY", "MAXRATE", 5000) == b"OK"
    time.sleep(0.5)
    assert status(a)["max_rate"] == 5000
    seen = rates(a, 4000)
    assert max(seen) <= 6000 and max(seen) >= 4000, seen
    assert a.execute_command("SHARD.RESHARD", "THROTTLE", 20000) == b"OK"
    time.sleep(0.3)
    seen = rates(a, 16000)
    assert max(seen) <= 24000 and max(seen) >= 16000, seen
    assert a.execute_command("SHARD.RESHARD", "THROTTLE", 0) == b"OK"  # no limit
    st = wait_job(a)
    assert st["state"] == b"done" and st["copied"] == b.dbsize() == len(moving_keys(a)), st
    with pytest.raises(redis.ResponseError, match="no resharding job is running"):
        a.execute_command("SHARD.RESHARD", "THROTTLE", 10)
    with pytest.raises(redis.ResponseError, match="MAXRATE must be an integer from 0"):
        a.execute_command("SHARD.RESHARD", "COPY", "MAXRATE", -1)


@pytest.mark.slow
def copy_writes(server):
    """The keys a copy sent to `server`: strings travel in SHARD.APPLY (INFO counts the strings
    it wrote and skipped), other types as RESTORE."""
    info = server.client().info("shard")
    return info["shard_applied_strings"] + info["shard_applied_skipped"] + command_calls(server, "restore")


def test_pause_stops_all_traffic_and_resume_finishes_with_every_key(server_factory):
    servers, a, b = two_nodes(server_factory)
    a.execute_command("SHARD.RESHARD", "COPY", "MAXRATE", 20000)
    until(lambda: copy_writes(servers["b"]) > 0, "the copy's first keys at b")
    assert a.execute_command("SHARD.RESHARD", "PAUSE") == b"OK"
    st = until(lambda: (s := status(a))["in_flight"] == 0 and s, "what was in flight to land")
    assert st["paused"] == b"yes" and st["state"] == b"copying" and st["in_flight"] == 0
    before = copy_writes(servers["b"])
    assert 0 < before < len(moving_keys(a))
    time.sleep(1.0)
    assert copy_writes(servers["b"]) == before, "nothing is sent while paused"
    # No connection of the job is left open at the destination (only this test's own clients).
    names = [c for c in servers["b"].client().client_list() if c["cmd"] in ("restore", "shard.apply", "shard.cluster")]
    assert not names, names
    assert a.execute_command("SHARD.RESHARD", "RESUME") == b"OK"
    a.execute_command("SHARD.RESHARD", "THROTTLE", 0)
    st = wait_job(a)
    moving = moving_keys(a)
    assert st["state"] == b"done" and st["failed"] == 0, st
    assert st["copied"] == len(moving) == b.dbsize()
    assert copy_writes(servers["b"]) == len(moving), \
        "each key sent once: the pass went on where it stopped"


@pytest.mark.serial
def test_pause_and_throttle_a_cleanup(server_factory):
    servers, a, b = two_nodes(server_factory, n=100_000)
    a.execute_command("SHARD.RESHARD", "COPY")
    wait_job(a)
    for c in (a, b):
        c.execute_command("SHARD.RING", "COMMIT")
    a.execute_command("SHARD.RESHARD", "CLEANUP")
    a.execute_command("SHARD.RESHARD", "PAUSE")
    time.sleep(0.2)
    left = a.dbsize()
    time.sleep(0.5)
    assert a.dbsize() == left and status(a)["state"] == b"cleaning"
    a.execute_command("SHARD.RESHARD", "THROTTLE", 10000)
    a.execute_command("SHARD.RESHARD", "RESUME")
    time.sleep(0.3)
    first = a.dbsize()
    time.sleep(1.0)
    rate = first - a.dbsize()
    assert 8000 <= rate <= 12000, rate
    # STATUS follows a cleanup's pace too (keys walked per second, over the last seconds).
    assert 0 < status(a)["keys_per_sec"], status(a)
    a.execute_command("SHARD.RESHARD", "THROTTLE", 0)
    st = wait_job(a)
    assert st["state"] == b"done" and a.dbsize() == 100_000 - len(moving_keys(a, 100_000))


@pytest.mark.slow
def test_big_keys_of_every_type_arrive_whole_with_their_ttls(server_factory):
    servers, a, b = two_nodes(server_factory, n=0)
    # A query buffer of 2 MB at most: the 12 MB string and the hash's and sorted set's payloads
    # (over 3 MB each) cannot arrive as one RESTORE; they must come in pieces.
    b.config_set("client-query-buffer-limit", 2 * 1024 * 1024)
    names = {kind: next(k for k in moving_keys(a, 200, prefix=f"big{kind}")) for kind in
             ("string", "hash", "set", "zset", "list", "stream")}
    big = b"0123456789abcdef" * (12 * 1024 * 1024 // 16)  # 12 MB
    a.set(names["string"], big)
    fill = ("local n = tonumber(ARGV[1]) local kind = ARGV[2] "
            "for i = 1, n, 1000 do local args = {} "
            " for j = i, math.min(n, i + 999) do "
            "  if kind == 'hash' then table.insert(args, 'f' .. j) table.insert(args, 'v' .. j) "
            "  elseif kind == 'zset' then table.insert(args, j * 0.5) table.insert(args, 'm' .. j) "
            "  else table.insert(args, 'e' .. j) end end "
            " if kind == 'hash' then redis.call('HSET', KEYS[1], unpack(args)) "
            " elseif kind == 'zset' then redis.call('ZADD', KEYS[1], unpack(args)) "
            " elseif kind == 'set' then redis.call('SADD', KEYS[1], unpack(args)) "
            " else redis.call('RPUSH', KEYS[1], unpack(args)) end end return 1")
    a.eval(fill, 1, names["hash"], 300_000, "hash")
    a.eval(fill, 1, names["zset"], 300_000, "zset")
    a.eval(fill, 1, names["set"], 200_000, "set")
    a.eval(fill, 1, names["list"], 200_000, "list")
    pipe = a.pipeline(transaction=False)
    for i in range(50_000):
        pipe.xadd(names["stream"], {"n": i}, id=f"{i + 1}-0")
    pipe.execute()
    a.xdel(names["stream"], "7-0", "8-0")
    a.xgroup_create(names["stream"], "g1", id="0")
    a.xreadgroup("g1", "c1", {names["stream"]: ">"}, count=100)
    a.xreadgroup("g1", "c2", {names["stream"]: ">"}, count=5)
    a.xclaim(names["stream"], "g1", "c2", 0, ["20-0"])  # delivered twice
    a.xgroup_createconsumer(names["stream"], "g1", "c3")
    a.xgroup_create(names["stream"], "g2", id="30000-0")
    for i, key in enumerate(names.values()):
        a.pexpireat(key, int(time.time() * 1000) + 3_600_000 + i)
    copy_started = time.monotonic()
    a.execute_command("SHARD.RESHARD", "COPY")
    st = wait_job(a, timeout=300)
    assert st["state"] == b"done" and st["failed"] == 0 and st["copied"] == 6, repr(status(a))
    for key in names.values():
        assert b.pexpiretime(key) == a.pexpiretime(key), key
        assert b.type(key) == a.type(key)
    assert b.strlen(names["string"]) == len(big) and b.get(names["string"]) == big
    assert b.hlen(names["hash"]) == 300_000 == a.hlen(names["hash"])
    assert b.zcard(names["zset"]) == 300_000
    assert b.scard(names["set"]) == 200_000 and b.llen(names["list"]) == 200_000
    for j in (1, 777, 150_000, 300_000):
        assert b.hget(names["hash"], f"f{j}") == f"v{j}".encode()
        assert b.zscore(names["zset"], f"m{j}") == j * 0.5
    assert b.lrange(names["list"], 0, 2) == [b"e1", b"e2", b"e3"]
    assert b.lindex(names["list"], -1) == b"e200000"
    assert b.sismember(names["set"], "e199999")
    assert b.xlen(names["stream"]) == 49_998
    assert b.xrange(names["stream"], count=10) == a.xrange(names["stream"], count=10)
    assert b.xrevrange(names["stream"], count=3) == a.xrevrange(names["stream"], count=3)
    info_a, info_b = (c.xinfo_stream(names["stream"]) for c in (a, b))
    for field in ("length", "last-generated-id", "max-deleted-entry-id", "entries-added",
                  "groups", "first-entry", "last-entry"):
        assert info_b[field] == info_a[field], field
    assert b.xinfo_groups(names["stream"]) == a.xinfo_groups(names["stream"])
    for group in ("g1", "g2"):
        assert b.xpending(names["stream"], group) == a.xpending(names["stream"], group)
        pa, pb = (c.xpending_range(names["stream"], group, "-", "+", 1000) for c in (a, b))
        assert [(p["message_id"], p["consumer"], p["times_delivered"]) for p in pb] == \
            [(p["message_id"], p["consumer"], p["times_delivered"]) for p in pa]
        # The delivery times travel too (the idle times agree to the time since the copy
        # began: more than a minute on a loaded machine).
        since_copy_ms = (time.monotonic() - copy_started) * 1000 + 1000
        assert all(abs(x["time_since_delivered"] - y["time_since_delivered"]) < since_copy_ms
                   for x, y in zip(pa, pb))
    assert sorted(c["name"] for c in b.xinfo_consumers(names["stream"], "g1")) == \
        [b"c1", b"c2", b"c3"]
    # Nothing of the pieces is left behind.
    assert b.keys("__shard_piece__:*") == []


@pytest.mark.slow
def test_a_write_while_its_pieces_travel_wins(server_factory):
    """A client writes a big key through SHARD.CALL while the copy sends it in pieces: the
    write path's copy-before-write brings the whole key to its new owner and applies the write;
    the copy then finds the key there and leaves it (skipped), and its pieces are dropped."""
    servers, a, b = two_nodes(server_factory, n=0)
    key = moving_keys(a, 50, prefix="bighash")[0]
    a.eval("for i = 1, tonumber(ARGV[1]), 1000 do local args = {} "
           "for j = i, i + 999 do table.insert(args, 'f' .. j) table.insert(args, 'v' .. j) end "
           "redis.call('HSET', KEYS[1], unpack(args)) end return 1", 1, key, 500_000)
    temp = "__shard_piece__:" + key
    # (b may stay busy for a while applying the copy-before-write of the whole key: the pieces'
    # connection waits for it rather than count the key failed.)
    a.execute_command("SHARD.RESHARD", "COPY", "TIMEOUT", 20_000)
    deadline = time.monotonic() + 30
    while not b.exists(temp):
        assert time.monotonic() < deadline and status(a)["state"] == b"copying", status(a)
    assert b.execute_command("SHARD.CALL", "HSET", key, "written", "during") == 1
    st = wait_job(a)
    assert st["state"] == b"done" and st["skipped"] == 1 and st["copied"] == 0, st
    assert b.hget(key, "written") == b"during" and b.hlen(key) == 500_001
    assert b.hget(key, "f499999") == b"v499999" and a.hlen(key) == 500_000
    assert not b.exists(temp)


def test_keys_of_every_database_move_to_the_same_database(server_factory):
    """COPY walks databases 0, 3 and 15 (and the keys written in db 3 during the copy), each key
    arriving in its own database number; CLEANUP deletes them in every database; STATUS and
    INFO count them by database."""
    servers, a, b = two_nodes(server_factory, n=0)
    dbs = {db: (servers["a"].client(db=db), servers["b"].client(db=db)) for db in (0, 3, 15)}
    for db, (ca, _) in dbs.items():
        fill(ca, 3000, prefix=f"db{db}")
        # The same name in every database, with a value of its own.
        ca.set("same", f"from db {db}")
    # The first pass is slowed down so that a key written in db 3 lands after its fork: the
    # next pass finds it among the written keys, with its database.
    written = moving_keys(a, 50, prefix="written-during")[0]
    a.execute_command("SHARD.RESHARD", "COPY", "MAXRATE", 3000)
    # (Its child forked and walks: a fork can wait for another child, such as a key index's
    # build.)
    until(lambda: status(a)["scanned"] > 0, "the copy's first pass to walk")
    time.sleep(0.3)
    assert status(a)["state"] == b"copying" and status(a)["passes"] == 1
    dbs[3][0].set(written, "x")
    a.execute_command("SHARD.RESHARD", "THROTTLE", 0)
    st = wait_job(a)
    assert st["state"] == b"done" and st["failed"] == 0 and st["passes"] >= 2, st
    assert dbs[3][1].get(written) == b"x" and dbs[0][1].get(written) is None
    expected = {}
    for db, (ca, cb) in dbs.items():
        keys = [k.decode() for k in ca.keys("*")]
        moving = [k for k, o in zip(keys, owners(a, keys)) if o == "b"]
        expected[db] = len(moving)
        assert moving and sorted(k.decode() for k in cb.keys("*")) == sorted(moving), db
        for k in moving:
            assert cb.get(k) == ca.get(k), (db, k)
    assert servers["b"].client(db=1).dbsize() == 0
    assert st["by_db"].decode() == ",".join(f"db{db}={n}" for db, n in expected.items())
    assert st["copied"] == sum(expected.values())
    for c in (a, b):
        c.execute_command("SHARD.RING", "COMMIT")
    a.execute_command("SHARD.RESHARD", "CLEANUP")
    st = wait_job(a)
    assert st["state"] == b"done" and st["deleted"] == sum(expected.values()), st
    assert st["by_db"].decode() == ",".join(f"db{db}={n}" for db, n in expected.items())
    # INFO shows the same (redis-py reads `db0=750,db3=12` as a dict).
    assert a.info("shard")["shard_reshard_by_db"] == {f"db{db}": n for db, n in expected.items()}
    for db, (ca, _) in dbs.items():
        keys = [k.decode() for k in ca.keys("*")]
        assert keys and set(owners(a, keys)) == {"a"}, db


def test_a_destination_without_the_database_fails_those_keys_by_name(server_factory):
    servers = {"a": server_factory(module_args=["self", "a"]),
               "b": server_factory(module_args=["self", "b"], config=[("databases", 4)])}
    a, b = servers["a"].client(), servers["b"].client()
    new = ["a", f"127.0.0.1:{servers['a'].port}", 1, "b", f"127.0.0.1:{servers['b'].port}", 3]
    for c in (a, b):
        c.execute_command("SHARD.RING", "SET", "ketama", *ring_args(servers, ["a"]))
        c.execute_command("SHARD.RING", "BEGIN", "ketama", *new)
    fill(a, 500)
    fill(servers["a"].client(db=9), 500)
    a.execute_command("SHARD.RESHARD", "COPY")
    st = wait_job(a)
    moving = len(moving_keys(a, 500))
    assert st["state"] == b"failed" and st["copied"] == moving and st["failed"] == moving, st
    assert b"database 9" in st["last_error"] and b"b (127.0.0.1:" in st["last_error"], st
    assert b.dbsize() == moving


def test_a_cleanup_without_a_child_walks_every_database_itself(server_factory):
    """While a BGSAVE's child runs, a cleanup cannot fork its own: its steps scan every
    database on the main thread instead."""
    servers, a, b = two_nodes(server_factory, n=0)
    dbs = {db: servers["a"].client(db=db) for db in (0, 3)}
    for db, c in dbs.items():
        fill(c, 2000, prefix=f"db{db}")
    a.execute_command("SHARD.RESHARD", "COPY")
    assert wait_job(a)["state"] == b"done"
    for c in (a, b):
        c.execute_command("SHARD.RING", "COMMIT")
    a.config_set("rdb-key-save-delay", 500)  # microseconds per key: the BGSAVE lasts seconds
    a.bgsave()
    assert a.info("persistence")["rdb_bgsave_in_progress"] == 1
    a.execute_command("SHARD.RESHARD", "CLEANUP")
    st = wait_job(a)
    assert a.info("persistence")["rdb_bgsave_in_progress"] == 1  # still: no child of ours ran
    assert st["state"] == b"done" and st["failed"] == 0, st
    for db, c in dbs.items():
        keys = [k.decode() for k in c.keys("*")]
        assert 0 < len(keys) < 2000 and set(owners(a, keys)) == {"a"}, db
    a.config_set("rdb-key-save-delay", 0)


def test_writes_of_keys_the_node_keeps_do_not_hold_the_copy_open(server_factory):
    """Clients write keys the new ring leaves on the source all along the copy: those need no
    next pass, so the copy ends after its first pass or two, not after 32 (the written-keys
    record keeps only the keys the ring gives away)."""
    servers, a, b = two_nodes(server_factory, n=50_000)
    keys = [f"k:{i}" for i in range(50_000)]
    kept = [k for k, o in zip(keys, owners(a, keys)) if o == "a"][:200]
    stop = threading.Event()

    writes = []

    def writer():
        c = servers["a"].client()
        i = 0
        while not stop.is_set():
            c.set(kept[i % len(kept)], i)
            i += 1
        writes.append(i)

    t = threading.Thread(target=writer)
    t.start()
    try:
        time.sleep(0.1)
        assert a.execute_command("SHARD.RESHARD", "COPY") == b"OK"
        st = wait_job(a)
    finally:
        stop.set()
        t.join()
    assert writes and writes[0] > 100, "the writer wrote all along"
    assert st["state"] == b"done" and st["failed"] == 0, st
    assert st["passes"] <= 2, st
    assert st["copied"] == b.dbsize() == len(moving_keys(a, 50_000))
