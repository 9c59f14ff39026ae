"""A node cut off from a grow pushes the rings it still holds (issue 44's leftover: the module's
own state never splits). `SHARD.RING PUSH` sends the pushing node's fleet term with its rings;
a node of a newer term refuses them (`STALETERM`), and one whose coordinator's lease runs
refuses them under its own term (`LEASEHELD`), so the fleet keeps the rings it moved to.
Servers on loopback addresses of their own, cut by `nft` rules (tests/helpers/partition.py)."""

import pytest

from helpers.fleet import assert_owned_only
from helpers.reshard import assert_one_ring, fleet_status, resume_until_over
from helpers.server import until
from test_partition import ring_args, ring_state
from test_partition_promises import NAMES3, NAMES4, load, part_fleet

pytestmark = pytest.mark.slow


def push(client):
    """SHARD.RING PUSH's reply: {node: b"OK" or the error naming the node}."""
    reply = client.execute_command("SHARD.RING", "PUSH")
    if isinstance(reply, list):
        reply = dict(zip(reply[::2], reply[1::2]))
    return {k.decode(): v for k, v in reply.items()}


@pytest.mark.partitions
def test_a_node_cut_off_from_a_grow_cannot_push_its_old_rings_over_the_fleets(server_factory,
                                                                              partition):
    """n0 coordinates a grow of n0..n2 to n3, held once it has committed itself; n2 is cut off
    from n0 and misses the commit that n1 and n3 get. n0 hands its term over and RESUMEs under
    the next one (held before it sends any ring): n2 hears of neither. n2's push of the rings it
    holds, during the cut and after the heal, is refused by every node it reaches (STALETERM
    naming the newer term; after the heal LEASEHELD if n0's renewal has reached n2 by then), and
    the nodes keep the new ring alone under the newer term. Then the grow ends everywhere."""
    fleet = part_fleet(server_factory, partition, NAMES4, NAMES3)
    keys = [f"k:{i}" for i in range(3000)]
    load(fleet, NAMES3, keys)
    c0, c1, c2, c3 = (fleet.client(n, socket_timeout=30) for n in NAMES4)
    assert c0.execute_command("SHARD.DEBUG", "FLEET-HOLD", "commit", 1) == b"OK"
    assert c0.execute_command("SHARD.RESHARD", "START", "ketama",
                              *ring_args(fleet, NAMES4)) == b"OK"
    new_digest = fleet_status(c0)["new_digest"]

    def committed(c):
        st = ring_state(c)
        return st["digest"] == new_digest and st["previous_digest"] == b""
    until(lambda: committed(c0), "n0 has committed")
    term = fleet_status(c0)["term"]
    assert not committed(c2)
    old_digest = ring_state(c2)["digest"]

    partition.cut(fleet["n0"], fleet["n2"])
    assert c0.execute_command("SHARD.DEBUG", "FLEET-HOLD", "OFF") == b"OK"
    until(lambda: committed(c1) and committed(c3), "n1 and n3 have committed")
    assert c0.execute_command("SHARD.RESHARD", "HANDOVER") == b"OK"
    until(lambda: fleet_status(c0)["running"] == b"no", "n0 to stop driving")
    assert c0.execute_command("SHARD.DEBUG", "FLEET-HOLD", "commit", 0) == b"OK"
    assert c0.execute_command("SHARD.RESHARD", "RESUME") == b"OK"
    for c in (c0, c1, c3):
        until(lambda: ring_state(c)["term"] == term + 1, "the nodes follow the next term")
    assert ring_state(c2)["term"] == term and ring_state(c2)["digest"] == old_digest

    def pushed_and_refused(when, codes):
        replies = push(c2)
        print(f"\n{when}: n2's push: {replies}")
        assert replies.pop("n2") == b"OK"
        for n in ("n1", "n3") if when == "during the cut" else ("n0", "n1", "n3"):
            reply = replies[n]
            assert reply.startswith(f"node {n} ".encode()), (n, reply)
            assert any(code in reply for code in codes), (n, reply)
        for c in (c0, c1, c3):
            st = ring_state(c)
            assert committed(c) and st["term"] == term + 1, st
    pushed_and_refused("during the cut", [
        f"STALETERM rings pushed under term {term} refused: this node follows term {term + 1} "
        f"of n0".encode()])
    partition.heal()
    pushed_and_refused("after the heal", [b"STALETERM rings pushed under term",
                                          f"LEASEHELD term {term + 1} of n0".encode()])

    assert c0.execute_command("SHARD.DEBUG", "FLEET-HOLD", "OFF") == b"OK"
    resume_until_over(c0, "the grow ends after the heal", timeout=60)
    assert_one_ring(fleet, NAMES4)
    assert ring_state(c2)["term"] == term + 1
    assert assert_owned_only(fleet, c0) == len(keys)
