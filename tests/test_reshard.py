"""Resharding between real servers with MIGRATE: grow 3 -> 4, shrink 4 -> 3, faults."""

import re
import threading
import time

import pytest
import redis

from helpers.fleet import (KEYS, check_placement, owners, populate, ring_args, set_ring,
                           snapshot, start_fleet)
from helpers.reshard import status, wait_job
from helpers.server import info_shard

def reshard(servers, old_names, new_names, active):
    """BEGIN on every active server, COPY everywhere, COMMIT, CLEANUP on the new ring's nodes."""
    for name in active:
        servers[name].client().execute_command(
            "SHARD.RING", "BEGIN", "ketama", *ring_args(servers, new_names))
    for name in active:
        assert servers[name].client().execute_command("SHARD.RESHARD", "COPY") == b"OK"
    copies = {name: wait_job(servers[name].client()) for name in active}
    for name in active:
        servers[name].client().execute_command("SHARD.RING", "COMMIT")
    for name in new_names:
        assert servers[name].client().execute_command("SHARD.RESHARD", "CLEANUP") == b"OK"
    cleanups = {name: wait_job(servers[name].client()) for name in new_names}
    return copies, cleanups


@pytest.mark.slow
def test_grow_three_to_four(server_factory):
    names3 = ["n0", "n1", "n2"]
    names4 = names3 + ["n3"]
    servers = start_fleet(server_factory, names4, ring=False)
    for n in names3:
        servers[n].client().execute_command("SHARD.RING", "SET", "ketama", *ring_args(servers, names3))
    servers["n3"].client().execute_command("SHARD.RING", "SET", "ketama", *ring_args(servers, names3))
    keys = populate({n: servers[n] for n in names3})
    before = snapshot(servers, keys)
    assert all(len(h) == 1 for h in before.values())

    copies, cleanups = reshard(servers, names3, names4, names4)
    moved = sum(c["copied"] for c in copies.values())
    assert all(c["state"] == b"done" and c["failed"] == 0 for c in copies.values()), copies
    assert 0.1 * KEYS < moved < 0.5 * KEYS
    assert sum(c["deleted"] for c in cleanups.values()) == moved
    check_placement(servers, names4, keys, before)
    info = info_shard(servers["n0"].client())
    assert info["reshard_state"] == "done" and info["resharding_open"] == "0"


@pytest.mark.slow
def test_shrink_four_to_three(server_factory):
    names4 = ["n0", "n1", "n2", "n3"]
    names3 = names4[:3]
    servers = start_fleet(server_factory, names4, ring=False)
    set_ring(servers, names4)
    keys = populate(servers, seed=2)
    before = snapshot(servers, keys)
    copies, _ = reshard(servers, names4, names3, names4)
    # The removed node sent every key away; cleanup there is refused (it is not in the ring).
    assert copies["n3"]["copied"] == servers["n3"].client().dbsize()
    with pytest.raises(redis.ResponseError, match="names no node of the ring"):
        servers["n3"].client().execute_command("SHARD.RESHARD", "CLEANUP")
    check_placement(servers, names3, keys, before)


def test_writes_during_the_copy_are_not_lost_or_overwritten(server_factory):
    names = ["a", "b"]
    servers = start_fleet(server_factory, names, ring=False)
    a, b = servers["a"].client(), servers["b"].client()
    a.execute_command("SHARD.RING", "SET", "ketama", *ring_args(servers, ["a"]))
    b.execute_command("SHARD.RING", "SET", "ketama", *ring_args(servers, ["a"]))
    pipe = a.pipeline(transaction=False)
    for i in range(20000):
        pipe.set(f"old:{i}", "old")
    pipe.execute()
    for c in (a, b):
        c.execute_command("SHARD.RING", "BEGIN", "ketama", *ring_args(servers, names))
    moving = [k for k, o in zip([f"old:{i}" for i in range(20000)],
                                owners(a, [f"old:{i}" for i in range(20000)])) if o == "b"]
    # Under the new ring clients write to b: these values are newer than a's copies.
    newer = moving[:500]
    b.mset({k: "new" for k in newer})

    written = []
    stop = threading.Event()

    def writer():
        c = servers["b"].client()
        at = {n: s.client() for n, s in servers.items()}  # a connection to each owner
        i = 0
        while not stop.is_set():
            key = f"fresh:{i}"
            owner = c.execute_command("SHARD.WHEREIS", key).decode()
            at[owner].set(key, f"fresh-{i}")
            written.append((key, owner))
            i += 1

    t = threading.Thread(target=writer)
    t.start()
    try:
        a.execute_command("SHARD.RESHARD", "COPY", "BATCH", 50)
        st = wait_job(a)
    finally:
        stop.set()
        t.join(timeout=30)
    assert st["state"] == b"done"
    assert st["skipped"] >= len(newer)
    assert b.mget(newer) == [b"new"] * len(newer)
    assert all(v == b"old" for v in b.mget(moving[500:]))
    assert written, "the writer wrote during the copy"
    at = {n: s.client() for n, s in servers.items()}
    for key, owner in written:
        assert at[owner].get(key) == f"fresh-{key.split(':')[1]}".encode()


def test_dead_destination_counts_failures_and_a_later_copy_moves_them(server_factory):
    names = ["a", "b"]
    servers = start_fleet(server_factory, names, ring=False)
    a = servers["a"].client()
    a.execute_command("SHARD.RING", "SET", "ketama", *ring_args(servers, ["a"]))
    pipe = a.pipeline(transaction=False)
    for i in range(5000):
        pipe.set(f"k{i}", i)
    pipe.execute()
    a.execute_command("SHARD.RING", "BEGIN", "ketama", *ring_args(servers, names))
    port_b = servers["b"].port
    servers["b"].stop()
    a.execute_command("SHARD.RESHARD", "COPY", "TIMEOUT", 200)
    st = wait_job(a)
    assert st["state"] == b"failed"
    assert st["failed"] > 500 and st["copied"] == 0
    assert b"127.0.0.1:%d" % port_b in st["last_error"]
    assert a.dbsize() == 5000, "COPY never deletes"
    assert int(info_shard(a)["reshard_failed"]) == st["failed"]

    servers["b"].port = port_b
    servers["b"].start()
    a.execute_command("SHARD.RESHARD", "COPY")
    st2 = wait_job(a)
    assert st2["state"] == b"done" and st2["copied"] == st["failed"]
    assert servers["b"].client().dbsize() == st["failed"]


def test_server_keeps_answering_during_copy(server_factory):
    """The copy runs in steps (or a child): the server answers PINGs all along it, and reports
    its longest step. How long the steps and the PINGs take is measured by `make bench`
    (bench/stall.py), not asserted here: a test machine's load decides it."""
    names = ["a", "b"]
    servers = start_fleet(server_factory, names, ring=False)
    a = servers["a"].client()
    set_ring(servers, ["a"])
    pipe = a.pipeline(transaction=False)
    for i in range(50000):
        pipe.set(f"k{i}", "v" * 100)
    pipe.execute()
    a.execute_command("SHARD.RING", "BEGIN", "ketama", *ring_args(servers, names))
    probe = servers["a"].client()
    a.execute_command("SHARD.RESHARD", "COPY")
    answered = 0
    while status(probe)["state"] == b"copying":
        assert probe.ping()
        answered += 1
    assert answered > 20, answered
    st = status(probe)
    assert st["state"] == b"done" and int(st["max_step_us"]) > 0, st


def test_stop_and_status_and_refusals(server_factory):
    names = ["a", "b"]
    servers = start_fleet(server_factory, names, ring=False)
    a = servers["a"].client()
    with pytest.raises(redis.ResponseError, match="no resharding job is running"):
        a.execute_command("SHARD.RESHARD", "STOP")
    assert status(a)["state"] == b"idle"
    with pytest.raises(redis.ResponseError, match="no ring is set"):
        a.execute_command("SHARD.RESHARD", "COPY")
    set_ring(servers, ["a"])
    pipe = a.pipeline(transaction=False)
    for i in range(50000):
        pipe.set(f"k{i}", i)
    pipe.execute()
    with pytest.raises(redis.ResponseError, match="no resharding is open"):
        a.execute_command("SHARD.RING", "COMMIT")
    a.execute_command("SHARD.RING", "BEGIN", "ketama", *ring_args(servers, names))
    with pytest.raises(redis.ResponseError, match="a resharding is open"):
        a.execute_command("SHARD.RING", "BEGIN", "ketama", *ring_args(servers, names))
    with pytest.raises(redis.ResponseError, match="a resharding is open"):
        a.execute_command("SHARD.RING", "SET", "ketama", *ring_args(servers, names))
    with pytest.raises(redis.ResponseError, match="a resharding is open"):
        a.execute_command("SHARD.RESHARD", "CLEANUP")
    a.execute_command("SHARD.RESHARD", "COPY", "BATCH", 1)
    with pytest.raises(redis.ResponseError, match="already running"):
        a.execute_command("SHARD.RESHARD", "COPY")
    with pytest.raises(redis.ResponseError, match="job is running"):
        a.execute_command("SHARD.RING", "COMMIT")
    assert a.execute_command("SHARD.RESHARD", "STOP") == b"OK"
    st = wait_job(a)
    assert st["state"] == b"idle" and st["copied"] < 25000
    for bad, msg in ((["BATCH", 0], "BATCH must be"), (["TIMEOUT", "x"], "TIMEOUT must be"),
                     (["FAST"], "unknown option")):
        with pytest.raises(redis.ResponseError, match=msg):
            a.execute_command("SHARD.RESHARD", "COPY", *bad)
    # ABORT puts the previous ring back; nothing was deleted.
    a.execute_command("SHARD.RING", "ABORT")
    ring = a.execute_command("SHARD.RING", "GET")
    ring = dict(zip(ring[::2], ring[1::2]))
    assert len(ring[b"nodes"]) == 1 and ring[b"previous"] is None
    assert a.dbsize() == 50000


def test_self_must_be_set_and_locate_shows_previous(server_factory):
    s = server_factory()
    c = s.client()
    c.execute_command("SHARD.RING", "SET", "ketama", "a", "127.0.0.1:1", 1)
    with pytest.raises(redis.ResponseError, match="self is not set"):
        c.execute_command("SHARD.RESHARD", "COPY")
    loc = c.execute_command("SHARD.LOCATE", "x")
    loc = dict(zip(loc[::2], loc[1::2]))
    assert loc[b"previous_node"] is None and loc[b"previous_address"] is None
    c.execute_command("SHARD.RING", "BEGIN", "ketama", "b", "127.0.0.1:2", 1)
    loc = c.execute_command("SHARD.LOCATE", "x")
    loc = dict(zip(loc[::2], loc[1::2]))
    assert (loc[b"node"], loc[b"previous_node"], loc[b"previous_address"]) == (b"b", b"a", b"127.0.0.1:1")
    assert c.execute_command("SHARD.WHEREIS", "x") == b"b"
    ring = c.execute_command("SHARD.RING", "GET")
    ring = dict(zip(ring[::2], ring[1::2]))
    prev = dict(zip(ring[b"previous"][::2], ring[b"previous"][1::2]))
    assert prev[b"algo"] == b"ketama" and len(prev[b"digest"]) == 32
    c.config_set("shard.self", "zz")
    with pytest.raises(redis.ResponseError, match="names no node of the current or previous ring"):
        c.execute_command("SHARD.RESHARD", "COPY")


def test_copy_with_auth(server_factory):
    a = server_factory(module_args=["self", "a", "auth-user", "mover", "auth-password", "s3cret"])
    b = server_factory(password="other")
    b_admin = b.client()
    b_admin.execute_command("ACL", "SETUSER", "mover", "on", ">s3cret", "~*", "+@all")
    servers = {"a": a, "b": b}
    ca = a.client()
    ca.execute_command("SHARD.RING", "SET", "ketama", *ring_args(servers, ["a"]))
    ca.mset({f"k{i}": i for i in range(2000)})
    ca.execute_command("SHARD.RING", "BEGIN", "ketama", *ring_args(servers, ["a", "b"]))
    ca.execute_command("SHARD.RESHARD", "COPY")
    st = wait_job(ca)
    assert st["state"] == b"done" and st["copied"] > 0
    assert b_admin.dbsize() == st["copied"]
    # The password is not shown back by the module's own replies.
    assert b"s3cret" not in repr(ca.execute_command("SHARD.RING", "GET")).encode()
    assert "s3cret" not in repr(ca.info("shard"))


def test_refusals_name_the_fence_or_the_cancel_that_holds_the_rings(server_factory):
    """The old ring over the new one, returning, is a fleet operation's fence or a cancel
    bringing keys back (issue 33): a write of a moving key is refused with TRYAGAIN either way,
    and the refusal says which one holds the rings; a restart keeps which one it was."""
    servers = start_fleet(server_factory, ["a", "b"], ring=["a"],
                          config=[("appendonly", "yes")])
    a = servers["a"].client()
    servers.ring(["a", "b"], verb="BEGIN", on=["a"])
    keys = [f"k:{i}" for i in range(100)]
    moving = [k for k, o in zip(keys, owners(a, keys)) if o == "b"][:5]
    assert moving
    a.execute_command("SHARD.RING", "ABORT")
    old = f"algo ketama\nhashtag none\nnode a 127.0.0.1:{servers['a'].port} 1\n"
    new = old + f"node b 127.0.0.1:{servers['b'].port} 1\n"
    for flag, words in (("FENCE", "a resharding is starting (its fence)"),
                        ("RETURNING", "a cancelled resharding is bringing")):
        assert a.execute_command("SHARD.RING", "INSTALL", old, new, flag) == b"OK"
        for k in moving:
            with pytest.raises(redis.ResponseError, match=r"^TRYAGAIN " + re.escape(words)):
                a.execute_command("SHARD.CALL", "SET", k, "v")
    a.execute_command("SHARD.RING", "INSTALL", old, new, "FENCE")
    servers["a"].stop()
    servers["a"].start()
    a = servers["a"].client()
    with pytest.raises(redis.ResponseError, match=r"^TRYAGAIN a resharding is starting"):
        a.execute_command("SHARD.CALL", "SET", moving[0], "v")
