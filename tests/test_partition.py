"""Network partitions (issue 44): servers and sentinels on loopback addresses of their own, cut
from each other by `nft` rules (tests/helpers/partition.py).

- the harness itself: a cut drops the packets between the addresses it names and nothing else,
  the servers' replication and the module's own connections included, one way or both, and a
  heal restores them;
- the Jepsen case: a primary cut off from its replica and the sentinels while a client on its
  side writes; every write acknowledged with the replica wait (`SHARD.CALL WAIT 1`) survives the
  promotion of the replica; what plain writes lose, with and without `min-replicas-to-write`;
- a node cut off from the coordinator during a grow: the fleet converges after the heal, the cut
  node refuses the keys it no longer owns, no acknowledged write is lost.
"""

import socket
import threading
import time

import pytest
import redis

from helpers.fleet import Fleet, assert_owned_only, owners
from helpers.reshard import assert_one_ring, fleet_status, resume_until_over, wait_copying
from helpers.server import PRIMARY, as_map, info_shard, until, wait_in_sync
from helpers.writers import Writers, check_writes

pytestmark = pytest.mark.slow


def tcp_connects(source, host, port, timeout=0.5):
    """Whether a TCP connection from `source` (an address to bind, None: the kernel's choice)
    to host:port is made within `timeout` seconds."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        if source:
            s.bind((source, 0))
        try:
            s.connect((host, port))
            return True
        except (socket.timeout, OSError):
            return False


def datagram_arrives(source, dest, timeout=0.3):
    """Whether a UDP datagram sent from `source` to a socket bound at `dest` arrives."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
        rx.bind((dest, 0))
        rx.settimeout(timeout)
        tx.bind((source, 0))
        tx.sendto(b"ping", rx.getsockname())
        try:
            return rx.recv(16) == b"ping"
        except socket.timeout:
            return False


def peer_hosts(server):
    """The source addresses of the connections `server` has from other clients (CLIENT LIST),
    by client name or command."""
    return {c["addr"].rsplit(":", 1)[0] for c in server.client().client_list()}


def test_cut_drops_packets_between_addresses_only(server_factory, partition):
    hosts = [partition.addresses.next() for _ in range(3)]
    assert len(set(hosts)) == 3 and all(h.startswith("127.") and h != "127.0.0.1" for h in hosts)
    common = [("shard.call-timeout-ms", 500), *PRIMARY]
    a = server_factory(config=[("shard.self", "n0"), *common], host=hosts[0])
    b = server_factory(config=[("shard.self", "n1"), *common], host=hosts[1])
    # c: a's replica (replication traffic between a and c).
    c = server_factory(config=[("replicaof", a.host, a.port)], host=hosts[2])
    servers = Fleet(n0=a, n1=b)
    ring = ["n0", f"{a.host}:{a.port}", 1, "n1", f"{b.host}:{b.port}", 1]
    for s in (a, b):
        s.client().execute_command("SHARD.RING", "SET", "ketama", *ring)
    ca, cb, cc = a.client(), b.client(), c.client()
    wait_in_sync(ca, cc)
    key_b = servers.key_of("n1")  # a key a forwards to b
    # Each side's connections leave from its own address: the replica's link, the module's
    # connection from a to b (the server's bind-source-addr, which the module follows).
    assert ca.execute_command("SHARD.CALL", "SET", key_b, "before") == b"OK"
    assert a.host in peer_hosts(b), peer_hosts(b)
    assert c.host in peer_hosts(a), peer_hosts(a)
    assert info_shard(ca)["node_n1_address"] == f"{b.host}:{b.port}"
    assert tcp_connects(a.host, b.host, b.port) and tcp_connects(b.host, a.host, a.port)

    # Both ways between a and b: nothing connects either way, the module's call times out;
    # from elsewhere (127.0.0.1, c) both still answer, and a's replication to c goes on.
    partition.cut(a, b)
    assert "drop" in partition.listed()
    assert not tcp_connects(a.host, b.host, b.port)
    assert not tcp_connects(b.host, a.host, a.port)
    assert tcp_connects(None, b.host, b.port) and tcp_connects(c.host, b.host, b.port)
    with pytest.raises(redis.ResponseError, match="n1"):
        ca.execute_command("SHARD.CALL", "SET", key_b, "during")
    assert cb.get(key_b) == b"before"
    assert cb.execute_command("SHARD.CALL", "SET", key_b, "at-b") == b"OK"
    ca.set("at-a", "1")
    wait_in_sync(ca, cc)
    assert cc.get("at-a") == b"1"
    partition.heal()
    assert "drop" not in partition.listed()
    until(lambda: ca.execute_command("SHARD.CALL", "SET", key_b, "after") == b"OK",
          "a's call to b after the heal", timeout=15)
    assert cb.get(key_b) == b"after"

    # The replication link between a and c: a write on a does not reach c while they are cut,
    # and does once healed (the same TCP connection: its segments are sent again).
    partition.cut(a, c)
    ca.set("cut-write", "x")
    time.sleep(1.0)
    assert cc.get("cut-write") is None
    assert cc.info("replication")["slave_repl_offset"] < ca.info("replication")[
        "master_repl_offset"]
    partition.heal()
    until(lambda: cc.get("cut-write") == b"x", "the replica gets the write after the heal",
          timeout=20)

    # One way, a -> b: a's datagrams to b are lost, b's to a arrive; TCP needs both ways, so it
    # connects neither way; 127.0.0.1 still reaches both.
    partition.cut_one_way(a, b)
    assert not datagram_arrives(a.host, b.host)
    assert datagram_arrives(b.host, a.host)
    assert datagram_arrives(a.host, c.host)
    assert not tcp_connects(a.host, b.host, b.port)
    assert not tcp_connects(b.host, a.host, a.port)
    assert tcp_connects(None, a.host, a.port) and tcp_connects(None, b.host, b.port)
    partition.heal()
    assert datagram_arrives(a.host, b.host) and tcp_connects(a.host, b.host, b.port)


# --- the Jepsen case -------------------------------------------------------------------------

MAX_LAG = 1  # min-replicas-max-lag, seconds


class SideWriter(threading.Thread):
    """A client of one server (connected from 127.0.0.1: on both sides of every cut) writing
    unique keys `<tag>w:<i>` with `SHARD.CALL WAIT 1 ...` and `<tag>p:<i>` plain, in turn;
    each write recorded as (sent at, key, "ack" or the error)."""

    def __init__(self, server, tag, wait_ms=300):
        super().__init__(daemon=True)
        self.client = server.client(socket_timeout=5, socket_connect_timeout=1)
        self.tag, self.wait_ms = tag, wait_ms
        self.log = []
        self.stop = threading.Event()

    def run(self):
        i = 0
        while not self.stop.is_set():
            i += 1
            for kind, prefix in (("wait", ["WAIT", 1, self.wait_ms]), ("plain", [])):
                key = f"{self.tag}{kind[0]}:{i}"
                sent = time.monotonic()
                try:
                    self.client.execute_command("SHARD.CALL", *prefix, "SET", key, i)
                    outcome = "ack"
                except redis.RedisError as e:
                    outcome = str(e).split(" ")[0] or type(e).__name__
                    time.sleep(0.01)
                self.log.append((sent, kind, key, str(i), outcome))
            time.sleep(0.002)

    def acked(self, kind):
        return [w for w in self.log if w[1] == kind and w[4] == "ack"]


def sentinel_setup(server_factory, sentinel_factory, partition, min_replicas):
    """A primary (n0, a ring of that one sentinel node) and its replica, three sentinels, each
    on an address of its own; `min-replicas-to-write` on both servers."""
    common = [("shard.self", "n0"), ("shard.topology-refresh-ms", 200),
              ("shard.call-timeout-ms", 1000), ("min-replicas-to-write", min_replicas),
              ("min-replicas-max-lag", MAX_LAG), *PRIMARY]
    primary = server_factory(config=common, host=partition.addresses.next())
    replica = server_factory(config=[*common, ("replicaof", primary.host, primary.port)],
                             host=partition.addresses.next())
    wait_in_sync(primary.client(), replica.client())
    sentinels = [sentinel_factory({"n0": f"{primary.host}:{primary.port}"},
                                  host=partition.addresses.next()) for _ in range(3)]
    for s in (primary, replica):
        s.client().config_set("shard.sentinels", " ".join(x.address for x in sentinels))
    primary.client().execute_command("SHARD.RING", "SET", "ketama", "n0", "sentinel", 1)

    def ready():
        for s in sentinels:
            c = s.client()
            reps = c.execute_command("SENTINEL", "REPLICAS", "n0")
            master = c.execute_command("SENTINEL", "MASTER", "n0")
            if not reps or b"s_down" in dict(zip(reps[0][::2], reps[0][1::2]))[b"flags"]:
                return False
            if dict(zip(master[::2], master[1::2]))[b"num-other-sentinels"] != b"2":
                return False
        return True
    until(ready, "the sentinels know the replica and each other")
    until(lambda: replica.client().execute_command("SHARD.RING", "GET"),
          "the replica has the ring")
    until(lambda: info_shard(primary.client()).get("node_n0_address")
          == f"{primary.host}:{primary.port}", "the module has the primary's address from Sentinel")
    return primary, replica, sentinels


def master_of(sentinel):
    return sentinel.client().execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", "n0")


@pytest.mark.parametrize("min_replicas", [1, pytest.param(0, marks=pytest.mark.partitions)],
                         ids=["min-replicas-1", "min-replicas-0"])
def test_primary_cut_off_with_its_clients_keeps_every_write_acknowledged_by_its_replica(
        server_factory, sentinel_factory, partition, min_replicas):
    primary, replica, sentinels = sentinel_setup(server_factory, sentinel_factory, partition,
                                                 min_replicas)
    old = primary.client()
    # A client on the primary's side, writing through it before, during and after the cut.
    minority = SideWriter(primary, "m")
    minority.start()
    majority = None
    try:
        until(lambda: len(minority.acked("wait")) > 20, "acknowledged writes before the cut")
        partition.cut(primary, [replica, *sentinels])
        # Once the rules are in place (nft may take 100 ms on a loaded machine: a write sent
        # while it ran was acknowledged, rightly).
        cut_at = time.monotonic()
        # Sentinel promotes the replica; a client on its side writes through it.
        until(lambda: all(master_of(s)[0].decode() == replica.host for s in sentinels),
              "the sentinels promote the replica", timeout=30)
        promoted_at = time.monotonic()
        majority = SideWriter(replica, "M")
        majority.start()
        time.sleep(1.5)  # the minority's client keeps writing on the old primary meanwhile
        healed_at = time.monotonic()
        partition.heal()
        # Sentinel turns the old primary into the new one's replica, which then syncs.
        until(lambda: old.info("replication")["role"] == "slave"
              and old.info("replication")["master_host"] == replica.host
              and old.info("replication")["master_link_status"] == "up",
              "the old primary follows the promoted replica", timeout=30)
        wait_in_sync(replica.client(), old, timeout=20)
        # Writes through the promoted primary acknowledged by its replica again (with
        # min-replicas-to-write 1 it refused them while it had none).
        until(lambda: any(w[0] > healed_at for w in majority.acked("wait")),
              "writes acknowledged by the new primary's replica after the heal", timeout=20)
    finally:
        for w in (minority, majority):
            if w:
                w.stop.set()
                w.join(timeout=10)
    new = replica.client()
    wait_in_sync(new, old)

    def present(writes):
        if not writes:
            return []
        got = new.mget([w[2] for w in writes])
        return [w for w, v in zip(writes, got) if v == w[3].encode()]

    counts = {}
    for writer in (minority, majority):
        for kind in ("wait", "plain"):
            acked = writer.acked(kind)
            kept = present(acked)
            not_acked = [w for w in writer.log if w[1] == kind and w[4] != "ack"]
            counts[f"{writer.tag}-{kind}"] = {
                "acked": len(acked), "acked_lost": len(acked) - len(kept),
                "not_acked": len(not_acked), "not_acked_applied": len(present(not_acked))}
    print(f"\n{min_replicas=}: {counts}")
    # The guarantee: every write acknowledged with the replica wait is on the new primary,
    # whichever side's client made it.
    for tag in ("m-wait", "M-wait", "M-plain"):
        assert counts[tag]["acked_lost"] == 0, (tag, counts)
    assert counts["m-wait"]["acked"] > 20 and counts["M-wait"]["acked"] > 0, counts
    # No write acknowledged with the replica wait on the minority side while it was cut off
    # (after the heal its calls go to the new primary, and are acknowledged there).
    assert not [w for w in minority.acked("wait") if cut_at + 0.05 < w[0] < healed_at]
    # Plain writes on the cut-off primary, sent well after the cut: acknowledged only without
    # min-replicas-to-write, and then every one of them is lost (the old primary's data is
    # replaced by the new primary's when it follows it).
    late = [w for w in minority.log
            if w[1] == "plain" and cut_at + MAX_LAG + 3 < w[0] < healed_at]
    late_acked = [w for w in late if w[4] == "ack"]
    assert late, "the minority's client wrote during the cut"
    if min_replicas:
        assert not late_acked, late_acked[:5]
        assert {w[4] for w in late} == {"NOREPLICAS"}, {w[4] for w in late}
    else:
        assert late_acked and not present(late_acked), \
            "without min-replicas-to-write the cut-off primary acknowledges writes that are lost"
    assert promoted_at > cut_at


# --- a node cut off from the coordinator during a grow ---------------------------------------

KEYS = 30_000
RATE = 1000  # MAXRATE: the copy of a grow 3 -> 4 takes about 2.5 s
CUT_SECONDS = 4  # longer than call-timeout-ms and the coordinator's retries


def ring_args(fleet, names):
    return [x for n in names for x in (n, f"{fleet[n].host}:{fleet[n].port}", 1)]


def ring_state(client):
    return as_map(client.execute_command("SHARD.RING", "STATE"))


@pytest.mark.partitions
@pytest.mark.parametrize("phase", ["copy", "settle", "commit"])
def test_node_cut_off_from_the_coordinator_during_a_grow(server_factory, partition, phase):
    """n0 coordinates a grow of n0..n2 to n3; n2 is cut off from n0 (it still reaches n1 and
    n3) while the copies run (`copy`), or once the coordinator has given the first node the
    settled rings (`settle`) or the new ring alone (`commit`: n2 misses its COMMIT while n0
    routes by the new ring); writers go on through n0 and n2 all along. After the heal the
    operation ends (RESUME if the coordinator gave up), every node holds the new ring alone, no
    acknowledged write is lost, every key is at its owner only, and n2 routes the keys it gave
    to n3 there."""
    names3, names4 = ["n0", "n1", "n2"], ["n0", "n1", "n2", "n3"]
    fleet = Fleet()
    for n in names4:
        fleet[n] = server_factory(module_args=["self", n, "call-timeout-ms", 500],
                                  config=[("enable-debug-command", "yes")],
                                  host=partition.addresses.next())
    for n in names3:
        assert fleet.client(n).execute_command("SHARD.RING", "SET", "ketama",
                                               *ring_args(fleet, names3)) == b"OK"
    c0, c2 = fleet.client("n0"), fleet.client("n2")
    keys = [f"k:{i}" for i in range(KEYS if phase == "copy" else 3000)]
    old_owner = dict(zip(keys, owners(c0, keys)))
    for n in names3:
        pipe = fleet.client(n).pipeline(transaction=False)
        for k in keys:
            if old_owner[k] == n:
                pipe.set(k, "v")
        pipe.execute()
    # Writers through the coordinator and through the node that will be cut off from it.
    writers = Writers(fleet, ["n0", "n2"], threads=3, counters=[f"c:{i}" for i in range(20)],
                      sets=[f"s:{i}" for i in range(20)],
                      values=[[f"v:{t}:{i}" for i in range(20)] for t in range(3)]).start()
    try:
        writers.wait_acknowledged(100)
        start = ["SHARD.RESHARD", "START", "ketama", *ring_args(fleet, names4)]
        if phase == "copy":
            assert c0.execute_command(*start, "MAXRATE", RATE) == b"OK"
            wait_copying(c0)
        else:
            # Held once the plan's first node (n0) has the phase's rings; n2 has not.
            assert c0.execute_command("SHARD.DEBUG", "FLEET-HOLD", phase, 1) == b"OK"
            assert c0.execute_command(*start) == b"OK"
            new_digest = fleet_status(c0)["new_digest"]

            def in_step(name):
                st = ring_state(fleet.client(name))
                if phase == "settle":
                    return st.get("settled") == b"yes"
                return st["digest"] == new_digest and st["previous_digest"] == b""
            until(lambda: in_step("n0"), f"n0 has the rings of phase {phase}")
            assert not in_step("n2")
        partition.cut(fleet["n0"], fleet["n2"])
        cut_at = time.monotonic()
        if phase != "copy":
            assert c0.execute_command("SHARD.DEBUG", "FLEET-HOLD", "OFF") == b"OK"
        writers.wait_acknowledged(200)
        time.sleep(max(0.0, cut_at + CUT_SECONDS - time.monotonic()))
        st = fleet_status(c0)
        print(f"\n{phase}: after {CUT_SECONDS} s cut: fleet phase {st['phase']}, running "
              f"{st['running']}, error {st['error']!r}; n2 {ring_state(c2)}")
        assert st["phase"] != b"done", "the grow finished while a node was cut off from it"
        partition.heal()
        resume_until_over(c0, "the grow ends after the heal", timeout=60)
        writers.wait_acknowledged(100)
    finally:
        writers.stop()
    print(writers.summary())
    assert_one_ring(fleet, names4)
    for n in names4:
        assert ring_state(fleet.client(n)).get("settled") == b"no", n
    total = assert_owned_only(fleet, c0)
    assert total >= len(keys)
    check_writes(c0, writers)
    # The keys n2 gave to n3: n2 routes them there, never runs them itself.
    moved = [k for k, o in zip(keys, owners(c2, keys)) if o == "n3" and old_owner[k] == "n2"]
    assert moved and all(o == "n3" for o in owners(c0, moved))
    for k in moved[:50]:
        assert c2.execute_command("SHARD.CALL", "SET", k, "after") == b"OK"
        assert c2.get(k) is None and fleet.client("n3").get(k) == b"after"
    assert not any(c2.exists(k) for k in moved)
