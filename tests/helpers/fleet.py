"""Fleets: named servers with the module, each with `self` set to its own name, and the rings
that join them. `Fleet` is a dict of name -> RedisServer with the clients and the look-ups the
tests need (owners, a key of a given owner, SHARD.CALL's counters); `start_fleet` starts one and
sets its ring; `populate` and `snapshot` write and read back keys of every type, so that a
resharding can be checked key by key.
"""

import random
import time

import redis

from helpers.resp import Raw
from helpers.server import as_map, info_shard

NAMES3 = ["n0", "n1", "n2"]
NAMES4 = NAMES3 + ["n3"]
NAMES = tuple(NAMES3)
# SHARD.CALL's call-timeout-ms in the fleets of `make_fleet`.
TIMEOUT_MS = 500
KEYS = 50_000  # populate's default
TYPES = ("string", "hash", "list", "set", "zset", "stream")


def ring_args(servers, names, extra=()):
    """The node arguments of SHARD.RING SET for the servers of `names` (weight 1 each, or the
    weights of a {name: weight} dict), then `extra` (name, port) nodes of weight 1."""
    weights = names if isinstance(names, dict) else dict.fromkeys(names, 1)
    args = []
    for name, weight in weights.items():
        args += [name, f"127.0.0.1:{servers[name].port}", weight]
    for name, port in extra:
        args += [name, f"127.0.0.1:{port}", 1]
    return args


def set_ring(servers, names, clients=None, algo="ketama"):
    """SHARD.RING SET of the ring of `names` on every server (or on `clients`: servers or
    redis-py clients)."""
    for s in (clients or servers.values()):
        c = s.client() if hasattr(s, "client") else s
        assert c.execute_command("SHARD.RING", "SET", algo, *ring_args(servers, names)) == b"OK"


def owners(client, keys):
    """The owner of each key (SHARD.WHEREIS on `client`'s node), as str."""
    pipe = client.pipeline(transaction=False)
    for k in keys:
        pipe.execute_command("SHARD.WHEREIS", k)
    return [o.decode() for o in pipe.execute()]


def ring_get(client):
    """`SHARD.RING GET` as a dict (helpers.server.as_map): str keys, `nodes` a list of dicts."""
    return as_map(client.execute_command("SHARD.RING", "GET"))


def ring_of(client):
    """`SHARD.RING GET` as a dict, or None on a node that holds no ring."""
    try:
        return ring_get(client)
    except redis.ResponseError as e:
        if "no ring is set" in str(e):
            return None
        raise


def keys_of(client, owner, count=1, prefix="key", limit=20_000):
    """`count` keys `prefix:<i>` that the ring of `client`'s node gives to `owner`."""
    found = []
    for i in range(limit):
        key = f"{prefix}:{i}"
        if client.execute_command("SHARD.WHEREIS", key) == owner.encode():
            found.append(key)
            if len(found) == count:
                return found
    raise AssertionError(f"fewer than {count} of {limit} keys {prefix}:* belong to {owner}")


def key_of(client, owner, prefix="key"):
    """A key `prefix:<i>` that the ring of `client`'s node gives to `owner`."""
    return keys_of(client, owner, 1, prefix)[0]


class Fleet(dict):
    """Named servers (name -> RedisServer), with their clients and the ring's look-ups."""

    def client(self, name, **kwargs):
        return self[name].client(**kwargs)

    def raw(self, name, **kwargs):
        s = self[name]
        kwargs.setdefault("password", s.password)
        kwargs.setdefault("tls", s.tls)
        return Raw(s.port, **kwargs)

    def ring_args(self, names, extra=()):
        return ring_args(self, names, extra)

    def ring(self, names, verb="SET", on=None, extra=(), hashtag=None, algo="ketama"):
        """SHARD.RING SET (or BEGIN) of the ring of `names` on every server (or those of `on`);
        the digests agree."""
        tag = ["HASHTAG", hashtag] if hashtag else []
        digests = set()
        for n in on or self:
            c = self.client(n)
            assert c.execute_command("SHARD.RING", verb, algo, *tag,
                                     *self.ring_args(names, extra)) == b"OK"
            digests.add(ring_get(c)["digest"])
        assert len(digests) == 1, digests

    def owners(self, keys, via=None):
        return owners(self.client(via or next(iter(self))), keys)

    def key_of(self, owner, prefix="key", via=None):
        """A key the ring gives to `owner`."""
        return key_of(self.client(via or next(iter(self))), owner, prefix)

    def calls(self, name):
        """SHARD.CALL's counters of a server (INFO shard's call_* fields)."""
        return {k: int(v) for k, v in info_shard(self.client(name)).items()
                if k.startswith("call_")}

    def total(self, field):
        return sum(self.calls(n).get(field, 0) for n in self)


def start_fleet(server_factory, names, ring=None, on=None, module_args=(), per_node_args=None,
                config=(), password=None, algo="ketama"):
    """One server per name, with `self` set to it, then `module_args` and its own
    `per_node_args[name]`; the ring of `ring` (default: every name; a {name: weight} dict for
    weights; False: no ring) is set on the servers of `on` (default: all)."""
    fleet = Fleet()
    for n in names:
        args = ["self", n, *module_args, *((per_node_args or {}).get(n, ()))]
        fleet[n] = server_factory(module_args=args, config=config, password=password)
    if ring is not False:
        fleet.ring(names if ring is None else ring, on=on, algo=algo)
    return fleet


def make_fleet(server_factory, names=NAMES, ring=None, timeout_ms=TIMEOUT_MS, args=(),
               per_node_args=None, config=(), password=None):
    """The SHARD.CALL tests' fleet: `start_fleet` with `call-timeout-ms` (500 ms by default)
    and the ring of `ring` (default: all) on every server."""
    return start_fleet(server_factory, names, ring=ring, config=config, password=password,
                       module_args=["call-timeout-ms", timeout_ms, *args],
                       per_node_args=per_node_args)


# --- keys of every type, written to their owners and read back ---------------------------------


def populate(servers, n=KEYS, seed=1):
    """Writes n keys of every type to their owners; a tenth get a TTL."""
    rng = random.Random(seed)
    keys = [f"k:{i}:{TYPES[i % len(TYPES)]}" for i in range(n)]
    any_client = next(iter(servers.values())).client()
    by_owner = {}
    for key, owner in zip(keys, owners(any_client, keys)):
        by_owner.setdefault(owner, []).append(key)
    for owner, owned in by_owner.items():
        pipe = servers[owner].client().pipeline(transaction=False)
        for key in owned:
            kind = key.rsplit(":", 1)[1]
            i = int(key.split(":")[1])
            if kind == "string":
                pipe.set(key, f"value-{i}-" + "x" * rng.randrange(0, 50))
            elif kind == "hash":
                pipe.hset(key, mapping={f"f{j}": j * i for j in range(rng.randrange(1, 6))})
            elif kind == "list":
                pipe.rpush(key, *[f"e{j}" for j in range(rng.randrange(1, 6))])
            elif kind == "set":
                pipe.sadd(key, *[f"m{j}" for j in range(rng.randrange(1, 6))])
            elif kind == "zset":
                pipe.zadd(key, {f"z{j}": j * 1.5 for j in range(rng.randrange(1, 6))})
            else:
                for j in range(rng.randrange(1, 4)):
                    pipe.xadd(key, {"n": j}, id=f"{j + 1}-0")
            if i % 10 == 0:
                pipe.pexpire(key, 600_000 + i)
        pipe.execute()
    return keys


# DUMP and PTTL of each key given (ARGV, not KEYS: a server redirects no script for its keys),
# and a set's members: one script call a batch, so that the server, not the client, loops.
SNAPSHOT_SCRIPT = """
local out = {}
for _, k in ipairs(ARGV) do
    local dump = redis.call('DUMP', k)
    out[#out + 1] = dump
    out[#out + 1] = redis.call('PTTL', k)
    if dump and string.sub(k, -4) == ':set' then
        out[#out + 1] = redis.call('SMEMBERS', k)
    else
        out[#out + 1] = false
    end
end
return out
"""


class Snapshot(dict):
    """key -> [(server, value, pttl)], and when it was taken (`taken_at`, time.monotonic())."""


def snapshot(servers, keys, batch=1000):
    """key -> [(server, value, pttl)] for every server that holds it.

    The value is the DUMP payload, except for sets: Redis 7.0 serializes a hashtable set in
    its hash order, which differs after a RESTORE, so a set is compared by its members.
    """
    holders = Snapshot()
    holders.taken_at = time.monotonic()
    for name, s in servers.items():
        c = s.client()
        sha = c.script_load(SNAPSHOT_SCRIPT)
        for i in range(0, len(keys), batch):
            part = keys[i:i + batch]
            replies = c.evalsha(sha, 0, *part)
            for k, dump, ttl, members in zip(part, replies[::3], replies[1::3], replies[2::3]):
                if dump is not None:
                    value = sorted(members) if k.endswith(":set") else dump
                    holders.setdefault(k, []).append((name, value, ttl))
    return holders


def check_placement(servers, names, keys, before):
    """Each key lives exactly on its owner under the ring of `names`, unchanged since `before`
    (a `snapshot`): the same value, and the TTL it had then, counted down since (within a
    minute, and the time the test took since the snapshot)."""
    live = {n: servers[n] for n in names}
    after = snapshot(live, keys)
    elapsed_ms = (after.taken_at - before.taken_at) * 1000
    expected = dict(zip(keys, owners(live[names[0]].client(), keys)))
    assert set(after) == set(keys), "no key lost"
    for k in keys:
        holders = after[k]
        assert [h[0] for h in holders] == [expected[k]], (k, holders)
        _, dump, ttl = holders[0]
        _, old_dump, old_ttl = before[k][0]
        assert dump == old_dump, k
        if old_ttl == -1:
            assert ttl == -1, k
        else:
            assert -60_000 - elapsed_ms < ttl - old_ttl < 60_000 and ttl > 0, (k, ttl, old_ttl)
    assert sum(live[n].client().dbsize() for n in names) == len(keys)


def assert_in_place(servers, keys, before, via):
    """Each of `keys` is held by exactly one server (all servers are looked at), its owner under
    the ring of `via`, with the value it had in `before` (a `snapshot`)."""
    after = snapshot(servers, keys)
    expected = dict(zip(keys, owners(via, keys)))
    for k in keys:
        holders = after.get(k, [])
        assert [h[0] for h in holders] == [expected[k]], (k, expected[k], holders)
        assert holders[0][1] == before[k][0][1], f"{k} changed"


def assert_owned_only(servers, via):
    """Every key of every server (all of database 0) is owned by that server under the ring of
    `via` (`SHARD.WHEREIS`); returns how many keys the servers hold in all."""
    total = 0
    for name, s in servers.items():
        keys = list(s.client().scan_iter(count=1000))
        total += len(keys)
        stray = [(k, o) for k, o in zip(keys, owners(via, keys)) if o != name]
        assert not stray, f"{len(stray)} keys on {name}, which does not own them: {stray[:10]}"
    return total
