"""Windows of a failover behind Sentinel (issue 33), each driven to its exact step on real
servers: three shards of a primary and a replica with the module on all six, three sentinels
(Debian's `redis-server --sentinel`, quorum 2).

- A restarted old primary (its `shard.self` and its AOF unchanged, so it comes back a primary)
  never acts as its shard's primary before Sentinel makes it a replica: a routed call for its
  shard goes to the primary Sentinel names, or is refused while Sentinel has named none, and
  a cluster client is sent there. The window is held open by stopping the sentinels
  (`SIGSTOP`) before the restart, so that nobody reconfigures the old primary until the test
  lets them go on.
- A copy whose destination fails over mid-copy follows it: the keys lost with the old primary
  (those in flight, those after, and those it acknowledged that its replica never received)
  reach the new primary, and the copy ends with nothing failed.
"""

import signal

import pytest
import redis

from helpers.fleet import keys_of
from helpers.reshard import status, wait_job
from helpers.sentinel import SHARDS, start_sentinel_fleet
from helpers.server import AOF, info_shard, until, wait_in_sync


def master_of(sentinel, name):
    """`host:port` a sentinel names for master `name`."""
    host, port = sentinel.client().execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", name)
    return f"{host.decode()}:{port.decode()}"


def quick_sentinels(fleet):
    """Sentinels that act at once after a pause: no TILT after SIGCONT (it would hold them for
    30 s), and an old primary that comes back is reconfigured within a second or two."""
    for s in fleet.sentinels:
        s.client().execute_command("SENTINEL", "DEBUG", "tilt-trigger", 3_600_000,
                                   "publish-period", 250, "info-period", 500)


def fail_over_n0(fleet):
    """Kills n0's primary; Sentinel promotes its replica. Returns once every sentinel names the
    replica and so knows the old primary as its replica (to reconfigure when it is back)."""
    old, new = fleet.primaries["n0"], fleet.replicas["n0"]
    old.stop(signal.SIGKILL)
    for s in fleet.sentinels:
        until(lambda: master_of(s, "n0") == f"127.0.0.1:{new.port}",
              "every sentinel names n0's new primary", timeout=30)
    until(lambda: new.client().info("replication")["role"] == "master", "n0's replica promoted")


@pytest.mark.slow
def test_a_restarted_old_primary_never_acts_as_its_shards_primary(server_factory,
                                                                  sentinel_factory):
    fleet = start_sentinel_fleet(server_factory, sentinel_factory, extra=AOF)
    quick_sentinels(fleet)
    ring = ["slots", *[x for n in SHARDS for x in (n, "sentinel", 1)]]
    for n in SHARDS:
        fleet.primaries[n].client().execute_command("SHARD.RING", "SET", *ring)
    old, new = fleet.primaries["n0"], fleet.replicas["n0"]
    via = fleet.primaries["n1"].client()
    stale, deleted, a, b, c, d = keys_of(via, "n0", 6, prefix="w")
    via.execute_command("SHARD.CALL", "SET", stale, "before")
    via.execute_command("SHARD.CALL", "SET", deleted, "before")
    wait_in_sync(old.client(), new.client())

    fail_over_n0(fleet)
    new_address = f"127.0.0.1:{new.port}"
    until(lambda: info_shard(via)["node_n0_address"] == new_address, "n1 follows the failover")
    # Written at the new primary after the failover: the old primary's AOF has the old values.
    assert via.execute_command("SHARD.CALL", "SET", stale, "after") == b"OK"
    assert via.execute_command("SHARD.CALL", "DEL", deleted) == 1

    # Nobody reconfigures the old primary while the sentinels are stopped.
    for s in fleet.sentinels:
        s.proc.send_signal(signal.SIGSTOP)
    try:
        old.start()  # same port, same `shard.self n0`, its AOF: a primary again
        p = old.client()
        assert p.info("replication")["role"] == "master"
        assert p.execute_command("SHARD.RING", "GET")[1] == b"slots"
        assert p.get(stale) == b"before" and p.get(deleted) == b"before"

        # Just started, no sentinel answers it (shard.sentinels is not set again yet): a routed
        # write of n0's key is refused, naming n0, not run here as the owner's.
        with pytest.raises(redis.ResponseError) as e:
            p.execute_command("SHARD.CALL", "SET", a, "window")
        assert "n0" in str(e.value), e.value
        p.config_set("shard.cluster-protocol", "yes")
        with pytest.raises(redis.ResponseError,
                           match="^TRYAGAIN this node is not the primary Sentinel names for n0"):
            p.set(b, "window")  # a cluster client's write, sent here directly
        p.config_set("shard.cluster-protocol", "no")
        assert p.get(a) is None and p.get(b) is None

        # A sentinel that knows only the new primary (so it will not reconfigure this one): once
        # it names the new primary, calls go there.
        s4 = sentinel_factory({"n0": new.port})
        p.config_set("shard.sentinels", s4.address)
        until(lambda: info_shard(p)["node_n0_address"] == new_address,
              "the old primary learns the new one")
        assert p.info("replication")["role"] == "master"
        assert p.execute_command("SHARD.CALL", "SET", c, "forwarded") == b"OK"
        assert new.client().get(c) == b"forwarded" and p.get(c) is None
        assert p.execute_command("SHARD.CALL", "GET", stale) == b"after"
        assert p.execute_command("SHARD.CALL", "EXISTS", deleted) == 0
        p.config_set("shard.cluster-protocol", "yes")
        slot = p.execute_command("CLUSTER", "KEYSLOT", d)
        with pytest.raises(redis.ResponseError, match=rf"^MOVED {slot} {new_address}$"):
            p.set(d, "window")
        p.config_set("shard.cluster-protocol", "no")
        assert p.get(d) is None and new.client().get(d) is None
    finally:
        for s in fleet.sentinels:
            s.proc.send_signal(signal.SIGCONT)

    # Sentinel makes it a replica of the new primary: what it held of n0 goes, nothing written
    # to it in the window comes back, and what went to the new primary stays.
    def replica_of_new():
        r = p.info("replication")
        return r["role"] == "slave" and r.get("master_port") == new.port
    until(replica_of_new, "Sentinel makes the old primary a replica", timeout=40)
    wait_in_sync(new.client(), p)
    for server in (new.client(), p):
        assert server.get(stale) == b"after"
        assert server.get(c) == b"forwarded"
        assert server.exists(deleted, a, b, d) == 0
