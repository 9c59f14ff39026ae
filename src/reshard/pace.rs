//! A job's pace against its `MAXRATE`/`THROTTLE` limit: how many keys may go now, and how long
//! until one more may. Shared by the copy's child (which sleeps) and the cleanup's steps (which
//! yield to the event loop). Pure: the caller passes the time.

use std::time::{Duration, Instant};

/// Keys handled since the rate last changed or the job resumed.
#[derive(Debug, Default, Clone)]
pub struct Pace {
    rate: u64,
    since: Option<Instant>,
    used: u64,
}

impl Pace {
    /// How many keys may go at `now` under `rate` keys per second (0: no limit): one at the
    /// start, then `rate` per second since.
    pub fn allowance(&mut self, rate: u64, now: Instant) -> u64 {
        if rate == 0 {
            return u64::MAX;
        }
        if self.since.is_none() || self.rate != rate {
            *self = Pace {
                rate,
                since: Some(now),
                used: 0,
            };
        }
        let elapsed = self
            .since
            .map_or(0.0, |t| now.duration_since(t).as_secs_f64());
        ((elapsed * rate as f64) as u64 + 1).saturating_sub(self.used)
    }

    /// Counts keys that went.
    pub fn spend(&mut self, keys: u64) {
        self.used += keys;
    }

    /// How long after `now` one more key may go (zero if one may now).
    pub fn wait(&self, now: Instant) -> Duration {
        match self.since {
            Some(since) if self.rate > 0 => {
                let due = Duration::from_secs_f64(self.used as f64 / self.rate as f64);
                (since + due).saturating_duration_since(now)
            }
            _ => Duration::ZERO,
        }
    }

    /// Starts counting afresh (after a pause: the time paused is no credit).
    pub fn restart(&mut self) {
        self.since = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allows_the_rate_and_says_how_long_to_wait() {
        let t0 = Instant::now();
        let mut pace = Pace::default();
        assert_eq!(pace.allowance(0, t0), u64::MAX);
        assert_eq!(pace.allowance(100, t0), 1);
        pace.spend(1);
        assert_eq!(pace.allowance(100, t0), 0);
        assert_eq!(pace.wait(t0), Duration::from_millis(10));
        let later = t0 + Duration::from_millis(505);
        assert_eq!(pace.allowance(100, later), 50);
        pace.spend(50);
        assert_eq!(pace.allowance(100, later), 0);
        assert!(pace.wait(later) <= Duration::from_millis(5));
        // A new rate or a restart counts from then.
        assert_eq!(pace.allowance(10, later), 1);
        pace.spend(1);
        pace.restart();
        assert_eq!(pace.allowance(10, later + Duration::from_secs(60)), 1);
    }
}
