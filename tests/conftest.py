"""Fixtures: real redis-server processes with the module loaded, on free loopback ports.

Each server runs in its own temporary directory with its own log, and is stopped (SIGTERM,
then SIGKILL) when the test ends, however it ends.
"""

import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import redis

ROOT = Path(__file__).resolve().parent.parent
# SHARD_MODULE tests another build of the module (as bench/run.py does).
MODULE = Path(os.environ.get("SHARD_MODULE", ROOT / "target" / "release" / "libshard.so"))
REDIS_SERVER = os.environ.get("REDIS_SERVER", "redis-server")
START_TIMEOUT = 10.0


def _server_identity():
    """("redis" or "valkey", (major, minor, patch)) of the REDIS_SERVER binary."""
    out = subprocess.run([REDIS_SERVER, "--version"], capture_output=True, text=True,
                         timeout=10).stdout
    match = re.search(r"^(\w+) server v=(\d+)\.(\d+)\.(\d+)", out)
    if not match:
        raise RuntimeError(f"cannot tell which server {REDIS_SERVER} is: {out!r}")
    return match.group(1).lower(), tuple(int(x) for x in match.groups()[1:])


SERVER_NAME, SERVER_VERSION = _server_identity()
# Redis 7.2 and Valkey let a module give its commands ACL categories; Redis 7.0 gives none.
MODULE_ACL_CATEGORIES = SERVER_NAME == "valkey" or SERVER_VERSION >= (7, 2, 0)
# Command filters learn which client sent a command (RedisModule_CommandFilterGetClientId).
FILTER_SEES_CLIENT = SERVER_NAME == "valkey" or SERVER_VERSION >= (7, 2, 0)


def pytest_report_header(config):
    return f"server under test: {REDIS_SERVER} ({SERVER_NAME} {'.'.join(map(str, SERVER_VERSION))})"


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerFailed(Exception):
    """redis-server exited or never answered; the message holds its log."""


class RedisServer:
    """One redis-server with the module, started by `start()` and stopped by `stop()`."""

    def __init__(self, workdir, module_args=(), config=(), env=None, password=None, tls=None):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.module_args = [str(a) for a in module_args]
        self.config = list(config)
        self.env = env
        self.password = password
        if password:
            self.config.append(("requirepass", password))
        # TLS only (tests/tls_certs.py `Certs.server_tls`): `port` is then the TLS port.
        self.tls = tls
        self.port = None
        self.proc = None
        self.logfile = self.workdir / "redis.log"

    def command_line(self):
        listen = ["--port", str(self.port)]
        if self.tls:
            listen = ["--port", "0", "--tls-port", str(self.port),
                      "--tls-cert-file", self.tls["cert"], "--tls-key-file", self.tls["key"],
                      "--tls-ca-cert-file", self.tls["ca"],
                      "--tls-auth-clients", self.tls.get("auth_clients", "yes")]
        conf = [
            *listen, "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", str(self.workdir), "--logfile", str(self.logfile),
            "--loadmodule", str(MODULE), *self.module_args,
        ]
        for line in self.config:
            conf.extend(["--" + line[0], *[str(v) for v in line[1:]]])
        return [REDIS_SERVER, *conf]

    def start(self):
        if not MODULE.exists():
            raise ServerFailed(f"{MODULE} is missing: run `make build`")
        self.port = self.port or free_port()
        env = dict(os.environ, **(self.env or {}))
        self.proc = subprocess.Popen(
            self.command_line(), stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, env=env
        )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerFailed(f"redis-server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if self.client(socket_timeout=0.5).ping():
                    return self
            except (redis.ConnectionError, redis.TimeoutError):
                time.sleep(0.02)
            except redis.ResponseError as e:  # still loading
                if "LOADING" not in str(e):
                    raise
                time.sleep(0.02)
        self.stop()
        raise ServerFailed(f"redis-server did not answer within {START_TIMEOUT}s:\n{self.log()}")

    def client(self, protocol=2, **kwargs):
        kwargs.setdefault("socket_timeout", 30)
        kwargs.setdefault("password", self.password)
        if self.tls:
            kwargs.setdefault("ssl", True)
            kwargs.setdefault("ssl_ca_certs", self.tls["client_ca"])
            kwargs.setdefault("ssl_certfile", self.tls["client_cert"])
            kwargs.setdefault("ssl_keyfile", self.tls["client_key"])
        return redis.Redis(host="127.0.0.1", port=self.port, protocol=protocol, **kwargs)

    def log(self):
        try:
            return self.logfile.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def stop(self, sig=signal.SIGTERM):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None


@pytest.fixture
def server_factory(tmp_path):
    """Starts servers on demand: `server_factory(module_args=..., config=...)`."""
    servers = []

    def make(module_args=(), config=(), start=True, env=None, password=None, tls=None):
        s = RedisServer(tmp_path / f"server{len(servers)}", module_args, config, env, password,
                        tls)
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


def info_shard(client):
    """The fields of `INFO shard` as text, without Redis's `shard_` prefix."""
    return {k.removeprefix("shard_"): str(v) for k, v in client.info("shard").items()}
