//! What a copy's child does with the keys its walk found (`copy_child`): hands each to the
//! shipper as the write its destination applies fastest, at the job's pace (its rate and pause,
//! read from `copy_page`). Strings are read in one `MGET` per batch and travel in one
//! `SHARD.APPLY NX key value expiry ...` per destination (measured at the destination from
//! `redis-cli --pipe`: 1.0 M strings/s, where `SET ... NX` runs at 850 k/s and `RESTORE` of
//! the same strings at 700 k/s; the child builds no checksum);
//! other types travel as the server's own `DUMP` in `RESTORE key ttl payload ABSTTL`, since no
//! command creates a hash, set, list or sorted set only when the key is absent; big keys
//! travel in pieces (`pieces`). Without `REPLACE`, `NX` and `RESTORE` both skip a key already
//! at the destination, so a write made there during the copy is never overwritten.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use redis_module::{CallOptionsBuilder, CallReply, CallResult, Context};

use crate::host::keyspace::KeyType;
use crate::reshard::copy_child::Found;
use crate::reshard::copy_page::Shared;
use crate::reshard::pace::Pace;
use crate::reshard::pieces::{self, Limits};
use crate::reshard::ship::{Expect, Shipper, Target};

/// Where a copier's writes go: the shipper itself (a forked child, which may wait on the
/// network) or a queue to a shipping thread (a pass in steps on the main thread, which never
/// waits: `ship_thread::Outbox`).
pub trait Sink {
    /// Queues one command for `target`, its reply read as `expect` says.
    fn send_as(&mut self, target: &Target, args: &[&[u8]], expect: Expect);
    /// The commands from now on are for database `db`.
    fn select(&mut self, db: i32);
    /// Waits while the job is paused or ahead of its rate for `keys` more keys (a child);
    /// a pass in steps looks at both before each batch and never waits here.
    fn wait_turn_for(&mut self, shared: &Shared, pace: &mut Pace, keys: u64);
    /// Ships a big key in pieces (which waits for the destination's answers mid-key), or
    /// leaves it for a forked pass (`name` in the current database).
    fn in_pieces(&mut self, ctx: &Context, target: &Target, f: &Found, replace: bool);
}

impl Sink for Shipper {
    fn send_as(&mut self, target: &Target, args: &[&[u8]], expect: Expect) {
        Shipper::send_as(self, target, args, expect);
    }

    fn select(&mut self, db: i32) {
        Shipper::select(self, db);
    }

    fn wait_turn_for(&mut self, shared: &Shared, pace: &mut Pace, keys: u64) {
        loop {
            if shared.paused.load(Ordering::SeqCst) != 0 {
                self.finish();
                self.close();
                shared.in_flight.store(0, Ordering::SeqCst);
                pace.restart();
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            let rate = shared.max_rate.load(Ordering::Relaxed);
            let now = Instant::now();
            if pace.allowance(rate, now) > 0 {
                pace.spend(keys);
                // What is about to go out counts as in flight before the pause is looked at
                // again: whoever pauses the job and then reads 0 in flight knows that nothing
                // more will be sent.
                let in_flight = self.in_flight() as u64 + keys;
                shared.in_flight.store(in_flight, Ordering::SeqCst);
                if shared.paused.load(Ordering::SeqCst) != 0 {
                    continue;
                }
                return;
            }
            std::thread::sleep(pace.wait(now).min(Duration::from_millis(50)));
        }
    }

    fn in_pieces(&mut self, ctx: &Context, target: &Target, f: &Found, replace: bool) {
        pieces::copy(
            ctx,
            self,
            target,
            &f.name,
            f.info.kind,
            f.info.expires_at,
            replace,
        );
    }
}

/// Serializes found keys and hands them to the sink (`Sink`).
pub struct Copier<'a, S: Sink = Shipper> {
    shared: &'a Shared,
    pace: Pace,
    pub shipper: S,
    targets: Vec<Target>,
    replace: bool,
    big: Limits,
}

impl<'a, S: Sink> Copier<'a, S> {
    pub fn new(
        shared: &'a Shared,
        shipper: S,
        targets: Vec<Target>,
        replace: bool,
        big: Limits,
    ) -> Copier<'a, S> {
        Copier {
            shared,
            pace: Pace::default(),
            shipper,
            targets,
            replace,
            big,
        }
    }

    /// Ships the keys of `found` that travel (and empties it).
    pub fn ship(&mut self, ctx: &Context, found: &mut Vec<Found>) {
        found.retain(|f| f.travels);
        let options = CallOptionsBuilder::new().build();
        // Big keys: in pieces.
        let big = self.big;
        let is_big = |f: &Found| big.big_by_length(f.info.kind, f.info.len);
        for f in found.iter().filter(|f| is_big(f)) {
            self.in_pieces(ctx, f);
        }
        found.retain(|f| !is_big(f));
        // Strings: their values in one MGET, shipped in one `SHARD.APPLY` per destination.
        let strings: Vec<&Found> = found
            .iter()
            .filter(|f| f.info.kind == KeyType::String)
            .collect();
        if !strings.is_empty() {
            let names: Vec<&[u8]> = strings.iter().map(|f| f.name.as_slice()).collect();
            let reply: CallResult = ctx.call_ext("MGET", &options, names.as_slice());
            if let Ok(CallReply::Array(values)) = reply {
                let values: Vec<_> = values.iter().collect();
                let mut by_owner: Vec<Vec<(&Found, &[u8])>> = vec![Vec::new(); self.targets.len()];
                for (f, value) in strings.iter().zip(values.iter()) {
                    // Anything else: gone since the scan saw it.
                    if let (Ok(CallReply::String(v)), Some(batch)) =
                        (value, by_owner.get_mut(f.owner))
                    {
                        batch.push((f, v.as_bytes()));
                    }
                }
                for (owner, batch) in by_owner.iter().enumerate() {
                    self.apply(owner, batch);
                }
            }
        }
        for f in found.iter().filter(|f| f.info.kind != KeyType::String) {
            self.dump_and_restore(ctx, f);
        }
        found.clear();
    }

    /// Ships the server's own `DUMP` of the key, or the key in
    /// pieces when the payload is too big.
    fn dump_and_restore(&mut self, ctx: &Context, f: &Found) {
        let options = CallOptionsBuilder::new().build();
        let dump: CallResult = ctx.call_ext("DUMP", &options, &[f.name.as_slice()]);
        if let Ok(CallReply::String(payload)) = dump {
            if self
                .big
                .big_by_payload(f.info.kind, payload.as_bytes().len())
            {
                self.in_pieces(ctx, f);
            } else {
                self.restore(f, payload.as_bytes());
            }
        }
    }

    /// Ships a big key in pieces.
    fn in_pieces(&mut self, ctx: &Context, f: &Found) {
        self.wait_turn();
        let Some(target) = self.targets.get(f.owner) else {
            return;
        };
        self.shipper.in_pieces(ctx, target, f, self.replace);
    }

    /// Waits while the job is paused (its connections closed) or ahead of its rate.
    fn wait_turn(&mut self) {
        self.wait_turn_for(1);
    }

    /// Waits while the job is paused (its connections closed) or ahead of its rate for `keys`
    /// more keys.
    fn wait_turn_for(&mut self, keys: u64) {
        self.shipper
            .wait_turn_for(self.shared, &mut self.pace, keys);
    }

    /// Ships strings (all for destination `owner`) in one `SHARD.APPLY NX|REPLACE key value
    /// expiry ...`: the destination dispatches one command for them all, where a `SET` each
    /// cost it 1.2 times as much (bench/findings.md, "The writes a destination applies
    /// fastest"); `NX` skips a key already there as `RESTORE` without `REPLACE` does.
    fn apply(&mut self, owner: usize, strings: &[(&Found, &[u8])]) {
        if strings.is_empty() {
            return;
        }
        self.wait_turn_for(strings.len() as u64);
        let Some(target) = self.targets.get(owner) else {
            return;
        };
        // The expiries' digits, all in one buffer (no allocation a key).
        let mut digits = Vec::with_capacity(14 * strings.len());
        let mut ends = Vec::with_capacity(strings.len());
        for (f, _) in strings {
            digits.extend_from_slice(itoa::Buffer::new().format(f.info.expires_at).as_bytes());
            ends.push(digits.len());
        }
        let condition: &[u8] = if self.replace { b"REPLACE" } else { b"NX" };
        let mut args: Vec<&[u8]> = Vec::with_capacity(2 + 3 * strings.len());
        args.push(b"SHARD.APPLY");
        args.push(condition);
        let mut start = 0;
        for ((f, value), &end) in strings.iter().zip(&ends) {
            args.push(&f.name);
            args.push(value);
            args.push(&digits[start..end]);
            start = end;
        }
        let n = u32::try_from(strings.len()).unwrap_or(u32::MAX);
        self.shipper.send_as(target, &args, Expect::Batch(n));
    }

    fn restore(&mut self, f: &Found, payload: &[u8]) {
        self.wait_turn();
        let Some(target) = self.targets.get(f.owner) else {
            return;
        };
        let mut ttl = itoa::Buffer::new();
        let ttl = ttl.format(f.info.expires_at).as_bytes();
        let mut args: Vec<&[u8]> = vec![b"RESTORE", &f.name, ttl, payload, b"ABSTTL"];
        if self.replace {
            args.push(b"REPLACE");
        }
        self.shipper.send_as(target, &args, Expect::Key);
    }
}
