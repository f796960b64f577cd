//! What a relay keeps count of as bytes flow: each direction's bytes (into the
//! backend's metric and the relay's own total) and when a byte last moved either
//! way (the idle clock).
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus::IntCounter;
use tokio::time::Instant;

/// Counters the relay adds to as bytes flow, borrowed from the backend's metric handles: no per-connection clone (and so no
/// reference-count traffic on a cache line every connection to the backend shares).
#[derive(Clone, Copy)]
pub struct RelayCounters<'a> {
    /// Client -> server bytes.
    pub c2s: &'a IntCounter,
    /// Server -> client bytes.
    pub s2c: &'a IntCounter,
    /// This connection's own totals, readable while the relay runs (the admin
    /// API's list of open connections reads them).
    pub conn: &'a ConnBytes,
}

/// One connection's bytes each way so far: the relay adds to them as it counts
/// (one relaxed add on a line no other connection touches); anyone holding the
/// connection's entry may read them while it runs.
#[derive(Debug, Default)]
pub struct ConnBytes {
    /// Client -> server bytes.
    pub c2s: AtomicU64,
    /// Server -> client bytes.
    pub s2c: AtomicU64,
}

/// Activity clock shared by both directions: milliseconds since `start` of the last
/// byte. On tokio's clock, the one the relay's timer runs on (the same as the
/// system's monotonic clock, but in tests with paused time).
pub(super) struct Activity {
    start: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    /// A clock starting now, with the last byte at its start.
    pub(super) fn new() -> Activity {
        Activity {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }
    /// When the clock started (the relay's start).
    pub(super) fn started(&self) -> Instant {
        self.start
    }
    /// Note that a byte moved now.
    pub(super) fn touch(&self) {
        self.last_ms
            .store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
    /// How long since a byte last moved.
    pub(super) fn idle_for(&self) -> Duration {
        let now = self.start.elapsed().as_millis() as u64;
        Duration::from_millis(now.saturating_sub(self.last_ms.load(Ordering::Relaxed)))
    }
}

/// One direction's accounting, shared by its pumps (copy and splice): the
/// backend's byte counter, the connection's total for the direction (which may
/// already hold bytes sent before the relay: the replayed hello), and the idle
/// clock both directions share.
pub(super) struct Meter<'a> {
    counter: &'a IntCounter,
    total: &'a AtomicU64,
    /// `total` when the relay started.
    start: u64,
    activity: &'a Activity,
}

impl<'a> Meter<'a> {
    /// A direction counting into `counter` and `total`, its activity on `activity`.
    pub(super) fn new(
        counter: &'a IntCounter,
        total: &'a AtomicU64,
        activity: &'a Activity,
    ) -> Meter<'a> {
        Meter {
            counter,
            start: total.load(Ordering::Relaxed),
            total,
            activity,
        }
    }

    /// `n` more bytes reached the destination.
    pub(super) fn count(&self, n: usize) {
        self.counter.inc_by(n as u64);
        self.total.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Bytes moved now (for the idle timeout).
    pub(super) fn touch(&self) {
        self.activity.touch();
    }

    /// Bytes this relay counted so far (the relay still running).
    pub(super) fn moved(&self) -> u64 {
        self.total.load(Ordering::Relaxed).wrapping_sub(self.start)
    }

    /// Every byte this relay counted.
    pub(super) fn total(self) -> u64 {
        self.moved()
    }
}
