//! Gathered commands whose effect is a pure move or copy of whole values (`RENAME`,
//! `RENAMENX`, `COPY` without `DB`), worked out from the keys as read at their owners, pure:
//! no scratch run (`gather_step`) is needed for them. The keys' `DUMP` payloads and absolute
//! expiries (`PEXPIRETIME`) are what the scratch run would have restored, moved and read back,
//! so the writes are the same: the source's copy at the destination (its expiry with it), the
//! source deleted for a rename. The reply is the server's own for the same keys (its error text
//! included). Any other form (`COPY ... DB n`, a wrong arity) goes to the scratch run, which
//! answers as the server does.

use crate::net::resp::Resp;
use crate::txn::coord::gather_step::{KeyCopy, Ran};

/// The server's reply to a `RENAME`/`RENAMENX` of a missing key.
const NO_SUCH_KEY: &[u8] = b"ERR no such key";

/// What `command` (its name first) does to `copies` (every key it names, as read at its
/// owners), when it is a pure move or copy; `None`: run it in the scratch database.
pub fn moved(command: &[Vec<u8>], copies: &[KeyCopy]) -> Option<Ran> {
    let name = command.first()?;
    let find = |k: &[u8]| copies.iter().find(|c| c.key == k);
    let rename = name.eq_ignore_ascii_case(b"RENAME");
    let renamenx = name.eq_ignore_ascii_case(b"RENAMENX");
    let copy = name.eq_ignore_ascii_case(b"COPY");
    let replace = match (copy, command.len()) {
        (_, 3) => false,
        (true, 4) if command[3].eq_ignore_ascii_case(b"REPLACE") => true,
        _ => return None,
    };
    if !(rename || renamenx || copy) {
        return None;
    }
    let (src, dst) = (find(&command[1])?, find(&command[2])?);
    if src.key == dst.key {
        return None;
    }
    let Some(value) = &src.value else {
        let reply = if copy {
            Resp::Int(0)
        } else {
            Resp::Error(NO_SUCH_KEY.to_vec())
        };
        return Some(Ran {
            reply,
            changed: Vec::new(),
        });
    };
    if (renamenx || (copy && !replace)) && dst.value.is_some() {
        return Some(Ran {
            reply: Resp::Int(0),
            changed: Vec::new(),
        });
    }
    let landed = KeyCopy {
        key: dst.key.clone(),
        value: Some(value.clone()),
        at_ms: src.at_ms.max(-1),
    };
    let mut changed = Vec::with_capacity(2);
    if !copy {
        changed.push(KeyCopy {
            key: src.key.clone(),
            value: None,
            at_ms: -1,
        });
    }
    if landed != *dst {
        changed.push(landed);
    }
    let reply = if rename {
        Resp::Simple(b"OK".to_vec())
    } else {
        Resp::Int(1)
    };
    Some(Ran { reply, changed })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(words: &[&str]) -> Vec<Vec<u8>> {
        words.iter().map(|w| w.as_bytes().to_vec()).collect()
    }

    fn key(k: &str, v: Option<&str>, at: i64) -> KeyCopy {
        KeyCopy {
            key: k.as_bytes().to_vec(),
            value: v.map(|v| v.as_bytes().to_vec()),
            at_ms: at,
        }
    }

    #[test]
    fn rename_moves_the_value_and_its_expiry() {
        let copies = [key("a", Some("A"), 99), key("b", Some("B"), -1)];
        let ran = moved(&c(&["rename", "a", "b"]), &copies).unwrap();
        assert_eq!(ran.reply, Resp::Simple(b"OK".to_vec()));
        assert_eq!(
            ran.changed,
            vec![key("a", None, -1), key("b", Some("A"), 99)]
        );
        // The destination missing: the same.
        let copies = [key("a", Some("A"), -1), key("b", None, -1)];
        let ran = moved(&c(&["RENAME", "a", "b"]), &copies).unwrap();
        assert_eq!(
            ran.changed,
            vec![key("a", None, -1), key("b", Some("A"), -1)]
        );
    }

    #[test]
    fn a_missing_source_writes_nothing() {
        let copies = [key("a", None, -1), key("b", Some("B"), -1)];
        for (cmd, reply) in [
            ("RENAME", Resp::Error(NO_SUCH_KEY.to_vec())),
            ("RENAMENX", Resp::Error(NO_SUCH_KEY.to_vec())),
            ("COPY", Resp::Int(0)),
        ] {
            let ran = moved(&c(&[cmd, "a", "b"]), &copies).unwrap();
            assert_eq!(ran.reply, reply, "{cmd}");
            assert!(ran.changed.is_empty());
        }
    }

    #[test]
    fn renamenx_and_copy_keep_an_existing_destination() {
        let copies = [key("a", Some("A"), 5), key("b", Some("B"), -1)];
        for cmd in [c(&["RENAMENX", "a", "b"]), c(&["COPY", "a", "b"])] {
            let ran = moved(&cmd, &copies).unwrap();
            assert_eq!(ran.reply, Resp::Int(0));
            assert!(ran.changed.is_empty());
        }
        let ran = moved(&c(&["copy", "a", "b", "replace"]), &copies).unwrap();
        assert_eq!(ran.reply, Resp::Int(1));
        assert_eq!(ran.changed, vec![key("b", Some("A"), 5)]);
        let copies = [key("a", Some("A"), 5), key("b", None, -1)];
        let ran = moved(&c(&["RENAMENX", "a", "b"]), &copies).unwrap();
        assert_eq!(ran.reply, Resp::Int(1));
        assert_eq!(
            ran.changed,
            vec![key("a", None, -1), key("b", Some("A"), 5)]
        );
    }

    #[test]
    fn other_forms_run_in_the_scratch_database() {
        let copies = [key("a", Some("A"), -1), key("b", None, -1)];
        for cmd in [
            c(&["COPY", "a", "b", "DB", "2"]),
            c(&["COPY", "a", "b", "REPLACE", "DB", "2"]),
            c(&["RENAME", "a", "b", "c"]),
            c(&["RENAME", "a"]),
            c(&["RENAMENX", "a", "b", "REPLACE"]),
            c(&["SMOVE", "a", "b", "m"]),
            c(&["LMOVE", "a", "b", "LEFT", "RIGHT"]),
            c(&["RENAME", "a", "x"]),
            c(&["RENAME", "a", "a"]),
            c(&[]),
        ] {
            assert!(moved(&cmd, &copies).is_none(), "{cmd:?}");
        }
    }
}
