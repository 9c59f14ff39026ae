"""The bank under faults (issue 35): 300 accounts over the shards of the nemesis fleet (four
shards of a primary and a replica behind three sentinels, AOF on with fsync always; the ring
of three, the fourth joins and leaves), clients of every node transferring random amounts in
transactions, readers reading every balance in one transaction, while faults land:

- `kill -9` of a coordinating node held at a random step of the two-phase commit
  (`SHARD.DEBUG TXN-HOLD prepared|decided|committed-one`), restarted from its AOF;
- `kill -9` of an owner's primary, restarted from its AOF;
- `SIGSTOP` of an owner's primary for longer than `shard.txn-lock-ms`;
- a Sentinel failover of an owner (`SENTINEL FAILOVER`), writes paused at the old primary
  (`CLIENT PAUSE WRITE`, as Redis's own FAILOVER does) until it knows the new one: without the
  pause, what it acknowledged in the second before Sentinel's switch is lost (open,
  docs/transactions.md, "What is still open"); Sentinel's down-after is raised so that it fails
  over only when told;
- a grow to four shards and a shrink back by `SHARD.RESHARD START`.

Each transfer carries a unique id: inside its transaction it also appends the id to a log of
each of its two accounts (`RPUSH {acct}:log id`, the same owner by the hash tag). At the end,
on the healed fleet: every read saw the same total; every id is in both of its accounts' logs
or in neither, at most once in each; every acknowledged transfer (its EXEC replied, or replied
that it committed but an owner had not confirmed yet) is there; each balance is its start plus
the amounts of the ids in its log (each transfer applied exactly once, all of it); no lock,
part in doubt or decision is left.

Sized by TXN_CHAOS_SCALE (default 1: the fault schedule once; `make txn-chaos` runs 10: the
schedule ten times, with more clients).
"""

import os
import random
import signal
import threading
import time
from collections import Counter

import pytest
import redis

from helpers.nemesis import (SHARDS, Clients, Fleet, History, finish_resharding,
                             fleet_report)
from helpers.server import info_shard, until

SCALE = int(os.environ.get("TXN_CHAOS_SCALE", "1"))
ACCOUNTS = 300
START = 100
WRITERS = 4 + SCALE // 2
READERS = 2
LOCK_MS = 500
STEPS = ("prepared", "decided", "committed-one")
BUDGET = 150 + 100 * (SCALE - 1)  # seconds, for the whole test
RING = SHARDS[:3]


def account(i):
    return f"{{a{i}}}"


def log_of(acct):
    return f"{acct}:log"


class Bank(Clients):
    """The clients: writers and readers, each a thread on a random node, switching node on an
    error; every transfer's outcome recorded."""

    join_timeout = 60
    socket_timeout = 10

    def __init__(self, fleet, history, rng):
        super().__init__(fleet, history)
        self.accounts = [account(i) for i in range(ACCOUNTS)]
        self.transfers = {}  # id -> (from, to, amount)
        self.outcome = {}  # id -> "ok" (acknowledged), "info" (unknown), "fail" (refused)
        self.reads = []  # the total of each read
        self.acked_at = {}  # id -> seconds since the start, when its EXEC replied
        self.sent = {}  # id -> (seconds since the start when its EXEC was sent, the port)
        self.problems = []
        self.seeds = [rng.randrange(1 << 30) for _ in range(WRITERS + READERS)]
        for w in range(WRITERS):
            self.spawn(self._writer, w)
        for r in range(READERS):
            self.spawn(self._reader, r)

    def acknowledged(self):
        with self.lock:
            return sum(1 for o in self.outcome.values() if o == "ok")

    def on_crash(self, body, i, e):
        self.problems.append(f"{body.__name__} {i} crashed: {e!r}")

    def _writer(self, w):
        rng = random.Random(self.seeds[w])
        c = self._client(rng)
        n = 0
        while not self.stop.is_set():
            outcome = self.transfer(c, rng, f"w{w}-{n}")
            if outcome is not None:
                n += 1
            if outcome in (None, "info"):
                c = self._client(rng)

    def transfer(self, c, rng, tid):
        """One transfer through `c` with the id `tid`: its outcome, or None when it failed
        before SHARD.EXEC (nothing sent to apply)."""
        a, b = rng.sample(self.accounts, 2)
        try:
            if c.execute_command("SHARD.WATCH", a, b) != b"OK":
                raise AssertionError("SHARD.WATCH did not reply OK")
            balance = int(c.execute_command("SHARD.CALL", "GET", a))
            if balance == 0:
                c.execute_command("SHARD.UNWATCH")
                return None
            amount = rng.randint(1, min(balance, 25))
            c.execute_command("SHARD.MULTI")
            for cmd in (("DECRBY", a, amount), ("INCRBY", b, amount),
                        ("RPUSH", log_of(a), tid), ("RPUSH", log_of(b), tid)):
                if c.execute_command("SHARD.CALL", *cmd) != b"QUEUED":
                    raise AssertionError(f"{cmd} not queued")
        except (redis.RedisError, OSError):
            return None
        with self.lock:
            self.transfers[tid] = (a, b, amount)
            self.sent[tid] = (round(time.monotonic() - self.history.started, 3),
                              c.connection_pool.connection_kwargs.get("port"))
        try:
            got = c.execute_command("SHARD.EXEC")
            outcome = "fail" if got is None else "ok"
            if got is not None and (len(got) != 4 or got[0] < 0):
                self.problems.append(f"{tid}: EXEC replied {got}")
        except redis.ResponseError as e:
            text = str(e)
            if "the transaction committed" in text:
                outcome = "ok"  # decided: applied, only the replies are missing
            elif text.startswith(("TRYAGAIN", "EXECABORT")):
                outcome = "fail"
            else:
                outcome = "info"
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            outcome = "info"
        with self.lock:
            self.outcome[tid] = outcome
            self.acked_at[tid] = round(time.monotonic() - self.history.started, 3)
        self.history.add("bank", f"{tid} {a}->{b} {amount}", outcome)
        return outcome

    def _reader(self, r):
        rng = random.Random(self.seeds[WRITERS + r])
        c = self._client(rng)
        total = ACCOUNTS * START
        while not self.stop.is_set():
            try:
                c.execute_command("SHARD.MULTI")
                c.execute_command("SHARD.CALL", "MGET", *self.accounts)
                got = c.execute_command("SHARD.EXEC")
            except redis.ResponseError:
                c = self._client(rng) if rng.random() < 0.5 else c
                continue
            except (redis.RedisError, OSError):
                c = self._client(rng)
                continue
            if got is None:
                continue
            balances = [int(v) for v in got[0]]
            with self.lock:
                self.reads.append(sum(balances))
            if sum(balances) != total or min(balances) < 0:
                what = f"a read saw a total of {sum(balances)}, not {total}"
                if what not in self.problems:
                    self.problems.append(what)
                    self.history.add("faults", f"reader {r}: {what}")
            time.sleep(0.02)


class Faults:
    """The fault schedule, each step recorded in the history."""

    def __init__(self, fleet, bank, history, rng, left):
        self.fleet, self.bank, self.history, self.rng, self.left = fleet, bank, history, rng, left
        self.counts = Counter()

    def note(self, what):
        self.counts[what.split()[0]] += 1
        self.history.add("faults", what)

    def progress(self, more=20):
        """Waits until `more` transfers more were acknowledged."""
        target = self.bank.acknowledged() + more
        until(lambda: self.bank.acknowledged() >= target, f"{more} more transfers acknowledged",
              timeout=min(60, self.left()), every=0.1)

    def primaries(self):
        return [self.fleet.primary(n) for n in RING]

    def kill_held_coordinator(self):
        step = self.rng.choice(STEPS)
        s = self.rng.choice(self.primaries())
        c = s.client(socket_timeout=5)
        c.execute_command("SHARD.DEBUG", "TXN-HOLD", step)
        # Transfers through it until one waits at the hold (one of a single owner does not).
        done = threading.Event()

        def drive():
            rng = random.Random(self.rng.randrange(1 << 30))
            k = 0
            while not done.is_set() and not self.bank.stop.is_set():
                tid = f"h{s.port}-{self.counts['kill'] }-{k}"
                if self.bank.transfer(s.client(socket_timeout=30), rng, tid) is not None:
                    k += 1
        driver = threading.Thread(target=drive, daemon=True)
        driver.start()
        try:
            until(lambda: c.execute_command("SHARD.DEBUG", "TXN-HOLD", "HELD") >= 1,
                  f"a transaction of {s.port} held at {step}", timeout=min(30, self.left()))
        except AssertionError:
            c.execute_command("SHARD.DEBUG", "TXN-HOLD", "OFF")
            raise
        finally:
            done.set()
        self.kill_and_restart(s, f"the coordinator held at {step}", 0)

    def kill_owner(self):
        self.kill_and_restart(self.rng.choice(self.primaries()), "an owner",
                              self.rng.uniform(0.1, 0.5))

    def kill_and_restart(self, s, what, down_s):
        """kill -9, then a restart in the role it had (as a config file Sentinel rewrote would
        keep it; the servers' command lines name the replicas' first primaries)."""
        n = self.fleet.shard_of(s)
        primary = self.fleet.master_address(n)
        s.config = [x for x in s.config if x[0] != "replicaof"]
        if primary is not None and primary != s.port:
            s.config.append(("replicaof", "127.0.0.1", primary))
        s.stop(signal.SIGKILL)
        self.fleet.down.add(s.port)
        self.note(f"kill -9 {what} {self.fleet.shard_of(s)}:{s.port}")
        time.sleep(down_s)
        self.fleet.restart(s)
        self.fleet.down.discard(s.port)
        self.note(f"restart {s.port}")

    def stop_owner(self):
        s = self.rng.choice(self.primaries())
        s.proc.send_signal(signal.SIGSTOP)
        self.note(f"SIGSTOP {self.fleet.shard_of(s)}:{s.port}")
        time.sleep(LOCK_MS / 1000 * 1.5)  # under Sentinel's down-after-milliseconds
        s.proc.send_signal(signal.SIGCONT)
        self.note(f"SIGCONT {s.port}")

    def failover(self):
        n = self.rng.choice(RING)

        def failover():
            try:
                return self.fleet.sentinels[0].client(socket_timeout=5).execute_command(
                    "SENTINEL", "FAILOVER", n)
            except redis.ResponseError as e:
                if "INPROG" in str(e) or "NOGOODSLAVE" in str(e):
                    return None  # a failover of an earlier fault still under way
                raise
        old = self.fleet.master_address(n)
        old_primary = self.fleet.primary(n).client(socket_timeout=5)
        # Writes paused at the old primary until it is demoted, as Redis's own FAILOVER does:
        # without it, what it acknowledges between its replica's promotion and Sentinel's
        # switch (up to a second) is lost with the replication that never carried it (open:
        # docs/transactions.md, "What is still open").
        old_primary.execute_command("CLIENT", "PAUSE", 30_000, "WRITE")
        until(failover, f"SENTINEL FAILOVER {n} accepted", timeout=min(60, self.left()), every=0.5)
        self.note(f"SENTINEL FAILOVER {n} (writes paused at the old primary)")
        until(lambda: self.fleet.master_address(n) not in (old, None),
              "Sentinel names the promoted replica", timeout=min(60, self.left()), every=0.1)
        new = self.fleet.master_address(n)
        # Writes resume at the old primary once it no longer acts as n (it has Sentinel's new
        # address for n; INFO, not a routed call, which the pause would hold): its owner side
        # refuses n's keys from then on.
        until(lambda: info_shard(old_primary)[f"node_{n}_address"] == f"127.0.0.1:{new}",
              "the old primary knows the new one", timeout=min(60, self.left()))
        old_primary.execute_command("CLIENT", "UNPAUSE")
        self.note(f"CLIENT UNPAUSE the old primary of {n}")
        until(self.fleet.settled, "the failover done", timeout=min(60, self.left()), every=0.2)

    def reshard(self, names):
        s = self.rng.choice([self.fleet.primary(n) for n in RING])
        args = ["slots", *[x for n in names for x in (n, "sentinel", 1)]]
        reply = s.client(socket_timeout=20).execute_command("SHARD.RESHARD", "START", *args)
        self.note(f"START to {len(names)} on {self.fleet.shard_of(s)}:{s.port} {reply}")
        finish_resharding(self.fleet, self.history, timeout=min(60, self.left()))

    def run(self):
        schedule = [self.kill_held_coordinator, self.kill_owner, self.kill_held_coordinator,
                    self.stop_owner, self.failover]
        self.rng.shuffle(schedule)
        for fault in schedule:
            self.progress()
            fault()
            until(self.fleet.settled, "every shard settled", timeout=min(60, self.left()),
                  every=0.2)
        self.progress()
        self.reshard(SHARDS)
        self.progress()
        self.reshard(RING)
        self.progress()


def story(bank, tid, history):
    """A transfer's own history, for a problem with it: its accounts and amount, the node that
    coordinated it, when its EXEC was sent and replied, what it replied, each owner now, and
    the faults from 5 s before it was sent to 5 s after it replied."""
    sent, port = bank.sent.get(tid, (None, None))
    acked = bank.acked_at.get(tid)
    lines = [f"    {tid}: {bank.transfers.get(tid)} through :{port}, sent at {sent}, "
             f"{bank.outcome.get(tid)} at {acked}"]
    if sent is not None and acked is not None:
        with history.lock:
            lines += [f"      {t:9.3f} {what}" for t, who, what, _, _ in history.events
                      if who == "faults" and sent - 5 <= t <= acked + 5]
    return "\n".join(lines)


def check(fleet, bank):
    """What the healed fleet must hold; the list of what is wrong."""
    problems = list(bank.problems)
    via = fleet.primary("n0").client(socket_timeout=30)
    balances = dict(zip(bank.accounts, (int(v) for v in via.execute_command(
        "SHARD.CALL", "MGET", *bank.accounts))))
    logs = {a: [x.decode() for x in via.execute_command("SHARD.CALL", "LRANGE", log_of(a), 0, -1)]
            for a in bank.accounts}
    total = ACCOUNTS * START
    if sum(balances.values()) != total:
        problems.append(f"the total is {sum(balances.values())}, not {total}")
    seen = Counter((tid, a) for a, ids in logs.items() for tid in ids)
    ids = {tid for tid, _ in seen}
    for (tid, a), count in seen.items():
        if count > 1:
            owner = via.execute_command("SHARD.WHEREIS", a).decode()
            problems.append(f"{tid} applied {count} times at {a} (owned by {owner} now)\n"
                            + story(bank, tid, bank.history))
    for tid in ids:
        if tid not in bank.transfers:
            problems.append(f"{tid} in a log but never sent")
            continue
        src, dst, _ = bank.transfers[tid]
        if not (seen[(tid, src)] and seen[(tid, dst)]):
            missing = src if not seen[(tid, src)] else dst
            owner = via.execute_command("SHARD.WHEREIS", missing).decode()
            problems.append(f"{tid} applied at one account only ({src} {seen[(tid, src)]}, "
                            f"{dst} {seen[(tid, dst)]}): {bank.outcome.get(tid)}; missing at "
                            f"{owner}\n" + story(bank, tid, bank.history))
        if bank.outcome.get(tid) == "fail":
            problems.append(f"{tid} applied, but its EXEC said it was not")
    for tid, outcome in bank.outcome.items():
        if outcome == "ok" and tid not in ids:
            problems.append(f"{tid} acknowledged but not applied: {bank.transfers[tid]}")
    for a in bank.accounts:
        expected = START
        for tid in set(logs[a]):
            if tid in bank.transfers:
                src, dst, amount = bank.transfers[tid]
                expected += -amount if a == src else amount if a == dst else 0
        if balances[a] != expected:
            problems.append(f"{a} holds {balances[a]}, its log says {expected}")
    return problems


def nothing_left(fleet):
    """No lock, no part in doubt, no decision held at any primary."""
    for n in SHARDS:
        i = info_shard(fleet.primary(n).client(socket_timeout=5))
        if (i["txn_locks_held"], i["txn_in_doubt"], i["txn_decisions_held"]) != ("0", "0", "0"):
            return False
    return True


def txn_report(fleet):
    """Each server's role and transaction counters, one line each."""
    lines = []
    for s in fleet.servers():
        try:
            i = info_shard(s.client(socket_timeout=2))
            lines.append(f"{fleet.shard_of(s)}:{s.port} {fleet.role(s)} "
                         + " ".join(f"{k}={v}" for k, v in i.items() if k.startswith("txn_")))
        except (redis.RedisError, OSError) as e:
            lines.append(f"{fleet.shard_of(s)}:{s.port} unreachable: {e}")
    return "\n".join(lines)


@pytest.mark.slow
def test_the_bank_keeps_its_total_under_faults(server_factory, sentinel_factory, clockshim,
                                               tmp_path):
    deadline = time.monotonic() + BUDGET

    def left():
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"the bank under faults ran over its {BUDGET} s"
        return remaining

    seed = int(os.environ.get("TXN_CHAOS_SEED", random.randrange(1 << 31)))
    rng = random.Random(seed)
    fleet = Fleet(server_factory, sentinel_factory, clockshim, tmp_path,
                  config=[("enable-debug-command", "yes"), ("shard.txn-lock-ms", LOCK_MS)])
    history = History()
    bank = Bank(fleet, history, rng)
    c = fleet.primary("n0").client()
    flat = [x for a in bank.accounts for x in (a, START)]
    assert c.execute_command("SHARD.CALL", "MSET", *flat) == b"OK"
    # Sentinel fails over only when told (SENTINEL FAILOVER): a kill -9 and its restart, or a
    # SIGSTOP, are over long before it would count the server down.
    for sentinel in fleet.sentinels:
        for n in SHARDS:
            sentinel.client().execute_command("SENTINEL", "SET", n, "down-after-milliseconds",
                                              10_000)
    faults = Faults(fleet, bank, history, rng, left)
    history.add("faults", "the fleet is up, the bank starts")
    bank.start()
    try:
        for _ in range(SCALE):
            faults.run()
    except (AssertionError, redis.RedisError) as e:
        raise AssertionError(f"TXN_CHAOS_SEED={seed}: {e}\n--- the servers ---\n"
                             + fleet_report(fleet) + "\n--- history ---\n"
                             + history.text(who=("faults",))) from e
    finally:
        bank.finish()
    history.add("faults", "the bank stopped")
    until(fleet.settled, "the fleet settled before the checks", timeout=60, every=0.5)
    try:
        until(lambda: nothing_left(fleet), "no lock, part in doubt or decision left", timeout=60)
    except AssertionError as e:
        raise AssertionError(f"TXN_CHAOS_SEED={seed}: {e}\n" + txn_report(fleet)
                             + "\n--- history ---\n" + history.text(who=("faults",))) from e
    problems = check(fleet, bank)
    outcomes = Counter(bank.outcome.values())
    summary = (f"TXN_CHAOS_SEED={seed}: {len(bank.transfers)} transfers {dict(outcomes)}, "
               f"{len(bank.reads)} reads; faults {dict(faults.counts)}")
    print(summary)
    print(history.text(who=("faults",)))
    problems.sort(key=lambda p: p.startswith("a read"))
    assert not problems, (f"{summary}\n" + "\n".join(problems[:40])
                          + "\n--- the servers ---\n" + fleet_report(fleet)
                          + "\n--- history ---\n" + history.text(who=("faults",)))
    assert outcomes["ok"] >= 50 * SCALE, summary
    assert len(bank.reads) >= 5, summary
    left()
