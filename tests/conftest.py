"""Fixtures shared by the test files: real servers with the module loaded, on loopback ports of
this test process (tests/helpers/ports.py), the TLS certificates, and Redis Sentinels.

Everything else the tests share (the server process, fleets, rings, waits, clients) is in
tests/helpers/; this file only turns it into fixtures, each of which stops what it started when
the test ends, however the test ends.
"""

import json
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from helpers.clock import build_shim
from helpers.npm import npm_folder
from helpers.partition import Addresses, NftUnavailable, Partition
from helpers.sentinel import Sentinel
from helpers.server import REDIS_SERVER, SERVER_NAME, SERVER_VERSION, RedisServer
from helpers.tls import make_certs


def pytest_report_header(config):
    return f"server under test: {REDIS_SERVER} ({SERVER_NAME} {'.'.join(map(str, SERVER_VERSION))})"


def pytest_collection_modifyitems(config, items):
    """The tests marked `slow` first, in their files' order: side by side (pytest-xdist,
    tests/run.py), a long test that starts last keeps the run going alone."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture
def server_factory(tmp_path):
    """Starts servers on demand: `server_factory(module_args=..., config=...)`."""
    servers = []

    def make(module_args=(), config=(), start=True, env=None, password=None, tls=None,
             host=None):
        s = RedisServer(tmp_path / f"server{len(servers)}", module_args, config, env, password,
                        tls, host=host)
        servers.append(s)
        return s.start() if start else s

    yield make
    for s in servers:
        s.stop(signal.SIGKILL)


@pytest.fixture
def server(server_factory):
    return server_factory()


@pytest.fixture
def r(server):
    """A RESP2 client of a fresh server with the default configuration."""
    return server.client()


@pytest.fixture(scope="session")
def certs(tmp_path_factory):
    """The TLS tests' certificates (tests/helpers/tls.py), made once per test process."""
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="session")
def clockshim(tmp_path_factory):
    """tests/clockshim.c built once per test process (tests/helpers/clock.py)."""
    return build_shim(tmp_path_factory.mktemp("clockshim"))


@pytest.fixture
def sentinel_factory(tmp_path):
    """Starts Redis Sentinels: `sentinel_factory({name: port or "host:port"}, tls=None,
    host=None)`."""
    made = []

    def make(masters, port=None, tls=None, host=None):
        s = Sentinel(tmp_path / f"sentinel{len(made)}", masters, port, tls, host=host)
        made.append(s)
        return s

    yield make
    for s in made:
        s.stop()


@pytest.fixture
def partition():
    """This test process's nft table (tests/helpers/partition.py), deleted when the test ends,
    however it ends; `partition.addresses.next()` gives a loopback address of this process's own.
    Skips only where nft cannot work (not root, no nf_tables in the kernel)."""
    try:
        part = Partition().__enter__()
    except NftUnavailable as e:
        pytest.skip(f"network partitions: {e}")
    part.addresses = Addresses()
    try:
        yield part
    finally:
        part.close()


CLIENTS = Path(__file__).resolve().parent / "clients"
IOREDIS = "5.4.2"


@pytest.fixture(scope="session")
def ioredis(tmp_path_factory):
    """tests/clients/ioredis_cluster.js with ioredis (npm, pinned): tests/clients/node_modules
    when it is installed there, otherwise installed once for the run (tests/helpers/npm.py).
    `ioredis(mode, port, commands)` runs the commands and returns their results."""
    assert shutil.which("node") and shutil.which("npm"), "node and npm run the ioredis client"
    directory = npm_folder(tmp_path_factory, CLIENTS, ("package.json", "ioredis_cluster.js"),
                           "ioredis", IOREDIS)

    def run(mode, port, commands):
        done = subprocess.run(["node", str(directory / "ioredis_cluster.js"), mode,
                               f"127.0.0.1:{port}"], input=json.dumps(commands).encode(),
                              capture_output=True, timeout=120)
        assert done.returncode == 0, done.stderr.decode(errors="replace")
        return json.loads(done.stdout)
    run.script = directory / "ioredis_cluster.js"
    return run
