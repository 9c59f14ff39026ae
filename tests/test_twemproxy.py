"""twemproxy as a peer: keys written through Debian's `nutcracker` (md5, ketama, weights, node
names) are found on the node SHARD.WHEREIS names, binary keys included, and its split MGET/DEL
agree with SHARD.CALL's."""
# nutcracker is installed by `make test` (Makefile APT_PACKAGES).

import shutil
import subprocess
import time

import pytest

from conftest import free_port
from test_call import Raw


@pytest.fixture(scope="module", autouse=True)
def nutcracker_installed():
    assert shutil.which("nutcracker"), "nutcracker is missing: `make test` installs it (Debian)"

WEIGHTS = {"alpha": 1, "beta": 2, "gamma": 3}


@pytest.fixture
def proxied(server_factory, tmp_path):
    servers = {n: server_factory(module_args=["self", n]) for n in WEIGHTS}
    ring = ["SHARD.RING", "SET", "ketama"]
    for n, s in servers.items():
        ring += [n, f"127.0.0.1:{s.port}", WEIGHTS[n]]
    for s in servers.values():
        assert s.client().execute_command(*ring) == b"OK"
    port, stats = free_port(), free_port()
    conf = tmp_path / "nutcracker.yml"
    conf.write_text(
        "fleet:\n"
        f"  listen: 127.0.0.1:{port}\n"
        "  hash: md5\n  distribution: ketama\n  redis: true\n  server_connections: 1\n"
        "  auto_eject_hosts: false\n  servers:\n"
        + "".join(f"   - 127.0.0.1:{s.port}:{WEIGHTS[n]} {n}\n" for n, s in servers.items()))
    proc = subprocess.Popen(["nutcracker", "-c", str(conf), "-s", str(stats),
                             "-o", str(tmp_path / "nutcracker.log")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                raw = Raw(port, timeout=5)
                assert raw.execute("PING") == b"+PONG\r\n"
                break
            except OSError:
                assert time.monotonic() < deadline, "nutcracker did not start"
                time.sleep(0.05)
        yield servers, raw
    finally:
        proc.kill()
        proc.wait(10)


def keys_to_try():
    keys = [f"user:{i}".encode() for i in range(2000)]
    keys += [bytes([i, 255 - i, 13, 10, i]) + b"bin" for i in range(256)]  # every byte value
    keys += [b"with space %d" % i for i in range(50)] + ["ünïcödé:%d".encode() % i for i in range(50)]
    keys += [b"{tag}:%d" % i for i in range(50)]
    return keys


def test_keys_written_through_twemproxy_are_where_whereis_says(proxied):
    servers, proxy = proxied
    keys = keys_to_try()
    replies = proxy.pipeline([("SET", k, k) for k in keys])
    assert set(replies) == {b"+OK\r\n"}
    first = next(iter(servers.values())).client()
    pipe = first.pipeline(transaction=False)
    for k in keys:
        pipe.execute_command("SHARD.WHEREIS", k)
    owners = [o.decode() for o in pipe.execute()]
    assert set(owners) == set(WEIGHTS), "every node owns some keys"
    misplaced = []
    for name, s in servers.items():
        c = s.client()
        pipe = c.pipeline(transaction=False)
        for k in keys:
            pipe.exists(k)
        for k, owner, there in zip(keys, owners, pipe.execute()):
            if bool(there) != (owner == name):
                misplaced.append((k, owner, name, there))
    assert not misplaced, f"{len(misplaced)} of {len(keys)} keys are not where WHEREIS says: {misplaced[:5]}"
    assert sum(s.client().dbsize() for s in servers.values()) == len(keys)


def test_split_mget_and_del_agree_with_shard_call(proxied):
    servers, proxy = proxied
    keys = [b"k:%d" % i for i in range(60)] + [b"\x00\xff:%d" % i for i in range(20)]
    proxy.pipeline([("SET", k, b"v" + k) for k in keys])
    node = next(iter(servers.values()))
    via_node = Raw(node.port)
    mget = ("MGET", *keys, b"k:none")
    assert proxy.execute(*mget) == via_node.execute("SHARD.CALL", *mget)
    half = keys[::2]
    assert via_node.execute("SHARD.CALL", "DEL", *half) == b":%d\r\n" % len(half)
    # (nutcracker 0.5.0 sends a multi-key EXISTS whole to its first key's server: compare
    # SHARD.CALL's split EXISTS with the nodes' own counts instead.)
    on_nodes = sum(s.client().exists(*keys) for s in servers.values())
    assert on_nodes == len(keys) - len(half)
    assert via_node.execute("SHARD.CALL", "EXISTS", *keys) == b":%d\r\n" % on_nodes
    assert proxy.execute("DEL", *keys) == b":%d\r\n" % (len(keys) - len(half))
    assert sum(s.client().dbsize() for s in servers.values()) == 0
