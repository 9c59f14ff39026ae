"""Rings that come without a coordinator's step hold to the fleet's term too (issue 44's
leftovers): `SHARD.RING PUSH` sends the pushing node's term (`SHARD.RING INSTALL ... PUSHED
...`), and a ring change by hand (`SHARD.RING SET|BEGIN|SETTLE|COMMIT|ABORT`) may name one
(`TERM n`, none: 0).

- On a fresh fleet (no term followed anywhere) both work as they always did.
- While a coordinator's lease runs at a node, a change by hand there is refused (`LEASEHELD`,
  naming the holder), and so are rings pushed under its own term; nothing changes.
- On a node that followed a fleet operation's term, a change by hand naming no term, or an
  older one, is refused (`STALETERM`, naming the term and its holder) and changes nothing;
  naming the node's term, it is made, and the node keeps its term. Rings pushed from a node of
  an older term (one that missed the operation: here a node given the old ring by hand) are
  refused everywhere; a push from a node of the newer term is accepted, and takes the term on.

(A node cut off from the fleet during a grow, pushing after the heal: test_partition_promises.)
"""

import pytest
import redis

from helpers.fleet import NAMES3, NAMES4, ring_args, start_fleet
from helpers.reshard import assert_one_ring, fleet_status, start_resharding, wait_fleet
from helpers.server import as_map, until


def node_state(client):
    return as_map(client.execute_command("SHARD.RING", "STATE"))


def digest(client):
    return node_state(client)["digest"]


def push(client):
    """SHARD.RING PUSH's reply: {node: b"OK" or the error naming the node}."""
    reply = client.execute_command("SHARD.RING", "PUSH")
    if isinstance(reply, list):
        reply = dict(zip(reply[::2], reply[1::2]))
    return {k.decode(): v for k, v in reply.items()}


def test_a_fresh_fleet_changes_its_rings_by_hand_as_before(server_factory):
    servers = start_fleet(server_factory, NAMES4, ring=NAMES3)
    c = {n: servers[n].client() for n in NAMES4}
    assert node_state(c["n0"])["term"] == 0
    for n in NAMES4:
        assert c[n].execute_command("SHARD.RING", "BEGIN", "ketama",
                                    *ring_args(servers, NAMES4)) == b"OK"
    # TERM 0 is "no term", as none given.
    assert c["n0"].execute_command("SHARD.RING", "SETTLE", "TERM", 0) == b"OK"
    assert push(c["n0"]) == {n: b"OK" for n in NAMES4}
    assert {node_state(c[n])["settled"] for n in NAMES4} == {b"yes"}
    for n in NAMES4:
        assert c[n].execute_command("SHARD.RING", "COMMIT") == b"OK"
    assert_one_ring(servers, NAMES4)
    with pytest.raises(redis.ResponseError, match="wrong number of arguments"):
        c["n0"].execute_command("SHARD.RING", "COMMIT", "TERM")
    with pytest.raises(redis.ResponseError, match="term"):
        c["n0"].execute_command("SHARD.RING", "ABORT", "TERM", "x")


def test_a_change_by_hand_or_a_push_is_refused_while_a_coordinators_lease_runs(server_factory):
    servers = start_fleet(server_factory, NAMES4, ring=NAMES3, on=NAMES3,
                          config=[("enable-debug-command", "yes")])
    c = {n: servers[n].client() for n in NAMES4}
    # n0 coordinates a grow, held once the settle rings are on the plan's first node.
    assert c["n0"].execute_command("SHARD.DEBUG", "FLEET-HOLD", "settle", 1) == b"OK"
    assert start_resharding(c["n0"], servers, NAMES4) == b"OK"
    until(lambda: fleet_status(c["n0"])["phase"] == b"settle", "the grow to reach settle")
    term = fleet_status(c["n0"])["term"]
    before = {n: node_state(c[n]) for n in NAMES4}
    held = rf"^LEASEHELD term {term} of n0 \(127.0.0.1:{servers['n0'].port}\) holds this fleet " \
        r"operation: its lease runs here for \d+ ms more, and a ring change by hand waits"
    for verb, args in (("SET", ring_args(servers, NAMES3)), ("BEGIN", ring_args(servers, NAMES4))):
        for extra in ((), ("TERM", term), ("TERM", term + 1)):
            with pytest.raises(redis.ResponseError, match=held):
                c["n1"].execute_command("SHARD.RING", verb, "ketama", *args, *extra)
    for verb in ("SETTLE", "COMMIT", "ABORT"):
        with pytest.raises(redis.ResponseError, match=held):
            c["n2"].execute_command("SHARD.RING", verb, "TERM", term)
    # A push from n1 (of the same term: its lease runs at the nodes) is refused at each.
    replies = push(c["n1"])
    assert replies.pop("n1") == b"OK"
    for n, reply in replies.items():
        assert reply.startswith(f"node {n} ".encode()) and b"LEASEHELD" in reply, (n, reply)
    for n in NAMES4:
        now = node_state(c[n])
        assert (now["digest"], now["previous_digest"], now["settled"], now["term"]) == \
            tuple(before[n][k] for k in ("digest", "previous_digest", "settled", "term")), n
    assert c["n0"].execute_command("SHARD.DEBUG", "FLEET-HOLD", "OFF") == b"OK"
    wait_fleet(c["n0"], "done", timeout=60)
    assert_one_ring(servers, NAMES4)


def test_old_rings_by_hand_or_pushed_are_refused_on_nodes_of_a_newer_term(server_factory):
    servers = start_fleet(server_factory, [*NAMES4, "n4"], ring=NAMES3, on=NAMES3)
    c = {n: servers[n].client() for n in servers}
    old = ring_args(servers, NAMES3)
    assert start_resharding(c["n0"], servers, NAMES4) == b"OK"
    wait_fleet(c["n0"], "done", timeout=60)
    until(lambda: fleet_status(c["n0"])["running"] == b"no", "the coordinator to stop")
    term = fleet_status(c["n0"])["term"]
    new = digest(c["n2"])
    holder = rf"this node follows term {term} of n0 \(127.0.0.1:{servers['n0'].port}\), " \
        "handed over"

    # By hand, the old ring, on a node that followed the grow's term: refused, nothing changed.
    for extra in ((), ("TERM", 0), ("TERM", term - 1)):
        with pytest.raises(redis.ResponseError,
                           match=rf"^STALETERM a ring change by hand under term "
                                 rf"{extra[1] if extra else 0} refused: {holder}: .*TERM {term}"):
            c["n2"].execute_command("SHARD.RING", "SET", "ketama", *old, *extra)
    with pytest.raises(redis.ResponseError, match="^STALETERM"):
        c["n2"].execute_command("SHARD.RING", "BEGIN", "ketama", *old)
    assert digest(c["n2"]) == new and node_state(c["n2"])["term"] == term

    # A node that missed the grow (n4, given the old ring by hand, no term) pushes it: every
    # node it names refuses, changing nothing.
    assert c["n4"].execute_command("SHARD.RING", "SET", "ketama", *old) == b"OK"
    replies = push(c["n4"])
    assert set(replies) == set(NAMES3)
    stale = f"STALETERM rings pushed under term 0 refused: this node follows term {term} of n0"
    for n, reply in replies.items():
        assert reply.startswith(f"node {n} ".encode()) and stale.encode() in reply, (n, reply)
    assert_one_ring(servers, NAMES4, on=NAMES4)

    # Naming the node's term, a change by hand is made and the node keeps its term; a push
    # from it (the same term, handed over everywhere) reaches the fleet, and n4, which missed
    # the grow, takes the term on with the rings.
    five = ring_args(servers, [*NAMES4, "n4"])
    assert c["n1"].execute_command("SHARD.RING", "SET", "ketama", *five, "TERM", term) == b"OK"
    assert node_state(c["n1"])["term"] == term
    assert push(c["n1"]) == {n: b"OK" for n in servers}
    assert_one_ring(servers, [*NAMES4, "n4"])
    st4 = node_state(c["n4"])
    assert (st4["term"], st4["term_holder"], st4["term_released"]) == (term, b"n0", b"yes"), st4
