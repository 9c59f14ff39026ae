"""High availability: ring nodes behind Redis Sentinel, failovers followed without a ring change,
reads from replicas.

Real processes on loopback: Debian's `redis-server --sentinel` (three sentinels, quorum 2), and
three shards each of a primary and a replica with the module loaded on all six.
"""

import signal
import time

import pytest
import redis

from helpers.fleet import keys_of, ring_get
from helpers.ports import free_port
from helpers.sentinel import SHARDS, Failover, start_sentinel_fleet
from helpers.server import command_calls, info_shard, until


def replicated(fleet, n):
    """Waits until n's replica acknowledged every write n's primary has had (one `WAIT 1 2000`
    may end first on a loaded machine, and a read at the replica then finds no value)."""
    p = fleet.primaries[n].client()
    until(lambda: p.execute_command("WAIT", 1, 2000) == 1, f"{n}'s replica acknowledged",
          timeout=30)


@pytest.fixture
def fleet(server_factory, sentinel_factory):
    return start_sentinel_fleet(server_factory, sentinel_factory)


def test_sentinel_nodes_resolve_and_show_where_they_are(fleet):
    c = fleet.primaries["n1"].client()
    got = ring_get(c)
    for node in got["nodes"]:
        name = node["name"].decode()
        assert node["address"] == b"sentinel"
        want = f"127.0.0.1:{fleet.primaries[name].port}".encode()
        until(lambda: ring_get(c)["nodes"][SHARDS.index(name)]["resolved"] == want,
              f"{name} resolved", timeout=5)
        assert info_shard(c)[f"node_{name}_address"] == want.decode()
    key = fleet.keys_of(c, "n0", 1)[0]
    loc = c.execute_command("SHARD.LOCATE", key)
    assert loc[3] == f"127.0.0.1:{fleet.primaries['n0'].port}".encode()
    assert c.execute_command("SHARD.CALL", "SET", key, "v") == b"OK"
    assert fleet.primaries["n0"].client().get(key) == b"v"
    # A replica forwards a routed write of its own shard to its primary.
    r0 = fleet.replicas["n0"].client()
    assert r0.execute_command("SHARD.CALL", "SET", key, "w") == b"OK"
    assert fleet.primaries["n0"].client().get(key) == b"w"
    assert info_shard(c)["sentinel_subscribed"] == "yes"


@pytest.mark.slow
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "frozen"])
def test_failover_is_followed_without_a_ring_change(fleet, how):
    """A primary killed, or frozen (its calls in flight then end at the call timeout, or when
    the switch closes their connections: never later)."""
    c1 = fleet.primaries["n1"].client()
    digest = ring_get(c1)["digest"]
    f = Failover(fleet, how, 50, serve_within=1.0)
    print(f"\nfailover: +switch-master {f.switched - f.killed_at:.2f}s after the kill; "
          f"n0's keys served everywhere {f.back_at - f.switched:.2f}s after it")
    new_address = f"127.0.0.1:{f.new.port}"
    for label, server in f.nodes.items():
        c = server.client()
        assert ring_get(c)["digest"] == digest
        if label != "n0 (promoted)":
            shard = info_shard(c)
            assert int(shard["failovers_seen"]) >= 1
            assert shard["node_n0_address"] == new_address
            assert c.execute_command("SHARD.LOCATE", f.n0_keys[0])[3] == new_address.encode()
    # No call hung: each returned within the call timeout (1 s) and a margin.
    for w in f.writers:
        assert w.slowest < 2.5, w.slowest
        for at, message in w.errors:
            assert "n0" in message, message
    lost_before, lost_after = f.lost()
    acked = sum(len(w.acked) for w in f.writers)
    print(f"acknowledged writes: {acked}; last values lost by the failover (acknowledged before "
          f"the kill, not yet replicated): {lost_before}; lost after the kill: {lost_after}")
    assert lost_after == 0


def test_reads_go_to_replicas_and_writes_to_primaries(fleet):
    entry = fleet.primaries["n0"]
    c = entry.client()
    keys = {n: fleet.keys_of(c, n, 20, prefix="r") for n in SHARDS}
    for n in SHARDS:
        for k in keys[n]:
            c.execute_command("SHARD.CALL", "SET", k, f"v-{k}")
        replicated(fleet, n)

    c.config_set("shard.read-from", "replica")
    until(lambda: all(ring_get(c)["nodes"][i]["replicas"] for i in range(3)),
          "replicas known", timeout=30)
    before = {n: (command_calls(fleet.primaries[n], "get"), command_calls(fleet.replicas[n], "get"))
              for n in SHARDS}
    for n in SHARDS:
        for k in keys[n]:
            assert c.execute_command("SHARD.CALL", "GET", k) == f"v-{k}".encode()
        # A split read too: MGET over the three shards.
    assert c.execute_command("SHARD.CALL", "MGET", keys["n0"][0], keys["n1"][0], keys["n2"][0]) == [
        f"v-{keys[n][0]}".encode() for n in SHARDS]
    for n in SHARDS:
        p, r = before[n]
        assert command_calls(fleet.primaries[n], "get") == p, n
        assert command_calls(fleet.replicas[n], "get") == r + len(keys[n]), n
    assert int(info_shard(c)["replica_reads"]) == 60 + 3
    # Writes still go to the primaries.
    set_before = {n: command_calls(fleet.primaries[n], "set") for n in SHARDS}
    for n in SHARDS:
        assert c.execute_command("SHARD.CALL", "SET", keys[n][0], "w") == b"OK"
        assert command_calls(fleet.primaries[n], "set") == set_before[n] + 1
        assert fleet.primaries[n].client().get(keys[n][0]) == b"w"


def test_a_shard_without_its_replica(fleet):
    c = fleet.primaries["n0"].client()
    key = fleet.keys_of(c, "n1", 1, prefix="d")[0]
    c.execute_command("SHARD.CALL", "SET", key, "value")
    c.config_set("shard.read-from", "replica-preferred")
    until(lambda: ring_get(c)["nodes"][1]["replicas"], "n1's replica known", timeout=5)
    fleet.replicas["n1"].stop(signal.SIGKILL)
    before = command_calls(fleet.primaries["n1"], "get")
    # replica-preferred: every read answers, from the primary once the replica is gone.
    for _ in range(20):
        assert c.execute_command("SHARD.CALL", "GET", key) == b"value"
    assert command_calls(fleet.primaries["n1"], "get") >= before + 1
    assert int(info_shard(c)["replica_fallbacks"]) >= 1
    # replica: an error naming the shard.
    c.config_set("shard.read-from", "replica")
    with pytest.raises(redis.ResponseError) as e:
        c.execute_command("SHARD.CALL", "GET", key)
    assert "n1" in str(e.value) and "replica" in str(e.value), e.value
    # The other shards still read from their replicas.
    other = fleet.keys_of(c, "n2", 1, prefix="d")[0]
    c.execute_command("SHARD.CALL", "GET", other)


def test_a_sentinel_that_is_down_is_skipped(server_factory, sentinel_factory):
    fleet = start_sentinel_fleet(server_factory, sentinel_factory,
                        sentinel_list=lambda s: " ".join([f"127.0.0.1:{free_port()}"] +
                                                         [x.address for x in s]))
    c = fleet.primaries["n2"].client()
    key = fleet.keys_of(c, "n0", 1)[0]
    assert c.execute_command("SHARD.CALL", "SET", key, "v") == b"OK"
    assert fleet.primaries["n0"].client().get(key) == b"v"
    assert info_shard(c)["sentinel_subscribed"] == "yes"


def test_all_sentinels_down(server_factory):
    # A node with no sentinel to ask: its sentinel nodes fail clearly, its plain nodes work.
    dead = f"127.0.0.1:{free_port()} 127.0.0.1:{free_port()}"
    s = server_factory(config=[("shard.self", "n3"), ("shard.sentinels", dead),
                               ("shard.call-timeout-ms", 1000)])
    c = s.client()
    c.execute_command("SHARD.RING", "SET", "ketama", "n0", "sentinel", 1,
                      "n3", f"127.0.0.1:{s.port}", 1)
    n0_key = keys_of(c, "n0", 1, prefix="k")[0]
    n3_key = keys_of(c, "n3", 1, prefix="k")[0]
    started = time.monotonic()
    with pytest.raises(redis.ResponseError) as e:
        c.execute_command("SHARD.CALL", "SET", n0_key, "v")
    assert time.monotonic() - started < 2.5
    message = str(e.value)
    assert "n0" in message and "sentinel" in message, message
    assert c.execute_command("SHARD.CALL", "SET", n3_key, "v") == b"OK"
    assert c.get(n3_key) == b"v"
    assert info_shard(c)["sentinel_error"] != ""
    ring = ring_get(c)
    assert ring["nodes"][0]["address"] == b"sentinel" and ring["nodes"][0]["resolved"] is None
    assert c.execute_command("SHARD.LOCATE", n0_key)[3] == b"sentinel"


def test_a_known_address_is_kept_when_every_sentinel_dies(fleet):
    c = fleet.primaries["n1"].client()
    key = fleet.keys_of(c, "n0", 1)[0]
    assert c.execute_command("SHARD.CALL", "SET", key, "before") == b"OK"
    for s in fleet.sentinels:
        s.stop()
    until(lambda: info_shard(c)["sentinel_subscribed"] == "no", "subscription lost", timeout=5)
    time.sleep(0.5)  # a few refresh intervals (200 ms) with no sentinel answering
    # Sentinel being away says nothing about the primary: calls still go to it.
    assert c.execute_command("SHARD.CALL", "SET", key, "after") == b"OK"
    assert fleet.primaries["n0"].client().get(key) == b"after"
    assert info_shard(c)["node_n0_address"] == f"127.0.0.1:{fleet.primaries['n0'].port}"
    assert info_shard(c)["sentinel_error"] != ""


def test_read_from_replica_reads_at_once(fleet, server_factory):
    """`CONFIG SET shard.read-from replica` looks the replicas up at once: the first read right
    after it waits for that look instead of failing ('its replicas are not known yet'), for
    Sentinel nodes (SENTINEL replicas) and plain ones (the primary's ROLE)."""
    c = fleet.primaries["n2"].client()
    # The first read waits for the look-up up to the call timeout: 1 s is short for Sentinel's
    # answer on a loaded machine (a read that did not wait fails at once all the same).
    c.config_set("shard.call-timeout-ms", 10_000)
    keys = {n: fleet.keys_of(c, n, 1, prefix="now")[0] for n in SHARDS}
    for n in SHARDS:
        c.execute_command("SHARD.CALL", "SET", keys[n], f"v-{n}")
        replicated(fleet, n)
    gets = {n: command_calls(fleet.replicas[n], "get") for n in SHARDS}
    c.config_set("shard.read-from", "replica")
    for n in SHARDS:
        assert c.execute_command("SHARD.CALL", "GET", keys[n]) == f"v-{n}".encode()
        assert command_calls(fleet.replicas[n], "get") == gets[n] + 1
    # A plain ring node: its replicas from its ROLE.
    primary = server_factory(config=[("shard.self", "p"), ("repl-diskless-sync-delay", 0),
                                     ("shard.call-timeout-ms", 10_000)])
    replica = server_factory(config=[("replicaof", "127.0.0.1", primary.port)])
    p = primary.client()
    p.execute_command("SHARD.RING", "SET", "ketama", "p", f"127.0.0.1:{primary.port}", 1)
    p.set("k", "v")
    until(lambda: p.execute_command("WAIT", 1, 100) == 1, "the replica in sync")
    p.config_set("shard.read-from", "replica")
    assert p.execute_command("SHARD.CALL", "GET", "k") == b"v"
    assert command_calls(replica, "get") == 1
