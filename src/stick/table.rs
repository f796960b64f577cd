//! The concurrent table: hashed keys to entries, lookups on a shard read lock,
//! inserts and evictions under the lock of the key's queue, expiry by the sweeper.
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use siphasher::sip::SipHasher13;

use super::entry::*;
use super::{EntryView, KeyKind, StickKey, TableParams, TableStats};
use crate::shard::{self, Padded};

/// Result of looking an entry up.
pub(super) enum Found {
    Hit(u16),
    Expired(u32),
    Miss,
}

/// What making room for a new entry did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Eviction {
    /// An entry was removed and its place handed to the caller (`count` unchanged).
    Handed,
    /// The entry to evict was removed meanwhile by someone else, who lowered `count`.
    Vanished,
    /// The queue holds no entry.
    Empty,
}

/// How a learned key updates its entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Learn {
    /// An entry: it now points at the backend.
    Entry,
    /// A ticket-key prefix: seen on a second backend, it is shared.
    Prefix,
    /// A source hint: its address's third full handshake marks it shared.
    Hint,
}

/// A concurrent stick table.
///
/// Limits and defaults: at most `size` entries (a `size` of 0 learns nothing); idle
/// lifetimes are whole seconds (rounded up, clamped to one year) and an entry expires
/// once more than its lifetime has passed since its last use, so up to ~2 s late, never
/// early; at most 65535 distinct backend names per table (more are not learned).
pub struct StickTable {
    /// `size` is fixed; `expire` and `source_expire` are as built (the lifetimes in
    /// force are `ttl` and `source_ttl`, which a reload may change).
    pub(super) params: TableParams,
    pub(super) ttl: AtomicU32,
    pub(super) source_ttl: AtomicU32,
    pub(super) hash_key: [AtomicU64; 2],
    pub(super) map: DashMap<u64, Entry, BuildHasherDefault<PassThrough>>,
    /// The CLOCK queues; a key's record is always in the same one ([`queue_of`]).
    pub(super) queues: Box<[Padded<Mutex<Fifo>>]>,
    /// Entries in the map; raised before an insert and lowered after a removal, so it
    /// never reads below the real number and the `size` check is conservative.
    pub(super) count: AtomicUsize,
    pub(super) backends: Backends,
    pub(super) epoch: Instant,
    pub(super) clock_offset: AtomicU32,
    pub(super) expired: AtomicU64,
    pub(super) evicted: AtomicU64,
    /// Of `evicted`, those of the protected segment.
    pub(super) evicted_protected: AtomicU64,
    /// The client prefix of each source entry (`10.2.0.17/32`), for `table show`:
    /// the entry itself keeps only its key's hash. At most `size` of them; those of
    /// entries gone are swept with the expired entries. Not saved in a state file.
    pub(super) clients: DashMap<u64, Box<str>, BuildHasherDefault<PassThrough>>,
}

impl std::fmt::Debug for StickTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StickTable")
            .field("params", &self.params)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl StickTable {
    /// An empty table with a fresh random hash key.
    pub fn new(params: TableParams) -> StickTable {
        let queues = queue_count(params.size);
        StickTable {
            ttl: AtomicU32::new(ttl_secs(params.expire)),
            source_ttl: AtomicU32::new(ttl_secs(params.source_expire)),
            params,
            hash_key: [
                AtomicU64::new(fastrand::u64(..)),
                AtomicU64::new(fastrand::u64(..)),
            ],
            map: DashMap::with_hasher(BuildHasherDefault::default()),
            queues: (0..queues)
                .map(|_| Padded(Mutex::new(Fifo::new())))
                .collect(),
            count: AtomicUsize::new(0),
            backends: Backends::new(),
            epoch: Instant::now(),
            clock_offset: AtomicU32::new(0),
            expired: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
            evicted_protected: AtomicU64::new(0),
            clients: DashMap::default(),
        }
    }

    /// The fixed-size key for raw key bytes of a kind.
    ///
    /// Keyed SipHash-1-3 over the kind's code byte and `raw`, with this table's secret
    /// 128-bit key: clients can't aim collisions at the table. `load` adopts the key of
    /// the saved table, so keys computed before a `load` no longer match.
    pub fn key(&self, kind: KeyKind, raw: &[u8]) -> StickKey {
        let mut hasher = SipHasher13::new_with_keys(
            self.hash_key[0].load(Relaxed),
            self.hash_key[1].load(Relaxed),
        );
        hasher.write_u8(kind.code());
        hasher.write(raw);
        StickKey {
            kind,
            hash: hasher.finish(),
        }
    }

    /// The backend an unexpired entry for `raw` bytes of `kind` points at (refreshing
    /// it), lent to `f`: one call from what the client sent to where it goes.
    ///
    /// Hot path: takes one dashmap shard read lock, never a table-wide lock. An expired
    /// entry is a miss and is removed; a shared prefix is a miss (and is not refreshed).
    pub fn lookup<R>(&self, kind: KeyKind, raw: &[u8], f: impl FnOnce(&str) -> R) -> Option<R> {
        self.lookup_with(&self.key(kind, raw), f)
    }

    /// [`StickTable::lookup`] for a key already hashed. The name is lent to `f`, not
    /// cloned: no shared reference count is touched, so concurrent hits on the same
    /// backend don't contend for one cache line.
    pub fn lookup_with<R>(&self, key: &StickKey, f: impl FnOnce(&str) -> R) -> Option<R> {
        self.find(key).and_then(|b| self.backends.with_name(b, f))
    }

    /// The backend index of an unexpired, unshared entry (refreshing it); removes an
    /// expired one.
    fn find(&self, key: &StickKey) -> Option<u16> {
        let now = self.now();
        let found = match self.map.get(&key.hash) {
            None => Found::Miss,
            Some(e) if e.kind != key.kind.code() => Found::Miss,
            Some(e) if e.idle(now) > self.ttl_of(e.kind) => Found::Expired(e.gen),
            Some(e) if e.is_shared() => Found::Miss,
            Some(e) => {
                e.touch(now);
                Found::Hit(e.backend)
            }
        };
        match found {
            Found::Hit(backend) => Some(backend),
            Found::Expired(gen) => {
                let removed = self.map.remove_if(&key.hash, |_, e| {
                    e.gen == gen && e.idle(now) > self.ttl_of(e.kind)
                });
                if removed.is_some() {
                    self.count.fetch_sub(1, Relaxed);
                    self.expired.fetch_add(1, Relaxed);
                }
                None
            }
            Found::Miss => None,
        }
    }

    /// Record that `key` lives on `backend` (insert or overwrite), evicting if full.
    ///
    /// An overwrite moves the entry to `backend` (resetting its age if the backend
    /// changes) and refreshes it. A new key in a full table first evicts the least
    /// recently used entry (approximately: see the module docs).
    pub fn learn(&self, key: StickKey, backend: &str) {
        if let Some(backend) = self.backends.intern(backend) {
            self.upsert(key, backend, Learn::Entry);
        }
    }

    /// Record a source hint: `key`'s address just did a full handshake on `backend`.
    /// The third full handshake from one address within the hint's life marks it
    /// shared (many clients behind it): a shared hint no longer routes, and stays
    /// shared, refreshed by each further full handshake, until idle for its lifetime.
    pub fn learn_hint(&self, key: StickKey, backend: &str) {
        if let Some(backend) = self.backends.intern(backend) {
            self.upsert(key, backend, Learn::Hint);
        }
    }

    /// Record a ticket-key prefix seen on `backend`; a prefix seen on two backends
    /// is marked shared and no longer routes.
    ///
    /// A shared entry stays (refreshed by each sighting) so the prefix keeps being
    /// recognised as shared until it has been idle for `expire`.
    pub fn learn_prefix(&self, key: StickKey, backend: &str) {
        if let Some(backend) = self.backends.intern(backend) {
            self.upsert(key, backend, Learn::Prefix);
        }
    }

    /// A resumption proved the entry of `key` (the server accepted the session it
    /// names, or the client behind the address resumed): it joins the protected
    /// segment, which a full table evicts from only when the probation segment
    /// has nothing left (see the module docs). Sets a flag, no lock; nothing
    /// when there is no such entry.
    pub fn protect(&self, key: &StickKey) {
        if let Some(e) = self.map.get(&key.hash) {
            if e.kind == key.kind.code() && !e.is_protected() {
                e.flags.fetch_or(PROTECTED, Relaxed);
            }
        }
    }

    #[cfg(test)]
    /// Remove one entry.
    pub(super) fn forget(&self, key: &StickKey) {
        let kind = key.kind.code();
        if self
            .map
            .remove_if(&key.hash, |_, e| e.kind == kind)
            .is_some()
        {
            self.count.fetch_sub(1, Relaxed);
        }
    }

    /// Remove every entry pointing at `backend` (it left the config).
    ///
    /// Returns how many were removed; shared prefixes (no backend) stay. Locks one
    /// dashmap shard at a time.
    pub fn remove_backend(&self, backend: &str) -> usize {
        match self.backends.find(backend) {
            Some(index) => self.remove_where(|e| e.backend == index),
            None => 0,
        }
    }

    /// Remove expired entries; returns how many. Called by one sweeper task per table.
    ///
    /// Uses dashmap's `retain`, which write-locks one shard at a time (~size/shards
    /// entries, e.g. ~12k for 100k entries on 8 shards: tens of microseconds), so
    /// lookups on other shards never wait and those on the locked shard wait briefly.
    /// The FIFO is not walked instead because its order is insertion/second-chance
    /// order, not expiry order (source and session lifetimes differ, hits refresh
    /// entries in place), so it can't tell where the expired entries end. Also
    /// compacts the queue when removals left more than `size / 4` stale records.
    pub fn sweep(&self) -> usize {
        let now = self.now();
        let removed = self.remove_where(|e| e.idle(now) > self.ttl_of(e.kind));
        self.expired.fetch_add(removed as u64, Relaxed);
        self.clients.retain(|hash, _| self.map.contains_key(hash));
        let records: usize = (0..self.queues.len())
            .map(|q| self.lock_queue_at(q).len())
            .sum();
        let stale = records.saturating_sub(self.count.load(Relaxed));
        if stale > (self.params.size / SWEEP_COMPACT_DIVISOR).max(MIN_QUEUE_SLACK) {
            for q in 0..self.queues.len() {
                self.compact(&mut self.lock_queue_at(q));
            }
        }
        removed
    }

    /// Apply new idle lifetimes (a reload that keeps the table): every entry, old or
    /// new, is judged by them from now on, as if they had always been in force (an
    /// entry idle longer than a shortened lifetime expires at once).
    pub fn set_lifetimes(&self, expire: Duration, source_expire: Duration) {
        self.ttl.store(ttl_secs(expire), Relaxed);
        self.source_ttl.store(ttl_secs(source_expire), Relaxed);
    }

    /// Remove everything.
    ///
    /// Keeps the hash key, the counters and the backend names.
    pub fn clear(&self) {
        let mut queues = self.lock_queues();
        self.remove_where(|_| true);
        for queue in &mut queues {
            queue.clear();
        }
        self.clients.clear();
    }

    /// Keep the client prefix (`10.2.0.17/32`) of the source entry `hash`, for
    /// `table show`; while `size` are kept, a new one is not.
    pub fn note_client(&self, hash: u64, prefix: String) {
        if self.clients.len() < self.params.size || self.clients.contains_key(&hash) {
            self.clients.insert(hash, prefix.into_boxed_str());
        }
    }

    /// The client prefix kept for the source entry `hash`, if any.
    fn client_of(&self, hash: u64) -> Option<String> {
        self.clients.get(&hash).map(|c| c.to_string())
    }

    /// Counters for metrics.
    pub fn stats(&self) -> TableStats {
        TableStats {
            entries: self.count.load(Relaxed),
            capacity: self.params.size,
            expired: self.expired.load(Relaxed),
            evicted_protected: self.evicted_protected.load(Relaxed),
            evicted: self.evicted.load(Relaxed),
        }
    }

    /// Up to `limit` entries, most recently used first.
    ///
    /// Expired entries not yet swept are left out. Walks the whole table (one shard
    /// read lock at a time) keeping the `limit` most recent in a heap: for the admin
    /// API, not for the hot path. Entries used within the same second come in no
    /// particular order.
    pub fn entries(&self, limit: usize) -> Vec<EntryView> {
        if limit == 0 {
            return Vec::new();
        }
        let now = self.now();
        // (last_used, learned, hash, kind, backend, flags), min-heap on last_used.
        let mut heap = BinaryHeap::with_capacity(limit.min(self.params.size).saturating_add(1));
        for item in self.map.iter() {
            let e = item.value();
            let last_used = e.last_used.load(Relaxed);
            if e.idle(now) > self.ttl_of(e.kind) {
                continue;
            }
            let flags = e.flags.load(Relaxed);
            heap.push(Reverse((
                last_used,
                e.learned,
                *item.key(),
                e.kind,
                e.backend,
                flags,
            )));
            if heap.len() > limit {
                heap.pop();
            }
        }
        // Ascending order of Reverse = most recent first.
        let newest_first = heap.into_sorted_vec();
        newest_first
            .into_iter()
            .filter_map(
                |Reverse((last_used, learned, hash, kind, backend, flags))| {
                    let ttl = self.ttl_of(kind);
                    Some(EntryView {
                        kind: KeyKind::from_code(kind)?,
                        hash_hex: format!("{hash:016x}"),
                        backend: if flags & SHARED != 0 {
                            None
                        } else {
                            self.backends.name(backend)
                        },
                        age: secs(now.saturating_sub(learned)),
                        expires_in: secs(ttl.saturating_sub(now.saturating_sub(last_used))),
                        client: self.client_of(hash),
                    })
                },
            )
            .collect()
    }

    /// The unexpired entry whose key hash is `hash` (as `entries` shows it), if any.
    /// Does not refresh it.
    pub fn entry(&self, hash: u64) -> Option<EntryView> {
        let now = self.now();
        let e = self.map.get(&hash)?;
        if e.idle(now) > self.ttl_of(e.kind) {
            return None;
        }
        self.view(now, hash, &e)
    }

    /// Remove the entry whose key hash is `hash`; what it was, if it was there and
    /// unexpired. The client it held then lands wherever balancing puts it.
    pub fn remove(&self, hash: u64) -> Option<EntryView> {
        let now = self.now();
        let (_, e) = self.map.remove(&hash)?;
        self.count.fetch_sub(1, Relaxed);
        let client = self.clients.remove(&hash);
        if e.idle(now) > self.ttl_of(e.kind) {
            self.expired.fetch_add(1, Relaxed);
            return None;
        }
        let mut view = self.view(now, hash, &e)?;
        view.client = client.map(|(_, c)| c.to_string());
        Some(view)
    }

    /// An entry as the admin API shows it.
    fn view(&self, now: u32, hash: u64, e: &Entry) -> Option<EntryView> {
        let last_used = e.last_used.load(Relaxed);
        let ttl = self.ttl_of(e.kind);
        Some(EntryView {
            kind: KeyKind::from_code(e.kind)?,
            hash_hex: format!("{hash:016x}"),
            backend: if e.is_shared() {
                None
            } else {
                self.backends.name(e.backend)
            },
            age: secs(now.saturating_sub(e.learned)),
            expires_in: secs(ttl.saturating_sub(now.saturating_sub(last_used))),
            client: self.client_of(hash),
        })
    }

    /// Move the test clock forward (expiry tests without sleeping).
    #[cfg(test)]
    pub(crate) fn advance_clock(&self, by: Duration) {
        self.clock_offset
            .fetch_add(u32::try_from(by.as_secs()).unwrap_or(u32::MAX), Relaxed);
    }

    /// The coarse table clock, in seconds. In unit tests it moves only with
    /// `advance_clock`, so expiry tests are deterministic.
    pub(super) fn now(&self) -> u32 {
        let elapsed = if cfg!(test) {
            0
        } else {
            u32::try_from(self.epoch.elapsed().as_secs()).unwrap_or(u32::MAX)
        };
        CLOCK_START
            .saturating_add(elapsed)
            .saturating_add(self.clock_offset.load(Relaxed))
    }

    pub(super) fn ttl_of(&self, kind: u8) -> u32 {
        if kind == KeyKind::Source.code() {
            self.source_ttl.load(Relaxed)
        } else {
            self.ttl.load(Relaxed)
        }
    }

    /// The queue of the key whose hash is `hash`, locked.
    pub(super) fn lock_queue(&self, hash: u64) -> MutexGuard<'_, Fifo> {
        self.lock_queue_at(queue_of(hash, self.queues.len()))
    }

    pub(super) fn lock_queue_at(&self, q: usize) -> MutexGuard<'_, Fifo> {
        self.queues[q]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Every queue, locked in order (the only order two queue locks are waited for).
    pub(super) fn lock_queues(&self) -> Vec<MutexGuard<'_, Fifo>> {
        (0..self.queues.len())
            .map(|q| self.lock_queue_at(q))
            .collect()
    }

    /// Most records the queues may hold together before `learn` compacts them.
    pub(super) fn queue_limit(&self) -> usize {
        let slack = (self.params.size / QUEUE_SLACK_DIVISOR).max(MIN_QUEUE_SLACK);
        self.params.size.saturating_add(slack)
    }

    /// Most records one queue may hold before `learn` compacts it: its share of
    /// [`StickTable::queue_limit`].
    pub(super) fn queue_share(&self) -> usize {
        self.queue_limit().div_ceil(self.queues.len())
    }

    pub(super) fn upsert(&self, key: StickKey, backend: u16, how: Learn) {
        if self.params.size == 0 {
            return;
        }
        let now = self.now();
        if self.update_existing(key, backend, how, now) {
            return;
        }
        let mut queue = self.lock_queue(key.hash);
        // New keys are only inserted under their queue's lock: re-check, then it
        // can't appear.
        if self.update_existing(key, backend, how, now) {
            return;
        }
        if !self.take_place(&mut queue, now) {
            return;
        }
        let gen = queue.next_gen();
        let flags = if how == Learn::Hint {
            HINT_COUNT_ONE
        } else {
            0
        };
        let entry = Entry::new(key.kind.code(), backend, gen, now, now, flags);
        if self.map.insert(key.hash, entry).is_some() {
            self.count.fetch_sub(1, Relaxed);
        }
        let limit = self.queue_share();
        queue.push(QueueRecord::new(key.hash, gen), limit);
        if queue.len() >= limit {
            self.compact(&mut queue);
        }
    }

    /// Takes one of the `size` places for a new entry (`count` + 1), evicting first
    /// when the table is full: the oldest unreferenced entry of `queue` (the new key's),
    /// or, when that queue has nothing left, of another queue whose lock is free at
    /// that moment. False when nothing could be evicted: the key is then not learned
    /// (a full table whose other queues are all busy; the key's queue empty).
    fn take_place(&self, queue: &mut Fifo, now: u32) -> bool {
        let size = self.params.size;
        let mut count = self.count.load(Relaxed);
        loop {
            if count < size {
                match self
                    .count
                    .compare_exchange_weak(count, count + 1, Relaxed, Relaxed)
                {
                    Ok(_) => return true,
                    Err(now_count) => count = now_count,
                }
                continue;
            }
            let evicted = match self.evict_one(queue, now) {
                Eviction::Empty => self.evict_elsewhere(now),
                found => found,
            };
            match evicted {
                // The evicted entry's place passes to the new one: `count` stays, and
                // each queue keeps its number of entries, so no queue's share of the
                // table drifts while learners race.
                Eviction::Handed => return true,
                Eviction::Vanished => count = self.count.load(Relaxed),
                Eviction::Empty => return false,
            }
        }
    }

    /// Evicts from the first other queue that is not locked and has an entry.
    fn evict_elsewhere(&self, now: u32) -> Eviction {
        for q in &*self.queues {
            // try_lock: this thread holds its own queue, so it never waits for
            // another (two threads could wait for each other's).
            let mut other = match q.try_lock() {
                Ok(guard) => guard,
                Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => continue,
            };
            match self.evict_one(&mut other, now) {
                Eviction::Empty => continue,
                found => return found,
            }
        }
        Eviction::Empty
    }

    /// Updates the entry of `key` in place if there is one; false if there is none.
    pub(super) fn update_existing(
        &self,
        key: StickKey,
        backend: u16,
        how: Learn,
        now: u32,
    ) -> bool {
        let Some(mut e) = self.map.get_mut(&key.hash) else {
            return false;
        };
        let kind = key.kind.code();
        if e.idle(now) > self.ttl_of(e.kind) {
            // Expired but not yet removed: reuse the slot as a fresh entry. Its queue
            // record is old, so mark it referenced to give it a second chance.
            self.expired.fetch_add(1, Relaxed);
            let gen = e.gen;
            let hint = if how == Learn::Hint {
                HINT_COUNT_ONE
            } else {
                0
            };
            *e = Entry::new(kind, backend, gen, now, now, REFERENCED | hint);
            return true;
        }
        let same_kind = e.kind == kind;
        match how {
            Learn::Prefix if same_kind && !e.is_shared() && e.backend != backend => {
                e.backend = NO_BACKEND;
                e.flags.fetch_or(SHARED, Relaxed);
            }
            Learn::Prefix if same_kind => {}
            Learn::Hint if same_kind => {
                if e.count_hint() {
                    e.backend = NO_BACKEND;
                    e.flags.fetch_or(SHARED, Relaxed);
                } else if e.backend != backend {
                    e.backend = backend;
                    e.learned = now;
                }
            }
            _ if !same_kind || e.backend != backend || e.is_shared() => {
                e.kind = kind;
                e.backend = backend;
                e.learned = now;
                // A new backend: what a resumption proved no longer holds.
                e.flags
                    .fetch_and(!(SHARED | HINT_COUNT | PROTECTED), Relaxed);
                if how == Learn::Hint {
                    e.flags.fetch_or(HINT_COUNT_ONE, Relaxed);
                }
            }
            _ => {}
        }
        e.touch(now);
        true
    }

    /// Removes one entry to make room for the caller's new one: from probation
    /// first, from the protected segment only when probation has none.
    pub(super) fn evict_one(&self, queue: &mut Fifo, now: u32) -> Eviction {
        match self.evict_from(queue, Segment::Probation, now) {
            Eviction::Empty => self.evict_from(queue, Segment::Protected, now),
            found => found,
        }
    }

    /// Removes the oldest unreferenced entry of one segment of `queue` (CLOCK).
    /// In probation, a protected entry met at the front moves to the protected
    /// segment instead ([`StickTable::promote`]).
    fn evict_from(&self, queue: &mut Fifo, segment: Segment, now: u32) -> Eviction {
        let mut chances = 0;
        while let Some(record) = segment.of(queue).pop_front() {
            let hash = record.hash();
            // Decided under the shard's read guard, acted on after it is dropped.
            let (expired, protected) = match self.map.get(&hash) {
                Some(e) if e.gen == record.gen => {
                    let expired = e.idle(now) > self.ttl_of(e.kind);
                    let protected = e.is_protected();
                    if !expired && protected && segment == Segment::Probation {
                        drop(e);
                        self.promote(queue, record);
                        continue;
                    }
                    if !expired && chances < MAX_SECOND_CHANCES && e.take_referenced() {
                        chances += 1;
                        segment.of(queue).push_back(record);
                        continue;
                    }
                    (expired, protected)
                }
                _ => continue, // stale record: entry gone or re-inserted
            };
            if self
                .map
                .remove_if(&hash, |_, e| e.gen == record.gen)
                .is_none()
            {
                // A lookup or forget removed it meanwhile: that made room as well.
                return Eviction::Vanished;
            }
            if expired {
                self.expired.fetch_add(1, Relaxed);
            } else {
                self.evicted.fetch_add(1, Relaxed);
                if protected {
                    self.evicted_protected.fetch_add(1, Relaxed);
                }
            }
            return Eviction::Handed;
        }
        Eviction::Empty
    }

    /// Moves a protected entry's record to the protected segment; past the
    /// segment's share of the queue ([`PROTECTED_PERCENT`]) its oldest entries are
    /// demoted to probation (their flag cleared), stale records dropped.
    fn promote(&self, queue: &mut Fifo, record: QueueRecord) {
        queue.protected.push_back(record);
        let share = self.params.size.div_ceil(self.queues.len());
        let cap = (share * PROTECTED_PERCENT / 100).max(1);
        while queue.protected.len() > cap {
            let Some(old) = queue.protected.pop_front() else {
                break;
            };
            let live = match self.map.get(&old.hash()) {
                Some(e) if e.gen == old.gen => {
                    e.flags.fetch_and(!PROTECTED, Relaxed);
                    true
                }
                _ => false,
            };
            if live {
                queue.records.push_back(old);
            }
        }
    }

    /// Drops stale records (O(queue), shard read locks only) and trims spare capacity.
    pub(super) fn compact(&self, queue: &mut Fifo) {
        let live = |r: &QueueRecord| self.map.get(&r.hash()).is_some_and(|e| e.gen == r.gen);
        queue.records.retain(live);
        queue.protected.retain(live);
        queue.protected.shrink_to_fit();
        let keep = queue
            .records
            .len()
            .saturating_mul(2)
            .max(MIN_QUEUE_CAPACITY);
        if queue.records.capacity() > keep {
            queue.records.shrink_to(keep);
        }
    }

    /// Removes the entries matching `doomed`, one shard at a time; returns how many.
    pub(super) fn remove_where(&self, doomed: impl Fn(&Entry) -> bool) -> usize {
        let mut removed = 0;
        self.map.retain(|_, e| {
            let remove = doomed(e);
            removed += usize::from(remove);
            !remove
        });
        self.count.fetch_sub(removed, Relaxed);
        removed
    }
}

/// The two segments of a queue ([`Fifo`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Segment {
    /// Entries not proven by a resumption: evicted first.
    Probation,
    /// Entries a resumption proved.
    Protected,
}

impl Segment {
    fn of(self, queue: &mut Fifo) -> &mut VecDeque<QueueRecord> {
        match self {
            Segment::Probation => &mut queue.records,
            Segment::Protected => &mut queue.protected,
        }
    }
}

/// A lifetime in whole table-clock seconds: rounded up, clamped to `MAX_TTL_SECS`.
pub(super) fn ttl_secs(ttl: Duration) -> u32 {
    let secs = ttl
        .as_secs()
        .saturating_add(u64::from(ttl.subsec_nanos() > 0));
    u32::try_from(secs).unwrap_or(u32::MAX).min(MAX_TTL_SECS)
}

/// Queues of a table of `size` entries: one (an exact CLOCK order over the whole
/// table) below `2 * MIN_QUEUE_ENTRIES`, else one per `MIN_QUEUE_ENTRIES` entries,
/// at most [`QUEUES_PER_SHARD`] per thread shard, a power of two.
pub(super) fn queue_count(size: usize) -> usize {
    let n = (size / MIN_QUEUE_ENTRIES)
        .min(shard::count() * QUEUES_PER_SHARD)
        .max(1);
    1 << n.ilog2()
}

/// The queue of the key whose hash is `hash`, among `queues` (a power of two): by the
/// bucket hash, so no state file can pile its keys into one queue.
pub(super) fn queue_of(hash: u64, queues: usize) -> usize {
    (bucket_hash(hash) >> 32) as usize & (queues - 1)
}

pub(super) fn secs(s: u32) -> Duration {
    Duration::from_secs(u64::from(s))
}

#[cfg(test)]
mod tests {
    use super::super::state_file::*;
    use super::*;
    use rstest::rstest;
    use std::sync::Arc;
    use std::{fs, io};

    const EXPIRE: Duration = Duration::from_secs(60);
    const SOURCE_EXPIRE: Duration = Duration::from_secs(10);

    /// The backends configured while a test loads a file.
    const BACKENDS: &[&str] = &["b1", "compile1", "compile2"];

    fn table(size: usize) -> StickTable {
        StickTable::new(TableParams {
            size,
            expire: EXPIRE,
            source_expire: SOURCE_EXPIRE,
        })
    }

    fn sid(t: &StickTable, i: u32) -> StickKey {
        t.key(KeyKind::SessionId, &i.to_be_bytes())
    }

    /// The stats of a table of 16 holding one entry, nothing expired or evicted.
    const ONE_ENTRY_OF_16: TableStats = TableStats {
        entries: 1,
        capacity: 16,
        expired: 0,
        evicted: 0,
        evicted_protected: 0,
    };

    /// `t` with the session IDs `ids` learned on `backend`, in order.
    fn learned(t: StickTable, ids: std::ops::Range<u32>, backend: &str) -> StickTable {
        for i in ids {
            t.learn(sid(&t, i), backend);
        }
        t
    }

    /// The backend name of an entry, cloned.
    fn lookup_name(t: &StickTable, key: &StickKey) -> Option<Arc<str>> {
        t.lookup_with(key, |b| Arc::<str>::from(b))
    }

    fn hit(t: &StickTable, key: &StickKey) -> Option<String> {
        lookup_name(t, key).map(|b| b.to_string())
    }

    fn queue_len(t: &StickTable) -> usize {
        t.lock_queues().iter().map(|q| q.len()).sum()
    }

    #[test]
    fn one_entry_is_found_and_removed_by_its_hash() {
        let t = learned(table(16), 0..3, "b1");
        let key = sid(&t, 1);
        let shown = t.entry(key.hash).expect("entry 1");
        assert_eq!(shown.hash_hex, format!("{:016x}", key.hash));
        assert_eq!(
            (shown.kind, shown.backend.as_deref()),
            (KeyKind::SessionId, Some("b1"))
        );
        assert!(t.entries(16).contains(&shown));
        assert_eq!(t.remove(key.hash), Some(shown));
        assert_eq!((t.entry(key.hash), t.remove(key.hash)), (None, None));
        assert_eq!(hit(&t, &key), None);
        assert_eq!(t.stats().entries, 2);
        assert_eq!(hit(&t, &sid(&t, 2)), Some("b1".into()));
        // An expired entry is not shown; removing it counts it as expired.
        t.advance_clock(EXPIRE + Duration::from_secs(2));
        let k0 = sid(&t, 0);
        assert_eq!((t.entry(k0.hash), t.remove(k0.hash)), (None, None));
        assert_eq!((t.stats().entries, t.stats().expired), (1, 1));
    }

    #[rstest]
    #[case(KeyKind::SessionId)]
    #[case(KeyKind::Ticket)]
    #[case(KeyKind::TicketPrefix)]
    #[case(KeyKind::Psk)]
    #[case(KeyKind::Source)]
    fn learn_then_lookup_each_kind(#[case] kind: KeyKind) {
        let t = table(16);
        let key = t.key(kind, b"raw key bytes");
        assert_eq!(key, t.key(kind, b"raw key bytes"), "keys are stable");
        assert_eq!(hit(&t, &key), None);
        t.learn(key, "b1");
        assert_eq!(hit(&t, &key), Some("b1".into()));
        // Same bytes under another kind is another key.
        let other = if kind == KeyKind::Psk {
            KeyKind::Ticket
        } else {
            KeyKind::Psk
        };
        assert_ne!(t.key(other, b"raw key bytes").hash, key.hash);
        assert_eq!(
            hit(
                &t,
                &StickKey {
                    kind: other,
                    hash: key.hash
                }
            ),
            None,
            "kind must match"
        );
        assert_eq!(t.stats(), ONE_ENTRY_OF_16);
    }

    #[test]
    fn tables_have_their_own_hash_keys() {
        let (a, b) = (table(1), table(1));
        assert_ne!(
            a.key(KeyKind::Psk, b"x").hash,
            b.key(KeyKind::Psk, b"x").hash
        );
    }

    #[test]
    fn overwrite_moves_the_entry() {
        let t = table(16);
        let key = sid(&t, 1);
        t.learn(key, "b1");
        t.advance_clock(Duration::from_secs(5));
        t.learn(key, "b2");
        assert_eq!(hit(&t, &key), Some("b2".into()));
        assert_eq!(t.stats().entries, 1);
        assert_eq!(queue_len(&t), 1, "an overwrite keeps the one queue record");
        assert_eq!(
            t.entries(10)[0].age,
            Duration::ZERO,
            "moving resets the age"
        );
    }

    #[test]
    fn entries_expire_after_idle_expire() {
        let t = table(16);
        let key = sid(&t, 1);
        t.learn(key, "b1");
        t.advance_clock(EXPIRE);
        assert_eq!(
            hit(&t, &key),
            Some("b1".into()),
            "exactly `expire` idle: still valid"
        );
        t.advance_clock(EXPIRE);
        assert_eq!(
            hit(&t, &key),
            Some("b1".into()),
            "the hit above refreshed it"
        );
        t.advance_clock(EXPIRE + Duration::from_secs(1));
        assert_eq!(hit(&t, &key), None);
        assert_eq!(t.stats().expired, 1);
        assert_eq!(t.stats().entries, 0, "an expired lookup removes the entry");
    }

    #[test]
    fn source_entries_use_source_expire() {
        let t = table(16);
        let source = t.key(KeyKind::Source, &[10, 0, 0, 0]);
        let session = sid(&t, 1);
        t.learn(source, "b1");
        t.learn(session, "b2");
        t.advance_clock(SOURCE_EXPIRE + Duration::from_secs(1));
        assert_eq!(hit(&t, &source), None);
        assert_eq!(hit(&t, &session), Some("b2".into()));
    }

    #[test]
    fn learning_an_expired_key_starts_it_afresh() {
        let t = table(16);
        let key = sid(&t, 1);
        t.learn(key, "b1");
        t.advance_clock(EXPIRE * 2);
        t.learn(key, "b1");
        assert_eq!(t.entries(1)[0].age, Duration::ZERO);
        assert_eq!(t.stats().expired, 1);
        assert_eq!(hit(&t, &key), Some("b1".into()));
    }

    #[test]
    fn sweep_removes_only_expired_entries() {
        let t = learned(table(100), 0..10, "b1");
        t.learn(t.key(KeyKind::Source, b"s"), "b1");
        t.advance_clock(SOURCE_EXPIRE + Duration::from_secs(1));
        assert_eq!(t.sweep(), 1);
        t.advance_clock(EXPIRE);
        assert_eq!(t.sweep(), 10);
        assert_eq!(t.stats().entries, 0);
        assert_eq!(t.stats().expired, 11);
    }

    #[test]
    fn lru_keeps_recently_used_entries() {
        let t = learned(table(64), 0..64, "b1");
        t.advance_clock(Duration::from_secs(1));
        let touched: Vec<u32> = (0..32).step_by(4).collect();
        for &i in &touched {
            assert!(lookup_name(&t, &sid(&t, i)).is_some());
        }
        for i in 64..96 {
            t.learn(sid(&t, i), "b2");
        }
        assert_eq!(t.stats().entries, 64);
        assert_eq!(t.stats().evicted, 32);
        for &i in &touched {
            assert_eq!(
                hit(&t, &sid(&t, i)),
                Some("b1".into()),
                "touched entry {i} was evicted"
            );
        }
        for i in (0..40).filter(|i| !touched.contains(i)) {
            assert_eq!(
                hit(&t, &sid(&t, i)),
                None,
                "untouched old entry {i} survived"
            );
        }
        for i in 40..96 {
            assert!(
                lookup_name(&t, &sid(&t, i)).is_some(),
                "recent entry {i} was evicted"
            );
        }
    }

    #[test]
    fn proven_entries_outlive_a_flood_of_unproven_ones() {
        let t = table(100);
        for i in 0..20 {
            t.learn(sid(&t, i), "home");
            t.protect(&sid(&t, i));
        }
        // Ten times the table of new, unproven keys (as a flood would teach).
        for i in 1000..2000 {
            t.learn(sid(&t, i), "flood");
        }
        for i in 0..20 {
            assert_eq!(hit(&t, &sid(&t, i)).as_deref(), Some("home"), "{i}");
        }
        let s = t.stats();
        assert_eq!(s.entries, 100);
        assert_eq!((s.evicted, s.evicted_protected), (920, 0));
    }

    #[test]
    fn the_protected_segment_keeps_room_for_new_entries() {
        let t = table(100);
        // Every entry proven: the protected share (80 %) demotes the oldest 20.
        for i in 0..100 {
            t.learn(sid(&t, i), "b");
            t.protect(&sid(&t, i));
        }
        for i in 1000..1200 {
            t.learn(sid(&t, i), "new");
        }
        let left = (0..100).filter(|&i| hit(&t, &sid(&t, i)).is_some()).count();
        assert_eq!(left, 80, "the protected share survives");
        assert!(hit(&t, &sid(&t, 1199)).is_some(), "new keys are learned");
        let s = t.stats();
        assert_eq!(s.evicted_protected, 0, "demoted entries are probation's");
    }

    #[test]
    fn a_full_table_of_used_entries_still_takes_new_ones() {
        let t = learned(table(32), 0..32, "b1");
        for i in 0..32 {
            assert!(lookup_name(&t, &sid(&t, i)).is_some());
        }
        t.learn(sid(&t, 100), "b1");
        assert_eq!(t.stats().entries, 32);
        assert_eq!(t.stats().evicted, 1);
        assert!(lookup_name(&t, &sid(&t, 100)).is_some());
    }

    /// Run `write(0)` and `write(1)` on two threads while a third checks, until
    /// both end, that the table never holds more than `size` entries.
    fn two_writers_never_past(t: &StickTable, size: usize, write: impl Fn(u32) + Sync) {
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            let write = &write;
            let writers: Vec<_> = (0..2u32).map(|w| s.spawn(move || write(w))).collect();
            s.spawn(|| {
                while !done.load(Relaxed) {
                    assert!(t.stats().entries <= size);
                    std::thread::yield_now();
                }
            });
            for w in writers {
                w.join().unwrap();
            }
            done.store(true, Relaxed);
        });
    }

    #[test]
    fn size_is_never_exceeded_under_two_threads() {
        const SIZE: usize = 1000;
        const PER_THREAD: u32 = 200_000;
        let t = table(SIZE);
        two_writers_never_past(&t, SIZE, |w| {
            for i in 0..PER_THREAD {
                let key = t.key(
                    KeyKind::Ticket,
                    &[w.to_be_bytes(), i.to_be_bytes()].concat(),
                );
                t.learn(key, if w == 0 { "b1" } else { "b2" });
                if i % 3 == 0 {
                    lookup_name(&t, &key);
                }
            }
        });
        assert_eq!(t.map.len(), SIZE);
        assert_eq!(t.stats().entries, SIZE);
        assert_eq!(t.stats().evicted, u64::from(2 * PER_THREAD) - SIZE as u64);
        assert!(queue_len(&t) <= t.queue_limit());
    }

    /// A table large enough for several queues: two threads learning new keys never
    /// push it past `size`; and it evicts about the oldest (each queue its own
    /// oldest): of 2 x size keys learned in order, nearly all of the newest size stay
    /// (each queue keeps as many entries as it had when the table filled up, so only
    /// the difference between the queues' shares of the two halves strays: ~0.6 %).
    #[test]
    fn sharded_queues_keep_the_size_and_evict_about_the_oldest() {
        const SIZE: usize = 1 << 16;
        let t = table(SIZE);
        assert!(t.queues.len() > 1, "{} queues", t.queues.len());
        two_writers_never_past(&t, SIZE, |w| {
            for i in (w..2 * SIZE as u32).step_by(2) {
                t.learn(sid(&t, i), "b1");
            }
        });
        assert_eq!((t.map.len(), t.stats().entries), (SIZE, SIZE));
        assert_eq!(t.stats().evicted, SIZE as u64);
        assert!(queue_len(&t) <= t.queue_limit());

        let t = learned(table(SIZE), 0..2 * SIZE as u32, "b1");
        let newest_kept = (SIZE as u32..2 * SIZE as u32)
            .filter(|&i| t.entry(sid(&t, i).hash).is_some())
            .count();
        assert!(
            newest_kept >= SIZE * 98 / 100,
            "{newest_kept} of the newest {SIZE} kept"
        );
    }

    /// A new key whose queue is empty, in a full table, takes the place of another
    /// queue's oldest entry.
    #[test]
    fn a_key_of_an_empty_queue_evicts_from_another() {
        let size = 2 * MIN_QUEUE_ENTRIES;
        let t = table(size);
        let queues = t.queues.len();
        assert!(queues > 1, "{queues} queues");
        let t = &t;
        let of_queue = |q: usize| (0u32..).filter(move |&i| queue_of(sid(t, i).hash, queues) == q);
        let first: Vec<u32> = of_queue(0).take(size).collect();
        for &i in &first {
            t.learn(sid(t, i), "b1");
        }
        assert_eq!(t.stats().entries, size);
        let newcomer = of_queue(1).next().unwrap();
        t.learn(sid(t, newcomer), "b2");
        assert_eq!(hit(t, &sid(t, newcomer)).as_deref(), Some("b2"));
        assert_eq!((t.stats().entries, t.stats().evicted), (size, 1));
        assert_eq!(hit(t, &sid(t, first[0])), None, "queue 0's oldest went");
        assert_eq!(hit(t, &sid(t, first[1])).as_deref(), Some("b1"));
    }

    #[test]
    fn stale_records_do_not_grow_the_queue() {
        let t = table(100);
        for i in 0..10_000 {
            let key = sid(&t, i);
            t.learn(key, "b1");
            t.forget(&key);
        }
        assert_eq!(t.stats().entries, 0);
        assert!(
            queue_len(&t) <= t.queue_limit(),
            "queue grew to {}",
            queue_len(&t)
        );
        // Sweep compacts as well.
        for i in 0..100 {
            let key = sid(&t, i);
            t.learn(key, "b1");
            t.forget(&key);
        }
        t.sweep();
        assert!(queue_len(&t) <= 100);
    }

    /// The soak's plateau (docs/performance.md, "Memory under load"): a full table
    /// that keeps learning new keys grows its map once (hashbrown replaces a shard
    /// whose free slots ran out to tombstones of evicted keys with one twice the
    /// size), then reuses it. A shard of n entries then has at most
    /// 2 x next_power_of_two(8/7 x n) slots, 7/8 of them usable: under 4 n, so the
    /// map's capacity stays under 4 x size however long the churn goes on (a leak of
    /// evicted keys passes it within the first rounds).
    #[test]
    fn a_churning_full_table_stops_growing() {
        const SIZE: usize = 1000;
        let t = table(SIZE);
        let mut next = 0u32;
        for _ in 0..200 {
            for _ in 0..SIZE {
                next += 1;
                t.learn(t.key(KeyKind::Ticket, &next.to_le_bytes()), "b1");
            }
            assert_eq!(t.stats().entries, SIZE);
            let capacity = t.map.capacity();
            assert!(
                capacity < 4 * SIZE,
                "map capacity {capacity} after {next} keys"
            );
            assert!(t
                .lock_queues()
                .iter()
                .all(|q| q.records.capacity() <= t.queue_share()));
        }
    }

    #[test]
    fn source_hint_of_an_address_with_three_full_handshakes_is_shared() {
        let t = table(16);
        let source = t.key(KeyKind::Source, &[127, 0, 0, 1]);
        t.learn_hint(source, "b1");
        assert_eq!(hit(&t, &source), Some("b1".into()));
        t.learn_hint(source, "b2");
        assert_eq!(hit(&t, &source), Some("b2".into()), "the last one, twice");
        t.learn_hint(source, "b2");
        assert_eq!(hit(&t, &source), None, "three: many clients behind it");
        t.learn_hint(source, "b1");
        assert_eq!(hit(&t, &source), None, "stays shared");
        assert_eq!(t.stats().entries, 1);
        // Another address's hint is its own.
        let other = t.key(KeyKind::Source, &[127, 0, 0, 2]);
        t.learn_hint(other, "b3");
        assert_eq!(hit(&t, &other), Some("b3".into()));
        // An ordinary entry learned over a shared hint routes again, counting afresh.
        t.learn(source, "b1");
        assert_eq!(hit(&t, &source), Some("b1".into()));
        t.learn_hint(source, "b1");
        assert_eq!(hit(&t, &source), Some("b1".into()));
    }

    #[test]
    fn prefix_seen_on_two_backends_is_shared() {
        let t = table(16);
        let prefix = t.key(KeyKind::TicketPrefix, &[7; 16]);
        t.learn_prefix(prefix, "b1");
        assert_eq!(hit(&t, &prefix), Some("b1".into()));
        t.learn_prefix(prefix, "b1");
        assert_eq!(hit(&t, &prefix), Some("b1".into()));
        t.learn_prefix(prefix, "b2");
        assert_eq!(hit(&t, &prefix), None);
        t.learn_prefix(prefix, "b1");
        assert_eq!(hit(&t, &prefix), None, "stays shared");
        let view = &t.entries(10)[0];
        assert_eq!(
            (view.kind, view.backend.clone()),
            (KeyKind::TicketPrefix, None)
        );
        assert_eq!(t.stats(), ONE_ENTRY_OF_16);
        // After it expires, the prefix is learned afresh.
        t.advance_clock(EXPIRE * 2);
        t.learn_prefix(prefix, "b2");
        assert_eq!(hit(&t, &prefix), Some("b2".into()));
    }

    #[test]
    fn remove_backend_drops_its_entries_only() {
        let t = learned(table(16), 0..4, "b1");
        t.learn(sid(&t, 10), "b2");
        let prefix = t.key(KeyKind::TicketPrefix, b"p");
        t.learn_prefix(prefix, "b1");
        t.learn_prefix(prefix, "b2");
        assert_eq!(t.remove_backend("b1"), 4);
        assert_eq!(t.remove_backend("nope"), 0);
        assert_eq!(hit(&t, &sid(&t, 0)), None);
        assert_eq!(hit(&t, &sid(&t, 10)), Some("b2".into()));
        assert_eq!(
            t.stats().entries,
            2,
            "b2's entry and the shared prefix stay"
        );
    }

    #[test]
    fn forget_and_clear() {
        let t = learned(table(16), 0..4, "b1");
        t.forget(&sid(&t, 0));
        t.forget(&StickKey {
            kind: KeyKind::Psk,
            hash: sid(&t, 1).hash,
        });
        assert_eq!(hit(&t, &sid(&t, 0)), None);
        assert_eq!(t.stats().entries, 3, "forget needs the right kind");
        t.clear();
        assert_eq!(t.stats().entries, 0);
        assert_eq!(queue_len(&t), 0);
        assert_eq!(hit(&t, &sid(&t, 1)), None);
        t.learn(sid(&t, 1), "b1");
        assert_eq!(hit(&t, &sid(&t, 1)), Some("b1".into()));
    }

    #[test]
    fn entries_are_most_recently_used_first() {
        let t = table(16);
        for i in 0..5 {
            t.learn(sid(&t, i), &format!("b{i}"));
            t.advance_clock(Duration::from_secs(10));
        }
        assert!(lookup_name(&t, &sid(&t, 1)).is_some());
        let names: Vec<String> = t
            .entries(3)
            .iter()
            .map(|v| v.backend.as_deref().unwrap_or("-").to_owned())
            .collect();
        assert_eq!(names, ["b1", "b4", "b3"]);
        let all = t.entries(100);
        assert_eq!(all.len(), 5);
        let b0 = &all[4];
        assert_eq!(b0.age, Duration::from_secs(50));
        assert_eq!(b0.expires_in, Duration::from_secs(10));
        assert_eq!(b0.hash_hex, format!("{:016x}", sid(&t, 0).hash));
        assert!(t.entries(0).is_empty());
    }

    #[test]
    fn save_and_load_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("puppet.table");
        let a = table(100);
        a.learn(a.key(KeyKind::SessionId, b"s1"), "compile1");
        a.advance_clock(Duration::from_secs(20));
        a.learn(a.key(KeyKind::Psk, b"p1"), "compile2");
        a.learn(a.key(KeyKind::Source, b"10.0.0.0"), "compile2");
        let prefix = a.key(KeyKind::TicketPrefix, b"pfx");
        a.learn_prefix(prefix, "compile1");
        a.learn_prefix(prefix, "compile2");
        a.advance_clock(Duration::from_secs(5));
        assert_eq!(a.save(&path).unwrap(), 4);
        let files: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(files, ["puppet.table"], "no temporary file left");

        let b = table(100);
        b.learn(b.key(KeyKind::SessionId, b"gone"), "other"); // replaced by load
        b.learn(b.key(KeyKind::SessionId, b"gone2"), "compile2"); // interned at another index
        assert_eq!(b.load(&path, BACKENDS).unwrap(), 4);
        assert_eq!(b.stats().entries, 4);
        assert_eq!(hit(&b, &b.key(KeyKind::SessionId, b"gone")), None);
        let mut views = b.entries(10);
        views.sort_by_key(|v| v.hash_hex.clone());
        let mut expected = a.entries(10);
        expected.sort_by_key(|v| v.hash_hex.clone());
        assert_eq!(
            views, expected,
            "kinds, backends by name, ages and remaining lifetimes"
        );
        let s1 = views.iter().find(|v| v.kind == KeyKind::SessionId).unwrap();
        assert_eq!(
            (s1.age, s1.expires_in),
            (Duration::from_secs(25), Duration::from_secs(35))
        );
        assert_eq!(s1.backend.as_deref(), Some("compile1"));
        assert_eq!(
            hit(&b, &b.key(KeyKind::Psk, b"p1")),
            Some("compile2".into())
        );
        assert_eq!(
            hit(&b, &b.key(KeyKind::TicketPrefix, b"pfx")),
            None,
            "still shared"
        );
        // Remaining lifetime is kept: the session entry (idle 25 s) expires 35 s later.
        b.advance_clock(Duration::from_secs(36));
        assert_eq!(hit(&b, &b.key(KeyKind::SessionId, b"s1")), None);
        assert_eq!(
            hit(&b, &b.key(KeyKind::Psk, b"p1")),
            Some("compile2".into())
        );
    }

    #[test]
    fn load_keeps_the_most_recent_entries_that_fit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t");
        let a = table(100);
        for i in 0..10 {
            a.learn(sid(&a, i), "b1");
            a.advance_clock(Duration::from_secs(1));
        }
        a.save(&path).unwrap();
        let b = table(4);
        assert_eq!(b.load(&path, BACKENDS).unwrap(), 4);
        for i in 0..10 {
            assert_eq!(lookup_name(&b, &sid(&b, i)).is_some(), i >= 6, "entry {i}");
        }
    }

    #[test]
    fn load_rejects_bad_files_and_leaves_the_table_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t");
        let a = learned(table(100), 0..10, "b1");
        a.save(&path).unwrap();
        let good = fs::read(&path).unwrap();

        let mut other_version = good.clone();
        other_version[8..12].copy_from_slice(&2u32.to_le_bytes());
        let mut flipped = good.clone();
        flipped[60] ^= 0x40;
        let mut bad_magic = good.clone();
        bad_magic[0] = b'Y';
        let mut cases: Vec<(&str, Vec<u8>)> = vec![
            ("empty", Vec::new()),
            ("other version", other_version),
            ("flipped byte", flipped),
            ("bad magic", bad_magic),
            ("trailing garbage", [good.as_slice(), b"x"].concat()),
        ];
        for len in [4, 12, 20, 40, good.len() / 2, good.len() - 1] {
            cases.push(("truncated", good[..len].to_vec()));
        }

        let b = table(100);
        let key = sid(&b, 1);
        b.learn(key, "mine");
        for (what, bytes) in cases {
            fs::write(&path, &bytes).unwrap();
            let err = b.load(&path, BACKENDS).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{what}: {err}");
            assert!(
                err.get_ref().is_some_and(|e| e.is::<StateFileError>()),
                "{what}"
            );
            assert_eq!(hit(&b, &key), Some("mine".into()), "{what}: table changed");
            assert_eq!(
                b.key(KeyKind::SessionId, &1u32.to_be_bytes()),
                key,
                "{what}: key changed"
            );
            assert_eq!(b.stats().entries, 1);
        }
        let missing = b.load(&dir.path().join("missing"), BACKENDS).unwrap_err();
        assert_eq!(missing.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn save_replaces_an_existing_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t");
        let t = table(10);
        t.learn(sid(&t, 1), "b1");
        t.save(&path).unwrap();
        t.clear();
        assert_eq!(t.save(&path).unwrap(), 0);
        assert_eq!(t.load(&path, BACKENDS).unwrap(), 0);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(
                fs::metadata(&path).unwrap().permissions().mode() & 0o777,
                0o600
            );
        }
    }

    #[test]
    fn entry_layout_is_small() {
        assert_eq!(std::mem::size_of::<Entry>(), 16);
        assert_eq!(std::mem::size_of::<(u64, Entry)>(), 24);
        assert_eq!(std::mem::size_of::<QueueRecord>(), 12);
    }

    /// Prints lookups per second; no assertion on speed (debug builds are slow).
    #[test]
    fn lookup_throughput_sanity() {
        const KEYS: u32 = 10_000;
        const LOOKUPS: u32 = 200_000;
        let t = table(KEYS as usize);
        let keys: Vec<StickKey> = (0..KEYS).map(|i| sid(&t, i)).collect();
        for (i, key) in keys.iter().enumerate() {
            t.learn(*key, if i % 2 == 0 { "b1" } else { "b2" });
        }
        for threads in [1, 2] {
            let start = Instant::now();
            std::thread::scope(|s| {
                for _ in 0..threads {
                    s.spawn(|| {
                        for i in 0..LOOKUPS {
                            assert!(lookup_name(&t, &keys[(i % KEYS) as usize]).is_some());
                        }
                    });
                }
            });
            let rate = f64::from(LOOKUPS * threads) / start.elapsed().as_secs_f64();
            println!(
                "stick lookup: {threads} thread(s): {:.2} M lookups/s",
                rate / 1e6
            );
        }
    }

    fn rss_bytes() -> usize {
        let statm = fs::read_to_string("/proc/self/statm").unwrap();
        let pages: usize = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
        pages * 4096 // page size; x86_64 and most aarch64 Linux
    }

    /// Inserts 1M entries and prints the RSS growth per entry (~2 s in a debug build).
    /// Other tests running alongside blur the figure; for a clean one run it alone:
    /// `cargo test --lib stick::tests::memory_per_entry -- --nocapture`
    #[test]
    #[cfg(target_os = "linux")]
    fn memory_per_entry() {
        const N: u32 = 1_000_000;
        let before = rss_bytes();
        let t = table(N as usize);
        for i in 0..N {
            t.learn(
                t.key(KeyKind::Psk, &i.to_le_bytes()),
                if i % 2 == 0 { "b1" } else { "b2" },
            );
        }
        let per_entry = rss_bytes().saturating_sub(before) as f64 / f64::from(N);
        println!("stick table: {per_entry:.1} bytes/entry (RSS) for {N} entries");
        assert_eq!(t.stats().entries, N as usize);
        assert!(per_entry < 200.0, "{per_entry} bytes per entry");
    }

    // Hostile state files and concurrent saves (issue #16).

    /// A saved table file of `entries` (backend index `backend` of `names`).
    fn crafted_file(path: &std::path::Path, names: &[Arc<str>], hashes: &[u64], backend: u16) {
        let entries: Vec<SavedEntry> = hashes
            .iter()
            .map(|&hash| SavedEntry {
                hash,
                kind: KeyKind::SessionId.code(),
                flags: 0,
                backend,
                age: 1,
                idle: 1,
            })
            .collect();
        fs::write(path, encode_state((1, 2), names, &entries)).unwrap();
    }

    #[test]
    fn saves_never_open_a_planted_file_or_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t");
        let victim = dir.path().join("victim");
        fs::write(&victim, b"precious").unwrap();
        let planted = dir.path().join("t.tmp");
        std::os::unix::fs::symlink(&victim, &planted).unwrap();
        let t = table(10);
        t.learn(sid(&t, 1), "b1");
        t.save(&path).unwrap();
        assert_eq!(
            fs::read(&victim).unwrap(),
            b"precious",
            "the save wrote through a symlink"
        );
        assert!(!fs::symlink_metadata(&path)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(table(10).load(&path, BACKENDS).unwrap(), 1);
        assert!(create_private(&planted).is_err(), "opened an existing path");
        assert_eq!(fs::read(&victim).unwrap(), b"precious");
    }

    #[test]
    fn concurrent_saves_to_one_path_all_land_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t");
        let t = Arc::new(table(20_000));
        for i in 0..20_000 {
            t.learn(sid(&t, i), "b1");
        }
        let savers: Vec<_> = (0..4)
            .map(|_| {
                let (t, path) = (t.clone(), path.clone());
                std::thread::spawn(move || {
                    (0..10).map(|_| t.save(&path).map(drop)).collect::<Vec<_>>()
                })
            })
            .collect();
        for s in savers {
            for r in s.join().unwrap() {
                r.expect("every save succeeds");
            }
        }
        assert_eq!(table(20_000).load(&path, BACKENDS).unwrap(), 20_000);
        let left: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, ["t"], "temporary files left behind");
    }

    /// A save killed before its rename leaves `<path>.<random>.tmp`: loading the table
    /// (at start) removes it, and nothing else: not a save in progress (it holds its
    /// temp file's lock, as one in another process would), not a link named like a
    /// temp file (nor what it points to), not a FIFO, not another user's file, not
    /// another name. Once the save holding a file is gone, that file is stale too.
    #[test]
    fn load_removes_the_temporary_files_of_crashed_saves_only() {
        use nix::fcntl::{Flock, FlockArg};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t");
        let t = table(10);
        t.learn(sid(&t, 1), "b1");
        t.save(&path).unwrap();
        let crashed = tmp_path(&path);
        fs::write(&crashed, b"half a table").unwrap();
        let busy = tmp_path(&path);
        let held = Flock::lock(create_private(&busy).unwrap(), FlockArg::LockExclusive).unwrap();
        let victim = dir.path().join("victim");
        fs::write(&victim, b"precious").unwrap();
        let link = tmp_path(&path);
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        let fifo = tmp_path(&path);
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let foreign = tmp_path(&path);
        fs::write(&foreign, b"someone else's").unwrap();
        std::os::unix::fs::chown(&foreign, Some(nix::unistd::geteuid().as_raw() + 1), None)
            .expect("chown to another user (the tests run as root)");
        let other = dir.path().join("t.backup.tmp");
        fs::write(&other, b"not ours").unwrap();

        assert_eq!(table(10).load(&path, BACKENDS).unwrap(), 1);
        assert!(!crashed.exists(), "the crashed save's file is still there");
        for kept in [&busy, &link, &fifo, &foreign, &other, &victim] {
            assert!(fs::symlink_metadata(kept).is_ok(), "{kept:?} was removed");
        }
        assert_eq!(fs::read(&victim).unwrap(), b"precious");
        drop(held);
        table(10).load(&path, BACKENDS).unwrap();
        assert!(!busy.exists(), "a file no save holds any more is stale");
        assert!(fs::symlink_metadata(&link).is_ok() && other.exists());
    }

    #[test]
    fn names_a_file_lists_do_not_fill_the_name_list() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t");
        let mut names: Vec<Arc<str>> = (0..5000).map(|i| Arc::from(format!("x{i}"))).collect();
        names.push(Arc::from("b1"));
        let unknown: Vec<u64> = (0..5000u64)
            .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .collect();
        crafted_file(&path, &names, &unknown, 17);
        let t = table(10_000);
        assert_eq!(
            t.load(&path, BACKENDS).unwrap(),
            0,
            "entries of backends not configured"
        );
        assert!(
            t.backends.names.load().len() <= 1,
            "names learned from the file"
        );
        // Duplicate hashes count once and don't grow the queue past its limit.
        crafted_file(&path, &names, &[7; 3000], 5000);
        assert_eq!(t.load(&path, BACKENDS).unwrap(), 1);
        assert_eq!(t.stats().entries, 1);
        assert!(queue_len(&t) <= t.queue_limit());
    }

    #[test]
    fn oversized_files_are_refused_unread() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t");
        let hashes: Vec<u64> = (0..100_000u64).collect();
        crafted_file(&path, &[Arc::from("b1")], &hashes, 0);
        let err = table(10).load(&path, BACKENDS).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(err.to_string().contains("more than the"), "{err}");
        assert_eq!(
            table(100_000).load(&path, BACKENDS).unwrap(),
            100_000,
            "a table of its size takes it"
        );
    }

    /// Hashes that share their low 40 bits would all probe one bucket sequence of a
    /// map that used them as they are: loading them must cost about what loading
    /// random ones costs (best of three each, same run; a ratio, not a time).
    #[test]
    fn colliding_hashes_load_like_random_ones() {
        const N: u64 = 300_000;
        let dir = tempfile::tempdir().unwrap();
        let names = [Arc::from("b1")];
        let best = |hashes: &[u64]| {
            let path = dir.path().join("t");
            crafted_file(&path, &names, hashes, 0);
            (0..3)
                .map(|_| {
                    let t = table(N as usize);
                    let started = std::time::Instant::now();
                    assert_eq!(t.load(&path, BACKENDS).unwrap(), N as usize);
                    started.elapsed()
                })
                .min()
                .unwrap()
        };
        let random: Vec<u64> = (0..N).map(|_| fastrand::u64(..)).collect();
        let colliding: Vec<u64> = (0..N).map(|i| (i + 1) << 40).collect();
        let (r, c) = (best(&random), best(&colliding));
        println!("load of {N} entries: random hashes {r:?}, colliding {c:?}");
        assert!(c < r * 4, "colliding hashes took {c:?}, random ones {r:?}");
    }
}
