"""A node that left the ring takes no write routed to it (issue 33, the nemesis test's stray
keys, Redis seed 1234): after a shrink's `CLEANUP LEFT` emptied it, a write routed by rings
older than the fleet's still reached it and ran there (the module's connections are obeyed),
leaving a key no ring names: a stray that breaks "every key at its owner only" and that a later
grow bringing the node back would copy or count; with the client still waiting, the write was
acknowledged and lost. In the nemesis the sender was a primary Sentinel had passed over, back
from `SIGSTOP` and serving what its clients sent meanwhile before its watcher learnt it: it
holds the rings from before the shrink. Here the sender is a server that holds those rings
because no step of the shrink reaches it (it is in neither ring), the same state without the
race. The node that left now refuses such a write with `TRYAGAIN`, which the sender replies;
its plain clients' writes still run, and deletes (which create nothing) still reach it."""

import pytest
import redis

from helpers.fleet import ring_args, start_fleet
from helpers.reshard import wait_fleet

NAMES = ["n0", "n1", "n2"]
KEYS = [f"k:{i}" for i in range(300)]


@pytest.mark.parametrize("protocol", [False, True], ids=["plain", "cluster-protocol"])
def test_a_write_routed_by_old_rings_to_a_node_that_left_is_refused(server_factory, protocol):
    algo = "slots" if protocol else "ketama"
    # `x` holds the three-node ring and is in no ring: the shrink's steps never reach it.
    servers = start_fleet(server_factory, [*NAMES, "x"], ring=NAMES, algo=algo)
    if protocol:
        for n in NAMES:
            servers.client(n).config_set("shard.cluster-protocol", "yes")
    n0, x, left = servers.client("n0"), servers.client("x"), servers.client("n2")
    old = dict(zip(KEYS, servers.owners(KEYS, via="x")))
    for k in KEYS:
        assert n0.execute_command("SHARD.CALL", "SET", k, "before") == b"OK"
    assert n0.execute_command("SHARD.RESHARD", "START", algo,
                              *ring_args(servers, NAMES[:2])) == b"OK"
    wait_fleet(n0)
    assert left.dbsize() == 0, "CLEANUP LEFT empties the node that left"
    assert servers.owners(KEYS, via="n0") != list(old.values())
    # Writes routed by x's old rings: those of the keys the old ring gave to n2 go there.
    acked, refused = [], []
    for k in KEYS:
        try:
            reply = x.execute_command("SHARD.CALL", "SET", k, "after")
        except redis.ResponseError as e:
            assert str(e).startswith("TRYAGAIN this node is outside its rings"), e
            assert old[k] == "n2", (k, old[k], e)
            refused.append(k)
            continue
        assert reply == b"OK"
        acked.append(k)
    # Nothing was left at the node that left, and no acknowledged write is lost: each reads
    # back through the fleet; a refused one keeps the value before.
    assert left.dbsize() == 0, f"stray keys at the node that left: {left.keys()[:5]}"
    for k in acked:
        assert n0.execute_command("SHARD.CALL", "GET", k) == b"after", k
    for k in refused:
        assert n0.execute_command("SHARD.CALL", "GET", k) == b"before", k
    assert refused, "no write was routed to the node that left"
    # A delete routed there still runs (it creates nothing), and a plain client of the node
    # that left writes there as before (with the cluster protocol on, it is sent elsewhere).
    assert x.execute_command("SHARD.CALL", "DEL", refused[0]) == 0
    if protocol:
        with pytest.raises(redis.ResponseError, match="^MOVED"):
            left.set(refused[0], "plain")
    else:
        assert left.set(refused[0], "plain") is True
        assert left.get(refused[0]) == b"plain"
