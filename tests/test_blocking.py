"""Blocking commands across the fleet (issue 43): BLPOP and its kin on a key another node owns
wait at the owner, on a connection of their own, through SHARD.CALL and a route-plain client;
the timeout is kept; a client that disconnects while it waits has no element popped for it; a
blocking command over keys of two owners is refused, saying why; a local key blocks as the
server's own command; an owner killed while a client waits fails the call, naming it."""

import signal
import threading
import time

import pytest
import redis

from helpers.fleet import make_fleet
from helpers.server import until


def fleet_of(server_factory):
    return make_fleet(server_factory, args=["route-plain", "yes"])


def later(seconds, fn):
    t = threading.Timer(seconds, fn)
    t.start()
    return t


@pytest.mark.parametrize("via", ["plain", "shard.call"])
def test_blpop_of_another_nodes_key_waits_there(server_factory, via):
    fleet = fleet_of(server_factory)
    q = fleet.key_of("n1", prefix="q")
    c = fleet.client("n0")
    # The replies as sent, whichever way the command went.
    c.response_callbacks.clear()

    def run(*args):
        if via == "plain":
            return c.execute_command(*args)
        return c.execute_command("SHARD.CALL", *args)

    # Woken by a push through another node, after it started waiting.
    t = later(0.3, lambda: fleet.client("n2").rpush(q, "a"))
    started = time.monotonic()
    assert run("BLPOP", q, 5) == [q.encode(), b"a"]
    assert 0.2 < time.monotonic() - started < 4
    t.join()
    # The timeout is the owner's: nil after about a second.
    started = time.monotonic()
    assert run("BLPOP", q, 1) is None
    assert 0.9 < time.monotonic() - started < 3
    # The other blocking commands of lists, sorted sets and streams.
    dst = fleet.key_of("n1", prefix="dst")
    z = fleet.key_of("n2", prefix="z")
    s = fleet.key_of("n2", prefix="s")
    t = later(0.2, lambda: fleet.client("n0").rpush(q, "b"))
    assert run("BRPOP", q, 5) == [q.encode(), b"b"]
    t.join()
    # BLMOVE between keys of one owner (n1).
    t = later(0.2, lambda: fleet.client("n2").rpush(q, "c"))
    assert run("BLMOVE", q, dst, "LEFT", "RIGHT", 5) == b"c"
    t.join()
    assert fleet.client("n0").lrange(dst, 0, -1) == [b"c"]
    t = later(0.2, lambda: fleet.client("n1").zadd(z, {"m": 3}))
    assert run("BZPOPMIN", z, 5) == [z.encode(), b"m", b"3"]
    t.join()
    t = later(0.2, lambda: fleet.client("n1").xadd(s, {"f": "v"}, id="1-1"))
    got = run("XREAD", "BLOCK", 5000, "STREAMS", s, "$")
    t.join()
    assert got == [[s.encode(), [[b"1-1", [b"f", b"v"]]]]]


def test_a_client_that_disconnects_while_waiting_gets_no_element(server_factory):
    fleet = fleet_of(server_factory)
    q = fleet.key_of("n1", prefix="gone")
    owner = fleet.client("n1")
    waiter = fleet.client("n0", single_connection_client=True, socket_timeout=0.5)
    with pytest.raises(redis.TimeoutError):
        waiter.blpop(q, 0)
    # The client is gone: its connection closed by redis-py's timeout.
    waiter.connection.disconnect()
    # The owner stops waiting for it.
    deadline = time.monotonic() + 5
    while owner.info("clients")["blocked_clients"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert owner.info("clients")["blocked_clients"] == 0
    fleet.client("n2").rpush(q, "kept")
    time.sleep(0.2)
    assert owner.lrange(q, 0, -1) == [b"kept"]


def test_keys_of_two_owners_are_refused_saying_why(server_factory):
    fleet = fleet_of(server_factory)
    a, b = fleet.key_of("n1", prefix="a"), fleet.key_of("n2", prefix="b")
    with pytest.raises(redis.ResponseError,
                       match=r"live on different nodes \(n1, n2\): a blocking command waits at one owner"):
        fleet.client("n0").blpop([a, b], 1)


def test_a_local_key_blocks_as_the_servers_own(server_factory):
    fleet = fleet_of(server_factory)
    q = fleet.key_of("n0", prefix="here")
    c = fleet.client("n0")
    c.config_resetstat()
    t = later(0.2, lambda: fleet.client("n1").rpush(q, "x"))
    assert c.blpop(q, 5) == (q.encode(), b"x")
    t.join()
    assert not [k for k in c.info("commandstats") if k.startswith("cmdstat_shard.plain")]
    # Through SHARD.CALL too (over a connection to this very node).
    t = later(0.2, lambda: fleet.client("n1").rpush(q, "y"))
    assert c.execute_command("SHARD.CALL", "BLPOP", q, 5) == [q.encode(), b"y"]
    t.join()


def test_an_owner_killed_while_a_client_waits_fails_the_call(server_factory):
    fleet = fleet_of(server_factory)
    q = fleet.key_of("n1", prefix="dead")
    c = fleet.client("n0")
    later(0.3, lambda: fleet["n1"].stop(signal.SIGKILL))
    with pytest.raises(redis.ResponseError, match="n1"):
        c.blpop(q, 10)
    # n0 still serves.
    assert c.ping()


@pytest.mark.slow
def test_a_blpop_waiting_at_an_owner_that_fails_over(server_factory, sentinel_factory):
    """A BLPOP routed to a Sentinel node's primary, which is killed and failed over: the
    waiting call fails naming the node (as a client blocked on a primary that goes away sees
    its connection end), nothing is popped for it, and the same BLPOP sent again waits at the
    promoted replica, where a push through another node wakes it."""
    from helpers.sentinel import start_sentinel_fleet
    fleet = start_sentinel_fleet(server_factory, sentinel_factory)
    for s in (*fleet.primaries.values(), *fleet.replicas.values()):
        s.client().config_set("shard.route-plain", "yes")
    entry = fleet.primaries["n0"]
    c0 = entry.client()
    q = fleet.keys_of(c0, "n1", 1)[0]
    old, new = fleet.primaries["n1"], fleet.replicas["n1"]
    later(0.5, lambda: old.stop(signal.SIGKILL))
    started = time.monotonic()
    with pytest.raises(redis.ResponseError, match="n1"):
        c0.blpop(q, 30)
    assert time.monotonic() - started < 10
    new_address = f"127.0.0.1:{new.port}".encode()
    # n0 waits there and n2 pushes there: both must follow (each learns from Sentinel on its
    # own; a push from n2 before it did went to the killed server's address).
    for via in ("n0", "n2"):
        c = fleet.primaries[via].client()
        until(lambda: c.execute_command("SHARD.LOCATE", q)[3] == new_address,
              f"{via} follows n1's failover", timeout=40)
    until(lambda: new.client().info("replication")["role"] == "master", "promoted", timeout=10)
    got = {}
    waiter = threading.Thread(target=lambda: got.setdefault("v", entry.client().blpop(q, 20)))
    waiter.start()
    until(lambda: new.client().info("clients")["blocked_clients"] >= 1,
          "the BLPOP waits at the promoted replica", timeout=10)
    assert fleet.primaries["n2"].client().lpush(q, "x") == 1
    waiter.join(25)
    assert tuple(got.get("v") or ()) == (q.encode(), b"x"), got
    assert new.client().llen(q) == 0


def test_a_blpop_waiting_at_a_key_a_resharding_moves(server_factory):
    """A BLPOP waits at its key's owner n1 when a resharding begins to move the key to n3:
    what it waits for will be pushed at n3, so its wait is ended (TRYAGAIN, saying so) rather
    than left to its timeout; sent again once the move is done, it waits at n3, where the
    element pushed during the move is."""
    names = ["n0", "n1", "n2", "n3"]
    fleet = make_fleet(server_factory, names=names, ring=["n0", "n1", "n2"],
                       args=["route-plain", "yes"])
    probe = fleet.client("n3")
    probe.execute_command("SHARD.RING", "SET", "ketama", *fleet.ring_args(names))
    cands = [f"mq:{i}" for i in range(300)]
    after = dict(zip(cands, fleet.owners(cands, via="n3")))
    probe.execute_command("SHARD.RING", "SET", "ketama", *fleet.ring_args(["n0", "n1", "n2"]))
    before = dict(zip(cands, fleet.owners(cands, via="n3")))
    q = next(k for k in cands if before[k] == "n1" and after[k] == "n3")
    n1 = fleet.client("n1")
    got = {}

    def wait():
        try:
            got["v"] = fleet.client("n0").blpop(q, 30)
        except redis.ResponseError as e:
            got["e"] = (str(e), time.monotonic())
    waiter = threading.Thread(target=wait)
    waiter.start()
    until(lambda: n1.info("clients")["blocked_clients"] == 1, "the BLPOP waits at n1")
    begun = time.monotonic()
    for n in ("n3", "n1", "n2", "n0"):
        assert fleet.client(n).execute_command(
            "SHARD.RING", "BEGIN", "ketama", *fleet.ring_args(names)) == b"OK"
    waiter.join(10)
    assert "e" in got, got
    message, at = got["e"]
    assert message.startswith("TRYAGAIN a ring change moved a key of 'blpop' away from n1"), message
    assert "n3" in message, message
    assert at - begun < 5
    assert n1.info("clients")["blocked_clients"] == 0
    # Pushed during the move: at the new owner.
    assert fleet.client("n2").rpush(q, "during") == 1
    with pytest.raises(redis.ResponseError, match="moving a key"):
        fleet.client("n0").blpop(q, 1)
    for n in names:
        assert fleet.client(n).execute_command("SHARD.RING", "COMMIT") == b"OK"
    assert tuple(fleet.client("n0").blpop(q, 5)) == (q.encode(), b"during")
    assert n1.exists(q) == 0 and fleet.client("n3").exists(q) == 0
