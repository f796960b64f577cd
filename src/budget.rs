//! The confirmation budget: a token bucket bounding the extra backend handshakes
//! that confirmed placement (`conn/confirm.rs`) may cost per second, process-wide.
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// A token bucket of extra backend handshakes per second, shared by every service
/// (`confirm_budget`). Holds at most one second's worth, so a burst after a quiet
/// period costs no more than `rate` at once.
pub struct Budget {
    rate: AtomicU32,
    bucket: Mutex<Bucket>,
}

struct Bucket {
    tokens: f64,
    last: Instant,
}

impl Budget {
    /// A full bucket of `rate` tokens refilled at `rate` per second (0: never).
    pub fn new(rate: u32) -> Budget {
        Budget {
            rate: AtomicU32::new(rate),
            bucket: Mutex::new(Bucket {
                tokens: f64::from(rate),
                last: Instant::now(),
            }),
        }
    }

    /// Change the rate (on reload); tokens above the new rate are dropped.
    pub fn set_rate(&self, rate: u32) {
        self.rate.store(rate, Ordering::Relaxed);
        let mut b = self.bucket.lock().unwrap_or_else(|e| e.into_inner());
        b.tokens = b.tokens.min(f64::from(rate));
    }

    /// Take one token if there is one.
    pub fn try_take(&self) -> bool {
        self.try_take_at(Instant::now())
    }

    fn try_take_at(&self, now: Instant) -> bool {
        let rate = f64::from(self.rate.load(Ordering::Relaxed));
        let mut b = self.bucket.lock().unwrap_or_else(|e| e.into_inner());
        let refill = now.saturating_duration_since(b.last).as_secs_f64() * rate;
        b.tokens = (b.tokens + refill).min(rate);
        b.last = b.last.max(now);
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn budget_holds_one_second_and_refills() {
        let b = Budget::new(5);
        let t0 = Instant::now();
        let taken = (0..20).filter(|_| b.try_take_at(t0)).count();
        assert_eq!(taken, 5, "a full bucket holds `rate` tokens");
        let t1 = t0 + Duration::from_millis(450);
        let refilled = (0..20).filter(|_| b.try_take_at(t1)).count();
        assert_eq!(refilled, 2, "0.45 s at 5/s");
        let t2 = t1 + Duration::from_secs(60);
        let capped = (0..20).filter(|_| b.try_take_at(t2)).count();
        assert_eq!(capped, 5, "never more than one second's worth");
        assert!(!Budget::new(0).try_take());
        b.set_rate(0);
        assert!(
            !b.try_take_at(t2 + Duration::from_secs(5)),
            "rate 0: no extra handshakes"
        );
    }
}
