//! The rings as route-plain's filter reads them for the usual command, a keyed one whose keys
//! are all this node's: a copy of the current ring and of which of its nodes this server is,
//! kept while the rings and the node's name stay the same, so that such a command takes
//! neither the state's lock nor a look at the node's name.
//!
//! The state counts every change of the rings or of `shard.self` (`state::rings_generation`,
//! bumped where the state is released after a change, the one place every change path goes
//! through: a ring set, installed, begun, committed, aborted, settled, loaded from an RDB, the
//! `self` configuration). The copy is made again, under the state's lock, when that count moved
//! since it was made: a command never reads a ring the state left. While a resharding step is
//! open (a previous ring), the copy says nothing and the filter takes its long way
//! (`filter::keys_local`), which weighs both rings.
//!
//! Only the command filter reads it, on the main thread (or a thread holding the server's
//! lock): the copy's mutex is only ever tried, never waited for.

use std::sync::{Arc, Mutex};

use crate::ring::placement::Placement;

/// Whether this server is a ring's node, for the filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mine {
    No,
    Yes,
    /// A `sentinel` node called as this server: it is, while Sentinel names this server its
    /// primary (`topology::nodes::names_me`, asked each time: Sentinel's answer changes without
    /// a ring change).
    IfNamed,
}

struct View {
    /// The `state::rings_generation` this copy was made at (`u64::MAX`: never made).
    generation: u64,
    /// The current ring when no resharding step is open and `shard.self` is set; `None`: the
    /// filter must take its long way.
    ring: Option<Arc<Placement>>,
    /// Per node of `ring`, by index, whether it is this server.
    mine: Vec<Mine>,
}

static VIEW: Mutex<View> = Mutex::new(View {
    generation: u64::MAX,
    ring: None,
    mine: Vec::new(),
});

/// Whether every key `keys` yields is this node's now, by a ring with no resharding step open
/// (and at least one key came): `Some(true)`; `Some(false)`: a key is another node's;
/// `None`: the copy cannot tell (a resharding step open, no ring or no `self`, the `cluster`
/// algo, or the copy in use), and the filter takes its long way. The caller checks that this
/// server is a primary.
pub fn all_here<'a>(keys: impl Iterator<Item = Option<&'a [u8]>>) -> Option<bool> {
    let generation = crate::state::rings_generation();
    let mut view = VIEW.try_lock().ok()?;
    if view.generation != generation {
        remake(&mut view);
    }
    let placement = view.ring.as_ref()?;
    let ring = placement.ring.as_ref()?;
    let mut any = false;
    for key in keys {
        let owner = ring.owner(key?);
        match view.mine.get(owner) {
            Some(Mine::Yes) => {}
            Some(Mine::IfNamed)
                if placement
                    .spec
                    .nodes
                    .get(owner)
                    .is_some_and(|n| crate::topology::nodes::names_me(&n.name)) => {}
            _ => return Some(false),
        }
        any = true;
    }
    any.then_some(true)
}

/// Makes the copy again from the state, under its lock.
#[cold]
#[inline(never)]
fn remake(view: &mut View) {
    let st = crate::state::lock();
    // Read under the lock: the count of the rings and name this lock shows.
    view.generation = crate::state::rings_generation();
    view.ring = None;
    view.mine.clear();
    let me = st.config.ring.self_name.as_str();
    if me.is_empty() || st.rings.previous.is_some() {
        return;
    }
    let Some(placement) = st.rings.current.as_ref() else {
        return;
    };
    if placement.ring.is_none() {
        return;
    }
    view.mine = placement
        .spec
        .nodes
        .iter()
        .map(|n| match (n.name == me, n.via_sentinel()) {
            (false, _) => Mine::No,
            (true, false) => Mine::Yes,
            (true, true) => Mine::IfNamed,
        })
        .collect();
    view.ring = Some(Arc::clone(placement));
}
