"""One fleet coordinator at a time (issue 33): a lease with a term that every step carries.

- The coordinator is frozen (SIGSTOP) in phase `copy`, its plan handed to another node
  (`SHARD.RESHARD PLAN`): RESUME there is refused while the frozen coordinator's lease runs,
  naming it and the time left; once it has run out RESUME takes the next term and drives. The
  old coordinator thawed (SIGCONT) then has its next step refused, naming the new term, and
  stops driving (its STATUS says it lost the lease, to whom); the operation finishes with
  every key once at its owner, unchanged.
- A node given a step of an older term (INSTALL, COPY, CLEANUP, STOP, a plan) refuses it,
  naming both terms and the holder of the newer one, and changes nothing.
- `SHARD.RESHARD HANDOVER`: the coordinator stops at its next step and releases its lease, so
  RESUME on a node given the plan goes on at once; RESUME on the old coordinator is then
  refused while the new one's lease runs.
- A node's term is durable with its rings: it reaches its replica, and its RDB keeps it
  through a restart (a late step of a term handed over is still refused).

(A coordinator restarted after a crash takes its own lease over at once: test_fleet.py's
restart tests RESUME right after the restart, well within the default 10 s lease.)
"""

import signal

import pytest
import redis

from helpers.fleet import NAMES3, NAMES4, check_placement, populate, snapshot, start_fleet
from helpers.reshard import (assert_one_ring, fleet_status, start_resharding, status,
                             wait_copying, wait_fleet)
from helpers.server import PRIMARY, as_map, until, wait_in_sync

# As test_fleet.py: each of the three sources sends about 2 500 keys at 1 000 keys/s, so the
# copy is still running when the coordinator is frozen.
SLOW_KEYS = 30_000
SLOW_RATE = 1000
# Long enough that the refusal is seen right after the freeze, short enough to wait out.
LEASE_MS = 4000


def node_state(client):
    return as_map(client.execute_command("SHARD.RING", "STATE"))


def resume(client):
    return client.execute_command("SHARD.RESHARD", "RESUME")


def finished(client):
    """The coordinator's STATUS once its operation is done and its lease released (the plan
    says done before the release reaches the nodes)."""
    wait_fleet(client, "done", timeout=120)
    until(lambda: fleet_status(client)["running"] == b"no", "the coordinator to stop")
    return fleet_status(client)


def canonical(ring):
    """A ring's canonical text (as `SHARD.RING INSTALL` takes it) from `SHARD.RING GET`."""
    lines = [f"algo {ring['algo'].decode()}", f"hashtag {ring['hashtag'].decode()}"]
    lines += [f"node {n['name'].decode()} {n['address'].decode()} {n['weight']}"
              for n in ring["nodes"]]
    return "\n".join(lines) + "\n"


class Frozen:
    """A server stopped with SIGSTOP until `thaw()` (or the end of the `with`)."""

    def __init__(self, server):
        self.server = server
        self.frozen = False

    def __enter__(self):
        self.server.proc.send_signal(signal.SIGSTOP)
        self.frozen = True
        return self

    def thaw(self):
        if self.frozen:
            self.server.proc.send_signal(signal.SIGCONT)
            self.frozen = False

    def __exit__(self, *exc):
        self.thaw()


@pytest.mark.slow
def test_resume_elsewhere_waits_for_the_lease_and_the_old_coordinator_is_fenced(server_factory):
    servers = start_fleet(server_factory, NAMES4, ring=NAMES3, on=NAMES3,
                          module_args=["fleet-lease-ms", LEASE_MS])
    keys = populate({n: servers[n] for n in NAMES3}, n=SLOW_KEYS, seed=33)
    before = snapshot(servers, keys)
    c0, c1, c2 = (servers[n].client(socket_timeout=30) for n in ("n0", "n1", "n2"))
    assert start_resharding(c0, servers, NAMES4, maxrate=SLOW_RATE) == b"OK"
    st = wait_copying(c0)
    term = st["term"]
    assert term >= 1 and st["lease"] == b"held", st
    plan = c0.execute_command("SHARD.RESHARD", "PLAN")
    old_run = node_state(c0)["run_id"]
    assert node_state(c2)["term"] == term and node_state(c2)["term_holder"] == b"n0"

    with Frozen(servers["n0"]) as frozen:
        # n1 is given the plan; n0 still holds the lease: RESUME is refused, naming n0.
        assert c1.execute_command("SHARD.RESHARD", "PLAN", plan) == b"OK"
        with pytest.raises(redis.ResponseError) as e:
            resume(c1)
        msg = str(e.value)
        assert msg.startswith(f"LEASEHELD term {term} of n0 (127.0.0.1:{servers['n0'].port})"), msg
        assert "ms more" in msg and "HANDOVER on n0" in msg, msg
        st1 = fleet_status(c1)
        assert st1["running"] == b"no" and st1["term"] == term and st1["phase"] == b"copy", st1

        # Once the lease has run out at every node that answers, RESUME takes the next term.
        def resumed():
            try:
                return resume(c1) == b"OK"
            except redis.ResponseError as refused:
                assert str(refused).startswith("LEASEHELD"), refused
                return False
        until(resumed, "n0's lease to run out", timeout=60, every=0.2)
        st1 = fleet_status(c1)
        assert st1["term"] == term + 1 and st1["running"] == b"yes", st1
        until(lambda: node_state(c2)["term"] == term + 1, "n2 to follow the new term")
        assert node_state(c2)["term_holder"] == b"n1"

        # n0 thaws: its next step is refused, naming the new term, and it stops driving.
        frozen.thaw()
        until(lambda: fleet_status(c0)["running"] == b"no", "n0 to stop driving", timeout=30)
    st0 = fleet_status(c0)
    lost = st0["lease"].decode()
    assert lost.startswith("lost: node n"), st0
    assert f"STALETERM step of term {term} from n0 refused: term {term + 1} of n1" in lost, st0
    assert st0["error"].startswith(b"lost the lease: "), st0

    done = finished(c1)
    assert done["error"] == b"" and done["lease"] == f"released (term {term + 1})".encode(), done
    # The old coordinator never drove again: its plan is where it lost the lease.
    st0 = fleet_status(c0)
    assert st0["running"] == b"no" and st0["phase"] == b"copy" and st0["term"] == term, st0
    new = assert_one_ring(servers, NAMES4)
    check_placement(servers, NAMES4, keys, before)  # every key once, at its owner, unchanged

    # Steps of the old term, given to a node directly: each refused, naming both terms and the
    # holder of the newer one, and nothing changes.
    n1_address = f"127.0.0.1:{servers['n1'].port}"
    old_term = ["TERM", term, LEASE_MS, "n0", f"127.0.0.1:{servers['n0'].port}", old_run]
    ring = as_map(c2.execute_command("SHARD.RING", "GET"))
    job = status(c2)
    for step in (["SHARD.RING", "INSTALL", canonical(ring), *old_term],
                 ["SHARD.RESHARD", "COPY", *old_term],
                 ["SHARD.RESHARD", "CLEANUP", *old_term],
                 ["SHARD.RESHARD", "STOP", *old_term],
                 ["SHARD.RING", "LEASE", *old_term[1:]]):
        with pytest.raises(redis.ResponseError) as e:
            c2.execute_command(*step)
        assert str(e.value) == (f"STALETERM step of term {term} from n0 refused: term {term + 1} "
                                f"of n1 ({n1_address}) holds this operation"), (step[:2], e.value)
    with pytest.raises(redis.ResponseError, match=rf"^STALETERM plan of term {term} refused: "
                                                  rf"term {term + 1} of n1"):
        c2.execute_command("SHARD.RESHARD", "PLAN", plan)
    assert fleet_status(c2) is None, "the refused plan was not stored"
    assert as_map(c2.execute_command("SHARD.RING", "GET"))["digest"] == new
    assert status(c2)["state"] == job["state"] and status(c2)["job"] == job["job"]
    check_placement(servers, NAMES4, keys, before)


@pytest.mark.slow
def test_handover_lets_a_node_given_the_plan_resume_at_once(server_factory):
    # The default lease (10 s): the RESUME below goes through at its first try only because the
    # lease was handed over.
    servers = start_fleet(server_factory, NAMES4, ring=NAMES3, on=NAMES3)
    keys = populate({n: servers[n] for n in NAMES3}, n=SLOW_KEYS, seed=34)
    before = snapshot(servers, keys)
    c0, c1 = servers["n0"].client(), servers["n1"].client()
    with pytest.raises(redis.ResponseError, match="not driving a fleet operation"):
        c0.execute_command("SHARD.RESHARD", "HANDOVER")
    assert c0.execute_command("SHARD.RESHARD", "PLAN") is None
    assert start_resharding(c0, servers, NAMES4, maxrate=SLOW_RATE) == b"OK"
    term = wait_copying(c0)["term"]

    assert c0.execute_command("SHARD.RESHARD", "HANDOVER") == b"OK"
    until(lambda: fleet_status(c0)["running"] == b"no", "n0 to stop driving")
    st0 = fleet_status(c0)
    assert st0["lease"] == f"released (term {term})".encode(), st0
    assert st0["error"].startswith(b"handed over"), st0
    assert node_state(c1)["term_released"] == b"yes"

    assert c1.execute_command("SHARD.RESHARD", "PLAN",
                              c0.execute_command("SHARD.RESHARD", "PLAN")) == b"OK"
    assert resume(c1) == b"OK"
    st1 = fleet_status(c1)
    assert st1["term"] == term + 1 and st1["lease"] == b"held", st1
    # Now n1 holds it: RESUME on n0 is refused, naming n1.
    with pytest.raises(redis.ResponseError,
                       match=rf"^LEASEHELD term {term + 1} of n1 \(127.0.0.1:{servers['n1'].port}\)"):
        resume(c0)
    assert fleet_status(c0)["running"] == b"no"

    wait_fleet(c1, "done", timeout=120)
    assert_one_ring(servers, NAMES4)
    check_placement(servers, NAMES4, keys, before)


def test_a_nodes_term_is_kept_in_its_rdb_and_reaches_its_replica(server_factory):
    servers = start_fleet(server_factory, NAMES4, ring=NAMES3, on=NAMES3, config=PRIMARY)
    keys = populate({n: servers[n] for n in NAMES3}, n=2000, seed=35)
    before = snapshot(servers, keys)
    replica = server_factory(module_args=["self", "n2"],
                             config=[("replicaof", "127.0.0.1", servers["n2"].port)])
    c0, c2, r2 = servers["n0"].client(), servers["n2"].client(), replica.client()
    wait_in_sync(c2, r2)
    assert start_resharding(c0, servers, NAMES4) == b"OK"
    term = finished(c0)["term"]
    st = node_state(c2)
    n0_address = f"127.0.0.1:{servers['n0'].port}"
    assert (st["term"], st["term_holder"], st["term_address"]) == (term, b"n0", n0_address.encode())
    assert st["term_released"] == b"yes" and st["lease_left_ms"] == 0, st
    wait_in_sync(c2, r2)
    rs = node_state(r2)
    assert {k: rs[k] for k in ("term", "term_holder", "term_run_id", "term_released")} == \
        {k: st[k] for k in ("term", "term_holder", "term_run_id", "term_released")}

    # Saved in the RDB and loaded at a restart: a late step of that term is still refused.
    assert c2.save()
    servers["n2"].stop()
    servers["n2"].start()
    c2 = servers["n2"].client()
    again = node_state(c2)
    assert {k: again[k] for k in ("term", "term_holder", "term_address", "term_run_id",
                                  "term_released")} == \
        {k: st[k] for k in ("term", "term_holder", "term_address", "term_run_id",
                            "term_released")}
    assert again["run_id"] != st["run_id"], "a restart is a new run"
    with pytest.raises(redis.ResponseError,
                       match=rf"^STALETERM step of term {term} from n0 refused: term {term} of "
                             rf"n0 \({n0_address}\) was handed over"):
        c2.execute_command("SHARD.RESHARD", "STOP", "TERM", term, 1000, "n0", n0_address,
                           st["term_run_id"])
    assert_one_ring(servers, NAMES4)
    check_placement(servers, NAMES4, keys, before)
