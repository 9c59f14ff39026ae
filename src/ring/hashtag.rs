//! `HashTag`: the peers' rules for which part of a key is hashed (Redis Cluster `{tag}`,
//! jedis `\{(.+?)\}`, redis-shard's greedy `.*\{(.*)\}.*`, or none). Allocation-free.

use super::error::{show, RingError};

/// A hash-tag rule: which slice of a key is hashed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HashTag {
    /// Redis Cluster: the first `{`, then the first `}` after it; the whole key when there is
    /// none or nothing between them.
    Cluster,
    /// jedis `DEFAULT_KEY_TAG_PATTERN` `\{(.+?)\}` with `Matcher.find()`: the leftmost `{`
    /// followed by at least one character and then a `}` (the first `}` from the second
    /// character on), no line terminator in between (java `.`).
    Jedis,
    /// redis-shard `re.match(r'.*\{(.*)\}.*', key)`: on the key's first line, from the last
    /// `{` before the line's last `}` to that `}` (python `.` stops only at `\n`).
    Greedy,
    /// The whole key is hashed.
    None,
    /// Shardjs: what comes before the first `-` (a fixed key's suffix is not hashed, so special
    /// keys with one prefix share a node); the whole key when there is none.
    Shardjs,
}

impl HashTag {
    /// All rules, in a fixed order.
    pub const ALL: [HashTag; 5] = [
        HashTag::Cluster,
        HashTag::Jedis,
        HashTag::Greedy,
        HashTag::None,
        HashTag::Shardjs,
    ];

    /// Parses `cluster`, `jedis`, `greedy`, `none` or `shardjs` (ASCII case-insensitive).
    pub fn parse(name: &[u8]) -> Result<HashTag, RingError> {
        for t in HashTag::ALL {
            if name.eq_ignore_ascii_case(t.name().as_bytes()) {
                return Ok(t);
            }
        }
        Err(RingError::new(format!(
            "unknown hashtag rule '{}', expected one of cluster, jedis, greedy, none, shardjs",
            show(name)
        )))
    }

    /// The canonical lowercase name.
    pub fn name(&self) -> &'static str {
        match self {
            HashTag::Cluster => "cluster",
            HashTag::Jedis => "jedis",
            HashTag::Greedy => "greedy",
            HashTag::None => "none",
            HashTag::Shardjs => "shardjs",
        }
    }

    /// The part of `key` that is hashed under this rule.
    pub fn extract<'a>(&self, key: &'a [u8]) -> &'a [u8] {
        match self {
            HashTag::Cluster => cluster_tag(key),
            HashTag::Jedis => jedis_tag(key),
            HashTag::Greedy => greedy_tag(key),
            HashTag::None => key,
            HashTag::Shardjs => memchr::memchr(b'-', key).map_or(key, |at| &key[..at]),
        }
    }
}

/// memchr's portable word-at-a-time search: as cheap as a byte loop on short keys and cheaper
/// on long ones, where `memchr::memchr`'s SIMD entry costs more than it saves below 16 bytes.
fn cluster_tag(key: &[u8]) -> &[u8] {
    if let Some(s) = memchr::arch::all::memchr::One::new(b'{').find(key) {
        let rest = &key[s + 1..];
        if let Some(e) = memchr::arch::all::memchr::One::new(b'}').find(rest) {
            if e > 0 {
                return &rest[..e];
            }
        }
    }
    key
}

/// Length of the java line terminator starting at `key[i]`, or 0.
///
/// jedis applies its pattern to a java `String`; `.` matches anything but `\n`, `\r`, U+0085,
/// U+2028 and U+2029. A key that is valid UTF-8 is read as the `String` jedis would hold
/// (U+0085 = C2 85, U+2028/9 = E2 80 A8/A9); any other key is read as ISO-8859-1, one char per
/// byte (U+0085 = byte 85). The jedis oracle in tests/oracles decodes keys the same way.
fn java_terminator(key: &[u8], i: usize, utf8: bool) -> usize {
    match key[i] {
        b'\n' | b'\r' => 1,
        0x85 if !utf8 => 1,
        0xC2 if utf8 && key.get(i + 1) == Some(&0x85) => 2,
        0xE2 if utf8
            && key.get(i + 1) == Some(&0x80)
            && matches!(key.get(i + 2), Some(&0xA8) | Some(&0xA9)) =>
        {
            3
        }
        _ => 0,
    }
}

fn jedis_tag(key: &[u8]) -> &[u8] {
    let utf8 = std::str::from_utf8(key).is_ok();
    let mut s = 0;
    // Linear: when the scan from one `{` hits a terminator before a usable `}`, every `{`
    // before that terminator fails too (any `}` they could use was seen), so jump past it.
    while s < key.len() {
        if key[s] != b'{' {
            s += 1;
            continue;
        }
        let mut j = s + 1;
        loop {
            if j >= key.len() {
                return key; // no `}` after this `{`: none after any later `{` either
            }
            let t = java_terminator(key, j, utf8);
            if t > 0 {
                s = j + t;
                break;
            }
            if key[j] == b'}' && j >= s + 2 {
                return &key[s + 1..j];
            }
            j += 1;
        }
    }
    key
}

fn greedy_tag(key: &[u8]) -> &[u8] {
    let line_end = key.iter().position(|&b| b == b'\n').unwrap_or(key.len());
    let line = &key[..line_end];
    if let Some(close) = line.iter().rposition(|&b| b == b'}') {
        if let Some(open) = line[..close].iter().rposition(|&b| b == b'{') {
            return &key[open + 1..close];
        }
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for t in HashTag::ALL {
            assert_eq!(HashTag::parse(t.name().as_bytes()), Ok(t));
        }
        assert_eq!(HashTag::parse(b"Greedy"), Ok(HashTag::Greedy));
        assert!(HashTag::parse(b"regex")
            .unwrap_err()
            .message()
            .contains("unknown hashtag rule 'regex'"));
    }

    #[test]
    fn shardjs_rule_hashes_before_the_first_dash() {
        assert_eq!(HashTag::Shardjs.extract(b"020000-emails"), b"020000");
        assert_eq!(HashTag::Shardjs.extract(b"1jyVFw3401"), b"1jyVFw3401");
        assert_eq!(HashTag::Shardjs.extract(b"a-b-c"), b"a");
        assert_eq!(HashTag::Shardjs.extract(b"-x"), b"");
    }

    #[test]
    fn cluster_rule() {
        let t = HashTag::Cluster;
        let cases: &[(&[u8], &[u8])] = &[
            (b"", b""),
            (b"abc", b"abc"),
            (b"{user1}.following", b"user1"),
            (b"foo{hash_tag}", b"hash_tag"),
            (b"{}", b"{}"),
            (b"{}x{y}", b"{}x{y}"),
            (b"{{a}}", b"{a"),
            (b"a{b}c{d}", b"b"),
            (b"a{b{c}d}", b"b{c"),
            (b"foo{", b"foo{"),
            (b"foo}{", b"foo}{"),
            (b"}{x}", b"x"),
            (b"a{\n}", b"\n"),
            (b"\xff{\x00}", b"\x00"),
        ];
        for (k, want) in cases {
            assert_eq!(t.extract(k), *want, "key {:?}", String::from_utf8_lossy(k));
        }
    }

    /// Expected tags printed by java.util.regex `\{(.+?)\}` + `find()` (JDK 17) on these keys
    /// (decoded as UTF-8 when valid, else ISO-8859-1, as tests/oracles/JedisOracle.java does).
    #[test]
    fn jedis_rule_matches_java_regex() {
        let cases: &[(&[u8], &[u8])] = &[
            (b"", b""),
            (b"abc", b"abc"),
            (b"{}", b"{}"),
            (b"{}}", b"}"),
            (b"{{}", b"{"),
            (b"{{a}}", b"{a"),
            (b"{a}", b"a"),
            (b"a{b}c{d}", b"b"),
            (b"{}x{y}", b"}x{y"),
            (b"a{b{c}d}", b"b{c"),
            (b"a{}b", b"a{}b"),
            (b"{}{}", b"}{"),
            (b"{}a}", b"}a"),
            (b"{\x0a}", b"{\x0a}"),
            (b"{\x0aa}", b"{\x0aa}"),
            (b"{a\x0a}", b"{a\x0a}"),
            (b"{a\x0a}{b}", b"b"),
            (b"a\x0a{b}", b"b"),
            (b"{a}\x0a{b}", b"a"),
            (b"x{\x0d}{y}", b"y"),
            (b"{\x0d\x0a}{z}", b"z"),
            (b"{{\x0a}", b"{{\x0a}"),
            (b"{ }", b" "),
            (b"{\x00}", b"\x00"),
            (b"\xff{ab}", b"ab"),
            (b"\xff{a\x85}{c}", b"c"),
            (b"{\xc3\x85}", b"\xc3\x85"),
            (b"{a\xc2\x85b}{c}", b"c"),
            (b"{\xe2\x80\xa8}{d}", b"d"),
            (b"{\xe2\x80\xa9}{d}", b"d"),
            (b"{\xe2\x80\xa6}", b"\xe2\x80\xa6"),
            (b"\x85{a}", b"a"),
            (b"{\x85}", b"{\x85}"),
            (b"}{", b"}{"),
            (b"}{x}", b"x"),
            (b"{x", b"{x"),
            (b"x}", b"x}"),
            (b"{{{{", b"{{{{"),
            (b"{{{{}", b"{{{"),
            (b"{a}}", b"a"),
            (b"user:{1000}:name", b"1000"),
            (b"{user1}.following", b"user1"),
            (b"a{b\x0ac}d{e}", b"e"),
            (b"a{b}\x0a{c}", b"b"),
            (b"{}\x0a{c}", b"c"),
            (b"a{{b}}c", b"{b"),
        ];
        for (k, want) in cases {
            assert_eq!(
                HashTag::Jedis.extract(k),
                *want,
                "key {:?}",
                String::from_utf8_lossy(k)
            );
        }
    }

    /// Expected tags printed by redis-shard 0.3.7's `re.match(r'.*\{(.*)\}.*', key)` (python
    /// 3.11) on the same keys decoded as latin-1.
    #[test]
    fn greedy_rule_matches_python_regex() {
        let cases: &[(&[u8], &[u8])] = &[
            (b"", b""),
            (b"abc", b"abc"),
            (b"{}", b""),
            (b"{}}", b"}"),
            (b"{{}", b""),
            (b"{{a}}", b"a}"),
            (b"{a}", b"a"),
            (b"a{b}c{d}", b"d"),
            (b"{}x{y}", b"y"),
            (b"a{b{c}d}", b"c}d"),
            (b"a{}b", b""),
            (b"{}{}", b""),
            (b"{}a}", b"}a"),
            (b"{\x0a}", b"{\x0a}"),
            (b"{\x0aa}", b"{\x0aa}"),
            (b"{a\x0a}", b"{a\x0a}"),
            (b"{a\x0a}{b}", b"{a\x0a}{b}"),
            (b"a\x0a{b}", b"a\x0a{b}"),
            (b"{a}\x0a{b}", b"a"),
            (b"x{\x0d}{y}", b"y"),
            (b"{\x0d\x0a}{z}", b"{\x0d\x0a}{z}"),
            (b"{{\x0a}", b"{{\x0a}"),
            (b"{ }", b" "),
            (b"{\x00}", b"\x00"),
            (b"\xff{ab}", b"ab"),
            (b"\xff{a\x85}{c}", b"c"),
            (b"{\xc3\x85}", b"\xc3\x85"),
            (b"{a\xc2\x85b}{c}", b"c"),
            (b"{\xe2\x80\xa8}{d}", b"d"),
            (b"{\xe2\x80\xa9}{d}", b"d"),
            (b"{\xe2\x80\xa6}", b"\xe2\x80\xa6"),
            (b"\x85{a}", b"a"),
            (b"{\x85}", b"\x85"),
            (b"}{", b"}{"),
            (b"}{x}", b"x"),
            (b"{x", b"{x"),
            (b"x}", b"x}"),
            (b"{{{{", b"{{{{"),
            (b"{{{{}", b""),
            (b"{a}}", b"a}"),
            (b"user:{1000}:name", b"1000"),
            (b"{user1}.following", b"user1"),
            (b"a{b\x0ac}d{e}", b"a{b\x0ac}d{e}"),
            (b"a{b}\x0a{c}", b"b"),
            (b"{}\x0a{c}", b""),
            (b"a{{b}}c", b"b}"),
        ];
        for (k, want) in cases {
            assert_eq!(
                HashTag::Greedy.extract(k),
                *want,
                "key {:?}",
                String::from_utf8_lossy(k)
            );
        }
    }

    #[test]
    fn none_rule_and_linear_time() {
        assert_eq!(HashTag::None.extract(b"a{b}c"), b"a{b}c");
        // Many `{` with no usable `}`: must stay linear (this would take minutes if quadratic).
        let mut k = vec![b'{'; 2_000_000];
        k.push(b'\n');
        k.extend_from_slice(b"{t}");
        assert_eq!(HashTag::Jedis.extract(&k), b"t");
        let k2 = vec![b'{'; 2_000_000];
        assert_eq!(HashTag::Jedis.extract(&k2), &k2[..]);
        assert_eq!(HashTag::Greedy.extract(&k2), &k2[..]);
        assert_eq!(HashTag::Cluster.extract(&k2), &k2[..]);
    }
}
