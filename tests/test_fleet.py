"""Fleet operations between real servers (issue 15): one command grows or shrinks the fleet.

- `SHARD.RESHARD START` grows 3 -> 4 and shrinks 4 -> 3, each from a node that is not the
  leaving one and with no other command: every key ends exactly once at its owner, unchanged,
  and every node holds the same ring with no resharding open.
- START refuses, naming the node, when a node is missing, down, holds another ring, joins with
  keys, or has another `shard.self`; after a refusal no node has a resharding open.
- `SHARD.RESHARD CANCEL` mid-copy while clients write moving keys through SHARD.CALL: the fleet is
  back on the old ring with every acknowledged write, and no key on a node that does not own it.
- The coordinator killed with SIGKILL mid-copy (AOF on) and restarted: STATUS shows where it
  stood, `SHARD.RESHARD RESUME` finishes the resharding.
- `SHARD.RING CHECK` (agreement, each node's share of the ketama circle against uhashring's own
  points) and `SHARD.RING PUSH`.

Replies are RESP2 (maps arrive as flat lists); `as_map` turns them into dicts.
"""

import random
import re
import signal
import threading
import time
from collections import Counter, defaultdict

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from uhashring import HashRing

from conftest import free_port
from test_reshard import check_placement, owners, populate, ring_args, set_ring, snapshot

NAMES3 = ["n0", "n1", "n2"]
NAMES4 = NAMES3 + ["n3"]
AOF = [("appendonly", "yes"), ("appendfsync", "always")]
FINAL = ("done", "cancelled")
# MAXRATE limits the keys a copy *sends* per second, per source. Growing 3 -> 4 moves about a
# quarter of the keys, so with 30 000 keys each of the three sources sends about 2 500: about
# 2.5 s at 1 000 keys/s, long enough to cancel or kill the coordinator in the middle.
SLOW_KEYS = 30_000
SLOW_RATE = 1000


# --- replies ---------------------------------------------------------------------------------


def as_map(reply):
    """A RESP2 map (flat `[k1, v1, k2, v2, ...]`) as a dict with str keys and the values as sent
    (bytes, ints, None). The known nested maps become dicts too: `fleet`, `previous`, and
    `nodes` (name -> map in CHECK and STATUS, a list of maps in RING GET)."""
    if reply is None:
        return None
    pairs = reply.items() if isinstance(reply, dict) else zip(reply[::2], reply[1::2])
    out = {}
    for k, v in pairs:
        k = k.decode() if isinstance(k, bytes) else k
        if k in ("fleet", "previous"):
            v = as_map(v)
        elif k == "nodes" and isinstance(v, list):
            if v and isinstance(v[0], list):
                v = [as_map(m) for m in v]
            else:
                v = {name.decode(): as_map(m) for name, m in zip(v[::2], v[1::2])}
        out[k] = v
    return out


def fleet_status(client):
    """The `fleet` map of the node's `SHARD.RESHARD STATUS` (None: it coordinates nothing)."""
    return as_map(client.execute_command("SHARD.RESHARD", "STATUS"))["fleet"]


def ring_of(client):
    """`SHARD.RING GET` as a dict, or None on a node that holds no ring."""
    try:
        return as_map(client.execute_command("SHARD.RING", "GET"))
    except redis.ResponseError as e:
        if "no ring is set" in str(e):
            return None
        raise


def share(value):
    return float(value.decode() if isinstance(value, bytes) else value)


# --- driving the fleet -----------------------------------------------------------------------


def make_fleet(server_factory, config=(), names=NAMES4, ring=NAMES3):
    """One server per name with `self` set; the ring of `ring` (weight 1 each) is set on those
    nodes only: the others hold no ring and no keys."""
    servers = {n: server_factory(module_args=["self", n], config=config) for n in names}
    set_ring(servers, ring, [servers[n] for n in ring])
    return servers


def start(client, servers, names, maxrate=None, extra=()):
    """`SHARD.RESHARD START ketama` to the ring of `names` (weight 1 each) plus `extra`."""
    args = ["SHARD.RESHARD", "START", "ketama", *ring_args(servers, names), *extra]
    if maxrate:
        args += ["MAXRATE", maxrate]
    return client.execute_command(*args)


def wait_fleet(client, phase="done", timeout=60):
    """Polls the coordinator's STATUS until `fleet.phase` is `phase`; fails, with the last status,
    on the other final phase, on a coordinator that stopped driving (`running` no) for a second,
    or after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    stalled_since = None
    while True:
        st = fleet_status(client)
        assert st is not None, "this node coordinates no resharding"
        now = st["phase"].decode()
        if now == phase:
            return st
        if now in FINAL:
            raise AssertionError(f"the resharding ended {now}, not {phase}: {st}")
        if st["running"] == b"no":
            stalled_since = stalled_since or time.monotonic()
            if time.monotonic() - stalled_since > 1.0:
                raise AssertionError(f"the coordinator stopped driving in phase {now}: {st}")
        else:
            stalled_since = None
        if time.monotonic() > deadline:
            raise AssertionError(f"fleet phase still {now} after {timeout:.0f} s: {st}")
        time.sleep(0.05)


def wait_copying(client, timeout=30):
    """Waits until the coordinator is in phase `copy` and has seen a node's copy running."""
    deadline = time.monotonic() + timeout
    while True:
        st = fleet_status(client)
        assert st is not None, "this node coordinates no resharding"
        now = st["phase"].decode()
        if now == "copy" and any(n["state"].startswith(b"copying") for n in st["nodes"].values()):
            return st
        assert now in ("fence", "begin", "copy"), \
            f"the copy ended before the test could act: more keys or a lower MAXRATE: {st}"
        assert time.monotonic() < deadline, f"no copy running after {timeout:.0f} s: {st}"
        time.sleep(0.02)


def check_done(st, old_digest, new_digest, roles):
    """The coordinator's STATUS once done: no problem left, the rings and each node's role."""
    assert st["error"] == b"", st
    assert (st["old_digest"], st["new_digest"]) == (old_digest, new_digest), st
    assert {n: m["role"].decode() for n, m in st["nodes"].items()} == roles, st


# --- what the fleet holds --------------------------------------------------------------------


def assert_one_ring(servers, names, on=None):
    """Every server of `on` (default: all) holds the ring of `names` alone (no resharding open),
    with the same digest; returns the digest."""
    digests = set()
    for n in on or servers:
        ring = ring_of(servers[n].client())
        assert ring is not None, f"{n} holds no ring"
        assert ring["previous"] is None, f"{n} still has a resharding open: {ring}"
        assert sorted(m["name"].decode() for m in ring["nodes"]) == sorted(names), (n, ring)
        digests.add(ring["digest"])
    assert len(digests) == 1, f"the nodes hold different rings: {digests}"
    return digests.pop()


def assert_no_resharding(servers, on):
    """No server of `on` has a resharding open (a server with no ring has none)."""
    for n in on:
        ring = ring_of(servers[n].client())
        assert ring is None or ring["previous"] is None, f"{n} has a resharding open: {ring}"


def assert_owned_only(servers, via):
    """Every key of every server (all of database 0) is owned by that server under the ring of
    `via` (`SHARD.WHEREIS`); returns how many keys the servers hold in all."""
    total = 0
    for name, s in servers.items():
        keys = list(s.client().scan_iter(count=1000))
        total += len(keys)
        stray = [(k, o) for k, o in zip(keys, owners(via, keys)) if o != name]
        assert not stray, f"{len(stray)} keys on {name}, which does not own them: {stray[:10]}"
    return total


def assert_in_place(servers, keys, before, via):
    """Each of `keys` is held by exactly one server (all servers are looked at), its owner under
    the ring of `via`, with the value it had in `before` (a `snapshot`)."""
    after = snapshot(servers, keys)
    expected = dict(zip(keys, owners(via, keys)))
    for k in keys:
        holders = after.get(k, [])
        assert [h[0] for h in holders] == [expected[k]], (k, expected[k], holders)
        assert holders[0][1] == before[k][0][1], f"{k} changed"


# --- clients writing through SHARD.CALL ------------------------------------------------------

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
        return sum(v for log in self.ledgers for k, v in log.outcomes.items() if k.endswith(ACK))


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


# --- tests -----------------------------------------------------------------------------------


def test_start_grows_three_to_four_and_shrinks_back_from_a_staying_node(server_factory):
    servers = make_fleet(server_factory)
    keys = populate({n: servers[n] for n in NAMES3}, n=20_000, seed=11)
    before = snapshot(servers, keys)
    assert all(len(h) == 1 for h in before.values())
    old = assert_one_ring(servers, NAMES3, on=NAMES3)

    # Grow from n1: n3 has no ring and no keys; START alone does everything.
    c1 = servers["n1"].client()
    assert start(c1, servers, NAMES4) == b"OK"
    st = wait_fleet(c1, "done")
    new = assert_one_ring(servers, NAMES4)
    assert new != old
    check_done(st, old, new, {"n0": "both", "n1": "both", "n2": "both", "n3": "new"})
    check_placement(servers, NAMES4, keys, before)  # all four: every key once, at its owner
    # Done: nothing to cancel any more, nor to resume.
    with pytest.raises(redis.ResponseError, match="no fleet operation to cancel"):
        c1.execute_command("SHARD.RESHARD", "CANCEL")
    with pytest.raises(redis.ResponseError, match="nothing to resume"):
        c1.execute_command("SHARD.RESHARD", "RESUME")

    # Shrink from n2, n3 leaving.
    c2 = servers["n2"].client()
    assert start(c2, servers, NAMES3) == b"OK"
    st = wait_fleet(c2, "done")
    back = assert_one_ring(servers, NAMES3)  # the node that left holds the new ring too
    assert back == old, "the same ring as at first: the same digest"
    check_done(st, new, back, {"n0": "both", "n1": "both", "n2": "both", "n3": "old"})
    # Every key once at its owner among n0..n2, unchanged; and nothing left on n3.
    check_placement(servers, NAMES3, keys, before)
    assert servers["n3"].client().dbsize() == 0


def test_start_refuses_naming_the_node_and_opens_nothing(server_factory):
    servers = make_fleet(server_factory, config=AOF)  # AOF: n2 is killed and restarted below
    keys = populate({n: servers[n] for n in NAMES3}, n=600, seed=12)
    before = snapshot(servers, keys)
    old = assert_one_ring(servers, NAMES3, on=NAMES3)
    c0 = servers["n0"].client()

    def refused(who, live=NAMES4, extra=(), names=NAMES4):
        with pytest.raises(redis.ResponseError) as e:
            start(c0, servers, names, extra=extra)
        msg = str(e.value)
        assert re.search(rf"\b{who}\b", msg), f"the refusal does not name {who}: {msg}"
        assert fleet_status(c0) is None, "a refused START leaves no plan"
        assert_no_resharding(servers, live)
        assert ring_of(servers["n3"].client()) is None, "the joining node got no ring"
        return msg

    # (a) A node of the new ring where nothing listens.
    refused("n9", extra=["n9", f"127.0.0.1:{free_port()}", 1])
    assert_one_ring(servers, NAMES3, on=NAMES3)

    # (c) A node holding another ring (other weights).
    n1 = servers["n1"].client()
    n1.execute_command("SHARD.RING", "SET", "ketama", "n0", f"127.0.0.1:{servers['n0'].port}", 1,
                       "n1", f"127.0.0.1:{servers['n1'].port}", 2,
                       "n2", f"127.0.0.1:{servers['n2'].port}", 1)
    refused("n1")
    set_ring(servers, NAMES3, [servers["n1"]])
    assert assert_one_ring(servers, NAMES3, on=NAMES3) == old

    # (d) A joining node that holds keys (in two databases): named with its key count.
    n3 = servers["n3"]
    n3.client().mset({f"stale:{i}": i for i in range(5)})
    n3.client(db=3).mset({"stale:db3:a": 1, "stale:db3:b": 2})
    msg = refused("n3")
    assert re.search(r"\b7\b", msg), f"the refusal does not give n3's 7 keys: {msg}"
    n3.client().flushall()

    # (e) A node whose shard.self is not its ring name.
    n2 = servers["n2"].client()
    n2.config_set("shard.self", "zz")
    refused("n2")
    n2.config_set("shard.self", "n2")

    # (b) A node of the old ring that was killed.
    servers["n2"].stop(signal.SIGKILL)
    refused("n2", live=["n0", "n1", "n3"])
    assert_one_ring(servers, NAMES3, on=["n0", "n1"])
    servers["n2"].start()
    assert assert_one_ring(servers, NAMES3, on=NAMES3) == old

    # Nothing was left behind: the same START now goes through.
    assert start(c0, servers, NAMES4) == b"OK"
    wait_fleet(c0, "done")
    assert_one_ring(servers, NAMES4)
    check_placement(servers, NAMES4, keys, before)


def test_cancel_mid_copy_keeps_every_acknowledged_write_on_the_old_ring(server_factory):
    servers = make_fleet(server_factory)
    keys = populate({n: servers[n] for n in NAMES3}, n=SLOW_KEYS, seed=13)
    c0 = servers["n0"].client()
    counters = [f"cnt:{i}" for i in range(400)]
    pipe = c0.pipeline(transaction=False)
    for k in counters:
        pipe.execute_command("SHARD.CALL", "SET", k, 1000)
    pipe.execute()
    strings = [k for k in keys if k.endswith(":string")]
    watched = strings + counters
    old_owner = dict(zip(watched, owners(c0, watched)))
    pipe = c0.pipeline(transaction=False)
    for k in strings:
        pipe.execute_command("SHARD.CALL", "GET", k)
    initial = dict(zip(strings, pipe.execute()))
    before = snapshot(servers, keys)
    old = assert_one_ring(servers, NAMES3, on=NAMES3)

    assert start(c0, servers, NAMES4, maxrate=SLOW_RATE) == b"OK"
    # Once the copy runs, BEGIN is done everywhere: SHARD.WHEREIS answers from the new ring.
    wait_copying(c0)
    new_owner = dict(zip(watched, owners(c0, watched)))
    moving_strings = [k for k in strings if new_owner[k] != old_owner[k]][:240]
    moving_counters = [k for k in counters if new_owner[k] != old_owner[k]]
    assert len(moving_strings) == 240 and len(moving_counters) > 40
    writers = Writers(servers, NAMES4, 4, counters=moving_counters,
                      values=[moving_strings[t::4] for t in range(4)], seed=13)
    writers.start()
    try:
        time.sleep(1.0)
        st = fleet_status(c0)
        assert st["phase"] == b"copy", f"the copy ended before CANCEL: more keys or a lower MAXRATE: {st}"
        assert c0.execute_command("SHARD.RESHARD", "CANCEL") == b"OK"
        st = wait_fleet(c0, "cancelled")
    finally:
        writers.stop()
    assert writers.acknowledged() > 100, writers.summary()

    # Every node (the joining one too) is on the old ring alone.
    assert assert_one_ring(servers, NAMES3) == old, st
    assert servers["n3"].client().dbsize() == 0
    assert_owned_only(servers, c0)
    written = set(moving_strings)
    assert_in_place(servers, [k for k in keys if k not in written], before, c0)
    check_writes(c0, writers, counter_base=1000, initial=initial)


def test_coordinator_killed_mid_copy_resumes_after_restart(server_factory):
    servers = make_fleet(server_factory, config=AOF)
    keys = populate({n: servers[n] for n in NAMES3}, n=SLOW_KEYS, seed=14)
    before = snapshot(servers, keys)
    old = assert_one_ring(servers, NAMES3, on=NAMES3)
    c0 = servers["n0"].client()
    assert start(c0, servers, NAMES4, maxrate=SLOW_RATE) == b"OK"
    wait_copying(c0)

    # n0 coordinates and is a copy source too: its copy dies with it.
    servers["n0"].stop(signal.SIGKILL)
    servers["n0"].start()
    c0 = servers["n0"].client()
    st = fleet_status(c0)
    assert st is not None, "the plan did not survive the restart"
    assert st["phase"] in (b"copy", b"commit", b"cleanup", b"done") and st["running"] == b"no", st
    assert c0.execute_command("SHARD.RESHARD", "RESUME") == b"OK"
    st = wait_fleet(c0, "done")
    new = assert_one_ring(servers, NAMES4)
    check_done(st, old, new, {"n0": "both", "n1": "both", "n2": "both", "n3": "new"})
    check_placement(servers, NAMES4, keys, before)


def weighted_args(servers, weights):
    args = []
    for name, weight in weights.items():
        args += [name, f"127.0.0.1:{servers[name].port}", weight]
    return args


def uhashring_shares(weights):
    """Each node's fraction of the ketama circle (2^32), from uhashring's own ring points: a key
    goes to the first point strictly greater than its hash, wrapping to the first point, so a
    point owns [previous point, point) and the first point also [last point, 2^32)."""
    ring = HashRing(nodes={n: {"weight": w} for n, w in weights.items()}, hash_fn="ketama")
    points = sorted(set(ring.runtime._keys))
    owner = ring.runtime._ring
    owned = dict.fromkeys(weights, 0)
    previous = 0
    for p in points:
        owned[owner[p]] += p - previous
        previous = p
    owned[owner[points[0]]] += 2**32 - points[-1]
    assert sum(owned.values()) == 2**32
    return {n: o / 2**32 for n, o in owned.items()}


def check(client):
    return as_map(client.execute_command("SHARD.RING", "CHECK"))


def test_ring_check_shares_agreement_and_push(server_factory):
    weights = {"n0": 1, "n1": 2, "n2": 3}
    servers = {n: server_factory(module_args=["self", n]) for n in weights}
    for s in servers.values():
        s.client().execute_command("SHARD.RING", "SET", "ketama", *weighted_args(servers, weights))
    populate(servers, n=600, seed=15)
    c0 = servers["n0"].client()

    got = check(c0)
    assert got["agree"] == b"yes", got
    assert set(got["nodes"]) == set(weights), got
    expected = uhashring_shares(weights)
    total = sum(weights.values())
    for n, node in got["nodes"].items():
        assert node["address"] == f"127.0.0.1:{servers[n].port}".encode(), node
        assert node["ring"] == b"current" and node["reachable"] == b"yes", node
        assert node["error"] == b"" and node["digest"] == got["digest"], node
        assert node["previous_digest"] == b"" and node["returning"] == b"no", node
        assert node["weight"] == weights[n], node
        assert node["keys"] == servers[n].client().dbsize() > 0, node
        assert node["used_memory"] > 0, node
        assert abs(share(node["weight_share"]) - weights[n] / total) <= 1e-6, node
        assert abs(share(node["share"]) - expected[n]) <= 0.001, (n, node, expected)
    # Six decimals each: the sum is 1 within the rounding of each.
    assert abs(sum(share(m["share"]) for m in got["nodes"].values()) - 1) <= 2e-6, got

    # One node gets another ring: CHECK from another node sees it.
    other = {"n0": 1, "n1": 1, "n2": 1}
    servers["n2"].client().execute_command("SHARD.RING", "SET", "ketama",
                                           *weighted_args(servers, other))
    got = check(c0)
    assert got["agree"] == b"no", got
    assert got["nodes"]["n2"]["digest"] != got["digest"], got
    assert got["nodes"]["n1"]["digest"] == got["digest"], got

    # PUSH from n0 puts its ring on every node.
    pushed = as_map(c0.execute_command("SHARD.RING", "PUSH"))
    assert {"n1", "n2"} <= set(pushed) <= set(weights), pushed
    assert all(v == b"OK" for v in pushed.values()), pushed
    for via in ("n0", "n2"):
        got = check(servers[via].client())
        assert got["agree"] == b"yes", (via, got)
        assert {m["digest"] for m in got["nodes"].values()} == {got["digest"]}, got
    ring = ring_of(servers["n2"].client())
    assert {m["name"].decode(): m["weight"] for m in ring["nodes"]} == weights, ring

    # A node down: named unreachable, with why.
    servers["n1"].stop(signal.SIGKILL)
    got = check(c0)
    assert got["agree"] == b"no", got
    down = got["nodes"]["n1"]
    assert down["reachable"] == b"no" and down["error"] != b"", down
    assert all(got["nodes"][n]["reachable"] == b"yes" for n in ("n0", "n2")), got


def test_start_with_passwords_and_the_plan_on_a_replica(server_factory):
    """Every server requires a password: the coordinator reaches the nodes (itself included) with
    `auth-password`. A replica of the coordinator holds its plan (replicated as SHARD.RESHARD
    PLAN), phase by phase, ready for a RESUME after a failover."""
    pw = "fleet-pw"
    servers = {
        n: server_factory(module_args=["self", n, "auth-password", pw], password=pw)
        for n in NAMES4
    }
    set_ring(servers, NAMES3, [servers[n] for n in NAMES3])
    keys = populate({n: servers[n] for n in NAMES3}, n=5000, seed=7)
    before = snapshot({n: servers[n] for n in NAMES3}, keys)
    replica = server_factory(module_args=["self", "n0"], password=pw,
                             config=[("replicaof", "127.0.0.1", servers["n0"].port),
                                     ("masterauth", pw)])
    c0 = servers["n0"].client()
    deadline = time.monotonic() + 20
    while c0.info("replication").get("connected_slaves", 0) < 1:
        assert time.monotonic() < deadline, "the replica did not connect"
        time.sleep(0.05)
    assert start(c0, servers, NAMES4) == b"OK"
    done = wait_fleet(c0, "done")
    assert done["error"] == b""
    check_placement(servers, NAMES4, keys, before)
    # The replica got every phase of the plan; the last one says done, and nothing drives it.
    r = replica.client()
    deadline = time.monotonic() + 10
    while True:
        st = fleet_status(r)
        if st is not None and st["phase"] == b"done":
            break
        assert time.monotonic() < deadline, f"the replica's plan: {st}"
        time.sleep(0.05)
    assert st["running"] == b"no" and st["new_digest"] == done["new_digest"]
    assert c0.info("shard")["shard_fleet_phase"] == "done"
    assert r.info("shard")["shard_fleet_phase"] == "done"
    assert r.info("shard")["shard_fleet_running"] == "no"
    assert r.execute_command("SHARD.RING", "GET")[7] == c0.execute_command("SHARD.RING", "GET")[7]
