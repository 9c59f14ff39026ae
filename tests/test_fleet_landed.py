"""A grow's copies count done only once they reached the destination's replica, at the primary
they were sent to (issue 33, found by the nemesis test: `list:3` and `list:7` lost everything
written before a grow).

The joining node n3 is behind Sentinel; once every node has the grow's `begin` rings (the
coordinator held there), its second server stops following its primary (`REPLICAOF NO ONE`: as
an old primary that Sentinel has not turned into a replica yet, which is where the nemesis
found it). The grow copies n0's, n1's and n2's moving keys to n3's primary, which has no
replica following it; then Sentinel fails n3 over to that second server, which never got them,
and the first server becomes its replica (its data replaced). Before, the copy counted done at
the primary's acknowledgement: the grow settled, committed and cleaned the keys up at their
sources, and after the failover every moved key was gone. Now the coordinator waits, before the
fleet settles, for each destination's replica to acknowledge the copies
(`reshard/fleet/landed.rs`), and a destination that failed over since gets them again.

The same holds for every step of a fleet operation (`reshard/fleet/durable.rs`): a ring step
at a primary that no replica follows, while Sentinel lists one it could promote, is not
counted done (Valkey seed 7: settle and commit counted done at n0's primary while its replica
was syncing, then Sentinel promoted that replica); the second test.
"""

from helpers.fleet import owners
from helpers.nemesis import SHARDS, Fleet
from helpers.reshard import fleet_status, resume_until_over
from helpers.server import as_map, until

KEYS = [f"k:{i}" for i in range(300)]


def written(fleet):
    """Every key written through n0 (`SHARD.CALL WAIT 1`); returns n0's client."""
    coordinator = fleet.primaries["n0"].client(socket_timeout=20)
    pipe = coordinator.pipeline(transaction=False)
    for k in KEYS:
        pipe.execute_command("SHARD.CALL", "WAIT", 1, 1000, "SET", k, f"v:{k}")
    assert all(r == b"OK" for r in pipe.execute())
    return coordinator


RING4 = ["slots", *[x for n in SHARDS for x in (n, "sentinel", 1)]]


def held_at_begin(server_factory, sentinel_factory, clockshim, tmp_path):
    """The fleet, every key written, and the grow to n3 started and held once every node has
    its begin rings, before the copies. Returns the fleet and the coordinator's client."""
    fleet = Fleet(server_factory, sentinel_factory, clockshim, tmp_path,
                  config=[("enable-debug-command", "yes")])
    coordinator = written(fleet)
    assert coordinator.execute_command("SHARD.DEBUG", "FLEET-HOLD", "begin", 4) == b"OK"
    assert coordinator.execute_command("SHARD.RESHARD", "START", *RING4) == b"OK"
    new = fleet_status(coordinator)["new_digest"]
    until(lambda: all(on_ring(fleet.primaries[n], new) for n in SHARDS),
          "every node has the grow's begin rings (the new ring current)")
    return fleet, coordinator


def back_as_a_primary(fleet, server):
    """`server`, killed, started again from its AOF as a primary (as a server back before
    Sentinel turns it into a replica): its keys' count."""
    server.config = [c for c in server.config if c[0] != "replicaof"]
    fleet.restart(server)
    return server.client().dbsize()


def kill_until_down(fleet, name, server):
    """`kill -9` of `name`'s replica `server`, once every sentinel counts it down."""
    fleet.kill(server)
    until(lambda: all(replica_down(s, name) for s in fleet.sentinels),
          f"every sentinel sees {name}'s second server down", timeout=30)


def detach(first, second):
    """`second` stops following `first` (Sentinel still counts it as a replica it could
    promote)."""
    assert second.client().execute_command("REPLICAOF", "NO", "ONE") == b"OK"
    until(lambda: first.client().execute_command("ROLE")[2] == [], "a primary without a replica")


def on_ring(server, digest):
    """Whether `server`'s current ring is the one of `digest`."""
    return as_map(server.client().execute_command("SHARD.RING", "STATE"))["digest"] == digest


def test_a_grow_waits_for_its_copies_to_reach_the_destinations_replica(
        server_factory, sentinel_factory, clockshim, tmp_path):
    fleet, coordinator = held_at_begin(server_factory, sentinel_factory, clockshim, tmp_path)
    first, second = fleet.primaries["n3"], fleet.replicas["n3"]
    # n3's second server leaves its primary: Sentinel still counts it as n3's replica.
    detach(first, second)
    assert coordinator.execute_command("SHARD.DEBUG", "FLEET-HOLD", "OFF") == b"OK"
    moving = [k for k, o in zip(KEYS, owners(coordinator, KEYS)) if o == "n3"]
    assert len(moving) >= 30
    until(lambda: first.client().dbsize() >= len(moving), "the moving keys copied to n3's primary")
    # The second server never got them, and Sentinel may still promote it.
    assert second.client().dbsize() == 0
    assert fleet.role(second) == "master"

    fleet.fail_over_to("n3", second)

    resume_until_over(coordinator, "the grow ends")
    every_key_at_its_owner(fleet, coordinator)


def every_key_at_its_owner(fleet, coordinator):
    """Every key at its owner with its value: the moved ones too."""
    expected = dict(zip(KEYS, owners(coordinator, KEYS)))
    for n in SHARDS:
        s = fleet.primary(n).client()
        mine = [k for k in KEYS if expected[k] == n]
        pipe = s.pipeline(transaction=False)
        for k in mine:
            pipe.execute_command("SHARD.DUMP", k)
        missing = [k for k, v in zip(mine, pipe.execute()) if not v]
        assert not missing, f"{n} lacks {len(missing)} of its {len(mine)} keys: {missing[:10]}"
    assert set(expected.values()) == set(SHARDS)


def test_a_ring_step_waits_for_a_replica_sentinel_could_promote(
        server_factory, sentinel_factory, clockshim, tmp_path):
    """n3's second server stops following its primary before the grow (Sentinel still counts it
    as a replica it could promote): the grow's first step at n3 (its fence rings) is not counted
    done at a primary no replica follows; the coordinator says why and sends it again. Before,
    it counted done at once (`ROLE` listed no replica: none was waited for), and so did every
    later ring step: a promotion of that second server would have lost them all. Once Sentinel
    fails n3 over to the second server, the steps reach it and the grow ends with every key at
    its owner."""
    fleet = Fleet(server_factory, sentinel_factory, clockshim, tmp_path)
    coordinator = written(fleet)
    first, second = fleet.primaries["n3"], fleet.replicas["n3"]
    detach(first, second)
    assert coordinator.execute_command("SHARD.RESHARD", "START", *RING4) == b"OK"
    until(lambda: b"replicas acknowledged" in fleet_status(coordinator)["error"],
          "the coordinator waits for n3's replica", timeout=30)
    assert b"n3" in fleet_status(coordinator)["error"], fleet_status(coordinator)["error"]
    assert fleet_status(coordinator)["phase"] == b"fence"
    fleet.fail_over_to("n3", second)
    resume_until_over(coordinator, "the grow ends")
    every_key_at_its_owner(fleet, coordinator)


def test_a_grow_waits_for_a_destinations_replica_that_is_down(
        server_factory, sentinel_factory, clockshim, tmp_path):
    """n3's second server is killed before the grow copies to n3: Sentinel lists it as a replica
    that is down, which it may promote once it is back, before it has synced (the nemesis test,
    Valkey seed 1171234040: restarted from its AOF as a primary, promoted by a failover, it
    served `list:7` without the 186 acknowledged elements the grow had copied to n3's other
    server). So the grow waits in its copy phase, its sources untouched, saying why. Before,
    the copies counted landed at once (no replica Sentinel could promote then): the grow
    committed and cleaned its sources up, and the failover below lost every moved key. The
    second server comes back from its AOF as a primary and Sentinel fails n3 over to it; the
    copies are sent again, to it, and the grow ends with every key at its owner."""
    fleet, coordinator = held_at_begin(server_factory, sentinel_factory, clockshim, tmp_path)
    first, second = fleet.primaries["n3"], fleet.replicas["n3"]
    kill_until_down(fleet, "n3", second)
    assert coordinator.execute_command("SHARD.DEBUG", "FLEET-HOLD", "OFF") == b"OK"
    moving = [k for k, o in zip(KEYS, owners(coordinator, KEYS)) if o == "n3"]
    assert len(moving) >= 30
    until(lambda: first.client().dbsize() >= len(moving), "the moving keys copied to n3's primary")
    until(lambda: b"replicas acknowledged" in fleet_status(coordinator)["error"],
          "the coordinator waits for n3's replica", timeout=30)
    status = fleet_status(coordinator)
    assert status["phase"] == b"copy" and b"n3" in status["error"], status
    assert sum(fleet.primaries[n].client().dbsize() for n in ("n0", "n1", "n2")) == len(KEYS), \
        "the sources keep every key"

    # Back from its AOF as a primary, without the copies; Sentinel fails n3 over to it.
    assert back_as_a_primary(fleet, second) == 0, "it never had the copies"
    fleet.fail_over_to("n3", second)

    resume_until_over(coordinator, "the grow ends")
    every_key_at_its_owner(fleet, coordinator)


def replica_down(sentinel, name):
    """Whether `sentinel` flags every replica of `name` down."""
    replicas = sentinel.client().execute_command("SENTINEL", "REPLICAS", name)
    return all(b"s_down" in dict(zip(r[::2], r[1::2]))[b"flags"] for r in replicas)


def test_a_cleanup_waits_for_a_nodes_replica_that_is_down(
        server_factory, sentinel_factory, clockshim, tmp_path):
    """n1's second server is killed just before the grow's cleanup: n1's primary deletes the
    keys the grow moved to n3, and its replica, down, never gets the deletions. Sentinel may
    promote it once it is back from its AOF, before it has synced: every deleted key would be
    back at n1, where no ring names it (the ten-minute Redis nemesis run, seed 1228672270:
    `list:3` and `list:7` back at n3 after a cancelled grow, and every later grow refused).
    So the cleanup counts done only once a replica Sentinel may promote has the deletions:
    the grow waits in `cleanup`, saying why. Before, it went on to `done` at once. The second
    server comes back from its AOF as a primary, with the moved keys, and Sentinel fails n1
    over to it; the cleanup runs again there, and the fleet holds every key once, at its
    owner."""
    fleet = Fleet(server_factory, sentinel_factory, clockshim, tmp_path,
                  config=[("enable-debug-command", "yes")])
    coordinator = written(fleet)
    before = dict(zip(KEYS, owners(coordinator, KEYS)))
    first, second = fleet.primaries["n1"], fleet.replicas["n1"]
    assert coordinator.execute_command("SHARD.DEBUG", "FLEET-HOLD", "cleanup", 4) == b"OK"
    assert coordinator.execute_command("SHARD.RESHARD", "START", *RING4) == b"OK"
    until(lambda: fleet_status(coordinator)["phase"] == b"cleanup", "the grow at its cleanup",
          timeout=60)
    after = dict(zip(KEYS, owners(coordinator, KEYS)))
    kept = sum(1 for k in KEYS if after[k] == "n1")
    assert sum(1 for k in KEYS if before[k] == "n1") - kept >= 10, "keys move from n1"
    kill_until_down(fleet, "n1", second)
    assert coordinator.execute_command("SHARD.DEBUG", "FLEET-HOLD", "OFF") == b"OK"
    until(lambda: first.client().dbsize() == kept, "n1's cleanup deleted the moved keys")
    until(lambda: b"replicas acknowledged" in fleet_status(coordinator)["error"],
          "the coordinator waits for n1's replica", timeout=30)
    status = fleet_status(coordinator)
    assert status["phase"] == b"cleanup" and b"n1" in status["error"], status

    # Back from its AOF as a primary, the moved keys still there; Sentinel fails n1 over to it.
    assert back_as_a_primary(fleet, second) > kept, "it never had the deletions"
    fleet.fail_over_to("n1", second)

    resume_until_over(coordinator, "the grow ends")
    every_key_at_its_owner(fleet, coordinator)
    for n in SHARDS:
        mine = sum(1 for k in KEYS if after[k] == n)
        assert fleet.primary(n).client().dbsize() == mine, f"{n} holds keys it does not own"


def test_a_resume_after_giving_up_sends_the_copies_again_to_a_destination_failed_over_meanwhile(
        server_factory, sentinel_factory, clockshim, tmp_path):
    """The coordinator waits for n3's replica, down, until it gives up (its tries spent); then,
    while nothing drives the grow, the operator restarts that replica, which comes back from its
    AOF as a primary without the copies, and Sentinel fails n3 over to it. RESUME runs the
    copy phase's jobs again (`landed::unwatched`): the copies reach the server Sentinel names
    now. Before, RESUME counted the jobs done before it, compared n3's address with itself (no
    failover seen since this run began), had the promoted server's replica acknowledge, and
    went on: the cleanup deleted the sources, and every key the grow gave n3 was lost."""
    fleet = Fleet(server_factory, sentinel_factory, clockshim, tmp_path,
                  config=[("enable-debug-command", "yes")])
    coordinator = written(fleet)
    first, second = fleet.primaries["n3"], fleet.replicas["n3"]
    kill_until_down(fleet, "n3", second)
    assert coordinator.execute_command("SHARD.RESHARD", "START", *RING4) == b"OK"
    until(lambda: fleet_status(coordinator)["running"] == b"no", "the coordinator gives up",
          timeout=120)
    status = fleet_status(coordinator)
    assert status["phase"] == b"copy" and b"gave up" in status["error"], status

    assert back_as_a_primary(fleet, second) == 0, "it never had the copies"
    fleet.fail_over_to("n3", second)

    resume_until_over(coordinator, "the grow ends")
    every_key_at_its_owner(fleet, coordinator)
