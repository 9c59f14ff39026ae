//! The durable state's byte format (RDB aux data): the generator's high-water mark, the ring
//! epoch, the current ring and, during a resharding, the previous ring; from version 2 also
//! whether a cancelled resharding is bringing keys back, and the plan of the fleet operation
//! this node coordinates (`reshard::fleet`, stored as its own bytes); version 3 is version 2
//! whose rings may carry a `slots` ring's explicit slot map (its ranges on each node line);
//! version 4 is version 3 whose returning flag may be 2: the rings of a fleet operation's fence,
//! or 3: settled rings (the copies are done, COMMIT's first step), which a build that knows only
//! 0 to 2 refuses, naming the flag;
//! version 5 is version 4 followed by the term of the fleet operation this node follows
//! (`ring::lease::Record`: the term, the lease's length, whether it was handed over, the
//! holder's name, address and run id), written only once a term has reached the node;
//! version 6 is version 5 followed by the transactions' own bytes (`txn::durable`: the prepared
//! parts and the done list of an owner), written only while there are some.
//!
//! `SHRD`, a format version, then fixed-width little-endian fields and length-prefixed ring
//! texts (the rings' canonical form). Decoding checks every length and rejects truncated,
//! trailing or unknown-version input with an error that says which; it never panics.

use crate::ring::lease::{Holder, Record};
use crate::ring::{parse_ranges, Algo, HashTag, NodeSpec, RingError, RingSpec};

const MAGIC: &[u8; 4] = b"SHRD";
/// The newest version this build writes; it reads every version from 1.
pub const FORMAT_VERSION: u8 = 6;
/// The version with the transactions' bytes.
const WITH_TXN: u8 = 6;
/// The version with the fleet operation's term.
const WITH_TERM: u8 = 5;
/// The version whose returning flag may be 2 (a fence).
const WITH_FENCE: u8 = 4;
/// The version whose rings may carry a slot map.
const WITH_SLOT_MAP: u8 = 3;
/// The version with the returning flag and the fleet plan.
const WITH_FLEET: u8 = 2;

/// What survives a restart.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Persisted {
    /// The last unix millisecond a key was issued in, if any.
    pub high_water_ms: Option<i64>,
    pub ring_epoch: u64,
    pub current: Option<RingSpec>,
    pub previous: Option<RingSpec>,
    /// The rings are those of a cancel bringing keys back (`RingState::returning`).
    pub returning: bool,
    /// The rings are those of a fleet operation's fence (`RingState::fence`).
    pub fence: bool,
    /// The rings are settled: the copies are done (`RingState::settled`).
    pub settled: bool,
    /// The coordinator's plan (`FleetPlan::encode`), if this node coordinates one.
    pub fleet: Option<Vec<u8>>,
    /// The term of the fleet operation this node follows (term 0: none yet).
    pub lease: Record,
    /// The transactions' durable records (`txn::durable`), if any.
    pub txn: Option<Vec<u8>>,
}

impl Persisted {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        out.extend_from_slice(MAGIC);
        // The oldest version that holds the data is written, which an older build reads: a
        // downgrade stays possible until a fleet operation (version 2) or a slot map (version
        // 3, whose rings an older build cannot read) is used.
        let mapped = [&self.current, &self.previous]
            .iter()
            .any(|r| r.as_ref().is_some_and(|r| r.slot_map.is_some()));
        let version = if self.txn.is_some() {
            WITH_TXN
        } else if self.lease != Record::default() {
            WITH_TERM
        } else if self.fence || self.settled {
            WITH_FENCE
        } else if mapped {
            WITH_SLOT_MAP
        } else if self.returning || self.fleet.is_some() {
            WITH_FLEET
        } else {
            1
        };
        let v2 = version >= WITH_FLEET;
        out.push(version);
        out.extend_from_slice(&self.high_water_ms.unwrap_or(i64::MIN).to_le_bytes());
        out.extend_from_slice(&self.ring_epoch.to_le_bytes());
        for ring in [&self.current, &self.previous] {
            let text = ring.as_ref().map(RingSpec::canonical).unwrap_or_default();
            out.extend_from_slice(&(text.len() as u64).to_le_bytes());
            out.extend_from_slice(text.as_bytes());
        }
        if v2 {
            out.push(if self.fence {
                2
            } else if self.settled {
                3
            } else {
                u8::from(self.returning)
            });
            let plan = self.fleet.as_deref().unwrap_or_default();
            out.extend_from_slice(&(plan.len() as u64).to_le_bytes());
            out.extend_from_slice(plan);
        }
        if version >= WITH_TERM {
            let l = &self.lease;
            out.extend_from_slice(&l.term.to_le_bytes());
            out.extend_from_slice(&l.lease_ms.to_le_bytes());
            out.push(u8::from(l.released));
            for text in [&l.holder.name, &l.holder.address, &l.holder.run_id] {
                out.extend_from_slice(&(text.len() as u64).to_le_bytes());
                out.extend_from_slice(text.as_bytes());
            }
        }
        if version >= WITH_TXN {
            let txn = self.txn.as_deref().unwrap_or_default();
            out.extend_from_slice(&(txn.len() as u64).to_le_bytes());
            out.extend_from_slice(txn);
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Persisted, String> {
        let mut r = Reader::new(bytes);
        if r.take(4, "magic")? != MAGIC {
            return Err("not shard data (bad magic)".into());
        }
        let version = r.byte("version")?;
        if !(1..=FORMAT_VERSION).contains(&version) {
            return Err(format!(
                "unknown format version {version} (this build reads version {FORMAT_VERSION}): \
                 the data was written by another version of shard"
            ));
        }
        let high_water = r.i64("high-water mark")?;
        let ring_epoch = r.u64("ring epoch")?;
        let current = r.ring("current ring")?;
        let previous = r.ring("previous ring")?;
        let (returning, fence, settled, fleet) = if version >= WITH_FLEET {
            let (returning, fence, settled) = match r.byte("returning flag")? {
                0 => (false, false, false),
                1 => (true, false, false),
                2 if version >= WITH_FENCE => (true, true, false),
                3 if version >= WITH_FENCE => (false, false, true),
                other => {
                    let allowed = if version >= WITH_FENCE {
                        "0, 1, 2 or 3"
                    } else {
                        "0 or 1"
                    };
                    return Err(format!("the returning flag is {other}, not {allowed}"));
                }
            };
            let plan = r.sized("fleet plan")?;
            let plan = (!plan.is_empty()).then(|| plan.to_vec());
            (returning, fence, settled, plan)
        } else {
            (false, false, false, None)
        };
        let lease = if version >= WITH_TERM {
            Record {
                term: r.u64("term")?,
                lease_ms: r.u64("lease length")?,
                released: r.flag("released flag")?,
                holder: Holder {
                    name: r.string("term holder's name")?,
                    address: r.string("term holder's address")?,
                    run_id: r.string("term holder's run id")?,
                },
            }
        } else {
            Record::default()
        };
        let txn = if version >= WITH_TXN {
            Some(r.sized("transactions' records")?.to_vec()).filter(|t| !t.is_empty())
        } else {
            None
        };
        if r.pos != bytes.len() {
            return Err(format!(
                "{} unexpected bytes after the data",
                bytes.len() - r.pos
            ));
        }
        if previous.is_some() && current.is_none() {
            return Err("a previous ring without a current ring".into());
        }
        Ok(Persisted {
            high_water_ms: (high_water != i64::MIN).then_some(high_water),
            ring_epoch,
            current,
            previous,
            returning,
            fence,
            settled,
            fleet,
            lease,
            txn,
        })
    }
}

/// Reads length-checked fields from bytes (this format's, and the fleet plan's): every read
/// that would pass the end is an error naming the field, never a panic.
pub(crate) struct Reader<'a> {
    pub(crate) bytes: &'a [u8],
    pub(crate) pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { bytes, pos: 0 }
    }

    pub(crate) fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        let end = self.pos.checked_add(n).filter(|e| *e <= self.bytes.len());
        let end = end.ok_or_else(|| format!("truncated data: the {what} is cut short"))?;
        let out = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    pub(crate) fn byte(&mut self, what: &str) -> Result<u8, String> {
        Ok(self.take(1, what)?[0])
    }

    /// A byte that must be 0 or 1.
    pub(crate) fn flag(&mut self, what: &str) -> Result<bool, String> {
        match self.byte(what)? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(format!("the {what} is {other}, not 0 or 1")),
        }
    }

    pub(crate) fn u64(&mut self, what: &str) -> Result<u64, String> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    pub(crate) fn i64(&mut self, what: &str) -> Result<i64, String> {
        self.u64(what).map(|v| v as i64)
    }

    /// A field prefixed with its u64 length.
    pub(crate) fn sized(&mut self, what: &str) -> Result<&'a [u8], String> {
        let len = self.u64(what)?;
        let len = usize::try_from(len).map_err(|_| format!("the {what} is too long"))?;
        self.take(len, what)
    }

    pub(crate) fn string(&mut self, what: &str) -> Result<String, String> {
        let b = self.sized(what)?;
        String::from_utf8(b.to_vec()).map_err(|_| format!("the {what} is not UTF-8"))
    }

    /// A ring's canonical text prefixed with its length; empty for none.
    pub(crate) fn ring(&mut self, what: &str) -> Result<Option<RingSpec>, String> {
        let text = self.sized(what)?;
        if text.is_empty() {
            return Ok(None);
        }
        parse_canonical(text)
            .map(Some)
            .map_err(|e| format!("the {what} is invalid: {e}"))
    }
}

/// Reads a ring's canonical text (`RingSpec::canonical`) back: node lines of three fields, or
/// of four when the ring has a slot map (every line then).
pub fn parse_canonical(text: &[u8]) -> Result<RingSpec, RingError> {
    let mut lines = text.split(|&b| b == b'\n').filter(|l| !l.is_empty());
    let mut field = |name: &str| -> Result<&[u8], RingError> {
        let line = lines
            .next()
            .ok_or_else(|| RingError::new(format!("missing {name}")))?;
        line.strip_prefix(name.as_bytes())
            .and_then(|rest| rest.strip_prefix(b" "))
            .ok_or_else(|| RingError::new(format!("expected '{name} ...'")))
    };
    let algo = Algo::parse(field("algo")?)?;
    let hashtag = HashTag::parse(field("hashtag")?)?;
    let mut nodes = Vec::new();
    let mut map = Vec::new();
    while let Ok(node) = field("node") {
        let parts: Vec<&[u8]> = node.split(|&b| b == b' ').collect();
        let (name, address, weight, slots) = match parts.as_slice() {
            [name, address, weight] => (name, address, weight, None),
            [name, address, weight, slots] => (name, address, weight, Some(slots)),
            _ => {
                return Err(RingError::new(
                    "a node line needs name, address and weight, and slot ranges if the ring has a slot map",
                ))
            }
        };
        let node = NodeSpec::parse(name, address, weight)?;
        map.push(slots.map(|s| parse_ranges(s, &node.name)).transpose()?);
        nodes.push(node);
    }
    let spec = RingSpec::new(algo, hashtag, nodes)?;
    if map.iter().all(Option::is_none) {
        return Ok(spec);
    }
    if map.iter().any(Option::is_none) {
        return Err(RingError::new(
            "a ring with a slot map gives slot ranges on every node line",
        ));
    }
    spec.with_slot_map(map.into_iter().flatten().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(algo: &[u8], names: &[&str]) -> RingSpec {
        let fields: Vec<String> = names
            .iter()
            .enumerate()
            .flat_map(|(i, n)| {
                [
                    n.to_string(),
                    format!("10.0.0.{i}:6379"),
                    format!("{}", i + 1),
                ]
            })
            .collect();
        let refs: Vec<&[u8]> = fields.iter().map(|s| s.as_bytes()).collect();
        RingSpec::from_args(algo, None, &refs).unwrap()
    }

    fn sample() -> Persisted {
        Persisted {
            high_water_ms: Some(1_795_305_412_170),
            ring_epoch: 7,
            current: Some(spec(b"ketama", &["a", "b", "c"])),
            previous: Some(spec(b"jedis", &["a", "b"])),
            returning: true,
            fence: false,
            settled: false,
            fleet: Some(b"plan bytes".to_vec()),
            lease: Record::default(),
            txn: None,
        }
    }

    #[test]
    fn transactions_are_written_as_version_6_and_read_back() {
        for base in [Persisted::default(), sample()] {
            let with_txn = Persisted {
                txn: Some(b"prepared parts".to_vec()),
                ..base
            };
            let bytes = with_txn.encode();
            assert_eq!(bytes[4], 6, "an older build refuses it by its version");
            assert_eq!(Persisted::decode(&bytes).unwrap(), with_txn);
            for cut in 0..bytes.len() {
                assert!(Persisted::decode(&bytes[..cut]).is_err(), "{cut}");
            }
        }
    }

    #[test]
    fn a_term_is_written_as_version_5_and_read_back() {
        let lease = Record {
            term: 7,
            lease_ms: 10_000,
            released: true,
            holder: Holder {
                name: "n2".into(),
                address: "10.0.0.3:6379".into(),
                run_id: "a".repeat(40),
            },
        };
        for base in [Persisted::default(), sample()] {
            let with_term = Persisted {
                lease: lease.clone(),
                returning: true,
                fence: true,
                ..base
            };
            let bytes = with_term.encode();
            assert_eq!(bytes[4], 5, "an older build refuses it by its version");
            assert_eq!(Persisted::decode(&bytes).unwrap(), with_term);
            for cut in 0..bytes.len() {
                assert!(Persisted::decode(&bytes[..cut]).is_err(), "{cut}");
            }
        }
        // Without a term the version is the one an older build reads.
        assert_eq!(sample().encode()[4], 2);
    }

    #[test]
    fn settled_rings_are_written_as_version_4_and_read_back() {
        let settled = Persisted {
            returning: false,
            settled: true,
            ..sample()
        };
        let bytes = settled.encode();
        assert_eq!(bytes[4], 4);
        assert_eq!(Persisted::decode(&bytes).unwrap(), settled);
        // A build that knows the flags up to the fence's refuses it, naming the flag (the
        // text it gives: "the returning flag is 3, not 0, 1 or 2"); an older version too.
        let mut older = bytes.clone();
        older[4] = 3;
        assert!(Persisted::decode(&older)
            .unwrap_err()
            .contains("returning flag is 3"));
    }

    #[test]
    fn a_fence_is_written_as_version_4_and_read_back() {
        let fenced = Persisted {
            fence: true,
            ..sample()
        };
        let bytes = fenced.encode();
        assert_eq!(bytes[4], 4, "an older build refuses it by its version");
        assert_eq!(Persisted::decode(&bytes).unwrap(), fenced);
        // A fence flag in an older version is refused, never read as something else.
        let mut older = bytes.clone();
        older[4] = 3;
        assert!(Persisted::decode(&older)
            .unwrap_err()
            .contains("returning flag is 2"));
    }

    #[test]
    fn round_trips() {
        for p in [sample(), Persisted::default()] {
            assert_eq!(Persisted::decode(&p.encode()).unwrap(), p);
        }
        let cluster = Persisted {
            current: Some(RingSpec::new(Algo::Cluster, HashTag::Cluster, vec![]).unwrap()),
            ..Persisted::default()
        };
        assert_eq!(Persisted::decode(&cluster.encode()).unwrap(), cluster);
    }

    #[test]
    fn every_truncation_is_an_error() {
        let bytes = sample().encode();
        for cut in 0..bytes.len() {
            let err = Persisted::decode(&bytes[..cut]).unwrap_err();
            assert!(
                err.contains("truncated") || err.contains("magic") || err.contains("invalid"),
                "{cut}: {err}"
            );
        }
    }

    #[test]
    fn without_the_new_fields_version_1_is_written_and_read() {
        let v1 = Persisted {
            returning: false,
            fleet: None,
            ..sample()
        };
        let bytes = v1.encode();
        assert_eq!(bytes[4], 1, "an older build can read it");
        assert_eq!(Persisted::decode(&bytes).unwrap(), v1);
        assert_eq!(sample().encode()[4], 2);
    }

    /// The bytes an older build wrote, spelled out field by field: `high` the high-water mark,
    /// `epoch`, the current ring's text, no previous ring, then version 2's fields if any.
    fn old_bytes(version: u8, ring: &str, v2: Option<(u8, &[u8])>) -> Vec<u8> {
        let mut b = b"SHRD".to_vec();
        b.push(version);
        b.extend_from_slice(&1_700_000_000_000i64.to_le_bytes());
        b.extend_from_slice(&5u64.to_le_bytes());
        b.extend_from_slice(&(ring.len() as u64).to_le_bytes());
        b.extend_from_slice(ring.as_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
        if let Some((returning, plan)) = v2 {
            b.push(returning);
            b.extend_from_slice(&(plan.len() as u64).to_le_bytes());
            b.extend_from_slice(plan);
        }
        b
    }

    #[test]
    fn what_older_builds_wrote_still_reads() {
        let text = "algo slots\nhashtag cluster\nnode a 10.0.0.1:6379 1\nnode b 10.0.0.2:6379 1\n";
        let want = Persisted {
            high_water_ms: Some(1_700_000_000_000),
            ring_epoch: 5,
            current: Some(parse_canonical(text.as_bytes()).unwrap()),
            ..Persisted::default()
        };
        assert_eq!(want.current.as_ref().unwrap().slot_map, None);
        assert_eq!(Persisted::decode(&old_bytes(1, text, None)).unwrap(), want);
        let v2 = Persisted::decode(&old_bytes(2, text, Some((1, b"plan")))).unwrap();
        assert_eq!(
            v2,
            Persisted {
                returning: true,
                fleet: Some(b"plan".to_vec()),
                ..want.clone()
            }
        );
        // And this build writes them the same way while no ring has a slot map.
        assert_eq!(want.encode(), old_bytes(1, text, None));
        assert_eq!(v2.encode(), old_bytes(2, text, Some((1, b"plan"))));
    }

    #[test]
    fn a_slot_map_is_written_as_version_3_and_read_back() {
        let fields: Vec<&[u8]> = vec![
            b"a",
            b"10.0.0.1:6379",
            b"1",
            b"SLOTS",
            b"0-4095,8192-16383",
            b"b",
            b"10.0.0.2:6379",
            b"1",
            b"SLOTS",
            b"4096-8191",
        ];
        let mapped = RingSpec::from_args(b"slots", None, &fields).unwrap();
        assert!(mapped.slot_map.is_some());
        for (current, previous) in [
            (Some(mapped.clone()), None),
            (Some(spec(b"slots", &["a", "b"])), Some(mapped.clone())),
        ] {
            let p = Persisted {
                current,
                previous,
                ..Persisted::default()
            };
            let bytes = p.encode();
            assert_eq!(bytes[4], 3, "an older build refuses it by its version");
            assert_eq!(Persisted::decode(&bytes).unwrap(), p);
        }
        let with_plan = Persisted {
            current: Some(mapped),
            returning: true,
            fleet: Some(b"plan".to_vec()),
            ..Persisted::default()
        };
        assert_eq!(Persisted::decode(&with_plan.encode()).unwrap(), with_plan);
    }

    #[test]
    fn unknown_version_and_garbage() {
        let mut bytes = sample().encode();
        bytes[4] = 9;
        assert!(Persisted::decode(&bytes)
            .unwrap_err()
            .contains("unknown format version 9"));
        let mut long = sample().encode();
        long.push(0);
        assert!(Persisted::decode(&long)
            .unwrap_err()
            .contains("unexpected bytes"));
        let mut huge = sample().encode();
        huge[21..29].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(Persisted::decode(&huge).is_err());
    }

    #[test]
    fn canonical_text_with_a_map_is_read_strictly() {
        let read = |t: &str| parse_canonical(t.as_bytes()).map_err(|e| e.to_string());
        let text = "algo slots\nhashtag cluster\nnode a h:1 1 0-4095,8192-9000\nnode b h:2 1 4096-8191,9001-16383\n";
        let spec = read(text).unwrap();
        assert_eq!(spec.canonical(), text);
        assert_eq!(spec.slot_map.as_ref().map(Vec::len), Some(2));
        // A map equal to the split of the weights reads as the ring without one.
        let plain =
            read("algo slots\nhashtag cluster\nnode a h:1 1 0-8191\nnode b h:2 1 8192-16383\n");
        assert_eq!(
            plain.unwrap().canonical(),
            "algo slots\nhashtag cluster\nnode a h:1 1\nnode b h:2 1\n"
        );
        assert!(
            read("algo slots\nhashtag cluster\nnode a h:1 1 0-8191\nnode b h:2 1\n")
                .unwrap_err()
                .contains("slot ranges on every node line")
        );
        assert!(read(
            "algo slots\nhashtag cluster\nnode a h:1 1 0-8191\nnode b h:2 1 8000-16383\n"
        )
        .unwrap_err()
        .contains("slot 8000 is given to both"));
        assert!(read("algo ketama\nhashtag none\nnode a h:1 1 0-16383\n")
            .unwrap_err()
            .contains("only the slots algo"));
        assert!(read("algo slots\nhashtag cluster\nnode a h:1 1 0-16383 x\n").is_err());
    }

    #[test]
    fn canonical_text_parses_back() {
        let s = spec(b"redis-shard", &["x", "y"]);
        assert_eq!(parse_canonical(s.canonical().as_bytes()).unwrap(), s);
        assert!(parse_canonical(b"algo ketama\n").is_err());
        assert!(parse_canonical(b"algo ketama\nhashtag none\nnode a b\n").is_err());
    }
}
