"""Commands over keys of several owners inside a transaction across nodes (issue 43, "any
keys, any owners"): a queued command whose keys have several owners and that does not split
(RENAME, LMOVE, SMOVE, ZUNIONSTORE, COPY, EVAL with declared keys...) makes the whole
transaction gathered at EXEC (txn/coord/gather.rs, `exec_gathered`): every key of every queued
command watched and read at its owner, the queued commands run in order on the copies, the
writes committed at the owners by one two-phase commit, EXEC's reply each command's own. Each
test compares with what one plain server answers to the same MULTI/EXEC; before this, such a
command was refused at queue time and EXEC replied EXECABORT."""

import random
import signal
import threading

import pytest
import redis

from helpers.fleet import NAMES
from helpers.server import AOF, until
from helpers.txn import hold, held, no_lock_left
from test_gather import (CASES, FUNCTION, SCRATCH, TTL, TTL_SLACK, bare, content, gather_fleet,
                         local, ttl_kind)


def errors_as_words(replies):
    return [("error", str(r).split(" ")[0]) if isinstance(r, redis.ResponseError) else r
            for r in replies]


def multi_plain(c, commands):
    """MULTI ... EXEC as a plain client sends it (redis-py's transaction pipeline)."""
    p = c.pipeline(transaction=True)
    for cmd in commands:
        p.execute_command(*cmd)
    return errors_as_words(p.execute(raise_on_error=False))


def multi_module(c, commands):
    """The same with the module's own commands: SHARD.MULTI, SHARD.CALL ..., SHARD.EXEC."""
    assert c.execute_command("SHARD.MULTI") == b"OK"
    for cmd in commands:
        assert c.execute_command("SHARD.CALL", *cmd) == b"QUEUED"
    return errors_as_words(c.execute_command("SHARD.EXEC"))


def same_keys(fleet, one, keys, label):
    reader = bare(fleet.client("n1"))
    for k in keys:
        assert content(reader, lambda c, *a: c.execute_command(*a), k) == \
            content(one, lambda c, *a: c.execute_command(*a), k), (label, k)
        fleet_ttl, one_ttl = reader.pttl(k), one.pttl(k)
        assert ttl_kind(fleet_ttl) == ttl_kind(one_ttl), (label, k, fleet_ttl, one_ttl)
        if one_ttl > 0:
            assert abs(fleet_ttl - one_ttl) < TTL_SLACK, (label, k, fleet_ttl, one_ttl)


def assert_scratch_empty(fleet):
    for n in NAMES:
        assert local(fleet, n, db=SCRATCH).dbsize() == 0, n


@pytest.mark.parametrize("how", ["plain", "module"])
def test_multi_rename_incr_exec_answers_as_one_server(server_factory, how):
    """MULTI; RENAME a b (a at n1 with a TTL, b at n2); INCR c (n0); reads after; EXEC: the
    replies and the keys (TTLs kept) as one plain server leaves them; each key at its owner."""
    fleet = gather_fleet(server_factory)
    one = bare(server_factory().client())
    c = bare(fleet.client("n0", single_connection_client=True))
    a, b = fleet.key_of("n1", prefix="ra"), fleet.key_of("n2", prefix="rb")
    cc = fleet.key_of("n0", prefix="rc")
    for target in (c, one):
        target.set(a, "moving", px=TTL)
        target.set(b, "old")
        target.set(cc, "41")
    txn = [("RENAME", a, b), ("INCR", cc), ("GET", b), ("EXISTS", a), ("APPEND", b, "!"),
           ("RENAME", a, b)]
    run = multi_plain if how == "plain" else multi_module
    got = run(c, txn)
    want = multi_plain(one, txn)
    assert got == want, (got, want)
    assert got[0] == b"OK" and got[1] == 42 and got[2] == b"moving" and got[5][0] == "error"
    same_keys(fleet, one, [a, b, cc], how)
    assert local(fleet, "n1").exists(a) == 0
    assert local(fleet, "n2").get(b) == b"moving!" and 0 < local(fleet, "n2").pttl(b) <= TTL
    assert local(fleet, "n0").get(cc) == b"42"
    for k, owner in ((b, "n2"), (cc, "n0")):
        for n in NAMES:
            if n != owner:
                assert local(fleet, n).exists(k) == 0, (k, n)
    assert_scratch_empty(fleet)


@pytest.mark.parametrize("how", ["plain", "module"])
def test_each_kind_inside_a_transaction_answers_as_one_server(server_factory, how):
    """test_gather's cases (LMOVE, SMOVE, ZUNIONSTORE, COPY, RENAMENX, MSETNX, BITOP, PFMERGE,
    GEOSEARCHSTORE, EVAL and FCALL with declared keys of two owners, a WRONGTYPE...), each as
    one transaction: its setup queued first (the gathered command sees the transaction's own
    earlier writes), the command, then a read of each key."""
    fleet = gather_fleet(server_factory)
    one = bare(server_factory().client())
    c = bare(fleet.client("n0", single_connection_client=True))
    assert c.execute_command("FUNCTION", "LOAD", FUNCTION) == b"gather"
    assert one.execute_command("FUNCTION", "LOAD", FUNCTION) == b"gather"
    run = multi_plain if how == "plain" else multi_module
    for i, (name, (setup, command)) in enumerate(CASES.items()):
        names = {"a": fleet.key_of("n1", prefix=f"ta{i}"), "b": fleet.key_of("n2", prefix=f"tb{i}"),
                 "d": fleet.key_of("n0", prefix=f"td{i}")}

        def real(args):
            return tuple(names.get(a, a) if isinstance(a, str) else a for a in args)
        txn = [real(s) for s in setup] + [real(command)] + [("TYPE", k) for k in names.values()]
        got = run(c, txn)
        want = multi_plain(one, txn)
        assert got == want, (name, got, want)
        same_keys(fleet, one, names.values(), name)
    assert_scratch_empty(fleet)


def test_a_watched_key_written_makes_exec_nil_and_writes_nothing(server_factory):
    fleet = gather_fleet(server_factory)
    a, b = fleet.key_of("n1", prefix="wa"), fleet.key_of("n2", prefix="wb")
    cc = fleet.key_of("n0", prefix="wc")
    w = fleet.key_of("n2", prefix="ww")
    c = bare(fleet.client("n0", single_connection_client=True))
    c.set(a, "v")
    c.set(cc, 1)
    c.set(w, "watched")
    for module in (False, True):
        if module:
            assert c.execute_command("SHARD.WATCH", w) == b"OK"
        else:
            assert c.execute_command("WATCH", w) == b"OK"
        fleet.client("n1").set(w, "changed")
        cmds = [("RENAME", a, b), ("INCR", cc)]
        if module:
            assert c.execute_command("SHARD.MULTI") == b"OK"
            for cmd in cmds:
                assert c.execute_command("SHARD.CALL", *cmd) == b"QUEUED"
            assert c.execute_command("SHARD.EXEC") is None
        else:
            assert c.execute_command("MULTI") == b"OK"
            for cmd in cmds:
                assert c.execute_command(*cmd) == b"QUEUED"
            assert c.execute_command("EXEC") is None
        assert local(fleet, "n1").get(a) == b"v" and local(fleet, "n2").exists(b) == 0
        assert local(fleet, "n0").get(cc) == b"1"
    # Unchanged watched key: applied; through redis-py's transaction() (retried on nil).
    tries = []

    def move(pipe):
        tries.append(1)
        pipe.get(w)
        if len(tries) == 1:
            fleet.client("n2").set(w, "again")
        pipe.multi()
        pipe.rename(a, b)
        pipe.incr(cc)
    c = fleet.client("n0", single_connection_client=True)
    assert c.transaction(move, w) == [True, 2]
    assert len(tries) == 2
    assert local(fleet, "n2").get(b) == b"v" and local(fleet, "n1").exists(a) == 0
    assert_scratch_empty(fleet)
    assert no_lock_left(fleet)


def test_concurrent_transactions_lose_and_double_nothing(server_factory):
    """Six clients through the three nodes: watched transactions moving elements between lists
    of three owners and counting each move at both ends (LMOVE and INCR/DECR in one
    transaction), and unwatched ones moving a token (RENAME) with a transfer of balances. In
    the end every element is in one list once, each list's length is its start plus its
    count, the balances sum to zero and the token is in one place."""
    fleet = gather_fleet(server_factory)
    lists = [fleet.key_of(n, prefix="cl") for n in NAMES]
    moved = [fleet.key_of(n, prefix="cm") for n in NAMES]
    tokens = [fleet.key_of(n, prefix="ct") for n in NAMES]
    bal = [fleet.key_of(n, prefix="cb") for n in NAMES]
    c = fleet.client("n0")
    elements = [f"e{i}" for i in range(30)]
    for i, lst in enumerate(lists):
        c.rpush(lst, *elements[i::3])
    start = [c.llen(lst) for lst in lists]
    c.set(tokens[0], "the-token")
    errors, done = [], []

    def work(seed):
        rnd = random.Random(seed)
        cl = fleet.client(NAMES[seed % 3], single_connection_client=True)
        try:
            for _ in range(25):
                src, dst = rnd.sample(range(3), 2)
                if seed % 2 == 0:
                    def move(pipe):
                        if pipe.llen(lists[src]) == 0:
                            pipe.multi()
                            return
                        pipe.multi()
                        pipe.lmove(lists[src], lists[dst], "LEFT", "RIGHT")
                        pipe.decr(moved[src])
                        pipe.incr(moved[dst])
                    cl.transaction(move, lists[src])
                    done.append(1)
                else:
                    p = cl.pipeline(transaction=True)
                    p.rename(tokens[src], tokens[dst])
                    p.decrby(bal[src], 7)
                    p.incrby(bal[dst], 7)
                    try:
                        r = p.execute(raise_on_error=False)
                    except redis.ResponseError as e:
                        if not str(e).startswith("TRYAGAIN"):
                            raise
                        continue
                    assert len(r) == 3, r
                    if isinstance(r[0], redis.ResponseError):
                        assert str(r[0]).startswith("no such key"), r
                    done.append(1)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert not errors, errors
    assert len(done) > 100, len(done)
    seen = [e for lst in lists for e in c.lrange(lst, 0, -1)]
    assert sorted(seen) == sorted(e.encode() for e in elements), "each element once"
    counts = [int(c.get(m) or 0) for m in moved]
    assert [c.llen(lst) for lst in lists] == [s + n for s, n in zip(start, counts)], counts
    assert sum(int(c.get(k) or 0) for k in bal) == 0
    assert [c.exists(t) for t in tokens].count(1) == 1
    assert_scratch_empty(fleet)
    until(lambda: no_lock_left(fleet), "no lock left")


def start_txn(fleet, a, b, cc, result):
    """n0 runs MULTI; RENAME a b; INCR c; LPUSH b2...; EXEC for a route-plain client, in a
    thread."""
    def run():
        try:
            cl = fleet.client("n0", socket_timeout=60, single_connection_client=True)
            p = cl.pipeline(transaction=True)
            p.rename(a, b)
            p.incr(cc)
            result["r"] = p.execute()
        except (redis.RedisError, OSError) as e:
            result["r"] = e
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("step,applied", [("read", False), ("scratch", False),
                                          ("prepared", False), ("decided", True),
                                          ("kill-after-commit", True)])
def test_the_gathering_node_killed_at_each_step_of_a_gathered_transaction(
        server_factory, step, applied):
    """n0 runs MULTI; RENAME a b (a at n1 with a TTL, b at n2); INCR c (c at n1); EXEC and is
    killed (SIGKILL) after the keys were read, while the scratch database holds the copies
    (a snapshot of them taken first: BGREWRITEAOF), after the owners prepared, after the
    decision, or as its first COMMIT leaves. Restarted from its AOF: the whole transaction is
    at both owners (decided) or at neither, nothing stays locked, the scratch database is
    empty."""
    fleet = gather_fleet(server_factory, config=[("enable-debug-command", "yes"), *AOF])
    for n in fleet:
        fleet.client(n).config_set("shard.txn-lock-ms", 3000)
    a, b = fleet.key_of("n1", prefix="ka"), fleet.key_of("n2", prefix="kb")
    cc = fleet.key_of("n1", prefix="kc")
    c = fleet.client("n0")
    c.set(a, "moving", px=TTL)
    c.rpush(b, "old")
    c.set(cc, 10)
    hold(c, step)
    result = {}
    t = start_txn(fleet, a, b, cc, result)
    if step == "kill-after-commit":
        until(lambda: not fleet["n0"].alive(), "n0 killed itself")
    else:
        until(lambda: held(c) == 1,
              "the transaction waits at the hold")
        if step == "scratch":
            s = local(fleet, "n0", db=SCRATCH)
            assert s.dbsize() == 3 and s.get(a) == b"moving"
            # The copies go into a snapshot (the AOF's base), loaded at the restart.
            done = c.info("persistence")["aof_rewrites"]
            c.bgrewriteaof()
            until(lambda: c.info("persistence")["aof_rewrites"] > done
                  and c.info("persistence")["aof_rewrite_in_progress"] == 0, "rewritten")
        fleet["n0"].stop(signal.SIGKILL)
    t.join(60)
    assert isinstance(result["r"], redis.ConnectionError), result
    fleet["n0"].start()
    until(lambda: no_lock_left(fleet), "every part applied or dropped", timeout=30)
    until(lambda: local(fleet, "n0", db=SCRATCH).dbsize() == 0, "the scratch database emptied")
    n1, n2 = local(fleet, "n1"), local(fleet, "n2")
    if applied:
        assert n1.exists(a) == 0 and n2.get(b) == b"moving" and 0 < n2.pttl(b) <= TTL
        assert n1.get(cc) == b"11"
    else:
        assert n1.get(a) == b"moving" and n2.lrange(b, 0, -1) == [b"old"]
        assert 0 < n1.pttl(a) <= TTL and n1.get(cc) == b"10"
    assert_scratch_empty(fleet)
    # The keys take the same transaction again.
    c = fleet.client("n0")
    if not applied:
        result = {}
        start_txn(fleet, a, b, cc, result).join(30)
        assert result["r"] == [True, 11], result
        assert n2.get(b) == b"moving" and n1.get(cc) == b"11"


def test_the_gathering_node_killed_between_watch_and_exec(server_factory):
    """The watch step: a client WATCHes a key of n1 and queues a gathered RENAME through n0,
    which is killed before EXEC: nothing written, and once n0 is back the keys take writes and
    the transaction again."""
    fleet = gather_fleet(server_factory, config=[*AOF])
    a, b = fleet.key_of("n1", prefix="xa"), fleet.key_of("n2", prefix="xb")
    c = bare(fleet.client("n0", single_connection_client=True, socket_timeout=10))
    c.set(a, "v")
    assert c.execute_command("WATCH", a) == b"OK"
    assert c.execute_command("MULTI") == b"OK"
    assert c.execute_command("RENAME", a, b) == b"QUEUED"
    fleet["n0"].stop(signal.SIGKILL)
    with pytest.raises(redis.ConnectionError):
        c.execute_command("EXEC")
    n1, n2 = local(fleet, "n1"), local(fleet, "n2")
    assert n1.get(a) == b"v" and n2.exists(b) == 0
    fleet["n0"].start()
    until(lambda: no_lock_left(fleet), "nothing locked")
    assert n1.set(a, "w") is True
    c = fleet.client("n0", single_connection_client=True)
    p = c.pipeline(transaction=True)
    p.rename(a, b)
    p.get(b)
    assert p.execute() == [True, b"w"]
    assert_scratch_empty(fleet)
