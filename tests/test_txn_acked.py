"""An owner's block acknowledged by its replica (issue 35, docs/transactions.md, "Durable at
the owner"): when the owner has a replica online, its reply to COMMIT (two owners), to APPLY
(one owner, another node) and the client's reply to a block run inside SHARD.EXEC at the
owner itself wait until one replica has the block (`WAIT 1` at the owner), so that the
replica promoted right after the reply holds the transaction's writes. A replica that does not
acknowledge a COMMIT within the bound (stopped): the part stays applied, counted in `INFO
shard`'s `txn_unacked`, and the owner answers `APPLIED` (not confirmed): the coordinator keeps
its decision and sends the COMMIT again until the replica has it. A single owner's block
(APPLY, or local) not acknowledged in time is answered `NOREPLICAS the transaction is applied
...` (before: its replies, as if a replica had it).

n1 has a replica; n0 and n2 have none.
"""

import signal
import time

import pytest
import redis

from helpers.fleet import make_fleet
from helpers.server import command_calls, info_shard, until, wait_in_sync

# The owner's bound on the wait (txn::owner::acked::REPLICA_WAIT_MS).
BOUND_S = 2.0


def call(c, *args):
    return c.execute_command("SHARD.CALL", *args)


def run_queued(c, commands):
    assert c.execute_command("SHARD.MULTI") == b"OK"
    for command in commands:
        assert call(c, *command) == b"QUEUED", command
    return c.execute_command("SHARD.EXEC")


@pytest.fixture
def fleet(server_factory):
    f = make_fleet(server_factory, timeout_ms=1000)
    primary = f["n1"]
    replica = server_factory(module_args=["self", "n1", "call-timeout-ms", 1000],
                             config=[("replicaof", "127.0.0.1", primary.port)])
    c = primary.client()
    wait_in_sync(c, replica.client())
    until(lambda: (c.info("replication").get("slave0") or {}).get("state") == "online",
          "n1's replica online")
    f.replica = replica
    return f


# The three ways a block reaches n1: (the node the client is connected to, the owners).
PATHS = {
    "commit": ("n0", ("n1", "n2")),  # two owners: PREPARE, then COMMIT at n1
    "apply": ("n0", ("n1",)),  # one owner, another node: SHARD.TXN APPLY at n1
    "local": ("n1", ("n1",)),  # one owner, the node itself: run inside SHARD.EXEC
}


def transfer_keys(fleet, owners):
    keys = [fleet.key_of(owners[0], prefix="from"), fleet.key_of(owners[-1], prefix="to")]
    fleet.client("n0").execute_command("SHARD.CALL", "MSET", keys[0], 100, keys[1], 100)
    return keys


@pytest.mark.parametrize("path", sorted(PATHS))
def test_the_promoted_replica_holds_a_block_the_owner_acknowledged(fleet, path):
    via, owners = PATHS[path]
    a, b = transfer_keys(fleet, owners)
    n1 = fleet["n1"]
    waits = command_calls(n1, "wait")
    c = fleet.client(via)
    assert run_queued(c, [("DECRBY", a, 30), ("INCRBY", b, 30)]) == [70, 130]
    # n1 waited for its replica before it answered (the previous build: no WAIT at n1).
    assert command_calls(n1, "wait") == waits + 1
    assert info_shard(n1.client())["txn_unacked"] == "0"
    # A read-only block writes nothing to wait for.
    assert run_queued(c, [("GET", a)]) == [b"70"]
    assert command_calls(n1, "wait") == waits + 1
    # The owner's primary killed right after the reply, its replica promoted: the block is
    # there.
    assert run_queued(c, [("DECRBY", a, 5), ("INCRBY", b, 5)]) == [65, 135]
    n1.stop(signal.SIGKILL)
    r = fleet.replica.client()
    assert r.execute_command("REPLICAOF", "NO", "ONE") == b"OK"
    assert r.get(a) == b"65"
    if owners == ("n1",):
        assert r.get(b) == b"135"


def test_a_replica_that_does_not_acknowledge_leaves_the_commit_unconfirmed(fleet):
    """COMMIT at n1 whose replica is stopped: n1 applies its part, waits the bound in vain and
    answers `APPLIED` (not confirmed); the client is told the transaction committed but is not
    confirmed, and the coordinator keeps its decision and sends the COMMIT again until n1's
    replica has the part: then `DONE`, and the decision is forgotten."""
    a, b = transfer_keys(fleet, ("n1", "n2"))
    n1 = fleet["n1"].client()
    c = fleet.client("n0")
    fleet.replica.proc.send_signal(signal.SIGSTOP)
    try:
        start = time.monotonic()
        with pytest.raises(redis.ResponseError, match="has not confirmed its part yet.*APPLIED"):
            run_queued(c, [("DECRBY", a, 30), ("INCRBY", b, 30)])
        waited = time.monotonic() - start
        # The reply came once the bound passed (no replica could acknowledge), the block
        # applied at the primary and counted; the decision kept.
        assert waited >= BOUND_S, waited
        assert n1.get(a) == b"70" and fleet.client("n2").get(b) == b"130"
        assert int(info_shard(n1)["txn_unacked"]) >= 1
        assert info_shard(c)["txn_decisions_held"] == "1"
    finally:
        fleet.replica.proc.send_signal(signal.SIGCONT)
    # The replica back: the COMMIT sent again is answered DONE, the decision forgotten.
    until(lambda: info_shard(c)["txn_decisions_held"] == "0", "the decision forgotten",
          timeout=30)
    wait_in_sync(n1, fleet.replica.client())
    assert n1.get(a) == b"70" and fleet.replica.client().get(a) == b"70", "applied once"
    unacked = info_shard(n1)["txn_unacked"]
    assert run_queued(c, [("DECRBY", a, 1), ("INCRBY", b, 1)]) == [69, 131]
    assert info_shard(n1)["txn_unacked"] == unacked
    assert fleet.replica.client().get(a) == b"69"


@pytest.mark.parametrize("path", ["apply", "local"])
def test_a_single_owner_block_no_replica_acknowledged_is_unconfirmed(fleet, path):
    """One owner's block (`APPLY` from n0, or run inside `SHARD.EXEC` at n1) while n1's replica
    is stopped, its link kept: n1 waits for it in vain, then (before: replied the commands'
    replies, acknowledged as if a replica had the block) replies `NOREPLICAS the transaction is applied at node n1 ...`: applied at
    n1, counted in `txn_unacked`, not confirmed by a replica; nothing sends it again, so it is
    applied once. With the replica back, the next block is acknowledged as before."""
    via, owners = PATHS[path]
    a, b = transfer_keys(fleet, owners)
    n1 = fleet["n1"].client()
    c = fleet.client(via)
    unacked = int(info_shard(n1)["txn_unacked"])
    fleet.replica.proc.send_signal(signal.SIGSTOP)
    try:
        with pytest.raises(redis.ResponseError) as e:
            run_queued(c, [("DECRBY", a, 30), ("INCRBY", b, 30)])
        assert str(e.value).startswith("NOREPLICAS the transaction is applied at node n1"), e
        assert "no replica acknowledged it within 2000 ms" in str(e.value), e
        assert n1.mget(a, b) == [b"70", b"130"]
        assert int(info_shard(n1)["txn_unacked"]) == unacked + 1
    finally:
        fleet.replica.proc.send_signal(signal.SIGCONT)
    wait_in_sync(n1, fleet.replica.client())
    assert fleet.replica.client().mget(a, b) == [b"70", b"130"], "applied once"
    assert run_queued(c, [("DECRBY", a, 1), ("INCRBY", b, 1)]) == [69, 131]


def test_a_decision_no_replica_acknowledged_waits_for_one(fleet):
    """The coordinator's decision no replica acknowledged within the bound: n1 coordinates a
    transfer over n0 and n2 while its replica is stopped (link kept). SHARD.EXEC replies that
    the commit is recorded but not acknowledged; the decision is then answered `pending` to the
    owners in doubt and not carried out (before: `commit`, so owners applied a decision a
    failover of n1 to that replica would lose, and the others asked the promoted one, which
    answered abort). Once the replica is back and has it, the commit is carried out at both
    owners."""
    c = fleet.client("n1")
    a, b = fleet.key_of("n0", prefix="from"), fleet.key_of("n2", prefix="to")
    c.execute_command("SHARD.CALL", "MSET", a, 100, b, 100)
    fleet.replica.proc.send_signal(signal.SIGSTOP)
    try:
        with pytest.raises(redis.ResponseError, match="is recorded, but no replica") as e:
            run_queued(c, [("DECRBY", a, 30), ("INCRBY", b, 30)])
        txid = str(e.value).split("the commit of transaction ")[1].split()[0]
        assert c.execute_command("SHARD.TXN", "STATUS", txid) == b"pending"
        assert info_shard(c)["txn_decisions_held"] == "1"
    finally:
        fleet.replica.proc.send_signal(signal.SIGCONT)
    until(lambda: info_shard(c)["txn_decisions_held"] == "0", "the commit carried out",
          timeout=30)
    assert c.execute_command("SHARD.TXN", "STATUS", txid) == b"commit"
    assert fleet.client("n0").get(a) == b"70" and fleet.client("n2").get(b) == b"130"
