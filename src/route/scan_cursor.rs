//! The fleet's `SCAN` cursor (issue 43): one number that walks the nodes one after the other,
//! each with its own `SCAN` cursor, and that a resharding cannot make skip a key.
//!
//! Layout of the 64-bit cursor a client sees (decimal, as `SCAN`'s): bits 0-11 the node's
//! place in the walk plus one (so a cursor in progress is never 0, which means "done"), bits
//! 12-23 the epoch of the rings the walk started on, bits 24-63 that node's own cursor. A
//! server's cursor stays under its table size (2^40 buckets is far beyond any server), and
//! clients such as go-redis read the cursor as an unsigned 64-bit number, so it must fit.
//!
//! The walk's nodes are the nodes of the current ring and of the previous one while a
//! resharding is open, sorted by name. Its epoch is a hash of both rings' digests and their
//! mark. Keys move only while rings change: a resharding copies them under one pair of rings
//! (keys only added at their new owner) and deletes them at the old owner only after the
//! rings changed again (the cleanup runs on the final ring alone), so within one epoch a key
//! that exists from the start of the walk to its end stays at a node whose rings place it
//! there. When a step finds another epoch than its cursor's, the walk starts again from the
//! first node: a key may then be returned twice, which `SCAN` allows, and none is missed.
//!
//! Pure: no I/O, unit-tested here.

/// The bits of each part.
const NODE_BITS: u32 = 12;
const EPOCH_BITS: u32 = 12;
const INNER_SHIFT: u32 = NODE_BITS + EPOCH_BITS;
/// The most nodes a walk can name.
pub const MAX_NODES: usize = (1 << NODE_BITS) - 1;
/// A node's own cursor must be below this to fit.
pub const INNER_LIMIT: u64 = 1 << (64 - INNER_SHIFT);

/// Where a walk is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    /// The node's place in the walk.
    pub node: usize,
    /// The rings' epoch the walk is on (`epoch_of`).
    pub epoch: u16,
    /// The node's own `SCAN` cursor.
    pub inner: u64,
}

/// Why a cursor was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum CursorError {
    NotANumber,
    /// Not a cursor this fleet gave (its node part is 0 but the rest is not).
    Invalid,
}

/// The epoch of a pair of rings: 12 bits of a hash of both digests and their mark.
pub fn epoch_of(current: &str, previous: Option<&str>, mark: u8) -> u16 {
    // FNV-1a: stable across builds and servers (no per-process seed).
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    };
    eat(current.as_bytes());
    eat(b"/");
    eat(previous.unwrap_or("-").as_bytes());
    eat(&[b'/', mark]);
    // Folded to 12 bits.
    ((h ^ (h >> 12) ^ (h >> 24) ^ (h >> 36) ^ (h >> 48)) & ((1 << EPOCH_BITS) - 1)) as u16
}

/// Reads the client's cursor: `None` is the start of a walk (cursor 0).
pub fn decode(text: &[u8]) -> Result<Option<Cursor>, CursorError> {
    let text = std::str::from_utf8(text).map_err(|_| CursorError::NotANumber)?;
    let n: u64 = text.parse().map_err(|_| CursorError::NotANumber)?;
    if n == 0 {
        return Ok(None);
    }
    let node = (n & ((1 << NODE_BITS) - 1)) as usize;
    if node == 0 {
        return Err(CursorError::Invalid);
    }
    Ok(Some(Cursor {
        node: node - 1,
        epoch: ((n >> NODE_BITS) & ((1 << EPOCH_BITS) - 1)) as u16,
        inner: n >> INNER_SHIFT,
    }))
}

/// The cursor to give the client; `None` when the node's place or cursor does not fit.
pub fn encode(c: Cursor) -> Option<u64> {
    if c.node >= MAX_NODES || c.inner >= INNER_LIMIT {
        return None;
    }
    Some((c.inner << INNER_SHIFT) | (u64::from(c.epoch) << NODE_BITS) | (c.node as u64 + 1))
}

/// Where the step of a walk runs: the node and its cursor, given the client's cursor, the
/// epoch of the rings held now and the walk's number of nodes. A cursor of another epoch, or
/// of a node past the walk's end, starts the walk again.
pub fn step(client: Option<Cursor>, epoch: u16, nodes: usize) -> Cursor {
    match client {
        Some(c) if c.epoch == epoch && c.node < nodes => c,
        _ => Cursor {
            node: 0,
            epoch,
            inner: 0,
        },
    }
}

/// The cursor after a node replied `inner` (0: that node is done): the same node's next
/// step, the next node's first, or 0 when the last node is done. `None` when the node's
/// cursor does not fit.
pub fn after(at: Cursor, inner: u64, nodes: usize) -> Option<u64> {
    if inner != 0 {
        return encode(Cursor { inner, ..at });
    }
    if at.node + 1 >= nodes {
        return Some(0);
    }
    encode(Cursor {
        node: at.node + 1,
        epoch: at.epoch,
        inner: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_round_trips_and_is_never_zero_in_progress() {
        for (node, epoch, inner) in [(0, 0, 0), (2, 4095, 1), (4094, 7, INNER_LIMIT - 1)] {
            let c = Cursor { node, epoch, inner };
            let n = encode(c).expect("fits");
            assert_ne!(n, 0);
            assert_eq!(decode(n.to_string().as_bytes()), Ok(Some(c)));
        }
        assert_eq!(decode(b"0"), Ok(None));
        assert_eq!(
            encode(Cursor {
                node: 0,
                epoch: 0,
                inner: INNER_LIMIT
            }),
            None
        );
        assert_eq!(
            encode(Cursor {
                node: MAX_NODES,
                epoch: 0,
                inner: 0
            }),
            None
        );
    }

    #[test]
    fn bad_cursors_are_refused() {
        assert_eq!(decode(b"abc"), Err(CursorError::NotANumber));
        assert_eq!(decode(b"-1"), Err(CursorError::NotANumber));
        assert_eq!(
            decode(b"18446744073709551616"),
            Err(CursorError::NotANumber)
        );
        // Node part 0, the rest not: no cursor of a fleet's walk.
        assert_eq!(decode(b"4096"), Err(CursorError::Invalid));
    }

    #[test]
    fn a_walk_goes_node_after_node_then_ends() {
        let epoch = epoch_of("abc", None, 0);
        // Each step's reply from its node: node 0 takes two steps, node 1 one, node 2 two.
        let replies = [5u64, 0, 0, 9, 0];
        let mut client = None;
        let mut visited = vec![];
        let mut last = u64::MAX;
        for r in replies {
            let at = step(client, epoch, 3);
            visited.push((at.node, at.inner));
            last = after(at, r, 3).expect("fits");
            if last == 0 {
                break;
            }
            client = decode(last.to_string().as_bytes()).expect("ok");
        }
        assert_eq!(last, 0);
        assert_eq!(visited, vec![(0, 0), (0, 5), (1, 0), (2, 0), (2, 9)]);
    }

    #[test]
    fn another_epoch_starts_the_walk_again() {
        let before = epoch_of("ring-a", None, 0);
        let during = epoch_of("ring-b", Some("ring-a"), 0);
        let settled = epoch_of("ring-b", Some("ring-a"), 3);
        assert_ne!(before, during);
        assert_ne!(during, settled);
        let c = Cursor {
            node: 1,
            epoch: before,
            inner: 77,
        };
        assert_eq!(step(Some(c), before, 3), c);
        assert_eq!(
            step(Some(c), during, 4),
            Cursor {
                node: 0,
                epoch: during,
                inner: 0
            }
        );
        // A node past the walk's end (fewer nodes now): again from the first.
        let far = Cursor {
            node: 5,
            epoch: before,
            inner: 1,
        };
        assert_eq!(step(Some(far), before, 3).node, 0);
    }

    #[test]
    fn the_last_node_done_is_cursor_zero() {
        let c = Cursor {
            node: 2,
            epoch: 1,
            inner: 40,
        };
        assert_eq!(after(c, 0, 3), Some(0));
        let next = after(Cursor { node: 0, ..c }, 0, 3).expect("fits");
        assert_eq!(
            decode(next.to_string().as_bytes())
                .expect("ok")
                .map(|c| c.node),
            Some(1)
        );
    }
}
