"""What the transaction tests share (test_txn_faults, test_txn_left_ring, test_gather,
test_gather_multi, test_partition_promises): a call through SHARD.CALL, a counter of
`INFO shard`, whether any lock, doubt or decision is left, the coordinator's hold at a step of
the two-phase commit (`SHARD.DEBUG TXN-HOLD`), and a SHARD.EXEC that runs in a thread while
the test acts at that step."""

import re
import threading
import time
from pathlib import Path

import redis

from helpers.server import info_shard


def call(c, *args):
    return c.execute_command("SHARD.CALL", *args)


def counter(client, name):
    return int(info_shard(client)[name])


def no_lock_left(fleet, names=None):
    """No owner among `names` (every node by default) holds a lock, none is in doubt, and none
    holds a decision as a coordinator."""
    for n in fleet if names is None else names:
        i = info_shard(fleet.client(n))
        if (i["txn_locks_held"], i["txn_in_doubt"], i["txn_decisions_held"]) != ("0", "0", "0"):
            return False
    return True


def hold(client, step):
    """The coordinator at `client` stops its next transaction at `step` (or `OFF`)."""
    assert client.execute_command("SHARD.DEBUG", "TXN-HOLD", step) == b"OK"


def held(client):
    """How many transactions wait at the hold."""
    return client.execute_command("SHARD.DEBUG", "TXN-HOLD", "HELD")


class Exec:
    """SHARD.MULTI, the commands queued through SHARD.CALL, then SHARD.EXEC on its own
    connection in a thread (it may wait at a hold or a cut link); `.result` is its reply or the
    error it got, `.took` its seconds."""

    def __init__(self, server, commands):
        self.result, self.took = None, None
        c = server.client(socket_timeout=60)
        assert c.execute_command("SHARD.MULTI") == b"OK"
        for command in commands:
            assert call(c, *command) == b"QUEUED"

        def run():
            t = time.monotonic()
            try:
                self.result = c.execute_command("SHARD.EXEC")
            except (redis.RedisError, OSError) as e:
                self.result = e
            self.took = time.monotonic() - t
        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def join(self, timeout=60):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "SHARD.EXEC did not reply"
        return self.result


def prepares_of(server, coordinator="n0"):
    """The txids of `coordinator`'s PREPAREs in `server`'s AOF."""
    found = set()
    pattern = rb"PREPARE\r\n\$\d+\r\n(" + coordinator.encode() + rb"/[0-9a-f]+)\r\n"
    for f in Path(server.workdir).rglob("*.aof"):
        found |= set(re.findall(pattern, f.read_bytes()))
    return found
