"""High availability: ring nodes behind Redis Sentinel, failovers followed without a ring change,
reads from replicas.

Real processes on loopback: Debian's `redis-server --sentinel` (three sentinels, quorum 2), and
three shards each of a primary and a replica with the module loaded on all six.
"""

import signal
import subprocess
import threading
import time

import pytest
import redis

from conftest import free_port, info_shard

DOWN_AFTER_MS = 1000
SHARDS = ("n0", "n1", "n2")


class Sentinel:
    """One `redis-server --sentinel` (always Debian's redis-server) with a writable config."""

    def __init__(self, workdir, masters, port=None):
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        lines = [f"port {self.port}", "bind 127.0.0.1", f"dir {self.workdir}",
                 f"logfile {self.workdir / 'sentinel.log'}"]
        for name, port in masters.items():
            lines += [f"sentinel monitor {name} 127.0.0.1 {port} 2",
                      f"sentinel down-after-milliseconds {name} {DOWN_AFTER_MS}",
                      f"sentinel failover-timeout {name} 5000"]
        self.conf = self.workdir / "sentinel.conf"
        self.conf.write_text("\n".join(lines) + "\n")
        self.proc = subprocess.Popen(["redis-server", str(self.conf), "--sentinel"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        until(lambda: self.client().ping(), "sentinel answers")

    def client(self):
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)

    @property
    def address(self):
        return f"127.0.0.1:{self.port}"

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def until(check, what, timeout=20.0, every=0.05):
    """Polls `check` until it returns a true value (exceptions count as false)."""
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
    raise AssertionError(f"timed out waiting for: {what} (last error: {last})")


def dead_port():
    return free_port()


class Fleet:
    def __init__(self, primaries, replicas, sentinels):
        self.primaries = primaries  # name -> RedisServer
        self.replicas = replicas
        self.sentinels = sentinels

    def keys_of(self, client, name, count, prefix="k"):
        out, i = [], 0
        while len(out) < count:
            key = f"{prefix}{i}"
            if client.execute_command("SHARD.LOCATE", key)[1] == name.encode():
                out.append(key)
            i += 1
        return out


@pytest.fixture
def sentinel_factory(tmp_path):
    made = []

    def make(masters, port=None):
        s = Sentinel(tmp_path / f"sentinel{len(made)}", masters, port)
        made.append(s)
        return s

    yield make
    for s in made:
        s.stop()


def start_fleet(server_factory, sentinel_factory, sentinel_list=None, extra=()):
    """Three shards of a primary and a replica, three sentinels, a ring of sentinel nodes."""
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
    return Fleet(primaries, replicas, sentinels)


@pytest.fixture
def fleet(server_factory, sentinel_factory):
    return start_fleet(server_factory, sentinel_factory)


def ring_get(client):
    got = client.execute_command("SHARD.RING", "GET")
    got = dict(zip(got[::2], got[1::2]))
    got[b"nodes"] = [dict(zip(n[::2], n[1::2])) for n in got[b"nodes"]]
    return got


def test_sentinel_nodes_resolve_and_show_where_they_are(fleet):
    c = fleet.primaries["n1"].client()
    got = ring_get(c)
    for node in got[b"nodes"]:
        name = node[b"name"].decode()
        assert node[b"address"] == b"sentinel"
        want = f"127.0.0.1:{fleet.primaries[name].port}".encode()
        until(lambda: ring_get(c)[b"nodes"][SHARDS.index(name)][b"resolved"] == want,
              f"{name} resolved", timeout=5)
        assert info_shard(c)[f"node_{name}_address"] == want.decode()
    key = fleet.keys_of(c, "n0", 1)[0]
    loc = c.execute_command("SHARD.LOCATE", key)
    assert loc[3] == f"127.0.0.1:{fleet.primaries['n0'].port}".encode()
    assert c.execute_command("SHARD.CALL", "SET", key, "v") == b"OK"
    assert fleet.primaries["n0"].client().get(key) == b"v"
    # A replica forwards a routed write of its own shard to its primary.
    r0 = fleet.replicas["n0"].client()
    assert r0.execute_command("SHARD.CALL", "SET", key, "w") == b"OK"
    assert fleet.primaries["n0"].client().get(key) == b"w"
    assert info_shard(c)["sentinel_subscribed"] == "yes"


class Writer(threading.Thread):
    """Writes unique values through one node, recording what was acknowledged and when."""

    def __init__(self, server, keys, tag):
        super().__init__(daemon=True)
        self.client = server.client(socket_timeout=5)
        self.keys, self.tag = keys, tag
        self.acked = []  # (time, key, value)
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
                self.acked.append((time.monotonic(), key, value))
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
        sub = fleet.sentinels[0].client().pubsub()
        sub.subscribe("+switch-master")

        def listen():
            for m in sub.listen():
                if m["type"] == "message" and m["data"].startswith(b"n0 "):
                    switches.append(time.monotonic())
                    return
        threading.Thread(target=listen, daemon=True).start()
        for w in self.writers:
            w.start()
        try:
            until(lambda: all(len(w.acked) > 20 for w in self.writers), "writers running")
            self.killed_at = time.monotonic()
            if how == signal.SIGKILL:
                self.old.stop(signal.SIGKILL)
            else:
                self.old.proc.send_signal(signal.SIGSTOP)
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
            time.sleep(0.5)
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


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "frozen"])
def test_failover_is_followed_without_a_ring_change(fleet, how):
    """A primary killed, or frozen (its calls in flight then end at the call timeout, or when
    the switch closes their connections: never later)."""
    c1 = fleet.primaries["n1"].client()
    digest = ring_get(c1)[b"digest"]
    f = Failover(fleet, how, 50, serve_within=1.0)
    print(f"\nfailover: +switch-master {f.switched - f.killed_at:.2f}s after the kill; "
          f"n0's keys served everywhere {f.back_at - f.switched:.2f}s after it")
    new_address = f"127.0.0.1:{f.new.port}"
    for label, server in f.nodes.items():
        c = server.client()
        assert ring_get(c)[b"digest"] == digest
        if label != "n0 (promoted)":
            shard = info_shard(c)
            assert int(shard["failovers_seen"]) >= 1
            assert shard["node_n0_address"] == new_address
            assert c.execute_command("SHARD.LOCATE", f.n0_keys[0])[3] == new_address.encode()
    # No call hung: each returned within the call timeout (1 s) and a margin.
    for w in f.writers:
        assert w.slowest < 2.5, w.slowest
        for at, message in w.errors:
            assert "n0" in message, message
    lost_before, lost_after = f.lost()
    acked = sum(len(w.acked) for w in f.writers)
    print(f"acknowledged writes: {acked}; last values lost by the failover (acknowledged before "
          f"the kill, not yet replicated): {lost_before}; lost after the kill: {lost_after}")
    assert lost_after == 0


def test_reads_go_to_replicas_and_writes_to_primaries(fleet):
    entry = fleet.primaries["n0"]
    c = entry.client()
    keys = {n: fleet.keys_of(c, n, 20, prefix="r") for n in SHARDS}
    for n in SHARDS:
        for k in keys[n]:
            c.execute_command("SHARD.CALL", "SET", k, f"v-{k}")
        fleet.primaries[n].client().execute_command("WAIT", 1, 2000)

    def gets(server):
        return server.client().info("commandstats").get("cmdstat_get", {}).get("calls", 0)

    def sets(server):
        return server.client().info("commandstats").get("cmdstat_set", {}).get("calls", 0)
    c.config_set("shard.read-from", "replica")
    until(lambda: all(ring_get(c)[b"nodes"][i][b"replicas"] for i in range(3)),
          "replicas known", timeout=5)
    before = {n: (gets(fleet.primaries[n]), gets(fleet.replicas[n])) for n in SHARDS}
    for n in SHARDS:
        for k in keys[n]:
            assert c.execute_command("SHARD.CALL", "GET", k) == f"v-{k}".encode()
        # A split read too: MGET over the three shards.
    assert c.execute_command("SHARD.CALL", "MGET", keys["n0"][0], keys["n1"][0], keys["n2"][0]) == [
        f"v-{keys[n][0]}".encode() for n in SHARDS]
    for n in SHARDS:
        p, r = before[n]
        assert gets(fleet.primaries[n]) == p, n
        assert gets(fleet.replicas[n]) == r + len(keys[n]), n
    assert int(info_shard(c)["replica_reads"]) == 60 + 3
    # Writes still go to the primaries.
    set_before = {n: sets(fleet.primaries[n]) for n in SHARDS}
    for n in SHARDS:
        assert c.execute_command("SHARD.CALL", "SET", keys[n][0], "w") == b"OK"
        assert sets(fleet.primaries[n]) == set_before[n] + 1
        assert fleet.primaries[n].client().get(keys[n][0]) == b"w"


def test_a_shard_without_its_replica(fleet):
    c = fleet.primaries["n0"].client()
    key = fleet.keys_of(c, "n1", 1, prefix="d")[0]
    c.execute_command("SHARD.CALL", "SET", key, "value")
    c.config_set("shard.read-from", "replica-preferred")
    until(lambda: ring_get(c)[b"nodes"][1][b"replicas"], "n1's replica known", timeout=5)
    fleet.replicas["n1"].stop(signal.SIGKILL)
    primary_gets = lambda: fleet.primaries["n1"].client().info("commandstats").get(  # noqa: E731
        "cmdstat_get", {}).get("calls", 0)
    before = primary_gets()
    # replica-preferred: every read answers, from the primary once the replica is gone.
    for _ in range(20):
        assert c.execute_command("SHARD.CALL", "GET", key) == b"value"
    assert primary_gets() >= before + 1
    assert int(info_shard(c)["replica_fallbacks"]) >= 1
    # replica: an error naming the shard.
    c.config_set("shard.read-from", "replica")
    with pytest.raises(redis.ResponseError) as e:
        c.execute_command("SHARD.CALL", "GET", key)
    assert "n1" in str(e.value) and "replica" in str(e.value), e.value
    # The other shards still read from their replicas.
    other = fleet.keys_of(c, "n2", 1, prefix="d")[0]
    c.execute_command("SHARD.CALL", "GET", other)


def test_a_sentinel_that_is_down_is_skipped(server_factory, sentinel_factory):
    fleet = start_fleet(server_factory, sentinel_factory,
                        sentinel_list=lambda s: " ".join([f"127.0.0.1:{dead_port()}"] +
                                                         [x.address for x in s]))
    c = fleet.primaries["n2"].client()
    key = fleet.keys_of(c, "n0", 1)[0]
    assert c.execute_command("SHARD.CALL", "SET", key, "v") == b"OK"
    assert fleet.primaries["n0"].client().get(key) == b"v"
    assert info_shard(c)["sentinel_subscribed"] == "yes"


def test_all_sentinels_down(server_factory):
    # A node with no sentinel to ask: its sentinel nodes fail clearly, its plain nodes work.
    dead = f"127.0.0.1:{dead_port()} 127.0.0.1:{dead_port()}"
    s = server_factory(config=[("shard.self", "n3"), ("shard.sentinels", dead),
                               ("shard.call-timeout-ms", 1000)])
    c = s.client()
    c.execute_command("SHARD.RING", "SET", "ketama", "n0", "sentinel", 1,
                      "n3", f"127.0.0.1:{s.port}", 1)
    n0_key = Fleet.keys_of(None, c, "n0", 1)[0]
    n3_key = Fleet.keys_of(None, c, "n3", 1)[0]
    started = time.monotonic()
    with pytest.raises(redis.ResponseError) as e:
        c.execute_command("SHARD.CALL", "SET", n0_key, "v")
    assert time.monotonic() - started < 2.5
    message = str(e.value)
    assert "n0" in message and "sentinel" in message, message
    assert c.execute_command("SHARD.CALL", "SET", n3_key, "v") == b"OK"
    assert c.get(n3_key) == b"v"
    assert info_shard(c)["sentinel_error"] != ""
    ring = ring_get(c)
    assert ring[b"nodes"][0][b"address"] == b"sentinel" and ring[b"nodes"][0][b"resolved"] is None
    assert c.execute_command("SHARD.LOCATE", n0_key)[3] == b"sentinel"


def test_a_known_address_is_kept_when_every_sentinel_dies(fleet):
    c = fleet.primaries["n1"].client()
    key = fleet.keys_of(c, "n0", 1)[0]
    assert c.execute_command("SHARD.CALL", "SET", key, "before") == b"OK"
    for s in fleet.sentinels:
        s.stop()
    until(lambda: info_shard(c)["sentinel_subscribed"] == "no", "subscription lost", timeout=5)
    time.sleep(0.5)  # a few refresh intervals (200 ms) with no sentinel answering
    # Sentinel being away says nothing about the primary: calls still go to it.
    assert c.execute_command("SHARD.CALL", "SET", key, "after") == b"OK"
    assert fleet.primaries["n0"].client().get(key) == b"after"
    assert info_shard(c)["node_n0_address"] == f"127.0.0.1:{fleet.primaries['n0'].port}"
    assert info_shard(c)["sentinel_error"] != ""
