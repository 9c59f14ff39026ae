"""Network partitions between servers on one machine: every server and sentinel of a partition
test listens on a loopback address of its own, and a cut drops the packets between two groups
of addresses with `nft` rules (Debian's `nftables`; root).

How the nodes are told apart. Any 127.0.0.0/8 address is the machine's own, so a server can
listen on 127.1.0.2 and another on 127.1.0.3 without configuring anything. But a connection to
any 127.x address leaves from 127.0.0.1 unless its socket binds a source address: so each
server is started with `bind-source-addr` (its replication link leaves from its own address),
each sentinel too (its links to the servers and the other sentinels), and the module follows
the server's `bind-source-addr` for every connection it opens (src/net/source.rs: SHARD.CALL,
copies, the coordinator, the Sentinel watcher). A packet from server A to server B then has A's
address as source and B's as destination, in both directions of every connection, whichever
side opened it; `test_partition.py::test_cut_drops_packets_between_addresses_only` proves it,
and that a cut drops the module's and the replication's traffic and nothing else.

What a cut does. The rules drop matching packets in the `input` hook: a dropped packet vanishes
as on a broken link (the sender's TCP retransmits, then times out), instead of failing the
sender's write at once as a drop in `output` would (EPERM). The test's own clients connect from
127.0.0.1, which no rule names: the test sees both sides of a partition, as clients on either
side would.

Side by side. Each test process takes its addresses from a /16 of its own, 127.<1 + its port
block>.0.0 (helpers.ports: a block is held by one live process), so the rules of one test
process never touch another's servers; its rules live in a table of its own, `inet
shard_part_<pid>`, deleted when the `Partition` closes, at the interpreter's exit, and, when its
process is gone (a run killed), by the next `Partition` that starts.
"""

import atexit
import os
import re
import shutil
import subprocess
from contextlib import suppress

from helpers.ports import block_index

TABLE_PREFIX = "shard_part_"


class NftUnavailable(Exception):
    """nft cannot add rules here (not root, or no nf_tables in the kernel): the reason."""


def _nft(*args, script=None):
    done = subprocess.run(["nft", *args], input=script, capture_output=True, text=True,
                          timeout=10)
    if done.returncode != 0:
        raise RuntimeError(f"nft {' '.join(args)} failed ({done.returncode}): "
                           f"{done.stderr.strip()}\n{script or ''}")
    return done.stdout


def check_usable():
    """Raises NftUnavailable when nft truly cannot work here: not root, or a kernel without
    nf_tables. A missing `nft` program is not a reason (make deps installs `nftables`): that
    fails, so that a machine where it could work never skips the tests."""
    assert shutil.which("nft"), "nft is missing: `make deps` installs Debian's nftables"
    if os.geteuid() != 0:
        raise NftUnavailable("nft rules need root (run the tests as root)")
    probe = f"{TABLE_PREFIX}probe_{os.getpid()}"
    try:
        _nft("add", "table", "inet", probe)
    except RuntimeError as e:
        if re.search(r"Operation not permitted|Operation not supported|"
                     r"Protocol not supported|No such file or directory", str(e)):
            raise NftUnavailable(f"the kernel refuses nf_tables: {e}") from None
        raise
    _nft("delete", "table", "inet", probe)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_tables():
    """Deletes the tables of test processes that are gone (killed before they could); returns
    their names."""
    removed = []
    for name in re.findall(rf"^table inet ({TABLE_PREFIX}(?:probe_)?(\d+))$",
                           _nft("list", "tables"), re.M):
        table, pid = name
        if int(pid) != os.getpid() and not _alive(int(pid)):
            with suppress(RuntimeError):  # another process removed it meanwhile
                _nft("delete", "table", "inet", table)
                removed.append(table)
    return removed


class Addresses:
    """Loopback addresses of this test process's own: 127.<1 + port block>.0.2, .3, ..."""

    def __init__(self):
        self.prefix = f"127.{1 + block_index()}"
        self.n = 0

    def next(self):
        i, self.n = self.n, self.n + 1
        return f"{self.prefix}.{i // 250}.{i % 250 + 2}"


def _host(node):
    """The address of a server, a sentinel (their `host`) or an address given as text."""
    host = node if isinstance(node, str) else node.host
    assert host.startswith("127.") and host != "127.0.0.1", \
        f"{host}: partitions cut the nodes' own addresses only (helpers.partition.Addresses)"
    return host


def _group(nodes):
    if isinstance(nodes, str) or hasattr(nodes, "host"):
        nodes = [nodes]
    return [_host(n) for n in nodes]


class Partition:
    """The nft table of this test process: `cut`, `cut_one_way`, `heal`; a context manager
    that deletes the table when it closes (and at the interpreter's exit)."""

    def __init__(self):
        self.table = f"{TABLE_PREFIX}{os.getpid()}"
        self.rules = []  # (source, destination) pairs dropped now
        self.open = False

    def __enter__(self):
        check_usable()
        remove_stale_tables()
        with suppress(RuntimeError):  # left by this process (a test that ended badly)
            _nft("delete", "table", "inet", self.table)
        # Priority -200: before anything else that filters input.
        _nft("-f", "-", script=(
            f"table inet {self.table} {{\n"
            "  chain input { type filter hook input priority -200; policy accept; }\n"
            "}\n"))
        self.open = True
        atexit.register(self.close)
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        if self.open:
            self.open = False
            with suppress(RuntimeError):
                _nft("delete", "table", "inet", self.table)

    def _drop(self, pairs):
        pairs = [p for p in pairs if p not in self.rules]
        if not pairs:
            return
        _nft("-f", "-", script="".join(
            f"add rule inet {self.table} input ip saddr {s} ip daddr {d} drop\n"
            for s, d in pairs))
        self.rules += pairs

    def cut(self, a, b):
        """Drops every packet between a node of `a` and a node of `b` (servers, sentinels or
        addresses; one or a list), both ways."""
        self._drop([(x, y) for x in _group(a) for y in _group(b)]
                   + [(y, x) for x in _group(a) for y in _group(b)])

    def cut_one_way(self, src, dst):
        """Drops the packets from the nodes of `src` to those of `dst` only: TCP connections
        between them stall either way (one side's segments and acknowledgements are lost), a
        datagram from `dst` still reaches `src`."""
        self._drop([(x, y) for x in _group(src) for y in _group(dst)])

    def heal(self):
        """Removes every cut."""
        _nft("flush", "chain", "inet", self.table, "input")
        self.rules = []

    def listed(self):
        """The table's rules as nft lists them."""
        return _nft("list", "table", "inet", self.table)
