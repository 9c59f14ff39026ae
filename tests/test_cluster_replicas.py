"""Cluster maps with replicas (issue 33): with `shard.cluster-protocol yes` on a fleet whose
primaries have replicas (the module loaded on every server), CLUSTER SLOTS, SHARDS and NODES list
each shard's replicas after its primary, as a real cluster with replicas does; a client that
sent READONLY reads its keys at a replica, anything else there is MOVED to the primary; so the
cluster clients' replica reads (redis-py's `read_from_replicas`, ioredis's `scaleReads`) work on
a plain fleet. Behind Sentinel, the maps follow a failover."""

import hashlib
import random
import subprocess

import pytest
import redis
from redis.cluster import RedisCluster

from helpers.calls import key_names, random_ops
from helpers.cluster import cluster_fleet_with_replicas, real_cluster_with_a_replica
from helpers.fleet import NAMES, keys_of
from helpers.sentinel import SHARDS, start_sentinel_fleet
from helpers.server import FILTER_SEES_CLIENT, as_dict, command_calls, until, wait_in_sync


@pytest.fixture
def fleet(server_factory):
    return cluster_fleet_with_replicas(server_factory)


def node_id(name):
    return hashlib.sha1(name.encode()).hexdigest()


def nodes_lines(server):
    return server.client().execute_command("CLUSTER", "NODES").decode().strip().splitlines()


def shape_of_slots(slots):
    """A CLUSTER SLOTS reply's shape: per range, the types of each node entry's fields."""
    return {tuple(tuple(type(x).__name__ for x in node) for node in entry[2:])
            for entry in slots}


def shape_of_shards(shards):
    """A CLUSTER SHARDS reply's shape: per shard its nodes' fields and roles (the fields of
    Redis 7.0's format: Valkey adds a shard `id`)."""
    out = set()
    for shard in shards:
        shard = as_dict(shard)
        assert {"slots", "nodes"} <= set(shard), shard
        out.add(tuple((tuple(sorted(as_dict(n))), as_dict(n)["role"]) for n in shard["nodes"]))
    return out


def shape_of_nodes(lines):
    """A CLUSTER NODES reply's shape: per line its flags without `myself`, whether its master
    field is `-` or another line's id, and its fields before the slots."""
    ids = {line.split()[0] for line in lines}
    shape = set()
    for line in lines:
        fields = line.split()
        master = "-" if fields[3] == "-" else ("id" if fields[3] in ids else fields[3])
        shape.add((fields[2].replace("myself,", ""), master, len(fields[:8]), fields[7]))
    return shape


def test_every_node_lists_the_replicas_as_a_real_cluster_does(fleet, server_factory):
    primaries, replicas = fleet
    slots, shards, maps = [], [], set()
    for s in (*primaries.values(), *replicas.values()):
        c = s.client()
        slots.append(c.execute_command("CLUSTER", "SLOTS"))
        shards.append(c.execute_command("CLUSTER", "SHARDS"))
        lines = nodes_lines(s)
        assert len(lines) == 6
        mine = [line for line in lines if "myself" in line]
        assert len(mine) == 1 and f":{s.port}@" in mine[0], mine
        assert c.execute_command("CLUSTER", "MYID").decode() == mine[0].split()[0]
        maps.add(tuple(sorted(line.replace("myself,", "") for line in lines)))
        info = c.execute_command("CLUSTER", "INFO").decode()
        assert "cluster_known_nodes:6" in info and "cluster_size:3" in info
    # Every node reports the same map.
    assert len(maps) == 1 and all(x == slots[0] for x in slots) and all(x == shards[0] for x in shards)
    # Each range: its primary, then its replica.
    got = sorted((e[0], e[1], e[2][1], tuple(r[1] for r in e[3:])) for e in slots[0])
    assert got == [(0, 5460, primaries["n0"].port, (replicas["n0"].port,)),
                   (5461, 10922, primaries["n1"].port, (replicas["n1"].port,)),
                   (10923, 16383, primaries["n2"].port, (replicas["n2"].port,))]
    lines = maps.pop()
    for n in NAMES:
        replica_line = next(line for line in lines if f":{replicas[n].port}@" in line)
        assert replica_line.split()[2:4] == ["slave", node_id(n)], replica_line
        assert replica_line.endswith(" connected")
    # The same shapes as a real cluster of a primary and a replica.
    real_primary, real_replica = real_cluster_with_a_replica(server_factory)
    real = real_primary.client()
    assert shape_of_slots(slots[0]) == shape_of_slots(real.execute_command("CLUSTER", "SLOTS"))
    assert shape_of_shards(shards[0]) == shape_of_shards(real.execute_command("CLUSTER", "SHARDS"))
    assert shape_of_nodes(list(lines)) == shape_of_nodes(nodes_lines(real_replica))


def test_a_replica_serves_readonly_reads_and_redirects_the_rest(fleet):
    primaries, replicas = fleet
    p0 = primaries["n0"].client()
    mine, other = keys_of(p0, "n0", 1, "ro")[0], keys_of(p0, "n1", 1, "ro")[0]
    slot, other_slot = (p0.execute_command("CLUSTER", "KEYSLOT", k) for k in (mine, other))
    assert p0.set(mine, "v") and primaries["n1"].client().set(other, "w")
    r0 = replicas["n0"].client(single_connection_client=True)
    wait_in_sync(p0, r0)
    to_primary = rf"^MOVED {slot} 127\.0\.0\.1:{primaries['n0'].port}$"
    # Without READONLY a replica redirects reads and writes to its primary, as cluster mode.
    with pytest.raises(redis.ResponseError, match=to_primary):
        r0.get(mine)
    with pytest.raises(redis.ResponseError, match=to_primary):
        r0.set(mine, "x")
    assert r0.execute_command("READONLY") in (True, b"OK")
    assert r0.get(mine) == b"v" and r0.exists(mine) == 1 and r0.strlen(mine) == 1
    # Writes still go to the primary; another shard's keys to theirs.
    with pytest.raises(redis.ResponseError, match=to_primary):
        r0.set(mine, "x")
    with pytest.raises(redis.ResponseError, match=to_primary):
        r0.incr(mine)
    with pytest.raises(redis.ResponseError,
                       match=rf"^MOVED {other_slot} 127\.0\.0\.1:{primaries['n1'].port}$"):
        r0.get(other)
    with pytest.raises(redis.ResponseError, match="CROSSSLOT"):
        r0.mget(mine, other)
    assert r0.ping() and r0.dbsize() == 1  # keyless commands as always
    assert r0.execute_command("READWRITE") in (True, b"OK")
    with pytest.raises(redis.ResponseError, match=to_primary):
        r0.get(mine)
    # The replica still applies its primary's writes, and nothing else.
    assert p0.set(mine, "after")
    r0.execute_command("READONLY")
    wait_in_sync(p0, r0)
    assert r0.get(mine) == b"after" and p0.get(mine) == b"after"
    # The module's own connections read at replicas (SHARD.CALL under read-from replica).
    wait_in_sync(primaries["n1"].client(), replicas["n1"].client())
    gets = command_calls(replicas["n1"], "get")
    p0.config_set("shard.read-from", "replica")
    assert p0.execute_command("SHARD.CALL", "GET", other) == b"w"
    assert command_calls(replicas["n1"], "get") == gets + 1


def test_redis_py_reads_from_replicas_and_writes_to_primaries(fleet):
    primaries, replicas = fleet
    rc = RedisCluster(host="127.0.0.1", port=primaries["n0"].port, socket_timeout=10,
                      read_from_replicas=True)
    keys = [f"rr:{i}" for i in range(300)]
    sets_before = {n: command_calls(primaries[n], "set") for n in NAMES}
    for k in keys:
        assert rc.set(k, f"v-{k}")
    assert sum(command_calls(primaries[n], "set") - sets_before[n] for n in NAMES) == len(keys)
    for n in NAMES:
        wait_in_sync(primaries[n].client(), replicas[n].client())
    gets = {s: command_calls(s, "get") for s in (*primaries.values(), *replicas.values())}
    for k in keys:
        assert rc.get(k) == f"v-{k}".encode(), k
    on_replicas = sum(command_calls(s, "get") - gets[s] for s in replicas.values())
    on_primaries = sum(command_calls(s, "get") - gets[s] for s in primaries.values())
    # redis-py takes the primary and the replicas of a slot in turn.
    assert on_replicas + on_primaries == len(keys)
    assert all(command_calls(s, "get") > gets[s] for s in replicas.values()), (on_replicas,)
    for s in replicas.values():
        errors = s.client().info("errorstats")
        assert "errorstat_MOVED" not in errors, errors  # READONLY was sent: nothing redirected
        if FILTER_SEES_CLIENT:
            # The filter knows the client: the replication stream (after its first keyed
            # command) and the READONLY reads pass untouched, with no SHARD.REDIRECT.
            assert command_calls(s, "shard.redirect") <= 1


def test_ioredis_scale_reads_to_replicas(fleet, ioredis):
    primaries, replicas = fleet
    keys = [f"io:{i}" for i in range(200)]
    got = ioredis("replicas", primaries["n0"].port, [["SET", k, f"v-{k}"] for k in keys])
    assert got == [{"ok": "OK"}] * len(keys)
    for n in NAMES:
        wait_in_sync(primaries[n].client(), replicas[n].client())
    before = {s: command_calls(s, "get") for s in (*primaries.values(), *replicas.values())}
    got = ioredis("replicas", replicas["n1"].port, [["GET", k] for k in keys])
    assert got == [{"ok": f"v-{k}"} for k in keys]
    # scaleReads "slave": every read at a replica, none at a primary.
    assert all(command_calls(s, "get") == before[s] for s in primaries.values()), \
        [(s.port, command_calls(s, "get") - before[s], s.client().info("errorstats"))
         for s in (*primaries.values(), *replicas.values())]
    assert sum(command_calls(s, "get") - before[s] for s in replicas.values()) == len(keys)
    assert all(command_calls(s, "get") > before[s] for s in replicas.values())


def test_redis_cli_follows_a_replica_to_the_primaries(fleet):
    primaries, replicas = fleet
    port = replicas["n2"].port
    for i in range(20):
        out = subprocess.run(["redis-cli", "-c", "-p", str(port), "SET", f"cli:{i}", f"v{i}"],
                             capture_output=True, text=True, timeout=10)
        assert out.stdout.strip() == "OK", out
        out = subprocess.run(["redis-cli", "-c", "-p", str(port), "GET", f"cli:{i}"],
                             capture_output=True, text=True, timeout=10)
        assert out.stdout.strip() == f"v{i}", out
    assert sum(s.client().dbsize() for s in primaries.values()) == 20


def test_sentinel_fleet_maps_follow_a_failover(server_factory, sentinel_factory):
    fleet = start_sentinel_fleet(server_factory, sentinel_factory)
    ring = ["slots", *[x for n in SHARDS for x in (n, "sentinel", 1)]]
    every = (*fleet.primaries.values(), *fleet.replicas.values())
    for n in SHARDS:
        fleet.primaries[n].client().execute_command("SHARD.RING", "SET", *ring)
    for s in every:
        until(lambda: s.client().execute_command("SHARD.RING", "GET")[1] == b"slots",
              "the slots ring everywhere")
        s.client().config_set("shard.cluster-protocol", "yes")

    def n0_range(server):
        slots = server.client().execute_command("CLUSTER", "SLOTS")
        entry = next(e for e in slots if e[0] == 0)
        return [node[1] for node in entry[2:]]

    old, new = fleet.primaries["n0"], fleet.replicas["n0"]
    for s in every:
        until(lambda: n0_range(s) == [old.port, new.port], "n0's replica in the map")
    key = keys_of(old.client(), "n0", 1, "f")[0]
    assert old.client().set(key, "before")
    wait_in_sync(old.client(), new.client())
    fleet.sentinels[0].client().execute_command("SENTINEL", "FAILOVER", "n0")
    # The new primary first, the old one as its replica once it has rejoined, on every node.
    for s in every:
        until(lambda: n0_range(s) == [new.port, old.port], "the map after the failover",
              timeout=40)
    line = next(line for line in nodes_lines(old) if "myself" in line)
    assert line.split()[2:4] == ["myself,slave", node_id("n0")], line
    # The old primary, now a replica, serves READONLY reads of n0's keys and redirects writes.
    c = old.client(single_connection_client=True)
    wait_in_sync(new.client(), c)
    c.execute_command("READONLY")
    assert c.get(key) == b"before"
    slot = c.execute_command("CLUSTER", "KEYSLOT", key)
    with pytest.raises(redis.ResponseError, match=rf"^MOVED {slot} 127\.0\.0\.1:{new.port}$"):
        c.set(key, "x")
    rc = RedisCluster(host="127.0.0.1", port=fleet.primaries["n1"].port, socket_timeout=10,
                      read_from_replicas=True)
    assert rc.set(key, "after") and rc.get(key) in (b"before", b"after")
    assert new.client().get(key) == b"after"


def content(client, key):
    """A key's type and value, in a form that does not depend on its encoding."""
    kind = client.type(key)
    value = {
        b"string": lambda: client.get(key),
        b"hash": lambda: client.hgetall(key),
        b"list": lambda: client.lrange(key, 0, -1),
        b"set": lambda: client.smembers(key),
        b"zset": lambda: client.zrange(key, 0, -1, withscores=True),
    }.get(kind, lambda: client.dump(key))()
    return kind, value, client.pexpiretime(key)


def test_a_replica_with_the_protocol_holds_what_its_primary_holds(fleet):
    """The replication stream is never redirected: on Redis 7.0 it runs through SHARD.REDIRECT
    (the filter cannot tell its client), transactions and scripts included, and the replica
    ends with exactly its primary's keys."""
    primaries, replicas = fleet
    rc = RedisCluster(host="127.0.0.1", port=primaries["n0"].port, socket_timeout=10)
    rng = random.Random(33)
    keys = [k for k in key_names(200, "sync") if isinstance(k, str)]
    for op in random_ops(rng, 2000, keys):
        try:
            rc.execute_command(*op)
        except redis.ResponseError:
            pass
    p0 = primaries["n0"].client()
    local = keys_of(p0, "n0", 3, "local")
    pipe = p0.pipeline(transaction=True)
    pipe.set(local[0], "in-multi").incr(local[1]).expire(local[0], 100)
    assert pipe.execute() == [True, 1, True]
    p0.eval("redis.call('SET', KEYS[1], ARGV[1]) return 1", 1, local[2], "by-script")
    for n in NAMES:
        p, r = primaries[n].client(), replicas[n].client(single_connection_client=True)
        r.execute_command("READONLY")  # DUMP is a read: without it, MOVED to the primary
        wait_in_sync(p, r)
        held = sorted(p.keys("*"))
        assert held and sorted(r.keys("*")) == held, n
        for k in held:
            # (Compared by content: DUMP of a hash in its hashtable encoding lists the fields
            # in the order of each process's own hash seed.)
            assert content(r, k) == content(p, k), (n, k)
        assert "errorstat_MOVED" not in r.info("errorstats"), n
