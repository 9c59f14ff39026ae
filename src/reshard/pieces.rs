//! Big keys copied in pieces, by a copy's child (`copy_child`): a key whose value is larger than
//! `big-key-bytes`, or a collection of more than `big-key-elements` elements, does not travel
//! as one `RESTORE` (which would make its destination load it all in one command, for as long
//! as that takes, and could exceed its `proto-max-bulk-len`). Its elements are read from the
//! child's snapshot a few hundred at a time (`GETRANGE`, `HSCAN`, `SSCAN`, `ZRANGE`, `LRANGE`,
//! `XRANGE`, and for a stream its groups, consumers and pending entries) and written to a
//! temporary key at the destination (`APPEND`, `HSET`, `SADD`, `ZADD`, `RPUSH`, `XADD`,
//! `XSETID`, `XGROUP`, `XCLAIM`), each request at most `PIECE_BYTES` of arguments. Once every
//! piece is acknowledged, the temporary key gets the key's expiry and is renamed into place by
//! `RENAMENX`: like a `RESTORE` without `REPLACE`, it never overwrites a key already there.
//!
//! A key written by a client while its pieces travel: the write goes to the key's new owner,
//! whose copy-before-write (`migrate`) first brings the whole current key there; the
//! `RENAMENX` then finds the key and leaves it (the copy counts it as skipped), and the
//! temporary key is deleted. The write path wins. The temporary key carries an expiry of an
//! hour until it is renamed, so a copy that dies half-way leaves nothing behind for long.
//!
//! No crate does this: it is Redis's commands, in the order a destination must receive them.

use redis_module::{CallOptionsBuilder, CallReply, CallResult, Context};

use crate::host::keyspace::KeyType;
use crate::reshard::ship::{Expect, Shipper, Target};

/// Which keys travel in pieces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// A string longer than this, or a serialized value larger.
    pub bytes: usize,
    /// A collection of more elements than this.
    pub elements: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            bytes: 1 << 20,
            elements: 4096,
        }
    }
}

impl Limits {
    /// Whether a value of `kind` and length `len` (bytes of a string, elements of a
    /// collection) travels in pieces whatever its serialized size.
    pub fn big_by_length(&self, kind: KeyType, len: usize) -> bool {
        match kind {
            KeyType::String => len > self.bytes,
            KeyType::Other => false,
            _ => len > self.elements,
        }
    }

    /// Whether a value whose `DUMP` payload has `len` bytes travels in pieces.
    pub fn big_by_payload(&self, kind: KeyType, len: usize) -> bool {
        kind != KeyType::Other && len > self.bytes
    }
}

/// Bytes of arguments one piece carries, at most (one element may exceed it alone).
const PIECE_BYTES: usize = 256 * 1024;
/// Elements read from the source per call.
const READ_COUNT: usize = 512;
/// The temporary key's expiry until it is renamed into place.
const TEMP_TTL_MS: &[u8] = b"3600000";

/// The temporary name of `key` at its destination while its pieces travel.
pub fn temp_name(key: &[u8]) -> Vec<u8> {
    let mut name = b"__shard_piece__:".to_vec();
    name.extend_from_slice(key);
    name
}

/// A reply, owned.
#[derive(Debug, Clone, PartialEq)]
enum Val {
    Bulk(Vec<u8>),
    Int(i64),
    List(Vec<Val>),
    Nil,
}

impl Val {
    fn bytes(&self) -> Option<&[u8]> {
        match self {
            Val::Bulk(b) => Some(b),
            _ => None,
        }
    }

    fn list(&self) -> &[Val] {
        match self {
            Val::List(l) => l,
            _ => &[],
        }
    }

    /// The value after `name` in a flat `name value ...` reply (`XINFO`).
    fn field(&self, name: &str) -> Option<&Val> {
        self.list()
            .chunks(2)
            .find(|p| p[0].bytes() == Some(name.as_bytes()))
            .and_then(|p| p.get(1))
    }

    /// An integer or a bulk string as text (`XINFO` gives both).
    fn text(&self) -> Option<Vec<u8>> {
        match self {
            Val::Bulk(b) => Some(b.clone()),
            Val::Int(i) => Some(i.to_string().into_bytes()),
            _ => None,
        }
    }
}

fn owned(reply: &CallResult) -> Option<Val> {
    match reply {
        Ok(CallReply::String(s)) => Some(Val::Bulk(s.as_bytes().to_vec())),
        Ok(CallReply::I64(i)) => Some(Val::Int(i.to_i64())),
        Ok(CallReply::Array(a)) => Some(Val::List(
            a.iter().map(|r| owned(&r).unwrap_or(Val::Nil)).collect(),
        )),
        Ok(CallReply::Null(_)) => Some(Val::Nil),
        Ok(_) => Some(Val::Nil),
        Err(_) => None,
    }
}

/// Runs a read at the source (the child's snapshot).
fn read(ctx: &Context, command: &str, args: &[&[u8]]) -> Option<Val> {
    let options = CallOptionsBuilder::new().build();
    owned(&ctx.call_ext(command, &options, args))
}

/// The pieces of one key on their way to one destination.
struct Sender<'a> {
    shipper: &'a mut Shipper,
    target: &'a Target,
    temp: Vec<u8>,
    /// The command being filled, its arguments after the key, and their size.
    command: &'static [u8],
    args: Vec<Vec<u8>>,
    bytes: usize,
    sent: usize,
}

impl Sender<'_> {
    fn send(&mut self, command: &[u8], rest: &[&[u8]]) {
        let mut args: Vec<&[u8]> = Vec::with_capacity(rest.len() + 2);
        args.push(command);
        args.push(&self.temp);
        args.extend_from_slice(rest);
        self.shipper.send_as(self.target, &args, Expect::Piece);
        self.sent += 1;
        if self.sent == 1 {
            let temp = self.temp.clone();
            self.shipper.send_as(
                self.target,
                &[b"PEXPIRE".as_slice(), &temp, TEMP_TTL_MS],
                Expect::Piece,
            );
        }
    }

    /// Adds arguments of `command` (an element, a member and its score...), sending the
    /// piece once it is full.
    fn add(&mut self, command: &'static [u8], element: &[&[u8]]) {
        if self.command != command {
            self.flush();
            self.command = command;
        }
        for part in element {
            self.bytes += part.len();
            self.args.push(part.to_vec());
        }
        if self.bytes >= PIECE_BYTES || self.args.len() >= 2 * READ_COUNT {
            self.flush();
        }
    }

    fn flush(&mut self) {
        if self.args.is_empty() {
            return;
        }
        let args = std::mem::take(&mut self.args);
        let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
        self.send(self.command, &refs);
        self.bytes = 0;
    }
}

/// Copies `key` (of `kind`, expiring at `expires_at` Unix ms, 0 for never) to `target` in
/// pieces. The shipper's tally counts the key: copied, skipped (there already) or failed.
pub fn copy(
    ctx: &Context,
    shipper: &mut Shipper,
    target: &Target,
    key: &[u8],
    kind: KeyType,
    expires_at: i64,
    replace: bool,
) {
    let temp = temp_name(key);
    shipper.send_as(target, &[b"DEL".as_slice(), &temp], Expect::Piece);
    let errors_before = shipper.tally.piece_errors;
    let mut sender = Sender {
        shipper,
        target,
        temp: temp.clone(),
        command: b"",
        args: Vec::new(),
        bytes: 0,
        sent: 0,
    };
    let read_all = match kind {
        KeyType::String => string(ctx, &mut sender, key),
        KeyType::Hash => scanned(ctx, &mut sender, key, "HSCAN", b"HSET", 2),
        KeyType::Set => scanned(ctx, &mut sender, key, "SSCAN", b"SADD", 1),
        KeyType::ZSet => ranged(ctx, &mut sender, key, "ZRANGE", b"ZADD"),
        KeyType::List => ranged(ctx, &mut sender, key, "LRANGE", b"RPUSH"),
        KeyType::Stream => stream(ctx, &mut sender, key),
        KeyType::Other => false,
    };
    sender.flush();
    let sent = sender.sent;
    // Every piece acknowledged before the key is put in place: a piece refused (out of
    // memory) or lost leaves the key out rather than incomplete.
    shipper.drain(target);
    let complete = read_all && sent > 0 && shipper.tally.piece_errors == errors_before;
    if complete {
        let mut at = itoa::Buffer::new();
        if expires_at > 0 {
            let at = at.format(expires_at).as_bytes();
            shipper.send_as(target, &[b"PEXPIREAT".as_slice(), &temp, at], Expect::Piece);
        } else {
            shipper.send_as(target, &[b"PERSIST".as_slice(), &temp], Expect::Piece);
        }
        let rename: &[u8] = if replace { b"RENAME" } else { b"RENAMENX" };
        shipper.send_as(target, &[rename, &temp, key], Expect::Rename);
    } else {
        shipper.unfinished(target);
        if !read_all {
            shipper.tally.last_error = format!(
                "'{}' could not be read in pieces at the source",
                String::from_utf8_lossy(key)
            );
        }
        // Else the destination's refusal of a piece is the last error already.
    }
    // Gone if it was renamed; left over if the key was there already (or failed).
    shipper.send_as(target, &[b"DEL".as_slice(), &temp], Expect::Piece);
}

/// A string, `PIECE_BYTES` at a time.
fn string(ctx: &Context, sender: &mut Sender, key: &[u8]) -> bool {
    let Some(Val::Int(len)) = read(ctx, "STRLEN", &[key]) else {
        return false;
    };
    let len = usize::try_from(len).unwrap_or(0);
    let mut from = 0;
    while from < len {
        let to = (from + PIECE_BYTES).min(len) - 1;
        let (mut a, mut b) = (itoa::Buffer::new(), itoa::Buffer::new());
        let range = [key, a.format(from).as_bytes(), b.format(to).as_bytes()];
        let Some(Val::Bulk(piece)) = read(ctx, "GETRANGE", &range) else {
            return false;
        };
        sender.send(b"APPEND", &[&piece]);
        from = to + 1;
    }
    true
}

/// A hash or a set, through its `SCAN` cursor (the snapshot does not change under it, so no
/// element comes twice).
fn scanned(
    ctx: &Context,
    sender: &mut Sender,
    key: &[u8],
    scan: &str,
    write: &'static [u8],
    per_element: usize,
) -> bool {
    let mut cursor = b"0".to_vec();
    let mut count = itoa::Buffer::new();
    let count = count.format(READ_COUNT).as_bytes().to_vec();
    loop {
        let Some(reply) = read(ctx, scan, &[key, &cursor, b"COUNT", &count]) else {
            return false;
        };
        let [Val::Bulk(next), Val::List(elements)] = reply.list() else {
            return false;
        };
        for element in elements.chunks(per_element) {
            let parts: Vec<&[u8]> = element.iter().filter_map(Val::bytes).collect();
            sender.add(write, &parts);
        }
        if next.as_slice() == b"0" {
            return true;
        }
        cursor = next.clone();
    }
}

/// A sorted set (members with their scores, in order) or a list, by index ranges.
fn ranged(
    ctx: &Context,
    sender: &mut Sender,
    key: &[u8],
    range: &str,
    write: &'static [u8],
) -> bool {
    let zset = range == "ZRANGE";
    let mut from = 0usize;
    loop {
        let (mut a, mut b) = (itoa::Buffer::new(), itoa::Buffer::new());
        let mut args = vec![
            key,
            a.format(from).as_bytes(),
            b.format(from + READ_COUNT - 1).as_bytes(),
        ];
        if zset {
            args.push(b"WITHSCORES");
        }
        let Some(reply) = read(ctx, range, &args) else {
            return false;
        };
        let got = reply.list();
        if got.is_empty() {
            return true;
        }
        if zset {
            for pair in got.chunks(2) {
                if let [Val::Bulk(member), Val::Bulk(score)] = pair {
                    sender.add(write, &[score, member]);
                }
            }
            from += got.len() / 2;
        } else {
            for element in got.iter().filter_map(Val::bytes) {
                sender.add(write, &[element]);
            }
            from += got.len();
        }
    }
}

/// A stream: its entries, then its last ID and counters, its groups, their consumers and
/// their pending entries (with their delivery times and counts).
fn stream(ctx: &Context, sender: &mut Sender, key: &[u8]) -> bool {
    let mut start = b"-".to_vec();
    let mut count = itoa::Buffer::new();
    let count = count.format(READ_COUNT).as_bytes().to_vec();
    loop {
        let Some(reply) = read(ctx, "XRANGE", &[key, &start, b"+", b"COUNT", &count]) else {
            return false;
        };
        let entries = reply.list();
        for entry in entries {
            let [Val::Bulk(id), Val::List(fields)] = entry.list() else {
                return false;
            };
            let mut args: Vec<&[u8]> = vec![id];
            args.extend(fields.iter().filter_map(Val::bytes));
            sender.flush();
            sender.send(b"XADD", &args);
        }
        match entries
            .last()
            .and_then(|e| e.list().first())
            .and_then(Val::bytes)
        {
            Some(last) if entries.len() == READ_COUNT => {
                start = [b"(".as_slice(), last].concat();
            }
            _ => break,
        }
    }
    let Some(info) = read(ctx, "XINFO", &[b"STREAM", key]) else {
        return false;
    };
    if let Some(last) = info.field("last-generated-id").and_then(Val::text) {
        let mut args: Vec<Vec<u8>> = vec![last];
        for (option, field) in [
            (b"ENTRIESADDED".as_slice(), "entries-added"),
            (b"MAXDELETEDID".as_slice(), "max-deleted-entry-id"),
        ] {
            if let Some(value) = info.field(field).and_then(Val::text) {
                args.push(option.to_vec());
                args.push(value);
            }
        }
        let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
        sender.send(b"XSETID", &refs);
    }
    let Some(groups) = read(ctx, "XINFO", &[b"GROUPS", key]) else {
        return false;
    };
    for group in groups.list() {
        let (Some(name), Some(last)) = (
            group.field("name").and_then(Val::text),
            group.field("last-delivered-id").and_then(Val::text),
        ) else {
            return false;
        };
        let mut args: Vec<Vec<u8>> = vec![b"CREATE".to_vec()];
        args.push(sender.temp.clone());
        args.push(name.clone());
        args.push(last);
        if let Some(read) = group.field("entries-read").and_then(Val::text) {
            args.push(b"ENTRIESREAD".to_vec());
            args.push(read);
        }
        let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
        group_command(sender, &refs);
        if !consumers(ctx, sender, key, &name) || !pending(ctx, sender, key, &name) {
            return false;
        }
    }
    true
}

/// `XGROUP sub temp ...`: its second argument is the key.
fn group_command(sender: &mut Sender, args: &[&[u8]]) {
    let mut all: Vec<&[u8]> = vec![b"XGROUP"];
    all.extend_from_slice(args);
    sender.shipper.send_as(sender.target, &all, Expect::Piece);
    sender.sent += 1;
}

fn consumers(ctx: &Context, sender: &mut Sender, key: &[u8], group: &[u8]) -> bool {
    let Some(list) = read(ctx, "XINFO", &[b"CONSUMERS", key, group]) else {
        return false;
    };
    for consumer in list.list() {
        if let Some(name) = consumer.field("name").and_then(Val::text) {
            let temp = sender.temp.clone();
            group_command(sender, &[b"CREATECONSUMER", &temp, group, &name]);
        }
    }
    true
}

/// The group's pending entries, each claimed again by its consumer with its delivery time
/// and count (`XCLAIM ... FORCE JUSTID TIME ms RETRYCOUNT n`).
fn pending(ctx: &Context, sender: &mut Sender, key: &[u8], group: &[u8]) -> bool {
    let now = crate::clock::now_ms().unwrap_or(0);
    let mut start = b"-".to_vec();
    let mut count = itoa::Buffer::new();
    let count = count.format(READ_COUNT).as_bytes().to_vec();
    loop {
        let Some(reply) = read(ctx, "XPENDING", &[key, group, &start, b"+", &count]) else {
            return false;
        };
        let entries = reply.list();
        for entry in entries {
            let [Val::Bulk(id), Val::Bulk(consumer), Val::Int(idle), Val::Int(deliveries)] =
                entry.list()
            else {
                return false;
            };
            let (mut at, mut n) = (itoa::Buffer::new(), itoa::Buffer::new());
            let at = at.format(now.saturating_sub(*idle).max(0)).as_bytes();
            let n = n.format(*deliveries).as_bytes();
            sender.send(
                b"XCLAIM",
                &[
                    group,
                    consumer,
                    b"0",
                    id,
                    b"FORCE",
                    b"JUSTID",
                    b"TIME",
                    at,
                    b"RETRYCOUNT",
                    n,
                ],
            );
        }
        match entries
            .last()
            .and_then(|e| e.list().first())
            .and_then(Val::bytes)
        {
            Some(last) if entries.len() == READ_COUNT => {
                start = [b"(".as_slice(), last].concat();
            }
            _ => return true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_go_by_bytes_collections_by_elements_or_payload() {
        let limits = Limits {
            bytes: 1000,
            elements: 10,
        };
        assert!(!limits.big_by_length(KeyType::String, 1000));
        assert!(limits.big_by_length(KeyType::String, 1001));
        assert!(!limits.big_by_length(KeyType::Hash, 10));
        assert!(limits.big_by_length(KeyType::Hash, 11));
        assert!(limits.big_by_length(KeyType::Stream, 11));
        assert!(!limits.big_by_length(KeyType::Other, usize::MAX));
        assert!(limits.big_by_payload(KeyType::Set, 1001));
        assert!(!limits.big_by_payload(KeyType::Set, 1000));
        assert!(!limits.big_by_payload(KeyType::Other, 1 << 30));
    }

    #[test]
    fn the_temporary_name_keeps_the_key() {
        assert_eq!(temp_name(b"user:{7}"), b"__shard_piece__:user:{7}".to_vec());
    }

    #[test]
    fn flat_replies_give_their_fields() {
        let info = Val::List(vec![
            Val::Bulk(b"length".to_vec()),
            Val::Int(3),
            Val::Bulk(b"last-generated-id".to_vec()),
            Val::Bulk(b"5-0".to_vec()),
        ]);
        assert_eq!(
            info.field("length").and_then(Val::text),
            Some(b"3".to_vec())
        );
        assert_eq!(
            info.field("last-generated-id").and_then(Val::text),
            Some(b"5-0".to_vec())
        );
        assert_eq!(info.field("groups"), None);
    }
}
