"""Transactions across nodes, the coordinator's side (docs/transactions.md): SHARD.WATCH,
SHARD.MULTI, SHARD.CALL queued, SHARD.EXEC / SHARD.DISCARD on a 3-node fleet.

A transaction whose keys have one owner and no watched key runs as MULTI/EXEC at that owner
(over the module's connection, or inside SHARD.EXEC when that owner is the coordinator
itself): it answers like the same MULTI/EXEC on a plain server. The tests that need the owner side (`SHARD.TXN WATCH/APPLY/PREPARE/COMMIT/...`, built
beside this) are skipped while the server has no `SHARD.TXN` command.
"""

import pytest
import redis

from helpers.fleet import make_fleet
from helpers.resp import Raw, raw_reply
from helpers.server import info_shard, until, wait_in_sync


def call(c, *args):
    return c.execute_command("SHARD.CALL", *args)


def owner_side(client):
    """Whether the owner side of the protocol is built in (`SHARD.TXN` is a command)."""
    return raw_reply(client, "COMMAND", "INFO", "shard.txn")[0] is not None


def needs_owner_side(fleet):
    if not owner_side(fleet.client("n0")):
        pytest.skip("the owner side (SHARD.TXN) is not built in yet")


@pytest.fixture
def fleet(server_factory):
    return make_fleet(server_factory, timeout_ms=2000, config=[("enable-debug-command", "yes")])


def counters(client):
    return {k: int(v) for k, v in info_shard(client).items() if k.startswith("txn_")}


def handler_calls(client):
    """How many SHARD.CALLs reached the module's handler (the command filter's rewrites of
    local calls run as the plain command, and count under it)."""
    return client.info("commandstats").get("cmdstat_shard.call", {}).get("calls", 0)


def run_queued(c, commands):
    """SHARD.MULTI, each command through SHARD.CALL (each must be QUEUED), SHARD.EXEC."""
    assert c.execute_command("SHARD.MULTI") == b"OK"
    for command in commands:
        assert call(c, *command) == b"QUEUED", command
    return c.execute_command("SHARD.EXEC")




@pytest.mark.parametrize("owner", ["n0", "n1"], ids=["owner-is-coordinator", "owner-elsewhere"])
def test_one_owner_answers_like_multi_exec_on_a_plain_server(fleet, server_factory, owner):
    plain = server_factory()
    keys = [fleet.key_of(owner, prefix=f"acct{i}") for i in range(3)]
    a, b, c_ = keys
    commands = [("SET", a, "10"), ("INCRBY", a, "5"), ("LPUSH", b, "x"), ("INCR", b),
                ("GET", a), ("DEL", c_), ("MGET", a, c_)]
    # Raw RESP bytes, RESP2 and RESP3: exactly what the plain server sends.
    for protocol in (2, 3):
        fleet.client(owner).delete(*keys)
        plain.client().delete(*keys)
        got = fleet.raw("n0", protocol=protocol).pipeline(
            [("SHARD.MULTI",)] + [("SHARD.CALL", *cmd) for cmd in commands] + [("SHARD.EXEC",)])
        want = Raw(plain.port, protocol=protocol).pipeline(
            [("MULTI",)] + list(commands) + [("EXEC",)])
        assert got[1:-1] == [b"+QUEUED\r\n"] * len(commands)
        assert got[-1] == want[-1], (got[-1], want[-1])
    c = fleet.client("n0")
    # Applied at the owner, as one block.
    assert fleet.client(owner).get(a) == b"15"
    assert counters(c)["txn_committed"] == 2


def test_a_local_call_inside_shard_multi_is_queued_not_run(fleet):
    """The command filter turns a local SHARD.CALL into the plain command; inside SHARD.MULTI
    it must not, or the command would run at once instead of being queued."""
    key = fleet.key_of("n0", prefix="local")
    c = fleet.client("n0")
    assert c.execute_command("SHARD.MULTI") == b"OK"
    assert call(c, "SET", key, "queued") == b"QUEUED"
    assert fleet.client("n0").get(key) is None, "the queued SET ran before SHARD.EXEC"
    # Another client's local calls run as before meanwhile.
    other = fleet.client("n0")
    assert call(other, "SET", key + "x", "1") == b"OK"
    assert c.execute_command("SHARD.EXEC") == [b"OK"]
    assert fleet.client("n0").get(key) == b"queued"
    # Once no client is inside SHARD.MULTI, local calls are rewritten again.
    before = handler_calls(other)
    assert call(other, "GET", key) == b"queued"
    assert handler_calls(other) == before


def test_errors_like_redis(fleet):
    c = fleet.client("n0")
    with pytest.raises(redis.ResponseError, match="SHARD.EXEC without SHARD.MULTI"):
        c.execute_command("SHARD.EXEC")
    with pytest.raises(redis.ResponseError, match="SHARD.DISCARD without SHARD.MULTI"):
        c.execute_command("SHARD.DISCARD")
    assert c.execute_command("SHARD.MULTI") == b"OK"
    with pytest.raises(redis.ResponseError, match="can not be nested"):
        c.execute_command("SHARD.MULTI")
    with pytest.raises(redis.ResponseError, match="SHARD.WATCH inside SHARD.MULTI"):
        c.execute_command("SHARD.WATCH", "k")
    assert c.execute_command("SHARD.DISCARD") == b"OK"
    with pytest.raises(redis.ResponseError, match="wrong number of arguments"):
        c.execute_command("SHARD.MULTI", "x")


def test_a_queue_time_error_aborts_the_transaction(fleet):
    k0, k1 = fleet.key_of("n1", prefix="q"), fleet.key_of("n2", prefix="q")
    c = fleet.client("n0")
    for bad, message in [
        (("NOSUCHCOMMAND", k0), "unknown command"),
        (("GET", k0, "extra"), "wrong number of arguments"),
        # (A command over keys of several owners is queued, gathered at EXEC:
        # test_gather_multi.py.)
        (("DBSIZE",), "has no key"),
        (("BLPOP", k0, "0"), "can block"),
    ]:
        assert c.execute_command("SHARD.MULTI") == b"OK"
        assert call(c, "SET", k0, "v") == b"QUEUED"
        with pytest.raises(redis.ResponseError, match=message):
            call(c, *bad)
        # Still inside SHARD.MULTI: later calls are queued, EXEC aborts them all.
        assert call(c, "SET", k1, "v") == b"QUEUED"
        with pytest.raises(redis.ResponseError, match="^EXECABORT|Transaction discarded"):
            c.execute_command("SHARD.EXEC")
        assert fleet.client("n1").get(k0) is None and fleet.client("n2").get(k1) is None
    assert counters(c)["txn_aborted_error"] == 4


def test_discard_drops_the_queue(fleet):
    key = fleet.key_of("n1", prefix="d")
    c = fleet.client("n0")
    assert c.execute_command("SHARD.MULTI") == b"OK"
    assert call(c, "SET", key, "v") == b"QUEUED"
    assert c.execute_command("SHARD.DISCARD") == b"OK"
    assert fleet.client("n1").get(key) is None
    # Not inside SHARD.MULTI any more: a call runs at once.
    assert call(c, "SET", key, "w") == b"OK"


def test_a_client_that_disconnects_inside_multi_is_forgotten(fleet):
    key = fleet.key_of("n0", prefix="gone")
    c = fleet.client("n0")
    c.execute_command("CLIENT", "SETNAME", "leaver")
    assert c.execute_command("SHARD.MULTI") == b"OK"
    assert call(c, "SET", key, "never") == b"QUEUED"
    c.connection_pool.disconnect()
    other = fleet.client("n0")
    # Its queue never runs, and local calls are rewritten again (no client inside MULTI).
    until(lambda: b"leaver" not in other.execute_command("CLIENT", "LIST"), "the client gone")
    before = handler_calls(other)
    assert call(other, "GET", key) is None
    assert handler_calls(other) == before


# --- with the owner side --------------------------------------------------------------------


def test_a_transfer_across_two_owners_commits_both_parts(fleet):
    needs_owner_side(fleet)
    a, b = fleet.key_of("n1", prefix="acct"), fleet.key_of("n2", prefix="acct")
    c = fleet.client("n0")
    call(c, "SET", a, 100)
    call(c, "SET", b, 100)
    got = run_queued(c, [("DECRBY", a, 30), ("INCRBY", b, 30), ("MGET", a, b)])
    assert got == [70, 130, [b"70", b"130"]]
    assert fleet.client("n1").get(a) == b"70" and fleet.client("n2").get(b) == b"130"
    assert counters(c)["txn_committed"] == 1
    assert counters(c)["txn_decisions_held"] == 0
    # In another database, there.
    d = fleet.client("n0", db=2)
    assert run_queued(d, [("INCRBY", a, 5), ("INCRBY", b, 5)]) == [5, 5]
    assert fleet.client("n1", db=2).get(a) == b"5" and fleet.client("n1").get(a) == b"70"


def test_a_watched_key_written_fails_the_transaction_everywhere(fleet):
    needs_owner_side(fleet)
    a, b = fleet.key_of("n1", prefix="w"), fleet.key_of("n2", prefix="w")
    c = fleet.client("n0")
    assert c.execute_command("SHARD.WATCH", a) == b"OK"
    fleet.client("n1").set(a, "changed")
    assert run_queued(c, [("SET", a, "mine"), ("SET", b, "mine")]) is None
    assert fleet.client("n1").get(a) == b"changed" and fleet.client("n2").get(b) is None
    assert counters(c)["txn_aborted_watch"] == 1
    # Not written: the same transaction commits.
    assert c.execute_command("SHARD.WATCH", a) == b"OK"
    assert run_queued(c, [("SET", a, "mine"), ("SET", b, "mine")]) == [b"OK", b"OK"]


def test_one_owner_with_a_watch_applies(fleet):
    needs_owner_side(fleet)
    a = fleet.key_of("n1", prefix="one")
    c = fleet.client("n0")
    assert c.execute_command("SHARD.WATCH", a) == b"OK"
    assert run_queued(c, [("INCR", a)]) == [1]
    assert c.execute_command("SHARD.WATCH", a) == b"OK"
    fleet.client("n1").incr(a)
    assert run_queued(c, [("INCR", a)]) is None
    assert fleet.client("n1").get(a) == b"2"


def test_split_commands_inside_a_transaction_merge_like_shard_call(fleet):
    needs_owner_side(fleet)
    keys = [fleet.key_of(n, prefix="s") for n in ("n0", "n1", "n2")]
    c = fleet.client("n0")
    flat = [x for k in keys for x in (k, f"v-{k}")]
    got = run_queued(c, [("MSET", *flat), ("MGET", *keys, "nokey"), ("DEL", *keys)])
    assert got == [b"OK", [f"v-{k}".encode() for k in keys] + [None], 3]


def test_status_answers_from_the_decisions_and_never_changes(fleet):
    needs_owner_side(fleet)
    c = fleet.client("n0")
    # Unknown here: presumed abort, recorded; a commit of it afterwards is refused.
    assert c.execute_command("SHARD.TXN", "STATUS", "n0/ff") == b"abort"
    with pytest.raises(redis.ResponseError, match="ABORTED"):
        c.execute_command("SHARD.TXN", "DECIDE", "n0/ff", "COMMIT", 0, 1, "n1", 1, 3, "SET", "x", "1")
    assert c.execute_command("SHARD.TXN", "STATUS", "n0/ff") == b"abort"
    # A commit recorded survives a restart (the RDB aux field).
    assert c.execute_command("SHARD.TXN", "DECIDE", "n0/fe", "COMMIT", 0, 1, "n9", 1, 3,
                             "SET", "x", "1") == b"OK"
    c.execute_command("DEBUG", "RELOAD")
    assert c.execute_command("SHARD.TXN", "STATUS", "n0/fe") == b"commit"
    assert c.execute_command("SHARD.TXN", "STATUS", "n0/ff") == b"abort"
    assert c.execute_command("SHARD.TXN", "FORGET", "n0/fe") == b"OK"


def test_a_decision_held_is_carried_out_after_a_restart(fleet):
    """A commit decided but not carried out (the coordinator died before its COMMITs) is sent
    again once the coordinator has loaded its decisions: the owner applies its part (given
    with the COMMIT), and the decision is forgotten."""
    needs_owner_side(fleet)
    c = fleet.client("n0")
    key = fleet.key_of("n1", prefix="held")
    # In database 5: the part is applied there.
    assert c.execute_command("SHARD.TXN", "DECIDE", "n0/abc", "COMMIT", 5, 1, "n1", 1, 3,
                             "SET", key, "applied") == b"OK"
    assert counters(c)["txn_decisions_held"] == 1
    c.execute_command("DEBUG", "RELOAD")
    until(lambda: fleet.client("n1", db=5).get(key) == b"applied", "n1 applied the part")
    assert fleet.client("n1").get(key) is None
    until(lambda: counters(c)["txn_decisions_held"] == 0, "the decision forgotten")
    assert c.execute_command("SHARD.TXN", "STATUS", "n0/abc") == b"commit"


def test_a_promoted_replica_carries_out_its_primary_s_decisions(fleet, server_factory):
    needs_owner_side(fleet)
    primary = fleet["n0"]
    replica = server_factory(module_args=["self", "n0", "call-timeout-ms", 2000],
                             config=[("replicaof", "127.0.0.1", primary.port)])
    c = primary.client()
    wait_in_sync(c, replica.client())
    # A transfer through the coordinator with a replica: its decision waits for the replica.
    a, b = fleet.key_of("n1", prefix="r"), fleet.key_of("n2", prefix="r")
    assert run_queued(c, [("SET", a, 1), ("SET", b, 2)]) == [b"OK", b"OK"]
    key = fleet.key_of("n1", prefix="promoted")
    assert c.execute_command("SHARD.TXN", "DECIDE", "n0/abd", "COMMIT", 0, 1, "n1", 1, 3,
                             "SET", key, "applied") == b"OK"
    wait_in_sync(c, replica.client())
    assert fleet.client("n1").get(key) is None
    replica.client().execute_command("REPLICAOF", "NO", "ONE")
    until(lambda: fleet.client("n1").get(key) == b"applied", "n1 applied the part")


def test_a_replica_coordinates_no_transaction(fleet, server_factory):
    replica = server_factory(module_args=["self", "n0"],
                             config=[("replicaof", "127.0.0.1", fleet["n0"].port)])
    wait_in_sync(fleet.client("n0"), replica.client())
    c = replica.client()
    with pytest.raises(redis.ResponseError, match="^transactions are coordinated by primaries"):
        c.execute_command("SHARD.WATCH", "k")
    # A two-phase commit needs a txid of the replica's generator, which its primary's repeats.
    assert c.execute_command("SHARD.MULTI") == b"OK"
    assert call(c, "SET", fleet.key_of("n1", prefix="rep"), 1) == b"QUEUED"
    assert call(c, "SET", fleet.key_of("n2", prefix="rep"), 1) == b"QUEUED"
    with pytest.raises(redis.ResponseError, match="coordinated by primaries"):
        c.execute_command("SHARD.EXEC")


@pytest.mark.parametrize("owners", [1, 2], ids=["one-owner", "two-owners"])
def test_a_locked_key_is_waited_for_then_tryagain(fleet, owners):
    """A key locked by another transaction's prepared part (held here by hand) makes the
    transaction wait and retry for shard.txn-lock-ms, then reply TRYAGAIN with nothing
    applied; once the lock ends, the same transaction commits."""
    needs_owner_side(fleet)
    a, b = fleet.key_of("n1", prefix="lk"), fleet.key_of("n2", prefix="lk")
    c = fleet.client("n0")
    c.config_set("shard.txn-lock-ms", 200)
    holder = fleet.client("n1")
    assert holder.execute_command("SHARD.TXN", "PREPARE", "n9/1", 60_000, 0, 1, 2,
                                  "GET", a) == b"PREPARED"
    commands = [("SET", a, "mine")] + ([("SET", b, "mine")] if owners == 2 else [])
    with pytest.raises(redis.ResponseError, match="^TRYAGAIN"):
        run_queued(c, commands)
    assert counters(c)["txn_aborted_lock"] == 1
    # (A read of the locked key would wait for the lock: the values are read once it ends.)
    assert holder.execute_command("SHARD.TXN", "ABORT", "n9/1") == b"OK"
    assert fleet.client("n1").get(a) is None and fleet.client("n2").get(b) is None
    assert run_queued(c, commands) == [b"OK"] * owners


@pytest.mark.parametrize("owner", ["n0", "n1"], ids=["watched-here", "watched-elsewhere"])
def test_a_queued_call_does_not_mark_its_own_watch(fleet, owner):
    """A write queued inside SHARD.MULTI is not a write yet: the transaction's own watch of the
    key (here at the coordinator, whose filter sees the queued SHARD.CALL) stays clean."""
    needs_owner_side(fleet)
    a = fleet.key_of(owner, prefix="own")
    c = fleet.client("n0")
    call(c, "SET", a, 10)
    assert c.execute_command("SHARD.WATCH", a) == b"OK"
    assert int(call(c, "GET", a)) == 10
    assert run_queued(c, [("INCRBY", a, 5), ("GET", a)]) == [15, b"15"]


def test_a_call_of_a_locked_key_is_queued_at_once(fleet):
    """Queueing touches no key: a SHARD.CALL of a key another transaction locks here is
    QUEUED at once (the owner's filter makes it wait for the lock as SHARD.LOCKED; its handler
    queues it for a client inside SHARD.MULTI), and the transaction runs once the lock ends."""
    needs_owner_side(fleet)
    k = fleet.key_of("n0", prefix="lockedq")
    c = fleet.client("n0")
    assert c.execute_command("SHARD.TXN", "PREPARE", "n9/2", 60_000, 0, 1, 2,
                             "GET", k) == b"PREPARED"
    assert c.execute_command("SHARD.MULTI") == b"OK"
    assert call(c, "SET", k, "mine") == b"QUEUED"
    assert c.execute_command("SHARD.TXN", "ABORT", "n9/2") == b"OK"
    assert c.execute_command("SHARD.EXEC") == [b"OK"]
    assert fleet.client("n0").get(k) == b"mine"
