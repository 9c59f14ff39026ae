"""Tools and suites see a cluster (issue 43): under `shard.cluster-protocol yes`, `INFO` says
`cluster_enabled:1` (and nothing else of it changes), `CLUSTER LINKS` and `CLUSTER MYSHARDID`
answer as a cluster node does, each primary has its own config epoch, the emulated `CLUSTER`,
`READONLY`, `READWRITE`, `ASKING` and `INFO` are authorised as the commands they stand for
(an unauthenticated client is still refused), the subcommands that assign slots by hand are
refused naming the ring commands, and `redis-cli --cluster check` and `--cluster info` pass."""

import re
import subprocess

import pytest
import redis

from helpers.cluster import (cluster_client, cluster_fleet, cluster_fleet_with_replicas,
                             real_cluster_with_a_replica)
from helpers.fleet import NAMES, start_fleet
from helpers.resp import Raw, raw_reply
from helpers.server import FILTER_SEES_CLIENT, until

PW = "fleet-pw"


@pytest.fixture
def fleet(server_factory):
    return cluster_fleet(server_factory)


def protocol(server, on):
    assert server.client().config_set("shard.cluster-protocol", "yes" if on else "no")


def redis_cli_cluster(what, server, *auth):
    """`redis-cli --cluster what` against `server`: (exit code, output without colours)."""
    run = subprocess.run(["redis-cli", *auth, "--cluster", what, f"127.0.0.1:{server.port}"],
                         capture_output=True, text=True, timeout=60)
    return run.returncode, re.sub(r"\x1b\[[0-9;]*m", "", run.stdout + run.stderr)


def epochs(nodes_text):
    """node id -> config epoch, from a CLUSTER NODES reply."""
    return {l.split()[0]: int(l.split()[6]) for l in nodes_text.decode().splitlines()}


def info_field(text, name):
    return next(l.split(":", 1)[1] for l in text.decode().splitlines() if l.startswith(name + ":"))


def test_info_says_cluster_enabled_and_nothing_else_of_it_changes(fleet):
    s = fleet["n0"]
    c = s.client()
    for sections in [(), ("cluster",), ("CLUSTER",), ("everything",), ("all",), ("default",),
                     ("server", "cluster")]:
        assert c.info(*sections)["cluster_enabled"] == 1, sections
    assert "cluster_enabled" not in c.info("server")
    # Byte for byte as the server writes it, but for the one line; in RESP3 too (verbatim).
    for proto in (2, 3):
        on = Raw(s.port, protocol=proto).execute("INFO", "cluster")
        protocol(s, False)
        off = Raw(s.port, protocol=proto).execute("INFO", "cluster")
        protocol(s, True)
        assert b"cluster_enabled:1\r\n" in on and on.replace(b"_enabled:1", b"_enabled:0") == off
    # The same fields, in the same order, in every section.
    names_on = [l.split(b":")[0] for l in raw_reply(c, "INFO", "everything").splitlines()]
    protocol(s, False)
    names_off = [l.split(b":")[0] for l in raw_reply(c, "INFO", "everything").splitlines()]
    protocol(s, True)
    assert names_on == names_off


def test_cluster_links_have_the_shape_of_a_cluster_nodes(fleet, server_factory):
    real, _ = real_cluster_with_a_replica(server_factory)
    real_links = real.client().execute_command("CLUSTER", "LINKS")
    shape = [(k, type(v)) for k, v in zip(real_links[0][::2], real_links[0][1::2])]
    ids = {n: s.client().execute_command("CLUSTER", "MYID") for n, s in fleet.items()}
    for n, s in fleet.items():
        links = s.client().execute_command("CLUSTER", "LINKS")
        assert all([(k, type(v)) for k, v in zip(l[::2], l[1::2])] == shape for l in links), links
        fields = [dict(zip(l[::2], l[1::2])) for l in links]
        # One link each way with every other node, none with itself.
        assert sorted((f[b"node"], f[b"direction"]) for f in fields) == sorted(
            (ids[o], d) for o in ids if o != n for d in (b"to", b"from"))
        assert all(f[b"create-time"] > 1_600_000_000_000 for f in fields)


def test_myshardid_is_stable_and_distinct_per_node(fleet):
    ids = {n: s.client().execute_command("CLUSTER", "MYSHARDID") for n, s in fleet.items()}
    assert all(re.fullmatch(rb"[0-9a-f]{40}", i) for i in ids.values()), ids
    assert len(set(ids.values())) == len(NAMES)
    node_ids = {s.client().execute_command("CLUSTER", "MYID") for s in fleet.values()}
    assert not node_ids & set(ids.values())
    # The same on every call, after the protocol was off, and after a restart.
    s = fleet["n1"]
    protocol(s, False)
    protocol(s, True)
    assert s.client().execute_command("CLUSTER", "MYSHARDID") == ids["n1"]
    s.client().save()
    s.stop()
    s.start()
    protocol(s, True)
    assert s.client().execute_command("CLUSTER", "MYSHARDID") == ids["n1"]


def test_each_primary_has_its_own_config_epoch(fleet):
    views = [epochs(s.client().execute_command("CLUSTER", "NODES")) for s in fleet.values()]
    assert all(v == views[0] for v in views), views
    assert sorted(views[0].values()) == [1, 2, 3]
    for s in fleet.values():
        c = s.client()
        me = c.execute_command("CLUSTER", "MYID").decode()
        info = c.execute_command("CLUSTER", "INFO")
        assert int(info_field(info, "cluster_my_epoch")) == views[0][me]
        assert int(info_field(info, "cluster_current_epoch")) == 3


def test_replicas_share_their_primarys_shard_id_and_epoch_and_redis_cli_sees_them(
        server_factory):
    primaries, replicas = cluster_fleet_with_replicas(server_factory)
    for n in NAMES:
        p, r = primaries[n].client(), replicas[n].client()
        assert r.execute_command("CLUSTER", "MYSHARDID") == p.execute_command("CLUSTER",
                                                                            "MYSHARDID")
        assert info_field(r.execute_command("CLUSTER", "INFO"), "cluster_my_epoch") == \
            info_field(p.execute_command("CLUSTER", "INFO"), "cluster_my_epoch")
        pid = p.execute_command("CLUSTER", "MYID")
        lines = p.execute_command("CLUSTER", "REPLICAS", pid)
        rid = r.execute_command("CLUSTER", "MYID")
        assert len(lines) == 1 and lines[0].startswith(rid + b" ") and b" slave " + pid in lines[0]
        assert p.execute_command("CLUSTER", "COUNT-FAILURE-REPORTS", rid) == 0
        # Every other node, primary or replica, has its two links.
        assert len(r.execute_command("CLUSTER", "LINKS")) == 2 * (2 * len(NAMES) - 1)
    code, out = redis_cli_cluster("check", replicas["n0"])
    assert code == 0, out
    assert "[OK] All 16384 slots covered." in out
    assert out.count("1 slaves.") == len(NAMES), out


def test_a_user_granted_the_plain_commands_gets_the_map_and_routes(fleet):
    admin = fleet["n0"].client()
    users = [("cl", "+cluster +readonly +readwrite +get +set +command"),
                        ("slots", "+cluster|slots +command"),
                        ("conn", "+@connection"),
                        ("inf", "+info"),
                        ("old", "+shard.cluster"),
             ("script", "+eval +cluster|myid"),
             ("none", "+get")]
    for s in fleet.values():
        for name, rules in users:
            s.client().execute_command("ACL", "SETUSER", name, "on", ">pw", "~*", *rules.split())
    as_user = {n: fleet["n0"].client(username=n, password="pw")
               for n, _ in users}
    the_map = admin.execute_command("CLUSTER", "SLOTS")
    until(lambda: as_user["cl"].execute_command("CLUSTER", "SLOTS") == the_map,
          "a user granted +cluster gets the map")
    assert as_user["cl"].execute_command("READONLY") and as_user["cl"].execute_command("READWRITE")
    assert as_user["slots"].execute_command("CLUSTER", "SLOTS") == the_map
    with pytest.raises(redis.exceptions.NoPermissionError, match="cluster\\|nodes"):
        as_user["slots"].execute_command("CLUSTER", "NODES")
    for command in ("READONLY", "READWRITE", "ASKING"):
        assert as_user["conn"].execute_command(command)
    assert as_user["inf"].info("cluster")["cluster_enabled"] == 1
    # The grant earlier versions asked for still serves.
    assert as_user["old"].execute_command("CLUSTER", "SLOTS") == the_map
    # A script's commands are its caller's.
    me = admin.execute_command("CLUSTER", "MYID")
    assert as_user["script"].eval("return redis.call('CLUSTER', 'MYID')", 0) == me
    with pytest.raises(redis.exceptions.ResponseError, match="no permissions to run the 'info'"):
        as_user["script"].eval("return redis.call('INFO', 'cluster')", 0)
    assert admin.eval("return redis.call('INFO', 'cluster')", 0) == \
        b"# Cluster\r\ncluster_enabled:1\r\n"
    for command in (("CLUSTER", "SLOTS"), ("READONLY",), ("INFO",), ("CLUSTER", "MYSHARDID")):
        with pytest.raises(redis.exceptions.NoPermissionError):
            as_user["none"].execute_command(*command)
    # redis-py's RedisCluster routes every key to its owner as that user.
    rc = cluster_client(fleet, username="cl", password="pw")
    for i in range(60):
        rc.set(f"k{i}", i)
    assert [int(rc.get(f"k{i}")) for i in range(60)] == list(range(60))
    held = [fleet[n].client().dbsize() for n in NAMES]
    assert sum(held) == 60 and all(held), held


def test_a_client_that_has_not_authenticated_is_still_refused(server_factory):
    fleet = start_fleet(server_factory, NAMES, algo="slots", password=PW,
                        module_args=["auth-password", PW])
    for s in fleet.values():
        protocol(s, True)
    s = fleet["n0"]
    for command in (("CLUSTER", "SLOTS"), ("INFO",), ("INFO", "cluster"), ("READONLY",),
                    ("CLUSTER", "LINKS")):
        assert Raw(s.port).execute(*command).startswith(b"-NOAUTH"), command
    # Sent as it is, the emulation does not let the map out either.
    for command in (("SHARD.EMULATE", "CLUSTER", "SLOTS"), ("SHARD.EMULATE", "INFO")):
        assert Raw(s.port).execute(*command).startswith(b"-TRYAGAIN"), command
    c = s.client()
    assert len(c.execute_command("CLUSTER", "SLOTS")) == 3
    until(lambda: c.info("cluster")["cluster_enabled"] == 1, "INFO as a cluster node's")
    code, out = redis_cli_cluster("check", s, "-a", PW, "--no-auth-warning")
    assert code == 0 and "[OK] All 16384 slots covered." in out, out
    # A user other than default, granted +cluster: served where the filter knows the client;
    # on Redis 7.0 it cannot tell such a user from a client that has not authenticated, so
    # the server checks SHARD.CLUSTER.
    c.execute_command("ACL", "SETUSER", "cl", "on", ">pw", "+cluster")
    cl = s.client(username="cl", password="pw")
    if FILTER_SEES_CLIENT:
        assert len(cl.execute_command("CLUSTER", "SLOTS")) == 3
    else:
        with pytest.raises(redis.exceptions.NoPermissionError, match="shard.cluster"):
            cl.execute_command("CLUSTER", "SLOTS")


def test_assigning_slots_by_hand_is_refused_naming_the_ring_command(fleet):
    s = fleet["n0"]
    c = s.client()
    before = c.execute_command("CLUSTER", "SLOTS")
    other = fleet["n1"].client().execute_command("CLUSTER", "MYID").decode()
    raw = Raw(s.port)
    refusals = {
        ("ADDSLOTS", "1"): "SHARD.RING SET",
        ("ADDSLOTSRANGE", "1", "2"): "SHARD.RING SET",
        ("DELSLOTS", "1"): "SHARD.RESHARD START",
        ("DELSLOTSRANGE", "1", "2"): "SHARD.RESHARD START",
        ("FLUSHSLOTS",): "SHARD.RING SET",
        ("SETSLOT", "1", "NODE", other): "SHARD.RESHARD START",
        ("SETSLOT", "1", "STABLE"): "SHARD.RESHARD START",
        ("MEET", "127.0.0.1", "7000"): "SHARD.RESHARD START",
        ("FORGET", other): "SHARD.RESHARD START",
        ("REPLICATE", other): "REPLICAOF",
        ("FAILOVER",): "SENTINEL FAILOVER",
        ("RESET", "HARD"): "SHARD.RING SET",
        ("SET-CONFIG-EPOCH", "5"): "SHARD.RING SET",
        ("BUMPEPOCH",): "SHARD.RING SET",
    }
    for args, names in refusals.items():
        reply = raw.execute("CLUSTER", *args).decode()
        assert reply.startswith(f"-ERR CLUSTER {args[0]} is not run on a fleet"), reply
        assert names in reply, reply
    assert c.execute_command("CLUSTER", "SLOTS") == before
    # What clients read answers; what no cluster node has does not.
    assert c.execute_command("CLUSTER", "SAVECONFIG")
    assert b"MYSHARDID" in c.execute_command("CLUSTER", "HELP")
    with pytest.raises(redis.ResponseError, match="unknown subcommand"):
        c.execute_command("CLUSTER", "NOSUCH")
    with pytest.raises(redis.ResponseError, match="Unknown node"):
        c.execute_command("CLUSTER", "REPLICAS", "f" * 40)
    # redis-py's own cluster commands read them.
    rc = cluster_client(fleet)
    node = rc.get_node("127.0.0.1", s.port)
    assert rc.cluster_myshardid(node) == c.execute_command("CLUSTER", "MYSHARDID").decode()
    assert len(rc.cluster_links(node)) == 4


def test_redis_cli_cluster_check_and_info_pass(fleet):
    rc = cluster_client(fleet)
    for i in range(30):
        rc.set(f"user:{i}", i)
    code, out = redis_cli_cluster("check", fleet["n1"])
    assert code == 0, out
    for line in ("[OK] All nodes agree about slots configuration.",
                 "[OK] All 16384 slots covered.", "[OK] 30 keys in 3 masters."):
        assert line in out, out
    assert "[ERR]" not in out and "[WARNING]" not in out, out
    code, out = redis_cli_cluster("info", fleet["n2"])
    assert code == 0, out
    assert "[OK] 30 keys in 3 masters." in out, out
    assert len(re.findall(r"-> \d+ keys \| \d+ slots \| 0 slaves\.", out)) == 3, out
