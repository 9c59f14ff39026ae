//! Each node's share of the keyspace: the fraction of the hash space its points own, as the
//! peer the algo names would place keys (`SHARD.RING CHECK` shows it beside the weight's share).
//!
//! - ketama (uhashring): a key goes to the first point strictly greater than its 32-bit hash,
//!   wrapping to the first point: a point owns `[previous point, point)`, the first point also
//!   the wrap-around `[last point, 2^32)`.
//! - redis-shard: the same search without wrapping: hashes past the last point go to the last.
//! - jedis: the first point at least the hash (murmur: 64-bit signed; MD5: 0..2^32), wrapping:
//!   a point owns `(previous point, point]`.
//! - slots: the node's slots out of 16384 (in all its ranges, when the ring has a slot map).

use super::{Inner, JedisHash, Ring, SLOTS};

impl Ring {
    /// Each node's share of the keyspace, in node order; the shares sum to 1.
    pub fn shares(&self) -> Vec<f64> {
        let mut owned = vec![0f64; self.spec.nodes.len()];
        let mut add = |owner: u32, width: f64| {
            if let Some(o) = owned.get_mut(owner as usize) {
                *o += width;
            }
        };
        let total = match &self.inner {
            Inner::Ketama(p) | Inner::RedisShard(p) => {
                let wrap = matches!(self.inner, Inner::Ketama(_));
                let e = p.entries();
                arcs(
                    e.iter().map(|&(pt, o)| (u128::from(pt), o)),
                    1u128 << 32,
                    wrap,
                    &mut add,
                );
                (1u128 << 32) as f64
            }
            Inner::Jedis(p, hash) => {
                // `(previous, point]` is `[previous + 1, point + 1)`: shift by one (and map
                // murmur's signed 64-bit hashes onto 0..2^64; jedis's MD5 hash is the first
                // four bytes of the digest, 0..2^32) so the same arithmetic applies.
                let (low, space) = match hash {
                    JedisHash::Md5 => (0i128, 1u128 << 32),
                    JedisHash::Murmur => (i128::from(i64::MIN), 1u128 << 64),
                };
                let shift = |pt: i64| (i128::from(pt) + 1 - low) as u128;
                let e = p.entries();
                arcs(
                    e.iter().map(|&(pt, o)| (shift(pt), o)),
                    space,
                    true,
                    &mut add,
                );
                space as f64
            }
            Inner::Slots(m) => {
                for (i, r) in m.ranges().iter().enumerate() {
                    add(i as u32, super::slot_map::count(r) as f64);
                }
                SLOTS as f64
            }
        };
        owned.iter().map(|o| o / total).collect()
    }
}

/// Hands each point's arc `[previous point, point)` to its owner. The head before the first
/// point goes to the first point; the tail after the last goes to the first when the search
/// wraps, else to the last.
fn arcs(
    points: impl Iterator<Item = (u128, u32)>,
    space: u128,
    wrap: bool,
    add: &mut impl FnMut(u32, f64),
) {
    let mut first: Option<u32> = None;
    let mut prev: Option<(u128, u32)> = None;
    for (pt, owner) in points {
        let from = match prev {
            None => {
                first = Some(owner);
                0
            }
            Some((p, _)) => p,
        };
        add(owner, (pt - from) as f64);
        prev = Some((pt, owner));
    }
    if let (Some(first), Some((last, last_owner))) = (first, prev) {
        add(if wrap { first } else { last_owner }, (space - last) as f64);
    }
}

#[cfg(test)]
mod tests {
    use crate::ring::{Ring, RingSpec};

    fn ring(algo: &[u8], weights: &[u32]) -> Ring {
        let fields: Vec<String> = weights
            .iter()
            .enumerate()
            .flat_map(|(i, w)| {
                [
                    format!("n{i}"),
                    format!("127.0.0.1:{}", 7000 + i),
                    w.to_string(),
                ]
            })
            .collect();
        let refs: Vec<&[u8]> = fields.iter().map(|s| s.as_bytes()).collect();
        Ring::build(&RingSpec::from_args(algo, None, &refs).unwrap()).unwrap()
    }

    /// The share of each node estimated by placing many keys: the arcs must agree with
    /// where `locate` actually puts keys.
    fn sampled(r: &Ring, n: usize) -> Vec<f64> {
        let mut counts = vec![0usize; r.node_count()];
        for i in 0..n {
            counts[r.owner(format!("key:{i}").as_bytes())] += 1;
        }
        counts.iter().map(|&c| c as f64 / n as f64).collect()
    }

    #[test]
    fn shares_sum_to_one_and_match_where_keys_go() {
        for algo in [
            &b"ketama"[..],
            b"jedis",
            b"jedis-murmur",
            b"redis-shard",
            b"slots",
        ] {
            let r = ring(algo, &[1, 2, 3]);
            let shares = r.shares();
            let sum: f64 = shares.iter().sum();
            assert!((sum - 1.0).abs() < 1e-9, "{algo:?}: {sum}");
            for (s, k) in shares.iter().zip(sampled(&r, 200_000)) {
                assert!(
                    (s - k).abs() < 0.01,
                    "{algo:?}: arcs {shares:?} vs keys {k}"
                );
            }
        }
    }

    #[test]
    fn slots_share_is_slots_over_16384() {
        let r = ring(b"slots", &[1, 1]);
        assert_eq!(r.shares(), vec![0.5, 0.5]);
    }
}
