"""SHARD.CALL between real servers: a fleet answers like one plain server, during a
resharding too; down, silent and restarted owners; ACL; authentication; bad input; databases
other than 0.

Replies are compared as raw RESP bytes (`Raw`, tests/helpers/resp.py), so every reply type, every error text and
the RESP2/RESP3 shapes (maps, sets, doubles, nulls) must be exactly what a plain server sends.
"""

import math
import random
import re
import signal
import threading
import time

import pytest
import redis

from helpers.calls import check_call_placement, key_names, random_ops, run_in_segments
from helpers.fleet import NAMES, TIMEOUT_MS, Fleet, make_fleet
from helpers.listener import Listener
from helpers.reshard import wait_job
from helpers.resp import Raw, assert_same_replies, call_ops, differences, encode, timed_pipeline
from helpers.server import until


# --- 1. a fleet answers like one plain server ------------------------------------------------


@pytest.mark.parametrize("protocol,count,extended", [(2, 10_000, False), (3, 2_500, True)],
                         ids=["resp2-10000-ops", "resp3-2500-ops"])
def test_fleet_through_one_node_equals_a_plain_server(server_factory, protocol, count, extended):
    fleet = make_fleet(server_factory, timeout_ms=2000)
    plain = server_factory()
    rng = random.Random(6 + protocol)
    keys = key_names(300, f"p{protocol}")
    ops = random_ops(rng, count, keys, extended=extended)

    client = fleet.raw("n0", protocol=protocol)
    got, took = timed_pipeline(client, call_ops(ops))
    plain_raw = Raw(plain.port, protocol=protocol)
    want, took_plain = timed_pipeline(plain_raw, ops)
    # (A TTL read a run's length later after its EXPIRE in one run than in the other: CI took
    # over 3 s for the fleet's run.)
    assert_same_replies(ops, got, want, f"RESP{protocol} through n0",
                        ttl_slack=2 + math.ceil(max(took, took_plain)))

    # The replies covered the types they should have: errors, nulls, and under RESP3 maps,
    # sets and doubles (redis-py would turn several of these into the same Python value).
    kinds = {w[:1] for w in want}
    assert {b"+", b"-", b":", b"$", b"*"} <= kinds, kinds
    if protocol == 3:
        assert {b"%", b"~", b",", b"_"} <= kinds, kinds
    assert b"-WRONGTYPE" in b"".join(want)

    calls = fleet.calls("n0")
    assert calls["call_local"] + calls["call_forwarded"] == len(ops), calls
    assert calls["call_local"] > len(ops) / 5 and calls["call_forwarded"] > len(ops) / 2, calls
    assert calls["call_errors"] == 0 and calls["call_timeouts"] == 0, calls
    assert calls["call_fallbacks"] == 0 and calls["call_copies"] == 0, calls

    by_owner = check_call_placement(fleet, list(NAMES), plain, keys)
    assert set(by_owner) == set(NAMES), "every node holds some of the keys"


def test_reply_types_byte_for_byte_local_and_forwarded(server_factory):
    """Fixed cases, each through a key of n0 (local) and of n1 (forwarded), RESP2 and RESP3."""
    fleet = make_fleet(server_factory, timeout_ms=2000)
    plain = server_factory()
    differ = []
    for owner in ("n0", "n1"):
        k = fleet.key_of(owner, prefix=f"types-{owner}")
        big = bytes(range(256)) * 8192 + b"\r\n"  # 2 MB, every byte value
        ops = [
            ("GET", k), ("LPOP", k, 2), ("HGETALL", k), ("SMEMBERS", k), ("ZSCORE", k, "a"),
            ("ZMSCORE", k, "a", "b"), ("SET", k, big), ("GET", k), ("STRLEN", k),
            ("SET", k, "v", "GET"), ("INCRBYFLOAT", k, 1), ("DEL", k),
            ("HSET", k, "a", 1, "b", "two"), ("HGETALL", k), ("HLEN", k),
            ("HINCRBYFLOAT", k, "a", 0.1), ("LPUSH", k, 1), ("DEL", k),
            ("ZADD", k, 0.1, "a", "inf", "b"), ("ZSCORE", k, "a"), ("ZSCORE", k, "b"),
            ("ZMSCORE", k, "a", "none", "b"), ("ZRANGE", k, 0, -1, "WITHSCORES"),
            ("ZINCRBY", k, "-inf", "b"),
            ("ZPOPMIN", k, 5), ("DEL", k), ("SADD", k, 3, 1, 2), ("SMEMBERS", k),
            ("SMISMEMBER", k, 1, 9), ("RPUSH", k, "x"), ("LPOP", k, 2), ("LPOP", k, 2),
            ("RPUSH", k, "a", "b"), ("LPOS", k, "b"), ("LPOS", k, "z"),
            ("XADD", k, "1-1", "f", "v"), ("XRANGE", k, "-", "+"), ("XLEN", k),
            ("EXPIRE", k, 100), ("PERSIST", k), ("TTL", k), ("OBJECT", "ENCODING", k),
        ]
        # OBJECT is refused (its key is not first); the plain server's reply is not compared.
        for protocol in (2, 3):
            got = fleet.raw("n0", protocol=protocol).pipeline(call_ops(ops))
            want = Raw(plain.port, protocol=protocol).pipeline(ops)
            # OBJECT ENCODING's key is its second argument: found by the command table.
            differ += [(f"RESP{protocol}", owner, *d) for d in differences(ops, got, want)]
    assert not differ, "replies differ from the plain server's " \
                       f"(protocol, owner, op, shard.call, plain): {differ}"


# --- 2. during a resharding ------------------------------------------------------------------


def locate(fleet, keys, via="n0"):
    """key -> (current owner, previous owner)."""
    pipe = fleet.client(via).pipeline(transaction=False)
    for k in keys:
        pipe.execute_command("SHARD.LOCATE", k)
    out = {}
    for k, reply in zip(keys, pipe.execute()):
        d = dict(zip(reply[::2], reply[1::2]))
        out[k] = (d[b"node"].decode(), d[b"previous_node"].decode())
    return out


def read_op(kind, key):
    return {b"string": ("GET", key), b"hash": ("HGETALL", key),
            b"list": ("LRANGE", key, 0, -1)}[kind]


def test_resharding_reads_fall_back_writes_copy_deletes_everywhere(server_factory):
    names3, names4 = ["n0", "n1", "n2"], ["n0", "n1", "n2", "n3"]
    fleet = make_fleet(server_factory, names=names4, ring=names3, timeout_ms=2000)
    plain = server_factory()
    rng = random.Random(62)
    keys = key_names(200, "r")
    counters = [f"ctr:{i}" for i in range(80)]
    everything = keys + counters

    # Before: a fleet of three, written through every node.
    ops = [("SET", c, i * 10) for i, c in enumerate(counters)]
    ops += random_ops(rng, 1500, keys, expire_zero=False)
    got, want = run_in_segments(fleet, names4, ops, rng, plain=plain)
    assert_same_replies(ops, got, want, "before the resharding")

    fleet.ring(names4, verb="BEGIN")
    where = locate(fleet, everything)
    moved = [k for k in everything if where[k][0] != where[k][1]]
    assert all(where[k][0] == "n3" for k in moved), "ketama moves keys only to the new node"
    p = plain.client()
    kinds = dict(zip(everything, [p.type(k) for k in everything]))
    moved_present = [k for k in moved if kinds[k] != b"none"]
    moved_counters = [k for k in moved_present if k in counters]
    assert len(moved_present) > 30 and len(moved_counters) >= 6, (len(moved_present), moved_counters)
    assert fleet.client("n3").dbsize() == 0, "nothing copied yet"

    # Reads through ANY node find the keys still at their previous owner.
    reads = [read_op(kinds[k], k) for k in moved_present if kinds[k] in (b"string", b"hash", b"list")]
    reads += [("TTL", k) for k in moved_present] + [("GET", "r:never-written")]
    fallbacks = fleet.total("call_fallbacks")
    want = Raw(plain.port).pipeline(reads)
    for n in names4:
        got = fleet.raw(n).pipeline(call_ops(reads))
        assert_same_replies(reads, got, want, f"reads through {n} with the copy not run")
    assert fleet.total("call_fallbacks") - fallbacks >= 4 * (len(reads) - 1), \
        "every read of a moved key fell back to its previous owner"
    assert fleet.client("n3").dbsize() == 0, "reads copy nothing"

    # INCR continues from the old value at the new owner; the previous owner keeps its copy.
    copies = fleet.total("call_copies")
    for i, k in enumerate(moved_counters[:4]):
        old = int(p.get(k))
        via = names4[i]
        assert fleet.client(via).execute_command("SHARD.CALL", "INCR", k) == old + 1 == p.incr(k)
        assert fleet.client("n3").get(k) == str(old + 1).encode(), f"INCR through {via}"
        assert fleet.client(where[k][1]).get(k) == str(old).encode(), "COPY keeps the original"
        assert fleet.client(via).execute_command("SHARD.CALL", "INCR", k) == old + 2 == p.incr(k)
    assert fleet.total("call_copies") - copies == 4, "one copy per key, the first write only"

    # DEL removes a key everywhere: one only at its previous owner, one copied already.
    for k, via in ((moved_counters[4], "n1"), (moved_counters[0], "n3"), (moved_counters[5], "n0")):
        assert fleet.client(via).execute_command("SHARD.CALL", "DEL", k) == 1 == p.delete(k)
        assert [fleet.client(n).exists(k) for n in names4] == [0] * 4, f"{k} deleted everywhere"
        assert fleet.client(via).execute_command("SHARD.CALL", "DEL", k) == 0 == p.delete(k)
        assert fleet.client(via).execute_command("SHARD.CALL", "GET", k) is None

    # Random traffic through every node while the resharding is open.
    fallbacks, copies = fleet.total("call_fallbacks"), fleet.total("call_copies")
    ops = random_ops(rng, 2500, everything, expire_zero=False)
    got, want = run_in_segments(fleet, names4, ops, rng, plain=plain)
    assert_same_replies(ops, got, want, "during the resharding")
    assert fleet.total("call_fallbacks") > fallbacks and fleet.total("call_copies") > copies

    # COPY, COMMIT, CLEANUP everywhere: the fleet holds what the plain server holds.
    for n in names4:
        assert fleet.client(n).execute_command("SHARD.RESHARD", "COPY", "TIMEOUT", 2000) == b"OK"
    for n in names4:
        st = wait_job(fleet.client(n))
        assert st["state"] == b"done" and st["failed"] == 0, (n, st)
    for n in names4:
        assert fleet.client(n).execute_command("SHARD.RING", "COMMIT") == b"OK"
    for n in names4:
        assert fleet.client(n).execute_command("SHARD.RESHARD", "CLEANUP") == b"OK"
    for n in names4:
        assert wait_job(fleet.client(n))["state"] == b"done", n
    by_owner = check_call_placement(fleet, names4, plain, everything)
    assert "n3" in by_owner


def test_resharding_deletes_by_other_writes_do_not_resurrect(server_factory):
    """A write that removes a key (GETDEL, EXPIRE 0, popping the last element) on a key that
    is still at its previous owner: a plain server no longer has the key afterwards."""
    fleet = make_fleet(server_factory, names=["a", "b"], ring=["a"], timeout_ms=2000)
    plain = server_factory()
    p = plain.client()
    a = fleet.client("a")
    cases = [("GETDEL",), ("EXPIRE", 0), ("LPOP",), ("HDEL", "f"), ("SPOP",), ("ZPOPMIN",)]
    setups = {"GETDEL": ("SET", "v"), "EXPIRE": ("SET", "v"), "LPOP": ("RPUSH", "e"),
              "HDEL": ("HSET", "f", "v"), "SPOP": ("SADD", "m"), "ZPOPMIN": ("ZADD", 1, "m")}
    # Keys that move from a to b: found under the new ring, written under the old one
    # (directly at a, as clients did before the BEGIN).
    fleet.ring(["a", "b"], verb="BEGIN")
    keys, i = {}, 0
    for case in cases:
        while fleet.owners([k := f"gone:{case[0]}:{i}"])[0] != "b":
            i += 1
        keys[case] = k
        i += 1
    for n in ("a", "b"):
        fleet.client(n).execute_command("SHARD.RING", "ABORT")
    for case, k in keys.items():
        cmd, *args = setups[case[0]]
        a.execute_command(cmd, k, *args)
        p.execute_command(cmd, k, *args)
    fleet.ring(["a", "b"], verb="BEGIN")

    problems = []
    for case, k in keys.items():
        got = a.execute_command("SHARD.CALL", case[0], k, *case[1:])
        want = p.execute_command(case[0], k, *case[1:])
        assert got == want, (case, got, want)
        assert p.exists(k) == 0
        if fleet.client("a").execute_command("SHARD.CALL", "EXISTS", k) != 0:
            problems.append(f"{' '.join(map(str, case))}: SHARD.CALL EXISTS still finds the key "
                            f"(at its previous owner a)")
    for step in (("RESHARD", "COPY"), ("RING", "COMMIT"), ("RESHARD", "CLEANUP")):
        for n in ("a", "b"):
            assert fleet.client(n).execute_command(f"SHARD.{step[0]}", step[1]) == b"OK"
            assert wait_job(fleet.client(n))["state"] in (b"done", b"idle"), (n, step)
    back = [k for k in keys.values() if fleet.client("b").exists(k)]
    if back:
        problems.append(f"after COPY/COMMIT/CLEANUP the removed keys are back at b: {back}")
    assert not problems, "a key removed by a write during a resharding comes back from its " \
                         "previous owner: " + "; ".join(problems)


# --- 3. owners that are down or silent -------------------------------------------------------


def timed_call(client, *args):
    t0 = time.monotonic()
    try:
        reply = client.execute_command("SHARD.CALL", *args)
    except redis.ResponseError as e:
        reply = e
    return reply, time.monotonic() - t0


def spread_over_workers(fleet, via, key, n=24, threads=6):
    """Calls from several clients at once, so that every worker pools a connection."""

    def run():
        c = fleet.client(via)
        for _ in range(n // threads):
            assert c.execute_command("SHARD.CALL", "SET", key, "x") == b"OK"

    ts = [threading.Thread(target=run) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=20)


@pytest.mark.serial
def test_down_owner_named_quickly_others_work_and_it_comes_back(server_factory):
    fleet = make_fleet(server_factory)
    k = {n: fleet.key_of(n) for n in NAMES}
    c0, c2 = fleet.client("n0"), fleet.client("n2")
    spread_over_workers(fleet, "n0", k["n1"])
    port1 = fleet["n1"].port
    addr1 = f"127.0.0.1:{port1}"

    fleet["n1"].stop()
    for _ in range(8):  # enough to meet every worker's stale pooled connection
        for c in (c0, c2):
            reply, elapsed = timed_call(c, "GET", k["n1"])
            assert isinstance(reply, redis.ResponseError), reply
            assert f"shard.call: node n1 ({addr1})" in str(reply), reply
            assert elapsed < 0.25, f"a refused connection is reported at once, took {elapsed:.3f}s"
    for n in ("n0", "n2"):
        assert c0.execute_command("SHARD.CALL", "SET", k[n], n) == b"OK"
        assert c2.execute_command("SHARD.CALL", "GET", k[n]) == n.encode()
    assert fleet.calls("n0")["call_errors_n1"] >= 8
    assert fleet.calls("n0")["call_errors"] >= 8

    fleet["n1"].port = port1
    fleet["n1"].start()
    fleet["n1"].client().execute_command("SHARD.RING", "SET", "ketama", *fleet.ring_args(NAMES))
    for i in range(12):
        assert c0.execute_command("SHARD.CALL", "SET", k["n1"], i) == b"OK"
        assert c2.execute_command("SHARD.CALL", "GET", k["n1"]) == str(i).encode()

    # A restart between two calls (no call while it was down): pooled connections of every
    # worker are stale, yet no call fails.
    spread_over_workers(fleet, "n0", k["n1"])
    errors = fleet.calls("n0")["call_errors_n1"]
    fleet["n1"].stop()
    fleet["n1"].start()
    failed = []
    for i in range(16):
        try:
            c0.execute_command("SHARD.CALL", "SET", k["n1"], i)
        except redis.ResponseError as e:
            failed.append(str(e))
    assert not failed, f"calls after the owner restarted failed: {failed}"
    assert fleet.calls("n0")["call_errors_n1"] == errors


def test_owner_closing_idle_pooled_connections_fails_no_call(server_factory):
    """An owner with `timeout 1` closes the pooled connections as idle clients; the next calls
    find them closed and use new ones: no call fails, and none runs twice (INCR counts)."""
    fleet = make_fleet(server_factory)
    k1 = fleet.key_of("n1")
    c0 = fleet.client("n0")
    spread_over_workers(fleet, "n0", k1)
    assert c0.execute_command("SHARD.CALL", "DEL", k1) == 1
    owner = fleet["n1"].client()
    owner.config_set("timeout", 1)
    before = owner.info("stats")["total_connections_received"]
    errors = fleet.calls("n0").get("call_errors_n1", 0)
    # clientsCron closes the clients idle for more than 1 s: every one but `owner`, which asks.
    until(lambda: len(owner.client_list()) == 1, "n1 to close its idle clients", 10, every=0.1)
    for i in range(1, 17):
        assert c0.execute_command("SHARD.CALL", "INCR", k1) == i
    assert fleet.calls("n0").get("call_errors_n1", 0) == errors
    assert c0.execute_command("SHARD.CALL", "GET", k1) == b"16"
    # The pooled connections were closed and replaced: more new connections than this check's
    # own client and the idle `owner` client's reconnection account for.
    fresh = redis.Redis(port=fleet["n1"].port)
    try:
        assert fresh.info("stats")["total_connections_received"] >= before + 2
    finally:
        fresh.close()


@pytest.mark.serial
def test_silent_owner_times_out_and_the_server_keeps_serving(server_factory):
    fleet = make_fleet(server_factory)
    with Listener(lifetime=15) as hole:
        fleet.ring(NAMES, extra=[("hole", hole.port)])
        key = fleet.key_of("hole")
        mine = fleet.key_of("n0")
        result = {}

        def blocked_call():
            result["reply"], result["elapsed"] = timed_call(fleet.client("n0"), "GET", key)

        t = threading.Thread(target=blocked_call)
        t.start()
        probe = fleet.client("n0")
        pings = []
        while t.is_alive():
            t0 = time.monotonic()
            assert probe.execute_command("SHARD.CALL", "SET", mine, "still here") == b"OK"
            pings.append(time.monotonic() - t0)
            time.sleep(0.01)
        t.join()
        reply, elapsed = result["reply"], result["elapsed"]
        assert isinstance(reply, redis.ResponseError), reply
        assert str(reply) == f"shard.call: node hole (127.0.0.1:{hole.port}): " \
                             f"did not answer within {TIMEOUT_MS} ms", reply
        assert TIMEOUT_MS / 1000 - 0.05 <= elapsed < TIMEOUT_MS / 1000 + 0.4, elapsed
        assert len(pings) > 10 and max(pings) < 0.1, "n0 served others while the call waited"
        assert hole.accepted >= 1 and b"GET" in bytes(hole.received)
        calls = fleet.calls("n0")
        assert calls["call_timeouts_hole"] == 1 and calls["call_timeouts"] == 1, calls
        reply, elapsed = timed_call(fleet.client("n1"), "SET", key, "v")
        assert "did not answer within" in str(reply) and elapsed < TIMEOUT_MS / 1000 + 0.4
        assert fleet.calls("n1")["call_timeouts_hole"] == 1


@pytest.mark.serial
def test_a_late_answer_never_reaches_the_next_call(server_factory):
    """An owner that answers after the timeout (paused): the late reply is dropped with its
    connection, and the next call gets its own reply."""
    fleet = make_fleet(server_factory)
    a, b = fleet.key_of("n1", "late-a"), fleet.key_of("n1", "late-b")
    c0 = fleet.client("n0")
    c0.execute_command("SHARD.CALL", "SET", a, "value of a")
    c0.execute_command("SHARD.CALL", "SET", b, "value of b")
    fleet.client("n1").execute_command("CLIENT", "PAUSE", 800, "ALL")
    reply, elapsed = timed_call(c0, "GET", a)
    assert "did not answer within" in str(reply) and elapsed < 0.9, (reply, elapsed)
    time.sleep(0.5)  # n1 resumes and answers the GET of a on the abandoned connection
    for _ in range(8):
        assert c0.execute_command("SHARD.CALL", "GET", b) == b"value of b"
        assert c0.execute_command("SHARD.CALL", "GET", a) == b"value of a"


def test_each_call_keeps_its_own_timeout_on_a_shared_connection(server_factory):
    """A call's timeout is its own, not that of the request that opened the pooled connection,
    nor that of the request in front of it on that connection: a call is failed at its own
    deadline even behind a request allowed longer. Before, every request of a connection
    expired by the timeout of the link that opened it, checked at the front of the queue only:
    a fleet request (5 s) that had opened a node's connection made the routed calls behind it
    wait 5 s for a frozen node (tests/test_sentinel.py's frozen failover, with the ring repair
    on). Here the call timeout is lowered between the two calls (CONFIG SET)."""
    fleet = make_fleet(server_factory, timeout_ms=4000)
    a, b = fleet.key_of("n1", "own-a"), fleet.key_of("n1", "own-b")
    c0 = fleet.client("n0")
    # n0's connection to n1 opens for a call of 4000 ms.
    assert c0.execute_command("SHARD.CALL", "SET", a, "value of a") == b"OK"
    owner = fleet["n1"]
    owner.proc.send_signal(signal.SIGSTOP)
    try:
        first = {}

        def long_call():
            first["reply"], _ = timed_call(fleet.client("n0", socket_timeout=20), "GET", a)
        t = threading.Thread(target=long_call)
        t.start()
        until(lambda: fleet.calls("n0")["call_in_flight"] >= 1, "the first call in flight")
        c0.config_set("shard.call-timeout-ms", 300)
        # Behind the first call on the same connection, with a timeout of its own.
        reply, _ = timed_call(c0, "GET", b)
        assert str(reply) == f"shard.call: node n1 (127.0.0.1:{owner.port}): " \
                             "did not answer within 300 ms", reply
        t.join(timeout=20)
        # The first call shared the connection closed with the second one's timeout.
        assert str(first["reply"]) == str(reply), first
    finally:
        owner.proc.send_signal(signal.SIGCONT)
    c0.config_set("shard.call-timeout-ms", 4000)
    assert c0.execute_command("SHARD.CALL", "GET", a) == b"value of a"


# --- 4. ACL ----------------------------------------------------------------------------------


def test_acl_applies_to_local_and_forwarded_calls(server_factory):
    fleet = make_fleet(server_factory)
    for n in NAMES:
        c = fleet.client(n)
        c.execute_command("ACL", "SETUSER", "app", "on", ">pw", "~*", "+@all", "-set")
        c.execute_command("ACL", "SETUSER", "narrow", "on", ">pw", "~ok:*", "+@all")
    local, remote = fleet.key_of("n0"), fleet.key_of("n1")
    admin = fleet.client("n0")
    for k in (local, remote):
        admin.execute_command("SHARD.CALL", "SET", k, "before")
    app = fleet.client("n0", username="app", password="pw")
    narrow = fleet.client("n0", username="narrow", password="pw")
    denied = {}  # what -> the error reply's raw bytes
    for k, where in ((remote, "forwarded to n1"), (local, "owned by n0")):
        denied[f"SET by app, key {where}"] = fleet.raw("n0", user="app", password="pw").execute(
            "SHARD.CALL", "SET", k, "after")
        assert app.execute_command("SHARD.CALL", "GET", k) == b"before", where
        assert admin.execute_command("SHARD.CALL", "GET", k) == b"before", "nothing was written"
        assert app.execute_command("SHARD.CALL", "INCRBY", k + ":n", 2) == 2, where
    # Key patterns: the user may only touch ok:*.
    for owner in ("n1", "n0"):
        ok, other = fleet.key_of(owner, "ok"), fleet.key_of(owner, "secret")
        assert narrow.execute_command("SHARD.CALL", "SET", ok, 1) == b"OK"
        assert narrow.execute_command("SHARD.CALL", "GET", ok) == b"1"
        denied[f"GET of secret:* by narrow, key of {owner}"] = fleet.raw(
            "n0", user="narrow", password="pw").execute("SHARD.CALL", "GET", other)
    assert all(r.startswith(b"-") for r in denied.values()), denied
    not_noperm = {what: r for what, r in denied.items() if not r.startswith(b"-NOPERM ")}
    assert not not_noperm, f"denied calls must reply NOPERM, like the plain commands: {not_noperm}"


# --- 5. authentication between nodes ---------------------------------------------------------


def test_nodes_authenticate_with_auth_user_and_password(server_factory):
    names = ["n0", "n1", "n2"]
    fleet = make_fleet(
        server_factory, names=names, password="adminpw",
        per_node_args={
            "n0": ["auth-user", "shard", "auth-password", "wrong-secret"],
            "n1": ["auth-password", "adminpw"],  # the default user
            "n2": ["auth-user", "shard", "auth-password", "s3cret"],
        })
    for n in names:
        fleet.client(n).execute_command("ACL", "SETUSER", "shard", "on", ">s3cret", "~*", "+@all")
    k = {n: fleet.key_of(n) for n in names}
    for via, target in (("n1", "n0"), ("n1", "n2"), ("n2", "n0"), ("n2", "n1")):
        c = fleet.client(via)
        assert c.execute_command("SHARD.CALL", "SET", k[target], via) == b"OK"
        assert c.execute_command("SHARD.CALL", "GET", k[target]) == via.encode()
        assert fleet.client(via, protocol=3).execute_command("SHARD.CALL", "HGETALL", k[target] + "h") == {}
    c0 = fleet.client("n0")
    for target in ("n1", "n2"):
        with pytest.raises(redis.ResponseError) as e:
            c0.execute_command("SHARD.CALL", "GET", k[target])
        msg = str(e.value)
        assert f"node {target} (127.0.0.1:{fleet[target].port})" in msg, msg
        assert "WRONGPASS" in msg, msg
        assert "wrong-secret" not in msg, "the password is never shown"
    assert c0.execute_command("SHARD.CALL", "GET", k["n0"]) == b"n2", "local calls need no auth"
    assert fleet.calls("n0")["call_errors_n1"] == 1
    # Fixing the password takes effect at once: failed handshakes keep no connection.
    c0.config_set("shard.auth-password", "s3cret")
    assert c0.execute_command("SHARD.CALL", "GET", k["n1"]) == b"n2"
    assert c0.execute_command("SHARD.CALL", "GET", k["n2"]) == b"n1"
    # Another database: the new connections authenticate, then select it.
    assert fleet.client("n2", db=3).execute_command("SHARD.CALL", "SET", k["n1"], "three") == b"OK"
    assert fleet.client("n1", db=3).get(k["n1"]) == b"three"
    # A user whose ACL denies SELECT: an error naming the node and the database; nothing runs.
    fleet.client("n0").execute_command("ACL", "SETUSER", "shard", "-select")
    with pytest.raises(redis.ResponseError) as e:
        fleet.client("n2", db=5).execute_command("SHARD.CALL", "SET", k["n0"], "five")
    assert f"node n0 (127.0.0.1:{fleet['n0'].port}): cannot select database 5: NOPERM" \
        in str(e.value), str(e.value)
    assert fleet.client("n0", db=5).dbsize() == 0 and fleet.client("n0").get(k["n0"]) == b"n2"


# --- 6. bad input ----------------------------------------------------------------------------


def test_bad_input_gets_clear_errors(server_factory):
    lone = server_factory(module_args=["self", "n0"])
    with pytest.raises(redis.ResponseError, match="^NORING no ring is set"):
        lone.client().execute_command("SHARD.CALL", "GET", "k")

    fleet = make_fleet(server_factory)
    c = fleet.client("n0")
    # The module's own message, or Redis's when the command is registered with arity -3.
    too_short = "(SHARD.CALL needs a command and its key|wrong number of arguments for 'shard.call')"
    for owner in ("n0", "n1"):
        k = fleet.key_of(owner)
        elsewhere = fleet.key_of("n1" if owner == "n0" else "n0", prefix="other")
        cases = [
            ((), too_short),
            # A command with no key in its arguments runs here, as one server (576e987).
            (("GET",), "wrong number of arguments for 'get' command"),
            (("SET", k), "wrong number of arguments for 'set' command"),
            (("GET", k, "extra"), "wrong number of arguments for 'get' command"),
            (("NOSUCHCMD", k), "unknown command 'nosuchcmd'"),
            # Keys of two owners, in a command that does not split: gathered, and the
            # command's own error (test_gather.py).
            (("RENAME", k, elsewhere), r"no such key"),
        ]
        for args, message in cases:
            raw = fleet.raw("n0").execute("SHARD.CALL", *args)
            assert raw.startswith(b"-ERR "), (args, raw)
            assert re.search(message.encode(), raw), (owner, args, raw)
        assert c.exists(k) == 0 and fleet.client(owner).dbsize() == 0, "nothing ran"

    local, remote = fleet.key_of("n0"), fleet.key_of("n1")
    # MULTI: the local call runs, the forwarded one errors, and the server goes on.
    pipe = c.pipeline(transaction=True)
    pipe.execute_command("SHARD.CALL", "SET", local, "in multi")
    pipe.execute_command("SHARD.CALL", "GET", remote)
    pipe.execute_command("SHARD.CALL", "GET", local)
    replies = pipe.execute(raise_on_error=False)
    assert replies[0] == b"OK" and replies[2] == b"in multi", replies
    assert isinstance(replies[1], redis.ResponseError), replies
    assert f"cannot wait for node n1 (127.0.0.1:{fleet['n1'].port}) inside MULTI" in str(replies[1])
    with pytest.raises(redis.ResponseError, match="not allowed from script"):
        c.eval("return redis.call('SHARD.CALL', 'GET', KEYS[1])", 1, remote)
    # Another database forwards too (tests of their own below).
    assert fleet.client("n0", db=1).execute_command("SHARD.CALL", "SET", remote, 1) == b"OK"
    assert fleet.client("n1", db=1).get(remote) == b"1" and fleet.client("n1").exists(remote) == 0
    assert c.ping()
    assert c.execute_command("SHARD.CALL", "SET", remote, "after") == b"OK"
    assert fleet.client("n1").get(remote) == b"after"
    assert c.execute_command("SHARD.CALL", "GET", local) == b"in multi"
    calls = fleet.calls("n0")
    assert calls["call_errors"] == 0 and calls["call_timeouts"] == 0, calls


# --- 7. databases other than 0 ---------------------------------------------------------------


def spread_keys(fleet, n, prefix, names=NAMES):
    """n keys and their owners; every node of `names` owns some."""
    keys = [f"{prefix}:{i}" for i in range(n)]
    owners = dict(zip(keys, fleet.owners(keys)))
    assert set(owners.values()) == set(names), owners
    return keys, owners


def test_calls_in_databases_3_and_15_run_in_that_database_at_the_owner(server_factory):
    """Writes and reads through every node, in databases 3 and 15 (RESP2 and RESP3), land in
    that database at the owner only; database 0, holding the same key names, is untouched.
    Local calls (the filter's plain command, RedisModule_Call for EVAL and the field
    dictionary) and forwarded ones alike."""
    fleet = make_fleet(server_factory, args=("fields", "username:u"))
    keys, owners = spread_keys(fleet, 30, "db")
    c0 = fleet.client("n0")
    assert c0.execute_command("SHARD.CALL", "MSET", *[x for k in keys for x in (k, f"db0:{k}")]) \
        == b"OK"
    db0_before = {n: sorted(fleet.client(n).keys("*")) for n in NAMES}

    for db, protocol in ((3, 2), (15, 3)):
        for via in NAMES:
            c = fleet.client(via, db=db, protocol=protocol)
            for k in keys:
                assert c.execute_command("SHARD.CALL", "SET", k, f"db{db}:{via}:{k}") == b"OK"
            for reader in NAMES:
                r = fleet.client(reader, db=db, protocol=protocol)
                got = [r.execute_command("SHARD.CALL", "GET", k) for k in keys]
                assert got == [f"db{db}:{via}:{k}".encode() for k in keys], (db, via, reader)
        for n in NAMES:
            direct = fleet.client(n, db=db)
            mine = sorted(k for k in keys if owners[k] == n)
            assert sorted(k.decode() for k in direct.keys("*")) == mine, (db, n)
            assert direct.mget(mine) == [f"db{db}:n2:{k}".encode() for k in mine], (db, n)

    # More paths in database 3: INCR from every node, EVAL (keys from the key specs; run
    # locally through RedisModule_Call), a hash under the field dictionary.
    for via in NAMES:
        c = fleet.client(via, db=3)
        for k in keys:
            c.execute_command("SHARD.CALL", "INCR", f"{{{k}}}ctr")
            assert c.execute_command("SHARD.CALL", "EVAL", "return redis.call('GET', KEYS[1])",
                                     1, k) == f"db3:n2:{k}".encode()
        assert c.execute_command("SHARD.CALL", "HSET", f"h:{via}", "username", via) == 1
    for via in NAMES:
        owner = fleet.owners([f"h:{via}"])[0]
        assert fleet.client(owner, db=3).hgetall(f"h:{via}") == {b"u": via.encode()}
        for reader in NAMES:
            got = fleet.client(reader, db=3).execute_command("SHARD.CALL", "HGETALL", f"h:{via}")
            assert got == [b"username", via.encode()], (via, reader, got)
    ctrs = [f"{{{k}}}ctr" for k in keys]
    got = fleet.client("n1", db=3).execute_command("SHARD.CALL", "MGET", *ctrs)
    assert got == [b"3"] * len(keys)
    for k, ctr_owner in zip(keys, fleet.owners(ctrs)):
        assert fleet.client(ctr_owner, db=3).get(f"{{{k}}}ctr") == b"3"

    # Database 0: the same keys, the same values, nothing added.
    assert {n: sorted(fleet.client(n).keys("*")) for n in NAMES} == db0_before
    for reader in NAMES:
        got = fleet.client(reader).execute_command("SHARD.CALL", "MGET", *keys)
        assert got == [f"db0:{k}".encode() for k in keys]
    for n in NAMES:
        calls = fleet.calls(n)
        assert calls["call_errors"] == 0 and calls["call_timeouts"] == 0, (n, calls)


def test_split_multi_key_calls_in_database_3(server_factory):
    fleet = make_fleet(server_factory)
    keys, owners = spread_keys(fleet, 60, "split")
    c0 = fleet.client("n0")
    pairs = [x for k in keys for x in (k, "zero")]
    assert c0.execute_command("SHARD.CALL", "MSET", *pairs) == b"OK"
    for via in NAMES:
        c = fleet.client(via, db=3)
        values = [f"{via}:{k}".encode() for k in keys]
        pairs = [x for kv in zip(keys, values) for x in kv]
        assert c.execute_command("SHARD.CALL", "MSET", *pairs) == b"OK"
        for reader in NAMES:
            r = fleet.client(reader, db=3)
            assert r.execute_command("SHARD.CALL", "MGET", *keys, "split:none") == values + [None]
            assert r.execute_command("SHARD.CALL", "EXISTS", *keys, "split:none") == len(keys)
            assert r.execute_command("SHARD.CALL", "TOUCH", *keys) == len(keys)
    for n in NAMES:
        mine = [k for k in keys if owners[k] == n]
        assert fleet.client(n, db=3).mget(mine) == [f"n2:{k}".encode() for k in mine]
        assert fleet.client(n, db=3).dbsize() == len(mine)
    gone = keys[::2]
    assert fleet.client("n1", db=3).execute_command("SHARD.CALL", "DEL", *gone) == len(gone)
    assert fleet.client("n2", db=3).execute_command("SHARD.CALL", "UNLINK", *gone) == 0
    left = fleet.client("n0", db=3).execute_command("SHARD.CALL", "EXISTS", *keys)
    assert left == len(keys) - len(gone)
    assert sum(fleet.client(n, db=3).dbsize() for n in NAMES) == len(keys) - len(gone)
    # Database 0 kept every key.
    assert c0.execute_command("SHARD.CALL", "MGET", *keys) == [b"zero"] * len(keys)
    assert sum(fleet.client(n).dbsize() for n in NAMES) == len(keys)


def test_pipelined_clients_of_databases_0_and_3_interleaved_on_one_node(server_factory):
    """Four clients of n0, in databases 0, 3, 0, 3, each with a pipeline in flight at once:
    the calls of both databases to the same owners share the event loop's turns, and each
    runs in its caller's database."""
    fleet = make_fleet(server_factory, timeout_ms=2000)
    rng = random.Random(3)
    sets = [spread_keys(fleet, 24, f"mix{i}")[0] for i in range(2)]
    clients = []
    for i, db in enumerate((0, 3, 0, 3)):
        raw = fleet.raw("n0")
        assert raw.execute("SELECT", db) == b"+OK\r\n"
        # Clients 0 and 1 share key names (in different databases), and so do 2 and 3.
        clients.append((db, raw, sets[i // 2]))
    last = {}  # (db, key) -> value
    incrs = {}  # (db, key) -> count
    for rnd in range(40):
        sent = []
        for i, (db, raw, keys) in enumerate(clients):
            ops = []
            for k in rng.sample(keys, 6):
                value = f"db{db}:c{i}:r{rnd}:{k}"
                ops += [("SET", k, value), ("GET", k), ("INCR", f"{{{k}}}n")]
                last[(db, k)] = value
                incrs[(db, k)] = incrs.get((db, k), 0) + 1
            raw.sock.sendall(b"".join(encode(c) for c in call_ops(ops)))
            sent.append(ops)
        for (db, raw, _), ops in zip(clients, sent):
            replies = [raw.read() for _ in ops]
            seen = {}
            for op, reply in zip(ops, replies):
                if op[0] == "SET":
                    assert reply == b"+OK\r\n", (db, op, reply)
                    seen[op[1]] = op[2]
                elif op[0] == "GET":
                    want = seen[op[1]].encode()
                    assert reply == b"$%d\r\n%s\r\n" % (len(want), want), (db, op, reply)
                else:
                    assert reply.startswith(b":"), (db, op, reply)
    for raw in (c[1] for c in clients):
        raw.close()
    # At each owner, in each database, what that database's clients wrote last.
    all_keys = sets[0] + sets[1]
    owners = dict(zip(all_keys, fleet.owners(all_keys)))
    ctr_owners = dict(zip(all_keys, fleet.owners([f"{{{k}}}n" for k in all_keys])))
    for (db, k), value in last.items():
        assert fleet.client(owners[k], db=db).get(k) == value.encode(), (db, k)
        assert fleet.client(ctr_owners[k], db=db).get(f"{{{k}}}n") == str(incrs[(db, k)]).encode()
    for n in NAMES:
        for db in (0, 3):
            held = {k.decode() for k in fleet.client(n, db=db).keys("*")}
            want = {k for (d, k) in last if d == db and owners[k] == n}
            want |= {f"{{{k}}}n" for (d, k) in last if d == db and ctr_owners[k] == n}
            assert held == want, (n, db)
    calls = fleet.calls("n0")
    assert calls["call_errors"] == 0 and calls["call_timeouts"] == 0, calls
    assert calls["call_forwarded"] > 0


def test_resharding_in_database_3_falls_back_and_copies_in_database_3(server_factory):
    """During a resharding, database 3's reads fall back to the previous owner's database 3,
    its writes copy from there into database 3 at the new owner, and deletes run at both in
    database 3; database 0, holding the same names with other values, is never touched."""
    fleet = make_fleet(server_factory, names=["a", "b"], ring=["a"], timeout_ms=2000)
    keys = [f"rs:{i}" for i in range(80)]
    a0, a3 = fleet.client("a"), fleet.client("a", db=3)
    assert a0.execute_command("SHARD.CALL", "MSET", *[x for k in keys for x in (k, f"db0:{k}")]) \
        == b"OK"
    assert a3.execute_command("SHARD.CALL", "MSET", *[x for k in keys for x in (k, 10)]) == b"OK"
    fleet.ring(["a", "b"], verb="BEGIN")
    moved = [k for k, o in zip(keys, fleet.owners(keys)) if o == "b"]
    assert len(moved) >= 8, moved
    b0, b3 = fleet.client("b"), fleet.client("b", db=3)

    for via in ("a", "b"):
        c = fleet.client(via, db=3)
        assert [c.execute_command("SHARD.CALL", "GET", k) for k in moved] == [b"10"] * len(moved)
        assert c.execute_command("SHARD.CALL", "MGET", *keys) == [b"10"] * len(keys)
        assert c.execute_command("SHARD.CALL", "EXISTS", *moved) == len(moved)
    assert b0.dbsize() == 0 and b3.dbsize() == 0, "reads copy nothing"
    assert fleet.total("call_fallbacks") >= 2 * len(moved)

    copies = fleet.total("call_copies")
    for i, via in enumerate(("a", "b")):
        c = fleet.client(via, db=3)
        assert c.execute_command("SHARD.CALL", "INCR", moved[i]) == 11
        assert c.execute_command("SHARD.CALL", "INCR", moved[i]) == 12
        assert b3.get(moved[i]) == b"12" and a3.get(moved[i]) == b"10", "copied into db 3"
    assert fleet.total("call_copies") - copies == 2
    # A split write during the resharding copies key by key, into database 3.
    split_write = ("MSET", moved[2], "m", keys[0], "m")
    assert fleet.client("a", db=3).execute_command("SHARD.CALL", *split_write) == b"OK"
    assert b3.get(moved[2]) == b"m"
    # DEL at both owners, in database 3 only; a write that removes the key removes the
    # previous owner's copy too.
    assert fleet.client("b", db=3).execute_command("SHARD.CALL", "DEL", moved[0], moved[3]) == 2
    assert fleet.client("a", db=3).execute_command("SHARD.CALL", "GETDEL", moved[4]) == b"10"
    for k in (moved[0], moved[3], moved[4]):
        assert a3.exists(k) == 0 and b3.exists(k) == 0, k
        assert fleet.client("b", db=3).execute_command("SHARD.CALL", "GET", k) is None

    # Database 0 meanwhile: its own values, found at the previous owner, nothing moved.
    assert b0.dbsize() == 0
    assert a0.dbsize() == len(keys)
    for via in ("a", "b"):
        got = fleet.client(via).execute_command("SHARD.CALL", "MGET", *keys)
        assert got == [f"db0:{k}".encode() for k in keys]
    for n in ("a", "b"):
        calls = fleet.calls(n)
        assert calls["call_errors"] == 0 and calls["call_timeouts"] == 0, (n, calls)


def test_a_destination_without_the_database_refuses_naming_node_and_database(server_factory):
    """n1 has `databases 4`: a call from database 5 of n0 to n1's keys is an error naming n1
    and database 5, never a reply or a write of another database; database 3 and n0's own
    keys still work from the same clients."""
    servers = {
        "n0": server_factory(module_args=["self", "n0", "call-timeout-ms", TIMEOUT_MS]),
        "n1": server_factory(module_args=["self", "n1", "call-timeout-ms", TIMEOUT_MS],
                             config=[("databases", 4)]),
    }
    fleet = Fleet(servers)
    fleet.ring(["n0", "n1"])
    k0, k1 = fleet.key_of("n0"), fleet.key_of("n1")
    k1b = fleet.key_of("n1", prefix="other")
    fleet.client("n1").set(k1, "db0 value")
    where = f"node n1 (127.0.0.1:{fleet['n1'].port})"

    c5 = fleet.client("n0", db=5)
    for args in (("GET", k1), ("SET", k1, "x"), ("INCR", k1b), ("MGET", k0, k1),
                 ("MSET", k1, "y", k1b, "z"), ("DEL", k1)):
        with pytest.raises(redis.ResponseError) as refused:
            c5.execute_command("SHARD.CALL", *args)
        message = str(refused.value)
        assert f"shard.call: {where}: cannot select database 5: " in message, (args, message)
        assert "DB index is out of range" in message, (args, message)
    raw = fleet.raw("n0")
    assert raw.execute("SELECT", 5) == b"+OK\r\n"
    replies = raw.pipeline([("SHARD.CALL", "GET", k1)] * 20)
    assert all(r.startswith(b"-ERR shard.call: " + where.encode() + b": cannot select database 5")
               for r in replies), replies[:3]
    raw.close()

    # Nothing ran at n1, in any database.
    n1 = fleet.client("n1")
    assert n1.get(k1) == b"db0 value" and n1.dbsize() == 1
    assert [fleet.client("n1", db=d).dbsize() for d in (1, 2, 3)] == [0, 0, 0]
    # The same client's local keys work, and so do n1's keys from database 3 and 0.
    assert c5.execute_command("SHARD.CALL", "SET", k0, "five") == b"OK"
    assert fleet.client("n0", db=5).get(k0) == b"five"
    c3 = fleet.client("n0", db=3)
    assert c3.execute_command("SHARD.CALL", "SET", k1, "three") == b"OK"
    assert fleet.client("n1", db=3).get(k1) == b"three"
    assert fleet.client("n0").execute_command("SHARD.CALL", "GET", k1) == b"db0 value"
    assert fleet.calls("n0")["call_errors_n1"] >= 26
