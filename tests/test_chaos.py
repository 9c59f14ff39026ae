"""Chaos (issue 15): the fleet grows 3 -> 4 and shrinks back 4 -> 3 with `SHARD.RESHARD START`
while 8 clients write through SHARD.CALL on every node; during the grow's copy the joining node
(the destination of every moving key) is killed with SIGKILL and restarted (AOF on, fsync always,
so nothing acknowledged is lost), and one source's copy is paused and resumed.

At the end: every counter equals its acknowledged INCRs plus at most its unknown ones
(at-most-once), every acknowledged set member is there, every value key holds its last
acknowledged value (or a later one whose outcome is unknown), the preloaded keys are unchanged,
and no key is on a node that does not own it.

Sized by CHAOS_SCALE (default 1: well under two minutes; `make chaos` runs 10): the preloaded
keys and the keys written grow with it, and so does the copy's MAXRATE, so that the copy lasts
about as long at any scale and the kill and the pause land in it. A hard deadline bounds it.
"""

import os
import signal
import time

import pytest
import redis

from helpers.fleet import (NAMES3, NAMES4, assert_in_place, assert_owned_only, populate, ring_of,
                           snapshot, start_fleet)
from helpers.reshard import (assert_one_ring, fleet_status, start_resharding, status,
                             wait_copying, wait_fleet)
from helpers.server import AOF, until
from helpers.writers import Writers, check_writes

SCALE = int(os.environ.get("CHAOS_SCALE", "1"))
THREADS = 8
PRELOAD = 4000 * SCALE
COUNTERS = 40 * SCALE
SETS = 20 * SCALE
VALUES_PER_THREAD = 10 * SCALE
# MAXRATE counts the keys a copy sends per second. A quarter of the keys moves to the joining
# node, from three sources: each sends about PRELOAD / 12 keys, about 2 s a pass at this rate.
MAXRATE = 150 * SCALE
BUDGET = 110 + 60 * (SCALE - 1)  # seconds, for the whole test


def pause_a_source(servers, names, timeout):
    """`SHARD.RESHARD PAUSE` on the first node of `names` whose copy is running; its name."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for n in names:
            c = servers[n].client()
            if status(c)["state"] == b"copying":
                try:
                    if c.execute_command("SHARD.RESHARD", "PAUSE") == b"OK":
                        return n
                except redis.ResponseError:
                    pass  # its job ended meanwhile
        time.sleep(0.02)
    raise AssertionError(f"no copy running on {names} to pause")


def start_past_lease(client, servers, names, timeout):
    """`start_resharding`, sent again while a node refuses it because the previous
    coordinator's lease still runs there (`LEASEHELD`); any other refusal fails at once."""
    end = time.monotonic() + timeout
    while True:
        try:
            return start_resharding(client, servers, names)
        except redis.ResponseError as e:
            if not str(e).startswith("LEASEHELD") or time.monotonic() > end:
                raise
        time.sleep(0.5)


@pytest.mark.slow
def test_chaos_grow_and_shrink_under_writes_with_a_kill_and_a_pause(server_factory):
    deadline = time.monotonic() + BUDGET

    def left():
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"the chaos test ran over its {BUDGET} s"
        return remaining

    servers = start_fleet(server_factory, NAMES4, ring=NAMES3, on=NAMES3, config=AOF)
    three = {n: servers[n] for n in NAMES3}
    preload = populate(three, n=PRELOAD, seed=21)
    before = snapshot(three, preload)
    per_thread = [[f"v:{t * VALUES_PER_THREAD + i}" for i in range(VALUES_PER_THREAD)]
                  for t in range(THREADS)]
    writers = Writers(servers, NAMES3, THREADS,
                      counters=[f"c:{i}" for i in range(COUNTERS)],
                      sets=[f"s:{i}" for i in range(SETS)],
                      values=per_thread, seed=21, pause=0.003, deadline=deadline)
    c0, c1 = servers["n0"].client(), servers["n1"].client()
    writers.start()
    try:
        until(lambda: writers.acknowledged() >= 200, "writes under the old ring first",
              timeout=min(30, left()))

        # Grow 3 -> 4 from n0, slowly enough for the kill and the pause to land in the copy.
        assert start_resharding(c0, servers, NAMES4, maxrate=MAXRATE) == b"OK"
        writers.via = NAMES4
        wait_copying(c0, timeout=min(30, left()))
        paused = pause_a_source(servers, ["n1", "n2"], timeout=min(5, left()))
        time.sleep(0.3)
        servers["n3"].stop(signal.SIGKILL)
        time.sleep(0.3)  # writes of moving keys fail meanwhile
        servers["n3"].start()
        ring = ring_of(servers["n3"].client())
        assert ring is not None and ring["previous"] is not None, \
            f"n3 did not reload the rings of the resharding from its AOF: {ring}"
        st = fleet_status(c0)
        assert st["phase"] == b"copy", f"the copy ended before the kill: a lower MAXRATE: {st}"
        time.sleep(0.3)
        assert status(servers[paused].client())["paused"] == b"yes"
        assert servers[paused].client().execute_command("SHARD.RESHARD", "RESUME") == b"OK"
        wait_fleet(c0, "done", timeout=left())
        # The grow's coordinator reports done before it releases its term at every node (then
        # it stops driving): a START elsewhere before that is refused, LEASEHELD.
        until(lambda: fleet_status(c0)["running"] == b"no", "n0 stopped driving the grow",
              timeout=min(30, left()))

        # Shrink 4 -> 3 from n1, n3 leaving. (The release is one try a node: a node it did not
        # reach under load refuses, LEASEHELD, until n0's lease has run out there.)
        assert start_past_lease(c1, servers, NAMES3, timeout=min(30, left())) == b"OK"
        wait_fleet(c1, "done", timeout=left())
    finally:
        writers.stop()
    print(writers.summary())
    assert writers.acknowledged() > 500, writers.summary()

    assert_one_ring(servers, NAMES3)
    assert servers["n3"].client().dbsize() == 0
    assert_owned_only(servers, c0)
    assert_in_place(servers, preload, before, c0)
    check_writes(c0, writers)
    left()
