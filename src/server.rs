//! The running balancer: builds services from a config, owns the listeners, and
//! handles reload and graceful shutdown.
//!
//! Connection tasks hold an `Arc<Service>` of the config they were accepted under,
//! so a reload never changes an established connection; each listen address keeps
//! its socket across reloads and only its routing table (and its limit, backlog)
//! changes. A reload is a transaction: `Server::prepare` does everything that can
//! fail without writing live state, then one commit under the state lock applies it.
//! What can fail includes the new health settings: a reload that would leave a
//! serving service with no backend able to pass its check is refused (see
//! [`crate::health::gate`]).
use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{BackendConfig, Config, DiscoverConfig, ListenConfig, ServiceConfig};
use crate::discovery::{DiscoveryStatus, Fresh, Registry};
use crate::listener::{self, BindError, ConnLimit};
use crate::log_writer::LogLimiter;
use crate::metrics::Metrics;
use crate::service::{prepare_table, ListenerRoutes, PreparedTable, Service, Shared};

/// How often each stick table's sweeper removes expired entries.
const SWEEP_INTERVAL: Duration = Duration::from_secs(5);
/// How long start-up waits for the first ticket-key probe round, so that crossbar
/// knows its backends' key names before it reports ready (listeners already accept).
const FIRST_PROBE_WAIT: Duration = Duration::from_secs(1);
/// After the shutdown grace period, how long cut connections get to finish logging.
const HARD_STOP_GRACE: Duration = Duration::from_secs(2);

/// Signals the end of a ticket-key learner's first probe round.
type Probe = tokio::sync::oneshot::Receiver<()>;

struct ListenerHandle {
    routes: Arc<ArcSwap<ListenerRoutes>>,
    local: SocketAddr,
    stop: CancellationToken,
    /// A duplicate of the listening socket: to hand to a successor on upgrade, and
    /// to apply a reload's new backlog. Closed at shutdown.
    fd: Option<OwnedFd>,
    /// Its `max_connections`, resized by a reload.
    limit: Arc<ConnLimit>,
    /// The settings in force (the first sharing service's `listen` entry).
    config: ListenConfig,
}

impl ListenerHandle {
    /// Apply a reload's settings to this kept listener: `max_connections` at once
    /// (see [`ConnLimit`]), a new `backlog` by listen(2) again. (A `freebind` change
    /// never gets here: [`check_kept_listeners`] refuses it before the commit.)
    fn update(&mut self, mut new: ListenConfig) {
        if new.max_connections != self.config.max_connections {
            self.limit.set_max(new.max_connections);
            tracing::info!(listen = %self.local, max_connections = new.max_connections, "listener limit changed");
        }
        if new.backlog != self.config.backlog {
            match self
                .fd
                .as_ref()
                .map(|fd| listener::set_backlog(fd, new.backlog))
            {
                Some(Ok(())) => {
                    tracing::info!(listen = %self.local, backlog = new.backlog, "listener backlog changed")
                }
                Some(Err(e)) => {
                    tracing::error!(listen = %self.local, "setting backlog {} failed, keeping {}: {e}", new.backlog, self.config.backlog);
                    new.backlog = self.config.backlog;
                }
                None => {} // shutting down: the socket is closing
            }
        }
        self.config = new;
    }
}

/// Identifies a listener across reloads: its address, or for port 0 (an ephemeral
/// port, used by tests and the demo) the service and position that asked for it,
/// since two `:0` entries are two different sockets.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ListenKey {
    addr: SocketAddr,
    owner: Option<(String, usize)>,
}

impl ListenKey {
    fn new(svc: &ServiceConfig, index: usize, l: &ListenConfig) -> ListenKey {
        ListenKey {
            addr: l.addr,
            owner: (l.addr.port() == 0).then(|| (svc.name.clone(), index)),
        }
    }
}

/// One listen address of a config and the services (indices, config order) on it.
struct ListenGroup {
    key: ListenKey,
    config: ListenConfig,
    services: Vec<usize>,
}

/// A configuration made ready off to the side by [`Server::prepare`]: everything
/// that can fail is done, nothing live is written yet.
struct Prepared {
    config: Config,
    /// Each service's stick table (config order), kept or new.
    tables: Vec<Option<PreparedTable>>,
    groups: Vec<ListenGroup>,
    /// Sockets bound for the addresses the running config does not listen on.
    fresh: HashMap<ListenKey, tokio::net::TcpListener>,
    /// First lookups of new or changed `discover` settings.
    discovered: Vec<Fresh>,
    /// A DNS change, not the operator's reload: run-time weights carry over.
    keep_weights: bool,
}

struct State {
    /// Shared with readers (the status page, the API): reading it copies nothing.
    config: Arc<Config>,
    services: Vec<Arc<Service>>,
    listeners: HashMap<ListenKey, ListenerHandle>,
}

/// Starting or reloading failed.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A listen address could not be bound.
    #[error(transparent)]
    Bind(#[from] BindError),
    /// A kept listen address changed `freebind`, which only matters when binding.
    #[error(
        "listen {addr}: `freebind` changed to {now}, which applies only when the address is bound, \
         and it is bound already: restart crossbar to apply it (or remove the address in one reload \
         and add it back in the next)"
    )]
    FreebindChanged {
        /// The address.
        addr: SocketAddr,
        /// The new setting.
        now: bool,
    },
    /// Preparing the stick tables failed unexpectedly (the task preparing them ended).
    #[error("preparing the stick tables failed: {0}")]
    Tables(String),
    /// The new health settings would fail every backend of a service that has
    /// backends passing now; the reason per service, one a line.
    #[error("{0}")]
    HealthGate(String),
}

/// What [`Server::apply`] is for: a start builds everything new; a reload first
/// probes the new health settings ([`crate::health::gate`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Applying {
    Start,
    Reload,
    /// A `discover` name's answer changed: the running config again, with the new set.
    Discovery,
}

/// A running balancer.
pub struct Server {
    /// Itself, for the discovery watchers (which must not keep it alive).
    me: Weak<Server>,
    state: Mutex<State>,
    /// Every service's DNS discovery (`discover:`): the backends found so far.
    discovery: Registry,
    /// Listening sockets received from a predecessor (upgrade), used instead of
    /// binding when the address matches.
    inherited: Mutex<HashMap<SocketAddr, std::net::TcpListener>>,
    shared: Arc<Shared>,
    tracker: TaskTracker,
    /// The periodic stick-table savers: shutdown waits for a running save before the
    /// last one (saves of one file never overlap: see [`crate::stick::StickTable::save`]).
    savers: TaskTracker,
    accepting: CancellationToken,
    /// Held by a reload from start to commit: reloads run one at a time.
    reloading: tokio::sync::Mutex<()>,
}

impl Server {
    /// Build every service, bind every listen address, start accepting.
    pub async fn start(config: Config, metrics: Arc<Metrics>) -> Result<Arc<Server>, ServerError> {
        Server::start_inheriting(config, metrics, HashMap::new()).await
    }

    /// Like [`Server::start`], accepting on `inherited` sockets (from a predecessor
    /// process, see [`crate::upgrade`]) for the addresses they were listening on.
    /// Inherited sockets the configuration no longer lists are closed.
    pub async fn start_inheriting(
        config: Config,
        metrics: Arc<Metrics>,
        inherited: HashMap<SocketAddr, std::net::TcpListener>,
    ) -> Result<Arc<Server>, ServerError> {
        let server = Arc::new_cyclic(|me| Server {
            me: me.clone(),
            discovery: Registry::default(),
            inherited: Mutex::new(inherited),
            state: Mutex::new(State {
                config: Arc::new(config.clone()),
                services: Vec::new(),
                listeners: HashMap::new(),
            }),
            shared: Arc::new(Shared {
                metrics,
                hard_stop: crate::relay::HardStop::new(),
                log_limiter: LogLimiter::new(),
                confirm_budget: crate::budget::Budget::new(config.confirm_budget),
            }),
            tracker: TaskTracker::new(),
            savers: TaskTracker::new(),
            accepting: CancellationToken::new(),
            reloading: tokio::sync::Mutex::new(()),
        });
        let (probes, _no_gate) = server.apply(config, Applying::Start).await?;
        let first_round = async {
            for rx in probes {
                let _ = rx.await; // ok: a probe task that ended early counts as done
            }
        };
        let _ = tokio::time::timeout(FIRST_PROBE_WAIT, first_round).await; // ok: bounded wait
        let unused =
            std::mem::take(&mut *server.inherited.lock().unwrap_or_else(|e| e.into_inner()));
        for addr in unused.keys() {
            tracing::info!(listen = %addr, "inherited socket not in the configuration: closed");
        }
        Ok(server)
    }

    /// The metrics registry.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.shared.metrics
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The current configuration (shared, not copied: a reload swaps in a new one).
    pub fn config(&self) -> Arc<Config> {
        self.lock().config.clone()
    }

    /// The running services, in config order.
    pub fn services(&self) -> Vec<Arc<Service>> {
        self.lock().services.clone()
    }

    /// One running service.
    pub fn service(&self, name: &str) -> Option<Arc<Service>> {
        self.lock()
            .services
            .iter()
            .find(|s| s.name() == name)
            .cloned()
    }

    /// The addresses a service's listeners are bound to (ports resolved when the
    /// config said port 0).
    pub fn local_addrs(&self, service: &str) -> Vec<SocketAddr> {
        let st = self.lock();
        let Some(svc) = st.services.iter().find(|s| s.name() == service) else {
            return Vec::new();
        };
        svc.config
            .listen
            .iter()
            .enumerate()
            .filter_map(|(i, l)| {
                st.listeners
                    .get(&ListenKey::new(&svc.config, i, l))
                    .map(|h| h.local)
            })
            .collect()
    }

    /// The listening sockets (duplicated) with the addresses the configuration lists
    /// for them, for handing to a successor. Port-0 listeners are not included.
    pub fn listen_sockets(&self) -> Vec<(SocketAddr, OwnedFd)> {
        self.lock()
            .listeners
            .iter()
            .filter(|(k, _)| k.owner.is_none())
            .filter_map(|(k, h)| Some((k.addr, h.fd.as_ref()?.try_clone().ok()?)))
            .collect()
    }

    /// Replace the running configuration: services rebuilt (stick tables and backend
    /// state carried over by name), new addresses bound, removed ones closed, kept
    /// ones re-routed and their limits and backlog changed. Established connections
    /// are untouched. New health settings are probed first and refused when they
    /// would fail every backend of a service that has backends passing now (see
    /// [`crate::health::gate`]); returns the gate's warnings. On error nothing
    /// changed (see `Server::apply`).
    pub async fn reload(&self, config: Config) -> Result<Vec<String>, ServerError> {
        self.apply(config, Applying::Reload)
            .await
            .map(|(_, warnings)| warnings)
    }

    /// Re-read the config file, check it as `crossbar check` does (the files it
    /// names opened too), and apply it; on any error keep the running config. Logs
    /// and counts the outcome (SIGHUP and `POST /api/reload` both come here); returns
    /// the warnings (the file's and the health gate's), or the reason for the admin
    /// API to return. The admin endpoint itself (listen address, token) is not
    /// reloaded: that needs a restart.
    pub async fn reload_file(&self) -> Result<Vec<String>, String> {
        let path = self.config().source.clone();
        tracing::info!(config = %path.display(), "reloading");
        crate::system::sd_notify("RELOADING=1");
        let result = match load_config(path).await {
            Ok(cfg) => {
                cfg.log_warnings();
                let mut warnings: Vec<String> =
                    cfg.warnings.iter().map(|w| w.to_string()).collect();
                match self.reload(cfg).await {
                    Ok(gate) => {
                        for w in &gate {
                            tracing::warn!("{w}");
                        }
                        warnings.extend(gate);
                        Ok(warnings)
                    }
                    Err(e) => Err(e.to_string()),
                }
            }
            Err(e) => Err(e),
        };
        crate::system::sd_notify("READY=1");
        self.metrics().process.note_reload(&result);
        match result {
            Ok(warnings) => {
                self.metrics().reload(true);
                tracing::info!(warnings = warnings.len(), "reload complete");
                Ok(warnings)
            }
            Err(e) => {
                self.metrics().reload(false);
                // One log line per event (journald): the diagnostics joined with "; ".
                let reason = e.lines().collect::<Vec<_>>().join("; ");
                tracing::error!(reason, "reload failed, keeping the running configuration");
                Err(e)
            }
        }
    }

    /// Apply a configuration as one transaction; returns the first-round signals of
    /// the new ticket-key learners and the health gate's warnings. Reloads run one at
    /// a time. Everything that can fail (probing new health settings, reading state
    /// files, binding new addresses, refusing a listener change that can't be
    /// applied) happens off to the side in [`Server::prepare`]; the commit that
    /// follows cannot fail. So a failed reload leaves routes, backend states, stick
    /// tables, metrics and listener limits exactly as they were.
    async fn apply(
        &self,
        config: Config,
        applying: Applying,
    ) -> Result<(Vec<Probe>, Vec<String>), ServerError> {
        let _one_at_a_time = self.reloading.lock().await;
        let (prepared, warnings) = self.prepare(config, applying).await?;
        Ok((self.commit(prepared), warnings))
    }

    /// A discovery watcher found a new set for `service`: apply the running config
    /// again with it, as one transaction like a reload (backends in both sets keep
    /// their state; new ones start down until they pass `rise` checks).
    async fn rediscover(&self, service: &str, cfg: &DiscoverConfig, backends: Vec<BackendConfig>) {
        let _one_at_a_time = self.reloading.lock().await;
        if self.is_draining() || !self.discovery.update(service, cfg, backends) {
            return;
        }
        let config = (*self.config()).clone();
        match self.prepare(config, Applying::Discovery).await {
            Ok((prepared, _)) => {
                self.commit(prepared);
            }
            Err(e) => tracing::error!(service, "applying the discovered backends failed: {e}"),
        }
    }

    /// Start the watcher of one service's `discover` name.
    fn spawn_watch(
        &self,
        service: &str,
        cfg: &DiscoverConfig,
        status: Arc<DiscoveryStatus>,
        found: Vec<BackendConfig>,
        first_wait: Duration,
        stop: CancellationToken,
    ) {
        let (me, name, c) = (self.me.clone(), service.to_string(), cfg.clone());
        let changed: crate::discovery::OnChange = Box::new(move |backends| {
            let (me, name, c) = (me.clone(), name.clone(), c.clone());
            Box::pin(async move {
                if let Some(server) = me.upgrade() {
                    server.rediscover(&name, &c, backends).await;
                }
            })
        });
        tokio::spawn(crate::discovery::watch(
            service.to_string(),
            cfg.clone(),
            status,
            found,
            first_wait,
            stop,
            changed,
        ));
    }

    /// Build the new runtime off to the side: on a reload, probe the new health
    /// settings (the gate's warnings are returned); choose (and load) stick tables,
    /// group the listen addresses, check what changes on kept ones, bind new ones.
    /// Writes nothing live; the state lock is held only to copy what the running
    /// config has. The running config serves on meanwhile.
    async fn prepare(
        &self,
        mut config: Config,
        applying: Applying,
    ) -> Result<(Prepared, Vec<String>), ServerError> {
        let (old, running) = {
            let st = self.lock();
            let running: HashMap<ListenKey, ListenConfig> = st
                .listeners
                .iter()
                .map(|(k, h)| (k.clone(), h.config.clone()))
                .collect();
            (st.services.clone(), running)
        };
        // DNS first: the gate, the state files and the pools see the discovered backends.
        let discovered = self
            .discovery
            .first_lookups(&config, &self.metrics().discovery)
            .await;
        self.discovery.expand(&mut config, &discovered);
        let groups = listen_groups(&config);
        check_kept_listeners(&groups, &running)?;
        let warnings = match applying {
            Applying::Start | Applying::Discovery => Vec::new(),
            Applying::Reload => {
                let mut w = start_only_changes(&self.config(), &config);
                let gate = crate::health::gate::judge(&old, &config).await;
                w.extend(gate.map_err(ServerError::HealthGate)?);
                w
            }
        };
        let tables = prepare_tables(&config, old).await?;
        let fresh = self.bind_new(&groups, &running)?;
        let prepared = Prepared {
            config,
            tables,
            groups,
            fresh,
            discovered,
            keep_weights: applying == Applying::Discovery,
        };
        Ok((prepared, warnings))
    }

    /// Bind every listen address the running config does not listen on yet (or take
    /// the socket a predecessor handed over). If one fails, the ones bound here close.
    fn bind_new(
        &self,
        groups: &[ListenGroup],
        running: &HashMap<ListenKey, ListenConfig>,
    ) -> Result<HashMap<ListenKey, tokio::net::TcpListener>, ServerError> {
        let mut fresh = HashMap::new();
        let mut inherited = self.inherited.lock().unwrap_or_else(|e| e.into_inner());
        for g in groups.iter().filter(|g| !running.contains_key(&g.key)) {
            let l = &g.config;
            let sock = match inherited.remove(&l.addr).filter(|_| g.key.owner.is_none()) {
                Some(std_sock) => tokio::net::TcpListener::from_std(std_sock)
                    .map_err(|source| BindError::new(l.addr, source))?,
                None => listener::bind(l)?,
            };
            fresh.insert(g.key.clone(), sock);
        }
        Ok(fresh)
    }

    /// Make a prepared configuration the running one, in one step under the state
    /// lock: build the services (this is where backend state, stick lifetimes and
    /// metric registrations are written), swap every listener's routes, retire what
    /// the new config drops, start the new services' tasks. Cannot fail.
    fn commit(&self, p: Prepared) -> Vec<Probe> {
        let mut st = self.lock();
        self.discovery.install(
            &p.config,
            p.discovered,
            |svc, cfg, status, found, wait, stop| {
                self.spawn_watch(svc, cfg, status, found, wait, stop)
            },
        );
        let services: Vec<Arc<Service>> = p
            .config
            .services
            .iter()
            .zip(p.tables)
            .map(|(sc, table)| {
                let old = st.services.iter().find(|s| s.name() == sc.name);
                let discovery = self.discovery.status(&sc.name);
                Service::build(sc, old, table, &self.shared.metrics, discovery)
            })
            .collect();
        for svc in &services {
            if let Some(d) = &svc.discovery {
                let found = svc
                    .pool
                    .backends
                    .iter()
                    .filter(|b| b.config.from_dns.is_some());
                d.publish(&found.map(|b| &*b.name).collect::<Vec<_>>());
            }
        }
        if p.keep_weights {
            keep_run_time_weights(&st.services, &services);
        }
        let listeners = self.commit_listeners(&mut st, p.groups, p.fresh, &services);
        let old_listeners = std::mem::replace(&mut st.listeners, listeners);
        let old_services = std::mem::replace(&mut st.services, services.clone());
        self.retire(old_listeners, &old_services, &services);
        let probes = self.spawn_services(&services);
        self.shared.confirm_budget.set_rate(p.config.confirm_budget);
        st.config = Arc::new(p.config);
        probes
    }

    /// The listeners of the new config: kept ones get their new routes and settings
    /// (taken out of `st`), new ones start accepting on their fresh socket.
    fn commit_listeners(
        &self,
        st: &mut State,
        groups: Vec<ListenGroup>,
        mut fresh: HashMap<ListenKey, tokio::net::TcpListener>,
        services: &[Arc<Service>],
    ) -> HashMap<ListenKey, ListenerHandle> {
        let mut listeners = HashMap::new();
        for g in groups {
            let svcs = g.services.iter().map(|&i| services[i].clone()).collect();
            let proxy = g.config.proxy_protocol.clone();
            let mut routes = ListenerRoutes::build(svcs, proxy);
            routes.admission = self.admission(st, &g, &fresh);
            let routes = Arc::new(routes);
            if let Some(mut h) = st.listeners.remove(&g.key) {
                h.routes.store(routes);
                h.update(g.config);
                listeners.insert(g.key, h);
            } else if let Some(sock) = fresh.remove(&g.key) {
                let handle = self.start_listener(sock, g.config, routes);
                listeners.insert(g.key, handle);
            }
        }
        listeners
    }

    /// A listener's per-source table under the new config: the running one kept
    /// (open connections stay counted), a new one, or none.
    fn admission(
        &self,
        st: &State,
        g: &ListenGroup,
        fresh: &HashMap<ListenKey, tokio::net::TcpListener>,
    ) -> Option<Arc<crate::admission::Admission>> {
        let running = st.listeners.get(&g.key);
        let old = running.and_then(|h| h.routes.load().admission.clone());
        let local = running
            .map(|h| h.local)
            .or_else(|| fresh.get(&g.key).and_then(|s| s.local_addr().ok()))
            .unwrap_or(g.config.addr);
        let metrics =
            || crate::admission::SourceMetrics::new(&self.shared.metrics, &local.to_string());
        crate::admission::Admission::carry(old, g.config.per_source.as_ref(), metrics)
    }

    /// Every listener's per-source table, by its bound address.
    pub(crate) fn sources(&self) -> Vec<(SocketAddr, Arc<crate::admission::Admission>)> {
        let mut out: Vec<_> = self
            .lock()
            .listeners
            .values()
            .filter_map(|h| Some((h.local, h.routes.load().admission.clone()?)))
            .collect();
        out.sort_by_key(|(a, _)| *a);
        out
    }

    /// Start accepting on a freshly bound socket.
    fn start_listener(
        &self,
        sock: tokio::net::TcpListener,
        config: ListenConfig,
        routes: Arc<ListenerRoutes>,
    ) -> ListenerHandle {
        let handle = ListenerHandle {
            routes: Arc::new(ArcSwap::new(routes)),
            local: sock.local_addr().unwrap_or(config.addr),
            stop: self.accepting.child_token(),
            fd: sock.as_fd().try_clone_to_owned().ok(),
            limit: ConnLimit::new(config.max_connections),
            config,
        };
        self.spawn_accept(sock, &handle);
        tracing::info!(listen = %handle.local, "listening");
        handle
    }

    /// After the commit: addresses no longer configured stop accepting (their
    /// connections continue); old services' background tasks stop; backends the new
    /// config removed leave the stick tables and the metrics.
    fn retire(
        &self,
        listeners: HashMap<ListenKey, ListenerHandle>,
        old: &[Arc<Service>],
        new: &[Arc<Service>],
    ) {
        for h in listeners.into_values() {
            tracing::info!(listen = %h.local, "listener removed");
            h.stop.cancel();
            self.shared.metrics.forget_listener(&h.local.to_string());
        }
        for o in old {
            o.tasks.cancel();
            let Some(n) = new.iter().find(|s| s.name() == o.name()) else {
                continue;
            };
            for b in o
                .pool
                .backends
                .iter()
                .filter(|b| n.pool.get(&b.name).is_none())
            {
                if let Some(t) = &n.table {
                    t.remove_backend(&b.name);
                }
                self.shared.metrics.forget_backend(o.name(), &b.name);
            }
        }
    }

    /// Start the committed services' tasks (health checks, sweeper, load feedback,
    /// ticket-key learners, saver) and publish their stick tables to the metrics.
    fn spawn_services(&self, services: &[Arc<Service>]) -> Vec<Probe> {
        let mut probes = Vec::new();
        for svc in services {
            self.spawn_service_tasks(svc);
            crate::feedback::spawn(svc);
            probes.extend(crate::ticket_keys::spawn(svc));
            spawn_saver(svc, &self.savers);
        }
        self.shared.metrics.set_tables(
            services
                .iter()
                .filter_map(|s| s.table.clone().map(|t| (s.name().to_string(), t)))
                .collect(),
        );
        probes
    }

    fn spawn_accept(&self, sock: tokio::net::TcpListener, h: &ListenerHandle) {
        let routes = h.routes.clone();
        let shared = self.shared.clone();
        let tracker = self.tracker.clone();
        let label: Arc<str> = Arc::from(h.local.to_string());
        let metrics = shared.metrics.listener(&label);
        let limit = h.limit.clone();
        let stop = h.stop.clone();
        let keepalive = {
            let routes = routes.clone();
            move || routes.load().keepalive
        };
        self.tracker.spawn(listener::accept_loop(
            sock,
            limit,
            metrics,
            stop,
            keepalive,
            move |acc| {
                let routes = routes.load_full();
                tracker.spawn(crate::conn::handle(
                    acc,
                    routes,
                    shared.clone(),
                    label.clone(),
                ));
            },
        ));
    }

    fn spawn_service_tasks(&self, svc: &Arc<Service>) {
        crate::health::spawn_checks(svc);
        if let Some(table) = svc.table.clone() {
            let stop = svc.tasks.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(SWEEP_INTERVAL);
                loop {
                    tokio::select! {
                        () = stop.cancelled() => return,
                        _ = tick.tick() => { table.sweep(); }
                    }
                }
            });
        }
    }

    /// Save every stick table that has a `state_file`, on a blocking thread (file
    /// I/O stays off the runtime workers).
    pub async fn save_tables(&self) {
        let services = self.services();
        if let Err(e) = tokio::task::spawn_blocking(move || save_all(&services)).await {
            tracing::error!("saving the stick tables failed: {e}");
        }
    }

    /// Stop accepting, let established connections finish for up to `grace`, then cut
    /// the rest. Returns the number of connections that had to be cut.
    pub async fn shutdown(&self, grace: Duration) -> usize {
        self.accepting.cancel();
        // Close our duplicates of the listening sockets too: while any copy is open the
        // kernel keeps completing handshakes that nobody would accept. (After an
        // upgrade handover the successor holds its own copies.)
        for h in self.lock().listeners.values_mut() {
            h.fd = None;
        }
        for s in self.services() {
            s.tasks.cancel();
        }
        self.discovery.stop_all();
        // A periodic save under way finishes first; none starts after this.
        self.savers.close();
        self.savers.wait().await;
        self.tracker.close();
        let open_before = self.tracker.len();
        if tokio::time::timeout(grace, self.tracker.wait())
            .await
            .is_ok()
        {
            self.save_tables().await;
            return 0;
        }
        let cut = self.tracker.len();
        tracing::warn!(
            connections = cut,
            of = open_before,
            "shutdown grace period over; closing remaining connections"
        );
        self.shared.hard_stop.stop();
        if tokio::time::timeout(HARD_STOP_GRACE, self.tracker.wait())
            .await
            .is_err()
        {
            tracing::error!("some connections did not close after the hard stop");
        }
        self.save_tables().await;
        cut
    }

    /// Shutdown has begun: no new connections are accepted.
    pub fn is_draining(&self) -> bool {
        self.accepting.is_cancelled()
    }

    /// Connections (and accept loops) still running.
    pub fn open_tasks(&self) -> usize {
        self.tracker.len()
    }
}

/// Save a service's stick table every `save_interval` when it has a `state_file`
/// (and once more at shutdown, by [`Server::shutdown`], after this task ended).
fn spawn_saver(svc: &Arc<Service>, savers: &TaskTracker) {
    let (Some(table), Some(stick)) = (svc.table.clone(), svc.config.stick.as_ref()) else {
        return;
    };
    let Some(path) = stick.state_file.clone() else {
        return;
    };
    let (every, stop, name) = (
        stick.save_interval,
        svc.tasks.clone(),
        svc.config.name.clone(),
    );
    savers.spawn(async move {
        let mut tick = tokio::time::interval(every);
        // Saves longer than the interval are followed by the next one, not a burst.
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await; // the first tick is immediate: nothing new to save yet
        loop {
            tokio::select! {
                biased;
                () = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let (t, p) = (table.clone(), path.clone());
            match tokio::task::spawn_blocking(move || t.save(&p)).await {
                Ok(Ok(n)) => tracing::debug!(service = %name, entries = n, "stick table saved"),
                Ok(Err(e)) => {
                    tracing::error!(service = %name, "saving stick table to {} failed: {e}", path.display())
                }
                Err(e) => tracing::error!(service = %name, "stick table save task failed: {e}"),
            }
        }
    });
}

/// Save every stick table of `services` that has a `state_file` (blocking I/O).
fn save_all(services: &[Arc<Service>]) {
    for svc in services {
        let (Some(t), Some(path)) = (
            &svc.table,
            svc.config
                .stick
                .as_ref()
                .and_then(|s| s.state_file.as_ref()),
        ) else {
            continue;
        };
        match t.save(path) {
            Ok(n) => {
                tracing::info!(service = %svc.name(), entries = n, "stick table saved to {}", path.display())
            }
            Err(e) => {
                tracing::error!(service = %svc.name(), "saving stick table to {} failed: {e}", path.display())
            }
        }
    }
}

/// Load the config file on a blocking thread (a reload reads it while serving) and
/// check it as `crossbar check` does: every file it names is opened too, so a
/// missing `ca_file` is refused here rather than taking every backend down.
async fn load_config(path: std::path::PathBuf) -> Result<Config, String> {
    match tokio::task::spawn_blocking(move || Config::load_and_check_files(&path)).await {
        Ok(loaded) => loaded.map_err(|e| e.to_string()),
        Err(e) => Err(format!("reading the config file failed: {e}")),
    }
}

/// The listen addresses of `config`, each with the services (indices) on it.
/// A DNS change rebuilds the pools; a weight the operator set at run time on a
/// backend that stays (same name, same weight in the answer) is kept: only a reload
/// or a restart returns to the configured weight. A backend whose answer now gives
/// another weight takes the answer's.
fn keep_run_time_weights(old: &[Arc<Service>], new: &[Arc<Service>]) {
    for svc in new {
        let Some(was) = old.iter().find(|o| o.name() == svc.name()) else {
            continue;
        };
        for b in &svc.pool.backends {
            let kept = was.pool.backends.iter().find(|o| {
                o.name == b.name
                    && o.config.weight == b.config.weight
                    && o.weight() != o.config.weight
            });
            if let Some(o) = kept {
                b.set_weight(o.weight());
            }
        }
    }
}

fn listen_groups(config: &Config) -> Vec<ListenGroup> {
    let mut groups: Vec<ListenGroup> = Vec::new();
    for (si, sc) in config.services.iter().enumerate() {
        for (i, l) in sc.listen.iter().enumerate() {
            let key = ListenKey::new(sc, i, l);
            match groups.iter_mut().find(|g| g.key == key) {
                Some(g) => g.services.push(si),
                None => groups.push(ListenGroup {
                    key,
                    config: l.clone(),
                    services: vec![si],
                }),
            }
        }
    }
    groups
}

/// Refuse what a kept listen address can't change without a new socket: `freebind`
/// only matters when binding, and the address is bound already. (A rebind would
/// drop the connections queued on the socket; a refusal is clear, ignoring is not.)
fn check_kept_listeners(
    groups: &[ListenGroup],
    running: &HashMap<ListenKey, ListenConfig>,
) -> Result<(), ServerError> {
    for g in groups {
        if let Some(now) = running.get(&g.key) {
            if now.freebind != g.config.freebind {
                return Err(ServerError::FreebindChanged {
                    addr: g.config.addr,
                    now: g.config.freebind,
                });
            }
        }
    }
    Ok(())
}

/// Choose every service's stick table off to the side (see [`prepare_table`]), on a
/// blocking thread: a new table is filled from its state file.
async fn prepare_tables(
    config: &Config,
    old: Vec<Arc<Service>>,
) -> Result<Vec<Option<PreparedTable>>, ServerError> {
    let services = config.services.clone();
    tokio::task::spawn_blocking(move || {
        services
            .iter()
            .map(|sc| prepare_table(sc, old.iter().find(|s| s.name() == sc.name)))
            .collect()
    })
    .await
    .map_err(|e| ServerError::Tables(e.to_string()))
}

/// What a reload from `old` to `new` changes that only a start reads: `workers`
/// (the runtime is built once) and the admin endpoint's address and token file
/// (bound and read once). The reload applies the rest; these say so.
fn start_only_changes(old: &Config, new: &Config) -> Vec<String> {
    let mut changed = Vec::new();
    if old.workers != new.workers {
        let n = |w: Option<usize>| w.map_or("one per core".to_string(), |n| n.to_string());
        changed.push(format!(
            "`workers` changed from {} to {}: the runtime keeps its threads until a restart or upgrade",
            n(old.workers),
            n(new.workers)
        ));
    }
    let listen = |c: &Config| c.admin.as_ref().map(|a| a.listen);
    let token = |c: &Config| c.admin.as_ref().and_then(|a| a.token_file.clone());
    if listen(old) != listen(new) {
        let at = |l: Option<SocketAddr>| l.map_or("off".to_string(), |a| a.to_string());
        changed.push(format!(
            "`admin` changed from {} to {}: the admin endpoint stays as it is until a restart or upgrade",
            at(listen(old)),
            at(listen(new))
        ));
    } else if token(old) != token(new) {
        changed.push(
            "`admin.token_file` changed: the token read at start stays in force until a restart or upgrade"
                .to_string(),
        );
    }
    changed
}
