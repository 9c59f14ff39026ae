//! The arguments of `SHARD.RING SET|BEGIN` (and of `SHARD.RESHARD START`): a ring as
//! `algo [HASHTAG rule] name host:port weight [SLOTS ranges] ...`, read and built, with the
//! `TERM n` a change by hand may end with split off first (`reshard::fleet::unstepped`).

use redis_module::ContextFlags;

use crate::commands::{Call, CmdError};
use crate::host::args::{is, ArgList};
use crate::ring::placement::Placement;
use crate::ring::{Algo, HashTag, RingSpec};
use crate::state;

/// Reads `algo [HASHTAG rule] name host:port weight [SLOTS ranges] ...` from argument 2 on.
pub fn parse_spec<A: ArgList + ?Sized>(args: &A, command: &str) -> Result<RingSpec, CmdError> {
    if args.count() < 3 {
        return Err(CmdError::wrong_arity(command));
    }
    let algo = args.arg(2);
    let (hashtag, first_node) = if args.count() > 3 && is(args.arg(3), "HASHTAG") {
        if args.count() < 5 {
            return Err(CmdError::err(
                "HASHTAG needs a rule: cluster, jedis, greedy, none or shardjs",
            ));
        }
        (Some(args.arg(4)), 5)
    } else {
        (None, 3)
    };
    let fields: Vec<&[u8]> = (first_node..args.count()).map(|i| args.arg(i)).collect();
    let spec = RingSpec::from_args(algo, hashtag, &fields).map_err(CmdError::err)?;
    if spec.algo == Algo::Cluster {
        if spec.hashtag != HashTag::Cluster {
            return Err(CmdError::err(
                "the cluster algo always uses the cluster hash-tag rule",
            ));
        }
        if !spec.nodes.is_empty() {
            return Err(CmdError::err(
                "the cluster algo takes no nodes: the live cluster's slot map is the ring",
            ));
        }
    }
    Ok(spec)
}

/// `parse_spec`, with the shardjs layout's hash tag rule when the ring names none (its IDs
/// are placed by their shard bits); and whether a rule was given (`HASHTAG` as the fourth
/// argument: the nodes then start at the sixth).
pub fn parse_spec_with_default_tag(
    args: &[&[u8]],
    command: &str,
) -> Result<(RingSpec, bool), CmdError> {
    let mut spec = parse_spec(args, command)?;
    let hashtag_given = args.len() > 3 && is(args[3], "HASHTAG");
    let shardjs = state::lock().keys.layout.kind == crate::keys::LayoutKind::Shardjs;
    if !hashtag_given && shardjs {
        spec = spec.with_shardjs_default().map_err(CmdError::err)?;
    }
    Ok((spec, hashtag_given))
}

/// Reads and builds the ring of a SET or BEGIN (its arguments before `TERM n`), and the term
/// it names (0: none); the cluster algo needs cluster mode.
pub fn parse_ring(call: &Call, command: &str) -> Result<(Placement, u64), CmdError> {
    let (n, term) = crate::reshard::fleet::unstepped::split_hand_term(&call.args, 3)?;
    let args: Vec<&[u8]> = (0..n).map(|i| call.args.get(i)).collect();
    let (spec, _) = parse_spec_with_default_tag(args.as_slice(), command)?;
    if spec.algo == Algo::Cluster && !call.ctx.get_flags().contains(ContextFlags::CLUSTER) {
        return Err(CmdError::err(
            "the cluster algo needs a server started with cluster-enabled yes",
        ));
    }
    let placement = Placement::build(spec).map_err(CmdError::err)?;
    Ok((placement, term))
}
