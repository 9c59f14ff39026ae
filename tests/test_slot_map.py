"""`slots` rings with an explicit slot map (issue 32): a node may own several slot ranges.

- `SHARD.RESHARD START` from 3 to 4 equal `slots` nodes moves a quarter of the keys (the
  contiguous split of four would move half), and back from 4 to 3 only the leaving node's, to
  the first ring again; after each, every key is once at its owner, and the cluster protocol
  shows the map (three ranges for the node that joined) to redis-py's RedisCluster, which reads
  every key through it.
- START given an explicit map moves exactly the slots that map moves, even a map that is the
  weights' own split.
- `SHARD.RING SET slots ... SLOTS ranges`: WHEREIS, GET and CLUSTER SLOTS answer as given; a bad
  map is refused with an ERR naming the slot, and nothing applied.
- The map survives a restart, from the RDB and from the AOF.
"""

import signal

import pytest
from redis.crc import key_slot

from helpers.cluster import cluster_client
from helpers.fleet import NAMES3, NAMES4, owners, ring_args, ring_get, start_fleet
from helpers.reshard import assert_one_ring, check_done, fleet_status, wait_fleet
from helpers.resp import Raw
from helpers.server import AOF

KEYS = 6000


def write_keys(servers, via, n=KEYS):
    """Keys `k:<i>` with value `v-k:<i>`, each written to its owner by the ring of `via`."""
    keys = [f"k:{i}" for i in range(n)]
    by_owner = {}
    for k, o in zip(keys, owners(servers[via].client(), keys)):
        by_owner.setdefault(o, []).append(k)
    for o, owned in by_owner.items():
        pipe = servers[o].client().pipeline(transaction=False)
        for k in owned:
            pipe.set(k, f"v-{k}")
        pipe.execute()
    return keys


def holdings(servers, keys):
    """name -> the set of `keys` that server holds (KEYS: no key argument, so the cluster
    protocol redirects nothing)."""
    wanted = set(keys)
    return {n: {k.decode() for k in s.client().keys("*")} & wanted for n, s in servers.items()}


def parse_ranges(text):
    """`0-4095,8192-9000,16383` as [(0, 4095), (8192, 9000), (16383, 16383)]."""
    out = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out.append((int(a), int(b or a)))
    return out


def slot_owners(client):
    """Per slot, its node's name, from SHARD.RING GET's `slots` fields (each slot once)."""
    owner = [None] * 16384
    for node in ring_get(client)["nodes"]:
        for a, b in parse_ranges(node["slots"].decode()):
            for s in range(a, b + 1):
                assert owner[s] is None, f"slot {s} twice"
                owner[s] = node["name"].decode()
    assert None not in owner
    return owner


def cluster_slots(client):
    """CLUSTER SLOTS as sorted (first, last, port)."""
    return sorted((e[0], e[1], e[2][1]) for e in client.execute_command("CLUSTER", "SLOTS"))


def start_slots(client, servers, names, *extra):
    return client.execute_command("SHARD.RESHARD", "START", "slots", *ring_args(servers, names),
                                  *extra)


def check_moves(servers, keys, before, old_owner, new_owner):
    """Every key is once, at its owner by `new_owner` (per slot); a key moved exactly when its
    slot changed owner. Returns the number of keys moved."""
    after = holdings(servers, keys)
    moved = 0
    for k in keys:
        s = key_slot(k.encode())
        holders = [n for n, held in after.items() if k in held]
        assert holders == [new_owner[s]], (k, s, holders)
        was = [n for n, held in before.items() if k in held]
        assert was == [old_owner[s]], (k, s, was)
        moved += old_owner[s] != new_owner[s]
    return moved


def test_start_grows_three_to_four_moving_a_quarter_and_shrinks_back(server_factory):
    servers = start_fleet(server_factory, NAMES4, ring=NAMES3, on=NAMES3, algo="slots")
    for n in NAMES3:
        assert servers[n].client().config_set("shard.cluster-protocol", "yes")
    keys = write_keys(servers, "n0")
    before = holdings(servers, keys)
    first = assert_one_ring(servers, NAMES3, on=NAMES3)
    three = slot_owners(servers["n0"].client())

    c1 = servers["n1"].client()
    assert start_slots(c1, servers, NAMES4) == b"OK"
    st = wait_fleet(c1, "done")
    grown = assert_one_ring(servers, NAMES4)
    check_done(st, first, grown, {"n0": "both", "n1": "both", "n2": "both", "n3": "new"})
    four = slot_owners(servers["n3"].client())
    assert sum(a != b for a, b in zip(three, four)) == 4096, "a quarter of the slots moved"
    assert [four.count(n) for n in NAMES4] == [4096] * 4
    ring = {m["name"].decode(): m["slots"] for m in ring_get(c1)["nodes"]}
    assert ring == {"n0": b"0-4095", "n1": b"5461-9556", "n2": b"10923-15018",
                    "n3": b"4096-5460,9557-10922,15019-16383"}
    moved = check_moves(servers, keys, before, three, four)
    assert moved == servers["n3"].client().dbsize()
    # A quarter of the keys; the contiguous split of four (n1 from 4096, ...) moves half.
    contiguous = [min(s // 4096, 3) for s in range(16384)]
    half = sum(f"n{contiguous[key_slot(k.encode())]}" != three[key_slot(k.encode())]
               for k in keys)
    assert 0.2 * KEYS < moved < 0.3 * KEYS and 0.45 * KEYS < half < 0.55 * KEYS, (moved, half)

    # The cluster protocol shows the map, n3 with three ranges, and a cluster client follows it.
    assert servers["n3"].client().config_set("shard.cluster-protocol", "yes")
    port = {n: servers[n].port for n in NAMES4}
    want = sorted([(0, 4095, port["n0"]), (5461, 9556, port["n1"]), (10923, 15018, port["n2"]),
                   (4096, 5460, port["n3"]), (9557, 10922, port["n3"]),
                   (15019, 16383, port["n3"])])
    for n in NAMES4:
        assert cluster_slots(servers[n].client()) == want, n
    n3_line = [line for line in servers["n0"].client().execute_command("CLUSTER", "NODES")
               .decode().splitlines() if f":{port['n3']}@" in line]
    assert n3_line[0].endswith(" connected 4096-5460 9557-10922 15019-16383"), n3_line
    rc = cluster_client(servers)
    assert all(rc.get(k) == f"v-{k}".encode() for k in keys)
    rc.close()

    # Shrink from n2, n3 leaving: only n3's keys move, and the fleet is on the first ring again.
    before = holdings(servers, keys)
    c2 = servers["n2"].client()
    assert start_slots(c2, servers, NAMES3) == b"OK"
    st = wait_fleet(c2, "done")
    back = assert_one_ring(servers, NAMES3)
    assert back == first, "grown and shrunk back: the first ring, the same digest"
    check_done(st, grown, back, {"n0": "both", "n1": "both", "n2": "both", "n3": "old"})
    moved = check_moves(servers, keys, before, four, three)
    assert moved == len(before["n3"]) > 0
    assert servers["n3"].client().dbsize() == 0
    assert cluster_slots(servers["n0"].client()) == [
        (0, 5460, port["n0"]), (5461, 10922, port["n1"]), (10923, 16383, port["n2"])]
    rc = cluster_client(servers)
    assert all(rc.get(k) == f"v-{k}".encode() for k in keys)
    rc.close()


def test_start_with_an_explicit_map_moves_what_it_says(server_factory):
    servers = start_fleet(server_factory, NAMES3, algo="slots")
    keys = write_keys(servers, "n0")
    before = holdings(servers, keys)
    old = slot_owners(servers["n0"].client())
    first = assert_one_ring(servers, NAMES3)
    c0 = servers["n0"].client()
    args = ["SHARD.RESHARD", "START", "slots"]
    for name, ranges in (("n0", "100-5460"), ("n1", "0-99,5461-10922"), ("n2", "10923-16383")):
        args += [name, f"127.0.0.1:{servers[name].port}", 1, "SLOTS", ranges]
    assert c0.execute_command(*args) == b"OK"
    wait_fleet(c0, "done")
    assert_one_ring(servers, NAMES3)
    new = slot_owners(servers["n2"].client())
    assert [s for s in range(16384) if old[s] != new[s]] == list(range(100))
    moved = check_moves(servers, keys, before, old, new)
    assert moved == sum(key_slot(k.encode()) < 100 for k in keys) > 0

    # A map given that is the weights' own split is still the operator's: slots 0-99 go back
    # to n0 (the fewest moves from here would have n1 give up its highest slots instead).
    before = holdings(servers, keys)
    args = ["SHARD.RESHARD", "START", "slots"]
    for name, ranges in (("n0", "0-5460"), ("n1", "5461-10922"), ("n2", "10923-16383")):
        args += [name, f"127.0.0.1:{servers[name].port}", 1, "SLOTS", ranges]
    assert c0.execute_command(*args) == b"OK"
    wait_fleet(c0, "done")
    assert assert_one_ring(servers, NAMES3) == first, "the first ring, the same digest"
    assert slot_owners(servers["n1"].client()) == old
    assert check_moves(servers, keys, before, new, old) == moved


def ring_state(client):
    ring = ring_get(client)
    return ring["epoch"], ring["digest"], [(m["name"], m.get("slots")) for m in ring["nodes"]]


def test_an_explicit_map_is_answered_as_given_and_a_bad_one_is_refused(server_factory):
    servers = start_fleet(server_factory, NAMES3, ring=False)
    given = {"n0": "8192-9000,0-4095", "n1": "4096-8191", "n2": "9001-16382,16383"}
    args = []
    for n in NAMES3:
        args += [n, f"127.0.0.1:{servers[n].port}", 1, "SLOTS", given[n]]
    digests = set()
    for s in servers.values():
        c = s.client()
        assert c.execute_command("SHARD.RING", "SET", "slots", *args) == b"OK"
        assert c.config_set("shard.cluster-protocol", "yes")
        digests.add(ring_get(c)["digest"])
    assert len(digests) == 1
    c = servers["n1"].client()
    shown = {m["name"].decode(): m["slots"].decode() for m in ring_get(c)["nodes"]}
    assert shown == {"n0": "0-4095,8192-9000", "n1": "4096-8191", "n2": "9001-16383"}
    owner = [None] * 16384
    for n, text in given.items():
        for a, b in parse_ranges(text):
            owner[a:b + 1] = [n] * (b - a + 1)
    keys = [f"user:{i}" for i in range(3000)]
    assert owners(c, keys) == [owner[key_slot(k.encode())] for k in keys]
    port = {n: servers[n].port for n in NAMES3}
    assert cluster_slots(c) == [(0, 4095, port["n0"]), (4096, 8191, port["n1"]),
                                (8192, 9000, port["n0"]), (9001, 16383, port["n2"])]
    shards = c.execute_command("CLUSTER", "SHARDS")
    n0 = [s for s in shards if s[3][0][3] == port["n0"]]
    assert n0[0][1] == [0, 4095, 8192, 9000]

    # Bad maps: an ERR that says what is wrong, and the ring as it was.
    state = ring_state(c)
    n = lambda name, ranges: [name, f"127.0.0.1:{port[name]}", 1, "SLOTS", ranges]  # noqa: E731
    bad = [  # (ring arguments, what the error says)
        (["slots", *n("n0", "0-8191"), *n("n1", "8192-16382")],
         "slot 16383 is given to no node"),
        (["slots", *n("n0", "0-8191"), *n("n1", "8000-16383")],
         "slot 8000 is given to both node 'n0' and node 'n1'"),
        (["slots", *n("n0", "0-16383"), "n1", f"127.0.0.1:{port['n1']}", 1],
         "node 'n1' has no SLOTS"),
        (["slots", *n("n0", "0-16384")], "slots are 0 to 16383"),
        (["slots", *n("n0", "5-0")], "the first slot is after the last"),
        (["slots", *n("n0", "0-100"), *n("n1", "101-16383"), "n2"], "SLOTS ranges"),
        (["slots", "HASHTAG", "cluster", *n("n0", "0-16382")], "slot 16383 is given to no node"),
        (["ketama", *n("n0", "0-16383")], "only the slots algo takes a slot map"),
    ]
    raw = Raw(servers["n1"].port)
    for sub in ("SET", "BEGIN"):
        for args, message in bad:
            reply = raw.execute("SHARD.RING", sub, *args)
            assert reply.startswith(b"-ERR ") and message.encode() in reply, (sub, args, reply)
            assert ring_state(c) == state, "nothing applied"
    reply = raw.execute("SHARD.RESHARD", "START", *bad[0][0])
    assert reply.startswith(b"-ERR ") and b"slot 16383 is given to no node" in reply, reply
    assert ring_get(c)["previous"] is None and ring_state(c) == state
    assert fleet_status(c) is None, "no plan"
    raw.close()


@pytest.mark.parametrize("how", ["rdb", "aof"])
def test_the_map_survives_a_restart(server_factory, how):
    s = server_factory(config=AOF if how == "aof" else ())
    c = s.client()
    first = ["slots", "a", "127.0.0.1:7001", 1, "SLOTS", "0-99,200-16383",
             "b", "127.0.0.1:7002", 1, "SLOTS", "100-199"]
    second = ["slots", "a", "127.0.0.1:7001", 1, "SLOTS", "0-99,300-16383",
              "b", "127.0.0.1:7002", 1, "SLOTS", "100-199",
              "c", "127.0.0.1:7003", 1, "SLOTS", "200-299"]
    assert c.execute_command("SHARD.RING", "SET", *first) == b"OK"
    assert c.execute_command("SHARD.RING", "BEGIN", *second) == b"OK"
    keys = [f"key:{i}" for i in range(2000)]
    where = owners(c, keys)
    assert {"a", "b", "c"} == set(where)
    got = ring_get(c)
    if how == "rdb":
        assert c.save()
    c.close()
    s.stop(signal.SIGTERM if how == "rdb" else signal.SIGKILL)
    if how == "aof":
        assert not (s.workdir / "dump.rdb").exists(), "the rings must come from the AOF alone"
    s.start()
    c = s.client()
    again = ring_get(c)
    assert again == got
    assert [m["slots"] for m in again["nodes"]] == [b"0-99,300-16383", b"100-199", b"200-299"]
    assert [m["slots"] for m in again["previous"]["nodes"]] == [b"0-99,200-16383", b"100-199"]
    assert owners(c, keys) == where
    assert c.execute_command("SHARD.RING", "ABORT") == b"OK"
    assert owners(c, keys) == ["b" if 100 <= key_slot(k.encode()) < 200 else "a" for k in keys]
