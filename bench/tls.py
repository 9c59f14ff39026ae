#!/usr/bin/env python3
"""The fleet over TLS (issue 23), side by side with the same fleet in plain TCP, in interleaved
rounds, as ratios.

Two fleets of three servers with the module (n0 n1 n2, a ketama ring of the three, KEYS keys
`key:...` each on its owner): one plain, one TLS-only (`--port 0 --tls-port P`, certificates of
a test CA made here with `openssl`, `tls-auth-clients yes`, the module's `tls yes` using the
server's own files). Rows:

- `SHARD.CALL GET` through n0 at `-P 1` and `-P 16` (redis-benchmark, `-c 50`; `--tls` on the
  TLS fleet): the issue's target is >= 0.8x the plain fleet;
- plain `GET` at n1 (what the server's own TLS costs a request, for reference);
- a resharding copy (`SHARD.RESHARD COPY` of COPY_KEYS keys from one server to a new one):
  keys per second, target >= 0.7x the plain copy;
- the handshake time of the module's connections (INFO `tls_handshake_avg_us`).

Each round runs the plain row and the TLS row next to each other, in one order in odd rounds
and the reverse in even ones. Writes the section "The fleet over TLS" into bench/results.md.
Standard library only.
"""

import argparse
import socket
import ssl
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fleet  # noqa: E402
import run as base  # noqa: E402

ROOT = base.ROOT
SECTION = "## The fleet over TLS (issue 23)"
KEYS = 20_000
COPY_KEYS = 200_000
CERTS = base.TMP / "tls"


def make_certs():
    """A CA and one certificate for 127.0.0.1 (server and client use), with openssl."""
    CERTS.mkdir(parents=True, exist_ok=True)
    ext = CERTS / "ext.cnf"
    ext.write_text("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n")

    def sh(*argv):
        subprocess.run(argv, check=True, capture_output=True, cwd=CERTS)

    sh("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key",
       "-out", "ca.crt", "-days", "30", "-subj", "/CN=bench-ca")
    sh("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "node.key", "-out",
       "node.csr", "-subj", "/CN=node")
    sh("openssl", "x509", "-req", "-in", "node.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
       "-CAcreateserial", "-out", "node.crt", "-days", "30", "-extfile", "ext.cnf")


def tls_files():
    return {k: str(CERTS / v) for k, v in
            (("cert", "node.crt"), ("key", "node.key"), ("ca", "ca.crt"))}


class TlsClient(base.Client):
    """base.Client over TLS."""

    def __init__(self, port):
        f = tls_files()
        ctx = ssl.create_default_context(cafile=f["ca"])
        ctx.load_cert_chain(f["cert"], f["key"])
        raw = socket.create_connection(("127.0.0.1", port))
        self.sock = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
        self.file = self.sock.makefile("rb")


class Server:
    """One server with the module, plain or TLS-only."""

    def __init__(self, name, tls, self_name=None):
        self.tls = tls
        self.port = base.free_port()
        log = base.TMP / f"tls-{name}.log"
        argv = [base.REDIS_SERVER, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", str(base.TMP), "--logfile", str(log), "--enable-debug-command", "yes"]
        if tls:
            f = tls_files()
            argv += ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file", f["cert"],
                     "--tls-key-file", f["key"], "--tls-ca-cert-file", f["ca"],
                     "--tls-auth-clients", "yes"]
        else:
            argv += ["--port", str(self.port)]
        argv += ["--loadmodule", str(base.MODULE), "self", self_name or name]
        if tls:
            argv += ["tls", "yes"]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        for _ in range(200):
            try:
                c = self.client()
                c.call("PING")
                c.close()
                return
            except (OSError, base.RedisError, ssl.SSLError):
                time.sleep(0.05)
        self.stop()
        sys.exit(f"server {name} did not start; see {log}")

    def client(self):
        return TlsClient(self.port) if self.tls else base.Client(self.port)

    stop = fleet.Proc.stop


def pipelined(c, commands):
    out = []
    for args in commands:
        out.append(b"*%d\r\n" % len(args))
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    c.sock.sendall(b"".join(out))
    return [c._read() for _ in commands]


def start_fleet(tls):
    servers = [Server(f"{'t' if tls else 'p'}{n}", tls, self_name=n) for n in fleet.NAMES]
    ring = []
    for n, s in zip(fleet.NAMES, servers):
        ring += [n, f"127.0.0.1:{s.port}", 1]
    for s in servers:
        c = s.client()
        c.call("SHARD.RING", "SET", "ketama", *ring)
        c.close()
    c = servers[0].client()
    for start in range(0, KEYS, 1000):
        pipelined(c, [("SHARD.CALL", "SET", f"key:{i}", "x" * 32)
                      for i in range(start, min(KEYS, start + 1000))])
    c.close()
    return servers


def benchmark(server, command, pipeline, n):
    argv = ["redis-benchmark", "-h", "127.0.0.1", "-p", str(server.port), "-c", "50",
            "-n", str(n), "-P", str(pipeline), "-r", str(KEYS), "--csv"]
    if server.tls:
        f = tls_files()
        argv += ["--tls", "--cacert", f["ca"], "--cert", f["cert"], "--key", f["key"]]
    out = subprocess.run(argv + command, capture_output=True, text=True, timeout=600)
    for line in out.stdout.splitlines()[1:]:
        cells = [c.strip('"') for c in line.split(",")]
        if len(cells) > 1:
            return float(cells[1])
    sys.exit(f"redis-benchmark failed: {out.stdout}{out.stderr}")


def copy_round(tls):
    """Keys per second of one `SHARD.RESHARD COPY` of COPY_KEYS keys to a new server."""
    a, b = Server("ca", tls, "a"), Server("cb", tls, "b")
    try:
        ca, cb = a.client(), b.client()
        ca.call("DEBUG", "POPULATE", COPY_KEYS, "key", 42)
        for c in (ca, cb):
            c.call("SHARD.RING", "SET", "ketama", "a", f"127.0.0.1:{a.port}", 1)
            c.call("SHARD.RING", "BEGIN", "ketama", "a", f"127.0.0.1:{a.port}", 1,
                   "b", f"127.0.0.1:{b.port}", 3)
        t0 = time.perf_counter()
        ca.call("SHARD.RESHARD", "COPY")
        while True:
            st = ca.call("SHARD.RESHARD", "STATUS")
            st = dict(zip(st[::2], st[1::2]))
            if st[b"state"] != b"copying":
                break
            time.sleep(0.01)
        seconds = time.perf_counter() - t0
        if st[b"state"] != b"done" or int(st[b"failed"]) != 0:
            sys.exit(f"copy failed: {st}")
        copied = int(st[b"copied"])
        handshake = int(ca.info("shard").get("shard_tls_handshake_avg_us", "0"))
        return copied / seconds, copied, handshake
    finally:
        a.stop()
        b.stop()


def ratio_row(label, plain, tls, target=None):
    p, t = statistics.median(plain), statistics.median(tls)
    verdict = "" if target is None else (" met" if t / p >= target else " **not met**")
    return (f"| {label} | {p:,.0f} | {t:,.0f} | {t / p:.2f}x"
            f"{'' if target is None else f' (target {target}x){verdict}'} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=200_000)
    ap.add_argument("--copy-rounds", type=int, default=3)
    ap.add_argument("--out", default=str(fleet.RESULTS))
    opts = ap.parse_args()
    base.TMP.mkdir(parents=True, exist_ok=True)
    make_certs()
    plain, tls = start_fleet(False), start_fleet(True)
    rows = {("call", 1): ([], []), ("call", 16): ([], []), ("get", 1): ([], []),
            ("get", 16): ([], [])}
    try:
        for r in range(opts.rounds):
            for (kind, p), (pl, tl) in rows.items():
                command = (["SHARD.CALL", "GET", "key:__rand_int__"] if kind == "call"
                           else ["GET", "key:__rand_int__"])
                fleets = [(plain, pl), (tls, tl)]
                if r % 2:
                    fleets.reverse()
                for servers, out in fleets:
                    target = servers[0] if kind == "call" else servers[1]
                    out.append(benchmark(target, command, p, opts.requests))
            print(f"round {r + 1}: " + ", ".join(
                f"{k}-P{p} {statistics.median(t) / statistics.median(pl):.2f}x"
                for (k, p), (pl, t) in rows.items()), flush=True)
        c = tls[0].client()
        info = c.info("shard")
        c.close()
        handshake_us = int(info.get("shard_tls_handshake_avg_us", "0"))
        handshakes = int(info.get("shard_tls_handshakes", "0"))
    finally:
        for s in plain + tls:
            s.stop()
    copies = ([], [])
    copy_handshakes = []
    for r in range(opts.copy_rounds):
        order = [(False, copies[0]), (True, copies[1])]
        if r % 2:
            order.reverse()
        for is_tls, out in order:
            rate, _, hs = copy_round(is_tls)
            out.append(rate)
            if is_tls and hs:
                copy_handshakes.append(hs)
        print(f"copy round {r + 1}: plain {copies[0][-1]:,.0f} keys/s, "
              f"TLS {copies[1][-1]:,.0f} keys/s", flush=True)
    lines = [SECTION, "",
             f"`make bench` (bench/tls.py): {opts.rounds} interleaved rounds of {opts.requests:,} "
             f"requests (`-c 50 -r {KEYS}`), {opts.copy_rounds} copy rounds of "
             f"{COPY_KEYS:,} keys; medians. TLS-only servers (`--port 0 --tls-port`, "
             "`tls-auth-clients yes`, RSA-2048 certificates of a test CA), the module's "
             "`shard.tls yes` with the server's files; redis-benchmark `--tls` on the TLS fleet. "
             f"Server: `{base.first_line([base.REDIS_SERVER, '--version'])}`.", "",
             "| row | plain | TLS | TLS / plain |", "|---|---:|---:|---:|",
             ratio_row("SHARD.CALL GET via n0, -P 1 (req/s)", *rows[("call", 1)], target=0.8),
             ratio_row("SHARD.CALL GET via n0, -P 16 (req/s)", *rows[("call", 16)], target=0.8),
             ratio_row("GET at n1, -P 1 (req/s; the server's own TLS)", *rows[("get", 1)]),
             ratio_row("GET at n1, -P 16 (req/s; the server's own TLS)", *rows[("get", 16)]),
             ratio_row("resharding copy (keys/s)", *copies, target=0.7),
             "",
             f"Handshake of a module connection (INFO `tls_handshake_avg_us`, TCP connect to "
             f"verified TLS 1.3 session, measured on the main thread's event loop): "
             f"{handshake_us} µs on n0 over {handshakes} connections; the copy child's "
             f"blocking handshakes: {', '.join(f'{h} µs' for h in copy_handshakes) or 'n/a'}.",
             ""]
    section = "\n".join(lines)
    print(section)
    fleet.write_section(Path(opts.out), SECTION, section)


if __name__ == "__main__":
    main()
