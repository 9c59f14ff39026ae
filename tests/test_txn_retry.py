"""A client library's optimistic loop works unchanged over transactions across nodes (issue 43,
docs/transactions.md): a transaction with watched keys that meets another transaction's lock
replies nil, as `EXEC` does when a watched key was written, never `TRYAGAIN`; redis-py's
`transaction()` (and Jedis's, ioredis's) retries only on a nil `EXEC` (`WatchError`).

- the bank: clients of every node transfer between few accounts (much contention) in loops that
  retry only on nil, as redis-py's `transaction()` does; no client ever sees an error, each
  acknowledged transfer is applied once, and the total is kept;
- the exact window: a transfer held at its coordinator (`SHARD.DEBUG TXN-HOLD decided`) with its
  keys locked at both owners; a watched transaction of those keys, through another node, replies
  nil (RESP2 and RESP3 as a plain server's `EXEC` after a watched write), applies nothing, and
  leaves no lock; once the transfer commits, its retry commits;
- one owner (the coordinator itself, or another node): a lock held past `shard.txn-lock-ms`
  ends a watched transaction in nil with its watches dropped at the owner (`UNWATCH`); without
  watches it stays `TRYAGAIN` (tests/test_txn.py, tests/test_txn_local.py).

Needs the owner side of the protocol (`SHARD.TXN`): skipped while it is not built in.
"""

import random
import threading

import pytest
import redis

from helpers.fleet import make_fleet
from helpers.resp import Raw, raw_reply
from helpers.server import info_shard, until
from helpers.txn import held, hold

ACCOUNTS = 20  # few: transfers meet each other's locks often
START = 100
WRITERS = 6
TRANSFERS = 50  # acknowledged, per writer


def call(c, *args):
    return c.execute_command("SHARD.CALL", *args)


def needs_owner_side(fleet):
    if raw_reply(fleet.client("n0"), "COMMAND", "INFO", "shard.txn")[0] is None:
        pytest.skip("the owner side (SHARD.TXN) is not built in yet")


@pytest.fixture
def fleet(server_factory):
    f = make_fleet(server_factory, timeout_ms=2000, config=[("enable-debug-command", "yes")])
    needs_owner_side(f)
    return f


def counters(client):
    return {k: int(v) for k, v in info_shard(client).items() if k.startswith("txn_")}


def txn_calls(client, sub):
    """How many `SHARD.TXN sub` the server ran."""
    stats = client.info("commandstats")
    return stats.get(f"cmdstat_shard.txn|{sub}", {}).get("calls", 0)


def optimistic(c, watched, body):
    """redis-py's `Redis.transaction()` over the module's commands: SHARD.WATCH, `body(c)`
    reads and returns the commands to queue (or None to give up), SHARD.MULTI, each queued,
    SHARD.EXEC; retried only on a nil EXEC (redis-py raises WatchError there). Any error
    reply propagates, as it does from redis-py's loop."""
    while True:
        assert c.execute_command("SHARD.WATCH", *watched) == b"OK"
        commands = body(c)
        if commands is None:
            c.execute_command("SHARD.UNWATCH")
            return None
        assert c.execute_command("SHARD.MULTI") == b"OK"
        for command in commands:
            assert call(c, *command) == b"QUEUED", command
        try:
            got = c.execute_command("SHARD.EXEC")
            if got is None:
                raise redis.WatchError("a watched key changed")
            return got
        except redis.WatchError:
            continue


def test_a_bank_of_optimistic_loops_sees_no_error(fleet):
    names = list(fleet)
    accounts = [f"acct:{i}" for i in range(ACCOUNTS)]
    assert set(fleet.owners(accounts)) == set(names), "every node holds accounts"
    assert call(fleet.client("n0"), "MSET", *[x for a in accounts for x in (a, START)]) == b"OK"
    total = ACCOUNTS * START
    acked = []  # (from, to, amount) of every acknowledged transfer
    failures = []
    lock = threading.Lock()

    def writer(seed):
        rng = random.Random(seed)
        c = fleet.client(names[seed % len(names)], single_connection_client=True)
        done = 0
        while done < TRANSFERS:
            a, b = rng.sample(accounts, 2)
            chosen = {}

            def body(c):
                balance = int(call(c, "GET", a))
                if balance == 0:
                    return None
                chosen["amount"] = rng.randint(1, min(balance, 25))
                return [("DECRBY", a, chosen["amount"]), ("INCRBY", b, chosen["amount"])]
            try:
                got = optimistic(c, [a, b], body)
            except redis.RedisError as e:
                with lock:
                    failures.append(f"{a} -> {b}: {e}")
                return
            if got is None:
                continue  # nothing to move from a
            if len(got) != 2 or got[0] < 0:
                with lock:
                    failures.append(f"{a} -> {b} replied {got}")
                return
            with lock:
                acked.append((a, b, chosen["amount"]))
            done += 1

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(WRITERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures[:5]
    assert len(acked) == WRITERS * TRANSFERS
    expected = dict.fromkeys(accounts, START)
    for a, b, amount in acked:
        expected[a] -= amount
        expected[b] += amount
    final = dict(zip(accounts, (int(v) for v in call(fleet.client("n1"), "MGET", *accounts))))
    assert final == expected, "each acknowledged transfer applied once, nothing else"
    assert sum(final.values()) == total
    seen = [counters(fleet.client(n)) for n in names]
    assert sum(s["txn_aborted_error"] for s in seen) == 0, seen
    # (About 15 transfers a run meet another's lock, each answered nil; none: nothing proved.)
    assert sum(s["txn_aborted_lock"] for s in seen) > 0, "no transfer met another's lock"


def plain_watch_failure(server_factory, protocol):
    """The bytes of a plain server's EXEC after another client wrote a watched key."""
    plain = server_factory()
    raw = Raw(plain.port, protocol=protocol)
    assert raw.execute("WATCH", "k") == b"+OK\r\n"
    plain.client().set("k", "other")
    return raw.pipeline([("MULTI",), ("SET", "k", "mine"), ("EXEC",)])[-1]


@pytest.mark.parametrize("protocol", [2, 3], ids=["resp2", "resp3"])
def test_a_watched_key_locked_by_a_commit_replies_nil(fleet, server_factory, protocol):
    """A transfer a -> b (a at n1, b at n2) through n0, held once its commit is decided: both
    keys locked. A transaction through n1 that watched a before the lock, and writes a and c
    (c at n2, free), meets the lock at n1 and is prepared at n2: it replies nil, exactly as a
    plain server's EXEC after a watched write, applies nothing and leaves no lock (the build
    before replied `TRYAGAIN ... the retry dropped its watches`). Once the transfer commits,
    the same transaction read again commits."""
    a, b = fleet.key_of("n1", prefix="acct"), fleet.key_of("n2", prefix="acct")
    c_ = fleet.key_of("n2", prefix="other")
    n0, n1, n2 = (fleet.client(n) for n in ("n0", "n1", "n2"))
    call(n0, "MSET", a, 100, b, 100, c_, 0)
    raw = fleet.raw("n1", protocol=protocol)
    assert raw.execute("SHARD.WATCH", a) == b"+OK\r\n"
    assert raw.execute("SHARD.CALL", "GET", a).endswith(b"100\r\n")

    hold(n0, "decided")
    holder = fleet["n0"].client(socket_timeout=60)
    assert holder.execute_command("SHARD.MULTI") == b"OK"
    assert call(holder, "DECRBY", a, 30) == b"QUEUED"
    assert call(holder, "INCRBY", b, 30) == b"QUEUED"
    result = {}

    def run():
        try:
            result["reply"] = holder.execute_command("SHARD.EXEC")
        except (redis.RedisError, OSError) as e:
            result["reply"] = e
    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        until(lambda: held(n0) == 1,
              "the transfer to wait at its decision")
        locks = {n: counters(fleet.client(n))["txn_locks_held"] for n in ("n1", "n2")}
        assert locks == {"n1": 1, "n2": 1}, locks
        aborts = {n: txn_calls(fleet.client(n), "abort") for n in ("n1", "n2")}
        got = raw.pipeline([("SHARD.MULTI",), ("SHARD.CALL", "DECRBY", a, 10),
                            ("SHARD.CALL", "INCRBY", c_, 10), ("SHARD.EXEC",)])
        assert got[:3] == [b"+OK\r\n", b"+QUEUED\r\n", b"+QUEUED\r\n"], got
        assert got[3] == plain_watch_failure(server_factory, protocol), got[3]
        assert counters(n1)["txn_aborted_lock"] == 1
        assert counters(n1)["txn_aborted_watch"] == 0
        # Its part at n2 (c) was prepared, then aborted with the one at n1: only the transfer's
        # locks are left, and its watches were dropped at both owners.
        assert {n: txn_calls(fleet.client(n), "abort") - aborts[n] for n in aborts} == \
            {"n1": 1, "n2": 1}
        locks = {n: counters(fleet.client(n))["txn_locks_held"] for n in ("n1", "n2")}
        assert locks == {"n1": 1, "n2": 1}, locks
        assert n2.get(c_) == b"0"
    finally:
        hold(n0, "OFF")
    t.join(60)
    assert result["reply"] == [70, 130], result
    until(lambda: all(counters(fleet.client(n))["txn_locks_held"] == 0 for n in fleet),
          "every lock released")
    assert [n1.get(a), n2.get(b), n2.get(c_)] == [b"70", b"130", b"0"]
    # The optimistic loop's next turn: read again, and it commits.
    assert raw.execute("SHARD.WATCH", a) == b"+OK\r\n"
    assert raw.execute("SHARD.CALL", "GET", a).endswith(b"70\r\n")
    got = raw.pipeline([("SHARD.MULTI",), ("SHARD.CALL", "DECRBY", a, 10),
                        ("SHARD.CALL", "INCRBY", c_, 10), ("SHARD.EXEC",)])
    assert got[3] == b"*2\r\n:60\r\n:10\r\n", got[3]
    assert [n1.get(a), n2.get(c_)] == [b"60", b"10"]
    assert counters(n1)["txn_committed"] == 1


@pytest.mark.parametrize("owner", ["n0", "n1"], ids=["owner-is-coordinator", "owner-elsewhere"])
def test_a_watched_key_locked_past_the_bound_replies_nil(fleet, owner):
    """One owner: a key locked by another transaction's prepared part (held by hand) for
    longer than shard.txn-lock-ms. A watched transaction of it waits the bound out, then
    replies nil (not TRYAGAIN, as the build before did), with nothing applied and its watches
    dropped at the owner (an UNWATCH sent there); the same without watches stays TRYAGAIN."""
    k = fleet.key_of(owner, prefix="held")
    c = fleet.client("n0")
    c.config_set("shard.txn-lock-ms", 200)
    at = fleet.client(owner)
    at.set(k, "before")
    assert c.execute_command("SHARD.WATCH", k) == b"OK"
    assert call(c, "GET", k) == b"before"
    assert at.execute_command("SHARD.TXN", "PREPARE", "n9/1", 60_000, 0, 1, 2,
                              "GET", k) == b"PREPARED"
    unwatches = txn_calls(at, "unwatch")
    assert c.execute_command("SHARD.MULTI") == b"OK"
    assert call(c, "SET", k, "mine") == b"QUEUED"
    assert c.execute_command("SHARD.EXEC") is None
    assert txn_calls(at, "unwatch") == unwatches + 1, "the watches dropped at the owner"
    assert counters(c)["txn_aborted_lock"] == 1 and counters(c)["txn_aborted_watch"] == 0
    # Without watches: TRYAGAIN once the bound passed.
    assert c.execute_command("SHARD.MULTI") == b"OK"
    assert call(c, "SET", k, "mine") == b"QUEUED"
    with pytest.raises(redis.ResponseError, match="^TRYAGAIN keys of the transaction stayed locked"):
        c.execute_command("SHARD.EXEC")
    assert counters(c)["txn_aborted_lock"] == 2
    assert at.execute_command("SHARD.TXN", "ABORT", "n9/1") == b"OK"
    assert at.get(k) == b"before", "nothing applied"
