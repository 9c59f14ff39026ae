"""Writes paused by a partition (issue 44's README row "the servers stay up while their writes
are paused", its partitions column): an operator's `FAILOVER TO <replica> TIMEOUT ms` pauses
the primary's writes until the replica has caught up, and a replica cut off never catches up,
so the primary stays paused until the timeout, then aborts the failover and writes again. Its
module's writers run across that window: a resharding's cleanup (deletes from a module timer)
and a transaction it coordinates, held after both owners prepared and let go in the pause (its
decision, sent to itself as a command, which the server holds until the pause ends). The server
stays up (Redis 7.0 and Valkey exit on a write propagated while paused), nothing of theirs is
written in the pause, and both end once it is over: the cleanup at once; the transaction
commits once its decision is recorded, acknowledged by the replica after the heal (until then
the client is told it is recorded but not acknowledged: `WAIT 1` cannot reach the cut replica),
applied at both owners exactly once. After the heal the replica holds what the primary holds.
"""

import time

import pytest

from helpers.fleet import Fleet, owners
from helpers.reshard import status, wait_job
from helpers.server import AOF, info_shard, until, wait_in_sync
from helpers.txn import Exec, call, held, hold

pytestmark = pytest.mark.slow

PAUSE_MS = 4000


def ring_args(fleet, names):
    return [x for n in names for x in (n, f"{fleet[n].host}:{fleet[n].port}", 1)]


def failover_state(client):
    return client.info("replication").get("master_failover_state")


def test_a_failover_to_a_cut_off_replica_pauses_the_module_s_writes_until_it_aborts(
        server_factory, partition):
    fleet = Fleet()
    for n in ("a", "b", "c"):
        fleet[n] = server_factory(module_args=["self", n, "call-timeout-ms", 4 * PAUSE_MS],
                                  config=[*AOF, ("enable-debug-command", "yes")],
                                  host=partition.addresses.next())
    replica = server_factory(module_args=["self", "a"],
                             config=[*AOF, ("replicaof", fleet["a"].host, fleet["a"].port)],
                             host=partition.addresses.next())
    a = fleet.client("a")
    wait_in_sync(a, replica.client())
    for n in ("a", "b", "c"):
        fleet.client(n).execute_command("SHARD.RING", "SET", "ketama",
                                        *ring_args(fleet, ["a", "b", "c"]))
    # A transfer between b and c, coordinated by a, and keys of a's that a cleanup deletes.
    x = next(k for k in (f"acct:{i}" for i in range(1000)) if owners(a, [k]) == ["b"])
    y = next(k for k in (f"acct:{i}" for i in range(1000)) if owners(a, [k]) == ["c"])
    call(a, "MSET", x, 100, y, 100)
    a.execute_command("SHARD.RING", "SET", "ketama", *ring_args(fleet, ["a"]))
    pipe = a.pipeline(transaction=False)
    for i in range(4000):
        pipe.set(f"k{i}", i)
    pipe.execute()
    a.execute_command("SHARD.RING", "SET", "ketama", *ring_args(fleet, ["a", "b", "c"]))
    wait_in_sync(a, replica.client())
    assert a.execute_command("SHARD.RESHARD", "CLEANUP") == b"OK"
    a.execute_command("SHARD.RESHARD", "THROTTLE", 500)
    until(lambda: status(a)["deleted"] > 0, "the cleanup deleting")
    hold(a, "prepared")
    ex = Exec(fleet["a"], [("DECRBY", x, 30), ("INCRBY", y, 30)])
    until(lambda: held(a) == 1, "the transaction prepared at b and c, held at a")

    partition.cut(fleet["a"], replica)
    assert a.execute_command("FAILOVER", "TO", replica.host, replica.port,
                             "TIMEOUT", PAUSE_MS) == b"OK"
    paused_at = time.monotonic()
    until(lambda: failover_state(a) == "waiting-for-sync", "a's writes paused by the failover")
    during = status(a)["deleted"]
    # (SHARD.DEBUG writes nothing: the server runs it in the pause.)
    hold(a, "OFF")
    time.sleep(PAUSE_MS / 2000)
    assert a.ping(), "the server died while its writes were paused"
    assert failover_state(a) == "waiting-for-sync"
    # Nothing deleted in the pause (a step under way as it began: a batch at most).
    assert status(a)["deleted"] - during <= 128, status(a)

    # The failover times out (the replica never caught up): aborted, writes go on.
    until(lambda: failover_state(a) == "no-failover", "the failover aborted at its timeout",
          timeout=PAUSE_MS / 1000 + 10)
    assert time.monotonic() - paused_at >= PAUSE_MS / 1000 - 0.5
    assert a.execute_command("ROLE")[0] == b"master"
    result = ex.join()
    if result != [70, 130]:
        assert "no replica of this node acknowledged it" in str(result), result
    try:
        a.execute_command("SHARD.RESHARD", "THROTTLE", 0)
    except Exception as e:  # (ended meanwhile on a slow machine)
        assert "no resharding job is running" in str(e), e
    st = wait_job(a)
    assert st["state"] == b"done" and st["failed"] == 0, st
    left = sorted(k.decode() for k in a.keys("k*"))
    assert left and set(owners(a, left)) == {"a"}, "a keeps only its own keys"

    # Healed: the replica catches up with everything a did, in the pause's wake too.
    partition.heal()
    until(lambda: info_shard(a)["txn_decisions_held"] == "0",
          "the decision carried out and forgotten", timeout=60)
    assert call(a, "MGET", x, y) == [b"70", b"130"], "applied once at both owners"
    r = replica.client()
    wait_in_sync(a, r, timeout=60)
    assert sorted(k.decode() for k in r.keys("k*")) == left
    assert a.ping()
