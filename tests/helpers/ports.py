"""Loopback ports for everything the tests listen on: servers, sentinels, nutcracker, cluster
buses, TLS ports.

Binding port 0 and releasing the port (what a `free_port` usually does) lets two test processes
that run side by side (pytest-xdist workers, or the Redis and the Valkey suites at once) be given
the same port between the check and the server's own bind. So each test process claims a block
of ports of its own, below the kernel's ephemeral range (where outgoing connections and port-0
binds land), by holding an exclusive lock on a file named after the block for as long as it
lives; within its block it hands ports out in turn, each checked free by a bind. A port is then
only ever handed to one process, and within a process only once in a while (the block wraps
around), so a test may stop a server and start it again on the same port.

`RedisServer.start` (helpers.server) still retries on another port when the log says the port
was taken: a program outside the tests may hold it.
"""

import fcntl
import os
import socket
import tempfile
from pathlib import Path

BLOCK = 400
FIRST = 10000
LOCK_DIR = Path(tempfile.gettempdir()) / "shard-test-ports"


def _ephemeral_start():
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


class _Block:
    """The block of ports this process holds: `lock` keeps it, `next` is the next port to try."""

    def __init__(self):
        self.pid = None
        self.lock = None
        self.first = None
        self.next = None

    def claim(self):
        if self.pid == os.getpid():
            return
        LOCK_DIR.mkdir(parents=True, exist_ok=True)
        try:
            os.chmod(LOCK_DIR, 0o1777)  # the lock files are every user's, as the ports are
        except OSError:
            pass
        end = min(_ephemeral_start(), 65536 - 10000)
        for first in range(FIRST, end - BLOCK + 1, BLOCK):
            try:
                # Read-only: a lock file another user made can still be locked.
                fd = os.open(LOCK_DIR / f"{first}.lock", os.O_RDONLY | os.O_CREAT, 0o444)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            self.pid, self.lock, self.first, self.next = os.getpid(), fd, first, first
            return
        raise RuntimeError(f"every block of {BLOCK} ports from {FIRST} to {end} is held by "
                           f"another test process (lock files in {LOCK_DIR})")


_block = _Block()


def bindable(port):
    """Nothing listens on 127.0.0.1:`port` (SO_REUSEADDR, as the servers bind: connections in
    TIME_WAIT do not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def block_index():
    """Which block of ports this process holds (0, 1, ...): unique among the test processes
    alive, so it also names things of their own (helpers.partition's loopback addresses)."""
    _block.claim()
    return (_block.first - FIRST) // BLOCK


def free_port():
    """A port of this process's block that nothing listens on now."""
    _block.claim()
    for _ in range(BLOCK):
        port = _block.next
        _block.next = port + 1 if port + 1 < _block.first + BLOCK else _block.first
        if bindable(port):
            return port
    raise RuntimeError(f"no free port in {_block.first}..{_block.first + BLOCK - 1}")
