//! Stick tables: which backend holds a TLS session, keyed by hashed session state.
//!
//! # Layout
//!
//! A table is a [`DashMap`] from a 64-bit keyed SipHash-1-3 of the key (kind tag +
//! raw bytes) to a 16-byte `Entry`: kind, backend as a `u16` index into a small
//! per-table name interner, `learned` and `last_used` as `u32` seconds of a coarse
//! table clock, and two flag bits (referenced, shared prefix). Because keys are
//! already uniform keyed hashes, the map hashes them with a pass-through hasher.
//!
//! # Eviction (CLOCK / second chance)
//!
//! Next to the map sits a FIFO of `(hash, generation)` records behind a `Mutex`,
//! one live record per entry in insertion order. A lookup hit sets the entry's
//! *referenced* bit (the "used after the record was queued" test, exact even within
//! one second of the coarse clock). When the table is full, `learn` pops the front:
//! a stale record (entry gone, or re-inserted with another generation) is dropped; a
//! referenced entry has its bit cleared and is re-queued at the back (at most
//! `MAX_SECOND_CHANCES` times per insert); otherwise the entry is evicted. Work per
//! insert is bounded by that constant plus the stale records met, and stale records
//! are bounded by compaction (`QUEUE_SLACK_DIVISOR`).
//!
//! # Concurrency
//!
//! `lookup` takes only a dashmap shard read lock (refreshing uses atomics in the
//! entry) and reads backend names through an `ArcSwap` snapshot, so concurrent
//! lookups never wait for each other or for a global lock. Inserting a *new* key
//! (and evicting) happens under the queue mutex, which is what guarantees the table
//! never holds more than `size` entries. Lock order is always queue, then shard.
//!
//! # Memory
//!
//! A map slot is 24 bytes plus one control byte; hashbrown keeps its tables between
//! 44% and 87% full (power-of-two growth), so the map costs ~28-55 bytes per entry,
//! and the queue 12 bytes per record: ~40-70 bytes per entry depending on where
//! `size` falls. Measured by the `memory_per_entry` test: ~65 bytes per entry at
//! 1M entries on 8 shards (an unlucky spot: every shard just past a doubling).
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::fs::{self, File, OpenOptions};
use std::hash::{BuildHasherDefault, Hasher};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use dashmap::DashMap;
use siphasher::sip::SipHasher13;

/// Referenced entries one insert re-queues before it evicts the next one anyway: bounds
/// the work of an insert into a full table whose oldest entries are all in use.
const MAX_SECOND_CHANCES: usize = 8;
/// Stale records (of entries forgotten, expired or removed) the queue may hold on top of
/// `size` before `learn` compacts it: `size / 2`, so a compaction (O(queue)) happens at
/// most once per `size / 2` removals and the queue stays under 1.5 × `size` records.
const QUEUE_SLACK_DIVISOR: usize = 2;
/// Stale records above which `sweep` compacts the queue (`size / 4`): the sweeper task
/// does the O(queue) pass in the background, normally before `learn` has to.
const SWEEP_COMPACT_DIVISOR: usize = 4;
/// Smallest stale-record slack, so tiny tables don't compact on every insert.
const MIN_QUEUE_SLACK: usize = 64;
/// First capacity of the queue; it then doubles, capped at its compaction limit.
const MIN_QUEUE_CAPACITY: usize = 16;
/// The table clock starts at this many seconds (~2.1 years), not 0, so an entry loaded
/// with N seconds of idle time just after start gets `last_used = now - N` >= 0.
const CLOCK_START: u32 = 1 << 26;
/// Longest idle lifetime honoured (one year, below `CLOCK_START`); longer `expire`
/// settings are clamped to it.
const MAX_TTL_SECS: u32 = 365 * 24 * 3600;
/// Backend index of a shared prefix (no backend); also caps the interner at 65535 names.
const NO_BACKEND: u16 = u16::MAX;
/// Entry flag: used since its queue record was (re)queued (second chance).
const REFERENCED: u8 = 1;
/// Entry flag: a ticket prefix seen on two backends (shared ticket keys).
const SHARED: u8 = 2;

/// First bytes of a saved table.
const STATE_MAGIC: [u8; 8] = *b"XBSTICK\0";
/// Version of the saved-table format; files of other versions are rejected.
const STATE_VERSION: u32 = 1;
/// Fixed SipHash key of the file checksum: it detects corruption and truncation, it
/// authenticates nothing (whoever can write the file can recompute it).
const CHECKSUM_KEY: (u64, u64) = (0x6372_6f73_7362_6172, 0x7374_6963_6b5f_7631);
/// Bytes of one saved entry: hash u64, kind u8, flags u8, backend u16, age u32, idle u32.
const SAVED_ENTRY_BYTES: usize = 20;
/// Bytes of the trailing checksum.
const CHECKSUM_BYTES: usize = 8;

/// The kind of a stick key (also the `key` label of the lookup metrics, via `label()`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyKind {
    /// TLS <= 1.2 session ID assigned by the server.
    SessionId,
    /// Hash of a whole session ticket (TLS 1.2 NewSessionTicket).
    Ticket,
    /// The key-name prefix of tickets / PSK identities: names the issuing backend.
    TicketPrefix,
    /// A TLS 1.3 PSK identity the server accepted.
    Psk,
    /// The client's (masked) source address.
    Source,
}

impl KeyKind {
    /// Short name used in the API and logs.
    pub fn as_str(&self) -> &'static str {
        match self {
            KeyKind::SessionId => "session_id",
            KeyKind::Ticket => "ticket",
            KeyKind::TicketPrefix => "ticket_prefix",
            KeyKind::Psk => "psk",
            KeyKind::Source => "source",
        }
    }

    /// Stable one-byte code: mixed into key hashes and written to saved tables, so it
    /// must never change for an existing kind.
    fn code(self) -> u8 {
        match self {
            KeyKind::SessionId => 1,
            KeyKind::Ticket => 2,
            KeyKind::TicketPrefix => 3,
            KeyKind::Psk => 4,
            KeyKind::Source => 5,
        }
    }

    fn from_code(code: u8) -> Option<KeyKind> {
        Some(match code {
            1 => KeyKind::SessionId,
            2 => KeyKind::Ticket,
            3 => KeyKind::TicketPrefix,
            4 => KeyKind::Psk,
            5 => KeyKind::Source,
            _ => return None,
        })
    }
}

/// A hashed stick key: fixed size whatever the client sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StickKey {
    /// The key's kind.
    pub kind: KeyKind,
    /// Keyed hash of the kind and the raw key bytes.
    pub hash: u64,
}

/// Settings of one table.
#[derive(Debug, Clone)]
pub struct TableParams {
    /// Maximum number of entries.
    pub size: usize,
    /// Idle lifetime of session/ticket/psk/prefix entries.
    pub expire: Duration,
    /// Idle lifetime of source entries.
    pub source_expire: Duration,
}

/// One entry as shown by the admin API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryView {
    /// The key kind.
    pub kind: KeyKind,
    /// The key hash as 16 hex digits.
    pub hash_hex: String,
    /// Backend name; `None` for a prefix seen on several backends (shared ticket keys).
    pub backend: Option<Arc<str>>,
    /// Seconds since the entry was learned.
    pub age: Duration,
    /// Time until it expires unless used.
    pub expires_in: Duration,
}

/// Counters of one table (read by the metrics collector at scrape time).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TableStats {
    /// Entries now.
    pub entries: usize,
    /// Capacity (`size`).
    pub capacity: usize,
    /// Entries removed because they expired, since start.
    pub expired: u64,
    /// Entries removed to make room, since start.
    pub evicted: u64,
}

/// Why a saved table was rejected; `load` returns it inside an `io::Error` of kind
/// `InvalidData` (get it back with `io::Error::get_ref` + `downcast_ref`).
#[derive(Debug, thiserror::Error)]
pub enum StateFileError {
    /// The file does not start with the stick-table magic.
    #[error("not a crossbar stick table file")]
    BadMagic,
    /// Written by a crossbar with another file format.
    #[error(
        "stick table file has format version {found}, this build reads version {STATE_VERSION}"
    )]
    UnsupportedVersion {
        /// The version in the file.
        found: u32,
    },
    /// The file ends before its header or entries do.
    #[error("stick table file is truncated")]
    Truncated,
    /// The checksum does not match: corrupt or truncated.
    #[error("stick table file checksum mismatch (corrupt or truncated)")]
    ChecksumMismatch,
    /// Bytes left between the last entry and the checksum.
    #[error("stick table file has {0} unexpected bytes after its entries")]
    TrailingBytes(usize),
    /// A backend name that is not UTF-8.
    #[error("stick table file backend name #{0} is not UTF-8")]
    BadName(usize),
    /// An entry with an unknown kind, flags or backend index.
    #[error("stick table file entry #{index}: {reason}")]
    BadEntry {
        /// Position of the entry in the file.
        index: usize,
        /// What is wrong with it.
        reason: &'static str,
    },
}

/// One table entry (16 bytes; the map slot with its key is 24).
struct Entry {
    /// Table-clock second the key was learned for its current backend.
    learned: u32,
    /// Table-clock second of the last hit or learn.
    last_used: AtomicU32,
    /// Insertion generation: tells this entry's queue record from stale ones.
    gen: u32,
    /// Index into the backend interner, or `NO_BACKEND` when shared.
    backend: u16,
    /// `KeyKind::code`.
    kind: u8,
    /// `REFERENCED` | `SHARED`.
    flags: AtomicU8,
}

impl Entry {
    fn new(kind: u8, backend: u16, gen: u32, learned: u32, last_used: u32, flags: u8) -> Entry {
        Entry {
            learned,
            last_used: AtomicU32::new(last_used),
            gen,
            backend,
            kind,
            flags: AtomicU8::new(flags),
        }
    }

    fn idle(&self, now: u32) -> u32 {
        now.saturating_sub(self.last_used.load(Relaxed))
    }

    fn is_shared(&self) -> bool {
        self.flags.load(Relaxed) & SHARED != 0
    }

    /// Marks a use; writes only what changes, so hot entries don't bounce cache lines.
    fn touch(&self, now: u32) {
        if self.last_used.load(Relaxed) < now {
            self.last_used.store(now, Relaxed);
        }
        if self.flags.load(Relaxed) & REFERENCED == 0 {
            self.flags.fetch_or(REFERENCED, Relaxed);
        }
    }

    /// Clears the referenced bit, returning whether it was set.
    fn take_referenced(&self) -> bool {
        self.flags.load(Relaxed) & REFERENCED != 0
            && self.flags.fetch_and(!REFERENCED, Relaxed) & REFERENCED != 0
    }
}

/// A queue record: the entry's hash (as two u32 so the record is 12 bytes) and generation.
#[derive(Clone, Copy)]
struct QueueRecord {
    hash: [u32; 2],
    gen: u32,
}

impl QueueRecord {
    fn new(hash: u64, gen: u32) -> QueueRecord {
        // Truncating casts on purpose: the two halves of the hash.
        QueueRecord {
            hash: [hash as u32, (hash >> 32) as u32],
            gen,
        }
    }

    fn hash(&self) -> u64 {
        u64::from(self.hash[0]) | (u64::from(self.hash[1]) << 32)
    }
}

/// The eviction queue and the generation counter (both only change under its mutex).
struct Fifo {
    records: VecDeque<QueueRecord>,
    next_gen: u32,
}

impl Fifo {
    fn next_gen(&mut self) -> u32 {
        self.next_gen = self.next_gen.wrapping_add(1);
        self.next_gen
    }

    /// Appends, growing by doubling but never past `limit` records of capacity.
    fn push(&mut self, record: QueueRecord, limit: usize) {
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

/// Hasher for keys that already are keyed SipHash outputs: hashing them again would only
/// cost time.
#[derive(Default, Clone, Copy)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
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
struct Backends {
    names: ArcSwap<Vec<Arc<str>>>,
    grow: Mutex<()>,
}

impl Backends {
    fn new() -> Backends {
        Backends {
            names: ArcSwap::from_pointee(Vec::new()),
            grow: Mutex::new(()),
        }
    }

    fn find(&self, name: &str) -> Option<u16> {
        let names = self.names.load();
        let index = names.iter().position(|n| &**n == name)?;
        u16::try_from(index).ok()
    }

    /// The index of `name`, adding it if new; `None` once 65535 names exist.
    fn intern(&self, name: &str) -> Option<u16> {
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

    fn name(&self, index: u16) -> Option<Arc<str>> {
        self.names.load().get(usize::from(index)).cloned()
    }

    /// Lend the name at `index` to `f` without cloning its `Arc`.
    fn with_name<R>(&self, index: u16, f: impl FnOnce(&str) -> R) -> Option<R> {
        self.names.load().get(usize::from(index)).map(|n| f(n))
    }
}

/// One entry as written to / read from a saved table.
struct SavedEntry {
    hash: u64,
    kind: u8,
    flags: u8,
    backend: u16,
    /// Seconds since learned.
    age: u32,
    /// Seconds since last used.
    idle: u32,
}

/// A decoded saved table.
struct StateFile {
    hash_key: (u64, u64),
    names: Vec<String>,
    entries: Vec<SavedEntry>,
}

/// Result of looking an entry up.
enum Found {
    Hit(u16),
    Expired(u32),
    Miss,
}

/// A concurrent stick table.
///
/// Limits and defaults: at most `size` entries (a `size` of 0 learns nothing); idle
/// lifetimes are whole seconds (rounded up, clamped to one year) and an entry expires
/// once more than its lifetime has passed since its last use, so up to ~2 s late, never
/// early; at most 65535 distinct backend names per table (more are not learned).
pub struct StickTable {
    params: TableParams,
    ttl: u32,
    source_ttl: u32,
    hash_key: [AtomicU64; 2],
    map: DashMap<u64, Entry, BuildHasherDefault<PassThrough>>,
    queue: Mutex<Fifo>,
    /// Entries in the map; raised before an insert and lowered after a removal, so it
    /// never reads below the real number and the `size` check is conservative.
    count: AtomicUsize,
    backends: Backends,
    epoch: Instant,
    clock_offset: AtomicU32,
    expired: AtomicU64,
    evicted: AtomicU64,
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
        StickTable {
            ttl: ttl_secs(params.expire),
            source_ttl: ttl_secs(params.source_expire),
            params,
            hash_key: [
                AtomicU64::new(fastrand::u64(..)),
                AtomicU64::new(fastrand::u64(..)),
            ],
            map: DashMap::with_hasher(BuildHasherDefault::default()),
            queue: Mutex::new(Fifo {
                records: VecDeque::new(),
                next_gen: 0,
            }),
            count: AtomicUsize::new(0),
            backends: Backends::new(),
            epoch: Instant::now(),
            clock_offset: AtomicU32::new(0),
            expired: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
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

    /// The backend an unexpired entry points at (refreshing it), if any.
    ///
    /// Hot path: takes one dashmap shard read lock, never a table-wide lock. An expired
    /// entry is a miss and is removed; a shared prefix is a miss (and is not refreshed).
    pub fn lookup(&self, key: &StickKey) -> Option<Arc<str>> {
        self.find(key).and_then(|b| self.backends.name(b))
    }

    /// Like [`StickTable::lookup`], but lends the backend name to `f` instead of
    /// cloning it: no shared reference count is touched, so concurrent hits on the
    /// same backend don't contend for one cache line. The data path uses this.
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
            self.upsert(key, backend, false);
        }
    }

    /// Record a ticket-key prefix seen on `backend`; a prefix seen on two backends
    /// is marked shared and no longer routes.
    ///
    /// A shared entry stays (refreshed by each sighting) so the prefix keeps being
    /// recognised as shared until it has been idle for `expire`.
    pub fn learn_prefix(&self, key: StickKey, backend: &str) {
        if let Some(backend) = self.backends.intern(backend) {
            self.upsert(key, backend, true);
        }
    }

    /// Remove one entry.
    pub fn forget(&self, key: &StickKey) {
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
        let mut queue = self.lock_queue();
        let stale = queue.records.len().saturating_sub(self.count.load(Relaxed));
        if stale > (self.params.size / SWEEP_COMPACT_DIVISOR).max(MIN_QUEUE_SLACK) {
            self.compact(&mut queue);
        }
        removed
    }

    /// Remove everything.
    ///
    /// Keeps the hash key, the counters and the backend names.
    pub fn clear(&self) {
        let mut queue = self.lock_queue();
        self.remove_where(|_| true);
        queue.records = VecDeque::new();
    }

    /// Counters for metrics.
    pub fn stats(&self) -> TableStats {
        TableStats {
            entries: self.count.load(Relaxed),
            capacity: self.params.size,
            expired: self.expired.load(Relaxed),
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
                    })
                },
            )
            .collect()
    }

    /// Save the table atomically (temp file + rename).
    ///
    /// Writes `<path>.tmp` in the same directory (mode 0600 on Unix: the file holds the
    /// table's hash key), fsyncs it, renames it over `path` and fsyncs the directory.
    /// Each entry keeps its remaining lifetime (idle seconds are stored). Returns the
    /// number of entries saved. The format is versioned binary: magic, version, hash
    /// key, backend names, entries, SipHash checksum.
    pub fn save(&self, path: &Path) -> io::Result<usize> {
        let now = self.now();
        let entries: Vec<SavedEntry> = self
            .map
            .iter()
            .filter(|item| item.idle(now) <= self.ttl_of(item.kind))
            .map(|item| SavedEntry {
                hash: *item.key(),
                kind: item.kind,
                flags: item.flags.load(Relaxed) & SHARED,
                backend: item.backend,
                age: now.saturating_sub(item.learned),
                idle: item.idle(now),
            })
            .collect();
        // Names after entries: the interner only grows, so every index above is in it.
        let names = self.backends.names.load_full();
        let hash_key = (
            self.hash_key[0].load(Relaxed),
            self.hash_key[1].load(Relaxed),
        );
        let bytes = encode_state(hash_key, &names, &entries);
        write_atomically(path, &bytes)?;
        Ok(entries.len())
    }

    /// Load a saved table, keeping remaining lifetimes; returns entries loaded.
    ///
    /// Replaces the table's contents and adopts the saved hash key (hashes can't be
    /// recomputed without the raw keys), so call it at startup before traffic. Keeps the
    /// `size` most recently used unexpired entries. A missing file is the `NotFound`
    /// error of the read; a corrupt, truncated or other-version file is `InvalidData`
    /// (wrapping a [`StateFileError`]) and leaves the table unchanged.
    pub fn load(&self, path: &Path) -> io::Result<usize> {
        let bytes = fs::read(path)?;
        let file =
            decode_state(&bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        Ok(self.install(file))
    }

    /// Move the test clock forward (expiry tests without sleeping).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn advance_clock(&self, by: Duration) {
        self.clock_offset
            .fetch_add(u32::try_from(by.as_secs()).unwrap_or(u32::MAX), Relaxed);
    }

    /// The coarse table clock, in seconds. In unit tests it moves only with
    /// `advance_clock`, so expiry tests are deterministic.
    fn now(&self) -> u32 {
        let elapsed = if cfg!(test) {
            0
        } else {
            u32::try_from(self.epoch.elapsed().as_secs()).unwrap_or(u32::MAX)
        };
        CLOCK_START
            .saturating_add(elapsed)
            .saturating_add(self.clock_offset.load(Relaxed))
    }

    fn ttl_of(&self, kind: u8) -> u32 {
        if kind == KeyKind::Source.code() {
            self.source_ttl
        } else {
            self.ttl
        }
    }

    fn lock_queue(&self) -> MutexGuard<'_, Fifo> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Most records the queue may hold before `learn` compacts it.
    fn queue_limit(&self) -> usize {
        let slack = (self.params.size / QUEUE_SLACK_DIVISOR).max(MIN_QUEUE_SLACK);
        self.params.size.saturating_add(slack)
    }

    fn upsert(&self, key: StickKey, backend: u16, prefix: bool) {
        if self.params.size == 0 {
            return;
        }
        let now = self.now();
        if self.update_existing(key, backend, prefix, now) {
            return;
        }
        let mut queue = self.lock_queue();
        // New keys are only inserted under the queue lock: re-check, then it can't appear.
        if self.update_existing(key, backend, prefix, now) {
            return;
        }
        while self.count.load(Relaxed) >= self.params.size {
            if !self.evict_one(&mut queue, now) {
                return; // nothing evictable: can't happen while entries have records
            }
        }
        let gen = queue.next_gen();
        self.count.fetch_add(1, Relaxed);
        let entry = Entry::new(key.kind.code(), backend, gen, now, now, 0);
        if self.map.insert(key.hash, entry).is_some() {
            self.count.fetch_sub(1, Relaxed);
        }
        let limit = self.queue_limit();
        queue.push(QueueRecord::new(key.hash, gen), limit);
        if queue.records.len() >= limit {
            self.compact(&mut queue);
        }
    }

    /// Updates the entry of `key` in place if there is one; false if there is none.
    fn update_existing(&self, key: StickKey, backend: u16, prefix: bool, now: u32) -> bool {
        let Some(mut e) = self.map.get_mut(&key.hash) else {
            return false;
        };
        let kind = key.kind.code();
        if e.idle(now) > self.ttl_of(e.kind) {
            // Expired but not yet removed: reuse the slot as a fresh entry. Its queue
            // record is old, so mark it referenced to give it a second chance.
            self.expired.fetch_add(1, Relaxed);
            let gen = e.gen;
            *e = Entry::new(kind, backend, gen, now, now, REFERENCED);
            return true;
        }
        let same_kind = e.kind == kind;
        if prefix && same_kind {
            if !e.is_shared() && e.backend != backend {
                e.backend = NO_BACKEND;
                e.flags.fetch_or(SHARED, Relaxed);
            }
        } else if !same_kind || e.backend != backend || e.is_shared() {
            e.kind = kind;
            e.backend = backend;
            e.learned = now;
            e.flags.fetch_and(!SHARED, Relaxed);
        }
        e.touch(now);
        true
    }

    /// Removes one entry to make room; false if the queue ran empty.
    fn evict_one(&self, queue: &mut Fifo, now: u32) -> bool {
        let mut chances = 0;
        while let Some(record) = queue.records.pop_front() {
            let hash = record.hash();
            let expired = match self.map.get(&hash) {
                Some(e) if e.gen == record.gen => {
                    let expired = e.idle(now) > self.ttl_of(e.kind);
                    if !expired && chances < MAX_SECOND_CHANCES && e.take_referenced() {
                        chances += 1;
                        queue.records.push_back(record);
                        continue;
                    }
                    expired
                }
                _ => continue, // stale record: entry gone or re-inserted
            };
            // The shard guard is dropped here, before removing from the same shard.
            if self
                .map
                .remove_if(&hash, |_, e| e.gen == record.gen)
                .is_some()
            {
                self.count.fetch_sub(1, Relaxed);
                let counter = if expired {
                    &self.expired
                } else {
                    &self.evicted
                };
                counter.fetch_add(1, Relaxed);
            }
            // If a lookup or forget removed it meanwhile, that made room as well.
            return true;
        }
        false
    }

    /// Drops stale records (O(queue), shard read locks only) and trims spare capacity.
    fn compact(&self, queue: &mut Fifo) {
        queue
            .records
            .retain(|r| self.map.get(&r.hash()).is_some_and(|e| e.gen == r.gen));
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
    fn remove_where(&self, doomed: impl Fn(&Entry) -> bool) -> usize {
        let mut removed = 0;
        self.map.retain(|_, e| {
            let remove = doomed(e);
            removed += usize::from(remove);
            !remove
        });
        self.count.fetch_sub(removed, Relaxed);
        removed
    }

    /// Replaces the contents with a decoded file's (see `load`).
    fn install(&self, file: StateFile) -> usize {
        let mut live: Vec<&SavedEntry> = file
            .entries
            .iter()
            .filter(|e| e.idle <= self.ttl_of(e.kind))
            .collect();
        live.sort_by_key(|e| e.idle);
        live.truncate(self.params.size);
        let backends: Vec<Option<u16>> =
            file.names.iter().map(|n| self.backends.intern(n)).collect();

        let mut queue = self.lock_queue();
        self.remove_where(|_| true);
        queue.records = VecDeque::new();
        self.hash_key[0].store(file.hash_key.0, Relaxed);
        self.hash_key[1].store(file.hash_key.1, Relaxed);
        let now = self.now();
        let limit = self.queue_limit();
        let mut loaded = 0;
        // Oldest first, so the queue front holds the least recently used.
        for saved in live.into_iter().rev() {
            let backend = if saved.backend == NO_BACKEND {
                NO_BACKEND
            } else {
                match backends.get(usize::from(saved.backend)).copied().flatten() {
                    Some(index) => index,
                    None => continue, // interner full
                }
            };
            let gen = queue.next_gen();
            let (learned, last_used) = (
                now.saturating_sub(saved.age),
                now.saturating_sub(saved.idle),
            );
            let entry = Entry::new(saved.kind, backend, gen, learned, last_used, saved.flags);
            self.count.fetch_add(1, Relaxed);
            if self.map.insert(saved.hash, entry).is_some() {
                self.count.fetch_sub(1, Relaxed); // duplicate hash in the file
            } else {
                loaded += 1;
            }
            queue.push(QueueRecord::new(saved.hash, gen), limit);
        }
        loaded
    }
}

/// A lifetime in whole table-clock seconds: rounded up, clamped to `MAX_TTL_SECS`.
fn ttl_secs(ttl: Duration) -> u32 {
    let secs = ttl
        .as_secs()
        .saturating_add(u64::from(ttl.subsec_nanos() > 0));
    u32::try_from(secs).unwrap_or(u32::MAX).min(MAX_TTL_SECS)
}

fn secs(s: u32) -> Duration {
    Duration::from_secs(u64::from(s))
}

fn checksum(bytes: &[u8]) -> u64 {
    let mut hasher = SipHasher13::new_with_keys(CHECKSUM_KEY.0, CHECKSUM_KEY.1);
    hasher.write(bytes);
    hasher.finish()
}

/// Serialises a table: all integers little-endian.
///
/// ```text
/// magic [8] | version u32 | hash key u64 u64
/// name count u32 | per name: length u16, UTF-8 bytes
/// entry count u64 | per entry: hash u64, kind u8, flags u8, backend u16, age u32, idle u32
/// checksum u64 (SipHash-1-3 of everything before it)
/// ```
/// `backend` indexes the file's own name list (`0xffff` for a shared prefix), so the
/// file stores backends by name, independent of any table's interner.
fn encode_state(hash_key: (u64, u64), names: &[Arc<str>], entries: &[SavedEntry]) -> Vec<u8> {
    let names_len: usize = names.iter().map(|n| 2 + n.len()).sum();
    let mut out = Vec::with_capacity(48 + names_len + entries.len() * SAVED_ENTRY_BYTES);
    out.extend_from_slice(&STATE_MAGIC);
    out.extend_from_slice(&STATE_VERSION.to_le_bytes());
    out.extend_from_slice(&hash_key.0.to_le_bytes());
    out.extend_from_slice(&hash_key.1.to_le_bytes());
    out.extend_from_slice(&(names.len() as u32).to_le_bytes());
    for name in names {
        // Backend names come from the config and are short; cut defensively at u16::MAX.
        let bytes = &name.as_bytes()[..name.len().min(usize::from(u16::MAX))];
        out.extend_from_slice(&(bytes.len() as u16).to_le_bytes());
        out.extend_from_slice(bytes);
    }
    out.extend_from_slice(&(entries.len() as u64).to_le_bytes());
    for e in entries {
        out.extend_from_slice(&e.hash.to_le_bytes());
        out.push(e.kind);
        out.push(e.flags);
        out.extend_from_slice(&e.backend.to_le_bytes());
        out.extend_from_slice(&e.age.to_le_bytes());
        out.extend_from_slice(&e.idle.to_le_bytes());
    }
    let sum = checksum(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

/// Reads little-endian fields, failing with `Truncated` at the end of the input.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], StateFileError> {
        let (head, rest) = self
            .bytes
            .split_at_checked(N)
            .ok_or(StateFileError::Truncated)?;
        self.bytes = rest;
        <[u8; N]>::try_from(head).map_err(|_| StateFileError::Truncated)
    }

    fn slice(&mut self, n: usize) -> Result<&'a [u8], StateFileError> {
        let (head, rest) = self
            .bytes
            .split_at_checked(n)
            .ok_or(StateFileError::Truncated)?;
        self.bytes = rest;
        Ok(head)
    }

    fn u16(&mut self) -> Result<u16, StateFileError> {
        self.take().map(u16::from_le_bytes)
    }

    fn u32(&mut self) -> Result<u32, StateFileError> {
        self.take().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Result<u64, StateFileError> {
        self.take().map(u64::from_le_bytes)
    }
}

/// Parses and validates a saved table (see `encode_state`) without touching any table.
fn decode_state(bytes: &[u8]) -> Result<StateFile, StateFileError> {
    let mut header = Reader { bytes };
    if header.take::<8>()? != STATE_MAGIC {
        return Err(StateFileError::BadMagic);
    }
    let version = header.u32()?;
    if version != STATE_VERSION {
        return Err(StateFileError::UnsupportedVersion { found: version });
    }
    let body_len = bytes
        .len()
        .checked_sub(CHECKSUM_BYTES)
        .ok_or(StateFileError::Truncated)?;
    let (body, sum) = bytes.split_at(body_len);
    let stored = Reader { bytes: sum }.u64()?;
    if stored != checksum(body) {
        return Err(StateFileError::ChecksumMismatch);
    }
    let mut r = Reader {
        bytes: body.get(12..).ok_or(StateFileError::Truncated)?,
    };
    let hash_key = (r.u64()?, r.u64()?);
    let name_count = r.u32()? as usize;
    let mut names = Vec::with_capacity(name_count.min(r.bytes.len() / 2));
    for index in 0..name_count {
        let len = usize::from(r.u16()?);
        let name =
            std::str::from_utf8(r.slice(len)?).map_err(|_| StateFileError::BadName(index))?;
        names.push(name.to_owned());
    }
    let entry_count = usize::try_from(r.u64()?).map_err(|_| StateFileError::Truncated)?;
    match entry_count.checked_mul(SAVED_ENTRY_BYTES) {
        Some(n) if n <= r.bytes.len() => {}
        _ => return Err(StateFileError::Truncated),
    }
    let mut entries = Vec::with_capacity(entry_count);
    for index in 0..entry_count {
        let entry = SavedEntry {
            hash: r.u64()?,
            kind: r.take::<1>()?[0],
            flags: r.take::<1>()?[0],
            backend: r.u16()?,
            age: r.u32()?,
            idle: r.u32()?,
        };
        let bad = |reason| StateFileError::BadEntry { index, reason };
        if KeyKind::from_code(entry.kind).is_none() {
            return Err(bad("unknown key kind"));
        }
        if entry.flags & !SHARED != 0 {
            return Err(bad("unknown flags"));
        }
        let shared = entry.flags & SHARED != 0;
        if shared != (entry.backend == NO_BACKEND) {
            return Err(bad("shared flag and backend disagree"));
        }
        if !shared && usize::from(entry.backend) >= names.len() {
            return Err(bad("backend index out of range"));
        }
        entries.push(entry);
    }
    if !r.bytes.is_empty() {
        return Err(StateFileError::TrailingBytes(r.bytes.len()));
    }
    Ok(StateFile {
        hash_key,
        names,
        entries,
    })
}

/// `<path>.tmp`, in the same directory so the rename is atomic.
fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".tmp");
    PathBuf::from(name)
}

/// Writes `bytes` to `path` via a fsynced temp file and a rename, then fsyncs the directory.
fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = tmp_path(path);
    let result = (|| {
        let mut file = create_private(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        drop(file);
        fs::rename(&tmp, path)?;
        let dir = match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        if let Err(e) = fs::remove_file(&tmp) {
            if e.kind() != io::ErrorKind::NotFound {
                tracing::warn!(path = %tmp.display(), error = %e, "could not remove temporary stick table file");
            }
        }
    }
    result
}

/// Creates (truncating) a file readable only by its owner: it holds the hash key.
fn create_private(path: &Path) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    const EXPIRE: Duration = Duration::from_secs(60);
    const SOURCE_EXPIRE: Duration = Duration::from_secs(10);

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

    fn hit(t: &StickTable, key: &StickKey) -> Option<String> {
        t.lookup(key).map(|b| b.to_string())
    }

    fn queue_len(t: &StickTable) -> usize {
        t.lock_queue().records.len()
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
        assert_eq!(
            t.stats(),
            TableStats {
                entries: 1,
                capacity: 16,
                expired: 0,
                evicted: 0
            }
        );
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
        let t = table(100);
        for i in 0..10 {
            t.learn(sid(&t, i), "b1");
        }
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
        let t = table(64);
        for i in 0..64 {
            t.learn(sid(&t, i), "b1");
        }
        t.advance_clock(Duration::from_secs(1));
        let touched: Vec<u32> = (0..32).step_by(4).collect();
        for &i in &touched {
            assert!(t.lookup(&sid(&t, i)).is_some());
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
                t.lookup(&sid(&t, i)).is_some(),
                "recent entry {i} was evicted"
            );
        }
    }

    #[test]
    fn a_full_table_of_used_entries_still_takes_new_ones() {
        let t = table(32);
        for i in 0..32 {
            t.learn(sid(&t, i), "b1");
        }
        for i in 0..32 {
            assert!(t.lookup(&sid(&t, i)).is_some());
        }
        t.learn(sid(&t, 100), "b1");
        assert_eq!(t.stats().entries, 32);
        assert_eq!(t.stats().evicted, 1);
        assert!(t.lookup(&sid(&t, 100)).is_some());
    }

    #[test]
    fn size_is_never_exceeded_under_two_threads() {
        const SIZE: usize = 1000;
        const PER_THREAD: u32 = 200_000;
        let t = table(SIZE);
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            let writers: Vec<_> = (0..2u32)
                .map(|w| {
                    let t = &t;
                    s.spawn(move || {
                        for i in 0..PER_THREAD {
                            let key = t.key(
                                KeyKind::Ticket,
                                &[w.to_be_bytes(), i.to_be_bytes()].concat(),
                            );
                            t.learn(key, if w == 0 { "b1" } else { "b2" });
                            if i % 3 == 0 {
                                t.lookup(&key);
                            }
                        }
                    })
                })
                .collect();
            s.spawn(|| {
                while !done.load(Relaxed) {
                    assert!(t.stats().entries <= SIZE);
                    std::thread::yield_now();
                }
            });
            for w in writers {
                w.join().unwrap();
            }
            done.store(true, Relaxed);
        });
        assert_eq!(t.map.len(), SIZE);
        assert_eq!(t.stats().entries, SIZE);
        assert_eq!(t.stats().evicted, u64::from(2 * PER_THREAD) - SIZE as u64);
        assert!(queue_len(&t) <= t.queue_limit());
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
        assert_eq!(
            t.stats(),
            TableStats {
                entries: 1,
                capacity: 16,
                expired: 0,
                evicted: 0
            }
        );
        // After it expires, the prefix is learned afresh.
        t.advance_clock(EXPIRE * 2);
        t.learn_prefix(prefix, "b2");
        assert_eq!(hit(&t, &prefix), Some("b2".into()));
    }

    #[test]
    fn remove_backend_drops_its_entries_only() {
        let t = table(16);
        for i in 0..4 {
            t.learn(sid(&t, i), "b1");
        }
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
        let t = table(16);
        for i in 0..4 {
            t.learn(sid(&t, i), "b1");
        }
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
        assert!(t.lookup(&sid(&t, 1)).is_some());
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
        assert!(!tmp_path(&path).exists());

        let b = table(100);
        b.learn(b.key(KeyKind::SessionId, b"gone"), "other"); // replaced by load
        b.learn(b.key(KeyKind::SessionId, b"gone2"), "compile2"); // interned at another index
        assert_eq!(b.load(&path).unwrap(), 4);
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
        assert_eq!(b.load(&path).unwrap(), 4);
        for i in 0..10 {
            assert_eq!(b.lookup(&sid(&b, i)).is_some(), i >= 6, "entry {i}");
        }
    }

    #[test]
    fn load_rejects_bad_files_and_leaves_the_table_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t");
        let a = table(100);
        for i in 0..10 {
            a.learn(sid(&a, i), "b1");
        }
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
            let err = b.load(&path).unwrap_err();
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
        let missing = b.load(&dir.path().join("missing")).unwrap_err();
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
        assert_eq!(t.load(&path).unwrap(), 0);
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
                            assert!(t.lookup(&keys[(i % KEYS) as usize]).is_some());
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
}
