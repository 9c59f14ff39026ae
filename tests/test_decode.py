"""SHARD.DECODE and SHARD.ENCODE, checked against the peers from PyPI."""

import datetime
import random

import pytest
import redis
from snowflake import Snowflake, SnowflakeGenerator
from sonyflake import SonyFlake

SNOWFLAKE_EPOCH = 1288834974657
SONYFLAKE_EPOCH = 1409529600000
SHARDJS_EPOCH = 1325404800000


def decode(client, *args):
    reply = client.execute_command("SHARD.DECODE", *args)
    if isinstance(reply, dict):
        return {k.decode(): v for k, v in reply.items()}
    return {k.decode(): v for k, v in zip(reply[::2], reply[1::2])}


def encode(client, *args):
    return client.execute_command("SHARD.ENCODE", *args)


def iso(ms):
    t = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def test_decode_agrees_with_snowflake_id_on_generated_keys(server_factory):
    c = server_factory(module_args=["node-id", 613]).client()
    for key in c.execute_command("SHARD.GENKEY", "COUNT", 5000)[::7]:
        peer = Snowflake.parse(int(key), SNOWFLAKE_EPOCH)
        d = decode(c, key)
        assert d["layout"] == b"snowflake"
        assert d["time_ms"] == peer.milliseconds
        assert d["node"] == peer.instance == 613
        assert d["seq"] == peer.seq
        assert d["time"].decode() == iso(peer.milliseconds)


def test_decode_agrees_with_snowflake_id_on_peer_keys(r):
    rng = random.Random(7)
    for _ in range(300):
        sid = Snowflake(timestamp=rng.randrange(2**41), instance=rng.randrange(1024),
                        epoch=SNOWFLAKE_EPOCH, seq=rng.randrange(4096)).value
        peer = Snowflake.parse(sid, SNOWFLAKE_EPOCH)
        d = decode(r, sid, "LAYOUT", "snowflake")
        assert (d["time_ms"], d["node"], d["seq"]) == (peer.milliseconds, peer.instance, peer.seq)
        # ENCODE is the inverse of DECODE.
        assert int(encode(r, "TIME", d["time_ms"], "NODE", d["node"], "SEQ", d["seq"])) == sid


def test_decode_agrees_with_snowflake_id_generator(r):
    gen = SnowflakeGenerator(77, epoch=SNOWFLAKE_EPOCH)
    for _ in range(200):
        sid = next(gen)
        peer = Snowflake.parse(sid, SNOWFLAKE_EPOCH)
        d = decode(r, sid)
        assert (d["time_ms"], d["node"], d["seq"]) == (peer.milliseconds, 77, peer.seq)


def test_decode_agrees_with_sonyflake_py(r):
    rng = random.Random(11)
    for _ in range(300):
        machine = rng.randrange(1 << 16)
        flake = SonyFlake(machine_id=lambda m=machine: m)
        flake.elapsed_time = rng.randrange(1 << 39)
        flake.sequence = rng.randrange(256)
        sid = flake.to_id()
        peer = SonyFlake.decompose(sid)
        d = decode(r, sid, "LAYOUT", "sonyflake")
        assert d["layout"] == b"sonyflake"
        assert d["node"] == peer["machine_id"]
        assert d["seq"] == peer["sequence"]
        assert d["time_ms"] == SONYFLAKE_EPOCH + peer["time"] * 10
        built = encode(r, "LAYOUT", "sonyflake", "TIME", d["time_ms"], "NODE", d["node"], "SEQ", d["seq"])
        assert int(built) == sid


def test_sonyflake_keys_generated_by_the_module_decode_with_the_peer(server_factory):
    c = server_factory(module_args=["layout", "sonyflake", "node-id", 4242]).client()
    now_units = (int(datetime.datetime.now(datetime.timezone.utc).timestamp() * 1000) - SONYFLAKE_EPOCH) // 10
    for key in c.execute_command("SHARD.GENKEY", "COUNT", 600):
        peer = SonyFlake.decompose(int(key))
        assert peer["machine_id"] == 4242 and peer["msb"] == 0
        assert abs(peer["time"] - now_units) <= 100


def test_shardjs_readme_example(r):
    d = decode(r, "1jyVFw3401", "LAYOUT", "shardjs")
    assert d == {
        "layout": b"shardjs", "time_ms": SHARDJS_EPOCH + 1595487784,
        "time": iso(SHARDJS_EPOCH + 1595487784).encode(), "node": 0, "seq": 190, "type": 1,
        "type_name": None, "decimal": b"159548778401900001", "suffix": None,
    }
    nxt = encode(r, "LAYOUT", "shardjs", "TIME", SHARDJS_EPOCH + 1595487784, "SEQ", 191, "TYPE", 1)
    assert nxt == b"1jyVFw3501"
    # A fixed key's suffix is not part of the key's fields.
    assert decode(r, "1jyVFw3401-avatar", "LAYOUT", "shardjs")["seq"] == 190


def test_decode_under_resp3_is_a_map(server):
    r3 = server.client(protocol=3)
    key = r3.execute_command("SHARD.GENKEY")
    reply = r3.execute_command("SHARD.DECODE", key)
    assert isinstance(reply, dict)
    assert set(reply) == {b"layout", b"time_ms", b"time", b"node", b"seq", b"type", b"type_name",
                          b"decimal", b"suffix"}
    assert reply[b"decimal"] is None and reply[b"suffix"] is None  # not a shardjs key


def test_type_names_in_decode(server_factory):
    c = server_factory(module_args=["layout", "shardjs", "types", "user:2 group:3 comment:4"]).client()
    key = c.execute_command("SHARD.GENKEY", "TYPE", "comment")
    d = decode(c, key)
    assert (d["type"], d["type_name"]) == (4, b"comment")
    assert decode(c, encode(c, "TIME", 1600000000000, "TYPE", 7))["type_name"] is None


def test_epoch_option_and_configured_epoch(server_factory):
    c = server_factory(module_args=["epoch", 1000000000000]).client()
    key = encode(c, "TIME", 1000000000123, "NODE", 1)
    assert int(key) == (123 << 22) | (1 << 12)
    assert decode(c, key)["time_ms"] == 1000000000123
    assert decode(c, key, "EPOCH", 0)["time_ms"] == 123
    assert decode(c, key, "LAYOUT", "snowflake", "EPOCH", 5)["time_ms"] == 128


def test_base62_round_trip(server_factory):
    c = server_factory(module_args=["encoding", "base62"]).client()
    key = encode(c, "TIME", 1700000000000, "NODE", 3, "SEQ", 9)
    assert len(key) == 11
    d = decode(c, key)
    assert (d["time_ms"], d["node"], d["seq"]) == (1700000000000, 3, 9)
    # A decimal Twitter ID still decodes when base62 is configured.
    sid = (5 << 22) | (2 << 12) | 1
    assert decode(c, sid)["node"] == 2


BAD_DECODE = [
    (["abc"], "'abc' is not a snowflake key: the key is not a decimal number"),
    ([""], "the key is empty"),
    (["-1"], "not a decimal number"),
    (["1" * 25], "longer than 20 characters"),
    (["18446744073709551616"], "out of range"),
    (["9223372036854775808"], "bits set above the layout's fields"),
    (["\u00e9\u00e9"], "not a decimal number"),
    (["1", "LAYOUT", "uuid"], "unknown layout 'uuid'"),
    (["1", "LAYOUT"], "LAYOUT needs a value"),
    (["1", "EPOCH", "x"], "EPOCH must be unix milliseconds"),
    (["1", "EPOCH", "-4"], "EPOCH must be unix milliseconds"),
    (["1", "LAYOUT", "custom"], "custom-layout"),
    (["1", "WHAT"], "unknown option 'WHAT'"),
    (["1", "LAYOUT", "snowflake", "LAYOUT", "snowflake"], "LAYOUT is given twice"),
    (["1jy!w3401", "LAYOUT", "shardjs"], "not a base62 character"),
    (["abc", "LAYOUT", "shardjs"], "at least 5 characters"),
]


@pytest.mark.parametrize("args,message", BAD_DECODE)
def test_bad_decode_input(r, args, message):
    with pytest.raises(redis.ResponseError) as e:
        decode(r, *args)
    assert message in str(e.value)


def test_decode_binary_garbage(r):
    with pytest.raises(redis.ResponseError, match="not a decimal number"):
        decode(r, b"\x00\xff\r\n\x01")
    with pytest.raises(redis.ResponseError, match="wrong number of arguments"):
        r.execute_command("SHARD.DECODE")


BAD_ENCODE = [
    ([], "TIME unix-ms (or OFFSET ms) is required"),
    (["TIME"], "TIME needs a value"),
    (["TIME", "soon"], "TIME must be an integer"),
    (["TIME", 5], "before the layout's epoch"),
    (["TIME", 1700000000000, "NODE", 1024], "node 1024 is out of range for this layout (0 to 1023)"),
    (["TIME", 1700000000000, "SEQ", 4096], "seq 4096 is out of range"),
    (["TIME", 1700000000000, "SEQ", -1], "SEQ must be an integer"),
    (["TIME", 1700000000000, "TYPE", 1], "has no type field"),
    (["TIME", 1700000000000, "TIME", 1700000000000], "TIME is given twice"),
    (["TIME", 1700000000000, "COLOR", 1], "unknown option 'COLOR'"),
    (["LAYOUT", "shardjs", "TIME", 1700000000000, "SEQ", 3844], "seq 3844 is out of range"),
    (["TIME", 2**62], "out of range"),
]


@pytest.mark.parametrize("args,message", BAD_ENCODE)
def test_bad_encode_input(r, args, message):
    with pytest.raises(redis.ResponseError) as e:
        encode(r, *args)
    assert message in str(e.value)


def test_shardjs_encode_node_must_match_virtual_shard(server_factory):
    c = server_factory(module_args=["layout", "shardjs", "node-count", 4]).client()
    t = SHARDJS_EPOCH + 1001  # offset 1001 belongs to node 1001 % 4 == 1
    assert decode(c, encode(c, "TIME", t))["node"] == 1
    assert decode(c, encode(c, "TIME", t, "NODE", 1))["node"] == 1
    with pytest.raises(redis.ResponseError, match="belongs to node 1"):
        encode(c, "TIME", t, "NODE", 2)
