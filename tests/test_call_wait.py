"""SHARD.CALL WAIT numreplicas timeout-ms command ...: the write runs at its owner and WAIT runs
after it there, on the same connection, so the reply comes once the owner's replicas have it
(or NOREPLICAS says how many did); on real primaries with real replicas (REPLICAOF), a replica
frozen with SIGSTOP standing for one that lags.
"""

import os
import signal
import threading
from contextlib import contextmanager

import pytest
import redis
from redis.cluster import RedisCluster

from helpers.cluster import cluster_fleet_with_replicas
from helpers.fleet import make_fleet
from helpers.resp import Raw, encode
from helpers.server import PRIMARY, until, wait_in_sync

NOREPLICAS = "NOREPLICAS {got} of {want} replicas of node {node} (127.0.0.1:{port}) " \
             "acknowledged the write within {ms} ms; it stays applied, as after WAIT"


def fleet_with_replicas(server_factory):
    """n0 and n1 (the ring of both), each a primary with one replica: (fleet, replicas)."""
    fleet = make_fleet(server_factory, names=("n0", "n1"), config=PRIMARY)
    replicas = {n: server_factory(config=[("replicaof", "127.0.0.1", fleet[n].port)])
                for n in fleet}
    for n in fleet:
        wait_in_sync(fleet[n].client(), replicas[n].client())
    return fleet, replicas


@contextmanager
def frozen(server):
    """The server stopped (SIGSTOP) inside the block: as a replica it acknowledges nothing."""
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)


def blocked_clients(server):
    return server.client().info("clients")["blocked_clients"]


def noreplicas(fleet, node, got, want, ms):
    return NOREPLICAS.format(got=got, want=want, node=node, port=fleet[node].port, ms=ms)


def call_error(client, *args):
    with pytest.raises(redis.ResponseError) as e:
        client.execute_command("SHARD.CALL", *args)
    return str(e.value)


def test_the_reply_comes_once_the_owners_replica_has_the_write(server_factory):
    fleet, replicas = fleet_with_replicas(server_factory)
    c = fleet.client("n0")
    # Through n0 to n1, and at n0 itself (over a connection to its own address).
    for owner in ("n1", "n0"):
        k = fleet.key_of(owner, prefix=f"acked-{owner}")
        assert c.execute_command("SHARD.CALL", "WAIT", 1, 0, "SET", k, "v1") == b"OK"
        # WAIT returned: the replica has acknowledged the write, so it has it.
        assert replicas[owner].client().get(k) == b"v1"
        assert fleet.client(owner).get(k) == b"v1"
        # The command's own reply, whatever its type.
        assert c.execute_command("SHARD.CALL", "WAIT", 1, 0, "APPEND", k, "+") == 3
        assert replicas[owner].client().get(k) == b"v1+"
        # An error reply is the reply: nothing was written to wait for.
        assert call_error(c, "WAIT", 1, 0, "LPUSH", k, "x").startswith("WRONGTYPE")
        # A read writes nothing to wait for: it replies at once, as WAIT after a read (with
        # timeout 0 and more replicas than there are, a WAIT would never return).
        assert c.execute_command("SHARD.CALL", "WAIT", 5, 0, "GET", k) == b"v1+"
        # WAIT 0: nothing to wait for either.
        assert c.execute_command("SHARD.CALL", "wait", 0, 0, "DEL", k) == 1
    # RESP3 replies too.
    k = fleet.key_of("n1", prefix="resp3")
    c3 = fleet.client("n0", protocol=3)
    assert c3.execute_command("SHARD.CALL", "WAIT", 1, 0, "HSET", k, "f", "v") == 1
    assert c3.execute_command("SHARD.CALL", "WAIT", 1, 0, "HINCRBYFLOAT", k, "n", "1.5") == b"1.5"
    assert replicas["n1"].client().hget(k, "n") == b"1.5"


def test_too_few_acknowledgements_reply_noreplicas_and_the_write_stays(server_factory):
    fleet, replicas = fleet_with_replicas(server_factory)
    c = fleet.client("n0")
    for owner, via in (("n1", "n0"), ("n1", "n1"), ("n0", "n0")):
        k = fleet.key_of(owner, prefix=f"short-{owner}-{via}")
        client = fleet.client(via)
        with frozen(replicas[owner]):
            got = call_error(client, "WAIT", 1, 100, "SET", k, "kept")
            assert got == noreplicas(fleet, owner, 0, 1, 100)
            # The write is applied at the primary, as after WAIT.
            assert fleet.client(owner).get(k) == b"kept"
        wait_in_sync(fleet[owner].client(), replicas[owner].client())
        assert replicas[owner].client().get(k) == b"kept"
    # More replicas than the owner has: NOREPLICAS once the timeout has passed (the one
    # replica it has acknowledges within it: a second is ample on loopback).
    k = fleet.key_of("n1", prefix="more")
    got = call_error(c, "WAIT", 2, 1000, "INCR", k)
    assert got == noreplicas(fleet, "n1", 1, 2, 1000)
    assert fleet.client("n1").get(k) == b"1"
    # Counted where the call came in: n0 answered three NOREPLICAS, n1 one.
    assert fleet.client("n0").info("shard")["shard_call_noreplicas"] == 3
    assert fleet.client("n1").info("shard")["shard_call_noreplicas"] == 1


def test_a_split_command_waits_at_each_owner(server_factory):
    fleet, replicas = fleet_with_replicas(server_factory)
    c = fleet.client("n0")
    a0, b0 = fleet.key_of("n0", prefix="sa"), fleet.key_of("n0", prefix="sb")
    a1 = fleet.key_of("n1", prefix="sc")
    assert c.execute_command("SHARD.CALL", "WAIT", 1, 0, "MSET", a0, 1, a1, 2, b0, 3) == b"OK"
    assert replicas["n0"].client().mget(a0, b0) == [b"1", b"3"]
    assert replicas["n1"].client().get(a1) == b"2"
    # n1's replica frozen: only n1 is named, with its count (n0's replica acknowledges within
    # the second); every part stays applied.
    with frozen(replicas["n1"]):
        got = call_error(c, "WAIT", 1, 1000, "MSET", a0, "x", a1, "y")
        assert got == noreplicas(fleet, "n1", 0, 1, 1000)
        assert fleet.client("n0").get(a0) == b"x" and fleet.client("n1").get(a1) == b"y"
        assert replicas["n0"].client().get(a0) == b"x"
    wait_in_sync(fleet["n1"].client(), replicas["n1"].client())
    # Both frozen: both named.
    with frozen(replicas["n0"]), frozen(replicas["n1"]):
        got = call_error(c, "WAIT", 1, 50, "DEL", a0, a1, b0)
        assert got == "NOREPLICAS " + ", ".join(
            f"0 of 1 replicas of node {n} (127.0.0.1:{fleet[n].port})" for n in ("n0", "n1")
        ) + " acknowledged the write within 50 ms; it stays applied, as after WAIT"
        assert fleet.client("n0").exists(a0, b0) == 0 and fleet.client("n1").exists(a1) == 0
    # The merged reply once every owner's replica acknowledged.
    for n in fleet:
        wait_in_sync(fleet[n].client(), replicas[n].client())
    assert c.execute_command("SHARD.CALL", "WAIT", 1, 0, "MSET", a0, 1, a1, 2) == b"OK"
    assert c.execute_command("SHARD.CALL", "WAIT", 1, 0, "DEL", a0, a1, b0) == 2
    assert replicas["n1"].client().exists(a1) == 0 and replicas["n0"].client().exists(a0) == 0


def test_bad_arguments_are_refused_and_nothing_runs(server_factory):
    fleet, _ = fleet_with_replicas(server_factory)
    c = fleet.client("n0")
    k = fleet.key_of("n1", prefix="bad")
    usage = "SHARD.CALL WAIT numreplicas timeout-ms command key [arg ...]"
    cases = [
        (("WAIT", 1), f"WAIT needs numreplicas and timeout-ms: {usage}"),
        (("WAIT", 1, 100), f"WAIT needs a command after numreplicas and timeout-ms: {usage}"),
        (("WAIT", -1, 100, "SET", k, "v"),
         "WAIT numreplicas must be an integer from 0 to 2147483647, got '-1'"),
        (("WAIT", "one", 100, "SET", k, "v"),
         "WAIT numreplicas must be an integer from 0 to 2147483647, got 'one'"),
        (("WAIT", 1, -1, "SET", k, "v"),
         "WAIT timeout-ms must be an integer from 0 to 2147483647, got '-1'"),
        (("WAIT", 1, "0.5", "SET", k, "v"),
         "WAIT timeout-ms must be an integer from 0 to 2147483647, got '0.5'"),
        (("WAIT", 1, 100, "PING", "x"),
         "'ping' has no key here: SHARD.CALL routes commands by their keys"),
        (("WAIT", 1, 100, "BLPOP", k, 0),
         "'blpop' can block: SHARD.CALL routes a blocking command on its own (not with WAIT, nor inside MULTI or SHARD.MULTI)"),
    ]
    for args, message in cases:
        # redis-py drops the ERR code; the raw reply keeps it.
        assert call_error(c, *args) == message, args
        assert Raw(fleet["n0"].port).execute("SHARD.CALL", *args) == \
            b"-ERR " + message.encode() + b"\r\n"
    assert fleet.client("n1").exists(k) == 0
    # Inside MULTI the client cannot wait, even for a key of this node.
    local = fleet.key_of("n0", prefix="multi")
    pipe = c.pipeline(transaction=True)
    pipe.execute_command("SHARD.CALL", "WAIT", 1, 0, "SET", local, "v")
    [reply] = pipe.execute(raise_on_error=False)
    assert "cannot wait for node n0" in str(reply) and "inside MULTI" in str(reply)
    assert c.exists(local) == 0
    # A user who may not run WAIT may not make SHARD.CALL run it.
    c.execute_command("ACL", "SETUSER", "nowait", "on", "nopass", "+@all", "-wait", "~*")
    u = fleet["n0"].client(username="nowait", password="")
    got = call_error(u, "WAIT", 1, 0, "SET", k, "v")
    assert "no permissions to run the 'wait' command" in got
    assert u.execute_command("SHARD.CALL", "SET", k, "v") == b"OK"


def test_a_call_waiting_for_replicas_holds_no_other_call_to_its_owner(server_factory):
    """The WAIT blocks the connection it runs on at the owner for as long as it waits (here for
    ever: timeout 0, the owner's replica frozen); another call to that owner must not queue
    behind it on the module's shared connection."""
    fleet, replicas = fleet_with_replicas(server_factory)
    waited, other = fleet.key_of("n1", prefix="hol-a"), fleet.key_of("n1", prefix="hol-b")
    counter = fleet.key_of("n1", prefix="hol-c")
    fleet.client("n1").set(other, "there")
    assert blocked_clients(fleet["n1"]) == 0
    replies = []
    with frozen(replicas["n1"]):
        waiting = threading.Thread(target=lambda: replies.append(
            fleet.client("n0").execute_command("SHARD.CALL", "WAIT", 1, 0, "SET", waited, "v")))
        waiting.start()
        until(lambda: blocked_clients(fleet["n1"]) == 1, "the WAIT to block at n1")
        assert fleet.client("n1").get(waited) == b"v"
        # Through the shared connection to n1, while the WAIT holds its own.
        c = fleet.client("n0", socket_timeout=20)
        assert c.execute_command("SHARD.CALL", "GET", other) == b"there"
        assert c.execute_command("SHARD.CALL", "SET", other, "again") == b"OK"
        # And another waiting call, on another connection of its own (WAIT 0: at once).
        assert c.execute_command("SHARD.CALL", "WAIT", 0, 0, "INCR", counter) == 1
        assert waiting.is_alive() and not replies
        assert blocked_clients(fleet["n1"]) == 1, "the first WAIT still waits"
    waiting.join(timeout=30)
    assert replies == [b"OK"]
    assert replicas["n1"].client().get(waited) == b"v"


def test_calls_waiting_at_one_node_are_bounded(server_factory):
    """32 calls may wait at one node at once (each holds a connection of its own there); the
    next one is refused at once with TRYAGAIN (it was sent nowhere: a retry can succeed),
    naming the node, and runs nothing."""
    fleet, replicas = fleet_with_replicas(server_factory)
    keys = [fleet.key_of("n1", prefix=f"lane{i}") for i in range(33)]
    conns = []
    with frozen(replicas["n1"]):
        for k in keys[:32]:
            conn = Raw(fleet["n0"].port)
            conn.sock.sendall(encode(("SHARD.CALL", "WAIT", 1, 0, "SET", k, "v")))
            conns.append(conn)
        until(lambda: blocked_clients(fleet["n1"]) == 32, "32 WAITs to block at n1")
        got = call_error(fleet.client("n0"), "WAIT", 1, 0, "SET", keys[32], "v")
        assert got == f"TRYAGAIN shard.call: node n1 (127.0.0.1:{fleet['n1'].port}): 32 calls wait for " \
                      "its replicas already (SHARD.CALL WAIT, per RESP version and database): " \
                      "retry when one is done"
        assert fleet.client("n1").exists(keys[32]) == 0
    assert [conn.read() for conn in conns] == [b"+OK\r\n"] * 32
    for conn in conns:
        conn.close()
    # Done, their connections take the next calls.
    assert fleet.client("n0").execute_command("SHARD.CALL", "WAIT", 1, 0, "SET", keys[32], "v") \
        == b"OK"
    assert replicas["n1"].client().get(keys[32]) == b"v"


def test_a_cluster_client_waits_with_wait_on_its_own_connection(server_factory):
    """The recipe of docs/call.md: a cluster client writes at the owner itself, so WAIT right
    after the write, on the same connection (a pipeline to the key's node), counts it."""
    primaries, replicas = cluster_fleet_with_replicas(server_factory, names=("n0", "n1"))
    rc = RedisCluster(host="127.0.0.1", port=primaries["n0"].port, socket_timeout=20)
    for i in range(6):
        key = f"user:{i}"
        node = rc.get_node_from_key(key)
        owner = next(n for n, s in primaries.items() if s.port == node.port)
        pipe = node.redis_connection.pipeline(transaction=False)
        pipe.set(key, "v").wait(1, 0)
        assert pipe.execute() == [True, 1]
        # A replica with the cluster protocol on serves reads after READONLY.
        read = Raw(replicas[owner].port).pipeline([("READONLY",), ("GET", key)])
        assert read == [b"+OK\r\n", b"$1\r\nv\r\n"]
        with frozen(replicas[owner]):
            pipe = node.redis_connection.pipeline(transaction=False)
            pipe.set(key, "w").wait(1, 50)
            assert pipe.execute() == [True, 0]
            assert primaries[owner].client().get(key) == b"w"
    rc.close()


def test_during_a_resharding_every_write_of_the_call_is_waited_for_where_it_runs(server_factory):
    """n0 alone, then BEGIN n0+n1: a moving key still at n0 is copied to n1 and written there
    (the write waits at n1's replica: NOREPLICAS names n1 when it is frozen, and n0's frozen
    replica does not matter: nothing was written at n0); a GETDEL of a key already at n1
    removes n0's copy too, and that delete waits at n0's replica (NOREPLICAS names n0)."""
    fleet, replicas = fleet_with_replicas(server_factory)
    fleet.ring(["n0"])
    moving = [k for k in (f"mv:{i}" for i in range(200))
              if fleet.owners([k], via="n0") == ["n0"]]
    c0 = fleet.client("n0")
    for k in moving:
        assert c0.set(k, "old")
    fleet.ring(["n0", "n1"], verb="BEGIN")
    moving = [k for k, o in zip(moving, fleet.owners(moving, via="n0")) if o == "n1"]
    assert len(moving) >= 3
    copied, waited, removed = moving[:3]
    # The copy and the write at n1: n0's replica frozen changes nothing.
    with frozen(replicas["n0"]):
        # (A timeout ample for a loaded machine: the reply comes once n1's replica has it.)
        assert c0.execute_command("SHARD.CALL", "WAIT", 1, 5000, "APPEND", copied, "+") == 4
    # n1's replica frozen: the write at n1 is not acknowledged; it stays applied there.
    with frozen(replicas["n1"]):
        got = call_error(c0, "WAIT", 1, 100, "APPEND", waited, "+")
        assert got == noreplicas(fleet, "n1", 0, 1, 100)
    assert fleet.client("n1").get(waited) == b"old+"
    # The key brought to n1, then removed there: the delete of n0's copy waits at n0's replica.
    assert c0.execute_command("SHARD.CALL", "APPEND", removed, "+") == 4
    assert c0.exists(removed) == 1, "n0 keeps its copy until the key is removed"
    with frozen(replicas["n0"]):
        got = call_error(c0, "WAIT", 1, 100, "GETDEL", removed)
        assert got == noreplicas(fleet, "n0", 0, 1, 100)
    assert c0.exists(removed) == 0 and fleet.client("n1").exists(removed) == 0
    wait_in_sync(c0, replicas["n0"].client())
    assert replicas["n0"].client().exists(removed) == 0
