//! Per-thread shards: which copy of a sharded structure the current thread uses, so
//! state touched by every connection is not one cache line all cores wait for.
//!
//! Each thread gets a number once, on first use, from a process-wide counter; a
//! structure of `n` shards gives the thread shard `number % n`. With at least as many
//! shards as worker threads, no two workers share one (tokio's workers are started
//! together, so they take consecutive numbers); a connection task that migrates
//! between workers keeps using the shard it chose, which is correct, only shared.
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::LazyLock;

/// Most shards a structure is split into: past this many cores, a few threads share
/// each shard (contention drops as 1/shards, memory grows with it).
const MAX_SHARDS: usize = 64;

/// Next thread number handed out.
static NEXT_THREAD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's number (taken on first use).
    static THREAD: usize = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
}

/// Shards per structure: the CPUs this process may run on, rounded up to a power of
/// two, at most [`MAX_SHARDS`]; 1 when unknown.
static SHARDS: LazyLock<usize> = LazyLock::new(|| {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .next_power_of_two()
        .min(MAX_SHARDS)
});

/// How many shards a per-thread structure should have.
pub(crate) fn count() -> usize {
    *SHARDS
}

/// The current thread's shard among `n` (`n` > 0).
pub(crate) fn of_thread(n: usize) -> usize {
    THREAD.with(|t| *t) % n.max(1)
}

/// A value alone on its cache lines (128 bytes: the adjacent-line prefetcher of x86
/// pulls pairs of 64-byte lines), so shards side by side don't share one.
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct Padded<T>(pub(crate) T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_take_distinct_shards_and_keep_them() {
        let n = 1024;
        let mine = of_thread(n);
        assert_eq!(of_thread(n), mine, "a thread keeps its shard");
        let theirs = std::thread::spawn(move || of_thread(n)).join().unwrap();
        assert_ne!(theirs, mine, "a second thread takes another shard");
        assert!(count().is_power_of_two() && count() <= MAX_SHARDS);
    }
}
