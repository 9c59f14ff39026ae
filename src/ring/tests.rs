// Compiled only under #[cfg(test)], as declared in mod.rs.
//! Cross-module ring tests: peer vectors (uhashring 2.5, redis-shard 0.3.7, the jedis oracle,
//! redis-cli 7.0 `--cluster create`), spec/build errors, size and speed limits.

use super::*;

fn spec(algo: &str, hashtag: Option<&str>, nodes: &[(&str, u32)]) -> RingSpec {
    let owned: Vec<Vec<u8>> = nodes
        .iter()
        .enumerate()
        .flat_map(|(i, (n, w))| {
            vec![
                n.as_bytes().to_vec(),
                format!("127.0.0.1:{}", 7001 + i).into_bytes(),
                w.to_string().into_bytes(),
            ]
        })
        .collect();
    let fields: Vec<&[u8]> = owned.iter().map(|v| v.as_slice()).collect();
    RingSpec::from_args(algo.as_bytes(), hashtag.map(|h| h.as_bytes()), &fields).unwrap()
}

fn ring(algo: &str, hashtag: Option<&str>, nodes: &[(&str, u32)]) -> Ring {
    Ring::build(&spec(algo, hashtag, nodes)).unwrap()
}

fn owner_name<'a>(r: &'a Ring, key: &[u8]) -> &'a str {
    &r.spec().nodes[r.owner(key)].name
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

/// Cross-check helper, run by hand: `SHARD_RING_CHECK=FILE cargo test --lib ring::tests::print_owners -- --ignored`.
/// FILE: line 1 algo, line 2 hashtag rule or `-` for the algo's default, line 3 `name:weight`
/// pairs, then hex keys one per line (empty line = empty key). Writes owners to FILE.rust.
#[test]
#[ignore]
fn print_owners() {
    let Ok(path) = std::env::var("SHARD_RING_CHECK") else {
        return;
    };
    let text = std::fs::read_to_string(&path).unwrap();
    let mut lines = text.split('\n');
    let algo = lines.next().unwrap().trim().to_string();
    let tag = lines.next().unwrap().trim().to_string();
    let pairs: Vec<(String, u32)> = lines
        .next()
        .unwrap()
        .split_whitespace()
        .map(|p| {
            let (n, w) = p.rsplit_once(':').unwrap();
            (n.to_string(), w.parse().unwrap())
        })
        .collect();
    let nodes: Vec<(&str, u32)> = pairs.iter().map(|(n, w)| (n.as_str(), *w)).collect();
    let r = ring(&algo, if tag == "-" { None } else { Some(&tag) }, &nodes);
    let keys: Vec<&str> = lines.collect();
    let keys = if keys.last() == Some(&"") {
        &keys[..keys.len() - 1]
    } else {
        &keys[..]
    };
    let mut out = String::new();
    for k in keys {
        out.push_str(owner_name(&r, &unhex(k.trim())));
        out.push('\n');
    }
    std::fs::write(format!("{}.rust", path), out).unwrap();
}

/// Keys of the peer tables below (the same list for every table).
const KEYS: &[&str] = &[
    "",
    "a",
    "foo",
    "bar",
    "baz",
    "user:1000",
    "user:1001",
    "session:abc",
    "order:42",
    "cart:{7}:items",
    "{user1}.following",
    "foo{hash_tag}",
    "a{b}c{d}",
    "a{b{c}d}",
    "{}x{y}",
    "hello world",
    "key-0",
    "key-1",
    "key-2",
    "key-3",
    "key-4",
    "key-5",
    "key-6",
    "key-7",
    "key-8",
    "key-9",
    "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
    "1jyVFw3401",
    "snowflake:1288834974657",
    "caf\u{e9}",
];

const R3: &[(&str, u32)] = &[("node1", 1), ("node2", 2), ("node3", 3)];
const R5: &[(&str, u32)] = &[
    ("redis-a", 5),
    ("redis-b", 1),
    ("redis-c", 3),
    ("redis-d", 1),
    ("redis-e", 10),
];

fn check_table(algo: &str, nodes: &[(&str, u32)], owners: &str) {
    let r = ring(algo, None, nodes);
    let want: Vec<&str> = owners.split_whitespace().collect();
    assert_eq!(want.len(), KEYS.len());
    for (k, w) in KEYS.iter().zip(want) {
        // redis-shard hashes a text key as latin-1 (`"caf\u{e9}"` is `caf\xe9`), the others as UTF-8.
        let bytes: Vec<u8> = match algo {
            "redis-shard" => k.chars().map(|c| c as u32 as u8).collect(),
            _ => k.as_bytes().to_vec(),
        };
        assert_eq!(owner_name(&r, &bytes), w, "{} key {:?}", algo, k);
    }
}

/// Owners printed by uhashring 2.5: HashRing(nodes={name: {"weight": w}}, hash_fn="ketama").get_node(key).
#[test]
fn ketama_matches_peer() {
    check_table(
        "ketama",
        R3,
        "node1 node2 node3 node1 node3 node2 node3 node2 \
         node3 node2 node2 node3 node3 node3 node2 node1 \
         node3 node2 node3 node1 node3 node3 node3 node3 \
         node3 node1 node3 node3 node3 node2",
    );
    check_table(
        "ketama",
        R5,
        "redis-e redis-e redis-e redis-a redis-c redis-b redis-a redis-b \
         redis-e redis-a redis-a redis-e redis-e redis-a redis-c redis-a \
         redis-c redis-e redis-e redis-a redis-e redis-e redis-e redis-c \
         redis-e redis-a redis-c redis-e redis-b redis-e",
    );
}

/// Owners printed by redis-shard 0.3.7: RedisShardAPI(servers).get_server_name(key) (its greedy tag rule applies).
#[test]
fn redis_shard_matches_peer() {
    check_table(
        "redis-shard",
        R3,
        "node1 node3 node2 node1 node3 node3 node3 node2 \
         node3 node3 node3 node2 node3 node3 node3 node1 \
         node1 node1 node2 node3 node3 node3 node3 node3 \
         node1 node1 node2 node3 node1 node1",
    );
    check_table(
        "redis-shard",
        R5,
        "redis-b redis-b redis-a redis-b redis-e redis-a redis-b redis-a \
         redis-c redis-c redis-a redis-e redis-d redis-a redis-a redis-b \
         redis-d redis-d redis-d redis-d redis-d redis-d redis-d redis-d \
         redis-b redis-b redis-a redis-e redis-c redis-c",
    );
}

/// Owners printed by tests/oracles/JedisOracle.java md5 tag (jedis Sharded, Hashing.MD5, key tag pattern).
#[test]
fn jedis_md5_matches_peer() {
    check_table(
        "jedis",
        R3,
        "node2 node2 node2 node3 node3 node2 node3 node1 \
         node1 node2 node3 node1 node2 node3 node3 node2 \
         node3 node3 node3 node2 node2 node1 node2 node1 \
         node2 node3 node3 node1 node3 node3",
    );
    check_table(
        "jedis",
        R5,
        "redis-a redis-e redis-c redis-d redis-c redis-e redis-e redis-e \
         redis-e redis-c redis-a redis-e redis-c redis-c redis-c redis-a \
         redis-e redis-a redis-e redis-e redis-e redis-a redis-e redis-b \
         redis-c redis-e redis-a redis-e redis-e redis-e",
    );
}

/// Owners printed by tests/oracles/JedisOracle.java murmur tag (jedis Sharded, Hashing.MURMUR_HASH, key tag pattern).
#[test]
fn jedis_murmur_matches_peer() {
    check_table(
        "jedis-murmur",
        R3,
        "node3 node3 node3 node2 node2 node1 node2 node3 \
         node3 node3 node3 node2 node3 node3 node3 node3 \
         node1 node2 node3 node3 node1 node3 node3 node1 \
         node3 node1 node3 node3 node1 node2",
    );
    check_table(
        "jedis-murmur",
        R5,
        "redis-a redis-a redis-e redis-d redis-e redis-c redis-e redis-e \
         redis-e redis-e redis-d redis-e redis-a redis-a redis-c redis-c \
         redis-e redis-e redis-d redis-a redis-d redis-c redis-e redis-c \
         redis-c redis-e redis-a redis-e redis-a redis-e",
    );
}
/// `MurmurHash.hash64A(s.getBytes(UTF_8), 0x1234ABCD)` as the JDK 17 run of jedis's code printed.
#[test]
fn murmur_hash64a_matches_jedis() {
    let want: &[(&str, i64)] = &[
        ("", 8371356515094919947),
        ("a", 7990182172224381693),
        ("ab", -4327967927557705532),
        ("abcdefg", -4310195171707304818),
        ("abcdefgh", 2328573686879900726),
        ("abcdefghi", -2111598944829186864),
        ("hello world", -7467008419718616472),
        ("shard*0", 3110538438962305966),
        ("node1*159", 7340618628306074955),
    ];
    for (s, h) in want {
        assert_eq!(JedisHash::Murmur.hash(s.as_bytes()), *h, "{:?}", s);
        assert_eq!(murmur_hash64a(s.as_bytes(), JEDIS_MURMUR_SEED) as i64, *h);
    }
}

fn equal_ranges(n: usize, w: u32) -> Vec<(u16, u16)> {
    let names: Vec<String> = (0..n).map(|i| format!("m{}", i)).collect();
    let nodes: Vec<(&str, u32)> = names.iter().map(|s| (s.as_str(), w)).collect();
    single_ranges(&ring("slots", None, &nodes))
}

/// The ranges of a ring given by weights alone: one per node.
fn single_ranges(r: &Ring) -> Vec<(u16, u16)> {
    let ranges = r.slot_ranges().unwrap();
    assert!(ranges.iter().all(|node| node.len() == 1), "{ranges:?}");
    ranges.iter().map(|node| node[0]).collect()
}

/// Splits printed by `redis-cli --cluster create` (redis 7.0.15) for N masters; N = 1 and 2
/// (which redis-cli refuses) follow its formula.
#[test]
fn slot_splits_match_redis_cli() {
    let want: &[&[(u16, u16)]] = &[
        &[(0, 16383)],
        &[(0, 8191), (8192, 16383)],
        &[(0, 5460), (5461, 10922), (10923, 16383)],
        &[
            (0, 3276),
            (3277, 6553),
            (6554, 9829),
            (9830, 13106),
            (13107, 16383),
        ],
        &[
            (0, 2730),
            (2731, 5460),
            (5461, 8191),
            (8192, 10922),
            (10923, 13652),
            (13653, 16383),
        ],
        &[
            (0, 2340),
            (2341, 4680),
            (4681, 7021),
            (7022, 9361),
            (9362, 11702),
            (11703, 14042),
            (14043, 16383),
        ],
        &[
            (0, 1819),
            (1820, 3640),
            (3641, 5460),
            (5461, 7281),
            (7282, 9101),
            (9102, 10922),
            (10923, 12742),
            (12743, 14563),
            (14564, 16383),
        ],
        &[
            (0, 1637),
            (1638, 3276),
            (3277, 4914),
            (4915, 6553),
            (6554, 8191),
            (8192, 9829),
            (9830, 11468),
            (11469, 13106),
            (13107, 14745),
            (14746, 16383),
        ],
        &[
            (0, 1488),
            (1489, 2978),
            (2979, 4467),
            (4468, 5957),
            (5958, 7446),
            (7447, 8936),
            (8937, 10425),
            (10426, 11915),
            (11916, 13404),
            (13405, 14894),
            (14895, 16383),
        ],
        &[
            (0, 1259),
            (1260, 2520),
            (2521, 3780),
            (3781, 5040),
            (5041, 6301),
            (6302, 7561),
            (7562, 8821),
            (8822, 10081),
            (10082, 11342),
            (11343, 12602),
            (12603, 13862),
            (13863, 15123),
            (15124, 16383),
        ],
        &[
            (0, 963),
            (964, 1927),
            (1928, 2890),
            (2891, 3854),
            (3855, 4818),
            (4819, 5782),
            (5783, 6745),
            (6746, 7709),
            (7710, 8673),
            (8674, 9637),
            (9638, 10600),
            (10601, 11564),
            (11565, 12528),
            (12529, 13492),
            (13493, 14455),
            (14456, 15419),
            (15420, 16383),
        ],
    ];
    for ranges in want {
        let n = ranges.len();
        assert_eq!(equal_ranges(n, 1), ranges.to_vec(), "n={}", n);
        // Equal weights other than 1 give the same split.
        assert_eq!(equal_ranges(n, 7), ranges.to_vec(), "n={} w=7", n);
        assert_eq!(equal_ranges(n, 1000), ranges.to_vec(), "n={} w=1000", n);
    }
}

#[test]
fn slot_splits_weighted_and_complete() {
    let r = ring("slots", None, &[("a", 1), ("b", 2), ("c", 1)]);
    assert_eq!(
        single_ranges(&r),
        &[(0, 4095), (4096, 12287), (12288, 16383)]
    );
    assert_eq!(r.points_per_node(), vec![4096, 8192, 4096]);
    let r = ring("slots", None, &[("a", 1000), ("b", 1), ("c", 1)]);
    assert_eq!(
        single_ranges(&r),
        &[(0, 16350), (16351, 16367), (16368, 16383)]
    );
    // Every split covers 0..=16383 contiguously, each node at least one slot.
    for n in [1usize, 2, 3, 4, 8, 100, 1000, 16384] {
        let names: Vec<String> = (0..n).map(|i| format!("m{}", i)).collect();
        let nodes: Vec<(&str, u32)> = names
            .iter()
            .enumerate()
            .map(|(i, s)| (s.as_str(), 1 + (i as u32 * 37) % 5))
            .collect();
        let Ok(r) = Ring::build(&spec("slots", None, &nodes)) else {
            continue;
        };
        let ranges = single_ranges(&r);
        assert_eq!(ranges[0].0, 0);
        assert_eq!(ranges[n - 1].1, 16383);
        for w in ranges.windows(2) {
            assert_eq!(w[0].1 + 1, w[1].0);
        }
        assert!(ranges.iter().all(|r| r.0 <= r.1));
    }
    // Equal weights with 16384 nodes: one slot each.
    assert_eq!(equal_ranges(16384, 1)[16383], (16383, 16383));
}

#[test]
fn slot_split_errors() {
    let names: Vec<String> = (0..16385).map(|i| format!("m{}", i)).collect();
    let nodes: Vec<(&str, u32)> = names.iter().map(|s| (s.as_str(), 1)).collect();
    let e = Ring::build(&spec("slots", None, &nodes)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "the slots algo can split 16384 slots among at most 16384 nodes, got 16385"
    );
    let mut nodes: Vec<(&str, u32)> = names[..16384].iter().map(|s| (s.as_str(), 1)).collect();
    nodes[0].1 = 1000;
    let e = Ring::build(&spec("slots", None, &nodes)).unwrap_err();
    assert!(
        e.to_string().starts_with("the slots algo leaves node '"),
        "{}",
        e
    );
}

#[test]
fn slots_locate_uses_cluster_keyslot() {
    let r = ring("slots", None, &[("a", 1), ("b", 1), ("c", 1)]);
    let l = r.locate(b"somekey");
    assert_eq!((l.point, l.hash, l.node), (11058, 11058, 2));
    let l = r.locate(b"{user1}.following");
    assert_eq!((l.point, l.hashed, l.node), (8106, &b"user1"[..], 1));
    assert_eq!(r.locate(b"foo{hash_tag}").node, 0);
    assert_eq!(r.point_count(), SLOTS);
}

#[test]
fn locate_reports_hashed_point_and_hash() {
    for algo in ["ketama", "jedis", "jedis-murmur", "redis-shard"] {
        let r = ring(algo, Some("cluster"), R5);
        for k in KEYS
            .iter()
            .map(|k| k.as_bytes())
            .chain([&b"\xff\x00\xfe"[..], b"\n"])
        {
            let l = r.locate(k);
            assert_eq!(l.hashed, HashTag::Cluster.extract(k));
            assert!(l.node < 5);
            // Every point ring: the deciding point is the owner's, and it is the one the peer's
            // rule picks among all points.
            let all: Vec<(i64, usize)> = match &r.inner {
                Inner::Ketama(p) | Inner::RedisShard(p) => p
                    .entries()
                    .iter()
                    .map(|e| (i64::from(e.0), e.1 as usize))
                    .collect(),
                Inner::Jedis(p, _) => p.entries().iter().map(|e| (e.0, e.1 as usize)).collect(),
                Inner::Slots(_) => unreachable!(),
            };
            let (lowest, highest) = (all[0], all[all.len() - 1]);
            let want = match algo {
                "ketama" => {
                    assert_eq!(l.hash, i64::from(ketama_hash(l.hashed)));
                    all.iter().copied().find(|p| p.0 > l.hash).unwrap_or(lowest)
                }
                "redis-shard" => {
                    assert_eq!(l.hash, i64::from(crc32(l.hashed)));
                    all.iter()
                        .copied()
                        .find(|p| p.0 > l.hash)
                        .unwrap_or(highest)
                }
                "jedis" => {
                    assert_eq!(l.hash, JedisHash::Md5.hash(l.hashed));
                    assert!((0..=i64::from(u32::MAX)).contains(&l.hash));
                    all.iter()
                        .copied()
                        .find(|p| p.0 >= l.hash)
                        .unwrap_or(lowest)
                }
                _ => {
                    assert_eq!(l.hash, JedisHash::Murmur.hash(l.hashed));
                    all.iter()
                        .copied()
                        .find(|p| p.0 >= l.hash)
                        .unwrap_or(lowest)
                }
            };
            assert_eq!((l.point, l.node), want, "{} {:?}", algo, k);
        }
    }
}

#[test]
fn wrap_and_clamp_at_the_top_of_the_ring() {
    let k = ring("ketama", None, R3);
    let Inner::Ketama(p) = &k.inner else { panic!() };
    assert_eq!(ketama::lookup(p, u32::MAX), 0);
    assert_eq!(ketama::lookup(p, 0), 0);
    let top = p.entries()[p.len() - 1].0;
    assert_eq!(ketama::lookup(p, top), 0);
    assert_eq!(ketama::lookup(p, top - 1), p.len() - 1);
    let s = ring("redis-shard", None, R3);
    let Inner::RedisShard(p) = &s.inner else {
        panic!()
    };
    assert_eq!(redis_shard::lookup(p, u32::MAX), p.len() - 1);
    let first = p.entries()[0].0;
    assert_eq!(redis_shard::lookup(p, first), 1);
    let j = ring("jedis-murmur", None, R3);
    let Inner::Jedis(p, _) = &j.inner else {
        panic!()
    };
    assert_eq!(jedis::lookup(p, i64::MAX), 0);
    assert_eq!(jedis::lookup(p, i64::MIN), 0);
    let second = p.entries()[1].0;
    assert_eq!(jedis::lookup(p, second), 1);
    assert!(p.entries()[0].0 < 0);
}

#[test]
fn point_counts() {
    // ketama: floor(40 * N * w / W) hashes of 4 points; R3: 20, 40, 60 hashes; [1, 1000]: 0, 79.
    let r = ring("ketama", None, R3);
    assert_eq!(r.points_per_node(), vec![80, 160, 240]);
    // uhashring integer arithmetic: 7 equal nodes get 40 hashes each (npm hashring's float
    // arithmetic gives 39).
    let names: Vec<String> = (0..7).map(|i| format!("n{}", i)).collect();
    let nodes: Vec<(&str, u32)> = names.iter().map(|s| (s.as_str(), 1)).collect();
    assert_eq!(ring("ketama", None, &nodes).points_per_node(), vec![160; 7]);
    // A node whose share rounds to no hash owns nothing, as in uhashring.
    assert_eq!(
        ring("ketama", None, &[("a", 1), ("b", 1000)]).points_per_node(),
        vec![0, 316]
    );
    assert_eq!(ring("jedis", None, R3).point_count(), 960);
    assert_eq!(
        ring("jedis", None, R3).points_per_node(),
        vec![160, 320, 480]
    );
    assert_eq!(ring("redis-shard", None, R5).point_count(), 640);
}

#[test]
fn build_errors() {
    let e = Ring::build(&spec("cluster", None, R3)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "the cluster algo reads the live cluster's slot map, it has no ring to build"
    );
    let names: Vec<String> = (0..7000).map(|i| format!("n{}", i)).collect();
    let nodes: Vec<(&str, u32)> = names.iter().map(|s| (s.as_str(), 1)).collect();
    let e = Ring::build(&spec("ketama", None, &nodes)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "ketama ring too large: 7000 nodes make 1120000 points, the limit is 1048576"
    );
    let e = Ring::build(&spec(
        "jedis",
        None,
        &[
            ("a", 1000),
            ("b", 1000),
            ("c", 1000),
            ("d", 1000),
            ("e", 1000),
            ("f", 1000),
            ("g", 1000),
        ],
    ))
    .unwrap_err();
    assert_eq!(e.to_string(), "jedis ring too large: total weight 7000 makes 1120000 points (160 per weight unit), the limit is 1048576");
    let empty = RingSpec {
        algo: Algo::Ketama,
        hashtag: HashTag::None,
        nodes: Vec::new(),
        slot_map: None,
    };
    assert_eq!(
        Ring::build(&empty).unwrap_err().to_string(),
        "a ring needs at least one node"
    );
}

#[test]
fn arbitrary_keys_never_panic() {
    let rings: Vec<Ring> = ["ketama", "jedis", "jedis-murmur", "redis-shard", "slots"]
        .iter()
        .flat_map(|a| {
            HashTag::ALL
                .iter()
                .map(move |t| ring(a, Some(t.name()), &[("only", 1)]))
        })
        .collect();
    let alphabet = b"{}\n\r\x85\xc2\xe2\x80\xa8\xa9a\x00\xff";
    let mut x: u64 = 88172645463325252;
    for _ in 0..2000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let len = (x % 24) as usize;
        let key: Vec<u8> = (0..len)
            .map(|i| alphabet[((x >> (i % 60)) as usize + i) % alphabet.len()])
            .collect();
        for r in &rings {
            let l = r.locate(&key);
            assert_eq!(l.node, 0);
            // The hashed part is a sub-slice of the key.
            let start = l.hashed.as_ptr() as usize - key.as_ptr() as usize;
            assert!(key.is_empty() || start + l.hashed.len() <= key.len());
        }
    }
}

#[test]
fn big_ketama_rings_build_small() {
    // How fast they build is `make bench`'s business (the ring build rows): a timing asserted
    // here failed on a busy machine (3844 nodes in 100 ms against a 100 ms limit).
    for n in [1000usize, 3844] {
        let names: Vec<String> = (0..n).map(|i| format!("node-{:04}", i)).collect();
        let nodes: Vec<(&str, u32)> = names.iter().map(|s| (s.as_str(), 1)).collect();
        let s = spec("ketama", None, &nodes);
        let t = std::time::Instant::now();
        let r = Ring::build(&s).unwrap();
        let took = t.elapsed().as_millis();
        eprintln!(
            "ketama build, {} nodes: {} ms, {} points",
            n,
            took,
            r.point_count()
        );
        let bytes = r.point_count() * std::mem::size_of::<(u32, u32)>();
        assert!(bytes < 16 << 20, "{} bytes", bytes);
        assert!(r.point_count() > 160 * n - 100);
    }
}

#[test]
fn a_key_is_settled_only_where_both_rings_place_it_alike() {
    let old = ring("ketama", None, &[("a", 1), ("b", 1)]);
    let new = ring("ketama", None, &[("a", 1), ("b", 1), ("c", 1)]);
    let (mut settled, mut moving) = (0, 0);
    for i in 0..2000 {
        let key = format!("k:{i}");
        let to = owner_name(&new, key.as_bytes());
        match new.settled_owner(Some(&old), key.as_bytes()) {
            Ok(n) => {
                assert_eq!(
                    (n.name.as_str(), owner_name(&old, key.as_bytes())),
                    (to, to)
                );
                settled += 1;
            }
            Err(n) => {
                assert_eq!(n.name, to);
                assert_ne!(owner_name(&old, key.as_bytes()), to);
                moving += 1;
            }
        }
        // With no resharding open every key is settled at its owner.
        assert_eq!(
            new.settled_owner(None, key.as_bytes())
                .map(|n| n.name.as_str()),
            Ok(to)
        );
    }
    assert!(
        settled > 0 && moving > 0,
        "{settled} settled, {moving} moving"
    );
}
