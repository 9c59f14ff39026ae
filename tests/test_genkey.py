"""SHARD.GENKEY: time-sorted, unique keys, drawn atomically inside the server."""

import threading
import time

import pytest
import redis

from helpers.server import info_shard

SNOWFLAKE_EPOCH = 1288834974657


def genkey(client, *args):
    return client.execute_command("SHARD.GENKEY", *args)


def test_single_key_is_a_bulk_string_of_the_current_time(r):
    before = int(time.time() * 1000)
    key = genkey(r)
    after = int(time.time() * 1000)
    assert isinstance(key, bytes) and key.isdigit()
    value = int(key)
    assert value < 2**63
    assert before - 1 <= (value >> 22) + SNOWFLAKE_EPOCH <= after + 1
    assert (value >> 12) & 1023 == 0  # node-id 0


def test_bulk_string_also_under_resp3(server):
    r3 = server.client(protocol=3)
    key = genkey(r3)
    assert isinstance(key, bytes) and key.isdigit()
    keys = genkey(r3, "COUNT", 3)
    assert isinstance(keys, list) and all(isinstance(k, bytes) for k in keys)


def test_count_100000_strictly_increasing_and_unique(r):
    keys = genkey(r, "COUNT", 100000)
    assert len(keys) == 100000
    values = [int(k) for k in keys]
    assert all(a < b for a, b in zip(values, values[1:]))
    assert len(set(values)) == 100000
    # 100000 keys need 25 ticks of 4096: all but the current one are borrowed.
    assert int(info_shard(r)["ticks_borrowed"]) >= 24
    assert int(info_shard(r)["keys_generated"]) == 100000


def test_keys_increase_call_after_call(r):
    values = []
    for _ in range(2000):
        values.append(int(genkey(r)))
    for _ in range(20):
        values.extend(int(k) for k in genkey(r, "COUNT", 500))
    assert all(a < b for a, b in zip(values, values[1:]))


def test_count_one_is_an_array(r):
    keys = genkey(r, "COUNT", 1)
    assert isinstance(keys, list) and len(keys) == 1


def test_four_nodes_generating_at_once_never_collide(server_factory):
    servers = [server_factory(module_args=["node-id", n]) for n in range(4)]
    results = [[] for _ in servers]

    def work(i, s):
        c = s.client()
        for _ in range(20):
            results[i].extend(int(k) for k in genkey(c, "COUNT", 2000))
        for _ in range(2000):
            results[i].append(int(genkey(c)))

    threads = [threading.Thread(target=work, args=(i, s)) for i, s in enumerate(servers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    union = [k for keys in results for k in keys]
    assert len(union) == 4 * 42000
    assert len(set(union)) == len(union)
    for node, keys in enumerate(results):
        assert {(k >> 12) & 1023 for k in keys} == {node}
        assert all(a < b for a, b in zip(keys, keys[1:]))


def test_base62_keys_sort_as_text_and_as_numbers(server_factory):
    s = server_factory(module_args=["encoding", "base62", "node-id", 7])
    c = s.client()
    keys = genkey(c, "COUNT", 20000)
    assert all(len(k) == 11 for k in keys)
    assert keys == sorted(keys)
    assert len(set(keys)) == len(keys)
    decoded = [c.execute_command("SHARD.DECODE", k) for k in keys[:3]]
    assert all(dict(zip(d[::2], d[1::2]))[b"node"] == 7 for d in decoded)


@pytest.mark.parametrize(
    "layout,args,node_of",
    [
        ("instagram", ["node-id", 5000], lambda v: (v >> 10) & 8191),
        ("sonyflake", ["node-id", 40000], lambda v: v & 0xFFFF),
        ("custom", ["custom-layout", "time:41 node:10 type:0 seq:12 unit:1", "node-id", 9],
         lambda v: (v >> 12) & 1023),
    ],
)
def test_bit_layouts_put_the_node_in_its_field(server_factory, layout, args, node_of):
    c = server_factory(module_args=["layout", layout, *args]).client()
    node = int(args[args.index("node-id") + 1])
    values = [int(k) for k in genkey(c, "COUNT", 5000)]
    assert all(node_of(v) == node for v in values)
    assert all(a < b for a, b in zip(values, values[1:]))


def test_shardjs_keys_with_types_and_virtual_shards(server_factory):
    servers = [
        server_factory(module_args=["layout", "shardjs", "node-count", 3, "node-id", n,
                                    "types", "user:2 group:3"])
        for n in range(3)
    ]
    union = []
    for n, s in enumerate(servers):
        c = s.client()
        keys = genkey(c, "TYPE", "user", "COUNT", 5000)
        assert all(k.endswith(b"02") for k in keys)
        for k in keys[:50]:
            d = c.execute_command("SHARD.DECODE", k)
            d = dict(zip(d[::2], d[1::2]))
            assert d[b"node"] == n and d[b"type"] == 2 and d[b"type_name"] == b"user"
        default_type = genkey(c)
        assert default_type.endswith(b"zz")  # Shardjs's default type 3843
        union.extend(keys)
    assert len(set(union)) == len(union)


def test_type_by_name_and_number(server_factory):
    c = server_factory(module_args=[
        "layout", "custom", "custom-layout", "time:41 type:4 node:6 seq:12", "types", "user:2 group:3",
    ]).client()
    for t, expected in (("user", 2), ("3", 3), ("15", 15)):
        key = int(genkey(c, "TYPE", t))
        assert (key >> 18) & 15 == expected
    # Keys stay strictly increasing even when a smaller type follows a larger one.
    values = []
    for t in ("15", "2", "9", "0", "15", "1"):
        values.extend(int(k) for k in genkey(c, "TYPE", t, "COUNT", 3))
    assert all(a < b for a, b in zip(values, values[1:]))


def test_drift_limit_refuses_and_issues_nothing(server_factory):
    c = server_factory(module_args=["max-drift-ms", 0]).client()
    first = int(genkey(c))
    generated = int(info_shard(c)["keys_generated"])
    with pytest.raises(redis.ResponseError, match=r"^.*max-drift-ms 0"):
        genkey(c, "COUNT", 100000)
    info = info_shard(c)
    assert int(info["keys_generated"]) == generated
    assert int(info["genkey_refused"]) == 1
    assert int(genkey(c)) > first
    # Raising the limit lets the same request through.
    c.config_set("shard.max-drift-ms", 60000)
    assert len(genkey(c, "COUNT", 100000)) == 100000


BAD_GENKEY = [
    (["COUNT", 0], "COUNT must be an integer from 1 to 100000, got '0'"),
    (["COUNT", -5], "COUNT must be an integer from 1 to 100000"),
    (["COUNT", 100001], "COUNT must be an integer from 1 to 100000"),
    (["COUNT", "ten"], "got 'ten'"),
    (["COUNT", "99999999999999999999999"], "COUNT must be an integer"),
    (["COUNT"], "COUNT needs a value"),
    (["COUNT", 1, "COUNT", 2], "COUNT is given twice"),
    (["TYPE", 1], "layout snowflake has no type field"),
    (["TYPE"], "TYPE needs a value"),
    (["FOO"], "unknown option 'FOO'"),
    ([""], "unknown option ''"),
]


@pytest.mark.parametrize("args,message", BAD_GENKEY)
def test_bad_genkey_input_is_refused_and_issues_nothing(r, args, message):
    genkey(r)
    before = info_shard(r)["keys_generated"]
    with pytest.raises(redis.ResponseError) as e:
        genkey(r, *args)
    assert message in str(e.value)
    assert info_shard(r)["keys_generated"] == before
    assert r.ping()


def test_unknown_type_name(server_factory):
    c = server_factory(module_args=["layout", "shardjs", "types", "user:2"]).client()
    with pytest.raises(redis.ResponseError, match="unknown type 'admin'"):
        genkey(c, "TYPE", "admin")
    with pytest.raises(redis.ResponseError, match="type 3844 is out of range"):
        genkey(c, "TYPE", 3844)


def test_error_replies_start_with_err(r):
    conn = r.connection_pool.get_connection("SHARD.GENKEY")
    try:
        conn.send_command("SHARD.GENKEY", "COUNT", "0")
        with pytest.raises(redis.ResponseError) as e:
            conn.read_response()
    finally:
        r.connection_pool.release(conn)
    # redis-py strips the "ERR " code; the raw reply is checked in test_errors_raw below.
    assert str(e.value).startswith("COUNT must be")


def test_errors_raw(server):
    """The raw RESP error line starts with the ERR code."""
    import socket

    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(b"*3\r\n$12\r\nSHARD.GENKEY\r\n$5\r\nCOUNT\r\n$1\r\n0\r\n")
        data = s.recv(4096)
    assert data.startswith(b"-ERR COUNT must be an integer from 1 to 100000")
