//! Why a TLS handshake with another server failed, in words that say what to fix (carried to
//! the caller inside an `io::Error`), and the handshake counters of INFO (handshakes, their
//! mean time, failures, the last failure). The configuration is `tls`'s.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use rustls::CertificateError;

/// Why a handshake failed, in words that say what to fix. `name` is the name the peer had to
/// carry.
pub fn explain(e: &rustls::Error, name: &str) -> String {
    use rustls::Error as E;
    let why = match e {
        E::InvalidCertificate(CertificateError::UnknownIssuer) => {
            "its certificate is not signed by a CA this node trusts \
             (shard.tls-ca-cert-file / shard.tls-ca-cert-dir)"
                .to_string()
        }
        E::InvalidCertificate(CertificateError::BadSignature) => {
            "its certificate is not signed by a CA this node trusts (a CA of the same name \
             signed it: shard.tls-ca-cert-file / shard.tls-ca-cert-dir)"
                .to_string()
        }
        E::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        ) => format!(
            "its certificate is not valid for {name} (the ring address's host, \
             or shard.tls-server-name)"
        ),
        E::InvalidCertificate(
            CertificateError::Expired | CertificateError::ExpiredContext { .. },
        ) => "its certificate has expired".to_string(),
        E::InvalidCertificate(
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. },
        ) => "its certificate is not valid yet".to_string(),
        E::InvalidCertificate(other) => format!("its certificate is refused: {other:?}"),
        E::InvalidMessage(_) | E::InappropriateMessage { .. } => {
            "it does not speak TLS (it answered with something else than a TLS record)".to_string()
        }
        E::AlertReceived(alert) => format!(
            "it refused the handshake ({alert:?}): does it trust this node's certificate \
             (shard.tls-cert-file)?"
        ),
        other => other.to_string(),
    };
    format!("TLS handshake failed: {why}")
}

/// A TLS failure carried inside an `io::Error` (its kind is `InvalidData`).
#[derive(Debug)]
pub struct TlsFailure(pub String);

impl fmt::Display for TlsFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TlsFailure {}

/// The TLS failure an I/O error stands for, if it is one.
pub fn failure(e: &std::io::Error) -> Option<&str> {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<TlsFailure>())
        .map(|f| f.0.as_str())
}

static HANDSHAKES: AtomicU64 = AtomicU64::new(0);
static HANDSHAKE_US: AtomicU64 = AtomicU64::new(0);
static FAILURES: AtomicU64 = AtomicU64::new(0);
static LAST_ERROR: Mutex<String> = Mutex::new(String::new());

/// Counts a finished handshake and what it took.
pub fn count_handshake(micros: u64) {
    HANDSHAKES.fetch_add(1, Ordering::Relaxed);
    HANDSHAKE_US.fetch_add(micros, Ordering::Relaxed);
}

/// Counts a refused node, and keeps why (for INFO). Never waits for the lock: the copy
/// child, a fork, may have inherited it held.
pub fn count_failure(why: &str) {
    FAILURES.fetch_add(1, Ordering::Relaxed);
    if let Ok(mut last) = LAST_ERROR.try_lock() {
        last.clear();
        last.push_str(why);
    }
}

/// INFO's view: handshakes done, their mean in microseconds, failures, the last failure.
pub fn stats() -> (u64, u64, u64, String) {
    let n = HANDSHAKES.load(Ordering::Relaxed);
    let us = HANDSHAKE_US.load(Ordering::Relaxed);
    let last = LAST_ERROR.try_lock().map(|s| s.clone()).unwrap_or_default();
    (
        n,
        us.checked_div(n).unwrap_or(0),
        FAILURES.load(Ordering::Relaxed),
        last,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explains_the_usual_failures() {
        let e = explain(
            &rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer),
            "127.0.0.1",
        );
        assert!(e.contains("not signed by a CA"), "{e}");
        let e = explain(
            &rustls::Error::InvalidCertificate(CertificateError::NotValidForName),
            "127.0.0.1",
        );
        assert!(e.contains("not valid for 127.0.0.1"), "{e}");
        let e = explain(
            &rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType),
            "h",
        );
        assert!(e.contains("does not speak TLS"), "{e}");
    }
}
