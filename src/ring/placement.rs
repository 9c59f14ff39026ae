//! The rings this server holds: the current one and, during a resharding, the previous one.
//!
//! A ring is built once per change and never modified, so a lookup only reads it. The
//! `cluster` algo holds no ring: its owner comes from the live cluster's slot map.

use std::sync::Arc;

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
}

/// Why a ring change was refused.
pub const RESHARDING_OPEN: &str =
    "a resharding is open: SHARD.RING COMMIT or SHARD.RING ABORT it first";
pub const NO_RESHARDING: &str = "no resharding is open: start one with SHARD.RING BEGIN";

impl RingState {
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
        returning: bool,
        fence: bool,
    ) -> Result<(), &'static str> {
        if (returning || fence) && previous.is_none() {
            return Err(
                "RETURNING and FENCE need a previous ring: the ring the keys come back from",
            );
        }
        self.current = Some(Arc::new(current));
        self.previous = previous.map(Arc::new);
        self.returning = returning || fence;
        self.fence = fence;
        self.epoch += 1;
        Ok(())
    }

    /// Closes the resharding, dropping the previous ring.
    pub fn commit(&mut self) -> Result<(), &'static str> {
        self.previous.take().ok_or(NO_RESHARDING)?;
        self.returning = false;
        self.fence = false;
        self.epoch += 1;
        Ok(())
    }

    /// Closes the resharding, putting the previous ring back as current.
    pub fn abort(&mut self) -> Result<(), &'static str> {
        let previous = self.previous.take().ok_or(NO_RESHARDING)?;
        self.current = Some(previous);
        self.returning = false;
        self.fence = false;
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
}
