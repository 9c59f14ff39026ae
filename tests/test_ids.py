"""The tsid, uuidv7 and ulid layouts (issue 34): SHARD.GENKEY's guarantees for them (text order,
uniqueness, nodes that never collide, COUNT all or nothing, max-drift-ms, a change of layout),
their forms (FORMAT), SHARD.DECODE and SHARD.ENCODE of them with every error they can meet, and
their keys on the rings (WHEREIS, SHARD.CALL, a cluster client). The peers' agreement is in
tests/test_id_peers.py; restarts, the AOF, clock steps and failover in tests/test_durability.py.
"""

import re
import socket
import threading

import pytest
import redis
from uhashring import HashRing

from helpers.cluster import cluster_client, cluster_fleet
from helpers.fleet import make_fleet
from helpers.ids import NEW_LAYOUTS, TSID_EPOCH, Ids, uuid_text
from helpers.keys import key_slot
from helpers.server import as_dict, info_shard

TEXT = {
    "uuidv7": re.compile(rb"^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$"),
    "ulid": re.compile(rb"^[0-7][0-9A-HJKMNP-TV-Z]{25}$"),
    "tsid": re.compile(rb"^[0-9A-F][0-9A-HJKMNP-TV-Z]{12}$"),
}
# (format, length of a key in it) per layout
FORMS = {
    "uuidv7": [("text", 36), ("hex", 32), ("binary", 16)],
    "ulid": [("text", 26), ("hex", 32), ("binary", 16)],
    "tsid": [("text", 13), ("hex", 16), ("binary", 8)],
}
MAX48 = 2**48 - 1


def genkey(client, *args):
    return client.execute_command("SHARD.GENKEY", *args)


def decode(client, *args):
    return as_dict(client.execute_command("SHARD.DECODE", *args))


def encode(client, *args):
    return client.execute_command("SHARD.ENCODE", *args)


@pytest.fixture(params=NEW_LAYOUTS)
def layout(request):
    return request.param


@pytest.fixture
def c(server_factory, layout):
    return server_factory(module_args=["layout", layout, "node-id", 5]).client()


def test_count_100000_in_text_order_unique_and_of_this_node(c, layout):
    ids = Ids(layout)
    keys = genkey(c, "COUNT", 100000)
    assert len(keys) == len(set(keys)) == 100000
    assert all(TEXT[layout].match(k) for k in keys[::997]), keys[:3]
    assert keys == sorted(keys), "text order"
    values = [ids.value(k) for k in keys]
    assert values == sorted(values), "the numbers' order is the text's"
    assert {ids.node(v) for v in values} == {5}
    assert int(info_shard(c)["keys_generated"]) == 100000


def test_keys_increase_call_after_call_in_every_form(c, layout):
    """Single calls and COUNT calls, each form in turn: the numbers increase throughout."""
    ids = Ids(layout)
    values = []
    for i in range(300):
        fmt, length = FORMS[layout][i % 3]
        for k in genkey(c, "COUNT", 1 + i % 7, "FORMAT", fmt):
            assert len(k) == length, (fmt, k)
            text = k if fmt == "text" else encode_back(c, layout, k, fmt)
            values.append(ids.value(text))
    assert all(a < b for a, b in zip(values, values[1:]))


def encode_back(client, layout, key, fmt):
    """The text form of a key given in another form (SHARD.DECODE's `text`)."""
    return decode(client, key, "FORMAT", fmt)["text"]


def test_a_single_key_is_a_bulk_string_in_resp2_and_resp3(server_factory, layout):
    s = server_factory(module_args=["layout", layout])
    for protocol in (2, 3):
        key = genkey(s.client(protocol=protocol))
        assert isinstance(key, bytes) and TEXT[layout].match(key)


def test_decimal_tsid_is_the_text_s_number(server_factory):
    c = server_factory(module_args=["layout", "tsid", "node-id", 1023]).client()
    ids = Ids("tsid")
    for key in genkey(c, "COUNT", 500, "FORMAT", "decimal"):
        d = decode(c, key)
        assert int(key) == ids.value(d["text"]) < 2**63
        assert d["decimal"] == key and d["node"] == 1023


def test_four_nodes_at_once_never_collide(server_factory, layout):
    ids = Ids(layout)
    servers = [server_factory(module_args=["layout", layout, "node-id", n]) for n in range(4)]
    results = [[] for _ in servers]

    def work(i, s):
        client = s.client()
        for _ in range(10):
            results[i].extend(genkey(client, "COUNT", 2000))
        for _ in range(1000):
            results[i].append(genkey(client))

    threads = [threading.Thread(target=work, args=(i, s)) for i, s in enumerate(servers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    union = [k for keys in results for k in keys]
    assert len(union) == len(set(union)) == 4 * 21000
    for node, keys in enumerate(results):
        assert keys == sorted(keys)
        assert {ids.node(ids.value(k)) for k in keys} == {node}


def test_a_full_millisecond_borrows_the_next_and_drift_is_respected(server_factory):
    """tsid with node-bits 20 has 4 IDs a millisecond: COUNT 100000 needs 25 s ahead."""
    c = server_factory(module_args=["layout", "tsid", "node-bits", 20, "max-drift-ms", 1000]).client()
    first = genkey(c)
    generated = int(info_shard(c)["keys_generated"])
    with pytest.raises(redis.ResponseError, match="max-drift-ms 1000"):
        genkey(c, "COUNT", 100000)
    assert int(info_shard(c)["keys_generated"]) == generated, "nothing was issued"
    keys = genkey(c, "COUNT", 2000)  # 500 ms ahead: borrowed, within the limit
    assert keys == sorted(keys) and keys[0] > first
    assert int(info_shard(c)["ticks_borrowed"]) >= 400
    ms = [Ids("tsid", 20).ms(Ids("tsid", 20).value(k)) for k in keys]
    assert ms[-1] - ms[0] >= 499


def test_a_change_of_layout_never_goes_back_in_time(server_factory):
    c = server_factory(module_args=["max-drift-ms", 60000]).client()
    last_ms = 0
    for layout in ["snowflake", "uuidv7", "ulid", "tsid", "uuidv7", "snowflake"]:
        assert c.config_set("shard.layout", layout)
        ids = Ids(layout)
        keys = genkey(c, "COUNT", 3000)
        ms = [ids.ms(ids.value(k)) for k in keys]
        assert ms[0] > last_ms, f"{layout} starts at {ms[0]}, not after {last_ms}"
        last_ms = ms[-1]


def test_genkey_layout_draws_another_layout_beside_the_configured_one(server_factory):
    """Calls of two layouts interleave: each layout's keys increase, neither moves the other's
    clock ahead, and the high-water mark is the later of the two."""
    c = server_factory(module_args=["node-id", 9]).client()  # snowflake configured
    uuid = Ids("uuidv7")
    snow, uuids = [], []
    for _ in range(300):
        snow += [int(k) for k in genkey(c, "COUNT", 20)]
        uuids += genkey(c, "LAYOUT", "uuidv7", "COUNT", 20)
        uuids += [genkey(c, "LAYOUT", "UUIDv7")]
    assert snow == sorted(snow) and uuids == sorted(uuids)
    assert len(set(uuids)) == len(uuids) == 300 * 21
    assert {uuid.node(uuid.value(k)) for k in uuids} == {9}
    info = info_shard(c)
    assert int(info["drift_ms"]) < 1000, "interleaving did not push a clock ahead"
    assert int(info["keys_generated"]) == 300 * 41
    last = max(uuid.ms(uuid.value(uuids[-1])), Ids("snowflake").ms(snow[-1]))
    assert int(info["high_water_ms"]) == last
    assert TEXT["tsid"].match(genkey(c, "LAYOUT", "tsid"))
    d = decode(c, genkey(c, "LAYOUT", "ulid", "FORMAT", "hex"), "LAYOUT", "ulid")
    assert d["node"] == 9
    other = server_factory(module_args=["layout", "sonyflake", "node-id", 40000]).client()
    with pytest.raises(redis.ResponseError, match=r"node-id 40000 does not fit layout uuidv7 \(0 to 1023\)"):
        genkey(other, "LAYOUT", "uuidv7")
    with pytest.raises(redis.ResponseError, match="unknown layout 'uuid'"):
        genkey(other, "LAYOUT", "uuid")
    assert info_shard(other)["keys_generated"] == "0"


def test_uuidv7_and_ulid_in_turn_each_keep_their_order(server_factory):
    """The two 128-bit layouts issued in turn within a millisecond (uuidv7 configured, ulid by
    LAYOUT, pipelined): each keeps its own counter start, so each layout's IDs still increase."""
    c = server_factory(module_args=["layout", "uuidv7", "node-id", 3]).client()
    uuids, ulids = [], []
    for _ in range(20):
        pipe = c.pipeline(transaction=False)
        for _ in range(100):
            pipe.execute_command("SHARD.GENKEY")
            pipe.execute_command("SHARD.GENKEY", "LAYOUT", "ulid")
        got = pipe.execute()
        uuids += got[0::2]
        ulids += got[1::2]
    assert uuids == sorted(uuids) and len(set(uuids)) == len(uuids)
    assert ulids == sorted(ulids) and len(set(ulids)) == len(ulids)


def test_node_bits_set_the_node_width(server_factory):
    c = server_factory(module_args=["layout", "uuidv7", "node-bits", 4, "node-id", 15]).client()
    assert Ids("uuidv7", 4).node(Ids("uuidv7", 4).value(genkey(c))) == 15
    with pytest.raises(redis.ResponseError, match=r"node-id 16 does not fit layout uuidv7 \(0 to 15"):
        c.config_set("shard.node-id", 16)
    assert c.config_set("shard.node-bits", 20)
    assert c.config_set("shard.node-id", 2**20 - 1)
    with pytest.raises(redis.ResponseError):
        c.config_set("shard.node-bits", 21)
    with pytest.raises(redis.ResponseError, match="node-id 1048575 does not fit"):
        c.config_set("shard.node-bits", 19)
    with pytest.raises(redis.ResponseError, match="counts milliseconds from 1970"):
        c.config_set("shard.epoch", 1000)
    assert c.config_get("shard.node-bits") == {"shard.node-bits": "20"}


# --- DECODE and ENCODE --------------------------------------------------------------------------


def edge_cases(layout):
    """(ENCODE arguments, the fields DECODE must give back) at the layouts' edges."""
    if layout == "uuidv7":
        return [
            (["TIME", 0], {"time_ms": 0, "node": 0, "seq": 0, "random": b"0" * 10}),
            (["TIME", MAX48, "SEQ", 2**24 - 1, "NODE", 1023, "RANDOM", "ff" * 5],
             {"time_ms": MAX48, "node": 1023, "seq": 2**24 - 1, "random": b"f" * 10}),
            (["TIME", 1700000000000, "SEQ", 77, "NODE", 5, "RANDOM", "abc"],
             {"time_ms": 1700000000000, "node": 5, "seq": 77, "random": b"0000000abc"}),
        ]
    if layout == "ulid":
        return [
            (["TIME", 0], {"time_ms": 0, "node": 0, "seq": None, "random": b"0" * 18}),
            (["TIME", MAX48, "NODE", 1023, "RANDOM", "3f" + "ff" * 8],
             {"time_ms": MAX48, "node": 1023, "seq": None, "random": b"3f" + b"ff" * 8}),
        ]
    return [
        (["TIME", TSID_EPOCH], {"time_ms": TSID_EPOCH, "node": 0, "seq": 0, "random": None}),
        (["TIME", TSID_EPOCH + 2**42 - 1, "NODE", 1023, "SEQ", 4095],
         {"time_ms": TSID_EPOCH + 2**42 - 1, "node": 1023, "seq": 4095, "random": None}),
    ]


def test_encode_and_decode_are_inverse_at_the_edges_in_every_form(c, layout):
    for args, want in edge_cases(layout):
        texts = {fmt: encode(c, "LAYOUT", layout, *args, "FORMAT", fmt) for fmt, _ in FORMS[layout]}
        assert texts["text"] == encode(c, *args)
        for fmt, key in texts.items():
            assert len(key) == dict(FORMS[layout])[fmt]
            # A TSID's hex digits are read only when asked for (16 digits may be decimal).
            plain = [] if (layout, fmt) != ("tsid", "hex") else ["FORMAT", fmt]
            for reading in (["FORMAT", fmt], plain):
                d = decode(c, key, *reading)
                assert d["layout"] == layout.encode()
                assert {k: d[k] for k in want} == want, (args, fmt)
                assert d["text"] == texts["text"]


def test_the_smallest_id_of_a_millisecond_bounds_a_range(c, layout):
    """ENCODE with TIME alone gives the smallest ID of that millisecond."""
    ids = Ids(layout)
    keys = genkey(c, "COUNT", 50)
    ms = ids.ms(ids.value(keys[0]))
    assert encode(c, "TIME", ms) <= keys[0] < encode(c, "TIME", ms + 1)
    assert encode(c, "TIME", ms + 1) > keys[-1] or ids.ms(ids.value(keys[-1])) > ms


def test_decode_under_resp3_is_a_map_of_the_id_s_fields(server_factory, layout):
    r3 = server_factory(module_args=["layout", layout]).client(protocol=3)
    reply = r3.execute_command("SHARD.DECODE", r3.execute_command("SHARD.GENKEY"))
    assert set(reply) == {b"layout", b"time_ms", b"time", b"node", b"seq", b"random", b"text",
                          b"decimal"}


BAD_DECODE = [
    ("uuidv7", ["9b2f5c3e-4a1d-4e8b-8c7f-2d3e4f5a6b7c"], "this UUID is version 4, not 7"),
    ("uuidv7", ["017f22e2-79b0-7cc3-d8c4-dc0c0c07398f"], "variant bits are 11, not 10"),
    ("uuidv7", ["017f22e2-79b0-7cc3-18c4-dc0c0c07398f"], "variant bits are 00, not 10"),
    ("uuidv7", ["017f22e2-79b0-7cc3-98c4-dc0c0c07398g"], "character 36 ('g') is not a hex digit"),
    ("uuidv7", ["017f22e2+79b0-7cc3-98c4-dc0c0c07398f"], "character 9 must be '-'"),
    ("uuidv7", ["017f22e279b0"], "32 hex digits or 16 bytes, not 12"),
    ("uuidv7", [""], "the key is empty"),
    ("uuidv7", ["017f22e2-79b0-7cc3-98c4-dc0c0c07398f", "FORMAT", "hex"], "hex form is 32 bytes long, not 36"),
    ("uuidv7", ["x", "FORMAT", "decimal"], "layout uuidv7 has no decimal form"),
    ("uuidv7", ["x", "FORMAT", "octal"], "unknown FORMAT 'octal'"),
    ("uuidv7", ["x", "EPOCH", 5], "counts milliseconds from 1970"),
    ("ulid", ["01ARZ3NDEKTSV4RRFFQ69G5FAU"], "character 26 ('U') is not Crockford base32"),
    ("ulid", ["01ARZ3NDEKTSV4RRFFQ69G5FA!"], "character 26 ('!') is not Crockford base32"),
    ("ulid", ["8ZZZZZZZZZZZZZZZZZZZZZZZZZ"], "the first character must be at most '7'"),
    ("ulid", ["01ARZ3NDEKTSV4RRFFQ69G5FA"], "not 25"),
    ("tsid", ["0AXFXR5W7VBXI"], "character 13 ('I') is not Crockford base32"),
    ("tsid", ["GZZZZZZZZZZZZ"], "the first character must be at most 'F'"),
    ("tsid", ["0AXF"], "not 4 characters"),
    ("tsid", ["18446744073709551616"], "does not fit 64 bits"),
    ("tsid", ["12", "FORMAT", "binary"], "binary form is 8 bytes, not 2"),
    ("tsid", ["0575FDC1787DAFAZ", "FORMAT", "hex"], "character 16 ('Z') is not a digit"),
]


@pytest.mark.parametrize("layout,args,message", BAD_DECODE)
def test_bad_ids_are_refused_naming_what_is_wrong(r, layout, args, message):
    with pytest.raises(redis.ResponseError) as e:
        decode(r, *args[:1], "LAYOUT", layout, *args[1:])
    assert message in str(e.value)


BAD_ENCODE = [
    ("uuidv7", ["TIME", 2**48], "time ticks 281474976710656 is out of range"),
    ("uuidv7", ["TIME", 1, "SEQ", 2**24], "seq 16777216 is out of range"),
    ("uuidv7", ["TIME", 1, "NODE", 1024], "node 1024 is out of range"),
    ("uuidv7", ["TIME", 1, "RANDOM", "1" + "0" * 10], "random"),
    ("uuidv7", ["TIME", 1, "RANDOM", "xyz"], "RANDOM must be 1 to 32 hex digits, got 'xyz'"),
    ("uuidv7", ["TIME", 1, "TYPE", 1], "layout uuidv7 has no type field"),
    ("uuidv7", ["OFFSET", 1], "the shardjs layout only"),
    ("uuidv7", ["TIME", 1, "FORMAT", "base62"], "layout uuidv7 has no base62 form"),
    ("ulid", ["TIME", 1, "SEQ", 1], "give RANDOM (hex) instead of SEQ"),
    ("ulid", ["TIME", 1, "RANDOM", "4" + "0" * 17], "random"),
    ("tsid", ["TIME", 1], "before the layout's epoch"),
    ("tsid", ["TIME", TSID_EPOCH, "SEQ", 4096], "seq 4096 is out of range"),
    ("tsid", ["TIME", TSID_EPOCH, "RANDOM", "1"], "RANDOM gives the random bits of the uuidv7 and ulid"),
    ("snowflake", ["TIME", 1700000000000, "FORMAT", "text"], "layout snowflake has no text form"),
]


@pytest.mark.parametrize("layout,args,message", BAD_ENCODE)
def test_bad_fields_are_refused_naming_what_is_wrong(r, layout, args, message):
    with pytest.raises(redis.ResponseError) as e:
        encode(r, "LAYOUT", layout, *args)
    assert message in str(e.value)


@pytest.mark.parametrize("args,message", [
    (["FORMAT", "decimal"], "layout uuidv7 has no decimal form"),
    (["FORMAT"], "FORMAT needs a value"),
    (["FORMAT", "hex", "FORMAT", "hex"], "FORMAT is given twice"),
    (["TYPE", "1"], "layout uuidv7 has no type field"),
    (["COUNT", 100001], "COUNT must be an integer from 1 to 100000"),
])
def test_bad_genkey_is_refused_and_issues_nothing(server_factory, args, message):
    c = server_factory(module_args=["layout", "uuidv7"]).client()
    genkey(c)
    with pytest.raises(redis.ResponseError, match=re.escape(message)):
        genkey(c, *args)
    assert info_shard(c)["keys_generated"] == "1"


def test_error_replies_start_with_err(server_factory):
    s = server_factory(module_args=["layout", "uuidv7"])
    bad = "9b2f5c3e-4a1d-4e8b-8c7f-2d3e4f5a6b7c"
    with socket.create_connection(("127.0.0.1", s.port), timeout=5) as sock:
        sock.sendall(f"*2\r\n$12\r\nSHARD.DECODE\r\n${len(bad)}\r\n{bad}\r\n".encode())
        data = sock.recv(4096)
    assert data.startswith(b"-ERR '9b2f5c3e-4a1d-4e8b-8c7f-2d3e4f5a6b7c' is not a uuidv7 key: "
                           b"this UUID is version 4, not 7")


def test_binary_garbage_never_harms_the_server(server_factory, layout):
    import random
    c = server_factory(module_args=["layout", layout]).client()
    rng = random.Random(34)
    for n in range(600):
        data = bytes(rng.randrange(256) for _ in range(rng.choice([1, 8, 13, 16, 26, 32, 36, 40])))
        for fmt in ([], ["FORMAT", "binary"], ["FORMAT", "text"], ["FORMAT", "hex"]):
            try:
                decode(c, data, *fmt)
            except redis.ResponseError as e:
                assert str(e)
    assert c.ping()


# --- on the rings -------------------------------------------------------------------------------


def test_ids_place_on_rings_like_any_key(server_factory, layout):
    """WHEREIS of IDs in every form (binary ones hold any byte, '{' and '}' included) is the
    ketama peer's answer and Redis Cluster's slot."""
    c = server_factory(module_args=["layout", layout]).client()
    keys = []
    for fmt, _ in FORMS[layout]:
        keys += genkey(c, "COUNT", 700, "FORMAT", fmt)
    nodes = [(f"n{i}", 1) for i in range(5)]
    ring = HashRing(nodes={n: {"weight": w} for n, w in nodes}, hash_fn="ketama")
    args = [x for i, (n, w) in enumerate(nodes) for x in (n, f"10.0.0.{i}:6379", w)]
    c.execute_command("SHARD.RING", "SET", "ketama", *args)
    pipe = c.pipeline(transaction=False)
    for k in keys:
        pipe.execute_command("SHARD.WHEREIS", k)
    got = [o.decode() for o in pipe.execute()]
    texts = [(k, o) for k, o in zip(keys, got) if len(k) != len(keys[-1])]  # not binary
    assert len(texts) == 1400
    assert [o for _, o in texts] == [ring.get_node(k.decode()) for k, _ in texts]
    c.execute_command("SHARD.RING", "SET", "slots", *args)
    located = [as_dict(c.execute_command("SHARD.LOCATE", k)) for k in keys]
    assert [d["point"] for d in located] == [key_slot(k) for k in keys]
    assert any(b"{" in k for k in keys[1400:]) or layout == "tsid"


def test_shard_call_and_a_cluster_client_carry_ids_to_their_owners(server_factory):
    fleet = make_fleet(server_factory, args=["layout", "uuidv7"])
    c = fleet.client("n0")
    keys = genkey(c, "COUNT", 300) + genkey(c, "COUNT", 300, "FORMAT", "binary")
    for k in keys:
        assert c.execute_command("SHARD.CALL", "SET", k, k) == b"OK"
    owners = fleet.owners(keys)
    assert len(set(owners)) == 3
    for k, owner in zip(keys, owners):
        assert fleet.client(owner).get(k) == k
    cluster = cluster_fleet(server_factory)
    for s in cluster.values():
        s.client().config_set("shard.layout", "ulid")
    rc = cluster_client(cluster)
    ulids = genkey(cluster.client("n0"), "COUNT", 300)
    for k in ulids:
        rc.set(k, uuid_text(len(k)))
    assert all(rc.get(k) == uuid_text(26).encode() for k in ulids)
