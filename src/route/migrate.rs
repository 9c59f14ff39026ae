//! The arguments of `MIGRATE host port key db timeout COPY [REPLACE] [AUTH ...]` for SHARD.CALL's
//! copy-before-write (the copy job ships pipelined `RESTORE`s instead: `ship`).

/// MIGRATE's arguments (without the command name) that copy `key` to database `db` of
/// `host:port`.
pub fn copy_args(
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
            text(&copy_args("h", 7, b"k", 0, 100, false, None)),
            "h 7 k 0 100 COPY"
        );
        let pw = (String::new(), "p".to_string());
        assert_eq!(
            text(&copy_args("h", 7, b"k", 0, 100, true, Some(&pw))),
            "h 7 k 0 100 COPY REPLACE AUTH p"
        );
        let up = ("u".to_string(), "p".to_string());
        assert_eq!(
            text(&copy_args("h", 7, b"k", 0, 1, false, Some(&up))),
            "h 7 k 0 1 COPY AUTH2 u p"
        );
        assert_eq!(
            text(&copy_args("h", 7, b"k", 3, 100, false, None)),
            "h 7 k 3 100 COPY"
        );
    }
}
