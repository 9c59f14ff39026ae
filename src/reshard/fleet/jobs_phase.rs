//! A phase's jobs driven by the fleet coordinator (`coordinator::run`): each node's step
//! (`SHARD.RESHARD COPY` or `CLEANUP`, stamped with the coordinator's term) sent once, the
//! nodes' jobs looked at every `POLL` (`SHARD.RING STATE`), a finished node counted done once
//! its replica has it (`durable`), and a failed one started again after a backoff, a bounded
//! number of times, each change made durable in the plan before the next look.

use std::time::Duration;

use futures_util::future::join_all;

use crate::net::resp::Resp;
use crate::reshard::fleet::checks::{job_verdict, JobVerdict};
use crate::reshard::fleet::coordinator::{
    backoff, current_plan, endpoint_of, persist, reply_text, with_plan, Reach, POLL,
};
use crate::reshard::fleet::durable;
use crate::reshard::fleet::lease;
use crate::reshard::fleet::node_state::NodeState;
use crate::reshard::fleet::plan::{NodeProgress, Phase, MAX_ATTEMPTS};
use crate::route::forward::NetSteps;

/// Runs the phase's job on every node that has one and waits for all; a node whose job fails
/// is started again, a bounded number of times. `Ok(false)`: a CANCEL interrupted the phase.
pub(super) async fn run_jobs(steps: &NetSteps, reach: &Reach) -> Result<bool, String> {
    let state_args = vec![b"SHARD.RING".to_vec(), b"STATE".to_vec()];
    // Nodes whose job this run has started (a resumed run starts every unfinished one again:
    // a repeated copy or cleanup only does what is left).
    let plan0 = current_plan()?;
    let mut started = vec![false; plan0.nodes.len()];
    let mut retry_at: Vec<Option<u32>> = vec![None; plan0.nodes.len()];
    // Nodes whose job ran on other rings than the phase's: the rings go there again first.
    let mut reinstall = vec![false; plan0.nodes.len()];
    let mut tick: u32 = 0;
    loop {
        lease::fresh(steps, reach).await?;
        // The term the jobs are started under, which a job must carry to count.
        let term = lease::held_term();
        let plan = current_plan()?;
        if plan.cancel && plan.phase.cancellable() {
            return Ok(false);
        }
        let workers: Vec<usize> = (0..plan.nodes.len())
            .filter(|&i| plan.work(i).is_some() && !plan.nodes[i].done)
            .collect();
        if workers.is_empty() {
            return Ok(true);
        }
        // Start (or start again) the jobs due.
        let due: Vec<usize> = workers
            .iter()
            .copied()
            .filter(|&i| !started[i] || retry_at[i].is_some_and(|t| t <= tick))
            .collect();
        if !due.is_empty() {
            let rings = plan.job_rings().map(|r| lease::stamped(r.command()));
            let sends = due.iter().filter_map(|&i| {
                let args = lease::stamped(plan.work(i)?.command(plan.max_rate));
                let at = endpoint_of(&plan, &plan.nodes[i].name, &reach.me.name)?;
                let install = rings.clone().filter(|_| reinstall[i]);
                Some(async move {
                    if let Some(install) = install {
                        // Counted once the node's replica has the rings, as the phase's install.
                        match durable::send(steps, &at, &install).await {
                            Ok(Resp::Simple(_)) => {}
                            other => return (i, other, true),
                        }
                    }
                    (i, durable::send(steps, &at, &args).await, false)
                })
            });
            let replies = join_all(sends).await;
            let names: Vec<&str> = replies
                .iter()
                .map(|(i, _, _)| plan.nodes[*i].name.as_str())
                .collect();
            lease::note_refusals(names.into_iter().zip(replies.iter().map(|(_, r, _)| r)))?;
            let mut gave_up = None;
            with_plan(|p| {
                for (i, reply, installing) in replies {
                    started[i] = true;
                    retry_at[i] = None;
                    reinstall[i] = installing;
                    let node = &mut p.nodes[i];
                    node.attempts += 1;
                    let refused = match reply {
                        Ok(Resp::Simple(_)) => None,
                        // A job of a run before a restart of the coordinator, still going; or
                        // a STOP where nothing runs.
                        Ok(Resp::Error(e))
                            if contains(&e, b"already running")
                                || contains(&e, b"no resharding job is running") =>
                        {
                            None
                        }
                        Ok(other) if installing => Some(format!(
                            "installing its rings again: {}",
                            reply_text(&other)
                        )),
                        Ok(other) => Some(reply_text(&other)),
                        Err(e) if installing => Some(format!("installing its rings again: {e}")),
                        Err(e) => Some(e.to_string()),
                    };
                    if let Some(why) = refused {
                        if let Some(e) = retry_later(p.phase, node, why, &mut retry_at[i], tick) {
                            gave_up.get_or_insert(e);
                        }
                    }
                }
            });
            if let Some(e) = gave_up {
                return Err(e);
            }
        }
        steps.sleep(POLL).await;
        tick += 1;
        // Look at every worker's job.
        let plan = current_plan()?;
        let looks = workers.iter().filter_map(|&i| {
            let at = endpoint_of(&plan, &plan.nodes[i].name, &reach.me.name)?;
            let args = &state_args;
            Some(async move { (i, steps.send(&at, args).await) })
        });
        let answers = join_all(looks).await;
        let mut finished_one = false;
        let mut gave_up = None;
        with_plan(|p| {
            let plan = p.clone();
            let rings = plan.job_rings();
            for (i, answer) in answers {
                let Some(work) = p.work(i) else { continue };
                let node = &mut p.nodes[i];
                let st = match answer
                    .map_err(|e| e.to_string())
                    .and_then(|r| NodeState::from_resp(&r))
                {
                    Ok(st) => st,
                    Err(e) => {
                        node.state = "unreachable".into();
                        node.last_error = e;
                        continue;
                    }
                };
                node.state = if st.paused {
                    format!("{} (paused)", st.job_state)
                } else {
                    st.job_state.clone()
                };
                node.copied = st.copied;
                node.percent = st.percent;
                if retry_at[i].is_some() {
                    continue;
                }
                match job_verdict(work, &st, term, rings.as_ref()) {
                    JobVerdict::Running => {}
                    JobVerdict::Done => {
                        node.done = true;
                        node.last_error.clear();
                        finished_one = true;
                    }
                    JobVerdict::Retry(why) => {
                        if let Some(e) = retry_later(p.phase, node, why, &mut retry_at[i], tick) {
                            gave_up.get_or_insert(e);
                        }
                    }
                    JobVerdict::OtherRings(why) => {
                        crate::reshard::fleet::journal::note(&format!("node {}: {why}", node.name));
                        reinstall[i] = true;
                        if let Some(e) = retry_later(p.phase, node, why, &mut retry_at[i], tick) {
                            gave_up.get_or_insert(e);
                        }
                    }
                }
            }
        });
        if let Some(e) = gave_up {
            return Err(e);
        }
        if finished_one {
            persist(steps, reach).await?;
        }
    }
}

/// A node's step failed (`why`): it is tried again after a backoff (`retry_at`, in looks), or,
/// once it has had its tries, the coordinator gives up with this error.
fn retry_later(
    phase: Phase,
    node: &mut NodeProgress,
    why: String,
    retry_at: &mut Option<u32>,
    tick: u32,
) -> Option<String> {
    node.last_error = why;
    if node.attempts >= MAX_ATTEMPTS {
        return Some(format!(
            "phase {phase}: node {} failed {} times, last: {}; SHARD.RESHARD RESUME to try again, or CANCEL",
            node.name, node.attempts, node.last_error
        ));
    }
    *retry_at = Some(tick + ticks(backoff(node.attempts)));
    None
}

/// `wait` in looks at the jobs.
fn ticks(wait: Duration) -> u32 {
    u32::try_from(wait.as_millis() / POLL.as_millis()).unwrap_or(u32::MAX)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}
