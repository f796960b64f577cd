//! The runtime model: a service as built from its config (backends, stick table,
//! metrics), the routing of a listen address, and what every connection task of the
//! process reaches ([`ProcessWide`]).
//!
//! Everything here is immutable once built; a reload builds new values and swaps
//! them in, so a connection keeps the `Arc<Service>` it was accepted under.
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::balance::{Pool, PoolParams};
use crate::config::{Keepalive, Mode, OnNonTls, ProxyAccept, ServiceConfig, StickConfig, StickOn};
use crate::log_writer::LogLimiter;
use crate::metrics::{Metrics, ServiceMetrics};
use crate::open_connections::OpenConnections;
use crate::route::Routes;
use crate::stick::{
    BackendIndex, KeyKind, StickMetrics, StickTable, Sticking, TableParams, RESUME_HINT_TTL,
};

/// One service at runtime.
pub struct Service {
    /// Its configuration.
    pub config: ServiceConfig,
    /// Its backends.
    pub pool: Pool,
    /// Its stick table, if stickiness is on.
    pub table: Option<Arc<StickTable>>,
    /// Metric handles.
    pub metrics: ServiceMetrics,
    /// Cancels this service's background tasks (sweeper, health checks, saver).
    pub tasks: CancellationToken,
    /// Its open connections (handed over by a reload, like the backends' state).
    pub connections: Arc<OpenConnections>,
    /// Its DNS discovery's status, when it has `discover:`.
    pub discovery: Option<Arc<crate::discovery::DiscoveryStatus>>,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("name", &self.config.name)
            .finish()
    }
}

impl Service {
    /// The service name.
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// The service's stickiness (table, rules, pool, counters), if it has a table.
    pub fn sticking(&self) -> Option<Sticking<'_>> {
        Some(Sticking {
            table: self.table.as_deref()?,
            config: self.config.stick.as_ref()?,
            backends: &self.pool,
            metrics: &self.metrics,
        })
    }

    /// Build a service from its config, as the commit step of a reload does: this
    /// writes live state and cannot fail. `old`, the same-named service of the running
    /// config, hands over its backends' live state and queue (see [`Pool::new`]);
    /// `table` is the stick table [`prepare_table`] chose off to the side. A kept
    /// table takes the new lifetimes here (`expire`, `source_expire`, `source` added
    /// to or removed from `stick.on`), never before the commit.
    pub fn build(
        sc: &ServiceConfig,
        old: Option<&Arc<Service>>,
        table: Option<PreparedTable>,
        metrics: &Arc<Metrics>,
        discovery: Option<Arc<crate::discovery::DiscoveryStatus>>,
    ) -> Arc<Service> {
        let pool = Pool::new(
            &sc.backends,
            PoolParams {
                algo: sc.balance,
                slow_start: sc.slow_start,
                queue_size: sc.queue_size,
                queue_timeout: sc.timeouts.queue,
            },
            |b| metrics.backend(&sc.name, &b.name),
            old.map(|o| &o.pool),
        );
        let table = table.map(|t| match t {
            PreparedTable::Kept(t) => {
                if let Some(st) = &sc.stick {
                    let params = table_params(st);
                    t.set_lifetimes(params.expire, params.source_expire);
                }
                t
            }
            PreparedTable::New(t) => t,
        });
        Arc::new(Service {
            config: sc.clone(),
            pool,
            table,
            metrics: metrics.service(&sc.name),
            tasks: CancellationToken::new(),
            connections: old.map(|o| o.connections.clone()).unwrap_or_default(),
            discovery,
        })
    }

    /// Is this key kind enabled for the service?
    pub fn sticks_on(&self, key: StickOn) -> bool {
        self.config
            .stick
            .as_ref()
            .is_some_and(|s| s.on.contains(&key))
    }
}

/// Routing and hello policy of one listen address (swapped whole on reload).
#[derive(Debug)]
pub struct ListenerRoutes {
    /// SNI -> service.
    pub routes: Routes<Service>,
    /// No inspection at all: a single `mode: tcp` service.
    pub tcp: bool,
    /// Longest client_hello timeout among the address's services.
    pub hello_timeout: Duration,
    /// Largest max_hello_size among the address's services.
    pub max_hello: usize,
    /// Where non-TLS bytes go when a service allows it: the single service, or the
    /// default service of a shared address, if it has `on_non_tls: forward`.
    pub non_tls: Option<Arc<Service>>,
    /// The keepalive the listening socket passes on to accepted connections (the
    /// first service's; connections of a service with another setting set their own).
    pub keepalive: Option<Keepalive>,
    /// Whose PROXY headers are read (`listen[].proxy_protocol`).
    pub proxy: Option<ProxyAccept>,
    /// Per-source limits and their table (`listen[].per_source`), kept across reloads.
    pub admission: Option<Arc<crate::admission::Admission>>,
}

/// What every connection task of the process reaches: the metrics registry, the
/// hard stop, the log-line limiter and the confirmation budget. One per process,
/// kept across reloads.
pub struct ProcessWide {
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Fires when established connections must be cut (end of shutdown grace).
    pub hard_stop: crate::relay::HardStop,
    /// Limits repetitive error log lines.
    pub log_limiter: LogLimiter,
    /// Extra backend handshakes placement confirmation may still spend.
    pub confirm_budget: crate::budget::Budget,
    /// The local addresses of our open backend connections (never dial yourself).
    pub own_sockets: Arc<crate::dial::OwnSockets>,
}

impl StickMetrics for ServiceMetrics {
    fn lookup(&self, kind: KeyKind, hit: bool) {
        ServiceMetrics::lookup(self, kind, hit);
    }

    fn learned(&self, kind: KeyKind) {
        ServiceMetrics::learned(self, kind);
    }
}

impl BackendIndex for Pool {
    fn position(&self, name: &str) -> Option<usize> {
        Pool::position(self, name)
    }
}

/// The stick table of a service being prepared, chosen off to the side (nothing
/// live is written; see [`Service::build`] for the commit).
#[derive(Debug)]
pub enum PreparedTable {
    /// The running table, kept because its size is unchanged (a reload keeps every
    /// entry; the new lifetimes apply to old entries too, from the commit on).
    Kept(Arc<StickTable>),
    /// A new table, filled from the `state_file` if there is one; nobody uses it yet.
    New(Arc<StickTable>),
}

/// Choose the stick table of `sc`: the running one if its size is unchanged, else a
/// new one filled from the `state_file`. Reads that file: call it on a blocking
/// thread, never on a runtime worker or under a lock (see
/// [`StickTable::load`], which never waits on a FIFO).
pub fn prepare_table(sc: &ServiceConfig, old: Option<&Arc<Service>>) -> Option<PreparedTable> {
    let st = sc.stick.as_ref()?;
    let same_size = |o: &&Arc<Service>| o.config.stick.as_ref().is_some_and(|p| p.size == st.size);
    if let Some(t) = old.filter(same_size).and_then(|o| o.table.clone()) {
        return Some(PreparedTable::Kept(t));
    }
    let t = StickTable::new(table_params(st));
    if let Some(path) = &st.state_file {
        let names: Vec<&str> = sc.backends.iter().map(|b| b.name.as_str()).collect();
        // A `discover` service's backends are not known before DNS answers: its
        // entries for up to `max_backends` other names wait for them.
        let discovered = sc.discover.as_ref().map_or(0, |d| d.max_backends);
        match t.load_discovering(path, &names, discovered) {
            Ok(n) => {
                tracing::info!(service = %sc.name, entries = n, "stick table loaded from {}", path.display())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(service = %sc.name, "ignoring stick table file {}: {e}", path.display())
            }
        }
    }
    Some(PreparedTable::New(Arc::new(t)))
}

fn table_params(st: &StickConfig) -> TableParams {
    TableParams {
        size: st.size,
        expire: st.expire,
        source_expire: if st.on.contains(&StickOn::Source) {
            st.source_expire
        } else {
            RESUME_HINT_TTL.min(st.expire)
        },
    }
}

impl ListenerRoutes {
    /// The routing of one listen address shared by `svcs` (in config order), which
    /// reads PROXY headers as `proxy` says.
    pub fn build(svcs: Vec<Arc<Service>>, proxy: Option<ProxyAccept>) -> ListenerRoutes {
        let hello_timeout = svcs
            .iter()
            .map(|s| s.config.timeouts.client_hello)
            .max()
            .unwrap_or_default();
        let max_hello = svcs
            .iter()
            .map(|s| s.config.max_hello_size)
            .max()
            .unwrap_or_default();
        let keepalive = svcs.first().and_then(|s| s.config.keepalive);
        if let [only] = svcs.as_slice() {
            return ListenerRoutes {
                keepalive,
                tcp: only.config.mode == Mode::Tcp,
                non_tls: (only.config.on_non_tls == OnNonTls::Forward).then(|| only.clone()),
                routes: Routes::single(only.clone()),
                hello_timeout,
                max_hello,
                proxy,
                admission: None,
            };
        }
        let non_tls = svcs
            .iter()
            .find(|s| s.config.default && s.config.on_non_tls == OnNonTls::Forward)
            .cloned();
        ListenerRoutes {
            routes: Routes::shared(
                svcs.into_iter()
                    .map(|s| (s.config.server_names.clone(), s.config.default, s))
                    .collect(),
            ),
            tcp: false,
            hello_timeout,
            max_hello,
            non_tls,
            keepalive,
            proxy,
            admission: None,
        }
    }
}

impl crate::metrics::Limits for Service {
    fn label(&self) -> &str {
        self.name()
    }

    fn waiting(&self) -> usize {
        self.pool.queued()
    }

    fn queue_places(&self) -> usize {
        self.config.queue_size
    }

    fn backend_limits(&self) -> Vec<(Arc<str>, u32)> {
        self.pool
            .backends
            .iter()
            .filter_map(|b| b.max_connections().map(|m| (b.name.clone(), m)))
            .collect()
    }
}
