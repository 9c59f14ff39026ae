"""The key index (`shard.key-index yes`, issue 32): the names of a node's keys by database and
ring bucket, kept exact through every way a key is made or ends, and through whole-keyspace
changes (flushes, SWAPDB, loads, a replica's full sync), checked against a full scan
(`SHARD.DEBUG KEYINDEX db` lists what the index holds). With it, a copy visits only the buckets
that move (STATUS `keys_from: index`), and CLUSTER COUNTKEYSINSLOT/GETKEYSINSLOT answer from it."""

import hashlib
import signal
import time

import pytest
import redis

from helpers.fleet import owners, start_fleet
from helpers.keys import key_slot
from helpers.reshard import status, wait_job
from helpers.server import command_calls, info_shard, pipelined, until, wait_in_sync

DEBUG = [("enable-debug-command", "yes")]


def indexed(client, db=0):
    """{name: bucket} the index holds for `db` (waits until it is ready)."""
    def ready():
        try:
            return client.execute_command("SHARD.DEBUG", "KEYINDEX", db)
        except redis.ResponseError as e:
            if "NOTREADY" in str(e):
                return None
            raise
    flat = until(lambda: (r := ready()) is not None and (r,), "the key index to be ready")[0]
    return {name: bucket for bucket, name in zip(flat[::2], flat[1::2])}


def assert_exact(server, dbs=(0,), slots=False):
    c = server.client()
    for db in dbs:
        got = indexed(c, db)
        want = set(server.client(db=db).scan_iter(count=1000))
        assert set(got) == want, (db, len(got), len(want),
                                  sorted(set(got) ^ want)[:5])
        if slots:
            assert all(b == key_slot(n) for n, b in got.items())


def node(server_factory, algo="ketama", config=(), extra=()):
    s = server_factory(module_args=["self", "a", "key-index", "yes", *extra],
                       config=[*DEBUG, *config])
    ring = ["slots", "a", f"127.0.0.1:{s.port}", 1] if algo == "slots" else \
        [algo, "a", f"127.0.0.1:{s.port}", 1]
    s.client().execute_command("SHARD.RING", "SET", *ring)
    return s


@pytest.mark.parametrize("algo", ["ketama", "slots"])
def test_the_index_follows_every_way_a_key_is_made_or_ends(server_factory, algo):
    s = node(server_factory, algo)
    c = s.client()
    pipelined(c, [("SET", f"k:{i}", i) for i in range(3000)])
    assert_exact(s, slots=algo == "slots")
    # Deletions of every kind.
    c.delete(*[f"k:{i}" for i in range(0, 100)])
    c.unlink(*[f"k:{i}" for i in range(100, 200)])
    c.rename("k:200", "renamed:200")
    c.renamenx("k:201", "renamed:201")
    c.set("k:202", "over")  # an overwrite makes nothing new
    c.move("k:203", 2)
    c.copy("k:204", "copied:204")
    c.restore("restored", 0, c.dump("k:205"))
    c.getdel("k:206")
    # Containers that empty themselves.
    c.rpush("list", "a")
    c.lpop("list")
    c.sadd("set", "m")
    c.srem("set", "m")
    c.hset("hash", "f", "v")
    c.hdel("hash", "f")
    c.zadd("zset", {"m": 1})
    c.zpopmin("zset")
    c.xadd("stream", {"f": "v"})
    # Expiries: active, lazy (a read of an expired key), and a write over an expired key.
    for i in range(300, 400):
        c.pexpire(f"k:{i}", 1)
    c.pexpire("k:400", 1)
    c.pexpire("k:401", 1)
    time.sleep(0.05)
    c.get("k:400")
    c.set("k:401", "again")
    until(lambda: c.dbsize() == len(set(c.scan_iter(count=1000))) and not any(
        c.exists(f"k:{i}") for i in range(300, 400)), "the expired keys to go")
    assert_exact(s, dbs=(0, 2), slots=algo == "slots")
    # Whole databases: SWAPDB, FLUSHDB, FLUSHALL.
    c.execute_command("SWAPDB", 0, 2)
    assert_exact(s, dbs=(0, 2))
    c.execute_command("SWAPDB", 0, 2)
    s.client(db=2).flushdb()
    assert_exact(s, dbs=(0, 2))
    c.flushall()
    assert indexed(c) == {}
    c.set("after-flush", 1)
    assert_exact(s)


def test_evicted_keys_leave_the_index(server_factory):
    s = node(server_factory, config=[("maxmemory-policy", "allkeys-random")])
    c = s.client()
    used = c.info("memory")["used_memory"]
    c.config_set("maxmemory", used + 2_000_000)
    pipelined(c, [("SET", f"big:{i}", "x" * 1000) for i in range(5000)], raise_on_error=False)
    assert c.info("stats")["evicted_keys"] > 0
    # (Every command evicts while the server is over maxmemory: none after this, so that the
    # index and the scan see the same keys.)
    c.config_set("maxmemory", 0)
    assert_exact(s)


def test_the_index_is_built_when_turned_on_and_after_a_load_and_a_restart(server_factory):
    s = server_factory(module_args=["self", "a"],
                       config=[*DEBUG, ("appendonly", "yes"), ("appendfsync", "always")])
    c = s.client()
    c.execute_command("SHARD.RING", "SET", "ketama", "a", f"127.0.0.1:{s.port}", 1)
    pipelined(c, [("SET", f"k:{i}", i) for i in range(20_000)])
    with pytest.raises(redis.ResponseError, match="NOTREADY"):
        c.execute_command("SHARD.DEBUG", "KEYINDEX", 0)
    c.config_set("shard.key-index", "yes")
    assert_exact(s)
    assert info_shard(c)["key_index"] == "ready"
    builds = int(info_shard(c)["key_index_builds"])
    c.execute_command("DEBUG", "RELOAD")
    until(lambda: int(info_shard(c)["key_index_builds"]) > builds, "a build after the load")
    assert_exact(s)
    with pytest.raises(redis.ResponseError, match="key-index is yes or no"):
        c.config_set("shard.key-index", "maybe")
    # A restart from the AOF: the setting given at load builds it again.
    s.module_args += ["key-index", "yes"]
    s.stop(signal.SIGKILL)
    s.start()
    assert_exact(s)
    c = s.client()
    c.config_set("shard.key-index", "no")
    assert info_shard(c)["key_index"] == "off"
    assert info_shard(c)["key_index_keys"] == "0"


def test_a_replica_after_its_full_sync_holds_an_exact_index(server_factory):
    primary = node(server_factory)
    pipelined(primary.client(), [("SET", f"k:{i}", i) for i in range(5000)])
    replica = server_factory(module_args=["self", "a", "key-index", "yes"], config=DEBUG)
    replica.client().execute_command("REPLICAOF", "127.0.0.1", primary.port)
    wait_in_sync(primary.client(), replica.client(), timeout=30)
    primary.client().delete(*[f"k:{i}" for i in range(100)])
    primary.client().set("new-after-sync", 1)
    wait_in_sync(primary.client(), replica.client(), timeout=30)
    assert_exact(replica)


def test_countkeysinslot_and_getkeysinslot_answer_from_the_index(server_factory):
    s = node(server_factory, "slots")
    c = s.client()
    c.config_set("shard.cluster-protocol", "yes")
    names = [f"{{user{i % 5}}}:{i}" for i in range(100)]
    pipelined(c, [("SET", n, 1) for n in names])
    indexed(c)  # ready
    for tag in range(5):
        slot = key_slot(f"{{user{tag}}}:0".encode())
        assert c.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 20
        got = c.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 7)
        assert len(got) == 7 and all(key_slot(n) == slot for n in got)
    # The answers are the index's (a walk would give the same): a name the index lost is not
    # counted.
    lost = names[0]
    assert c.execute_command("SHARD.DEBUG", "KEYINDEX-FORGET", 0, lost) == 1
    assert c.execute_command("CLUSTER", "COUNTKEYSINSLOT", key_slot(lost.encode())) == 19


def indexed_resharding(server_factory, n, weights):
    """a (with the key index, ready) holds k:0..n-1; a resharding to `weights` of a and b is
    open on both. The servers, a's client, and the keys that move to b."""
    servers = start_fleet(server_factory, ["a", "b"], ring=["a"],
                          module_args=["key-index", "yes"], config=DEBUG)
    a = servers["a"].client()
    keys = [f"k:{i}" for i in range(n)]
    pipelined(a, [("SET", k, i) for i, k in enumerate(keys)])
    indexed(a)
    servers.ring(weights, verb="BEGIN")
    return servers, a, [k for k, o in zip(keys, owners(a, keys)) if o == "b"]


def test_a_copy_with_the_index_visits_only_the_buckets_that_move(server_factory):
    servers, a, moving = indexed_resharding(server_factory, 30_000, {"a": 3, "b": 1})
    assert a.execute_command("SHARD.RESHARD", "COPY") == b"OK"
    st = wait_job(a)
    assert st["state"] == b"done" and st["keys_from"] == b"index", st
    assert st["copied"] == len(moving) == servers["b"].client().dbsize()
    # It looked at the keys of the buckets that move, not at the whole keyspace.
    assert len(moving) <= st["scanned"] < 30_000 / 2, st["scanned"]
    for n in ("a", "b"):
        servers[n].client().execute_command("SHARD.RING", "COMMIT")
    a.execute_command("SHARD.RESHARD", "CLEANUP")
    st = wait_job(a)
    assert st["keys_from"] == b"list" and st["deleted"] == len(moving), st
    assert a.dbsize() == 30_000 - len(moving)
    assert_exact(servers["a"])


def test_a_copy_does_not_trust_an_index_that_names_fewer_keys_than_there_are(server_factory):
    """An index that lost a name (as a missed event would make it: SHARD.DEBUG KEYINDEX-FORGET)
    is not trusted: the copy walks the keyspace and moves every key, and the index is built
    again, whole."""
    servers, a, moving = indexed_resharding(server_factory, 5000, {"a": 1, "b": 1})
    assert a.execute_command("SHARD.DEBUG", "KEYINDEX-FORGET", 0, moving[0]) == 1
    builds = int(info_shard(a)["key_index_builds"])
    assert a.execute_command("SHARD.RESHARD", "COPY") == b"OK"
    st = wait_job(a)
    assert st["state"] == b"done" and st["keys_from"] == b"walk", st
    assert st["copied"] == len(moving) == servers["b"].client().dbsize()
    assert servers["b"].client().get(moving[0]) is not None
    until(lambda: int(info_shard(a)["key_index_builds"]) > builds, "the index built again")
    assert_exact(servers["a"])


def ketama_bucket(name):
    """A key's bucket on a ketama ring (no hash tags): the top 14 bits of the first word of its
    MD5, little-endian, as libketama reads it."""
    return int.from_bytes(hashlib.md5(name.encode()).digest()[:4], "little") >> 18


@pytest.mark.parametrize("algo", ["ketama", "slots"])
def test_ring_check_counts_each_nodes_keys_per_range_of_buckets_it_owns(server_factory, algo):
    """SHARD.RING CHECK with the key index: each node's keys per range of buckets it owns
    wholly (counted here from the names' own hashes), the keys of buckets it shares with another
    node, and those it holds but does not own (a stray); without the index, it says so."""
    names = ["a", "b", "c"]
    servers = start_fleet(server_factory, names, algo=algo, config=DEBUG,
                          per_node_args={"a": ["key-index", "yes"], "b": ["key-index", "yes"]})
    c = servers["a"].client()
    keys = [f"k:{i}" for i in range(6000)]
    where = dict(zip(keys, owners(c, keys)))
    for n in names:
        pipelined(servers[n].client(), [("SET", k, 1) for k in keys if where[k] == n])
    stray = next(k for k in keys if where[k] == "b")
    servers["a"].client().set(stray, "left behind")  # a holds a key b owns
    for n in ("a", "b"):
        indexed(servers[n].client())
    bucket = (lambda k: key_slot(k.encode())) if algo == "slots" else ketama_bucket
    reply = c.execute_command("SHARD.RING", "CHECK")
    nodes = {name.decode(): dict(zip(f[::2], f[1::2])) for name, f in
             zip(reply[5][::2], reply[5][1::2])}
    for n in ("a", "b"):
        f = nodes[n]
        held = [k for k in keys if where[k] == n] + ([stray] if n == "a" else [])
        ranges = f[b"key_ranges"]
        assert ranges, f
        in_ranges = 0
        for first, last, count in ranges:
            assert count == sum(1 for k in held if first <= bucket(k) <= last), (n, first, last)
            in_ranges += count
        # Every key held is in a whole range, a shared bucket, or not owned at all.
        assert in_ranges + f[b"keys_in_part_buckets"] + f[b"keys_not_owned"] == len(held)
        # Every key the node owns is counted as its own; the stray is counted apart.
        assert f[b"keys_not_owned"] + f[b"keys_in_part_buckets"] >= (1 if n == "a" else 0)
        if algo == "slots":
            assert f[b"keys_in_part_buckets"] == 0
            assert f[b"keys_not_owned"] == (1 if n == "a" else 0)
            assert in_ranges == len(held) - (1 if n == "a" else 0)
    assert nodes["c"][b"key_ranges"].startswith(b"unknown")


def test_a_cleanup_without_the_copys_list_visits_only_the_buckets_that_move(server_factory):
    """After a reload the copy's list is gone, but the key index (built again after the load)
    names the keys by bucket: the cleanup visits those of the buckets the ring does not give
    wholly to this node and looks at no other key (`keys_from: index`), in steps on the main
    thread without a fork (`shard.copy-fork auto`, the default)."""
    servers, a, moving = indexed_resharding(server_factory, 30_000, {"a": 3, "b": 1})
    assert a.execute_command("SHARD.RESHARD", "COPY") == b"OK"
    assert wait_job(a)["failed"] == 0
    a.execute_command("DEBUG", "RELOAD")
    builds = int(info_shard(a)["key_index_builds"])
    indexed(a)  # built again after the load
    assert int(info_shard(a)["key_index_builds"]) >= builds
    late = [f"late:{i}" for i in range(2000)]  # written after the copy: some go too
    pipelined(a, [("SET", k, "v") for k in late])
    late_moving = [k for k, o in zip(late, owners(a, late)) if o == "b"]
    for n in ("a", "b"):
        servers[n].client().execute_command("SHARD.RING", "COMMIT")
    forks = a.info("stats")["total_forks"]
    assert a.execute_command("SHARD.RESHARD", "CLEANUP") == b"OK"
    st = wait_job(a)
    assert st["state"] == b"done" and st["keys_from"] == b"index", st
    assert a.info("stats")["total_forks"] == forks, "the cleanup walked the index in a child"
    assert st["deleted"] == len(moving) + len(late_moving), st
    assert len(moving) <= st["scanned"] < 32_000 / 2, st["scanned"]
    assert a.dbsize() == 32_000 - st["deleted"]
    left = [k.decode() for k in a.scan_iter(count=1000)]
    assert all(o == "a" for o in owners(a, left))
    assert_exact(servers["a"])


def test_a_build_under_many_deletions_ends_exact(server_factory):
    """Past its bound of names deleted during a build (lowered here to 10), a build looks each
    name up as it arrives instead of starting again: it ends, exact."""
    s = server_factory(module_args=["self", "a"], config=DEBUG)
    c = s.client()
    c.execute_command("SHARD.RING", "SET", "ketama", "a", f"127.0.0.1:{s.port}", 1)
    c.execute_command("DEBUG", "POPULATE", 1_000_000, "key", 10)
    assert c.execute_command("SHARD.DEBUG", "KEYINDEX-GONE-LIMIT", 10) == b"OK"
    c.config_set("shard.key-index", "yes")
    until(lambda: info_shard(c)["key_index"] == "building", "the build to start", every=0.001)
    pipelined(c, [("UNLINK", *[f"key:{i}" for i in range(j, j + 100)])
                  for j in range(0, 30_000, 100)])
    assert info_shard(c)["key_index"] == "building", "deleted while the build runs"
    # (Each name is looked up as it arrives: slower than a plain build on a loaded machine.)
    until(lambda: info_shard(c)["key_index"] == "ready", "the build to end", timeout=120)
    assert_exact(s)
    assert c.dbsize() == 970_000
    info = info_shard(c)
    assert info["key_index_builds"] == "1" and info["key_index_restarts"] == "0", info


def test_a_bucket_of_one_hash_tag_travels_in_bounded_batches(server_factory):
    """One hash tag's keys fill one bucket: a copy from the index still ships them at most 256
    strings a command (one bucket must never become one command of all its keys)."""
    servers = start_fleet(server_factory, ["a", "b"], ring=["a"], algo="slots",
                          module_args=["key-index", "yes"], config=DEBUG)
    a = servers["a"].client()
    servers.ring({"a": 1, "b": 3}, verb="BEGIN", algo="slots")
    tag = next(t for t in range(1000) if owners(a, [f"{{t{t}}}:0"]) == ["b"])
    keys = [f"{{t{tag}}}:{i}" for i in range(5000)]
    pipelined(a, [("SET", k, i) for i, k in enumerate(keys)])
    indexed(a)
    assert a.execute_command("SHARD.RESHARD", "COPY") == b"OK"
    st = wait_job(a)
    assert st["state"] == b"done" and st["keys_from"] == b"index", st
    assert st["copied"] == 5000 == servers["b"].client().dbsize()
    calls = command_calls(servers["b"], "shard.apply")
    assert calls >= 5000 / 256, calls


def test_a_copy_ends_when_the_server_reaps_its_child_while_a_build_waits_to_fork(server_factory):
    """The copy seen in `copying` for ever with nothing in flight (fixed in 44951d3): the key
    index's build, refused a fork while the copy's child ran, took the running child's done
    handler for its own, so when the server's cron reaped the copy's child the copy never
    learned it ended. Made deterministic by `SHARD.DEBUG COPY-CHILD-END ms`: the child waits at
    its end while the build is turned on and refused its fork, and the copy leaves reaping the
    child to the server."""
    servers = start_fleet(server_factory, ["a", "b"], ring=["a"], config=DEBUG)
    a = servers["a"].client()
    pipelined(a, [("SET", f"k:{i}", i) for i in range(2000)])
    servers.ring({"a": 1, "b": 1}, verb="BEGIN")
    assert a.execute_command("SHARD.DEBUG", "COPY-CHILD-END", 1500) == b"OK"
    assert a.execute_command("SHARD.RESHARD", "COPY") == b"OK"
    until(lambda: a.info("persistence")["module_fork_in_progress"] == 1, "the copy's child")
    # The build tries to fork while the copy's child runs: refused, it waits and tries again.
    a.config_set("shard.key-index", "yes")
    time.sleep(0.3)
    assert info_shard(a)["key_index"] == "waiting", info_shard(a)["key_index"]
    assert status(a)["state"] == b"copying"
    st = wait_job(a, timeout=15)
    assert st["state"] == b"done", st
    assert st["copied"] == servers["b"].client().dbsize() > 0
    a.execute_command("SHARD.DEBUG", "COPY-CHILD-END", 0)
    indexed(a)


def test_an_index_turned_off_gives_its_memory_back_in_steps(server_factory):
    """An index dropped (`shard.key-index no`) is freed in steps on the main thread
    (`index::free`: before, on a thread of its own, whose frees made the main thread wait for
    the allocator's locks): all of its memory comes back, over as many turns of the event loop
    as it takes, while the server serves its keys."""
    s = node(server_factory, config=DEBUG)
    c = s.client()
    pipelined(c, [("SET", f"k:{i}", i) for i in range(200_000)])
    until(lambda: info_shard(c)["key_index"] == "ready", "the index built", timeout=60)
    index_bytes = int(info_shard(c)["key_index_bytes"])
    assert index_bytes > 2_000_000
    with_index = c.info("memory")["used_memory"]
    c.config_set("shard.key-index", "no")
    until(lambda: with_index - c.info("memory")["used_memory"] > 0.9 * index_bytes,
          "the index's memory given back", timeout=30)
    assert info_shard(c)["key_index"] == "off"
    assert c.dbsize() == 200_000 and c.get("k:199999") == b"199999"
