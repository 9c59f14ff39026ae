//! The rings this server holds: the current one and, during a resharding, the previous one.
//!
//! A ring is built once per change and never modified, so a lookup only reads it. The
//! `cluster` algo holds no ring: its owner comes from the live cluster's slot map.

use std::sync::Arc;

use crate::ring::spec::NodeSpec;
use crate::ring::{Algo, Ring, RingError, RingSpec};

/// One ring as held by the module: its spec, the built ring (none for `cluster`), its digest.
#[derive(Debug)]
pub struct Placement {
    pub spec: RingSpec,
    pub ring: Option<Ring>,
    pub digest: String,
}

impl Placement {
    pub fn build(spec: RingSpec) -> Result<Placement, RingError> {
        let ring = match spec.algo {
            Algo::Cluster => None,
            _ => Some(Ring::build(&spec)?),
        };
        let digest = spec.digest();
        Ok(Placement { spec, ring, digest })
    }
}

/// The rings and the counter of changes.
#[derive(Debug, Default)]
pub struct RingState {
    pub current: Option<Arc<Placement>>,
    pub previous: Option<Arc<Placement>>,
    /// Grows by one with every change.
    pub epoch: u64,
    /// A cancelled resharding brings keys back: `current` is the ring being returned to,
    /// `previous` the one being left, and the keys that move between them are the previous
    /// owner's while they travel back. Routed writes of those keys are refused (`TRYAGAIN`)
    /// and reads prefer the previous owner (see `route::decide`).
    pub returning: bool,
    /// The same rings, for a fleet operation's fence (`reshard::fleet`): nothing was copied or
    /// cancelled yet; writes of the keys about to move are refused for a moment all the same,
    /// and the refusal says it is the fence.
    pub fence: bool,
    /// The new ring over the old one, *settled*: the copies are done (a fleet operation's
    /// `settle` phase, or `SHARD.RING SETTLE` by hand), so a moving key lives at its new owner.
    /// Routed calls read and write it there only (no fallback to the previous owner, no copy
    /// from it); a delete still reaches both owners, for the nodes that have not settled yet.
    /// The step that makes COMMIT safe: no node reads the previous owner once a node that
    /// committed may have deleted a key at the new owner alone (`route::decide`).
    pub settled: bool,
}

/// How `SHARD.RING INSTALL` marks the rings it installs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    /// A resharding as BEGIN opens it (or no resharding, with no previous ring).
    Open,
    /// A cancel bringing keys back (`RETURNING`).
    Returning,
    /// A fleet operation's fence (`FENCE`).
    Fence,
    /// The copies are done (`SETTLED`).
    Settled,
}

impl Mark {
    /// The marks a previous ring needs, by their `SHARD.RING INSTALL` word.
    pub const WORDS: [(&'static str, Mark); 3] = [
        ("RETURNING", Mark::Returning),
        ("FENCE", Mark::Fence),
        ("SETTLED", Mark::Settled),
    ];
}

/// Why a ring change was refused.
pub const RESHARDING_OPEN: &str =
    "a resharding is open: SHARD.RING COMMIT or SHARD.RING ABORT it first";
pub const NO_RESHARDING: &str = "no resharding is open: start one with SHARD.RING BEGIN";

impl RingState {
    /// The node called `name` in the current ring, else in the previous one.
    pub fn node(&self, name: &str) -> Option<&NodeSpec> {
        [self.current.as_ref(), self.previous.as_ref()]
            .into_iter()
            .flatten()
            .flat_map(|p| p.spec.nodes.iter())
            .find(|n| n.name == name)
    }

    /// Whether either ring names the node `name` a `sentinel` node (its address followed
    /// through Sentinel, so a replica may be promoted in its primary's place).
    pub fn via_sentinel(&self, name: &str) -> bool {
        self.node(name).is_some_and(|n| n.via_sentinel())
    }

    /// Replaces the current ring; refused while a resharding is open.
    pub fn set(&mut self, placement: Placement) -> Result<(), &'static str> {
        if self.previous.is_some() {
            return Err(RESHARDING_OPEN);
        }
        self.current = Some(Arc::new(placement));
        self.epoch += 1;
        Ok(())
    }

    /// Opens a resharding: `placement` becomes current, the current ring previous.
    pub fn begin(&mut self, placement: Placement) -> Result<(), &'static str> {
        if self.previous.is_some() {
            return Err(RESHARDING_OPEN);
        }
        let Some(current) = self.current.take() else {
            return Err("no ring is set to reshard from: set one with SHARD.RING SET first");
        };
        self.previous = Some(current);
        self.current = Some(Arc::new(placement));
        self.epoch += 1;
        Ok(())
    }

    /// Installs both rings as given (a fleet operation's step, `SHARD.RING INSTALL`): the same
    /// call repeated changes nothing but the epoch, so a coordinator may send it again after a
    /// crash.
    pub fn install(
        &mut self,
        current: Placement,
        previous: Option<Placement>,
        mark: Mark,
    ) -> Result<(), &'static str> {
        if mark != Mark::Open && previous.is_none() {
            return Err(
                "RETURNING, FENCE and SETTLED need a previous ring: the ring the keys move from",
            );
        }
        self.current = Some(Arc::new(current));
        self.previous = previous.map(Arc::new);
        self.returning = matches!(mark, Mark::Returning | Mark::Fence);
        self.fence = mark == Mark::Fence;
        self.settled = mark == Mark::Settled;
        self.epoch += 1;
        Ok(())
    }

    /// Marks the open resharding settled (`SHARD.RING SETTLE`): its copies are done. Refused
    /// with no resharding open, or while rings return (a fence or a cancel: nothing was copied
    /// to settle).
    pub fn settle(&mut self) -> Result<(), &'static str> {
        if self.previous.is_none() {
            return Err(NO_RESHARDING);
        }
        if self.returning {
            return Err("the rings are returning (a fleet operation's fence or a cancel): only a resharding whose copies are done settles");
        }
        self.settled = true;
        self.epoch += 1;
        Ok(())
    }

    /// The mark of the rings held now.
    pub fn mark(&self) -> Mark {
        if self.fence {
            Mark::Fence
        } else if self.returning {
            Mark::Returning
        } else if self.settled {
            Mark::Settled
        } else {
            Mark::Open
        }
    }

    /// Closes the resharding, dropping the previous ring.
    pub fn commit(&mut self) -> Result<(), &'static str> {
        self.previous.take().ok_or(NO_RESHARDING)?;
        self.returning = false;
        self.fence = false;
        self.settled = false;
        self.epoch += 1;
        Ok(())
    }

    /// Closes the resharding, putting the previous ring back as current.
    pub fn abort(&mut self) -> Result<(), &'static str> {
        let previous = self.previous.take().ok_or(NO_RESHARDING)?;
        self.current = Some(previous);
        self.returning = false;
        self.fence = false;
        self.settled = false;
        self.epoch += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placement(names: &[&str]) -> Placement {
        let fields: Vec<String> = names
            .iter()
            .flat_map(|n| [n.to_string(), "127.0.0.1:1".into(), "1".into()])
            .collect();
        let refs: Vec<&[u8]> = fields.iter().map(|s| s.as_bytes()).collect();
        Placement::build(RingSpec::from_args(b"ketama", None, &refs).unwrap()).unwrap()
    }

    fn names(p: &Option<Arc<Placement>>) -> Vec<String> {
        p.as_ref().map_or(vec![], |p| {
            p.spec.nodes.iter().map(|n| n.name.clone()).collect()
        })
    }

    #[test]
    fn begin_commit_abort() {
        let mut rings = RingState::default();
        assert_eq!(
            rings.begin(placement(&["a"])),
            Err("no ring is set to reshard from: set one with SHARD.RING SET first")
        );
        rings.set(placement(&["a"])).unwrap();
        rings.begin(placement(&["a", "b"])).unwrap();
        assert_eq!(
            (names(&rings.previous), names(&rings.current)),
            (
                vec!["a".to_string()],
                vec!["a".to_string(), "b".to_string()]
            )
        );
        assert_eq!(rings.begin(placement(&["c"])), Err(RESHARDING_OPEN));
        assert_eq!(rings.set(placement(&["c"])), Err(RESHARDING_OPEN));
        rings.abort().unwrap();
        assert_eq!(
            (names(&rings.previous), names(&rings.current)),
            (vec![], vec!["a".to_string()])
        );
        rings.begin(placement(&["a", "b"])).unwrap();
        rings.commit().unwrap();
        assert_eq!(
            (names(&rings.previous), names(&rings.current)),
            (vec![], vec!["a".to_string(), "b".to_string()])
        );
        assert_eq!(rings.commit(), Err(NO_RESHARDING));
        assert_eq!(rings.epoch, 5);
    }

    #[test]
    fn settled_needs_an_open_resharding_whose_keys_are_not_returning() {
        let mut rings = RingState::default();
        rings.set(placement(&["a"])).unwrap();
        assert_eq!(rings.settle(), Err(NO_RESHARDING));
        assert!(rings
            .install(placement(&["a", "b"]), None, Mark::Settled)
            .is_err());
        rings
            .install(placement(&["a"]), Some(placement(&["a", "b"])), Mark::Fence)
            .unwrap();
        assert!(rings.settle().unwrap_err().contains("returning"));
        rings
            .install(placement(&["a", "b"]), Some(placement(&["a"])), Mark::Open)
            .unwrap();
        assert_eq!(rings.mark(), Mark::Open);
        rings.settle().unwrap();
        assert_eq!((rings.mark(), rings.returning), (Mark::Settled, false));
        rings
            .install(
                placement(&["a", "b"]),
                Some(placement(&["a"])),
                Mark::Settled,
            )
            .unwrap();
        assert_eq!(rings.mark(), Mark::Settled);
        rings.commit().unwrap();
        assert_eq!(rings.mark(), Mark::Open);
    }
}
