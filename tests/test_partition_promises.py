"""What the fleet promises under a network partition (issue 44), each promise driven at its exact
step: servers and sentinels on loopback addresses of their own, cut from each other by `nft`
rules (tests/helpers/partition.py; the harness and the Jepsen case are in test_partition.py).

- a transaction's owner (or every owner) cut off from its coordinator after PREPARE and before
  COMMIT: the part stays locked and in doubt, neither applied nor dropped, for as long as the
  cut lasts (past the lock's deadline); after the heal it is applied, once, everywhere;
- a grow's destination cut off mid-copy: the grow does not finish; after the heal and RESUME
  every key is at its owner only, and a value written at the new owner since is not copied over;
- a grow's coordinator cut off from the fleet: another node given the plan cannot RESUME while
  the lease runs, takes the next term once it has run out (clocks stepped on either side change
  nothing: the lease runs on a monotonic clock), and the old coordinator's steps are refused by
  term after the heal;
- a node cut off from a ring change (settle or commit) reads and writes moved keys at their new
  owner, through SHARD.CALL and route-plain, never from the copy it still holds;
- sentinels split 2|1: the minority never fails over; the majority's failover is followed by
  the module;
- a one-way cut between two primaries: calls fail naming the node within the call timeout, a
  transaction is applied everywhere or nowhere, the main threads never stall;
- SHARD.GENKEY on a primary cut off and failed over: every ID drawn on either side is distinct.
"""

import threading
import time

import pytest
import redis

from helpers.fleet import Fleet, assert_owned_only, owners
from helpers.reshard import assert_one_ring, fleet_status, resume_until_over, wait_copying
from helpers.server import as_map, info_shard, until, wait_in_sync
from helpers.txn import Exec, call, counter, held, hold, no_lock_left
from test_partition import master_of, ring_args, ring_state, sentinel_setup

pytestmark = pytest.mark.slow


def part_fleet(server_factory, partition, names, ring, module_args=(), config=(), env=None):
    """One server per name on an address of its own, `call-timeout-ms` 500, SHARD.DEBUG on; the
    ring of `ring` set on the servers it names."""
    fleet = Fleet()
    for n in names:
        fleet[n] = server_factory(
            module_args=["self", n, "call-timeout-ms", 500, *module_args],
            config=[("enable-debug-command", "yes"), *config],
            host=partition.addresses.next(), env=(env or {}).get(n))
    for n in ring:
        assert fleet.client(n).execute_command("SHARD.RING", "SET", "ketama",
                                               *ring_args(fleet, ring)) == b"OK"
    return fleet


# --- 1. a transaction's owners cut off from the coordinator after PREPARE --------------------

LOCK_MS = 1000


def locked_by(client, key):
    """The TRYAGAIN a read of `key` gets at once (shard.txn-lock-ms 1 meanwhile), or its value."""
    client.config_set("shard.txn-lock-ms", 1)
    try:
        return call(client, "GET", key)
    except redis.ResponseError as e:
        return str(e)
    finally:
        client.config_set("shard.txn-lock-ms", LOCK_MS)


@pytest.mark.parametrize("cut", ["one-owner", pytest.param("every-owner", marks=pytest.mark.partitions)])
def test_txn_owner_cut_off_between_prepare_and_commit_stays_in_doubt(server_factory, partition,
                                                                      cut):
    """n0 coordinates a transfer between n1 and n2, held once both prepared (TXN-HOLD
    prepared); n1 (or n1 and n2) is cut off from n0, the hold released: n0 decides commit and
    its COMMIT to the cut owners is lost. For three times the lock's deadline each cut owner
    keeps its part locked and in doubt (it asks n0, which it cannot reach): it neither applies
    nor drops it; a reader of its key is refused naming the txid. After the heal the commit
    reaches it: both parts applied, once; no lock, doubt or decision left."""
    fleet = part_fleet(server_factory, partition, ["n0", "n1", "n2"], ["n0", "n1", "n2"])
    for n in fleet:
        fleet.client(n).config_set("shard.txn-lock-ms", LOCK_MS)
    c0 = fleet.client("n0")
    a, b = fleet.key_of("n1", prefix="acct"), fleet.key_of("n2", prefix="acct")
    call(c0, "MSET", a, 100, b, 100)
    # A second transfer, committed before the cut, proves the path works.
    ex = Exec(fleet["n0"], [("DECRBY", a, 1), ("INCRBY", b, 1)])
    assert ex.join() == [99, 101]
    hold(c0, "prepared")
    ex = Exec(fleet["n0"], [("DECRBY", a, 30), ("INCRBY", b, 30)])
    until(lambda: held(c0) == 1,
          "the transfer waits with both parts prepared")
    assert [counter(fleet.client(n), "txn_locks_held") for n in ("n1", "n2")] == [1, 1]
    cut_off = ["n1"] if cut == "one-owner" else ["n1", "n2"]
    partition.cut(fleet["n0"], [fleet[n] for n in cut_off])
    cut_at = time.monotonic()
    hold(c0, "OFF")
    result = ex.join()
    # The decision was commit: the client is told so, and that n1 has not confirmed.
    assert isinstance(result, redis.ResponseError), result
    assert str(result).startswith("the transaction committed, but node n1 has not confirmed"), \
        result
    assert counter(c0, "txn_decisions_held") == 1
    until(lambda: all(counter(fleet.client(n), "txn_in_doubt") == 1 for n in cut_off),
          "the cut-off parts in doubt past their deadline")
    if cut == "one-owner":
        # n2 got its COMMIT: applied, unlocked.
        assert fleet.client("n2").get(b) == b"131"
        assert counter(fleet.client("n2"), "txn_locks_held") == 0
    # The cut lasts three deadlines: every cut-off part still locked and in doubt, neither
    # applied nor dropped (a read is refused naming the lock).
    while time.monotonic() < cut_at + 3 * LOCK_MS / 1000 + 1:
        for n in cut_off:
            c = fleet.client(n)
            assert counter(c, "txn_locks_held") == 1 and counter(c, "txn_in_doubt") == 1, n
        time.sleep(0.2)
    for n, key in (("n1", a), ("n2", b)):
        if n in cut_off:
            refused = locked_by(fleet.client(n), key)
            assert isinstance(refused, str) and refused.startswith("TRYAGAIN") \
                and "n0/" in refused, refused
    partition.heal()
    until(lambda: no_lock_left(fleet), "the commit reaches the cut-off owners", timeout=20)
    assert [fleet.client("n1").get(a), fleet.client("n2").get(b)] == [b"69", b"131"], \
        "every part applied once"
    assert counter(c0, "txn_committed") == 2


# --- 2. a grow's destination cut off mid-copy ------------------------------------------------

KEYS = 30_000
RATE = 1000  # MAXRATE: the copy of a grow 3 -> 4 takes about 2.5 s
NAMES3, NAMES4 = ["n0", "n1", "n2"], ["n0", "n1", "n2", "n3"]


def load(fleet, names, keys, value="v"):
    """Writes `keys` with `value` at their owners under the ring of names[0]."""
    owner = dict(zip(keys, owners(fleet.client(names[0]), keys)))
    for n in names:
        pipe = fleet.client(n).pipeline(transaction=False)
        for k in keys:
            if owner[k] == n:
                pipe.set(k, value)
        pipe.execute()
    return owner


@pytest.mark.partitions
def test_destination_cut_off_mid_copy_keeps_every_key_and_newer_data(server_factory, partition):
    """A grow of n0..n2 to n3 (MAXRATE): n3, the destination, is cut off from every other node
    while the copies run. The grow does not finish while it is cut. After the heal a value is
    written at n3 (SHARD.CALL through n3) for some moved keys before the copies are RESUMEd:
    the copies never write over it; once the grow is done every key is at its owner only, the
    newer values kept, the others unchanged."""
    fleet = part_fleet(server_factory, partition, NAMES4, NAMES3)
    c0, c3 = fleet.client("n0"), fleet.client("n3", socket_timeout=10)
    keys = [f"k:{i}" for i in range(KEYS)]
    load(fleet, NAMES3, keys)
    assert c0.execute_command("SHARD.RESHARD", "START", "ketama", *ring_args(fleet, NAMES4),
                              "MAXRATE", RATE) == b"OK"
    wait_copying(c0)
    partition.cut(fleet["n3"], [fleet[n] for n in NAMES3])
    cut_at = time.monotonic()
    # Writes of moving keys during the cut: through n0 (they go to the new owner, n3) or n3
    # (which fetches the old value first): each either fails or is acknowledged.
    # n0 holds the new ring as current since the copy began: each key's new owner.
    new_owner = dict(zip(keys, owners(c0, keys)))
    moved = [k for k in keys if new_owner[k] == "n3"]
    assert len(moved) > 1000, len(moved)
    acked = {}
    for i, k in enumerate(moved[:8]):
        via = c0 if i % 2 else c3
        try:
            if call(via, "SET", k, f"cut-{i}") == b"OK":
                acked[k] = f"cut-{i}".encode()
        except redis.RedisError:
            pass
    time.sleep(max(0.0, cut_at + 4 - time.monotonic()))
    st = fleet_status(c0)
    print(f"\nafter the cut: phase {st['phase']}, running {st['running']}, error {st['error']!r};"
          f" acknowledged during the cut: {len(acked)} of 8")
    assert st["phase"] != b"done", "the grow finished while its destination was cut off"
    partition.heal()
    # Newer values at the new owner, written while the copy is still unfinished.
    newer = moved[-200:]
    for i, k in enumerate(newer):
        until(lambda: call(c3, "SET", k, f"newer-{i}") == b"OK", "a write at n3 after the heal",
              timeout=15)
    acked.update({k: f"newer-{i}".encode() for i, k in enumerate(newer)})
    healed_at = time.monotonic()
    resume_until_over(c0, "the grow ends after the heal", timeout=90)
    print(f"the grow ended {time.monotonic() - healed_at:.1f} s after the newer writes")
    assert_one_ring(fleet, NAMES4)
    total = assert_owned_only(fleet, c0)
    assert total == len(keys), (total, len(keys))
    got = {}
    for n in NAMES4:
        mine = [k for k in keys if new_owner[k] == n]
        got.update(zip(mine, fleet.client(n).mget(mine)))
    lost = [k for k in keys if got[k] is None]
    assert not lost, f"{len(lost)} keys lost: {lost[:5]}"
    overwritten = {k: (got[k], v) for k, v in acked.items() if got[k] != v}
    assert not overwritten, f"copied over newer data: {list(overwritten.items())[:5]}"
    changed = [k for k in keys if k not in acked and got[k] != b"v"]
    assert not changed, changed[:5]


# --- 3. a grow's coordinator cut off from the fleet: the lease, a second coordinator ----------

LEASE_MS = 4000


def node_state(client):
    return as_map(client.execute_command("SHARD.RING", "STATE"))


@pytest.mark.parametrize("clocks", [pytest.param("same", marks=pytest.mark.partitions),
                                    pytest.param("others-ahead", marks=pytest.mark.partitions),
                                    "coordinator-behind"])
def test_coordinator_cut_off_loses_its_lease_to_one_resume_and_is_fenced(
        server_factory, partition, clockshim, tmp_path, clocks):
    """n0 coordinates a grow (MAXRATE, `fleet-lease-ms` 4000) and is cut off from n1..n3 in
    phase copy; n1 holds the plan. RESUME at n1 is refused (LEASEHELD) while n0's lease runs at
    the nodes, and takes the next term once it ran out, not before; n2 and n3 follow n1.
    `others-ahead`: right after the cut n1..n3's wall clocks step forward 60 s (a lease counted
    by the wall clock would have run out at once there): the lease runs on a monotonic clock,
    so nothing changes. `coordinator-behind`: n0's clock steps back 60 s instead: its pending
    timers (its polls) still run on time, so it stops within seconds of the heal (the server's
    module timers are keyed by the wall clock: src/host/timers.rs). After the heal n0 stops driving (its steps refused by
    term), never drove past the cut, and an old-term step sent by hand is refused; n1 finishes
    the grow: every key once at its owner."""
    from test_durability import Clock
    clock = {}
    if clocks != "same":
        clock = {n: Clock(tmp_path / f"clock-{n}", clockshim) for n in NAMES4}
    fleet = part_fleet(server_factory, partition, NAMES4, NAMES3,
                       module_args=["fleet-lease-ms", LEASE_MS],
                       env={n: c.env() for n, c in clock.items()})
    for n, c in clock.items():
        c.server = fleet[n]
    keys = [f"k:{i}" for i in range(KEYS)]
    load(fleet, NAMES3, keys)
    c0, c1, c2, c3 = (fleet.client(n, socket_timeout=30) for n in NAMES4)
    assert c0.execute_command("SHARD.RESHARD", "START", "ketama", *ring_args(fleet, NAMES4),
                              "MAXRATE", RATE) == b"OK"
    term = wait_copying(c0)["term"]
    run_id = node_state(c0)["run_id"]
    assert c1.execute_command("SHARD.RESHARD", "PLAN",
                              c0.execute_command("SHARD.RESHARD", "PLAN")) == b"OK"
    partition.cut(fleet["n0"], [fleet[n] for n in ("n1", "n2", "n3")])
    cut_at = time.monotonic()
    if clocks == "coordinator-behind":
        clock["n0"].set(-60_000)
    elif clocks == "others-ahead":
        for n in ("n1", "n2", "n3"):
            clock[n].set(60_000)
    refusals = []

    def resumed():
        try:
            return c1.execute_command("SHARD.RESHARD", "RESUME") == b"OK"
        except redis.ResponseError as e:
            assert str(e).startswith(f"LEASEHELD term {term} of n0"), e
            refusals.append(time.monotonic())
            return False
    until(resumed, "n0's lease to run out at the nodes", timeout=30, every=0.2)
    resumed_at = time.monotonic()
    print(f"\n{clocks}: RESUME refused {len(refusals)} times, "
          f"taken {resumed_at - cut_at:.1f} s after the cut")
    assert refusals and refusals[0] - cut_at < 1.0, "RESUME was not refused right after the cut"
    # n0 renews every third of the lease: it ran out no sooner than two thirds of it after.
    assert resumed_at - cut_at > LEASE_MS * 0.6 / 1000, resumed_at - cut_at
    assert fleet_status(c1)["term"] == term + 1
    for c in (c2, c3):
        until(lambda: node_state(c)["term"] == term + 1, "the nodes follow n1's term")
        assert node_state(c)["term_holder"] == b"n1"
    assert node_state(c0)["term"] == term, "n0 heard nothing of the new term while cut off"
    time.sleep(1)
    partition.heal()
    # (The clocks stay where they were stepped: a step back would delay the timers armed
    # meanwhile, as in `coordinator-behind`.)
    until(lambda: fleet_status(c0)["running"] == b"no", "n0 stops driving after the heal",
          timeout=10)
    resume_until_over(c1, "n1 finishes the grow", timeout=90)
    st0 = fleet_status(c0)
    print(f"n0 after the heal: lease {st0['lease']!r}, error {st0['error']!r}")
    assert st0["term"] == term and st0["phase"] == b"copy", "n0 drove past the cut"
    for c in (c0, c1, c2, c3):
        s = node_state(c)
        assert s["term"] >= term + 1 and s["term_holder"] == b"n1", s
    with pytest.raises(redis.ResponseError, match=rf"^STALETERM step of term {term} from n0"):
        c2.execute_command("SHARD.RING", "LEASE", term, LEASE_MS, "n0",
                           f"{fleet['n0'].host}:{fleet['n0'].port}", run_id)
    assert_one_ring(fleet, NAMES4)
    assert assert_owned_only(fleet, c0) == len(keys)


# --- 4. a node cut off from a ring change ----------------------------------------------------


@pytest.mark.parametrize("phase", ["settle", "commit"])
def test_node_cut_off_from_a_ring_change_serves_nothing_by_the_old_ring(server_factory,
                                                                        partition, phase):
    """A grow of n0..n2 to n3, held at n0 once it has the rings of `settle` (or `commit`); n2
    is cut off from n0, which goes on to give the other nodes those rings while n2 keeps the
    ones before. Newer values of the keys n2 gives to n3 are written at n3. Through n2 (its
    clients with `shard.route-plain yes`, and SHARD.CALL) every read of those keys, during the
    cut and after the heal, returns the newer value or an error: never the copy n2 still holds;
    after the grow n2 routes their writes to n3 and holds none of them."""
    fleet = part_fleet(server_factory, partition, NAMES4, NAMES3)
    keys = [f"k:{i}" for i in range(3000)]
    old_owner = load(fleet, NAMES3, keys)
    c0, c2, c3 = fleet.client("n0"), fleet.client("n2"), fleet.client("n3")
    c2.config_set("shard.route-plain", "yes")
    plain2 = fleet.client("n2")  # a client of n2 whose plain commands are routed
    assert c0.execute_command("SHARD.DEBUG", "FLEET-HOLD", phase, 1) == b"OK"
    assert c0.execute_command("SHARD.RESHARD", "START", "ketama",
                              *ring_args(fleet, NAMES4)) == b"OK"
    new_digest = fleet_status(c0)["new_digest"]

    def in_step(c):
        st = ring_state(c)
        if phase == "settle":
            return st.get("settled") == b"yes"
        return st["digest"] == new_digest and st["previous_digest"] == b""
    until(lambda: in_step(c0), f"n0 has the rings of {phase}")
    assert not in_step(c2)
    new_owner = dict(zip(keys, owners(c0, keys)))
    gone = [k for k in keys if old_owner[k] == "n2" and new_owner[k] == "n3"]
    assert len(gone) > 50, len(gone)
    partition.cut(fleet["n0"], fleet["n2"])
    assert c0.execute_command("SHARD.DEBUG", "FLEET-HOLD", "OFF") == b"OK"
    until(lambda: in_step(c3), f"n3 has the rings of {phase}")
    for k in gone:
        assert call(c3, "SET", k, f"new:{k}") == b"OK"

    def reads(what):
        """Reads of the moved keys through n2, both ways; those that were not the newer
        value (errors counted apart)."""
        stale, errors = [], 0
        for k in gone:
            for read in (lambda: plain2.get(k), lambda: call(c2, "GET", k)):
                try:
                    v = read()
                except redis.ResponseError:
                    errors += 1
                    continue
                if v != f"new:{k}".encode():
                    stale.append((k, v))
        print(f"{what}: {len(gone) * 2} reads through n2, {errors} errors, {len(stale)} stale")
        return stale

    print()
    assert not reads(f"{phase}, during the cut")[:5]
    assert not in_step(c2), "n2 got the rings through the cut"
    partition.heal()
    assert not reads(f"{phase}, just healed")[:5]
    resume_until_over(c0, "the grow ends after the heal", timeout=60)
    assert not reads(f"{phase}, grow done")[:5]
    for k in gone[:50]:
        assert plain2.set(k, "after") is True
        assert c3.get(k) == b"after"
    c2.config_set("shard.route-plain", "no")
    assert not any(c2.exists(k) for k in gone)
    assert_one_ring(fleet, NAMES4)
    assert assert_owned_only(fleet, c0) == len(keys)


# --- 5. sentinels split 2|1 ------------------------------------------------------------------


def flags(sentinel):
    m = sentinel.client().execute_command("SENTINEL", "MASTER", "n0")
    return dict(zip(m[::2], m[1::2]))[b"flags"].decode()


@pytest.mark.partitions
def test_sentinels_split_the_minority_never_fails_over_the_majoritys_failover_is_followed(
        server_factory, sentinel_factory, partition):
    """A primary (n0), its replica, three sentinels (quorum 2). First the replica and one
    sentinel are cut off from the primary and the other two, past `down-after-milliseconds`:
    the minority sentinel sees the primary down, and nothing fails over. Then the primary and
    that sentinel are cut off from the replica and the other two: the majority promotes the
    replica, the minority sentinel still names the old primary; the promoted replica's module
    acts as n0 at once; after the heal every sentinel and both modules name it."""
    primary, replica, sentinels = sentinel_setup(server_factory, sentinel_factory, partition, 0)
    p, r = primary.client(), replica.client()
    me = f"{primary.host}:{primary.port}"
    minority, majority = sentinels[2], sentinels[:2]
    partition.cut([replica, minority], [primary, *majority])
    until(lambda: "s_down" in flags(minority), "the minority sentinel sees the primary down",
          timeout=10)
    time.sleep(3)
    for s in sentinels:
        assert master_of(s)[0].decode() == primary.host, "a failover on a minority"
        assert "o_down" not in flags(s)
    assert r.info("replication")["role"] == "slave"
    assert call(p, "SET", "a", "1") == b"OK"
    partition.heal()
    wait_in_sync(p, r, timeout=20)
    until(lambda: "s_down" not in flags(minority), "the minority sees the primary again")

    partition.cut([primary, minority], [replica, *majority])
    until(lambda: all(master_of(s)[0].decode() == replica.host for s in majority),
          "the majority promotes the replica", timeout=30)
    assert master_of(minority)[0].decode() == primary.host
    until(lambda: info_shard(r).get("node_n0_address") == f"{replica.host}:{replica.port}",
          "the promoted replica's module follows the majority's failover", timeout=10)
    assert call(r, "SET", "b", "2") == b"OK"
    assert call(r, "GET", "a") == b"1"
    time.sleep(1)
    assert master_of(minority)[0].decode() == primary.host, "the minority followed alone"
    assert info_shard(p).get("node_n0_address") == me  # it hears only the minority
    partition.heal()
    until(lambda: all(master_of(s)[0].decode() == replica.host for s in sentinels),
          "every sentinel names the promoted replica", timeout=30)
    until(lambda: p.info("replication")["role"] == "slave"
          and info_shard(p).get("node_n0_address") == f"{replica.host}:{replica.port}",
          "the old primary follows it, its module too", timeout=30)
    wait_in_sync(r, p, timeout=20)
    assert call(p, "GET", "b") == b"2"


# --- 6. a one-way cut between two primaries --------------------------------------------------


class Pinger(threading.Thread):
    """PINGs a server every 10 ms from 127.0.0.1 (outside every cut); the slowest, in s."""

    def __init__(self, server):
        super().__init__(daemon=True)
        self.client = server.client(socket_timeout=5)
        self.slowest, self.stop = 0.0, threading.Event()

    def run(self):
        while not self.stop.is_set():
            t = time.monotonic()
            self.client.ping()
            self.slowest = max(self.slowest, time.monotonic() - t)
            time.sleep(0.01)


@pytest.mark.serial
@pytest.mark.partitions
def test_one_way_cut_fails_calls_in_time_half_applies_nothing_and_stalls_no_server(
        server_factory, partition):
    """n0 reaches n1, n1 does not reach n0 (its packets to n0 are dropped): TCP needs both
    ways, so calls either way fail, naming the other node, within the call timeout (500 ms,
    plus slack); a transaction over both nodes begun on either side ends applied everywhere or
    nowhere after the heal; PINGs from outside are answered at once all along, and neither
    server's latency monitor nor SLOWLOG (5 ms, reset once the fleet is up) records a command
    of the module's or one it ran."""
    fleet = part_fleet(server_factory, partition, ["n0", "n1"], ["n0", "n1"],
                       config=[("latency-monitor-threshold", 5),
                               ("slowlog-log-slower-than", 5000)])
    for n in fleet:
        fleet.client(n).config_set("shard.txn-lock-ms", LOCK_MS)
    c = {n: fleet.client(n, socket_timeout=10) for n in fleet}
    key = {n: fleet.key_of(n, prefix="x") for n in fleet}
    for n in fleet:  # the module's connections both ways exist before the cut
        assert call(c[n], "SET", key["n1" if n == "n0" else "n0"], "0") == b"OK"
    # What the servers recorded before (their start: the module's load runs `COMMAND INFO` of
    # every command, which can pass 5 ms on a busy machine) is shown, then forgotten.
    for n in fleet:
        print(f"\n{n} at start: LATENCY LATEST {c[n].execute_command('LATENCY', 'LATEST')}; "
              f"SLOWLOG {[e[3][:3] for e in c[n].execute_command('SLOWLOG', 'GET', 5)]}")
        c[n].execute_command("LATENCY", "RESET")
        c[n].execute_command("SLOWLOG", "RESET")
    pingers = [Pinger(fleet[n]) for n in fleet]
    for p in pingers:
        p.start()
    partition.cut_one_way(fleet["n1"], fleet["n0"])
    took, results = [], {}
    try:
        for i in range(6):
            for me, other in (("n0", "n1"), ("n1", "n0")):
                t = time.monotonic()
                with pytest.raises(redis.ResponseError, match=rf"node {other} \("):
                    call(c[me], "SET", key[other], f"cut-{i}")
                took.append(time.monotonic() - t)
        # A transaction over both, from each side.
        for me in fleet:
            ex = Exec(fleet[me], [("INCR", key["n0"]), ("INCR", key["n1"])])
            results[me] = ex.join()
        time.sleep(1)
    finally:
        partition.heal()
        for p in pingers:
            p.stop.set()
            p.join(10)
    print(f"\ncalls failed in {min(took):.2f}..{max(took):.2f} s; transactions: {results}; "
          f"slowest PING {[round(p.slowest * 1000) for p in pingers]} ms")
    assert max(took) < 1.5, took
    for me, res in results.items():
        assert isinstance(res, redis.ResponseError), (me, res)
    until(lambda: no_lock_left(fleet), "every transaction ends after the heal", timeout=20)
    got = [c["n0"].get(key["n0"]), c["n1"].get(key["n1"])]
    # Each transaction incremented both or neither (the plain SETs during the cut may or may
    # not have run at n1, which received them: they set it to `cut-i`, not a number).
    assert got[0] in (b"0", b"1", b"2"), got
    v1 = got[1]
    assert v1 == got[0] or (v1.startswith(b"cut-") and got[0] == b"0"), got
    assert max(p.slowest for p in pingers) < 0.25, [p.slowest for p in pingers]
    # The latency monitor names an event's kind, SLOWLOG (at the same 5 ms) its command. No
    # command of the module's (SHARD.*, from clients or from the other node) or run by the
    # module itself (RM_Call: a client with no address) took 5 ms. Other events are printed:
    # `module-acquire-GIL` is the main thread waiting for the module lock, which no thread of
    # the module takes (it has none): the machine's scheduler; a PING's `fast-command` too.
    for n in fleet:
        events = c[n].execute_command("LATENCY", "LATEST")
        slow = [(e[2] // 1000, [a.decode(errors="replace")[:40] for a in e[3][:3]],
                 e[4].decode(errors="replace"))
                for e in c[n].execute_command("SLOWLOG", "GET", 50)]
        print(f"{n}: LATENCY LATEST {events}; SLOWLOG (ms, command, client) {slow}")
        module = [e for e in slow if e[1][0].upper().startswith("SHARD.")
                  or not e[2].startswith("127.")]
        assert not module, (n, events, module)
        kinds = {e[0].decode() for e in events}
        assert kinds <= {"command", "fast-command", "module-acquire-GIL"}, (n, events)


# --- 7. SHARD.GENKEY through a cut and a failover --------------------------------------------


@pytest.mark.partitions
def test_genkey_never_issues_an_id_twice_through_a_cut_and_a_failover(server_factory,
                                                                     sentinel_factory, partition):
    """A primary and its replica, each with a node id of its own (docs/durability.md), three
    sentinels. IDs are drawn from the primary before the cut; it is cut off from its replica
    and the sentinels and goes on issuing IDs on its side, while the promoted replica issues
    its own; after the heal the old primary is a replica (GENKEY refused) and the new primary
    issues more. Every ID drawn is distinct, and each server's are increasing."""
    primary, replica, sentinels = sentinel_setup(server_factory, sentinel_factory, partition, 0)
    p, r = primary.client(), replica.client()
    assert p.config_set("shard.node-id", 1) and r.config_set("shard.node-id", 2)
    drawn = {"p": [], "r": []}

    def draw(c, side, n=200):
        got = [int(k) for k in c.execute_command("SHARD.GENKEY", "COUNT", n)]
        assert got == sorted(got) and (not drawn[side] or drawn[side][-1] < got[0])
        drawn[side] += got

    draw(p, "p")
    wait_in_sync(p, r)
    partition.cut(primary, [replica, *sentinels])
    deadline = time.monotonic() + 30
    while not all(master_of(s)[0].decode() == replica.host for s in sentinels):
        draw(p, "p", 50)
        assert time.monotonic() < deadline, "no failover"
        time.sleep(0.05)
    for _ in range(20):
        draw(p, "p", 50)
        draw(r, "r", 50)
        time.sleep(0.02)
    partition.heal()
    until(lambda: p.info("replication")["role"] == "slave", "the old primary follows", timeout=60)
    with pytest.raises(redis.ResponseError):
        p.execute_command("SHARD.GENKEY")
    for _ in range(10):
        draw(r, "r", 100)
    every = drawn["p"] + drawn["r"]
    print(f"\nIDs: {len(drawn['p'])} from the old primary, {len(drawn['r'])} from the new")
    assert len(set(every)) == len(every), "an ID issued twice"
