"""Transactions across nodes, the coordinator's own parts (docs/transactions.md, "the
coordinator may be an owner too"): a watch of this node's keys and a block whose only owner
is this node run inside the client's SHARD.WATCH / SHARD.EXEC, not over a connection to
itself (no SHARD.TXN reaches the server as a command); what they answer is what the owner
side answers over the network. And the decision's wait for a replica follows the replicas
that come and go (the count is kept from the server's replica events, not read per decision).
"""

import pytest
import redis

from helpers.fleet import make_fleet
from helpers.server import (AOF, PRIMARY, aof_command_names, command_calls, info_shard, until,
                            wait_in_sync)


def call(c, *args):
    return c.execute_command("SHARD.CALL", *args)


@pytest.fixture
def fleet(server_factory):
    return make_fleet(server_factory, timeout_ms=2000)


def run_queued(c, commands):
    assert c.execute_command("SHARD.MULTI") == b"OK"
    for command in commands:
        assert call(c, *command) == b"QUEUED", command
    return c.execute_command("SHARD.EXEC")


def txn_calls(server):
    """The SHARD.TXN subcommands `server` ran as commands, by name."""
    stats = server.client().info("commandstats")
    return {k[len("cmdstat_shard.txn|"):]: v["calls"] for k, v in stats.items()
            if k.startswith("cmdstat_shard.txn|")}


def test_this_node_s_own_part_runs_inside_the_client_s_command(fleet):
    """Watches and one owner's block of the coordinator's own keys are no SHARD.TXN command
    (the previous build sent WATCH and APPLY to itself over a connection: 1 each)."""
    n0 = fleet["n0"]
    a, b = fleet.key_of("n0", prefix="here"), fleet.key_of("n0", prefix="also")
    c = n0.client()
    assert c.execute_command("SHARD.WATCH", a, b) == b"OK"
    assert call(c, "GET", a) is None
    assert run_queued(c, [("DECRBY", a, 5), ("INCRBY", b, 5)]) == [-5, 5]
    assert run_queued(c, [("INCR", a)]) == [-4]
    assert txn_calls(n0) == {}
    assert int(info_shard(c)["txn_committed"]) == 2
    # The watch was this node's: a write by another client fails the next transaction, with
    # nothing applied, and the watch is gone after it.
    assert c.execute_command("SHARD.WATCH", a) == b"OK"
    n0.client().set(a, 100)
    assert run_queued(c, [("INCR", a), ("INCR", b)]) is None
    assert n0.client().mget(a, b) == [b"100", b"5"]
    assert run_queued(c, [("INCR", a)]) == [101]
    # SHARD.UNWATCH drops a watch of this node without a request either.
    assert c.execute_command("SHARD.WATCH", a) == b"OK"
    assert c.execute_command("SHARD.UNWATCH") == b"OK"
    n0.client().set(a, 7)
    assert run_queued(c, [("INCR", a)]) == [8]
    assert txn_calls(n0) == {}


def test_own_keys_beside_another_owner_s_watch_there_and_here(fleet):
    """A watch over this node and another: this node's keys here, the other's at its owner;
    a write of either fails the transaction."""
    here, there = fleet.key_of("n0", prefix="mix"), fleet.key_of("n1", prefix="mix")
    c = fleet.client("n0")
    for writer, key in (("n0", here), ("n1", there)):
        assert c.execute_command("SHARD.WATCH", here, there) == b"OK"
        fleet.client(writer).set(key, "written")
        assert run_queued(c, [("SET", here, "mine")]) is None
    assert txn_calls(fleet["n1"]).get("watch") == 2
    assert txn_calls(fleet["n0"]).get("watch") is None
    assert c.execute_command("SHARD.WATCH", here, there) == b"OK"
    assert run_queued(c, [("SET", here, "mine"), ("SET", there, "mine")]) == [b"OK", b"OK"]


def test_a_locked_key_here_is_waited_for_then_committed(fleet):
    """A key of this node locked by another transaction: the block goes the way of any owner's
    (retried over the connection until the lock ends), TRYAGAIN with nothing applied after
    shard.txn-lock-ms, and a plain commit once the lock is gone."""
    k = fleet.key_of("n0", prefix="lockedhere")
    c = fleet.client("n0")
    c.config_set("shard.txn-lock-ms", 200)
    assert c.execute_command("SHARD.TXN", "PREPARE", "n9/7", 60_000, 0, 1, 2,
                             "GET", k) == b"PREPARED"
    with pytest.raises(redis.ResponseError, match="^TRYAGAIN"):
        run_queued(c, [("SET", k, "mine")])
    assert int(info_shard(c)["txn_aborted_lock"]) == 1
    assert c.execute_command("SHARD.TXN", "ABORT", "n9/7") == b"OK"
    assert c.get(k) is None  # (read once the lock ended: a read of a locked key waits)
    assert run_queued(c, [("SET", k, "mine")]) == [b"OK"]
    assert c.get(k) == b"mine"


def test_a_refused_block_here_answers_like_the_owner(fleet):
    """An error of a queued command is its reply, the others apply (as MULTI/EXEC)."""
    k, s = fleet.key_of("n0", prefix="err"), fleet.key_of("n0", prefix="str")
    c = fleet.client("n0")
    c.set(s, "text")
    got = run_queued(c, [("INCR", s), ("SET", k, 1)])
    assert isinstance(got[0], redis.ResponseError) and got[1] == b"OK"
    assert c.get(k) == b"1"


def test_a_block_here_is_one_multi_exec_in_the_aof_and_at_the_replica(server_factory):
    """Run inside SHARD.EXEC, the block's writes are replicated and written to the AOF as one
    MULTI/EXEC, as SHARD.TXN APPLY's are; the watch and the SHARD.EXEC are not written."""
    primary = server_factory(module_args=["self", "n0"], config=AOF + PRIMARY)
    replica = server_factory(module_args=["self", "n0"], config=AOF)
    p, r = primary.client(), replica.client()
    p.execute_command("SHARD.RING", "SET", "ketama", "n0", f"127.0.0.1:{primary.port}", 1)
    r.replicaof("127.0.0.1", primary.port)
    wait_in_sync(p, r)
    until(lambda: r.info("persistence")["aof_rewrite_in_progress"] == 0
          and r.info("persistence")["aof_rewrite_scheduled"] == 0, "the replica's AOF rewrite")
    assert p.execute_command("SHARD.WATCH", "a") == b"OK"
    replies = run_queued(p, [("SET", "a", 1), ("INCR", "a"), ("GET", "a"), ("LPUSH", "a", "x")])
    assert replies[:3] == [b"OK", 2, b"2"]
    assert isinstance(replies[3], redis.ResponseError) and "WRONGTYPE" in str(replies[3])
    wait_in_sync(p, r)
    assert r.get("a") == b"2"
    # (The reply waited for the replica: SHARD.TXN SYNC and WAIT on a connection to itself,
    # tests/test_txn_acked.py; the block itself is no SHARD.TXN command.)
    assert txn_calls(primary) == {"sync": 1}
    for server in (primary, replica):
        # (Valkey writes a SELECT inside the block.)
        names = [n for n in aof_command_names(server.workdir) if n != b"select"]
        at = names.index(b"multi")
        assert names[at:at + 4] == [b"multi", b"set", b"incr", b"exec"], names
        assert not {b"shard.exec", b"shard.watch", b"shard.txn"} & set(names), names


def test_the_decision_waits_for_replicas_as_they_come_and_go(fleet, server_factory):
    """No replica: no WAIT; a replica online: the decision's WAIT 1; the replica gone: no
    WAIT again (a WAIT with no replica would fail the commit after 2 s)."""
    primary = fleet["n0"]
    c = primary.client()
    a, b = fleet.key_of("n1", prefix="rw"), fleet.key_of("n2", prefix="rw")
    assert run_queued(c, [("INCR", a), ("INCR", b)]) == [1, 1]
    assert command_calls(primary, "wait") == 0
    replica = server_factory(module_args=["self", "n0", "call-timeout-ms", 2000],
                             config=[("replicaof", "127.0.0.1", primary.port)])
    wait_in_sync(c, replica.client())
    until(lambda: (c.info("replication").get("slave0") or {}).get("state") == "online",
          "the replica online")
    assert run_queued(c, [("INCR", a), ("INCR", b)]) == [2, 2]
    assert command_calls(primary, "wait") == 1
    replica.stop()
    until(lambda: c.info("replication")["connected_slaves"] == 0, "the replica gone")
    assert run_queued(c, [("INCR", a), ("INCR", b)]) == [3, 3]
    assert command_calls(primary, "wait") == 1
