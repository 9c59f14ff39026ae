//! A fleet plan's byte form: `SHFP`, a version, then fields (u64 little-endian numbers, u8
//! codes, strings prefixed with their u64 length, the rings as canonical text). The coordinator
//! keeps it in its RDB and sends it as `SHARD.RESHARD PLAN`, which replicates it; decoding
//! refuses anything truncated, longer, or of an unknown version. Version 2 is version 1 and the
//! term (u64) at the end, written once the plan has one: a plan of version 1 reads as term 0.

use super::{FleetPlan, NodeProgress, Phase, Role};
use crate::persist::Reader;

const MAGIC: &[u8; 4] = b"SHFP";
/// The newest version this build writes; it reads every version from 1.
const VERSION: u8 = 2;
/// The version with the term.
const WITH_TERM: u8 = 2;

impl FleetPlan {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(256);
        out.extend_from_slice(MAGIC);
        // The oldest version that holds the plan, which an older build reads.
        out.push(if self.term > 0 { WITH_TERM } else { 1 });
        put_str(&mut out, &self.old.canonical());
        put_str(&mut out, &self.new.canonical());
        out.extend_from_slice(&self.max_rate.to_le_bytes());
        out.push(self.phase.code());
        out.push(u8::from(self.cancel));
        put_str(&mut out, &self.error);
        out.extend_from_slice(&(self.nodes.len() as u64).to_le_bytes());
        for n in &self.nodes {
            put_str(&mut out, &n.name);
            put_str(&mut out, &n.address);
            out.push(n.role.code());
            out.push(u8::from(n.done));
            out.extend_from_slice(&u64::from(n.attempts).to_le_bytes());
            put_str(&mut out, &n.state);
            out.extend_from_slice(&n.copied.to_le_bytes());
            out.extend_from_slice(&n.percent.to_le_bytes());
            put_str(&mut out, &n.last_error);
        }
        if self.term > 0 {
            out.extend_from_slice(&self.term.to_le_bytes());
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<FleetPlan, String> {
        let mut r = Reader::new(bytes);
        if r.take(4, "magic")? != MAGIC {
            return Err("not a fleet plan (bad magic)".into());
        }
        let version = r.byte("version")?;
        if !(1..=VERSION).contains(&version) {
            return Err(format!("unknown fleet plan version {version}"));
        }
        let old = r.ring("old ring")?.ok_or("the plan has no old ring")?;
        let new = r.ring("new ring")?.ok_or("the plan has no new ring")?;
        let max_rate = r.u64("max rate")?;
        let phase = Phase::from_code(r.byte("phase")?).ok_or("unknown phase")?;
        let cancel = r.flag("cancel flag")?;
        let error = r.string("error")?;
        let count = r.u64("node count")?;
        if count > 1 << 16 {
            return Err(format!("{count} nodes is too many"));
        }
        let mut nodes = Vec::new();
        for _ in 0..count {
            nodes.push(NodeProgress {
                name: r.string("node name")?,
                address: r.string("node address")?,
                role: Role::from_code(r.byte("role")?).ok_or("unknown role")?,
                done: r.flag("done flag")?,
                attempts: u32::try_from(r.u64("attempts")?).unwrap_or(u32::MAX),
                state: r.string("state")?,
                copied: r.u64("copied")?,
                percent: r.u64("percent")?,
                last_error: r.string("last error")?,
            });
        }
        let term = if version >= WITH_TERM {
            r.u64("term")?
        } else {
            0
        };
        if r.pos != bytes.len() {
            return Err(format!(
                "{} unexpected bytes after the plan",
                bytes.len() - r.pos
            ));
        }
        Ok(FleetPlan {
            old,
            new,
            max_rate,
            phase,
            cancel,
            error,
            nodes,
            term,
        })
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}
