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

/// Serializes found keys and hands them to the shipper.
pub struct Copier<'a> {
    ctx: &'a Context,
    shared: &'a Shared,
    pace: Pace,
    pub shipper: Shipper,
    targets: Vec<Target>,
    replace: bool,
    big: Limits,
}

impl<'a> Copier<'a> {
    pub fn new(
        ctx: &'a Context,
        shared: &'a Shared,
        shipper: Shipper,
        targets: Vec<Target>,
        replace: bool,
        big: Limits,
    ) -> Copier<'a> {
        Copier {
            ctx,
            shared,
            pace: Pace::default(),
            shipper,
            targets,
            replace,
            big,
        }
    }

    /// Ships the keys of `found` that travel (and empties it).
    pub fn ship(&mut self, found: &mut Vec<Found>) {
        found.retain(|f| f.travels);
        let options = CallOptionsBuilder::new().build();
        // Big keys: in pieces.
        let big = self.big;
        let is_big = |f: &Found| big.big_by_length(f.info.kind, f.info.len);
        for f in found.iter().filter(|f| is_big(f)) {
            self.in_pieces(f);
        }
        found.retain(|f| !is_big(f));
        // Strings: their values in one MGET, shipped in one `SHARD.APPLY` per destination.
        let strings: Vec<&Found> = found
            .iter()
            .filter(|f| f.info.kind == KeyType::String)
            .collect();
        if !strings.is_empty() {
            let names: Vec<&[u8]> = strings.iter().map(|f| f.name.as_slice()).collect();
            let reply: CallResult = self.ctx.call_ext("MGET", &options, names.as_slice());
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
            self.dump_and_restore(f);
        }
        found.clear();
    }

    /// Ships the server's own `DUMP` of the key, or the key in
    /// pieces when the payload is too big.
    fn dump_and_restore(&mut self, f: &Found) {
        let options = CallOptionsBuilder::new().build();
        let dump: CallResult = self.ctx.call_ext("DUMP", &options, &[f.name.as_slice()]);
        if let Ok(CallReply::String(payload)) = dump {
            if self
                .big
                .big_by_payload(f.info.kind, payload.as_bytes().len())
            {
                self.in_pieces(f);
            } else {
                self.restore(f, payload.as_bytes());
            }
        }
    }

    /// Ships a big key in pieces.
    fn in_pieces(&mut self, f: &Found) {
        self.wait_turn();
        let Some(target) = self.targets.get(f.owner) else {
            return;
        };
        pieces::copy(
            self.ctx,
            &mut self.shipper,
            target,
            &f.name,
            f.info.kind,
            f.info.expires_at,
            self.replace,
        );
    }

    /// Waits while the job is paused (its connections closed) or ahead of its rate.
    fn wait_turn(&mut self) {
        self.wait_turn_for(1);
    }

    /// Waits while the job is paused (its connections closed) or ahead of its rate for `keys`
    /// more keys.
    fn wait_turn_for(&mut self, keys: u64) {
        loop {
            if self.shared.paused.load(Ordering::SeqCst) != 0 {
                self.shipper.finish();
                self.shipper.close();
                self.shared.in_flight.store(0, Ordering::SeqCst);
                self.pace.restart();
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            let rate = self.shared.max_rate.load(Ordering::Relaxed);
            let now = Instant::now();
            if self.pace.allowance(rate, now) > 0 {
                self.pace.spend(keys);
                // What is about to go out counts as in flight before the pause is looked at
                // again: whoever pauses the job and then reads 0 in flight knows that nothing
                // more will be sent.
                let in_flight = self.shipper.in_flight() as u64 + keys;
                self.shared.in_flight.store(in_flight, Ordering::SeqCst);
                if self.shared.paused.load(Ordering::SeqCst) != 0 {
                    continue;
                }
                return;
            }
            std::thread::sleep(self.pace.wait(now).min(Duration::from_millis(50)));
        }
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
        self.shipper.send(target, &args);
    }
}
