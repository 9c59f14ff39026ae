"""RESUME finishes the operation whose rings the fleet holds, when the coordinator's own plan is
gone or older than the fleet (issue 33, found by the nemesis test, `NEMESIS_SEED=32`).

A plan lives at its coordinator's server and that server's replica only. Sentinel promoted a
replica restarted from an older AOF before it had synced (it held the previous operation's
plan); the old primary, which coordinated the running operation, came back and was turned into
its replica: the full sync replaced its plan by the older one. No server held the running
operation's plan any more, every other node held its settle rings under its term, and RESUME
answered "nothing to resume" on the promoted server and "the plan is older than the fleet" on
the other: the fleet stayed on two operations' rings for good.

The tests drive that state: the coordinator held once n0 has the commit (`SHARD.DEBUG
FLEET-HOLD`), handed over, then its plan removed (`PLAN ""`) or taken back to an older copy (a
`DEBUG RELOAD` of an RDB saved in an earlier phase under an earlier term, as a server restarted
from an older file). RESUME there adopts the operation from the nodes' rings (`SHARD.RING
STATE` carries their canonical texts) and drives it to its end: every node on the new ring
alone, every key at its owner only. (On the previous build: "nothing to resume", and "refused to
drive the plan: ... older than the fleet".)

START, for its part, no longer takes a node that holds the reverse operation's fence for one
that has begun its own (`checks::check_start`, unit-tested).
"""

import pytest

from helpers.fleet import ring_args
from helpers.reshard import assert_one_ring, fleet_status, wait_fleet
from helpers.server import as_map, until
from test_commit_window import NEW, check_final, grow_fleet, in_step


def handover(client):
    """Stops the coordinator at its next step; it releases its lease at every node."""
    assert client.execute_command("SHARD.RESHARD", "HANDOVER") == b"OK"
    until(lambda: fleet_status(client)["running"] == b"no", "the coordinator to stop")


def begun(servers, name):
    """Whether node `name` holds the new ring over the old one."""
    st = as_map(servers.client(name).execute_command("SHARD.RING", "STATE"))
    return st["digest"] == servers.new_digest and st["previous_digest"] not in (b"", None)


@pytest.mark.parametrize("left", ["no plan", "an older plan"])
def test_resume_adopts_the_operation_whose_rings_the_fleet_holds(server_factory, left):
    servers = grow_fleet(server_factory)
    # Term 1, held once n0 has the begin rings: the older copy of n1's state.
    c1 = servers.client("n1")
    assert c1.execute_command("SHARD.DEBUG", "FLEET-HOLD", "begin", 1) == b"OK"
    assert c1.execute_command("SHARD.RESHARD", "START", "ketama", *ring_args(servers, NEW)) == b"OK"
    servers.new_digest = fleet_status(c1)["new_digest"]
    until(lambda: begun(servers, "n0"), "n0 has the begin rings")
    term = fleet_status(c1)["term"]
    if left == "an older plan":
        assert c1.execute_command("SAVE")
    handover(c1)
    # A new term drives on, held once n0 has committed (n1 and n2 settled).
    assert c1.execute_command("SHARD.DEBUG", "FLEET-HOLD", "commit", 1) == b"OK"
    assert c1.execute_command("SHARD.RESHARD", "RESUME") == b"OK"
    until(lambda: in_step(servers, "n0", "commit"), "n0 has committed")
    assert fleet_status(c1)["term"] > term
    handover(c1)
    assert c1.execute_command("SHARD.DEBUG", "FLEET-HOLD", "OFF") == b"OK"

    if left == "no plan":
        assert c1.execute_command("SHARD.RESHARD", "PLAN", "") == b"OK"
        assert fleet_status(c1) is None
    else:
        # n1 back on what it held in begin: that plan (term 1), its rings and term.
        assert c1.execute_command("DEBUG", "RELOAD", "NOSAVE")
        st = fleet_status(c1)
        assert (st["phase"], st["term"]) == (b"begin", term), st

    assert c1.execute_command("SHARD.RESHARD", "RESUME") == b"OK"
    st = wait_fleet(c1, "done")
    assert st["error"] == b"", st
    assert_one_ring(servers, NEW)
    check_final(servers, {})
