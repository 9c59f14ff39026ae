"""The nemesis's network partitions (issue 44): every server and sentinel of the nemesis fleet
listens on a loopback address of its own (helpers.partition), and these faults cut them apart
with `nft` rules, one partition in force at a time (several cuts at once for the ring), mixed
with the nemesis's kills, pauses, failovers, clock steps and fleet operations:

- `cut_primary` (Jepsen's case): a shard's primary, as Sentinel names it, cut off from every
  other server (its replica among them) and from the sentinels; the test's clients reach both
  sides (they connect from 127.0.0.1, which no rule names), so some clients write through it
  and to it all along the cut;
- `cut_sentinels`: one sentinel cut off from the other two (a minority and a majority), and
  half the time a shard's primary on the minority's side (cut off from the majority sentinels
  and from every other server): the majority fails it over, the minority cannot;
- `cut_coordinator`: the coordinator of a grow or a shrink (started first if none runs) cut off
  from one node of the operation, in whatever phase it is then (noted);
- `cut_destination`: a destination of the running operation (the joining shard in a grow, a
  ring node in a shrink) cut off from every other server (not from its replica nor the
  sentinels) while its copies arrive;
- `cut_txn_owner`: a transaction held at its coordinator between PREPARE and COMMIT
  (`SHARD.DEBUG TXN-HOLD prepared`), an owner it prepared at cut off from the coordinator, then
  the hold released: the COMMIT (or ABORT) does not reach the owner until the heal;
- `cut_ring`: the shards' primaries in a ring, each reaching only its two neighbours;
- `cut_one_way`: the packets from a primary to one group dropped, the other way untouched:
  its replica, the coordinator, or two sentinels.

Each partition heals after a random time: mostly 1-6 s, one in four longer than every timeout
(`LONG_S`: past the fleet lease `shard.fleet-lease-ms`, the transaction lock
`shard.txn-lock-ms` and Sentinel's `down-after-milliseconds`). `windows` keeps, for each, when it
began and healed and which servers it hid from a majority of the sentinels (a primary there may
be failed over without knowing it: reads through it may be stale until it learns, which Redis
does not prevent; the checks allow those, and no other stale read).
"""

import threading
import time

import redis

from helpers.reshard import fleet_status
from helpers.sentinel import DOWN_AFTER_MS

FLEET_LEASE_MS = 3000  # the nemesis fleet's shard.fleet-lease-ms (test_nemesis)
TXN_LOCK_MS = 5000  # shard.txn-lock-ms's default
LONG_S = max(FLEET_LEASE_MS, TXN_LOCK_MS, DOWN_AFTER_MS) / 1000 + 1.0
# After a heal, how long a server the cut hid from the sentinels may still serve stale reads:
# until Sentinel has told it it is a replica (its INFO to a returning old primary) or the
# module's watcher has seen that Sentinel names another server (shard.topology-refresh-ms).
HEAL_GRACE_S = 12.0
KINDS = ("cut_primary", "cut_sentinels", "cut_coordinator", "cut_destination", "cut_txn_owner",
         "cut_ring", "cut_one_way")


class Window:
    """One partition: its kind, what it cut, when it began and healed (monotonic, and seconds
    since the history's start), and the ports of the servers it hid from the sentinels."""

    def __init__(self, kind, what, hidden, at):
        self.kind, self.what, self.hidden = kind, what, set(hidden)
        self.began, self.healed = at, None

    def excuses(self, port, began, answered):
        """Whether a stale read through `port` between `began` and `answered` falls in this
        partition's window for it (seconds since the history's start)."""
        end = (self.healed if self.healed is not None else float("inf")) + HEAL_GRACE_S
        return port in self.hidden and began < end and answered > self.began


class Partitions:
    """The partition faults of a `Nemesis` (its fleet, history, rng, workload and notes)."""

    def __init__(self, nemesis, partition, workload):
        self.n, self.partition, self.workload = nemesis, partition, workload
        self.fleet, self.rng = nemesis.fleet, nemesis.rng
        self.current = None  # the Window in force
        self.ends = None  # monotonic time it heals
        self.windows = []

    def actions(self):
        return [getattr(self, k) for k in KINDS]

    def surely(self, kind, long, tries=3):
        """The partition `kind` (a name of KINDS) for `long`, tried again (1 s apart) while it
        is skipped (no primary to choose, no transaction held): a fixed schedule's each kind
        lands. An action, named as the kind."""
        def action():
            for _ in range(tries):
                try:
                    getattr(self, kind)(long=long)
                except (redis.RedisError, OSError, IndexError, StopIteration) as e:
                    self.n.history.add("nemesis", kind, "error", repr(e))
                if self.current is not None and self.current.kind == kind:
                    return
                time.sleep(1)
        action.__name__ = kind
        return action

    def _now(self):
        return round(time.monotonic() - self.n.history.started, 3)

    def _label(self, s):
        return f"{self.fleet.shard_of(s)}:{s.port}" if hasattr(s, "proc") and \
            s in self.fleet.servers() else f"sentinel:{s.port}"

    def _owning(self):
        """The primaries of the shards that hold keys now: the ring's, and the joining one once
        a grow started."""
        names = [*self.fleet.ring_names, *([self.fleet.shards[-1]] if self.n.grown else [])]
        return [p for p in self._primaries() if self.fleet.shard_of(p) in names]

    def _primaries(self, down_too=False):
        """The primary Sentinel names for each shard (those up, or all)."""
        out = []
        for n in self.fleet.shards:
            try:
                p = self.fleet.primary(n)
            except StopIteration:
                continue
            if down_too or p.port not in self.fleet.down:
                out.append(p)
        return out

    def _begin(self, kind, what, hidden=(), long=None):
        """`long`: True, past every timeout; a number, that many seconds; None: at random."""
        long = self.rng.random() < 0.25 if long is None else long
        if long is True:
            seconds = self.rng.uniform(LONG_S, LONG_S + 3)
        elif long is False:
            seconds = self.rng.uniform(1, 6)
        else:
            seconds, long = float(long), float(long) > LONG_S
        self.current = Window(kind, what, hidden, self._now())
        self.windows.append(self.current)
        self.ends = time.monotonic() + seconds
        self.n._note(f"{kind} for {seconds:.1f} s{' (past every timeout)' if long else ''}: "
                     f"{what}")

    def _make_room(self):
        """Heals the partition in force, if any, before a new one."""
        if self.current is not None:
            self.heal()

    def heal_due(self):
        if self.current is not None and time.monotonic() >= self.ends:
            self.heal()

    def heal(self):
        if self.current is None:
            return
        self.partition.heal()
        self.current.healed = self._now()
        self.n._note(f"heal {self.current.kind}")
        self.current = None

    # --- the kinds ---------------------------------------------------------------------------

    def cut_primary(self, long=None):
        self._make_room()
        p = self.rng.choice(self._owning())
        others = [s for s in self.fleet.servers() if s is not p]
        self.partition.cut(p, [*others, *self.fleet.sentinels])
        self._begin("cut_primary", f"{self._label(p)} from every server and sentinel",
                    [p.port], long)

    def cut_sentinels(self, long=None):
        self._make_room()
        minority = self.rng.choice(self.fleet.sentinels)
        majority = [s for s in self.fleet.sentinels if s is not minority]
        self.partition.cut(minority, majority)
        what = f"sentinel:{minority.port} from the other two"
        hidden = []
        if self.rng.random() < 0.5:
            p = self.rng.choice(self._owning())
            others = [s for s in self.fleet.servers() if s is not p]
            self.partition.cut(p, [*others, *majority])
            what += f", with {self._label(p)} on its side"
            hidden = [p.port]
        self._begin("cut_sentinels", what, hidden, long)

    def _operation(self):
        """The coordinator of a running grow or shrink and its plan; starts one when none
        runs."""
        c = self.n.coordinator
        st = None
        if c is not None and c.port not in self.fleet.down:
            try:
                st = fleet_status(c.client(socket_timeout=2))
            except (redis.RedisError, OSError):
                st = None
        if st is None or st["phase"] in (b"done", b"cancelled"):
            self.n.reshard()
            c = self.n.coordinator
            if c is None:
                return None, None
            try:
                st = fleet_status(c.client(socket_timeout=2))
            except (redis.RedisError, OSError):
                return None, None
            if st is None:  # no plan there (the START refused, or already forgotten)
                return None, None
        return c, st

    def cut_coordinator(self, long=None):
        self._make_room()
        c, st = self._operation()
        if c is None:
            return
        others = [p for p in self._primaries() if p is not c]
        q = self.rng.choice(others)
        self.partition.cut(c, q)
        self._begin("cut_coordinator", f"the coordinator {self._label(c)} from {self._label(q)} "
                    f"in phase {st['phase'].decode()}", (), long)

    def cut_destination(self, long=None):
        self._make_room()
        c, st = self._operation()
        if c is None:
            return
        joining = self.fleet.shards[-1]
        # A grow's destination is the joining shard; a shrink's, the nodes that stay.
        names = [joining] if self.n.grown else list(self.fleet.ring_names)
        d = self.fleet.primary(self.rng.choice(names))
        others = [s for s in self.fleet.servers()
                  if s is not d and self.fleet.shard_of(s) != self.fleet.shard_of(d)]
        self.partition.cut(d, others)
        self._begin("cut_destination", f"{self._label(d)} from every other shard's servers "
                    f"in phase {st['phase'].decode()}", (), long)

    def cut_txn_owner(self, long=None):
        self._make_room()
        primaries = self._primaries()
        ring = [p for p in primaries if self.fleet.shard_of(p) in self.fleet.ring_names]
        if len(ring) < 3:
            self.n._note(f"cut_txn_owner skipped: {len(ring)} primaries of the ring up")
            return
        c = self.rng.choice(ring)
        # Two keys of owners other than the coordinator, apart (the ring of its own node).
        cc = c.client(socket_timeout=30)
        by_owner = {}
        for k in self.workload.tx_lists:
            try:
                by_owner.setdefault(cc.execute_command("SHARD.WHEREIS", k).decode(), k)
            except redis.RedisError:
                return
        owners = [o for o in by_owner if o != self.fleet.shard_of(c)]
        if len(owners) < 2:
            self.n._note("cut_txn_owner skipped: the tx lists have fewer than two other owners")
            return
        a, b = self.rng.sample(owners, 2)
        keys = (by_owner[a], by_owner[b])
        q = self.fleet.primary(a)
        cc.execute_command("SHARD.DEBUG", "TXN-HOLD", "prepared")
        tid = f"h{len(self.windows)}"
        done = threading.Thread(target=self.workload.transact,
                                args=(cc, self.rng, tid, keys), daemon=True)
        done.start()
        hold = c.client(socket_timeout=5)
        try:
            end = time.monotonic() + 5
            while hold.execute_command("SHARD.DEBUG", "TXN-HOLD", "HELD") < 1:
                if time.monotonic() > end:
                    self.n._note(f"cut_txn_owner: no transaction held at {self._label(c)}")
                    return
                time.sleep(0.02)
            self.partition.cut(c, q)
            self._begin("cut_txn_owner", f"{tid} ({keys[0]} at {a}, {keys[1]} at {b}) held "
                        f"prepared at {self._label(c)}; {self._label(q)} cut off from it",
                        (), long)
        finally:
            hold.execute_command("SHARD.DEBUG", "TXN-HOLD", "OFF")

    def cut_ring(self, long=None):
        self._make_room()
        # Down ones too (a server restarted meanwhile comes back into the ring).
        ring = self._primaries(down_too=True)
        self.rng.shuffle(ring)
        if len(ring) < 4:
            self.n._note(f"cut_ring skipped: {len(ring)} primaries named")
            return
        for i, p in enumerate(ring):
            far = [q for j, q in enumerate(ring)
                   if j > i and (j - i) % len(ring) not in (1, len(ring) - 1)]
            if far:
                self.partition.cut(p, far)
        self._begin("cut_ring", " - ".join(self._label(p) for p in ring) + " (a ring)", (),
                    long)

    def cut_one_way(self, long=None):
        self._make_room()
        p = self.rng.choice(self._primaries())
        n = self.fleet.shard_of(p)
        replica = next(s for s in (self.fleet.primaries[n], self.fleet.replicas[n]) if s is not p)
        choices = [("its replica", [replica], []),
                   ("two sentinels", self.rng.sample(self.fleet.sentinels, 2), [p.port])]
        c = self.n.coordinator
        if c is not None and c is not p and c.port not in self.fleet.down:
            choices.append(("the coordinator", [c], []))
        name, dst, hidden = self.rng.choice(choices)
        self.partition.cut_one_way(p, dst)
        self._begin("cut_one_way", f"{self._label(p)} -> {name} "
                    f"({', '.join(self._label(d) for d in dst)}) dropped, not back", hidden,
                    long)
