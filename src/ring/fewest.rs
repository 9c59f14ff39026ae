//! The slot map that moves the fewest slots from one `slots` ring to new weights or nodes
//! (`SHARD.RESHARD START`): what `redis-cli --cluster rebalance` and Valkey move, not the
//! contiguous split's half of the keys on a 3 -> 4 grow.
//!
//! Each node of the new ring has a target: its slot count in the contiguous split of the new
//! weights (its share of 16384, rounded as that split rounds, so the targets sum to 16384 and a
//! fleet that returns to its old weights returns to its old map). A node kept from the old ring
//! keeps its slots up to its target; an over-full node gives up its highest slots (whole
//! ranges from the end, then part of the last), a leaving node all of them. The slots given up
//! go to the under-full nodes in node order: first those next to a range the node already
//! owns (growing it), then the lowest ones. Deterministic: the same rings give the same map.

use super::algo::Algo;
use super::error::RingError;
use super::slot_map::{self, Ranges};
use super::slots::{self, SLOTS};
use super::spec::RingSpec;

const FREE: u32 = u32::MAX;

impl RingSpec {
    /// This ring (the ring to go to) with the slot map that moves the fewest slots from `old`,
    /// when both are `slots` rings with the same hash-tag rule and this one has no map of its
    /// own; else this ring unchanged.
    pub fn moving_fewest_slots_from(self, old: &RingSpec) -> Result<RingSpec, RingError> {
        if self.algo != Algo::Slots
            || self.slot_map.is_some()
            || old.algo != Algo::Slots
            || old.hashtag != self.hashtag
        {
            return Ok(self);
        }
        let Some(old_map) = old.slot_ranges() else {
            return Ok(self);
        };
        let map = fewest_moves(old, &old_map, &self)?;
        self.with_slot_map(map)
    }
}

/// The new ring's map, each node's ranges in node order (see the module's comment).
fn fewest_moves(
    old: &RingSpec,
    old_map: &[Ranges],
    new: &RingSpec,
) -> Result<Vec<Ranges>, RingError> {
    let targets: Vec<usize> = slots::contiguous(new)?
        .iter()
        .map(|&(a, b)| usize::from(b) - usize::from(a) + 1)
        .collect();
    // Who keeps what: an old node's slots stay with it when it is in the new ring.
    let mut owner = vec![FREE; SLOTS];
    let mut held = vec![0usize; new.nodes.len()];
    for (node, ranges) in old.nodes.iter().zip(old_map) {
        let Some(i) = new.node_index(&node.name) else {
            continue;
        };
        for &(a, b) in ranges {
            for s in a..=b {
                owner[usize::from(s)] = i as u32;
            }
        }
        held[i] += slot_map::count(ranges);
    }
    // An over-full node gives up its highest slots.
    for s in (0..SLOTS).rev() {
        let o = owner[s];
        if o != FREE && held[o as usize] > targets[o as usize] {
            owner[s] = FREE;
            held[o as usize] -= 1;
        }
    }
    // An under-full node first grows its ranges into the free slots next to them.
    let kept = slot_map::ranges_of(&owner, new.nodes.len());
    for (i, node_ranges) in kept.iter().enumerate() {
        for &(a, b) in node_ranges {
            let mut s = usize::from(b) + 1;
            while held[i] < targets[i] && s < SLOTS && owner[s] == FREE {
                owner[s] = i as u32;
                held[i] += 1;
                s += 1;
            }
            let mut s = usize::from(a);
            while held[i] < targets[i] && s > 0 && owner[s - 1] == FREE {
                owner[s - 1] = i as u32;
                held[i] += 1;
                s -= 1;
            }
        }
    }
    // Then takes the lowest free slots.
    let mut next = 0usize;
    for (i, (h, t)) in held.iter_mut().zip(&targets).enumerate() {
        while *h < *t {
            while next < SLOTS && owner[next] != FREE {
                next += 1;
            }
            if next == SLOTS {
                return Err(RingError::new(
                    "the slot map that moves the fewest slots came out short (a bug): give SLOTS explicitly",
                ));
            }
            owner[next] = i as u32;
            *h += 1;
        }
    }
    Ok(slot_map::ranges_of(&owner, new.nodes.len()))
}

#[cfg(test)]
#[path = "fewest_tests.rs"]
mod tests;
