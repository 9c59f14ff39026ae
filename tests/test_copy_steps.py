"""A copy pass without a fork (issue 44's "No stall"): with the key index ready, a copy runs its
passes in time-bounded steps on the main thread (`shard.copy-fork auto`, the default), the
commands shipped by a thread of its own; the server forks nothing during the whole grow (its
`total_forks` stat and LATENCY's `fork` event say so), and the copy stays exact: keys made
during a pass are sent by the next, expiries travel, a big key goes in a forked pass, STOP and
a SWAPDB mid-pass leave nothing half-done. `shard.copy-fork yes` forks every pass as before;
`no` runs even the walk without an index in steps (a scan)."""

import time

import pytest
import redis

from helpers.fleet import owners, start_fleet
from helpers.reshard import status, wait_job
from helpers.server import info_shard, pipelined, until

DEBUG = [("enable-debug-command", "yes")]
N = 40_000


def indexed_ready(client):
    def ready():
        try:
            client.execute_command("SHARD.DEBUG", "KEYINDEX", 0)
            return True
        except redis.ResponseError as e:
            if "NOTREADY" in str(e):
                return False
            raise
    until(ready, "the key index to be ready")


def resharding(server_factory, n=N, index=True, weights=None):
    """a holds k:0..n-1 (and the key index, ready, with `index`); a resharding to a:1 b:1 is
    open on both. The servers, a's and b's clients, and the names that move to b."""
    servers = start_fleet(server_factory, ["a", "b"], ring=["a"],
                          module_args=["key-index", "yes" if index else "no"], config=DEBUG)
    a, b = servers["a"].client(), servers["b"].client()
    keys = [f"k:{i}" for i in range(n)]
    pipelined(a, [("SET", k, f"v{i}") for i, k in enumerate(keys)])
    if index:
        indexed_ready(a)
    servers.ring(weights or {"a": 1, "b": 1}, verb="BEGIN")
    return servers, a, b, [k for k, o in zip(keys, owners(a, keys)) if o == "b"]


def forks(client):
    return int(client.info("stats")["total_forks"])


def fork_events(client):
    return [e for e in client.execute_command("LATENCY", "LATEST") if e[0] in (b"fork", "fork")]


def test_an_index_ready_grow_runs_in_steps_and_forks_nothing(server_factory):
    servers, a, b, moving = resharding(server_factory)
    a.config_set("latency-monitor-threshold", 1)
    a.execute_command("LATENCY", "RESET")
    before = forks(a)
    latest_fork = int(a.info("stats")["latest_fork_usec"])
    assert a.execute_command("SHARD.RESHARD", "COPY") == b"OK"
    st = wait_job(a)
    assert st["state"] == b"done" and st["failed"] == 0 and st["keys_from"] == b"index", st
    assert st["passes_forked"] == 0 and st["passes_stepped"] >= 1, st
    assert info_shard(a)["reshard_passes_stepped"] == str(st["passes_stepped"])
    assert st["copied"] == len(moving) == b.dbsize()
    assert b.mget(moving) == a.mget(moving)
    for n in ("a", "b"):
        servers[n].client().execute_command("SHARD.RING", "COMMIT")
    assert a.execute_command("SHARD.RESHARD", "CLEANUP") == b"OK"
    st = wait_job(a)
    assert st["keys_from"] == b"list" and st["deleted"] == len(moving), st
    assert a.dbsize() == N - len(moving)
    # The whole grow, copy and cleanup: no fork at all.
    assert forks(a) == before
    assert int(a.info("stats")["latest_fork_usec"]) == latest_fork
    assert fork_events(a) == []


def test_keys_made_during_a_step_pass_are_sent_by_the_next(server_factory):
    servers, a, b, moving = resharding(server_factory)
    names = [f"late:{i}" for i in range(4000)]
    late = [k for k, o in zip(names, owners(a, names)) if o == "b"]
    # Slow enough that the writes land while the first pass runs.
    assert a.execute_command("SHARD.RESHARD", "COPY", "MAXRATE", 10_000) == b"OK"
    until(lambda: status(a)["scanned"] > 0, "the first pass to begin")
    first = status(a)
    assert first["passes"] == 1 and first["state"] == b"copying", first
    pipelined(a, [("SET", k, f"late-{k}") for k in late])
    # And some that expire while it runs, and some deleted before they were sent.
    brief = [f"brief:{i}" for i in range(2000)]
    pipelined(a, [("SET", k, 1, "PX", 1500) for k in brief])
    gone = moving[-2000:]
    a.delete(*gone)
    assert status(a)["state"] == b"copying", "the writes were made during the first pass"
    a.execute_command("SHARD.RESHARD", "THROTTLE", 0)
    st = wait_job(a)
    assert st["state"] == b"done" and st["failed"] == 0, st
    assert st["passes"] >= 2 and st["passes_forked"] == 0 and st["passes_stepped"] >= 2, st
    assert b.mget(late) == [f"late-{k}".encode() for k in late]
    kept = moving[:-2000]
    assert b.mget(kept) == a.mget(kept)
    # What arrived of the brief keys keeps its deadline (the source's own, to the ms): none is
    # left once it has passed.
    arrived = [(k, at) for k, at in zip(brief, pipelined(b, [("PEXPIRETIME", k) for k in brief]))
               if at > 0]
    for k, at in arrived[:200]:
        assert a.pexpiretime(k) in (at, -2), k  # (-2: gone at the source meanwhile)
    time.sleep(max([at / 1000 - time.time() for _, at in arrived], default=0) + 0.2)
    assert not [k for k in b.scan_iter("brief:*", count=1000) if b.exists(k)]
    assert all(b.pttl(k) == -1 for k in kept[:200])


def test_copy_fork_yes_forks_and_no_walks_in_steps_without_an_index(server_factory):
    servers, a, b, moving = resharding(server_factory, n=20_000, index=False)
    with pytest.raises(redis.ResponseError):
        a.config_set("shard.copy-fork", "maybe")
    assert a.config_get("shard.copy-fork") == {"shard.copy-fork": "auto"}
    a.config_set("shard.copy-fork", "yes")
    before = forks(a)
    assert a.execute_command("SHARD.RESHARD", "COPY") == b"OK"
    st = wait_job(a)
    assert st["state"] == b"done" and st["copied"] == len(moving), st
    assert st["passes_forked"] >= 1 and st["passes_stepped"] == 0, st
    assert forks(a) > before
    b.flushall()
    a.config_set("shard.copy-fork", "no")
    before = forks(a)
    assert a.execute_command("SHARD.RESHARD", "COPY") == b"OK"
    st = wait_job(a)
    assert st["state"] == b"done" and st["failed"] == 0 and st["keys_from"] == b"walk", st
    assert st["passes_forked"] == 0 and st["passes_stepped"] >= 1, st
    assert st["copied"] == len(moving) == b.dbsize()
    assert b.mget(moving) == a.mget(moving)
    assert forks(a) == before


def test_a_big_key_goes_in_a_forked_pass_after_the_steps(server_factory):
    servers, a, b, moving = resharding(server_factory, n=5000)
    big = next(f"big:{i}" for i in range(1000) if owners(a, [f"big:{i}"]) == ["b"])
    for start in range(0, 6000, 1000):
        a.hset(big, mapping={f"f{i}": i for i in range(start, start + 1000)})
    until(lambda: a.execute_command("SHARD.DEBUG", "KEYINDEX", 0) is not None, "the index")
    assert a.execute_command("SHARD.RESHARD", "COPY") == b"OK"
    st = wait_job(a)
    assert st["state"] == b"done" and st["failed"] == 0, st
    assert st["passes_stepped"] >= 1 and st["passes_forked"] == 1, st
    assert b.hlen(big) == 6000 and b.hgetall(big) == a.hgetall(big)
    assert st["copied"] == len(moving) + 1 == b.dbsize()


def test_stop_mid_step_pass_then_a_new_copy_sends_every_key(server_factory):
    servers, a, b, moving = resharding(server_factory)
    assert a.execute_command("SHARD.RESHARD", "COPY", "MAXRATE", 5000) == b"OK"
    until(lambda: status(a)["copied"] > 0, "the first keys to land")
    assert a.execute_command("SHARD.RESHARD", "STOP") == b"OK"
    until(lambda: not status(a)["state"] in (b"copying",), "the job to stop")
    landed = b.dbsize()
    assert 0 < landed < len(moving)
    time.sleep(0.3)
    assert b.dbsize() == landed, "nothing is sent after STOP"
    assert a.execute_command("SHARD.RESHARD", "COPY") == b"OK"
    st = wait_job(a)
    assert st["state"] == b"done" and st["failed"] == 0, st
    assert st["copied"] + st["skipped"] == len(moving) == b.dbsize(), st
    assert b.mget(moving) == a.mget(moving)


def test_a_swapdb_mid_step_pass_fails_the_job_rather_than_miss_keys(server_factory):
    servers, a, b, moving = resharding(server_factory)
    assert a.execute_command("SHARD.RESHARD", "COPY", "MAXRATE", 5000) == b"OK"
    until(lambda: status(a)["copied"] > 0, "the first keys to land")
    a.execute_command("SWAPDB", 0, 5)
    a.execute_command("SWAPDB", 0, 5)
    a.execute_command("SHARD.RESHARD", "THROTTLE", 0)
    st = wait_job(a)
    assert st["state"] == b"failed" and b"replaced" in st["last_error"], st


def test_a_destination_killed_mid_step_pass_gets_every_key_from_a_second_copy(server_factory):
    servers, a, b, moving = resharding(server_factory)
    assert a.execute_command("SHARD.RESHARD", "COPY", "TIMEOUT", 500, "MAXRATE", 5000) == b"OK"
    until(lambda: status(a)["copied"] > 0, "the first keys to land")
    port = servers["b"].port
    servers["b"].stop(sig=9)
    a.execute_command("SHARD.RESHARD", "THROTTLE", 0)
    st = wait_job(a)
    assert st["state"] == b"failed" and st["failed"] > 0 and st["passes_forked"] == 0, st
    assert f"127.0.0.1:{port}".encode() in st["last_error"], st
    assert a.dbsize() == N, "the source keeps every key"
    servers["b"].port = port
    servers["b"].start()
    b = servers["b"].client()
    assert b.dbsize() == 0
    assert a.execute_command("SHARD.RESHARD", "COPY") == b"OK"
    st = wait_job(a)
    assert st["state"] == b"done" and st["failed"] == 0 and st["passes_stepped"] >= 1, st
    assert b.dbsize() == len(moving) == st["copied"]
    assert b.mget(moving) == a.mget(moving)
