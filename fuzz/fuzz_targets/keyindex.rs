//! `KeyIndex` under arbitrary operations (insert, remove, contains, swap and clear of
//! databases), checked against a model of `HashSet`s: every answer, every count, every
//! bucket's names. Names are short, empty, or long (past the page's long-name limit).
#![no_main]

use std::collections::{HashMap, HashSet};

use libfuzzer_sys::fuzz_target;
use shard::keyindex::KeyIndex;

type Model = HashMap<(i32, u16), HashSet<Vec<u8>>>;

fn check(index: &KeyIndex, model: &Model) {
    let total: usize = model.values().map(HashSet::len).sum();
    assert_eq!(index.len(), total);
    for (&(db, bucket), set) in model {
        assert_eq!(index.count(db, bucket), set.len());
        let names: HashSet<&[u8]> = index.names(db, bucket).collect();
        assert_eq!(names.len(), set.len());
        assert!(set.iter().all(|n| names.contains(n.as_slice())));
    }
    let mut dbs: Vec<i32> = model
        .iter()
        .filter(|(_, s)| !s.is_empty())
        .map(|(k, _)| k.0)
        .collect();
    dbs.sort_unstable();
    dbs.dedup();
    assert_eq!(index.databases().collect::<Vec<_>>(), dbs);
}

fuzz_target!(|data: &[u8]| {
    let mut index = KeyIndex::new();
    let mut model: Model = HashMap::new();
    let mut at = 0;
    while let Some(&op) = data.get(at) {
        at += 1;
        let db = i32::from((op >> 3) & 3);
        let bucket = u16::from(op >> 5) * 2047;
        let len = usize::from(data.get(at).copied().unwrap_or(0));
        at += 1;
        // A length byte of 200 or more makes a long name of repeated bytes.
        let name: Vec<u8> = if len >= 200 {
            let fill = data.get(at).copied().unwrap_or(0);
            at += 1;
            vec![fill; 1000 + (len - 200) * 8]
        } else {
            let end = (at + len % 24).min(data.len());
            let n = data.get(at..end).unwrap_or(&[]).to_vec();
            at = end.max(at);
            n
        };
        let set = model.entry((db, bucket)).or_default();
        match op & 7 {
            0..=2 => assert_eq!(index.insert(db, bucket, &name), set.insert(name)),
            3 | 4 => assert_eq!(index.remove(db, bucket, &name), set.remove(&name)),
            5 => assert_eq!(index.contains(db, bucket, &name), set.contains(&name)),
            6 => {
                let other = i32::from(name.first().copied().unwrap_or(0) & 3);
                if len % 2 == 0 {
                    index.swap_dbs(db, other);
                    model = model
                        .drain()
                        .map(|((d, b), s)| {
                            let d = if d == db {
                                other
                            } else if d == other {
                                db
                            } else {
                                d
                            };
                            ((d, b), s)
                        })
                        .collect();
                } else {
                    index.clear_db(db);
                    model.retain(|k, _| k.0 != db);
                }
            }
            _ => check(&index, &model),
        }
    }
    check(&index, &model);
});
