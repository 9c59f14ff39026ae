"""The fleet answers like one server (issue 43): with `shard.route-plain yes`, an unchanged
client pointed at any node runs its plain commands as if the fleet were one server: keyed
commands at their owners, multi-key commands split, plain WATCH/MULTI/EXEC across nodes, and
the keyless commands of the data (DBSIZE, KEYS, SCAN, RANDOMKEY, the flushes, SCRIPT, FUNCTION,
PUBLISH) answered for the whole fleet, in the client's database. Each test compares with what
one plain server holding every key answers, and fails without the setting (the node then
answers from its own keyspace)."""

import random
import threading
import time

import pytest
import redis

from helpers.fleet import NAMES, make_fleet
from helpers.server import FILTER_SEES_CLIENT, until


def plain_fleet(server_factory, on=True, **kw):
    fleet = make_fleet(server_factory, args=["route-plain", "yes" if on else "no"], **kw)
    return fleet


def local(fleet, name, db=0):
    """A client of one node's own keyspace: its connection is marked as one of the module's own
    (`SHARD.CLUSTER INTERNAL`), whose commands are never routed."""
    c = fleet.client(name, db=db, single_connection_client=True)
    assert c.execute_command("SHARD.CLUSTER", "INTERNAL") == b"OK"
    return c


def keys_on_every_node(fleet, n=30, prefix="k"):
    """`n` key names, spread over every owner."""
    keys = [f"{prefix}:{i}" for i in range(n)]
    owners = fleet.owners(keys)
    assert set(owners) == set(NAMES), owners
    return keys, owners


def test_plain_get_and_set_of_any_owner_through_any_node(server_factory):
    fleet = plain_fleet(server_factory)
    keys, owners = keys_on_every_node(fleet)
    c0 = fleet.client("n0")
    for k in keys:
        assert c0.set(k, f"v-{k}") is True
    # Each key is at its owner only: the plain SET was routed.
    for k, owner in zip(keys, owners):
        for n in NAMES:
            want = f"v-{k}".encode() if n == owner else None
            assert local(fleet, n).get(k) == want, (k, owner, n)
    # Read back through every node, plain GET and MGET.
    for n in NAMES:
        c = fleet.client(n)
        assert [c.get(k) for k in keys] == [f"v-{k}".encode() for k in keys]
        assert c.mget(keys) == [f"v-{k}".encode() for k in keys]
        assert c.exists(*keys) == len(keys)
    assert c0.delete(*keys) == len(keys)
    assert fleet.client("n2").mget(keys) == [None] * len(keys)


def test_without_the_setting_a_plain_get_reads_the_nodes_own_keyspace(server_factory):
    fleet = plain_fleet(server_factory, on=False)
    k = fleet.key_of("n1")
    fleet.client("n1").set(k, "here")
    assert fleet.client("n0").get(k) is None
    fleet.client("n0").config_set("shard.route-plain", "yes")
    assert fleet.client("n0").get(k) == b"here"
    with pytest.raises(redis.ResponseError, match="route-plain is yes or no"):
        fleet.client("n0").config_set("shard.route-plain", "maybe")


def test_local_keys_stay_plain_commands(server_factory):
    """A key this node owns runs as the plain command: no SHARD.PLAIN in the server's command
    stats, the key's reply the server's own."""
    fleet = plain_fleet(server_factory)
    c0 = fleet.client("n0")
    local = fleet.key_of("n0", prefix="local")
    remote = fleet.key_of("n1", prefix="remote")
    c0.config_resetstat()
    for _ in range(20):
        c0.set(local, "x")
        c0.get(local)
    stats = c0.info("commandstats")
    assert not [k for k in stats if k.startswith("cmdstat_shard.plain")], stats
    assert stats["cmdstat_set"]["calls"] == 20
    c0.set(remote, "y")
    stats = c0.info("commandstats")
    # The default user's command goes to SHARD.PLAIN, which the server checks as itself.
    assert stats["cmdstat_shard.plain"]["calls"] == 1
    assert "cmdstat_shard.plainas" not in stats, stats


def test_the_filters_copy_of_the_ring_follows_every_ring_change(server_factory):
    """A local key's plain command passes the filter on its quick way, by a copy of the ring
    (`route::local_view`). Once a ring change gives the key to another node, by SHARD.RING SET
    or by a resharding's BEGIN, the same command goes to that node: a copy not made again would
    go on reading this node's own value."""
    fleet = plain_fleet(server_factory)
    heavy = {"n0": 1, "n1": 6, "n2": 1}
    # Keys n0 owns now, each with a value of its own at n0 and another at n1.
    mine = fleet.owners([f"m:{i}" for i in range(400)], via="n0")
    keys = [f"m:{i}" for i, o in enumerate(mine) if o == "n0"]
    for name in ("n0", "n1"):
        c = local(fleet, name)
        for k in keys:
            c.set(k, f"at-{name}")
    c0 = fleet.client("n0", single_connection_client=True)
    for _ in range(3):
        assert [c0.get(k) for k in keys] == [b"at-n0"] * len(keys)
    # Which of them the heavy ring gives to n1 (asked of n2 alone, then n2 set back).
    fleet.ring(heavy, on=["n2"])
    heavy_owners = fleet.owners(keys, via="n2")
    moved = [k for k, o in zip(keys, heavy_owners) if o == "n1"]
    stay = [k for k, o in zip(keys, heavy_owners) if o == "n0"]
    assert len(moved) >= 5 and len(stay) >= 5, (len(keys), len(moved), len(stay))
    fleet.ring(NAMES, on=["n2"])

    # SHARD.RING SET (n0 last: its copy was made by the ring before).
    fleet.ring(heavy, on=["n1", "n2", "n0"])
    assert [c0.get(k) for k in moved] == [b"at-n1"] * len(moved)
    assert [c0.get(k) for k in stay] == [b"at-n0"] * len(stay)
    # Back, then a resharding to the heavy ring opened by BEGIN: the moving keys are read at
    # their new owner, and the ABORT brings them back to n0.
    fleet.ring(NAMES, on=["n1", "n2", "n0"])
    assert [c0.get(k) for k in moved] == [b"at-n0"] * len(moved)
    fleet.ring(heavy, verb="BEGIN", on=["n1", "n2", "n0"])
    assert [c0.get(k) for k in moved] == [b"at-n1"] * len(moved)
    for n in ("n1", "n2", "n0"):
        assert fleet.client(n).execute_command("SHARD.RING", "ABORT") == b"OK"
    assert [c0.get(k) for k in moved] == [b"at-n0"] * len(moved)


def test_plain_transactions_across_nodes(server_factory):
    """redis-py's own transaction(): WATCH, MULTI, EXEC over keys of two owners, retried on a
    nil EXEC when another client writes a watched key."""
    fleet = plain_fleet(server_factory)
    a = fleet.key_of("n1", prefix="acct")
    b = fleet.key_of("n2", prefix="acct")
    c0 = fleet.client("n0")
    c0.mset({a: 100, b: 0})

    tries = []

    def transfer(pipe):
        tries.append(1)
        x = int(pipe.get(a))
        y = int(pipe.get(b))
        if len(tries) == 1:
            # Another client writes a watched key meanwhile: EXEC must fail (nil), retried.
            fleet.client("n2").incrby(a, 1)
        pipe.multi()
        pipe.set(a, x - 10)
        pipe.set(b, y + 10)

    c0.transaction(transfer, a, b)
    assert len(tries) == 2
    assert int(c0.get(a)) + int(c0.get(b)) == 101
    assert int(local(fleet, "n1").get(a)) == 91
    # A watched key of this very node, written by another client meanwhile: nil, retried
    # (a plain WATCH of a local key is the fleet's watch too, not the server's alone).
    here = fleet.key_of("n0", prefix="acct")
    c0.set(here, 5)
    local_tries = []

    def move_here(pipe):
        local_tries.append(1)
        h = int(pipe.get(here))
        if len(local_tries) == 1:
            fleet.client("n1").incr(here)
        pipe.multi()
        pipe.set(here, h + 1)
        pipe.incrby(b, 0)

    c0.transaction(move_here, here, b)
    assert len(local_tries) == 2 and int(c0.get(here)) == 7
    # A pipeline with MULTI/EXEC (redis-py's default pipeline) over both owners.
    with c0.pipeline() as p:
        p.incr(a).incr(b).get(a)
        assert p.execute() == [92, 11, b"92"]
    # DISCARD drops the queue.
    with c0.pipeline() as p:
        p.multi()
        p.set(a, "never")
        p.reset()
    assert c0.get(a) == b"92"


def test_keyless_commands_answer_for_the_fleet(server_factory):
    fleet = plain_fleet(server_factory)
    plain = server_factory()
    keys, _ = keys_on_every_node(fleet, n=200)
    c1 = fleet.client("n1")
    p = plain.client()
    for k in keys:
        c1.set(k, k)
        p.set(k, k)
    for n in NAMES:
        c = fleet.client(n)
        assert c.dbsize() == p.dbsize() == len(keys)
        assert sorted(c.keys("k:1*")) == sorted(p.keys("k:1*"))
        assert sorted(c.keys()) == sorted(p.keys())
        assert sorted(c.scan_iter(count=7)) == sorted(p.scan_iter(count=7))
        assert sorted(c.scan_iter(match="k:2*", count=50)) == sorted(p.scan_iter(match="k:2*"))
        assert c.randomkey() in set(p.keys())
        # Through SHARD.CALL too.
        assert c.execute_command("SHARD.CALL", "DBSIZE") == len(keys)
    # A node's own keyspace holds a part only: the sum is the fleet's.
    assert fleet.client("n0").execute_command("SHARD.CALL", "PING") == b"PONG"
    # TYPE filters per node.
    fleet.client("n2").rpush("alist", 1)
    assert list(fleet.client("n0").scan_iter(_type="list")) == [b"alist"]
    # FLUSHDB everywhere (ASYNC kept), through any node.
    assert fleet.client("n2").flushdb(asynchronous=True) is True
    for n in NAMES:
        assert fleet.client(n).dbsize() == 0
    assert fleet.client("n0").randomkey() is None


def test_scripts_and_functions_on_every_node(server_factory):
    fleet = plain_fleet(server_factory)
    c0 = fleet.client("n0")
    sha = c0.script_load("return redis.call('GET', KEYS[1])")
    for n in NAMES:
        assert fleet.client(n).script_exists(sha, "0" * 40) == [True, False]
    ks = [fleet.key_of(n, prefix="s") for n in NAMES]
    c0.set(ks[2], "two")
    # EVALSHA of a key on another node: the script is there too.
    assert c0.evalsha(sha, 1, ks[2]) == b"two"
    lib = "#!lua name=mylib\nredis.register_function('myget', function(keys) return redis.call('GET', keys[1]) end)"
    assert c0.function_load(lib) == "mylib" or c0.function_load(lib, replace=True)
    assert fleet.client("n1").fcall("myget", 1, ks[2]) == b"two"
    assert c0.function_delete("mylib")
    for n in NAMES:
        assert fleet.client(n).function_list() == []
    assert c0.script_flush()
    for n in NAMES:
        assert fleet.client(n).script_exists(sha) == [False]


def test_publish_reaches_the_subscribers_of_every_node(server_factory):
    fleet = plain_fleet(server_factory)
    subs = {}
    for n in NAMES:
        ps = fleet.client(n).pubsub()
        ps.subscribe("news")
        ps.psubscribe("ne*")
        subs[n] = ps
        # The subscription confirmations.
        assert ps.get_message(timeout=2)["type"] == "subscribe"
        assert ps.get_message(timeout=2)["type"] == "psubscribe"
    for sender in NAMES:
        # Every node's subscriber and pattern subscriber: 2 per node.
        assert fleet.client(sender).publish("news", f"from {sender}") == 2 * len(NAMES)
        for n, ps in subs.items():
            got = [ps.get_message(timeout=2) for _ in range(2)]
            assert sorted(m["type"] for m in got) == ["message", "pmessage"], (n, got)
            assert {m["data"] for m in got} == {f"from {sender}".encode()}
            # Once each: nothing more.
            assert ps.get_message(timeout=0.2) is None
    for ps in subs.values():
        ps.close()


def test_select_runs_every_path_in_the_clients_database(server_factory):
    fleet = plain_fleet(server_factory)
    keys, owners = keys_on_every_node(fleet, n=30, prefix="db")
    c = fleet.client("n0", db=3)
    for k in keys:
        c.set(k, "three")
    assert c.dbsize() == len(keys)
    assert sorted(c.scan_iter()) == sorted(k.encode() for k in keys)
    assert c.mget(keys) == [b"three"] * len(keys)
    for k, owner in zip(keys, owners):
        assert local(fleet, owner, db=3).get(k) == b"three"
        assert local(fleet, owner, db=0).get(k) is None
    assert fleet.client("n1").dbsize() == 0
    assert local(fleet, "n1", db=3).dbsize() == owners.count("n1")
    # A transaction across nodes, a gathered command and a blocking one, in database 3 too.
    a, b = fleet.key_of("n1", prefix="t3"), fleet.key_of("n2", prefix="t3")
    with c.pipeline() as p:
        p.set(a, "x").set(b, "y")
        assert p.execute() == [True, True]
    assert c.rename(a, f"{b}-renamed") is True
    assert local(fleet, fleet.owners([f"{b}-renamed"])[0], db=3).get(f"{b}-renamed") == b"x"
    assert local(fleet, "n1", db=0).get(a) is None and local(fleet, "n1", db=3).get(a) is None
    q = fleet.key_of("n2", prefix="q3")
    threading.Timer(0.2, lambda: fleet.client("n1", db=3).rpush(q, "three")).start()
    assert c.blpop(q, 5) == (q.encode(), b"three")
    assert local(fleet, "n2", db=0).exists(q) == 0
    c.flushdb()
    assert c.dbsize() == 0


def subscribe_everywhere(fleet, channel, pattern):
    subs = {}
    for n in NAMES:
        ps = fleet.client(n).pubsub()
        ps.subscribe(channel)
        ps.psubscribe(pattern)
        assert ps.get_message(timeout=2)["type"] == "subscribe"
        assert ps.get_message(timeout=2)["type"] == "psubscribe"
        subs[n] = ps
    return subs


def assert_delivered_once(subs, data):
    for n, ps in subs.items():
        got = [ps.get_message(timeout=2) for _ in range(2)]
        assert all(got), (n, got)
        assert sorted(m["type"] for m in got) == ["message", "pmessage"], (n, got)
        assert {m["data"] for m in got} == {data}
        assert ps.get_message(timeout=0.2) is None, n


def test_publish_under_the_cluster_protocol_reaches_every_node(server_factory):
    """A cluster client's PUBLISH, sent to whichever node it picks, reaches the subscribers of
    every node once, as Redis Cluster's bus carries it (before: that node's only)."""
    from helpers.cluster import cluster_client, cluster_fleet

    fleet = cluster_fleet(server_factory)
    subs = subscribe_everywhere(fleet, "news", "n*")
    rc = cluster_client(fleet)
    for i in range(3):
        rc.publish("news", f"c{i}")
        assert_delivered_once(subs, f"c{i}".encode())
    for sender in NAMES:
        fleet.client(sender).publish("news", f"plain {sender}")
        assert_delivered_once(subs, f"plain {sender}".encode())
    for ps in subs.values():
        ps.close()
    rc.close()


def test_cluster_clients_and_plain_clients_side_by_side(server_factory):
    """Both settings on: a cluster client still routes itself and merges keyless commands from
    every node itself (each node answers for its own keys), while a plain client's keyed
    command on any node is routed, not refused with MOVED."""
    from helpers.cluster import cluster_client, cluster_fleet

    fleet = cluster_fleet(server_factory)
    for n in NAMES:
        fleet.client(n).config_set("shard.route-plain", "yes")
    rc = cluster_client(fleet)
    keys = [f"both:{i}" for i in range(60)]
    for k in keys:
        rc.set(k, k)
    # The cluster client's own fan-out: DBSIZE summed over the primaries, each node counting
    # its own keys once (as in a real Redis Cluster), not the fleet's three times.
    from redis.cluster import RedisCluster

    assert rc.dbsize(target_nodes=RedisCluster.PRIMARIES) == len(keys)
    got = rc.keys(target_nodes=RedisCluster.PRIMARIES)
    assert sorted(got) == sorted(k.encode() for k in keys)
    # A plain client of one node reads and writes every key.
    c0 = fleet.client("n0")
    assert c0.mget(keys) == [k.encode() for k in keys]
    c0.set("plain-written", "x")
    assert rc.get("plain-written") == b"x"
    rc.close()


def test_spublish_reaches_the_shard_subscribers_of_every_node(server_factory):
    """A plain client subscribes (SSUBSCRIBE) at the node it is connected to; SPUBLISH through
    any node reaches every such subscriber once. SHARD.CALL refuses to subscribe a connection
    of the module's (it would take a connection every call shares)."""
    fleet = plain_fleet(server_factory)
    subs = {}
    for n in NAMES:
        ps = fleet.client(n).pubsub()
        ps.ssubscribe("orders")
        assert ps.get_message(timeout=2)["type"] == "ssubscribe"
        subs[n] = ps
    for sender in NAMES:
        assert fleet.client(sender).spublish("orders", f"s {sender}") == len(NAMES)
        for n, ps in subs.items():
            m = ps.get_message(timeout=2)
            assert m and m["type"] == "smessage" and m["data"] == f"s {sender}".encode(), (n, m)
            assert ps.get_message(timeout=0.2) is None
    elsewhere = fleet.key_of("n1", prefix="channel")
    with pytest.raises(redis.ResponseError, match="subscribes a connection"):
        fleet.client("n0").execute_command("SHARD.CALL", "SSUBSCRIBE", elsewhere)
    # The fleet still serves after (no connection of the module's left subscribed).
    k = fleet.key_of("n2")
    fleet.client("n0").set(k, "after")
    assert fleet.client("n1").get(k) == b"after"
    for ps in subs.values():
        ps.close()


def test_containers_sort_patterns_and_a_small_scan(server_factory):
    """A container command's keys (XGROUP, XINFO, OBJECT, MEMORY USAGE) are found per
    subcommand, so it runs at the key's owner; SORT with a BY or GET pattern (keys it does not
    name) is refused rather than answered from one node's keys; a SCAN of a small keyspace
    returns every key in one call (cursor 0), as one server does (redis-py's own tests expect
    it)."""
    fleet = plain_fleet(server_factory)
    c = fleet.client("n0")
    s = fleet.key_of("n2", prefix="stream")
    c.xadd(s, {"f": "v"}, id="1-1")
    assert c.xgroup_create(s, "g", id="0") is True
    assert c.xinfo_stream(s)["length"] == 1
    assert c.xreadgroup("g", "c1", {s: ">"}) == [[s.encode(), [(b"1-1", {b"f": b"v"})]]]
    assert c.object("encoding", s) == b"stream"
    assert c.memory_usage(s) > 0
    lst = fleet.key_of("n1", prefix="sorted")
    c.rpush(lst, 3, 1, 2)
    assert c.sort(lst) == [b"1", b"2", b"3"]
    for args in (("BY", "w_*"), ("GET", "o_*")):
        with pytest.raises(redis.ResponseError, match="reads keys it does not name"):
            c.execute_command("SORT", lst, *args)
    assert c.execute_command("SORT", lst, "BY", "nosort", "GET", "#") == [b"3", b"1", b"2"]
    c.flushall()
    small = [fleet.key_of(n, prefix="few") for n in NAMES]
    for k in small:
        c.set(k, 1)
    cursor, keys = c.scan(0)
    assert cursor == 0 and sorted(keys) == sorted(k.encode() for k in small)


def test_an_ioredis_cluster_clients_publish_reaches_every_node(server_factory, ioredis):
    """ioredis's Redis.Cluster publishes through whichever node it picks: the subscribers of
    every node get the message once (cluster protocol on, as on a real Redis Cluster)."""
    from helpers.cluster import cluster_fleet

    fleet = cluster_fleet(server_factory)
    subs = subscribe_everywhere(fleet, "news", "n*")
    got = ioredis("cluster", fleet["n0"].port, [["PUBLISH", "news", "from ioredis"]])
    assert "err" not in got[0], got
    assert_delivered_once(subs, b"from ioredis")
    for ps in subs.values():
        ps.close()


def test_server_commands_through_shard_call_are_refused_not_run(server_factory):
    """SHARD.CALL runs PING, ECHO, TIME and scripts without keys here, answers the data's
    keyless commands for the fleet, and refuses the other keyless ones, which are about the
    server a client talks to: run inside the module's call, a CLIENT KILL of the calling client
    would free it under the server's feet (Redis 7.0 crashed on it). A plain client's own CLIENT
    KILL inside MULTI, with route-plain on, runs as the server's own."""
    fleet = plain_fleet(server_factory)
    c = fleet.client("n0")
    for cmd in (("CLIENT", "KILL", "TYPE", "normal"), ("CONFIG", "SET", "maxclients", "1"),
                ("DEBUG", "SLEEP", "0"), ("SWAPDB", "0", "1"), ("SHUTDOWN", "NOSAVE")):
        with pytest.raises(redis.ResponseError, match="has no key: SHARD.CALL answers"):
            c.execute_command("SHARD.CALL", *cmd)
    assert c.execute_command("SHARD.CALL", "ECHO", "hi") == b"hi"
    assert c.execute_command("SHARD.CALL", "EVAL", "return 7", 0) == 7
    # A plain client's own CLIENT KILL (route-plain leaves it the server's).
    killer = fleet.client("n0")
    victim = fleet.client("n0", single_connection_client=True)
    victim.ping()
    assert killer.client_kill_filter(_type="normal", skipme=True) >= 1
    assert fleet["n0"].alive() and killer.ping()
    # Inside a plain transaction across nodes, PING and ECHO are queued beside keyed commands.
    k = fleet.key_of("n1", prefix="tx")
    with killer.pipeline() as p:
        p.ping().echo("e").set(k, "v").get(k)
        assert p.execute() == [True, b"e", True, b"v"]


def test_a_user_granted_plain_commands_only_runs_them_on_any_nodes_keys(server_factory):
    """A user granted `+get +set +multi +exec +watch` and keys `cache:*`, not the module's
    commands: its plain commands of other nodes' keys are handed over authorised as
    themselves (SHARD.PLAINAS, where the filter knows the client: Valkey), so they run; what the user may not do is refused as the server
    refuses it, and the ACL log records it; a client that has not authenticated is refused."""
    fleet = plain_fleet(server_factory)
    # Redis 7.0's filter cannot tell the client: there the user needs the module's grants too.
    grants = [] if FILTER_SEES_CLIENT else ["+shard.plain", "+shard.multi", "+shard.exec",
                                            "+shard.watch"]
    for n in NAMES:
        fleet.client(n).acl_setuser("app", enabled=True, nopass=True, reset=True,
                                    commands=["+get", "+set", "+multi", "+exec", "+watch",
                                              "+select", *grants], keys=["cache:*"])
    keys, owners = keys_on_every_node(fleet, prefix="cache")
    app = fleet.client("n0", username="app", password="x")
    for k in keys:
        assert app.set(k, k) is True
    assert [app.get(k) for k in keys] == [k.encode() for k in keys]
    # A transaction over keys of every owner, with a watch.
    with app.pipeline(transaction=True) as p:
        p.watch(keys[0])
        p.multi()
        for k in keys[:6]:
            p.set(k, f"t-{k}")
        assert p.execute() == [True] * 6
    assert [local(fleet, o).get(k) for k, o in zip(keys[:6], owners[:6])] == \
        [f"t-{k}".encode() for k in keys[:6]]
    # Refused as the server refuses it, for another node's key, and logged there.
    admin = fleet.client("n0")
    admin.acl_log_reset()
    other_key = fleet.key_of("n1", prefix="violated")
    with pytest.raises(redis.exceptions.NoPermissionError):
        app.get(other_key)
    hash_key = next(k for k, o in zip(keys, owners) if o == "n2")
    with pytest.raises(redis.exceptions.NoPermissionError):
        app.hset(hash_key, "f", "v")
    log = admin.acl_log()
    assert {(e["reason"], e["object"]) for e in log} >= {("key", other_key), ("command", "hset")}, log
    assert all(e["username"] == "app" for e in log), log
    # With a password on the default user, a client that has not authenticated is refused.
    for n in NAMES:
        fleet.client(n).config_set("requirepass", "secret")
    try:
        anonymous = redis.Redis(port=fleet["n0"].port)
        time.sleep(1.2)  # the filter's reading of the default user, every second
        for k in (keys[1], other_key):
            with pytest.raises(redis.exceptions.AuthenticationError):
                anonymous.get(k)
    finally:
        for n in NAMES:
            fleet.client(n, password="secret").config_set("requirepass", "")
