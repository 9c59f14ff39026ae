"""RESUME finishes a fleet operation whose plan is recorded behind what the nodes hold (issue 33,
found by the nemesis test, `NEMESIS_SEED=7` on Valkey).

A coordinator's step counts durable once its server's replica acknowledged it, but a primary
with no replica linked at that moment waits for none. In the nemesis run the coordinator n0
drove a grow through settle and commit while its replica was not following it (killed, then
restarted and not synced yet); Sentinel then promoted that replica, which held the plan in
`copy` and n0's rings begun, under the older term it had last seen, while every other node held
the new ring alone under the newer term of the RESUME that had driven them. RESUME on the
promoted server refused the plan ("... does not fit phase copy of this plan ...: the plan is
older than the fleet"), no node of the newest term held two rings for a RESUME elsewhere to adopt
("nothing to resume"), and the fleet stayed split for good.

The test drives that state step by step: the coordinator held in `copy` once its copies are done
(`SHARD.DEBUG FLEET-HOLD copy 0`), its replica's AOF saved there (the plan in `copy` and n0's
rings begun), the coordinator handed over and RESUMEd under a newer term to the end; writes
acknowledged by their owner's replica (`SHARD.CALL WAIT`) at the other nodes; then n0's primary
and replica killed and the replica started again from the AOF saved in `copy` (a disk that lost
its last writes, a backup), which Sentinel promotes. (The nemesis's way there, the replica
killed in `copy` and the grow driven on without it, is closed since: a copy waits for a replica
Sentinel lists as down, `test_fleet_landed`.) RESUME,
on the promoted server or on another node, now goes on from `commit` (back to `settle` while n0
is only begun) and ends on the new ring, every key at its owner only, no acknowledged write
lost; a CANCEL there is refused, as it is from `settle` on (before, it was driven as RESUME and
refused the same way as RESUME).
"""

import shutil

import pytest
import redis

from helpers.fleet import owners
from helpers.nemesis import SHARDS, Fleet
from helpers.reshard import fleet_status, wait_fleet
from helpers.server import as_map, saved_aof, until

KEYS = [f"k:{i}" for i in range(300)]


def state(server):
    return as_map(server.client(socket_timeout=5).execute_command("SHARD.RING", "STATE"))


def past_lease(client, verb):
    """`SHARD.RESHARD verb`, sent again while the lease the promoted server restored from its
    AOF (the old primary's term) still runs there (`LEASEHELD`): its reply, or its error."""
    got = []

    def answered():
        try:
            got.append(client.execute_command("SHARD.RESHARD", verb))
        except redis.ResponseError as e:
            if str(e).startswith("LEASEHELD"):
                return False
            got.append(e)
        return True
    until(answered, f"{verb} answered once the restored lease has run out", timeout=30,
          every=0.5)
    return got[-1]


def resume(client):
    got = past_lease(client, "RESUME")
    assert got == b"OK", f"RESUME refused: {got}"


@pytest.mark.parametrize("where", ["the promoted replica", "another node"])
def test_resume_goes_on_from_what_the_nodes_committed(server_factory, sentinel_factory,
                                                      clockshim, tmp_path, where):
    fleet = Fleet(server_factory, sentinel_factory, clockshim, tmp_path,
                  config=[("enable-debug-command", "yes")])
    primary, replica = fleet.primaries["n0"], fleet.replicas["n0"]
    coordinator = primary.client(socket_timeout=20)
    pipe = coordinator.pipeline(transaction=False)
    for k in KEYS:
        pipe.execute_command("SHARD.CALL", "WAIT", 1, 0, "SET", k, f"v:{k}")
    assert all(r == b"OK" for r in pipe.execute())

    # The grow, held in copy once its copies are done.
    assert coordinator.execute_command("SHARD.DEBUG", "FLEET-HOLD", "copy", 0) == b"OK"
    ring4 = ["slots", *[x for n in SHARDS for x in (n, "sentinel", 1)]]
    assert coordinator.execute_command("SHARD.RESHARD", "START", *ring4) == b"OK"
    old, new = (fleet_status(coordinator)[k] for k in ("old_digest", "new_digest"))

    def copied(client):
        st = fleet_status(client)
        return st is not None and st["phase"] == b"copy" and all(
            st["nodes"][n]["step_done"] == b"yes" for n in SHARDS[:3])
    until(lambda: copied(replica.client()), "n0's replica has the plan, copies done, in copy",
          timeout=60)
    # The replica's AOF there (the plan in copy, n0's rings begun), to restart it from later.
    behind = saved_aof(replica, tmp_path / "n0-replica-aof-in-copy")
    term = fleet_status(coordinator)["term"]
    assert coordinator.execute_command("SHARD.RESHARD", "HANDOVER") == b"OK"
    until(lambda: fleet_status(coordinator)["running"] == b"no", "the coordinator stopped")
    assert coordinator.execute_command("SHARD.DEBUG", "FLEET-HOLD", "OFF") == b"OK"
    # A newer term drives the grow to its end.
    assert coordinator.execute_command("SHARD.RESHARD", "RESUME") == b"OK"
    st = wait_fleet(coordinator, "done", timeout=90)
    assert st["term"] > term, st

    # Writes acknowledged by their owner's replica: every other node's keys; n0's go to a
    # replica whose disk loses them (below), so they may or may not be kept.
    owner = dict(zip(KEYS, owners(coordinator, KEYS)))
    c1 = fleet.primaries["n1"].client(socket_timeout=20)
    acked, unacked = [], [k for k in KEYS if owner[k] == "n0"][:5]
    pipe = c1.pipeline(transaction=False)
    for k in KEYS:
        if owner[k] != "n0":
            pipe.execute_command("SHARD.CALL", "WAIT", 1, 0, "SET", k, f"w:{k}")
            acked.append(k)
    assert all(r == b"OK" for r in pipe.execute())
    for k in unacked:
        assert c1.execute_command("SHARD.CALL", "SET", k, f"w:{k}") == b"OK"

    # n0's primary and replica killed; the replica back from its AOF saved in copy (the plan
    # in copy, n0's rings begun, the older term), promoted by Sentinel.
    fleet.kill(primary)
    fleet.kill(replica)
    shutil.rmtree(replica.workdir / "appendonlydir")
    shutil.copytree(behind, replica.workdir / "appendonlydir")
    fleet.restart(replica)
    until(lambda: fleet.master_address("n0") == replica.port
          and fleet.role(replica) == "master", "Sentinel promoted n0's replica", timeout=60)
    promoted = replica.client(socket_timeout=20)
    # The old primary back, as an operator restarts a server that crashed: Sentinel makes it a
    # replica of the promoted one (a cleanup counts done at n0 once a replica has it).
    fleet.restart(primary)
    # Until Sentinel has demoted it (INFO every 10 s, then 8 s: 10 s or more after the switch,
    # up to ~30 s on a loaded machine) and it is linked, n0 has no replica to acknowledge a
    # step: a coordinator that ran out of tries meanwhile (5 x 2 s for its plan) gives up, and
    # wait_fleet below failed on it. The RESUME is the test's, after that.
    until(fleet.settled, "n0's old primary linked as the promoted one's replica", timeout=60,
          every=0.2)

    def resolved(server):
        ring = as_map(server.client().execute_command("SHARD.RING", "GET"))
        n0 = next(m for m in ring["nodes"] if m["name"] == b"n0")
        return n0["resolved"] == f"127.0.0.1:{replica.port}".encode()
    until(lambda: all(resolved(fleet.primary(n)) for n in SHARDS),
          "every node reaches n0 at its promoted replica")
    st = fleet_status(promoted)
    assert (st["phase"], st["term"]) == (b"copy", term), st
    assert (state(replica)["digest"], state(replica)["previous_digest"]) == (new, old)
    for n in SHARDS[1:]:
        got = state(fleet.primary(n))
        assert (got["digest"], got["previous_digest"]) == (new, b""), (n, got)

    # RESUME goes on from what the nodes committed (before: refused, the plan "does not fit
    # phase copy", or "nothing to resume" on another node).
    via = promoted if where == "the promoted replica" else c1
    if where == "the promoted replica":
        # A CANCEL there is refused, as from settle on: the fleet committed.
        got = past_lease(promoted, "CANCEL")
        assert isinstance(got, redis.ResponseError), got
        assert "can no longer be cancelled" in str(got), got
        assert fleet_status(promoted)["phase"] == b"copy"
    resume(via)
    st = wait_fleet(via, "done", timeout=90)
    assert st["error"] == b"", st
    if where == "another node":
        # The promoted server's own plan, still in copy, is not left open either.
        assert fleet_status(promoted)["phase"] == b"copy"
        resume(promoted)
        assert wait_fleet(promoted, "done", timeout=90)["error"] == b""

    # Every node on the new ring alone; every key at its owner only, with the value last
    # acknowledged (an unacknowledged write may or may not have been kept).
    primaries = {n: fleet.primary(n) for n in SHARDS}
    for n, s in primaries.items():
        got = state(s)
        assert (got["digest"], got["previous_digest"], got["settled"]) == (new, b"", b"no"), \
            (n, got)
    assert dict(zip(KEYS, owners(promoted, KEYS))) == owner
    for n, s in primaries.items():
        c = s.client()
        held = [k.decode() for k in c.scan_iter(count=1000)]
        stray = [k for k in held if owner.get(k) != n]
        assert not stray, f"{len(stray)} keys on {n}, which does not own them: {stray[:10]}"
        mine = [k for k in KEYS if owner[k] == n]
        pipe = c.pipeline(transaction=False)
        for k in mine:
            pipe.get(k)
        values = dict(zip(mine, pipe.execute()))
        wrong = {k: v for k, v in values.items()
                 if v not in ({f"w:{k}".encode()} if k in acked
                              else {f"v:{k}".encode(), f"w:{k}".encode()} if k in unacked
                              else {f"v:{k}".encode()})}
        assert not wrong, f"{n}: {len(wrong)} keys not as acknowledged: {list(wrong.items())[:8]}"
