//! Stick tables: which backend holds a TLS session, keyed by hashed session state.
//!
//! STUB: the types and signatures are the contract; the stick-table work fills in the bodies.
use std::sync::Arc;
use std::time::Duration;

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

/// A concurrent stick table.
#[derive(Debug)]
pub struct StickTable {
    params: TableParams,
}

impl StickTable {
    /// An empty table with a fresh random hash key.
    pub fn new(params: TableParams) -> StickTable {
        StickTable { params }
    }

    /// The fixed-size key for raw key bytes of a kind.
    pub fn key(&self, kind: KeyKind, raw: &[u8]) -> StickKey {
        let _ = raw;
        StickKey { kind, hash: 0 }
    }

    /// The backend an unexpired entry points at (refreshing it), if any.
    pub fn lookup(&self, _key: &StickKey) -> Option<Arc<str>> {
        None
    }

    /// Record that `key` lives on `backend` (insert or overwrite), evicting if full.
    pub fn learn(&self, _key: StickKey, _backend: &str) {}

    /// Record a ticket-key prefix seen on `backend`; a prefix seen on two backends
    /// is marked shared and no longer routes.
    pub fn learn_prefix(&self, _key: StickKey, _backend: &str) {}

    /// Remove one entry.
    pub fn forget(&self, _key: &StickKey) {}

    /// Remove every entry pointing at `backend` (it left the config).
    pub fn remove_backend(&self, _backend: &str) -> usize {
        0
    }

    /// Remove expired entries; returns how many. Called by one sweeper task per table.
    pub fn sweep(&self) -> usize {
        0
    }

    /// Remove everything.
    pub fn clear(&self) {}

    /// Counters for metrics.
    pub fn stats(&self) -> TableStats {
        TableStats {
            capacity: self.params.size,
            ..TableStats::default()
        }
    }

    /// Up to `limit` entries, most recently used first.
    pub fn entries(&self, _limit: usize) -> Vec<EntryView> {
        Vec::new()
    }

    /// Save the table atomically (temp file + rename).
    pub fn save(&self, _path: &std::path::Path) -> std::io::Result<usize> {
        Ok(0)
    }

    /// Load a saved table, keeping remaining lifetimes; returns entries loaded.
    pub fn load(&self, _path: &std::path::Path) -> std::io::Result<usize> {
        Ok(0)
    }
}
