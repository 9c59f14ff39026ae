"""A fleet step's job counts only when it ran on its phase's rings (issue 33, found by the nemesis
test: `NEMESIS_SEED=819126060` on Valkey lost writes made during a shrink's copy after a CANCEL).

The cancel's return installs the old ring over the new one, returning, on every node; then each
node of the new ring copies its versions of the moving keys back (`COPY REPLACE`). A node's
primary without a replica following it (its partner an old primary Sentinel has not turned into
a replica yet) takes those rings alone, and the step counts done there (its `WAIT` waits for
no replica); Sentinel then promotes the partner, which still holds the copy's rings, and the
coordinator's `COPY REPLACE` runs there: on the copy's rings the node owns the moving keys, so
nothing goes back, the job ends done, and the cancel's cleanup deletes the keys the new owner
was written meanwhile. In the nemesis run the new owner was n0, its old primary paused when
Sentinel promoted its replica.

The test drives the step: n3 joins (a grow), held after the `begin` rings are on every node
(`SHARD.DEBUG FLEET-HOLD begin 4`); the moving keys are written at n3 (acknowledged by its
replica); CANCEL; n3's second server stops following its primary; the coordinator is held
after the return's rings are installed, before its jobs (`FLEET-HOLD cancel-return 4`); Sentinel
fails n3 over to the second server; then the jobs run. Before, the copy back ran on the begin
rings and counted done: the old owners kept the values from before. Now the coordinator sees
that the job ran on other rings (`SHARD.RING STATE`'s `job_digest`, `job_previous_digest`),
installs the return's rings there again and runs the copy back again.
"""

from helpers.fleet import owners
from helpers.nemesis import SHARDS, Fleet
from helpers.reshard import fleet_status, wait_fleet
from helpers.server import as_map, until

KEYS = [f"k:{i}" for i in range(300)]


def rings_of(server):
    st = as_map(server.client().execute_command("SHARD.RING", "STATE"))
    return st["digest"], st["previous_digest"], st["returning"]


def test_a_cancels_copy_back_runs_again_on_a_promoted_server_without_its_rings(
        server_factory, sentinel_factory, clockshim, tmp_path):
    fleet = Fleet(server_factory, sentinel_factory, clockshim, tmp_path,
                  config=[("enable-debug-command", "yes")])
    c = fleet.primaries["n0"].client(socket_timeout=20)
    pipe = c.pipeline(transaction=False)
    for k in KEYS:
        pipe.execute_command("SHARD.CALL", "WAIT", 1, 1000, "SET", k, "before")
    assert all(r == b"OK" for r in pipe.execute())
    old_owner = dict(zip(KEYS, owners(c, KEYS)))
    first, second = fleet.primaries["n3"], fleet.replicas["n3"]

    # The grow held once the begin rings are on every node: the moving keys are n3's.
    assert c.execute_command("SHARD.DEBUG", "FLEET-HOLD", "begin", 4) == b"OK"
    ring4 = ["slots", *[x for n in SHARDS for x in (n, "sentinel", 1)]]
    assert c.execute_command("SHARD.RESHARD", "START", *ring4) == b"OK"
    until(lambda: fleet_status(c)["phase"] == b"begin"
          and all(rings_of(fleet.primaries[n])[2] == b"no" for n in SHARDS)
          and len({rings_of(fleet.primaries[n])[:2] for n in SHARDS}) == 1,
          "the begin rings on every node")
    new_digest, old_digest, _ = rings_of(first)
    moving = [k for k, o in zip(KEYS, owners(c, KEYS)) if o == "n3"]
    assert len(moving) >= 30
    # Written at their new owner, n3, and acknowledged by its replica.
    pipe = c.pipeline(transaction=False)
    for k in moving:
        pipe.execute_command("SHARD.CALL", "WAIT", 1, 1000, "SET", k, "during")
    assert all(r == b"OK" for r in pipe.execute())
    assert second.client().execute_command("SHARD.DUMP", moving[0])

    assert c.execute_command("SHARD.RESHARD", "CANCEL") == b"OK"
    # n3's second server leaves its primary (Sentinel still counts it as n3's replica): the
    # return's rings reach the primary alone.
    assert second.client().execute_command("REPLICAOF", "NO", "ONE") == b"OK"
    until(lambda: first.client().execute_command("ROLE")[2] == [], "n3's primary without a replica")
    assert c.execute_command("SHARD.DEBUG", "FLEET-HOLD", "cancel-return", 4) == b"OK"
    until(lambda: fleet_status(c)["phase"] == b"cancel-return"
          and all(rings_of(fleet.primaries[n]) == (old_digest, new_digest, b"yes") for n in SHARDS),
          "the return's rings on every node's primary")
    assert rings_of(second) == (new_digest, old_digest, b"no")

    # Sentinel promotes the second server, which never got them; the coordinator sees it.
    log_from = len(fleet.primaries["n0"].log())
    fleet.fail_over_to("n3", second)
    switched = f"node n3 failed over from 127.0.0.1:{first.port} to 127.0.0.1:{second.port}"
    until(lambda: switched in fleet.primaries["n0"].log()[log_from:],
          "the coordinator follows n3's failover")
    assert c.execute_command("SHARD.DEBUG", "FLEET-HOLD", "OFF") == b"OK"

    st = wait_fleet(c, "cancelled", timeout=90)
    # Every moving key is back at its old owner with the value written at n3.
    pipe = c.pipeline(transaction=False)
    for k in moving:
        pipe.execute_command("SHARD.CALL", "GET", k)
    got = dict(zip(moving, pipe.execute()))
    lost = [k for k in moving if got[k] != b"during"]
    assert not lost, f"{len(lost)} of {len(moving)} writes made at n3 lost by the cancel: {lost[:10]} {st}"
    for k in moving:
        assert fleet.primary(old_owner[k]).client().execute_command("SHARD.DUMP", k), k
