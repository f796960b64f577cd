//! The bounded wait for a slot: when every candidate is full, a connection waits
//! in its service's queue (`queue.size`, `queue.timeout`) for a slot one of them
//! frees; and why no backend could be had ([`PickError`]). It knows nothing of
//! pools: the pool says how to look for a slot and which backends to listen to.
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use tokio::sync::futures::Notified;

/// Nanoseconds in a millisecond: a wait is rounded up to whole milliseconds, so
/// that any wait at all shows (a 0 says the connection never queued).
const NANOS_PER_MS: u128 = 1_000_000;

/// Why no backend could be had.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PickError {
    /// No backend is healthy and enabled (or all were tried).
    #[error("no backend available")]
    NoBackendAvailable,
    /// Every candidate is full and the queue is full too.
    #[error("all backends full and the queue is full")]
    QueueFull,
    /// Every candidate stayed full for the queue timeout.
    #[error("timed out waiting in the queue for a backend slot")]
    QueueTimeout,
}

impl PickError {
    /// Metric label / access-log reason.
    pub fn reason(&self) -> &'static str {
        match self {
            PickError::NoBackendAvailable => "no_backend",
            PickError::QueueFull => "queue_full",
            PickError::QueueTimeout => "queue_timeout",
        }
    }
}

/// What one look for a slot found.
pub(super) enum Look<T> {
    /// A slot, reserved.
    Got(T),
    /// Every candidate is full: wait for one to free a slot.
    Full,
    /// No candidate at all.
    Nothing,
    /// Lost several reservation races in a row: look again at once.
    Raced,
}

/// A service's queue: how many connections wait for a slot now, the most that
/// ever waited at once, and its bounds.
///
/// The counts are shared (one `Arc`) by the pools of successive reloads, so that
/// the bound holds across a reload and the peak is the process's; each connection
/// waits on the backends it can use, whose slot notifications are shared the same
/// way (a slot freed by a connection of the old config wakes a connection queued
/// under the new one).
#[derive(Debug)]
pub(super) struct Queue {
    counts: Arc<Counts>,
    size: usize,
    timeout: Duration,
}

/// A queue's counts, shared across reloads.
#[derive(Debug, Default)]
struct Counts {
    /// Connections waiting now.
    queued: AtomicUsize,
    /// The most that waited at once since the start (HAProxy's `qmax`).
    peak: AtomicUsize,
}

impl Queue {
    /// A queue of `size` places, each held at most `timeout`; counting with
    /// `previous`'s, the same service's queue under the running config.
    pub(super) fn new(size: usize, timeout: Duration, previous: Option<&Queue>) -> Queue {
        Queue {
            counts: previous.map_or_else(Default::default, |q| q.counts.clone()),
            size,
            timeout,
        }
    }

    /// Connections waiting now.
    pub(super) fn queued(&self) -> usize {
        self.counts.queued.load(Ordering::Acquire)
    }

    /// The most connections that waited at once since the process started.
    pub(super) fn peak(&self) -> usize {
        self.counts.peak.load(Ordering::Acquire)
    }

    /// Look for a slot with `look` until it finds one or no candidate, waiting for
    /// one of the slots `listen` names to be freed while every candidate is full:
    /// in a place of the queue (refused when none is free), up to the timeout.
    /// The milliseconds spent in a place, rounded up, are added to `waited_ms` when
    /// the place is left (the slot found, the timeout, or this future dropped: the
    /// client left).
    ///
    /// It listens before it looks, so a slot freed in between is not missed.
    pub(super) async fn wait<'n, T>(
        &self,
        listen: impl Fn() -> Vec<Pin<Box<Notified<'n>>>>,
        mut look: impl FnMut() -> Look<T>,
        waited_ms: &mut u32,
    ) -> Result<T, PickError> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        // Taken when a place is entered: a connection queues once per wait.
        let mut unqueued = Some(waited_ms);
        // Held, never read, until the wait ends: its drop gives the place back.
        let mut _place: Option<Place<'_, '_>> = None;
        loop {
            let mut freed = listen();
            for n in &mut freed {
                n.as_mut().enable();
            }
            match look() {
                Look::Got(found) => return Ok(found),
                Look::Nothing => return Err(PickError::NoBackendAvailable),
                Look::Raced => continue,
                Look::Full => {}
            }
            if let Some(waited_ms) = unqueued.take() {
                let place = Place::enter(self, &deadline, waited_ms);
                _place = Some(place.ok_or(PickError::QueueFull)?);
            }
            if tokio::time::timeout_at(deadline, any_of(&mut freed))
                .await
                .is_err()
            {
                return Err(PickError::QueueTimeout);
            }
        }
    }
}

/// A place in a queue, given back on drop, when the time it was held is added
/// to the connection's wait.
///
/// It was entered in the poll that set the wait's deadline (nothing awaits
/// before), so it was entered at the deadline less the timeout: it keeps a
/// reference to the deadline, not an `Instant` of its own (this future lives in
/// every connection's, `conn::size_probe`).
struct Place<'a, 'w> {
    queue: &'a Queue,
    deadline: &'w tokio::time::Instant,
    waited_ms: &'w mut u32,
}

impl<'a, 'w> Place<'a, 'w> {
    fn enter(
        queue: &'a Queue,
        deadline: &'w tokio::time::Instant,
        waited_ms: &'w mut u32,
    ) -> Option<Place<'a, 'w>> {
        let counts = &queue.counts;
        let mut cur = counts.queued.load(Ordering::Acquire);
        loop {
            if cur >= queue.size {
                return None;
            }
            match counts.queued.compare_exchange_weak(
                cur,
                cur + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(now) => cur = now,
            }
        }
        counts.peak.fetch_max(cur + 1, Ordering::AcqRel);
        Some(Place {
            queue,
            deadline,
            waited_ms,
        })
    }
}

impl Drop for Place<'_, '_> {
    fn drop(&mut self) {
        self.queue.counts.queued.fetch_sub(1, Ordering::AcqRel);
        let deadline = *self.deadline;
        let entered = deadline.checked_sub(self.queue.timeout).unwrap_or(deadline);
        let ms = entered.elapsed().as_nanos().div_ceil(NANOS_PER_MS);
        *self.waited_ms = (*self.waited_ms).saturating_add(u32::try_from(ms).unwrap_or(u32::MAX));
    }
}

/// Completes when one of `notified` does. The others are dropped with it, and one
/// that was notified meanwhile hands its wakeup on to the next connection waiting
/// on that backend (tokio's `Notified` does so on drop), so no freed slot is lost.
async fn any_of(notified: &mut [Pin<Box<Notified<'_>>>]) {
    std::future::poll_fn(|cx| {
        if notified.iter_mut().any(|n| n.as_mut().poll(cx).is_ready()) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
}
