//! What happens to one key: copy it to its new owner, keep it, or delete it in cleanup.

use crate::ring::{NodeSpec, Ring};

/// The node a key must be copied to: its owner under `current` when that is not `self_name`.
pub fn copy_target<'r>(current: &'r Ring, self_name: &str, key: &[u8]) -> Option<&'r NodeSpec> {
    let owner = current.owner_spec(key);
    (owner.name != self_name).then_some(owner)
}

/// Whether cleanup deletes a local key: its owner under `current` is another node.
pub fn cleanup_deletes(current: &Ring, self_name: &str, key: &[u8]) -> bool {
    copy_target(current, self_name, key).is_some()
}

/// The keys of every database, from `INFO keyspace` (`db3:keys=12,expires=0,...` lines).
pub fn keys_in_keyspace(info: &str) -> u64 {
    info.lines()
        .filter(|l| l.starts_with("db"))
        .filter_map(|l| {
            l.split_once("keys=")?
                .1
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// Whether `self_name` names a node of `ring`.
pub fn is_member(ring: &Ring, self_name: &str) -> bool {
    ring.spec().node_index(self_name).is_some()
}

#[cfg(test)]
mod tests {
    #[test]
    fn keys_of_every_database_are_summed() {
        let info = "# Keyspace\r\ndb0:keys=1000,expires=3,avg_ttl=0\r\ndb15:keys=7,expires=0,avg_ttl=0\r\n";
        assert_eq!(keys_in_keyspace(info), 1007);
        assert_eq!(keys_in_keyspace("# Keyspace\r\n"), 0);
    }

    use super::*;

    fn ring(names: &[&str]) -> Ring {
        Ring::build(&crate::ring::test_spec(names)).unwrap()
    }

    #[test]
    fn growing_moves_only_keys_of_the_new_node() {
        let before = ring(&["a", "b", "c"]);
        let after = ring(&["a", "b", "c", "d"]);
        let mut moved = 0;
        for i in 0..10_000 {
            let key = format!("k{i}");
            let old = &before.owner_spec(key.as_bytes()).name;
            match copy_target(&after, old, key.as_bytes()) {
                None => {}
                Some(target) => {
                    assert_eq!(target.name, "d", "ketama moves keys only to the new node");
                    moved += 1;
                }
            }
            assert_eq!(
                cleanup_deletes(&after, old, key.as_bytes()),
                copy_target(&after, old, key.as_bytes()).is_some()
            );
        }
        assert!(
            (1500..3500).contains(&moved),
            "about a quarter moves, got {moved}"
        );
    }

    #[test]
    fn a_removed_node_copies_everything() {
        let after = ring(&["a", "b"]);
        assert!(!is_member(&after, "c"));
        assert!(is_member(&after, "a"));
        assert!((0..100).all(|i| copy_target(&after, "c", format!("k{i}").as_bytes()).is_some()));
    }
}
