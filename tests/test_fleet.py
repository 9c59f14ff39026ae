"""Fleet operations between real servers (issue 15): one command grows or shrinks the fleet.

- `SHARD.RESHARD START` grows 3 -> 4 and shrinks 4 -> 3, each from a node that is not the
  leaving one and with no other command: every key ends exactly once at its owner, unchanged,
  and every node holds the same ring with no resharding open.
- START refuses, naming the node, when a node is missing, down, holds another ring, joins with
  keys, or has another `shard.self`; after a refusal no node has a resharding open.
- `SHARD.RESHARD CANCEL` mid-copy while clients write moving keys through SHARD.CALL: the fleet is
  back on the old ring with every acknowledged write, and no key on a node that does not own it.
- The coordinator killed with SIGKILL mid-copy (AOF on) and restarted: STATUS shows where it
  stood, `SHARD.RESHARD RESUME` finishes the resharding.
- `SHARD.RING CHECK` (agreement, each node's share of the ketama circle against uhashring's own
  points) and `SHARD.RING PUSH`.

Replies are RESP2 (maps arrive as flat lists); `as_map` turns them into dicts.
"""

import re
import signal
import time

import pytest
import redis
from uhashring import HashRing

from helpers.fleet import (NAMES3, NAMES4, assert_in_place, assert_owned_only, check_placement,
                           owners, populate, ring_args, ring_of, set_ring, snapshot, start_fleet)
from helpers.ports import free_port
from helpers.reshard import (assert_no_resharding, assert_one_ring, check_done, fleet_status,
                             start_resharding, wait_copying, wait_fleet)
from helpers.server import AOF, PRIMARY, as_map
from helpers.writers import Writers, check_writes, set_through

# MAXRATE limits the keys a copy *sends* per second, per source. Growing 3 -> 4 moves about a
# quarter of the keys, so with 30 000 keys each of the three sources sends about 2 500: about
# 2.5 s at 1 000 keys/s, long enough to cancel or kill the coordinator in the middle.
SLOW_KEYS = 30_000
SLOW_RATE = 1000


def share(value):
    return float(value.decode() if isinstance(value, bytes) else value)


def fleet_of_four(server_factory, config=()):
    """n0..n3 with `self` set; the ring of n0..n2 is set on those nodes only: n3 holds no ring
    and no keys."""
    return start_fleet(server_factory, NAMES4, ring=NAMES3, on=NAMES3, config=config)


# --- tests -----------------------------------------------------------------------------------


def test_start_grows_three_to_four_and_shrinks_back_from_a_staying_node(server_factory):
    servers = fleet_of_four(server_factory)
    keys = populate({n: servers[n] for n in NAMES3}, n=20_000, seed=11)
    before = snapshot(servers, keys)
    assert all(len(h) == 1 for h in before.values())
    old = assert_one_ring(servers, NAMES3, on=NAMES3)

    # Grow from n1: n3 has no ring and no keys; START alone does everything.
    c1 = servers["n1"].client()
    assert start_resharding(c1, servers, NAMES4) == b"OK"
    st = wait_fleet(c1, "done")
    new = assert_one_ring(servers, NAMES4)
    assert new != old
    check_done(st, old, new, {"n0": "both", "n1": "both", "n2": "both", "n3": "new"})
    check_placement(servers, NAMES4, keys, before)  # all four: every key once, at its owner
    # Done: nothing to cancel any more, nor to resume.
    with pytest.raises(redis.ResponseError, match="no fleet operation to cancel"):
        c1.execute_command("SHARD.RESHARD", "CANCEL")
    with pytest.raises(redis.ResponseError, match="nothing to resume"):
        c1.execute_command("SHARD.RESHARD", "RESUME")

    # Shrink from n2, n3 leaving.
    c2 = servers["n2"].client()
    assert start_resharding(c2, servers, NAMES3) == b"OK"
    st = wait_fleet(c2, "done")
    back = assert_one_ring(servers, NAMES3)  # the node that left holds the new ring too
    assert back == old, "the same ring as at first: the same digest"
    check_done(st, new, back, {"n0": "both", "n1": "both", "n2": "both", "n3": "old"})
    # Every key once at its owner among n0..n2, unchanged; and nothing left on n3.
    check_placement(servers, NAMES3, keys, before)
    assert servers["n3"].client().dbsize() == 0


def test_start_refuses_naming_the_node_and_opens_nothing(server_factory):
    servers = fleet_of_four(server_factory, config=AOF)  # AOF: n2 is killed and restarted below
    keys = populate({n: servers[n] for n in NAMES3}, n=600, seed=12)
    before = snapshot(servers, keys)
    old = assert_one_ring(servers, NAMES3, on=NAMES3)
    c0 = servers["n0"].client()

    def refused(who, live=NAMES4, extra=(), names=NAMES4):
        with pytest.raises(redis.ResponseError) as e:
            start_resharding(c0, servers, names, extra=extra)
        msg = str(e.value)
        assert re.search(rf"\b{who}\b", msg), f"the refusal does not name {who}: {msg}"
        assert fleet_status(c0) is None, "a refused START leaves no plan"
        assert_no_resharding(servers, live)
        assert ring_of(servers["n3"].client()) is None, "the joining node got no ring"
        return msg

    # (a) A node of the new ring where nothing listens.
    refused("n9", extra=["n9", f"127.0.0.1:{free_port()}", 1])
    assert_one_ring(servers, NAMES3, on=NAMES3)

    # (c) A node holding another ring (other weights).
    n1 = servers["n1"].client()
    n1.execute_command("SHARD.RING", "SET", "ketama", "n0", f"127.0.0.1:{servers['n0'].port}", 1,
                       "n1", f"127.0.0.1:{servers['n1'].port}", 2,
                       "n2", f"127.0.0.1:{servers['n2'].port}", 1)
    refused("n1")
    set_ring(servers, NAMES3, [servers["n1"]])
    assert assert_one_ring(servers, NAMES3, on=NAMES3) == old

    # (d) A joining node that holds keys (in two databases): named with its key count.
    n3 = servers["n3"]
    n3.client().mset({f"stale:{i}": i for i in range(5)})
    n3.client(db=3).mset({"stale:db3:a": 1, "stale:db3:b": 2})
    msg = refused("n3")
    assert re.search(r"\b7\b", msg), f"the refusal does not give n3's 7 keys: {msg}"
    n3.client().flushall()

    # (e) A node whose shard.self is not its ring name.
    n2 = servers["n2"].client()
    n2.config_set("shard.self", "zz")
    refused("n2")
    n2.config_set("shard.self", "n2")

    # (b) A node of the old ring that was killed.
    servers["n2"].stop(signal.SIGKILL)
    refused("n2", live=["n0", "n1", "n3"])
    assert_one_ring(servers, NAMES3, on=["n0", "n1"])
    servers["n2"].start()
    assert assert_one_ring(servers, NAMES3, on=NAMES3) == old

    # Nothing was left behind: the same START now goes through.
    assert start_resharding(c0, servers, NAMES4) == b"OK"
    wait_fleet(c0, "done")
    assert_one_ring(servers, NAMES4)
    check_placement(servers, NAMES4, keys, before)


@pytest.mark.slow
def test_cancel_mid_copy_keeps_every_acknowledged_write_on_the_old_ring(server_factory):
    servers = fleet_of_four(server_factory)
    keys = populate({n: servers[n] for n in NAMES3}, n=SLOW_KEYS, seed=13)
    c0 = servers["n0"].client()
    counters = [f"cnt:{i}" for i in range(400)]
    set_through(c0, counters, 1000)
    strings = [k for k in keys if k.endswith(":string")]
    watched = strings + counters
    old_owner = dict(zip(watched, owners(c0, watched)))
    pipe = c0.pipeline(transaction=False)
    for k in strings:
        pipe.execute_command("SHARD.CALL", "GET", k)
    initial = dict(zip(strings, pipe.execute()))
    before = snapshot(servers, keys)
    old = assert_one_ring(servers, NAMES3, on=NAMES3)

    assert start_resharding(c0, servers, NAMES4, maxrate=SLOW_RATE) == b"OK"
    # Once the copy runs, BEGIN is done everywhere: SHARD.WHEREIS answers from the new ring.
    wait_copying(c0)
    new_owner = dict(zip(watched, owners(c0, watched)))
    moving_strings = [k for k in strings if new_owner[k] != old_owner[k]][:240]
    moving_counters = [k for k in counters if new_owner[k] != old_owner[k]]
    assert len(moving_strings) == 240 and len(moving_counters) > 40
    writers = Writers(servers, NAMES4, 4, counters=moving_counters,
                      values=[moving_strings[t::4] for t in range(4)], seed=13)
    writers.start()
    try:
        writers.wait_acknowledged(150)  # writes of moving keys while the copy runs
        st = fleet_status(c0)
        assert st["phase"] == b"copy", f"the copy ended before CANCEL: more keys or a lower MAXRATE: {st}"
        assert c0.execute_command("SHARD.RESHARD", "CANCEL") == b"OK"
        st = wait_fleet(c0, "cancelled")
    finally:
        writers.stop()
    assert writers.acknowledged() > 100, writers.summary()

    # Every node (the joining one too) is on the old ring alone.
    assert assert_one_ring(servers, NAMES3) == old, st
    assert servers["n3"].client().dbsize() == 0
    assert_owned_only(servers, c0)
    written = set(moving_strings)
    assert_in_place(servers, [k for k in keys if k not in written], before, c0)
    check_writes(c0, writers, counter_base=1000, initial=initial)


@pytest.mark.slow
def test_coordinator_killed_mid_copy_resumes_after_restart(server_factory):
    servers = fleet_of_four(server_factory, config=AOF)
    keys = populate({n: servers[n] for n in NAMES3}, n=SLOW_KEYS, seed=14)
    before = snapshot(servers, keys)
    old = assert_one_ring(servers, NAMES3, on=NAMES3)
    c0 = servers["n0"].client()
    assert start_resharding(c0, servers, NAMES4, maxrate=SLOW_RATE) == b"OK"
    term = wait_copying(c0)["term"]

    # n0 coordinates and is a copy source too: its copy dies with it.
    servers["n0"].stop(signal.SIGKILL)
    servers["n0"].start()
    c0 = servers["n0"].client()
    st = fleet_status(c0)
    assert st is not None, "the plan did not survive the restart"
    assert st["phase"] in (b"copy", b"settle", b"commit", b"cleanup", b"done") and st["running"] == b"no", st
    # Its lease still runs at the nodes (10 s), but it was this server's earlier run: RESUME takes
    # it over at once, under the next term.
    assert c0.execute_command("SHARD.RESHARD", "RESUME") == b"OK"
    st = fleet_status(c0)
    assert st["term"] == term + 1, st
    assert st["lease"] in (b"held (taken over from an earlier run of this server)",
                           f"released (term {term + 1})".encode()), st
    st = wait_fleet(c0, "done")
    new = assert_one_ring(servers, NAMES4)
    check_done(st, old, new, {"n0": "both", "n1": "both", "n2": "both", "n3": "new"})
    check_placement(servers, NAMES4, keys, before)


def test_start_again_to_the_same_ring_after_a_restart_resumes(server_factory):
    """START repeated with the same ring on a restarted coordinator whose plan is unfinished
    resumes it (as RESUME does) and replies at once: the server goes on serving and the
    resharding finishes. (An earlier build drove the plan while holding the lock its first
    step takes, and hung the server.)"""
    servers = fleet_of_four(server_factory, config=AOF)
    keys = populate({n: servers[n] for n in NAMES3}, n=SLOW_KEYS, seed=15)
    before = snapshot(servers, keys)
    c0 = servers["n0"].client()
    assert start_resharding(c0, servers, NAMES4, maxrate=SLOW_RATE) == b"OK"
    wait_copying(c0)
    servers["n0"].stop(signal.SIGKILL)
    servers["n0"].start()
    c0 = servers["n0"].client(socket_timeout=10)
    st = fleet_status(c0)
    assert st is not None and st["running"] == b"no", st
    assert start_resharding(c0, servers, NAMES4, maxrate=SLOW_RATE) == b"OK"
    assert c0.ping()
    wait_fleet(c0, "done")
    assert_one_ring(servers, NAMES4)
    check_placement(servers, NAMES4, keys, before)


def uhashring_shares(weights):
    """Each node's fraction of the ketama circle (2^32), from uhashring's own ring points: a key
    goes to the first point strictly greater than its hash, wrapping to the first point, so a
    point owns [previous point, point) and the first point also [last point, 2^32)."""
    ring = HashRing(nodes={n: {"weight": w} for n, w in weights.items()}, hash_fn="ketama")
    points = sorted(set(ring.runtime._keys))
    owner = ring.runtime._ring
    owned = dict.fromkeys(weights, 0)
    previous = 0
    for p in points:
        owned[owner[p]] += p - previous
        previous = p
    owned[owner[points[0]]] += 2**32 - points[-1]
    assert sum(owned.values()) == 2**32
    return {n: o / 2**32 for n, o in owned.items()}


def check(client):
    return as_map(client.execute_command("SHARD.RING", "CHECK"))


def test_ring_check_shares_agreement_and_push(server_factory):
    weights = {"n0": 1, "n1": 2, "n2": 3}
    servers = start_fleet(server_factory, weights, ring=weights)
    populate(servers, n=600, seed=15)
    c0 = servers["n0"].client()

    got = check(c0)
    assert got["agree"] == b"yes", got
    assert set(got["nodes"]) == set(weights), got
    expected = uhashring_shares(weights)
    total = sum(weights.values())
    for n, node in got["nodes"].items():
        assert node["address"] == f"127.0.0.1:{servers[n].port}".encode(), node
        assert node["ring"] == b"current" and node["reachable"] == b"yes", node
        assert node["error"] == b"" and node["digest"] == got["digest"], node
        assert node["previous_digest"] == b"" and node["returning"] == b"no", node
        assert node["weight"] == weights[n], node
        assert node["keys"] == servers[n].client().dbsize() > 0, node
        assert node["used_memory"] > 0, node
        assert abs(share(node["weight_share"]) - weights[n] / total) <= 1e-6, node
        assert abs(share(node["share"]) - expected[n]) <= 0.001, (n, node, expected)
    # Six decimals each: the sum is 1 within the rounding of each.
    assert abs(sum(share(m["share"]) for m in got["nodes"].values()) - 1) <= 2e-6, got

    # One node gets another ring: CHECK from another node sees it.
    other = {"n0": 1, "n1": 1, "n2": 1}
    servers["n2"].client().execute_command("SHARD.RING", "SET", "ketama",
                                           *ring_args(servers, other))
    got = check(c0)
    assert got["agree"] == b"no", got
    assert got["nodes"]["n2"]["digest"] != got["digest"], got
    assert got["nodes"]["n1"]["digest"] == got["digest"], got

    # PUSH from n0 puts its ring on every node.
    pushed = as_map(c0.execute_command("SHARD.RING", "PUSH"))
    assert {"n1", "n2"} <= set(pushed) <= set(weights), pushed
    assert all(v == b"OK" for v in pushed.values()), pushed
    for via in ("n0", "n2"):
        got = check(servers[via].client())
        assert got["agree"] == b"yes", (via, got)
        assert {m["digest"] for m in got["nodes"].values()} == {got["digest"]}, got
    ring = ring_of(servers["n2"].client())
    assert {m["name"].decode(): m["weight"] for m in ring["nodes"]} == weights, ring

    # A node down: named unreachable, with why.
    servers["n1"].stop(signal.SIGKILL)
    got = check(c0)
    assert got["agree"] == b"no", got
    down = got["nodes"]["n1"]
    assert down["reachable"] == b"no" and down["error"] != b"", down
    assert all(got["nodes"][n]["reachable"] == b"yes" for n in ("n0", "n2")), got


@pytest.mark.slow
def test_start_with_passwords_and_the_plan_on_a_replica(server_factory):
    """Every server requires a password: the coordinator reaches the nodes (itself included) with
    `auth-password`. A replica of the coordinator holds its plan (replicated as SHARD.RESHARD
    PLAN), phase by phase, ready for a RESUME after a failover."""
    pw = "fleet-pw"
    servers = start_fleet(server_factory, NAMES4, ring=NAMES3, on=NAMES3, config=PRIMARY,
                          module_args=["auth-password", pw], password=pw)
    keys = populate({n: servers[n] for n in NAMES3}, n=5000, seed=7)
    before = snapshot({n: servers[n] for n in NAMES3}, keys)
    replica = server_factory(module_args=["self", "n0"], password=pw,
                             config=[("replicaof", "127.0.0.1", servers["n0"].port),
                                     ("masterauth", pw)])
    c0 = servers["n0"].client()
    deadline = time.monotonic() + 20
    while c0.info("replication").get("connected_slaves", 0) < 1:
        assert time.monotonic() < deadline, "the replica did not connect"
        time.sleep(0.05)
    assert start_resharding(c0, servers, NAMES4) == b"OK"
    done = wait_fleet(c0, "done")
    assert done["error"] == b""
    check_placement(servers, NAMES4, keys, before)
    # The replica got every phase of the plan; the last one says done, and nothing drives it.
    r = replica.client()
    deadline = time.monotonic() + 10
    while True:
        st = fleet_status(r)
        if st is not None and st["phase"] == b"done":
            break
        assert time.monotonic() < deadline, f"the replica's plan: {st}"
        time.sleep(0.05)
    assert st["running"] == b"no" and st["new_digest"] == done["new_digest"]
    assert c0.info("shard")["shard_fleet_phase"] == "done"
    assert r.info("shard")["shard_fleet_phase"] == "done"
    assert r.info("shard")["shard_fleet_running"] == "no"
    assert r.execute_command("SHARD.RING", "GET")[7] == c0.execute_command("SHARD.RING", "GET")[7]
