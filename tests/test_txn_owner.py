"""Transactions across nodes, the owner's side (issue 35, docs/transactions.md): `SHARD.TXN`
driven directly, as a coordinator sends it, against real servers.

- the watch table: what marks a watched key written (a client's write, a delete, an expiry, a
  flush, a script, a write queued in MULTI, the module's own write of a routed call), and APPLY:
  nil on a written watch, else the commands as one block (one MULTI/EXEC in the AOF and at the
  replica);
- PREPARE's refusals (WATCHED, LOCKED, MOVED, a moving key, a key reserved for a command let go
  that has not run yet), the lock it takes: a plain command
  of a locked key waits for COMMIT or ABORT, gets TRYAGAIN after shard.txn-lock-ms, and is refused
  at once inside MULTI; COMMIT's DONE, COMMIT with the parts when the record is gone;
- the record's durability: kill -9 and a restart from the AOF, a restart from the RDB, a promoted
  replica; a resharding step that would move a locked key;
- a part in doubt asks its coordinator (a second real server) and commits by its answer, or
  stays locked (counted in INFO) while the coordinator cannot be reached.
"""

import signal
import socket
import threading
import time

import pytest
import redis

from helpers.server import (AOF, FILTER_SEES_CLIENT, PRIMARY, aof_command_names, info_shard,
                            until, wait_in_sync)
from helpers.ports import free_port
from helpers.reshard import wait_job


def txn(client, *args):
    return client.execute_command("SHARD.TXN", *args)


def cmds(*commands):
    """`ncmds (argc arg...)...` of the protocol."""
    out = [len(commands)]
    for c in commands:
        out += [len(c), *c]
    return out


def watch(client, txid, *keys, ttl=60_000):
    assert txn(client, "WATCH", txid, ttl, *keys) == b"OK"


def apply(client, txid, watched, *commands):
    return txn(client, "APPLY", txid, len(watched), *watched, *cmds(*commands))


def prepare(client, txid, *commands, watched=(), lock_ms=60_000):
    return txn(client, "PREPARE", txid, lock_ms, len(watched), *watched, *cmds(*commands))


def info(client):
    return info_shard(client)


def blocked_on_lock(client):
    """A client of the server is blocked in SHARD.LOCKED (its command waits for a lock)."""
    return any(c.get("cmd") == "shard.locked" and "b" in c.get("flags", "")
               for c in client.client_list())


class Background:
    """Runs one command on its own connection in a thread; `.result` is its reply or error."""

    def __init__(self, server, *command):
        self.result = None
        self.client = server.client()

        def run():
            try:
                self.result = self.client.execute_command(*command)
            except redis.RedisError as e:
                self.result = e
        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def join(self):
        self.thread.join(30)
        assert not self.thread.is_alive()
        return self.result


def ring_of(server, *nodes):
    """A ketama ring of this server as n0 and the given (name, port) nodes."""
    args = ["ketama", "n0", f"127.0.0.1:{server.port}", 1]
    for name, port in nodes:
        args += [name, f"127.0.0.1:{port}", 1]
    return args


def key_of(client, node, prefix="k"):
    """A key the current ring gives to `node`."""
    for i in range(10_000):
        key = f"{prefix}{i}"
        if client.execute_command("SHARD.WHEREIS", key) == node.encode():
            return key
    raise AssertionError(f"no key of {node}")


@pytest.fixture
def node(server_factory):
    """A server acting as node n0 of a ring of itself alone."""
    s = server_factory(module_args=["self", "n0"])
    s.client().execute_command("SHARD.RING", "SET", *ring_of(s))
    return s


# --- the watch table -----------------------------------------------------------------------


def marks(name):
    """The writes that must mark the watched key `w`, each run after the WATCH."""
    def set_(c, s):
        c.set("w", "2")

    def del_(c, s):
        c.delete("w")

    def expire(c, s):
        # `w` was given a TTL before the WATCH (`expiring`): its expiry, not a command, marks
        # it (actively, or when this read finds it gone: the `expired` event either way).
        until(lambda: c.exists("w") == 0, "the watched key to expire")

    def flush(c, s):
        c.flushdb()

    def script(c, s):
        c.eval("redis.call('SET', 'w', '3') return 1", 0)

    def multi(c, s):
        p = c.pipeline(transaction=True)
        p.set("w", "4")
        p.execute()

    def routed(c, s):
        # A routed call that runs here through RedisModule_Call (its keys move with its
        # arguments, so the command filter does not make it a plain ZUNIONSTORE): the module's
        # own write.
        c.zadd("src", {"m": 1})
        assert c.execute_command("SHARD.CALL", "ZUNIONSTORE", "w", 1, "src") == 1

    def routed_plain(c, s):
        c.execute_command("SHARD.CALL", "SET", "w", "5")
    return {"set": set_, "del": del_, "expire": expire, "flush": flush, "script": script,
            "multi": multi, "routed": routed, "routed_plain": routed_plain}[name]


@pytest.mark.parametrize("how", ["set", "del", "expire", "flush", "script", "multi", "routed",
                                 "routed_plain"])
def test_a_write_of_a_watched_key_makes_apply_nil(node, how):
    c = node.client()
    c.set("other", "1")
    for _ in range(10):
        c.set("w", "1", px=500 if how == "expire" else None)
        watch(c, "n0/1", "w", "other")
        if c.exists("w"):
            break
    marks(how)(c, node)
    assert apply(c, "n0/1", ["w"], ["SET", "out", "applied"]) is None
    assert c.get("out") is None, "nothing of a transaction whose watch was written runs"
    # The same watch of a key nobody wrote applies.
    watch(c, "n0/2", "other")
    assert apply(c, "n0/2", ["other"], ["SET", "out", "applied"]) == [b"OK"]
    assert c.get("out") == b"applied"


def test_a_watch_is_dropped_after_its_ttl_and_then_counts_as_written(node):
    c = node.client()
    watch(c, "n0/1", "w", ttl=1)
    time.sleep(0.01)  # longer than the 1 ms ttl, whatever the machine's load
    assert apply(c, "n0/1", ["w"], ["SET", "out", "1"]) is None
    assert c.get("out") is None
    watch(c, "n0/2", "w")
    assert txn(c, "UNWATCH", "n0/2") == b"OK"
    assert apply(c, "n0/2", ["w"], ["SET", "out", "1"]) is None, "unwatched: gone"


def test_apply_is_one_block_in_the_aof_and_at_the_replica(server_factory):
    primary = server_factory(config=AOF + PRIMARY)
    replica = server_factory(config=AOF)
    p, r = primary.client(), replica.client()
    r.replicaof("127.0.0.1", primary.port)
    wait_in_sync(p, r)
    until(lambda: r.info("persistence")["aof_rewrite_in_progress"] == 0
          and r.info("persistence")["aof_rewrite_scheduled"] == 0, "the replica's AOF rewrite")
    watch(p, "n0/1", "a")
    replies = apply(p, "n0/1", ["a"], ["SET", "a", "1"], ["INCR", "a"], ["GET", "a"],
                    ["LPUSH", "a", "x"])
    assert replies[:3] == [b"OK", 2, b"2"]
    assert isinstance(replies[3], redis.ResponseError) and "WRONGTYPE" in str(replies[3])
    wait_in_sync(p, r)
    assert r.get("a") == b"2"
    # The failed LPUSH wrote nothing: the block holds the two writes.
    for server in (primary, replica):
        # (Valkey writes a SELECT inside the block.)
        names = [n for n in aof_command_names(server.workdir) if n != b"select"]
        at = names.index(b"multi")
        assert names[at:at + 4] == [b"multi", b"set", b"incr", b"exec"], names


# --- PREPARE, locks, COMMIT, ABORT ---------------------------------------------------------


def test_prepare_refuses_a_written_watch_and_a_key_locked_by_another(node):
    c = node.client()
    watch(c, "n0/1", "a")
    c.set("a", "x")
    with pytest.raises(redis.ResponseError, match="^WATCHED"):
        prepare(c, "n0/1", ["SET", "b", "1"], watched=["a"])
    assert prepare(c, "n0/2", ["SET", "b", "1"], ["SET", "c", "1"]) == b"PREPARED"
    with pytest.raises(redis.ResponseError, match="^LOCKED n0/2"):
        prepare(c, "n0/3", ["SET", "c", "2"])
    assert prepare(c, "n0/2", ["SET", "b", "1"]) == b"PREPARED", "a retry is prepared already"
    assert info(c)["txn_locks_held"] == "2"
    with pytest.raises(redis.ResponseError, match="^SYNTAX"):
        txn(c, "PREPARE", "n0/4", 1000, 5, "a")
    with pytest.raises(redis.ResponseError, match="^SYNTAX"):
        txn(c, "PREPARE", "n0/4", 1000, 0, 1, 2, "GET")


def test_prepare_refuses_a_key_of_another_node_and_a_moving_key(node):
    c = node.client()
    other = free_port()
    c.execute_command("SHARD.RING", "SET", *ring_of(node, ("n1", other)))
    theirs = key_of(c, "n1")
    with pytest.raises(redis.ResponseError, match="^MOVED"):
        prepare(c, "n0/1", ["SET", theirs, "1"])
    # A resharding that brings n1's keys here: they are moving until it settles.
    c.execute_command("SHARD.RING", "BEGIN", *ring_of(node))
    with pytest.raises(redis.ResponseError, match="^TRYAGAIN.*moving"):
        prepare(c, "n0/1", ["SET", theirs, "1"])
    with pytest.raises(redis.ResponseError, match="^TRYAGAIN.*moving"):
        apply(c, "n0/1", [], ["SET", theirs, "1"])
    assert info(c)["txn_locks_held"] == "0"


def test_a_plain_command_of_a_locked_key_waits_for_commit(node):
    c = node.client()
    c.set("k", "old")
    assert prepare(c, "n0/1", ["SET", "k", "new"], ["SET", "k2", "v"]) == b"PREPARED"
    assert c.get("free") is None, "a key of no lock runs at once"
    reader = Background(node, "GET", "k")
    writer = Background(node, "APPEND", "k", "+")
    until(lambda: sum(cl.get("cmd") == "shard.locked" for cl in c.client_list()) == 2,
          "both commands to wait for the lock")
    assert txn(c, "COMMIT", "n0/1") == [b"OK", b"OK"]
    assert reader.join() in (b"new", b"new+")
    assert writer.join() == 4
    assert c.get("k") == b"new+"
    assert txn(c, "COMMIT", "n0/1") == b"DONE", "COMMIT is idempotent"
    assert txn(c, "STATUS", "n0/1") == b"commit"
    assert info(c)["txn_locks_held"] == "0"


def test_a_command_let_go_runs_before_another_transaction_may_lock_its_key(node):
    """COMMIT of one transaction and PREPARE of the next, pipelined (so both run before the
    event loop lets the waiting clients run, in its reply callbacks): the PREPARE is refused
    with LOCKED (the coordinator waits and retries it), and the GET and APPEND let go by the
    COMMIT run, neither inside the second transaction's lock nor refused (issue 43: a client's
    optimistic loop retries a nil EXEC, never an error of its GET). Once they ran the key is
    free to lock. (On the build before, the PREPARE locked the key and both got TRYAGAIN 'it
    was locked again as the command was let go'.)"""
    c = node.client()
    c.set("k", "old")
    assert prepare(c, "n0/1", ["SET", "k", "new"]) == b"PREPARED"
    reader = Background(node, "GET", "k")
    writer = Background(node, "APPEND", "k", "+")
    until(lambda: sum(cl.get("cmd") == "shard.locked" for cl in c.client_list()) == 2,
          "the GET and the APPEND to wait for the lock")
    p = c.pipeline(transaction=False)
    p.execute_command("SHARD.TXN", "COMMIT", "n0/1")
    p.execute_command("SHARD.TXN", "PREPARE", "n0/2", 60_000, 0, *cmds(["SET", "k", "newer"]))
    committed, second = p.execute(raise_on_error=False)
    assert committed == [b"OK"]
    assert reader.join() in (b"new", b"new+")
    assert writer.join() == 4
    assert isinstance(second, redis.ResponseError), second
    assert str(second).startswith("LOCKED "), second
    assert "'k'" in str(second), second
    assert c.get("k") == b"new+"
    assert prepare(c, "n0/2", ["SET", "k", "newer"]) == b"PREPARED", "the retry locks it"
    assert txn(c, "COMMIT", "n0/2") == [b"OK"]
    assert c.get("k") == b"newer"
    assert info(c)["txn_locks_held"] == "0"


def test_a_waiting_client_gone_leaves_no_key_reserved(node):
    """A client that waited for a lock and disconnected is let go when the lock ends like the
    others (its reply goes nowhere): the key is reserved only until the server dropped it, in
    that same turn of the event loop, and then locks again."""
    c = node.client()
    c.set("k", "old")
    assert prepare(c, "n0/1", ["SET", "k", "new"]) == b"PREPARED"
    gone = socket.create_connection(("127.0.0.1", node.port))
    gone.sendall(b"GET k\r\n")
    until(lambda: blocked_on_lock(c), "the GET to wait for the lock")
    gone.close()
    until(lambda: not blocked_on_lock(c), "the GET's client to be gone")
    p = c.pipeline(transaction=False)
    p.execute_command("SHARD.TXN", "ABORT", "n0/1")
    p.execute_command("SHARD.TXN", "PREPARE", "n0/2", 60_000, 0, *cmds(["SET", "k", "x"]))
    aborted, second = p.execute(raise_on_error=False)
    assert aborted == b"OK"
    assert isinstance(second, redis.ResponseError) and str(second).startswith("LOCKED "), second
    assert prepare(c, "n0/2", ["SET", "k", "x"]) == b"PREPARED"
    assert txn(c, "COMMIT", "n0/2") == [b"OK"]
    assert c.get("k") == b"x"


def test_a_routed_call_the_filter_leaves_to_the_module_waits_for_the_lock_too(node):
    """While a client of this node is inside SHARD.MULTI the filter no longer turns a local
    SHARD.CALL into the plain command (it could be that client's, to queue): SHARD.CALL GET of
    a locked key then reaches the module, and must wait for the lock as the plain GET does,
    not read the key under the transaction. (On the build before, it read 'old' at once.)"""
    c = node.client()
    c.set("k", "old")
    opener = node.client()
    assert opener.execute_command("SHARD.MULTI") == b"OK"
    assert prepare(c, "n0/1", ["SET", "k", "new"]) == b"PREPARED"
    reader = Background(node, "SHARD.CALL", "GET", "k")
    until(lambda: blocked_on_lock(c), "the routed GET to wait for the lock")
    assert txn(c, "COMMIT", "n0/1") == [b"OK"]
    assert reader.join() == b"new"
    assert opener.execute_command("SHARD.DISCARD") == b"OK"


def test_a_waiting_command_gets_tryagain_after_the_lock_ms(node):
    c = node.client()
    c.config_set("shard.txn-lock-ms", 50)
    assert prepare(c, "n0/1", ["SET", "k", "new"]) == b"PREPARED"
    with pytest.raises(redis.ResponseError, match="^TRYAGAIN .*n0/1.*'k'"):
        c.set("k", "mine")
    assert txn(c, "ABORT", "n0/1") == b"OK"
    assert txn(c, "ABORT", "n0/1") == b"OK", "idempotent"
    assert c.set("k", "mine") and c.get("k") == b"mine"


def test_abort_unlocks_and_the_waiting_command_runs(node):
    c = node.client()
    c.set("k", "old")
    assert prepare(c, "n0/1", ["SET", "k", "new"]) == b"PREPARED"
    waiting = Background(node, "GET", "k")
    until(lambda: blocked_on_lock(c), "the GET to wait for the lock")
    assert txn(c, "ABORT", "n0/1") == b"OK"
    assert waiting.join() == b"old"
    # n0/1 is this node's txid, never decided here: the coordinator's side presumes (and
    # records) its abort.
    assert txn(c, "STATUS", "n0/1") == b"abort"
    with pytest.raises(redis.ResponseError, match="^NOPREPARED"):
        txn(c, "COMMIT", "n0/1")


def test_a_locked_key_in_multi_or_a_script_is_refused_at_once(node):
    c = node.client()
    assert prepare(c, "n0/1", ["SET", "k", "new"]) == b"PREPARED"
    p = c.pipeline(transaction=True)
    p.get("k")
    p.set("free", "1")
    try:
        replies = p.execute(raise_on_error=False)
        # Redis 7.0's filter cannot tell MULTI: the command is refused when EXEC runs it.
        assert not FILTER_SEES_CLIENT
        assert isinstance(replies[0], redis.ResponseError) and "TRYAGAIN" in str(replies[0])
    except redis.ResponseError as e:
        # Refused when queued: EXEC aborts, nothing runs.
        assert FILTER_SEES_CLIENT and "TRYAGAIN" in str(e) or "EXECABORT" in str(e), e
        assert c.get("free") is None
    with pytest.raises(redis.ResponseError, match="TRYAGAIN"):
        c.eval("return redis.call('GET', 'k')", 0)
    assert txn(c, "ABORT", "n0/1") == b"OK"


def test_commit_with_the_parts_applies_when_the_record_is_gone(node):
    c = node.client()
    assert txn(c, "COMMIT", "n0/9", *cmds(["SET", "a", "1"], ["INCR", "a"])) == [b"OK", 2]
    assert txn(c, "COMMIT", "n0/9", *cmds(["SET", "a", "1"])) == b"DONE"
    assert c.get("a") == b"2"


# --- durability ----------------------------------------------------------------------------


def test_kill_9_after_prepare_and_a_restart_from_the_aof_keep_the_record_and_the_lock(
        server_factory):
    s = server_factory(config=AOF)
    c = s.client()
    assert prepare(c, "n0/1", ["SET", "a", "1"], ["SET", "b", "2"]) == b"PREPARED"
    assert txn(c, "COMMIT", "n0/0", *cmds(["SET", "z", "1"])) == [b"OK"]
    s.stop(signal.SIGKILL)
    s.start()
    c = s.client()
    assert info(c)["txn_locks_held"] == "2"
    c.config_set("shard.txn-lock-ms", 50)
    with pytest.raises(redis.ResponseError, match="^TRYAGAIN"):
        c.set("a", "mine")
    assert txn(c, "COMMIT", "n0/0") == b"DONE", "the done list survives too"
    assert txn(c, "COMMIT", "n0/1") == [b"OK", b"OK"]
    assert c.mget("a", "b") == [b"1", b"2"]
    # And its end too: after another kill -9, nothing is locked and it is done.
    s.stop(signal.SIGKILL)
    s.start()
    c = s.client()
    assert info(c)["txn_locks_held"] == "0"
    assert txn(c, "COMMIT", "n0/1") == b"DONE"


def test_a_restart_from_the_rdb_keeps_the_record(server_factory):
    s = server_factory()
    c = s.client()
    assert prepare(c, "n0/1", ["SET", "a", "1"]) == b"PREPARED"
    c.save()
    s.stop()
    s.start()
    c = s.client()
    assert info(c)["txn_locks_held"] == "1"
    assert txn(c, "COMMIT", "n0/1") == [b"OK"]
    assert c.get("a") == b"1"


def test_a_replica_promoted_after_prepare_keeps_the_record(server_factory):
    primary = server_factory(config=PRIMARY)
    replica = server_factory()
    p, r = primary.client(), replica.client()
    assert prepare(p, "n0/0", ["SET", "before", "1"]) == b"PREPARED"  # reaches it by the RDB
    r.replicaof("127.0.0.1", primary.port)
    wait_in_sync(p, r)
    assert prepare(p, "n0/1", ["SET", "a", "1"], ["SET", "b", "1"]) == b"PREPARED"
    wait_in_sync(p, r)
    assert r.get("a") is None, "a replica only records"
    primary.stop(signal.SIGKILL)
    r.replicaof("NO", "ONE")
    assert info(r)["txn_locks_held"] == "3"
    r.config_set("shard.txn-lock-ms", 50)
    with pytest.raises(redis.ResponseError, match="^TRYAGAIN"):
        r.get("a")
    assert txn(r, "COMMIT", "n0/1") == [b"OK", b"OK"]
    assert txn(r, "COMMIT", "n0/0") == [b"OK"]
    assert r.mget("a", "b", "before") == [b"1", b"1", b"1"]


def test_a_resharding_step_that_would_move_a_locked_key_waits_for_the_lock(node):
    c = node.client()
    other = free_port()
    grown = ring_of(node, ("n1", other))
    c.execute_command("SHARD.RING", "SET", *grown)
    leaving = key_of(c, "n1")
    c.execute_command("SHARD.RING", "SET", *ring_of(node))
    assert prepare(c, "n0/1", ["SET", leaving, "1"]) == b"PREPARED"
    with pytest.raises(redis.ResponseError, match="^TRYAGAIN .*n0/1"):
        c.execute_command("SHARD.RING", "BEGIN", *grown)
    with pytest.raises(redis.ResponseError, match="^TRYAGAIN .*n0/1"):
        c.execute_command("SHARD.RING", "SET", *grown)
    assert txn(c, "COMMIT", "n0/1") == [b"OK"]
    assert c.execute_command("SHARD.RING", "BEGIN", *grown) == b"OK"


# --- in doubt ------------------------------------------------------------------------------


def test_a_part_in_doubt_asks_its_coordinator_and_commits_by_its_answer(server_factory):
    coordinator = server_factory(module_args=["self", "n1"])
    owner = server_factory(module_args=["self", "n0"])
    o, k = owner.client(), coordinator.client()
    ring = ring_of(owner, ("n1", coordinator.port))
    for c in (o, k):
        c.execute_command("SHARD.RING", "SET", *ring)
    mine = key_of(o, "n0")
    # The coordinator's side answers `commit` for a txid it applied (its done list).
    assert txn(k, "COMMIT", "n1/5", 0) == []
    assert txn(k, "STATUS", "n1/5") == b"commit"
    assert prepare(o, "n1/5", ["SET", mine, "decided"], lock_ms=1) == b"PREPARED"
    until(lambda: o.get(mine) == b"decided", "the owner to ask n1 and commit")
    assert info(o)["txn_locks_held"] == "0" and info(o)["txn_in_doubt"] == "0"
    assert txn(o, "COMMIT", "n1/5") == b"DONE"


def test_a_part_whose_coordinator_cannot_be_reached_stays_locked_in_doubt(node):
    c = node.client()
    c.execute_command("SHARD.RING", "SET", *ring_of(node, ("n9", free_port())))
    mine, also = key_of(c, "n0"), key_of(c, "n0", prefix="j")
    assert prepare(c, "n9/1", ["SET", mine, "1"], lock_ms=1) == b"PREPARED"
    assert prepare(c, "n9/2", ["SET", also, "1"], lock_ms=1) == b"PREPARED"
    until(lambda: info(c)["txn_in_doubt"] == "2", "both parts to be in doubt")
    until(lambda: int(info(c).get("call_errors_n9", 0)) >= 2, "the owner to ask n9")
    c.config_set("shard.txn-lock-ms", 50)
    with pytest.raises(redis.ResponseError, match="^TRYAGAIN"):
        c.get(mine)
    assert info(c)["txn_locks_held"] == "2"
    assert txn(c, "ABORT", "n9/1") == b"OK"
    assert txn(c, "COMMIT", "n9/2") == [b"OK"]
    assert info(c)["txn_in_doubt"] == "0" and info(c)["txn_locks_held"] == "0"
    assert c.get(mine) is None and c.get(also) == b"1"


def test_a_cleanup_that_deletes_a_watched_key_marks_it(node):
    """A resharding's cleanup deletes the keys that moved away through the module's own
    UNLINK: a watch of one of them counts as written."""
    c = node.client()
    grown = ring_of(node, ("n1", free_port()))
    c.execute_command("SHARD.RING", "SET", *grown)
    leaving = key_of(c, "n1")
    c.execute_command("SHARD.RING", "SET", *ring_of(node))
    c.set(leaving, "1")
    c.set("stays", "1")
    watch(c, "n0/1", leaving)
    c.execute_command("SHARD.RING", "SET", *grown)
    assert c.execute_command("SHARD.RESHARD", "CLEANUP") == b"OK"
    wait_job(c)
    assert c.exists(leaving) == 0
    assert apply(c, "n0/1", [leaving], ["SET", "out", "1"]) is None
    assert c.get("out") is None
