"""Transactions across nodes when an owner fails over after PREPARE (issue 35,
docs/transactions.md): three shards of a primary and a replica behind three sentinels; the
coordinator (n0's primary) is held by `SHARD.DEBUG TXN-HOLD` once both owners prepared, or once
the commit is decided; n1's primary is killed (or failed over by `SENTINEL FAILOVER`) and
Sentinel promotes its replica; then the coordinator goes on:

- the promoted replica holds the prepared part (replicated with PREPARE): the part is still
  locked there, and the COMMIT applies it;
- the promoted replica does not hold it (the record never reached it: dropped on the promoted
  replica by `SHARD.TXN ABORT`, which leaves the state of a replica that never got the
  PREPARE): the COMMIT carries the part and applies it.

Either way the transfer is applied exactly once on both owners, and confirmed (the decision
forgotten) only once a replica of n1's promoted server has it.

A part that n1's primary applied but no replica acknowledged (its replica stopped, its link
dropped or not) is not confirmed (`APPLIED`): the coordinator keeps the decision and sends the
COMMIT with the part again to the promoted stale replica (the nemesis's transaction applied at
one owner only).
"""

import signal

import pytest
import redis

from helpers.fleet import ring_of
from helpers.reshard import wait_fleet
from helpers.sentinel import start_sentinel_fleet
from helpers.server import AOF, info_shard, until, wait_in_sync
from helpers.txn import Exec, call, held, hold, prepares_of
from test_txn_faults import LONG_MS


@pytest.fixture
def ha(server_factory, sentinel_factory):
    fleet = start_sentinel_fleet(server_factory, sentinel_factory,
                                 extra=[("enable-debug-command", "yes"),
                                        ("shard.txn-lock-ms", LONG_MS)])
    return fleet


def promoted(fleet, n, via):
    """Waits until Sentinel promoted n's replica and `via` routes n's keys to it."""
    replica = fleet.replicas[n]
    # 60 s: a failover attempt Sentinel aborts (no replica it counts good yet, e.g. one just
    # continued from SIGSTOP whose INFO is stale) is tried again only after 2 x failover-timeout.
    until(lambda: replica.client().execute_command("ROLE")[0] == b"master",
          f"{n}'s replica promoted", timeout=60)
    probe = fleet.keys_of(via, n, 1, prefix="probe")[0]
    until(lambda: call(via, "SET", probe, replica.port) == b"OK"
          and replica.client().get(probe) == str(replica.port).encode(),
          f"{n}'s keys routed to its promoted replica", timeout=30)
    return replica.client()


def confirmed_or_not_yet(result):
    """The transfer's reply: its replies, or (the owner's old primary killed: the promoted one
    has no replica linked while Sentinel lists it) applied but not confirmed yet."""
    if result == [70, 130]:
        return True
    return (isinstance(result, redis.ResponseError)
            and "has not confirmed its part yet" in str(result) and "APPLIED" in str(result))


def back_as_replica(fleet, server):
    """`server` (a primary killed) started again, given the sentinels, and made a replica of the
    primary Sentinel names for its shard, as Sentinel itself does (`REPLICAOF`, here at once:
    Sentinel demotes a returned primary only once an INFO, every 10 s for a replica in its
    view, has shown it a master for 8 s with no down time, `SENTINEL_PUBLISH_PERIOD*4` in
    sentinel.c; on a loaded machine it took over 60 s once)."""
    shard = next(n for n in fleet.primaries if server in (fleet.primaries[n], fleet.replicas[n]))
    server.start()
    c = server.client()
    c.config_set("shard.sentinels", " ".join(s.address for s in fleet.sentinels))
    host, port = fleet.sentinels[0].client().execute_command(
        "SENTINEL", "GET-MASTER-ADDR-BY-NAME", shard)
    if int(port) != server.port:
        c.execute_command("REPLICAOF", host.decode(), int(port))
    until(lambda: c.execute_command("ROLE")[0] == b"slave", "the old primary demoted",
          timeout=60)


def pair_now(fleet, n):
    """(primary, replica) clients of shard `n` as Sentinel names them now."""
    def named():
        port = int(fleet.sentinels[0].client().execute_command(
            "SENTINEL", "GET-MASTER-ADDR-BY-NAME", n)[1])
        pair = (fleet.primaries[n], fleet.replicas[n])
        primary = next(s for s in pair if s.port == port)
        other = next(s for s in pair if s.port != port)
        if primary.client().execute_command("ROLE")[0] != b"master":
            return None
        return primary.client(), other.client()
    return until(named, f"{n}'s primary as Sentinel names it", timeout=60)


def start_transfer(fleet, step):
    c = fleet.primaries["n0"].client()
    a = fleet.keys_of(c, "n1", 1, prefix="acct")[0]
    b = fleet.keys_of(c, "n2", 1, prefix="acct")[0]
    call(c, "MSET", a, 100, b, 100)
    hold(c, step)
    ex = Exec(fleet.primaries["n0"], [("DECRBY", a, 30), ("INCRBY", b, 30)])
    until(lambda: held(c) == 1, "the transaction waits at the hold")
    return c, a, b, ex


def restart_unseen(fleet, name):
    """Kills `name`'s primary and starts it again from its AOF while every sentinel is paused,
    so that none fails it over meanwhile."""
    for s in fleet.sentinels:
        s.proc.send_signal(signal.SIGSTOP)
    try:
        fleet.primaries[name].stop(signal.SIGKILL)
        fleet.primaries[name].start()
    finally:
        for s in fleet.sentinels:
            s.proc.send_signal(signal.SIGCONT)


@pytest.mark.parametrize("how", ["kill", "sentinel-failover"])
def test_the_promoted_replica_holds_the_prepared_part(ha, how):
    c, a, b, ex = start_transfer(ha, "prepared")
    old, replica = ha.primaries["n1"], ha.replicas["n1"]
    wait_in_sync(old.client(), replica.client())
    assert info_shard(replica.client())["txn_locks_held"] == "1", "a replica records the part"
    if how == "kill":
        old.stop(signal.SIGKILL)
    else:
        assert ha.sentinels[0].client().execute_command("SENTINEL", "FAILOVER", "n1") == b"OK"
    new = promoted(ha, "n1", c)
    assert info_shard(new)["txn_locks_held"] == "1", "still locked after the promotion"
    hold(c, "OFF")
    assert confirmed_or_not_yet(ex.join())
    until(lambda: new.get(a) == b"70", "applied at the promoted replica")
    assert ha.primaries["n2"].client().get(b) == b"130"
    if how == "kill":
        # Confirmed once a replica of n1 has it: its old primary back as its replica.
        back_as_replica(ha, old)
    until(lambda: info_shard(new)["txn_locks_held"] == "0"
          and info_shard(c)["txn_decisions_held"] == "0", "no lock, no decision left",
          timeout=30)
    if how == "sentinel-failover":
        # The old primary, now its replica, holds the same: applied once, no lock.
        demoted = old.client()
        # (Sentinel demotes it as it does a returned primary: see back_as_replica.)
        until(lambda: demoted.execute_command("ROLE")[0] == b"slave", "n1's old primary demoted",
              timeout=60)
        wait_in_sync(new, demoted, timeout=30)
        assert demoted.get(a) == b"70" and info_shard(demoted)["txn_locks_held"] == "0"


def test_the_promoted_replica_gets_the_part_with_the_commit(ha):
    c, a, b, ex = start_transfer(ha, "decided")
    old = ha.primaries["n1"]
    wait_in_sync(old.client(), ha.replicas["n1"].client())
    old.stop(signal.SIGKILL)
    new = promoted(ha, "n1", c)
    # The record dropped, as if it never reached the replica: no prepared part, no lock.
    assert info_shard(new)["txn_locks_held"] == "1"
    new.config_set("shard.txn-lock-ms", 1)
    with pytest.raises(redis.ResponseError, match="^TRYAGAIN") as e:
        new.get(a)
    new.config_set("shard.txn-lock-ms", LONG_MS)
    txid = next(w.strip("()'") for w in str(e.value).split() if w.strip("()'").startswith("n0/"))
    assert new.execute_command("SHARD.TXN", "ABORT", txid) == b"OK"
    assert info_shard(new)["txn_locks_held"] == "0" and new.get(a) == b"100"
    hold(c, "OFF")
    assert confirmed_or_not_yet(ex.join())
    until(lambda: new.get(a) == b"70", "applied at the promoted replica")
    assert ha.primaries["n2"].client().get(b) == b"130"
    # Not confirmed while n1 has no replica linked (Sentinel lists its old primary, down).
    with pytest.raises(redis.ResponseError, match="^APPLIED"):
        new.execute_command("SHARD.TXN", "COMMIT", txid)
    back_as_replica(ha, old)
    until(lambda: info_shard(c)["txn_decisions_held"] == "0", "the decision forgotten",
          timeout=30)
    assert new.execute_command("SHARD.TXN", "COMMIT", txid) == b"DONE"
    assert new.get(a) == b"70", "applied once"


@pytest.mark.slow
def test_a_coordinator_failed_over_then_shrunk_out_is_asked_at_the_primary_its_old_one_follows(
        server_factory, sentinel_factory):
    """n0's primary coordinates a transfer, held once both owners prepared; Sentinel fails n0
    over (its old primary becomes a replica), a shrink takes n0 out of the ring, and n1's
    primary restarts from its AOF (the sentinels paused: no failover; and it is given no
    sentinels, as a server whose `shard.sentinels` is set at run time comes back): no ring
    there names n0, nor does Sentinel's table, so once its lock is over its part in doubt asks
    the address n0's PREPARE gave, now a replica, which refuses `STATUS` with `READONLY`. It
    then asks the primary that replica follows (n0's promoted server), which answers for n0:
    abort (presumed). Before, the part stayed in doubt and locked for ever. The parts lock for
    25 s: long enough that none is in doubt before the restart (n1's lock counts again from its
    load)."""
    fleet = start_sentinel_fleet(server_factory, sentinel_factory,
                                 extra=[("enable-debug-command", "yes"),
                                        ("shard.txn-lock-ms", 25_000), *AOF])
    c, a, b, ex = start_transfer(fleet, "prepared")
    n1, n2 = fleet.primaries["n1"].client(), fleet.primaries["n2"].client()
    assert [info_shard(x)["txn_locks_held"] for x in (n1, n2)] == ["1", "1"]
    old, new = fleet.primaries["n0"], fleet.replicas["n0"]
    wait_in_sync(old.client(), new.client())
    assert fleet.sentinels[0].client().execute_command("SENTINEL", "FAILOVER", "n0") == b"OK"
    new_address = f"127.0.0.1:{new.port}"
    for x in (n1, n2):
        until(lambda: info_shard(x)["node_n0_address"] == new_address, "n0's promotion followed",
              timeout=30)
    until(lambda: old.client().execute_command("ROLE")[0] == b"slave", "n0's old primary demoted",
          timeout=60)  # as a returned primary is (back_as_replica)
    shrunk = ["ketama", *[x for m in ("n1", "n2") for x in (m, "sentinel", 1)]]
    assert n1.execute_command("SHARD.RESHARD", "START", *shrunk) == b"OK"
    wait_fleet(n1, "done", timeout=60)
    assert info_shard(n1)["txn_locks_held"] == "1", "n1's part ended before the restart"
    # n1's primary restarts from its AOF, holding the part with the address n0 had.
    restart_unseen(fleet, "n1")
    n1 = fleet.primaries["n1"].client()
    assert info_shard(n1)["txn_locks_held"] == "1"
    until(lambda: info_shard(n1)["txn_locks_held"] == "0" and info_shard(n2)["txn_locks_held"]
          == "0", "both parts ended", timeout=60)
    assert n1.get(a) == b"100" and n2.get(b) == b"100", "aborted: nothing applied"



@pytest.mark.slow
def test_a_coordinator_no_ring_names_is_found_through_sentinel(server_factory, sentinel_factory):
    """The nemesis's parts in doubt for ever (seed 2054124654): a shrink takes n0 out of the
    ring, and n0's primary, which clients still used, coordinated a transfer between n1 and n2.
    No ring at n0 named it, so its PREPAREs gave no address (`FROM`). n0 now refuses to
    coordinate out of the ring (checked here too); the PREPAREs it sent then (as a coordinator
    of an older build still sends them) are sent by hand, n0's txid, no `FROM`. n1's primary
    restarts from its AOF (the sentinels paused: no failover), so no ring nor Sentinel's table
    there names n0 either (its AOF rewritten after the shrink, it restarts from the shrunk
    ring). Once its lock is over, n1's part in doubt has Sentinel asked for n0 by name and asks
    the primary it gives, which answers abort (presumed: it holds no such transaction). Before,
    n1 asked nobody and the part stayed locked and in doubt for ever. (A second fleet
    operation, between n1 and n2, leaves no plan naming n0 at n1, as in the nemesis.)"""
    fleet = start_sentinel_fleet(server_factory, sentinel_factory,
                                 extra=[("enable-debug-command", "yes"),
                                        ("shard.txn-lock-ms", 8000), *AOF])
    n1 = fleet.primaries["n1"].client()
    shrunk = ["ketama", *[x for m in ("n1", "n2") for x in (m, "sentinel", 1)]]
    assert n1.execute_command("SHARD.RESHARD", "START", *shrunk) == b"OK"
    wait_fleet(n1, "done", timeout=60)
    c = fleet.primaries["n0"].client()
    until(lambda: info_shard(c)["ring_digest"] == info_shard(n1)["ring_digest"],
          "n0 holds the ring without it", timeout=30)
    # Another fleet operation, between n1 and n2 only: the plan the servers keep names n0 no
    # more (the watcher watches a plan's rings too).
    reweighted = ["ketama", "n1", "sentinel", 1, "n2", "sentinel", 2]
    assert n1.execute_command("SHARD.RESHARD", "START", *reweighted) == b"OK"
    wait_fleet(n1, "done", timeout=60)
    # n1's AOF rewritten: it restarts from the shrunk ring, never having watched n0 since.
    assert n1.execute_command("BGREWRITEAOF")
    until(lambda: all(n1.info("persistence")[k] == 0 for k in
                      ("aof_rewrite_in_progress", "aof_rewrite_scheduled")), "n1's AOF rewritten")
    a = fleet.keys_of(n1, "n1", 1, prefix="acct")[0]
    b = fleet.keys_of(n1, "n2", 1, prefix="acct")[0]
    call(n1, "MSET", a, 100, b, 100)
    # n0, out of the ring, coordinates no transfer now: refused before any PREPARE.
    assert c.execute_command("SHARD.MULTI") == b"OK"
    assert call(c, "DECRBY", a, 30) == b"QUEUED" and call(c, "INCRBY", b, 30) == b"QUEUED"
    with pytest.raises(redis.ResponseError, match="^shard.txn: node n0 is not in the ring"):
        c.execute_command("SHARD.EXEC")
    n2 = fleet.primaries["n2"].client()
    txid = "n0/7f00000001"
    for owner, part in ((n1, ("DECRBY", a, 30)), (n2, ("INCRBY", b, 30))):
        assert owner.execute_command("SHARD.TXN", "PREPARE", txid, 8000, 0, 1, len(part),
                                     *part) == b"PREPARED"
    assert [info_shard(x)["txn_locks_held"] for x in (n1, n2)] == ["1", "1"]
    restart_unseen(fleet, "n1")
    n1 = fleet.primaries["n1"].client()
    n1.config_set("shard.sentinels", " ".join(s.address for s in fleet.sentinels))
    assert info_shard(n1)["txn_locks_held"] == "1"
    # No ring n1 holds names n0: the part can end only by asking Sentinel for it.
    ring = ring_of(n1)
    assert ring["previous"] is None, ring
    assert b"n0" not in [m["name"] for m in ring["nodes"]], ring
    until(lambda: info_shard(n1)["txn_locks_held"] == "0" and info_shard(n2)["txn_locks_held"]
          == "0", "both parts ended", timeout=40)
    assert n1.get(a) == b"100" and n2.get(b) == b"100", "aborted: nothing applied"


@pytest.mark.parametrize("how", ["link-dropped", "stopped"])
def test_a_part_no_replica_acknowledged_is_sent_again_to_the_promoted_replica(
        server_factory, sentinel_factory, how):
    """The nemesis's case (Redis seed 1218370420, t1976 in `tx:2`, not in `tx:0`, after
    `cut_primary n2`): n1's replica stopped before the transfer, so it gets neither the
    PREPARE nor the COMMIT, its link to n1's primary either dropped (n1 then has no replica
    linked, while Sentinel lists one: before, it confirmed at once) or kept (`stopped`: n1
    waits 2 s for it, in vain, and confirmed all the same; the replica is then restarted from
    its AOF, without the part, as a stopped process's socket would still hand it the bytes
    sent meanwhile). n1's primary is killed and Sentinel promotes that stale replica. Before,
    the coordinator had counted n1's part applied and forgotten the decision: the transfer
    stood at n2 only. Now n1 answers `APPLIED` (not confirmed), the coordinator keeps the
    decision and sends the COMMIT with the part again, to the promoted replica, which applies
    it; that one, with no replica linked while Sentinel lists n1's old primary, answers
    `APPLIED` again until that server is back as its replica and has the part: then `DONE`, and
    the decision is forgotten. Applied once at both owners."""
    ha = start_sentinel_fleet(server_factory, sentinel_factory,
                              extra=[("enable-debug-command", "yes"),
                                     ("shard.txn-lock-ms", LONG_MS), *AOF])
    c = ha.primaries["n0"].client()
    a = ha.keys_of(c, "n1", 1, prefix="acct")[0]
    b = ha.keys_of(c, "n2", 1, prefix="acct")[0]
    call(c, "MSET", a, 100, b, 100)
    old, replica = ha.primaries["n1"], ha.replicas["n1"]
    wait_in_sync(old.client(), replica.client())
    replica.proc.send_signal(signal.SIGSTOP)
    try:
        if how == "link-dropped":
            assert old.client().execute_command("CLIENT", "KILL", "TYPE", "replica") == 1
            until(lambda: old.client().info("replication")["connected_slaves"] == 0,
                  "n1's replica link dropped")
        hold(c, "prepared")
        ex = Exec(ha.primaries["n0"], [("DECRBY", a, 30), ("INCRBY", b, 30)])
        until(lambda: held(c) == 1, "both owners prepared, n1's replica stopped")
        hold(c, "OFF")
        result = ex.join()
        assert old.client().get(a) == b"70" and ha.primaries["n2"].client().get(b) == b"130"
        kept = info_shard(c)["txn_decisions_held"]
        old.stop(signal.SIGKILL)
        if how == "stopped":
            replica.stop(signal.SIGKILL)
            replica.start()
            # (`shard.sentinels` was set at run time: not in the restarted server's config.)
            replica.client().config_set("shard.sentinels",
                                        " ".join(s.address for s in ha.sentinels))
    finally:
        if replica.proc and replica.proc.poll() is None:
            replica.proc.send_signal(signal.SIGCONT)
    assert replica.client().get(a) == b"100", "n1's replica lacks the part"
    new = promoted(ha, "n1", c)
    # The promoted replica lacked the part; the COMMIT sent again carried it (before: 100
    # there, 130 at n2, for good).
    until(lambda: new.get(a) == b"70", "the part applied at n1's promoted replica", timeout=30)
    assert ha.primaries["n2"].client().get(b) == b"130"
    # Applied at n1's primary, which no replica acknowledged: not confirmed, the decision kept.
    assert isinstance(result, redis.ResponseError), result
    assert "has not confirmed its part yet" in str(result) and "APPLIED" in str(result)
    assert kept == "1", "the decision is kept"
    # No replica of n1 has it yet (its old primary, which Sentinel lists, is down).
    assert info_shard(c)["txn_decisions_held"] == "1"
    back_as_replica(ha, old)
    until(lambda: info_shard(c)["txn_decisions_held"] == "0", "the decision forgotten",
          timeout=30)
    # Both of n1's servers in sync, whichever Sentinel names primary now (down-after is 1 s: on
    # a loaded machine it may fail n1 over again, back to its old primary).
    primary, other = pair_now(ha, "n1")
    wait_in_sync(primary, other, timeout=30)
    assert new.get(a) == b"70" and old.client().get(a) == b"70", "applied once"
    assert ha.primaries["n2"].client().get(b) == b"130"
    assert info_shard(new)["txn_locks_held"] == "0"


@pytest.mark.parametrize("via", ["n0", "n1"])
def test_a_single_owner_block_no_replica_has_is_not_acknowledged(
        server_factory, sentinel_factory, via):
    """The nemesis's "acknowledged, lost" (Redis seed 818825495: 119 in 600 s, each of one
    owner, answered within a few ms): a transaction whose keys are all n1's runs as one block
    at n1 (`APPLY` from n0, or inside `SHARD.EXEC` at n1 itself). n1's replica stopped and its
    link dropped: n1 has no replica linked while Sentinel lists one it may promote. Before, n1
    applied the block and answered its replies at once (acknowledged); its primary killed,
    Sentinel promoted the stale replica, and the acknowledged transfer was gone. Now the reply
    is `NOREPLICAS the transaction is applied at node n1 ...`: applied at n1, at no replica, a failover may lose it (as a write whose
    `WAIT 1` answered 0), which the promotion then shows."""
    ha = start_sentinel_fleet(server_factory, sentinel_factory, extra=list(AOF))
    c = ha.primaries["n0"].client()
    a, b = ha.keys_of(c, "n1", 2, prefix="acct")
    call(c, "MSET", a, 100, b, 100)
    old, replica = ha.primaries["n1"], ha.replicas["n1"]
    wait_in_sync(old.client(), replica.client())
    replica.proc.send_signal(signal.SIGSTOP)
    try:
        assert old.client().execute_command("CLIENT", "KILL", "TYPE", "replica") == 1
        until(lambda: old.client().info("replication")["connected_slaves"] == 0,
              "n1's replica link dropped")
        t = ha.primaries[via].client()
        assert t.execute_command("SHARD.MULTI") == b"OK"
        assert call(t, "DECRBY", a, 30) == b"QUEUED" and call(t, "INCRBY", b, 30) == b"QUEUED"
        with pytest.raises(redis.ResponseError) as e:
            t.execute_command("SHARD.EXEC")
        assert str(e.value).startswith("NOREPLICAS the transaction is applied at node n1"), e
        assert "no replica linked while Sentinel lists one" in str(e.value), e
        assert old.client().mget(a, b) == [b"70", b"130"], "applied at n1's primary"
        assert int(info_shard(old.client())["txn_unacked"]) >= 1
        old.stop(signal.SIGKILL)
    finally:
        replica.proc.send_signal(signal.SIGCONT)
    new = promoted(ha, "n1", c)
    # What the error warned of: the promoted replica never had the block.
    assert new.mget(a, b) == [b"100", b"100"]


def test_a_coordinator_with_no_replica_linked_decides_nothing(server_factory, sentinel_factory):
    """A commit decision only the coordinator's primary holds: n0's replica stopped and its
    link dropped (Sentinel still lists it), a transfer over n1 and n2 through n0, held once the
    first owner's COMMIT went out (`TXN-HOLD committed-one`); n0's primary killed and Sentinel
    promotes the stale replica, which never had the decision. Before, the first owner had
    applied its part while the other, still prepared, asked the promoted n0, which answered
    abort: the transfer stood at one owner only (the nemesis's "applied in part"). Now a
    coordinator with no replica linked while one is expected records no commit, and refuses
    the transaction before it prepares anything: no PREPARE reaches n1's or n2's AOF (before,
    both owners prepared and locked their keys, then the decision was refused; a coordinator
    killed in between left them in doubt)."""
    ha = start_sentinel_fleet(server_factory, sentinel_factory,
                              extra=[("enable-debug-command", "yes"),
                                     ("shard.txn-lock-ms", 2000), *AOF])
    c = ha.primaries["n0"].client()
    a = ha.keys_of(c, "n1", 1, prefix="acct")[0]
    b = ha.keys_of(c, "n2", 1, prefix="acct")[0]
    call(c, "MSET", a, 100, b, 100)
    old, replica = ha.primaries["n0"], ha.replicas["n0"]
    wait_in_sync(old.client(), replica.client())
    replica.proc.send_signal(signal.SIGSTOP)
    try:
        assert c.execute_command("CLIENT", "KILL", "TYPE", "replica") == 1
        until(lambda: c.info("replication")["connected_slaves"] == 0,
              "n0's replica link dropped")
        hold(c, "committed-one")
        ex = Exec(old, [("DECRBY", a, 30), ("INCRBY", b, 30)])
        until(lambda: held(c) == 1 or not ex.thread.is_alive(),
              "the first COMMIT out, or the transaction refused")
        old.stop(signal.SIGKILL)
    finally:
        replica.proc.send_signal(signal.SIGCONT)
    result = ex.join()
    n1, n2 = ha.primaries["n1"].client(), ha.primaries["n2"].client()
    promoted(ha, "n0", n1)
    until(lambda: all(info_shard(o)["txn_locks_held"] == "0" for o in (n1, n2)),
          "no part left prepared at n1 or n2", timeout=30)
    got = (n1.get(a), n2.get(b))
    assert got in ((b"70", b"130"), (b"100", b"100")), f"applied in part: {got} ({result})"
    assert got == (b"100", b"100"), result
    assert isinstance(result, redis.ResponseError), result
    assert "has no replica linked while Sentinel lists one" in str(result), result
    assert [prepares_of(ha.primaries[n]) for n in ("n1", "n2")] == [set(), set()], \
        "n0 prepared nothing at the owners"


def test_a_server_sentinel_no_longer_names_primary_refuses_to_coordinate(
        server_factory, sentinel_factory):
    """The nemesis's most common refusal: n0's primary stopped (SIGSTOP) until Sentinel
    promoted its replica, then continued; until Sentinel demotes it (seconds), it still runs
    as a master, and learns from Sentinel that another server is n0's primary now. A transfer
    over n1 and n2 sent to it then is refused before anything is prepared (`not node n0's
    primary now`): no PREPARE reaches n1's or n2's AOF, no key is locked. Before, both owners
    prepared and locked their keys first, and the decision was refused after."""
    ha = start_sentinel_fleet(server_factory, sentinel_factory, extra=list(AOF))
    old = ha.primaries["n0"]
    c = old.client()
    a = ha.keys_of(c, "n1", 1, prefix="acct")[0]
    b = ha.keys_of(c, "n2", 1, prefix="acct")[0]
    mine = ha.keys_of(c, "n0", 1, prefix="probe")[0]
    call(c, "MSET", a, 100, b, 100)
    new_address = f"127.0.0.1:{ha.replicas['n0'].port}".encode()
    old.proc.send_signal(signal.SIGSTOP)
    try:
        sentinel = ha.sentinels[0].client()
        until(lambda: int(sentinel.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME",
                                                   "n0")[1]) == ha.replicas["n0"].port,
              "Sentinel promoted n0's replica", timeout=30)
    finally:
        old.proc.send_signal(signal.SIGCONT)
    until(lambda: c.execute_command("SHARD.LOCATE", mine)[3] == new_address,
          "n0's old primary learns that Sentinel names its replica", timeout=20)
    assert c.execute_command("ROLE")[0] == b"master", "demoted already: the window is gone"
    result = Exec(old, [("DECRBY", a, 30), ("INCRBY", b, 30)]).join()
    assert isinstance(result, redis.ResponseError), result
    assert "is not node n0's primary now" in str(result), result
    assert [prepares_of(ha.primaries[n]) for n in ("n1", "n2")] == [set(), set()], \
        "the old primary prepared nothing at the owners"
    n1, n2 = ha.primaries["n1"].client(), ha.primaries["n2"].client()
    assert (n1.get(a), n2.get(b)) == (b"100", b"100")
    assert [info_shard(o)["txn_locks_held"] for o in (n1, n2)] == ["0", "0"]
