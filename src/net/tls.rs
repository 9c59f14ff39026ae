//! TLS toward other servers: the settings (`shard.tls*`, falling back to the server's own
//! `tls-*` files), the client configuration built from them and the one in force for new
//! connections. Why a handshake failed, in words an operator can act on, and the handshake
//! counters of INFO are `tls_failure`'s; the byte stream that uses it is `transport`.
//!
//! Why rustls (with the `ring` provider) and not the OpenSSL the server links:
//! - memory safety: the parser of everything a peer sends is Rust, in a process that holds
//!   the users' data; OpenSSL's C parsers are where its CVEs come from;
//! - nothing to install: `ring` compiles with the C compiler the CI machine has; the `openssl`
//!   crate needs `libssl-dev` and pkg-config at build time, and would share the server's
//!   library state (the server initialises and configures OpenSSL itself);
//! - its connection is a plain state machine (`read_tls`/`process_new_packets`/`write_tls`),
//!   which drops into the module's own non-blocking event-loop connections and the copy
//!   child's `poll` loop without callbacks or BIO plumbing;
//! - cost, measured (`bench/findings.md`, "Where a forwarded call's time goes over TLS"): a
//!   handshake with a Redis server (TLS 1.3, RSA-2048 certificates) takes 2.1 ms of wall time
//!   on the event loop, once per long-lived connection; in a profile of a node forwarding
//!   `-P 16` pipelines, rustls and ring are under 1 % of its samples (the server's own OpenSSL
//!   for its clients 14.5 %); the whole hop, syscalls included, about 1.7 µs per request at the
//!   forwarding node.
//!
//! What it does not do: encrypted private keys (`tls-key-file-pass`), certificate revocation
//! lists, and TLS 1.2 renegotiation. Peers are verified like a browser verifies a site: the
//! chain up to a configured CA, and the name (the ring address's host, an IP address matching
//! an IP subjectAltName, or `shard.tls-server-name`).

use std::cell::RefCell;
use std::fmt;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore};

/// The TLS settings as configured (`shard.tls-*`); empty means "the server's own".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert_file: String,
    pub key_file: String,
    pub ca_cert_file: String,
    pub ca_cert_dir: String,
    pub server_name: String,
}

/// The server's own `tls-*` settings the module's fall back to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerTls {
    pub cert_file: String,
    pub key_file: String,
    pub client_cert_file: String,
    pub client_key_file: String,
    pub ca_cert_file: String,
    pub ca_cert_dir: String,
}

impl ServerTls {
    /// The server settings this module reads, by name.
    pub const NAMES: [&'static str; 6] = [
        "tls-cert-file",
        "tls-key-file",
        "tls-client-cert-file",
        "tls-client-key-file",
        "tls-ca-cert-file",
        "tls-ca-cert-dir",
    ];

    /// Reads the settings with `get` (the server's `CONFIG GET`).
    pub fn read(get: impl Fn(&str) -> String) -> ServerTls {
        ServerTls {
            cert_file: get("tls-cert-file"),
            key_file: get("tls-key-file"),
            client_cert_file: get("tls-client-cert-file"),
            client_key_file: get("tls-client-key-file"),
            ca_cert_file: get("tls-ca-cert-file"),
            ca_cert_dir: get("tls-ca-cert-dir"),
        }
    }
}

/// Which file a setting names, and where the name came from (for errors).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Source {
    path: String,
    setting: &'static str,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.setting, self.path)
    }
}

fn pick(own: &str, own_name: &'static str, server: &[(&str, &'static str)]) -> Option<Source> {
    if !own.is_empty() {
        return Some(Source {
            path: own.to_string(),
            setting: own_name,
        });
    }
    server
        .iter()
        .find(|(path, _)| !path.is_empty())
        .map(|(path, setting)| Source {
            path: (*path).to_string(),
            setting,
        })
}

/// A client configuration ready for connections, and the name peers must carry when it is
/// not their address's host.
pub struct Tls {
    pub config: Arc<ClientConfig>,
    pub server_name: Option<ServerName<'static>>,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

impl Tls {
    /// The name a peer at `host` must carry.
    pub fn name_for(&self, host: &str) -> Result<ServerName<'static>, String> {
        if let Some(name) = &self.server_name {
            return Ok(name.clone());
        }
        ServerName::try_from(host.to_string())
            .map_err(|_| format!("'{host}' is neither an IP address nor a DNS name"))
    }
}

/// Checks one file setting on its own (`CONFIG SET`): readable, and holding what it should.
pub fn check_file(setting: &'static str, path: &str) -> Result<(), String> {
    if path.is_empty() {
        return Ok(());
    }
    let src = Source {
        path: path.to_string(),
        setting,
    };
    match setting {
        "shard.tls-cert-file" | "shard.tls-ca-cert-file" => certificates(&src).map(|_| ()),
        "shard.tls-key-file" => private_key(&src).map(|_| ()),
        "shard.tls-ca-cert-dir" => ca_dir(&src).map(|_| ()),
        _ => Ok(()),
    }
}

/// Checks `shard.tls-server-name`.
pub fn check_server_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Ok(());
    }
    ServerName::try_from(name.to_string())
        .map(|_| ())
        .map_err(|_| format!("shard.tls-server-name '{name}' is not a DNS name or an IP address"))
}

fn read_file(src: &Source) -> Result<Vec<u8>, String> {
    std::fs::read(&src.path).map_err(|e| format!("{src}: cannot read it: {e}"))
}

fn certificates(src: &Source) -> Result<Vec<CertificateDer<'static>>, String> {
    let bytes = read_file(src)?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{src}: not a PEM certificate file: {e}"))?;
    if certs.is_empty() {
        return Err(format!("{src}: holds no PEM certificate"));
    }
    Ok(certs)
}

fn private_key(src: &Source) -> Result<PrivateKeyDer<'static>, String> {
    let bytes = read_file(src)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| {
        format!("{src}: not an unencrypted PEM private key (PKCS#8, PKCS#1 or SEC1): {e}")
    })
}

fn ca_dir(src: &Source) -> Result<Vec<CertificateDer<'static>>, String> {
    let entries =
        std::fs::read_dir(&src.path).map_err(|e| format!("{src}: cannot read it: {e}"))?;
    let mut certs = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        if !path.is_file() {
            continue;
        }
        // OpenSSL's hashed directories also hold CRLs and other files: only certificates
        // count, and files that hold none are passed over.
        if let Ok(bytes) = std::fs::read(&path) {
            certs.extend(CertificateDer::pem_slice_iter(&bytes).flatten());
        }
    }
    if certs.is_empty() {
        return Err(format!("{src}: holds no PEM certificate"));
    }
    Ok(certs)
}

/// Why a configuration could not be built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildError {
    pub message: String,
    /// The settings do not fit together (no CA, a certificate without its key, a key that is
    /// not the certificate's), though each file reads: the setting that mends it may be next in
    /// the same `CONFIG SET`.
    pub combination: bool,
}

impl From<String> for BuildError {
    fn from(message: String) -> Self {
        BuildError {
            message,
            combination: false,
        }
    }
}

impl BuildError {
    fn combination(message: String) -> BuildError {
        BuildError {
            message,
            combination: true,
        }
    }
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// Builds the client configuration from the module's settings and the server's.
pub fn build(own: &TlsFiles, server: &ServerTls) -> Result<Tls, BuildError> {
    let ca_file = pick(
        &own.ca_cert_file,
        "shard.tls-ca-cert-file",
        &[(&server.ca_cert_file, "tls-ca-cert-file")],
    );
    let ca_dir_src = pick(
        &own.ca_cert_dir,
        "shard.tls-ca-cert-dir",
        &[(&server.ca_cert_dir, "tls-ca-cert-dir")],
    );
    if ca_file.is_none() && ca_dir_src.is_none() {
        return Err(BuildError::combination(
            "TLS needs a CA to verify the other servers: set shard.tls-ca-cert-file \
             (or shard.tls-ca-cert-dir), or the server's tls-ca-cert-file"
                .into(),
        ));
    }
    let mut roots = RootCertStore::empty();
    for src in ca_file.iter() {
        for cert in certificates(src)? {
            roots
                .add(cert)
                .map_err(|e| format!("{src}: a certificate cannot be used as a CA: {e}"))?;
        }
    }
    for src in ca_dir_src.iter() {
        let (added, _ignored) = roots.add_parsable_certificates(ca_dir(src)?);
        if added == 0 {
            return Err(format!("{src}: holds no certificate usable as a CA").into());
        }
    }
    let cert = pick(
        &own.cert_file,
        "shard.tls-cert-file",
        &[
            (&server.client_cert_file, "tls-client-cert-file"),
            (&server.cert_file, "tls-cert-file"),
        ],
    );
    let key = pick(
        &own.key_file,
        "shard.tls-key-file",
        &[
            (&server.client_key_file, "tls-client-key-file"),
            (&server.key_file, "tls-key-file"),
        ],
    );
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots);
    let config = match (cert, key) {
        (Some(cert), Some(key)) => {
            let chain = certificates(&cert)?;
            let pkey = private_key(&key)?;
            builder
                .with_client_auth_cert(chain, pkey)
                .map_err(|e| match e {
                    rustls::Error::InconsistentKeys(_) => BuildError {
                        message: format!(
                            "{key} is not the key of the certificate in {cert} \
                             (change both in one CONFIG SET)"
                        ),
                        combination: true,
                    },
                    e => format!("{cert} with {key}: {e}").into(),
                })?
        }
        (Some(cert), None) => {
            return Err(BuildError::combination(format!(
                "{cert} has no key: set shard.tls-key-file (or the server's tls-key-file)"
            )))
        }
        (None, Some(key)) => {
            return Err(BuildError::combination(format!(
                "{key} has no certificate: set shard.tls-cert-file (or the server's tls-cert-file)"
            )))
        }
        (None, None) => builder.with_no_client_auth(),
    };
    let server_name = if own.server_name.is_empty() {
        None
    } else {
        check_server_name(&own.server_name)?;
        ServerName::try_from(own.server_name.clone()).ok()
    };
    Ok(Tls {
        config: Arc::new(config),
        server_name,
    })
}

thread_local! {
    /// The configuration in force for new connections (`None`: plain TCP). The main thread's;
    /// the copy child, forked from it, reads its copy; the watcher thread gets it with its
    /// orders.
    static CURRENT: RefCell<Option<Arc<Tls>>> = const { RefCell::new(None) };
}

/// The TLS configuration new connections use, `None` for plain TCP.
pub fn current() -> Option<Arc<Tls>> {
    CURRENT.with(|c| c.borrow().clone())
}

/// Puts `tls` in force for new connections: a rotated certificate serves the connections made
/// from now on, while open ones keep theirs until they close; turning TLS on or off retires
/// the open connections of the other kind (`pool::retire_all`). Main thread only.
pub fn install(tls: Option<Arc<Tls>>) {
    let flipped = CURRENT.with(|c| {
        let mut current = c.borrow_mut();
        let flipped = current.is_some() != tls.is_some();
        *current = tls;
        flipped
    });
    if flipped {
        crate::net::pool::retire_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_settings_win_then_the_servers_client_then_server_files() {
        let server = ServerTls {
            cert_file: "/s.crt".into(),
            client_cert_file: "/c.crt".into(),
            ..Default::default()
        };
        let pick_cert = |own: &str| {
            pick(
                own,
                "shard.tls-cert-file",
                &[
                    (&server.client_cert_file, "tls-client-cert-file"),
                    (&server.cert_file, "tls-cert-file"),
                ],
            )
        };
        assert_eq!(
            pick_cert("/own.crt").map(|s| s.path),
            Some("/own.crt".into())
        );
        assert_eq!(
            pick_cert("").map(|s| s.to_string()),
            Some("tls-client-cert-file /c.crt".into())
        );
        assert_eq!(pick("", "x", &[("", "a"), ("", "b")]), None);
    }

    #[test]
    fn refuses_without_a_ca_and_names_unreadable_files() {
        let e = build(&TlsFiles::default(), &ServerTls::default())
            .unwrap_err()
            .message;
        assert!(e.contains("needs a CA"), "{e}");
        let own = TlsFiles {
            ca_cert_file: "/nonexistent/ca.crt".into(),
            ..Default::default()
        };
        let e = build(&own, &ServerTls::default()).unwrap_err().message;
        assert!(
            e.starts_with("shard.tls-ca-cert-file /nonexistent/ca.crt: cannot read it"),
            "{e}"
        );
        let e = check_file("shard.tls-key-file", "/nonexistent/k").unwrap_err();
        assert!(e.contains("/nonexistent/k"), "{e}");
    }

    #[test]
    fn a_file_that_is_not_pem_is_refused() {
        let dir = std::env::temp_dir().join(format!("shard-tls-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("junk.crt");
        std::fs::write(&path, b"not a certificate\n").unwrap();
        let p = path.to_str().unwrap();
        let e = check_file("shard.tls-cert-file", p).unwrap_err();
        assert!(e.contains(p) && e.contains("no PEM certificate"), "{e}");
        let e = check_file("shard.tls-key-file", p).unwrap_err();
        assert!(e.contains(p) && e.contains("private key"), "{e}");
        let e = check_file("shard.tls-ca-cert-dir", dir.to_str().unwrap()).unwrap_err();
        assert!(e.contains("holds no PEM certificate"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn server_names() {
        assert!(check_server_name("not a name!").is_err());
        assert!(check_server_name("redis.internal").is_ok());
        assert!(check_server_name("10.0.0.1").is_ok());
    }
}
