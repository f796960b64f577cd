//! The one weight a backend is balanced by, and round robin's schedule for it.
//!
//! [`Weight::of`] is the only formula: the configured or run-time weight, times
//! the load-feedback factor, times the slow-start ramp, each quantised here. Every
//! algorithm picks with it, and the status page, `crossbar status`,
//! `/api/services` and `crossbar_backend_feedback_effective_weight` show it, so the
//! number shown is the number used.
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::Backend;
use crate::feedback::cell::FACTOR_ONE;

/// Steps of a feedback factor and of a slow-start ramp: a factor counts in
/// sixteenths, so round robin's schedule is rebuilt when a factor crosses one (not
/// at every sample's change of a per mille), and a ramp goes 1/16, 2/16 ... of the
/// way up, so it rebuilds the schedule at most 16 times.
const STEPS: u64 = 16;

/// Longest round-robin cycle built: weights (reduced by their greatest common
/// divisor) summing to more are scaled down to it. 16 slow-start steps x weights up
/// to 256 stay exact up to 4 backends at the largest coprime weights, and for any
/// realistic pool (12:4:2 is a cycle of 9); 64k entries cost 512 KiB and ~1 ms to
/// build per dozen backends, once per weight change.
const MAX_SCHEDULE: u64 = 1 << 16;

/// The weight a backend is balanced by, in units of 1/256 of a configured weight
/// (a feedback step times a ramp step): 0 only at weight 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Weight(u64);

impl Weight {
    /// `b`'s weight now: [`Backend::weight`] x its feedback factor (in [`STEPS`],
    /// at least one) x its ramp over `slow_start` (in [`STEPS`], at least one).
    pub fn of(b: &Backend, slow_start: Duration) -> Weight {
        let factor = u64::from(b.feedback().factor()) * STEPS;
        let level = ((factor + u64::from(FACTOR_ONE) / 2) / u64::from(FACTOR_ONE)).max(1);
        let ramp = match ramp(b, slow_start) {
            Some((elapsed, total)) => (STEPS * elapsed / total).max(1),
            None => STEPS,
        };
        Weight(u64::from(b.weight()) * level * ramp)
    }

    /// In 1/256ths of a configured weight.
    pub fn units(self) -> u64 {
        self.0
    }

    /// As a configured weight would say it: 1.0 for weight 1 at factor 1, no ramp.
    pub fn as_f64(self) -> f64 {
        self.0 as f64 / (STEPS * STEPS) as f64
    }
}

/// `(elapsed, total)` milliseconds of `b`'s slow-start ramp under way (`elapsed <
/// total`, `total` > 0); `None` when not ramping.
pub(super) fn ramp(b: &Backend, slow_start: Duration) -> Option<(u64, u64)> {
    let total = slow_start.as_millis() as u64;
    let up = b.shared.up_since_ms.load(Ordering::Acquire);
    if total == 0 || up == 0 {
        return None; // no ramp, or available since start
    }
    let since = b.shared.epoch.elapsed().as_millis() as u64;
    let elapsed = since.saturating_sub(up - 1);
    (elapsed < total).then_some((elapsed, total))
}

/// One cycle of smooth weighted round robin for fixed weights, and where the pool
/// is in it.
#[derive(Debug, Default)]
pub(super) struct Schedule {
    /// The weight of each backend (by index) it was built for; 0 = not in it.
    pub(super) weights: Vec<u64>,
    /// Backend indices in pick order: each backend as often as its weight (divided
    /// by the weights' greatest common divisor), spread evenly.
    pub(super) order: Vec<usize>,
    /// Picks made from it (wrapping around `order`).
    pub(super) cursor: AtomicUsize,
}

impl Schedule {
    pub(super) fn build(weights: Vec<u64>, cursor: usize) -> Schedule {
        let gcd = weights.iter().fold(0, |g, &w| gcd(g, w)).max(1);
        let mut reduced: Vec<u64> = weights.iter().map(|&w| w / gcd).collect();
        let sum: u64 = reduced.iter().sum();
        if sum > MAX_SCHEDULE {
            // Proportions to within 1 / MAX_SCHEDULE; every backend keeps a place.
            for w in reduced.iter_mut().filter(|w| **w > 0) {
                *w = (*w * MAX_SCHEDULE / sum).max(1);
            }
        }
        let reduced: Vec<i64> = reduced.into_iter().map(|w| w as i64).collect();
        let total: i64 = reduced.iter().sum();
        let mut current = vec![0i64; reduced.len()];
        let mut order = Vec::with_capacity(total as usize);
        for _ in 0..total {
            let mut best = None;
            for (i, &w) in reduced.iter().enumerate().filter(|(_, &w)| w > 0) {
                current[i] += w;
                if best.map_or(true, |b: usize| current[i] > current[b]) {
                    best = Some(i);
                }
            }
            if let Some(b) = best {
                current[b] -= total;
                order.push(b);
            }
        }
        Schedule {
            weights,
            order,
            cursor: AtomicUsize::new(cursor),
        }
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}
