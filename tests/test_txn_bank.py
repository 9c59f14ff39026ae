"""The bank: 300 accounts over three nodes, clients of every node transferring random amounts
between random accounts in transactions (SHARD.WATCH both accounts, read them, SHARD.MULTI,
DECRBY and INCRBY, SHARD.EXEC; a nil or TRYAGAIN is tried again), and readers reading every
balance in one transaction (SHARD.MULTI, one MGET split over the three owners, SHARD.EXEC).
The total is the same in every read and at the end, and each account ends with exactly the
transfers that were acknowledged (each applied once).

Needs the owner side of the protocol (`SHARD.TXN`): skipped while it is not built in.
"""

import random
import threading

import pytest
import redis

from helpers.fleet import make_fleet
from helpers.resp import raw_reply

ACCOUNTS = 300
START = 100
WRITERS = 6
TRANSFERS = 60  # per writer
READS = 20  # per reader


def call(c, *args):
    return c.execute_command("SHARD.CALL", *args)


def test_the_bank_keeps_its_total(server_factory):
    fleet = make_fleet(server_factory, timeout_ms=2000)
    names = list(fleet)
    if raw_reply(fleet.client("n0"), "COMMAND", "INFO", "shard.txn")[0] is None:
        pytest.skip("the owner side (SHARD.TXN) is not built in yet")
    accounts = [f"acct:{i}" for i in range(ACCOUNTS)]
    assert set(fleet.owners(accounts)) == set(names), "every node holds accounts"
    flat = [x for a in accounts for x in (a, START)]
    assert call(fleet.client("n0"), "MSET", *flat) == b"OK"
    total = ACCOUNTS * START

    acked = []  # (from, to, amount) of every acknowledged transfer
    failures = []
    lock = threading.Lock()

    def writer(seed):
        rng = random.Random(seed)
        c = fleet.client(names[seed % len(names)])
        done = 0
        while done < TRANSFERS:
            a, b = rng.sample(accounts, 2)
            try:
                assert c.execute_command("SHARD.WATCH", a, b) == b"OK"
                balance = int(call(c, "GET", a))
                if balance == 0:
                    c.execute_command("SHARD.UNWATCH")
                    continue
                amount = rng.randint(1, min(balance, 25))
                assert c.execute_command("SHARD.MULTI") == b"OK"
                assert call(c, "DECRBY", a, amount) == b"QUEUED"
                assert call(c, "INCRBY", b, amount) == b"QUEUED"
                got = c.execute_command("SHARD.EXEC")
            except redis.ResponseError as e:
                if str(e).startswith("TRYAGAIN"):
                    continue
                with lock:
                    failures.append(f"{a} -> {b}: {e}")
                return
            if got is None:
                continue  # a watched account changed: read it again
            assert len(got) == 2 and got[0] >= 0, got
            with lock:
                acked.append((a, b, amount))
            done += 1

    def reader(seed):
        c = fleet.client(names[seed % len(names)])
        for _ in range(READS):
            assert c.execute_command("SHARD.MULTI") == b"OK"
            assert call(c, "MGET", *accounts) == b"QUEUED"
            try:
                got = c.execute_command("SHARD.EXEC")
            except redis.ResponseError as e:
                if str(e).startswith("TRYAGAIN"):
                    continue
                with lock:
                    failures.append(f"read: {e}")
                return
            balances = [int(v) for v in got[0]]
            with lock:
                if sum(balances) != total or min(balances) < 0:
                    failures.append(f"a read saw a total of {sum(balances)}, not {total}")

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(WRITERS)]
    threads += [threading.Thread(target=reader, args=(100 + i,)) for i in range(3)]
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
