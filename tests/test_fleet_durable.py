"""A fleet operation's step counts done at a node only once that node's replica has it
(issue 33, found by the nemesis): the coordinator sends each step with `WAIT` on the same
connection, and a step that the replica did not acknowledge is sent again, after a failover to
the promoted replica. Before, a ring step acknowledged by a primary whose replica never got it
was lost when Sentinel promoted that replica: the operation ended `done` with that node on
other rings (split rings, keys at the wrong owner).

The test drives the step: `SHARD.DEBUG FLEET-HOLD commit 3` holds the coordinator once the
first three nodes have the commit rings; n3's replica is then stopped (SIGSTOP), the hold
lifted, and once n3's primary holds the commit rings (the step reached the primary only), that
primary is killed and the replica continued: Sentinel promotes it.
"""
import shutil
import threading
import signal

import redis

from helpers.fleet import owners
from helpers.nemesis import SHARDS, Fleet
from helpers.reshard import fleet_status, resume_until_over, status, wait_fleet, wait_job
from helpers.server import as_map, saved_aof, until

KEYS = [f"k:{i}" for i in range(300)]


def state(server):
    return as_map(server.client(socket_timeout=2).execute_command("SHARD.RING", "STATE"))


def restart_from_aof(fleet, server, aof):
    """`server` killed and started again from the AOF saved in `aof`, the sentinels paused
    meanwhile, so that the restart is no failover: it comes back as the primary Sentinel names."""
    for s in fleet.sentinels:
        s.proc.send_signal(signal.SIGSTOP)
    try:
        server.stop(signal.SIGKILL)
        shutil.rmtree(server.workdir / "appendonlydir")
        shutil.copytree(aof, server.workdir / "appendonlydir")
        server.start()
    finally:
        for s in fleet.sentinels:
            s.proc.send_signal(signal.SIGCONT)


def grown_after_saving(fleet, name, tmp_path):
    """`name`'s AOF saved, then the fleet grown from three nodes to four by the coordinator
    (n0). Returns the saved AOF, the new rings' digest, and the keys the grow moved from `name`
    (to n3; for n3, those the grow gave it)."""
    coordinator = fleet.primaries["n0"].client(socket_timeout=20)
    before = dict(zip(KEYS, owners(coordinator, KEYS)))
    old_aof = saved_aof(fleet.primaries[name], tmp_path / f"{name}-aof-before-the-grow")
    ring4 = ["slots", *[x for n in SHARDS for x in (n, "sentinel", 1)]]
    assert coordinator.execute_command("SHARD.RESHARD", "START", *ring4) == b"OK"
    new = wait_fleet(coordinator, "done")["new_digest"]
    after = dict(zip(KEYS, owners(coordinator, KEYS)))
    moved = [k for k in KEYS if after[k] == "n3" and (before[k] == name) != (name == "n3")]
    assert len(moved) >= 10
    return old_aof, new, moved


def set_all(client, keys, value):
    """`SHARD.CALL SET key value(key)` for every key, through `client`."""
    pipe = client.pipeline(transaction=False)
    for k in keys:
        pipe.execute_command("SHARD.CALL", "SET", k, value(k))
    assert all(r == b"OK" for r in pipe.execute())


def grown_and_rewritten(fleet, coordinator, tmp_path):
    """Every key written (`v:key`), n1's AOF saved, the grow (`grown_after_saving`), then the
    keys it moved from n1 written again at their new owner (`w:key`)."""
    set_all(coordinator, KEYS, lambda k: f"v:{k}")
    old_aof, new, moved = grown_after_saving(fleet, "n1", tmp_path)
    set_all(coordinator, moved, lambda k: f"w:{k}")
    return old_aof, new, moved


def test_a_ring_step_lost_in_a_failover_is_sent_again(server_factory, sentinel_factory,
                                                      clockshim, tmp_path):
    fleet = Fleet(server_factory, sentinel_factory, clockshim, tmp_path,
                  config=[("enable-debug-command", "yes")])
    coordinator = fleet.primaries["n0"].client(socket_timeout=20)
    set_all(coordinator, KEYS, lambda k: f"v:{k}")

    assert coordinator.execute_command("SHARD.DEBUG", "FLEET-HOLD", "commit", 3) == b"OK"
    ring = ["slots", *[x for n in SHARDS for x in (n, "sentinel", 1)]]
    assert coordinator.execute_command("SHARD.RESHARD", "START", *ring) == b"OK"
    new = fleet_status(coordinator)["new_digest"]

    def has_commit(server):
        st = state(server)
        return st["digest"] == new and st["previous_digest"] == b""

    until(lambda: all(has_commit(fleet.primaries[n]) for n in ("n0", "n1", "n2")),
          "n0..n2 have the commit rings", timeout=60)
    assert not has_commit(fleet.primaries["n3"])
    # The step reaches n3's primary only.
    old_primary, replica = fleet.primaries["n3"], fleet.replicas["n3"]
    replica.proc.send_signal(signal.SIGSTOP)
    try:
        # A stopped replica still receives what its socket can take (and reads it once
        # continued): a filler, in another database, fills that socket and the primary's, so
        # that the ring step stays in the primary's output buffer and dies with it.
        filler = old_primary.client(db=9, socket_timeout=20)
        filler.config_set("shard.cluster-protocol", "no")  # it dies with the filler
        for i in range(4):
            filler.set(f"filler:{i}", b"x" * (16 << 20))
        assert coordinator.execute_command("SHARD.DEBUG", "FLEET-HOLD", "OFF") == b"OK"
        until(lambda: has_commit(old_primary), "n3's primary has the commit rings", timeout=30)
        filler.flushdb()
        old_primary.proc.send_signal(signal.SIGKILL)
        old_primary.proc.wait()
    finally:
        replica.proc.send_signal(signal.SIGCONT)
    assert not has_commit(replica), "the replica got the commit rings before it was stopped"
    until(lambda: fleet.master_address("n3") == replica.port
          and fleet.role(replica) == "master", "Sentinel promoted n3's replica", timeout=60)
    # The old primary back, as an operator restarts a server that crashed: Sentinel makes it a
    # replica of the promoted one (the grow's copies to n3 and its cleanup there count done
    # once a replica has them, `reshard/fleet/landed.rs`).
    fleet.restart(old_primary)

    # The coordinator may have given up while n3 had no primary: RESUME goes on.
    st = resume_until_over(coordinator, "the operation ends")

    # Every node, the promoted replica too, holds the new ring alone. Each shard's primary is
    # the one Sentinel names now: on a loaded machine (CI) Sentinel (`down-after` 1 s) may
    # have failed a shard over again meanwhile, n3's back to its restarted old primary.
    until(fleet.settled, "every shard's primary named by Sentinel, its replica linked",
          timeout=60)
    primaries = {n: fleet.primary(n) for n in SHARDS}
    for n, s in primaries.items():
        got = state(s)
        assert (got["digest"], got["previous_digest"]) == (new, b""), (n, got, st)
    # Every key at its owner only, with its value.
    expected = dict(zip(KEYS, owners(coordinator, KEYS)))
    for n, s in primaries.items():
        c = s.client()
        assert s.client(db=9).dbsize() == 0
        held = [k.decode() for k in c.scan_iter(count=1000)]
        stray = [k for k in held if expected.get(k) != n]
        assert not stray, f"{len(stray)} keys on {n}, which does not own them: {stray[:10]}"
        mine = [k for k in KEYS if expected[k] == n]
        pipe = c.pipeline(transaction=False)
        for k in mine:
            pipe.get(k)
        values = pipe.execute(raise_on_error=False)
        missing = [(k, v) for k, v in zip(mine, values) if v != f"v:{k}".encode()]
        assert not missing, (f"{n} ({s.port}, {fleet.role(s)}) lacks {len(missing)} of its "
                             f"keys: {missing[:10]}")


def test_a_node_back_on_rings_older_than_the_fleets_is_brought_up_to_date(
        server_factory, sentinel_factory, clockshim, tmp_path):
    """A node restarted from an AOF older than the fleet's last operation (as a server killed
    before the AOF rewrite that follows a full sync had finished comes back: the nemesis test
    found the joining node on the old ring after a grow had ended) holds rings of an older
    fleet term than its peers: once loaded it asks them, and a node of the newer term pushes
    it the rings. Before, it stayed on the old ring for good."""
    fleet = Fleet(server_factory, sentinel_factory, clockshim, tmp_path)
    n3 = fleet.primaries["n3"]
    old = as_map(n3.client().execute_command("SHARD.RING", "GET"))["digest"]
    # n3's AOF as it is before the grow (its old ring, no fleet term).
    old_aof, new, _ = grown_after_saving(fleet, "n3", tmp_path)
    assert new != old
    # The sentinels paused, so that the restart is no failover: n3's primary comes back from
    # the old AOF as the primary Sentinel names.
    restart_from_aof(fleet, n3, old_aof)
    until(lambda: as_map(n3.client().execute_command("SHARD.RING", "GET"))["digest"] == new,
          "n3 brought back to the fleet's ring", timeout=30)


def test_a_node_brought_up_to_date_drops_the_copies_the_fleet_moved_away(
        server_factory, sentinel_factory, clockshim, tmp_path):
    """A node back from an AOF older than a grow (in the nemesis test: a replica restarted from
    its AOF and promoted before it synced) holds the keys the grow moved away from it, now
    written again at their new owner. Its rings are brought up to date, and it cleans up the
    keys of buckets it no longer owns. Before, they stayed: the shrink that followed moved those
    buckets back, skipped the owner's newer copies as already there, and cleaned them up at
    their owner: the writes made since the grow were lost (NEMESIS_SEED=32)."""
    fleet = Fleet(server_factory, sentinel_factory, clockshim, tmp_path)
    coordinator = fleet.primaries["n0"].client(socket_timeout=20)
    n1 = fleet.primaries["n1"]
    old_aof, new, moved = grown_and_rewritten(fleet, coordinator, tmp_path)
    # n1 back from the AOF before the grow, as the primary Sentinel names (no failover).
    restart_from_aof(fleet, n1, old_aof)
    c1 = n1.client()
    assert c1.exists(*moved) == len(moved)  # the grow's moved copies, back
    until(lambda: as_map(c1.execute_command("SHARD.RING", "GET"))["digest"] == new,
          "n1 brought back to the fleet's ring", timeout=30)

    def only_its_own():
        keys = [k.decode() for k in c1.scan_iter(count=1000)]
        return keys and all(o == "n1" for o in owners(coordinator, keys)) \
            and state(n1)["job_state"] != b"cleaning"
    until(only_its_own, "n1 to hold only the keys it owns", timeout=30)

    # The shrink moves the buckets back to n1: the newer copies come with them.
    ring3 = ["slots", *[x for n in SHARDS[:3] for x in (n, "sentinel", 1)]]
    assert coordinator.execute_command("SHARD.RESHARD", "START", *ring3) == b"OK"
    wait_fleet(coordinator, "done")
    got = dict(zip(moved, coordinator.pipeline(transaction=False).execute_command(
        "SHARD.CALL", "MGET", *moved).execute()[0]))
    stale = {k: v for k, v in got.items() if v != f"w:{k}".encode()}
    assert not stale, f"{len(stale)} of {len(moved)} keys lost their writes since the grow: " \
                      f"{dict(list(stale.items())[:5])}"


def big(key):
    return f"v:{key}:" + "x" * 20_000


def test_a_copy_counts_done_only_at_the_server_that_ran_it(
        server_factory, sentinel_factory, clockshim, tmp_path):
    """A shrink's source fails over mid-copy, back to a server that holds a finished copy of an
    older job (here one run by hand; in the nemesis test, a copy that server had run as the
    primary in an earlier operation). Before, the coordinator counted that old copy done for
    this step: the shrink ended with the keys the failed-over copy had not sent yet left at n3,
    then deleted there by its cleanup (lost). Now a job counts only when it carries the step's
    term, a demoted server's job stops and counts for no step, and the copy runs again at the
    server Sentinel names."""
    fleet = Fleet(server_factory, sentinel_factory, clockshim, tmp_path)
    coordinator = fleet.primaries["n0"].client(socket_timeout=20)
    ring4 = ["slots", *[x for n in SHARDS for x in (n, "sentinel", 1)]]
    assert coordinator.execute_command("SHARD.RESHARD", "START", *ring4) == b"OK"
    wait_fleet(coordinator, "done")
    # Values of 20 KB: the copy's shipper sends every few keys, not all at its end.
    set_all(coordinator, KEYS, big)
    moving = [k for k, o in zip(KEYS, owners(coordinator, KEYS)) if o == "n3"]
    assert len(moving) >= 30
    first, second = fleet.primaries["n3"], fleet.replicas["n3"]
    until(lambda: second.client().dbsize() == first.client().dbsize(), "n3's replica in sync")
    # An older job on n3's primary: a copy by hand, done (every key there is its own).
    c = first.client()
    assert c.execute_command("SHARD.RESHARD", "COPY") == b"OK"
    assert wait_job(c)["state"] == b"done"

    fleet.fail_over_to("n3", second)
    ring3 = ["slots", *[x for n in SHARDS[:3] for x in (n, "sentinel", 1)]]
    assert coordinator.execute_command("SHARD.RESHARD", "START", *ring3, "MAXRATE", 10) == b"OK"
    r = second.client()
    until(lambda: fleet_status(coordinator)["phase"] == b"copy", "the shrink's copy phase")
    assert "n3" not in owners(coordinator, moving)  # the new ring

    def arrived():
        # Counted by DBSIZE: a read of a key under the cluster protocol falls back to n3.
        held = sum(fleet.primary(n).client().dbsize() for n in SHARDS[:3])
        return held - (len(KEYS) - len(moving))
    until(lambda: status(r)["state"] == b"copying" and arrived() >= 1,
          "the shrink's copy under way at n3's second server")
    assert r.execute_command("SHARD.RESHARD", "PAUSE") == b"OK"
    until(lambda: status(r)["in_flight"] == 0, "the paused copy has nothing in flight")
    assert arrived() < len(moving), "the copy was over before its pause"
    # Back to the first server mid-copy: it holds the older job's copy, done.
    fleet.fail_over_to("n3", first)

    resume_until_over(coordinator, "the shrink ends")
    # Every key at its owner, with its value; n3 left with nothing.
    expected = dict(zip(KEYS, owners(coordinator, KEYS)))
    assert "n3" not in expected.values()
    for n in SHARDS[:3]:
        s = fleet.primary(n).client()
        mine = [k for k in KEYS if expected[k] == n]
        pipe = s.pipeline(transaction=False)
        for k in mine:
            pipe.get(k)
        values = pipe.execute()
        missing = [k for k, v in zip(mine, values) if v != big(k).encode()]
        assert not missing, f"{n} lacks {len(missing)} of its keys: {missing[:10]}"
    assert fleet.primary("n3").client().dbsize() == 0
    # The demoted server's copy stopped with its demotion.
    assert status(r)["state"] != b"copying"


def test_a_node_back_on_older_rings_refuses_writes_until_they_are_checked(
        server_factory, sentinel_factory, clockshim, tmp_path):
    """A node back from an AOF older than a grow holds the old ring until its peers push it the
    new one (issue 33, the nemesis test's lost list elements): before, it acknowledged the
    writes routed through it by the old ring meanwhile, at owners the new ring no longer names,
    and they were lost. Now its rings are unchecked after the load and its writes refused with
    TRYAGAIN (SHARD.CALL's and the cluster protocol's) until the check is over, and so are the
    reads it would send to another node by them.
    The test holds the check (`SHARD_DEBUG_HOLD_RING_CHECK=yes` at start, then `SHARD.DEBUG
    RING-CHECK GO`), so that it acts while the gate is closed."""
    fleet = Fleet(server_factory, sentinel_factory, clockshim, tmp_path,
                  config=[("enable-debug-command", "yes")])
    coordinator = fleet.primaries["n0"].client(socket_timeout=20)
    n3 = fleet.primaries["n3"]
    # Keys the grow gave n3: the old ring routes them elsewhere.
    old_aof, new, moved = grown_after_saving(fleet, "n3", tmp_path)

    n3.env = dict(n3.env or {}, SHARD_DEBUG_HOLD_RING_CHECK="yes")
    restart_from_aof(fleet, n3, old_aof)
    c3 = n3.client(socket_timeout=20)
    c3.config_set("shard.cluster-protocol", "yes")  # as an operator's configuration would
    acked, refused = [], []
    for k in moved:
        try:
            assert c3.execute_command("SHARD.CALL", "RPUSH", f"l:{k}", "e1") == 1
            acked.append(k)
        except redis.ResponseError as e:
            refused.append(str(e))
    try:
        c3.execute_command("SET", moved[0], "plain")  # the cluster protocol's write
    except redis.ResponseError as e:
        refused.append(str(e))
    else:
        acked.append(None)
    # A read the old ring sends to another node is refused too (it could miss newer writes),
    # through SHARD.CALL and the cluster protocol (before: MOVED to the old owner).
    for read in (("SHARD.CALL", "GET", moved[0]), ("GET", moved[0])):
        try:
            c3.execute_command(*read)
        except redis.ResponseError as e:
            refused.append(str(e))
        else:
            acked.append("read")
    assert c3.execute_command("SHARD.DEBUG", "RING-CHECK", "GO") == b"OK"
    until(lambda: as_map(c3.execute_command("SHARD.RING", "GET"))["digest"] == new,
          "n3 brought back to the fleet's ring", timeout=30)

    # Writes are accepted again once the rings are checked (retried while the push lands).
    def write_all():
        for k in moved:
            try:
                c3.execute_command("SHARD.CALL", "RPUSH", f"l:{k}", "e2")
            except redis.ResponseError as e:
                if not str(e).startswith("TRYAGAIN"):
                    raise
                return False
        return True
    until(write_all, "n3 accepts writes again", timeout=30)
    # No acknowledged element is lost: every list holds what was acknowledged.
    pipe = coordinator.pipeline(transaction=False)
    for k in moved:
        pipe.execute_command("SHARD.CALL", "LRANGE", f"l:{k}", 0, -1)
    got = dict(zip(moved, pipe.execute()))
    lost = [k for k in acked if k not in (None, "read") and b"e1" not in got[k]]
    assert not lost, f"{len(lost)} of {len(acked)} acknowledged elements lost: {lost[:5]}"
    assert not acked, f"{len(acked)} writes acknowledged by the old ring: {acked[:5]}"
    assert all(r.startswith("TRYAGAIN this node's rings are being checked") for r in refused), \
        refused[:3]


def test_a_node_back_on_older_rings_reads_nothing_until_they_are_checked(
        server_factory, sentinel_factory, clockshim, tmp_path):
    """A node back from an AOF older than a grow holds the keys the grow moved away from it, and
    its old rings call them its own: a read of one there, while its rings are being checked,
    answered the old value, missing the write the new owner acknowledged since (the nemesis
    test's bad reads, Redis seed 7, through a replica promoted with older rings). Now every
    keyed read is refused with TRYAGAIN while the gate is closed, through `SHARD.CALL` (before,
    the filter ran it as a plain local read) and the cluster protocol (before, served here),
    and answers the new value once the rings are checked. The check is held as above."""
    fleet = Fleet(server_factory, sentinel_factory, clockshim, tmp_path,
                  config=[("enable-debug-command", "yes")])
    coordinator = fleet.primaries["n0"].client(socket_timeout=20)
    n1 = fleet.primaries["n1"]
    old_aof, new, moved = grown_and_rewritten(fleet, coordinator, tmp_path)

    n1.env = dict(n1.env or {}, SHARD_DEBUG_HOLD_RING_CHECK="yes")
    restart_from_aof(fleet, n1, old_aof)
    c1 = n1.client(socket_timeout=20)
    assert c1.get(moved[0]) == f"v:{moved[0]}".encode()  # the old copy is here
    c1.config_set("shard.cluster-protocol", "yes")
    answered, refused = {}, []
    for read in [("SHARD.CALL", "GET", k) for k in moved[:5]] + [("GET", k) for k in moved[:5]]:
        try:
            answered[read] = c1.execute_command(*read)
        except redis.ResponseError as e:
            refused.append(str(e))
    assert not answered, f"{len(answered)} reads answered by the unchecked rings: " \
                         f"{list(answered.items())[:4]}"
    assert all(r.startswith("TRYAGAIN this node's rings are being checked") for r in refused), \
        refused[:3]
    assert c1.execute_command("SHARD.DEBUG", "RING-CHECK", "GO") == b"OK"
    until(lambda: as_map(c1.execute_command("SHARD.RING", "GET"))["digest"] == new,
          "n1 brought back to the fleet's ring", timeout=30)

    def read_new():
        try:
            return all(c1.execute_command("SHARD.CALL", "GET", k) == f"w:{k}".encode()
                       for k in moved[:5])
        except redis.ResponseError as e:
            if not str(e).startswith("TRYAGAIN"):
                raise
            return False
    until(read_new, "n1 reads the new owner's values", timeout=30)


def test_start_replies_once_the_coordinators_replica_has_the_plan(
        server_factory, sentinel_factory, clockshim, tmp_path):
    """The plan is made durable at the coordinator as a step is at any node: `SHARD.RESHARD
    PLAN` sent to itself and acknowledged by its replica (`WAIT`) before the coordinator goes
    on. Before, it was acknowledged by the primary alone: START replied, and the fleet was
    driven, while the coordinator's replica (stopped here) did not have the plan, so a
    failover to it lost the operation's phase."""
    fleet = Fleet(server_factory, sentinel_factory, clockshim, tmp_path)
    coordinator = fleet.primaries["n0"].client(socket_timeout=60)
    replica = fleet.replicas["n0"]
    ring = ["slots", *[x for n in SHARDS for x in (n, "sentinel", 1)]]
    replies = []
    replica.proc.send_signal(signal.SIGSTOP)
    try:
        start = threading.Thread(target=lambda: replies.append(
            coordinator.execute_command("SHARD.RESHARD", "START", *ring)))
        start.start()
        start.join(timeout=1.5)
        assert not replies, "START replied while the coordinator's replica could not have the plan"
    finally:
        replica.proc.send_signal(signal.SIGCONT)
    start.join(timeout=30)
    assert replies == [b"OK"]
    assert replica.client().execute_command("SHARD.RESHARD", "PLAN") is not None
    wait_fleet(coordinator, "done", timeout=120)
