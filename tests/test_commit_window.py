"""No write lost or resurrected while COMMIT reaches the nodes one by one (issue 33).

A fleet operation commits node by node. A node that has committed routes a moving key to its
new owner alone, so a delete through it deletes only there; a node that had not committed yet
read the key from the old owner's copy when the new owner lacked it, or copied that copy back
before a write: the deleted key came back. COMMIT is now two steps: `settle` (every node gets
the new ring over the old one, *settled*: the copies are done, so a moving key is read and
written at its new owner only, and a delete still reaches both owners), then, once no call
routed by the earlier rings is in flight, `commit`. In each step a node either never reads the
old owner or deletes there too, whatever its neighbours hold.

The tests drive the step: `SHARD.DEBUG FLEET-HOLD phase 1` holds the coordinator once the plan's
first node (n0) has the phase's rings, and the test acts through n0 and through n1 (which has
not) with SHARD.CALL and with a cluster client: deletes, reads of the deleted keys, writes of
them, writes of other moving keys. Once the operation is done no deleted key is anywhere and
every acknowledged write is at its owner only. A coordinator killed inside the window is
restarted and RESUMEd: the operation ends and no node stays settled. By hand, `SHARD.RING
SETTLE` and `PUSH` give the same guarantee.

(On the build before `settle`, with only the hold added, the commit window fails: a GET through
n1 of a key deleted through n0 returned the old value, and an APPEND through n1 continued from
it.)
"""

import signal

import pytest
import redis
from redis.cluster import RedisCluster

from helpers.fleet import owners, ring_args, start_fleet
from helpers.reshard import assert_one_ring, fleet_status, run_job, wait_fleet
from helpers.server import AOF, as_map, until

OLD, NEW = ["n0", "n1"], ["n0", "n1", "n2"]
DEBUG = [("enable-debug-command", "yes")]
KEYS = [f"k:{i}" for i in range(400)]


def grow_fleet(server_factory, algo="ketama", config=()):
    """n0 and n1 on the ring of both, holding KEYS (`v:<key>`, each at its owner); n2 joins
    (no ring or, for a `slots` ring, the old one: the cluster protocol needs one)."""
    servers = start_fleet(server_factory, NEW, ring=OLD, on=OLD, algo=algo,
                          module_args=["call-timeout-ms", 500], config=[*DEBUG, *config])
    if algo == "slots":
        c2 = servers.client("n2")
        assert c2.execute_command("SHARD.RING", "SET", "slots", *ring_args(servers, OLD)) == b"OK"
        for n in NEW:
            assert servers.client(n).config_set("shard.cluster-protocol", "yes")
    pipe = servers.client("n0").pipeline(transaction=False)
    for k in KEYS:
        pipe.execute_command("SHARD.CALL", "SET", k, f"v:{k}")
    assert all(r == b"OK" for r in pipe.execute())
    servers.old_owner = dict(zip(KEYS, owners(servers.client("n0"), KEYS)))
    return servers


def start_held(servers, phase, algo="ketama"):
    """START from n1, its coordinator held in `phase` once n0 (the plan's first node) has the
    phase's rings; returns n1's client once n0 has them and n1 and n2 have not."""
    c1 = servers.client("n1")
    assert c1.execute_command("SHARD.DEBUG", "FLEET-HOLD", phase, 1) == b"OK"
    assert c1.execute_command("SHARD.RESHARD", "START", algo, *ring_args(servers, NEW)) == b"OK"
    servers.new_digest = fleet_status(c1)["new_digest"]
    until(lambda: in_step(servers, "n0", phase), f"n0 has the rings of phase {phase}")
    for n in ("n1", "n2"):
        assert not in_step(servers, n, phase), f"{n} has the rings of phase {phase} too"
    assert fleet_status(c1)["phase"] == phase.encode()
    return c1


def in_step(servers, name, phase):
    """Whether node `name` holds the rings of `phase`: settled, or the new ring alone."""
    st = as_map(servers.client(name).execute_command("SHARD.RING", "STATE"))
    if phase == "settle":
        return st.get("settled") == b"yes"
    return st["digest"] == servers.new_digest and st["previous_digest"] == b""


def moving_keys(servers, old_owner):
    """KEYS that the new ring gives to n2 (every node's current ring is the new one now) and
    the old one gave to `old_owner`."""
    new = owners(servers.client("n0"), KEYS)
    return [k for k, o in zip(KEYS, new) if o == "n2" and servers.old_owner[k] == old_owner]


def finish(servers, c1):
    """Lifts the hold; the operation ends; every node holds the new ring alone, none settled."""
    assert c1.execute_command("SHARD.DEBUG", "FLEET-HOLD", "OFF") == b"OK"
    st = wait_fleet(c1, "done")
    assert st["error"] == b"", st
    assert_one_ring(servers, NEW)
    for n in NEW:
        assert as_map(servers.client(n).execute_command("SHARD.RING", "STATE"))["settled"] == b"no"


def resume_to_the_end(servers, c1, expected):
    """RESUME on n1 drives the plan to its end: every node holds the new ring alone, none
    settled, and every key is as `expected` (`check_final`)."""
    assert c1.execute_command("SHARD.RESHARD", "RESUME") == b"OK"
    st = wait_fleet(c1, "done")
    assert st["error"] == b"", st
    assert_one_ring(servers, NEW)
    for n in NEW:
        assert as_map(servers.client(n).execute_command("SHARD.RING", "STATE"))["settled"] == b"no"
    check_final(servers, expected)


def check_final(servers, expected):
    """Every key of `expected` (key -> value, None: deleted) is at its owner only with that
    value, or nowhere; every other key of KEYS is at its owner only, unchanged."""
    want = {k: f"v:{k}".encode() for k in KEYS}
    want.update({k: None if v is None else v.encode() for k, v in expected.items()})
    owner = dict(zip(KEYS, owners(servers.client("n0"), KEYS)))
    found = {}
    for n in NEW:
        c = servers.client(n)
        held = sorted(k.decode() for k in c.scan_iter(count=1000))
        # A node's own keys read plainly (the cluster protocol lets them through); a key it
        # holds but does not own is wrong whatever its value.
        mine = [k for k in held if owner.get(k) == n]
        pipe = c.pipeline(transaction=False)
        for k in mine:
            pipe.get(k)
        values = dict(zip(mine, pipe.execute()))
        for k in held:
            found.setdefault(k, []).append((n, values.get(k, b"<not its owner>")))
    assert set(found) <= set(KEYS), set(found) - set(KEYS)
    wrong = {k: found.get(k) for k in KEYS
             if found.get(k, []) != ([] if want[k] is None else [(owner[k], want[k])])}
    assert not wrong, f"{len(wrong)} keys not as acknowledged: {dict(list(wrong.items())[:8])}"


def call(servers, via, *args):
    return servers.client(via).execute_command("SHARD.CALL", *args)


def act_in_the_window(servers, done, waiting):
    """Deletes, reads and writes of moving keys through `done` (a node that has the step's
    rings) and `waiting` (one that has not); returns what each key must end as."""
    moving = [k for pair in zip(moving_keys(servers, "n0"), moving_keys(servers, "n1"))
              for k in pair]
    assert len(moving) >= 16, "enough keys move to n2"
    deleted, rewritten, written = moving[:4], moving[4:8], moving[8:12]
    expected = {}
    for i, k in enumerate(deleted + rewritten):
        assert call(servers, (done, waiting)[i % 2], "DEL", k) == 1, k
        expected[k] = None
    for k in deleted + rewritten:
        for n in NEW:
            assert call(servers, n, "GET", k) is None, f"{k}, deleted, read back through {n}"
            assert call(servers, n, "EXISTS", k) == 0, (k, n)
    # A write of a deleted key starts from nothing: the old owner's copy is not copied back.
    for i, k in enumerate(rewritten):
        assert call(servers, (waiting, done)[i % 2], "APPEND", k, "+w") == 2, k
        expected[k] = "+w"
    for i, k in enumerate(written):
        via = (done, waiting)[i % 2]
        assert call(servers, via, "SET", k, f"set-via-{via}") == b"OK"
        expected[k] = f"set-via-{via}"
    for k, v in expected.items():
        for n in NEW:
            got = call(servers, n, "GET", k)
            assert got == (None if v is None else v.encode()), f"{k} through {n}: {got}"
    return expected


# --- tests -----------------------------------------------------------------------------------


@pytest.mark.parametrize("phase", ["settle", "commit"])
def test_deletes_and_writes_between_two_nodes_of_commit(server_factory, phase):
    """Held after n0 got the phase's rings: n0 is settled (or committed), n1 and n2 are
    begun (or settled). Deletes through either are gone through every node and stay gone;
    writes through either are read back through every node and end at their owner only."""
    servers = grow_fleet(server_factory)
    c1 = start_held(servers, phase)
    expected = act_in_the_window(servers, "n0", "n1")
    finish(servers, c1)
    check_final(servers, expected)


@pytest.mark.parametrize("phase", ["settle", "commit"])
def test_cluster_clients_between_two_nodes_of_commit(server_factory, phase):
    """The same window for cluster clients (a `slots` ring, the cluster protocol on): a delete
    through the new owner reaches the old owner too (else a node that still falls back to the
    old owner reads it there), and once settled, the old owner serves no ASK for a moving key
    (its copy may be one deleted since at the new owner alone) and the new owner sends none."""
    servers = grow_fleet(server_factory, algo="slots")
    c1 = start_held(servers, phase, algo="slots")
    rc = RedisCluster(host="127.0.0.1", port=servers["n0"].port, socket_timeout=10)
    from_n1 = moving_keys(servers, "n1")
    assert len(from_n1) >= 4
    gone, asked, kept = from_n1[0], from_n1[1], from_n1[2]
    expected = {gone: None, asked: None, kept: "kept"}
    # A cluster client deletes at the new owner, n2 (begun, or settled).
    assert rc.delete(gone) == 1
    for n in NEW:
        assert call(servers, n, "GET", gone) is None, f"deleted, read back through {n}"
    assert rc.get(gone) is None
    # Deleted through n0: in the commit window n0 has committed and deletes at n2 alone.
    assert call(servers, "n0", "DEL", asked) == 1
    assert rc.get(asked) is None
    n1 = servers.client("n1")
    if phase == "commit":
        # n1, the old owner, settled: an ASK followed late finds MOVED, not its old copy.
        pipe = n1.pipeline(transaction=False)
        pipe.execute_command("ASKING")
        pipe.execute_command("GET", asked)
        with pytest.raises(redis.ResponseError, match=r"MOVED \d+ 127\.0\.0\.1:%d$" % servers["n2"].port):
            pipe.execute()
        # n2 settled: a read of a key it lacks is answered there, not sent to n1 by ASK.
        assert servers.client("n2").get(asked) is None
    # A script's delete runs at the new owner as before (a script cannot wait for the other).
    scripted = from_n1[3]
    assert servers.client("n2").eval("return redis.call('DEL', KEYS[1])", 1, scripted) == 1
    expected[scripted] = None
    assert rc.set(kept, "kept")
    for n in NEW:
        assert call(servers, n, "GET", kept) == b"kept", n
    finish(servers, c1)
    check_final(servers, expected)
    assert rc.get(kept) == b"kept" and rc.get(gone) is None and rc.get(asked) is None


@pytest.mark.parametrize("phase", ["settle", "commit"])
def test_coordinator_killed_inside_the_window_resumes_and_lifts_it(server_factory, phase):
    """kill -9 of the coordinator (n1) while held between two nodes of the step: restarted
    from its AOF it holds the rings it had (settled ones stay settled) and the plan, not
    driven; RESUME finishes the operation and no node stays settled."""
    servers = grow_fleet(server_factory, config=AOF)
    c1 = start_held(servers, phase)
    expected = act_in_the_window(servers, "n0", "n1")
    servers["n1"].stop(signal.SIGKILL)
    servers["n1"].start()
    c1 = servers.client("n1")
    st = fleet_status(c1)
    assert st is not None and st["phase"] == phase.encode() and st["running"] == b"no", st
    settled_before = phase == "commit"  # n1 had settled before n0 committed
    assert in_step(servers, "n1", "settle") == settled_before
    # The hold died with the process: RESUME drives the plan to its end.
    resume_to_the_end(servers, c1, expected)


def test_by_hand_settle_and_push_then_commit_one_by_one(server_factory):
    """The steps by hand: BEGIN everywhere, COPY, `SHARD.RING SETTLE` on one node and `PUSH`
    (the settled rings to every node), then COMMIT node by node: between two COMMITs the same
    deletes and writes keep their word."""
    servers = grow_fleet(server_factory)
    assert servers.client("n2").execute_command(
        "SHARD.RING", "SET", "ketama", *ring_args(servers, OLD)) == b"OK"
    for n in NEW:
        assert servers.client(n).execute_command(
            "SHARD.RING", "BEGIN", "ketama", *ring_args(servers, NEW)) == b"OK"
    c0 = servers.client("n0")
    run_job(servers, OLD, "COPY")
    assert c0.execute_command("SHARD.RING", "SETTLE") == b"OK"
    pushed = as_map(c0.execute_command("SHARD.RING", "PUSH"))
    assert pushed == dict.fromkeys(NEW, b"OK"), pushed
    for n in NEW:
        assert in_step(servers, n, "settle"), n
    assert c0.execute_command("SHARD.RING", "COMMIT") == b"OK"
    expected = act_in_the_window(servers, "n0", "n1")
    for n in ("n1", "n2"):
        assert servers.client(n).execute_command("SHARD.RING", "COMMIT") == b"OK"
    run_job(servers, NEW, "CLEANUP")
    assert_one_ring(servers, NEW)
    check_final(servers, expected)
    # SETTLE needs an open resharding.
    with pytest.raises(redis.ResponseError, match="no resharding is open"):
        c0.execute_command("SHARD.RING", "SETTLE")


def test_cluster_clients_removing_a_copied_key_before_settle(server_factory):
    """Copies done, no node settled yet (held at `settle 0`): a cluster client's GETDEL or
    EXPIRE 0 of a key already brought to its new owner removes it there, and must remove the
    old owner's copy too, or every node that still falls back to the old owner (all of them,
    until they settle) reads it back. (On the build before, a GET through n0 returned the
    removed key's old value from n1.)"""
    servers = grow_fleet(server_factory, algo="slots")
    c1 = servers.client("n1")
    assert c1.execute_command("SHARD.DEBUG", "FLEET-HOLD", "settle", 0) == b"OK"
    assert c1.execute_command("SHARD.RESHARD", "START", "slots", *ring_args(servers, NEW)) == b"OK"
    until(lambda: fleet_status(c1)["phase"] == b"settle", "the coordinator holds in settle")
    for n in NEW:
        assert not in_step(servers, n, "settle"), f"{n} settled"
    rc = RedisCluster(host="127.0.0.1", port=servers["n0"].port, socket_timeout=10)
    from_n1 = moving_keys(servers, "n1")
    assert len(from_n1) >= 3
    took, expired, kept = from_n1[:3]
    n2 = servers.client("n2")
    assert all(n2.exists(k) for k in (took, expired, kept)), "the copies are done"
    assert rc.execute_command("GETDEL", took) == f"v:{took}".encode()
    assert rc.expire(expired, 0)
    assert rc.append(kept, "+") == len(f"v:{kept}+")
    for n in NEW:
        for k in (took, expired):
            assert call(servers, n, "GET", k) is None, f"{k}, removed, read back through {n}"
        assert call(servers, n, "GET", kept) == f"v:{kept}+".encode(), n
    finish(servers, c1)
    check_final(servers, {took: None, expired: None, kept: f"v:{kept}+"})


def canonical(ring):
    """A ring's canonical text (as `SHARD.RING INSTALL` takes it) from `SHARD.RING GET`."""
    lines = [f"algo {ring['algo'].decode()}", f"hashtag {ring['hashtag'].decode()}"]
    lines += [f"node {n['name'].decode()} {n['address'].decode()} {n['weight']}"
              for n in ring["nodes"]]
    return "\n".join(lines) + "\n"


def test_resume_in_commit_goes_back_to_settle_for_a_node_that_lost_it(server_factory):
    """Held in commit after n0 committed; n2 then holds the new ring over the old one without
    `settled` (as when its primary failed over, or restarted from an AOF, before the settle
    reached its replica or the disk), and the coordinator is killed. RESUME drives the plan
    back to `settle` (every node settled again, n0 too) and then commits: the operation ends
    and every write of the window is kept. (On the build before, RESUME refused: n2's rings did
    not fit phase commit.)"""
    servers = grow_fleet(server_factory, config=AOF)
    c1 = start_held(servers, "commit")
    expected = act_in_the_window(servers, "n0", "n1")
    c2 = servers.client("n2")
    ring = as_map(c2.execute_command("SHARD.RING", "GET"))
    current, previous = canonical(ring), canonical(ring["previous"])
    # Under the coordinator's term, as its own step (its lease runs: rings given by hand or
    # pushed under its term are refused, SHARD.RING PUSH's LEASEHELD).
    st = as_map(c2.execute_command("SHARD.RING", "STATE"))
    assert c2.execute_command("SHARD.RING", "INSTALL", current, previous, "TERM", st["term"],
                              10_000, st["term_holder"], st["term_address"],
                              st["term_run_id"]) == b"OK"
    assert not in_step(servers, "n2", "settle")
    servers["n1"].stop(signal.SIGKILL)
    servers["n1"].start()
    c1 = servers.client("n1")
    resume_to_the_end(servers, c1, expected)


def test_resume_in_cancel_cleanup_goes_back_to_revert_for_a_node_that_lost_it(server_factory):
    """A grow cancelled after writes at the joining node, held in `cancel-cleanup`; n0 then
    holds the cancel's return again (the old ring over the new one, returning), as when its
    primary and replica were both killed before the revert reached their files (the nemesis,
    Redis seed 2054124654), and the coordinator is killed. RESUME drives the plan back to
    `cancel-revert` and cleans up again: the cancel ends on the old ring everywhere and every
    write made at n2 is at its old owner. (On the build before, RESUME refused: n0's rings did
    not fit phase cancel-cleanup, and the fleet stayed split.)"""
    servers = grow_fleet(server_factory, config=AOF)
    c1 = servers.client("n1")
    assert c1.execute_command("SHARD.DEBUG", "FLEET-HOLD", "begin", 3) == b"OK"
    assert c1.execute_command("SHARD.RESHARD", "START", "ketama", *ring_args(servers, NEW)) == b"OK"
    servers.new_digest = fleet_status(c1)["new_digest"]
    until(lambda: fleet_status(c1)["phase"] == b"begin"
          and all(as_map(servers.client(n).execute_command("SHARD.RING", "STATE"))["digest"]
                  == servers.new_digest for n in NEW), "the begin rings on every node")
    moving = moving_keys(servers, "n0") + moving_keys(servers, "n1")
    assert len(moving) >= 16
    for k in moving:
        assert call(servers, "n2", "SET", k, "during") == b"OK"
    expected = {k: "during" for k in moving}
    begun = as_map(servers.client("n0").execute_command("SHARD.RING", "GET"))
    new, old = canonical(begun), canonical(begun["previous"])

    assert c1.execute_command("SHARD.DEBUG", "FLEET-HOLD", "cancel-cleanup", 3) == b"OK"
    assert c1.execute_command("SHARD.RESHARD", "CANCEL") == b"OK"
    until(lambda: fleet_status(c1)["phase"] == b"cancel-cleanup", "the cancel in cancel-cleanup")
    assert_one_ring(servers, OLD, on=NEW)
    c0 = servers.client("n0")
    st = as_map(c0.execute_command("SHARD.RING", "STATE"))
    assert c0.execute_command("SHARD.RING", "INSTALL", old, new, "RETURNING", "TERM", st["term"],
                              10_000, st["term_holder"], st["term_address"],
                              st["term_run_id"]) == b"OK", "n0 back on the cancel's return"
    back = as_map(c0.execute_command("SHARD.RING", "STATE"))
    assert back["returning"] == b"yes" and back["previous_digest"] == servers.new_digest, back

    servers["n1"].stop(signal.SIGKILL)
    servers["n1"].start()
    c1 = servers.client("n1")
    assert c1.execute_command("SHARD.RESHARD", "RESUME") == b"OK"
    st = wait_fleet(c1, "cancelled")
    assert st["error"] == b"", st
    assert_one_ring(servers, OLD, on=NEW)
    check_final(servers, expected)
