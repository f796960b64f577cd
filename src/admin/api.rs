//! The admin API's resources as JSON: services and backends, stick tables, backend
//! state changes and reload. Pure functions of the running [`Server`], so the HTTP
//! layer in `mod.rs` only routes and authorizes.
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::SystemTime;

use serde_json::{json, Value};
use tokio::sync::Semaphore;

use crate::balance::{AdminState, Backend, MAX_WEIGHT};
use crate::config::{Balance, Mode};
use crate::server::Server;
use crate::service::Service;

/// Entries `GET /api/tables/{service}` returns without `?limit=`.
pub const DEFAULT_TABLE_LIMIT: usize = 1000;
/// Connections `GET /api/connections` returns without `?limit=` (the oldest).
pub const DEFAULT_CONNECTIONS_LIMIT: usize = 100;
/// Largest `?limit=`: the walk keeps a heap of this size and the answer is ~150 bytes
/// an entry, so ~1.5 MB of JSON: enough to debug, small enough that an
/// unauthenticated reader can't make crossbar build tens of MB per request.
pub const MAX_TABLE_LIMIT: usize = 10_000;

/// An API call that cannot be answered with 200.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// No such service.
    #[error("unknown service {0:?}")]
    UnknownService(String),
    /// No such backend in the service.
    #[error("unknown backend {backend:?} in service {service:?}")]
    UnknownBackend {
        /// Service.
        service: String,
        /// Backend.
        backend: String,
    },
    /// The service has no stick table.
    #[error("service {0:?} has no stick table (no `stick:` in its config)")]
    NoTable(String),
    /// A query parameter is malformed or out of range.
    #[error("bad query: {0}")]
    BadQuery(String),
    /// No stick entry matched the key or client to delete.
    #[error("no stick entry of service {service:?} for {what}")]
    NoEntry {
        /// Service.
        service: String,
        /// `key K` or `client A (prefix P)`.
        what: String,
    },
    /// Draining or disabling this backend would leave its service with no backend
    /// available, and `force` was not given.
    #[error("{backend} is the last available backend of service {service:?}{others}: to {action} it leaves no backend for new connections (every new client is refused: no_backend); add force=true to do it anyway (crossbar backend {action} --force)")]
    LastBackend {
        /// Service.
        service: String,
        /// Backend.
        backend: String,
        /// `drain` or `disable`.
        action: &'static str,
        /// The other backends and their states, `" (others: b2 down)"`, or `""`.
        others: String,
    },
    /// Setting this backend's weight to 0 would leave its service with no backend
    /// for new connections, and `force` was not given.
    #[error("{backend} is the last backend of service {service:?} taking new connections{others}: weight 0 leaves none for new connections (every new client is refused: no_backend; sticky hits still reach it); add force=true to do it anyway (crossbar backend weight {service}/{backend} 0 --force)")]
    LastWeighted {
        /// Service.
        service: String,
        /// Backend.
        backend: String,
        /// The other backends and their states, `" (others: b2 drain)"`, or `""`.
        others: String,
    },
    /// The configuration file could not be reloaded; the old one keeps running.
    #[error("reload failed, keeping the running configuration: {0}")]
    ReloadFailed(String),
    /// The answer could not be built (a worker thread failed).
    #[error("internal error: {0}")]
    Internal(String),
}

impl ApiError {
    /// The HTTP status for this error.
    pub fn status(&self) -> hyper::StatusCode {
        use hyper::StatusCode as S;
        match self {
            ApiError::UnknownService(_)
            | ApiError::UnknownBackend { .. }
            | ApiError::NoTable(_)
            | ApiError::NoEntry { .. } => S::NOT_FOUND,
            ApiError::BadQuery(_) => S::BAD_REQUEST,
            ApiError::LastBackend { .. } | ApiError::LastWeighted { .. } => S::CONFLICT,
            ApiError::ReloadFailed(_) => S::UNPROCESSABLE_ENTITY,
            ApiError::Internal(_) => S::INTERNAL_SERVER_ERROR,
        }
    }
}

/// A backend state change requested by `POST /api/backends/{service}/{backend}/{action}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// No new connections; open ones continue; sticky entries to it are ignored.
    Drain,
    /// Back in rotation (also ends a manual-failback standby).
    Enable,
    /// Maintenance: no new connections.
    Disable,
}

impl Action {
    /// Parse the last path segment.
    pub fn parse(s: &str) -> Option<Action> {
        match s {
            "drain" => Some(Action::Drain),
            "enable" => Some(Action::Enable),
            "disable" => Some(Action::Disable),
            _ => None,
        }
    }

    /// The path segment (`drain`, `enable`, `disable`).
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Drain => "drain",
            Action::Enable => "enable",
            Action::Disable => "disable",
        }
    }

    fn state(self) -> AdminState {
        match self {
            Action::Drain => AdminState::Drain,
            Action::Enable => AdminState::Enabled,
            Action::Disable => AdminState::Disabled,
        }
    }
}

fn mode_name(m: Mode) -> &'static str {
    match m {
        Mode::Tls => "tls",
        Mode::Tcp => "tcp",
    }
}

fn balance_name(b: Balance) -> &'static str {
    match b {
        Balance::RoundRobin => "roundrobin",
        Balance::LeastConn => "leastconn",
        Balance::First => "first",
        Balance::Source => "source",
    }
}

fn service(server: &Server, name: &str) -> Result<Arc<Service>, ApiError> {
    server
        .service(name)
        .ok_or_else(|| ApiError::UnknownService(name.to_string()))
}

/// The listen addresses of `svc` that read PROXY headers, with from where.
fn proxy_listeners(svc: &Service) -> Vec<Value> {
    svc.config
        .listen
        .iter()
        .filter_map(|l| {
            let p = l.proxy_protocol.as_ref()?;
            let from: Vec<String> = p.accept_from.iter().map(|n| n.to_string()).collect();
            Some(json!({
                "listen": l.addr.to_string(),
                "accept_from": from,
                "required": p.required,
                "text": format!("{} {p}", l.addr),
            }))
        })
        .collect()
}

/// `GET /api/services`: every service with its listeners and backends.
pub fn services(server: &Server) -> Value {
    let list: Vec<Value> = server
        .services()
        .iter()
        .map(|svc| {
            let backends: Vec<Value> = svc.pool.backends.iter().map(|b| backend_json(b)).collect();
            let listeners: Vec<String> = server
                .local_addrs(svc.name())
                .iter()
                .map(|a| a.to_string())
                .collect();
            json!({
                "name": svc.name(),
                "mode": mode_name(svc.config.mode),
                "balance": balance_name(svc.config.balance),
                "listeners": listeners,
                "proxy_protocol": proxy_listeners(svc),
                "stick_table": svc.table.as_ref().map(|t| table_json(svc, &t.stats())),
                "queued": svc.pool.queued(),
                "queue_size": svc.config.queue_size,
                "handshakes": handshakes(&svc.pool.backends),
                "active_backend": active_backend(svc),
                "discovery": svc.discovery.as_ref().map(|d| d.snapshot()),
                "backends": backends,
            })
        })
        .collect();
    json!({ "crossbar": process_json(server), "services": list })
}

/// For `balance: first`, the backend new connections go to now (the active CA
/// of a `puppetca` pool); `null` for other algorithms or when none is available.
fn active_backend(svc: &Service) -> Option<&str> {
    (svc.config.balance == Balance::First)
        .then(|| svc.pool.first_choice())
        .flatten()
        .map(|b| &*b.name)
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

fn seconds_since(t: SystemTime) -> u64 {
    SystemTime::now()
        .duration_since(t)
        .map_or(0, |d| d.as_secs())
}

/// Version, uptime, the config file and the last reload's outcome.
fn process_json(server: &Server) -> Value {
    let p = &server.metrics().process;
    let reload = p.last_reload().map(|r| {
        json!({
            "at": rfc3339(r.at),
            "seconds_ago": seconds_since(r.at),
            "ok": r.error.is_none(),
            "error": r.error,
            "warnings": r.warnings,
        })
    });
    json!({
        "version": env!("CARGO_PKG_VERSION"),
        "started_at": rfc3339(p.started_at()),
        "uptime_seconds": p.uptime().as_secs(),
        "config": server.config().source.display().to_string(),
        "last_reload": reload,
    })
}

fn backend_json(b: &Backend) -> Value {
    let (m, live) = (&b.metrics, &b.metrics.live);
    let since = live.state_since();
    let check = live.last_check().map(|c| {
        json!({
            "at": rfc3339(c.at),
            "seconds_ago": seconds_since(c.at),
            "result": if c.error.is_none() { "ok" } else { "fail" },
            "error": c.error,
        })
    });
    json!({
        "name": &*b.name,
        "address": b.config.address.to_string(),
        "source": b.config.from_dns.as_ref().map_or("config", |_| "dns"),
        "dns_name": b.config.from_dns,
        "state": b.state_name(),
        "state_since": rfc3339(since),
        "state_seconds": seconds_since(since),
        "available": b.is_available(),
        "healthy": b.is_healthy(),
        "active_connections": b.active(),
        "peak_connections": live.peak(),
        "connections_total": m.connections.get(),
        "weight": b.weight(),
        "configured_weight": b.config.weight,
        "backup": b.config.backup,
        "bytes": {
            "client_to_server": m.bytes_c2s.get(),
            "server_to_client": m.bytes_s2c.get(),
        },
        "connect_errors": m.connect_errors.get(),
        "check": crate::health::check_label(&b.config.health.check),
        "check_failures": m.check_fail.get(),
        "last_check": check,
        "handshakes": { "resumed": m.resumed.get(), "full": m.full.get() },
    })
}

/// Resumed and full TLS handshakes over a service's backends.
fn handshakes(backends: &[Arc<Backend>]) -> Value {
    let (resumed, full) = backends.iter().fold((0, 0), |(r, f), b| {
        (r + b.metrics.resumed.get(), f + b.metrics.full.get())
    });
    json!({ "resumed": resumed, "full": full })
}

/// A stick table's counters plus the service's lookup hit ratio (`null` before
/// the first lookup).
fn table_json(svc: &Service, s: &crate::stick::TableStats) -> Value {
    let mut v = stats(s);
    let (hits, misses) = svc.metrics.lookup_totals();
    let total = hits + misses;
    v["lookups"] = json!({ "hit": hits, "miss": misses });
    v["hit_ratio"] = json!((total > 0).then(|| hits as f64 / total as f64));
    v
}

fn stats(s: &crate::stick::TableStats) -> Value {
    json!({
        "entries": s.entries,
        "capacity": s.capacity,
        "expired": s.expired,
        "evicted": s.evicted,
    })
}

/// The parameters of a query string, `k=v` or bare `k` (value ""), each known
/// (one of `allowed`) and given once: a typo is refused, not silently ignored
/// (on a DELETE, ignoring it would flush the whole table).
fn params<'q>(
    query: Option<&'q str>,
    allowed: &[&str],
) -> Result<Vec<(&'q str, &'q str)>, ApiError> {
    let mut seen: Vec<(&str, &str)> = Vec::new();
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if !allowed.contains(&k) {
            return Err(ApiError::BadQuery(format!(
                "unknown parameter {k:?} (here: {})",
                allowed.join(", ")
            )));
        }
        if seen.iter().any(|(s, _)| *s == k) {
            return Err(ApiError::BadQuery(format!("{k:?} given twice")));
        }
        seen.push((k, v));
    }
    Ok(seen)
}

/// `limit=N`: an integer in 1..=`max`.
fn limit_param(v: &str, max: usize) -> Result<usize, ApiError> {
    v.parse::<usize>()
        .ok()
        .filter(|n| (1..=max).contains(n))
        .ok_or_else(|| {
            ApiError::BadQuery(format!("limit must be an integer in 1..={max}, got {v:?}"))
        })
}

/// `client=ADDR`: an IP address (a port after it is refused: entries and
/// connections are looked up by address).
fn client_param(v: &str) -> Result<IpAddr, ApiError> {
    v.parse::<IpAddr>()
        .map(|ip| ip.to_canonical())
        .map_err(|_| ApiError::BadQuery(format!("client must be an IP address, got {v:?}")))
}

/// Which stick entries a table request is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick {
    /// The entry with this key hash (the 16 hex digits `table show` prints).
    Key(u64),
    /// The source entry a client address falls under (`source` stickiness or the
    /// resume hint); session, ticket and PSK entries keep no client address.
    Client(IpAddr),
}

/// `GET /api/tables/{service}`'s parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableQuery {
    /// Entries to return at most.
    pub limit: usize,
    /// Only these entries (else the most recently used).
    pub pick: Option<Pick>,
}

/// Parse `key=HEX` or `client=ADDR` (at most one of them).
fn pick(params: &[(&str, &str)]) -> Result<Option<Pick>, ApiError> {
    let mut pick = None;
    for (k, v) in params {
        let p = match *k {
            "key" => u64::from_str_radix(v, 16)
                .ok()
                .filter(|_| v.len() == 16 && v.bytes().all(|b| b.is_ascii_hexdigit()))
                .map(Pick::Key)
                .ok_or_else(|| {
                    ApiError::BadQuery(format!(
                        "key must be the 16 hex digits `table show` prints, got {v:?}"
                    ))
                })?,
            "client" => Pick::Client(client_param(v)?),
            _ => continue,
        };
        if pick.replace(p).is_some() {
            return Err(ApiError::BadQuery("give key or client, not both".into()));
        }
    }
    Ok(pick)
}

/// Parse `GET /api/tables/{service}`'s query: `limit=N`, and `key=HEX` or
/// `client=ADDR`; other parameters are refused.
pub fn table_query(query: Option<&str>) -> Result<TableQuery, ApiError> {
    let params = params(query, &["limit", "key", "client"])?;
    let mut limit = DEFAULT_TABLE_LIMIT;
    if let Some((_, v)) = params.iter().find(|(k, _)| *k == "limit") {
        limit = limit_param(v, MAX_TABLE_LIMIT)?;
    }
    Ok(TableQuery {
        limit,
        pick: pick(&params)?,
    })
}

/// Parse `DELETE /api/tables/{service}`'s query: nothing (flush the table), or
/// `key=HEX` or `client=ADDR` (those entries only).
pub fn delete_query(query: Option<&str>) -> Result<Option<Pick>, ApiError> {
    pick(&params(query, &["key", "client"])?)
}

fn entry_json(e: &crate::stick::EntryView) -> Value {
    json!({
        "kind": e.kind.as_str(),
        "key": e.hash_hex,
        "backend": e.backend.as_deref(),
        "age_seconds": e.age.as_secs(),
        "expires_in_seconds": e.expires_in.as_secs(),
    })
}

/// The entry a pick names, if any, and a description of what was asked
/// (`key K` or `client A (prefix P)`); `remove` takes it out of the table.
fn picked(
    svc: &Service,
    table: &crate::stick::StickTable,
    pick: Pick,
    remove: bool,
) -> (Option<crate::stick::EntryView>, Value) {
    let (hash, asked) = match pick {
        Pick::Key(hash) => (hash, json!({ "key": format!("{hash:016x}") })),
        Pick::Client(ip) => match svc.config.stick.as_ref() {
            Some(cfg) => {
                let (key, prefix) = crate::stick::source_key(table, cfg, ip);
                (
                    key.hash,
                    json!({ "client": ip.to_string(), "prefix": prefix }),
                )
            }
            None => return (None, json!({ "client": ip.to_string() })),
        },
    };
    let found = if remove {
        table.remove(hash)
    } else {
        table.entry(hash)
    };
    (found, asked)
}

/// `GET /api/tables/{service}`: the most recently used entries, or those a pick
/// names, and the table's counters.
pub fn table(server: &Server, name: &str, q: TableQuery) -> Result<Value, ApiError> {
    let svc = service(server, name)?;
    let table = svc
        .table
        .as_ref()
        .ok_or_else(|| ApiError::NoTable(name.to_string()))?;
    let (entries, asked): (Vec<Value>, Value) = match q.pick {
        None => (
            table.entries(q.limit).iter().map(entry_json).collect(),
            Value::Null,
        ),
        Some(p) => {
            let (found, asked) = picked(&svc, table, p, false);
            (found.iter().map(entry_json).collect(), asked)
        }
    };
    let mut v = json!({
        "service": name,
        "limit": q.limit,
        "stats": stats(&table.stats()),
        "entries": entries,
    });
    if !asked.is_null() {
        v["lookup"] = asked;
    }
    Ok(v)
}

/// Table dumps built at a time: each walks the whole table and holds up to
/// [`MAX_TABLE_LIMIT`] entries; more readers wait their turn.
static TABLE_DUMPS: Semaphore = Semaphore::const_new(1);

/// [`table`] as JSON text, built on the blocking pool (never on a runtime worker
/// that relays connections), one dump at a time.
pub async fn table_dump(
    server: Arc<Server>,
    name: String,
    q: TableQuery,
) -> Result<String, ApiError> {
    dump(move || table(&server, &name, q)).await
}

/// Build a walk's answer as JSON text on the blocking pool, one walk at a time
/// ([`TABLE_DUMPS`]).
async fn dump(
    walk: impl FnOnce() -> Result<Value, ApiError> + Send + 'static,
) -> Result<String, ApiError> {
    let _turn = TABLE_DUMPS
        .acquire()
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    tokio::task::spawn_blocking(move || {
        walk().map(|v| {
            let mut body = v.to_string();
            body.push('\n');
            body
        })
    })
    .await
    .map_err(|e| ApiError::Internal(format!("dump: {e}")))?
}

/// `DELETE /api/tables/{service}`: remove every entry, or (with a pick) the one
/// it names; a pick that names nothing is [`ApiError::NoEntry`].
pub fn delete(server: &Server, name: &str, pick: Option<Pick>) -> Result<Value, ApiError> {
    let svc = service(server, name)?;
    let table = svc
        .table
        .as_ref()
        .ok_or_else(|| ApiError::NoTable(name.to_string()))?;
    let Some(pick) = pick else {
        return Ok(flush(name, table));
    };
    let (found, asked) = picked(&svc, table, pick, true);
    let Some(e) = found else {
        let what = match (&asked["key"], &asked["client"], &asked["prefix"]) {
            (Value::String(k), _, _) => format!("key {k}"),
            (_, Value::String(c), Value::String(p)) => format!("client {c} (prefix {p})"),
            (_, Value::String(c), _) => format!("client {c}"),
            _ => asked.to_string(),
        };
        return Err(ApiError::NoEntry {
            service: name.to_string(),
            what,
        });
    };
    tracing::info!(
        service = name,
        kind = e.kind.as_str(),
        key = e.hash_hex,
        backend = e.backend.as_deref(),
        "admin: stick entry deleted"
    );
    Ok(json!({ "service": name, "lookup": asked, "deleted": [entry_json(&e)] }))
}

/// Remove every entry of `table`.
fn flush(name: &str, table: &crate::stick::StickTable) -> Value {
    let before = table.stats().entries;
    table.clear();
    tracing::info!(
        service = name,
        entries = before,
        "admin: stick table flushed"
    );
    json!({ "service": name, "flushed": before })
}

/// Parse `POST /api/backends/...`'s query: nothing, or `force` (`force=true`,
/// `force=1`; `force=false` and `force=0` are the default).
pub fn force_query(query: Option<&str>) -> Result<bool, ApiError> {
    match params(query, &["force"])?.first() {
        None => Ok(false),
        Some((_, "" | "true" | "1")) => Ok(true),
        Some((_, "false" | "0")) => Ok(false),
        Some((_, v)) => Err(ApiError::BadQuery(format!(
            "force must be true or false, got {v:?}"
        ))),
    }
}

/// Backend state changes, one at a time: two operators draining the last two
/// backends at once must not both pass the last-backend check.
static BACKEND_CHANGES: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// `backend` of `svc`, or the API's 404 naming both.
fn backend_of<'a>(svc: &'a Service, backend: &str) -> Result<&'a Arc<Backend>, ApiError> {
    svc.pool
        .get(backend)
        .ok_or_else(|| ApiError::UnknownBackend {
            service: svc.name().to_string(),
            backend: backend.to_string(),
        })
}

/// `POST /api/backends/{service}/{backend}/{action}`: set the operator state.
/// Draining or disabling the last available backend of the service is refused
/// ([`ApiError::LastBackend`]) unless `force`; enabling never is.
pub fn set_backend(
    server: &Server,
    name: &str,
    backend: &str,
    action: Action,
    force: bool,
) -> Result<Value, ApiError> {
    let svc = service(server, name)?;
    let b = backend_of(&svc, backend)?;
    let _one_at_a_time = BACKEND_CHANGES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if !force && action != Action::Enable {
        last_available(&svc, b, action)?;
    }
    b.set_admin_state(action.state());
    tracing::info!(
        service = name,
        backend,
        state = b.state_name(),
        "admin: backend state set"
    );
    Ok(json!({
        "service": name,
        "backend": backend,
        "state": b.state_name(),
        "active_connections": b.active(),
    }))
}

/// Refuse to take `b` out of rotation when it is the only backend left that takes
/// new connections (available, weight above 0).
fn last_available(svc: &Service, b: &Backend, action: Action) -> Result<(), ApiError> {
    match others_out(svc, b) {
        None => Ok(()),
        Some(others) => Err(ApiError::LastBackend {
            service: svc.name().to_string(),
            backend: b.name.to_string(),
            action: action.as_str(),
            others,
        }),
    }
}

/// `None` when `b` takes no new connections or another backend of `svc` does;
/// else the other backends and why each takes none: `" (others: b2 down)"`, or
/// `" (its only backend)"`.
fn others_out(svc: &Service, b: &Backend) -> Option<String> {
    let others: Vec<&Arc<Backend>> = svc
        .pool
        .backends
        .iter()
        .filter(|o| o.name != b.name)
        .collect();
    if !b.takes_new() || others.iter().any(|o| o.takes_new()) {
        return None;
    }
    let list: Vec<String> = others
        .iter()
        .map(|o| match o.state_name() {
            "up" => format!("{} up at weight 0", o.name),
            state => format!("{} {state}", o.name),
        })
        .collect();
    Some(if list.is_empty() {
        " (its only backend)".to_string()
    } else {
        format!(" (others: {})", list.join(", "))
    })
}

/// A weight asked of `POST /api/backends/{service}/{backend}/weight`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightAsk {
    /// This weight, 0..=[`MAX_WEIGHT`].
    Absolute(u32),
    /// This percentage of the configured weight (HAProxy's `set weight ... 50%`).
    Percent(u32),
}

impl WeightAsk {
    /// The weight this asks of a backend configured with `configured`: a percentage
    /// rounds to the nearest integer, and one above 0 never gives 0 (`1%` must not
    /// stop a backend's traffic by accident); above [`MAX_WEIGHT`] is refused.
    pub fn resolve(self, configured: u32) -> Result<u32, ApiError> {
        let w = match self {
            WeightAsk::Absolute(w) => u64::from(w),
            WeightAsk::Percent(0) => 0,
            WeightAsk::Percent(p) => ((u64::from(configured) * u64::from(p) + 50) / 100).max(1),
        };
        u32::try_from(w)
            .ok()
            .filter(|w| *w <= MAX_WEIGHT)
            .ok_or_else(|| {
                ApiError::BadQuery(format!(
                    "weight must be 0..={MAX_WEIGHT}; {self} of the configured weight {configured} is {w}"
                ))
            })
    }
}

impl std::fmt::Display for WeightAsk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WeightAsk::Absolute(w) => write!(f, "{w}"),
            WeightAsk::Percent(p) => write!(f, "{p}%"),
        }
    }
}

/// Parse a weight as the CLI and the API take it: `N` (0..=256) or `N%` (of the
/// configured weight; `%25` is the URL-encoded `%`).
pub fn parse_weight(v: &str) -> Result<WeightAsk, ApiError> {
    let bad = |why: &str| {
        ApiError::BadQuery(format!(
            "weight must be an integer 0..={MAX_WEIGHT} or a percentage of the configured weight (50%){why}, got {v:?}"
        ))
    };
    let (digits, percent) = match v.strip_suffix("%25").or_else(|| v.strip_suffix('%')) {
        Some(d) => (d, true),
        None => (v, false),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad(""));
    }
    let n: u32 = digits.parse().map_err(|_| bad(": out of range"))?;
    match (percent, n) {
        (true, _) => Ok(WeightAsk::Percent(n)),
        (false, n) if n <= MAX_WEIGHT => Ok(WeightAsk::Absolute(n)),
        (false, _) => Err(bad(": out of range")),
    }
}

/// Parse `POST /api/backends/{service}/{backend}/weight`'s query: `weight=N` or
/// `weight=N%` (required) and `force`.
pub fn weight_query(query: Option<&str>) -> Result<(WeightAsk, bool), ApiError> {
    let params = params(query, &["weight", "force"])?;
    let Some((_, v)) = params.iter().find(|(k, _)| *k == "weight") else {
        return Err(ApiError::BadQuery(format!(
            "give the new weight: weight=N (0..={MAX_WEIGHT}) or weight=N%25 (of the configured weight)"
        )));
    };
    let force = match params.iter().find(|(k, _)| *k == "force") {
        None => false,
        Some((_, "" | "true" | "1")) => true,
        Some((_, "false" | "0")) => false,
        Some((_, v)) => {
            return Err(ApiError::BadQuery(format!(
                "force must be true or false, got {v:?}"
            )))
        }
    };
    Ok((parse_weight(v)?, force))
}

/// `POST /api/backends/{service}/{backend}/weight`: set the weight new connections
/// are balanced by, until the next reload or restart. Weight 0 on the last backend
/// that takes new connections is refused ([`ApiError::LastWeighted`]) unless `force`.
pub fn set_weight(
    server: &Server,
    name: &str,
    backend: &str,
    ask: WeightAsk,
    force: bool,
) -> Result<Value, ApiError> {
    let svc = service(server, name)?;
    let b = backend_of(&svc, backend)?;
    let weight = ask.resolve(b.config.weight)?;
    let _one_at_a_time = BACKEND_CHANGES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if weight == 0 && !force {
        if let Some(others) = others_out(&svc, b) {
            return Err(ApiError::LastWeighted {
                service: name.to_string(),
                backend: backend.to_string(),
                others,
            });
        }
    }
    let previous = b.weight();
    b.set_weight(weight);
    tracing::info!(
        service = name,
        backend,
        weight,
        previous,
        configured = b.config.weight,
        "admin: backend weight set (until the next reload or restart)"
    );
    Ok(json!({
        "service": name,
        "backend": backend,
        "weight": weight,
        "previous_weight": previous,
        "configured_weight": b.config.weight,
        "state": b.state_name(),
        "active_connections": b.active(),
    }))
}

/// `GET /api/connections`'s parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionsQuery {
    /// Only this service's connections.
    pub service: Option<String>,
    /// Only connections from this client address.
    pub client: Option<IpAddr>,
    /// Connections to return at most (the oldest).
    pub limit: usize,
}

/// Parse `GET /api/connections`'s query: `service=NAME`, `client=ADDR`, `limit=N`.
pub fn connections_query(query: Option<&str>) -> Result<ConnectionsQuery, ApiError> {
    let mut q = ConnectionsQuery {
        service: None,
        client: None,
        limit: DEFAULT_CONNECTIONS_LIMIT,
    };
    for (k, v) in params(query, &["service", "client", "limit"])? {
        match k {
            "service" => q.service = Some(v.to_string()),
            "client" => q.client = Some(client_param(v)?),
            _ => q.limit = limit_param(v, MAX_TABLE_LIMIT)?,
        }
    }
    Ok(q)
}

/// `GET /api/connections`: the oldest open connections (of a service, of a
/// client), with their backend, age, bytes each way and state, and how many
/// matched in all.
pub fn connections(server: &Server, q: &ConnectionsQuery) -> Result<Value, ApiError> {
    let services = match &q.service {
        Some(name) => vec![service(server, name)?],
        None => server.services(),
    };
    let keep = |c: &crate::connections::OpenConn| q.client.map_or(true, |ip| c.client.ip() == ip);
    let mut total = 0;
    let mut all = Vec::new();
    for svc in &services {
        let (list, matched) = svc.connections.oldest(q.limit, keep);
        total += matched;
        all.extend(list.into_iter().map(|c| (svc.name().to_string(), c)));
    }
    all.sort_by_key(|(_, c)| c.started);
    all.truncate(q.limit);
    let draining = server.is_draining();
    let list: Vec<Value> = all
        .iter()
        .map(|(service, c)| {
            let age = c.started.elapsed();
            json!({
                "service": service,
                "client": c.client.to_string(),
                "backend": &*c.backend,
                "since": rfc3339(crate::connections::wall_clock(c.started)),
                "age_seconds": age.as_secs(),
                "state": if draining { "draining" } else { c.state() },
                "bytes": {
                    "client_to_server": c.bytes.c2s.load(Ordering::Relaxed),
                    "server_to_client": c.bytes.s2c.load(Ordering::Relaxed),
                },
            })
        })
        .collect();
    Ok(json!({
        "limit": q.limit,
        "total": total,
        "connections": list,
    }))
}

/// [`connections`] as JSON text, built on the blocking pool like table dumps.
pub async fn connections_dump(
    server: Arc<Server>,
    q: ConnectionsQuery,
) -> Result<String, ApiError> {
    dump(move || connections(&server, &q)).await
}

/// Sources `GET /api/sources` lists per listener without `?limit=`.
pub const DEFAULT_SOURCES_LIMIT: usize = 20;

/// Parse `GET /api/sources`'s query: `limit=N` (sources per listener).
pub fn sources_query(query: Option<&str>) -> Result<usize, ApiError> {
    let mut limit = DEFAULT_SOURCES_LIMIT;
    for (_, v) in params(query, &["limit"])? {
        limit = limit_param(v, MAX_TABLE_LIMIT)?;
    }
    Ok(limit)
}

/// `GET /api/sources`: for each listener with `per_source`, its limits, how many
/// sources it tracks and the `limit` sources with the most open connections.
pub fn sources(server: &Server, limit: usize) -> Value {
    let listeners: Vec<Value> = server
        .sources()
        .into_iter()
        .map(|(local, a)| {
            let l = a.limits();
            let top: Vec<Value> = a
                .top(limit)
                .into_iter()
                .map(|v| {
                    json!({
                        "source": v.source.to_string(),
                        "open": v.open,
                        "tokens": v.tokens.map(|t| (t * 10.0).floor() / 10.0),
                        "admitted": v.admitted,
                        "refused": v.refused,
                    })
                })
                .collect();
            json!({
                "listener": local.to_string(),
                "limits": {
                    "max_connections": l.max_connections,
                    "rate": l.rate,
                    "burst": l.burst,
                    "source_prefix_v4": l.source_prefix_v4,
                    "source_prefix_v6": l.source_prefix_v6,
                    "allow": l.allow.iter().map(|n| n.to_string()).collect::<Vec<_>>(),
                    "table_size": l.table_size,
                },
                "tracked": a.tracked(),
                "sources": top,
            })
        })
        .collect();
    json!({ "listeners": listeners })
}

/// [`sources`] as JSON text, built on the blocking pool like table dumps.
pub async fn sources_dump(server: Arc<Server>, limit: usize) -> Result<String, ApiError> {
    dump(move || Ok(sources(&server, limit))).await
}

/// `POST /api/reload`: the same path as SIGHUP; an applied reload's warnings.
pub async fn reload(server: &Arc<Server>) -> Result<Value, ApiError> {
    let warnings = server.reload_file().await.map_err(ApiError::ReloadFailed)?;
    Ok(json!({ "reloaded": true, "warnings": warnings }))
}

/// `GET /healthz`: every configured listen address is bound and crossbar is not
/// shutting down (so a keepalived check moves the VIP away from a draining host).
pub fn healthz(server: &Server) -> Result<(), String> {
    if server.is_draining() {
        return Err("shutting down: draining established connections".into());
    }
    let missing: Vec<String> = server
        .services()
        .iter()
        .filter(|s| server.local_addrs(s.name()).len() < s.config.listen.len())
        .map(|s| s.name().to_string())
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!("listeners not bound for: {}", missing.join(", ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table_limit(q: Option<&str>) -> Result<usize, ApiError> {
        table_query(q).map(|q| q.limit)
    }

    #[test]
    fn picks() {
        let q = |s| table_query(Some(s)).map(|q| q.pick);
        assert_eq!(
            q("key=00000000000000ff&limit=3").unwrap(),
            Some(Pick::Key(255))
        );
        assert_eq!(
            q("client=::ffff:10.1.2.3").unwrap(),
            Some(Pick::Client("10.1.2.3".parse().unwrap()))
        );
        for bad in [
            "key=ff",
            "key=zz00000000000000",
            "key=+00000000000000f",
            "client=10.1.2.3:80",
            "client=host",
            "key=00000000000000ff&client=::1",
            "limit=1&limit=2",
        ] {
            assert!(q(bad).is_err(), "{bad}");
        }
        assert_eq!(delete_query(None).unwrap(), None);
        for bad in ["limit=3", "kye=00000000000000ff", "force"] {
            assert!(delete_query(Some(bad)).is_err(), "{bad}");
        }
        assert!(force_query(Some("force")).unwrap());
        assert!(force_query(Some("force=true")).unwrap());
        assert!(!force_query(Some("force=0")).unwrap());
        assert!(!force_query(None).unwrap());
        assert!(force_query(Some("force=yes please")).is_err());
        assert!(force_query(Some("forse")).is_err());
        let c = connections_query(Some("service=puppet&client=127.0.0.2&limit=5")).unwrap();
        assert_eq!(
            (c.service.as_deref(), c.client, c.limit),
            (Some("puppet"), Some("127.0.0.2".parse().unwrap()), 5)
        );
        assert_eq!(
            connections_query(None).unwrap().limit,
            DEFAULT_CONNECTIONS_LIMIT
        );
        assert!(connections_query(Some("limit=0")).is_err());
        assert!(connections_query(Some("backend=b1")).is_err());
    }

    #[test]
    fn weights() {
        assert_eq!(parse_weight("0").unwrap(), WeightAsk::Absolute(0));
        assert_eq!(parse_weight("256").unwrap(), WeightAsk::Absolute(256));
        assert_eq!(parse_weight("50%").unwrap(), WeightAsk::Percent(50));
        assert_eq!(parse_weight("150%25").unwrap(), WeightAsk::Percent(150));
        for bad in [
            "", "%", "257", "-1", "+3", "1.5", "0x10", "ten", " 5", "5 %",
        ] {
            assert!(parse_weight(bad).is_err(), "{bad}");
        }
        let r = |ask, configured| WeightAsk::resolve(ask, configured).ok();
        assert_eq!(r(WeightAsk::Percent(50), 5), Some(3), "rounded");
        assert_eq!(r(WeightAsk::Percent(1), 1), Some(1), "never 0 by rounding");
        assert_eq!(r(WeightAsk::Percent(0), 100), Some(0));
        assert_eq!(r(WeightAsk::Percent(200), 128), Some(256));
        assert_eq!(r(WeightAsk::Percent(201), 128), None);
        assert_eq!(r(WeightAsk::Percent(u32::MAX), 256), None);
        assert_eq!(r(WeightAsk::Absolute(7), 1), Some(7));
        assert_eq!(
            weight_query(Some("weight=0&force")).unwrap(),
            (WeightAsk::Absolute(0), true)
        );
        assert!(weight_query(None).is_err());
        assert!(weight_query(Some("force=1")).is_err());
    }

    #[test]
    fn limits() {
        assert_eq!(table_limit(None).unwrap(), DEFAULT_TABLE_LIMIT);
        assert_eq!(table_limit(Some("")).unwrap(), DEFAULT_TABLE_LIMIT);
        assert_eq!(table_limit(Some("limit=5")).unwrap(), 5);
        assert_eq!(table_limit(Some("limit=10000")).unwrap(), 10_000);
        for bad in [
            "limit=0",
            "limit=10001",
            "limit=100000",
            "limit=x",
            "limit",
            "lmit=3",
            "limit=-1",
        ] {
            assert!(table_limit(Some(bad)).is_err(), "{bad}");
        }
    }
}
