"""The module on a real three-master Redis Cluster made by `redis-cli --cluster create`.

- the `cluster` algo answers, for every key, the master that CLUSTER SHARDS says serves
  CLUSTER KEYSLOT of the key (node id, ip:port, slot), on every node;
- a `slots` ring of the three masters in create order places every key on the same master as
  the real cluster: the equal-weight split is redis-cli's;
- the other commands work on a cluster-mode server, with no MOVED or CROSSSLOT errors;
- the `cluster` algo follows the live slot map when a slot moves.
"""

import subprocess

import pytest

from helpers.keys import key_set, slot_keys
from helpers.ports import free_port
from helpers.server import RedisServer, as_dict, pipelined, until

CLUSTER_WAIT = 30.0


def cluster_tag(key):
    """The part of a key Redis Cluster hashes: between the first `{` and the first `}` after
    it when that is not empty, else the whole key."""
    s = key.find(b"{")
    if s >= 0:
        e = key.find(b"}", s + 1)
        if e > s + 1:
            return key[s + 1:e]
    return key


def cluster_info(client):
    text = client.execute_command("CLUSTER", "INFO").decode()
    return dict(line.split(":", 1) for line in text.split() if ":" in line)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Three masters with the module, joined by `redis-cli --cluster create`, in create order.
    (Module scope, so RedisServer is used directly: server_factory is per test.)"""
    servers = []
    try:
        for i in range(3):
            servers.append(RedisServer(
                tmp_path_factory.mktemp(f"cluster{i}"),
                config=[("cluster-enabled", "yes"), ("cluster-config-file", "nodes.conf"),
                        # the bus port would be port + 10000, which may not exist for a free port
                        ("cluster-port", free_port()), ("cluster-node-timeout", 5000)],
            ).start())
        create = subprocess.run(
            ["redis-cli", "--cluster", "create", *[f"127.0.0.1:{s.port}" for s in servers],
             "--cluster-yes"],
            capture_output=True, timeout=120, stdin=subprocess.DEVNULL,
        )
        assert create.returncode == 0, create.stdout.decode(errors="replace") + create.stderr.decode(
            errors="replace")
        clients = [s.client() for s in servers]
        until(lambda: all(cluster_info(c).get("cluster_state") == "ok"
                          and cluster_info(c).get("cluster_known_nodes") == "3" for c in clients),
              "cluster_state:ok on all three nodes", CLUSTER_WAIT)
        yield servers
    finally:
        for s in servers:
            s.stop()


def shards(client):
    """{slot: (node id, ip:port)} from CLUSTER SHARDS."""
    owner = {}
    for shard in client.execute_command("CLUSTER", "SHARDS"):
        shard = as_dict(shard)
        masters = [as_dict(n) for n in shard["nodes"] if as_dict(n)["role"] == b"master"]
        assert len(masters) == 1
        m = masters[0]
        node = (m["id"], m["ip"] + b":" + str(m["port"]).encode())
        ranges = shard["slots"]
        for start, end in zip(ranges[::2], ranges[1::2]):
            for slot in range(start, end + 1):
                owner[slot] = node
    assert len(owner) == 16384
    return owner


def test_cluster_was_created_with_redis_cli_split(cluster):
    ids = [s.client().execute_command("CLUSTER", "MYID") for s in cluster]
    owner = shards(cluster[0].client())
    for first, last, node in ((0, 5460, 0), (5461, 10922, 1), (10923, 16383, 2)):
        assert {owner[s][0] for s in range(first, last + 1)} == {ids[node]}


def test_cluster_algo_equals_cluster_shards_on_every_node(cluster):
    keys = key_set(utf8_only=False) + slot_keys()
    first = cluster[0].client()
    owner = shards(first)
    slots = pipelined(first, [("CLUSTER", "KEYSLOT", k) for k in keys])
    for server in cluster:
        c = server.client()
        assert c.execute_command("SHARD.RING", "SET", "cluster") == b"OK"
        whereis = pipelined(c, [("SHARD.WHEREIS", k) for k in keys])
        located = [as_dict(r) for r in pipelined(c, [("SHARD.LOCATE", k) for k in keys])]
        bad = [(k, w, owner[s][0]) for k, w, s in zip(keys, whereis, slots) if w != owner[s][0]]
        assert not bad, (
            f"cluster algo on :{server.port}: {len(bad)} of {len(keys)} keys differ from "
            f"CLUSTER SHARDS, first: {bad[:5]}")
        for key, slot, loc, w in zip(keys, slots, located, whereis):
            assert (loc["node"], loc["address"], loc["point"]) == (w, owner[slot][1], slot), key
            assert loc["hashed"] == cluster_tag(key), key
            assert loc["previous_node"] is None and loc["previous_address"] is None
        assert len(set(whereis)) == 3


def test_slots_ring_in_create_order_equals_the_real_cluster(cluster):
    # The three masters, named by their node ids, with equal weights, in the order given to
    # `redis-cli --cluster create`: the same owner for every key (and slot) as the live cluster.
    keys = key_set(utf8_only=False) + slot_keys()
    c = cluster[1].client()
    ids = [s.client().execute_command("CLUSTER", "MYID").decode() for s in cluster]
    nodes = []
    for node_id, s in zip(ids, cluster):
        nodes += [node_id, f"127.0.0.1:{s.port}", 1]
    c.execute_command("SHARD.RING", "SET", "cluster")
    live = pipelined(c, [("SHARD.WHEREIS", k) for k in keys])
    c.execute_command("SHARD.RING", "SET", "slots", *nodes)
    ring = pipelined(c, [("SHARD.WHEREIS", k) for k in keys])
    owner = shards(c)
    slots = pipelined(c, [("CLUSTER", "KEYSLOT", k) for k in keys])
    bad = [(k, r, owner[s][0]) for k, r, s in zip(keys, ring, slots) if r != owner[s][0]]
    assert not bad, f"slots ring vs the real cluster: {len(bad)} keys differ, first: {bad[:5]}"
    assert ring == live


def test_other_commands_work_on_a_cluster_node(cluster):
    # Keys whose slots every master serves: none of them may draw MOVED, ASK or CROSSSLOT, as
    # no command of the module declares keys.
    keys = [b"a", b"b", b"c", b"{user1}.following", b"foo{hash_tag}", b"somekey", b"\xff"]
    owner = shards(cluster[0].client())
    slots = pipelined(cluster[0].client(), [("CLUSTER", "KEYSLOT", k) for k in keys])
    assert len({owner[s][0] for s in slots}) == 3
    for server in cluster:
        c = server.client()
        key = c.execute_command("SHARD.GENKEY")
        assert key.isdigit()
        batch = c.execute_command("SHARD.GENKEY", "COUNT", 5)
        assert len(batch) == 5 and [int(k) for k in batch] == sorted({int(k) for k in batch})
        assert int(batch[0]) > int(key)
        decoded = as_dict(c.execute_command("SHARD.DECODE", key))
        assert decoded["layout"] == b"snowflake"
        again = c.execute_command("SHARD.ENCODE", "TIME", decoded["time_ms"],
                                  "NODE", decoded["node"], "SEQ", decoded["seq"])
        assert again == key
        # A ring other than `cluster` on a cluster node, then `cluster` again.
        c.execute_command("SHARD.RING", "SET", "ketama", "a", "127.0.0.1:7001", 1,
                          "b", "127.0.0.1:7002", 2)
        assert {c.execute_command("SHARD.WHEREIS", k) for k in keys} <= {b"a", b"b"}
        c.execute_command("SHARD.RING", "SET", "cluster")
        got = as_dict(c.execute_command("SHARD.RING", "GET"))
        assert (got["algo"], got["hashtag"], got["nodes"]) == (b"cluster", b"cluster", [])
        assert len(got["digest"]) == 32
        for k, s in zip(keys, slots):
            assert c.execute_command("SHARD.WHEREIS", k) == owner[s][0]
            assert as_dict(c.execute_command("SHARD.LOCATE", k))["point"] == s
        # Under RESP3 too.
        r3 = server.client(protocol=3)
        assert r3.execute_command("SHARD.LOCATE", keys[0])[b"node"] == owner[slots[0]][0]
        assert int(c.info("shard")["shard_keys_generated"]) >= 6


def test_cluster_algo_follows_a_moved_slot(cluster):
    # Move an empty slot from its master to another one with CLUSTER SETSLOT: the module reads
    # the live slot map (kept for at most a second), so WHEREIS follows.
    clients = [s.client() for s in cluster]
    ids = [c.execute_command("CLUSTER", "MYID") for c in clients]
    key = b"somekey"
    slot = clients[0].execute_command("CLUSTER", "KEYSLOT", key)
    source = shards(clients[0])[slot][0]
    target = next(i for i in ids if i != source)
    for c in clients:
        c.execute_command("SHARD.RING", "SET", "cluster")
        assert c.execute_command("SHARD.WHEREIS", key) == source

    def move(to, away_from):
        # As `redis-cli --cluster reshard` does: the new owner imports the slot and the old one
        # migrates it (it holds no key), then the new owner takes it, which bumps its config
        # epoch, then the others are told. (With SETSLOT NODE alone, the old owner's claim, of a
        # higher epoch, could reach the new owner before the old owner was told, and win it
        # back: the nodes then never agreed. A busy machine made that happen.)
        by_id = dict(zip(ids, clients))
        assert by_id[to].execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", away_from)
        assert by_id[away_from].execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", to)
        order = sorted(range(3), key=lambda i: ids[i] != to)
        for i in order:
            clients[i].execute_command("CLUSTER", "SETSLOT", slot, "NODE", to)
        until(lambda: all(shards(c)[slot][0] == to for c in clients),
              f"every node to see slot {slot} on {to}", CLUSTER_WAIT)
        until(lambda: all(c.execute_command("SHARD.WHEREIS", key) == to for c in clients),
              f"SHARD.WHEREIS to follow slot {slot} to {to}", timeout=10)

    try:
        move(target, away_from=source)
        for c in clients:
            assert as_dict(c.execute_command("SHARD.LOCATE", key))["node"] == target
    finally:
        move(source, away_from=target)
