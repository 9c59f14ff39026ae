//! The durable state's byte format (RDB aux data): the generator's high-water mark, the ring
//! epoch, the current ring and, during a resharding, the previous ring; from version 2 also
//! whether a cancelled resharding is bringing keys back, and the plan of the fleet operation
//! this node coordinates (`reshard::fleet`, stored as its own bytes).
//!
//! `SHRD`, a format version, then fixed-width little-endian fields and length-prefixed ring
//! texts (the rings' canonical form). Decoding checks every length and rejects truncated,
//! trailing or unknown-version input with an error that says which; it never panics.

use crate::ring::{Algo, HashTag, NodeSpec, RingError, RingSpec};

const MAGIC: &[u8; 4] = b"SHRD";
/// The version this build writes and reads.
pub const FORMAT_VERSION: u8 = 2;

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
    /// The coordinator's plan (`FleetPlan::encode`), if this node coordinates one.
    pub fleet: Option<Vec<u8>>,
}

impl Persisted {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        out.extend_from_slice(MAGIC);
        // Without the version-2 fields the data is written as version 1, which an older build
        // reads: a downgrade stays possible until a fleet operation is used.
        let v2 = self.returning || self.fleet.is_some();
        out.push(if v2 { FORMAT_VERSION } else { 1 });
        out.extend_from_slice(&self.high_water_ms.unwrap_or(i64::MIN).to_le_bytes());
        out.extend_from_slice(&self.ring_epoch.to_le_bytes());
        for ring in [&self.current, &self.previous] {
            let text = ring.as_ref().map(RingSpec::canonical).unwrap_or_default();
            out.extend_from_slice(&(text.len() as u64).to_le_bytes());
            out.extend_from_slice(text.as_bytes());
        }
        if v2 {
            out.push(u8::from(self.returning));
            let plan = self.fleet.as_deref().unwrap_or_default();
            out.extend_from_slice(&(plan.len() as u64).to_le_bytes());
            out.extend_from_slice(plan);
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Persisted, String> {
        let mut r = Reader::new(bytes);
        if r.take(4, "magic")? != MAGIC {
            return Err("not shard data (bad magic)".into());
        }
        let version = r.byte("version")?;
        if version != FORMAT_VERSION && version != 1 {
            return Err(format!(
                "unknown format version {version} (this build reads version {FORMAT_VERSION}): \
                 the data was written by another version of shard"
            ));
        }
        let high_water = r.i64("high-water mark")?;
        let ring_epoch = r.u64("ring epoch")?;
        let current = r.ring("current ring")?;
        let previous = r.ring("previous ring")?;
        let (returning, fleet) = if version >= 2 {
            let returning = r.flag("returning flag")?;
            let plan = r.sized("fleet plan")?;
            (returning, (!plan.is_empty()).then(|| plan.to_vec()))
        } else {
            (false, None)
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
            fleet,
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

/// Reads a ring's canonical text (`RingSpec::canonical`) back.
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
    while let Ok(node) = field("node") {
        let parts: Vec<&[u8]> = node.split(|&b| b == b' ').collect();
        let [name, address, weight] = parts.as_slice() else {
            return Err(RingError::new("a node line needs name, address and weight"));
        };
        nodes.push(NodeSpec::parse(name, address, weight)?);
    }
    RingSpec::new(algo, hashtag, nodes)
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
            fleet: Some(b"plan bytes".to_vec()),
        }
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
    fn canonical_text_parses_back() {
        let s = spec(b"redis-shard", &["x", "y"]);
        assert_eq!(parse_canonical(s.canonical().as_bytes()).unwrap(), s);
        assert!(parse_canonical(b"algo ketama\n").is_err());
        assert!(parse_canonical(b"algo ketama\nhashtag none\nnode a b\n").is_err());
    }
}
