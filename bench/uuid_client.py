#!/usr/bin/env python3
"""What an application does without the module (issue 34's baseline): it draws a UUIDv7 with
`uuid6.uuid7()` in Python and writes it with SET, pipelined. bench/run.py runs this with the
project's .venv (which has uuid6) and compares its rate with SHARD.GENKEY's uuidv7.

    .venv/bin/python bench/uuid_client.py PORT N PIPELINE

Sends N `SET <uuid> 1` commands, PIPELINE at a time, over one connection (the RESP written by
hand: no client library's overhead), reads every reply, and prints the IDs written per second.
"""

import socket
import sys
import time

import uuid6


def main():
    port, n, depth = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    sock = socket.create_connection(("127.0.0.1", port))
    reader = sock.makefile("rb")
    start = time.perf_counter()
    sent = 0
    while sent < n:
        batch = min(depth, n - sent)
        out = []
        for _ in range(batch):
            key = str(uuid6.uuid7()).encode()
            out.append(b"*3\r\n$3\r\nSET\r\n$36\r\n%s\r\n$1\r\n1\r\n" % key)
        sock.sendall(b"".join(out))
        for _ in range(batch):
            line = reader.readline()
            if not line.startswith(b"+OK"):
                sys.exit(f"unexpected reply {line!r}")
        sent += batch
    elapsed = time.perf_counter() - start
    print(f"{n / elapsed:.0f}")


if __name__ == "__main__":
    main()
