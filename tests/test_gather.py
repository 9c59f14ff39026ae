"""Commands over keys of several owners that do not split (issue 43, "Any keys, any owners,
atomically"): gathered at the node the client is connected to (txn/coord/gather.rs) and run
there on copies in the scratch database (the server's last), the writes committed at the
owners as one transaction across them. Each kind of command (list, set, sorted set, string,
bitmap, hyperloglog, geo, stream, script, function) replies and leaves the keys as one plain
server does for the same commands, TTLs kept, the scratch database empty at every node, each
key at its owner only; through SHARD.CALL and through a route-plain client. Then clients
moving elements and a token between owners at once (nothing lost or doubled), and the
gathering node killed between the gather and the commit (nothing half-applied). Before the
gather every one of these commands was refused (`live on different nodes`)."""

import random
import signal
import threading

import pytest
import redis

from helpers.fleet import NAMES, make_fleet
from helpers.server import AOF, until
from helpers.txn import hold, held, no_lock_left

# The scratch database: the last of the default 16.
SCRATCH = 15
# How far a TTL may drift between the fleet and the plain server (ms).
TTL_SLACK = 3000
TTL = 100_000

FUNCTION = """#!lua name=gather
redis.register_function('mv', function(keys, args)
  local v = redis.call('lpop', keys[1])
  if v then redis.call('rpush', keys[2], v) end
  return v
end)"""

SCRIPT = ("redis.call('set', KEYS[2], redis.call('get', KEYS[1]) .. ARGV[1]); "
          "return redis.call('incr', KEYS[1])")

# name: (setup commands, the command); a, b, d stand for keys at n1, n2 and n0.
CASES = {
    "lmove": ([("RPUSH", "a", "x", "y", "z"), ("RPUSH", "b", "q"), ("PEXPIRE", "a", TTL)],
              ("LMOVE", "a", "b", "LEFT", "RIGHT")),
    "lmove-last": ([("RPUSH", "a", "x"), ("PEXPIRE", "b", TTL)],
                   ("LMOVE", "a", "b", "LEFT", "RIGHT")),
    "smove": ([("SADD", "a", "m1", "m2"), ("SADD", "b", "m3"), ("PEXPIRE", "b", TTL)],
              ("SMOVE", "a", "b", "m1")),
    "sunionstore": ([("SADD", "a", "1", "2"), ("SADD", "b", "2", "3", "x"),
                     ("SET", "d", "old", "PX", TTL)],
                    ("SUNIONSTORE", "d", "a", "b")),
    "zunionstore": ([("ZADD", "a", 1, "p", 2, "q"), ("ZADD", "b", 3, "q", 4, "r")],
                    ("ZUNIONSTORE", "d", 2, "a", "b", "WEIGHTS", 1, 2)),
    "rename": ([("SET", "a", "v", "PX", TTL), ("SET", "b", "old")], ("RENAME", "a", "b")),
    "renamenx": ([("SET", "a", "v"), ("SET", "b", "old")], ("RENAMENX", "a", "b")),
    "copy": ([("SET", "a", "v", "PX", TTL), ("SET", "b", "old")], ("COPY", "a", "b", "REPLACE")),
    # The pure moves are worked out without the scratch run (txn/coord/moves.rs): each answer.
    "rename-missing": ([("SET", "b", "old")], ("RENAME", "a", "b")),
    "renamenx-missing": ([], ("RENAMENX", "a", "b")),
    "renamenx-free": ([("RPUSH", "a", "x", "y"), ("PEXPIRE", "a", TTL)], ("RENAMENX", "a", "b")),
    "copy-kept": ([("SET", "a", "v"), ("SET", "b", "old", "PX", TTL)], ("COPY", "a", "b")),
    "copy-free": ([("SADD", "a", "m"), ("PEXPIRE", "a", TTL)], ("COPY", "a", "b")),
    "copy-missing": ([("SET", "b", "old")], ("COPY", "a", "b", "REPLACE")),
    "msetnx": ([], ("MSETNX", "a", "1", "b", "2", "d", "3")),
    "msetnx-refused": ([("SET", "b", "there")], ("MSETNX", "a", "1", "b", "2")),
    "bitop": ([("SET", "a", "\x0f\x01"), ("SET", "b", "\xf0")], ("BITOP", "OR", "d", "a", "b")),
    "pfmerge": ([("PFADD", "a", "x", "y"), ("PFADD", "b", "y", "z"), ("PEXPIRE", "a", TTL)],
                ("PFMERGE", "d", "a", "b")),
    "geosearchstore": ([("GEOADD", "a", 13.361389, 38.115556, "Palermo",
                         15.087269, 37.502669, "Catania")],
                       ("GEOSEARCHSTORE", "d", "a", "FROMLONLAT", 15, 37, "BYRADIUS", 200, "km",
                        "ASC")),
    "stream-rename": ([("XADD", "a", "1-1", "f", "v"), ("XADD", "a", "2-1", "g", "w"),
                       ("PEXPIRE", "a", TTL)],
                      ("RENAME", "a", "b")),
    "eval": ([("SET", "a", "5", "PX", TTL)], ("EVAL", SCRIPT, 2, "a", "b", "!")),
    "fcall": ([("RPUSH", "a", "p", "q"), ("RPUSH", "b", "r")], ("FCALL", "mv", 2, "a", "b")),
    "wrongtype": ([("SET", "a", "s"), ("RPUSH", "b", "l")], ("LMOVE", "a", "b", "LEFT", "LEFT")),
}


def gather_fleet(server_factory, config=()):
    return make_fleet(server_factory, timeout_ms=1000, args=["route-plain", "yes"],
                      config=config)


def local(fleet, name, db=0):
    """A client of one node's own keyspace (never routed)."""
    c = fleet.client(name, db=db, single_connection_client=True)
    assert c.execute_command("SHARD.CLUSTER", "INTERNAL") == b"OK"
    return c


def content(c, run, k):
    """A key as a plain read shows it: its type and value."""
    t = run(c, "TYPE", k)
    t = t.decode() if isinstance(t, bytes) else t
    if t == "none":
        return None
    read = {
        "string": lambda: run(c, "GET", k),
        "list": lambda: run(c, "LRANGE", k, 0, -1),
        "set": lambda: sorted(run(c, "SMEMBERS", k)),
        "zset": lambda: run(c, "ZRANGE", k, 0, -1, "WITHSCORES"),
        "hash": lambda: sorted(run(c, "HGETALL", k)),
        "stream": lambda: run(c, "XRANGE", k, "-", "+"),
    }[t]
    return t, read()


def bare(c):
    """The client with redis-py's reply conversions off: replies as the server sends them."""
    c.response_callbacks.clear()
    return c


def ttl_kind(ms):
    return "none" if ms < 0 else "ttl"


def via_call(c, *args):
    return c.execute_command("SHARD.CALL", *args)


def via_plain(c, *args):
    return c.execute_command(*args)


def outcome(run, *args):
    try:
        return run(*args)
    except redis.ResponseError as e:
        return ("error", str(e).split(" ")[0])


def assert_tidy(fleet, placed):
    """Each key at its owner only, and the scratch database empty at every node."""
    for k, owner in placed.items():
        for n in NAMES:
            if n != owner:
                assert local(fleet, n).exists(k) == 0, (k, owner, n)
    for n in NAMES:
        assert local(fleet, n, db=SCRATCH).dbsize() == 0, n


@pytest.mark.parametrize("how", ["call", "plain"])
def test_each_kind_answers_as_one_server(server_factory, how):
    fleet = gather_fleet(server_factory)
    one = bare(server_factory().client())
    run = via_call if how == "call" else via_plain
    c0 = bare(fleet.client("n0"))
    assert run(c0, "FUNCTION", "LOAD", FUNCTION) == b"gather"
    assert one.execute_command("FUNCTION", "LOAD", FUNCTION) == b"gather"
    for i, (name, (setup, command)) in enumerate(CASES.items()):
        names = {"a": fleet.key_of("n1", prefix=f"a{i}"), "b": fleet.key_of("n2", prefix=f"b{i}"),
                 "d": fleet.key_of("n0", prefix=f"d{i}")}
        owners = {names["a"]: "n1", names["b"]: "n2", names["d"]: "n0"}

        def real(args):
            return [names.get(a, a) if isinstance(a, str) else a for a in args]
        for s in setup:
            run(c0, *real(s))
            one.execute_command(*real(s))
        got = outcome(run, c0, *real(command))
        want = outcome(one.execute_command, *real(command))
        assert got == want, (name, got, want)
        for k in names.values():
            # Read through another node than the one that gathered.
            reader = bare(fleet.client("n1"))
            assert content(reader, run, k) == content(one, via_plain, k), (name, k)
            fleet_ttl, one_ttl = run(reader, "PTTL", k), one.execute_command("PTTL", k)
            assert ttl_kind(fleet_ttl) == ttl_kind(one_ttl), (name, k, fleet_ttl, one_ttl)
            if one_ttl > 0:
                assert abs(fleet_ttl - one_ttl) < TTL_SLACK, (name, k, fleet_ttl, one_ttl)
        assert_tidy(fleet, owners)


def test_a_gathered_command_in_the_clients_database(server_factory):
    fleet = gather_fleet(server_factory)
    c = fleet.client("n0", db=3)
    a, b = fleet.key_of("n1", prefix="sel"), fleet.key_of("n2", prefix="sel")
    c.set(a, "in-3", px=TTL)
    assert c.rename(a, b) is True
    assert local(fleet, "n2", db=3).get(b) == b"in-3"
    assert 0 < local(fleet, "n2", db=3).pttl(b) <= TTL
    assert local(fleet, "n2", db=0).exists(b) == 0
    assert local(fleet, "n1", db=3).exists(a) == 0
    # The scratch database itself cannot gather.
    s = fleet.client("n0", db=SCRATCH)
    with pytest.raises(redis.ResponseError, match="scratch database"):
        s.rename(a, b)


def test_a_script_writing_an_undeclared_key_is_refused_and_writes_nothing(server_factory):
    fleet = gather_fleet(server_factory)
    c = fleet.client("n0")
    a, b = fleet.key_of("n1", prefix="u"), fleet.key_of("n2", prefix="u")
    c.set(a, "1")
    with pytest.raises(redis.ResponseError, match="did not declare"):
        c.eval("redis.call('set', KEYS[2], '2'); redis.call('set', 'elsewhere', '3')", 2, a, b)
    assert c.get(b) is None and c.get(a) == b"1"
    for n in NAMES:
        assert local(fleet, n, db=SCRATCH).dbsize() == 0


def test_concurrent_moves_between_owners_lose_and_double_nothing(server_factory):
    fleet = gather_fleet(server_factory)
    lists = [fleet.key_of(n, prefix="list") for n in NAMES]
    tokens = [fleet.key_of(n, prefix="token") for n in NAMES]
    c = fleet.client("n0")
    elements = [f"e{i}" for i in range(60)]
    for i, lst in enumerate(lists):
        c.rpush(lst, *elements[i::3])
    c.set(tokens[0], "the-token")
    errors, done = [], []

    def work(seed):
        rnd = random.Random(seed)
        try:
            for _ in range(40):
                node = rnd.choice(NAMES)
                cl = fleet.client(node)
                run = rnd.choice([via_call, via_plain])
                src, dst = rnd.sample(range(3), 2)
                try:
                    if rnd.random() < 0.5:
                        run(cl, "LMOVE", lists[src], lists[dst], "LEFT", "RIGHT")
                    else:
                        run(cl, "RENAME", tokens[src], tokens[dst])
                    done.append(1)
                except redis.ResponseError as e:
                    if not str(e).startswith(("no such key", "TRYAGAIN")):
                        raise
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert len(done) > 100, len(done)
    seen = [e for lst in lists for e in c.lrange(lst, 0, -1)]
    assert sorted(seen) == sorted(e.encode() for e in elements), "each element once"
    held = [t for t in tokens if c.exists(t)]
    assert len(held) == 1 and c.get(held[0]) == b"the-token"
    for lst, n in zip(lists, NAMES):
        for other in NAMES:
            if other != n:
                assert local(fleet, other).exists(lst) == 0
    for n in NAMES:
        assert local(fleet, n, db=SCRATCH).dbsize() == 0


@pytest.mark.parametrize("step,applied", [("prepared", False), ("decided", True),
                                          ("kill-after-commit", True)])
def test_the_gathering_node_killed_before_the_commit_leaves_nothing_half_applied(
        server_factory, step, applied):
    """n0 gathers RENAME a b (a at n1 with a TTL, b at n2) and is killed (SIGKILL) after the
    owners prepared, after the decision, or as its first COMMIT leaves; restarted from its AOF,
    the writes are at both owners (decided) or at neither (presumed abort)."""
    fleet = gather_fleet(server_factory, config=[("enable-debug-command", "yes"), *AOF])
    for n in fleet:
        fleet.client(n).config_set("shard.txn-lock-ms", 3000)
    a, b = fleet.key_of("n1", prefix="acct"), fleet.key_of("n2", prefix="acct")
    c = fleet.client("n0")
    c.set(a, "moving", px=TTL)
    c.rpush(b, "old")
    hold(c, step)
    result = {}

    def rename():
        try:
            result["r"] = fleet.client("n0", socket_timeout=60).rename(a, b)
        except (redis.RedisError, OSError) as e:
            result["r"] = e
    t = threading.Thread(target=rename, daemon=True)
    t.start()
    if step == "kill-after-commit":
        until(lambda: not fleet["n0"].alive(), "n0 killed itself")
    else:
        until(lambda: held(c) == 1,
              "the gather waits at the hold")
        fleet["n0"].stop(signal.SIGKILL)
    t.join(60)
    assert isinstance(result["r"], redis.ConnectionError), result
    fleet["n0"].start()
    until(lambda: no_lock_left(fleet), "every part applied or dropped", timeout=30)
    n1, n2 = local(fleet, "n1"), local(fleet, "n2")
    if applied:
        assert n1.exists(a) == 0 and n2.get(b) == b"moving"
        assert 0 < n2.pttl(b) <= TTL
    else:
        assert n1.get(a) == b"moving" and n2.lrange(b, 0, -1) == [b"old"]
        assert 0 < n1.pttl(a) <= TTL
    for n in NAMES:
        assert local(fleet, n, db=SCRATCH).dbsize() == 0


def test_the_gathering_node_killed_after_the_read_writes_nothing(server_factory):
    """n0 gathers RENAME a b (a at n1, b at n2): the keys are watched and read at their owners
    (`SHARD.TXN READ`), and n0 is killed before any PREPARE: nothing is written, nothing stays
    locked, the owners' watches go (their ttl), and the keys take writes and a RENAME again."""
    fleet = gather_fleet(server_factory, config=[("enable-debug-command", "yes"), *AOF])
    a, b = fleet.key_of("n1", prefix="rd"), fleet.key_of("n2", prefix="rd")
    c = fleet.client("n0")
    c.set(a, "moving", px=TTL)
    c.set(b, "old")
    hold(c, "read")
    result = {}

    def rename():
        try:
            result["r"] = fleet.client("n0", socket_timeout=60).rename(a, b)
        except (redis.RedisError, OSError) as e:
            result["r"] = e
    t = threading.Thread(target=rename, daemon=True)
    t.start()
    until(lambda: held(c) == 1,
          "the gather waits after its read")
    fleet["n0"].stop(signal.SIGKILL)
    t.join(60)
    assert isinstance(result["r"], redis.ConnectionError), result
    n1, n2 = local(fleet, "n1"), local(fleet, "n2")
    assert n1.get(a) == b"moving" and n2.get(b) == b"old"
    assert 0 < n1.pttl(a) <= TTL
    fleet["n0"].start()
    until(lambda: no_lock_left(fleet), "nothing locked", timeout=30)
    # The keys are free: a plain write at the owner, and the RENAME again through n0.
    assert n2.set(b, "newer") is True
    c = fleet.client("n0")
    assert c.rename(a, b) is True
    assert n1.exists(a) == 0 and n2.get(b) == b"moving" and 0 < n2.pttl(b) <= TTL


@pytest.mark.parametrize("atomic", [False, True], ids=["split", "atomic-mset"])
def test_mset_over_three_owners_with_one_down(server_factory, atomic):
    """With `shard.atomic-mset yes` an MSET over keys of several owners is all or nothing: an
    owner down fails it and no key is written; the split MSET (the default) writes the keys
    of the owners it reached, as twemproxy's split does."""
    fleet = gather_fleet(server_factory)
    if atomic:
        for n in NAMES:
            fleet.client(n).config_set("shard.atomic-mset", "yes")
    keys = {n: fleet.key_of(n, prefix="ms") for n in NAMES}
    c = fleet.client("n0")
    assert c.execute_command("SHARD.CALL", "MSET", *[x for k in keys.values() for x in (k, "old")])
    fleet["n2"].stop(signal.SIGKILL)
    with pytest.raises(redis.exceptions.RedisError):
        c.execute_command("SHARD.CALL", "MSET", *[x for k in keys.values() for x in (k, "new")])
    got = [local(fleet, n).get(keys[n]) for n in ("n0", "n1")]
    assert got == ([b"old", b"old"] if atomic else [b"new", b"new"]), got
    for n in ("n0", "n1"):
        assert local(fleet, n, db=SCRATCH).dbsize() == 0


def test_atomic_mset_writes_every_owner(server_factory):
    fleet = gather_fleet(server_factory)
    for n in NAMES:
        fleet.client(n).config_set("shard.atomic-mset", "yes")
    keys = [fleet.key_of(n, prefix="am") for n in NAMES]
    c = fleet.client("n1")
    assert c.execute_command("SHARD.CALL", "MSET", *[x for k in keys for x in (k, k)]) == b"OK"
    assert c.execute_command("SHARD.CALL", "MGET", *keys) == [k.encode() for k in keys]
    for n, k in zip(NAMES, keys):
        assert local(fleet, n).get(k) == k.encode()
    with pytest.raises(redis.ResponseError, match="atomic-mset is yes or no"):
        c.config_set("shard.atomic-mset", "sometimes")
