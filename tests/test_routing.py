"""SHARD.CALL at the speed the server allows (issue 19): keys from the server's command table,
multi-key commands split over owners, local calls turned into the plain command by the command
filter (same replies, notifications and replication stream), pipelines that keep their order,
many clients at once, an owner killed under load, and MGET during a resharding."""

import random
import re
import signal
import threading
import time

import pytest
import redis

from helpers.calls import key_names, random_ops
from helpers.fleet import NAMES, make_fleet
from helpers.resp import Raw, assert_same_replies, call_ops
from helpers.server import PRIMARY, aof_command_names, info_shard, until, wait_in_sync


def multi_key_ops(rng, n, keys, tagged):
    """Random commands with several keys (over different owners), keys found by the command
    table (EVAL numkeys, XREAD STREAMS, OBJECT ENCODING), mixed with single-key ones."""

    def some(k=None):
        return rng.sample(keys, k or rng.randrange(1, 6))

    def value():
        return rng.choice([str(rng.randrange(100)), f"v{rng.randrange(1000)}", "", "\r\n\x00"])

    stream_ids = iter(range(1, 10**9))

    def tag_pair():
        t = rng.choice(tagged)
        return [f"{{{t}}}:a", f"{{{t}}}:b"]

    table = [
        (10, lambda: ("MGET", *some())),
        (6, lambda: ("MSET", *[x for k in some() for x in (k, value())])),
        (4, lambda: ("DEL", *some())),
        (3, lambda: ("UNLINK", *some())),
        (6, lambda: ("EXISTS", *some())),
        (3, lambda: ("TOUCH", *some())),
        (4, lambda: ("EVAL", "return redis.call('GET', KEYS[1])", 1, rng.choice(keys))),
        (4, lambda: ("EVAL", "redis.call('SET', KEYS[1], ARGV[1]); return redis.call('INCR', KEYS[2])",
                     2, *tag_pair(), value())),
        # Explicit, ever larger IDs: a `*` ID is the time, which differs between servers.
        (3, lambda: ("XADD", rng.choice(keys), f"{next(stream_ids)}-0", "f", value())),
        (3, lambda: ("XREAD", "COUNT", 2, "STREAMS", rng.choice(keys), "0")),
        (3, lambda: ("OBJECT", "ENCODING", rng.choice(keys))),
        (2, lambda: ("MSET", *[x for k in tag_pair() for x in (k, value())])),
        (2, lambda: ("MGET", *tag_pair())),
        (2, lambda: ("RENAME", *tag_pair())),
    ]
    weights = [w for w, _ in table]
    makers = [m for _, m in table]
    single = random_ops(rng, n, keys)
    out = []
    for op in single:
        out.append(op if rng.random() < 0.5 else rng.choices(makers, weights)[0]())
    return out


@pytest.mark.parametrize("protocol,count", [(2, 10_000), (3, 3_000)],
                         ids=["resp2-10000-ops", "resp3-3000-ops"])
def test_multi_key_and_movable_key_commands_equal_a_plain_server(server_factory, protocol, count):
    fleet = make_fleet(server_factory, timeout_ms=2000)
    fleet.ring(NAMES, hashtag="cluster")  # keys hashed by `{tag}` only: kept together on purpose
    plain = server_factory()
    rng = random.Random(19 + protocol)
    keys = key_names(200, f"m{protocol}")
    tagged = [f"t{i}" for i in range(12)]
    ops = multi_key_ops(rng, count, keys, tagged)

    # The keys really are spread: MGETs and MSETs cross owners.
    owners = set(fleet.owners([k for k in keys[:30]]))
    assert owners == set(NAMES), owners

    got = fleet.raw("n0", protocol=protocol).pipeline(call_ops(ops))
    want = Raw(plain.port, protocol=protocol).pipeline(ops)
    assert_same_replies(ops, got, want, f"RESP{protocol} through n0")
    kinds = {w[:1] for w in want}
    assert {b"+", b"-", b":", b"$", b"*"} <= kinds, kinds
    calls = fleet.calls("n0")
    assert calls["call_errors"] == 0 and calls["call_timeouts"] == 0, calls
    # Every node holds exactly what the plain server holds of its keys.
    total = sum(fleet.client(n).dbsize() for n in NAMES)
    assert total == plain.client().dbsize()


def test_commands_with_keys_on_several_nodes_are_gathered_or_refused_naming_them(server_factory):
    """A command that does not split, over keys of two owners, is gathered (test_gather.py)
    and replies as one server; inside MULTI or under SHARD.CALL WAIT it is refused, naming the
    owners; a blocking command waits at its owner."""
    fleet = make_fleet(server_factory)
    a, b = fleet.key_of("n1", prefix="a"), fleet.key_of("n2", prefix="b")
    c = fleet.client("n0")

    def call(*cmd):
        return c.execute_command("SHARD.CALL", *cmd)
    with pytest.raises(redis.ResponseError, match="no such key"):
        call("RENAME", a, b)
    assert call("MSETNX", a, 1, b, 2) == 1
    assert call("EVAL", "return redis.call('get', KEYS[1]) .. redis.call('get', KEYS[2])",
                2, a, b) == b"12"
    with pytest.raises(redis.ResponseError, match="wrong kind of value"):
        call("LMOVE", a, b, "LEFT", "RIGHT")
    with pytest.raises(redis.ResponseError,
                       match=r"live on different nodes \(n1, n2\).*SHARD.CALL WAIT"):
        call("WAIT", 1, 100, "RENAME", a, b)
    pipe = c.pipeline(transaction=True)
    pipe.execute_command("SHARD.CALL", "RENAME", a, b)
    replies = pipe.execute(raise_on_error=False)
    assert "live on different nodes (n1, n2)" in str(replies[0]), replies
    assert "cannot run inside MULTI or a script" in str(replies[0]), replies
    # A script with no key runs here, as one server runs it (since route-plain, 576e987).
    assert c.execute_command("SHARD.CALL", "EVAL", "return 1", 0) == 1
    # A blocking command waits at its owner (test_blocking.py): here until its timeout; with
    # WAIT it is refused.
    q = fleet.key_of("n1", prefix="q")
    for blocking in (("BLPOP", q, 1), ("XREAD", "BLOCK", 10, "STREAMS", q, "$")):
        assert c.execute_command("SHARD.CALL", *blocking) is None
        with pytest.raises(redis.ResponseError, match="can block"):
            c.execute_command("SHARD.CALL", "WAIT", 1, 10, *blocking)
    assert fleet.client("n1").get(a) == b"1" and fleet.client("n2").get(b) == b"2"
    assert sum(fleet.client(n).dbsize() for n in NAMES) == 2


def test_pipeline_of_1000_mixed_calls_keeps_its_order(server_factory):
    fleet = make_fleet(server_factory)
    keys = [f"order:{i}" for i in range(1000)]
    owners = fleet.owners(keys)
    assert {"n0", "n1", "n2"} <= set(owners)
    ops = []
    for i, k in enumerate(keys):
        ops.append(("SET", k, f"v{i}") if i % 2 == 0 else ("INCRBY", keys[i - 1] + ":n", i))
    for protocol in (2, 3):
        fleet.client("n0").execute_command("SHARD.CALL", "DEL", *[k + ":n" for k in keys])
        got = fleet.raw("n0", protocol=protocol).pipeline(call_ops(ops), chunk=1000)
        want = [b"+OK\r\n" if i % 2 == 0 else b":%d\r\n" % i for i in range(1000)]
        assert got == want
        back = fleet.raw("n0", protocol=protocol).pipeline(
            call_ops([("GET", k) for k in keys[::2]]), chunk=1000)
        assert back == [b"$%d\r\nv%d\r\n" % (len(str(i)) + 1, i) for i in range(0, 1000, 2)]


def test_200_clients_at_once_get_every_reply_right(server_factory):
    fleet = make_fleet(server_factory, timeout_ms=5000)
    errors = []

    def client(i):
        try:
            raw = fleet.raw(NAMES[i % 3], timeout=30)
            ops = []
            for j in range(25):
                k = f"c{i}:{j}"
                ops += [("SET", k, f"{i}-{j}"), ("INCR", f"{k}:n"), ("GET", k),
                        ("MGET", k, f"c{(i + 1) % 200}:none", f"{k}:n")]
            got = raw.pipeline(call_ops(ops), chunk=40)
            for j in range(25):
                v = f"{i}-{j}".encode()
                want = [b"+OK\r\n", b":1\r\n", b"$%d\r\n%s\r\n" % (len(v), v),
                        b"*3\r\n$%d\r\n%s\r\n$-1\r\n$1\r\n1\r\n" % (len(v), v)]
                if got[4 * j:4 * j + 4] != want:
                    errors.append((i, j, got[4 * j:4 * j + 4], want))
                    return
            raw.close()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append((i, repr(e)))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(200)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a client never got all its replies"
    assert not errors, errors[:3]
    assert sum(fleet.client(n).dbsize() for n in NAMES) == 200 * 25 * 2


def test_owner_killed_under_load_errors_name_it_for_its_keys_only_then_recovers(server_factory):
    fleet = make_fleet(server_factory, timeout_ms=1000)
    keys = [f"load:{i}" for i in range(300)]
    owners = dict(zip(keys, fleet.owners(keys)))
    fleet.client("n0").execute_command(
        "SHARD.CALL", "MSET", *[x for k in keys for x in (k, k)])
    victim = fleet["n2"]
    stop = threading.Event()
    seen = {"err": [], "wrong": []}
    rounds = [0]  # GETs of every key answered so far

    def load():
        raw = fleet.raw("n0", timeout=10)
        while not stop.is_set():
            got = raw.pipeline(call_ops([("GET", k) for k in keys]), chunk=100)
            rounds[0] += 1
            for k, reply in zip(keys, got):
                if reply.startswith(b"-"):
                    seen["err"].append((k, reply))
                elif reply != b"$%d\r\n%s\r\n" % (len(k), k.encode()) and not (
                        owners[k] == "n2" and reply == b"$-1\r\n"):  # n2 restarted empty
                    seen["wrong"].append((k, reply))

    t = threading.Thread(target=load)
    t.start()
    until(lambda: rounds[0] >= 2, "the load's first rounds")
    victim.stop(signal.SIGKILL)
    killed_at = rounds[0]
    until(lambda: rounds[0] >= killed_at + 3, "three rounds of the load with n2 down")
    # Its keys fail with an error naming it; every other key keeps being served.
    during = len(seen["err"])
    assert during > 0
    for k, reply in seen["err"]:
        assert owners[k] == "n2", (k, reply)
        assert re.search(rb"^-ERR shard.call: node n2 \(127\.0\.0\.1:%d\)" % victim.port, reply), reply
    # Back on the same port: its keys are served again within a few seconds.
    victim.start()
    victim.client().execute_command("SHARD.RING", "SET", "ketama", *fleet.ring_args(NAMES))
    victim.client().mset({k: k for k in keys if owners[k] == "n2"})
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        got = fleet.raw("n0").pipeline(call_ops([("GET", k) for k in keys]))
        if all(not r.startswith(b"-") for r in got):
            break
        time.sleep(0.1)
    else:
        pytest.fail("calls to n2's keys did not recover")
    stop.set()
    t.join(10)
    assert not t.is_alive()
    assert not seen["wrong"], seen["wrong"][:3]


def test_mget_and_counts_during_a_resharding_find_keys_at_the_previous_owner(server_factory):
    fleet = make_fleet(server_factory, names=NAMES, ring=("n0", "n1"))
    keys = [f"move:{i}" for i in range(200)]
    c = fleet.client("n0")
    c.execute_command("SHARD.CALL", "MSET", *[x for k in keys for x in (k, f"v-{k}")])
    fleet.ring(NAMES, verb="BEGIN")  # n2 joins; nothing copied yet
    moved = [k for k, o in zip(keys, fleet.owners(keys)) if o == "n2"]
    assert moved and fleet.client("n2").dbsize() == 0
    got = c.execute_command("SHARD.CALL", "MGET", *keys, "move:none")
    assert got == [f"v-{k}".encode() for k in keys] + [None]
    assert c.execute_command("SHARD.CALL", "EXISTS", *keys, "move:none") == len(keys)
    # A write during the resharding copies first; DEL removes at both owners.
    c.execute_command("SHARD.CALL", "MSET", moved[0], "new")
    assert fleet.client("n2").get(moved[0]) == b"new"
    assert c.execute_command("SHARD.CALL", "DEL", *moved[:5]) == 5
    assert c.execute_command("SHARD.CALL", "EXISTS", *moved[:5]) == 0
    assert sum(fleet.client(n).exists(*moved[:5]) for n in NAMES) == 0
    assert int(info_shard(c)["call_fallbacks"]) > 0


def test_local_calls_become_the_plain_command_notifications_replication_aof(server_factory):
    config = [("notify-keyspace-events", "KEA"), ("appendonly", "yes"),
              ("appendfsync", "always")]
    node = server_factory(module_args=["self", "n0"], config=[*config, *PRIMARY])
    plain = server_factory(config=config)
    replica = server_factory(module_args=["self", "n0"])
    c = node.client()
    c.execute_command("SHARD.RING", "SET", "ketama", "n0", f"127.0.0.1:{node.port}", 1)
    replica.client().replicaof("127.0.0.1", node.port)

    ops = [("SET", "a", "1"), ("INCR", "a"), ("HSET", "h", "f", "v", "g", "w"), ("EXPIRE", "h", 500),
           ("LPUSH", "l", "x", "y"), ("LPOP", "l"), ("MSET", "m1", "1", "m2", "2"),
           ("SADD", "s", "1"), ("DEL", "a", "m1"), ("GETDEL", "m2")]
    # The first call of each command teaches the module its table entry; from then on the
    # filter rewrites.
    for op in ops:
        c.execute_command("SHARD.CALL", *op)
    c.flushall()
    plain.client().flushall()

    def events(server, run):
        sub = server.client().pubsub()
        sub.psubscribe("__key*__:*")
        sub.get_message(timeout=1)
        run()
        got = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            m = sub.get_message(timeout=0.2)
            if m is None:
                if got:
                    break
                continue
            got.append((m["channel"], m["data"]))
        sub.close()
        return got

    before = {k: v for k, v in c.info("commandstats").items()}
    raw_node, raw_plain = Raw(node.port), Raw(plain.port)
    got_node, got_plain = [], []
    ev_node = events(node, lambda: got_node.extend(raw_node.pipeline(call_ops(ops))))
    ev_plain = events(plain, lambda: got_plain.extend(raw_plain.pipeline(ops)))
    assert got_node == got_plain
    assert ev_node == ev_plain and len(ev_node) >= len(ops)

    # Inside MULTI: queued as the plain commands, run at EXEC, one transaction.
    multi = [("MULTI",), *call_ops(ops), ("EXEC",)]
    assert Raw(node.port).pipeline(multi) == Raw(plain.port).pipeline(
        [("MULTI",), *ops, ("EXEC",)])

    after = c.info("commandstats")
    calls = after.get("cmdstat_shard.call", {}).get("calls", 0) - \
        before.get("cmdstat_shard.call", {}).get("calls", 0)
    assert calls == 0, "every local call was rewritten by the filter, none ran the module command"
    assert after["cmdstat_set"]["calls"] > before.get("cmdstat_set", {}).get("calls", 0)

    # The replica holds what the primary holds; the AOF has the plain commands only.
    wait_in_sync(c, replica.client())
    for k in c.keys("*"):
        assert replica.client().dump(k) == c.dump(k), k
    assert sorted(replica.client().keys("*")) == sorted(c.keys("*"))
    names = aof_command_names(node.workdir)
    assert b"shard.call" not in names
    # (GETDEL is propagated as DEL, by the server itself.)
    assert {b"set", b"incr", b"hset", b"lpush", b"mset", b"del", b"multi", b"exec"} <= set(names)
