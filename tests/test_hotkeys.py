"""SHARD.HOTKEYS (issue 43, a fleet-wide hot-key view): every node's hottest keys by their LFU
counters (OBJECT FREQ), merged from any node into the fleet's top, each with its owner; LOCAL
gives one node's own. Read without touching the keys; refused without an LFU policy; the
sampling walks the keyspace in short steps, so the server goes on serving meanwhile."""

import threading
import time

import pytest
import redis

from helpers.fleet import NAMES, make_fleet
from helpers.resp import Raw

# lfu-log-factor 0: every access adds 1 to a key's counter (from 5, a new key's), so the test
# knows each counter; lfu-decay-time 0: no decay while the test runs.
LFU = [("maxmemory-policy", "allkeys-lfu"), ("lfu-log-factor", 0), ("lfu-decay-time", 0)]
# The hot keys' GETs, hottest first: one hot key at each owner.
HITS = [60, 45, 30]


def lfu_fleet(server_factory, config=(), args=(), timeout_ms=None):
    extra = {} if timeout_ms is None else {"timeout_ms": timeout_ms}
    return make_fleet(server_factory, config=[*LFU, *config], args=args, **extra)


def spread_keys(fleet, n=30):
    """`n` keys over every owner, each written at its owner; {key: owner}."""
    keys = [f"k:{i}" for i in range(n)]
    owners = fleet.owners(keys)
    assert set(owners) == set(NAMES), owners
    for key, owner in zip(keys, owners):
        assert fleet.client(owner).set(key, f"value of {key}") is True
    return dict(zip(keys, owners))


def heat(fleet, owned):
    """One key of each owner read HITS times at its owner (the rest never read); the hot keys,
    hottest first."""
    hot = []
    for owner, hits in zip(NAMES, HITS):
        key = next(k for k, o in owned.items() if o == owner)
        pipe = fleet.client(owner).pipeline(transaction=False)
        for _ in range(hits):
            pipe.get(key)
        pipe.execute()
        hot.append(key)
    return hot


def freq(fleet, owner, key):
    return fleet.client(owner).object("freq", key)


def hotkeys(client, *args):
    return [[k.decode(), f, n.decode()] for k, f, n in client.execute_command("SHARD.HOTKEYS", *args)]


def test_the_fleet_s_hottest_keys_from_any_node_with_their_owners(server_factory):
    fleet = lfu_fleet(server_factory)
    owned = spread_keys(fleet)
    hot = heat(fleet, owned)
    want = [[k, 5 + hits, owned[k]] for k, hits in zip(hot, HITS)]
    # The counters are the servers' own (OBJECT FREQ at the owner).
    assert [freq(fleet, o, k) for k, _, o in want] == [f for _, f, _ in want]
    before = {k: freq(fleet, o, k) for k, o in owned.items()}
    for n in NAMES:
        c = fleet.client(n)
        assert hotkeys(c, "COUNT", 3) == want, n
        # The default COUNT is 10: the hot keys first, then never-read keys (5 each, by name).
        top = hotkeys(c)
        assert len(top) == 10 and top[:3] == want, top
        cold = sorted(k for k in owned if k not in hot)[:7]
        assert top[3:] == [[k, 5, owned[k]] for k in cold]
        assert hotkeys(c, "count", 1) == want[:1]
        # COUNT beyond the keyspace: every key once, at its owner.
        every = hotkeys(c, "COUNT", 1000)
        assert sorted(k for k, _, _ in every) == sorted(owned)
        assert all(owned[k] == o for k, _, o in every)
    # Reading the counters touched nothing: neither the counters nor the keys' idle times.
    assert {k: freq(fleet, o, k) for k, o in owned.items()} == before


def test_local_is_one_node_s_own_top(server_factory):
    fleet = lfu_fleet(server_factory)
    owned = spread_keys(fleet)
    hot = heat(fleet, owned)
    for n, key, hits in zip(NAMES, hot, HITS):
        c = fleet.client(n)
        local = c.execute_command("SHARD.HOTKEYS", "LOCAL", "COUNT", 100)
        mine = sorted(k for k, o in owned.items() if o == n)
        assert sorted(k.decode() for k, _ in local) == mine
        assert [local[0][0].decode(), local[0][1]] == [key, 5 + hits]
        assert all(f == 5 for _, f in local[1:])
        assert len(c.execute_command("SHARD.HOTKEYS", "LOCAL")) == min(10, len(mine))


def test_in_the_client_s_database_and_under_resp3(server_factory):
    # With route-plain on too: the module's own commands are not routed.
    fleet = lfu_fleet(server_factory, args=["route-plain", "yes"])
    keys = [f"db3:{i}" for i in range(12)]
    owners = fleet.owners(keys)
    for key, owner in zip(keys, owners):
        c3 = fleet.client(owner, db=3)
        c3.set(key, "x")
        for _ in range(keys.index(key)):
            c3.get(key)
    # Database 0 holds none of them.
    assert fleet.client("n0").execute_command("SHARD.HOTKEYS") == []
    raw = Raw(fleet["n1"].port, protocol=3)
    assert raw.execute("SELECT", 3) == b"+OK\r\n"
    reply = raw.execute("SHARD.HOTKEYS", "COUNT", 2)
    # An array of [key, frequency, node] under RESP3 too (the order is the answer).
    k11, k10 = keys[11], keys[10]
    o11, o10 = owners[11], owners[10]
    assert reply == (
        b"*2\r\n"
        + b"*3\r\n$%d\r\n%s\r\n:16\r\n$2\r\n%s\r\n" % (len(k11), k11.encode(), o11.encode())
        + b"*3\r\n$%d\r\n%s\r\n:15\r\n$2\r\n%s\r\n" % (len(k10), k10.encode(), o10.encode())
    ), reply
    raw.close()


def test_refused_without_an_lfu_policy_naming_the_node(server_factory):
    plain = make_fleet(server_factory)
    for args in [(), ("LOCAL",)]:
        with pytest.raises(redis.ResponseError) as e:
            plain.client("n0").execute_command("SHARD.HOTKEYS", *args)
        msg = str(e.value)
        assert "maxmemory-policy" in msg and "allkeys-lfu" in msg and "noeviction" in msg, msg
    fleet = lfu_fleet(server_factory)
    spread_keys(fleet)
    fleet.client("n2").config_set("maxmemory-policy", "allkeys-lru")
    with pytest.raises(redis.ResponseError) as e:
        fleet.client("n0").execute_command("SHARD.HOTKEYS")
    assert "allkeys-lfu" in str(e.value) and "(at node n2)" in str(e.value), str(e.value)
    with pytest.raises(redis.ResponseError, match="set maxmemory-policy to allkeys-lfu"):
        fleet.client("n2").execute_command("SHARD.HOTKEYS")
    fleet.client("n2").config_set("maxmemory-policy", "volatile-lfu")
    assert len(hotkeys(fleet.client("n0"))) == 10


@pytest.mark.parametrize("args, says", [
    (("COUNT",), "COUNT needs a value"),
    (("COUNT", 0), "COUNT must be an integer from 1 to 1000, got '0'"),
    (("COUNT", "ten"), "COUNT must be an integer from 1 to 1000, got 'ten'"),
    (("COUNT", 1001), "COUNT must be an integer from 1 to 1000"),
    (("SAMPLES", -5), "SAMPLES must be an integer from 1 to 10000000, got '-5'"),
    (("COUNT", 1, "COUNT", 2), "COUNT is given twice"),
    (("COUNT", 1, "LOCAL"), "LOCAL must come first"),
    (("HOT",), "unknown option 'HOT' for 'shard.hotkeys'"),
])
def test_bad_arguments_refused(server_factory, args, says):
    fleet = lfu_fleet(server_factory)
    raw = fleet.raw("n0")
    reply = raw.execute("SHARD.HOTKEYS", *args)
    assert reply.startswith(b"-ERR ") and says.encode() in reply, reply
    raw.close()


def test_a_large_keyspace_is_sampled_in_short_steps(server_factory):
    # The walk stops at half of call-timeout-ms: 10 s, so that a loaded machine (Redis 7.0's
    # timers give a step at most every millisecond) still reads all 300000 keys.
    fleet = lfu_fleet(server_factory, config=[("enable-debug-command", "yes")], timeout_ms=10_000)
    c = fleet.client("n0")
    assert c.execute_command("DEBUG", "POPULATE", 300_000, "pop") == b"OK"
    hot = "pop:123456"
    for _ in range(40):
        c.get(hot)
    # Meanwhile another client's PINGs are answered between the sampling's steps.
    stop = threading.Event()
    slowest = [0.0]

    def ping():
        p = fleet.client("n0")
        while not stop.is_set():
            t = time.perf_counter()
            p.ping()
            slowest[0] = max(slowest[0], time.perf_counter() - t)

    pinger = threading.Thread(target=ping)
    pinger.start()
    try:
        t = time.perf_counter()
        top = c.execute_command("SHARD.HOTKEYS", "LOCAL", "COUNT", 1, "SAMPLES", 1_000_000)
        took = time.perf_counter() - t
    finally:
        stop.set()
        pinger.join()
    assert top == [[hot.encode(), 45]]
    # The walk of 300000 keys took many steps, none of which held the server long.
    assert took > 0.02, took
    assert slowest[0] < took / 3, (slowest[0], took)
    # SAMPLES bounds the keys read (a scan's step may give a few more: a bucket of the table).
    few = c.execute_command("SHARD.HOTKEYS", "LOCAL", "SAMPLES", 300, "COUNT", 1000)
    assert 300 <= len(few) < 400, len(few)
