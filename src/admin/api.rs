//! The admin API's resources as JSON: services and backends, stick tables, backend
//! state changes and reload. Pure functions of the running [`Server`], so the HTTP
//! layer in `mod.rs` only routes and authorizes.
use std::sync::Arc;
use std::time::SystemTime;

use serde_json::{json, Value};
use tokio::sync::Semaphore;

use crate::balance::{AdminState, Backend};
use crate::config::{Balance, Mode};
use crate::server::Server;
use crate::service::Service;

/// Entries `GET /api/tables/{service}` returns without `?limit=`.
pub const DEFAULT_TABLE_LIMIT: usize = 1000;
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
            | ApiError::NoTable(_) => S::NOT_FOUND,
            ApiError::BadQuery(_) => S::BAD_REQUEST,
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
                "stick_table": svc.table.as_ref().map(|t| table_json(svc, &t.stats())),
                "queued": svc.pool.queued(),
                "queue_size": svc.config.queue_size,
                "handshakes": handshakes(&svc.pool.backends),
                "active_backend": active_backend(svc),
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
        "state": b.state_name(),
        "state_since": rfc3339(since),
        "state_seconds": seconds_since(since),
        "available": b.is_available(),
        "healthy": b.is_healthy(),
        "active_connections": b.active(),
        "peak_connections": live.peak(),
        "connections_total": m.connections.get(),
        "weight": b.config.weight,
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

/// Parse `limit=N` out of a query string; other parameters are refused so a typo
/// is not silently ignored.
pub fn table_limit(query: Option<&str>) -> Result<usize, ApiError> {
    let mut limit = DEFAULT_TABLE_LIMIT;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if k != "limit" {
            return Err(ApiError::BadQuery(format!(
                "unknown parameter {k:?} (only `limit`)"
            )));
        }
        limit = v
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=MAX_TABLE_LIMIT).contains(n))
            .ok_or_else(|| {
                ApiError::BadQuery(format!(
                    "limit must be an integer in 1..={MAX_TABLE_LIMIT}, got {v:?}"
                ))
            })?;
    }
    Ok(limit)
}

/// `GET /api/tables/{service}`: the most recently used entries and the table's counters.
pub fn table(server: &Server, name: &str, limit: usize) -> Result<Value, ApiError> {
    let svc = service(server, name)?;
    let table = svc
        .table
        .as_ref()
        .ok_or_else(|| ApiError::NoTable(name.to_string()))?;
    let entries: Vec<Value> = table
        .entries(limit)
        .iter()
        .map(|e| {
            json!({
                "kind": e.kind.as_str(),
                "key": e.hash_hex,
                "backend": e.backend.as_deref(),
                "age_seconds": e.age.as_secs(),
                "expires_in_seconds": e.expires_in.as_secs(),
            })
        })
        .collect();
    Ok(json!({
        "service": name,
        "limit": limit,
        "stats": stats(&table.stats()),
        "entries": entries,
    }))
}

/// Table dumps built at a time: each walks the whole table and holds up to
/// [`MAX_TABLE_LIMIT`] entries; more readers wait their turn.
static TABLE_DUMPS: Semaphore = Semaphore::const_new(1);

/// [`table`] as JSON text, built on the blocking pool (never on a runtime worker
/// that relays connections), one dump at a time.
pub async fn table_dump(
    server: Arc<Server>,
    name: String,
    limit: usize,
) -> Result<String, ApiError> {
    let _turn = TABLE_DUMPS
        .acquire()
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    tokio::task::spawn_blocking(move || {
        table(&server, &name, limit).map(|v| {
            let mut body = v.to_string();
            body.push('\n');
            body
        })
    })
    .await
    .map_err(|e| ApiError::Internal(format!("table dump: {e}")))?
}

/// `DELETE /api/tables/{service}`: remove every entry.
pub fn flush(server: &Server, name: &str) -> Result<Value, ApiError> {
    let svc = service(server, name)?;
    let table = svc
        .table
        .as_ref()
        .ok_or_else(|| ApiError::NoTable(name.to_string()))?;
    let before = table.stats().entries;
    table.clear();
    tracing::info!(
        service = name,
        entries = before,
        "admin: stick table flushed"
    );
    Ok(json!({ "service": name, "flushed": before }))
}

/// `POST /api/backends/{service}/{backend}/{action}`: set the operator state.
pub fn set_backend(
    server: &Server,
    name: &str,
    backend: &str,
    action: Action,
) -> Result<Value, ApiError> {
    let svc = service(server, name)?;
    let b = svc
        .pool
        .get(backend)
        .ok_or_else(|| ApiError::UnknownBackend {
            service: name.to_string(),
            backend: backend.to_string(),
        })?;
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

/// `POST /api/reload`: the same path as SIGHUP.
pub async fn reload(server: &Arc<Server>) -> Result<Value, ApiError> {
    server.reload_file().await.map_err(ApiError::ReloadFailed)?;
    Ok(json!({ "reloaded": true }))
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
