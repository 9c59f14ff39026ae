"""A transaction whose coordinator leaves the ring (a shrink, `SHARD.RESHARD START` to a ring
without it) while it is held at a step of the two-phase commit (issue 35,
docs/transactions.md, "A shrink"): the owners' parts must still end, and their locks go.

On a fleet of three with AOF on, n0 coordinates a transfer between n1 and n2 and is held by
`SHARD.DEBUG TXN-HOLD` after both owners prepared, or after its decision; a shrink to n1 and n2
runs to its end meanwhile; then n0 is let go, or killed and restarted from its AOF (no ring
names it any more):

- held at `prepared`, let go: n0 cannot record a decision outside the ring; it aborts both parts;
- held at `prepared`, the owners' rings without n0 (as a shrink that ends within the lock leaves
  them: `SHARD.RING SET`, so that no owner is in doubt before), n0 killed: the owners, in doubt,
  stay locked while n0 is down, then ask it at the address its PREPARE gave once it is back,
  and abort (presumed). Before the PREPARE carried the address, locked for ever;
- held at `decided`, let go or killed: n0 carries the commit out (after the restart, from its
  book) though no ring names it: both parts applied once.

A node no current ring names (shrunk out, or leaving in a shrink under way) refuses to coordinate
a transaction across nodes, before anything is prepared: it could record no decision.

The parts' locks end within a few times `shard.txn-lock-ms`. A STATUS asked of a node that is
not the txid's is refused (`WRONGNODE`): an address may be another server's by then.
"""

import signal

import pytest
import redis

from helpers.fleet import ring_get
from helpers.reshard import start_resharding, wait_fleet
from helpers.server import info_shard, until
from helpers.txn import Exec, call, held, hold, no_lock_left, prepares_of
from test_txn_faults import txn_fleet

LOCK_MS = 2000
# How long the parts may take to end once the coordinator is back: past the lock, the owners
# ask every 100 ms.
ENDS_WITHIN_S = 4 * LOCK_MS / 1000


@pytest.fixture
def fleet(server_factory):
    return txn_fleet(server_factory, LOCK_MS)


def transfer_held(fleet, step):
    """n0 coordinates 30 from a (at n1) to b (at n2), held at `step`; returns (a, b, the Exec)
    once both parts are prepared and n0 waits at the hold (n1's applied past `committed-one`)."""
    n0 = fleet.client("n0")
    a, b = fleet.key_of("n1", prefix="acct"), fleet.key_of("n2", prefix="acct")
    call(n0, "MSET", a, 100, b, 100)
    hold(n0, step)
    ex = Exec(fleet["n0"], [("DECRBY", a, 30), ("INCRBY", b, 30)])
    until(lambda: held(n0) == 1, "the transaction waits at the hold")
    locked = [0 if step == "committed-one" else 1, 1]
    until(lambda: [int(info_shard(fleet.client(n))["txn_locks_held"])
                   for n in ("n1", "n2")] == locked, f"locks held at n1, n2: {locked}")
    return a, b, ex


def held_then_shrunk(fleet, step):
    """`transfer_held`, with n0's locks of a minute, then a shrink to n1 and n2 (coordinated by
    n1) runs to its end. Returns (a, b, the Exec, the txid)."""
    n0 = fleet.client("n0")
    # The parts lock for a minute: no owner is in doubt during the shrink (n0, still in the
    # previous ring, would answer it), what ends them is n0's doing.
    n0.config_set("shard.txn-lock-ms", 60_000)
    a, b, ex = transfer_held(fleet, step)
    n1 = fleet.client("n1")
    assert start_resharding(n1, fleet, ["n1", "n2"]) is not None
    wait_fleet(n1)
    for n in ("n1", "n2"):
        ring = ring_get(fleet.client(n))
        assert ring.get("previous") is None, (n, ring)
        assert sorted(node["name"] for node in ring["nodes"]) == [b"n1", b"n2"], (n, ring)
    return a, b, ex


def end(fleet, ex, how):
    if how == "let go":
        hold(fleet.client("n0"), "OFF")
        return ex.join()
    fleet["n0"].stop(signal.SIGKILL)
    assert isinstance(ex.join(), redis.ConnectionError)
    fleet["n0"].start()
    return None


def values(fleet, a, b):
    return [fleet.client("n1").get(a), fleet.client("n2").get(b)]


def test_held_after_prepare_then_shrunk_out_and_let_go_the_parts_abort(fleet):
    a, b, ex = held_then_shrunk(fleet, "prepared")
    reply = end(fleet, ex, "let go")
    # Outside the ring n0 cannot record a decision: it aborts both parts.
    assert isinstance(reply, redis.ResponseError) and "not in the ring" in str(reply), reply
    until(lambda: no_lock_left(fleet, ("n0", "n1", "n2")), "both parts aborted, their locks gone",
          timeout=ENDS_WITHIN_S)
    assert values(fleet, a, b) == [b"100", b"100"], "nothing applied"
    assert call(fleet.client("n1"), "INCR", a) == 101, "the key is free"


def test_killed_after_prepare_out_of_every_ring_the_owners_ask_it_where_it_prepared(fleet):
    """n0 held after both PREPAREs; the owners' rings lose n0 (as a shrink that ends within the
    lock leaves them: no previous ring); n0 killed. Past the lock the parts are in doubt and
    stay locked while n0 is down (deciding alone could undo a commit); once n0 is back at the
    address its PREPARE gave, the owners ask it there and abort (presumed). Before PREPARE
    carried the address, no owner could find n0: locked for ever."""
    a, b, ex = transfer_held(fleet, "prepared")
    fleet.ring(["n1", "n2"])
    fleet["n0"].stop(signal.SIGKILL)
    assert isinstance(ex.join(), redis.ConnectionError)
    for n in ("n1", "n2"):
        until(lambda: info_shard(fleet.client(n))["txn_in_doubt"] == "1", f"{n}'s part in doubt")
        assert info_shard(fleet.client(n))["txn_locks_held"] == "1"
    fleet["n0"].start()
    until(lambda: no_lock_left(fleet, ("n0", "n1", "n2")), "both parts aborted, their locks gone",
          timeout=ENDS_WITHIN_S)
    assert values(fleet, a, b) == [b"100", b"100"], "nothing applied"
    assert call(fleet.client("n1"), "INCR", a) == 101, "the key is free"


@pytest.mark.parametrize("how", ["let go", "killed"])
def test_held_after_the_decision_then_shrunk_out_the_commit_is_carried_out(fleet, how):
    a, b, ex = held_then_shrunk(fleet, "decided")
    reply = end(fleet, ex, how)
    if how == "let go":
        assert reply == [70, 130]
    until(lambda: no_lock_left(fleet, ("n0", "n1", "n2")),
          "both parts applied, the decision forgotten", timeout=ENDS_WITHIN_S)
    assert values(fleet, a, b) == [b"70", b"130"], "each part applied exactly once"


def test_status_is_answered_only_by_the_node_named_in_the_txid(fleet):
    n1 = fleet.client("n1")
    with pytest.raises(redis.ResponseError, match="^WRONGNODE"):
        n1.execute_command("SHARD.TXN", "STATUS", "n0/ff")
    # Nothing was presumed there: n0 itself still answers for it.
    assert fleet.client("n0").execute_command("SHARD.TXN", "STATUS", "n0/ff") == b"abort"


def test_an_owner_shrunk_out_before_its_confirmation_is_asked_where_it_was(fleet):
    """An owner that leaves the ring after it applied its part, before its confirmation reached
    the coordinator: n0 coordinates 30 from a (at n1) to b (at n2), held once n1's COMMIT went
    out (`committed-one`: n1 applies its part, n2's stays locked); a shrink to n0 and n2
    (coordinated by n0) takes n1 out; n0 is killed and restarted from its AOF, holding the
    decision. It sends the commit again to every owner: n1, which no ring names now, at the
    address it had when the commit was decided (it applies nothing twice), and n2. Before, n0
    logged `... which no ring names now: it waits` and sent it to no owner: the decision was
    held for ever (`txn_decisions_held`), and n2's part stayed locked until its lock ran out."""
    n0 = fleet.client("n0")
    n0.config_set("shard.txn-lock-ms", 60_000)
    a, b, ex = transfer_held(fleet, "committed-one")
    until(lambda: fleet.client("n1").get(a) == b"70", "n1 applied its part")
    assert info_shard(fleet.client("n2"))["txn_locks_held"] == "1"
    assert start_resharding(n0, fleet, ["n0", "n2"]) is not None
    wait_fleet(n0)
    fleet["n0"].stop(signal.SIGKILL)
    assert isinstance(ex.join(), redis.ConnectionError)
    fleet["n0"].start()
    until(lambda: no_lock_left(fleet, ("n0", "n1", "n2")),
          "the commit carried out at both owners, the decision forgotten", timeout=ENDS_WITHIN_S)
    n0 = fleet.client("n0")
    assert [call(n0, "GET", a), call(n0, "GET", b)] == [b"70", b"130"], \
        "each part applied exactly once"
    # n1 applied nothing again: the shrink's cleanup left it no key, and it has none now.
    assert fleet.client("n1").dbsize() == 0


@pytest.mark.parametrize("how", ["shrunk out", "leaving"])
def test_a_node_no_current_ring_names_refuses_to_coordinate_and_prepares_nothing(fleet, how):
    """The nemesis's coordinator out of the ring (seed 2054124654): a shrink took n0 out (or is
    taking it out: `leaving`, only the previous ring of a resharding under way names it), and a
    client still sends n0 a transfer between n1 and n2, with a watched key. n0 could record no
    decision (no current ring names it), so it refuses at once, naming why, and prepares
    nothing: no PREPARE reaches n1's or n2's AOF, no key is locked, the hold at `prepared` is
    never reached. Before, n0 prepared at both owners (no `FROM` when no ring named it), then
    aborted (`ERR this node is not in the ring: it cannot record a decision`); killed in
    between, it left both parts locked and in doubt. A node of the ring (n1) then coordinates
    the same transfer: committed."""
    n0 = fleet.client("n0")
    a, b = fleet.key_of("n1", prefix="acct"), fleet.key_of("n2", prefix="acct")
    call(n0, "MSET", a, 100, b, 100)
    if how == "shrunk out":
        n1 = fleet.client("n1")
        assert start_resharding(n1, fleet, ["n1", "n2"]) is not None
        wait_fleet(n1)
        until(lambda: ring_get(n0).get("previous") is None and sorted(
            node["name"] for node in ring_get(n0)["nodes"]) == [b"n1", b"n2"],
            "n0 holds the ring without it")
    else:
        fleet.ring(["n1", "n2"], verb="BEGIN")
        assert ring_get(n0).get("previous") is not None
    # Were n0 to prepare, the transaction would wait at this hold, both parts locked.
    hold(n0, "prepared")
    raw = fleet.raw("n0", timeout=10)
    replies = raw.pipeline([("SHARD.WATCH", a), ("SHARD.MULTI",),
                            ("SHARD.CALL", "DECRBY", a, 30), ("SHARD.CALL", "INCRBY", b, 30),
                            ("SHARD.EXEC",)])
    raw.close()
    assert replies[:4] == [b"+OK\r\n", b"+OK\r\n", b"+QUEUED\r\n", b"+QUEUED\r\n"], replies
    refused = replies[4].decode()
    assert refused.startswith("-ERR shard.txn: node n0 is not in the ring"), refused
    assert "nothing was prepared" in refused, refused
    assert held(n0) == 0
    assert no_lock_left(fleet, ("n0", "n1", "n2"))
    assert [prepares_of(fleet[n], "n0") for n in ("n1", "n2")] == [set(), set()], \
        "n0 prepared nothing at the owners"
    assert info_shard(n0)["txn_aborted_error"] == "1"
    assert values(fleet, a, b) == [b"100", b"100"], "nothing applied"
    # A node of the ring coordinates it: the keys are free (n0's watch dropped, nothing locked).
    c1 = fleet.client("n1")
    assert c1.execute_command("SHARD.WATCH", a) == b"OK"
    assert c1.execute_command("SHARD.MULTI") == b"OK"
    assert call(c1, "DECRBY", a, 30) == b"QUEUED"
    assert call(c1, "INCRBY", b, 30) == b"QUEUED"
    assert c1.execute_command("SHARD.EXEC") == [70, 130]
    assert values(fleet, a, b) == [b"70", b"130"]
