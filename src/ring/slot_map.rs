//! Explicit slot maps of a `slots` ring: each node's inclusive slot ranges, as `CLUSTER SLOTS`
//! shows them (a node may own several). Owns the text form that `SHARD.RING SET`'s `SLOTS`
//! takes and the ring's canonical text writes (`0-4095,8192-9000`, a single slot as `5`), the
//! normal form (ranges sorted, adjacent ones merged) and the check that a map gives each of the
//! 16384 slots to exactly one node, with an error naming the first slot that is not.

use super::error::{show, RingError};
use super::slots::SLOTS;

/// A node's inclusive slot ranges.
pub type Ranges = Vec<(u16, u16)>;

/// The most slot ranges one node's list may have (one per slot).
const MAX_RANGES: usize = SLOTS;

/// Parses `first-last,slot,...` (slots 0 to 16383) for node `node`; at least one range.
pub fn parse_ranges(text: &[u8], node: &str) -> Result<Ranges, RingError> {
    let bad = |item: &[u8], why: &str| {
        RingError::new(format!(
            "SLOTS of node '{node}': '{}' is not a slot range: {why}",
            show(item)
        ))
    };
    if text.is_empty() {
        return Err(bad(
            text,
            "expected first-last or a slot, like 0-5460,10923",
        ));
    }
    let mut out = Vec::new();
    for item in text.split(|&b| b == b',') {
        if out.len() == MAX_RANGES {
            return Err(RingError::new(format!(
                "SLOTS of node '{node}': more than {MAX_RANGES} ranges"
            )));
        }
        let (first, last) = match item.iter().position(|&b| b == b'-') {
            Some(dash) => (&item[..dash], &item[dash + 1..]),
            None => (item, item),
        };
        let slot = |t: &[u8]| -> Result<u16, RingError> {
            if t.is_empty() || t.len() > 5 || !t.iter().all(u8::is_ascii_digit) {
                return Err(bad(
                    item,
                    "expected first-last or a slot, like 0-5460,10923",
                ));
            }
            let n = t
                .iter()
                .fold(0u32, |acc, &d| acc * 10 + u32::from(d - b'0'));
            u16::try_from(n)
                .ok()
                .filter(|s| usize::from(*s) < SLOTS)
                .ok_or_else(|| bad(item, "slots are 0 to 16383"))
        };
        let (first, last) = (slot(first)?, slot(last)?);
        if first > last {
            return Err(bad(item, "the first slot is after the last"));
        }
        out.push((first, last));
    }
    Ok(out)
}

/// The text form: ranges joined by `,`, a single slot as itself (as `CLUSTER NODES` writes).
pub fn format_ranges(ranges: &[(u16, u16)]) -> String {
    let mut out = String::with_capacity(ranges.len() * 11);
    for (i, &(a, b)) in ranges.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        if a == b {
            out.push_str(&a.to_string());
        } else {
            out.push_str(&format!("{a}-{b}"));
        }
    }
    out
}

/// Number of slots in `ranges`.
pub fn count(ranges: &[(u16, u16)]) -> usize {
    ranges
        .iter()
        .map(|&(a, b)| usize::from(b) - usize::from(a) + 1)
        .sum()
}

/// Per slot, the index of its node in `map` (`u32::MAX` where no node has it); or the first
/// slot given twice, with its two nodes.
pub(crate) fn owners(map: &[Ranges]) -> Result<Vec<u32>, (u16, u32, u32)> {
    let mut owner = vec![u32::MAX; SLOTS];
    for (node, ranges) in map.iter().enumerate() {
        for &(a, b) in ranges {
            for s in a..=b {
                let o = &mut owner[usize::from(s) & (SLOTS - 1)];
                if *o != u32::MAX {
                    return Err((s, *o, node as u32));
                }
                *o = node as u32;
            }
        }
    }
    Ok(owner)
}

/// Each node's ranges, in node order, read from a per-slot owner table (`u32::MAX`: none).
pub(crate) fn ranges_of(owner: &[u32], nodes: usize) -> Vec<Ranges> {
    let mut out = vec![Vec::new(); nodes];
    let mut s = 0usize;
    while s < owner.len() {
        let o = owner[s];
        let start = s;
        while s + 1 < owner.len() && owner[s + 1] == o {
            s += 1;
        }
        if let Some(r) = out.get_mut(o as usize) {
            r.push((start as u16, s as u16));
        }
        s += 1;
    }
    out
}

/// Checks that `map` (each node's ranges, named by `names` in the same order) gives every slot
/// to exactly one node and every node at least one slot; returns it in normal form.
pub fn check_cover(names: &[&str], map: &[Ranges]) -> Result<Vec<Ranges>, RingError> {
    if map.len() != names.len() {
        return Err(RingError::new(format!(
            "a slot map gives slots to {} nodes, the ring has {}",
            map.len(),
            names.len()
        )));
    }
    let name = |i: u32| names.get(i as usize).copied().unwrap_or("?");
    let owner = owners(map).map_err(|(slot, first, second)| {
        RingError::new(if first == second {
            format!(
                "slot map: slot {slot} is given twice to node '{}'",
                name(first)
            )
        } else {
            format!(
                "slot map: slot {slot} is given to both node '{}' and node '{}'",
                name(first),
                name(second)
            )
        })
    })?;
    if let Some(first) = owner.iter().position(|&o| o == u32::MAX) {
        let last = owner[first..]
            .iter()
            .position(|&o| o != u32::MAX)
            .map_or(SLOTS - 1, |n| first + n - 1);
        let which = if first == last {
            format!("slot {first} is")
        } else {
            format!("slots {first}-{last} are")
        };
        return Err(RingError::new(format!(
            "slot map: {which} given to no node (each of the 16384 slots goes to exactly one node)"
        )));
    }
    let normal = ranges_of(&owner, names.len());
    if let Some(i) = normal.iter().position(Vec::is_empty) {
        return Err(RingError::new(format!(
            "slot map: node '{}' owns no slot",
            name(i as u32)
        )));
    }
    Ok(normal)
}

#[cfg(test)]
#[path = "slot_map_tests.rs"]
mod tests;
