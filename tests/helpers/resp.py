"""The wire, as the tests see it: `Raw`, a client that returns each reply as the exact bytes
the server sent (so that every reply type, error text and RESP2/RESP3 shape is compared, not
what a client library makes of it), SHARD.CALL's wrapping of commands, and the comparison of a
fleet's replies with a plain server's.
"""

import socket
import time

from helpers.tls import client_context


def encode(args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        if isinstance(a, str):
            a = a.encode()
        elif not isinstance(a, bytes):
            a = str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


class Raw:
    """One connection; `pipeline` sends commands in chunks and returns each reply's bytes."""

    def __init__(self, port, protocol=2, user=None, password=None, timeout=30, tls=None):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        if tls:  # a TLS-only server (its `RedisServer.tls`)
            self.sock = client_context(tls).wrap_socket(self.sock, server_hostname="127.0.0.1")
        self.buf = bytearray()
        if protocol == 3 or password:
            hello = ["HELLO", protocol]
            if password:
                hello += ["AUTH", user or "default", password]
            reply = self.execute(*hello)
            assert not reply.startswith(b"-"), reply

    def close(self):
        self.sock.close()

    def execute(self, *args):
        return self.pipeline([args])[0]

    def pipeline(self, commands, chunk=500):
        replies = []
        for i in range(0, len(commands), chunk):
            part = commands[i:i + chunk]
            self.sock.sendall(b"".join(encode(c) for c in part))
            replies += [self.read() for _ in part]
        return replies

    def _fill(self):
        data = self.sock.recv(1 << 20)
        if not data:
            raise ConnectionError("the server closed the connection")
        self.buf += data

    def _line(self):
        while (end := self.buf.find(b"\r\n")) < 0:
            self._fill()
        line = bytes(self.buf[:end + 2])
        del self.buf[:end + 2]
        return line

    def _exact(self, n):
        while len(self.buf) < n:
            self._fill()
        data = bytes(self.buf[:n])
        del self.buf[:n]
        return data

    def read(self):
        line = self._line()
        kind, n = line[:1], line[1:-2]
        if kind in b"$=!":
            return line if int(n) < 0 else line + self._exact(int(n) + 2)
        if kind in b"*~>":
            return line if int(n) < 0 else line + b"".join(self.read() for _ in range(int(n)))
        if kind == b"%":
            return line + b"".join(self.read() for _ in range(2 * int(n)))
        if kind == b"|":  # an attribute precedes the reply it describes
            return line + b"".join(self.read() for _ in range(2 * int(n))) + self.read()
        return line  # + - : _ , # (


def call_ops(ops):
    return [("SHARD.CALL", *op) for op in ops]


def differences(ops, got, want, ttl_slack=2):
    """The (op, got, want) whose replies differ; TTL replies may differ by `ttl_slack` s."""
    bad = []
    for op, g, w in zip(ops, got, want, strict=True):
        if g == w:
            continue
        name = op[0].upper() if isinstance(op[0], str) else op[0].decode().upper()
        if (name == "TTL" and g[:1] == w[:1] == b":" and int(g[1:-2]) >= 0
                and int(w[1:-2]) >= 0 and abs(int(g[1:-2]) - int(w[1:-2])) <= ttl_slack):
            continue
        bad.append((op, g, w))
    return bad


def assert_same_replies(ops, got, want, what, ttl_slack=2):
    """`ttl_slack`: what a TTL may differ by (s); more than 2 when a run took seconds (a TTL
    read in one run can be that much later after its EXPIRE than in the other)."""
    bad = differences(ops, got, want, ttl_slack)
    assert not bad, f"{what}: {len(bad)} of {len(ops)} replies differ from the plain server's, " \
                    f"first (op, shard.call, plain): {bad[:5]}"


def raw_reply(client, *args):
    """A redis-py client's reply as the server sent it, without redis-py's own post-processing
    of some replies (COMMAND INFO, COMMAND DOCS, ACL CAT)."""
    conn = client.connection_pool.get_connection(args[0])
    try:
        conn.send_command(*args)
        return conn.read_response()
    finally:
        client.connection_pool.release(conn)


def timed_pipeline(raw, ops):
    """`raw.pipeline(ops)` and the seconds it took."""
    started = time.monotonic()
    replies = raw.pipeline(ops)
    return replies, time.monotonic() - started
