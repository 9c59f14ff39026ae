"""SHARD.CALL against a plain server: random commands over awkward key names, sent through a
fleet's nodes and to one plain server, and the check that the fleet then holds exactly what the
plain server holds, each key at its owner only.
"""

from helpers.resp import Raw, call_ops

# Far enough in the future that no key expires during a test; TTL replies may differ by a second.
TTL_MIN, TTL_MAX = 10_000, 20_000


def key_names(n, prefix):
    """n distinct keys, some binary, with spaces or non-ASCII."""
    keys = []
    for i in range(n):
        if i % 50 == 7:
            keys.append(b"%s:bin:\x00\xff\r\n:%d" % (prefix.encode(), i))
        elif i % 50 == 13:
            keys.append(f"{prefix}:sp ace {i}")
        elif i % 50 == 21:
            keys.append(f"{prefix}:ünï:{i}".encode())
        else:
            keys.append(f"{prefix}:{i}")
    return keys


def random_ops(rng, n, keys, extended=False, expire_zero=True):
    """n random single-key commands on `keys`; types collide, so some replies are errors.

    The basic set is SET GET HSET HGETALL INCR LPUSH LRANGE EXPIRE TTL DEL; `extended` adds
    sets (integers: intset order is deterministic), sorted sets (doubles, inf), LPOP with a
    count (a null array in RESP2), ZMSCORE (doubles and nulls in one array) and more.
    """

    def value():
        return rng.choice([str(rng.randrange(-50, 50)), f"v{rng.randrange(1000)}",
                           "x" * rng.randrange(0, 70), "", "\r\n\x00\xff"])

    basic = [
        (12, lambda k: ("SET", k, value())),
        (2, lambda k: ("SET", k, value(), "EX", rng.randrange(TTL_MIN, TTL_MAX))),
        (12, lambda k: ("GET", k)),
        (8, lambda k: ("HSET", k, f"f{rng.randrange(6)}", value(),
                       *([f"f{rng.randrange(6)}", value()] if rng.random() < 0.3 else []))),
        (8, lambda k: ("HGETALL", k)),
        (10, lambda k: ("INCR", k)),
        (8, lambda k: ("LPUSH", k, *[value() for _ in range(rng.randrange(1, 4))])),
        (8, lambda k: ("LRANGE", k, *rng.choice([(0, -1), (0, 1), (-2, -1), (5, 2)]))),
        (6, lambda k: ("EXPIRE", k, rng.randrange(TTL_MIN, TTL_MAX))),
        (8, lambda k: ("TTL", k)),
        (5, lambda k: ("DEL", k)),
    ]
    if expire_zero:
        basic.append((1, lambda k: ("EXPIRE", k, 0)))  # deletes the key
    more = [
        (5, lambda k: ("SADD", k, *[rng.randrange(100) for _ in range(rng.randrange(1, 4))])),
        (4, lambda k: ("SMEMBERS", k)),
        (2, lambda k: ("SISMEMBER", k, rng.randrange(100))),
        (5, lambda k: ("ZINCRBY", k, rng.choice([0.5, 1.25, -0.1, 3, "inf"]), f"m{rng.randrange(4)}")),
        (4, lambda k: ("ZSCORE", k, f"m{rng.randrange(4)}")),
        (3, lambda k: ("ZMSCORE", k, "m0", "m1", "nope")),
        (3, lambda k: ("ZRANGE", k, 0, -1, "WITHSCORES")),
        (3, lambda k: ("LPOP", k, 2)),
        (2, lambda k: ("HINCRBYFLOAT", k, "fl", rng.choice([0.1, 2.5, -1]))),
        (2, lambda k: ("HMGET", k, "f0", "nope")),
        (2, lambda k: ("GETDEL", k)),
        (2, lambda k: ("TYPE", k)),
    ]
    table = basic + (more if extended else [])
    weights = [w for w, _ in table]
    makers = [m for _, m in table]
    return [rng.choices(makers, weights)[0](rng.choice(keys)) for _ in range(n)]


def run_in_segments(fleet, names, ops, rng, protocol=2, plain=None):
    """Sends ops through SHARD.CALL in pipelined segments, each through a random node of
    `names` (a segment's replies arrive before the next segment starts, so the order holds
    across nodes); returns the replies, and the plain server's for the same ops."""
    raws = {n: fleet.raw(n, protocol=protocol) for n in names}
    got, i = [], 0
    while i < len(ops):
        seg = ops[i:i + rng.randrange(1, 80)]
        got += raws[rng.choice(names)].pipeline(call_ops(seg))
        i += len(seg)
    for r in raws.values():
        r.close()
    want = None
    if plain is not None:
        p = Raw(plain.port, protocol=protocol)
        want = p.pipeline(ops)
        p.close()
    return got, want


def check_call_placement(fleet, names, plain, keys):
    """Every key lives only on its owner under the current ring, and equals the plain
    server's (DUMP payload; PTTL within 10 s); the fleet holds nothing else."""
    owners = dict(zip(keys, fleet.owners(keys, via=names[0])))
    where = {k: [] for k in keys}
    for n in names:
        pipe = fleet.client(n).pipeline(transaction=False)
        for k in keys:
            pipe.exists(k)
        for k, e in zip(keys, pipe.execute()):
            if e:
                where[k].append(n)
    pp = plain.client().pipeline(transaction=False)
    for k in keys:
        pp.dump(k)
        pp.pttl(k)
    plain_replies = pp.execute()
    expected = {}
    for k, dump, pttl in zip(keys, plain_replies[::2], plain_replies[1::2]):
        expected[k] = (dump, pttl)
    wrong = [(k, where[k], owners[k]) for k in keys
             if where[k] != ([owners[k]] if expected[k][0] is not None else [])]
    assert not wrong, f"{len(wrong)} keys are not exactly on their owner " \
                      f"(key, holders, owner): {wrong[:5]}"
    by_owner = {}
    for k in keys:
        if expected[k][0] is not None:
            by_owner.setdefault(owners[k], []).append(k)
    differ = []
    for n, owned in by_owner.items():
        pipe = fleet.client(n).pipeline(transaction=False)
        for k in owned:
            pipe.dump(k)
            pipe.pttl(k)
        replies = pipe.execute()
        for k, dump, pttl in zip(owned, replies[::2], replies[1::2]):
            want_dump, want_pttl = expected[k]
            same_ttl = pttl == want_pttl if min(pttl, want_pttl) < 0 \
                else abs(pttl - want_pttl) < 10_000
            if dump != want_dump or not same_ttl:
                differ.append((k, n, dump, want_dump, pttl, want_pttl))
    assert not differ, f"{len(differ)} keys differ from the plain server's " \
                       f"(key, node, dump, plain dump, pttl, plain pttl): {differ[:3]}"
    total = sum(fleet.client(n).dbsize() for n in names)
    assert total == plain.client().dbsize(), "the fleet holds keys the plain server does not"
    return by_owner
