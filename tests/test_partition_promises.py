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
from helpers.server import PRIMARY, as_map, info_shard, until, wait_in_sync
from test_partition import master_of, ring_args, ring_state, sentinel_setup

pytestmark = pytest.mark.slow


def call(c, *args):
    return c.execute_command("SHARD.CALL", *args)


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


def counter(client, name):
    return int(info_shard(client)[name])


# --- 1. a transaction's owners cut off from the coordinator after PREPARE --------------------

LOCK_MS = 1000


class Exec:
    """SHARD.MULTI, the commands queued, then SHARD.EXEC in a thread; `.result` its reply or
    error, `.took` its seconds."""

    def __init__(self, server, commands):
        self.result, self.took = None, None
        c = server.client(socket_timeout=60)
        assert c.execute_command("SHARD.MULTI") == b"OK"
        for command in commands:
            assert call(c, *command) == b"QUEUED"

        def run():
            t = time.monotonic()
            try:
                self.result = c.execute_command("SHARD.EXEC")
            except (redis.RedisError, OSError) as e:
                self.result = e
            self.took = time.monotonic() - t
        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def join(self, timeout=30):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "SHARD.EXEC did not reply"
        return self.result


def locked_by(client, key):
    """The TRYAGAIN a read of `key` gets at once (shard.txn-lock-ms 1 meanwhile), or its value."""
    client.config_set("shard.txn-lock-ms", 1)
    try:
        return call(client, "GET", key)
    except redis.ResponseError as e:
        return str(e)
    finally:
        client.config_set("shard.txn-lock-ms", LOCK_MS)


def no_lock_left(fleet):
    for n in fleet:
        i = info_shard(fleet.client(n))
        if (i["txn_locks_held"], i["txn_in_doubt"], i["txn_decisions_held"]) != ("0", "0", "0"):
            return False
    return True


@pytest.mark.parametrize("cut", ["one-owner", "every-owner"])
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
    assert c0.execute_command("SHARD.DEBUG", "TXN-HOLD", "prepared") == b"OK"
    ex = Exec(fleet["n0"], [("DECRBY", a, 30), ("INCRBY", b, 30)])
    until(lambda: c0.execute_command("SHARD.DEBUG", "TXN-HOLD", "HELD") == 1,
          "the transfer waits with both parts prepared")
    assert [counter(fleet.client(n), "txn_locks_held") for n in ("n1", "n2")] == [1, 1]
    cut_off = ["n1"] if cut == "one-owner" else ["n1", "n2"]
    partition.cut(fleet["n0"], [fleet[n] for n in cut_off])
    cut_at = time.monotonic()
    assert c0.execute_command("SHARD.DEBUG", "TXN-HOLD", "OFF") == b"OK"
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


def test_destination_cut_off_mid_copy_keeps_every_key_and_newer_data(server_factory, partition):
    """A grow of n0..n2 to n3 (MAXRATE): n3, the destination, is cut off from every other node
    while the copies run. The grow does not finish while it is cut. After the heal a value is
    written at n3 (SHARD.CALL through n3) for some moved keys before the copies are RESUMEd:
    the copies never write over it; once the grow is done every key is at its owner only, the
    newer values kept, the others unchanged."""
    fleet = part_fleet(server_factory, partition, NAMES4, NAMES3)
    c0, c3 = fleet.client("n0"), fleet.client("n3", socket_timeout=10)
    keys = [f"k:{i}" for i in range(KEYS)]
    old_owner = load(fleet, NAMES3, keys)
    assert c0.execute_command("SHARD.RESHARD", "START", "ketama", *ring_args(fleet, NAMES4),
                              "MAXRATE", RATE) == b"OK"
    wait_copying(c0)
    partition.cut(fleet["n3"], [fleet[n] for n in NAMES3])
    # Writes of moving keys during the cut: through n0 (they go to the new owner, n3) or n3
    # (which fetches the old value first): each either fails or is acknowledged.
    # n0 holds the new ring as current since the copy began: each key's new owner.
    new_owner = dict(zip(keys, owners(c0, keys)))
    moved = [k for k in keys if new_owner[k] == "n3"]
    assert len(moved) > 1000, len(moved)
    acked = {}
    for i, k in enumerate(moved[:40]):
        via = c0 if i % 2 else c3
        try:
            if call(via, "SET", k, f"cut-{i}") == b"OK":
                acked[k] = f"cut-{i}".encode()
        except redis.RedisError:
            pass
    time.sleep(3)
    st = fleet_status(c0)
    print(f"\nafter the cut: phase {st['phase']}, running {st['running']}, error {st['error']!r};"
          f" acknowledged during the cut: {len(acked)} of 40")
    assert st["phase"] != b"done", "the grow finished while its destination was cut off"
    partition.heal()
    # Newer values at the new owner, written while the copy is still unfinished.
    newer = moved[-200:]
    for i, k in enumerate(newer):
        until(lambda: call(c3, "SET", k, f"newer-{i}") == b"OK", "a write at n3 after the heal",
              timeout=15)
    acked.update({k: f"newer-{i}".encode() for i, k in enumerate(newer)})
    resume_until_over(c0, "the grow ends after the heal", timeout=90)
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
