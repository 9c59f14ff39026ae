"""Cluster clients on a fleet of plain servers (issue 22): with `shard.cluster-protocol yes` on a
`slots` ring, the nodes answer the CLUSTER commands and redirect keyed commands, so redis-py's
RedisCluster, `redis-cli -c` and `redis-benchmark --cluster` route themselves over the fleet,
through a resharding too."""

import hashlib
import random
import subprocess
import time

import pytest
import redis

from helpers.calls import key_names, random_ops
from helpers.cluster import (CliLoad, NodeLoad, PyLoad, cluster_client, cluster_fleet,
                             grow_and_shrink, grow_and_shrink_under_load, slots_ring)
from helpers.fleet import NAMES, ring_args
from helpers.ports import free_port
from helpers.server import (AOF, FILTER_SEES_CLIENT, PRIMARY, aof_command_names, command_calls,
                            pipelined, until, wait_in_sync)


@pytest.fixture
def fleet(server_factory):
    return cluster_fleet(server_factory)


def test_only_a_slots_ring_takes_the_protocol_and_off_is_plain_at_once(server_factory):
    s = server_factory(module_args=["self", "a"])
    c = s.client()
    with pytest.raises(redis.ResponseError, match="needs a current ring of the slots algo"):
        c.config_set("shard.cluster-protocol", "yes")
    c.execute_command("SHARD.RING", "SET", "ketama", "a", f"127.0.0.1:{s.port}", 1)
    with pytest.raises(redis.ResponseError, match="needs a current ring of the slots algo"):
        c.config_set("shard.cluster-protocol", "yes")
    c.execute_command("SHARD.RING", "SET", "slots", "HASHTAG", "none", "a", f"127.0.0.1:{s.port}", 1)
    with pytest.raises(redis.ResponseError, match="cluster hash-tag rule"):
        c.config_set("shard.cluster-protocol", "yes")
    with pytest.raises(redis.ResponseError, match="yes or no"):
        c.config_set("shard.cluster-protocol", "maybe")
    c.execute_command("SHARD.RING", "SET", "slots", "a", f"127.0.0.1:{s.port}", 1)
    assert c.config_set("shard.cluster-protocol", "yes")
    assert c.execute_command("CLUSTER", "MYID") == hashlib.sha1(b"a").hexdigest().encode()
    # While it is on, the ring stays one that cluster clients can follow.
    with pytest.raises(redis.ResponseError, match="cluster-protocol is yes"):
        c.execute_command("SHARD.RING", "SET", "ketama", "a", f"127.0.0.1:{s.port}", 1)
    assert c.config_set("shard.cluster-protocol", "no")
    with pytest.raises(redis.ResponseError, match="cluster support disabled"):
        c.execute_command("CLUSTER", "MYID")


def test_every_node_reports_the_same_map(fleet):
    maps = set()
    for n, s in fleet.items():
        c = s.client()
        raw = c.execute_command("CLUSTER", "NODES").decode()
        lines = sorted(raw.strip().splitlines())
        assert len(lines) == 3
        mine = [l for l in lines if "myself" in l]
        assert len(mine) == 1 and mine[0].startswith(hashlib.sha1(n.encode()).hexdigest())
        maps.add(tuple(l.replace("myself,", "") for l in lines))
        info = c.execute_command("CLUSTER", "INFO").decode()
        assert "cluster_state:ok" in info and "cluster_slots_assigned:16384" in info
        assert "cluster_known_nodes:3" in info
        assert c.execute_command("CLUSTER", "KEYSLOT", "somekey") == 11058
        assert c.execute_command("CLUSTER", "KEYSLOT", "foo{hash_tag}") == 2515
        assert c.execute_command("READONLY") is True and c.execute_command("READWRITE") is True
    assert len(maps) == 1
    slots = fleet["n1"].client().execute_command("CLUSTER", "SLOTS")
    ranges = sorted((s[0], s[1], s[2][1]) for s in slots)
    assert ranges == [(0, 5460, fleet["n0"].port), (5461, 10922, fleet["n1"].port),
                      (10923, 16383, fleet["n2"].port)]


def test_moved_crossslot_and_local_keys(fleet):
    c = fleet["n0"].client()
    slot_of = {f"k{i}": c.execute_command("CLUSTER", "KEYSLOT", f"k{i}") for i in range(1000)}
    local = next(k for k, s in slot_of.items() if s <= 5460)
    foreign = next(k for k, s in slot_of.items() if s > 5460)
    assert c.set(local, "here")
    slot = c.execute_command("CLUSTER", "KEYSLOT", foreign)
    owner = fleet["n1"] if slot <= 10922 else fleet["n2"]
    with pytest.raises(redis.ResponseError, match=rf"^MOVED {slot} 127\.0\.0\.1:{owner.port}$"):
        c.set(foreign, "x")
    with pytest.raises(redis.ResponseError, match="CROSSSLOT"):
        c.mget(local, foreign)
    # Keyless and module commands are never redirected.
    assert c.ping() and c.dbsize() == 1
    assert c.execute_command("SHARD.WHEREIS", foreign) == (b"n1" if slot <= 10922 else b"n2")


def test_redis_py_cluster_client_equals_a_plain_server(fleet, server_factory):
    plain = server_factory().client()
    rc = cluster_client(fleet)
    rng = random.Random(22)
    keys = [k for k in key_names(150, "rc") if isinstance(k, str)]
    ops = random_ops(rng, 10_000, keys)
    differ = []
    for op in ops:
        got = want = None
        try:
            got = rc.execute_command(*op)
        except redis.ResponseError as e:
            got = ("error", str(e))
        try:
            want = plain.execute_command(*op)
        except redis.ResponseError as e:
            want = ("error", str(e))
        if got != want and not (op[0] == "TTL" and abs(got - want) <= 2):
            differ.append((op, got, want))
    assert not differ, differ[:5]
    # Every key is on the node that owns its slot, and only there.
    total = sum(s.client().dbsize() for s in fleet.values())
    assert total == plain.dbsize()
    for n, s in fleet.items():
        c = s.client()
        for k in c.keys("*"):
            assert c.execute_command("SHARD.WHEREIS", k).decode() == n


def test_redis_cli_follows_redirects(fleet):
    port = fleet["n0"].port
    for i in range(30):
        out = subprocess.run(["redis-cli", "-c", "-p", str(port), "SET", f"cli:{i}", f"v{i}"],
                             capture_output=True, text=True, timeout=10)
        assert out.stdout.strip() == "OK", out
        out = subprocess.run(["redis-cli", "-c", "-p", str(port), "GET", f"cli:{i}"],
                             capture_output=True, text=True, timeout=10)
        assert out.stdout.strip() == f"v{i}", out
    assert sum(s.client().dbsize() for s in fleet.values()) == 30
    assert all(s.client().dbsize() > 0 for s in fleet.values())


def test_redis_benchmark_cluster_runs_over_the_fleet(fleet):
    out = subprocess.run(["redis-benchmark", "--cluster", "-h", "127.0.0.1", "-p",
                          str(fleet["n0"].port), "-n", "3000", "-c", "10", "-r", "1000",
                          "-t", "set,get", "--csv"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr + out.stdout
    rows = [l for l in out.stdout.splitlines() if l.startswith('"SET"') or l.startswith('"GET"')]
    assert len(rows) == 2, out.stdout
    assert all(s.client().dbsize() > 0 for s in fleet.values())


def test_a_resharding_redirects_with_ask_and_loses_nothing(fleet, server_factory):
    rc = cluster_client(fleet)
    keys = [f"move:{i}" for i in range(300)]
    for k in keys:
        rc.set(k, f"v-{k}")
        rc.incr(f"{k}:n")
    joining = server_factory(module_args=["self", "n3"])
    servers = dict(fleet, n3=joining)
    ring = slots_ring(servers, ("n0", "n1", "n2", "n3"))
    old = slots_ring(fleet, NAMES)
    joining.client().execute_command("SHARD.RING", "SET", *old)
    joining.client().config_set("shard.cluster-protocol", "yes")
    for s in servers.values():
        assert s.client().execute_command("SHARD.RING", "BEGIN", *ring) == b"OK"
    # Nothing copied yet: every read finds its key (ASK to the previous owner), every write
    # continues from the old value (copy before write at the new owner).
    rc = cluster_client(servers)
    for k in keys:
        assert rc.get(k) == f"v-{k}".encode(), k
        assert rc.incr(f"{k}:n") == 2, k
    n3 = joining.client()
    moved = [f"{k}:n" for k in keys if n3.execute_command("SHARD.WHEREIS", f"{k}:n") == b"n3"]
    assert moved, "some keys belong to the new node"
    # The counters written during the resharding are at their new owner, continued from the
    # old value; the values only read are still at the previous owner (no COPY ran).
    assert [n3.get(k) for k in moved] == [b"2"] * len(moved)
    assert all(rc.get(k) == b"2" for k in moved)


def test_a_shard_subscriber_hears_its_channel_after_the_channel_moves(fleet):
    """A cluster client's SSUBSCRIBE is at its channel's owner; a ring change gives the
    channel's slot to another node, whose SPUBLISH (a cluster client sends it to the new
    owner) is published at every node: the subscriber, not told of the move, still hears it."""
    weights = {"n0": 1, "n1": 1, "n2": 4}
    c0 = fleet["n0"].client()
    before = {f"orders:{i}": c0.execute_command("SHARD.WHEREIS", f"orders:{i}").decode()
              for i in range(60)}
    probe = fleet["n2"].client()
    probe.execute_command("SHARD.RING", "SET", "slots", *ring_args(fleet, weights))
    after = {ch: probe.execute_command("SHARD.WHEREIS", ch).decode() for ch in before}
    probe.execute_command("SHARD.RING", "SET", *slots_ring(fleet, NAMES))
    channel = next(ch for ch in before if before[ch] != after[ch])
    old, new = before[channel], after[channel]

    sub = fleet[old].client().pubsub()
    sub.ssubscribe(channel)
    assert sub.get_sharded_message(timeout=2)["type"] == "ssubscribe"
    rc = cluster_client(fleet)
    assert rc.spublish(channel, "before") >= 1
    assert sub.get_sharded_message(timeout=2)["data"] == b"before"

    for s in fleet.values():
        s.client().execute_command("SHARD.RING", "SET", "slots", *ring_args(fleet, weights))
    assert c0.execute_command("SHARD.WHEREIS", channel).decode() == new
    rc = cluster_client(fleet)
    assert rc.spublish(channel, "after") >= 1
    got = sub.get_sharded_message(timeout=2)
    assert got is not None and got["data"] == b"after", got
    # Sent by hand to the new owner, as any cluster client does, and to a third node.
    for name in (new, next(n for n in NAMES if n not in (old, new))):
        fleet[name].client().execute_command("SPUBLISH", channel, f"via {name}")
        got = sub.get_sharded_message(timeout=2)
        assert got is not None and got["data"] == f"via {name}".encode(), (name, got)
    sub.close()


# --- a Node.js cluster client: ioredis's Redis.Cluster -------------------------------------

@pytest.mark.slow
def test_ioredis_cluster_client_equals_a_plain_server(fleet, server_factory, ioredis):
    plain = server_factory()
    rng = random.Random(2201)
    keys = [k for k in key_names(120, "io") if isinstance(k, str) and k.isascii()]
    ops = [[str(a) for a in op] for op in random_ops(rng, 1500, keys)]
    # Multi-key commands within one slot (a shared hash tag) route as a whole. The two runs
    # follow each other: a TTL may differ by the seconds between them (at most the time both
    # runs took: on a loaded machine, more than ten).
    ops += [["MSET", "{t}a", "1", "{t}b", "2"], ["MGET", "{t}a", "{t}b", "{t}c"], ["DEL", "{t}a", "{t}b"]]
    started = time.monotonic()
    got = ioredis("cluster", fleet["n0"].port, ops)
    want = ioredis("single", plain.port, ops)
    apart = time.monotonic() - started + 1
    differ = [(op, g, w) for op, g, w in zip(ops, got, want)
              if g != w and not (op[0] == "TTL" and abs(g.get("ok", 0) - w.get("ok", 0)) <= apart)]
    assert not differ, differ[:5]
    assert sum(s.client().dbsize() for s in fleet.values()) == plain.client().dbsize()
    assert all(s.client().dbsize() > 0 for s in fleet.values())


# --- a whole grow and shrink under a cluster client's load ----------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("client", ["redis-py", "ioredis", "redis-cli"])
def test_a_grow_and_a_shrink_under_load_lose_nothing(fleet, server_factory, client, request):
    joining = server_factory(module_args=["self", "n3"])
    if client == "redis-py":
        make_load = PyLoad
    elif client == "ioredis":
        script = request.getfixturevalue("ioredis").script
        make_load = lambda servers, keys: NodeLoad(servers, keys, script)  # noqa: E731
    else:
        make_load = CliLoad
    grow_and_shrink_under_load(fleet, joining, make_load)
    # Every key is on its owner only (n3 has left).
    # n3 has left the map; what it still holds (a leaving node is shut down, not cleaned up)
    # was copied to the owners before the commit.
    assert len(fleet["n0"].client().execute_command("CLUSTER", "NODES").splitlines()) == 3
    n0 = fleet["n0"].client()
    for k in joining.client().keys("*"):
        owner = fleet[n0.execute_command("SHARD.WHEREIS", k).decode()].client()
        assert owner.exists(k), k
    for n in NAMES:
        c = fleet[n].client()
        for k in c.keys("*"):
            assert c.execute_command("SHARD.WHEREIS", k).decode() == n


def test_a_replica_and_the_aof_hold_what_the_primary_holds(server_factory):
    servers = {n: server_factory(module_args=["self", n], config=[*AOF, *PRIMARY])
               for n in ("n0", "n1")}
    replica = server_factory(module_args=["self", "n0"])
    for s in servers.values():
        s.client().execute_command("SHARD.RING", "SET", *slots_ring(servers, ("n0", "n1")))
        s.client().config_set("shard.cluster-protocol", "yes")
    replica.client().replicaof("127.0.0.1", servers["n0"].port)
    rc = cluster_client(servers)
    rng = random.Random(31)
    keys = [k for k in key_names(200, "rep") if isinstance(k, str)]
    for op in random_ops(rng, 2000, keys):
        try:
            rc.execute_command(*op)
        except redis.ResponseError:
            pass
    primary = servers["n0"].client()
    wait_in_sync(primary, replica.client())
    # The replica applied everything (nothing it received was redirected away).
    held = primary.keys("*")
    assert held and sorted(replica.client().keys("*")) == sorted(held)
    for k in held:
        assert replica.client().dump(k) == primary.dump(k), k
    # The AOF holds the plain commands, none of the module's wrappers.
    names = aof_command_names(servers["n0"].workdir)
    assert b"shard.redirect" not in names and b"shard.cluster" not in names
    assert {b"set", b"incr", b"hset"} <= set(names)


# --- transactions ---------------------------------------------------------------------------


def keys_by_owner(c, count=2000, prefix="k"):
    """Key names grouped by the node that owns them (SHARD.WHEREIS)."""
    out = {}
    for i in range(count):
        k = f"{prefix}{i}"
        out.setdefault(c.execute_command("SHARD.WHEREIS", k).decode(), []).append(k)
    return out


def transaction(client, *commands):
    """MULTI, the commands, EXEC on one connection: the replies to each queued command and the
    reply (or error) of EXEC."""
    queued = []
    client.execute_command("MULTI")
    for cmd in commands:
        try:
            queued.append(client.execute_command(*cmd))
        except redis.ResponseError as e:
            queued.append(("error", str(e)))
    try:
        done = client.execute_command("EXEC")
    except redis.ResponseError as e:
        done = ("error", str(e))
    return queued, done


@pytest.mark.skipif(not FILTER_SEES_CLIENT, reason="Redis 7.0's command filters cannot tell which "
                    "client sent a command, so a transaction cannot be refused when it is queued")
def test_a_transaction_naming_another_nodes_key_runs_nothing(fleet):
    c = fleet["n0"].client(single_connection_client=True)
    by_owner = keys_by_owner(c)
    local, foreign = by_owner["n0"], by_owner["n1"]
    script = "redis.call('SET', KEYS[1], ARGV[1]) return 1"
    for bad in (["SET", foreign[0], "x"], ["INCR", foreign[1]],
                ["MSET", local[2], "1", foreign[2], "2"],  # two slots: CROSSSLOT
                ["EVAL", script, 1, foreign[3], "x"]):    # keys found by the key specs
        queued, done = transaction(c, ["SET", local[0], "a"], bad, ["INCR", local[1]])
        assert [isinstance(q, tuple) for q in queued] == [False, True, False], (bad, queued)
        assert done[0] == "error" and done[1].startswith("Transaction discarded"), (bad, done)
        assert c.exists(local[0]) + c.exists(local[1]) == 0, bad
        assert sum(s.client().dbsize() for s in fleet.values()) == 0, bad
    # A transaction on this node's keys (fixed keys and keys found by the key specs) runs.
    assert queued[1][1].startswith("unknown command 'MOVED ")  # where the key is
    queued, done = transaction(c, ["SET", local[0], "a"], ["INCR", local[1]],
                               ["EVAL", script, 1, local[2], "z"])
    assert not any(isinstance(q, tuple) for q in queued) and done == [b"OK", 1, 1], (queued, done)
    assert (c.get(local[0]), c.get(local[2])) == (b"a", b"z")
    # Outside a transaction the same commands are redirected as before.
    with pytest.raises(redis.ResponseError, match="^MOVED"):
        c.set(foreign[0], "x")
    with pytest.raises(redis.ResponseError, match="^MOVED"):
        c.eval(script, 1, foreign[3], "x")


def error_counts(server):
    """INFO errorstats of a server: {error code: replies}."""
    info = server.client().info("errorstats")
    return {k.removeprefix("errorstat_"): v["count"] for k, v in info.items()}


@pytest.mark.slow
def test_redis_benchmark_through_a_grow_and_a_shrink_loses_no_incr(fleet, server_factory):
    """`redis-benchmark --cluster -t incr` while a node joins (taking slots 0-4095) and leaves
    again. redis-benchmark learns its nodes once, at start (a node that appears later in
    `CLUSTER SLOTS` makes it exit, as on a real cluster): it starts once the joining node is in
    the map, right after `SHARD.RING BEGIN`. It follows MOVED and ASK and exits at once on any
    other error, so it still running at the end means it met none. Every INCR a server ran
    must then be in the counters at their owners: none lost in the moves."""
    joining = server_factory(module_args=["self", "n3"])
    servers = dict(fleet, n3=joining)
    old, new = NAMES, ("n3", "n0", "n1", "n2")
    joining.client().execute_command("SHARD.RING", "SET", *slots_ring(fleet, old))
    joining.client().config_set("shard.cluster-protocol", "yes")
    for s in servers.values():
        assert s.client().execute_command("SHARD.RING", "BEGIN", *slots_ring(servers, new)) == b"OK"
    bench = subprocess.Popen(["redis-benchmark", "--cluster", "-h", "127.0.0.1", "-p",
                              str(fleet["n0"].port), "-n", "1000000000", "-c", "6", "-r", "2000",
                              "-t", "incr", "-q"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        time.sleep(0.5)
        grow_and_shrink(servers, old, new, grow_begun=True)
        assert bench.poll() is None, ("redis-benchmark stopped: it met an error", bench.communicate())
    finally:
        bench.terminate()
        bench.communicate(timeout=30)
    time.sleep(0.2)
    redirects = sum(error_counts(s).get(code, 0) for s in servers.values() for code in ("MOVED", "ASK"))
    assert redirects > 0, "slot 0 moved to the joining node and back: the benchmark was redirected"
    ran = sum(command_calls(s, "incr") for s in servers.values())
    total = 0
    for n in old:
        c = fleet[n].client()
        for k in c.keys("counter:*"):
            assert c.execute_command("SHARD.WHEREIS", k).decode() == n
            total += int(c.get(k))
    # Enough INCRs to span the grow and the shrink (how many a loaded machine runs varies: 8 716
    # once beside the other tests); every one of them counted once.
    assert ran > 1_000 and total == ran, (total, ran)


def test_countkeysinslot_and_getkeysinslot_equal_a_cluster_mode_server(server_factory):
    """The same keys on a one-node `slots` ring and on a real cluster-mode server: both answer
    the key questions of cluster mode alike (names that are UTF-8 included: they once went
    missing, so that `SET op:1:5 v` left slot 15842 counting 0)."""
    ours = server_factory(module_args=["self", "a"])
    c = ours.client()
    c.execute_command("SHARD.RING", "SET", "slots", "a", f"127.0.0.1:{ours.port}", 1)
    c.config_set("shard.cluster-protocol", "yes")
    real = server_factory(config=[("cluster-enabled", "yes"), ("cluster-config-file", "nodes.conf"),
                                  ("cluster-port", free_port())])
    rc = real.client()
    rc.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
    until(lambda: b"cluster_state:ok" in rc.execute_command("CLUSTER", "INFO"),
          "the one-node cluster is up")
    names = [b"op:1:5", b"\xff\xfe binary", *[f"{{user{i % 7}}}:{i}".encode() for i in range(60)],
             *[f"k{i}".encode() for i in range(200)]]
    for client in (c, rc):
        pipelined(client, [("SET", n, "v") for n in names])
    slots = sorted({rc.execute_command("CLUSTER", "KEYSLOT", n) for n in names})
    assert c.execute_command("CLUSTER", "KEYSLOT", "op:1:5") == 15842
    empty = next(s for s in range(16384) if s not in slots)
    for slot in [*slots, empty]:
        count = rc.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot)
        assert c.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == count, slot
        want = sorted(rc.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1000))
        assert len(want) == count
        assert sorted(c.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1000)) == want
        some = c.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 2)
        assert len(some) == min(2, count) and set(some) <= set(want)
    assert c.execute_command("CLUSTER", "COUNTKEYSINSLOT", 15842) >= 1
    for bad in (("COUNTKEYSINSLOT", 16384), ("COUNTKEYSINSLOT", -1), ("COUNTKEYSINSLOT", "x"),
                ("GETKEYSINSLOT", 1, -1), ("GETKEYSINSLOT", -1, 1), ("GETKEYSINSLOT", 16384, 1),
                ("GETKEYSINSLOT", 1, "x"), ("GETKEYSINSLOT", "x", 1)):
        with pytest.raises(redis.ResponseError) as theirs:
            rc.execute_command("CLUSTER", *bad)
        with pytest.raises(redis.ResponseError) as mine:
            c.execute_command("CLUSTER", *bad)
        assert str(mine.value) == str(theirs.value), bad
