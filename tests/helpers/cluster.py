"""Cluster clients on a fleet with `shard.cluster-protocol yes` on a `slots` ring: the ring's
arguments, a redis-py RedisCluster of the fleet, a fleet whose primaries each have a replica,
a real Redis Cluster of a primary and a replica to compare with, a grow and a shrink of the fleet by hand
(BEGIN, COPY, COMMIT, CLEANUP) and the loads that cluster clients put on it meanwhile (redis-py,
ioredis in Node.js, `redis-cli -c`), with what each load must find afterwards.
"""

import json
import random
import subprocess
import threading
import time
import traceback

from redis.cluster import RedisCluster

from helpers.fleet import NAMES, ring_args, start_fleet
from helpers.ports import free_port
from helpers.reshard import run_job
from helpers.server import PRIMARY, until, wait_in_sync
from helpers.tls import cli_tls_args, redis_py_tls_args


def slots_ring(servers, names):
    """SHARD.RING SET's arguments of a `slots` ring of `names` (weight 1 each)."""
    return ["slots", *ring_args(servers, names)]


def cluster_fleet(server_factory, names=NAMES):
    """One server per name (`self` set), the `slots` ring of them all on each, and
    `shard.cluster-protocol yes`: cluster clients can route themselves over it."""
    fleet = start_fleet(server_factory, names, algo="slots")
    for s in fleet.values():
        assert s.client().config_set("shard.cluster-protocol", "yes")
    return fleet


def cluster_fleet_with_replicas(server_factory, names=NAMES):
    """`cluster_fleet`, and a replica of each primary (the module loaded, no `self`: each knows
    its shard from its primary's address) with the protocol on too. Returns (primaries,
    replicas), each name -> RedisServer, once every node lists every replica."""
    fast = [("shard.topology-refresh-ms", 200), *PRIMARY]
    primaries = {n: server_factory(module_args=["self", n], config=fast) for n in names}
    for s in primaries.values():
        assert s.client().execute_command("SHARD.RING", "SET", *slots_ring(primaries, names))
    replicas = {n: server_factory(config=[*fast, ("replicaof", "127.0.0.1", primaries[n].port)])
                for n in names}
    for n in names:
        c = replicas[n].client()
        wait_in_sync(primaries[n].client(), c)
        until(lambda: c.execute_command("SHARD.RING", "GET"), f"{n}'s replica has the ring")
    for s in (*primaries.values(), *replicas.values()):
        assert s.client().config_set("shard.cluster-protocol", "yes")
    every = (*primaries.values(), *replicas.values())
    until(lambda: all(len(s.client().execute_command("CLUSTER", "NODES").splitlines())
                      == 2 * len(names) for s in every), "every node lists every replica")
    return primaries, replicas


def real_cluster_with_a_replica(server_factory):
    """A real Redis Cluster of one primary (every slot) and its replica: (primary, replica),
    once the primary's CLUSTER SLOTS lists the replica."""
    def node():
        return server_factory(config=[("cluster-enabled", "yes"),
                                      ("cluster-config-file", "nodes.conf"),
                                      ("cluster-port", free_port()), *PRIMARY])
    primary, replica = node(), node()
    p, r = primary.client(), replica.client()
    p.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
    bus = int(p.config_get("cluster-port")["cluster-port"])
    r.execute_command("CLUSTER", "MEET", "127.0.0.1", primary.port, bus)
    pid = p.execute_command("CLUSTER", "MYID").decode()
    until(lambda: pid.encode() in r.execute_command("CLUSTER", "NODES"), "the nodes met")
    until(lambda: r.execute_command("CLUSTER", "REPLICATE", pid), "the replica follows")
    until(lambda: len(p.execute_command("CLUSTER", "SLOTS")[0]) == 4, "the replica is listed")
    return primary, replica


def cluster_client(servers, **kwargs):
    s = servers["n0"]
    kwargs = {**redis_py_tls_args(s), **kwargs}
    return RedisCluster(host="127.0.0.1", port=s.port, socket_timeout=10, **kwargs)


def check_load(rc, keys, load):
    """What a cluster client load must leave after a grow and a shrink: no error, no wrong
    reply, enough work done, every key's value and every acknowledged INCR there."""
    assert not load.errors, load.errors[:5]
    assert not load.wrong, load.wrong[:5]
    assert load.ops > 100 and len(load.counts) > 50, (load.ops, len(load.counts))
    for k in keys:
        assert rc.get(k) == f"v-{k}".encode()
        assert int(rc.get(f"{k}:n") or 0) == load.counts.get(k, 0), k


def grow_and_shrink(servers, old, new, grow_begun=False):
    """From the ring of `old` to that of `new` and back: BEGIN everywhere (unless the grow's was
    done already), COPY on the nodes of the ring left, COMMIT everywhere, CLEANUP on the nodes of
    the ring reached."""
    for before, after in ((old, new), (new, old)):
        if not (grow_begun and after == new):
            for s in servers.values():
                c = s.client()
                assert c.execute_command("SHARD.RING", "BEGIN", *slots_ring(servers, after)) == b"OK"
        run_job(servers, before, "COPY")
        for s in servers.values():
            assert s.client().execute_command("SHARD.RING", "COMMIT") == b"OK"
        run_job(servers, after, "CLEANUP")
        time.sleep(0.3)


class PyLoad:
    """redis-py's RedisCluster in a thread."""

    def __init__(self, servers, keys):
        self.counts, self.errors, self.wrong, self.ops = {}, [], [], 0
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self.run, args=(servers, keys))
        self.thread.start()

    def run(self, servers, keys):
        client = cluster_client(servers)
        rng = random.Random(5)
        while not self.stop_event.is_set():
            k = rng.choice(keys)
            try:
                if rng.random() < 0.5:
                    self.counts[k] = client.incr(f"{k}:n")  # acknowledged: the counter's value
                elif client.get(k) != f"v-{k}".encode():
                    self.wrong.append(k)
            except Exception as e:  # noqa: BLE001 - every failure is a finding, reported below
                self.errors.append((k, repr(e), traceback.format_exc()[-1000:]))
            self.ops += 1

    def stop(self):
        self.stop_event.set()
        self.thread.join(30)
        assert not self.thread.is_alive()


class NodeLoad:
    """ioredis's Redis.Cluster in a Node.js process (tests/clients/ioredis_cluster.js load)."""

    def __init__(self, servers, keys, script):
        self.proc = subprocess.Popen(["node", str(script), "load", f"127.0.0.1:{servers['n0'].port}"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        self.proc.stdin.write(json.dumps(keys).encode() + b"\n")
        self.proc.stdin.flush()

    def stop(self):
        out, err = self.proc.communicate(timeout=60)  # closes stdin: the load stops
        assert self.proc.returncode == 0, err.decode(errors="replace")
        done = json.loads(out)
        self.counts, self.errors, self.wrong, self.ops = (
            done["counts"], done["errors"], done["wrong"], done["ops"])


class CliLoad:
    """`redis-cli -c` reading commands from a pipe, one at a time, in a thread."""

    def __init__(self, servers, keys):
        self.counts, self.errors, self.wrong, self.ops = {}, [], [], 0
        self.proc = subprocess.Popen(["redis-cli", *cli_tls_args(servers["n0"]), "-c", "-p",
                                      str(servers["n0"].port)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self.run, args=(keys,))
        self.thread.start()

    def reply(self):
        while True:
            line = self.proc.stdout.readline()
            assert line, "redis-cli exited"
            if not line.startswith("-> Redirected"):  # what -c prints when it follows one
                return line.rstrip("\n")

    def run(self, keys):
        rng = random.Random(7)
        while not self.stop_event.is_set():
            k = rng.choice(keys)
            incr = rng.random() < 0.5
            self.proc.stdin.write(f"INCR {k}:n\n" if incr else f"GET {k}\n")
            self.proc.stdin.flush()
            got = self.reply()
            if incr and got.isdigit():
                self.counts[k] = int(got)
            elif incr:
                self.errors.append((k, got))
            elif got != f"v-{k}":
                self.wrong.append((k, got))
            self.ops += 1

    def stop(self):
        self.stop_event.set()
        self.thread.join(30)
        assert not self.thread.is_alive()
        self.proc.stdin.close()
        assert self.proc.wait(10) == 0


def grow_and_shrink_under_load(fleet, joining, make_load):
    """n3 (`joining`: a server with `self` n3 and no ring) joins the `slots` ring of n0..n2
    (`fleet`, with the cluster protocol on) and leaves again (`grow_and_shrink`) while the
    cluster client load `make_load(servers, keys)` reads and increments 400 keys; `check_load`
    then holds. Returns the servers (n0..n3) and a cluster client of them."""
    servers = dict(fleet, n3=joining)
    old, new = NAMES, ("n0", "n1", "n2", "n3")
    joining.client().execute_command("SHARD.RING", "SET", *slots_ring(fleet, old))
    joining.client().config_set("shard.cluster-protocol", "yes")
    rc = cluster_client(servers)
    keys = [f"grow:{i}" for i in range(400)]
    for k in keys:
        rc.set(k, f"v-{k}")
    load = make_load(servers, keys)
    try:
        time.sleep(0.3)  # the load under way on the old ring first
        grow_and_shrink(servers, old, new)
    finally:
        load.stop()
    check_load(rc, keys, load)
    return servers, rc
