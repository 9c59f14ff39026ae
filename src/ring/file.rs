//! Ring-file parser: text with one node per line `name host:port weight`, `#` comments
//! (whole-line or trailing) and blank lines; errors name the file and the line. Never panics.

use super::algo::Algo;
use super::error::{show, RingError};
use super::hashtag::HashTag;
use super::spec::{NodeSpec, RingSpec};

/// Parses a ring file's bytes into nodes, validating each line and the uniqueness of names.
/// `path` is only used in messages: "ring file <path> line <n>: <what is wrong>".
pub fn parse_ring_file(path: &str, content: &[u8]) -> Result<Vec<NodeSpec>, RingError> {
    let mut nodes: Vec<NodeSpec> = Vec::new();
    let mut seen: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for (i, raw) in content.split(|&b| b == b'\n').enumerate() {
        let lineno = i + 1;
        let at = |e: RingError| e.prefixed(&format!("ring file {} line {}: ", path, lineno));
        let line = match raw.iter().position(|&b| b == b'#') {
            Some(p) => &raw[..p],
            None => raw,
        };
        let fields: Vec<&[u8]> = line
            .split(|b| matches!(b, b' ' | b'\t' | b'\r' | b'\x0b' | b'\x0c'))
            .filter(|f| !f.is_empty())
            .collect();
        if fields.is_empty() {
            continue;
        }
        if fields.len() != 3 {
            return Err(at(RingError::new(format!(
                "expected 'name host:port weight', got {} field{}{}",
                fields.len(),
                if fields.len() == 1 { "" } else { "s" },
                if fields.len() > 3 {
                    format!(" ('{}')", show(line.trim_ascii()))
                } else {
                    String::new()
                }
            ))));
        }
        let node = NodeSpec::parse(fields[0], fields[1], fields[2]).map_err(at)?;
        if let Some(first) = seen.get(&node.name) {
            return Err(at(RingError::new(format!(
                "duplicate node name '{}' (first on line {})",
                node.name, first
            ))));
        }
        seen.insert(node.name.clone(), lineno);
        nodes.push(node);
    }
    if nodes.is_empty() {
        return Err(RingError::new(format!(
            "ring file {} has no node lines",
            path
        )));
    }
    Ok(nodes)
}

impl RingSpec {
    /// A spec whose nodes come from a ring file (see `parse_ring_file`).
    pub fn from_file(
        algo: &[u8],
        hashtag: Option<&[u8]>,
        path: &str,
        content: &[u8],
    ) -> Result<RingSpec, RingError> {
        let algo = Algo::parse(algo)?;
        let hashtag = match hashtag {
            Some(h) => HashTag::parse(h)?,
            None => algo.default_hashtag(),
        };
        RingSpec::new(algo, hashtag, parse_ring_file(path, content)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(content: &str) -> String {
        parse_ring_file("/x/y", content.as_bytes())
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn parses_comments_and_blanks() {
        let text = "# ring\n\n  a 127.0.0.1:7001 1   # first\r\nb\t[::1]:7002\t2\n#c h:1 1\n   \nc h:3 3#x";
        let nodes = parse_ring_file("f", text.as_bytes()).unwrap();
        let names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert_eq!(nodes[1].host, "::1");
        assert_eq!(nodes[2].weight, 3);
        let spec = RingSpec::from_file(b"jedis", None, "f", text.as_bytes()).unwrap();
        assert_eq!(spec.nodes, nodes);
        assert_eq!(spec.hashtag, HashTag::Jedis);
    }

    #[test]
    fn errors_name_file_and_line() {
        assert_eq!(
            err("a h:1 1\n\nb h:2\n"),
            "ring file /x/y line 3: expected 'name host:port weight', got 2 fields"
        );
        assert_eq!(
            err("a\n"),
            "ring file /x/y line 1: expected 'name host:port weight', got 1 field"
        );
        assert_eq!(err("a h:1 1 extra\n"),
            "ring file /x/y line 1: expected 'name host:port weight', got 4 fields ('a h:1 1 extra')");
        assert_eq!(
            err("a h:1 1\nb h:2 0"),
            "ring file /x/y line 2: weight must be an integer from 1 to 1000, got '0' for node 'b'"
        );
        assert_eq!(
            err("a h:1 1\n# x\na h:2 2"),
            "ring file /x/y line 3: duplicate node name 'a' (first on line 1)"
        );
        assert_eq!(
            err("# only comments\n\n"),
            "ring file /x/y has no node lines"
        );
        assert_eq!(err(""), "ring file /x/y has no node lines");
        assert!(err("a h:99999 1").starts_with("ring file /x/y line 1: address must be host:port"));
    }

    #[test]
    fn never_panics_on_bytes() {
        // A cheap deterministic fuzz: xorshift bytes from a small alphabet of interesting ones.
        let alphabet = b"ab:1 \t\r\n#[]{}\xff\x00\x85:09";
        let mut x: u64 = 0x9E3779B97F4A7C15;
        for _ in 0..3000 {
            let mut buf = Vec::new();
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 40) as usize;
            for _ in 0..len {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                buf.push(alphabet[(x % alphabet.len() as u64) as usize]);
            }
            let _ = parse_ring_file("fuzz", &buf);
        }
    }
}
