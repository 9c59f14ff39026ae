"""The module's rings against the real peers, byte for byte (issue 3).

Every case sets a ring with `SHARD.RING SET`, asks `SHARD.WHEREIS` (pipelined) for at least
10000 keys and compares each answer with the peer's own answer for the same nodes and weights:

- `ketama`:       uhashring 2.5 (PyPI) and npm `hashring` 3.2.0 (tests/oracles/hashring_oracle.js)
- `redis-shard`:  redis-shard 0.3.7 (PyPI), `RedisShardAPI.get_server_name`
- `jedis`, `jedis-murmur`: jedis `Sharded` through tests/oracles/JedisOracle.java
- `slots`:        `CLUSTER KEYSLOT` of a real redis-server with cluster-enabled yes

(the live `cluster` algo is in test_cluster_mode.py). Keys are deterministic: random ASCII,
hash-tag edge cases, UTF-8 and, for the peers that can take them, bytes that are not UTF-8.
"""

import bisect
import random
import shutil
import subprocess
import sys

import pytest
from redis_shard.shard import RedisShardAPI
from uhashring import HashRing

from helpers.keys import key_set, slot_keys
from helpers.npm import npm_folder
from helpers.ports import free_port
from helpers.server import ROOT, RedisServer, as_dict, pipelined

NODE_COUNTS = (1, 2, 5, 64, 500)
ORACLES = ROOT / "tests" / "oracles"
NPM_HASHRING = "3.2.0"
SUBPROCESS_TIMEOUT = 180

# ---------------------------------------------------------------------------------------------
# Nodes

FANCY_NAMES = ["cache.example.com", "shard-\u00e9", "n{1}", "redis_7", "\u03b1\u03b2"]


def make_nodes(count, weights="random", fancy=True):
    """[(name, weight)]: deterministic per (count, weights, fancy). `fancy` mixes in names
    with dots, braces and UTF-8 (not for redis-shard, which encodes names as latin-1).
    No name is integer-like: JavaScript would reorder those object keys."""
    rng = random.Random(f"nodes-{count}-{weights}-{fancy}")
    names = [f"node-{i:03d}" for i in range(count)]
    if fancy and count > 2:
        for name in FANCY_NAMES[: count - 2]:
            names[rng.randrange(count)] = name
        assert len(set(names)) == count
    ws = [rng.randint(1, 10) if weights == "random" else 1 for _ in range(count)]
    return list(zip(names, ws))


def fake_ring_args(nodes):
    """Ring arguments of `nodes` at addresses nothing listens on (only owners are asked)."""
    args = []
    for i, (name, weight) in enumerate(nodes):
        args += [name, f"127.0.0.1:{7000 + i}", weight]
    return args


# ---------------------------------------------------------------------------------------------
# The module

def set_ring(client, algo, nodes, hashtag=None):
    tag = ["HASHTAG", hashtag] if hashtag else []
    assert client.execute_command("SHARD.RING", "SET", algo, *tag, *fake_ring_args(nodes)) == b"OK"


def module_owners(client, algo, nodes, keys, hashtag=None):
    set_ring(client, algo, nodes, hashtag)
    return [o.decode() for o in pipelined(client, [("SHARD.WHEREIS", k) for k in keys])]


@pytest.fixture(scope="module")
def module_server(tmp_path_factory):
    s = RedisServer(tmp_path_factory.mktemp("ring-peers")).start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def rc(module_server):
    return module_server.client()


@pytest.fixture(scope="module")
def cluster_enabled_server(tmp_path_factory):
    s = RedisServer(
        tmp_path_factory.mktemp("ring-peers-cluster"),
        # A free port above 55535 leaves no room for the default bus port (port + 10000).
        config=[("cluster-enabled", "yes"), ("cluster-config-file", "nodes.conf"),
                ("cluster-port", free_port())],
    ).start()
    yield s
    s.stop()


# ---------------------------------------------------------------------------------------------
# The peers

def run_oracle(cmd, nodes, keys):
    """Feeds the oracles' protocol (tests/oracles/README.md) and returns one name per key."""
    text = " ".join(f"{n}:{w}" for n, w in nodes) + "\n" + "".join(k.hex() + "\n" for k in keys)
    p = subprocess.run(cmd, input=text.encode(), capture_output=True, timeout=SUBPROCESS_TIMEOUT)
    assert p.returncode == 0, f"{cmd} failed ({p.returncode}):\n{p.stderr.decode(errors='replace')}"
    out = p.stdout.decode("utf-8").split("\n")
    assert out[-1] == ""
    assert len(out) - 1 == len(keys), f"{cmd}: {len(out) - 1} answers for {len(keys)} keys"
    return out[:-1]


@pytest.fixture(scope="session")
def jedis_oracle(tmp_path_factory):
    """tests/oracles/JedisOracle.java compiled into a temporary directory."""
    for tool in ("javac", "java"):
        assert shutil.which(tool), f"{tool} (JDK 17) is needed for the jedis oracle"
    out = tmp_path_factory.mktemp("jedis-oracle")
    subprocess.run(["javac", "-d", str(out), str(ORACLES / "JedisOracle.java")], check=True,
                   timeout=SUBPROCESS_TIMEOUT, capture_output=True)

    def owners(hash_name, tag, nodes, keys):
        cmd = ["java", "-cp", str(out), "JedisOracle", hash_name,
               "tag" if tag else "notag"]
        return run_oracle(cmd, nodes, keys)

    return owners


@pytest.fixture(scope="session")
def npm_oracle(tmp_path_factory):
    """tests/oracles/hashring_oracle.js with npm hashring 3.2.0: tests/oracles/node_modules when
    it is already installed there, otherwise installed once for the run (tests/helpers/npm.py)."""
    assert shutil.which("node"), "node is needed for the npm hashring oracle"
    directory = npm_folder(tmp_path_factory, ORACLES, ("package.json", "hashring_oracle.js"),
                           "hashring", NPM_HASHRING)

    def owners(nodes, keys):
        return run_oracle(["node", str(directory / "hashring_oracle.js")], nodes, keys)

    return owners


def uhashring_ring(nodes):
    return HashRing(nodes={n: {"weight": w} for n, w in nodes}, hash_fn="ketama")


def uhashring_owners(nodes, keys):
    # uhashring hashes str(key) as UTF-8: give it the text whose UTF-8 bytes are the key.
    ring = uhashring_ring(nodes)
    return [ring.get_node(k.decode("utf-8")) for k in keys]


def redis_shard_owners(nodes, keys):
    # The constructor only makes redis.Redis objects; nothing connects until a command runs.
    servers = [{"name": n, "host": "127.0.0.1", "port": 7000 + i, "db": 0}
               for i, (n, _) in enumerate(nodes)]
    api = RedisShardAPI(servers)
    # A text key is encoded as latin-1 before hashing, and the tag regex runs on that text:
    # latin-1 text is the one that stands for any bytes one for one.
    return [api.get_server_name(k.decode("latin-1")) for k in keys]


def npm_counts_agree(nodes):
    """npm hashring computes a node's hash count as floor(w / W * 40 * N) in floating point,
    uhashring (and libketama, and `shard`) floor(40 * N * w / W) in integers; they differ for
    some node counts and weights (see hashring_oracle.js). Only rings where every node gets the
    same count are comparable."""
    n, total = len(nodes), sum(w for _, w in nodes)
    return all((40 * n * w) // total == int(w / total * 40 * n) for _, w in nodes)


# ---------------------------------------------------------------------------------------------
# The comparison

def mismatches(keys, got, expected):
    assert len(got) == len(expected) == len(keys)
    return [(k, g, e) for k, g, e in zip(keys, got, expected) if g != e]


def describe(what, keys, bad):
    shown = "\n".join(f"  key={k!r} module={g!r} peer={e!r}" for k, g, e in bad[:10])
    return f"{what}: {len(bad)} of {len(keys)} keys differ:\n{shown}"


def check_against_peer(rc, algo, nodes, keys, peer_owners, what, hashtag=None):
    got = module_owners(rc, algo, nodes, keys, hashtag)
    bad = mismatches(keys, got, peer_owners)
    assert not bad, describe(what, keys, bad)
    # The ring is not degenerate: with several nodes, keys spread over more than one.
    if len(nodes) > 1:
        assert len(set(got)) > 1
    return got


def node_id(n, weights="random"):
    return f"{n}-nodes-{weights}"


KETAMA_CASES = [(n, "random") for n in NODE_COUNTS] + [(n, "equal") for n in (5, 64, 500)]


@pytest.mark.parametrize("n,weights", KETAMA_CASES, ids=[node_id(*c) for c in KETAMA_CASES])
def test_ketama_equals_uhashring(rc, n, weights):
    nodes = make_nodes(n, weights)
    keys = key_set(utf8_only=True)
    check_against_peer(rc, "ketama", nodes, keys, uhashring_owners(nodes, keys),
                       f"ketama vs uhashring 2.5, {n} nodes, {weights} weights")


@pytest.mark.parametrize("n,weights", KETAMA_CASES, ids=[node_id(*c) for c in KETAMA_CASES])
def test_ketama_equals_npm_hashring(rc, npm_oracle, n, weights):
    nodes = make_nodes(n, weights)
    # Chosen so that npm's float hash counts equal the integer ones (N = 7, 14, 28, ... with
    # equal weights would not be); if a case stops being comparable, pick other weights.
    assert npm_counts_agree(nodes), f"npm hashring gives other hash counts for {nodes}"
    keys = key_set(utf8_only=True)
    npm = npm_oracle(nodes, keys)
    got = module_owners(rc, "ketama", nodes, keys)
    bad = mismatches(keys, got, npm)
    # npm hashring and uhashring (which `shard` follows) differ on two documented points only:
    # a key whose hash is exactly a ring point (npm takes that point, uhashring the next) and
    # two nodes on one point (npm keeps the earlier node, uhashring the later). Such keys are
    # rare; each one is allowed only if it is exactly such a case and the module gives
    # uhashring's answer, and at most 3 per case. Anything else fails. With this key set the
    # 500-node rings have no tied point, and one key, b'~"1a{EfY=}>', hashes exactly onto a
    # point of node-284 (1482031539): npm says node-284, uhashring and the module node-197.
    ring = uhashring_ring(nodes)
    points = ring.runtime._keys  # sorted, a tied point appears once per node on it
    unexplained = []
    for key, module, peer in bad:
        text = key.decode("utf-8")
        h = ring.hashi(text)
        i = bisect.bisect_left(points, h) % len(points)  # npm's point: first >= hash
        p = points[i]
        tied = bisect.bisect_right(points, p) - bisect.bisect_left(points, p) > 1
        if not ((p == h or tied) and module == ring.get_node(text)):
            unexplained.append((key, module, peer))
    assert not unexplained, describe(f"ketama vs npm hashring, {n} nodes, {weights}", keys,
                                     unexplained)
    assert len(bad) <= 3, describe(f"ketama vs npm hashring, {n} nodes: too many ties", keys, bad)
    if bad:
        print(f"{n} nodes: {len(bad)} keys on a tied point or an exact hit, where npm hashring "
              f"and uhashring differ; the module follows uhashring", file=sys.stderr)


@pytest.mark.parametrize("n", NODE_COUNTS, ids=[f"{n}-nodes" for n in NODE_COUNTS])
def test_redis_shard_equals_redis_shard_0_3_7(rc, n):
    nodes = make_nodes(n, weights="equal", fancy=False)  # redis-shard has no weights
    keys = key_set(utf8_only=False)
    check_against_peer(rc, "redis-shard", nodes, keys, redis_shard_owners(nodes, keys),
                       f"redis-shard vs redis-shard 0.3.7, {n} nodes")


JEDIS_CASES = [(algo, n) for algo in ("jedis", "jedis-murmur") for n in NODE_COUNTS]


@pytest.mark.parametrize("algo,n", JEDIS_CASES, ids=[f"{a}-{n}-nodes" for a, n in JEDIS_CASES])
def test_jedis_equals_jedis_sharded(rc, jedis_oracle, algo, n):
    nodes = make_nodes(n)
    keys = key_set(utf8_only=False)
    hash_name = "murmur" if algo == "jedis-murmur" else "md5"
    check_against_peer(rc, algo, nodes, keys, jedis_oracle(hash_name, True, nodes, keys),
                       f"{algo} vs jedis Sharded ({hash_name}, key tag pattern), {n} nodes")


@pytest.mark.parametrize("algo", ["jedis", "jedis-murmur"])
def test_jedis_without_key_tags_equals_jedis_byte_keys(rc, jedis_oracle, algo):
    # jedis's byte[] methods apply no tag pattern: HASHTAG none.
    nodes = make_nodes(5)
    keys = key_set(utf8_only=False)
    hash_name = "murmur" if algo == "jedis-murmur" else "md5"
    check_against_peer(rc, algo, nodes, keys, jedis_oracle(hash_name, False, nodes, keys),
                       f"{algo} HASHTAG none vs jedis Sharded without tag pattern, 5 nodes",
                       hashtag="none")


SLOTS_CASES = [(n, "random") for n in NODE_COUNTS] + [(3, "equal"), (500, "equal")]


@pytest.mark.parametrize("n,weights", SLOTS_CASES, ids=[node_id(*c) for c in SLOTS_CASES])
def test_slots_equals_cluster_keyslot(cluster_enabled_server, n, weights):
    c = cluster_enabled_server.client()
    nodes = make_nodes(n, weights)
    keys = key_set(utf8_only=False) + slot_keys()
    set_ring(c, "slots", nodes)
    slots = pipelined(c, [("CLUSTER", "KEYSLOT", k) for k in keys])
    located = [as_dict(r) for r in pipelined(c, [("SHARD.LOCATE", k) for k in keys])]
    whereis = pipelined(c, [("SHARD.WHEREIS", k) for k in keys])
    bad = [(k, loc["point"], s) for k, loc, s in zip(keys, located, slots) if loc["point"] != s]
    assert not bad, describe(f"slots LOCATE point vs CLUSTER KEYSLOT, {n} nodes", keys, bad)
    index = {name.encode(): i for i, (name, _) in enumerate(nodes)}
    owner_of_slot = {}
    for key, loc, w in zip(keys, located, whereis):
        assert loc["node"] == w, f"LOCATE and WHEREIS disagree on {key!r}"
        assert loc["address"] == f"127.0.0.1:{7000 + index[w]}".encode()
        assert owner_of_slot.setdefault(loc["point"], w) == w, f"slot {loc['point']} has 2 owners"
    assert sorted(owner_of_slot) == list(range(16384))
    # Contiguous ranges in node order, like redis-cli: the owner's index never goes down as the
    # slot goes up, and every node has a range.
    order = [index[owner_of_slot[s]] for s in range(16384)]
    assert order == sorted(order), f"slots ranges are not contiguous in node order ({n} nodes)"
    assert set(order) == set(range(n)), f"some node has no slot ({n} nodes)"
    if n == 3 and weights == "equal":
        # redis-cli --cluster create with 3 masters: 0-5460, 5461-10922, 10923-16383.
        names = [name.encode() for name, _ in nodes]
        for slot, owner in owner_of_slot.items():
            expected = names[0] if slot <= 5460 else names[1] if slot <= 10922 else names[2]
            assert owner == expected, f"slot {slot}: {owner!r}, redis-cli gives {expected!r}"
