//! Prometheus registry and the per-service / per-backend metric handles.
//!
//! Handles are resolved once when a service is built, so the data path only does
//! atomic adds. Stick-table sizes are read from the tables at scrape time by a
//! collector, so the data path never touches those gauges.
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

mod families;
mod feedback;
mod limits;

pub use limits::{Limits, BACKEND_MAX_CONNECTIONS, QUEUE_SIZE, QUEUE_WAITING};

pub use feedback::{
    BackendFeedbackMetrics, FeedbackMetrics, FeedbackPublished, JrubyCounts, FEEDBACK_PHASES,
    FEEDBACK_POLL_RESULTS,
};

use crate::config::state::State;
use crate::listener::AcceptCounters;
use crate::live::BackendLive;
use crate::relay::Peer;
use crate::stick::{KeyKind, StickTable};
use families::{BackendFamilies, ListenerFamilies, ServiceFamilies, StickFamilies};

/// Buckets for connect time: loopback is ~100 us, a WAN master tens of ms, a timeout seconds.
const CONNECT_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];
/// Buckets for connection lifetime: health probes last ms, agent runs minutes, idle keep-alives hours.
const DURATION_BUCKETS: &[f64] = &[
    0.01, 0.1, 0.5, 1.0, 5.0, 15.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 14400.0,
];

/// The label used for events that happen before a connection is routed to a service.
pub const UNROUTED: &str = "unrouted";

/// Every metric family crossbar exports, registered in one registry.
pub struct Metrics {
    /// The registry `/metrics` encodes.
    pub registry: Registry,
    stick: StickFamilies,
    backends: BackendFamilies,
    services: ServiceFamilies,
    listeners: ListenerFamilies,
    tables: Arc<TableCollector>,
    /// Queues and connection limits, read at scrape time.
    limits: Arc<limits::LimitCollector>,
    /// Process facts for the status page (start, last reload).
    pub process: crate::live::ProcessLive,
    /// Backend facts by (service, backend): kept across reloads like the counters.
    live: Mutex<HashMap<(String, String), Arc<BackendLive>>>,
    /// The admin endpoint's refusals and connection slots.
    pub admin: AdminMetrics,
    /// DNS discovery of backends: lookups, staleness, answer sizes.
    pub discovery: crate::discovery::DiscoveryMetrics,
    /// Load feedback: factors, samples, polls (`crossbar_backend_feedback_*`).
    feedback: FeedbackMetrics,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

fn counter_vec(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let v = IntCounterVec::new(Opts::new(name, help), labels).expect("static metric definition"); // ok: static
    r.register(Box::new(v.clone())).expect("unique metric name"); // ok: static
    v
}

fn gauge_vec(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let v = IntGaugeVec::new(Opts::new(name, help), labels).expect("static metric definition"); // ok: static
    r.register(Box::new(v.clone())).expect("unique metric name"); // ok: static
    v
}

fn histogram_vec(r: &Registry, name: &str, help: &str, labels: &[&str], b: &[f64]) -> HistogramVec {
    let opts = HistogramOpts::new(name, help).buckets(b.to_vec());
    let v = HistogramVec::new(opts, labels).expect("static metric definition"); // ok: static
    r.register(Box::new(v.clone())).expect("unique metric name"); // ok: static
    v
}

impl Metrics {
    /// A registry with every family, process metrics and build info.
    pub fn new() -> Arc<Metrics> {
        let r = Registry::new();
        #[cfg(target_os = "linux")]
        {
            let pc = prometheus::process_collector::ProcessCollector::for_self();
            if let Err(e) = r.register(Box::new(pc)) {
                tracing::warn!("process metrics unavailable: {e}");
            }
        }
        let build = gauge_vec(
            &r,
            "crossbar_build_info",
            "Build information.",
            &["version"],
        );
        build.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
        let tables = Arc::new(TableCollector::new());
        r.register(Box::new(TableCollectorHandle(tables.clone())))
            .expect("unique metric name"); // ok: static
        let limits = Arc::new(limits::LimitCollector::new());
        r.register(Box::new(limits::LimitCollectorHandle(limits.clone())))
            .expect("unique metric name"); // ok: static
        let metrics = Arc::new(Metrics {
            limits,
            stick: StickFamilies::register(&r),
            backends: BackendFamilies::register(&r),
            services: ServiceFamilies::register(&r),
            listeners: ListenerFamilies::register(&r),
            tables,
            process: Default::default(),
            live: Mutex::new(HashMap::new()),
            admin: AdminMetrics::register(&r),
            discovery: crate::discovery::DiscoveryMetrics::register(&r),
            feedback: FeedbackMetrics::register(&r),
            registry: {
                // The log writer's drops (process-wide: crate::log_writer).
                let dropped = crate::log_writer::dropped_lines().clone();
                r.register(Box::new(dropped)).expect("unique metric name"); // ok: static
                r
            },
        });
        metrics.zero_fixed_labels();
        metrics
    }

    /// Create every series with a fixed label set at 0, so that `increase()` and
    /// `rate()` see the first event (a series born at 1 has no earlier sample to
    /// compare with: the first failed reload would never fire an alert).
    fn zero_fixed_labels(&self) {
        for result in RELOAD_RESULTS {
            self.services.config_reloads.with_label_values(&[result]);
        }
        for reason in HELLO_ERROR_REASONS {
            self.services
                .hello_errors
                .with_label_values(&[UNROUTED, reason]);
        }
        self.services
            .routing_refused
            .with_label_values(&[UNROUTED, UNROUTED_REFUSED_REASON]);
    }

    /// Encode every family in the Prometheus text format.
    pub fn encode(&self) -> String {
        let mut buf = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            tracing::error!("encoding metrics failed: {e}");
        }
        String::from_utf8(buf).unwrap_or_default()
    }

    /// Handles of one service.
    pub fn service(&self, service: &str) -> ServiceMetrics {
        let lookup = |key: &str, result: &str| {
            self.stick
                .lookups
                .with_label_values(&[service, key, result])
        };
        let keys = ["session_id", "ticket", "psk", "source"];
        // Fixed label sets exist at 0 from the start (see `zero_fixed_labels`).
        for reason in HELLO_ERROR_REASONS {
            self.services
                .hello_errors
                .with_label_values(&[service, reason]);
        }
        for reason in ROUTE_REFUSED_REASONS {
            self.services
                .routing_refused
                .with_label_values(&[service, reason]);
        }
        for result in CONFIRM_RESULTS {
            self.stick.confirm.with_label_values(&[service, result]);
        }
        ServiceMetrics {
            name: service.to_string(),
            lookup_hit: keys.map(|k| lookup(k, "hit")),
            lookup_miss: keys.map(|k| lookup(k, "miss")),
            learned: keys.map(|k| self.stick.learned.with_label_values(&[service, k])),
            duration: self
                .services
                .connection_duration
                .with_label_values(&[service]),
            queue_timeouts: self.services.queue_timeouts.with_label_values(&[service]),
            resets: [Peer::Client, Peer::Backend].map(|p| {
                self.services
                    .resets
                    .with_label_values(&[service, p.as_str()])
            }),
            hello_errors: self.services.hello_errors.clone(),
            routing_refused: self.services.routing_refused.clone(),
            confirm: self.stick.confirm.clone(),
            confirm_extra: self.stick.confirm_extra.clone(),
        }
    }

    /// Handles of one backend of a service.
    pub fn backend(&self, service: &str, backend: &str) -> BackendMetrics {
        let l = [service, backend];
        // Exists at 0 from the start, like the other per-backend counters, so a
        // dashboard or rate() sees the series before the first confirmation.
        self.stick.confirm_extra.with_label_values(&l);
        BackendMetrics {
            connections: self.backends.connections.with_label_values(&l),
            active: self.backends.active.with_label_values(&l),
            up: self.backends.up.with_label_values(&l),
            weight: self.backends.weight.with_label_values(&l),
            bytes_c2s: self.backends.bytes.with_label_values(&[
                service,
                backend,
                "client_to_server",
            ]),
            bytes_s2c: self.backends.bytes.with_label_values(&[
                service,
                backend,
                "server_to_client",
            ]),
            connect_errors: self.backends.connect_errors.with_label_values(&l),
            server_hello_timeouts: self.backends.server_hello_timeouts.with_label_values(&l),
            connect_duration: self.backends.connect_duration.with_label_values(&l),
            resumed: self
                .backends
                .tls_handshakes
                .with_label_values(&[service, backend, "resumed"]),
            full: self
                .backends
                .tls_handshakes
                .with_label_values(&[service, backend, "full"]),
            check_ok: self
                .backends
                .health_checks
                .with_label_values(&[service, backend, "ok"]),
            check_fail: self
                .backends
                .health_checks
                .with_label_values(&[service, backend, "fail"]),
            state: self.backends.state.clone(),
            feedback: self.feedback.backend(service, backend),
            live: self.backend_live(service, backend),
            service: service.to_string(),
            backend: backend.to_string(),
        }
    }

    fn backend_live(&self, service: &str, backend: &str) -> Arc<BackendLive> {
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        live.entry((service.to_string(), backend.to_string()))
            .or_default()
            .clone()
    }

    /// Remove the label sets of a backend that left the configuration.
    pub fn forget_backend(&self, service: &str, backend: &str) {
        self.live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(service.to_string(), backend.to_string()));
        let l = [service, backend];
        for v in [
            &self.backends.connections,
            &self.backends.connect_errors,
            &self.backends.server_hello_timeouts,
            &self.stick.confirm_extra,
        ] {
            let _ = v.remove_label_values(&l); // ok: absent labels are fine
        }
        let _ = self.backends.active.remove_label_values(&l); // ok: absent labels are fine
        let _ = self.backends.up.remove_label_values(&l); // ok: absent labels are fine
        let _ = self.backends.weight.remove_label_values(&l); // ok: absent labels are fine
        let _ = self.backends.connect_duration.remove_label_values(&l); // ok: absent labels are fine
                                                                        // Every series of the backend goes at once: one that came back starts all
                                                                        // of them at 0 together, never some restarted while others kept counting.
        for (v, third) in [
            (&self.backends.bytes, "client_to_server"),
            (&self.backends.bytes, "server_to_client"),
            (&self.backends.tls_handshakes, "resumed"),
            (&self.backends.tls_handshakes, "full"),
            (&self.backends.health_checks, "ok"),
            (&self.backends.health_checks, "fail"),
        ] {
            let _ = v.remove_label_values(&[service, backend, third]); // ok: absent is fine
        }
        self.feedback.forget(service, backend);
        for state in State::ALL {
            let _ = self
                .backends
                .state
                .remove_label_values(&[service, backend, state.as_str()]); // ok
        }
    }

    /// Handles for a listener (label: its address).
    pub(crate) fn listener(&self, listener: &str) -> AcceptCounters {
        // Exported (0) for every listener, `per_source` or not, like its counters.
        self.listeners
            .sources_tracked
            .with_label_values(&[listener]);
        self.listeners.proxy_probes.with_label_values(&[listener]);
        self.listeners
            .refused
            .with_label_values(&[listener, "self"]);
        AcceptCounters {
            accepts: self.listeners.accepts.with_label_values(&[listener]),
            refused_full: self
                .listeners
                .refused
                .with_label_values(&[listener, "max_connections"]),
            accept_errors: self
                .listeners
                .refused
                .with_label_values(&[listener, "accept_error"]),
        }
    }

    /// A listen address the config no longer has: its gauge goes (a stale count
    /// would read as sources still tracked); its counters stay, like a backend's
    /// totals in Prometheus, until the process ends.
    pub fn forget_listener(&self, listener: &str) {
        let _ = self
            .listeners
            .sources_tracked
            .remove_label_values(&[listener]); // ok: absent is fine
    }

    /// Count a connection `listener` refused because it came from one of crossbar's
    /// own backend connections (`reason="self"`: a backend is our own listener).
    pub fn self_connection(&self, listener: &str) {
        self.listeners
            .refused
            .with_label_values(&[listener, "self"])
            .inc();
    }

    /// Count a trusted tier's health check on `listener` (a PROXY LOCAL header and a close).
    pub fn proxy_probe(&self, listener: &str) {
        self.listeners
            .proxy_probes
            .with_label_values(&[listener])
            .inc();
    }

    /// Count a connection a listener ended at its front for a PROXY header reason
    /// (`reason="proxy_<reason>"`, see [`crate::proxy_protocol::FrontError::reason`]).
    pub fn proxy_refused(&self, listener: &str, reason: &str) {
        self.listeners
            .refused
            .with_label_values(&[listener, &format!("proxy_{reason}")])
            .inc();
    }

    /// `crossbar_listener_refused_total` of `listener` for `reason` (per-source
    /// admission's reasons: `crate::admission::Refusal::reason`).
    pub fn listener_refused(&self, listener: &str, reason: &str) -> IntCounter {
        self.listeners
            .refused
            .with_label_values(&[listener, reason])
    }

    /// `crossbar_listener_sources_tracked` of `listener`.
    pub fn sources_tracked(&self, listener: &str) -> IntGauge {
        self.listeners
            .sources_tracked
            .with_label_values(&[listener])
    }

    /// Count a configuration reload.
    pub fn reload(&self, ok: bool) {
        self.services
            .config_reloads
            .with_label_values(&[if ok { "ok" } else { "error" }])
            .inc();
    }

    /// Publish the running services whose queues and connection limits are read
    /// at scrape time.
    pub fn set_services<S: Limits + 'static>(&self, services: &[Arc<S>]) {
        let weak = services
            .iter()
            .map(|s| {
                let w: std::sync::Weak<S> = Arc::downgrade(s);
                w as std::sync::Weak<dyn Limits>
            })
            .collect();
        self.limits.set(weak);
    }

    /// Publish the set of stick tables read at scrape time.
    pub fn set_tables(&self, tables: Vec<(String, Arc<StickTable>)>) {
        *self.tables.tables.lock().unwrap_or_else(|e| e.into_inner()) = tables;
    }
}

/// `result` values of `crossbar_config_reloads_total`.
pub const RELOAD_RESULTS: [&str; 2] = ["ok", "error"];
/// `reason` values of `crossbar_client_hello_errors_total` (`HelloError::reason`).
pub const HELLO_ERROR_REASONS: [&str; 5] =
    ["not_tls", "too_large", "malformed", "truncated", "timeout"];
/// `result` values of `crossbar_stick_confirm_total` (`conn/confirm.rs`: `Outcome::as_str`).
pub const CONFIRM_RESULTS: [&str; 7] = [
    "first",
    "retried_resumed",
    "none_resumed",
    "budget_empty",
    "not_eligible",
    "hello_retry",
    "ended",
];
/// `reason` values of `crossbar_route_refused_total` for a service (`PickError::reason`).
pub const ROUTE_REFUSED_REASONS: [&str; 3] = ["no_backend", "queue_full", "queue_timeout"];
/// The `reason` of `crossbar_route_refused_total{service="unrouted"}`: no service matched.
pub const UNROUTED_REFUSED_REASON: &str = "no_route";

/// Per-service handles.
#[derive(Clone)]
pub struct ServiceMetrics {
    /// Service name (label value).
    pub name: String,
    lookup_hit: [IntCounter; 4],
    lookup_miss: [IntCounter; 4],
    learned: [IntCounter; 4],
    /// Connection lifetime histogram.
    pub duration: Histogram,
    /// Queue give-ups.
    pub queue_timeouts: IntCounter,
    /// Aborts passed on, by the side that aborted (client, backend).
    resets: [IntCounter; 2],
    hello_errors: IntCounterVec,
    routing_refused: IntCounterVec,
    confirm: IntCounterVec,
    confirm_extra: IntCounterVec,
}

/// Index of a key kind in the 4-element label arrays (prefix lookups count as the
/// key that carried the ticket: `ticket` or `psk`).
fn key_index(kind: KeyKind) -> usize {
    match kind {
        KeyKind::SessionId => 0,
        KeyKind::Ticket | KeyKind::TicketPrefix => 1,
        KeyKind::Psk => 2,
        KeyKind::Source => 3,
    }
}

impl ServiceMetrics {
    /// Count a stick lookup.
    pub fn lookup(&self, kind: KeyKind, hit: bool) {
        let i = key_index(kind);
        if hit {
            self.lookup_hit[i].inc()
        } else {
            self.lookup_miss[i].inc()
        }
    }

    /// Stick lookups so far: (hits, misses), every key kind together.
    pub fn lookup_totals(&self) -> (u64, u64) {
        let sum = |v: &[IntCounter; 4]| v.iter().map(IntCounter::get).sum();
        (sum(&self.lookup_hit), sum(&self.lookup_miss))
    }

    /// Count a learned entry.
    pub fn learned(&self, kind: KeyKind) {
        self.learned[key_index(kind)].inc()
    }

    /// Count a relayed connection `side` aborted (and crossbar reset the other side).
    pub fn reset(&self, side: Peer) {
        let i = match side {
            Peer::Client => 0,
            Peer::Backend => 1,
        };
        self.resets[i].inc()
    }

    /// Count a hello error (rare path: label lookup here is fine).
    pub fn hello_error(&self, reason: &str) {
        self.hello_errors
            .with_label_values(&[&self.name, reason])
            .inc()
    }

    /// Count the outcome of one placement confirmation (once per connection that
    /// offered a session of uncertain placement).
    pub fn confirm(&self, result: &str) {
        self.confirm.with_label_values(&[&self.name, result]).inc()
    }

    /// Count a ClientHello offered to `backend` beyond the first backend.
    pub fn confirm_extra(&self, backend: &str) {
        self.confirm_extra
            .with_label_values(&[&self.name, backend])
            .inc()
    }

    /// Count a refusal after routing (no backend, queue full, ...).
    pub fn refused(&self, reason: &str) {
        self.routing_refused
            .with_label_values(&[&self.name, reason])
            .inc()
    }
}

/// Count a hello error or routing refusal that happened before a service was known.
pub fn unrouted(metrics: &Metrics, hello_reason: Option<&str>, refused: Option<&str>) {
    if let Some(r) = hello_reason {
        metrics
            .services
            .hello_errors
            .with_label_values(&[UNROUTED, r])
            .inc();
    }
    if let Some(r) = refused {
        metrics
            .services
            .routing_refused
            .with_label_values(&[UNROUTED, r])
            .inc();
    }
}

/// Per-backend handles.
#[derive(Clone)]
pub struct BackendMetrics {
    /// Connections relayed.
    pub connections: IntCounter,
    /// Open connections.
    pub active: IntGauge,
    /// 1 when the backend takes new connections.
    pub up: IntGauge,
    /// Its weight now (configured or set at run time).
    pub weight: IntGauge,
    /// Bytes client -> server.
    pub bytes_c2s: IntCounter,
    /// Bytes server -> client.
    pub bytes_s2c: IntCounter,
    /// Failed connects.
    pub connect_errors: IntCounter,
    /// Backends silent for `timeouts.server_hello` after the ClientHello.
    pub server_hello_timeouts: IntCounter,
    /// Connect time.
    pub connect_duration: Histogram,
    /// Resumed handshakes.
    pub resumed: IntCounter,
    /// Full handshakes.
    pub full: IntCounter,
    /// Successful active checks.
    pub check_ok: IntCounter,
    /// Failed active checks.
    pub check_fail: IntCounter,
    /// Since-when, peak and last check (see [`crate::live`]).
    pub live: Arc<BackendLive>,
    /// Its load feedback's factor, samples and polls.
    pub feedback: BackendFeedbackMetrics,
    state: IntGaugeVec,
    service: String,
    backend: String,
}

impl BackendMetrics {
    /// Set the state gauge: 1 for `state`, 0 for the others.
    pub fn set_state(&self, state: State) {
        self.live.note_state(state);
        for s in State::ALL {
            self.state
                .with_label_values(&[&self.service, &self.backend, s.as_str()])
                .set(i64::from(s == state));
        }
    }
}

/// Why the admin endpoint refused a request (`crossbar_admin_requests_refused_total`).
pub const ADMIN_REFUSED_REASONS: [&str; 8] = [
    "host",
    "origin",
    "fetch_site",
    "form_content_type",
    "not_loopback",
    "token",
    "bad_host",
    "body",
];

/// The admin endpoint's own counters: refused requests, and its connection slots.
#[derive(Clone)]
pub struct AdminMetrics {
    requests_refused: IntCounterVec,
    /// Connections closed at accept because every slot held a request in progress.
    pub connections_refused: IntCounter,
    /// Connections without a request in progress closed to make room for a new one.
    pub connections_evicted: IntCounter,
    /// Requests being handled now (headers read, answer not yet produced).
    pub requests_in_progress: IntGauge,
}

impl AdminMetrics {
    fn register(r: &Registry) -> AdminMetrics {
        let requests_refused = counter_vec(
            r,
            "crossbar_admin_requests_refused_total",
            "Admin requests refused by reason (host, origin, fetch_site, \
             form_content_type, not_loopback, token, bad_host, body).",
            &["reason"],
        );
        for reason in ADMIN_REFUSED_REASONS {
            requests_refused.with_label_values(&[reason]);
        }
        let counter = |name: &str, help: &str| {
            let c = IntCounter::new(name, help).expect("static metric definition"); // ok: static
            r.register(Box::new(c.clone())).expect("unique metric name"); // ok: static
            c
        };
        let in_progress = IntGauge::new(
            "crossbar_admin_requests_in_progress",
            "Admin requests being handled now.",
        )
        .expect("static metric definition"); // ok: static
        r.register(Box::new(in_progress.clone()))
            .expect("unique metric name"); // ok: static
        AdminMetrics {
            requests_refused,
            connections_refused: counter(
                "crossbar_admin_connections_refused_total",
                "Admin connections closed at accept: every slot held a request in progress.",
            ),
            connections_evicted: counter(
                "crossbar_admin_connections_evicted_total",
                "Admin connections without a request in progress (idle, or silent since \
                 connecting) closed to make room for a new connection.",
            ),
            requests_in_progress: in_progress,
        }
    }

    /// Count a refused admin request (`reason`: one of [`ADMIN_REFUSED_REASONS`]).
    pub fn refused(&self, reason: &str) {
        self.requests_refused.with_label_values(&[reason]).inc();
    }
}

/// Reads every stick table's stats when Prometheus scrapes.
struct TableCollector {
    tables: Mutex<Vec<(String, Arc<StickTable>)>>,
    entries: IntGaugeVec,
    capacity: IntGaugeVec,
    expired: IntCounterVec,
    evicted: IntCounterVec,
}

impl TableCollector {
    fn new() -> TableCollector {
        let g = |n: &str, h: &str| IntGaugeVec::new(Opts::new(n, h), &["service"]).expect("static"); // ok: static
        let c =
            |n: &str, h: &str| IntCounterVec::new(Opts::new(n, h), &["service"]).expect("static"); // ok: static
        TableCollector {
            tables: Mutex::new(Vec::new()),
            entries: g(
                "crossbar_stick_table_entries",
                "Entries in the service's stick table.",
            ),
            capacity: g(
                "crossbar_stick_table_capacity",
                "Configured size of the stick table.",
            ),
            expired: c(
                "crossbar_stick_expired_total",
                "Stick entries removed because they expired.",
            ),
            evicted: IntCounterVec::new(
                Opts::new(
                    "crossbar_stick_evicted_total",
                    "Stick entries evicted to make room, by segment (probation: unproven; \
                     protected: proven by a resumption).",
                ),
                &["service", "segment"],
            )
            .expect("static"), // ok: static
        }
    }
}

struct TableCollectorHandle(Arc<TableCollector>);

impl Collector for TableCollectorHandle {
    fn desc(&self) -> Vec<&Desc> {
        let t = &self.0;
        [
            t.entries.desc(),
            t.capacity.desc(),
            t.expired.desc(),
            t.evicted.desc(),
        ]
        .concat()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let t = &self.0;
        let tables = t.tables.lock().unwrap_or_else(|e| e.into_inner());
        t.entries.reset();
        t.capacity.reset();
        t.expired.reset();
        t.evicted.reset();
        for (name, table) in tables.iter() {
            let s = table.stats();
            t.entries.with_label_values(&[name]).set(s.entries as i64);
            t.capacity.with_label_values(&[name]).set(s.capacity as i64);
            t.expired.with_label_values(&[name]).inc_by(s.expired);
            let protected = s.evicted_protected.min(s.evicted);
            t.evicted
                .with_label_values(&[name, "probation"])
                .inc_by(s.evicted - protected);
            t.evicted
                .with_label_values(&[name, "protected"])
                .inc_by(protected);
        }
        [
            t.entries.collect(),
            t.capacity.collect(),
            t.expired.collect(),
            t.evicted.collect(),
        ]
        .concat()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::balance::PickError;
    use crate::hello::HelloError;

    #[test]
    fn fixed_label_sets_exist_at_zero_from_the_start() {
        let m = Metrics::new();
        let _svc = m.service("puppet");
        let text = m.encode();
        for line in [
            "crossbar_config_reloads_total{result=\"error\"} 0",
            "crossbar_config_reloads_total{result=\"ok\"} 0",
            "crossbar_client_hello_errors_total{reason=\"timeout\",service=\"puppet\"} 0",
            "crossbar_client_hello_errors_total{reason=\"not_tls\",service=\"unrouted\"} 0",
            "crossbar_route_refused_total{reason=\"no_backend\",service=\"puppet\"} 0",
            "crossbar_route_refused_total{reason=\"no_route\",service=\"unrouted\"} 0",
        ] {
            assert!(text.contains(line), "no `{line}` in:\n{text}");
        }
    }

    #[test]
    fn the_reason_lists_name_every_reason_counted() {
        use HelloError as H;
        for e in [
            H::NotTls,
            H::TooLarge,
            H::Malformed,
            H::Truncated,
            H::Timeout,
        ] {
            assert!(HELLO_ERROR_REASONS.contains(&e.reason()), "{}", e.reason());
        }
        use PickError as P;
        for e in [P::NoBackendAvailable, P::QueueFull, P::QueueTimeout] {
            assert!(
                ROUTE_REFUSED_REASONS.contains(&e.reason()),
                "{}",
                e.reason()
            );
        }
    }
}
