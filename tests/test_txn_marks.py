"""Transactions across nodes, the owner's marks and locks at their edges (issue 35,
docs/transactions.md "What marks a watched key written"), `SHARD.TXN` driven directly against
real servers:

- a watch is per database: a write of the same name in another database leaves it clean, a
  write in its own marks it (a plain command, one queued in MULTI);
- a write marks a watched name of any length (the filter's direct reads of every string size);
- the module's own write path (`SHARD.APPLY`, a resharding copy's way in) marks a watch;
- a command the module's filter never learnt (renamed with `rename-command`, so not under its
  name in `COMMAND INFO`) marks a watch and waits for a lock as a known one does;
- an owner in doubt asks its coordinator `SHARD.TXN STATUS` on a connection of its own: the
  answer comes while a routed command waits for a lock at the coordinator on the shared one.
"""

import pytest
import redis

from helpers.server import FILTER_SEES_CLIENT, info_shard, until
from test_txn_owner import Background, blocked_on_lock, key_of, prepare, ring_of, txn, watch


def apply(client, txid, watched, *commands):
    out = [len(commands)]
    for c in commands:
        out += [len(c), *c]
    return txn(client, "APPLY", txid, len(watched), *watched, *out)


@pytest.fixture
def node(server_factory):
    """A server acting as node n0 of a ring of itself alone."""
    s = server_factory(module_args=["self", "n0"])
    s.client().execute_command("SHARD.RING", "SET", *ring_of(s))
    return s


def write_set(c):
    c.set("w", "x")


def write_multi(c):
    p = c.pipeline(transaction=True)
    p.set("w", "y")
    p.incr("other")
    p.execute()


@pytest.mark.parametrize("write", [write_set, write_multi], ids=["set", "multi"])
def test_a_watch_is_marked_by_writes_of_its_own_database_only(node, write):
    """Where the filter sees the client (Valkey, Redis 7.2+), a write in another database leaves
    a watch clean. Redis 7.0's filter cannot tell the database: a write there marks the name in
    every database (the watch fails for nothing and is retried; never the reverse)."""
    other_db = [b"OK"] if FILTER_SEES_CLIENT else None
    db0, db1 = node.client(db=0), node.client(db=1)
    for c in (db0, db1):
        c.set("w", "1")
    # Watched in database 0, written in database 1: clean.
    watch(db0, "n0/1", "w")
    write(db1)
    assert apply(db0, "n0/1", ["w"], ["SET", "out", "a"]) == other_db
    # Watched in database 1, written in database 0: clean; the reverse below.
    watch(db1, "n0/2", "w")
    write(db0)
    assert apply(db1, "n0/2", ["w"], ["SET", "out", "b"]) == other_db
    # Written in its own database: marked, in either.
    watch(db0, "n0/3", "w")
    watch(db1, "n0/4", "w")
    write(db0)
    assert apply(db1, "n0/4", ["w"], ["SET", "out", "c"]) == other_db
    assert apply(db0, "n0/3", ["w"], ["SET", "out", "d"]) is None
    watch(db1, "n0/5", "w")
    write(db1)
    assert apply(db1, "n0/5", ["w"], ["SET", "out", "e"]) is None
    if FILTER_SEES_CLIENT:
        assert (db0.get("out"), db1.get("out")) == (b"a", b"c")
    assert db0.get("w") in (b"x", b"y") and db1.get("w") in (b"x", b"y")


def test_a_user_allowed_only_plain_commands_writes_a_watched_key(node):
    """A write of a watched name runs as the plain command it is, whatever the user's ACL
    allows of the module's commands, and marks the watch."""
    admin = node.client()
    admin.execute_command("ACL", "SETUSER", "app", "on", ">pw", "~*", "+set", "+get", "+ping")
    admin.set("w", "1")
    watch(admin, "n0/1", "w")
    app = node.client(username="app", password="pw")
    assert app.set("w", "2") is True
    assert app.get("w") == b"2"
    assert apply(admin, "n0/1", ["w"], ["SET", "out", "a"]) is None


@pytest.mark.parametrize("length", [1, 44, 45, 255, 256, 65535, 65536, 70000])
def test_a_write_marks_a_watched_name_of_any_length(node, length):
    """The filter reads every argument's length and bytes (on Redis 7 from the server's own
    string objects: embedded up to 44 bytes, then raw with 8-, 16- and 32-bit length headers,
    bench/findings.md "Plain GET/SET while transactions run"): a write of another name of the
    same length leaves a watch clean; a plain write and a script's write of the watched name
    mark it."""
    c = node.client()
    name = "k" * length
    c.set(name, "1")
    watch(c, "n0/1", name)
    c.set("k" * (length - 1) + "j", "2")
    assert apply(c, "n0/1", [name], ["SET", "out", "a"]) == [b"OK"]
    watch(c, "n0/2", name)
    c.set(name, "3")
    assert apply(c, "n0/2", [name], ["SET", "out", "b"]) is None
    watch(c, "n0/3", name)
    c.eval("return redis.call('SET', KEYS[1], ARGV[1])", 1, name, "4")
    assert apply(c, "n0/3", [name], ["SET", "out", "c"]) is None
    assert c.get("out") == b"a" and c.get(name) == b"4"


@pytest.mark.parametrize("flag", ["REPLACE", "NX"])
def test_shard_apply_marks_the_watched_keys_it_writes(node, flag):
    """SHARD.APPLY writes through the module API (no command the filter sees runs): a key it
    writes counts as written; a key NX leaves as it was does not."""
    c = node.client()
    c.set("there", "1")
    watch(c, "n0/1", "fresh", "there")
    assert c.execute_command("SHARD.APPLY", flag, "fresh", "v", 0, "there", "v", 0) == (
        2 if flag == "REPLACE" else 1)
    assert apply(c, "n0/1", ["fresh"], ["SET", "out", "1"]) is None
    watch(c, "n0/2", "there")
    c.execute_command("SHARD.APPLY", flag, "there", "w", 0)
    expected = None if flag == "REPLACE" else [b"OK"]
    assert apply(c, "n0/2", ["there"], ["SET", "out", "2"]) == expected


@pytest.fixture
def renamed(server_factory):
    """n0 of a ring of itself, where APPEND is called MYAPPEND (`rename-command`): the command
    table the module learns at load (COMMAND INFO) names it `append`, so MYAPPEND is a command
    the module's filter does not know by that name."""
    s = server_factory(module_args=["self", "n0"], config=[("rename-command", "APPEND", "MYAPPEND")])
    s.client().execute_command("SHARD.RING", "SET", *ring_of(s))
    return s


def test_a_command_the_filter_never_learnt_marks_a_watch(renamed):
    c = renamed.client()
    watch(c, "n0/1", "w", "other")
    assert c.execute_command("MYAPPEND", "w", "+") == 1
    assert apply(c, "n0/1", ["w"], ["SET", "out", "1"]) is None
    watch(c, "n0/2", "other")
    assert apply(c, "n0/2", ["other"], ["SET", "out", "2"]) == [b"OK"]


def test_a_command_the_filter_never_learnt_waits_for_a_lock(renamed):
    c = renamed.client()
    c.set("k", "old")
    assert prepare(c, "n0/1", ["SET", "k", "new"]) == b"PREPARED"
    writer = Background(renamed, "MYAPPEND", "k", "+")
    until(lambda: blocked_on_lock(c) or writer.result is not None,
          "the renamed APPEND to wait for the lock (or to run)")
    assert writer.result is None, f"MYAPPEND ran inside the lock: {writer.result!r}"
    assert txn(c, "COMMIT", "n0/1") == [b"OK"]
    assert writer.join() == 4
    assert c.get("k") == b"new+"
    if FILTER_SEES_CLIENT:
        # Inside MULTI, where the filter can tell: refused at queue time, EXEC aborts.
        assert prepare(c, "n0/2", ["SET", "k", "newer"]) == b"PREPARED"
        p = c.pipeline(transaction=True)
        p.execute_command("MYAPPEND", "k", "!")
        with pytest.raises(redis.ResponseError, match="EXECABORT|TRYAGAIN"):
            p.execute()
        assert txn(c, "ABORT", "n0/2") == b"OK"
        assert c.get("k") == b"new+"


def test_a_question_in_doubt_does_not_wait_behind_a_routed_command(server_factory):
    """n0 holds a part of n1's in doubt and asks n1 STATUS while a client's routed SET waits at
    n1 for a lock (on n0's shared connection to n1): the answer (a presumed abort) comes and
    n0 drops its part while the SET still waits."""
    coordinator = server_factory(module_args=["self", "n1", "call-timeout-ms", 60_000])
    owner = server_factory(module_args=["self", "n0", "call-timeout-ms", 60_000])
    o, k = owner.client(), coordinator.client()
    ring = ring_of(owner, ("n1", coordinator.port))
    for c in (o, k):
        c.execute_command("SHARD.RING", "SET", *ring)
    k.config_set("shard.txn-lock-ms", 600_000)
    mine, theirs = key_of(o, "n0"), key_of(o, "n1")
    # A lock at n1 (of a transaction of an unknown n9, far from its deadline), and a routed SET
    # of that key from a client of n0, waiting for it at n1.
    assert prepare(k, "n9/1", ["SET", theirs, "locked"], lock_ms=600_000) == b"PREPARED"
    routed = Background(owner, "SHARD.CALL", "SET", theirs, "routed")
    until(lambda: blocked_on_lock(k), "the routed SET to wait at n1")
    # A part of n1's at n0, past its deadline at once: n0 asks n1, n1 never decided it.
    assert prepare(o, "n1/7", ["SET", mine, "v"], lock_ms=1) == b"PREPARED"
    until(lambda: info_shard(o)["txn_locks_held"] == "0",
          "n0 to learn n1's answer and drop its part")
    assert routed.result is None and blocked_on_lock(k), "the routed SET still waits"
    assert o.get(mine) is None
    assert txn(k, "ABORT", "n9/1") == b"OK"
    assert routed.join() == b"OK"
    assert k.get(theirs) == b"routed"
