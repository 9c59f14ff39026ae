"""A silent peer: a plain TCP listener that accepts connections, keeps every byte each one
sends and never answers. It stands for an owner that does not answer (SHARD.CALL's timeout), or
checks what the module sends to a node that does not speak TLS (a ClientHello, nothing else).
"""

import selectors
import socket
import threading
import time


class Listener:
    """Listens on a port the kernel picks (so no other test process can be given it) until
    `close()` or, with `lifetime`, that many seconds at most."""

    def __init__(self, lifetime=None):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]
        self.lock = threading.Lock()
        self.buffers = []  # one bytearray per connection, in the order they came
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(lifetime,), daemon=True)
        self.thread.start()

    @property
    def accepted(self):
        with self.lock:
            return len(self.buffers)

    @property
    def received(self):
        """Every byte received, all connections together."""
        return b"".join(self.data())

    def data(self):
        """What each connection sent, one bytes per connection."""
        with self.lock:
            return [bytes(b) for b in self.buffers]

    def _run(self, lifetime):
        deadline = time.monotonic() + lifetime if lifetime else None
        sel = selectors.DefaultSelector()
        sel.register(self.sock, selectors.EVENT_READ)
        conns = []
        while not self.done.is_set() and (deadline is None or time.monotonic() < deadline):
            for key, _ in sel.select(timeout=0.05):
                if key.fileobj is self.sock:
                    conn, _ = self.sock.accept()
                    conn.setblocking(False)
                    buf = bytearray()
                    with self.lock:
                        self.buffers.append(buf)
                    conns.append(conn)
                    sel.register(conn, selectors.EVENT_READ, buf)
                    continue
                try:
                    data = key.fileobj.recv(65536)
                except OSError:
                    data = b""
                if data:
                    with self.lock:
                        key.data.extend(data)
                else:  # the peer closed it: keep what it sent
                    sel.unregister(key.fileobj)
        for c in conns:
            c.close()
        sel.close()
        self.sock.close()

    def close(self):
        self.done.set()
        self.thread.join(timeout=5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
