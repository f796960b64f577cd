//! The admin API's reads: the views ([`super::view`]) of services and backends,
//! stick tables, open connections and client sources, built from the running
//! [`Server`], and `/healthz`. Pure functions of the server, so the HTTP layer in
//! `mod.rs` only routes and authorizes; writes are in `writes.rs`.
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::SystemTime;

use serde::Serialize;
use tokio::sync::Semaphore;

use super::error::ApiError;
use super::query::{ConnectionsQuery, Pick, TableQuery};
use super::view::{self, time::seconds_between};
use crate::balance::{Backend, State};
use crate::config::Balance;
use crate::server::Server;
use crate::service::Service;

/// `name` of `server`, or the API's 404.
pub(super) fn service(server: &Server, name: &str) -> Result<Arc<Service>, ApiError> {
    server.service(name).ok_or_else(|| {
        let all = server.services();
        ApiError::UnknownService {
            name: name.to_string(),
            nearest: crate::config::nearest(name, all.iter().map(|s| s.name())).map(str::to_string),
        }
    })
}

/// `GET /api/services`: the process, then every service with its listeners and
/// backends.
pub fn services(server: &Server) -> view::ServicesView {
    let now = SystemTime::now();
    view::ServicesView {
        crossbar: process(server, now),
        services: server
            .services()
            .iter()
            .map(|svc| service_view(server, svc, now))
            .collect(),
        per_source: sources(server, view::PAGE_SOURCES).listeners,
    }
}

fn service_view(server: &Server, svc: &Service, now: SystemTime) -> view::ServiceView {
    let backends = &svc.pool.backends;
    let operator = server.operator_state();
    let departed_serve = svc.pool.departed_serve();
    view::ServiceView {
        name: svc.name().to_string(),
        mode: svc.config.mode,
        balance: svc.config.balance,
        listeners: server
            .local_addrs(svc.name())
            .iter()
            .map(|a| a.to_string())
            .collect(),
        proxy_protocol: proxy_listeners(svc),
        stick_table: svc.table.as_ref().map(|t| stick_table(svc, &t.stats())),
        queued: svc.pool.queued(),
        queue_size: svc.config.queue_size,
        queue_timeout_ms: u64::try_from(svc.config.timeouts.queue.as_millis()).unwrap_or(u64::MAX),
        handshakes: view::Handshakes {
            resumed: backends.iter().map(|b| b.metrics.resumed.get()).sum(),
            full: backends.iter().map(|b| b.metrics.full.get()).sum(),
        },
        active_backend: active_backend(svc),
        discovery: svc.discovery.as_ref().map(|d| view::DiscoveryView {
            serving: backends
                .iter()
                .filter(|b| b.config.from_dns.is_some())
                .count(),
            ..discovery(&d.snapshot())
        }),
        feedback: svc.config.feedback.as_ref().map(super::weights::settings),
        backends: backends
            .iter()
            .map(|b| {
                let held = operator.get(svc.name(), &b.name);
                let mut v = view::BackendView {
                    slow_start: svc.pool.ramp_of(b).map(ramp),
                    ..backend(b, svc, now)
                };
                origins(&mut v, b, held, departed_serve);
                v
            })
            .collect(),
    }
}

/// The listen addresses of `svc` that read PROXY headers, with from where.
fn proxy_listeners(svc: &Service) -> Vec<view::ProxyListenerView> {
    svc.config
        .listen
        .iter()
        .filter_map(|l| {
            let p = l.proxy_protocol.as_ref()?;
            Some(view::ProxyListenerView {
                listen: l.addr.to_string(),
                accept_from: p.accept_from.iter().map(|n| n.to_string()).collect(),
                required: p.required,
                text: format!("{} {p}", l.addr),
            })
        })
        .collect()
}

/// For `balance: first`, the backend new connections go to now (the active CA
/// of a `puppetca` pool); `None` for other algorithms or when none is available.
fn active_backend(svc: &Service) -> Option<String> {
    (svc.config.balance == Balance::First)
        .then(|| svc.pool.first_choice())
        .flatten()
        .map(|b| b.name.to_string())
}

/// Who set `b`'s weight and state, what the operator set, and whether it left DNS
/// (then, unless no listed backend can take new connections, it drains).
fn origins(
    v: &mut view::BackendView,
    b: &Backend,
    held: Option<&crate::server::Override>,
    departed_serve: bool,
) {
    let dns = b.config.from_dns.is_some();
    v.weight_origin = match (held.and_then(|h| h.weight), dns) {
        (Some(_), _) => view::Origin::Operator,
        (None, true) => view::Origin::Dns,
        (None, false) => view::Origin::File,
    };
    v.state_origin = match held.and_then(|h| h.state) {
        Some(_) => view::Origin::Operator,
        None => view::Origin::File,
    };
    v.operator = held.map(|h| view::OperatorView {
        state: h.state.map(State::from),
        weight: h.weight,
        since: view::time::from_unix_seconds(h.since),
    });
    v.left_dns = b.config.left_dns;
    if v.effective_origin != view::Origin::Feedback {
        v.effective_origin = v.weight_origin;
    }
    if b.config.left_dns && !departed_serve && v.state_origin != view::Origin::Operator {
        v.state = State::Drain;
        v.state_origin = view::Origin::Dns;
        v.available = false;
    }
}

/// What the operator had set on a backend, kept or reset (`why`).
pub(super) fn held_view(
    service: &str,
    backend: &str,
    o: &crate::server::Override,
    why: Option<String>,
) -> view::HeldView {
    view::HeldView {
        service: service.to_string(),
        backend: backend.to_string(),
        state: o.state.map(State::from),
        weight: o.weight,
        why,
    }
}

fn discovery(s: &crate::discovery::Snapshot) -> view::DiscoveryView {
    view::DiscoveryView {
        kind: s.kind.to_string(),
        name: s.name.clone(),
        last_resolved: s.last_resolved.map(view::time::from_unix_seconds),
        last_attempt: s.last_attempt.map(view::time::from_unix_seconds),
        stale: s.stale,
        error: s.error.clone(),
        backends: s.backends,
        dropped: s.dropped,
        next_in_ms: s.next_in_ms,
        own: s.own.clone(),
        stale_since: s.stale_since.map(view::time::from_unix_seconds),
        failures: s.failures,
        serving: 0,
    }
}

/// Version, uptime, the config file and the last reload's outcome.
fn process(server: &Server, now: SystemTime) -> view::ProcessView {
    let p = &server.metrics().process;
    view::ProcessView {
        version: env!("CARGO_PKG_VERSION").to_string(),
        started_at: p.started_at(),
        uptime_seconds: p.uptime().as_secs(),
        config: server.config().source.display().to_string(),
        last_reload: p.last_reload().map(|r| view::ReloadView {
            at: r.at,
            seconds_ago: seconds_between(r.at, now),
            ok: r.error.is_none(),
            error: r.error,
            warnings: r.warnings,
            kept: r.kept,
            reset: r.reset,
        }),
    }
}

fn backend(b: &Backend, svc: &Service, now: SystemTime) -> view::BackendView {
    let (m, live) = (&b.metrics, &b.metrics.live);
    let since = live.state_since();
    let feedback = svc.config.feedback.as_ref();
    let (effective_weight, scaled, feedback) =
        super::weights::effective(b, svc.pool.weight_of(b), feedback);
    view::BackendView {
        name: b.name.to_string(),
        address: b.config.address.to_string(),
        source: match b.config.from_dns {
            Some(_) => view::BackendSource::Dns,
            None => view::BackendSource::Config,
        },
        dns_name: b.config.from_dns.clone(),
        state: b.state(),
        state_since: since,
        state_seconds: seconds_between(since, now),
        available: b.is_available(),
        healthy: b.is_healthy(),
        active_connections: b.active(),
        peak_connections: live.peak(),
        max_connections: b.max_connections(),
        connections_total: m.connections.get(),
        weight: b.weight(),
        configured_weight: b.config.weight,
        effective_weight,
        // Feedback's while it scales the weight; else who set the weight (`origins`).
        effective_origin: if scaled {
            view::Origin::Feedback
        } else {
            view::Origin::File
        },
        feedback,
        backup: b.config.backup,
        bytes: view::Bytes {
            client_to_server: m.bytes_c2s.get(),
            server_to_client: m.bytes_s2c.get(),
        },
        connect_errors: m.connect_errors.get(),
        check: check_kind(&b.config.health.check),
        check_failures: m.check_fail.get(),
        last_check: live.last_check().map(|c| view::CheckView {
            at: c.at,
            seconds_ago: seconds_between(c.at, now),
            result: match c.error {
                None => view::CheckResult::Ok,
                Some(_) => view::CheckResult::Fail,
            },
            error: c.error,
        }),
        handshakes: view::Handshakes {
            resumed: m.resumed.get(),
            full: m.full.get(),
        },
        // The pool's to say (`service_view`), and the record's (`origins`).
        slow_start: None,
        weight_origin: view::Origin::File,
        state_origin: view::Origin::File,
        operator: None,
        left_dns: false,
    }
}

/// A ramp under way as the view says it (whole seconds left, rounded up).
fn ramp(r: crate::balance::Ramp) -> view::RampView {
    let (elapsed, total) = (r.elapsed.as_millis(), r.total.as_millis().max(1));
    view::RampView {
        percent: u8::try_from((elapsed * 100 / total).min(99)).unwrap_or(99),
        seconds_left: (r.total.saturating_sub(r.elapsed).as_millis() as u64).div_ceil(1000),
        seconds_total: r.total.as_secs(),
    }
}

fn check_kind(c: &crate::config::CheckKind) -> view::CheckKind {
    use crate::config::CheckKind as K;
    match c {
        K::None => view::CheckKind::None,
        K::Tcp => view::CheckKind::Tcp,
        K::TlsHello => view::CheckKind::TlsHello,
        K::Https(_) => view::CheckKind::Https,
    }
}

/// A stick table's counters plus the service's lookup hit ratio (`None` before
/// the first lookup).
fn stick_table(svc: &Service, s: &crate::stick::TableStats) -> view::StickTableView {
    let (hit, miss) = svc.metrics.lookup_totals();
    let total = hit + miss;
    view::StickTableView {
        counts: counts(s),
        lookups: view::Lookups { hit, miss },
        hit_ratio: (total > 0).then(|| hit as f64 / total as f64),
    }
}

fn counts(s: &crate::stick::TableStats) -> view::TableCounts {
    view::TableCounts {
        entries: s.entries,
        capacity: s.capacity,
        expired: s.expired,
        evicted: s.evicted,
    }
}

pub(super) fn entry(e: &crate::stick::EntryView) -> view::EntryView {
    view::EntryView {
        kind: e.kind.as_str().to_string(),
        key: e.hash_hex.clone(),
        backend: e.backend.as_deref().map(str::to_string),
        age_seconds: e.age.as_secs(),
        expires_in_seconds: e.expires_in.as_secs(),
        client: e.client.clone(),
    }
}

/// `svc`'s stick table, or the API's 404.
pub(super) fn table_of<'a>(
    svc: &'a Service,
    name: &str,
) -> Result<&'a crate::stick::StickTable, ApiError> {
    svc.table
        .as_deref()
        .ok_or_else(|| ApiError::NoTable(name.to_string()))
}

/// The entry a pick names, if any, and what was asked (a key, or a client and
/// the prefix it falls under); `remove` takes it out of the table.
pub(super) fn picked(
    svc: &Service,
    table: &crate::stick::StickTable,
    pick: Pick,
    remove: bool,
) -> (Option<crate::stick::EntryView>, view::Lookup) {
    let (hash, asked) = match pick {
        Pick::Key(hash) => (
            hash,
            view::Lookup::Key {
                key: format!("{hash:016x}"),
            },
        ),
        Pick::Client(ip) => {
            let client = ip.to_string();
            let Some(cfg) = svc.config.stick.as_ref() else {
                return (
                    None,
                    view::Lookup::Client {
                        client,
                        prefix: None,
                    },
                );
            };
            let (key, prefix) = crate::stick::source_key(table, cfg, ip);
            let prefix = Some(prefix);
            (key.hash, view::Lookup::Client { client, prefix })
        }
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
pub fn table(server: &Server, name: &str, q: TableQuery) -> Result<view::TableView, ApiError> {
    let svc = service(server, name)?;
    let table = table_of(&svc, name)?;
    let (entries, lookup) = match q.pick {
        None => (table.entries(q.limit).iter().map(entry).collect(), None),
        Some(p) => {
            let (found, asked) = picked(&svc, table, p, false);
            (found.iter().map(entry).collect(), Some(asked))
        }
    };
    Ok(view::TableView {
        service: name.to_string(),
        limit: q.limit,
        lookup,
        stats: counts(&table.stats()),
        entries,
    })
}

/// Table dumps built at a time: each walks the whole table and holds up to
/// [`super::MAX_TABLE_LIMIT`] entries; more readers wait their turn.
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
async fn dump<V: Serialize>(
    walk: impl FnOnce() -> Result<V, ApiError> + Send + 'static,
) -> Result<String, ApiError> {
    let _turn = TABLE_DUMPS
        .acquire()
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    tokio::task::spawn_blocking(move || walk().and_then(|v| json_text(&v)))
        .await
        .map_err(|e| ApiError::Internal(format!("dump: {e}")))?
}

/// A view as the JSON text of an answer, with a final newline.
pub fn json_text<V: Serialize>(v: &V) -> Result<String, ApiError> {
    let mut body = serde_json::to_string(v).map_err(|e| ApiError::Internal(e.to_string()))?;
    body.push('\n');
    Ok(body)
}

/// `GET /api/connections`: the oldest open connections (of a service, of a
/// client), with their backend, age, bytes each way and state, and how many
/// matched in all.
pub fn connections(
    server: &Server,
    q: &ConnectionsQuery,
) -> Result<view::ConnectionsView, ApiError> {
    let services = match &q.service {
        Some(name) => vec![service(server, name)?],
        None => server.services(),
    };
    let keep =
        |c: &crate::open_connections::OpenConn| q.client.map_or(true, |ip| c.client.ip() == ip);
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
    let connections = all
        .into_iter()
        .map(|(service, c)| connection_view(service, &c, draining))
        .collect();
    Ok(view::ConnectionsView {
        limit: q.limit,
        total,
        connections,
    })
}

/// One open connection of `service` as the API shows it.
pub(super) fn connection_view(
    service: String,
    c: &crate::open_connections::OpenConn,
    draining: bool,
) -> view::ConnectionView {
    view::ConnectionView {
        id: c.id,
        service,
        client: c.client.to_string(),
        backend: c.backend.to_string(),
        since: crate::open_connections::wall_clock(c.started),
        age_seconds: c.started.elapsed().as_secs(),
        state: match (draining, c.state()) {
            (true, _) => view::ConnState::Draining,
            (false, "relaying") => view::ConnState::Relaying,
            (false, _) => view::ConnState::Handshake,
        },
        bytes: view::Bytes {
            client_to_server: c.bytes.c2s.load(Ordering::Relaxed),
            server_to_client: c.bytes.s2c.load(Ordering::Relaxed),
        },
    }
}

/// [`connections`] as JSON text, built on the blocking pool like table dumps.
pub async fn connections_dump(
    server: Arc<Server>,
    q: ConnectionsQuery,
) -> Result<String, ApiError> {
    dump(move || connections(&server, &q)).await
}

/// `GET /api/sources`: for each listener with `per_source`, its limits, how many
/// sources it tracks and the `limit` sources with the most open connections.
pub fn sources(server: &Server, limit: usize) -> view::SourcesView {
    let listeners = server
        .sources()
        .into_iter()
        .map(|(local, a)| {
            let l = a.limits();
            view::ListenerSourcesView {
                listener: local.to_string(),
                limits: view::SourceLimitsView {
                    max_connections: l.max_connections,
                    rate: l.rate,
                    burst: l.burst,
                    source_prefix_v4: l.source_prefix_v4,
                    source_prefix_v6: l.source_prefix_v6,
                    allow: l.allow.iter().map(|n| n.to_string()).collect(),
                    table_size: l.table_size,
                },
                tracked: a.tracked(),
                sources: a
                    .top(limit)
                    .into_iter()
                    .map(|v| view::SourceView {
                        source: v.source.to_string(),
                        open: v.open,
                        tokens: v.tokens.map(|t| (t * 10.0).floor() / 10.0),
                        admitted: v.admitted,
                        refused: v.refused,
                    })
                    .collect(),
            }
        })
        .collect();
    view::SourcesView { listeners }
}

/// [`sources`] as JSON text, built on the blocking pool like table dumps.
pub async fn sources_dump(server: Arc<Server>, limit: usize) -> Result<String, ApiError> {
    dump(move || Ok(sources(&server, limit))).await
}

/// `GET /healthz`: every configured listen address is bound and crossbar is not
/// shutting down (so a keepalived check moves the VIP away from a draining host);
/// with `admin.healthz_needs_backends`, also every service has a backend that
/// takes new connections (HAProxy's `monitor fail if nbsrv lt 1`).
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
    if !missing.is_empty() {
        return Err(format!("listeners not bound for: {}", missing.join(", ")));
    }
    let needs = server
        .config()
        .admin
        .as_ref()
        .is_some_and(|a| a.healthz_needs_backends);
    let empty: Vec<String> = server
        .services()
        .iter()
        .filter(|s| !s.pool.backends.iter().any(|b| b.takes_new()))
        .map(|s| s.name().to_string())
        .collect();
    if needs && !empty.is_empty() {
        return Err(format!(
            "no backend takes new connections in: {} (admin.healthz_needs_backends)",
            empty.join(", ")
        ));
    }
    Ok(())
}
