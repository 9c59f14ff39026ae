//! The shipper's unit tests, against peers on loopback that answer as a destination would.

use super::*;
use std::io::BufRead;
use std::net::TcpListener;

/// A peer that answers each command with the reply `answer` gives for its second argument.
fn peer(answer: fn(&str) -> &'static str) -> (String, std::thread::JoinHandle<usize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let handle = std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let mut reader = io::BufReader::new(stream.try_clone().unwrap());
        let mut writer = stream;
        let mut seen = 0;
        loop {
            let Ok(crate::net::resp::Resp::Array(args)) = crate::net::resp::read_reply(&mut reader)
            else {
                return seen;
            };
            let text = |i: usize| match args.get(i) {
                Some(crate::net::resp::Resp::Bulk(b)) => String::from_utf8_lossy(b).into_owned(),
                _ => String::new(),
            };
            let reply = if text(0) == "SHARD.CLUSTER" {
                "+OK\r\n"
            } else {
                answer(&text(1))
            };
            seen += 1;
            if writer.write_all(reply.as_bytes()).is_err() {
                return seen;
            }
            let _ = reader.fill_buf();
        }
    });
    (address, handle)
}

fn target(address: &str) -> Target {
    Target {
        name: "d".into(),
        address: address.into(),
        index: 1,
        followed: false,
    }
}

#[test]
fn counts_copied_skipped_and_failed_through_a_small_window() {
    let (address, peer) = peer(|key| match key.as_bytes()[0] {
        b'b' => "-BUSYKEY Target key name already exists.\r\n",
        b'e' => "-ERR bad payload\r\n",
        _ => "+OK\r\n",
    });
    let window = Window {
        requests: 3,
        bytes: 1 << 20,
    };
    let mut shipper = Shipper::new(window, Duration::from_secs(5), None, None);
    let t = target(&address);
    for i in 0..300 {
        let key = format!("{}{i}", ["a", "b", "e"][i % 3]);
        shipper.send(&t, &[b"RESTORE", key.as_bytes(), b"0", b"payload"]);
        assert!(shipper.in_flight() <= 4);
    }
    shipper.finish();
    assert_eq!(shipper.in_flight(), 0);
    let tally = shipper.tally.clone();
    assert_eq!((tally.copied, tally.skipped, tally.failed), (100, 100, 100));
    assert!(
        tally.last_error.ends_with("ERR bad payload"),
        "{}",
        tally.last_error
    );
    drop(shipper);
    assert_eq!(peer.join().unwrap(), 301);
}

#[test]
fn pieces_count_only_their_errors_and_the_rename_counts_the_key() {
    let (address, peer) = peer(|key| match key {
        "new" => ":1\r\n",
        "there" => ":0\r\n",
        "oom" => "-OOM command not allowed\r\n",
        _ => "+OK\r\n",
    });
    let mut shipper = Shipper::new(Window::default(), Duration::from_secs(5), None, None);
    let t = target(&address);
    shipper.send_as(&t, &[b"HSET", b"tmp", b"f", b"v"], Expect::Piece);
    shipper.send_as(&t, &[b"RENAMENX", b"new", b"k1"], Expect::Rename);
    shipper.send_as(&t, &[b"RENAMENX", b"there", b"k2"], Expect::Rename);
    shipper.send_as(&t, &[b"HSET", b"oom", b"f", b"v"], Expect::Piece);
    shipper.drain(&t);
    let tally = shipper.tally.clone();
    assert_eq!(
        (
            tally.copied,
            tally.skipped,
            tally.failed,
            tally.piece_errors
        ),
        (1, 1, 0, 1)
    );
    assert!(tally.last_error.ends_with("OOM command not allowed"));
    drop(shipper);
    assert_eq!(peer.join().unwrap(), 5);
}

#[test]
fn a_destination_that_is_not_there_fails_every_key_with_its_name() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    drop(listener);
    let mut shipper = Shipper::new(Window::default(), Duration::from_millis(500), None, None);
    for _ in 0..5 {
        shipper.send(&target(&address), &[b"RESTORE", b"k", b"0", b"p"]);
    }
    shipper.finish();
    assert_eq!(shipper.tally.failed, 5);
    assert!(shipper
        .tally
        .last_error
        .starts_with(&format!("d ({address})")));
}

#[test]
fn a_set_nx_counts_its_null_as_skipped() {
    let (address, peer) = peer(|key| match key.as_bytes()[0] {
        b'n' => "$-1\r\n",
        b'e' => "-OOM command not allowed\r\n",
        _ => "+OK\r\n",
    });
    let mut shipper = Shipper::new(Window::default(), Duration::from_secs(5), None, None);
    let t = target(&address);
    for i in 0..30 {
        let key = format!("{}{i}", ["s", "n", "e"][i % 3]);
        shipper.send_as(&t, &[b"SET", key.as_bytes(), b"v", b"NX"], Expect::Set);
    }
    shipper.finish();
    let tally = shipper.tally.clone();
    assert_eq!((tally.copied, tally.skipped, tally.failed), (10, 10, 10));
    drop(shipper);
    assert_eq!(peer.join().unwrap(), 31);
}

fn followed(address: &str) -> Target {
    Target {
        followed: true,
        ..target(address)
    }
}

#[test]
fn a_followed_destination_that_is_not_there_loses_its_keys_for_another_pass() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    drop(listener);
    let mut shipper = Shipper::new(Window::default(), Duration::from_millis(500), None, None);
    for _ in 0..5 {
        shipper.send(&followed(&address), &[b"RESTORE", b"k", b"0", b"p"]);
    }
    shipper.send_as(
        &followed(&address),
        &[b"SHARD.APPLY", b"NX", b"a", b"1", b"0", b"b", b"2", b"0"],
        Expect::Batch(2),
    );
    shipper.finish();
    let tally = &shipper.tally;
    assert_eq!(
        (tally.failed, tally.lost(), tally.lost_by_node.clone()),
        (0, 7, vec![0, 7])
    );
    assert!(tally.last_error.starts_with(&format!("d ({address})")));
}

#[test]
fn a_demoted_destination_loses_what_it_refused_and_everything_after() {
    let (address, peer) = peer(|key| match key.as_bytes()[0] {
        b'o' => "-OOM command not allowed\r\n",
        b'r' => "-READONLY You can't write against a read only replica.\r\n",
        _ => "+OK\r\n",
    });
    let mut shipper = Shipper::new(Window::default(), Duration::from_secs(5), None, None);
    let t = followed(&address);
    for key in ["a0", "o1", "a2"] {
        shipper.send(&t, &[b"RESTORE", key.as_bytes(), b"0", b"p"]);
    }
    shipper.drain(&t);
    for i in 0..10 {
        let key = format!("{}{i}", if i == 0 { "r" } else { "a" });
        shipper.send(&t, &[b"RESTORE", key.as_bytes(), b"0", b"p"]);
    }
    shipper.finish();
    // More sent after the destination was lost: lost at once, never sent.
    shipper.send(&t, &[b"RESTORE", b"a99", b"0", b"p"]);
    let tally = shipper.tally.clone();
    assert_eq!((tally.copied, tally.failed, tally.lost()), (2, 1, 11));
    assert!(
        tally.last_error.contains("READONLY"),
        "{}",
        tally.last_error
    );
    drop(shipper);
    peer.join().unwrap();
}
