"""High availability as the tests set it up: Redis Sentinel processes (Debian's
`redis-server --sentinel`, plain or TLS-only), a fleet of three shards each of a primary and a
replica watched by three sentinels, and a failover of n0 under writes with what it lost.
"""

import signal
import subprocess
import threading
import time

import redis

from helpers.fleet import keys_of
from helpers.ports import free_port
from helpers.server import PORT_TAKEN, until
from helpers.tls import redis_py_tls_args

DOWN_AFTER_MS = 1000
SHARDS = ("n0", "n1", "n2")


class Sentinel:
    """One `redis-server --sentinel` (always Debian's redis-server) with a writable config,
    watching `masters` ({name: port, or "host:port"}, quorum 2). With `tls` (a
    `Certs.server_tls()`) it listens on TLS only and reaches the servers over TLS
    (`tls-replication yes`). `host` (default 127.0.0.1) is the loopback address it listens on
    and, when another, the one its connections leave from (helpers.partition)."""

    def __init__(self, workdir, masters, port=None, tls=None, host=None):
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.masters, self.tls = masters, tls
        self.host = host or "127.0.0.1"
        self.log = self.workdir / "sentinel.log"
        self.proc = None
        for attempt in range(5):
            self.port = port or free_port()
            if self._start() or port or attempt == 4:
                break
        until(lambda: self.client().ping(), "sentinel answers" + (" over TLS" if tls else ""))

    def _start(self):
        """Starts the process; False when it exited because its port was taken."""
        if self.tls:
            t = self.tls
            lines = ["port 0", f"tls-port {self.port}", f"tls-cert-file {t['cert']}",
                     f"tls-key-file {t['key']}", f"tls-ca-cert-file {t['ca']}",
                     "tls-auth-clients yes", "tls-replication yes"]
        else:
            lines = [f"port {self.port}"]
        lines += [f"bind {self.host}", f"dir {self.workdir}", f"logfile {self.log}"]
        if self.host != "127.0.0.1":
            lines += [f"bind-source-addr {self.host}", "protected-mode no"]
        for name, at in self.masters.items():
            host, port = str(at).rpartition(":")[::2] if ":" in str(at) else ("127.0.0.1", at)
            lines += [f"sentinel monitor {name} {host} {port} 2",
                      f"sentinel down-after-milliseconds {name} {DOWN_AFTER_MS}",
                      f"sentinel failover-timeout {name} 5000"]
        self.conf = self.workdir / "sentinel.conf"
        self.conf.write_text("\n".join(lines) + "\n")
        log_from = self.log.stat().st_size if self.log.exists() else 0
        self.proc = subprocess.Popen(["redis-server", str(self.conf), "--sentinel"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                if self.client().ping():
                    return True
            except (redis.RedisError, OSError):
                time.sleep(0.02)
        if self.proc.poll() is not None and self.log.exists() and \
                PORT_TAKEN in self.log.read_text(errors="replace")[log_from:]:
            return False
        return True

    def client(self, **kwargs):
        kwargs.setdefault("socket_timeout", 5)
        return redis.Redis(host=self.host, port=self.port, **kwargs, **redis_py_tls_args(self))

    @property
    def address(self):
        return f"{self.host}:{self.port}"

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


class SentinelFleet:
    """Three shards (name -> RedisServer) of a primary and a replica, and their sentinels."""

    def __init__(self, primaries, replicas, sentinels):
        self.primaries = primaries
        self.replicas = replicas
        self.sentinels = sentinels

    def keys_of(self, client, name, count, prefix="k"):
        return keys_of(client, name, count, prefix)


def start_sentinel_fleet(server_factory, sentinel_factory, sentinel_list=None, extra=()):
    """Three shards of a primary and a replica, three sentinels, a ring of sentinel nodes;
    returns once every sentinel knows every replica and the other sentinels, and every replica
    has the ring."""
    common = [("shard.topology-refresh-ms", 200), ("shard.call-timeout-ms", 1000),
              ("repl-diskless-sync-delay", 0), *extra]
    primaries = {n: server_factory(config=[("shard.self", n), *common]) for n in SHARDS}
    replicas = {n: server_factory(config=[("shard.self", n), *common,
                                          ("replicaof", "127.0.0.1", primaries[n].port)])
                for n in SHARDS}
    for n in SHARDS:
        c = replicas[n].client()
        until(lambda: c.info("replication")["master_link_status"] == "up", f"{n}'s replica in sync")
    sentinels = [sentinel_factory({n: primaries[n].port for n in SHARDS}) for _ in range(3)]
    addresses = sentinel_list(sentinels) if sentinel_list else " ".join(s.address for s in sentinels)
    for s in (*primaries.values(), *replicas.values()):
        s.client().config_set("shard.sentinels", addresses)
    for n in SHARDS:
        primaries[n].client().execute_command(
            "SHARD.RING", "SET", "ketama", *[x for m in SHARDS for x in (m, "sentinel", 1)])
    for n in SHARDS:
        def sentinels_see_replica():
            for s in sentinels:
                reps = s.client().execute_command("SENTINEL", "REPLICAS", n)
                if not any(b"s_down" not in dict(zip(r[::2], r[1::2]))[b"flags"] for r in reps):
                    return False
            return True
        until(sentinels_see_replica, f"sentinels know {n}'s replica")

        def sentinels_know_each_other():
            for s in sentinels:
                master = s.client().execute_command("SENTINEL", "MASTER", n)
                if dict(zip(master[::2], master[1::2]))[b"num-other-sentinels"] != b"2":
                    return False
            return True
        # A quorum of 2 elects a leader only among sentinels that have met.
        until(sentinels_know_each_other, f"the sentinels of {n} know each other")
        c = replicas[n].client()
        until(lambda: c.execute_command("SHARD.RING", "GET"), f"{n}'s replica has the ring")
    return SentinelFleet(primaries, replicas, sentinels)


class Writer(threading.Thread):
    """Writes unique values through one node, recording what was acknowledged and when."""

    def __init__(self, server, keys, tag):
        super().__init__(daemon=True)
        self.client = server.client(socket_timeout=5)
        self.keys, self.tag = keys, tag
        self.acked = []  # (time it was sent, key, value)
        self.errors = []  # (time, message)
        self.slowest = 0.0
        self.stop = threading.Event()

    def run(self):
        i = 0
        while not self.stop.is_set():
            key = self.keys[i % len(self.keys)]
            value = f"{self.tag}-{i}"
            started = time.monotonic()
            try:
                self.client.execute_command("SHARD.CALL", "SET", key, value)
                # The time it was sent: one sent before the old primary died may be acknowledged
                # by it (and lost) however late its reply is read on a loaded machine.
                self.acked.append((started, key, value))
            except redis.ResponseError as e:
                self.errors.append((time.monotonic(), str(e)))
                time.sleep(0.01)
            except (redis.ConnectionError, redis.TimeoutError) as e:  # pragma: no cover
                self.errors.append((time.monotonic(), f"client: {e}"))
            self.slowest = max(self.slowest, time.monotonic() - started)
            i += 1


class Failover:
    """n0's primary killed (or frozen) while two writers write n0's keys through the n1 and n2
    primaries, until every primary serves n0's keys again; what happened, for the checks."""

    def __init__(self, fleet, how, n_keys, serve_within):
        c1 = fleet.primaries["n1"].client()
        self.n0_keys = fleet.keys_of(c1, "n0", n_keys)
        self.old, self.new = fleet.primaries["n0"], fleet.replicas["n0"]
        # Every key gets its own writer's values, so the last acknowledged value per key is known.
        entry = {"n1": fleet.primaries["n1"], "n2": fleet.primaries["n2"]}
        self.writers = [Writer(entry[n], self.n0_keys[i::2], n) for i, n in enumerate(entry)]
        self.nodes = {"n1": fleet.primaries["n1"], "n2": fleet.primaries["n2"],
                      "n0 (promoted)": self.new}
        switches = []
        # No socket timeout: the switch may come more than 5 s after the subscription (a busy
        # machine), and a timeout would end the listening thread, not the wait for the switch.
        sub = fleet.sentinels[0].client(socket_timeout=None).pubsub()
        sub.subscribe("+switch-master")

        def listen():
            try:
                for m in sub.listen():
                    if m["type"] == "message" and m["data"].startswith(b"n0 "):
                        switches.append(time.monotonic())
                        return
            except redis.ConnectionError:
                return  # the sentinels stopped (the test failed and ended): no switch to see
        threading.Thread(target=listen, daemon=True).start()
        for w in self.writers:
            w.start()
        try:
            until(lambda: all(len(w.acked) > 20 for w in self.writers), "writers running")
            if how == signal.SIGKILL:
                self.old.stop(signal.SIGKILL)
            else:
                self.old.proc.send_signal(signal.SIGSTOP)
            # Once the signal is sent (and a killed server gone): a write sent later cannot reach
            # the old primary's keyspace.
            self.killed_at = time.monotonic()
            until(lambda: switches, "+switch-master for n0", timeout=30)
            self.switched = switches[0]
            # Every node that is a primary now serves n0's keys again within `serve_within`
            # seconds of the switch.
            for label, server in self.nodes.items():
                c = server.client(socket_timeout=5)
                key = self.n0_keys[0]

                def works():
                    return (c.execute_command("SHARD.CALL", "SET", key, f"probe-{label}") == b"OK"
                            and c.execute_command("SHARD.CALL", "GET", key)
                            == f"probe-{label}".encode())
                until(works, f"n0's keys through {label}",
                      timeout=self.switched + serve_within - time.monotonic() + 0.001, every=0.02)
            self.back_at = time.monotonic()
            # The writers go on until each has had writes acknowledged since then.
            until(lambda: all(sum(at > self.back_at for at, _, _ in w.acked[-20:]) >= 10
                              for w in self.writers), "writes acknowledged after the failover")
        finally:
            for w in self.writers:
                w.stop.set()
            for w in self.writers:
                w.join(timeout=10)

    def lost(self):
        """(lost, lost after the kill): the last acknowledged value of a key missing at the new
        primary. Before the kill the server's asynchronous replication may lose some; after
        it, none may be missing."""
        store = self.new.client()
        last = {}
        for w in self.writers:
            for at, key, value in w.acked:
                last[key] = (at, value)
        lost_before, lost_after = 0, 0
        for w in self.writers:
            for at, key, value in w.acked:
                if (at, value) != last[key]:
                    continue  # overwritten by a later acknowledged write of the same key
                if store.get(key) != value.encode():
                    if at <= self.killed_at:
                        lost_before += 1
                    else:
                        lost_after += 1
        return lost_before, lost_after
