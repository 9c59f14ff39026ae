//! A fleet operation's term at a node (the record and its rules are `ring::lease`, pure): the
//! `TERM term lease-ms name address run-id` that ends each step a coordinator sends
//! (`SHARD.RING INSTALL`, `SHARD.RESHARD COPY|CLEANUP|STOP`), read off the arguments; the step
//! accepted or refused against this node's record, and the record made durable when it changed
//! (`SHARD.RING LEASE` to the replicas and the AOF). What the primary accepted is never refused where it is repeated (a replica, the
//! AOF at load): there the record only follows. A plan a client stores (`SHARD.RESHARD PLAN`)
//! is refused when it is of an older term than the one this node follows: a coordinator that
//! lost its lease cannot overwrite the plan of the one that took it.

use redis_module::{Context, ContextFlags};

use crate::host::args::{int_in, is, ArgList};
use crate::host::error::CmdError;
use crate::ring::lease::{Claim, Holder, How, Refusal};
use crate::ring::RingSpec;
use crate::state;

/// `TERM` and its five values.
pub const SUFFIX: usize = 6;

/// Splits a step's `TERM ...` off its arguments (a command of at least `min` arguments before
/// it): how many arguments come before it, and the claim, if the step carries one.
pub fn split_term<A: ArgList + ?Sized>(
    args: &A,
    min: usize,
) -> Result<(usize, Option<Claim>), CmdError> {
    let n = args.count();
    if n >= min + SUFFIX && is(args.arg(n - SUFFIX), "TERM") {
        let claim = parse_claim(args, n - SUFFIX + 1)?;
        return Ok((n - SUFFIX, Some(claim)));
    }
    Ok((n, None))
}

/// Reads `term lease-ms name address run-id` from argument `at` on.
pub fn parse_claim<A: ArgList + ?Sized>(args: &A, at: usize) -> Result<Claim, CmdError> {
    let term = int_in(args.arg(at), "term", 1, i64::MAX)?.unsigned_abs();
    let lease_ms = int_in(args.arg(at + 1), "lease-ms", 1, 86_400_000)?.unsigned_abs();
    let text = |i: usize, what: &str| -> Result<String, CmdError> {
        let arg = args.arg(at + i);
        if arg.is_empty() {
            return Err(CmdError::err(format!("the term's {what} is empty")));
        }
        String::from_utf8(arg.to_vec())
            .map_err(|_| CmdError::err(format!("the term's {what} is not UTF-8")))
    };
    Ok(Claim {
        term,
        lease_ms,
        holder: Holder {
            name: text(2, "holder name")?,
            address: text(3, "holder address")?,
            run_id: text(4, "holder run id")?,
        },
    })
}

/// The arguments of `SHARD.RING LEASE` for `claim` (after the command name), with its mode.
pub fn lease_args(claim: &Claim, mode: Option<&str>) -> Vec<Vec<u8>> {
    let mut args = vec![
        b"LEASE".to_vec(),
        claim.term.to_string().into_bytes(),
        claim.lease_ms.to_string().into_bytes(),
        claim.holder.name.clone().into_bytes(),
        claim.holder.address.clone().into_bytes(),
        claim.holder.run_id.clone().into_bytes(),
    ];
    args.extend(mode.map(|m| m.as_bytes().to_vec()));
    args
}

/// Whether the command comes from a client (a coordinator), not from the primary's
/// replication stream or the AOF being loaded.
pub fn from_client(ctx: &Context) -> bool {
    let flags = ctx.get_flags();
    !flags.contains(ContextFlags::REPLICATED) && !flags.contains(ContextFlags::LOADING)
}

/// Takes `claim` for a step of this kind, or refuses it (`STALETERM`) changing nothing. True when the durable record changed (the caller makes it durable).
pub fn accept(ctx: &Context, claim: &Claim, how: How) -> Result<bool, CmdError> {
    let now = crate::clock::monotonic_ms();
    let mut st = state::lock();
    if from_client(ctx) {
        st.lease.accept(claim, how, now).map_err(|r| refusal(&r))
    } else {
        Ok(st.lease.follow(claim, how == How::Release, now))
    }
}

/// A step's term (INSTALL, COPY, CLEANUP, STOP), checked before anything else the step does:
/// taken, and made durable as `SHARD.RING LEASE` when it changed the record (even if the step
/// then fails: a newer coordinator spoke), or refused.
///
/// A coordinator's step (from a client, not replayed) is also refused when this server's own
/// node is behind Sentinel (in a ring it holds, or in `rings`: the rings an INSTALL brings) and
/// Sentinel does not name this server as its primary: a restarted old primary, or one not yet
/// looked up, would take a step that its demotion then throws away, while the coordinator
/// counted the node done (`named_primary`).
pub fn accept_step(
    ctx: &Context,
    claim: Option<&Claim>,
    rings: &[&RingSpec],
) -> Result<(), CmdError> {
    let Some(claim) = claim else {
        return Ok(());
    };
    if from_client(ctx) {
        named_primary(rings)?;
    }
    if accept(ctx, claim, How::Step)? {
        let args = lease_args(claim, None);
        let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
        ctx.replicate("SHARD.RING", &refs[..]);
    }
    Ok(())
}

/// Refuses (`TRYAGAIN`) when this server's node is behind Sentinel and Sentinel does not name
/// this server as its primary now; asks Sentinel at once when it does not know yet.
fn named_primary(rings: &[&RingSpec]) -> Result<(), CmdError> {
    let me = {
        let st = state::lock();
        let me = st.config.ring.self_name.as_str();
        let held = [st.rings.current.as_ref(), st.rings.previous.as_ref()];
        let own = held
            .into_iter()
            .flatten()
            .map(|p| &p.spec)
            .chain(rings.iter().copied())
            .flat_map(|spec| spec.nodes.iter())
            .find(|n| n.name == me && n.via_sentinel());
        // The same test the routed calls make (`acts_as`).
        match own {
            Some(node) if !crate::topology::nodes::acts_as(node, me) => me.to_owned(),
            _ => return Ok(()),
        }
    };
    crate::topology::watcher::wake_for(&me);
    Err(CmdError::code(
        "TRYAGAIN",
        format!(
            "this server is not the primary Sentinel names for {me} (not yet looked up, or no \
             longer): a fleet step goes to that primary"
        ),
    ))
}

/// A plan a client stores: refused when its term is older than the one this node follows.
pub fn check_plan_term(ctx: &Context, plan_term: u64) -> Result<(), CmdError> {
    if !from_client(ctx) {
        return Ok(());
    }
    let st = state::lock();
    let r = &st.lease.record;
    if plan_term < r.term {
        return Err(CmdError::code(
            "STALETERM",
            format!(
                "plan of term {plan_term} refused: term {} of {} ({}) holds this operation",
                r.term, r.holder.name, r.holder.address
            ),
        ));
    }
    Ok(())
}

/// A refusal as the error reply: its code, then why.
fn refusal(r: &Refusal) -> CmdError {
    let text = r.to_string();
    match text.split_once(' ') {
        Some((code, why)) => CmdError::code(code, why),
        None => CmdError::err(text),
    }
}
