//! `NodeSpec` and `RingSpec`: a validated ring description (algo, hash-tag rule, nodes with
//! `name host:port weight`, and for a `slots` ring an optional explicit slot map given as
//! `SLOTS ranges` after each node's weight), parsed from command arguments, with a canonical
//! text and its digest.
//!
//! A node's address may be the word `sentinel`: the node is then a Sentinel master of its name,
//! and its address is whatever Sentinel says at the time (`route::topology`). Placement hashes
//! names only, so the digest, which keeps the word, survives every failover.

use md5::{Digest, Md5};

use super::algo::Algo;
use super::error::{show, RingError};
use super::hashtag::HashTag;
use super::slot_map::{self, Ranges};
use super::slots;

/// Largest weight a node may have.
pub const MAX_WEIGHT: u32 = 1000;
/// Longest node name, in bytes.
pub const MAX_NAME_LEN: usize = 256;
/// Longest host, in bytes.
pub const MAX_HOST_LEN: usize = 255;

/// One node of a ring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSpec {
    /// The name the peers hash (`name-i`, `name*n`, `name:x`): UTF-8, no whitespace,
    /// control characters or `#`.
    pub name: String,
    /// `host:port` exactly as given, or `sentinel`.
    pub address: String,
    /// The host without IPv6 brackets (empty for a Sentinel node).
    pub host: String,
    /// The port, 1..=65535 (0 for a Sentinel node).
    pub port: u16,
    /// The weight, 1..=1000.
    pub weight: u32,
}

impl NodeSpec {
    /// Validates one `name host:port weight` triplet.
    pub fn parse(name: &[u8], address: &[u8], weight: &[u8]) -> Result<NodeSpec, RingError> {
        let name = parse_name(name)?;
        let (host, port) = parse_address(address, &name)?;
        let weight = parse_weight(weight, &name)?;
        // parse_address accepted only printable ASCII-free-of-space bytes that are UTF-8.
        let address = String::from_utf8_lossy(address).into_owned();
        Ok(NodeSpec {
            name,
            address,
            host,
            port,
            weight,
        })
    }

    /// Whether the node's address comes from Sentinel (its master of the same name).
    pub fn via_sentinel(&self) -> bool {
        self.port == 0
    }
}

/// The address word of a node whose address Sentinel gives.
pub const SENTINEL_ADDRESS: &str = "sentinel";

fn parse_name(name: &[u8]) -> Result<String, RingError> {
    if name.is_empty() {
        return Err(RingError::new("node name must not be empty"));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(RingError::new(format!(
            "node name '{}' is longer than {} bytes",
            show(name),
            MAX_NAME_LEN
        )));
    }
    let text = std::str::from_utf8(name)
        .map_err(|_| RingError::new(format!("node name '{}' is not valid utf-8", show(name))))?;
    if text
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || c == '#')
    {
        return Err(RingError::new(format!(
            "node name '{}' must not contain whitespace, control characters or '#'",
            show(name)
        )));
    }
    Ok(text.to_string())
}

fn parse_address(address: &[u8], name: &str) -> Result<(String, u16), RingError> {
    let bad = |why: &str| {
        RingError::new(format!(
            "address must be host:port, got '{}' for node '{}': {}",
            show(address),
            name,
            why
        ))
    };
    if address == SENTINEL_ADDRESS.as_bytes() {
        return Ok((String::new(), 0));
    }
    if address.iter().any(|&b| b <= b' ' || b == 0x7f) {
        return Err(bad("whitespace or control character"));
    }
    let text = std::str::from_utf8(address).map_err(|_| bad("not valid utf-8"))?;
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let close = rest
            .find(']')
            .ok_or_else(|| bad("missing ']' after ipv6 host"))?;
        let host = &rest[..close];
        let port = rest[close + 1..]
            .strip_prefix(':')
            .ok_or_else(|| bad("missing ':port' after ']'"))?;
        if host.is_empty() {
            return Err(bad("empty host"));
        }
        if !host.contains(':') || host.contains(['[', ']']) {
            return Err(bad("not an ipv6 address between brackets"));
        }
        (host, port)
    } else {
        let (host, port) = text
            .rsplit_once(':')
            .ok_or_else(|| bad("missing ':port'"))?;
        if host.is_empty() {
            return Err(bad("empty host"));
        }
        if host.contains(':') {
            return Err(bad(
                "an ipv6 host must be written in brackets, like [::1]:6379",
            ));
        }
        if host.contains(['[', ']']) {
            return Err(bad("unexpected bracket"));
        }
        (host, port)
    };
    if host.len() > MAX_HOST_LEN {
        return Err(bad("host too long"));
    }
    let port = parse_uint(port.as_bytes())
        .filter(|p| (1..=65535).contains(p))
        .ok_or_else(|| bad("port must be an integer from 1 to 65535"))?;
    Ok((host.to_string(), port as u16))
}

fn parse_weight(weight: &[u8], name: &str) -> Result<u32, RingError> {
    parse_uint(weight)
        .filter(|w| (1..=MAX_WEIGHT as u64).contains(w))
        .map(|w| w as u32)
        .ok_or_else(|| {
            RingError::new(format!(
                "weight must be an integer from 1 to {}, got '{}' for node '{}'",
                MAX_WEIGHT,
                show(weight),
                name
            ))
        })
}

/// A plain decimal number of at most 9 digits (no sign, no spaces).
fn parse_uint(text: &[u8]) -> Option<u64> {
    if text.is_empty() || text.len() > 9 || !text.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(
        text.iter()
            .fold(0u64, |acc, &d| acc * 10 + u64::from(d - b'0')),
    )
}

/// A validated ring description.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingSpec {
    /// The placement algorithm.
    pub algo: Algo,
    /// The hash-tag rule applied to keys before hashing.
    pub hashtag: HashTag,
    /// The nodes, in the order given (the order matters for ties and for `slots`).
    pub nodes: Vec<NodeSpec>,
    /// A `slots` ring's explicit slot map: each node's ranges, in node order, in normal form
    /// (`slot_map::check_cover`). `None`: the contiguous split of the weights, and a map equal
    /// to that split is `None` too, so equal placements have equal digests.
    pub slot_map: Option<Vec<Ranges>>,
}

impl RingSpec {
    /// The ring as used with the shardjs layout when it has no hash-tag rule of its own: it
    /// hashes what comes before a key's first `-`, as Shardjs does (the slot algos keep Redis
    /// Cluster's rule). The rule is part of the spec, so the ring (and its digest) does not
    /// change if the layout does.
    pub fn with_shardjs_default(self) -> Result<RingSpec, RingError> {
        if matches!(self.algo, Algo::Slots | Algo::Cluster) {
            return Ok(self);
        }
        RingSpec::new(self.algo, HashTag::Shardjs, self.nodes)
    }

    /// Validates a spec: at least one node (the `cluster` algo may have none) and unique names.
    pub fn new(algo: Algo, hashtag: HashTag, nodes: Vec<NodeSpec>) -> Result<RingSpec, RingError> {
        if nodes.is_empty() && algo != Algo::Cluster {
            return Err(RingError::new("a ring needs at least one node"));
        }
        let mut names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
        names.sort_unstable();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(RingError::new(format!("duplicate node name '{}'", w[0])));
        }
        Ok(RingSpec {
            algo,
            hashtag,
            nodes,
            slot_map: None,
        })
    }

    /// The same ring with an explicit slot map (each node's ranges, in node order): only a
    /// `slots` ring takes one, and it must give every slot to exactly one node and every node
    /// a slot. A map equal to the contiguous split of the weights is dropped.
    pub fn with_slot_map(mut self, map: Vec<Ranges>) -> Result<RingSpec, RingError> {
        if self.algo != Algo::Slots {
            return Err(RingError::new(format!(
                "only the slots algo takes a slot map (SLOTS), not {}",
                self.algo.name()
            )));
        }
        let names: Vec<&str> = self.nodes.iter().map(|n| n.name.as_str()).collect();
        let map = slot_map::check_cover(&names, &map)?;
        let split = slots::contiguous(&self).ok();
        let same = split.is_some_and(|s| s.iter().zip(&map).all(|(r, m)| m.as_slice() == [*r]));
        self.slot_map = (!same).then_some(map);
        Ok(self)
    }

    /// Each node's slot ranges, in node order: the explicit map, else the contiguous split;
    /// `None` for an algo other than `slots` or a split that leaves a node without a slot.
    pub fn slot_ranges(&self) -> Option<Vec<Ranges>> {
        if self.algo != Algo::Slots {
            return None;
        }
        match &self.slot_map {
            Some(map) => Some(map.clone()),
            None => slots::contiguous(self)
                .ok()
                .map(|split| split.into_iter().map(|r| vec![r]).collect()),
        }
    }

    /// Parses `algo`, an optional hash-tag rule (the algo's default when `None`) and a flat list
    /// of `name host:port weight` triplets, each optionally followed by `SLOTS ranges` (a
    /// `slots` ring's explicit map: every node then gives its slots).
    pub fn from_args(
        algo: &[u8],
        hashtag: Option<&[u8]>,
        node_fields: &[&[u8]],
    ) -> Result<RingSpec, RingError> {
        let algo = Algo::parse(algo)?;
        let hashtag = match hashtag {
            Some(h) => HashTag::parse(h)?,
            None => algo.default_hashtag(),
        };
        let groups = group_fields(node_fields)?;
        let mut nodes = Vec::with_capacity(groups.len());
        let mut map: Vec<Option<Ranges>> = Vec::with_capacity(groups.len());
        let mut seen = std::collections::HashSet::with_capacity(groups.len());
        for (t, slots) in &groups {
            let node = NodeSpec::parse(t[0], t[1], t[2])?;
            if !seen.insert(node.name.clone()) {
                return Err(RingError::new(format!(
                    "duplicate node name '{}'",
                    node.name
                )));
            }
            map.push(
                slots
                    .map(|list| slot_map::parse_ranges(list, &node.name))
                    .transpose()?,
            );
            nodes.push(node);
        }
        let spec = RingSpec::new(algo, hashtag, nodes)?;
        if map.iter().all(Option::is_none) {
            return Ok(spec);
        }
        if let Some(i) = map.iter().position(Option::is_none) {
            return Err(RingError::new(format!(
                "node '{}' has no SLOTS: once a node gives its slots, every node does",
                spec.nodes[i].name
            )));
        }
        spec.with_slot_map(map.into_iter().flatten().collect())
    }

    /// Whether node fields (as `from_args` takes them) give their slots with `SLOTS`: a map
    /// given is the operator's, even one equal to the weights' split (which the spec keeps as
    /// no map).
    pub fn fields_give_slots(node_fields: &[&[u8]]) -> bool {
        group_fields(node_fields).is_ok_and(|g| g.iter().any(|(_, list)| list.is_some()))
    }

    /// A stable text form: `algo <a>\nhashtag <h>\n` then `node <name> <address> <weight>\n`
    /// per node in the given order; with an explicit slot map, each node line ends with its
    /// ranges (` 0-4095,8192-9000`).
    pub fn canonical(&self) -> String {
        let mut out = String::with_capacity(32 + self.nodes.len() * 40);
        out.push_str("algo ");
        out.push_str(self.algo.name());
        out.push_str("\nhashtag ");
        out.push_str(self.hashtag.name());
        out.push('\n');
        for (i, n) in self.nodes.iter().enumerate() {
            out.push_str("node ");
            out.push_str(&n.name);
            out.push(' ');
            out.push_str(&n.address);
            out.push(' ');
            out.push_str(&n.weight.to_string());
            if let Some(ranges) = self.slot_map.as_ref().and_then(|m| m.get(i)) {
                out.push(' ');
                out.push_str(&slot_map::format_ranges(ranges));
            }
            out.push('\n');
        }
        out
    }

    /// Lowercase hex MD5 of `canonical()`.
    pub fn digest(&self) -> String {
        let d = Md5::digest(self.canonical().as_bytes());
        let mut out = String::with_capacity(32);
        for b in d.iter() {
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 15)]));
        }
        out
    }

    /// Index of the node called `name`.
    pub fn node_index(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.name == name)
    }

    /// Sum of the weights.
    pub fn total_weight(&self) -> u64 {
        self.nodes.iter().map(|n| u64::from(n.weight)).sum()
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// The word after a node's weight that introduces its slot ranges.
const SLOTS_WORD: &str = "SLOTS";

/// A node's `name host:port weight` and its `SLOTS` list, if given.
type Group<'a> = (&'a [&'a [u8]], Option<&'a [u8]>);

/// Cuts the node fields into nodes: three fields each, then `SLOTS ranges` when the word
/// follows a weight with a list after it that is no address (a node may be called `slots`: its
/// address has a `:` or is `sentinel`, which no slot list has).
fn group_fields<'a>(fields: &'a [&'a [u8]]) -> Result<Vec<Group<'a>>, RingError> {
    let is_address = |f: &[u8]| f.contains(&b':') || f == SENTINEL_ADDRESS.as_bytes();
    let mut groups = Vec::with_capacity(fields.len() / 3);
    let mut with_slots = false;
    let mut i = 0;
    while i < fields.len() {
        if fields.len() - i < 3 {
            if with_slots || fields[i..].iter().any(|f| is(f, SLOTS_WORD)) {
                let after = groups
                    .last()
                    .map(|(t, _): &Group| format!(" after node '{}'", show(t[0])))
                    .unwrap_or_default();
                return Err(RingError::new(format!(
                    "nodes are given as 'name host:port weight [SLOTS ranges]', got {} more field{}{after}",
                    fields.len() - i,
                    if fields.len() - i == 1 { "" } else { "s" }
                )));
            }
            return Err(RingError::new(format!(
                "nodes are given as 'name host:port weight' triplets, got {} fields, not a multiple of 3",
                fields.len()
            )));
        }
        let triplet = &fields[i..i + 3];
        i += 3;
        let list = match fields.get(i..i + 2) {
            Some([word, list]) if is(word, SLOTS_WORD) && !is_address(list) => {
                i += 2;
                with_slots = true;
                Some(*list)
            }
            _ => None,
        };
        groups.push((triplet, list));
    }
    Ok(groups)
}

fn is(field: &[u8], word: &str) -> bool {
    field.eq_ignore_ascii_case(word.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<&[u8]> {
        s.split(' ')
            .filter(|x| !x.is_empty())
            .map(|x| x.as_bytes())
            .collect()
    }

    fn err(algo: &str, fields: &str) -> String {
        RingSpec::from_args(algo.as_bytes(), None, &args(fields))
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn parses_triplets() {
        let s = RingSpec::from_args(
            b"ketama",
            None,
            &args("a 127.0.0.1:7001 1 b [::1]:7002 3 c redis.local:6379 1000"),
        )
        .unwrap();
        assert_eq!(s.algo, Algo::Ketama);
        assert_eq!(s.hashtag, HashTag::None);
        assert_eq!(s.nodes.len(), 3);
        assert_eq!(s.nodes[1].name, "b");
        assert_eq!(s.nodes[1].address, "[::1]:7002");
        assert_eq!(s.nodes[1].host, "::1");
        assert_eq!(s.nodes[1].port, 7002);
        assert_eq!(s.nodes[1].weight, 3);
        assert_eq!(s.nodes[2].host, "redis.local");
        assert_eq!(s.total_weight(), 1004);
        assert_eq!(s.node_index("c"), Some(2));
        let s = RingSpec::from_args(b"jedis", Some(b"none"), &args("a h:1 1")).unwrap();
        assert_eq!(s.hashtag, HashTag::None);
    }

    #[test]
    fn validation_errors() {
        assert_eq!(err("ketama", "a h:1 1 a h:2 1"), "duplicate node name 'a'");
        assert_eq!(
            err("ketama", "a h:1 1 b h:2 0"),
            "weight must be an integer from 1 to 1000, got '0' for node 'b'"
        );
        assert_eq!(
            err("ketama", "a h:1 1001"),
            "weight must be an integer from 1 to 1000, got '1001' for node 'a'"
        );
        assert_eq!(
            err("ketama", "a h:1 -1"),
            "weight must be an integer from 1 to 1000, got '-1' for node 'a'"
        );
        assert_eq!(
            err("ketama", "a h:1 1.5"),
            "weight must be an integer from 1 to 1000, got '1.5' for node 'a'"
        );
        assert_eq!(
            err("ketama", "a h:1 99999999999999999999"),
            "weight must be an integer from 1 to 1000, got '99999999999999999999' for node 'a'"
        );
        assert_eq!(err("ketama", ""), "a ring needs at least one node");
        assert_eq!(err("ketama", "a h:1"), "nodes are given as 'name host:port weight' triplets, got 2 fields, not a multiple of 3");
        assert_eq!(err("nope", "a h:1 1"),
            "unknown algo 'nope', expected one of ketama, jedis, jedis-murmur, redis-shard, slots, cluster");
        assert!(err("ketama", "a h:0 1").contains("port must be an integer from 1 to 65535"));
        assert!(err("ketama", "a h:65536 1").contains("port must be an integer from 1 to 65535"));
        assert!(err("ketama", "a h: 1").contains("port must be an integer"));
        assert!(err("ketama", "a h 1").contains("missing ':port'"));
        assert!(err("ketama", "a :1 1").contains("empty host"));
        assert!(err("ketama", "a ::1:6379 1").contains("brackets"));
        assert!(err("ketama", "a []:1 1").contains("empty host"));
        assert!(err("ketama", "a [::1]6379 1").contains("missing ':port' after ']'"));
        assert!(err("ketama", "a [::1:6379 1").contains("missing ']'"));
        assert_eq!(err("ketama", "a h:x 1"), "address must be host:port, got 'h:x' for node 'a': port must be an integer from 1 to 65535");
        let e = RingSpec::from_args(b"ketama", None, &[b"", b"h:1", b"1"]).unwrap_err();
        assert_eq!(e.to_string(), "node name must not be empty");
        let e = RingSpec::from_args(b"ketama", None, &[b"a b", b"h:1", b"1"]).unwrap_err();
        assert!(e.to_string().contains("must not contain whitespace"));
        let e = RingSpec::from_args(b"ketama", None, &[b"\xff", b"h:1", b"1"]).unwrap_err();
        assert!(e.to_string().contains("not valid utf-8"));
        let e = RingSpec::from_args(b"ketama", Some(b"bogus"), &[b"a", b"h:1", b"1"]).unwrap_err();
        assert!(e.to_string().starts_with("unknown hashtag rule 'bogus'"));
    }

    #[test]
    fn a_sentinel_node_keeps_the_word_in_its_digest() {
        let s = RingSpec::from_args(b"ketama", None, &args("n0 sentinel 1 n1 127.0.0.1:7001 2"))
            .unwrap();
        assert!(s.nodes[0].via_sentinel());
        assert!(!s.nodes[1].via_sentinel());
        assert_eq!(s.nodes[0].address, "sentinel");
        assert!(s.canonical().contains("node n0 sentinel 1\n"));
        assert!(err("ketama", "a Sentinel 1").contains("missing ':port'"));
        assert!(err("ketama", "a sentinel:0 1").contains("port must be"));
    }

    #[test]
    fn cluster_algo_may_have_no_nodes() {
        let s = RingSpec::from_args(b"cluster", None, &[]).unwrap();
        assert!(s.nodes.is_empty());
        assert_eq!(s.hashtag, HashTag::Cluster);
    }

    #[test]
    fn canonical_and_digest() {
        let s = RingSpec::from_args(b"ketama", None, &args("a 127.0.0.1:7001 1 b [::1]:7002 3"))
            .unwrap();
        let c = s.canonical();
        assert_eq!(
            c,
            "algo ketama\nhashtag none\nnode a 127.0.0.1:7001 1\nnode b [::1]:7002 3\n"
        );
        // md5 of the text, as `printf "$text" | md5sum` prints it.
        assert_eq!(s.digest(), "bd16001dffd448532b3491535307940e");
        assert_eq!(s.digest(), s.clone().digest());
        let other =
            RingSpec::from_args(b"ketama", None, &args("b [::1]:7002 3 a 127.0.0.1:7001 1"))
                .unwrap();
        assert_ne!(s.digest(), other.digest());
        let empty = RingSpec::from_args(b"cluster", None, &[]).unwrap();
        assert_eq!(empty.digest(), "8a78b94e28506dcf6911869bd5b16784");
    }
}
