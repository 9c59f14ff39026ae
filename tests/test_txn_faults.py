"""Transactions across nodes under faults at an exact step of the two-phase commit (issue 35,
docs/transactions.md): the coordinator is held at a step by `SHARD.DEBUG TXN-HOLD` (after
every owner prepared; after the decision is recorded; after one owner's COMMIT went out), and
the test kills, stops or fails over a node there, on a fleet of three with AOF on (fsync
always):

- the coordinator killed after PREPARE, before the decision: the owners end it by presumed
  abort once it is back (nothing applied, no lock left);
- the coordinator killed after the decision, or after one owner's COMMIT: restarted from its
  AOF, it sends the COMMITs again: every part applied exactly once;
- an owner killed after PREPARE: restarted from its AOF, its part is still locked, and the
  commit applies it; killed and still down when the decision comes: the coordinator sends it
  again once the owner is back, and forgets it;
- an owner stopped (SIGSTOP) past the lock: its late PREPARE's lock ends by presumed abort;
- isolation: while one owner applied and the other not yet, a reading transaction never sees
  one without the other; a plain read of the other waits;
- a coordinator that left the ring after its decision forgets it all the same;
- watches: a watched key written by another transaction's commit, at another node, through the
  recovery of a killed coordinator, fails the watching transaction.

The Sentinel failovers of an owner after PREPARE are in test_txn_failover.py.
"""

import signal
import time

import pytest
import redis

from helpers.fleet import make_fleet
from helpers.server import AOF, command_calls, until
from helpers.txn import Exec, call, counter, held, hold, no_lock_left, prepares_of

# The owners' waits for a lock, and the lock of a transaction the test lets expire.
LOCK_MS = 3000
# The lock of a transaction the test ends itself (no owner asks its coordinator meanwhile).
LONG_MS = 60_000


def txn_fleet(server_factory, lock_ms=LOCK_MS):
    """Three nodes with AOF and SHARD.DEBUG on, a 1 s call timeout and `lock_ms` locks."""
    f = make_fleet(server_factory, timeout_ms=1000,
                   config=[("enable-debug-command", "yes"), *AOF])
    for n in f:
        f.client(n).config_set("shard.txn-lock-ms", lock_ms)
    return f


@pytest.fixture
def fleet(server_factory):
    return txn_fleet(server_factory)


def long_locks(fleet):
    """n0's transactions lock for a minute: what ends them is the test's doing, not the lock."""
    fleet.client("n0").config_set("shard.txn-lock-ms", LONG_MS)


def prepared_txid(server):
    """The txid of the PREPARE in `server`'s AOF."""
    found = prepares_of(server)
    assert len(found) == 1, found
    return found.pop().decode()


def transfer(fleet, coordinator="n0", amount=30):
    """Accounts a (at n1) and b (at n2), 100 each; a transfer of `amount` from a to b through
    `coordinator`, held at the step already set there; returns (a, b, the Exec) once it waits
    there."""
    a, b = fleet.key_of("n1", prefix="acct"), fleet.key_of("n2", prefix="acct")
    c = fleet.client(coordinator)
    call(c, "MSET", a, 100, b, 100)
    ex = Exec(fleet[coordinator], [("DECRBY", a, amount), ("INCRBY", b, amount)])
    until(lambda: held(c) == 1, "the transaction waits at the hold")
    return a, b, ex


def values(fleet, a, b):
    return [fleet.client("n1").get(a), fleet.client("n2").get(b)]


def txid_locking(fleet, node, key):
    """The txid that locks `key` at `node` (from the TRYAGAIN of a read that waits 1 ms)."""
    c = fleet.client(node)
    c.config_set("shard.txn-lock-ms", 1)
    try:
        with pytest.raises(redis.ResponseError, match="^TRYAGAIN") as e:
            c.get(key)
    finally:
        c.config_set("shard.txn-lock-ms", LOCK_MS)
    return next(w.strip("()'") for w in str(e.value).split() if w.strip("()'").startswith("n0/"))


def restart(server):
    server.start()
    server.client().config_set("shard.txn-lock-ms", LOCK_MS)


# --- the coordinator killed ------------------------------------------------------------------


def test_coordinator_killed_after_prepare_the_owners_abort_by_presumption(fleet):
    hold(fleet.client("n0"), "prepared")
    a, b, ex = transfer(fleet)
    fleet["n0"].stop(signal.SIGKILL)
    txid = prepared_txid(fleet["n1"])
    assert isinstance(ex.join(), redis.ConnectionError)
    # The coordinator down: past the lock, the parts are in doubt and stay locked.
    until(lambda: counter(fleet.client("n1"), "txn_in_doubt") == 1, "n1's part in doubt")
    assert counter(fleet.client("n1"), "txn_locks_held") == 1
    restart(fleet["n0"])
    until(lambda: no_lock_left(fleet), "both parts ended")
    assert values(fleet, a, b) == [b"100", b"100"], "nothing applied"
    assert fleet.client("n0").execute_command("SHARD.TXN", "STATUS", txid) == b"abort"
    # The keys are free at once.
    assert call(fleet.client("n0"), "INCR", a) == 101


@pytest.mark.parametrize("step", ["decided", "committed-one"])
def test_coordinator_killed_after_the_decision_sends_the_commits_again(fleet, step):
    long_locks(fleet)
    hold(fleet.client("n0"), step)
    a, b, ex = transfer(fleet)
    txid = txid_locking(fleet, "n2" if step == "committed-one" else "n1",
                        b if step == "committed-one" else a)
    locked = [counter(fleet.client(n), "txn_locks_held") for n in ("n1", "n2")]
    if step == "committed-one":
        # n1's COMMIT went out first (queue order), n2's waits: one applied, one locked.
        assert locked == [0, 1] and fleet.client("n1").get(a) == b"70"
    else:
        # (A read of a locked key would wait for the lock.)
        assert locked == [1, 1]
    fleet["n0"].stop(signal.SIGKILL)
    assert isinstance(ex.join(), redis.ConnectionError)
    restart(fleet["n0"])
    until(lambda: no_lock_left(fleet), "every part applied and the decision forgotten")
    assert values(fleet, a, b) == [b"70", b"130"], "each part applied exactly once"
    for n in ("n1", "n2"):
        assert fleet.client(n).execute_command("SHARD.TXN", "COMMIT", txid) == b"DONE"
    assert fleet.client("n0").execute_command("SHARD.TXN", "STATUS", txid) == b"commit"


def test_coordinator_killed_as_its_first_commit_leaves_had_its_decision_in_the_aof(fleet):
    """n0 kills itself (SIGKILL) the moment the bytes of its first COMMIT are written to the
    owner's socket (TXN-HOLD kill-after-commit): the decision, recorded in-process, must be in
    its AOF by then. Restarted, n0 carries the commit out at both owners. Were the COMMIT
    written before the AOF (in the same turn), the restarted n0 would presume an abort when n2
    asks after its lock: n1 applied, n2 not."""
    c = fleet.client("n0")
    a, b = fleet.key_of("n1", prefix="acct"), fleet.key_of("n2", prefix="acct")
    call(c, "MSET", a, 100, b, 100)
    hold(c, "kill-after-commit")
    ex = Exec(fleet["n0"], [("DECRBY", a, 30), ("INCRBY", b, 30)])
    assert isinstance(ex.join(), redis.ConnectionError)
    until(lambda: not fleet["n0"].alive(), "n0 killed itself")
    restart(fleet["n0"])
    until(lambda: no_lock_left(fleet), "every part applied and the decision forgotten")
    assert values(fleet, a, b) == [b"70", b"130"], "each part applied, exactly once"


# --- an owner killed or stopped --------------------------------------------------------------


def test_owner_killed_after_prepare_restarts_locked_then_commits(fleet):
    long_locks(fleet)
    hold(fleet.client("n0"), "prepared")
    a, b, ex = transfer(fleet)
    fleet["n1"].stop(signal.SIGKILL)
    restart(fleet["n1"])
    n1 = fleet.client("n1")
    assert counter(n1, "txn_locks_held") == 1, "the prepared part came back from the AOF"
    assert txid_locking(fleet, "n1", a).startswith("n0/")
    hold(fleet.client("n0"), "OFF")
    assert ex.join() == [70, 130]
    assert values(fleet, a, b) == [b"70", b"130"]
    until(lambda: no_lock_left(fleet), "no lock, no decision left")


def test_owner_down_when_the_decision_comes_gets_the_commit_once_back(fleet):
    """The decision is taken while n1 is down: the client hears that the commit is decided but
    not confirmed; the coordinator sends n1's COMMIT again until n1 is back, and then forgets
    the decision (it does not wait for n1 to ask)."""
    long_locks(fleet)
    hold(fleet.client("n0"), "prepared")
    a, b, ex = transfer(fleet)
    fleet["n1"].stop(signal.SIGKILL)
    hold(fleet.client("n0"), "OFF")
    result = ex.join()
    assert isinstance(result, redis.ResponseError) and "committed" in str(result), result
    assert fleet.client("n2").get(b) == b"130"
    assert counter(fleet.client("n0"), "txn_decisions_held") == 1
    restart(fleet["n1"])
    until(lambda: no_lock_left(fleet), "n1's part applied and the decision forgotten")
    assert values(fleet, a, b) == [b"70", b"130"]


def test_a_commit_sent_again_after_the_owner_forgot_it_is_not_applied_again(fleet):
    """n2 is down when the decision comes: the coordinator sends the COMMIT, with the parts,
    again every second until n2 confirms, to n1 too, which applied its part and confirmed it.
    n1 keeps the last 10 000 txids it applied; once as many others were applied there since
    (20 to 30 s of the bank under faults at ten times its size), a COMMIT sent again must not
    apply n1's part a second time (it did: `a` went 100, 70, 40)."""
    long_locks(fleet)
    n0, n1 = fleet.client("n0"), fleet.client("n1")
    hold(n0, "prepared")
    a, b, ex = transfer(fleet)
    fleet["n2"].stop(signal.SIGKILL)
    hold(n0, "OFF")
    result = ex.join()
    assert isinstance(result, redis.ResponseError) and "committed" in str(result), result
    assert n1.get(a) == b"70"
    # 10 000 other transactions applied at n1 since (parts given with their COMMIT).
    filler = fleet.key_of("n1", prefix="filler")
    pipe = n1.pipeline(transaction=False)
    for i in range(10_000):
        pipe.execute_command("SHARD.TXN", "COMMIT", f"z/{i:x}", 1, 2, "INCR", filler)
    assert pipe.execute()[-1] == [10_000]
    commits = command_calls(fleet["n1"], "shard.txn|commit")
    until(lambda: command_calls(fleet["n1"], "shard.txn|commit") >= commits + 2,
          "the coordinator sent n1's COMMIT again, twice")
    assert n1.get(a) == b"70", "n1's part applied once"
    restart(fleet["n2"])
    until(lambda: no_lock_left(fleet), "n2's part applied and the decision forgotten")
    assert values(fleet, a, b) == [b"70", b"130"]


def test_owner_stopped_past_the_lock_its_late_prepare_ends_by_presumed_abort(fleet):
    """n1 is stopped (SIGSTOP) while the coordinator prepares: its PREPARE times out, the
    transaction fails and is aborted; the PREPARE n1 reads once continued locks its key for at
    most the lock, then ends by presumed abort (the coordinator never decided it)."""
    a, b = fleet.key_of("n1", prefix="acct"), fleet.key_of("n2", prefix="acct")
    c = fleet.client("n0")
    call(c, "MSET", a, 100, b, 100)
    fleet["n1"].proc.send_signal(signal.SIGSTOP)
    try:
        assert c.execute_command("SHARD.MULTI") == b"OK"
        call(c, "DECRBY", a, 30)
        call(c, "INCRBY", b, 30)
        with pytest.raises(redis.ResponseError, match="n1"):
            c.execute_command("SHARD.EXEC")
    finally:
        fleet["n1"].proc.send_signal(signal.SIGCONT)
    until(lambda: no_lock_left(fleet), "no lock left once n1 continued")
    assert values(fleet, a, b) == [b"100", b"100"]
    assert call(c, "INCR", a) == 101


# --- isolation and watches -------------------------------------------------------------------


def test_a_reader_never_sees_one_owner_applied_and_not_the_other(fleet):
    long_locks(fleet)
    hold(fleet.client("n0"), "committed-one")
    a, b, ex = transfer(fleet)
    until(lambda: fleet.client("n1").get(a) == b"70", "n1 applied its part")
    for via in ("n1", "n2"):
        r = fleet.client(via)
        r.config_set("shard.txn-lock-ms", 300)
        assert r.execute_command("SHARD.MULTI") == b"OK"
        assert call(r, "MGET", a, b) == b"QUEUED"
        with pytest.raises(redis.ResponseError, match="^TRYAGAIN"):
            r.execute_command("SHARD.EXEC")
        r.config_set("shard.txn-lock-ms", LOCK_MS)
    # A plain read of the part not applied yet waits for it too.
    n2 = fleet.client("n2")
    n2.config_set("shard.txn-lock-ms", 300)
    with pytest.raises(redis.ResponseError, match="^TRYAGAIN"):
        n2.get(b)
    n2.config_set("shard.txn-lock-ms", LOCK_MS)
    hold(fleet.client("n0"), "OFF")
    assert ex.join() == [70, 130]
    r = fleet.client("n2")
    assert r.execute_command("SHARD.MULTI") == b"OK"
    assert call(r, "MGET", a, b) == b"QUEUED"
    assert r.execute_command("SHARD.EXEC") == [[b"70", b"130"]]


@pytest.mark.parametrize("how", ["commit", "recovery"])
def test_a_watch_sees_a_write_by_another_transaction_at_another_node(fleet, how):
    """A client of n2 watches a (at n1); another transaction, coordinated by n0, writes a: by
    its COMMIT, or by its recovery after n0 was killed past the decision. The watching
    transaction then fails (nil), changing nothing."""
    a, b = fleet.key_of("n1", prefix="acct"), fleet.key_of("n2", prefix="acct")
    w = fleet.client("n2")
    call(w, "MSET", a, 100, b, 100)
    assert w.execute_command("SHARD.WATCH", a) == b"OK"
    assert call(w, "GET", a) == b"100"
    if how == "commit":
        c = fleet.client("n0")
        assert c.execute_command("SHARD.MULTI") == b"OK"
        call(c, "DECRBY", a, 30)
        call(c, "INCRBY", b, 30)
        assert c.execute_command("SHARD.EXEC") == [70, 130]
    else:
        long_locks(fleet)
        hold(fleet.client("n0"), "decided")
        ex = Exec(fleet["n0"], [("DECRBY", a, 30), ("INCRBY", b, 30)])
        until(lambda: held(fleet.client("n0")) == 1, "the transaction waits at the hold")
        fleet["n0"].stop(signal.SIGKILL)
        ex.join()
        restart(fleet["n0"])
        until(lambda: no_lock_left(fleet), "the recovery applied every part")
    assert values(fleet, a, b) == [b"70", b"130"]
    assert w.execute_command("SHARD.MULTI") == b"OK"
    call(w, "SET", a, "mine")
    call(w, "SET", b, "mine")
    assert w.execute_command("SHARD.EXEC") is None
    assert values(fleet, a, b) == [b"70", b"130"]


def test_a_part_in_doubt_waits_while_writes_are_paused(fleet):
    """An owner whose writes are paused (CLIENT PAUSE WRITE, as a failover pauses them) does
    not apply a part in doubt on its timer meanwhile (Redis 7.0 fails an assertion on a write
    replicated from a timer during the pause: the server crashed); it does once they resume."""
    n0, n1 = fleet.client("n0"), fleet.client("n1")
    n0.config_set("shard.txn-lock-ms", 300)
    hold(n0, "decided")
    a, b, ex = transfer(fleet)
    assert n1.execute_command("CLIENT", "PAUSE", 60_000, "WRITE") == b"OK"
    until(lambda: counter(n1, "txn_in_doubt") == 1, "n1's part in doubt")
    # Ten of the owner's ticks in doubt, each of which would ask and apply the answer (a
    # build that does crashes within the first; the fixed one passes however long this is).
    time.sleep(1.0)
    assert fleet["n1"].alive() and n1.ping()
    assert counter(n1, "txn_locks_held") == 1, "not applied while writes are paused"
    assert n1.execute_command("CLIENT", "UNPAUSE") == b"OK"
    until(lambda: counter(n1, "txn_locks_held") == 0, "applied once writes resume")
    hold(n0, "OFF")
    ex.join()
    until(lambda: no_lock_left(fleet), "every part applied and the decision forgotten")
    assert values(fleet, a, b) == [b"70", b"130"]


def test_a_coordinator_that_left_the_ring_forgets_its_decision(fleet):
    """n0 decides, then leaves the ring (as a shrink leaves it) before its COMMITs: it has no
    address of its own to send FORGET to any more; it forgets the decision all the same."""
    long_locks(fleet)
    n0 = fleet.client("n0")
    hold(n0, "decided")
    a, b, ex = transfer(fleet)
    assert n0.execute_command("SHARD.RING", "SET", "ketama",
                              *fleet.ring_args(["n1", "n2"])) == b"OK"
    hold(n0, "OFF")
    assert ex.join() == [70, 130]
    until(lambda: counter(n0, "txn_decisions_held") == 0, "the decision forgotten")
    assert values(fleet, a, b) == [b"70", b"130"]
