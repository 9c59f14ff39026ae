"""TLS for the tests: the certificates (made with Debian's `openssl` command once per test
process, by the `certs` fixture of tests/conftest.py) and the client arguments of a TLS server.

Every key is EC P-256 (PKCS#8 PEM, as `openssl genpkey` writes it): quick to make and to use.

| files | signed by | subjectAltName | use |
|---|---|---|---|
| `ca.crt`, `ca.key` | itself | | the fleet's CA |
| `other-ca.crt`, `other-ca.key` | itself | | an unrelated CA |
| `ca-b.crt`, `ca-b.key` | itself | | the CA of the rotated certificates |
| `ca-bundle.crt` | | | `ca.crt` and `ca-b.crt` in one file |
| `node.crt`, `node.key` | ca | IP:127.0.0.1 | every server (server and client use) |
| `client.crt`, `client.key` | ca | DNS:client | the tests' own clients |
| `wrong-host.crt`, `wrong-host.key` | ca | DNS:other.example | a server that names another host |
| `other-node.crt`, `other-node.key` | other-ca | IP:127.0.0.1 | a server of another CA |
| `node-b.crt`, `node-b.key` | ca-b | IP:127.0.0.1 | the second generation (rotation) |
"""

import secrets
import ssl
import subprocess
from pathlib import Path

CAS = ("ca", "other-ca", "ca-b")
# name -> (issuer, subject CN, subjectAltName, extendedKeyUsage)
LEAVES = {
    "node": ("ca", "node", "IP:127.0.0.1", "serverAuth,clientAuth"),
    "client": ("ca", "client", "DNS:client", "clientAuth"),
    "wrong-host": ("ca", "other.example", "DNS:other.example", "serverAuth,clientAuth"),
    "other-node": ("other-ca", "node", "IP:127.0.0.1", "serverAuth,clientAuth"),
    "node-b": ("ca-b", "node-b", "IP:127.0.0.1", "serverAuth,clientAuth"),
}


def _openssl(*args, cwd):
    out = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed: {out.stderr}")


def _key(directory, name):
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-out", f"{name}.key", cwd=directory)


def make_certs(directory):
    """Writes every file of the table above into `directory`; returns a `Certs`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for ca in CAS:
        _key(directory, ca)
        _openssl("req", "-x509", "-new", "-key", f"{ca}.key", "-subj", f"/CN=shard test {ca}",
                 "-days", "3650", "-set_serial", f"0x{secrets.token_hex(8)}",
                 "-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign",
                 "-out", f"{ca}.crt", cwd=directory)
    for name, (issuer, cn, san, eku) in LEAVES.items():
        _key(directory, name)
        _openssl("req", "-new", "-key", f"{name}.key", "-subj", f"/CN={cn}",
                 "-out", f"{name}.csr", cwd=directory)
        ext = directory / f"{name}.ext"
        ext.write_text("basicConstraints=critical,CA:FALSE\n"
                       "keyUsage=critical,digitalSignature\n"
                       f"extendedKeyUsage={eku}\n"
                       f"subjectAltName={san}\n"
                       "subjectKeyIdentifier=hash\n"
                       "authorityKeyIdentifier=keyid\n")
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{issuer}.crt",
                 "-CAkey", f"{issuer}.key", "-set_serial", f"0x{secrets.token_hex(8)}",
                 "-days", "365", "-extfile", ext.name, "-out", f"{name}.crt", cwd=directory)
    (directory / "ca-bundle.crt").write_text(
        (directory / "ca.crt").read_text() + (directory / "ca-b.crt").read_text())
    return Certs(directory)


class Certs:
    """The generated files: `certs.ca`, `certs.node_crt`, `certs.path("other-node.crt")`, ..."""

    def __init__(self, directory):
        self.dir = Path(directory)

    def path(self, name):
        p = self.dir / name
        assert p.exists(), p
        return str(p)

    def __getattr__(self, attr):  # node_crt -> node.crt, other_ca -> other-ca.crt
        if attr.startswith("_"):
            raise AttributeError(attr)
        stem, _, ext = attr.rpartition("_")
        if ext not in ("crt", "key"):
            stem, ext = attr, "crt"
        return self.path(f"{stem.replace('_', '-')}.{ext}")

    def server_tls(self, cert="node", ca="ca.crt", client_cert="client", client_ca=None,
                   auth_clients="yes"):
        """The `tls` of a RedisServer: the server presents `cert`.crt/.key and trusts `ca`; the
        tests' clients present `client_cert`.crt/.key and trust `client_ca` (default: the
        server's `ca`)."""
        return {
            "cert": self.path(f"{cert}.crt"), "key": self.path(f"{cert}.key"),
            "ca": self.path(ca), "auth_clients": auth_clients,
            "client_cert": self.path(f"{client_cert}.crt"),
            "client_key": self.path(f"{client_cert}.key"),
            "client_ca": self.path(client_ca or ca),
        }


def client_context(tls):
    """An ssl.SSLContext for a raw socket to a server of that `tls` (as its clients use)."""
    ctx = ssl.create_default_context(cafile=tls["client_ca"])
    ctx.load_cert_chain(tls["client_cert"], tls["client_key"])
    return ctx


def redis_py_tls_args(server):
    """The redis-py arguments (Redis, RedisCluster) for a client of `server`: none for a plain
    server, `ssl=True` and the files for a TLS-only one."""
    tls = getattr(server, "tls", None)
    if not tls:
        return {}
    return {"ssl": True, "ssl_ca_certs": tls["client_ca"], "ssl_certfile": tls["client_cert"],
            "ssl_keyfile": tls["client_key"]}


def cli_tls_args(server):
    """The `redis-cli` / `redis-benchmark` options for `server`: none for a plain server."""
    tls = getattr(server, "tls", None)
    if not tls:
        return []
    return ["--tls", "--cacert", tls["client_ca"], "--cert", tls["client_cert"],
            "--key", tls["client_key"]]
