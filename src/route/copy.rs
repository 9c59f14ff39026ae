//! Copy-before-write: while a resharding moves a key, a write at its new owner first copies
//! it from the previous owner, never replacing a newer copy there. On a plain fleet the
//! previous owner runs `MIGRATE ... COPY` (one round trip from here); on a TLS fleet the copy
//! goes over the module's own verified connections (`SHARD.DUMP` there, `RESTORE` here), since
//! `MIGRATE` would connect from the server itself in clear. The copy job ships pipelined
//! `RESTORE`s instead (`reshard::ship`).

use std::future::Future;

use crate::net::endpoint::{Endpoint, StepError};
use crate::net::resp::Resp;
use crate::route::forward::NetSteps;

/// Copy-before-write on a TLS fleet: `SHARD.DUMP` at the previous owner, `RESTORE` (never
/// replacing) at the new one, both over the module's own verified TLS connections.
/// `MIGRATE` would connect from the server itself: in clear unless it has `tls-cluster
/// yes`, credentials included, and without checking the peer's name. (On a plain fleet
/// `MIGRATE` stays: one round trip from here instead of two.)
pub fn over_own_connections(
    steps: &NetSteps,
    from: &Endpoint,
    to: &Endpoint,
    key: &[u8],
) -> impl Future<Output = Result<(), StepError>> {
    let dump = steps.send(from, &[b"SHARD.DUMP".to_vec(), key.to_vec()]);
    let (from, to) = (from.clone(), to.clone());
    let key = key.to_vec();
    let steps = steps.clone();
    async move {
        let (payload, pttl) = match dump.await? {
            Resp::Array(items) => match items.as_slice() {
                [Resp::Bulk(payload), Resp::Int(pttl)] => (payload.clone(), *pttl),
                _ => return Err(StepError::new(&from, "SHARD.DUMP gave an unexpected reply")),
            },
            Resp::Null | Resp::NullArray => return Ok(()), // nothing to copy: the write makes it
            Resp::Error(e) => {
                return Err(StepError::new(
                    &from,
                    format!(
                        "reading the key to copy it to {} failed: {}",
                        to.name,
                        String::from_utf8_lossy(&e)
                    ),
                ))
            }
            _ => return Err(StepError::new(&from, "SHARD.DUMP gave an unexpected reply")),
        };
        let ttl = pttl.max(0).to_string().into_bytes();
        let restore = vec![b"RESTORE".to_vec(), key, ttl, payload];
        match steps.send(&to, &restore).await? {
            Resp::Error(e) if !e.starts_with(b"BUSYKEY") => Err(StepError::new(
                &to,
                format!(
                    "copying the key from {} failed: {}",
                    from.name,
                    String::from_utf8_lossy(&e)
                ),
            )),
            _ => Ok(()),
        }
    }
}

/// Copy-before-write on a plain fleet: `MIGRATE ... COPY` run by the previous owner.
pub fn with_migrate(
    steps: &NetSteps,
    from: &Endpoint,
    to: &Endpoint,
    key: &[u8],
) -> impl Future<Output = Result<(), StepError>> {
    let timeout_ms = u64::try_from(steps.link().timeout.as_millis()).unwrap_or(u64::MAX);
    let unknown = (to.port == 0).then(|| {
        StepError::new(
            to,
            "its address is not known yet from Sentinel: retry in a moment",
        )
    });
    let mut args = vec![b"MIGRATE".to_vec()];
    // MIGRATE reads the key in its connection's database, the call's: the copy goes into
    // the same database at the new owner.
    args.extend(migrate_args(
        &to.host,
        to.port,
        key,
        steps.link().db,
        timeout_ms,
        false,
        steps.link().auth.as_ref(),
    ));
    let reply = unknown.is_none().then(|| steps.send(from, &args));
    let (from, to_name) = (from.clone(), to.name.clone());
    async move {
        let Some(reply) = reply else {
            return Err(unknown.unwrap_or_else(|| StepError::new(&from, "no address")));
        };
        match reply.await? {
            Resp::Error(e) if !e.windows(7).any(|w| w == b"BUSYKEY") => Err(StepError::new(
                &from,
                format!(
                    "copying the key to {to_name} failed: {}",
                    String::from_utf8_lossy(&e)
                ),
            )),
            _ => Ok(()),
        }
    }
}

/// MIGRATE's arguments (without the command name) that copy `key` to database `db` of
/// `host:port`.
pub fn migrate_args(
    host: &str,
    port: u16,
    key: &[u8],
    db: u32,
    timeout_ms: u64,
    replace: bool,
    auth: Option<&(String, String)>,
) -> Vec<Vec<u8>> {
    let mut args = vec![
        host.as_bytes().to_vec(),
        port.to_string().into_bytes(),
        key.to_vec(),
        db.to_string().into_bytes(),
        timeout_ms.to_string().into_bytes(),
        b"COPY".to_vec(),
    ];
    if replace {
        args.push(b"REPLACE".to_vec());
    }
    match auth {
        Some((user, password)) if user.is_empty() => {
            args.extend([b"AUTH".to_vec(), password.as_bytes().to_vec()]);
        }
        Some((user, password)) => {
            args.extend([
                b"AUTH2".to_vec(),
                user.as_bytes().to_vec(),
                password.as_bytes().to_vec(),
            ]);
        }
        None => {}
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(args: &[Vec<u8>]) -> String {
        args.iter()
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn builds_copy_replace_and_auth() {
        assert_eq!(
            text(&migrate_args("h", 7, b"k", 0, 100, false, None)),
            "h 7 k 0 100 COPY"
        );
        let pw = (String::new(), "p".to_string());
        assert_eq!(
            text(&migrate_args("h", 7, b"k", 0, 100, true, Some(&pw))),
            "h 7 k 0 100 COPY REPLACE AUTH p"
        );
        let up = ("u".to_string(), "p".to_string());
        assert_eq!(
            text(&migrate_args("h", 7, b"k", 0, 1, false, Some(&up))),
            "h 7 k 0 1 COPY AUTH2 u p"
        );
        assert_eq!(
            text(&migrate_args("h", 7, b"k", 3, 100, false, None)),
            "h 7 k 3 100 COPY"
        );
    }
}
