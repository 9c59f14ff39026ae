"""A replica whose link to its primary is down routes no keyed command by the rings it holds
(issue 33, found by the nemesis test, Valkey seed 1171234040).

A replica gets the fleet's steps only through its link (`reshard/fleet/durable.rs` counts a
step done once the replicas linked then have it), so while the link is down, or its full sync
not over, its rings may be older than the fleet's. In the nemesis run, a replica of n0
restarted from its AOF just before a grow began and waited for its full sync while the grow
went on: it routed an `RPUSH` of `list:7` by the rings before the grow to n0's primary, which
acknowledged it after the grow had copied `list:7` to n3; the cleanup deleted it. Now such a
replica refuses `SHARD.CALL`'s keyed commands with `TRYAGAIN` until its link is up again
(`route/gate.rs`, the server's `MASTER_LINK_CHANGE` event).

The first test points a replica of n0 at a port where nothing listens (its primary gone, for
it), grows the fleet to n3 meanwhile, and sends writes and reads of keys the grow moved from n0
to n3 through that replica. Before, the writes were acknowledged and landed at n0, where no ring
names them (strays, lost to every read through the fleet's rings). Once the replica follows its
primary again it holds the fleet's rings and routes by them. The second test loses the link
the other two ways, with no change of the replica's role: its primary killed, then the replica
restarted from its AOF while its primary is still down (the nemesis's way).
"""
import signal

import pytest
import redis

from helpers.fleet import NAMES3, NAMES4, owners, ring_get, start_fleet
from helpers.ports import free_port
from helpers.reshard import start_resharding, wait_fleet
from helpers.server import AOF, PRIMARY, saved_aof, until

KEYS = [f"l:{i}" for i in range(400)]


def linked(client):
    return client.info("replication").get("master_link_status") == "up"


def test_a_replica_whose_link_is_down_routes_nothing_by_the_rings_it_had(server_factory):
    servers = start_fleet(server_factory, NAMES4, ring=NAMES3, on=NAMES3)
    primary = servers["n0"]
    replica = server_factory(module_args=["self", "n0"],
                             config=[("replicaof", "127.0.0.1", primary.port)])
    c0, r = primary.client(), replica.client()
    until(lambda: linked(r), "the replica linked to n0's primary")
    until(lambda: ring_get(r)["digest"] == ring_get(c0)["digest"], "the replica has the ring")
    # Linked: it routes (a write of n0's key goes to n0's primary).
    n0_key = next(k for k, o in zip(KEYS, owners(c0, KEYS)) if o == "n0")
    assert r.execute_command("SHARD.CALL", "RPUSH", n0_key, "first") == 1

    # Its primary gone, for it: its link down, its rings those of before the grow.
    r.execute_command("REPLICAOF", "127.0.0.1", free_port())
    until(lambda: not linked(r), "the replica's link down")
    before = dict(zip(KEYS, owners(c0, KEYS)))
    assert start_resharding(c0, servers, NAMES4) == b"OK"
    wait_fleet(c0, "done")
    after = dict(zip(KEYS, owners(c0, KEYS)))
    moved = [k for k in KEYS if before[k] == "n0" and after[k] == "n3" and k != n0_key]
    assert len(moved) >= 10
    assert ring_get(r)["digest"] != ring_get(c0)["digest"], "the replica missed the grow"

    for k in moved[:10]:
        with pytest.raises(redis.ResponseError, match=r"^TRYAGAIN this replica's link to its primary is down"):
            r.execute_command("SHARD.CALL", "RPUSH", k, "e1")
        with pytest.raises(redis.ResponseError, match=r"^TRYAGAIN this replica's link"):
            r.execute_command("SHARD.CALL", "LRANGE", k, 0, -1)
    # Nothing landed anywhere: not at n0 (where no ring names these keys), not at n3.
    for n in NAMES4:
        c = servers[n].client()
        assert not any(c.exists(k) for k in moved[:10]), f"a write landed at {n}"

    # Linked again: the fleet's rings reach it, and it routes by them.
    r.execute_command("REPLICAOF", "127.0.0.1", primary.port)
    until(lambda: linked(r), "the replica linked again")
    until(lambda: ring_get(r)["digest"] == ring_get(c0)["digest"], "the replica has the new ring")
    assert r.execute_command("SHARD.CALL", "RPUSH", moved[0], "e2") == 1
    assert servers["n3"].client().lrange(moved[0], 0, -1) == [b"e2"]
    assert not c0.exists(moved[0])
    assert r.execute_command("SHARD.CALL", "LRANGE", moved[0], 0, -1) == [b"e2"]


def test_a_replica_routes_nothing_while_its_primary_is_down_nor_after_a_restart_until_linked(
        server_factory, tmp_path):
    servers = start_fleet(server_factory, NAMES3, config=[*AOF, *PRIMARY])
    primary = servers["n0"]
    replica = server_factory(module_args=["self", "n0"],
                             config=[*AOF, ("replicaof", "127.0.0.1", primary.port)])
    r = replica.client()
    until(lambda: linked(r), "the replica linked to n0's primary")
    c0 = primary.client()
    until(lambda: ring_get(r)["digest"] == ring_get(c0)["digest"], "the replica has the ring")
    n1_key = next(k for k, o in zip(KEYS, owners(c0, KEYS)) if o == "n1")
    assert r.execute_command("SHARD.CALL", "SET", n1_key, "v") == b"OK"

    # Its primary killed: the link drops, the role stays. Even another node's key is refused.
    primary.stop(signal.SIGKILL)
    until(lambda: not linked(r), "the replica's link down")
    with pytest.raises(redis.ResponseError, match=r"^TRYAGAIN this replica's link"):
        r.execute_command("SHARD.CALL", "GET", n1_key)
    # Restarted from its AOF (rewritten whole, with its rings) while its primary is still
    # down: refused from the load on.
    until(lambda: r.info("persistence")["aof_rewrite_in_progress"] == 0,
          "the rewrite after the full sync over")
    saved_aof(replica, tmp_path / "replica-aof")
    replica.stop(signal.SIGKILL)
    replica.start()
    r = replica.client()
    assert not linked(r)
    with pytest.raises(redis.ResponseError, match=r"^TRYAGAIN this replica's link"):
        r.execute_command("SHARD.CALL", "GET", n1_key)
    with pytest.raises(redis.ResponseError, match=r"^TRYAGAIN this replica's link"):
        r.execute_command("SHARD.CALL", "SET", n1_key, "w")

    # Its primary back: linked again, it routes.
    primary.start()
    until(lambda: linked(r), "the replica linked again", timeout=30)
    assert r.execute_command("SHARD.CALL", "GET", n1_key) == b"v"
    assert r.execute_command("SHARD.CALL", "SET", n1_key, "w") == b"OK"
    assert servers["n1"].client().get(n1_key) == b"w"
