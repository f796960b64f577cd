//! `GET /api/services`: the process and its last reload, then every service with
//! its listeners, stick table, discovery and backends (`backend.rs`); and what a
//! reader derives from a service (no backend available, the active one, totals).
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use super::{time, BackendView, Balance, FeedbackSettings, Mode, State};

/// `GET /api/services`: the process facts, then every service in config order, then
/// each listener with `per_source` limits and its busiest sources: everything the
/// status page shows (`crossbar status --json` prints it).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ServicesView {
    /// Version, uptime, config file, last reload.
    pub crossbar: ProcessView,
    /// Every service, in config order.
    pub services: Vec<ServiceView>,
    /// The listeners with `per_source` limits, each with its
    /// [`crate::admin::view::PAGE_SOURCES`] sources with the most open connections
    /// (`GET /api/sources` lists more). Absent from a crossbar before it: none.
    #[serde(default)]
    pub per_source: Vec<super::ListenerSourcesView>,
}

/// The running process: version, since when, which file, the last reload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessView {
    /// crossbar's version.
    pub version: String,
    /// When the process started.
    #[serde(with = "time::rfc3339")]
    pub started_at: SystemTime,
    /// Seconds since it started.
    pub uptime_seconds: u64,
    /// The configuration file.
    pub config: String,
    /// The last reload attempted (`null` before the first).
    pub last_reload: Option<ReloadView>,
}

impl Default for ProcessView {
    fn default() -> ProcessView {
        ProcessView {
            version: String::new(),
            started_at: SystemTime::UNIX_EPOCH,
            uptime_seconds: 0,
            config: String::new(),
            last_reload: None,
        }
    }
}

/// A reload's outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReloadView {
    /// When it was attempted.
    #[serde(with = "time::rfc3339")]
    pub at: SystemTime,
    /// Seconds since.
    pub seconds_ago: u64,
    /// Applied (else refused: the running configuration was kept).
    pub ok: bool,
    /// Why it was refused (one line per problem).
    pub error: Option<String>,
    /// What an applied one warned about.
    pub warnings: Vec<String>,
    /// Operator states it kept (`puppet/compile1 drain`).
    #[serde(default)]
    pub kept: Vec<String>,
    /// Operator states it reset, and why.
    #[serde(default)]
    pub reset: Vec<String>,
}

/// One service.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ServiceView {
    /// Its name in the config.
    pub name: String,
    /// `tls` or `tcp`.
    pub mode: Mode,
    /// The balance algorithm.
    pub balance: Balance,
    /// The bound listen addresses (a configured port 0 shows the real port).
    pub listeners: Vec<String>,
    /// The configured listen addresses that read PROXY headers.
    pub proxy_protocol: Vec<ProxyListenerView>,
    /// Its stick table (`null` without `stick:`).
    pub stick_table: Option<StickTableView>,
    /// Connections waiting for a backend slot now.
    pub queued: usize,
    /// Most connections that may wait.
    pub queue_size: usize,
    /// How long a connection may wait in the queue before it is refused
    /// (`queue_timeout`), in milliseconds.
    #[serde(default)]
    pub queue_timeout_ms: u64,
    /// TLS handshakes over its backends.
    pub handshakes: Handshakes,
    /// For `balance: first`, the backend new connections go to now.
    pub active_backend: Option<String>,
    /// Its DNS discovery (`null` without `discover:`).
    pub discovery: Option<DiscoveryView>,
    /// Its load feedback settings (`null` without `feedback:`).
    pub feedback: Option<FeedbackSettings>,
    /// Its backends, in config order (discovered ones after).
    pub backends: Vec<BackendView>,
}

/// A listen address that reads PROXY headers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProxyListenerView {
    /// The configured listen address.
    pub listen: String,
    /// The networks whose PROXY headers are trusted.
    pub accept_from: Vec<String>,
    /// A connection from there without a header is refused.
    pub required: bool,
    /// All of it in a line, as the page and the CLI show it.
    pub text: String,
}

/// A stick table's counters plus the service's lookups.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StickTableView {
    /// Entries, capacity, expired and evicted.
    #[serde(flatten)]
    pub counts: TableCounts,
    /// Lookups that found an entry, and that did not.
    pub lookups: Lookups,
    /// `hit / (hit + miss)`; `null` before the first lookup.
    pub hit_ratio: Option<f64>,
}

/// A stick table's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableCounts {
    /// Entries now.
    pub entries: usize,
    /// Its `size`.
    pub capacity: usize,
    /// Removed because they expired, since start.
    pub expired: u64,
    /// Removed to make room, since start.
    pub evicted: u64,
}

/// Stick lookups over every key kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lookups {
    /// Found an entry.
    pub hit: u64,
    /// Found none.
    pub miss: u64,
}

/// Resumed and full TLS handshakes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Handshakes {
    /// The backend resumed the session.
    pub resumed: u64,
    /// A full handshake.
    pub full: u64,
}

/// Bytes each way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bytes {
    /// From the client to the backend.
    pub client_to_server: u64,
    /// From the backend to the client.
    pub server_to_client: u64,
}

/// The last lookups of a service's `discover` name.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DiscoveryView {
    /// `srv` or `host`.
    pub kind: String,
    /// The name looked up.
    pub name: String,
    /// When it last gave a usable answer (`null`: never).
    #[serde(with = "time::rfc3339_opt")]
    pub last_resolved: Option<SystemTime>,
    /// When it was last looked up.
    #[serde(with = "time::rfc3339_opt")]
    pub last_attempt: Option<SystemTime>,
    /// The last lookup failed: the backends are the last good answer's.
    pub stale: bool,
    /// Why the last lookup failed.
    pub error: Option<String>,
    /// Backends the last good answer gave.
    pub backends: usize,
    /// Records of that answer beyond `max_backends`.
    pub dropped: usize,
    /// Milliseconds from the last lookup to the next.
    pub next_in_ms: Option<u64>,
    /// Records of the last answer left out because they name crossbar itself.
    #[serde(default)]
    pub own: Vec<String>,
    /// Since when lookups fail (while stale).
    #[serde(default, with = "time::rfc3339_opt")]
    pub stale_since: Option<SystemTime>,
    /// Failed lookups in a row (while stale).
    #[serde(default)]
    pub failures: u32,
    /// Backends from this name in the pool now (those that left DNS and still
    /// drain included); 0 with `last_resolved` null: none has ever been resolved.
    #[serde(default)]
    pub serving: usize,
}

impl DiscoveryView {
    /// While a lookup fails, what serves meanwhile, in words.
    pub fn meanwhile(&self) -> &'static str {
        match self.serving {
            0 => "no backend from DNS serves",
            _ => "the last good set serves on",
        }
    }

    /// The set in words, as the CLI and the page say it (`ago` is the age of
    /// the last answer): `3 backends, resolved 12s ago`; before any answer since
    /// the start (or since `discover` changed), what serves instead: `2 backends
    /// of the last good set (the state file's, or the name before), none resolved
    /// yet` (the last answer's count, 0, would contradict them).
    pub fn set_text(&self, ago: &str) -> String {
        let plural = |n: usize| if n == 1 { "" } else { "s" };
        match (self.last_resolved, self.serving) {
            (Some(_), _) => format!("{} backend{}, resolved {ago}", self.backends, plural(self.backends)),
            (None, 0) => "no backend yet, never resolved".to_string(),
            (None, n) => format!(
                "{n} backend{} of the last good set (the state file's, or the name before), none resolved yet",
                plural(n)
            ),
        }
    }
}

/// A service's backends summed, as the page's Total row shows them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    /// Backends `up`.
    pub up: usize,
    /// Backends.
    pub backends: usize,
    /// Weights.
    pub weight: u64,
    /// Open connections.
    pub active_connections: u64,
    /// Connections relayed.
    pub connections_total: u64,
    /// Bytes each way.
    pub bytes: Bytes,
    /// Failed connects.
    pub connect_errors: u64,
    /// Failed checks.
    pub check_failures: u64,
    /// Handshakes.
    pub handshakes: Handshakes,
}

impl ServiceView {
    /// Its queue in words, as the CLI and the page say it: `queue 2/1024 waiting
    /// (up to 10s each)`, or `no queue` with `queue_size: 0`.
    pub fn queue_text(&self) -> String {
        if self.queue_size == 0 {
            return "no queue (queue_size 0: a connection finding every backend at its limit is refused)".into();
        }
        format!(
            "queue {}/{} waiting (up to {} each)",
            self.queued,
            self.queue_size,
            crate::admin::human::human_secs(self.queue_timeout_ms.div_ceil(1000))
        )
    }

    /// No backend takes new connections: every new client is refused.
    pub fn none_available(&self) -> bool {
        !self.backends.iter().any(BackendView::takes_new)
    }

    /// `b` is the backend `balance: first` sends new connections to now.
    pub fn is_active(&self, b: &BackendView) -> bool {
        self.active_backend.as_deref() == Some(b.name.as_str())
    }

    /// Its backends summed.
    pub fn totals(&self) -> Totals {
        let mut t = Totals {
            backends: self.backends.len(),
            ..Totals::default()
        };
        for b in &self.backends {
            t.up += usize::from(b.state == State::Up);
            t.weight += u64::from(b.weight);
            t.active_connections += u64::from(b.active_connections);
            t.connections_total += b.connections_total;
            t.bytes.client_to_server += b.bytes.client_to_server;
            t.bytes.server_to_client += b.bytes.server_to_client;
            t.connect_errors += b.connect_errors;
            t.check_failures += b.check_failures;
            t.handshakes.resumed += b.handshakes.resumed;
            t.handshakes.full += b.handshakes.full;
        }
        t
    }
}
