//! Unit tests of `keyless::hot_keys`, the merge of `SHARD.HOTKEYS`.

use crate::net::resp::Resp;
use crate::route::keyless::{hot_keys, hot_reply, HotKey, NodeReply};

fn local(node: &str, pairs: &[(&str, i64)]) -> NodeReply {
    NodeReply {
        node: node.into(),
        reply: Resp::Array(
            pairs
                .iter()
                .map(|(k, f)| Resp::Array(vec![Resp::Bulk(k.as_bytes().to_vec()), Resp::Int(*f)]))
                .collect(),
        ),
    }
}

fn names(hot: &[HotKey]) -> Vec<(String, u64, String)> {
    hot.iter()
        .map(|h| {
            (
                String::from_utf8_lossy(&h.key).into_owned(),
                h.freq,
                h.node.clone(),
            )
        })
        .collect()
}

#[test]
fn merged_by_counter_across_nodes_and_cut_at_count() {
    let replies = || {
        vec![
            local("n0", &[("a", 200), ("b", 9)]),
            local("n1", &[("c", 120), ("d", 120), ("e", 5)]),
            local("n2", &[("f", 150)]),
        ]
    };
    let hot = hot_keys(replies(), |_, _| true, 10).unwrap();
    let want = [
        ("a", 200, "n0"),
        ("f", 150, "n2"),
        ("c", 120, "n1"),
        ("d", 120, "n1"),
        ("b", 9, "n0"),
        ("e", 5, "n1"),
    ];
    let want: Vec<_> = want
        .iter()
        .map(|(k, f, n)| (k.to_string(), *f, n.to_string()))
        .collect();
    assert_eq!(names(&hot), want);
    let top3 = hot_keys(replies(), |_, _| true, 3).unwrap();
    assert_eq!(names(&top3), want[..3].to_vec());
    assert!(hot_keys(replies(), |_, _| true, 0).unwrap().is_empty());
    assert!(hot_keys(Vec::new(), |_, _| true, 5).unwrap().is_empty());
}

#[test]
fn strays_left_out_and_a_key_at_two_nodes_kept_once() {
    let replies = vec![
        local("n0", &[("moving", 50), ("stray", 250)]),
        local("n1", &[("moving", 40), ("x", 45)]),
    ];
    let hot = hot_keys(replies, |_, k| k != b"stray", 10).unwrap();
    let got = names(&hot);
    assert_eq!(got.len(), 2);
    assert_eq!(got[0], ("moving".into(), 50, "n0".into()));
    assert_eq!(got[1], ("x".into(), 45, "n1".into()));
}

#[test]
fn errors_and_bad_replies_name_their_node() {
    let refused = NodeReply {
        node: "n2".into(),
        reply: Resp::Error(b"ERR set an LFU policy".to_vec()),
    };
    let e = hot_keys(vec![local("n0", &[("a", 1)]), refused], |_, _| true, 5);
    assert_eq!(
        e,
        Err(Resp::Error(b"ERR set an LFU policy (at node n2)".to_vec()))
    );
    for bad in [
        Resp::Int(3),
        Resp::Array(vec![Resp::Bulk(b"a".to_vec())]),
        Resp::Array(vec![Resp::Array(vec![Resp::Bulk(b"a".to_vec())])]),
        Resp::Array(vec![Resp::Array(vec![
            Resp::Bulk(b"a".to_vec()),
            Resp::Int(-1),
        ])]),
    ] {
        let r = NodeReply {
            node: "n1".into(),
            reply: bad,
        };
        let Err(Resp::Error(line)) = hot_keys(vec![r], |_, _| true, 5) else {
            panic!("a bad reply is an error");
        };
        assert!(line.ends_with(b"(at node n1)"));
    }
}

#[test]
fn the_reply_is_key_counter_node() {
    let r = hot_reply(vec![HotKey {
        key: b"k".to_vec(),
        freq: 7,
        node: "n1".into(),
    }]);
    assert_eq!(
        r,
        Resp::Array(vec![Resp::Array(vec![
            Resp::Bulk(b"k".to_vec()),
            Resp::Int(7),
            Resp::Bulk(b"n1".to_vec()),
        ])])
    );
}
