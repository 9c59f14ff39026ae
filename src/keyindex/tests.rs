// Compiled only under #[cfg(test)], as declared in mod.rs.
//! The index against a model (`HashSet`s) under random operations, big buckets that split,
//! long and empty names; its memory and speed with 3 000 000 names (ignored: run in release).

use std::collections::{HashMap, HashSet};

use super::page::{LONG_NAME, PAGE_MAX};
use super::*;

use crate::test_rng::TestRng as Rng;

type Model = HashMap<(i32, u16), HashSet<Vec<u8>>>;

/// Checks every count, every bucket's names and the databases against the model.
fn check(index: &KeyIndex, model: &Model) {
    let total: usize = model.values().map(HashSet::len).sum();
    assert_eq!(index.len(), total);
    assert_eq!(index.is_empty(), total == 0);
    let mut dbs: Vec<i32> = model
        .iter()
        .filter(|(_, s)| !s.is_empty())
        .map(|(k, _)| k.0)
        .collect();
    dbs.sort_unstable();
    dbs.dedup();
    assert_eq!(index.databases().collect::<Vec<_>>(), dbs);
    for (&(db, bucket), set) in model {
        assert_eq!(
            index.count(db, bucket),
            set.len(),
            "db {db} bucket {bucket}"
        );
        let names: Vec<&[u8]> = index.names(db, bucket).collect();
        assert_eq!(names.len(), set.len());
        let got: HashSet<&[u8]> = names.into_iter().collect();
        assert_eq!(got.len(), set.len(), "a name listed twice");
        assert!(set.iter().all(|n| got.contains(n.as_slice())));
    }
    for db in &dbs {
        let in_model: usize = model
            .iter()
            .filter(|(k, _)| k.0 == *db)
            .map(|(_, s)| s.len())
            .sum();
        assert_eq!(index.db_len(*db), in_model);
        let by_bucket: usize = index.buckets(*db).map(|(_, n)| n).sum();
        assert_eq!(by_bucket, in_model);
    }
}

/// A name: mostly short, some empty, some around the long-name limit, a few long.
fn name(rng: &mut Rng, pool: u64) -> Vec<u8> {
    let id = rng.below(pool);
    match id % 50 {
        0 => Vec::new(),
        1 => vec![b'x'; LONG_NAME - 3 + (id as usize / 50) % 6],
        2 if id % 200 == 2 => {
            let mut v = vec![0xa5u8; 40_000];
            v.extend_from_slice(&id.to_le_bytes());
            v
        }
        3 => {
            let mut v = vec![b'm'; 100 + (id as usize % 300)];
            v.extend_from_slice(&id.to_le_bytes());
            v
        }
        _ => format!("k:{id}").into_bytes(),
    }
}

#[test]
fn random_operations_agree_with_a_model() {
    let mut rng = Rng::new(7);
    let mut index = KeyIndex::new();
    let mut model: Model = HashMap::new();
    let dbs = [0, 1, 2, 15, 1000, -1];
    for round in 0..40 {
        for _ in 0..3000 {
            let db = dbs[rng.below(dbs.len() as u64) as usize];
            // Few buckets, so that some hold many names.
            let bucket = [0u16, 1, 16383, 77][rng.below(4) as usize];
            let n = name(&mut rng, 3000);
            let set = model.entry((db, bucket)).or_default();
            match rng.below(10) {
                0..=4 => assert_eq!(index.insert(db, bucket, &n), set.insert(n.clone())),
                5..=7 => assert_eq!(index.remove(db, bucket, &n), set.remove(&n)),
                _ => assert_eq!(index.contains(db, bucket, &n), set.contains(&n)),
            }
        }
        match round % 7 {
            2 => {
                let (a, b) = (dbs[round % dbs.len()], dbs[(round * 3 + 1) % dbs.len()]);
                index.swap_dbs(a, b);
                let keys: Vec<(i32, u16)> = model.keys().copied().collect();
                let mut swapped: Model = HashMap::new();
                for (db, bucket) in keys {
                    let set = model.remove(&(db, bucket)).unwrap_or_default();
                    let to = if db == a {
                        b
                    } else if db == b {
                        a
                    } else {
                        db
                    };
                    swapped.insert((to, bucket), set);
                }
                model = swapped;
            }
            4 => {
                let db = dbs[round % dbs.len()];
                index.clear_db(db);
                model.retain(|k, _| k.0 != db);
            }
            _ => {}
        }
        check(&index, &model);
    }
    assert!(index.len() > 1000);
    index.clear();
    model.clear();
    check(&index, &model);
    assert_eq!(index.count(0, 0), 0);
    assert!(index.insert(3, 5, b""));
    assert!(index.contains(3, 5, b"") && !index.contains(3, 6, b""));
}

#[test]
fn a_bucket_of_many_names_splits_and_empties() {
    let mut index = KeyIndex::new();
    let n = 20 * PAGE_MAX;
    for i in 0..n {
        assert!(index.insert(0, 9, format!("{{tag}}:{i}").as_bytes()));
    }
    assert!(!index.insert(0, 9, b"{tag}:7"));
    assert_eq!(index.count(0, 9), n);
    assert_eq!(index.names(0, 9).count(), n);
    let Some(Bucket::Split(_)) = index.bucket(0, 9) else {
        panic!("a bucket of {n} names is one page");
    };
    for i in (0..n).step_by(2) {
        assert!(index.remove(0, 9, format!("{{tag}}:{i}").as_bytes()));
    }
    for i in 0..n {
        let there = index.contains(0, 9, format!("{{tag}}:{i}").as_bytes());
        assert_eq!(there, i % 2 == 1, "{i}");
    }
    for i in (1..n).step_by(2) {
        assert!(index.remove(0, 9, format!("{{tag}}:{i}").as_bytes()));
    }
    assert_eq!((index.count(0, 9), index.len()), (0, 0));
    assert!(index.bucket(0, 9).is_none(), "an empty bucket is freed");
}

#[test]
fn long_names_come_and_go() {
    let mut index = KeyIndex::new();
    let long: Vec<Vec<u8>> = (0..40u8)
        .map(|i| vec![i; LONG_NAME + 100 * usize::from(i)])
        .collect();
    let huge = vec![7u8; 3 << 20];
    for (i, name) in long.iter().enumerate() {
        assert!(index.insert(1, 2, name));
        assert!(index.insert(1, 2, format!("short{i}").as_bytes()));
    }
    assert!(index.insert(1, 2, &huge) && !index.insert(1, 2, &huge));
    // Removing long names in another order than they came moves the last one into each hole.
    for name in long.iter().step_by(3) {
        assert!(index.remove(1, 2, name));
    }
    for (i, name) in long.iter().enumerate() {
        assert_eq!(index.contains(1, 2, name), i % 3 != 0, "{i}");
    }
    assert!(index.contains(1, 2, &huge));
    assert!(index.heap_bytes() > huge.len());
    let listed: usize = index.names(1, 2).filter(|n| n.len() >= LONG_NAME).count();
    assert_eq!(listed, 1 + long.len() - long.len().div_ceil(3));
    assert!(index.remove(1, 2, &huge) && !index.contains(1, 2, &huge));
}

#[test]
fn buckets_are_taken_modulo_16384() {
    let mut index = KeyIndex::new();
    assert!(index.insert(0, 16384 + 3, b"a"));
    assert!(index.contains(0, 3, b"a"));
    assert_eq!(index.buckets(0).collect::<Vec<_>>(), vec![(3, 1)]);
    assert!(index.remove(0, 3, b"a") && index.is_empty());
    assert_eq!(
        index.databases().count(),
        0,
        "a database with no name is not listed"
    );
}

/// `cargo test --release --lib keyindex::tests::figures -- --ignored --nocapture`: heap bytes
/// per key with 3 000 000 names of 16 bytes over 16384 buckets (`KEYINDEX_N` for another
/// count), inserts, lookups and removes per second, the longest single step, and the same
/// steps with 1 000 000 names in one bucket (one hash tag).
#[test]
#[ignore]
fn figures() {
    let n: u64 = std::env::var("KEYINDEX_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3_000_000);
    let mut rng = Rng::new(11);
    let keys: Vec<([u8; 16], u16)> = (0..n)
        .map(|_| {
            let mut k = [0u8; 16];
            k[..8].copy_from_slice(format!("{:08x}", rng.next() as u32).as_bytes());
            k[8..].copy_from_slice(format!("{:08x}", rng.next() as u32).as_bytes());
            (k, (rng.next() >> 50) as u16)
        })
        .collect();
    let per_key = run(&keys, "spread over 16384 buckets");
    if n == 3_000_000 {
        assert!(per_key <= 32.0, "{per_key} bytes a key");
    }
    let one: Vec<([u8; 16], u16)> = keys.iter().take(1_000_000).map(|(k, _)| (*k, 42)).collect();
    run(&one, "in one bucket");
}

/// This thread's CPU time (a step's time without the other processes of a shared machine).
fn cpu_now() -> std::time::Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Inserts, looks up and removes `keys` in database 0; the heap bytes a key.
fn run(keys: &[([u8; 16], u16)], what: &str) -> f64 {
    use std::time::{Duration, Instant};
    let mut index = KeyIndex::new();
    let t = Instant::now();
    for (k, b) in keys {
        index.insert(0, *b, k);
    }
    let insert = t.elapsed();
    let n = index.len();
    assert_eq!(n, keys.len());
    let bytes = index.heap_bytes();
    let per_key = bytes as f64 / n as f64;
    println!(
        "{n} names of 16 bytes {what}: {bytes} heap bytes, {per_key:.2} a key ({:.2} beyond the name)",
        per_key - 16.0
    );
    let t = Instant::now();
    let found = keys
        .iter()
        .filter(|(k, b)| index.contains(0, *b, k))
        .count();
    let lookup = t.elapsed();
    assert_eq!(found, n);
    let t = Instant::now();
    for (k, b) in keys {
        index.remove(0, *b, k);
    }
    let remove = t.elapsed();
    assert!(index.is_empty());
    let rate = |d: Duration| n as f64 / d.as_secs_f64() / 1e6;
    println!(
        "  inserts {:.2} M/s, lookups {:.2} M/s, removes {:.2} M/s",
        rate(insert),
        rate(lookup),
        rate(remove)
    );
    // Again, each step timed in this thread's CPU time.
    let (mut longest, mut slow) = (Duration::ZERO, 0);
    let mut step = |f: &mut dyn FnMut()| {
        let start = cpu_now();
        f();
        let took = cpu_now().saturating_sub(start);
        slow += usize::from(took > Duration::from_micros(100));
        longest = longest.max(took);
    };
    for (k, b) in keys {
        step(&mut || {
            index.insert(0, *b, k);
        });
    }
    for (k, b) in keys.iter().step_by(2) {
        step(&mut || {
            index.remove(0, *b, k);
        });
    }
    println!("  longest insert or remove (CPU time): {longest:?}, {slow} steps over 100 µs");
    let t = Instant::now();
    index.clear_db(0);
    println!("  clear_db of {} names: {:?}", n - n / 2, t.elapsed());
    per_key
}

#[test]
fn size_classes_are_jemallocs() {
    let pairs = [
        (1, 8),
        (8, 8),
        (9, 16),
        (17, 32),
        (128, 128),
        (129, 160),
        (160, 160),
    ];
    let more = [
        (161, 192),
        (256, 256),
        (257, 320),
        (4097, 5120),
        (14337, 16384),
    ];
    for (n, class) in pairs.into_iter().chain(more) {
        assert_eq!(super::page::size_class(n), class, "{n}");
    }
    assert_eq!(super::page::allocated(0), 0);
}

/// A walk of a bucket page by page (`page_count`, `page_names`, as a copy in steps takes it)
/// while names are added and removed between pages: every name present from the walk's start
/// to its end is seen (the pages split as the bucket grows past `PAGE_MAX`).
#[test]
fn a_walk_by_pages_sees_every_name_that_stays() {
    let mut rng = Rng::new(44);
    let mut split = 0;
    for round in 0..20 {
        let mut index = KeyIndex::new();
        let start = 500 + round * 300;
        let stays: Vec<Vec<u8>> = (0..start).map(|i| format!("s:{i}").into_bytes()).collect();
        for n in &stays {
            index.insert(0, 7, n);
        }
        let mut churn: Vec<Vec<u8>> = Vec::new();
        let mut seen: HashSet<Vec<u8>> = HashSet::new();
        let mut page = 0;
        let mut made = 0;
        while page < index.page_count(0, 7) {
            seen.extend(index.page_names(0, 7, page));
            page += 1;
            // Between two steps: new names (splitting pages), and some of them gone again.
            for _ in 0..rng.below(600) {
                let n = format!("new:{made}").into_bytes();
                made += 1;
                index.insert(0, 7, &n);
                churn.push(n);
            }
            for _ in 0..rng.below(300) {
                if churn.is_empty() {
                    break;
                }
                let i = rng.below(churn.len() as u64) as usize;
                let n = churn.swap_remove(i);
                index.remove(0, 7, &n);
            }
        }
        split += usize::from(index.page_count(0, 7) > 1);
        let missed = stays.iter().filter(|n| !seen.contains(*n)).count();
        assert_eq!(missed, 0, "round {round}: names that stayed were not seen");
    }
    assert!(split > 10, "pages split during the walks ({split} rounds)");
}
