//! What Redis Sentinel and a primary's `ROLE` say, read into addresses: the pure part of
//! following failovers (`watch_loop` asks, `nodes` keeps the answers).
//!
//! - `SENTINEL get-master-addr-by-name <name>`: `[ip, port]`, or a null when the sentinel does
//!   not monitor that name.
//! - `SENTINEL replicas <name>`: one field/value list per replica (`ip`, `port`, `flags`,
//!   `master-link-status`, ...); a replica whose flags say it is down or disconnected, or whose
//!   link to its primary is not `ok`, is left out (it would answer stale data or nothing).
//! - A `+switch-master` message: `<name> <old-ip> <old-port> <new-ip> <new-port>`.
//! - `ROLE` on a primary: `["master", offset, [[ip, port, offset], ...]]`.

use crate::net::resp::Resp;
use crate::ring::NodeSpec;

/// `host:port`, with brackets around an IPv6 host.
pub fn join_address(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// A host and a port as Sentinel or `ROLE` give them (texts), as an address.
fn address_of(host: &[u8], port: &[u8]) -> Option<String> {
    let host = std::str::from_utf8(host).ok()?;
    let port: u16 = std::str::from_utf8(port).ok()?.parse().ok()?;
    (!host.is_empty() && port != 0).then(|| join_address(host, port))
}

/// The addresses of `shard.sentinels` (`host:port` separated by spaces), checked.
pub fn parse_sentinels(text: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for word in text.split_whitespace() {
        match NodeSpec::parse(b"sentinel", word.as_bytes(), b"1") {
            Ok(n) if !n.via_sentinel() => out.push(n.address),
            Ok(_) => return Err("shard.sentinels: give each sentinel as host:port".into()),
            Err(e) => {
                return Err(format!(
                    "shard.sentinels: '{word}' is not host:port ({})",
                    e.to_string().rsplit(": ").next().unwrap_or("invalid")
                ))
            }
        }
    }
    Ok(out)
}

/// What a sentinel said of a master: its address, `None` when it does not know the name, or
/// the error it replied.
pub fn master_address(reply: &Resp) -> Result<Option<String>, String> {
    match reply {
        Resp::Null | Resp::NullArray => Ok(None),
        Resp::Array(items) => match items.as_slice() {
            [Resp::Bulk(host), Resp::Bulk(port)] => address_of(host, port)
                .map(Some)
                .ok_or_else(|| "an address that does not parse".to_string()),
            _ => Err("an unexpected reply".into()),
        },
        Resp::Error(e) => Err(String::from_utf8_lossy(e).into_owned()),
        _ => Err("an unexpected reply".into()),
    }
}

/// The field/value pairs of one replica's description (an array in RESP2, a map in RESP3).
fn fields(entry: &Resp) -> Vec<(&[u8], &[u8])> {
    fn bulk(r: &Resp) -> Option<&[u8]> {
        match r {
            Resp::Bulk(b) | Resp::Simple(b) => Some(b.as_slice()),
            _ => None,
        }
    }
    match entry {
        Resp::Array(items) => items
            .chunks_exact(2)
            .filter_map(|kv| Some((bulk(&kv[0])?, bulk(&kv[1])?)))
            .collect(),
        Resp::Map(pairs) => pairs
            .iter()
            .filter_map(|(k, v)| Some((bulk(k)?, bulk(v)?)))
            .collect(),
        _ => Vec::new(),
    }
}

/// Whether a replica's `flags` (from `SENTINEL replicas`) say Sentinel holds it down or
/// disconnected.
fn is_down(flags: Option<&[u8]>) -> bool {
    flags.is_some_and(|flags| {
        flags
            .split(|&b| b == b',')
            .any(|w| matches!(w, b"s_down" | b"o_down" | b"disconnected"))
    })
}

/// The replicas of a master that can serve reads, from `SENTINEL replicas <name>`.
pub fn sentinel_replicas(reply: &Resp) -> Result<Vec<String>, String> {
    let entries = match reply {
        Resp::Array(items) | Resp::Set(items) => items,
        Resp::Error(e) => return Err(String::from_utf8_lossy(e).into_owned()),
        _ => return Err("an unexpected reply".into()),
    };
    let mut out = Vec::new();
    for entry in entries {
        let f = fields(entry);
        let get = |name: &str| f.iter().find(|(k, _)| *k == name.as_bytes()).map(|kv| kv.1);
        let down = is_down(get("flags"));
        let linked = get("master-link-status").is_none_or(|s| s == b"ok");
        if down || !linked {
            continue;
        }
        if let (Some(host), Some(port)) = (get("ip"), get("port")) {
            if let Some(a) = address_of(host, port) {
                out.push(a);
            }
        }
    }
    Ok(out)
}

/// How many replicas of `SENTINEL replicas <name>` Sentinel could promote: those not down or
/// disconnected and not of priority 0, linked to their primary or not (an old primary
/// Sentinel has not turned into a replica yet, a replica that lost its link: either may be
/// promoted with nothing of what its primary acknowledged since). Not an error: 0.
pub fn promotable_replicas(reply: &Resp) -> usize {
    count_replicas(reply, false)
}

/// How many replicas of `SENTINEL replicas <name>` Sentinel may ever promote: those not of
/// priority 0, down ones too. A replica that is down now comes back from its own AOF with
/// what it had when it stopped, and Sentinel may promote it before it has synced (it reports
/// itself a primary at first, or a link down since never), so data that reached the primary
/// alone since (a resharding's copies: `reshard::fleet::landed`) is gone when it does.
pub fn replicas_it_may_promote(reply: &Resp) -> usize {
    count_replicas(reply, true)
}

/// The replicas of a `SENTINEL replicas` reply not of priority 0, and not down unless `down`.
fn count_replicas(reply: &Resp, down: bool) -> usize {
    let (Resp::Array(entries) | Resp::Set(entries)) = reply else {
        return 0;
    };
    entries
        .iter()
        .filter(|entry| {
            let f = fields(entry);
            let get = |name: &str| f.iter().find(|(k, _)| *k == name.as_bytes()).map(|kv| kv.1);
            let never = get("slave-priority").or_else(|| get("replica-priority")) == Some(b"0");
            !never && (down || !is_down(get("flags")))
        })
        .count()
}

/// The replicas a primary reports in `ROLE`; an error when the node is not a primary.
pub fn role_replicas(reply: &Resp) -> Result<Vec<String>, String> {
    let items = match reply {
        Resp::Array(items) => items,
        Resp::Error(e) => return Err(String::from_utf8_lossy(e).into_owned()),
        _ => return Err("an unexpected reply to ROLE".into()),
    };
    match items.as_slice() {
        [Resp::Bulk(role), _, Resp::Array(replicas)] if role == b"master" => Ok(replicas
            .iter()
            .filter_map(|r| match r {
                Resp::Array(r) => match r.as_slice() {
                    [Resp::Bulk(host), Resp::Bulk(port), ..] => address_of(host, port),
                    _ => None,
                },
                _ => None,
            })
            .collect()),
        [Resp::Bulk(role), ..] => Err(format!(
            "it is a {}, not a primary",
            String::from_utf8_lossy(role)
        )),
        _ => Err("an unexpected reply to ROLE".into()),
    }
}

/// A `+switch-master` message's master name and new address.
pub fn switch_master(payload: &[u8]) -> Option<(String, String)> {
    let text = std::str::from_utf8(payload).ok()?;
    let words: Vec<&str> = text.split_whitespace().collect();
    match words.as_slice() {
        [name, _, _, host, port] => Some((
            name.to_string(),
            address_of(host.as_bytes(), port.as_bytes())?,
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Resp {
        Resp::Bulk(s.as_bytes().to_vec())
    }

    #[test]
    fn sentinels_parse_or_say_which_is_wrong() {
        assert_eq!(
            parse_sentinels(" 127.0.0.1:26379  [::1]:26380 ").unwrap(),
            vec!["127.0.0.1:26379", "[::1]:26380"]
        );
        assert!(parse_sentinels("").unwrap().is_empty());
        let e = parse_sentinels("127.0.0.1:26379 nope").unwrap_err();
        assert!(e.contains("'nope'"), "{e}");
        assert!(parse_sentinels("sentinel").is_err());
        assert!(parse_sentinels("h:0").is_err());
    }

    #[test]
    fn a_master_address_or_none() {
        let r = Resp::Array(vec![bulk("127.0.0.1"), bulk("6380")]);
        assert_eq!(
            master_address(&r).unwrap().as_deref(),
            Some("127.0.0.1:6380")
        );
        let r = Resp::Array(vec![bulk("::1"), bulk("6380")]);
        assert_eq!(master_address(&r).unwrap().as_deref(), Some("[::1]:6380"));
        assert_eq!(master_address(&Resp::NullArray).unwrap(), None);
        assert_eq!(master_address(&Resp::Null).unwrap(), None);
        assert!(master_address(&Resp::Array(vec![bulk("h"), bulk("x")])).is_err());
        let e = master_address(&Resp::Error(b"NOAUTH Authentication required.".to_vec()));
        assert_eq!(e.unwrap_err(), "NOAUTH Authentication required.");
    }

    fn replica(ip: &str, port: &str, flags: &str, link: &str) -> Resp {
        Resp::Array(
            [
                ("name", "x"),
                ("ip", ip),
                ("port", port),
                ("flags", flags),
                ("master-link-status", link),
            ]
            .iter()
            .flat_map(|(k, v)| [bulk(k), bulk(v)])
            .collect(),
        )
    }

    #[test]
    fn replicas_that_are_down_or_unlinked_are_left_out() {
        let r = Resp::Array(vec![
            replica("127.0.0.1", "7001", "slave", "ok"),
            replica("127.0.0.1", "7002", "s_down,slave,disconnected", "err"),
            replica("127.0.0.1", "7003", "slave", "err"),
            replica("127.0.0.1", "7004", "slave,o_down", "ok"),
        ]);
        assert_eq!(sentinel_replicas(&r).unwrap(), vec!["127.0.0.1:7001"]);
        // An unlinked one may still be promoted; a down one not.
        assert_eq!(promotable_replicas(&r), 2);
        // Sentinel may promote a down one once it is back, before it has synced.
        assert_eq!(replicas_it_may_promote(&r), 4);
        let map = Resp::Array(vec![Resp::Map(vec![
            (bulk("ip"), bulk("10.0.0.1")),
            (bulk("port"), bulk("7005")),
            (bulk("flags"), bulk("slave")),
        ])]);
        assert_eq!(sentinel_replicas(&map).unwrap(), vec!["10.0.0.1:7005"]);
        assert!(sentinel_replicas(&Resp::Error(b"ERR No such master".to_vec())).is_err());
    }

    #[test]
    fn role_of_a_primary_and_of_a_replica() {
        let r = Resp::Array(vec![
            bulk("master"),
            Resp::Int(100),
            Resp::Array(vec![
                Resp::Array(vec![bulk("127.0.0.1"), bulk("7001"), bulk("100")]),
                Resp::Array(vec![bulk("127.0.0.1"), bulk("bad"), bulk("100")]),
            ]),
        ]);
        assert_eq!(role_replicas(&r).unwrap(), vec!["127.0.0.1:7001"]);
        let r = Resp::Array(vec![bulk("slave"), bulk("127.0.0.1"), Resp::Int(7000)]);
        assert_eq!(
            role_replicas(&r).unwrap_err(),
            "it is a slave, not a primary"
        );
    }

    #[test]
    fn switch_master_messages() {
        assert_eq!(
            switch_master(b"n0 127.0.0.1 7000 127.0.0.1 7001"),
            Some(("n0".into(), "127.0.0.1:7001".into()))
        );
        assert_eq!(switch_master(b"n0 127.0.0.1 7000"), None);
        assert_eq!(switch_master(b"n0 a 1 b x"), None);
    }
}
