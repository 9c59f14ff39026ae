"""What a plain client's routed commands do under a network partition (issue 44): the rows of
the README's guarantees table that concern routing, each driven at its exact step, with the
servers on loopback addresses of their own cut apart by `nft` rules (tests/helpers/partition.py).

- a command over keys of two owners, gathered by the node the client is connected to (RENAME
  through route-plain), with one owner cut off from that node after both prepared: the cut
  owner keeps its part locked and in doubt, neither applied nor dropped, for as long as the cut
  lasts; after the heal the command is applied at both owners, once;
- a keyless command that spans the fleet (SCAN, DBSIZE, KEYS) through a node cut off from one
  other: an error naming that node within the call timeout, never a partial answer given as
  whole; after the heal the whole answer;
- a replica cut off from its primary: once the server counts its link down, `SHARD.CALL`'s keyed
  commands through it are refused (`TRYAGAIN`), and after the heal it routes again and reads the
  writes made at its primary during the cut;
- a blocking command routed to another node, its link to that owner cut while it waits: the
  client is told within its timeout and the call timeout, and nothing is popped for it after
  the heal.
"""

import threading
import time

import pytest
import redis

from helpers.server import info_shard, until
from helpers.txn import counter, held, hold, no_lock_left
from test_partition_promises import part_fleet

pytestmark = pytest.mark.slow

NAMES = ["n0", "n1", "n2"]
LOCK_MS = 1000


def plain_fleet(server_factory, partition):
    """Three nodes on addresses of their own, route-plain on, a 500 ms call timeout."""
    fleet = part_fleet(server_factory, partition, NAMES, NAMES, module_args=["route-plain", "yes"])
    for n in fleet:
        fleet.client(n).config_set("shard.txn-lock-ms", LOCK_MS)
    return fleet


def own(fleet, name):
    """A client of one node's own keyspace (never routed)."""
    c = fleet.client(name, single_connection_client=True)
    assert c.execute_command("SHARD.CLUSTER", "INTERNAL") == b"OK"
    return c


def outcome(f):
    try:
        return f()
    except (redis.RedisError, OSError) as e:
        return e


@pytest.mark.partitions  # as the transaction's test in make test, 12 s: make partitions
def test_gathered_command_owner_cut_off_after_prepare_stays_in_doubt_then_applies_once(
        server_factory, partition):
    """n0 gathers RENAME a b for a plain client (a at n1, b at n2), held once both owners
    prepared; n1 is cut off from n0 and the hold released: n0 decides commit, its COMMIT to n1
    is lost. For three lock deadlines n1 keeps its part locked and in doubt (neither applied nor
    dropped); n2 applied its own. After the heal the commit reaches n1: a is gone, b holds a's
    value, at their owners only; no lock, doubt or decision left."""
    fleet = plain_fleet(server_factory, partition)
    c0 = fleet.client("n0")
    a, b = fleet.key_of("n1", prefix="acct"), fleet.key_of("n2", prefix="acct")
    c0.set(a, "moving")
    c0.rpush(b, "old")
    hold(c0, "prepared")
    result = {}
    t = threading.Thread(target=lambda: result.update(
        r=outcome(lambda: fleet.client("n0", socket_timeout=30).rename(a, b))), daemon=True)
    t.start()
    until(lambda: held(c0) == 1, "the gather waits with both parts prepared")
    partition.cut(fleet["n0"], fleet["n1"])
    cut_at = time.monotonic()
    hold(c0, "OFF")
    t.join(30)
    assert not t.is_alive(), "RENAME did not reply"
    # The decision was commit; n1 has not confirmed: the client is told it is not confirmed,
    # not that it failed.
    assert isinstance(result["r"], redis.ResponseError), result
    assert "committed" in str(result["r"]) and "n1" in str(result["r"]), result
    until(lambda: counter(fleet.client("n1"), "txn_in_doubt") == 1, "n1's part in doubt")
    n1, n2 = own(fleet, "n1"), own(fleet, "n2")
    assert n2.get(b) == b"moving", "n2 applied its part"
    while time.monotonic() < cut_at + 3 * LOCK_MS / 1000 + 1:
        i = info_shard(fleet.client("n1"))
        assert (i["txn_locks_held"], i["txn_in_doubt"]) == ("1", "1"), i
        time.sleep(0.2)
    partition.heal()
    until(lambda: no_lock_left(fleet), "the commit reaches n1", timeout=20)
    assert n1.exists(a) == 0 and n2.get(b) == b"moving"
    assert own(fleet, "n0").exists(a, b) == 0
    assert c0.get(b) == b"moving" and c0.exists(a) == 0, "the plain client reads it whole"


def test_keyless_commands_through_a_node_cut_off_from_another_name_it_and_answer_whole_after(
        server_factory, partition):
    """With n0 cut off from n2, SCAN, DBSIZE and KEYS through n0 fail naming n2 (never an
    answer missing n2's keys); n0 itself keeps answering. After the heal they answer whole."""
    fleet = plain_fleet(server_factory, partition)
    c0 = fleet.client("n0", socket_timeout=20)
    keys = {f"k:{i}".encode() for i in range(300)}
    pipe = c0.pipeline(transaction=False)
    for k in keys:
        pipe.set(k, "v")
    pipe.execute()
    assert own(fleet, "n2").dbsize() > 0
    partition.cut(fleet["n0"], fleet["n2"])
    for command in (lambda: set(c0.scan_iter(count=50)), c0.dbsize, lambda: c0.keys("k:*")):
        e = outcome(command)
        assert isinstance(e, redis.ResponseError) and "n2" in str(e), e
        assert c0.ping()
    partition.heal()
    until(lambda: outcome(c0.dbsize) == len(keys), "DBSIZE whole after the heal", timeout=30)
    assert set(c0.scan_iter(count=50)) == keys
    assert set(c0.keys("k:*")) == keys


@pytest.mark.partitions  # waits out repl-timeout: make partitions
def test_replica_cut_off_from_its_primary_refuses_keyed_calls_until_it_is_linked_again(
        server_factory, partition):
    """n1's replica, cut off from n1, counts its link down after `repl-timeout` (2 s here): its
    `SHARD.CALL` reads and writes are refused with TRYAGAIN (its rings may be behind the fleet's),
    and none lands anywhere. After the heal it links again, and reads through it see the writes
    made at n1 during the cut."""
    fleet = plain_fleet(server_factory, partition)
    primary = fleet["n1"]
    primary.client().config_set("repl-ping-replica-period", 1)
    replica = server_factory(module_args=["self", "n1", "call-timeout-ms", 500],
                             config=[("replicaof", primary.host, primary.port),
                                     ("repl-timeout", 2)],
                             host=partition.addresses.next())
    r, p = replica.client(), primary.client()
    linked = lambda: r.info("replication").get("master_link_status") == "up"  # noqa: E731
    until(linked, "the replica linked to n1")
    key = fleet.key_of("n1", prefix="r")
    other = fleet.key_of("n2", prefix="r")
    p.set(key, "before")
    until(lambda: r.execute_command("SHARD.CALL", "GET", key) == b"before", "a read through it")
    partition.cut(replica, primary)
    until(lambda: not linked(), "the replica counts its link down", timeout=20)
    for args in (("GET", key), ("SET", other, "through-the-replica")):
        with pytest.raises(redis.ResponseError, match=r"^TRYAGAIN this replica's link"):
            r.execute_command("SHARD.CALL", *args)
    assert own(fleet, "n2").exists(other) == 0, "a write through the cut-off replica landed"
    p.set(key, "during")
    partition.heal()
    until(linked, "the replica linked again", timeout=30)
    until(lambda: outcome(lambda: r.execute_command("SHARD.CALL", "GET", key)) == b"during",
          "a read through it sees the write made during the cut")


def test_blocking_command_whose_owner_is_cut_off_tells_its_client_and_pops_nothing_after(
        server_factory, partition):
    """A BLPOP (timeout 4 s) through n0 at a key of n1 waits at n1; n0 is cut off from n1 (n1's
    nil at its timeout cannot reach n0): the client gets an error naming n1 by the BLPOP's
    timeout plus the call timeout, not never. After the heal an element pushed at n1 stays there: nothing is popped
    for the client that was told."""
    fleet = plain_fleet(server_factory, partition)
    key = fleet.key_of("n1", prefix="q")
    c1 = fleet.client("n1")
    result = {}

    def blpop():
        t = time.monotonic()
        result["r"] = outcome(lambda: fleet.client("n0", socket_timeout=30).blpop([key], 4))
        result["took"] = time.monotonic() - t
    t = threading.Thread(target=blpop, daemon=True)
    t.start()
    until(lambda: int(c1.info("clients")["blocked_clients"]) == 1, "the BLPOP waits at n1",
          every=0.01)
    partition.cut(fleet["n0"], fleet["n1"])
    t.join(30)
    assert not t.is_alive(), "the BLPOP never answered"
    r = result["r"]
    assert isinstance(r, redis.ResponseError) and "n1" in str(r), r
    assert fleet.client("n0").ping()
    partition.heal()
    until(lambda: int(c1.info("clients")["blocked_clients"]) == 0, "n1's wait over", timeout=30)
    assert own(fleet, "n1").rpush(key, "e") == 1
    time.sleep(0.5)
    assert own(fleet, "n1").lrange(key, 0, -1) == [b"e"], "an element popped for a client gone"
