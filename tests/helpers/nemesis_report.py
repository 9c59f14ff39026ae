"""What a nemesis failure prints of the acknowledged list elements it lost (issue 33): for each
lost element, when it was sent and acknowledged and by which path (`SHARD.CALL` via which
server, or the cluster client to which address); grouped in episodes (lost elements less than
2 s apart), each with the faults and the servers' notable log lines (fleet steps, role changes,
loads) from 3 s before to 3 s after, and the acknowledged elements of the same list that were
kept meanwhile, by path, and the changes an `Observer` saw of each server's copy of the list
(read locally a few times a second with `SHARD.DUMP`, past the cluster protocol's redirects);
which server holds which copy of the list at the end, and in which servers' AOF files each
lost element was ever written (an AOF rewrite, a full sync's among them, drops what came
before it). Bad reads and elements out of order or twice get the same treatment.

Times are seconds since the run started, as the history prints them; a server's log lines are
placed by their wall-clock stamp, corrected by the clock offset the nemesis had set on that
server (tests/clockshim.c moves the log's stamps too).
"""

import re
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

import redis

from helpers.dump_list import list_elements, read_list

WINDOW = 3.0  # seconds either side of an episode
EPISODE_GAP = 2.0  # lost elements further apart start a new episode
# The log lines worth placing beside a lost element: the module's notices and the server's
# changes of role, syncs and loads.
NOTABLE = ("shard:", "MASTER MODE", "master mode", "Connecting to MASTER", "Connecting to PRIMARY",
           "MASTER <-> REPLICA sync: Finished", "PRIMARY <-> REPLICA sync: Finished",
           "Full resync", "Partial resynchronization", "DB loaded", "Ready to accept",
           "REPLICAOF", "SLAVE OF", "REPLICA OF", "Discarding previously cached",
           "Synchronization with replica", "Server initialized", "Before turning into a replica",
           "Setting secondary replication ID", "Connection with master lost",
           "Connection with primary lost", "Received SIGTERM", "would be")
LINE = re.compile(r"^(\d+):(\w) (\d+ \w+ \d+ \d+:\d+:\d+\.\d+) . (.*)$")


def log_events(fleet, history):
    """(time since the start, "n0:port M", text) of each notable line of every server's log."""
    out = []
    for s in fleet.servers():
        steps = fleet.clocks[s.port].steps
        label = f"{fleet.shard_of(s)}:{s.port}"
        for line in s.log().splitlines():
            m = LINE.match(line)
            if not m or not any(n in m.group(4) for n in NOTABLE):
                continue
            try:
                stamp = time.mktime(time.strptime(m.group(3).split(".")[0], "%d %b %Y %H:%M:%S"))
            except ValueError:
                continue
            stamp += float("0." + m.group(3).split(".")[1])
            real = _unshift(stamp, steps)
            out.append((round(real - history.wall_started, 3), f"{label} {m.group(2)}",
                        m.group(4)[:220]))
    out.sort()
    return out


def _unshift(stamp, steps):
    """The real time of a log stamp written with the offsets `steps` in force."""
    real = stamp
    for since, offset in steps:
        if stamp - offset / 1000 >= since:
            real = stamp - offset / 1000
    return real


def local_list(server, key):
    """The list as `server` holds it, read past the cluster protocol (`SHARD.DUMP`); the
    error's text when it cannot be read."""
    try:
        return read_list(server.client(socket_timeout=5), key)
    except (redis.RedisError, OSError, ValueError) as e:
        return f"unreadable: {e}"


class Observer:
    """Looks at every server's copy of every list a few times a second (its length and first
    element, read locally) and keeps the changes that tell a copy's life: a list appearing,
    vanishing, shrinking or starting with another element, and a server's role or
    reachability changing; `timeline(key)` prints them."""

    def __init__(self, fleet, history, keys, every=0.3):
        self.fleet, self.history, self.keys, self.every = fleet, history, list(keys), every
        self.stop = threading.Event()
        self.last = {}  # port -> (role, {key: (length, head)}) or "down"
        self.changes = []  # (t, label, key or None, text)
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self.thread.start()

    def finish(self):
        self.stop.set()
        self.thread.join(timeout=10)

    def _run(self):
        try:
            while not self.stop.is_set():
                for s in self.fleet.servers():
                    self._look(s)
                self.stop.wait(self.every)
        except Exception as e:  # a bug of the observer: said in the report, not fatal
            self.changes.append((0.0, "observer", None, f"stopped: {e!r}"))

    def _look(self, s):
        t = round(time.monotonic() - self.history.started, 3)
        label = f"{self.fleet.shard_of(s)}:{s.port}"
        try:
            p = s.client(socket_timeout=0.5, socket_connect_timeout=0.5).pipeline(
                transaction=False)
            p.execute_command("ROLE")
            for k in self.keys:
                p.execute_command("SHARD.DUMP", k)
            got = p.execute()
            role = got[0][0].decode()
            lists = {}
            for k, reply in zip(self.keys, got[1:]):
                elements = (list_elements(reply[0]) if reply else []) or []
                lists[k] = (len(elements), elements[0] if elements else "")
        except (redis.RedisError, OSError, ValueError, IndexError, KeyError) as e:
            if self.last.get(s.port) != "down":
                self.changes.append((t, label, None, f"unreachable ({e})"[:120]))
            self.last[s.port] = "down"
            return
        before = self.last.get(s.port)
        if before is None or before == "down" or before[0] != role:
            self.changes.append((t, label, None, f"up, {role}"))
        old = {} if before in (None, "down") else before[1]
        for k, (n, head) in lists.items():
            was_n, was_head = old.get(k, (0, ""))
            if n == was_n and head == was_head:
                continue
            if was_n == 0 and n > 0:
                what = f"appears: {n} elements from {head}"
            elif n == 0 and was_n > 0:
                what = f"vanishes (had {was_n})"
            elif head != was_head:
                what = f"now {n} elements from {head} (was {was_n} from {was_head})"
            elif n < was_n:
                what = f"shrinks to {n} (was {was_n})"
            else:
                continue
            self.changes.append((t, label, k, what))
        self.last[s.port] = (role, lists)

    def timeline(self, key):
        """(t, label, text) of the changes of `key`'s copies and of the servers."""
        return [(t, label, text if k is None else f"{k} {text}")
                for t, label, k, text in self.changes if k in (None, key)]


def aof_holders(fleet, elements):
    """element -> the servers whose AOF files hold it (as written, anywhere in them)."""
    found = defaultdict(list)
    for s in fleet.servers():
        data = b""
        for f in sorted(Path(s.workdir).glob("appendonlydir/*")):
            try:
                data += f.read_bytes()
            except OSError:
                continue
        for e in elements:
            if f"\r\n{e}\r\n".encode() in data:
                found[e].append(f"{fleet.shard_of(s)}:{s.port}")
    return found


class Report:
    """What a failure prints beyond the problems' list: the lost elements (`lost`), the bad
    reads (`reads`) and the elements out of order or twice (`elements`), each with its own
    history and the faults, log lines and copies seen around it."""

    def __init__(self, fleet, workload, history, observer=None):
        self.fleet, self.workload, self.history, self.observer = \
            fleet, workload, history, observer
        nemesis = [(t, who, f"{what} {outcome} {detail}".strip())
                   for t, who, what, outcome, detail in history.events
                   if who in ("nemesis", "heal")]
        self.base = sorted(nemesis + log_events(fleet, history))
        # element -> the failure the writer recorded (its outcome's detail)
        self.failures = {}
        for t, who, what, outcome, detail in history.events:
            if what.startswith("RPUSH "):
                self.failures[what.rsplit(" ", 1)[1]] = f"{outcome} at {t:.3f}: {detail}"

    def events(self, key):
        """The faults, log lines and (if observed) the changes of `key`'s copies, in order."""
        seen = self.observer.timeline(key) if self.observer else []
        return sorted(self.base + [(t, f"{label} seen", text) for t, label, text in seen])

    def describe(self, e, aofs=None):
        key, outcome = self.workload.appends.get(e, ("?", "?"))
        began, answered, path = self.workload.sent.get(e, (0, 0, "?"))
        text = f"{e} ({key}, {outcome}): sent {began:.3f} answered {answered:.3f} {path}"
        if e in self.failures:
            text += f"; {self.failures[e]}"
        if aofs is not None:
            text += f"; RPUSHed in the AOF of {', '.join(aofs.get(e, [])) or 'no server'}"
        return text

    def all(self, via, problems, limit=6):
        """Every part that has something to say about `problems` (the checks' list)."""
        parts = [self.lost(lost_elements(self.fleet, self.workload, via), limit),
                 self.reads(limit), self.elements(problems)]
        return "\n".join(p for p in parts if p)

    def lost(self, lost, limit=6):
        """`lost` ({key: set of lost acknowledged elements}): each key's copies at the end,
        then the lost elements in episodes, each with what happened around it."""
        if not lost:
            return ""
        aofs = aof_holders(self.fleet, {e for es in lost.values() for e in es})
        lines = []
        for key, elements in sorted(lost.items()):
            lines.append(f"=== {key}: {len(elements)} acknowledged elements lost")
            for s in self.fleet.servers():
                held = local_list(s, key)
                what = held if isinstance(held, str) else (
                    f"{len(held)} elements, {len(elements & set(held))} of the lost ones"
                    + (f", from {held[0]}" if held else ""))
                lines.append(f"  at the end {self.fleet.shard_of(s)}:{s.port} "
                             f"({self.fleet.role(s)}): {what}")
            episodes = self._episodes(elements)
            for n, episode in enumerate(episodes[:limit]):
                lines += self._episode(key, episode, aofs)
            if len(episodes) > limit:
                lines.append(f"  ... {len(episodes) - limit} more episodes")
        return "\n".join(lines)

    def reads(self, limit=6):
        """The bad reads, by key in episodes (2 s apart), each with the acknowledged elements
        it lacked and what happened around its first read."""
        by_key = defaultdict(list)
        for key, problems, (began, answered), via, missing in self.workload.read_errors:
            by_key[key].append((began, answered, via, problems, missing))
        lines = []
        for key, reads in sorted(by_key.items()):
            episodes = []
            for r in sorted(reads):
                if episodes and r[0] - episodes[-1][-1][0] <= EPISODE_GAP:
                    episodes[-1].append(r)
                else:
                    episodes.append([r])
            lines.append(f"=== bad reads of {key}: {len(reads)} in {len(episodes)} episodes")
            for episode in episodes[:limit]:
                first, last = episode[0][0], episode[-1][1]
                vias = Counter(r[2] for r in episode)
                lines.append(f"  --- {len(episode)} bad reads {first:.3f} .. {last:.3f} via "
                             f"{dict(vias)}: first {episode[0][3]}")
                missing = sorted(set().union(*(set(r[4]) for r in episode)),
                                 key=lambda e: self.workload.sent.get(e, (0, 0))[1])
                for e in missing[:10]:
                    lines.append(f"    lacked {self.describe(e)}")
                if len(missing) > 10:
                    lines.append(f"    ... and {len(missing) - 10} more lacked")
                lines += self._window(key, first, last)
            if len(episodes) > limit:
                lines.append(f"  ... {len(episodes) - limit} more episodes")
        return "\n".join(lines)

    def elements(self, problems):
        """The elements `problems` name out of order or twice, each described."""
        names = set()
        for p in problems:
            if "out of order" in p or "twice" in p or "stray" in p:
                names.update(re.findall(r"w\d+-\d+", p))
        if not names:
            return ""
        return "\n".join(["=== elements out of order, twice, or stray"]
                         + [f"  {self.describe(e)}" for e in sorted(names)[:20]])

    def _episodes(self, elements):
        """Elements by acknowledgement time, split where they are EPISODE_GAP apart."""
        ordered = sorted(elements, key=lambda e: self.workload.sent[e][1])
        out = []
        for e in ordered:
            if out and self.workload.sent[e][1] - self.workload.sent[out[-1][-1]][1] \
                    <= EPISODE_GAP:
                out[-1].append(e)
            else:
                out.append([e])
        return out

    def _episode(self, key, episode, aofs):
        sent = self.workload.sent
        first, last = sent[episode[0]][1], sent[episode[-1]][1]
        lines = [f"  --- episode: {len(episode)} lost, acknowledged {first:.3f} .. {last:.3f}"]
        for e in episode[:25]:
            lines.append(f"    lost {self.describe(e, aofs)}")
        if len(episode) > 25:
            lines.append(f"    ... and {len(episode) - 25} more")
        kept = Counter(sent[e][2] for e, (k, o) in self.workload.appends.items()
                       if k == key and o == "ok" and e not in episode
                       and first - 1 <= sent[e][1] <= last + 1)
        lost_by = Counter(sent[e][2] for e in episode)
        lines.append(f"    lost by path: {dict(lost_by)}; kept (acknowledged ±1 s) by path: "
                     f"{dict(kept)}")
        return lines + self._window(key, first, last)

    def _window(self, key, first, last):
        return [f"    {t:9.3f} {who:>14} {text}" for t, who, text in self.events(key)
                if first - WINDOW <= t <= last + WINDOW]


def lost_elements(fleet, workload, via):
    """{key: the acknowledged elements missing from the list as `via` reads it}."""
    acked = defaultdict(set)
    for element, (key, outcome) in workload.appends.items():
        if outcome == "ok":
            acked[key].add(element)
    lost = {}
    for key in workload.lists:
        got = {e.decode() for e in via.execute_command("SHARD.CALL", "LRANGE", key, 0, -1)}
        if acked[key] - got:
            lost[key] = acked[key] - got
    return lost
