//! One table entry (16 bytes) and the CLOCK queue that ages entries out, with the
//! seeded pass-through hasher and the backend-name interner the table is built from.
use std::collections::VecDeque;
use std::hash::Hasher;
use std::sync::atomic::{AtomicU32, AtomicU8, Ordering::Relaxed};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use arc_swap::ArcSwap;

/// Referenced entries one insert re-queues before it evicts the next one anyway: bounds
/// the work of an insert into a full table whose oldest entries are all in use.
pub(super) const MAX_SECOND_CHANCES: usize = 8;
/// Stale records (of entries forgotten, expired or removed) the queue may hold on top of
/// `size` before `learn` compacts it: `size / 2`, so a compaction (O(queue)) happens at
/// most once per `size / 2` removals and the queue stays under 1.5 × `size` records.
pub(super) const QUEUE_SLACK_DIVISOR: usize = 2;
/// Stale records above which `sweep` compacts the queue (`size / 4`): the sweeper task
/// does the O(queue) pass in the background, normally before `learn` has to.
pub(super) const SWEEP_COMPACT_DIVISOR: usize = 4;
/// Smallest stale-record slack, so tiny tables don't compact on every insert.
pub(super) const MIN_QUEUE_SLACK: usize = 64;
/// Entries per queue below which a table does not split its queue further: a
/// queue's CLOCK order is exact within it, so the fewer entries a queue holds the
/// further its eviction may stray from the table's least recently used.
pub(super) const MIN_QUEUE_ENTRIES: usize = 4096;
/// Queues per thread shard (`crate::shard::count`) at most: with four times as many
/// queues as cores, two cores learning at once meet on one queue 1 time in 4 x cores.
pub(super) const QUEUES_PER_SHARD: usize = 4;
/// First capacity of the queue; it then doubles, capped at its compaction limit.
pub(super) const MIN_QUEUE_CAPACITY: usize = 16;
/// The table clock starts at this many seconds (~2.1 years), not 0, so an entry loaded
/// with N seconds of idle time just after start gets `last_used = now - N` >= 0.
pub(super) const CLOCK_START: u32 = 1 << 26;
/// Longest idle lifetime honoured (one year, below `CLOCK_START`); longer `expire`
/// settings are clamped to it.
pub(super) const MAX_TTL_SECS: u32 = 365 * 24 * 3600;
/// Backend index of a shared prefix (no backend); also caps the interner at 65535 names.
pub(super) const NO_BACKEND: u16 = u16::MAX;
/// Entry flag: used since its queue record was (re)queued (second chance).
pub(super) const REFERENCED: u8 = 1;
/// Entry flag: a ticket prefix seen on two backends (shared ticket keys), or a
/// source hint whose address is evidently shared by many clients (NAT).
pub(super) const SHARED: u8 = 2;
/// Entry bits of a source hint: the full handshakes seen from its address while the
/// hint lived (saturating at 3). Not saved in a state file.
pub(super) const HINT_COUNT: u8 = 0b1100;
/// One full handshake in [`HINT_COUNT`].
pub(super) const HINT_COUNT_ONE: u8 = 0b0100;
/// Full handshakes from one address within a hint's life that mark the address
/// shared. One client does one per session; a resumption that failed adds one;
/// a third means more clients than one are behind the address, and following the
/// hint would send all of their resumptions to the backend of the last one.
pub(super) const HINT_SHARED_AT: u8 = 3;

/// Entry flag: a resumption proved the entry (the server accepted the session it
/// names, or the client behind the address resumed): it belongs to the protected
/// segment, evicted only when the probation segment has nothing left.
pub(super) const PROTECTED: u8 = 0b1_0000;
/// Share of a queue's places the protected segment may hold, in percent (as the
/// segmented LRU of Caffeine and of Karedla et al. 1994, 80 %): the rest stays for
/// new, unproven entries, so a table full of proven sessions still learns new ones;
/// a protected entry pushed out of its share is demoted to probation, not evicted.
pub(super) const PROTECTED_PERCENT: usize = 80;

/// One table entry (16 bytes; the map slot with its key is 24).
pub(super) struct Entry {
    /// Table-clock second the key was learned for its current backend.
    pub(super) learned: u32,
    /// Table-clock second of the last hit or learn.
    pub(super) last_used: AtomicU32,
    /// Insertion generation: tells this entry's queue record from stale ones.
    pub(super) gen: u32,
    /// Index into the backend interner, or `NO_BACKEND` when shared.
    pub(super) backend: u16,
    /// `KeyKind::code`.
    pub(super) kind: u8,
    /// `REFERENCED` | `SHARED` | `HINT_COUNT` | `PROTECTED`.
    pub(super) flags: AtomicU8,
}

impl Entry {
    pub(super) fn new(
        kind: u8,
        backend: u16,
        gen: u32,
        learned: u32,
        last_used: u32,
        flags: u8,
    ) -> Entry {
        Entry {
            learned,
            last_used: AtomicU32::new(last_used),
            gen,
            backend,
            kind,
            flags: AtomicU8::new(flags),
        }
    }

    pub(super) fn idle(&self, now: u32) -> u32 {
        now.saturating_sub(self.last_used.load(Relaxed))
    }

    pub(super) fn is_shared(&self) -> bool {
        self.flags.load(Relaxed) & SHARED != 0
    }

    /// Did a resumption prove it ([`PROTECTED`])?
    pub(super) fn is_protected(&self) -> bool {
        self.flags.load(Relaxed) & PROTECTED != 0
    }

    /// Marks a use; writes only what changes, so hot entries don't bounce cache lines.
    pub(super) fn touch(&self, now: u32) {
        if self.last_used.load(Relaxed) < now {
            self.last_used.store(now, Relaxed);
        }
        if self.flags.load(Relaxed) & REFERENCED == 0 {
            self.flags.fetch_or(REFERENCED, Relaxed);
        }
    }

    /// Counts one more full handshake of a source hint; true once the address
    /// counts as shared ([`HINT_SHARED_AT`]).
    pub(super) fn count_hint(&self) -> bool {
        let flags = self.flags.load(Relaxed);
        let seen = ((flags & HINT_COUNT) / HINT_COUNT_ONE + 1).min(HINT_SHARED_AT);
        self.flags
            .store((flags & !HINT_COUNT) | (seen * HINT_COUNT_ONE), Relaxed);
        seen >= HINT_SHARED_AT
    }

    /// Clears the referenced bit, returning whether it was set.
    pub(super) fn take_referenced(&self) -> bool {
        self.flags.load(Relaxed) & REFERENCED != 0
            && self.flags.fetch_and(!REFERENCED, Relaxed) & REFERENCED != 0
    }
}

/// A queue record: the entry's hash (as two u32 so the record is 12 bytes) and generation.
#[derive(Clone, Copy)]
pub(super) struct QueueRecord {
    pub(super) hash: [u32; 2],
    pub(super) gen: u32,
}

impl QueueRecord {
    pub(super) fn new(hash: u64, gen: u32) -> QueueRecord {
        // Truncating casts on purpose: the two halves of the hash.
        QueueRecord {
            hash: [hash as u32, (hash >> 32) as u32],
            gen,
        }
    }

    pub(super) fn hash(&self) -> u64 {
        u64::from(self.hash[0]) | (u64::from(self.hash[1]) << 32)
    }
}

/// The eviction queues of one lock, probation and protected (a segmented LRU), and
/// the generation counter (all only change under its mutex).
///
/// Every entry is queued in `records` (probation) first; one found [`PROTECTED`]
/// at the probation front moves to `protected` then (lazily: protecting an entry
/// only sets its flag, without the queue's lock).
pub(super) struct Fifo {
    /// Probation: unproven entries, and protected ones not yet moved.
    pub(super) records: VecDeque<QueueRecord>,
    /// Protected: entries a resumption proved, oldest first.
    pub(super) protected: VecDeque<QueueRecord>,
    pub(super) next_gen: u32,
}

impl Fifo {
    /// An empty queue pair.
    pub(super) fn new() -> Fifo {
        Fifo {
            records: VecDeque::new(),
            protected: VecDeque::new(),
            next_gen: 0,
        }
    }

    /// Records of both segments, stale ones included.
    pub(super) fn len(&self) -> usize {
        self.records.len() + self.protected.len()
    }

    /// Forget every record.
    pub(super) fn clear(&mut self) {
        self.records = VecDeque::new();
        self.protected = VecDeque::new();
    }

    pub(super) fn next_gen(&mut self) -> u32 {
        self.next_gen = self.next_gen.wrapping_add(1);
        self.next_gen
    }

    /// Appends, growing by doubling but never past `limit` records of capacity.
    pub(super) fn push(&mut self, record: QueueRecord, limit: usize) {
        let cap = self.records.capacity();
        if self.records.len() == cap {
            let grow = cap
                .max(MIN_QUEUE_CAPACITY)
                .min(limit.saturating_sub(cap))
                .max(1);
            self.records.reserve_exact(grow);
        }
        self.records.push_back(record);
    }
}

/// A per-process secret mixed into the map's bucket choice. Keys are keyed SipHash
/// outputs when crossbar computes them, but a state file supplies them as stored: a
/// crafted file could give every entry the same low bits, one long probe sequence that
/// makes loading and every later lookup quadratic. Mixed with a secret, no file can
/// aim at a bucket.
static BUCKET_SEED: LazyLock<u64> = LazyLock::new(|| fastrand::u64(..));

/// A key hash mixed with [`BUCKET_SEED`] (SplitMix64's finaliser): where the map and
/// the queues place the key.
pub(super) fn bucket_hash(hash: u64) -> u64 {
    let mut z = hash ^ *BUCKET_SEED;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Hasher for keys that already are (nearly always) keyed SipHash outputs: one
/// xor and the SplitMix64 finaliser (bijective, so distinct keys stay distinct)
/// instead of hashing them again.
#[derive(Default, Clone, Copy)]
pub(super) struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        bucket_hash(self.0)
    }

    fn write(&mut self, bytes: &[u8]) {
        // Not reached for u64 keys; a plain fold keeps it correct anyway.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// Backend names by index: append-only, read lock-free through an `ArcSwap` snapshot.
/// Names are few (one per backend ever seen), so lookups by name scan the list.
pub(super) struct Backends {
    pub(super) names: ArcSwap<Vec<Arc<str>>>,
    pub(super) grow: Mutex<()>,
}

impl Backends {
    pub(super) fn new() -> Backends {
        Backends {
            names: ArcSwap::from_pointee(Vec::new()),
            grow: Mutex::new(()),
        }
    }

    pub(super) fn find(&self, name: &str) -> Option<u16> {
        let names = self.names.load();
        let index = names.iter().position(|n| &**n == name)?;
        u16::try_from(index).ok()
    }

    /// The index of `name`, adding it if new; `None` once 65535 names exist.
    pub(super) fn intern(&self, name: &str) -> Option<u16> {
        if let Some(index) = self.find(name) {
            return Some(index);
        }
        let _writer = self.grow.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(index) = self.find(name) {
            return Some(index);
        }
        let current = self.names.load_full();
        let index = u16::try_from(current.len())
            .ok()
            .filter(|&i| i < NO_BACKEND)?;
        let mut next = Vec::with_capacity(current.len() + 1);
        next.extend(current.iter().cloned());
        next.push(Arc::from(name));
        self.names.store(Arc::new(next));
        Some(index)
    }

    pub(super) fn name(&self, index: u16) -> Option<Arc<str>> {
        self.names.load().get(usize::from(index)).cloned()
    }

    /// Lend the name at `index` to `f` without cloning its `Arc`.
    pub(super) fn with_name<R>(&self, index: u16, f: impl FnOnce(&str) -> R) -> Option<R> {
        self.names.load().get(usize::from(index)).map(|n| f(n))
    }
}
