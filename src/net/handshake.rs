//! What a new connection of the pool says before any request: `HELLO` (the RESP version and
//! the credentials), `SELECT db` for a database other than 0, and `SHARD.CLUSTER INTERNAL`;
//! which of their error replies refuse the connection, and in what words.

use crate::net::pool::Link;

/// The steps of a connection's handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Handshake {
    /// `HELLO` with the RESP version and the credentials.
    Hello,
    /// `SELECT db`, on a connection for a database other than 0.
    Select,
    /// `SHARD.CLUSTER INTERNAL`.
    Internal,
}

impl Handshake {
    /// Whether the step's error reply does not matter (`SHARD.CLUSTER INTERNAL` to a node of an
    /// older version); the other steps' errors refuse the connection, and requests wait for
    /// their replies.
    pub(super) fn tolerant(self) -> bool {
        self == Handshake::Internal
    }

    /// Why the connection is refused, when the step got the error reply `e`.
    pub(super) fn refused(self, db: u32, e: &[u8]) -> String {
        let e = String::from_utf8_lossy(e);
        match self {
            Handshake::Select if e.starts_with("NOAUTH") => {
                format!("cannot select database {db}: {e}: set shard.auth-password (and shard.auth-user)")
            }
            Handshake::Select => format!("cannot select database {db}: {e}"),
            Handshake::Hello | Handshake::Internal => format!("handshake refused: {e}"),
        }
    }
}

/// What a new connection says first: `HELLO` for RESP3 or credentials, then `SELECT db`
/// for a database other than 0 (an error of either refuses the connection), then
/// `SHARD.CLUSTER INTERNAL`, so that a node with the cluster protocol on never redirects
/// this module's own requests (an error there is ignored).
pub(super) fn steps(link: &Link) -> Vec<(Vec<Vec<u8>>, Handshake)> {
    let mut steps = Vec::new();
    if link.resp3 || link.auth.is_some() {
        let mut hello = vec![
            b"HELLO".to_vec(),
            if link.resp3 { b"3" } else { b"2" }.to_vec(),
        ];
        if let Some((user, password)) = &link.auth {
            let user = if user.is_empty() { "default" } else { user };
            hello.extend([
                b"AUTH".to_vec(),
                user.as_bytes().to_vec(),
                password.as_bytes().to_vec(),
            ]);
        }
        steps.push((hello, Handshake::Hello));
    }
    if link.db != 0 {
        let db = link.db.to_string().into_bytes();
        steps.push((vec![b"SELECT".to_vec(), db], Handshake::Select));
    }
    steps.push((
        vec![b"SHARD.CLUSTER".to_vec(), b"INTERNAL".to_vec()],
        Handshake::Internal,
    ));
    steps
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn link(resp3: bool, auth: bool, db: u32) -> Link {
        Link {
            timeout: Duration::from_millis(100),
            auth: auth.then(|| (String::new(), "pw".to_string())),
            resp3,
            db,
        }
    }

    fn words(link: &Link) -> Vec<(String, Handshake)> {
        steps(link)
            .into_iter()
            .map(|(args, step)| {
                let words: Vec<String> = args
                    .iter()
                    .map(|a| String::from_utf8_lossy(a).into_owned())
                    .collect();
                (words.join(" "), step)
            })
            .collect()
    }

    #[test]
    fn database_0_says_no_select() {
        assert_eq!(
            words(&link(false, false, 0)),
            [("SHARD.CLUSTER INTERNAL".into(), Handshake::Internal)]
        );
        assert_eq!(
            words(&link(true, true, 0)),
            [
                ("HELLO 3 AUTH default pw".into(), Handshake::Hello),
                ("SHARD.CLUSTER INTERNAL".into(), Handshake::Internal)
            ]
        );
    }

    #[test]
    fn other_databases_select_after_the_credentials_and_wait_for_it() {
        let got = words(&link(false, true, 15));
        assert_eq!(
            got,
            [
                ("HELLO 2 AUTH default pw".into(), Handshake::Hello),
                ("SELECT 15".into(), Handshake::Select),
                ("SHARD.CLUSTER INTERNAL".into(), Handshake::Internal)
            ]
        );
        assert!(!Handshake::Select.tolerant() && Handshake::Internal.tolerant());
        assert_eq!(
            words(&link(false, false, 3))[0],
            ("SELECT 3".into(), Handshake::Select)
        );
    }

    #[test]
    fn a_refused_select_names_the_database() {
        assert_eq!(
            Handshake::Select.refused(5, b"ERR DB index is out of range"),
            "cannot select database 5: ERR DB index is out of range"
        );
        assert!(Handshake::Select
            .refused(5, b"NOAUTH Authentication required.")
            .ends_with("set shard.auth-password (and shard.auth-user)"));
        assert_eq!(
            Handshake::Hello.refused(0, b"WRONGPASS no"),
            "handshake refused: WRONGPASS no"
        );
    }
}
