//! `GET` and `DELETE /api/tables/{service}`: a stick table's entries, the entry a
//! key or client names, and what a delete or flush removed.
use serde::{Deserialize, Serialize};

use super::TableCounts;

/// `GET /api/tables/{service}`: the most recently used entries, or those a lookup
/// found, and the table's counters.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TableView {
    /// The service.
    pub service: String,
    /// Entries asked for at most.
    pub limit: usize,
    /// What was looked up (absent without `key=` or `client=`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lookup: Option<Lookup>,
    /// The table's counters.
    pub stats: TableCounts,
    /// The entries.
    pub entries: Vec<EntryView>,
}

/// What a table request looked up: a key, or the entry a client falls under.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Lookup {
    /// `key=`: the 16 hex digits `table show` prints.
    Key {
        /// The key hash.
        key: String,
    },
    /// `client=`: the address, and the source prefix it was masked to.
    Client {
        /// The client address.
        client: String,
        /// `address/len` (absent when the service keeps no stick config).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        prefix: Option<String>,
    },
}

impl std::fmt::Display for Lookup {
    /// `key K`, `client A (prefix P)` or `client A`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Lookup::Key { key } => write!(f, "key {key}"),
            Lookup::Client {
                client,
                prefix: Some(p),
            } => write!(f, "client {client} (prefix {p})"),
            Lookup::Client { client, .. } => write!(f, "client {client}"),
        }
    }
}

/// One stick entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryView {
    /// `session_id`, `ticket`, `ticket_prefix`, `psk` or `source`.
    pub kind: String,
    /// The table's keyed hash of the key, 16 hex digits.
    pub key: String,
    /// Its backend; `null` for a ticket prefix seen on several backends.
    pub backend: Option<String>,
    /// Seconds since it was learned.
    pub age_seconds: u64,
    /// Seconds until it expires unless used.
    pub expires_in_seconds: u64,
    /// A source entry's client prefix (`10.2.0.17/32`), when known (absent for
    /// session, ticket and PSK entries, and for source entries loaded from a
    /// state file until the client comes back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<String>,
}

/// `DELETE /api/tables/{service}`: how many entries a flush removed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlushView {
    /// The service.
    pub service: String,
    /// Entries removed.
    pub flushed: usize,
}

/// `DELETE /api/tables/{service}?key=|client=`: the entry removed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeleteView {
    /// The service.
    pub service: String,
    /// What was looked up.
    pub lookup: Lookup,
    /// The entries removed (one).
    pub deleted: Vec<EntryView>,
}
