//! The term of rings that come without a coordinator's step, at a node (the rules are
//! `ring::lease`, pure): rings pushed from another node (`SHARD.RING PUSH` sends
//! `SHARD.RING INSTALL ... PUSHED term lease-ms holder address run-id released`, the pushing
//! node's record; nothing after the rings from a node that followed no term, or from a build
//! that sends none), and a ring change by hand (`SHARD.RING SET|BEGIN ... [TERM n]`,
//! `SHARD.RING SETTLE|COMMIT|ABORT [TERM n]`).
//!
//! Without them, a node cut off during a fleet operation, still holding the rings the fleet
//! left, would push them (or be given a ring by hand, by an operator or a script) over the newer
//! rings the fleet moved to. So, from a client: pushed rings of an older term than this node's
//! are refused (`STALETERM`), and so are those of its own term while the holder's lease runs
//! here (`LEASEHELD`: its operation drives the rings); a newer term's rings are installed and
//! their record taken on (the term, not the lease). A change by hand is refused while the
//! holder's lease runs here (`LEASEHELD`) and when the term it names (none: 0) is older than
//! this node's (`STALETERM`), and takes no term: the node's record stays the operation's, so a
//! node of a newer term still brings it up to date (`repair`), and a change made by hand on a
//! node cut off from the fleet never wins over the fleet's newer rings. A fresh fleet (no term
//! followed) accepts both as before. What a primary accepted is never refused where it is
//! repeated (a replica, the AOF at load).

use redis_module::Context;

use crate::host::args::{int_in, is, ArgList};
use crate::host::error::CmdError;
use crate::reshard::fleet::fencing::{from_client, parse_claim};
use crate::ring::lease::{Fenced, Record};
use crate::state;

/// `PUSHED` and its six values.
const PUSHED_SUFFIX: usize = 7;

/// The `PUSHED ...` a push of this node's rings ends with (`record`: this node's), or nothing
/// when it follows no term.
pub fn pushed_args(record: &Record) -> Vec<Vec<u8>> {
    if record.term == 0 {
        return Vec::new();
    }
    vec![
        b"PUSHED".to_vec(),
        record.term.to_string().into_bytes(),
        record.lease_ms.to_string().into_bytes(),
        record.holder.name.clone().into_bytes(),
        record.holder.address.clone().into_bytes(),
        record.holder.run_id.clone().into_bytes(),
        if record.released {
            b"yes".to_vec()
        } else {
            b"no".to_vec()
        },
    ]
}

/// Splits a push's `PUSHED ...` off an INSTALL's arguments (at least `min` before it): how many
/// come before it, and the pushing node's record, if it came with one.
pub fn split_pushed<A: ArgList + ?Sized>(
    args: &A,
    min: usize,
) -> Result<(usize, Option<Record>), CmdError> {
    let n = args.count();
    if n < min + PUSHED_SUFFIX || !is(args.arg(n - PUSHED_SUFFIX), "PUSHED") {
        return Ok((n, None));
    }
    let at = n - PUSHED_SUFFIX + 1;
    let claim = parse_claim(args, at)?;
    let released = match args.arg(at + 5) {
        r if is(r, "yes") => true,
        r if is(r, "no") => false,
        _ => return Err(CmdError::err("the pushed term's released is yes or no")),
    };
    let record = Record {
        term: claim.term,
        lease_ms: claim.lease_ms,
        holder: claim.holder,
        released,
    };
    Ok((n - PUSHED_SUFFIX, Some(record)))
}

/// Rings that came without a step (`pushed`: the pushing node's record, `None` for none): from
/// a client, refused or accepted with the record this node takes on once they are installed;
/// repeated (a replica, the AOF), never refused, the record taken on when it is newer.
pub fn check_push(ctx: &Context, pushed: Option<&Record>) -> Result<Option<Record>, CmdError> {
    let none = Record::default();
    let pushed = pushed.unwrap_or(&none);
    let now = crate::clock::monotonic_ms();
    let checked = state::lock().lease.check_push(pushed, now);
    match checked {
        Ok(adopt) => Ok(adopt),
        Err(fenced) if from_client(ctx) => Err(refusal(&fenced)),
        Err(_) => Ok(None),
    }
}

/// Splits a change by hand's `TERM n` off its arguments (at least `min` before it): how many
/// come before it, and the term it names (0: none).
pub fn split_hand_term<A: ArgList + ?Sized>(
    args: &A,
    min: usize,
) -> Result<(usize, u64), CmdError> {
    let n = args.count();
    if n >= min + 2 && is(args.arg(n - 2), "TERM") {
        let term = int_in(args.arg(n - 1), "term", 0, i64::MAX)?.unsigned_abs();
        return Ok((n - 2, term));
    }
    Ok((n, 0))
}

/// A change by hand naming `term`: refused from a client while the holder's lease runs here or
/// when `term` is older than this node's; never where it is repeated.
pub fn check_by_hand(ctx: &Context, term: u64) -> Result<(), CmdError> {
    if !from_client(ctx) {
        return Ok(());
    }
    let now = crate::clock::monotonic_ms();
    let checked = state::lock().lease.check_by_hand(term, now);
    checked.map_err(|fenced| refusal(&fenced))
}

/// A refusal as the error reply: its code, then why.
fn refusal(fenced: &Fenced) -> CmdError {
    let text = fenced.to_string();
    match text.split_once(' ') {
        Some((code, why)) => CmdError::code(code, why),
        None => CmdError::err(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::lease::Holder;

    fn args(words: &[&[u8]]) -> Vec<Vec<u8>> {
        words.iter().map(|w| w.to_vec()).collect()
    }

    #[test]
    fn a_push_carries_the_record_it_is_read_back_as() {
        assert!(
            pushed_args(&Record::default()).is_empty(),
            "no term: no suffix"
        );
        let record = Record {
            term: 7,
            lease_ms: 10_000,
            holder: Holder {
                name: "n0".into(),
                address: "10.0.0.1:6379".into(),
                run_id: "abc".into(),
            },
            released: true,
        };
        let mut sent = args(&[b"SHARD.RING", b"INSTALL", b"ring"]);
        sent.extend(pushed_args(&record));
        let list: Vec<&[u8]> = sent.iter().map(Vec::as_slice).collect();
        let (n, got) = split_pushed(list.as_slice(), 3).unwrap();
        assert_eq!((n, got), (3, Some(record)));
        let bare: Vec<&[u8]> = vec![b"SHARD.RING", b"INSTALL", b"ring"];
        assert_eq!(split_pushed(bare.as_slice(), 3).unwrap(), (3, None));
        let mut bad = list.clone();
        *bad.last_mut().unwrap() = b"maybe";
        assert!(split_pushed(bad.as_slice(), 3).is_err());
    }

    #[test]
    fn a_change_by_hand_reads_its_term_off_the_end() {
        let set: Vec<&[u8]> = vec![b"SHARD.RING", b"SET", b"ketama", b"a", b"h:1", b"1"];
        assert_eq!(split_hand_term(set.as_slice(), 3).unwrap(), (6, 0));
        let mut with = set.clone();
        with.extend([b"TERM".as_slice(), b"4"]);
        assert_eq!(split_hand_term(with.as_slice(), 3).unwrap(), (6, 4));
        let commit: Vec<&[u8]> = vec![b"SHARD.RING", b"COMMIT", b"TERM", b"x"];
        assert!(split_hand_term(commit.as_slice(), 2).is_err());
    }
}
