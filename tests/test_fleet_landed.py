"""A grow's copies count done only once they reached the destination's replica, at the primary
they were sent to (issue 33, found by the nemesis test: `list:3` and `list:7` lost everything
written before a grow).

The joining node n3 is behind Sentinel; its second server stops following its primary
(`REPLICAOF NO ONE`: as an old primary that Sentinel has not turned into a replica yet, which
is where the nemesis found it). The grow copies n0's, n1's and n2's moving keys to n3's
primary, which has no replica following it; then Sentinel fails n3 over to that second server,
which never got them, and the first server becomes its replica (its data replaced). Before,
the copy counted done at the primary's acknowledgement: the grow settled, committed and
cleaned the keys up at their sources, and after the failover every moved key was gone. Now the
coordinator waits, before the fleet settles, for each destination's replica to acknowledge the
copies (`reshard/fleet/landed.rs`), and a destination that failed over since gets them again.
"""

from helpers.fleet import owners
from helpers.nemesis import SHARDS, Fleet
from helpers.reshard import fleet_status, resume_until_over
from helpers.server import until

KEYS = [f"k:{i}" for i in range(300)]


def test_a_grow_waits_for_its_copies_to_reach_the_destinations_replica(
        server_factory, sentinel_factory, clockshim, tmp_path):
    fleet = Fleet(server_factory, sentinel_factory, clockshim, tmp_path)
    coordinator = fleet.primaries["n0"].client(socket_timeout=20)
    pipe = coordinator.pipeline(transaction=False)
    for k in KEYS:
        pipe.execute_command("SHARD.CALL", "WAIT", 1, 1000, "SET", k, f"v:{k}")
    assert all(r == b"OK" for r in pipe.execute())
    first, second = fleet.primaries["n3"], fleet.replicas["n3"]
    # n3's second server leaves its primary: Sentinel still counts it as n3's replica.
    assert second.client().execute_command("REPLICAOF", "NO", "ONE") == b"OK"
    until(lambda: first.client().execute_command("ROLE")[2] == [], "n3's primary without a replica")

    ring4 = ["slots", *[x for n in SHARDS for x in (n, "sentinel", 1)]]
    assert coordinator.execute_command("SHARD.RESHARD", "START", *ring4) == b"OK"
    until(lambda: fleet_status(coordinator)["phase"] not in (b"fence", b"begin"),
          "the grow past its fence: the new ring current")
    moving = [k for k, o in zip(KEYS, owners(coordinator, KEYS)) if o == "n3"]
    assert len(moving) >= 30
    until(lambda: first.client().dbsize() >= len(moving), "the moving keys copied to n3's primary")
    # The second server never got them, and Sentinel may still promote it.
    assert second.client().dbsize() == 0
    assert fleet.role(second) == "master"

    fleet.fail_over_to("n3", second)

    resume_until_over(coordinator, "the grow ends")
    # Every key at its owner with its value: the moved ones too.
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
