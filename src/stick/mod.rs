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
//! Next to the map sit FIFOs of `(hash, generation)` records, each behind its own
//! `Mutex`, one live record per entry in insertion order. A key's record always goes
//! to the same queue, chosen by its (seeded) bucket hash. A table below 8,192 entries
//! has one queue, so its order is exact over the whole table; a larger one has one
//! per 4,096 entries, at most 4 per CPU (a power of two), and each evicts its own
//! oldest: an approximation of the table's least recently used that only strays by
//! the difference between queues' fill (~1 % at 64k entries in 8 queues, measured by
//! a unit test). A lookup hit sets the entry's
//! *referenced* bit (the "used after the record was queued" test, exact even within
//! one second of the coarse clock). When the table is full, `learn` pops the front:
//! a stale record (entry gone, or re-inserted with another generation) is dropped; a
//! referenced entry has its bit cleared and is re-queued at the back (at most
//! `MAX_SECOND_CHANCES` times per insert); otherwise the entry is evicted. Work per
//! insert is bounded by that constant plus the stale records met, and stale records
//! are bounded by compaction (`QUEUE_SLACK_DIVISOR`).
//!
//! # Segments (probation, protected)
//!
//! Each queue is a segmented LRU: an entry a resumption proved (the server accepted
//! the session it names, or the client behind the address resumed) is flagged
//! *protected*, and a full table evicts from the probation queue first, from the
//! protected queue only when probation holds nothing evictable. A flood of new,
//! unproven entries therefore only churns probation. The protected segment holds
//! at most `PROTECTED_PERCENT` of a queue's places; beyond, its oldest entry is
//! demoted to probation. Protecting sets a flag (no lock); the record moves to the
//! protected queue when eviction meets it at the probation front.
//!
//! # Concurrency
//!
//! `lookup` takes only a dashmap shard read lock (refreshing uses atomics in the
//! entry) and reads backend names through an `ArcSwap` snapshot, so concurrent
//! lookups never wait for each other or for a global lock. Inserting a *new* key
//! (and evicting) happens under its queue's mutex, so learners of keys of different
//! queues don't wait for each other; the table never holds more than `size`
//! entries because a place is taken (`count` raised by compare-and-swap) before the
//! insert, after evicting from the key's queue, or, when that one is empty, from
//! another queue that is not locked at that moment (never waited for: two learners
//! can't wait on each other). Lock order is always queue, then shard; all queues are
//! locked only in index order (`clear`, loading a state file).
//!
//! # Memory
//!
//! A map slot is 24 bytes plus one control byte; hashbrown keeps its tables between
//! 44% and 87% full (power-of-two growth), so the map costs ~28-55 bytes per entry,
//! and the queue 12 bytes per record: ~40-70 bytes per entry depending on where
//! `size` falls. Measured by the `memory_per_entry` test: ~65 bytes per entry at
//! 1M entries on 8 shards (an unlucky spot: every shard just past a doubling).

mod entry;
mod policy;
mod state_file;
mod table;

use std::sync::Arc;
use std::time::Duration;

pub use policy::{
    learn_when, source_key, BackendIndex, LearnWhen, Placement, StickMetrics, Sticking,
    RESUME_HINT_TTL,
};
pub use state_file::StateFileError;
pub(crate) use state_file::{read_bounded, write_atomically};
pub use table::StickTable;

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
    /// A source entry's client prefix (`10.2.0.17/32`), when it is known.
    pub client: Option<String>,
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
    /// Of `evicted`, those of the protected segment (entries a resumption proved;
    /// evicted only when no unproven entry was left to evict).
    pub evicted_protected: u64,
}
