"""twemproxy (Debian's `nutcracker`) as a peer: keys written through a real nutcracker in front of
real servers with the module (ketama, md5, unequal weights, named servers) are found on the node
`SHARD.WHEREIS` names, binary keys included; nutcracker's own multi-key commands (MGET, MSET,
DEL, UNLINK, TOUCH, and EXISTS, which it does not split) across the nodes, as a check of the
peer; and SHARD.CALL through one node reads what nutcracker wrote.

One known difference: the empty key. nutcracker 0.5.0 gives a key of length 0 the hash 0
(`server_pool_hash` in nc_server.c: `if (keylen == 0) return 0`), so it lives on the node of the
ring's lowest point; the module, libketama and uhashring hash it with MD5 like any other key.
The test pins both answers down.

Clients of nutcracker are redis-py with `lib_name=None, lib_version=None` and RESP2: redis-py 5
otherwise sends CLIENT SETINFO on connect, which nutcracker answers by closing the connection.
"""

import hashlib
import random
import shutil
import signal
import subprocess
import time

import pytest
import redis
from uhashring import HashRing

from helpers.fleet import start_fleet
from helpers.ports import free_port
from helpers.server import pipelined

NUTCRACKER = shutil.which("nutcracker")
START_TIMEOUT = 10.0
pytestmark = pytest.mark.skipif(NUTCRACKER is None,
                                reason="nutcracker is not installed (make test installs it)")

# (name, weight): names as a user might write them, with dots, braces, dashes and UTF-8.
RINGS = {
    "weights-1-3-7": [("cache.example.com", 1), ("n{1}", 3), ("shard-\u00e9", 7)],
    "weights-10-1-2": [("redis_7", 10), ("\u03b1\u03b2", 1), ("node-002", 2)],
}
KEY_COUNT = 3000


class Nutcracker:
    """One nutcracker process on a free port, with its stats on another free port."""

    def __init__(self, workdir, servers):
        """`servers`: [(port, weight, name)]."""
        self.workdir = workdir
        self.servers = servers
        self.proc = None
        self.port = None
        self.log = workdir / "nutcracker.log"

    def config(self):
        lines = [
            "fleet:",
            f"  listen: 127.0.0.1:{self.port}",
            "  hash: md5",
            "  distribution: ketama",
            "  redis: true",
            "  server_connections: 1",
            "  auto_eject_hosts: false",
            "  timeout: 5000",
            "  servers:",
        ]
        lines += [f"   - 127.0.0.1:{port}:{weight} {name}" for port, weight, name in self.servers]
        return "\n".join(lines) + "\n"

    def start(self):
        # A free port may be taken between the check and nutcracker's bind: try a few times.
        for _ in range(3):
            self.port = free_port()
            conf = self.workdir / "nutcracker.yml"
            conf.write_text(self.config(), encoding="utf-8")
            self.proc = subprocess.Popen(
                [NUTCRACKER, "-c", str(conf), "-s", str(free_port()), "-a", "127.0.0.1",
                 "-o", str(self.log), "-p", str(self.workdir / "nutcracker.pid")],
                stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
            deadline = time.monotonic() + START_TIMEOUT
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    if self.client(socket_timeout=0.5).ping():
                        return self
                except (redis.ConnectionError, redis.TimeoutError):
                    time.sleep(0.05)
            self.stop()
        raise AssertionError(f"nutcracker did not answer PING:\n{self.read_log()}")

    def client(self, **kwargs):
        kwargs.setdefault("socket_timeout", 30)
        return redis.Redis(host="127.0.0.1", port=self.port, protocol=2,
                           lib_name=None, lib_version=None, **kwargs)

    def read_log(self):
        try:
            return self.log.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"

    def stop(self):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)
        self.proc = None


@pytest.fixture
def nutcracker_factory(tmp_path):
    """Starts nutcracker in front of the given servers; every one is killed when the test ends."""
    started = []

    def make(servers):
        workdir = tmp_path / f"nutcracker{len(started)}"
        workdir.mkdir()
        proxy = Nutcracker(workdir, servers)
        started.append(proxy)
        return proxy.start()

    yield make
    for proxy in started:
        proxy.stop()


def peer_keys(count=KEY_COUNT):
    """`count` distinct keys, always the same: every single byte, every byte inside a key,
    spaces, CR and LF, RESP fragments, braces, UTF-8, the empty key, long keys, random bytes."""
    rng = random.Random(20261123)
    keys = [bytes([b]) for b in range(256)]
    keys += [b"k" + bytes([b]) + b"k" for b in range(256)]
    keys += [b"", b" ", b"  ", b"a b", b" lead", b"trail ", b"\r\n", b"\r", b"\n",
             b"line\r\nbreak", b"*1\r\n$4\r\nPING\r\n", b"$-1\r\n", b"-ERR x", b"+OK",
             b"{tag}a", b"{tag}b", b"a{tag}", b"{}", b"}{", b"\x00\x00\x00",
             b"\xff" * 8, "\u00fcn\u00efc\u00f6de".encode(), "\U0001F600".encode(),
             "\u6f22\u5b57 key".encode(), b"x" * 1000, b"y" * 5000]
    keys = list(dict.fromkeys(keys))
    seen = set(keys)
    while len(keys) < count:
        r = rng.random()
        if r < 0.5:
            k = b"user:%d" % rng.randrange(10 ** 9)
        elif r < 0.8:
            k = bytes(rng.randrange(256) for _ in range(rng.randint(1, 40)))
        else:
            k = "".join(chr(rng.choice([rng.randrange(32, 127), rng.randrange(0xA0, 0x3000)]))
                        for _ in range(rng.randint(1, 12))).encode()
        if k not in seen:
            seen.add(k)
            keys.append(k)
    return keys


def value_of(key):
    return b"v-" + hashlib.md5(key).hexdigest().encode()


def holders(servers, keys):
    """{key: set of names of the servers where it exists}, by a plain EXISTS on each."""
    found = {k: set() for k in keys}
    for name, s in servers.items():
        exists = pipelined(s.client(), [("EXISTS", k) for k in keys], raise_on_error=False)
        for k, n in zip(keys, exists):
            if n:
                found[k].add(name)
    return found


def describe(bad, limit=10):
    return "\n".join(f"  {k!r}: {what}" for k, what in bad[:limit]) + (
        f"\n  ... and {len(bad) - limit} more" if len(bad) > limit else "")


@pytest.mark.parametrize("ring_name", sorted(RINGS))
def test_keys_written_through_nutcracker_are_where_whereis_says(server_factory,
                                                                 nutcracker_factory, ring_name):
    ring = RINGS[ring_name]
    servers = start_fleet(server_factory, [n for n, _ in ring], ring=dict(ring))
    proxy = nutcracker_factory([(servers[n].port, w, n) for n, w in ring])
    via = proxy.client()
    keys = peer_keys()
    assert len(set(keys)) == len(keys) >= KEY_COUNT

    replies = pipelined(via, [("SET", k, value_of(k)) for k in keys], raise_on_error=False)
    bad = [(k, r) for k, r in zip(keys, replies) if r is not True]
    assert not bad, "SET through nutcracker failed:\n" + describe(bad)

    first = next(iter(servers.values())).client()
    owners = [o.decode() for o in pipelined(first, [("SHARD.WHEREIS", k) for k in keys],
                                            raise_on_error=False)]
    found = holders(servers, keys)

    # The empty key (see the module's docstring): WHEREIS hashes it as uhashring does,
    # nutcracker puts it on the owner of the lowest point.
    peer = HashRing(nodes={name: {"weight": w} for name, w in ring}, hash_fn="ketama")
    assert owners[keys.index(b"")] == peer.get_node("")
    assert found[b""] == {min(peer.get_points())[1]}
    others = [(k, o) for k, o in zip(keys, owners) if k != b""]
    keys, owners = [k for k, _ in others], [o for _, o in others]

    bad = [(k, f"WHEREIS says {o}, the key is on {sorted(found[k])}")
           for k, o in zip(keys, owners) if found[k] != {o}]
    assert not bad, (f"{len(bad)} of {len(keys)} keys written through nutcracker are not (only) "
                     f"where SHARD.WHEREIS says:\n" + describe(bad))

    # The value is the one written, on the owner, by a plain GET there.
    for name, s in servers.items():
        mine = [k for k, o in zip(keys, owners) if o == name]
        got = pipelined(s.client(), [("GET", k) for k in mine], raise_on_error=False)
        bad = [(k, f"GET on {name} gives {v!r}") for k, v in zip(mine, got) if v != value_of(k)]
        assert not bad, describe(bad)

    # The weights matter to both: the heavier a node, the more keys it holds.
    counts = {name: owners.count(name) for name, _ in ring}
    by_weight = [name for name, _ in sorted(ring, key=lambda nw: nw[1])]
    assert [counts[n] for n in by_weight] == sorted(counts.values()), counts


def test_nutcracker_multi_key_commands_across_nodes(server_factory, nutcracker_factory):
    """nutcracker splits MGET, MSET, DEL, UNLINK and TOUCH by owner and merges the replies
    (EXISTS it does not split): checked against plain commands on each server and
    SHARD.WHEREIS."""
    ring = RINGS["weights-1-3-7"]
    servers = start_fleet(server_factory, [n for n, _ in ring], ring=dict(ring))
    proxy = nutcracker_factory([(servers[n].port, w, n) for n, w in ring])
    via = proxy.client()
    first = next(iter(servers.values())).client()
    keys = [k for k in peer_keys(601) if k]  # not the empty key: nutcracker hashes it to 0
    owners = dict(zip(keys, (o.decode() for o in
                             pipelined(first, [("SHARD.WHEREIS", k) for k in keys],
                                       raise_on_error=False))))

    # MSET through nutcracker, 100 keys a command: each key lands on its owner.
    for i in range(0, len(keys), 100):
        part = keys[i:i + 100]
        assert len({owners[k] for k in part}) == len(ring)  # every command spans every node
        assert via.execute_command("MSET", *[x for k in part for x in (k, value_of(k))]) is True
    found = holders(servers, keys)
    bad = [(k, f"on {sorted(found[k])}, WHEREIS says {owners[k]}")
           for k in keys if found[k] != {owners[k]}]
    assert not bad, describe(bad)

    # MGET: the values in the caller's order, nil for keys that do not exist.
    missing = [b"missing:%d" % i for i in range(5)]
    asked = keys[:200] + missing
    random.Random(7).shuffle(asked)
    got = via.execute_command("MGET", *asked)
    assert got == [None if k in missing else value_of(k) for k in asked]

    # TOUCH, DEL, UNLINK: split by owner, the replies summed.
    part = keys[200:320] + missing
    assert via.execute_command("TOUCH", *part) == 120
    # EXISTS is not split: nutcracker 0.5.0 sends the whole command to the first key's owner
    # (its redis_fragment splits only MGET, DEL, TOUCH, UNLINK and MSET), so the count is of
    # the keys that node holds.
    first_owner = owners[part[0]]
    assert via.execute_command("EXISTS", *part) == sum(
        owners.get(k) == first_owner for k in part) < 120
    assert via.execute_command("DEL", *keys[200:260], *missing) == 60
    assert via.execute_command("UNLINK", *keys[260:320], *missing) == 60
    assert via.execute_command("TOUCH", *part) == 0
    found = holders(servers, keys[200:320])
    assert not any(found.values()), {k: v for k, v in found.items() if v}
    assert via.execute_command("MGET", *keys[200:320]) == [None] * 120
    # The keys not deleted are still there, on their owners.
    assert via.execute_command("TOUCH", *keys[320:]) == len(keys) - 320
    found = holders(servers, keys[320:])
    assert all(found[k] == {owners[k]} for k in keys[320:])


def test_shard_call_reads_what_nutcracker_wrote(server_factory, nutcracker_factory):
    """The other direction of the same agreement: SHARD.CALL through any one node finds every key
    nutcracker placed, and a key SHARD.CALL writes is read back through nutcracker."""
    ring = RINGS["weights-10-1-2"]
    servers = start_fleet(server_factory, [n for n, _ in ring], ring=dict(ring))
    proxy = nutcracker_factory([(servers[n].port, w, n) for n, w in ring])
    via = proxy.client()
    keys = [k for k in peer_keys(1501) if k]  # not the empty key: nutcracker hashes it to 0
    assert all(r is True for r in pipelined(via, [("SET", k, value_of(k)) for k in keys],
                                            raise_on_error=False))
    for name, s in servers.items():
        got = pipelined(s.client(), [("SHARD.CALL", "GET", k) for k in keys],
                        raise_on_error=False)
        bad = [(k, f"SHARD.CALL GET through {name} gives {v!r}")
               for k, v in zip(keys, got) if v != value_of(k)]
        assert not bad, describe(bad)
    node = next(iter(servers.values())).client()
    written = [b"call:" + k for k in keys[:300]]
    assert all(r == b"OK" for r in
               pipelined(node, [("SHARD.CALL", "SET", k, b"w" + k) for k in written],
                         raise_on_error=False))
    assert via.execute_command("MGET", *written) == [b"w" + k for k in written]
    # Split commands agree: SHARD.CALL's MGET equals nutcracker's, DEL and EXISTS count alike.
    mget = ("MGET", *keys[:200], b"none:at:all")
    assert node.execute_command("SHARD.CALL", *mget) == via.execute_command(*mget)
    half = keys[:200:2]
    assert node.execute_command("SHARD.CALL", "DEL", *half) == len(half)
    assert node.execute_command("SHARD.CALL", "EXISTS", *keys[:200]) == 200 - len(half)
    assert via.execute_command("DEL", *keys[:200]) == 200 - len(half)
