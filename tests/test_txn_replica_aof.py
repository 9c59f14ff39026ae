"""An owner's records in its replica's own AOF (issue 35, found by the bank under faults at ten
times its size: transfers applied twice at one account, on Valkey). A replica records a part
prepared, committed or aborted at its primary as the primary's stream replays SHARD.TXN
PREPARE / COMMIT / ABORT; a module command run from the stream reaches the replica's own AOF
only if it replicates itself, and these did not: the replica's AOF held the block's writes but
not the record's end. A replica whose AOF base held the part prepared (a rewrite, or the
primary's RDB reused as its base after a full sync, as Valkey does), restarted from its AOF
(promoted, then killed, in the bank), had the part prepared again, asked its coordinator, heard
`commit`, and applied it a second time.
"""

import signal

import pytest

from helpers.fleet import make_fleet
from helpers.server import AOF, info_shard, until, wait_in_sync
from helpers.txn import Exec, call, held, hold
from test_txn_faults import LONG_MS, prepared_txid


@pytest.fixture
def fleet(server_factory):
    f = make_fleet(server_factory, timeout_ms=1000,
                   config=[("enable-debug-command", "yes"), *AOF])
    f.client("n0").config_set("shard.txn-lock-ms", LONG_MS)
    primary = f["n1"]
    f.replica = server_factory(module_args=["self", "n1", "call-timeout-ms", 1000],
                               config=[*AOF, ("replicaof", "127.0.0.1", primary.port)])
    wait_in_sync(primary.client(), f.replica.client())
    return f


def rewritten(client):
    """Waits until no AOF rewrite of `client`'s server runs or is scheduled."""
    until(lambda: client.info("persistence")["aof_rewrite_in_progress"] == 0
          and client.info("persistence")["aof_rewrite_scheduled"] == 0, "the AOF rewrite done")


def test_a_replica_restarted_from_its_aof_holds_the_end_of_a_part(fleet):
    p, r = fleet.client("n1"), fleet.replica.client()
    rewritten(r)
    a, b = fleet.key_of("n1", prefix="acct"), fleet.key_of("n2", prefix="acct")
    n0 = fleet.client("n0")
    call(n0, "MSET", a, 100, b, 100)
    hold(n0, "prepared")
    ex = Exec(fleet["n0"], [("DECRBY", a, 30), ("INCRBY", b, 30)])
    until(lambda: held(n0) == 1, "the transaction waits at the hold")
    wait_in_sync(p, r)
    assert info_shard(r)["txn_locks_held"] == "1", "the replica records the prepared part"
    # The replica's AOF base holds the part prepared.
    assert r.execute_command("BGREWRITEAOF")
    rewritten(r)
    hold(n0, "OFF")
    assert ex.join() == [70, 130]
    wait_in_sync(p, r)
    assert r.get(a) == b"70" and info_shard(r)["txn_locks_held"] == "0"
    txid = prepared_txid(fleet["n1"])
    # Restarted from its own AOF alone (not resynced from its primary): the part is ended and
    # done there too (the previous build: prepared again, locked, and a COMMIT applied it again).
    replica = fleet.replica
    replica.stop(signal.SIGKILL)
    replica.config = [x for x in replica.config if x[0] != "replicaof"]
    replica.start()
    r = replica.client()
    assert info_shard(r)["txn_locks_held"] == "0"
    assert r.execute_command("SHARD.TXN", "COMMIT", txid) == b"DONE"
    assert r.get(a) == b"70"
