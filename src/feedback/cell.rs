//! Where load feedback is published for the balancer: a backend's factor in
//! fixed point, whether it is saturated, its agent's connection limit, and the
//! tracker behind them (`weight.rs`).
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Mutex;

use super::weight::{Tracker, MAX_FACTOR};

/// The factor in fixed point as the balancer reads it: 1000 = the weight as set.
pub const FACTOR_ONE: u32 = 1000;

/// A factor in the balancer's fixed point.
pub fn fixed(factor: f64) -> u32 {
    (factor * f64::from(FACTOR_ONE))
        .round()
        .clamp(1.0, MAX_FACTOR * f64::from(FACTOR_ONE)) as u32
}

/// What the balancer reads of a backend's feedback, and the tracker behind it:
/// carried across reloads with the rest of the backend's live state, so a reload
/// neither restarts the blackout nor forgets the average.
#[derive(Debug)]
pub struct FeedbackCell {
    factor: AtomicU32,
    saturated: AtomicBool,
    max_connections: AtomicU32,
    tracker: Mutex<Tracker>,
}

impl Default for FeedbackCell {
    fn default() -> FeedbackCell {
        FeedbackCell {
            factor: AtomicU32::new(FACTOR_ONE),
            saturated: AtomicBool::new(false),
            max_connections: AtomicU32::new(0),
            tracker: Mutex::new(Tracker::default()),
        }
    }
}

impl FeedbackCell {
    /// The factor in fixed point ([`FACTOR_ONE`] = the weight as set).
    pub fn factor(&self) -> u32 {
        self.factor.load(Ordering::Acquire)
    }

    /// Its compiler refuses work now (see [`Tracker::saturated`]).
    pub fn saturated(&self) -> bool {
        self.saturated.load(Ordering::Acquire)
    }

    /// The connection limit its agent set, if any.
    pub fn max_connections(&self) -> Option<u32> {
        Some(self.max_connections.load(Ordering::Acquire)).filter(|&n| n > 0)
    }

    /// Publish what the balancer reads.
    pub fn publish(&self, factor: u32, saturated: bool, max_connections: Option<u32>) {
        self.factor.store(factor, Ordering::Release);
        self.saturated.store(saturated, Ordering::Release);
        self.max_connections
            .store(max_connections.unwrap_or(0), Ordering::Release);
    }

    /// The tracker, to update or read (never held across an await).
    pub fn tracker(&self) -> std::sync::MutexGuard<'_, Tracker> {
        self.tracker.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Feedback is off: the weight as set, and nothing remembered.
    pub fn reset(&self) {
        self.publish(FACTOR_ONE, false, None);
        *self.tracker() = Tracker::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::feedback::weight::{Params, PoolLock, PuppetSample, Reading};
    use std::time::{Duration, Instant};

    #[test]
    fn the_cell_publishes_and_resets() {
        let cell = FeedbackCell::default();
        assert_eq!(
            (cell.factor(), cell.saturated(), cell.max_connections()),
            (FACTOR_ONE, false, None)
        );
        cell.publish(fixed(0.25), true, Some(3));
        assert_eq!(
            (cell.factor(), cell.saturated(), cell.max_connections()),
            (250, true, Some(3))
        );
        let idle = Reading::Puppet(PuppetSample {
            jrubies: 1,
            free: 1,
            queued: 0,
            borrowed: 0,
            lock: PoolLock::NotInUse,
            queue_limit_hits: 0,
        });
        let p = Params {
            floor: 0.05,
            blackout: Duration::ZERO,
            expiry: Duration::from_secs(10),
            smoothing: Duration::ZERO,
            jrubies: None,
            queue_limit: None,
            by_pool_size: true,
        };
        cell.tracker().observe(idle, Instant::now(), &p);
        cell.reset();
        assert_eq!(cell.factor(), FACTOR_ONE);
        assert!(cell.tracker().last().is_none());
    }
}
