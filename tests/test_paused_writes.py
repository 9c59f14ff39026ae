"""While a server's writes are paused (`CLIENT PAUSE WRITE`, as Redis's own `FAILOVER` pauses
them, or an operator), nothing the module does may be replicated: Redis 7.0 and Valkey fail an
assertion (`propagateNow`: '!(areClientsPaused() && ...)') and the server exits when a command
or a timer propagates a write then. These tests pause a server with AOF on (so that writes are
propagated) while the module's writers run, and check that the server lives and that the work
waits for the pause's end, then completes:
- a resharding's cleanup (deletes from a module timer): it waits, then deletes the rest;
- the module's own commands that replicate (`SHARD.RING SET`, `LEASE`, a fleet step): the
  server holds them until the pause ends, as it holds `SET`, instead of running them;
- a fleet operation (`SHARD.RESHARD START`) whose coordinator's writes are paused midway;
- a transaction across two owners whose coordinator's writes are paused after every owner
  prepared, or after its decision: it completes, its decision and forget wait for the pause;
- a command waiting for a transaction's lock (`SHARD.LOCKED`, a blocked client whose reply
  callback runs the command, replicated) let go by the lock's `ABORT` in the same turn of the
  event loop as `CLIENT PAUSE WRITE`: refused (`TRYAGAIN`, not run), the write after the pause
  runs.

The audit of every writer outside a flagged command's own handler (docs/architecture.md, "Where
state lives"): module timers (a cleanup: here; an owner's part in doubt:
test_txn_faults.py::test_a_part_in_doubt_waits_while_writes_are_paused), the BEFORE_SLEEP
handler (the coordinator's decisions, sent to itself as a command while paused, and its
forgets, which wait: here), blocked clients' reply callbacks (only
SHARD.LOCKED's runs a command: here; the others write a reply), the connection pool's callbacks,
keyspace-event, fork-done and server-event handlers (these write nothing: every node, this one
included, is reached as a command over a connection, which the server holds).
"""

import signal
import threading
import time

import pytest
import redis

from helpers.fleet import (NAMES3, NAMES4, check_placement, make_fleet, owners, populate,
                           ring_args, ring_get, snapshot, start_fleet)
from helpers.reshard import start_resharding, status, wait_fleet, wait_job
from helpers.server import AOF, info_shard, until
from helpers.txn import held, hold

PAUSE_MS = 1500


def alive(server):
    return server.proc.poll() is None and server.client().ping()


def test_cleanup_waits_while_writes_are_paused(server_factory):
    servers = start_fleet(server_factory, ["a", "b"], ring=False, config=AOF)
    a = servers["a"].client()
    a.execute_command("SHARD.RING", "SET", "ketama", *ring_args(servers, ["a"]))
    pipe = a.pipeline(transaction=False)
    for i in range(5000):
        pipe.set(f"k{i}", i)
    pipe.execute()
    # A ring that gives b about half the keys: a's cleanup deletes them, 500 a second.
    a.execute_command("SHARD.RING", "SET", "ketama", *ring_args(servers, ["a", "b"]))
    assert a.execute_command("SHARD.RESHARD", "CLEANUP") == b"OK"
    a.execute_command("SHARD.RESHARD", "THROTTLE", 500)
    until(lambda: status(a)["deleted"] > 0, "the cleanup deleting")
    assert a.execute_command("CLIENT", "PAUSE", PAUSE_MS, "WRITE") == b"OK"
    during = status(a)["deleted"]
    time.sleep(PAUSE_MS / 2000)
    assert alive(servers["a"]), "the server died while its writes were paused"
    # Nothing deleted while paused (a step already under way may have ended: a batch at most).
    assert status(a)["deleted"] - during <= 128, status(a)
    try:  # the rest at full speed (unless the cleanup has ended meanwhile, on a slow machine)
        a.execute_command("SHARD.RESHARD", "THROTTLE", 0)
    except redis.ResponseError as e:
        assert "no resharding job is running" in str(e), e
    st = wait_job(a)
    assert st["state"] == b"done" and st["failed"] == 0, st
    assert alive(servers["a"])
    left = {k.decode() for k in a.keys("k*")}
    assert left and set(owners(a, sorted(left))) == {"a"}, "a keeps only its own keys"
    assert len(left) < 5000


def test_replicated_module_commands_wait_for_the_pause(server_factory):
    servers = start_fleet(server_factory, ["a"], ring=False, config=AOF)
    a = servers["a"].client()
    a.execute_command("SHARD.RING", "SET", "ketama", *ring_args(servers, ["a"]))
    assert a.execute_command("CLIENT", "PAUSE", PAUSE_MS, "WRITE") == b"OK"
    started = time.monotonic()
    # SHARD.RING SET replicates: the server holds it until the pause ends, then runs it.
    other = servers["a"].client()
    assert other.execute_command("SHARD.RING", "SET", "ketama", "a",
                                 f"127.0.0.1:{servers['a'].port}", 2) == b"OK"
    held = time.monotonic() - started
    assert alive(servers["a"]), "the server died while its writes were paused"
    assert held >= PAUSE_MS / 1000 * 0.5, f"SHARD.RING SET ran during the pause ({held:.2f} s)"
    assert ring_get(a)["nodes"][0]["weight"] == 2, ring_get(a)
    # The server restarted from its AOF holds the ring set after the pause.
    servers["a"].stop(signal.SIGKILL)
    servers["a"].start()
    assert ring_get(servers["a"].client())["nodes"][0]["weight"] == 2


def test_fleet_operation_with_the_coordinators_writes_paused(server_factory):
    servers = start_fleet(server_factory, NAMES4, ring=NAMES3, on=NAMES4, config=AOF)
    keys = populate({n: servers[n] for n in NAMES3}, n=3000)
    before = snapshot(servers, keys)
    c0 = servers["n0"].client()
    pauser = threading.Timer(0.05, lambda: servers["n0"].client().execute_command(
        "CLIENT", "PAUSE", PAUSE_MS, "WRITE"))
    pauser.start()
    assert start_resharding(c0, servers, NAMES4, maxrate=2000) == b"OK"
    pauser.join()
    st = wait_fleet(c0, "done", timeout=60)
    assert all(alive(servers[n]) for n in NAMES4), "a server died while writes were paused"
    check_placement(servers, NAMES4, keys, before)
    assert st["phase"] == b"done"


def test_a_command_let_go_by_a_lock_as_writes_pause_does_not_run_in_the_pause(server_factory):
    """A plain write of a locked key waits (SHARD.LOCKED, a blocked client); the transaction's
    ABORT and `CLIENT PAUSE WRITE`, pipelined, run in one turn of the event loop: the ABORT
    lets the waiting SET go, whose reply callback runs the SET (replicated) only at the turn's
    end, inside the pause. It must not run there (on the build before, the server died): it
    gets TRYAGAIN, nothing written, and the server takes writes again after the pause."""
    s = server_factory(module_args=["self", "n0"], config=AOF)
    c = s.client()
    c.execute_command("SHARD.RING", "SET", "ketama", "n0", f"127.0.0.1:{s.port}", 1)
    c.set("k", "old")
    assert c.execute_command("SHARD.TXN", "PREPARE", "n0/1", 60_000, 0,
                             1, 3, "SET", "k", "new") == b"PREPARED"
    result = {}

    def write():
        try:
            result["reply"] = s.client().set("k", "mine")
        except redis.RedisError as e:
            result["reply"] = e
    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    until(lambda: any(cl.get("cmd") == "shard.locked" and "b" in cl.get("flags", "")
                      for cl in c.client_list()), "the SET to wait for the lock")
    p = c.pipeline(transaction=False)
    p.execute_command("SHARD.TXN", "ABORT", "n0/1")
    p.execute_command("CLIENT", "PAUSE", PAUSE_MS, "WRITE")
    assert p.execute() == [b"OK", b"OK"]
    writer.join(30)
    assert alive(s), "the server died: the let-go SET was replicated while writes were paused"
    got = result["reply"]
    assert isinstance(got, redis.ResponseError), got
    assert str(got).startswith("TRYAGAIN"), got
    assert c.get("k") == b"old", "the refused SET wrote nothing"
    # After the pause the same write runs (the server held it until then).
    assert s.client().set("k", "mine")
    assert c.get("k") == b"mine"
    s.stop(signal.SIGKILL)
    s.start()
    assert s.client().get("k") == b"mine", "the write after the pause is in the AOF"


@pytest.mark.parametrize("step", ["prepared", "decided"])
def test_a_transaction_whose_coordinators_writes_pause_midway_completes_after(server_factory,
                                                                             step):
    """A two-owner transfer held at its coordinator (`SHARD.DEBUG TXN-HOLD`) after every owner
    prepared (its decision, recorded in-process at the turn's end, comes in the pause: it goes
    to itself as `SHARD.TXN DECIDE`, which the server holds until the pause ends), or after
    its decision (the owners commit; its forget, at a turn's end, waits for the pause's end);
    the coordinator's writes paused there: it lives, and the transfer completes. (The call
    timeout is longer than the pause: a `DECIDE` held longer fails the transaction, aborted.)"""
    fleet = make_fleet(server_factory, timeout_ms=PAUSE_MS * 4,
                       config=[("enable-debug-command", "yes"), *AOF])
    n0 = fleet.client("n0")
    a, b = fleet.key_of("n1", prefix="acct"), fleet.key_of("n2", prefix="acct")
    n0.execute_command("SHARD.CALL", "MSET", a, 100, b, 100)
    hold(n0, step)
    result = {}
    w = fleet["n0"].client(socket_timeout=60)
    assert w.execute_command("SHARD.MULTI") == b"OK"
    assert w.execute_command("SHARD.CALL", "DECRBY", a, 30) == b"QUEUED"
    assert w.execute_command("SHARD.CALL", "INCRBY", b, 30) == b"QUEUED"

    def run():
        try:
            result["reply"] = w.execute_command("SHARD.EXEC")
        except (redis.RedisError, OSError) as e:
            result["reply"] = e
    ex = threading.Thread(target=run, daemon=True)
    ex.start()
    until(lambda: held(n0) == 1,
          "the transaction to wait at the hold")
    assert n0.execute_command("CLIENT", "PAUSE", PAUSE_MS, "WRITE") == b"OK"
    # (SHARD.DEBUG writes nothing: the server runs it in the pause.)
    hold(n0, "OFF")
    ex.join(60)
    assert alive(fleet["n0"]), "the coordinator died while its writes were paused"
    assert result["reply"] == [70, 130], result
    assert [fleet.client("n1").get(a), fleet.client("n2").get(b)] == [b"70", b"130"]
    until(lambda: info_shard(n0)["txn_decisions_held"] == "0", "the decision forgotten")
    assert alive(fleet["n0"])
