"""An old primary restarted from an AOF older than a grow, while Sentinel names its former
replica for its node, routes no write by its old rings (issue 33, found by the nemesis test).

Its rings are checked after the load (`reshard/fleet/repair.rs`), and its writes refused until
then (`route/gate.rs`), but no push can bring it the fleet's rings: pushes go to the servers
Sentinel names, and it is not one. Before, the check's bound lifted the gate anyway, and until
Sentinel turned the server into a replica (about ten seconds) it acknowledged writes routed by
its old ring to keys' old owners, whose copies the fleet no longer reads (the nemesis lost an
element this way: routed to n0 after the grow had copied `list:3` to n3). Now the gate stays
closed while Sentinel names another server for its node.

The test holds the check at start (`SHARD_DEBUG_HOLD_RING_CHECK=yes`), lets it go once the
server knows whom Sentinel names, and acts once the check's bound has passed: the server's log
says either that its writes are accepted again (before) or that they stay refused (now).
"""
import shutil
import signal

import redis

from helpers.fleet import owners
from helpers.nemesis import SHARDS, Fleet
from helpers.reshard import wait_fleet
from helpers.server import saved_aof, until

KEYS = [f"k:{i}" for i in range(300)]
LIFTED = "its writes are accepted again"
KEPT = "Sentinel names another server for this node"


def test_an_old_primary_passed_over_by_sentinel_routes_no_write_by_its_old_rings(
        server_factory, sentinel_factory, clockshim, tmp_path):
    fleet = Fleet(server_factory, sentinel_factory, clockshim, tmp_path,
                  config=[("enable-debug-command", "yes")])
    coordinator = fleet.primaries["n0"].client(socket_timeout=20)
    before = dict(zip(KEYS, owners(coordinator, KEYS)))
    old, new = fleet.primaries["n2"], fleet.replicas["n2"]
    old_aof = saved_aof(old, tmp_path / "n2-aof-before-the-grow")

    fleet.fail_over_to("n2", new)
    ring4 = ["slots", *[x for n in SHARDS for x in (n, "sentinel", 1)]]
    assert coordinator.execute_command("SHARD.RESHARD", "START", *ring4) == b"OK"
    wait_fleet(coordinator, "done")
    moved = [k for k, o in zip(KEYS, owners(coordinator, KEYS)) if o == "n3" and before[k] != "n3"]
    assert len(moved) >= 10

    # The old primary back from its AOF of before the grow, as a primary: Sentinel names the
    # other server for n2.
    old.stop(signal.SIGKILL)
    shutil.rmtree(old.workdir / "appendonlydir")
    shutil.copytree(old_aof, old.workdir / "appendonlydir")
    old.config = [c for c in old.config if c[0] != "replicaof"]
    old.env = dict(old.env or {}, SHARD_DEBUG_HOLD_RING_CHECK="yes")
    log_from = len(old.log())
    old.start()
    c = old.client(socket_timeout=20)
    c.config_set("shard.cluster-protocol", "yes")
    until(lambda: c.info("shard").get("shard_node_n2_address") == f"127.0.0.1:{new.port}",
          "the old primary knows whom Sentinel names for n2")
    assert c.execute_command("SHARD.DEBUG", "RING-CHECK", "GO") == b"OK"
    until(lambda: LIFTED in old.log()[log_from:] or KEPT in old.log()[log_from:],
          "the check's bound passed", timeout=30)
    # Still passed over (Sentinel takes seconds to make it a replica), on its old rings.
    assert fleet.role(old) == "master" and fleet.master_address("n2") == new.port
    acked, refused = [], []
    for k in moved[:10]:
        try:
            c.execute_command("SHARD.CALL", "RPUSH", f"l:{k}", "e1")
            acked.append(k)
        except redis.ResponseError as e:
            refused.append(str(e))
    assert not acked, (f"{len(acked)} of 10 writes acknowledged by the old rings: "
                       f"{acked[:5]}")
    assert all(r.startswith("TRYAGAIN this node's rings are being checked") for r in refused), \
        refused[:3]
    assert LIFTED not in old.log()[log_from:]
