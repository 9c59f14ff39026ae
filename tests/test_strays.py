"""Strays never travel (issue 33): a key a node holds although the ring it leaves gives it to
another node (left there by an earlier cleanup that failed or was stopped) is never shipped by
a copy, nor by a cancel's copy back, so it can neither replace nor bring back the owner's key;
the cleanup that follows deletes it."""

from helpers.fleet import NAMES3, NAMES4, owners, start_fleet
from helpers.reshard import start_resharding, wait_copying, wait_fleet, wait_job
from helpers.server import pipelined

SLOW_KEYS = 30_000
SLOW_RATE = 1000


def test_a_copy_ships_only_the_keys_the_old_ring_gave_this_node(server_factory):
    """b holds a stale copy of a key a owns (a stray); a resharding gives the key to c. b's copy,
    run first, must not ship it: c gets a's live value, and b's cleanup deletes the stray."""
    servers = start_fleet(server_factory, ["a", "b", "c"], ring=["a", "b"])
    a, b, c = (servers[n].client() for n in "abc")
    keys = [f"k:{i}" for i in range(4000)]
    old = dict(zip(keys, owners(a, keys)))
    for n in ("a", "b"):
        pipelined(servers[n].client(), [("SET", k, f"live-{k}") for k in keys if old[k] == n])
    servers.ring(["a", "b", "c"], verb="BEGIN")
    new = dict(zip(keys, owners(a, keys)))
    strays = [k for k in keys if old[k] == "a" and new[k] == "c"][:50]
    assert len(strays) == 50
    pipelined(b, [("SET", k, "stale") for k in strays])
    for n in ("b", "a"):  # b first: a stray shipped by b would reach c before a's key
        client = servers[n].client()
        assert client.execute_command("SHARD.RESHARD", "COPY") == b"OK"
        st = wait_job(client)
        assert st["state"] == b"done" and st["failed"] == 0, st
    assert c.mget(strays) == [f"live-{k}".encode() for k in strays]
    for n in ("a", "b", "c"):
        servers[n].client().execute_command("SHARD.RING", "COMMIT")
    for n in ("a", "b"):
        client = servers[n].client()
        assert client.execute_command("SHARD.RESHARD", "CLEANUP") == b"OK"
        assert wait_job(client)["state"] == b"done"
    assert a.exists(*strays) == 0 and b.exists(*strays) == 0
    assert c.mget(strays) == [f"live-{k}".encode() for k in strays]


def test_a_cancels_copy_back_leaves_strays_where_they_are(server_factory):
    """n1 holds stale copies of keys n0 owns under the old ring and that the new ring does not
    give to n1 either. A grow cancelled mid-copy brings keys back with COPY REPLACE: the strays
    must not travel (they would replace n0's live keys), and the cancel's cleanup deletes them."""
    servers = start_fleet(server_factory, NAMES4, ring=NAMES3, on=NAMES3)
    c0 = servers["n0"].client()
    keys = [f"k:{i}" for i in range(SLOW_KEYS)]
    old = dict(zip(keys, owners(c0, keys)))
    for n in NAMES3:
        pipelined(servers[n].client(), [("SET", k, f"live-{k}") for k in keys if old[k] == n])
    assert start_resharding(c0, servers, NAMES4, maxrate=SLOW_RATE) == b"OK"
    wait_copying(c0)
    new = dict(zip(keys, owners(c0, keys)))
    strays = [k for k in keys if old[k] == "n0" and new[k] != "n1"][:50]
    pipelined(servers["n1"].client(), [("SET", k, "stale") for k in strays])
    assert c0.execute_command("SHARD.RESHARD", "CANCEL") == b"OK"
    wait_fleet(c0, "cancelled")
    assert servers["n0"].client().mget(strays) == [f"live-{k}".encode() for k in strays]
    for n in ("n1", "n2", "n3"):
        assert servers[n].client().exists(*strays) == 0, n
    got = c0.pipeline(transaction=False)
    for k in strays:
        got.execute_command("SHARD.CALL", "GET", k)
    assert got.execute() == [f"live-{k}".encode() for k in strays]
