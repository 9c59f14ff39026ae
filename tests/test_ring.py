"""SHARD.RING SET/GET, SHARD.WHEREIS/LOCATE, the ring file and their errors."""

import pytest
import redis
from uhashring import HashRing

from helpers.fleet import ring_get
from helpers.server import RedisServer, ServerFailed, as_dict

THREE = ["a", "127.0.0.1:7001", 1, "b", "127.0.0.1:7002", 2, "c", "127.0.0.1:7003", 1]


def test_no_ring_is_a_clear_error(r):
    for cmd in (["SHARD.WHEREIS", "k"], ["SHARD.LOCATE", "k"], ["SHARD.RING", "GET"]):
        with pytest.raises(redis.ResponseError, match="no ring is set: use SHARD.RING SET"):
            r.execute_command(*cmd)


def test_set_and_get(r):
    assert r.execute_command("SHARD.RING", "SET", "ketama", *THREE) == b"OK"
    got = ring_get(r)
    assert got["algo"] == b"ketama" and got["hashtag"] == b"none" and got["epoch"] == 1
    # A plain node's address is the one in use; no replicas are learned under read-from primary.
    assert got["nodes"] == [
        {"name": b"a", "address": b"127.0.0.1:7001", "weight": 1,
         "resolved": b"127.0.0.1:7001", "replicas": []},
        {"name": b"b", "address": b"127.0.0.1:7002", "weight": 2,
         "resolved": b"127.0.0.1:7002", "replicas": []},
        {"name": b"c", "address": b"127.0.0.1:7003", "weight": 1,
         "resolved": b"127.0.0.1:7003", "replicas": []},
    ]
    assert len(got["digest"]) == 32
    r.execute_command("SHARD.RING", "SET", "jedis", *THREE)
    again = ring_get(r)
    assert again["epoch"] == 2 and again["hashtag"] == b"jedis"
    assert again["digest"] != got["digest"]


def test_digest_is_the_same_on_every_server_with_the_same_ring(server_factory):
    a, b = server_factory().client(), server_factory().client()
    for c in (a, b):
        c.execute_command("SHARD.RING", "SET", "slots", "HASHTAG", "cluster", *THREE)
    assert ring_get(a)["digest"] == ring_get(b)["digest"]
    b.execute_command("SHARD.RING", "SET", "slots", *THREE[:-1], 2)
    assert ring_get(a)["digest"] != ring_get(b)["digest"]


def test_get_under_resp3_is_a_map(server):
    r3 = server.client(protocol=3)
    r3.execute_command("SHARD.RING", "SET", "ketama", *THREE)
    reply = r3.execute_command("SHARD.RING", "GET")
    assert isinstance(reply, dict) and isinstance(reply[b"nodes"][0], dict)
    loc = r3.execute_command("SHARD.LOCATE", "foo")
    assert isinstance(loc, dict)
    assert set(loc) == {b"node", b"address", b"hashed", b"point", b"previous_node", b"previous_address"}


def test_whereis_and_locate_agree(r):
    r.execute_command("SHARD.RING", "SET", "ketama", *THREE)
    addresses = {b"a": b"127.0.0.1:7001", b"b": b"127.0.0.1:7002", b"c": b"127.0.0.1:7003"}
    # The deciding point and its node, as uhashring (the ketama peer) places them.
    peer = HashRing(nodes={"a": {"weight": 1}, "b": {"weight": 2}, "c": {"weight": 1}},
                    hash_fn="ketama")
    seen = set()
    for i in range(500):
        key = f"key:{i}"
        node = r.execute_command("SHARD.WHEREIS", key)
        loc = as_dict(r.execute_command("SHARD.LOCATE", key))
        assert loc["node"] == node and loc["address"] == addresses[node]
        assert loc["hashed"] == key.encode()
        point, peer_node = peer.get_server(key)
        assert (loc["point"], node) == (point, peer_node.encode()), key
        seen.add(node)
    assert seen == {b"a", b"b", b"c"}


def test_keys_are_binary_safe(r):
    r.execute_command("SHARD.RING", "SET", "slots", *THREE)
    for key in (b"", b"\x00\xff\xfe", "\u00e9t\u00e9".encode(), b"a{\xff}b", b"\r\n"):
        loc = as_dict(r.execute_command("SHARD.LOCATE", key))
        assert loc["node"] in (b"a", b"b", b"c")
        assert 0 <= loc["point"] < 16384
    assert as_dict(r.execute_command("SHARD.LOCATE", b"x{\xff}y"))["hashed"] == b"\xff"


@pytest.mark.parametrize(
    "args,message",
    [
        (["nope", "a", "h:1", 1], "unknown algo 'nope'"),
        (["ketama", "a", "h:1", 1, "a", "h:2", 1], "duplicate node name 'a'"),
        (["ketama", "a", "h:1", 0], "weight"),
        (["ketama", "a", "h:1", 1001], "weight"),
        (["ketama", "a", "h:1", "x"], "weight"),
        (["ketama", "a", "nohost", 1], "host:port"),
        (["ketama", "a", "h:0", 1], "port"),
        (["ketama", "a", "h:65536", 1], "port"),
        (["ketama", "a", ":80", 1], "host"),
        (["ketama", "a", "h:1"], "triplets"),
        (["ketama", "a", "h:1", 1, "b"], "triplets"),
        (["ketama"], "at least one node"),
        (["ketama", "HASHTAG", "weird", "a", "h:1", 1], "unknown hashtag rule 'weird'"),
        (["ketama", "HASHTAG"], "HASHTAG needs a rule"),
        (["cluster"], "cluster-enabled yes"),
        (["cluster", "a", "h:1", 1], "takes no nodes"),
    ],
)
def test_bad_ring_is_refused_and_the_old_ring_stays(r, args, message):
    r.execute_command("SHARD.RING", "SET", "ketama", *THREE)
    before = ring_get(r)
    with pytest.raises(redis.ResponseError) as e:
        r.execute_command("SHARD.RING", "SET", *args)
    assert message in str(e.value)
    assert ring_get(r) == before


def test_wrong_arity_and_unknown_subcommand(r):
    with pytest.raises(redis.ResponseError, match="wrong number of arguments"):
        r.execute_command("SHARD.WHEREIS")
    with pytest.raises(redis.ResponseError, match="wrong number of arguments"):
        r.execute_command("SHARD.LOCATE", "a", "b")
    with pytest.raises(redis.ResponseError, match="unknown subcommand"):
        r.execute_command("SHARD.RING", "FROB")
    with pytest.raises(redis.ResponseError, match="wrong number of arguments"):
        r.execute_command("SHARD.RING", "GET", "extra")


def test_hashtag_override(r):
    r.execute_command("SHARD.RING", "SET", "ketama", "HASHTAG", "cluster", *THREE)
    assert ring_get(r)["hashtag"] == b"cluster"
    assert as_dict(r.execute_command("SHARD.LOCATE", "user{42}.name"))["hashed"] == b"42"
    owners = {r.execute_command("SHARD.WHEREIS", f"{{42}}.field{i}") for i in range(50)}
    assert len(owners) == 1


def write_ring_file(path, text):
    path.write_text(text)
    return str(path)


def test_ring_file_at_load(tmp_path, server_factory):
    f = write_ring_file(tmp_path / "ring.txt", "# the fleet\na 127.0.0.1:7001 1\n\nb 127.0.0.1:7002 2  # big\nc 127.0.0.1:7003 1\n")
    c = server_factory(module_args=["ring-file", f, "ring-algo", "jedis", "self", "b"]).client()
    got = ring_get(c)
    assert got["algo"] == b"jedis" and got["hashtag"] == b"jedis"
    assert [n["name"] for n in got["nodes"]] == [b"a", b"b", b"c"]
    assert c.config_get("shard.self") == {"shard.self": "b"}
    # The same ring set by command has the same digest.
    other = server_factory().client()
    other.execute_command("SHARD.RING", "SET", "jedis", *THREE)
    assert ring_get(other)["digest"] == got["digest"]


@pytest.mark.parametrize(
    "text,message",
    [
        ("a 127.0.0.1:7001 1\nb 127.0.0.1:7002\n", "line 2: expected 'name host:port weight'"),
        ("a 127.0.0.1:7001 1\na 127.0.0.1:7002 1\n", "line 2: duplicate node name 'a'"),
        ("# nothing\n", "has no node lines"),
        ("a 127.0.0.1:70010 1\n", "line 1:"),
        ("a 127.0.0.1:7001 0\n", "line 1:"),
    ],
)
def test_broken_ring_file_stops_the_load_naming_file_and_line(tmp_path, text, message):
    f = write_ring_file(tmp_path / "broken.ring", text)
    s = RedisServer(tmp_path / "srv", module_args=["ring-file", f])
    with pytest.raises(ServerFailed) as e:
        s.start()
    s.stop()
    assert message in str(e.value) and f in str(e.value)


def test_missing_ring_file_stops_the_load(tmp_path):
    s = RedisServer(tmp_path / "srv", module_args=["ring-file", str(tmp_path / "nope.txt")])
    with pytest.raises(ServerFailed, match="cannot read ring file .*nope.txt"):
        s.start()
    s.stop()


def test_ring_file_config_set_reloads_or_keeps_the_old_ring(tmp_path, r):
    good = write_ring_file(tmp_path / "good.txt", "x 127.0.0.1:1 1\ny 127.0.0.1:2 1\n")
    bad = write_ring_file(tmp_path / "bad.txt", "x 127.0.0.1:1\n")
    r.config_set("shard.ring-file", good)
    assert [n["name"] for n in ring_get(r)["nodes"]] == [b"x", b"y"]
    with pytest.raises(redis.ResponseError, match="line 1"):
        r.config_set("shard.ring-file", bad)
    assert r.config_get("shard.ring-file") == {"shard.ring-file": good}
    assert [n["name"] for n in ring_get(r)["nodes"]] == [b"x", b"y"]
    with pytest.raises(redis.ResponseError, match="unknown algo"):
        r.config_set("shard.ring-algo", "nope")
    r.config_set("shard.ring-algo", "redis-shard")
    assert ring_get(r)["algo"] == b"redis-shard"
