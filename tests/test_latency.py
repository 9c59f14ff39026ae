"""No stall (issue 44): the module's main-thread steps are visible to the server's latency
monitor (`host::latency`), each kind under its own event (`shard-cleanup-step`,
`shard-index-build`, ...), so that `LATENCY LATEST` tells which step held the server.

What is asserted is that the events are recorded, not how long anything took: with
`latency-monitor-threshold 1`, a cleanup step works until its 2 ms budget is spent while it has
keys to delete (tens of thousands here), so it reaches the threshold whatever the machine's
speed. And nothing of the module's is recorded while the
monitor is off (the server's own call compares with the threshold, not with 0)."""

from helpers.fleet import start_fleet
from helpers.reshard import start_resharding, wait_fleet, wait_job
from helpers.server import info_shard, until

KEYS = 200_000
NAMES = ["a", "b", "c"]


def module_events(client):
    """{event: worst ms} of the module's events in `LATENCY LATEST`."""
    out = {}
    for row in client.execute_command("LATENCY", "LATEST"):
        name = row[0].decode() if isinstance(row[0], bytes) else row[0]
        if name.startswith("shard-"):
            out[name] = int(row[3])
    return out


def index_ready(servers):
    return all(info_shard(s.client())["key_index"] == "ready" for s in servers)


def test_a_grows_steps_are_recorded_by_the_latency_monitor_by_kind(server_factory):
    fleet = start_fleet(server_factory, [*NAMES, "d"], ring=NAMES,
                        module_args=["key-index", "yes"],
                        config=[("enable-debug-command", "yes")])
    old = [fleet[n] for n in NAMES]
    # Every old node gets the same names; a cleanup leaves each its own (the monitor off).
    for s in old:
        s.client().execute_command("DEBUG", "POPULATE", KEYS, "key", 10)
    for s in old:
        s.client().execute_command("SHARD.RESHARD", "CLEANUP")
    for s in old:
        assert wait_job(s.client(), timeout=120)["state"] == b"done"
    until(lambda: index_ready(fleet.values()), "every key index ready", timeout=120)
    assert sum(s.client().dbsize() for s in old) == KEYS
    for s in fleet.values():
        assert module_events(s.client()) == {}, "recorded while the monitor was off"

    # The monitor on (set at run time: the module reads the setting again), then a grow.
    for s in fleet.values():
        s.client().config_set("latency-monitor-threshold", 1)
        s.client().execute_command("LATENCY", "RESET")
    start_resharding(fleet["a"].client(), fleet, [*NAMES, "d"])
    wait_fleet(fleet["a"].client(), timeout=180)
    until(lambda: index_ready(fleet.values()), "every key index rebuilt", timeout=120)
    assert sum(s.client().dbsize() for s in fleet.values()) == KEYS

    events = {n: module_events(s.client()) for n, s in fleet.items()}
    # Each old node deleted what moved, in steps of 2 ms.
    for n in NAMES:
        assert "shard-cleanup-step" in events[n], events
    # Whatever else went over, by its kind's name, at or over the threshold.
    kinds = {"copy-step", "cleanup-step", "index-build", "ring-install", "timer", "before-sleep",
             "after-sleep", "pool-flush", "txn-turn", "lock-scan", "socket-event",
             "keyspace-event", "keyspace-change", "main-thread-call", "config-change",
             "role-change", "client-gone"}
    for e in events.values():
        for name, worst in e.items():
            assert name.removeprefix("shard-").removesuffix("-cpu") in kinds, name
            assert worst >= 1, (name, worst)
