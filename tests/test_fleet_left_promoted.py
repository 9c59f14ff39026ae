"""A server of a node a shrink removed, promoted with the rings from before the shrink, takes the
fleet's rings, which do not name it, rather than own keys by its old ones (issue 33, found by the
nemesis test: Valkey `NEMESIS_SEED=2028666081` lost 198 acknowledged list elements).

n3 joins (a grow), then its second server stops following its primary (as an old primary back
from its AOF that Sentinel has not turned into a replica yet, which is where the nemesis found
it), stopped long enough for Sentinel to count it down (else the fleet's steps at n3 would wait
for it, `reshard/fleet/durable.rs`), and the fleet shrinks back: n3 leaves, under a newer fleet
term, and its second server never hears of it (the shrink waits in its cleanup, whose deletions
at n3 count done only once a replica Sentinel may promote has them, the stopped one too:
`reshard/fleet/landed.rs`). Then Sentinel fails n3 over to that server, a primary already (no role change). It
held the grow's ring, by which n3 owns keys. Before, nothing checked its rings (no role change),
and a check would have asked a peer of the newer term to push its rings, a push that goes to the
nodes those rings name, not n3, then lifted the gate at its bound: the server took writes of
keys the fleet had moved away, as their owner, and its replica acknowledged them. Now Sentinel's
naming it starts the check, and rings of a newer term that do not name this node are installed
here by the check itself (`reshard/fleet/repair.rs`); the gate stays closed until then. Then
the server, which its old rings named and the fleet's no longer do, empties itself.
"""

import signal

from helpers.fleet import owners
from helpers.nemesis import RING, SHARDS, Fleet
from helpers.reshard import fleet_status, resume_until_over, wait_fleet
from helpers.server import as_map, until

KEYS = [f"k:{i}" for i in range(200)]
OPEN = "its writes are accepted again"


def replica_down(fleet, server):
    """Whether the sentinels count `server`, a replica of n3 to them, as down."""
    for entry in fleet.sentinels[0].client().execute_command("SENTINEL", "REPLICAS", "n3"):
        fields = dict(zip(entry[::2], entry[1::2]))
        if fields.get(b"port") == str(server.port).encode():
            return b"s_down" in fields.get(b"flags", b"")
    return False


def digest(server):
    return as_map(server.client().execute_command("SHARD.RING", "STATE"))["digest"]


def test_a_server_of_a_node_that_left_takes_the_fleets_rings_when_sentinel_names_it(
        server_factory, sentinel_factory, clockshim, tmp_path):
    fleet = Fleet(server_factory, sentinel_factory, clockshim, tmp_path)
    c = fleet.primaries["n0"].client(socket_timeout=20)
    pipe = c.pipeline(transaction=False)
    for k in KEYS:
        pipe.execute_command("SHARD.CALL", "WAIT", 1, 1000, "SET", k, "before")
    assert all(r == b"OK" for r in pipe.execute())
    ring4 = ["slots", *[x for n in SHARDS for x in (n, "sentinel", 1)]]
    ring3 = ["slots", *[x for n in RING for x in (n, "sentinel", 1)]]
    assert c.execute_command("SHARD.RESHARD", "START", *ring4) == b"OK"
    wait_fleet(c, "done", timeout=90)
    grown = digest(c)
    first, second = fleet.primaries["n3"], fleet.replicas["n3"]
    until(lambda: digest(second) == grown, "n3's second server on the grown ring")
    mine = [k for k, o in zip(KEYS, owners(c, KEYS)) if o == "n3"]
    assert len(mine) >= 20
    until(lambda: second.client().dbsize() == len(mine), "n3's second server holds its keys")

    # n3's second server leaves its primary and stops (Sentinel counts it as down, so the
    # fleet's ring steps at n3 wait for no replica, `reshard/fleet/durable.rs`), then the fleet
    # shrinks back without it, up to its cleanup: n3's `CLEANUP LEFT` counts done only once a
    # replica Sentinel may promote has it, the stopped one too (`reshard/fleet/landed.rs`).
    assert second.client().execute_command("REPLICAOF", "NO", "ONE") == b"OK"
    until(lambda: first.client().execute_command("ROLE")[2] == [], "n3's primary without a replica")
    second.proc.send_signal(signal.SIGSTOP)
    try:
        until(lambda: replica_down(fleet, second), "Sentinel counts n3's second server down")
        assert c.execute_command("SHARD.RESHARD", "START", *ring3) == b"OK"
        until(lambda: fleet_status(c)["phase"] == b"cleanup"
              and b"SENTINEL RESET n3" in fleet_status(c)["error"],
              "the shrink's cleanup waits for n3's second server", timeout=90)
    finally:
        second.proc.send_signal(signal.SIGCONT)
    shrunk = digest(c)
    assert shrunk != grown and digest(second) == grown

    log_from = len(second.log())
    fleet.fail_over_to("n3", second)
    until(lambda: digest(second) == shrunk or OPEN in second.log()[log_from:],
          "n3's new primary checked its rings", timeout=30)
    assert digest(second) == shrunk, second.log()[log_from:][-3000:]
    # What it held of n3 are copies the fleet moved away: emptied (`CLEANUP LEFT`), so that
    # no key lies where no ring names it, and a later grow may bring n3 back. Before, they
    # stayed, and every later START was refused ("a joining node must be empty").
    until(lambda: second.client().dbsize() == 0, "n3's new primary emptied", timeout=30)
    # A write of a key n3 owned sent to it goes to the key's owner in the fleet's rings.
    s = second.client()
    for k in mine[:20]:
        assert s.execute_command("SHARD.CALL", "SET", k, "after") == b"OK"
    got = [c.execute_command("SHARD.CALL", "GET", k) for k in mine[:20]]
    assert got == [b"after"] * 20, got
    # The shrink ends: its cleanup at n3, run again at the server Sentinel names now, reaches
    # that server's replica.
    resume_until_over(c, "the shrink ends")
    assert second.client().dbsize() == 0
