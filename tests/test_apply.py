"""SHARD.APPLY, the copy's way in at its destination for strings (issue 32): many strings with
their absolute expiries in one command, NX or REPLACE; replicated and written to the AOF with
exactly the strings it wrote; bad input changes nothing."""

import time

import pytest
import redis

from helpers.server import info_shard, wait_in_sync


def apply(client, condition, *triples):
    args = ["SHARD.APPLY", condition]
    for t in triples:
        args += list(t)
    return client.execute_command(*args)


def test_writes_the_strings_with_their_expiries_and_counts_them(r):
    at = int(time.time() * 1000) + 600_000
    assert apply(r, "NX", ("a", "1", 0), ("b", b"\x00\xffbin", at), ("c", "x" * 100_000, 0)) == 3
    assert r.mget("a", "b", "c") == [b"1", b"\x00\xffbin", b"x" * 100_000]
    assert r.ttl("a") == -1 and r.pexpiretime("b") == at
    assert r.type("b") == b"string" and r.strlen("c") == 100_000
    # The value is stored as SET stores it: it can be appended to, incremented, read by range.
    assert r.incr("a") == 2 and r.append("b", "z") == 6 and r.getrange("c", 0, 1) == b"xx"
    info = info_shard(r)
    assert info["applied_strings"] == "3" and info["applied_skipped"] == "0"


def test_nx_skips_a_key_that_is_there_and_replace_writes_over_it(r):
    r.set("here", "newer")
    r.rpush("list", "x")
    assert apply(r, "NX", ("here", "older", 0), ("list", "v", 0), ("new", "v", 0)) == 1
    assert r.get("here") == b"newer" and r.type("list") == b"list" and r.get("new") == b"v"
    assert apply(r, "REPLACE", ("here", "replaced", 0), ("list", "v", 0)) == 2
    assert r.get("here") == b"replaced" and r.get("list") == b"v"
    info = info_shard(r)
    assert info["applied_strings"] == "3" and info["applied_skipped"] == "2"


def test_a_string_whose_expiry_has_passed_is_not_written(r):
    past = int(time.time() * 1000) - 1000
    assert apply(r, "NX", ("gone", "v", past), ("kept", "v", 0)) == 1
    assert r.exists("gone") == 0 and r.get("kept") == b"v"


def test_fires_the_keyspace_events_that_set_fires(r):
    r.config_set("notify-keyspace-events", "KEA")
    p = r.pubsub()
    p.psubscribe("__keyspace@0__:*")
    p.get_message(timeout=1)
    apply(r, "NX", ("ev", "v", int(time.time() * 1000) + 60_000))
    seen = []
    deadline = time.monotonic() + 5
    while len(seen) < 2 and time.monotonic() < deadline:
        m = p.get_message(timeout=0.5)
        if m and m["type"] == "pmessage":
            seen.append((m["channel"], m["data"]))
    assert seen == [(b"__keyspace@0__:ev", b"set"), (b"__keyspace@0__:ev", b"expire")]


@pytest.mark.parametrize("args, error", [
    (["SHARD.APPLY", "NX", "k", "v"], "wrong number of arguments"),
    (["SHARD.APPLY", "NX"], "wrong number of arguments"),
    (["SHARD.APPLY", "XX", "k", "v", "0"], "NX or REPLACE first, not 'XX'"),
    (["SHARD.APPLY", "NX", "k", "v", "0", "k2", "v", "soon"], "expiry of key 'k2'"),
    (["SHARD.APPLY", "NX", "k", "v", "0", "k2", "v", "-5"], "expiry of key 'k2'"),
])
def test_bad_input_is_refused_and_changes_nothing(r, args, error):
    with pytest.raises(redis.ResponseError, match=error):
        r.execute_command(*args)
    assert r.dbsize() == 0


def test_replica_and_aof_hold_exactly_what_was_written(server_factory):
    primary = server_factory(config=[("appendonly", "yes")])
    replica = server_factory()
    p, rep = primary.client(), replica.client()
    rep.execute_command("REPLICAOF", "127.0.0.1", primary.port)
    wait_in_sync(p, rep)
    p.set("there", "newer")
    future = int(time.time() * 1000) + 600_000
    past = int(time.time() * 1000) - 1000
    # Some written, one skipped as there, one as expired: the replica gets the written ones.
    assert apply(p, "NX", ("there", "older", 0), ("w1", "1", 0), ("w2", "2", future),
                 ("old", "x", past)) == 2
    assert apply(p, "NX", ("all1", "1", 0), ("all2", "2", 0)) == 2
    wait_in_sync(p, rep)
    for c in (p, rep):
        assert c.mget("there", "w1", "w2", "old", "all1", "all2") == [
            b"newer", b"1", b"2", None, b"1", b"2"]
        assert c.pexpiretime("w2") == future
    assert rep.dbsize() == p.dbsize() == 5
    # The AOF, loaded again, gives the same keys.
    primary.stop()
    primary.start()
    p = primary.client()
    assert p.mget("there", "w1", "w2", "old", "all1", "all2") == [
        b"newer", b"1", b"2", None, b"1", b"2"]
    assert p.pexpiretime("w2") == future and p.dbsize() == 5
