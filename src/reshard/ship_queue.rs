//! The queue between the main thread and a copy's shipping thread (`ship_thread`), such that
//! every buffer is allocated and freed on the main thread: two fixed rings (`rtrb`: one
//! producer, one consumer, no lock, no allocation per message), one carrying the messages to the
//! thread, the other bringing each command's buffer back once the thread has copied it out; the
//! main thread encodes the next commands into buffers it got back.
//!
//! Why (a channel of `Vec<u8>` before): each command's buffer was allocated by the main thread
//! and freed by the shipping thread, and so was each block of the channel. Under Redis's
//! allocator (jemalloc) a free from another thread gives the memory back to the main thread's
//! arena under that arena's lock; the shipping thread runs under `SCHED_IDLE`, and preempted
//! while it held such a lock it left the main thread asleep on it until it ran again
//! (bench/findings.md, "No stall": main threads in `__lll_lock_wait` for 2-7 ms during a grow,
//! each woken right after a shipping thread ran).
//!
//! Bounded: the main thread stops serializing once `CAPACITY` commands are out (in the ring, at
//! the thread, or on their way back: `full`), past which a step adds at most one batch's
//! commands; the ring back holds twice as many, so it has room for every command out. A
//! message that finds the ring to the thread full waits in the main thread's own overflow, in
//! order, until the next `flush`. What the main thread counts as queued (`queued_bytes`) is
//! the bytes of the commands out.

use std::collections::VecDeque;

use rtrb::{Consumer, Producer, RingBuffer};

use crate::reshard::ship::Expect;

/// Commands out at which the main thread stops serializing (the ring to the thread's size).
pub const CAPACITY: usize = 4096;

/// A buffer that comes back bigger than this is freed rather than used again.
const KEEP_BYTES: usize = 1 << 20;

/// One message from the main thread to the shipping thread.
#[derive(Debug, PartialEq, Eq)]
pub enum Msg {
    /// The commands from now on are for this database.
    Select(i32),
    /// An encoded command for the pass's target of this index, its reply read as `expect`
    /// says. The buffer goes back (`Reader::give_back`) once copied out.
    Send(usize, Vec<u8>, Expect),
    /// The job is paused: wait for the replies and close every connection.
    Close,
    /// Every command is queued: wait for their replies, publish, and exit.
    End,
}

/// The main thread's end.
pub struct Writer {
    to_thread: Producer<Msg>,
    back: Consumer<Vec<u8>>,
    /// Messages that found the ring full, oldest first (sent before any new one).
    overflow: VecDeque<Msg>,
    /// Buffers back from the thread, emptied, for the next commands.
    pool: Vec<Vec<u8>>,
    /// Commands sent and their buffers not back yet (in the overflow too).
    out: usize,
    /// Their bytes.
    out_bytes: usize,
}

/// The shipping thread's end.
pub struct Reader {
    from_main: Consumer<Msg>,
    back: Producer<Vec<u8>>,
}

/// A new queue.
pub fn queue() -> (Writer, Reader) {
    let (to_thread, from_main) = RingBuffer::new(CAPACITY);
    let (back_in, back_out) = RingBuffer::new(2 * CAPACITY);
    (
        Writer {
            to_thread,
            back: back_out,
            overflow: VecDeque::new(),
            pool: Vec::new(),
            out: 0,
            out_bytes: 0,
        },
        Reader {
            from_main,
            back: back_in,
        },
    )
}

impl Writer {
    /// An empty buffer to encode a command into (one that came back, when there is one).
    pub fn buffer(&mut self) -> Vec<u8> {
        self.take_back();
        self.pool.pop().unwrap_or_default()
    }

    /// Queues `msg` (after those waiting in the overflow).
    pub fn put(&mut self, msg: Msg) {
        if let Msg::Send(_, bytes, _) = &msg {
            self.out += 1;
            self.out_bytes += bytes.len();
        }
        self.flush();
        if !self.overflow.is_empty() {
            self.overflow.push_back(msg);
            return;
        }
        if let Err(rtrb::PushError::Full(msg)) = self.to_thread.push(msg) {
            self.overflow.push_back(msg);
        }
    }

    /// Takes the buffers that came back and moves what waits in the overflow into the ring,
    /// as far as it fits; whether nothing waits now.
    pub fn flush(&mut self) -> bool {
        self.take_back();
        while let Some(msg) = self.overflow.pop_front() {
            if let Err(rtrb::PushError::Full(msg)) = self.to_thread.push(msg) {
                self.overflow.push_front(msg);
                return false;
            }
        }
        true
    }

    /// Whether the main thread should serialize no more for now: a message still waits for
    /// room in the ring, `CAPACITY` commands are out, or more than `max_bytes` of them.
    pub fn full(&mut self, max_bytes: usize) -> bool {
        !self.flush() || self.out >= CAPACITY || self.out_bytes > max_bytes
    }

    /// Bytes of the commands out.
    pub fn queued_bytes(&mut self) -> usize {
        self.take_back();
        self.out_bytes
    }

    fn take_back(&mut self) {
        while let Ok(mut bytes) = self.back.pop() {
            self.out = self.out.saturating_sub(1);
            self.out_bytes = self.out_bytes.saturating_sub(bytes.len());
            if bytes.capacity() <= KEEP_BYTES {
                bytes.clear();
                self.pool.push(bytes);
            }
        }
    }
}

impl Reader {
    /// The next message, if one is there.
    pub fn take(&mut self) -> Option<Msg> {
        self.from_main.pop().ok()
    }

    /// Sends a command's buffer back to the main thread, which frees or reuses it. (The ring
    /// back has room for every command out; were it full all the same, the buffer would be
    /// freed here.)
    pub fn give_back(&mut self, bytes: Vec<u8>) {
        let _ = self.back.push(bytes);
    }

    /// Whether the main thread's end is gone and nothing is left to read (a pass given up
    /// without its `End`).
    pub fn abandoned(&self) -> bool {
        self.from_main.is_abandoned() && self.from_main.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send(w: &mut Writer, target: usize, fill: u8, len: usize) {
        let mut b = w.buffer();
        b.extend(std::iter::repeat_n(fill, len));
        w.put(Msg::Send(target, b, Expect::Key));
    }

    #[test]
    fn buffers_come_back_to_the_writer_and_are_used_again() {
        let (mut w, mut r) = queue();
        send(&mut w, 0, b'a', 100);
        assert_eq!(w.queued_bytes(), 100);
        let Some(Msg::Send(0, bytes, Expect::Key)) = r.take() else {
            panic!("no command");
        };
        assert_eq!(bytes, vec![b'a'; 100]);
        let at = bytes.as_ptr();
        r.give_back(bytes);
        assert_eq!(w.queued_bytes(), 0);
        let again = w.buffer();
        assert!(again.is_empty() && again.capacity() >= 100);
        assert_eq!(again.as_ptr(), at, "the same buffer, not a new one");
    }

    #[test]
    fn messages_beyond_the_ring_wait_in_order_and_count_as_out() {
        let (mut w, mut r) = queue();
        for i in 0..CAPACITY + 10 {
            send(&mut w, i, b'x', 1);
        }
        w.put(Msg::End);
        assert!(w.full(usize::MAX));
        assert!(!w.flush(), "11 messages wait for room");
        let mut seen = Vec::new();
        for _ in 0..3 * CAPACITY {
            match r.take() {
                Some(Msg::Send(i, b, _)) => {
                    seen.push(i);
                    r.give_back(b);
                }
                Some(Msg::End) => break,
                Some(other) => panic!("{other:?}"),
                None => {
                    w.flush();
                }
            }
        }
        assert_eq!(seen, (0..CAPACITY + 10).collect::<Vec<_>>());
        assert!(w.flush());
        assert!(!w.full(usize::MAX));
        assert_eq!(w.queued_bytes(), 0);
    }

    #[test]
    fn a_big_buffer_is_freed_not_kept() {
        let (mut w, mut r) = queue();
        let mut b = w.buffer();
        b.resize(KEEP_BYTES + 1, 0);
        w.put(Msg::Send(0, b, Expect::Piece));
        let Some(Msg::Send(_, b, _)) = r.take() else {
            panic!("no command");
        };
        r.give_back(b);
        assert_eq!(w.queued_bytes(), 0);
        assert_eq!(w.buffer().capacity(), 0);
    }

    #[test]
    fn the_reader_knows_when_the_writer_is_gone_once_it_read_everything() {
        let (mut w, mut r) = queue();
        w.put(Msg::Select(3));
        drop(w);
        assert!(!r.abandoned(), "a message is still to read");
        assert_eq!(r.take(), Some(Msg::Select(3)));
        assert!(r.abandoned());
    }
}
