"""No crash, whatever comes in: tens of thousands of random and malformed SHARD.* commands
against a real server (random arity, random bytes, huge and negative numbers, unicode, empty
strings, long arguments), over RESP2 and RESP3 connections. Errors are expected replies; what
must not happen: a dropped connection, a dead server, a panic or an internal error in the log
or in a reply, or damage to data written before.

The generator is seeded, so a failure reproduces: the message names the seed and the batch.
"""

import random
import re
import time

import pytest

from helpers.reshard import wait_job

SEED = 20240808
COMMANDS = 24_000
BATCH = 200
# Hard bound on the random phase; the whole test stays under a minute.
DEADLINE_S = 45

# Canary keys: written before, checked after. The generator never produces an argument that
# contains "canary", so no random command (SHARD.CALL DEL, EXPIRE, ...) can touch them.
CANARY = "canary"

# Node addresses the random rings use: nothing listens on port 1 or 2, so forwarding and
# MIGRATE fail at once instead of waiting on a stranger's service. `self` is node "a", the
# only one at this server's own address (a COPY job's MIGRATE to its own server would wait for
# itself until its timeout).
SAFE_ADDRESSES = ["127.0.0.1:1", "[::1]:2", "localhost:1"]

LAYOUTS = ["snowflake", "instagram", "sonyflake", "shardjs", "custom", "SHARDJS", "bogus"]
ALGOS = ["ketama", "jedis", "jedis-murmur", "redis-shard", "slots", "cluster", "KETAMA", "nope"]
HASHTAGS = ["cluster", "jedis", "greedy", "none", "bad"]
KEYWORDS = {
    "SHARD.GENKEY": ["TYPE", "COUNT", "count", "type"],
    "SHARD.DECODE": ["LAYOUT", "EPOCH"] + LAYOUTS,
    "SHARD.ENCODE": ["LAYOUT", "EPOCH", "TIME", "NODE", "SEQ", "TYPE"] + LAYOUTS,
    "SHARD.WHEREIS": [],
    "SHARD.LOCATE": [],
    "SHARD.ADVANCE": [],
    "SHARD.RESHARD": ["COPY", "STATUS", "STOP", "BATCH", "TIMEOUT", "REPLACE"],
    "SHARD.RING": ["SET", "GET", "BEGIN", "COMMIT", "ABORT", "HASHTAG"] + ALGOS + HASHTAGS,
}
# Commands SHARD.CALL is asked to route; none of these can allocate without bound from a
# number (no SETRANGE, SETBIT, ...). Since issue 43 SHARD.CALL answers the keyless commands of
# the data for the fleet (DBSIZE, KEYS, SCAN...), runs PING and scripts without keys here and
# refuses the other keyless ones (SHUTDOWN, DEBUG, CLIENT, CONFIG, SWAPDB...: a CLIENT KILL of
# the calling client inside the module's call would crash Redis 7.0), and a blocking command
# waits at its owner for as long as the client asks (tests/test_route_plain.py,
# test_blocking.py): FLUSHALL/FLUSHDB (which would empty the canaries) and BLPOP ... 0 (which
# would wait for ever) are left out here, as a client's own would be.
CALL_COMMANDS = [
    "GET", "SET", "INCR", "INCRBY", "INCRBYFLOAT", "APPEND", "STRLEN", "GETRANGE", "GETDEL",
    "GETEX", "SETNX", "HSET", "HGET", "HINCRBY", "HGETALL", "LPUSH", "RPUSH", "LRANGE", "LPOP",
    "SADD", "SMEMBERS", "ZADD", "ZRANGE", "ZINCRBY", "XADD", "XLEN", "PFADD", "EXISTS", "TYPE",
    "TTL", "PTTL", "EXPIRE", "PERSIST", "DEL", "UNLINK", "DUMP", "MGET", "MSET", "OBJECT",
    "SORT", "RENAME", "COPY", "MOVE", "KEYS", "DBSIZE", "SCAN", "RANDOMKEY",
    "PING", "SELECT", "SWAPDB", "EVAL", "MULTI", "EXEC", "SUBSCRIBE", "CLIENT", "CONFIG", "DEBUG",
    "SHUTDOWN", "SHARD.CALL", "SHARD.GENKEY", "SHARD.RING", "get", "sEt", "NOSUCHCMD", "",
]
UNICODE = ["é", "日本語", "🙂", "\u202e", "e\u0301", "\ufeff", "ß", "Ω", "\u0000", "𝕏" * 40]
VALID_KEYS = [
    "2124290981632159744", "1jyVFw3401", "1jyVFw3401-avatar", "00000000000", "zzzzzzzzzzz",
    "2Wb1XJnCmE0", "9223372036854775807", "0", "1",
]
NUMBERS = [
    0, 1, -1, 2, 7, 100, 3843, 3844, 4095, 65535, 65536, 100_000, 100_001, 600_000, 10_000,
    86_400_000, 1_288_834_974_657, 1_700_000_000_000, 253_402_300_799_999, 2**31, 2**32,
    2**53, 2**62, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 10**30, -(10**30),
]
NUMBER_TEXTS = ["+5", " 5", "5 ", "0x10", "1e3", "1.5", "-0", "00", "٣", "NaN", "inf", "-", "--1"]
ADDRESS_LIKE = re.compile(rb"^(\[[^\]]*\]|[^:\s\[\]]+):0*[1-9][0-9]{0,4}$")


def rand_bytes(rng, n):
    return bytes(rng.randrange(256) for _ in range(n))


def number(rng):
    r = rng.random()
    if r < 0.45:
        return str(rng.choice(NUMBERS)).encode()
    if r < 0.6:
        return rng.choice(NUMBER_TEXTS).encode()
    if r < 0.8:
        return str(rng.randrange(-(10**6), 10**6)).encode()
    return str(rng.randrange(-(2**70), 2**70)).encode()


def arg(rng, words, port):
    """One argument: a keyword of the command, a number, random bytes, unicode, empty, ..."""
    r = rng.random()
    if r < 0.28 and words:
        w = rng.choice(words)
        return (w.lower() if rng.random() < 0.2 else w).encode()
    if r < 0.52:
        return number(rng)
    if r < 0.66:
        return rand_bytes(rng, rng.choice([1, 2, 5, 11, 20, 64]))
    if r < 0.74:
        return "".join(rng.choice(UNICODE) for _ in range(rng.randint(1, 4))).encode()
    if r < 0.79:
        return b""
    if r < 0.89:
        return rng.choice(VALID_KEYS).encode()
    if r < 0.93:
        return rng.choice(SAFE_ADDRESSES).encode()
    if r < 0.995:
        return rng.choice([b"k:", b"x", b"{tag}"]) + rand_bytes(rng, rng.randint(0, 8))
    # A long argument now and then: 4 KiB to 512 KiB.
    return rand_bytes(rng, 1) * rng.choice([4096, 65536, 524288])


def arity(rng):
    r = rng.random()
    if r < 0.8:
        return rng.randint(0, 6)
    if r < 0.97:
        return rng.randint(7, 30)
    return rng.randint(31, 150)


def valid_ring_args(rng, port):
    """SHARD.RING SET/BEGIN arguments that are accepted: a random algo and node set."""
    args = [rng.choice(ALGOS[:5]).encode()]
    if rng.random() < 0.3:
        args += [b"HASHTAG", rng.choice(HASHTAGS[:4]).encode()]
    names = rng.sample(["a", "b", "c", "d", "e", "n5", "é", "{x}"], rng.randint(1, 5))
    for name in names:
        address = f"127.0.0.1:{port}" if name == "a" else rng.choice(SAFE_ADDRESSES)
        weight = str(rng.choice([1, 1, 2, 3, 10]))
        args += [name.encode(), address.encode(), weight.encode()]
    return args


def random_ring_args(rng, port):
    """SHARD.RING SET/BEGIN: half accepted as they are, half with odd or mangled parts."""
    if rng.random() < 0.5:
        return valid_ring_args(rng, port)
    args = [rng.choice(ALGOS).encode()]
    if rng.random() < 0.3:
        args += [b"HASHTAG", rng.choice(HASHTAGS).encode()]
    for i in range(rng.choice([0, 1, 1, 2, 3, 5, 12, 40])):
        name = rng.choice(["a", "b", "c", f"n{i}", f"n{i}", "a", "é", "x y", "#", ""])
        if name == "a":
            address = f"127.0.0.1:{port}"
        else:
            address = rng.choice(SAFE_ADDRESSES + ["h:0", "h:65536", "[::1", "::1:5", "", "a:b"])
        weight = rng.choice(["1", "1", "1", "2", "3", "1000", "0", "1001", "-1", "999999999999"])
        args += [name.encode(), address.encode(), weight.encode()]
    for _ in range(rng.choice([0, 0, 0, 0, 0, 1, 2])):
        op = rng.random()
        if op < 0.4 and args:
            del args[rng.randrange(len(args))]
        elif op < 0.8:
            args.insert(rng.randint(0, len(args)), arg(rng, KEYWORDS["SHARD.RING"], port))
        elif args:
            args[rng.randrange(len(args))] = arg(rng, [], port)
    return args


def plausible_time(rng):
    return str(rng.choice([
        1_700_000_000_000 + rng.randrange(10**9), 1_288_834_974_657, 1_409_529_600_000,
        1_325_404_800_000 + rng.randrange(10**12), 0, 253_402_300_799_999, 2**63 - 1,
    ])).encode()


def structured(rng, name, port):
    """Arguments that are mostly well-formed, so the work behind the parser runs too."""
    if name == "SHARD.GENKEY":
        out = []
        for opt in rng.sample(["TYPE", "COUNT"], rng.randint(0, 2)):
            # COUNT 100000 (2 MB of reply) stays rare, so the test stays fast.
            value = (str(rng.choice([0, 1, 2, 5, 3843, 100, 100_000])) if opt == "TYPE"
                     else str(rng.choice([1, 2, 50, 4096, 5000, 100_001, 0, -1])
                              if rng.random() < 0.99 else 100_000))
            out += [opt.encode(), value.encode()]
        return out
    if name == "SHARD.DECODE":
        out = [rng.choice([rng.choice(VALID_KEYS).encode(), number(rng), arg(rng, [], port)])]
        if rng.random() < 0.5:
            out += [b"LAYOUT", rng.choice(LAYOUTS[:5]).encode()]
        if rng.random() < 0.3:
            out += [b"EPOCH", rng.choice([plausible_time(rng), number(rng)])]
        return out
    if name == "SHARD.ENCODE":
        out = [b"TIME", plausible_time(rng) if rng.random() < 0.8 else number(rng)]
        for opt in rng.sample(["LAYOUT", "EPOCH", "NODE", "SEQ", "TYPE"], rng.randint(0, 5)):
            if opt == "LAYOUT":
                value = rng.choice(LAYOUTS[:5]).encode()
            elif opt == "EPOCH":
                value = rng.choice([b"0", b"1288834974657", plausible_time(rng), number(rng)])
            else:
                value = str(rng.choice([0, 1, 2, 3, 255, 1023, 3843, 4095, 65535, 2**40])).encode()
            out += [opt.encode(), value]
        if rng.random() < 0.1:
            rng.shuffle(out)
        return out
    if name in ("SHARD.WHEREIS", "SHARD.LOCATE", "SHARD.ADVANCE"):
        return [arg(rng, [], port)]
    return None


def command(rng, port):
    """One random SHARD.* command, as a list of bytes."""
    name = rng.choices(
        ["SHARD.GENKEY", "SHARD.DECODE", "SHARD.ENCODE", "SHARD.WHEREIS", "SHARD.LOCATE",
         "SHARD.CALL", "SHARD.ADVANCE", "SHARD.RING", "SHARD.RESHARD"],
        weights=[12, 14, 14, 8, 8, 18, 3, 15, 8],
    )[0]
    words = KEYWORDS.get(name, [])
    spelled = name if rng.random() < 0.8 else "".join(
        c.lower() if rng.random() < 0.5 else c for c in name
    )
    out = [spelled.encode()]
    well_formed = structured(rng, name, port) if rng.random() < 0.6 else None
    if well_formed is not None:
        out += well_formed
    elif name == "SHARD.CALL":
        if rng.random() < 0.9:
            out.append(rng.choice(CALL_COMMANDS).encode())
            if rng.random() < 0.9:
                out.append(rng.choice([b"k:%d" % rng.randrange(50), b"{k}x", b""])
                           if rng.random() < 0.7 else arg(rng, [], port))
        n = rng.choice([0, 1, 1, 2, 3]) if rng.random() < 0.7 else arity(rng) // 2
        out += [arg(rng, [], port) for _ in range(n)]
    elif name == "SHARD.RING":
        sub = rng.choices(["SET", "BEGIN", "GET", "COMMIT", "ABORT", None],
                          weights=[30, 15, 10, 15, 15, 15])[0]
        if sub in ("SET", "BEGIN"):
            out += [sub.encode()] + random_ring_args(rng, port)
        elif sub is not None:
            out.append(sub.encode() if rng.random() < 0.8 else sub.lower().encode())
            if rng.random() < 0.2:
                out += [arg(rng, words, port) for _ in range(arity(rng))]
        else:
            out += [arg(rng, words, port) for _ in range(arity(rng))]
    elif name == "SHARD.RESHARD":
        # CLEANUP deletes the keys a random ring gives to other nodes: it runs only at the
        # end, under the ring where this server owns everything.
        sub = rng.choices(["COPY", "STATUS", "STOP", None], weights=[30, 25, 25, 20])[0]
        if sub is not None:
            out.append(sub.encode())
        if sub is None or rng.random() < 0.4:
            out += [arg(rng, words, port) for _ in range(arity(rng))]
    else:
        out += [arg(rng, words, port) for _ in range(arity(rng))]
    return [safe(a) for a in out]


def safe(a):
    """Keeps random arguments away from the canaries and from live services."""
    if CANARY.encode() in a.lower():
        return b"x"
    if ADDRESS_LIKE.match(a) and a.decode(errors="replace") not in SAFE_ADDRESSES:
        host = a.rsplit(b":", 1)[0]
        if host not in (b"127.0.0.1",):
            return b"x"
    return a


def flat(reply):
    """Every text in a reply, flattened, for the 'internal error' check."""
    if isinstance(reply, (list, tuple, set)):
        for x in reply:
            yield from flat(x)
    elif isinstance(reply, dict):
        for k, v in reply.items():
            yield from flat(k)
            yield from flat(v)
    elif isinstance(reply, bytes):
        yield reply.decode(errors="replace")
    else:
        yield str(reply)


def write_canaries(c):
    c.set(f"{CANARY}:str", "plain value")
    c.set(f"{CANARY}:bin", bytes(range(256)))
    c.hset(f"{CANARY}:hash", mapping={"f1": "v1", "f2": "2"})
    c.rpush(f"{CANARY}:list", "a", "b", "c")
    c.sadd(f"{CANARY}:set", "x", "y")
    c.zadd(f"{CANARY}:zset", {"m1": 1.5, "m2": -3})
    c.xadd(f"{CANARY}:stream", {"k": "v"})
    for i in range(50):
        c.set(f"{CANARY}:{{t{i % 7}}}:{i}", f"value {i}")
    return {k: c.dump(k) for k in sorted(c.scan_iter(match=f"{CANARY}:*"))}


def genkey_retry(c, timeout=10):
    """GENKEY, waiting out the drift limit that random COUNT calls may have reached."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return int(c.execute_command("SHARD.GENKEY"))
        except Exception as e:  # noqa: BLE001 - the drift refusal is an ordinary error reply
            if "drift" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@pytest.mark.slow
def test_random_and_malformed_commands(server_factory):
    started = time.monotonic()
    srv = server_factory(module_args=["self", "a", "call-timeout-ms", "200"])
    port = srv.port
    admin = srv.client()
    home_ring = ["SHARD.RING", "SET", "ketama", "a", f"127.0.0.1:{port}", "1"]
    assert admin.execute_command(*home_ring) in (b"OK", "OK", True)
    before = write_canaries(admin)
    assert len(before) == 57
    first_key = genkey_retry(admin)

    rng = random.Random(SEED)
    clients = [srv.client(protocol=2), srv.client(protocol=3)]
    ids = [c.client_id() for c in clients]
    sent = errors = 0
    batch_no = 0
    while sent < COMMANDS:
        assert time.monotonic() - started < DEADLINE_S, f"too slow: {sent} commands sent"
        c = clients[batch_no % 2]
        cmds = [command(rng, port) for _ in range(BATCH)]
        if rng.random() < 0.3:
            # Back to the ring where this server owns every key, so SHARD.CALL runs locally.
            cmds[rng.randrange(BATCH)] = [x.encode() for x in home_ring]
        pipe = c.pipeline(transaction=False)
        for cmd in cmds:
            pipe.execute_command(*cmd)
        replies = pipe.execute(raise_on_error=False)
        assert len(replies) == len(cmds)
        for cmd, reply in zip(cmds, replies):
            if isinstance(reply, Exception):
                errors += 1
            for text in flat(reply if not isinstance(reply, Exception) else str(reply)):
                assert "internal error" not in text.lower(), (
                    f"seed {SEED} batch {batch_no}: {cmd[:8]!r} -> {text[:300]}"
                )
        assert srv.alive(), f"redis-server died (seed {SEED} batch {batch_no}):\n{srv.log()[-3000:]}"
        sent += len(cmds)
        batch_no += 1
    # The same connections, never re-opened: nothing dropped them.
    assert [c.client_id() for c in clients] == ids
    assert 0 < errors < sent, (errors, sent)

    # Back to the home ring: stop a copy, close a resharding, then check the canaries.
    try:
        admin.execute_command("SHARD.RESHARD", "STOP")
    except Exception:  # noqa: BLE001 - "no resharding job is running"
        pass
    wait_job(admin)
    for closing in ("ABORT", "COMMIT"):
        try:
            admin.execute_command("SHARD.RING", closing)
        except Exception:  # noqa: BLE001 - nothing open
            pass
    admin.execute_command(*home_ring)
    after = {k: admin.dump(k) for k in sorted(admin.scan_iter(match=f"{CANARY}:*"))}
    assert after == before
    # CLEANUP under the home ring: this server owns every key, so nothing is deleted.
    admin.execute_command("SHARD.RESHARD", "CLEANUP", "BATCH", "7")
    status = wait_job(admin)
    assert status["state"] == b"done" and status["deleted"] == 0, status
    assert {k: admin.dump(k) for k in before} == before
    assert admin.execute_command("SHARD.CALL", "GET", f"{CANARY}:str") == b"plain value"
    assert admin.execute_command("SHARD.WHEREIS", f"{CANARY}:str") == b"a"
    # The generator still goes forward.
    assert genkey_retry(admin) > first_key
    assert admin.ping()

    log = srv.log()
    assert not re.search(r"panic|internal error", log, re.IGNORECASE), log[-3000:]
    elapsed = time.monotonic() - started
    print(f"{sent} random commands ({errors} error replies) in {elapsed:.1f}s")
    assert elapsed < 60


@pytest.mark.parametrize("protocol", [2, 3])
def test_each_command_with_no_and_junk_arguments(server, protocol):
    """Every SHARD.* command and subcommand with no argument, and with a few junk ones."""
    c = server.client(protocol=protocol)
    names = [
        ["SHARD.GENKEY"], ["SHARD.DECODE"], ["SHARD.ENCODE"], ["SHARD.WHEREIS"], ["SHARD.LOCATE"],
        ["SHARD.CALL"], ["SHARD.ADVANCE"], ["SHARD.RING"], ["SHARD.RESHARD"],
    ] + [["SHARD.RING", s] for s in ("SET", "GET", "BEGIN", "COMMIT", "ABORT", "NOPE")] + [
        ["SHARD.RESHARD", s] for s in ("COPY", "CLEANUP", "STATUS", "STOP", "NOPE")
    ]
    junk = [b"", b"\x00\xff", "é🙂".encode(), b"-1", b"99999999999999999999999", b"\r\n"]
    pipe = c.pipeline(transaction=False)
    for n in names:
        pipe.execute_command(*n)
        pipe.execute_command(*n, *junk)
    replies = pipe.execute(raise_on_error=False)
    assert len(replies) == 2 * len(names)
    for r in replies:
        assert "internal error" not in str(r).lower(), r
    assert server.alive() and c.ping()
    assert not re.search(r"panic|internal error", server.log(), re.IGNORECASE)
