"""SCAN of the whole fleet through one node (issue 43, `shard.route-plain yes`): one cursor
that walks node after node and, through a grow and a shrink, still returns every key that
exists from the start of the walk to its end at least once, as SCAN promises on one server.

The shrink is the case a naive walk gets wrong: the keys move from the leaving node, walked
last, to nodes walked first; a walk that passed those nodes before the copies landed and
reaches the leaving node after its cleanup would miss them. The walk's cursor carries the
rings' epoch and starts again when the rings change (`src/route/scan_cursor.rs`)."""

import threading
import time

from helpers.fleet import NAMES3, NAMES4, start_fleet
from helpers.reshard import assert_one_ring, start_resharding, wait_fleet

KEYS = 6000
# About two seconds of copies each way: several walks span every phase.
RATE = 700


def walk(client, count, pause=0.0):
    """One full SCAN walk: the keys returned (with repeats) and the number of steps; `pause`
    between steps, so that a walk spans the phases of a resharding."""
    seen, steps, cursor = [], 0, 0
    while True:
        cursor, keys = client.scan(cursor, count=count)
        seen.extend(keys)
        steps += 1
        if cursor == 0:
            return seen, steps
        time.sleep(pause)


def test_scan_returns_every_key_through_a_grow_and_a_shrink(server_factory):
    servers = start_fleet(server_factory, NAMES4, ring=NAMES3, on=NAMES3,
                          module_args=["route-plain", "yes"])
    c0 = servers["n0"].client()
    keys = {f"scan:{i}".encode() for i in range(KEYS)}
    with c0.pipeline(transaction=False) as p:
        for k in keys:
            p.set(k, b"v")
        p.execute()
    assert c0.dbsize() == KEYS

    walks, missing, stop = [], [], threading.Event()

    def walker(pause):
        c = servers["n1"].client()
        while not stop.is_set():
            seen, steps = walk(c, count=25, pause=pause)
            walks.append((len(seen), steps))
            lost = keys - set(seen)
            if lost:
                missing.append(sorted(lost)[:5] + [f"... {len(lost)} in all"])

    threads = [threading.Thread(target=walker, args=(p,), daemon=True) for p in (0, 0.002, 0.006)]
    for t in threads:
        t.start()
    try:
        coordinator = servers["n2"].client()
        assert start_resharding(coordinator, servers, NAMES4, maxrate=RATE) == b"OK"
        wait_fleet(coordinator, "done", timeout=120)
        assert_one_ring(servers, NAMES4)
        during_grow = len(walks)
        assert start_resharding(coordinator, servers, NAMES3, maxrate=RATE) == b"OK"
        wait_fleet(coordinator, "done", timeout=120)
        assert_one_ring(servers, NAMES3, on=NAMES3)
        during_shrink = len(walks) - during_grow
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert not missing, missing
    # The walks really ran through both operations.
    assert during_grow >= 2 and during_shrink >= 2, (during_grow, during_shrink)
    # And after: exactly the keys, each once, with the rings still.
    seen, _ = walk(c0, count=100)
    assert sorted(seen) == sorted(keys)
