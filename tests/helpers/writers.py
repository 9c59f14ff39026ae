"""Clients writing through SHARD.CALL while a fleet changes under them, and what the fleet must
hold afterwards: every acknowledged write, nothing that was never written.

`Writers` runs threads that INCR counters, SADD unique members and SET unique values, each
write on a random node, and keeps a ledger per thread; `check_writes` reads the fleet back
against the ledgers.
"""

import random
import threading
import time
from collections import Counter, defaultdict

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from helpers.server import until

ACK, UNKNOWN, REFUSED = "ack", "unknown", "refused"


class Ledger:
    """What one writer thread did. A write is acknowledged once its reply arrived; a write that
    got an error or no answer is unknown (it may or may not have applied), except `TRYAGAIN`:
    refused, not applied."""

    def __init__(self):
        self.incr = {ACK: Counter(), UNKNOWN: Counter()}
        self.members = {ACK: defaultdict(set), UNKNOWN: defaultdict(set)}
        self.values = defaultdict(list)  # key -> [(value, outcome)] in the order written
        self.outcomes = Counter()
        self.errors = Counter()  # the first words of each error, for the failure messages


class Writers:
    """`threads` clients writing through SHARD.CALL, each write on a random node of `self.via`
    (which the test may change as it goes): INCR of `counters`; SADD of a unique member
    `t<thread>-<n>` to `sets`; SET of `t<thread>-<n>` to the keys of `values[thread]` (each
    thread its own keys, so that "the last acknowledged value" is well defined)."""

    def __init__(self, servers, via, threads, counters=(), sets=(), values=None, seed=0,
                 pause=0.002, deadline=None):
        self.servers, self.via = servers, list(via)
        self.counters, self.sets = list(counters), list(sets)
        self.values = values or [[] for _ in range(threads)]
        assert len(self.values) == threads
        self.kinds = [k for k, keys in (("incr", self.counters), ("sadd", self.sets),
                                        ("set", any(self.values))) if keys]
        self.seed, self.pause = seed, pause
        self.deadline = deadline or time.monotonic() + 300
        self.ledgers = [Ledger() for _ in range(threads)]
        self.crashed = []
        self.done = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(t,), daemon=True)
                        for t in range(threads)]

    def start(self):
        for t in self.threads:
            t.start()
        return self

    def stop(self):
        self.done.set()
        for t in self.threads:
            t.join(timeout=30)
        assert not any(t.is_alive() for t in self.threads), "a writer thread is stuck"
        assert not self.crashed, f"a writer thread crashed: {self.crashed}"

    def _client(self, name):
        # No retry inside redis-py: a command is sent at most once, whatever happens.
        return self.servers[name].client(socket_timeout=10, socket_connect_timeout=2,
                                         retry=Retry(NoBackoff(), 0))

    def _run(self, t):
        rng = random.Random(f"{self.seed}-{t}")
        log = self.ledgers[t]
        clients = {}
        n = 0
        try:
            while not self.done.is_set() and time.monotonic() < self.deadline:
                name = rng.choice(self.via)
                client = clients.get(name) or clients.setdefault(name, self._client(name))
                n += 1
                kind = rng.choice(self.kinds)
                if kind == "incr":
                    key = rng.choice(self.counters)
                    args = ("INCR", key)
                elif kind == "sadd":
                    key, item = rng.choice(self.sets), f"t{t}-{n}"
                    args = ("SADD", key, item)
                else:
                    key, item = rng.choice(self.values[t]), f"t{t}-{n}"
                    args = ("SET", key, item)
                try:
                    client.execute_command("SHARD.CALL", *args)
                    outcome = ACK
                except redis.ResponseError as e:
                    outcome = REFUSED if str(e).startswith("TRYAGAIN") else UNKNOWN
                    log.errors[" ".join(str(e).split()[:4])] += 1
                except (redis.ConnectionError, redis.TimeoutError) as e:
                    outcome = UNKNOWN
                    log.errors[f"{type(e).__name__} via {name}"] += 1
                    clients.pop(name).close()  # a new connection next time
                    time.sleep(0.02)
                log.outcomes[f"{kind} {outcome}"] += 1
                if kind == "incr" and outcome != REFUSED:
                    log.incr[outcome][key] += 1
                elif kind == "sadd" and outcome != REFUSED:
                    log.members[outcome][key].add(item.encode())
                elif kind == "set":
                    log.values[key].append((item.encode(), outcome))
                if self.pause:
                    time.sleep(self.pause)
        except Exception as e:  # noqa: BLE001 - reported by stop()
            self.crashed.append(f"thread {t}: {e!r}")

    def summary(self):
        outcomes, errors = Counter(), Counter()
        for log in self.ledgers:
            outcomes.update(log.outcomes)
            errors.update(log.errors)
        return f"writes: {dict(outcomes)}; errors: {dict(errors.most_common(8))}"

    def acknowledged(self):
        """Writes acknowledged so far (safe while the threads write: each ledger's counts are
        copied at once)."""
        return sum(v for log in self.ledgers for k, v in list(log.outcomes.items())
                   if k.endswith(ACK))

    def wait_acknowledged(self, more, timeout=30):
        """Waits until `more` writes more than now have been acknowledged: the writers have
        written through whatever the fleet is doing at this moment."""
        target = self.acknowledged() + more
        until(lambda: self.acknowledged() >= target, f"{more} more acknowledged writes", timeout)


def set_through(client, keys, value):
    """SHARD.CALL SET of every key to `value` through `client`'s node, in one pipeline: the
    writers' initial values (a counter's base, a value key's first value)."""
    pipe = client.pipeline(transaction=False)
    for k in keys:
        pipe.execute_command("SHARD.CALL", "SET", k, value)
    assert all(r == b"OK" for r in pipe.execute())


def allowed_values(history, initial=None):
    """The values a key may hold after the writes of `history` ([(value, outcome)] in order):
    its last acknowledged value, or one written after it whose outcome is unknown; with no
    acknowledged write, its initial value or any unknown one."""
    acked = [i for i, (_, o) in enumerate(history) if o == ACK]
    if not acked:
        return {initial} | {v for v, o in history if o == UNKNOWN}
    last = acked[-1]
    return {history[last][0]} | {v for v, o in history[last + 1:] if o == UNKNOWN}


def check_writes(client, writers, counter_base=0, initial=None):
    """What the fleet holds (read through SHARD.CALL on `client`) against the writers' ledgers:
    each counter is its base plus the acknowledged INCRs plus at most the unknown ones; each set
    holds every acknowledged member and nothing that was not written; each value key holds its
    last acknowledged value or a later unknown one."""
    incr = {ACK: Counter(), UNKNOWN: Counter()}
    members = {ACK: defaultdict(set), UNKNOWN: defaultdict(set)}
    for log in writers.ledgers:
        for o in (ACK, UNKNOWN):
            incr[o].update(log.incr[o])
            for k, m in log.members[o].items():
                members[o][k] |= m
    value_keys = [k for keys in writers.values for k in keys]
    histories = {}
    for log in writers.ledgers:
        histories.update(log.values)

    def read(command, keys):
        pipe = client.pipeline(transaction=False)
        for k in keys:
            pipe.execute_command("SHARD.CALL", command, k)
        return dict(zip(keys, pipe.execute()))

    problems = []
    for k, got in read("GET", writers.counters).items():
        got = int(got) if got is not None else 0
        low = counter_base + incr[ACK][k]
        high = low + incr[UNKNOWN][k]
        if not low <= got <= high:
            problems.append(f"counter {k} = {got}, expected {low}..{high} "
                            f"({incr[ACK][k]} acknowledged, {incr[UNKNOWN][k]} unknown INCRs)")
    for k, got in read("SMEMBERS", writers.sets).items():
        got = set(got)
        lost = members[ACK][k] - got
        foreign = got - members[ACK][k] - members[UNKNOWN][k]
        if lost or foreign:
            problems.append(f"set {k}: {len(lost)} acknowledged members lost {sorted(lost)[:5]}, "
                            f"{len(foreign)} never written {sorted(foreign)[:5]}")
    for k, got in read("GET", value_keys).items():
        history = histories.get(k, [])
        allowed = allowed_values(history, (initial or {}).get(k))
        if got not in allowed:
            problems.append(f"{k} = {got!r}, expected one of {sorted(map(repr, allowed))[:5]} "
                            f"(last writes: {history[-4:]})")
    assert not problems, f"{len(problems)} keys wrong, e.g. {problems[:10]}; {writers.summary()}"
