//! The hard stop: the moment shutdown cuts the connections still open, waited for by
//! every relay without a process-wide lock.
//!
//! A `CancellationToken` would do, but every connection's wait on it takes the token's
//! one mutex to check the flag on each poll (each time the relay's task wakes: every
//! chunk relayed) and its `Notify`'s one mutex to register and deregister. Here the
//! flag is an atomic, and waiters register on one of `shard::count` `Notify`s, the
//! one of the thread that starts waiting; a waiter re-registers only when its task's
//! waker changes, so relaying a chunk touches no shared lock at all.
use std::future::{poll_fn, Future};
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Poll, Waker};

use tokio::sync::Notify;

use crate::shard::{self, Padded};

/// Fires once, when shutdown's grace period is over; every [`HardStop::stopped`]
/// future then completes.
#[derive(Debug)]
pub struct HardStop {
    stopped: AtomicBool,
    shards: Box<[Padded<Notify>]>,
}

impl Default for HardStop {
    fn default() -> Self {
        HardStop::new()
    }
}

impl HardStop {
    /// Not stopped, one waiter list per shard (`shard::count`).
    pub fn new() -> HardStop {
        HardStop {
            stopped: AtomicBool::new(false),
            shards: (0..shard::count()).map(|_| Padded(Notify::new())).collect(),
        }
    }

    /// Stop: every waiter, present and future, completes.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        for waiters in &*self.shards {
            waiters.notify_waiters();
        }
    }

    /// Has [`HardStop::stop`] been called?
    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    /// Completes once stopped (at once if already). Cancel safe.
    pub async fn stopped(&self) {
        let waiters = &self.shards[shard::of_thread(self.shards.len())];
        // Created before the flag is read: a `notify_waiters` from then on completes
        // it even before it is first polled, so no stop falls between the two.
        let notified = waiters.notified();
        tokio::pin!(notified);
        let mut registered: Option<Waker> = None;
        poll_fn(|cx| {
            if self.is_stopped() {
                return Poll::Ready(());
            }
            if registered.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                return Poll::Pending; // our waker is still the one on the list
            }
            if notified.as_mut().poll(cx).is_ready() {
                return Poll::Ready(());
            }
            registered = Some(cx.waker().clone());
            Poll::Pending
        })
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn stop_ends_every_waiter_on_every_thread() {
        let stop = Arc::new(HardStop::new());
        let mut waiting = Vec::new();
        for _ in 0..64 {
            let s = stop.clone();
            let (armed_tx, armed_rx) = tokio::sync::oneshot::channel();
            waiting.push((
                tokio::spawn(async move {
                    let stopped = s.stopped();
                    tokio::pin!(stopped);
                    // Registered before the test goes on: a stop after this wakes it.
                    assert!(futures_poll_once(stopped.as_mut()).await.is_pending());
                    armed_tx.send(()).unwrap();
                    stopped.await;
                }),
                armed_rx,
            ));
        }
        let mut tasks = Vec::new();
        for (task, armed) in waiting {
            armed.await.unwrap();
            tasks.push(task);
        }
        assert!(tasks.iter().all(|t| !t.is_finished()));
        stop.stop();
        for t in tasks {
            // Hang guard only: a waiter the stop did not wake never ends.
            let ended = tokio::time::timeout(std::time::Duration::from_secs(60), t).await;
            ended.expect("the stop woke the waiter").unwrap();
        }
        // After the stop, a new wait completes at once.
        stop.stopped().await;
        assert!(stop.is_stopped());
    }

    /// Poll `f` once with the task's own context.
    async fn futures_poll_once<F: std::future::Future + Unpin>(mut f: F) -> Poll<F::Output> {
        poll_fn(|cx| Poll::Ready(std::pin::Pin::new(&mut f).poll(cx))).await
    }
}
