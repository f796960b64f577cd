//! `GET /api/connections` and `GET /api/sources`: the open connections, and the
//! busiest client sources of each listener with `per_source` limits.
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use super::{time, Bytes};

/// `GET /api/connections`: the oldest open connections and how many matched.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ConnectionsView {
    /// Connections asked for at most.
    pub limit: usize,
    /// Connections that matched in all.
    pub total: usize,
    /// The oldest of them.
    pub connections: Vec<ConnectionView>,
}

/// Where an open connection is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ConnState {
    /// The backend's side of the TLS handshake has not gone by yet.
    #[default]
    Handshake,
    /// Relaying bytes.
    Relaying,
    /// Shutdown has begun.
    Draining,
}

impl std::fmt::Display for ConnState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ConnState::Handshake => "handshake",
            ConnState::Relaying => "relaying",
            ConnState::Draining => "draining",
        })
    }
}

/// One open connection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConnectionView {
    /// Its id (`crossbar connections kill ID`; never reused while crossbar runs).
    pub id: u64,
    /// Its service.
    pub service: String,
    /// The client's address (after a trusted PROXY header, the one it carried).
    pub client: String,
    /// The backend it is relayed to.
    pub backend: String,
    /// When it was accepted.
    #[serde(with = "time::rfc3339")]
    pub since: SystemTime,
    /// Seconds since.
    pub age_seconds: u64,
    /// Where it is.
    pub state: ConnState,
    /// Bytes written each way so far.
    pub bytes: Bytes,
}

/// `POST /api/connections/kill` and `POST /api/backends/{service}/{backend}/shutdown-sessions`:
/// the connections closed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct KilledView {
    /// Each connection closed, as it was listed.
    pub killed: Vec<ConnectionView>,
}

/// `GET /api/sources`: every listener with `per_source` limits.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SourcesView {
    /// The listeners, by address.
    pub listeners: Vec<ListenerSourcesView>,
}

/// A listener's per-source limits and its busiest sources.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ListenerSourcesView {
    /// The bound listen address.
    pub listener: String,
    /// Its `per_source` limits.
    pub limits: SourceLimitsView,
    /// Sources its table tracks now.
    pub tracked: usize,
    /// The sources with the most open connections, then the most refused.
    pub sources: Vec<SourceView>,
}

/// A listener's `per_source` settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceLimitsView {
    /// Open connections one source may hold (`null`: not limited).
    pub max_connections: Option<u32>,
    /// New connections per second one source may open (`null`: not limited).
    pub rate: Option<u32>,
    /// The token bucket's size.
    pub burst: u32,
    /// Prefix length grouping IPv4 sources.
    pub source_prefix_v4: u8,
    /// Prefix length grouping IPv6 sources.
    pub source_prefix_v6: u8,
    /// Networks neither limited nor tracked.
    pub allow: Vec<String>,
    /// Most sources tracked at once.
    pub table_size: usize,
}

/// One client source of a listener.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SourceView {
    /// The address, `network/prefix`, or `overflow`.
    pub source: String,
    /// Its open connections.
    pub open: u32,
    /// New connections it may open now, to a tenth (`null` without `rate`).
    pub tokens: Option<f64>,
    /// Connections admitted since it was first tracked.
    pub admitted: u64,
    /// Connections refused since it was first tracked.
    pub refused: u64,
}
