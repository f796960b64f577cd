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

/// A service's queue: how many connections wait for a slot now, and its bounds.
///
/// The count is shared (one `Arc`) by the pools of successive reloads, so that the
/// bound holds across a reload; each connection waits on the backends it can use,
/// whose slot notifications are shared the same way (a slot freed by a connection
/// of the old config wakes a connection queued under the new one).
#[derive(Debug)]
pub(super) struct Queue {
    queued: Arc<AtomicUsize>,
    size: usize,
    timeout: Duration,
}

impl Queue {
    /// A queue of `size` places, each held at most `timeout`; counting with
    /// `previous`'s, the same service's queue under the running config.
    pub(super) fn new(size: usize, timeout: Duration, previous: Option<&Queue>) -> Queue {
        Queue {
            queued: previous.map_or_else(Default::default, |q| q.queued.clone()),
            size,
            timeout,
        }
    }

    /// Connections waiting now.
    pub(super) fn queued(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }

    /// Look for a slot with `look` until it finds one or no candidate, waiting for
    /// one of the slots `listen` names to be freed while every candidate is full:
    /// in a place of the queue (refused when none is free), up to the timeout.
    ///
    /// It listens before it looks, so a slot freed in between is not missed.
    pub(super) async fn wait<'n, T>(
        &self,
        listen: impl Fn() -> Vec<Pin<Box<Notified<'n>>>>,
        mut look: impl FnMut() -> Look<T>,
    ) -> Result<T, PickError> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let mut waiting: Option<Place<'_>> = None;
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
            if waiting.is_none() {
                waiting = Some(Place::enter(self).ok_or(PickError::QueueFull)?);
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

/// A place in a queue, given back on drop.
struct Place<'a> {
    queue: &'a Queue,
}

impl<'a> Place<'a> {
    fn enter(queue: &'a Queue) -> Option<Place<'a>> {
        let mut cur = queue.queued.load(Ordering::Acquire);
        loop {
            if cur >= queue.size {
                return None;
            }
            match queue.queued.compare_exchange_weak(
                cur,
                cur + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(Place { queue }),
                Err(now) => cur = now,
            }
        }
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        self.queue.queued.fetch_sub(1, Ordering::AcqRel);
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
