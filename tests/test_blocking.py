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
    assert "cmdstat_shard.plain" not in c.info("commandstats")
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
