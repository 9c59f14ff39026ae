"""The server under test and one process of it: which binary and module the tests run
(REDIS_SERVER, SHARD_MODULE), what that server can do, `RedisServer` (start, clients, log,
stop), and the small readers and waits every test file uses (INFO shard, maps, polling).

Each server runs in its own directory with its own log, on a port of this test process's block
(helpers.ports); `server_factory` (tests/conftest.py) stops every server a test started,
however the test ends.
"""

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import redis

from helpers.ports import free_port

ROOT = Path(__file__).resolve().parent.parent.parent
# SHARD_MODULE tests another build of the module (as bench/run.py does).
MODULE = Path(os.environ.get("SHARD_MODULE", ROOT / "target" / "release" / "libshard.so"))
REDIS_SERVER = os.environ.get("REDIS_SERVER", "redis-server")
START_TIMEOUT = 10.0
# A server's config for an AOF that holds every acknowledged write.
AOF = [("appendonly", "yes"), ("appendfsync", "always")]
# A primary's config that starts a replica's full sync at once (the default waits 5 s for more
# replicas to share it).
PRIMARY = [("repl-diskless-sync-delay", 0)]
PORT_TAKEN = "Address already in use"


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


class ServerFailed(Exception):
    """redis-server exited or never answered; the message holds its log."""


class RedisServer:
    """One redis-server with the module, started by `start()` and stopped by `stop()`.

    `binary` runs another server than REDIS_SERVER (Debian's `redis-server`, built with TLS);
    `module=False` starts it without the module. `tls` (tests/helpers/tls.py
    `Certs.server_tls`) makes it TLS-only: `port` is then its TLS port. `host` (default
    127.0.0.1) is the loopback address it listens on; another one (helpers.partition) is also
    the address its own connections leave from (`bind-source-addr`: replication, and the
    module's connections, which follow it), so that a rule on addresses cuts them.
    """

    def __init__(self, workdir, module_args=(), config=(), env=None, password=None, tls=None,
                 binary=None, module=True, host=None):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.module_args = [str(a) for a in module_args]
        self.config = list(config)
        self.env = env
        self.password = password
        if password:
            self.config.append(("requirepass", password))
        self.tls = tls
        self.binary = binary or REDIS_SERVER
        self.module = module
        self.host = host or "127.0.0.1"
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
            *listen, "--bind", self.host, "--save", "",
            "--appendonly", "no", "--dir", str(self.workdir), "--logfile", str(self.logfile),
        ]
        if self.host != "127.0.0.1":
            # Redis 7.0's protected mode takes only 127.0.0.1 for loopback: the other servers'
            # connections from their own addresses would be refused.
            conf += ["--bind-source-addr", self.host, "--protected-mode", "no"]
        if self.module:
            args = list(self.module_args)
            # SHARD_KEY_INDEX=yes (tests/run.py's `index` pass): every server keeps the key
            # index unless its test says otherwise, so that the resharding tests run with it.
            if os.environ.get("SHARD_KEY_INDEX") == "yes" and "key-index" not in args:
                args += ["key-index", "yes"]
            conf += ["--loadmodule", str(MODULE), *args]
        for line in self.config:
            conf.extend(["--" + line[0], *[str(v) for v in line[1:]]])
        return [self.binary, *conf]

    def start(self):
        """Starts the server and waits for its PING. A server given no port gets one of this
        process's (helpers.ports), and another one if that one was taken meanwhile; a server
        that keeps its port (a restart) waits for the port to be released."""
        if self.module and not MODULE.exists():
            raise ServerFailed(f"{MODULE} is missing: run `make build`")
        own_port = self.port is None
        for attempt in range(5):
            if own_port:
                self.port = free_port()
            try:
                return self._start_once()
            except ServerFailed as e:
                if PORT_TAKEN not in str(e) or attempt == 4:
                    raise
                if not own_port:
                    time.sleep(0.2 * (attempt + 1))
        raise AssertionError("unreachable")

    def _start_once(self):
        env = dict(os.environ, **(self.env or {}))
        log_from = len(self.log())
        self.proc = subprocess.Popen(
            self.command_line(), stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, env=env
        )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                log = self.log()
                code = self.proc.returncode
                if PORT_TAKEN in log[log_from:]:
                    self.proc = None
                    raise ServerFailed(f"port {self.port} taken ({PORT_TAKEN}):\n{log[log_from:]}")
                raise ServerFailed(f"redis-server exited with {code}:\n{log}")
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
        return redis.Redis(host=self.host, port=self.port, protocol=protocol, **kwargs)

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


# --- replies and waits -----------------------------------------------------------------------


def info_shard(client):
    """The fields of `INFO shard` as text, without Redis's `shard_` prefix."""
    return {k.removeprefix("shard_"): str(v) for k, v in client.info("shard").items()}


def pipelined(client, commands, chunk=500, raise_on_error=True):
    """The replies to `commands` (tuples), sent in pipelines of `chunk` commands (no MULTI);
    with `raise_on_error=False` an error reply comes back as its exception, in its place."""
    replies = []
    for i in range(0, len(commands), chunk):
        pipe = client.pipeline(transaction=False)
        for c in commands[i:i + chunk]:
            pipe.execute_command(*c)
        replies += pipe.execute(raise_on_error=raise_on_error)
    return replies


def command_calls(server, command):
    """How many times `server` has run `command` (INFO commandstats, lower case: 'get')."""
    stats = server.client().info("commandstats")
    return stats.get(f"cmdstat_{command}", {}).get("calls", 0)


def as_dict(reply):
    """A map reply (RESP3 dict, or RESP2's flat `[k1, v1, ...]`) as a dict with str keys."""
    if isinstance(reply, dict):
        return {k.decode() if isinstance(k, bytes) else k: v for k, v in reply.items()}
    return {k.decode(): v for k, v in zip(reply[::2], reply[1::2])}


def as_map(reply):
    """A map reply as a dict with str keys and the values as sent (bytes, ints, None), RESP2's
    flat `[k1, v1, k2, v2, ...]` or RESP3's dict alike. The module's known nested maps become
    dicts too: `fleet`, `previous`, and `nodes` (name -> map in SHARD.RING CHECK and
    SHARD.RESHARD STATUS, a list of maps in SHARD.RING GET)."""
    if reply is None:
        return None
    pairs = reply.items() if isinstance(reply, dict) else zip(reply[::2], reply[1::2])
    out = {}
    for k, v in pairs:
        k = k.decode() if isinstance(k, bytes) else k
        if k in ("fleet", "previous"):
            v = as_map(v)
        elif k == "nodes" and isinstance(v, list):
            if v and isinstance(v[0], list):
                v = [as_map(m) for m in v]
            else:
                v = {name.decode(): as_map(m) for name, m in zip(v[::2], v[1::2])}
        out[k] = v
    return out


def until(check, what, timeout=20.0, every=0.05):
    """Polls `check` until it returns a true value, which it returns; fails naming `what` (and
    the last error) after `timeout` seconds. A Redis or socket error counts as not yet."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            got = check()
            if got:
                return got
        except (redis.RedisError, OSError) as e:
            last = e
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.1f}s waiting for: {what}"
                         + (f" (last error: {last!r})" if last else ""))


def wait_in_sync(primary, replica, timeout=10.0, also=None):
    """Waits until `replica` (a client) has its link to `primary` (a client) up and the same
    replication offset; `also(primary, replica)`, when given, must hold too."""
    def synced():
        r = replica.info("replication")
        if r.get("master_link_status") != "up":
            return False
        return (r.get("slave_repl_offset") == primary.info("replication").get("master_repl_offset")
                and (also is None or also(primary, replica)))
    until(synced, "the replica to catch up with its primary", timeout, every=0.02)


def aof_command_names(workdir):
    """Command names in a server's AOF files (RESP arrays), lower case, in order."""
    names = []
    for f in sorted(Path(workdir).rglob("*.aof")):
        names += [m.lower() for m in re.findall(rb"\*\d+\r\n\$\d+\r\n([^\r]+)\r\n", f.read_bytes())]
    return names


def saved_aof(server, path):
    """`server`'s AOF rewritten whole, then copied to `path` (returned), to restart from later."""
    server.client().execute_command("BGREWRITEAOF")
    until(lambda: server.client().info("persistence")["aof_rewrite_in_progress"] == 0
          and server.client().info("persistence")["aof_rewrite_scheduled"] == 0,
          "the AOF rewritten")
    shutil.copytree(server.workdir / "appendonlydir", path)
    return path
