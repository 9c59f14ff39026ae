"""Resharding, as the tests drive and watch it: a node's job (`SHARD.RESHARD STATUS`, waiting
for a COPY or a CLEANUP to end), the one-command fleet operation (`SHARD.RESHARD START`, waiting
for its phases), and what the fleet must hold once it is over (one ring everywhere, no
resharding left open).
"""

import time

from helpers.fleet import ring_args, ring_of
from helpers.server import as_map, until

FINAL = ("done", "cancelled")


# --- one node's job (COPY, CLEANUP) ----------------------------------------------------------


def status(client):
    """`SHARD.RESHARD STATUS` as a dict with str keys (the values as sent)."""
    reply = client.execute_command("SHARD.RESHARD", "STATUS")
    return {k.decode(): v for k, v in zip(reply[::2], reply[1::2])}


def wait_job(client, timeout=120):
    """Polls STATUS until the node's job is no longer copying or cleaning; returns the status."""
    deadline = time.monotonic() + timeout
    while True:
        st = status(client)
        if st["state"] not in (b"copying", b"cleaning"):
            return st
        if time.monotonic() > deadline:
            raise AssertionError(f"resharding job still running after {timeout}s: {st}")
        time.sleep(0.02)


def run_job(servers, names, verb, timeout=60):
    """SHARD.RESHARD COPY or CLEANUP on the servers of `names`, then waits for each to be
    done."""
    for n in names:
        assert servers[n].client().execute_command("SHARD.RESHARD", verb) == b"OK"
    for n in names:
        st = wait_job(servers[n].client(), timeout)
        assert st["state"] == b"done", (n, st)


# --- the fleet operation (SHARD.RESHARD START) -----------------------------------------------


def fleet_status(client):
    """The `fleet` map of the node's `SHARD.RESHARD STATUS` (None: it coordinates nothing)."""
    return as_map(client.execute_command("SHARD.RESHARD", "STATUS"))["fleet"]


def start_resharding(client, servers, names, maxrate=None, extra=()):
    """`SHARD.RESHARD START ketama` to the ring of `names` (weight 1 each) plus `extra`."""
    args = ["SHARD.RESHARD", "START", "ketama", *ring_args(servers, names), *extra]
    if maxrate:
        args += ["MAXRATE", maxrate]
    return client.execute_command(*args)


def wait_fleet(client, phase="done", timeout=60):
    """Polls the coordinator's STATUS until `fleet.phase` is `phase`; fails, with the last status,
    on the other final phase, on a coordinator that stopped driving (`running` no) for a second,
    or after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    stalled_since = None
    while True:
        st = fleet_status(client)
        assert st is not None, "this node coordinates no resharding"
        now = st["phase"].decode()
        if now == phase:
            return st
        if now in FINAL:
            raise AssertionError(f"the resharding ended {now}, not {phase}: {st}")
        if st["running"] == b"no":
            stalled_since = stalled_since or time.monotonic()
            if time.monotonic() - stalled_since > 1.0:
                raise AssertionError(f"the coordinator stopped driving in phase {now}: {st}")
        else:
            stalled_since = None
        if time.monotonic() > deadline:
            raise AssertionError(f"fleet phase still {now} after {timeout:.0f} s: {st}")
        time.sleep(0.05)


def resume_until_over(client, what="the operation ends", timeout=120):
    """Waits until the coordinator's fleet operation is done or cancelled, sending RESUME
    whenever the coordinator stopped driving (it may give up while a node has no primary), then
    checks that it ended done."""
    def over():
        st = fleet_status(client)
        if st["phase"] in (b"done", b"cancelled"):
            return True
        if st["running"] == b"no":
            client.execute_command("SHARD.RESHARD", "RESUME")
        return False
    until(over, what, timeout=timeout, every=0.5)
    return wait_fleet(client, "done")


def wait_copying(client, timeout=30):
    """Waits until the coordinator is in phase `copy` and has seen a node's copy running."""
    deadline = time.monotonic() + timeout
    while True:
        st = fleet_status(client)
        assert st is not None, "this node coordinates no resharding"
        now = st["phase"].decode()
        if now == "copy" and any(n["state"].startswith(b"copying") for n in st["nodes"].values()):
            return st
        assert now in ("fence", "begin", "copy"), \
            f"the copy ended before the test could act: more keys or a lower MAXRATE: {st}"
        assert time.monotonic() < deadline, f"no copy running after {timeout:.0f} s: {st}"
        time.sleep(0.02)


def check_done(st, old_digest, new_digest, roles):
    """The coordinator's STATUS once done: no problem left, the rings and each node's role."""
    assert st["error"] == b"", st
    assert (st["old_digest"], st["new_digest"]) == (old_digest, new_digest), st
    assert {n: m["role"].decode() for n, m in st["nodes"].items()} == roles, st


# --- the rings once it is over ---------------------------------------------------------------


def assert_one_ring(servers, names, on=None):
    """Every server of `on` (default: all) holds the ring of `names` alone (no resharding open),
    with the same digest; returns the digest."""
    digests = set()
    for n in on or servers:
        ring = ring_of(servers[n].client())
        assert ring is not None, f"{n} holds no ring"
        assert ring["previous"] is None, f"{n} still has a resharding open: {ring}"
        assert sorted(m["name"].decode() for m in ring["nodes"]) == sorted(names), (n, ring)
        digests.add(ring["digest"])
    assert len(digests) == 1, f"the nodes hold different rings: {digests}"
    return digests.pop()


def assert_no_resharding(servers, on):
    """No server of `on` has a resharding open (a server with no ring has none)."""
    for n in on:
        ring = ring_of(servers[n].client())
        assert ring is None or ring["previous"] is None, f"{n} has a resharding open: {ring}"
