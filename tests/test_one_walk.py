"""One walk per resharding (issue 32): a cleanup that follows a copy on the same ring deletes
what the copy's walk found going elsewhere, plus the keys written since that go elsewhere,
without walking the keyspace again (STATUS `keys_from: list`). A keyspace replaced between the
two (a restart, a load, SWAPDB) makes the cleanup walk as before; either way it ends with every
key this node owns kept and every other one gone."""

import os
import signal

import pytest

from helpers.fleet import owners, start_fleet
from helpers.reshard import status, wait_job
from helpers.server import info_shard, pipelined, until, wait_in_sync

KEYS = 20_000
# How a cleanup without the copy's list finds its keys: a walk, or the key index's buckets when
# the servers keep one (tests/run.py's index pass) and it is ready.
WALKED = (b"walk", b"index") if os.environ.get("SHARD_KEY_INDEX") == "yes" else (b"walk",)


def two_nodes(server_factory, persist=False):
    """a holds KEYS keys in db 0 and a few in db 3; a resharding to a:1 b:3 is open on both."""
    config = [("enable-debug-command", "yes")]
    module_args = []
    if persist:
        config += [("appendonly", "yes"), ("appendfsync", "always")]
        # b fsyncs every write: on a loaded machine (CI, a build writing beside) an fsync can
        # take over a second, and the copy gave b up ("did not answer within 1000 ms").
        module_args = ["call-timeout-ms", 10_000]
    servers = start_fleet(server_factory, ["a", "b"], ring=["a"], config=config,
                          module_args=module_args)
    a, b = servers["a"].client(), servers["b"].client()
    pipelined(a, [("SET", f"k:{i}", i) for i in range(KEYS)])
    a3 = servers["a"].client(db=3)
    pipelined(a3, [("SET", f"d3:{i}", i) for i in range(300)])
    servers.ring({"a": 1, "b": 3}, verb="BEGIN")
    return servers, a, b


def every_key(server):
    """{db: set of names} of every database of `server`."""
    out = {}
    for db in range(16):
        names = set(server.client(db=db).scan_iter(count=1000))
        if names:
            out[db] = names
    return out


def split(client, names):
    """(owned by a, owned elsewhere) of `names`, as the ring says."""
    names = sorted(names)
    who = owners(client, names)
    return ({n for n, o in zip(names, who) if o == "a"},
            {n for n, o in zip(names, who) if o != "a"})


def commit_and_clean(servers, a):
    for n in ("a", "b"):
        servers[n].client().execute_command("SHARD.RING", "COMMIT")
    assert a.execute_command("SHARD.RESHARD", "CLEANUP") == b"OK"
    return wait_job(a)


def assert_only_owned_left(servers, a, want, st=None):
    """a holds exactly `want` ({db: names}): what it owns, nothing else. On a failure the
    message also gives the cleanup's STATUS (`st`), a's key index and a's log lines of the
    module's jobs: which way the cleanup found its keys, and what it did."""
    left = every_key(servers["a"])
    if left == want:
        return
    counts = {db: (len(left.get(db, ())), len(want.get(db, ()))) for db in set(left) | set(want)}
    index = {k: v for k, v in info_shard(a).items() if k.startswith("key_index")}
    log = [line for line in servers["a"].log().splitlines()
           if "shard:" in line or "fork" in line.lower() or "Loading" in line]
    raise AssertionError(f"(left, wanted) by db: {counts}; status: {st}; index: {index}; "
                         "log:\n" + "\n".join(log[-30:]))


def test_a_cleanup_after_a_copy_reads_its_list_and_deletes_what_was_written_since(
        server_factory):
    servers, a, b = two_nodes(server_factory)
    assert a.execute_command("SHARD.RESHARD", "COPY") == b"OK"
    st = wait_job(a)
    assert st["state"] == b"done" and st["failed"] == 0, st
    # The list is beside the server's RDB file, named after it and the port.
    listed = servers["a"].workdir / (a.config_get("dbfilename")["dbfilename"]
                                     + f".shard-moved.{servers['a'].port}")
    assert listed.stat().st_size > 0
    before = every_key(servers["a"])
    moving = sum(len(split(a, names)[1]) for names in before.values())
    assert 0 < moving < sum(len(v) for v in before.values())
    # Written after the copy, straight on a (no routing): keys of a and keys of b, in two
    # databases; and some keys the copy listed are deleted meanwhile.
    late = [f"late:{i}" for i in range(400)]
    pipelined(a, [("SET", k, "v") for k in late])
    a5 = servers["a"].client(db=5)
    pipelined(a5, [("SET", k, "v") for k in late[:100]])
    listed_gone = sorted(split(a, before[0])[1])[:50]
    a.delete(*listed_gone)
    want, total = {}, 0
    for db, names in every_key(servers["a"]).items():
        total += len(names)
        mine, _ = split(a, names)
        if mine:
            want[db] = mine
    st = commit_and_clean(servers, a)
    assert st["state"] == b"done" and st["keys_from"] == b"list", st
    # It read the copy's list (every name the copy found moving) and no other key of the
    # keyspace: a walk would have scanned every key.
    assert st["scanned"] == moving, (st["scanned"], moving)
    assert_only_owned_left(servers, a, want)
    assert st["deleted"] == total - sum(len(v) for v in want.values()), st
    assert not listed.exists(), "the list is removed once spent"
    # Spent: a second cleanup walks (and has nothing to delete).
    assert a.execute_command("SHARD.RESHARD", "CLEANUP") == b"OK"
    st = wait_job(a)
    assert st["keys_from"] in WALKED and st["deleted"] == 0, st


def test_a_cleanup_stopped_midway_leaves_the_rest_to_the_next_from_the_list(server_factory):
    """A cleanup from the list, throttled and stopped while it deletes the keys written since
    the copy (they come after the list's), gives back those it had not handled: the next cleanup
    reads the list again, deletes them too, and leaves only what this node owns."""
    servers, a, b = two_nodes(server_factory)
    assert a.execute_command("SHARD.RESHARD", "COPY") == b"OK"
    assert wait_job(a)["failed"] == 0
    listed = sum(len(split(a, names)[1]) for names in every_key(servers["a"]).values())
    late = [f"late:{i}" for i in range(40_000)]
    pipelined(a, [("SET", k, "v") for k in late])
    late_moving = split(a, late)[1]
    want = {}
    for db, names in every_key(servers["a"]).items():
        mine, _ = split(a, names)
        if mine:
            want[db] = mine
    for n in ("a", "b"):
        servers[n].client().execute_command("SHARD.RING", "COMMIT")
    assert a.execute_command("SHARD.RESHARD", "CLEANUP") == b"OK"
    a.execute_command("SHARD.RESHARD", "THROTTLE", 20_000)
    until(lambda: status(a)["deleted"] > listed + 2000, "the cleanup to reach the late keys",
          every=0.01)
    a.execute_command("SHARD.RESHARD", "STOP")
    st = wait_job(a)
    assert st["state"] == b"idle" and st["keys_from"] == b"list", st
    left = [k for k in late_moving if a.exists(k)]
    assert 0 < len(left) < len(late_moving), "stopped while deleting the keys written since"
    assert a.execute_command("SHARD.RESHARD", "CLEANUP") == b"OK"
    st = wait_job(a)
    assert st["state"] == b"done" and st["keys_from"] == b"list", st
    assert_only_owned_left(servers, a, want)


@pytest.mark.parametrize("change", ["swapdb", "debug-reload", "restart"])
def test_a_keyspace_replaced_between_copy_and_cleanup_makes_the_cleanup_walk(
        server_factory, change):
    servers, a, b = two_nodes(server_factory, persist=change == "restart")
    assert a.execute_command("SHARD.RESHARD", "COPY") == b"OK"
    assert wait_job(a)["failed"] == 0
    if change == "swapdb":
        # Database 0 and 3 swap: the list's names now live in another database than it says.
        a.execute_command("SWAPDB", 0, 3)
    elif change == "debug-reload":
        a.execute_command("DEBUG", "RELOAD")
    else:
        servers["a"].stop(signal.SIGKILL)
        servers["a"].start()
        a = servers["a"].client()
    want = {}
    for db, names in every_key(servers["a"]).items():
        mine, _ = split(a, names)
        if mine:
            want[db] = mine
    st = commit_and_clean(servers, a)
    assert st["state"] == b"done" and st["keys_from"] in WALKED, st
    assert_only_owned_left(servers, a, want, st)


def test_a_replica_holds_what_its_primary_holds_after_a_cleanup_from_the_list(server_factory):
    servers, a, b = two_nodes(server_factory)
    replica = server_factory(module_args=["self", "a"])
    replica.client().execute_command("REPLICAOF", "127.0.0.1", servers["a"].port)
    wait_in_sync(a, replica.client(), timeout=30)
    assert a.execute_command("SHARD.RESHARD", "COPY") == b"OK"
    assert wait_job(a)["failed"] == 0
    pipelined(a, [("SET", f"late:{i}", "v") for i in range(300)])
    st = commit_and_clean(servers, a)
    assert st["keys_from"] == b"list" and st["deleted"] > 0, st
    wait_in_sync(a, replica.client(), timeout=30)
    assert every_key(replica) == every_key(servers["a"])
