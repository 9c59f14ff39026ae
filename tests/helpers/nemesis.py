"""The nemesis test's parts (issues 33 and 44): a fleet of shards of a primary and a replica
behind three sentinels (AOF on, fsync always, the cluster protocol on a `slots` ring of all but
the last shard, which a grow adds; each server and sentinel on an address of its own when the
test cuts them apart: helpers.nemesis_partitions),
a workload that records every operation's outcome, a nemesis that injects many faults at once
from a seeded schedule, and the checks run on the healed fleet.

The workload (each operation's outcome is `ok`, `fail`: refused and not applied, or `info`: its
outcome unknown, as Jepsen's histories have it):
- list appends: each writer appends unique elements `w<writer>-<n>` (`RPUSH`) to random list
  keys, through `SHARD.CALL WAIT 1 <ms> RPUSH` on a random primary (acknowledged only once the
  owner's replica has it), or through a cluster client (redis-py's `RedisCluster` finds the
  owner from its slot map; `RPUSH` then `WAIT 1` on that node's connection);
- registers: one writer per register key `SET`s unique values and `DEL`s, through
  `SHARD.CALL WAIT`;
- readers: `SHARD.CALL LRANGE` of a list, checked as read: no element twice, each writer's
  elements in its order, every element acknowledged before the read began present;
- IDs: `SHARD.GENKEY COUNT 10` on random primaries; one of them has its wall clock stepped back
  by the nemesis (tests/clockshim.c);
- transactions: `SHARD.MULTI`, `RPUSH` of one id to two lists `tx:<i>`, `SHARD.EXEC`, through a
  random primary; checked at the end: no id applied twice, none applied that EXEC refused, none
  at one list only (all or nothing), none acknowledged (EXEC's replies, or "the transaction
  committed ...") and applied nowhere: an acknowledgement is durable, as `SHARD.CALL WAIT 1`'s
  (a single owner's block no replica has is answered `NOREPLICAS the transaction is applied
  ...`, not acknowledged: counted in "transactions not acknowledged, applied", as Redis's own
  `WAIT` leaves such a write to chance).

The nemesis, every 0.5-2 s: `kill -9` (restarted later from its AOF) or `SIGSTOP` (then `SIGCONT`)
of a primary, a replica or a sentinel; a Sentinel failover; a grow to the last shard and a
shrink back (`SHARD.RESHARD START` on a random primary, which coordinates), `CANCEL`, a kill of
the coordinator, and `RESUME` on another node; a clock step; a partition
(helpers.nemesis_partitions). At the end everything is healed,
an unfinished resharding is resumed to its end, and the checks run: every acknowledged element
is in its list exactly once and in its writer's order, no unknown one twice; every register
holds its last acknowledged write (or a later unknown one), so no deleted key comes back; every
key is at its owner only; no ID was issued twice.
"""

import os
import random
import re
import signal
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import RedisClusterException

from helpers.dump_list import read_list
from helpers.fleet import owners
from helpers.reshard import fleet_status
from helpers.ports import free_port
from helpers.server import AOF, as_map, until

SHARDS = ("n0", "n1", "n2", "n3")
RING = SHARDS[:3]
WAIT_MS = 1000
OK, FAIL, INFO = "ok", "fail", "info"
# Errors that say the command was not applied.
REFUSALS = ("TRYAGAIN", "MOVED", "ASK", "CLUSTERDOWN", "NOREPLICAS_NOT_SENT", "LOADING",
            "MASTERDOWN", "READONLY", "NORING", "ERR unknown")


class Clients:
    """Client threads over the fleet until `stop`: each runs `body(i)`; a crash (a bug of the
    harness) is recorded by `on_crash`, for the checks to report. `Workload` and the bank under
    faults (tests/test_txn_bank_faults.py) are built on it."""

    join_timeout = 30  # seconds `finish` waits for each thread
    socket_timeout = 2  # of the clients `_client` opens

    def __init__(self, fleet, history):
        self.fleet, self.history = fleet, history
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = []

    def spawn(self, body, i):
        """A thread that runs `body(i)` (started by `start`)."""
        self.threads.append(threading.Thread(target=self._guard, args=(body, i), daemon=True))

    def start(self):
        for t in self.threads:
            t.start()

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=self.join_timeout)

    def on_crash(self, body, i, e):
        raise NotImplementedError

    def _guard(self, body, i):
        try:
            body(i)
        except Exception as e:  # a bug of the harness: reported by the checks
            self.on_crash(body, i, e)

    def _server(self, rng):
        """A random live server (any server when none is)."""
        return rng.choice(self.fleet.live() or self.fleet.servers())

    def _client(self, rng):
        """A client of a random live server (any server when none is)."""
        return self._server(rng).client(socket_timeout=self.socket_timeout,
                                        socket_connect_timeout=1)


class History:
    """Every operation and every nemesis event, in order, with the time since the start."""

    def __init__(self):
        self.lock = threading.Lock()
        self.started = time.monotonic()
        self.wall_started = time.time()  # to place the servers' log lines (nemesis_report)
        self.events = []

    def add(self, who, what, outcome="", detail=""):
        with self.lock:
            self.events.append((round(time.monotonic() - self.started, 3), who, what, outcome,
                                str(detail)[:200]))

    def text(self, last=400, who=None):
        with self.lock:
            events = [e for e in self.events if who is None or e[1] in who][-last:]
        return "\n".join(f"{t:9.3f} {who:>10} {what} {outcome} {detail}"
                         for t, who, what, outcome, detail in events)


def outcome_of(error):
    """The outcome of an operation that got `error`: `fail` when the reply says it was not
    applied, `info` when it may have been."""
    text = str(error)
    if isinstance(error, redis.ResponseError) and text.startswith(REFUSALS):
        return FAIL
    return INFO


class Clock:
    """The offset file of tests/clockshim.c for one server: a signed number of ms."""

    def __init__(self, path):
        self.path = Path(path)
        self.steps = []  # (real wall time, offset ms) of each set: to read the server's log
        self.set(0)

    def set(self, offset_ms):
        self.steps.append((time.time(), int(offset_ms)))
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(f"{int(offset_ms)}\n")
        tmp.replace(self.path)


class Fleet:
    """The servers (primaries and replicas by shard, as started), the sentinels, and who is
    down or paused now."""

    def __init__(self, server_factory, sentinel_factory, shim, workdir, config=(),
                 shards=SHARDS, addresses=None):
        """`shards`: the names of the shards, the last of which joins and leaves by START (the
        ring holds the others). `addresses` (helpers.partition.Addresses): every server and
        sentinel listens on a loopback address of its own, which its connections leave from,
        so that a `Partition` can cut them apart; None: all on 127.0.0.1."""
        self.shards = tuple(shards)
        self.ring_names = self.shards[:-1]
        self.clocks = {}

        def host():
            return addresses.next() if addresses is not None else "127.0.0.1"
        # The sentinels' addresses first: every server is started knowing them, so that a
        # server restarted after a kill still follows Sentinel.
        sentinel_at = [(host(), free_port()) for _ in range(3)]
        common = [("shard.sentinels", " ".join(f"{h}:{p}" for h, p in sentinel_at)),
                  ("shard.topology-refresh-ms", 200), ("shard.call-timeout-ms", 1000),
                  ("shard.max-drift-ms", 60000), ("repl-diskless-sync-delay", 0),
                  ("enable-debug-command", "yes"), *AOF,
                  # Every main-thread hold of 5 ms or more, by event (`latency_report`).
                  ("latency-monitor-threshold", 5),
                  *config]

        def make(n, i, role, primary=None):
            clock = Clock(Path(workdir) / f"clock-{n}-{role}")
            env = {"LD_PRELOAD": str(shim), "SHARD_CLOCK_OFFSET_FILE": str(clock.path)}
            # Every server a node id of its own, replicas too (docs/durability.md): a replica
            # promoted before its primary's last marks reached it, with its clock behind,
            # would otherwise issue the same IDs again.
            node_id = 2 * i + (role == "r")
            config = [("shard.self", n), ("shard.node-id", node_id), *common]
            if primary is not None:
                config.append(("replicaof", primary.host, primary.port))
            s = server_factory(config=config, env=env,
                               host=host() if addresses is not None else None)
            self.clocks[s.port] = clock
            return s

        self.primaries = {n: make(n, i, "p") for i, n in enumerate(self.shards)}
        self.replicas = {n: make(n, i, "r", self.primaries[n])
                         for i, n in enumerate(self.shards)}
        for n in self.shards:
            c = self.replicas[n].client()
            until(lambda: c.info("replication")["master_link_status"] == "up",
                  f"{n}'s replica in sync")
        self.sentinels = [
            sentinel_factory({n: f"{self.primaries[n].host}:{self.primaries[n].port}"
                              for n in self.shards}, port=p,
                             host=h if addresses is not None else None)
            for h, p in sentinel_at]
        ring = ["slots", *[x for n in self.ring_names for x in (n, "sentinel", 1)]]
        for n in self.shards:  # the last too: it joins and leaves by START
            self.primaries[n].client().execute_command("SHARD.RING", "SET", *ring)
        for n in self.shards:
            self._sentinels_ready(n)
        for s in self.servers():
            c = s.client()
            until(lambda: c.execute_command("SHARD.RING", "GET"), f"{s.port} has the ring")
            c.config_set("shard.cluster-protocol", "yes")
        self.down = set()  # ports of servers killed and not restarted yet
        self.paused = set()  # processes stopped: (kind, object)

    def _sentinels_ready(self, n):
        def ready():
            for s in self.sentinels:
                c = s.client()
                reps = c.execute_command("SENTINEL", "REPLICAS", n)
                if not any(b"s_down" not in dict(zip(r[::2], r[1::2]))[b"flags"] for r in reps):
                    return False
                master = c.execute_command("SENTINEL", "MASTER", n)
                if dict(zip(master[::2], master[1::2]))[b"num-other-sentinels"] != b"2":
                    return False
            return True
        until(ready, f"the sentinels know {n}'s replica and each other", timeout=30)

    def servers(self):
        return [*self.primaries.values(), *self.replicas.values()]

    def shard_of(self, server):
        for n in self.shards:
            if server in (self.primaries[n], self.replicas[n]):
                return n
        raise KeyError(server.port)

    def live(self):
        """The servers up and not paused."""
        stopped = {id(o) for _, o in self.paused}
        return [s for s in self.servers() if s.port not in self.down and id(s) not in stopped]

    def role(self, server):
        try:
            return server.client(socket_timeout=1).execute_command("ROLE")[0].decode()
        except (redis.RedisError, OSError):
            return None

    def current_primaries(self):
        """Each shard's servers that say they are primaries now, among the live ones."""
        out = defaultdict(list)
        for s in self.live():
            if self.role(s) == "master":
                out[self.shard_of(s)].append(s)
        return out

    def master_address(self, n):
        """The address the first sentinel that answers names for shard `n`."""
        for s in self.sentinels:
            try:
                host, port = s.client(socket_timeout=1).execute_command(
                    "SENTINEL", "GET-MASTER-ADDR-BY-NAME", n)
                return int(port)
            except (redis.RedisError, OSError, TypeError, ValueError):
                continue
        return None

    def heal(self):
        """Every paused process continued, every killed server restarted."""
        for kind, o in list(self.paused):
            o.proc.send_signal(signal.SIGCONT)
        self.paused.clear()
        for s in self.servers():
            if s.port in self.down:
                self.restart(s)
        self.down.clear()

    def kill(self, s):
        """`kill -9` of `s`, which later restarts as its configuration file says: as a replica
        of the primary it followed when killed, or a primary, since Sentinel rewrites that file
        at each change it makes to a server that is up (`CONFIG REWRITE`), and a killed server
        keeps the last one. Started again with its first `replicaof` instead, a promoted replica
        came back as the replica of its own replica, and Sentinel, which counts that one as
        unlinked, never promoted either: the shard stayed without a primary (seed 7 on Redis).
        A server that does not answer (paused) keeps the configuration it had."""
        try:
            role = s.client(socket_timeout=0.5).execute_command("ROLE")
        except (redis.RedisError, OSError):
            role = None
        if role is not None:
            s.config = [c for c in s.config if c[0] != "replicaof"]
            if role[0] == b"slave":
                s.config.append(("replicaof", role[1].decode(), int(role[2])))
        s.stop(signal.SIGKILL)
        # A paused server killed is no longer paused (nothing to continue: NEMESIS_SEED=1185022197
        # killed the paused coordinator, then sent SIGCONT to a process gone).
        self.paused.difference_update([(kind, o) for kind, o in self.paused if o is s])

    def restart(self, s):
        """Starts a killed server again from its AOF, with the cluster protocol on from its
        start, as an operator's redis.conf line gives it (the ring comes from the AOF). Turned
        on by CONFIG SET once the server answered, as before, a cluster client's write sent in
        between ran as a plain server's and was lost to the cancel's copy back (NEMESIS_SEED=
        673052557: an RPUSH acknowledged by n0's primary 40 ms after its restart)."""
        if "cluster-protocol" not in s.module_args:
            s.module_args += ["cluster-protocol", "yes"]
        s.start()
        assert s.client().config_get("shard.cluster-protocol") == {
            "shard.cluster-protocol": "yes"}, f"{s.port}: the cluster protocol on at its start"

    def settled(self):
        """Each shard has one primary, the one Sentinel names, and its replica is linked."""
        for n in self.shards:
            port = self.master_address(n)
            pair = (self.primaries[n], self.replicas[n])
            primary = [s for s in pair if s.port == port]
            if not primary or self.role(primary[0]) != "master":
                return False
            other = [s for s in pair if s.port != port][0]
            try:
                info = other.client(socket_timeout=1).info("replication")
            except (redis.RedisError, OSError):
                return False
            if info.get("role") != "slave" or info.get("master_port") != port or \
                    info.get("master_link_status") != "up":
                return False
        return True

    def fail_over_to(self, n, server):
        """`SENTINEL FAILOVER n` (asked again while Sentinel refuses: a failover in progress, no
        replica it counts as good yet) until Sentinel names `server`, it is a primary, and every
        shard's other server is its replica, in sync."""
        def done():
            if self.master_address(n) == server.port and self.role(server) == "master":
                return True
            try:
                self.sentinels[0].client().execute_command("SENTINEL", "FAILOVER", n)
            except redis.ResponseError:
                pass
            return False
        until(done, f"Sentinel fails {n} over to {server.port}", timeout=60, every=0.5)
        until(self.settled, "every shard's replica linked to its primary", timeout=60, every=0.2)

    def primary(self, n):
        """The server Sentinel names as shard `n`'s primary."""
        port = self.master_address(n)
        return next(s for s in (self.primaries[n], self.replicas[n]) if s.port == port)


class Workload(Clients):
    """The clients: list writers (SHARD.CALL WAIT and a cluster client), register writers,
    readers and an ID drawer, each a thread, until `stop`."""

    def __init__(self, fleet, history, rng, lists=12, registers=16, call_writers=3,
                 txn_lists=8):
        super().__init__(fleet, history)
        self.lists = [f"list:{i}" for i in range(lists)]
        self.registers = [f"reg:{i}" for i in range(registers)]
        # element -> (key, outcome); per writer, its elements in order
        self.appends = {}
        # element -> (sent at, answered at, the path: "CALL via n1:port" or "cluster n3:port"),
        # times since the history's start: what a failure prints of a lost element
        self.sent = {}
        self.order = defaultdict(list)
        # register -> [(value or None for a delete, outcome)], one writer per register
        self.writes = defaultdict(list)
        self.ids = []
        self.read_errors = []
        self.crashed = []
        # Transactions across owners (SHARD.MULTI ... SHARD.EXEC): each appends its id to two
        # lists `tx:<i>`; id -> (the two keys, outcome), the outcome as for appends.
        self.tx_lists = [f"tx:{i}" for i in range(txn_lists)]
        self.txns = {}
        # id -> (the owners of its two keys at send time by SHARD.WHEREIS at the node it was
        # sent through, or None; how SHARD.EXEC answered: "reply", "committed" (the error
        # "the transaction committed ..."), or the error's first words): what
        # `txn_classes` sorts the lost and the applied-in-part ones by.
        self.tx_info = {}
        self.seeds = [rng.randrange(1 << 30) for _ in range(call_writers + 5)]
        for w in range(call_writers):
            self.spawn(self._call_writer, w)
        self.spawn(self._cluster_writer, call_writers)
        for body in (self._register_writer, self._reader, self._genkey):
            self.spawn(body, 0)
        if txn_lists:
            self.spawn(self._txn_writer, 0)

    def on_crash(self, body, _i, e):
        self.crashed.append(f"{body.__name__}: {e!r}")

    def _now(self):
        return round(time.monotonic() - self.history.started, 3)

    def _record_append(self, w, element, key, outcome, began, path):
        with self.lock:
            self.appends[element] = (key, outcome)
            self.sent[element] = (began, self._now(), path)
            self.order[w].append(element)

    def _call_writer(self, w):
        rng = random.Random(self.seeds[w])
        n = 0
        while not self.stop.is_set():
            key = rng.choice(self.lists)
            element = f"w{w}-{n}"
            n += 1
            began, path = self._now(), "CALL (no server)"
            try:
                s = self._server(rng)
                path = f"CALL via {self.fleet.shard_of(s)}:{s.port}"
                c = s.client(socket_timeout=2, socket_connect_timeout=1)
                c.execute_command("SHARD.CALL", "WAIT", 1, WAIT_MS, "RPUSH", key, element)
                outcome = OK
            except (redis.RedisError, OSError) as e:
                outcome = outcome_of(e)
                self.history.add(f"w{w}", f"RPUSH {key} {element}", outcome, e)
                time.sleep(0.02)
            self._record_append(w, element, key, outcome, began, path)

    def _cluster_writer(self, w):
        rng = random.Random(self.seeds[w])
        n = 0
        rc = None
        while not self.stop.is_set():
            key = rng.choice(self.lists)
            element = f"w{w}-{n}"
            n += 1
            outcome = INFO
            began, path = self._now(), "cluster (no node)"
            try:
                if rc is None:
                    s = rng.choice(self.fleet.live() or self.fleet.servers())
                    rc = RedisCluster(startup_nodes=[ClusterNode(s.host, s.port)],
                                      socket_timeout=2, socket_connect_timeout=1,
                                      cluster_error_retry_attempts=0)
                node = rc.get_node_from_key(key)
                path = f"cluster {self._shard_at(node.port)}:{node.port}"
                p = rc.get_redis_connection(node).pipeline(transaction=False)
                p.execute_command("RPUSH", key, element)
                p.execute_command("WAIT", 1, WAIT_MS)
                pushed, acks = p.execute(raise_on_error=False)
                if isinstance(pushed, Exception):
                    outcome = outcome_of(pushed)
                    rc = None  # its slot map may be old: a new client reads it again
                elif isinstance(acks, int) and acks >= 1:
                    outcome = OK
                if outcome != OK:
                    self.history.add(f"w{w}", f"RPUSH {key} {element}", outcome,
                                     pushed if isinstance(pushed, Exception) else f"WAIT {acks}")
            except RedisClusterException as e:  # no node answered: nothing was sent
                outcome = FAIL
                self.history.add(f"w{w}", f"RPUSH {key} {element}", outcome, e)
                rc = None
                time.sleep(0.05)
            except (redis.RedisError, OSError) as e:
                outcome = outcome_of(e)
                self.history.add(f"w{w}", f"RPUSH {key} {element}", outcome, e)
                rc = None
                time.sleep(0.02)
            self._record_append(w, element, key, outcome, began, path)

    def _shard_at(self, port):
        for s in self.fleet.servers():
            if s.port == int(port):
                return self.fleet.shard_of(s)
        return "?"

    def _register_writer(self, _):
        rng = random.Random(self.seeds[-3])
        n = 0
        while not self.stop.is_set():
            key = rng.choice(self.registers)
            delete = rng.random() < 0.3
            value = None if delete else f"v{n}"
            n += 1
            command = ("DEL", key) if delete else ("SET", key, value)
            try:
                self._client(rng).execute_command("SHARD.CALL", "WAIT", 1, WAIT_MS, *command)
                outcome = OK
            except (redis.RedisError, OSError) as e:
                outcome = outcome_of(e)
                self.history.add("regs", " ".join(map(str, command)), outcome, e)
                time.sleep(0.02)
            with self.lock:
                self.writes[key].append((value, outcome))

    def _reader(self, _):
        rng = random.Random(self.seeds[-2])
        while not self.stop.is_set():
            key = rng.choice(self.lists)
            with self.lock:
                known = {e for e, (k, o) in self.appends.items() if k == key and o == OK}
            began = self._now()
            try:
                s = self._server(rng)
                got = s.client(socket_timeout=2, socket_connect_timeout=1).execute_command(
                    "SHARD.CALL", "LRANGE", key, 0, -1)
            except (redis.RedisError, OSError):
                time.sleep(0.02)
                continue
            got = [e.decode() for e in got]
            problems = list_problems(got, known)
            if problems:
                # What the report prints of a bad read (nemesis_report): when, through which
                # server, and the acknowledged elements it lacked.
                self.read_errors.append(
                    (key, problems, (began, self._now()),
                     f"{self.fleet.shard_of(s)}:{s.port}", sorted(known - set(got))))
                self.history.add("reader", f"LRANGE {key}", "bad", problems)
            time.sleep(0.01)

    def _txn_writer(self, _):
        rng = random.Random(self.seeds[-4])
        n = 0
        while not self.stop.is_set():
            primaries = [s for s in self.fleet.live() if self.fleet.role(s) == "master"]
            if not primaries:
                time.sleep(0.05)
                continue
            s = rng.choice(primaries)
            if self.transact(s.client(socket_timeout=10, socket_connect_timeout=1), rng,
                             f"t{n}") is not None:
                n += 1
            else:
                time.sleep(0.02)

    def transact(self, c, rng, tid, keys=None):
        """One transaction through `c`: `RPUSH` of `tid` to two lists `tx:<i>` (`keys`, or two
        at random) in SHARD.MULTI ... SHARD.EXEC; its outcome (recorded), or None when it failed
        before SHARD.EXEC (nothing sent to apply)."""
        a, b = keys or rng.sample(self.tx_lists, 2)
        try:
            p = c.pipeline(transaction=False)
            p.execute_command("SHARD.WHEREIS", a)
            p.execute_command("SHARD.WHEREIS", b)
            owned = tuple(o.decode() for o in p.execute())
        except (redis.RedisError, OSError):
            owned = None
        answer = "reply"
        try:
            c.execute_command("SHARD.MULTI")
            for k in (a, b):
                if c.execute_command("SHARD.CALL", "RPUSH", k, tid) != b"QUEUED":
                    raise redis.ResponseError(f"RPUSH {k} not queued")
        except (redis.RedisError, OSError):
            return None
        began = self._now()
        try:
            got = c.execute_command("SHARD.EXEC")
            outcome = FAIL if got is None else OK
        except redis.ResponseError as e:
            text = str(e)
            answer = "committed" if "the transaction committed" in text else \
                " ".join(text.split()[:4])
            if "the transaction committed" in text:
                outcome = OK  # decided: applied, only an owner's reply is missing
            elif text.startswith(("TRYAGAIN", "EXECABORT")):
                outcome = FAIL
            else:
                outcome = INFO
            self.history.add("txn", f"{tid} {a} {b}", outcome, e)
        except (redis.ConnectionError, redis.TimeoutError, OSError) as e:
            outcome = INFO
            answer = type(e).__name__
            self.history.add("txn", f"{tid} {a} {b}", outcome, e)
        port = c.connection_pool.connection_kwargs.get("port")
        with self.lock:
            self.txns[tid] = ((a, b), outcome, began, self._now(), port)
            self.tx_info[tid] = (owned, answer)
        return outcome

    def _genkey(self, _):
        rng = random.Random(self.seeds[-1])
        while not self.stop.is_set():
            try:
                c = self._client(rng)
                ids = c.execute_command("SHARD.GENKEY", "COUNT", 10)
                port = c.connection_pool.connection_kwargs["port"]
                at = round(time.monotonic() - self.history.started, 3)
                with self.lock:
                    self.ids.extend((i, port, at) for i in ids)
            except (redis.RedisError, OSError):
                time.sleep(0.02)


def fill(fleet, keys):
    """`keys` string keys `fill:<i>`, each at its owner's primary: data for the copies of a grow
    or a shrink to move (so that a fault can land in the middle of one)."""
    via = fleet.primary(fleet.ring_names[0]).client(socket_timeout=30)
    names = [f"fill:{i}" for i in range(keys)]
    by_owner = defaultdict(list)
    for k, o in zip(names, owners(via, names)):
        by_owner[o].append(k)
    for o, ks in by_owner.items():
        c = fleet.primary(o).client(socket_timeout=30)
        for i in range(0, len(ks), 1000):
            p = c.pipeline(transaction=False)
            for k in ks[i:i + 1000]:
                p.set(k, "x" * 64)
            p.execute()


def list_problems(elements, acknowledged):
    """What is wrong with a list's `elements`: an element twice, an acknowledged element after a
    later one of its writer, an element of `acknowledged` missing."""
    problems = []
    counts = Counter(elements)
    twice = [e for e, c in counts.items() if c > 1]
    if twice:
        problems.append(f"twice: {twice[:5]}")
    # An acknowledged element must come before every later element of its writer (sent after
    # it was acknowledged); one whose outcome is unknown may have taken effect later (held at a
    # paused server, applied after the writer's next one).
    last = {}
    for e in elements:
        writer, n = e.rsplit("-", 1)
        if int(n) < last.get(writer, -1) and e in acknowledged:
            problems.append(f"out of order: {e} after {writer}-{last[writer]}")
            break
        last[writer] = max(int(n), last.get(writer, -1))
    missing = sorted(acknowledged - counts.keys())
    if missing:
        problems.append(f"missing {len(missing)} acknowledged: {missing[:5]}")
    return problems


class Nemesis:
    """Faults from a seeded schedule, one every 0.5-2 s, several in force at once."""

    def __init__(self, fleet, history, rng, partition=None, workload=None, maxrate=None):
        """`partition` (helpers.partition.Partition, the fleet on addresses of its own): the
        partitions of helpers.nemesis_partitions join the faults. `maxrate`: START's MAXRATE,
        so that copies last long enough for faults to land in them."""
        self.fleet, self.history, self.rng = fleet, history, rng
        self.coordinator = None  # the server that ran the last START
        # When each fault in force ends: ("down", port) or ("paused", id) -> monotonic time.
        self.ends = {}
        self.grown = False
        self.counts = Counter()
        self.maxrate = maxrate
        self.parts = None
        if partition is not None:
            from helpers.nemesis_partitions import Partitions
            self.parts = Partitions(self, partition, workload)

    def run(self, seconds, opening=()):
        """Faults for `seconds`: the `opening` actions first (a short schedule begins with a
        grow, so that every run moves keys), then random ones."""
        end = time.monotonic() + seconds
        actions = [self.kill, self.kill, self.pause, self.pause, self.failover, self.reshard,
                   self.cancel, self.kill_coordinator, self.resume_elsewhere, self.clock_step,
                   self.restore]
        if self.parts is not None:
            actions += self.parts.actions()
        first = list(opening)
        while time.monotonic() < end or (first and time.monotonic() < end + 60):
            self.heal_due()
            if self.parts is not None:
                self.parts.heal_due()
                # An opening's partition waits for the one in force to heal (a random one
                # heals it early).
                if first and self.parts.current is not None and _is_cut(first[0]):
                    time.sleep(0.2)
                    continue
            action = first.pop(0) if first else self.rng.choice(actions)
            try:
                action()
            except (redis.RedisError, OSError, IndexError, StopIteration) as e:
                # IndexError, StopIteration: no server to choose (all down, or no primary
                # named for a shard at the moment)
                self.history.add("nemesis", _name(action), "error", repr(e))
            time.sleep(self.rng.uniform(0.5, 2.0))

    def _note(self, what, detail=""):
        self.counts[what.split()[0] + (" refused" if "refused" in what else "")] += 1
        self.history.add("nemesis", what, "", detail)

    def kill(self):
        up = [s for s in self.fleet.servers() if s.port not in self.fleet.down]
        if len(self.fleet.down) >= 2 or not up:
            return self.restore()
        s = self.rng.choice(up)
        self.fleet.kill(s)
        self.fleet.down.add(s.port)
        self.ends[("down", s.port)] = time.monotonic() + self.rng.uniform(0.5, 6)
        self._note(f"kill -9 {self.fleet.shard_of(s)}:{s.port}")

    def pause(self):
        if len(self.fleet.paused) >= 2:
            return self.restore()
        choices = [("server", s) for s in self.fleet.live()] + \
                  [("sentinel", s) for s in self.fleet.sentinels
                   if ("sentinel", s) not in self.fleet.paused]
        kind, o = self.rng.choice(choices)
        o.proc.send_signal(signal.SIGSTOP)
        self.fleet.paused.add((kind, o))
        self.ends[("paused", id(o))] = time.monotonic() + self.rng.uniform(0.3, 5)
        self._note(f"SIGSTOP {kind}:{o.port}")

    def heal_due(self):
        """Ends the faults whose time is up: a paused process continues, a killed server
        restarts."""
        now = time.monotonic()
        for fault in self._faults():
            if self.ends.get(fault[0], now) <= now:
                self._end(fault)

    def restore(self):
        """Ends the fault in force that was to end first."""
        faults = self._faults()
        if faults:
            self._end(min(faults, key=lambda f: self.ends.get(f[0], 0)))

    def _faults(self):
        """The faults in force, each (its key in `ends`, what ends it)."""
        paused = [(("paused", id(o)), (kind, o)) for kind, o in self.fleet.paused]
        down = [(("down", port), port) for port in self.fleet.down]
        return paused + down

    def _end(self, fault):
        key, what = fault
        if key[0] == "paused":
            kind, o = what
            o.proc.send_signal(signal.SIGCONT)
            self.fleet.paused.discard(what)
            self._note(f"SIGCONT {kind}:{o.port}")
        else:
            s = next(s for s in self.fleet.servers() if s.port == what)
            self.fleet.restart(s)
            self.fleet.down.discard(what)
            self._note(f"restart {self.fleet.shard_of(s)}:{what}")

    def failover(self):
        n = self.rng.choice(self.fleet.shards)
        live = [s for s in self.fleet.sentinels if ("sentinel", s) not in self.fleet.paused]
        reply = self.rng.choice(live).client(socket_timeout=2).execute_command(
            "SENTINEL", "FAILOVER", n)
        self._note(f"SENTINEL FAILOVER {n}", reply)

    def reshard(self):
        target = self.fleet.shards if not self.grown else self.fleet.ring_names
        live = [s for s in self.fleet.live() if self.fleet.role(s) == "master"]
        if not live:
            return
        s = self.rng.choice(live)
        args = ["slots", *[x for n in target for x in (n, "sentinel", 1)]]
        if self.maxrate:
            args += ["MAXRATE", self.maxrate]
        try:
            # START asks every node first (5 s for one that does not answer).
            reply = s.client(socket_timeout=20).execute_command("SHARD.RESHARD", "START", *args)
        except redis.ResponseError as e:
            self._note(f"START to {len(target)} refused", e)
            return
        self.coordinator = s
        self.grown = not self.grown
        self._note(f"START to {len(target)} on {self.fleet.shard_of(s)}:{s.port}", reply)

    def cancel(self):
        s = self.coordinator
        if s is None or s.port in self.fleet.down:
            return
        try:
            reply = s.client(socket_timeout=20).execute_command("SHARD.RESHARD", "CANCEL")
        except redis.ResponseError as e:
            self._note("CANCEL refused", e)
            return
        self.grown = not self.grown
        self._note(f"CANCEL on {s.port}", reply)

    def kill_coordinator(self):
        s = self.coordinator
        if s is None or s.port in self.fleet.down:
            return
        self.fleet.kill(s)
        self.fleet.down.add(s.port)
        self.ends[("down", s.port)] = time.monotonic() + self.rng.uniform(0.5, 6)
        self._note(f"kill -9 the coordinator {self.fleet.shard_of(s)}:{s.port}")

    def resume_elsewhere(self):
        """RESUME on a live node that holds the plan and is not the coordinator."""
        for s in self.fleet.live():
            if s is self.coordinator:
                continue
            try:
                st = fleet_plan(s)
                if st is None or st["phase"] in (b"done", b"cancelled") or st["running"] == b"yes":
                    continue
                reply = s.client(socket_timeout=20).execute_command("SHARD.RESHARD", "RESUME")
                self.coordinator = s
                self._note(f"RESUME on {self.fleet.shard_of(s)}:{s.port}", reply)
                return
            except redis.ResponseError as e:
                self._note(f"RESUME on {s.port} refused", e)
                return

    def clock_step(self):
        s = self.rng.choice(self.fleet.servers())
        offset = self.rng.choice((-3000, -1500, 2000))
        self.fleet.clocks[s.port].set(offset)
        self._note(f"clock {offset:+} ms on {self.fleet.shard_of(s)}:{s.port}")


def _name(action):
    return getattr(getattr(action, "func", action), "__name__", str(action))


def _is_cut(action):
    return _name(action).startswith("cut_")


def fleet_plan(server):
    """The fleet plan `server` holds (`SHARD.RESHARD STATUS`'s `fleet`), or None."""
    return fleet_status(server.client(socket_timeout=2))


def finish_resharding(fleet, history, timeout=120):
    """Resumes an unfinished plan (on whichever primary holds one) until no node has a
    resharding open and every plan is done, cancelled, or superseded: a plan whose coordinator
    lost its lease to a newer term, or which is older than the rings the fleet went on to
    (RESUME refuses those, naming why)."""
    end = time.monotonic() + timeout
    superseded = set()
    while time.monotonic() < end:
        open_plans = []
        for s in fleet.servers():
            if fleet.role(s) != "master" or s.port in superseded:
                continue
            st = fleet_plan(s)
            if st is not None and st["phase"] not in (b"done", b"cancelled"):
                open_plans.append((s, st))
        rings_open = [s for s in fleet.servers()
                      if fleet.role(s) == "master" and ring_previous(s)]
        if not open_plans and not rings_open:
            return
        # No plan open anywhere, but rings open: the plan was lost (a failover to a server that
        # never had it); RESUME adopts the operation whose rings the fleet holds.
        todo = open_plans or [(s, {"running": b"no", "phase": b"(rings open)"})
                              for s in [s for s in rings_open if s.port not in superseded][:1]]
        for s, st in todo:
            if st["running"] == b"yes":
                continue
            try:
                s.client(socket_timeout=20).execute_command("SHARD.RESHARD", "RESUME")
                history.add("heal", f"RESUME on {s.port}", "", st["phase"])
            except redis.ResponseError as e:
                history.add("heal", f"RESUME on {s.port}", "refused", e)
                if str(e).startswith("STALETERM") or "older than the fleet" in str(e):
                    superseded.add(s.port)
            except (redis.RedisError, OSError) as e:
                history.add("heal", f"RESUME on {s.port}", "error", e)
        time.sleep(0.5)
    raise AssertionError("the resharding did not finish once the fleet was healed:\n"
                         + history.text(who=("nemesis", "heal"))
                         + "\n--- the servers ---\n" + fleet_report(fleet))


def ring_previous(server):
    """The resharding `server` has open (its ring's `previous`), or None."""
    ring = as_map(server.client().execute_command("SHARD.RING", "GET"))
    return ring and ring.get("previous")


# --- the checks, on the healed fleet ---------------------------------------------------------


def excused(read, windows):
    """Whether a bad read (an entry of `Workload.read_errors`) went through a server that a
    partition hid from the sentinels, while it was cut off or before it learned of the
    failover after the heal (helpers.nemesis_partitions.Window.excuses)."""
    _, _, (began, answered), via, _ = read
    port = int(via.rsplit(":", 1)[1])
    return any(w.excuses(port, began, answered) for w in windows)


def tally(fleet, workload, windows=()):
    """The run's counters, read on the healed fleet: acknowledged writes (list appends, register
    writes and deletes), those lost (appends), those not acknowledged but applied, elements
    twice, stale reads (allowed: through a server a partition hid from the sentinels, in its
    window; not: any other), IDs issued twice."""
    via = fleet.primary("n0").client(socket_timeout=10)
    lists = {k: [e.decode() for e in via.execute_command("SHARD.CALL", "LRANGE", k, 0, -1)]
             for k in [*workload.lists, *workload.tx_lists]}
    t = Counter()
    for element, (key, outcome) in workload.appends.items():
        present = element in lists[key]
        t["acknowledged"] += outcome == OK
        t["lost"] += outcome == OK and not present
        t["not acknowledged, applied"] += outcome != OK and present
    for key, writes in workload.writes.items():
        t["acknowledged"] += sum(1 for _, o in writes if o == OK)
    for tid, ((a, b), outcome, *_rest) in workload.txns.items():
        at = (tid in lists[a]) + (tid in lists[b])
        t["transactions acknowledged"] += outcome == OK
        t["transactions acknowledged, lost"] += outcome == OK and at == 0
        t["transactions not acknowledged, applied"] += outcome != OK and at == 2
        t["transactions applied in part"] += at == 1
    t["duplicates"] = sum(c - 1 for es in lists.values() for c in Counter(es).values() if c > 1)
    bad = workload.read_errors
    t["stale reads in a partition's window (allowed)"] = sum(1 for r in bad if excused(r, windows))
    t["stale reads otherwise"] = sum(1 for r in bad if not excused(r, windows))
    ids = Counter(i for i, _, _ in workload.ids)
    t["IDs issued"] = len(workload.ids)
    t["IDs issued twice"] = sum(1 for c in ids.values() if c > 1)
    return dict(t)


def check(fleet, workload, windows=()):
    """Everything the fleet must hold; returns the list of what is wrong (empty: all good).
    `windows`: the partitions' (helpers.nemesis_partitions.Window), whose stale reads through a
    server hidden from the sentinels are allowed."""
    problems = [f"harness thread crashed: {c}" for c in workload.crashed]
    primaries = {n: fleet.primary(n) for n in fleet.shards}
    via = primaries["n0"].client(socket_timeout=10)
    # Transactions: each id in both of its lists or in neither, at most once; every acknowledged
    # one in both, no refused one in either.
    tx = {k: [e.decode() for e in via.execute_command("SHARD.CALL", "LRANGE", k, 0, -1)]
          for k in workload.tx_lists}
    for k, ids in tx.items():
        twice = [i for i, c in Counter(ids).items() if c > 1]
        if twice:
            problems.append(f"{k}: transactions applied twice: {twice[:5]}")
        never = set(ids) - set(workload.txns)
        if never:
            problems.append(f"{k}: transactions never sent: {sorted(never)[:5]}")
    for tid, ((a, b), outcome, began, answered, port) in sorted(workload.txns.items()):
        at = [k for k in (a, b) if tid in tx[k]]
        story = f"(sent at {began:.3f} through :{port}, answered {answered:.3f})"
        # All or nothing, whatever the answer: its owners' parts are applied by one durable
        # decision (txn::coord::fleet, confirm) or as one block at one owner.
        if len(at) == 1:
            problems.append(f"transaction {tid} applied at {at[0]} only, not at "
                            f"{({a, b} - set(at)).pop()}: {outcome} {story}")
        if outcome == FAIL and at:
            problems.append(f"transaction {tid} applied, but its EXEC said it was not {story}")
        # Acknowledged: its replies (each owner's replica had its part: txn::owner::acked, or
        # no replica expected), or "the transaction committed ..." (the decision durable at a
        # replica of the coordinator, its COMMIT sent again until each owner's replica has
        # the part). Either survives a failover, as a SHARD.CALL WAIT 1 write does. A part at
        # no replica is answered NOREPLICAS ... (not acknowledged).
        if outcome == OK and not at:
            owned, answer = workload.tx_info.get(tid, (None, "?"))
            problems.append(f"transaction {tid} acknowledged ({answer}), applied nowhere "
                            f"{story}, owners {owned}")
    return problems + check_rest(fleet, workload, windows, primaries, via)


def txn_classes(workload, tx, history):
    """The lost and applied-in-part transactions sorted into classes: one owner or several (by
    SHARD.WHEREIS at send time), how SHARD.EXEC answered, and the kinds of nemesis events that
    named an owner (its shard name) from 10 s before the transaction to 20 s after its answer;
    returns (Counter of (class, outcome, owners, answer), Counter of fault kinds per class)."""
    classes, faults = Counter(), Counter()
    with history.lock:
        events = [e for e in history.events if e[1] == "nemesis"]
    for tid, ((a, b), outcome, began, answered, _port) in workload.txns.items():
        at = (tid in tx[a]) + (tid in tx[b])
        if at == 1:
            cls = "applied in part"
        elif outcome == OK and at == 0:
            cls = "acknowledged, lost"
        else:
            continue
        owned, answer = workload.tx_info.get(tid, (None, "?"))
        n = "?" if owned is None else ("one owner" if owned[0] == owned[1] else "two owners")
        classes[(cls, outcome, n, answer)] += 1
        names = set(owned or ())
        kinds = sorted({what.split()[0].rstrip(":") + ("-coordinator" if "the coordinator" in what
                                                         else "")
                        for t, _, what, _, _ in events
                        if began - 10 <= t <= answered + 20
                        and any(f"{x}:" in what or what.endswith(f" {x}") for x in names)})
        faults[(cls, n, " ".join(kinds))] += 1
    return classes, faults


def check_rest(fleet, workload, windows, primaries, via):
    problems = []
    # Lists: each acknowledged element exactly once, each writer's elements in its order, no
    # element twice.
    acked = defaultdict(set)
    sent = defaultdict(set)
    for element, (key, outcome) in workload.appends.items():
        if outcome == OK:
            acked[key].add(element)
        if outcome != FAIL:
            sent[key].add(element)
    for key in workload.lists:
        got = [e.decode() for e in via.execute_command("SHARD.CALL", "LRANGE", key, 0, -1)]
        for p in list_problems(got, acked[key]):
            problems.append(f"{key}: {p}")
        never = set(got) - sent[key]
        if never:
            problems.append(f"{key}: elements never sent or refused: {sorted(never)[:5]}")
    # Registers: the last acknowledged write, or a later one of unknown outcome.
    for key in workload.registers:
        writes = workload.writes.get(key, [])
        last_ok = max((i for i, (_, o) in enumerate(writes) if o == OK), default=None)
        allowed = set()
        start = 0 if last_ok is None else last_ok
        if last_ok is None:
            allowed.add(None)
        for value, outcome in writes[start:]:
            if outcome != FAIL:
                allowed.add(value)
        value = via.execute_command("SHARD.CALL", "GET", key)
        value = value.decode() if value is not None else None
        if value not in allowed:
            what = "a deleted key came back" if None in allowed and value is not None \
                else "not its last acknowledged write"
            problems.append(f"{key}: {what}: holds {value!r}, allowed {sorted(map(str, allowed))}")
    # Every key at its owner only (database 0 of each shard's primary).
    for n, s in primaries.items():
        keys = list(s.client(socket_timeout=10).scan_iter(count=1000))
        if not keys:
            continue
        stray = [k for k, o in zip(keys, owners(via, keys)) if o != n]
        if stray:
            problems.append(f"{len(stray)} keys on {n}, which does not own them: {stray[:5]}")
            for k in stray[:5]:
                if k.decode() in workload.lists:
                    held = read_list(s.client(socket_timeout=10), k.decode())
                    problems.append(f"  stray {k.decode()} on {n} holds {held[:5]}")
    # IDs: none issued twice.
    issued = defaultdict(list)
    for i, port, at in workload.ids:
        issued[i].append((port, at))
    twice = {i: by for i, by in issued.items() if len(by) > 1}
    if twice:
        problems.append(f"{len(twice)} IDs issued twice (the ID: (port, time) of each): "
                        f"{list(twice.items())[:5]}")
    problems += [f"read of {k} at {t[0]:.3f} via {via}: {p}"
                 for k, p, t, via, _ in workload.read_errors
                 if not excused((k, p, t, via, _), windows)]
    return problems


def latency_report(fleet):
    """The server's own latency monitor (`latency-monitor-threshold 5`) on every server at the
    end of the run: per event, the servers that recorded it and the longest hold in ms (since
    each server's last start: a restart clears its record). The module's main-thread steps
    report under `shard-*`, and their CPU time under `shard-*-cpu` (docs/development.md): a wall
    event without its `-cpu` twin waited for the CPU (the nemesis loads a 2-core machine with
    two dozen processes). Printed, not asserted: `make bench` measures it (bench/stall.py)."""
    events = {}
    for s in fleet.servers():
        try:
            latest = s.client(socket_timeout=2).execute_command("LATENCY", "LATEST")
        except (redis.RedisError, OSError):
            continue
        for name, _at, _last, worst, *_ in latest:
            name = name.decode() if isinstance(name, bytes) else name
            events.setdefault(name, []).append((int(worst), s.port))
    lines = []
    for name in sorted(events, key=lambda n: (not n.startswith("shard-"), n)):
        seen = sorted(events[name], reverse=True)
        lines.append(f"  {name}: worst {seen[0][0]} ms at :{seen[0][1]}, on {len(seen)} servers")
    return "latency events of 5 ms or more (LATENCY LATEST, every server):\n" + (
        "\n".join(lines) if lines else "  none")


def fleet_report(fleet):
    """Each server's role, rings and fleet plan, one line each: what a failure prints."""
    lines = []
    for s in fleet.servers():
        try:
            c = s.client(socket_timeout=2)
            ring = as_map(c.execute_command("SHARD.RING", "GET")) or {}
            previous = ring.get("previous") or {}
            plan = fleet_status(c) or {}
            lines.append(
                f"{fleet.shard_of(s)}:{s.port} {fleet.role(s)} ring {ring.get('digest')} "
                f"previous {previous.get('digest')} plan "
                + " ".join(f"{k}={plan.get(k)}" for k in
                           ("phase", "running", "error", "term", "lease") if k in plan))
        except (redis.RedisError, OSError) as e:
            lines.append(f"{fleet.shard_of(s)}:{s.port} unreachable: {e}")
    return "\n".join(lines)
