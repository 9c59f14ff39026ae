"""Shardjs parity (issue 17), from Shardjs's own code (`lib/shardjs.js` 0.2.3) and README: fixed
and special keys, changeKeyType, toDecimalString, placement by node-hash-ring (libketama) with
`ip:port` node ids, and the field-name dictionary (minify/maxify) applied by SHARD.CALL."""

import bisect
import hashlib
import random

import pytest
import redis
from uhashring import HashRing

from helpers.fleet import key_of, start_fleet
from helpers.resp import Raw

SHARDJS_EPOCH = 1325404800000
SPECIAL = "users:0:index usernames:1:index emails:2:index"
SUB_KEYS = "name:n city:c password:p userid:u email:e"


@pytest.fixture
def sj(server_factory):
    s = server_factory(module_args=["layout", "shardjs", "types", "index:0 user:1 group:2",
                                    "special-keys", SPECIAL])
    return s.client()


def test_fixed_keys_as_shardjs_writes_them(sj):
    # fixedKey(2, 0, 0, 'emails'): ts is the offset from the epoch, every field padded to 2.
    assert sj.execute_command("SHARD.ENCODE", "OFFSET", 2, "SEQ", 0, "TYPE", 0,
                              "SUFFIX", "emails") == b"020000-emails"
    assert sj.execute_command("SHARD.ENCODE", "TIME", SHARDJS_EPOCH + 2, "SEQ", 0, "TYPE", 0,
                              "SUFFIX", "emails") == b"020000-emails"
    # The suffix keeps only 0-9A-Za-z; without a suffix, OFFSET still gives the padded form.
    assert sj.execute_command("SHARD.ENCODE", "OFFSET", 3844, "SEQ", 1, "TYPE", 1,
                              "SUFFIX", "a b!c") == b"1000101-abc"
    assert sj.execute_command("SHARD.ENCODE", "OFFSET", 2, "SEQ", 0, "TYPE", 0) == b"020000"
    # TIME without SUFFIX is genKey's form, as before (what GENKEY issues and DECODE reads).
    assert sj.execute_command("SHARD.ENCODE", "TIME", SHARDJS_EPOCH + 2, "SEQ", 0,
                              "TYPE", 0) == b"20000"
    with pytest.raises(redis.ResponseError, match="TIME or OFFSET, not both"):
        sj.execute_command("SHARD.ENCODE", "TIME", SHARDJS_EPOCH, "OFFSET", 2)


def test_special_keys_of_the_readme_config(sj):
    assert sj.execute_command("SHARD.SPECIALKEY", "users") == b"000000-users"
    assert sj.execute_command("SHARD.SPECIALKEY", "usernames") == b"010000-usernames"
    assert sj.execute_command("SHARD.SPECIALKEY", "emails") == b"020000-emails"
    with pytest.raises(redis.ResponseError, match="no special key 'phones'.*users, usernames, emails"):
        sj.execute_command("SHARD.SPECIALKEY", "phones")
    d = sj.execute_command("SHARD.DECODE", "020000-emails")
    d = dict(zip(d[::2], d[1::2]))
    assert d[b"suffix"] == b"emails" and d[b"type_name"] == b"index" and d[b"time_ms"] == SHARDJS_EPOCH + 2


def test_special_keys_and_fields_are_checked(server_factory):
    c = server_factory(module_args=["layout", "shardjs", "types", "index:0"]).client()
    for bad, msg in (("users:0", "name:offset:type"), ("users:x:index", "not a whole number"),
                     ("users:0:nosuchtype", "neither a configured type name"),
                     ("a:0:0 a:1:0", "twice")):
        with pytest.raises(redis.ResponseError, match=msg):
            c.config_set("shard.special-keys", bad)
    assert c.config_get("shard.special-keys")["shard.special-keys"] == ""
    for bad, msg in (("name", "long:short"), ("name:n name:m", "twice"), ("name:n nick:n", "twice"),
                     ("name:n n:x", "also a long name")):
        with pytest.raises(redis.ResponseError, match=msg):
            c.config_set("shard.fields", bad)
    assert c.config_set("shard.fields", SUB_KEYS)
    assert c.execute_command("SHARD.MINIFY", "name", "age", "email") == [b"n", b"age", b"e"]
    assert c.execute_command("SHARD.MAXIFY", "n", "x", "u") == [b"name", b"x", b"userid"]


def test_change_key_type_and_decimal_form_of_the_readme_keys(sj):
    assert sj.execute_command("SHARD.RETYPE", "1jyVFw3401", 5) == b"1jyVFw3405"
    assert sj.execute_command("SHARD.RETYPE", "1jyVFw3401", "group") == b"1jyVFw3402"
    assert sj.execute_command("SHARD.RETYPE", "020000-emails", "user") == b"020001-emails"
    with pytest.raises(redis.ResponseError, match="is not a shardjs key"):
        sj.execute_command("SHARD.RETYPE", "1j!", 5)
    for key, decimal in ((b"1jyVFw3401", b"159548778401900001"),
                         (b"1jyVFw3501", b"159548778401910001")):
        d = sj.execute_command("SHARD.DECODE", key)
        assert dict(zip(d[::2], d[1::2]))[b"decimal"] == decimal


def test_retype_in_bit_layouts(server_factory):
    c = server_factory(module_args=["layout", "custom",
                                    "custom-layout", "time:41 node:6 type:4 seq:12"]).client()
    key = c.execute_command("SHARD.ENCODE", "TIME", 1700000000000, "NODE", 3, "TYPE", 2, "SEQ", 9)
    again = c.execute_command("SHARD.RETYPE", key, 7)
    d = c.execute_command("SHARD.DECODE", again)
    d = dict(zip(d[::2], d[1::2]))
    assert (d[b"type"], d[b"node"], d[b"seq"], d[b"time_ms"]) == (7, 3, 9, 1700000000000)
    plain = server_factory().client()  # snowflake: no type field
    with pytest.raises(redis.ResponseError, match="no type field"):
        plain.execute_command("SHARD.RETYPE", plain.execute_command("SHARD.GENKEY"), 1)


# --- placement: node-hash-ring's libketama, node ids "ip:port", the key cut at "-" ----------


def libketama(nodes):
    """node-hash-ring (Brian Noguchi's hash_ring, libketama): 40*N*w/W md5 hashes of
    "<id>-<k>" per node, four points each; a key goes to the first point at or above its md5."""
    total = sum(nodes.values())
    points = []
    for node, weight in nodes.items():
        for k in range(40 * len(nodes) * weight // total):
            d = hashlib.md5(f"{node}-{k}".encode()).digest()
            for r in range(4):
                points.append((int.from_bytes(d[4 * r:4 * r + 4], "little"), node))
    points.sort()
    keys = [p for p, _ in points]

    def owner(key):
        h = int.from_bytes(hashlib.md5(key.encode()).digest()[:4], "little")
        i = bisect.bisect_left(keys, h)
        return points[i % len(points)][1]
    return owner


def test_placement_equals_node_hash_ring_with_ip_port_ids(sj):
    nodes = {"10.0.0.1:6379": 1, "10.0.0.2:6379": 2, "10.0.0.3:6380": 1, "10.0.0.4:6379": 3}
    args = []
    for node, w in nodes.items():
        args += [node, node, w]
    assert sj.execute_command("SHARD.RING", "SET", "ketama", *args) == b"OK"
    ring = sj.execute_command("SHARD.RING", "GET")
    assert dict(zip(ring[::2], ring[1::2]))[b"hashtag"] == b"shardjs"
    generated = [k.decode() for k in sj.execute_command("SHARD.GENKEY", "COUNT", 1000)]
    rng = random.Random(17)
    fixed = [sj.execute_command("SHARD.ENCODE", "OFFSET", rng.randrange(10**9), "SEQ",
                                rng.randrange(3844), "TYPE", rng.randrange(3844), "SUFFIX",
                                rng.choice(["emails", "avatar", "x1"])).decode()
             for _ in range(1000)]
    owner = libketama(nodes)
    peer = HashRing(nodes={n: {"weight": w} for n, w in nodes.items()}, hash_fn="ketama")
    pipe = sj.pipeline(transaction=False)
    for k in generated + fixed:
        pipe.execute_command("SHARD.WHEREIS", k)
    got = [o.decode() for o in pipe.execute()]
    want = [owner(k.split("-")[0]) for k in generated + fixed]
    assert got == want
    # uhashring (first point strictly above) with the key cut at "-" agrees with libketama on
    # every one of these keys: none hashes exactly onto a point.
    assert [peer.get_node(k.split("-")[0]) for k in generated + fixed] == want
    # Special keys with one prefix share a node.
    assert len({sj.execute_command("SHARD.WHEREIS", f"020000-{s}") for s in ("a", "b", "c")}) == 1


# --- the field dictionary through SHARD.CALL -----------------------------------------------

HASH_OPS = [
    (("HSET", "{k}", "name", "John", "city", "London"), b":2\r\n"),
    (("HSETNX", "{k}", "email", "j@x"), b":1\r\n"),
    (("HMSET", "{k}", "userid", "7", "age", "30"), b"+OK\r\n"),
    (("HGET", "{k}", "name"), b"$4\r\nJohn\r\n"),
    (("HMGET", "{k}", "name", "city", "age", "nope"), None),
    (("HEXISTS", "{k}", "city"), b":1\r\n"),
    (("HINCRBY", "{k}", "userid", 2), b":9\r\n"),
    (("HINCRBYFLOAT", "{k}", "userid", "0.5"), b"$3\r\n9.5\r\n"),
    (("HSTRLEN", "{k}", "email"), b":3\r\n"),
    (("HGETALL", "{k}"), None),
    (("HKEYS", "{k}"), None),
    (("HSCAN", "{k}", 0, "COUNT", 100), None),
    (("HRANDFIELD", "{k}", 10, "WITHVALUES"), None),  # every field: a set to compare
    (("HDEL", "{k}", "name", "age"), b":2\r\n"),
]


@pytest.fixture
def dict_fleet(server_factory):
    return start_fleet(server_factory, ("a", "b"), module_args=["fields", SUB_KEYS])


@pytest.mark.parametrize("protocol", [2, 3])
@pytest.mark.parametrize("owner", ["a", "b"], ids=["local", "forwarded"])
def test_every_hash_command_stores_short_names_and_replies_long_ones(dict_fleet, server_factory,
                                                                     protocol, owner):
    via = dict_fleet["a"]
    key = key_of(via.client(), owner, f"user{protocol}")
    plain = server_factory()
    raw, plain_raw = Raw(via.port, protocol=protocol), Raw(plain.port, protocol=protocol)
    for op, want in HASH_OPS:
        op = tuple(key if a == "{k}" else a for a in op)
        got = raw.execute("SHARD.CALL", *op)
        expected = plain_raw.execute(*op)  # the same commands on a server without a dictionary
        if op[0] == "HRANDFIELD":
            # random order: compare as sets of lines
            assert sorted(got.split(b"\r\n")) == sorted(expected.split(b"\r\n")), op
        elif op[0] == "HSCAN":
            assert sorted(got.split(b"\r\n")) == sorted(expected.split(b"\r\n")), op
        else:
            assert got == expected, (op, got, expected)
        if want is not None:
            assert got == want, (op, got)
    # On the owner itself, the hash holds the short names.
    stored = dict_fleet[owner].client().hgetall(key)
    assert stored == {b"c": b"London", b"e": b"j@x", b"u": b"9.5"}, stored


def test_readme_example_and_memory_saved(dict_fleet):
    c = dict_fleet["a"].client()
    for owner in ("a", "b"):
        key = key_of(c, owner, "user")
        assert c.execute_command("SHARD.CALL", "HSET", key, "name", "John", "city", "London") == 2
        assert dict_fleet[owner].client().hgetall(key) == {b"n": b"John", b"c": b"London"}
        got = c.execute_command("SHARD.CALL", "HGETALL", key)
        assert dict(zip(got[::2], got[1::2])) == {b"name": b"John", b"city": b"London"}
