"""Windows of a failover behind Sentinel (issue 33), each driven to its exact step on real
servers: three shards of a primary and a replica with the module on all six, three sentinels
(Debian's `redis-server --sentinel`, quorum 2).

- A restarted old primary (its `shard.self` and its AOF unchanged, so it comes back a primary)
  never acts as its shard's primary before Sentinel makes it a replica: a keyed routed call is
  refused (while Sentinel has named none, and once it names another server, whose fleet steps
  this one may have missed), and a cluster client is sent to the primary Sentinel names. The window is held open by stopping the sentinels
  (`SIGSTOP`) before the restart, so that nobody reconfigures the old primary until the test
  lets them go on.
- A copy whose destination fails over mid-copy follows it: the keys lost with the old primary
  (those in flight, those after, and those it acknowledged that its replica never received)
  reach the new primary, and the copy ends with nothing failed.
"""

import signal

import pytest
import redis

from helpers.fleet import keys_of, owners
from helpers.nemesis import SHARDS as SHARDS4, Fleet
from helpers.reshard import status, wait_fleet, wait_job
from helpers.sentinel import SHARDS, start_sentinel_fleet
from helpers.server import AOF, as_map, info_shard, until, wait_in_sync


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
    stale, deleted, a, a2, b, c, c2, d = keys_of(via, "n0", 8, prefix="w")
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
        # write of n0's key is refused, naming n0, not run here as the owner's (the first call of
        # a command goes to SHARD.CALL's handler, the next ones through the command filter).
        for key in (a, a2):
            with pytest.raises(redis.ResponseError) as e:
                p.execute_command("SHARD.CALL", "SET", key, "window")
            assert "n0" in str(e.value), e.value
        p.config_set("shard.cluster-protocol", "yes")
        with pytest.raises(redis.ResponseError,
                           match="^TRYAGAIN this node is not the primary Sentinel names for n0"):
            p.set(b, "window")  # a cluster client's write, sent here directly
        p.config_set("shard.cluster-protocol", "no")
        assert p.exists(a, a2, b) == 0

        # A sentinel that knows only the new primary (so it will not reconfigure this one): once
        # it names the new primary, this server's rings may be older than the fleet's (it
        # missed whatever the fleet did meanwhile), so it routes no keyed call, its own node's
        # keys neither (`test_a_passed_over_primary_routes_nothing_to_another_node`).
        s4 = sentinel_factory({"n0": new.port})
        p.config_set("shard.sentinels", s4.address)
        until(lambda: info_shard(p)["node_n0_address"] == new_address,
              "the old primary learns the new one")
        assert p.info("replication")["role"] == "master"
        for command in (("SET", c, "window"), ("SET", c2, "window"), ("GET", stale),
                        ("EXISTS", deleted)):
            with pytest.raises(redis.ResponseError,
                               match="^TRYAGAIN this server is no longer the primary Sentinel"):
                p.execute_command("SHARD.CALL", *command)
        assert new.client().exists(c, c2) == 0 and p.exists(c, c2) == 0
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
        assert server.exists(deleted, a, a2, b, c, c2, d) == 0


@pytest.mark.slow
def test_a_copy_follows_a_failover_of_its_destination(server_factory, sentinel_factory):
    fleet = start_sentinel_fleet(server_factory, sentinel_factory)
    old, new = fleet.primaries["n0"], fleet.replicas["n0"]
    sentinels = " ".join(s.address for s in fleet.sentinels)
    source = server_factory(config=[("shard.self", "a"), ("shard.sentinels", sentinels),
                                    ("shard.topology-refresh-ms", 200),
                                    ("shard.call-timeout-ms", 1000)])
    a = source.client()
    here = f"127.0.0.1:{source.port}"
    a.execute_command("SHARD.RING", "SET", "ketama", "a", here, 1)
    # Values of 1 KB: each batch of the copy fills the shipper's write buffer and goes out at
    # once (smaller ones would wait for more, and reach the destination all at the end).
    strings = {f"m:{i}": f"v{i}-" + "x" * 1000 for i in range(3000)}
    pipe = a.pipeline(transaction=False)
    for k, v in strings.items():
        pipe.set(k, v)
    for i in range(100):
        pipe.hset(f"h:{i}", mapping={"f": i, "g": "x"})  # these travel as RESTORE
    pipe.execute()
    a.execute_command("SHARD.RING", "BEGIN", "ketama", "a", here, 1, "n0", "sentinel", 1)
    names = [*strings, *(f"h:{i}" for i in range(100))]
    moving = [k for k in names if a.execute_command("SHARD.WHEREIS", k) == b"n0"]
    assert len(moving) > 500
    until(lambda: info_shard(a)["node_n0_address"] == f"127.0.0.1:{old.port}",
          "the source knows n0's primary")

    assert a.execute_command("SHARD.RESHARD", "COPY", "MAXRATE", 200) == b"OK"
    p = old.client()
    until(lambda: p.dbsize() >= 100, "the copy sends keys to n0")
    # The replica frozen and its link cut (it cannot come back while frozen): what the primary
    # takes from now on, only it has.
    new.proc.send_signal(signal.SIGSTOP)
    try:
        assert p.client_kill_filter(_type="slave") == 1
        base = p.dbsize()
        until(lambda: p.dbsize() >= base + 200, "keys taken by n0's primary alone")
        a.execute_command("SHARD.RESHARD", "PAUSE")
        until(lambda: status(a)["in_flight"] == 0, "the paused copy has nothing in flight")
        acknowledged = p.dbsize()
        assert status(a)["state"] == b"copying" and acknowledged < len(moving)
        old.stop(signal.SIGKILL)
    finally:
        new.proc.send_signal(signal.SIGCONT)
    new_address = f"127.0.0.1:{new.port}"
    for s in fleet.sentinels:
        until(lambda: master_of(s, "n0") == new_address, "Sentinel promotes n0's replica",
              timeout=40)
    until(lambda: info_shard(a)["node_n0_address"] == new_address, "the source follows it")
    r = new.client()
    until(lambda: r.info("replication")["role"] == "master", "n0's replica promoted")
    held = sum(r.exists(k) for k in moving)
    assert held < acknowledged, "the old primary took keys its replica never received"
    # Written under the new ring at n0's new primary: newer than the copy's.
    newer = moving[-1]
    r.delete(newer)
    r.set(newer, "newer") if newer.startswith("m:") else r.hset(newer, "f", "newer")

    a.execute_command("SHARD.RESHARD", "THROTTLE", 0)
    a.execute_command("SHARD.RESHARD", "RESUME")
    st = wait_job(a, timeout=60)
    assert st["state"] == b"done" and st["failed"] == 0, st
    assert b"n0 failed over" in st["last_error"], st
    for k in moving[:-1]:
        if k.startswith("m:"):
            assert r.get(k) == strings[k].encode(), k
        else:
            assert r.hgetall(k) == {b"f": k[2:].encode(), b"g": b"x"}, k
    assert (r.get(newer) if newer.startswith("m:") else r.hget(newer, "f")) == b"newer"
    assert r.dbsize() == len(moving)


def test_start_grows_the_fleet_to_a_node_behind_sentinel(server_factory, sentinel_factory,
                                                          clockshim, tmp_path):
    """START to a ring that adds a Sentinel node: its address is asked of Sentinel although no
    ring this server holds names it yet (it was never watched, and START was refused with "its
    address did not come from Sentinel"; found by the nemesis test)."""
    fleet = Fleet(server_factory, sentinel_factory, clockshim, tmp_path)
    c = fleet.primaries["n0"].client(socket_timeout=20)
    keys = [f"k:{i}" for i in range(300)]
    for k in keys:
        assert c.execute_command("SHARD.CALL", "SET", k, k) == b"OK"
    ring = ["slots", *[x for n in SHARDS4 for x in (n, "sentinel", 1)]]
    assert c.execute_command("SHARD.RESHARD", "START", *ring) == b"OK"
    new = wait_fleet(c, "done")["new_digest"]
    # Every server, the joining node's too, holds the new ring alone.
    for s in fleet.servers():
        ring = as_map(s.client().execute_command("SHARD.RING", "GET"))
        assert (ring["digest"], ring["previous"]) == (new, None), (s.port, ring)
    assert [c.execute_command("SHARD.CALL", "GET", k) for k in keys] == [k.encode() for k in keys]
    held = {n: set(fleet.primaries[n].client().keys("k:*")) for n in SHARDS4}
    assert held["n3"], "the joining node got its keys"
    for n, names in held.items():
        assert all(o == n for o in owners(c, sorted(names))), n
    assert sum(len(v) for v in held.values()) == len(keys)


def test_a_fleet_step_is_refused_by_a_server_sentinel_does_not_name(server_factory,
                                                                    sentinel_factory):
    """A coordinator's step (here STOP, with its term) sent to a server that calls itself n0
    while Sentinel names another server as n0's primary is refused with TRYAGAIN, so the
    coordinator sends it again to the primary Sentinel names; a server Sentinel names takes it.
    (The nemesis test found a joining node's rings lost this way: a step taken by a server that
    Sentinel then turned into a replica.)"""
    fleet = start_sentinel_fleet(server_factory, sentinel_factory)
    rogue = fleet.replicas["n0"].client()
    # n0's replica made a primary behind Sentinel's back: Sentinel still names the old one.
    assert rogue.execute_command("REPLICAOF", "NO", "ONE") == b"OK"
    run_id = rogue.info("server")["run_id"]
    step = ["SHARD.RESHARD", "STOP", "TERM", 1, 10000, "n1",
            f"127.0.0.1:{fleet.primaries['n1'].port}", run_id]
    with pytest.raises(redis.ResponseError,
                       match=r"^TRYAGAIN this server is not the primary Sentinel names for n0"):
        rogue.execute_command(*step)
    # The primary Sentinel names takes the step (and answers as STOP does with no job).
    with pytest.raises(redis.ResponseError, match=r"^no resharding job is running"):
        fleet.primaries["n0"].client().execute_command(*step)


@pytest.mark.slow
def test_a_passed_over_primary_routes_nothing_to_another_node(server_factory, sentinel_factory):
    """An old primary that Sentinel failed over away from, not restarted, acts as a primary
    until Sentinel turns it into a replica; the fleet's steps go to the primary Sentinel names
    meanwhile, so its rings may be older than the fleet's. A write it routed by them to a key's
    old owner ran there (the module's connections are obeyed) and was lost to the cleanup (the
    nemesis test, Valkey seed 519702395), and a read there missed acknowledged writes (Redis
    seed 7). It refuses every keyed command now, with TRYAGAIN, its own node's keys too: a key
    its rings call its node's may be another node's by the fleet's rings (Redis seed 1234: bad
    reads through such a server after a shrink took its node out); before, such a call was
    forwarded to the primary Sentinel names, which ran it without asking its rings."""
    fleet = start_sentinel_fleet(server_factory, sentinel_factory)
    quick_sentinels(fleet)
    ring = ["slots", *[x for n in SHARDS for x in (n, "sentinel", 1)]]
    for n in SHARDS:
        fleet.primaries[n].client().execute_command("SHARD.RING", "SET", *ring)
    old, new = fleet.primaries["n0"], fleet.replicas["n0"]
    wait_in_sync(old.client(), new.client())
    new_address = f"127.0.0.1:{new.port}"

    def failed_over():
        if master_of(fleet.sentinels[0], "n0") == new_address:
            return True
        try:  # asked again while Sentinel has no replica it counts as good yet
            fleet.sentinels[0].client().execute_command("SENTINEL", "FAILOVER", "n0")
        except redis.ResponseError:
            pass
        return False
    until(failed_over, "Sentinel fails n0 over to its replica", timeout=60, every=0.5)
    for s in fleet.sentinels:
        until(lambda: master_of(s, "n0") == new_address, "every sentinel names n0's new primary",
              timeout=30)
    until(lambda: old.client().info("replication").get("master_port") == new.port,
          "Sentinel makes the old primary a replica")
    for s in fleet.sentinels:
        s.proc.send_signal(signal.SIGSTOP)
    try:
        # A primary again behind Sentinel's back, and a sentinel that names the new one.
        p = old.client()
        assert p.execute_command("REPLICAOF", "NO", "ONE") == b"OK"
        s4 = sentinel_factory({"n0": new.port})
        p.config_set("shard.sentinels", s4.address)
        until(lambda: info_shard(p)["node_n0_address"] == new_address,
              "the old primary learns the new one")
        # The fleet moves on without it: n2 leaves the ring, and n1 takes some of n0's keys.
        smaller = ["slots", "n0", "sentinel", 1, "n1", "sentinel", 3]
        for server in (new, fleet.primaries["n1"], fleet.primaries["n2"]):
            server.client().execute_command("SHARD.RING", "SET", *smaller)
        names = [f"k:{i}" for i in range(400)]
        stale = owners(p, names)
        fresh = owners(new.client(), names)
        moved = [k for k, a, b in zip(names, stale, fresh) if a == "n2" and b == "n1"]
        own = [k for k, a, b in zip(names, stale, fresh) if a == b == "n0"]
        taken = [k for k, a, b in zip(names, stale, fresh) if a == "n0" and b == "n1"]
        assert moved and own and taken
        for key in moved[:5]:
            with pytest.raises(redis.ResponseError,
                               match="^TRYAGAIN this server is no longer the primary Sentinel"):
                p.execute_command("SHARD.CALL", "SET", key, "stale")
            assert fleet.primaries["n2"].client().get(key) is None
        with pytest.raises(redis.ResponseError,  # nor read by rings that may be stale
                           match="^TRYAGAIN this server is no longer the primary Sentinel"):
            p.execute_command("SHARD.CALL", "GET", moved[0])
        # Nor its own node's keys, by rings that may be stale: n1 owns `taken` now.
        fleet.primaries["n1"].client().set(taken[0], "fresh")
        for command in (("SET", own[0], "stale"), ("GET", taken[0]), ("SET", taken[0], "stale")):
            with pytest.raises(redis.ResponseError,
                               match="^TRYAGAIN this server is no longer the primary Sentinel"):
                p.execute_command("SHARD.CALL", *command)
        assert new.client().get(own[0]) is None and p.get(own[0]) is None
        assert fleet.primaries["n1"].client().get(taken[0]) == b"fresh"
        assert new.client().get(taken[0]) is None
    finally:
        for s in fleet.sentinels:
            s.proc.send_signal(signal.SIGCONT)
