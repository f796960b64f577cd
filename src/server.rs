//! The running balancer: builds services from a config, owns the listeners, and
//! handles reload and graceful shutdown.
//!
//! Connection tasks hold an `Arc<Service>` of the config they were accepted under,
//! so a reload never changes an established connection; each listen address keeps
//! its socket across reloads and only its routing table is swapped.
use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::access_log::LogLimiter;
use crate::config::{Config, ListenConfig, ServiceConfig};
use crate::listener::{self, BindError};
use crate::metrics::Metrics;
use crate::service::{ListenerRoutes, Service, Shared};

/// How often each stick table's sweeper removes expired entries.
const SWEEP_INTERVAL: Duration = Duration::from_secs(5);
/// How long start-up waits for the first ticket-key probe round, so that crossbar
/// knows its backends' key names before it reports ready (listeners already accept).
const FIRST_PROBE_WAIT: Duration = Duration::from_secs(1);
/// After the shutdown grace period, how long cut connections get to finish logging.
const HARD_STOP_GRACE: Duration = Duration::from_secs(2);

struct ListenerHandle {
    routes: Arc<ArcSwap<ListenerRoutes>>,
    local: SocketAddr,
    stop: CancellationToken,
    /// A duplicate of the listening socket, to hand to a successor on upgrade.
    fd: Option<OwnedFd>,
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
}

/// A running balancer.
pub struct Server {
    state: Mutex<State>,
    /// Listening sockets received from a predecessor (upgrade), used instead of
    /// binding when the address matches.
    inherited: Mutex<HashMap<SocketAddr, std::net::TcpListener>>,
    shared: Arc<Shared>,
    tracker: TaskTracker,
    /// The periodic stick-table savers: shutdown waits for a running save before the
    /// last one (saves of one file never overlap: see [`crate::stick::StickTable::save`]).
    savers: TaskTracker,
    accepting: CancellationToken,
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
        let server = Arc::new(Server {
            inherited: Mutex::new(inherited),
            state: Mutex::new(State {
                config: Arc::new(config.clone()),
                services: Vec::new(),
                listeners: HashMap::new(),
            }),
            shared: Arc::new(Shared {
                metrics,
                hard_stop: CancellationToken::new(),
                log_limiter: LogLimiter::new(),
                confirm_budget: crate::budget::Budget::new(config.confirm_budget),
            }),
            tracker: TaskTracker::new(),
            savers: TaskTracker::new(),
            accepting: CancellationToken::new(),
        });
        let probes = server.apply(config)?;
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
            .filter_map(|(k, h)| Some((k.addr, h.fd.as_ref()?.try_clone().ok()?)))
            .collect()
    }

    /// Replace the running configuration: services rebuilt (stick tables and backend
    /// state carried over by name), new addresses bound, removed ones closed, kept
    /// ones re-routed. Established connections are untouched.
    pub fn reload(&self, config: Config) -> Result<(), ServerError> {
        self.apply(config).map(drop)
    }

    /// Re-read the config file and apply it; on any error keep the running config.
    /// Logs and counts the outcome (SIGHUP and `POST /api/reload` both come here);
    /// the error is the reason, for the admin API to return. The admin endpoint itself
    /// (listen address, token) is not reloaded: that needs a restart.
    pub fn reload_file(&self) -> Result<(), String> {
        let path = self.config().source.clone();
        tracing::info!(config = %path.display(), "reloading");
        crate::system::sd_notify("RELOADING=1");
        let result = Config::load(&path)
            .map_err(|e| e.to_string())
            .and_then(|cfg| {
                cfg.log_warnings();
                self.reload(cfg).map_err(|e| e.to_string())
            });
        crate::system::sd_notify("READY=1");
        self.metrics().process.note_reload(&result);
        match result {
            Ok(()) => {
                self.metrics().reload(true);
                tracing::info!("reload complete");
                Ok(())
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

    /// Apply a configuration; returns the first-round signals of the new ticket-key
    /// learners.
    fn apply(
        &self,
        config: Config,
    ) -> Result<Vec<tokio::sync::oneshot::Receiver<()>>, ServerError> {
        let mut st = self.lock();
        let services: Vec<Arc<Service>> = config
            .services
            .iter()
            .map(|sc| {
                let old = st.services.iter().find(|s| s.name() == sc.name);
                Service::build(sc, old, &self.shared.metrics)
            })
            .collect();

        // Group listen addresses.
        let mut by_addr: Vec<(ListenKey, ListenConfig, Vec<Arc<Service>>)> = Vec::new();
        for svc in &services {
            for (i, l) in svc.config.listen.iter().enumerate() {
                let key = ListenKey::new(&svc.config, i, l);
                match by_addr.iter_mut().find(|(k, _, _)| *k == key) {
                    Some((_, _, list)) => list.push(svc.clone()),
                    None => by_addr.push((key, l.clone(), vec![svc.clone()])),
                }
            }
        }

        // Bind new addresses first: if one fails, nothing changes.
        let mut fresh = HashMap::new();
        let mut inherited = self.inherited.lock().unwrap_or_else(|e| e.into_inner());
        for (key, l, _) in &by_addr {
            if st.listeners.contains_key(key) {
                continue;
            }
            let sock = match inherited.remove(&l.addr).filter(|_| key.owner.is_none()) {
                Some(std_sock) => tokio::net::TcpListener::from_std(std_sock)
                    .map_err(|source| BindError::new(l.addr, source))?,
                None => listener::bind(l)?,
            };
            fresh.insert(key.clone(), sock);
        }
        drop(inherited);

        let mut listeners = HashMap::new();
        for (key, l, svcs) in by_addr {
            let routes = Arc::new(ListenerRoutes::build(svcs));
            if let Some(h) = st.listeners.remove(&key) {
                h.routes.store(routes);
                listeners.insert(key, h);
                continue;
            }
            let Some(sock) = fresh.remove(&key) else {
                continue;
            };
            let local = sock.local_addr().unwrap_or(l.addr);
            let handle = ListenerHandle {
                routes: Arc::new(ArcSwap::new(routes)),
                local,
                stop: self.accepting.child_token(),
                fd: key
                    .owner
                    .is_none()
                    .then(|| sock.as_fd().try_clone_to_owned().ok())
                    .flatten(),
            };
            self.spawn_accept(sock, &l, &handle);
            tracing::info!(listen = %local, "listening");
            listeners.insert(key, handle);
        }
        // Addresses no longer configured stop accepting; their connections continue.
        for (_, h) in st.listeners.drain() {
            tracing::info!(listen = %h.local, "listener removed");
            h.stop.cancel();
        }
        // Old services' background tasks stop; removed backends leave the tables.
        for old in &st.services {
            old.tasks.cancel();
            if let Some(new) = services.iter().find(|s| s.name() == old.name()) {
                for b in &old.pool.backends {
                    if new.pool.get(&b.name).is_none() {
                        if let Some(t) = &new.table {
                            t.remove_backend(&b.name);
                        }
                        self.shared.metrics.forget_backend(old.name(), &b.name);
                    }
                }
            }
        }
        let mut probes = Vec::new();
        for svc in &services {
            self.spawn_service_tasks(svc);
            probes.extend(crate::ticket_keys::spawn(svc));
            spawn_saver(svc, &self.savers);
        }
        self.shared.metrics.set_tables(
            services
                .iter()
                .filter_map(|s| s.table.clone().map(|t| (s.name().to_string(), t)))
                .collect(),
        );
        st.listeners = listeners;
        st.services = services;
        self.shared.confirm_budget.set_rate(config.confirm_budget);
        st.config = Arc::new(config);
        Ok(probes)
    }

    fn spawn_accept(&self, sock: tokio::net::TcpListener, l: &ListenConfig, h: &ListenerHandle) {
        let routes = h.routes.clone();
        let shared = self.shared.clone();
        let tracker = self.tracker.clone();
        let label: Arc<str> = Arc::from(h.local.to_string());
        let metrics = shared.metrics.listener(&label);
        let limit = Arc::new(Semaphore::new(l.max_connections));
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

    /// Save every stick table that has a `state_file`.
    pub fn save_tables(&self) {
        for svc in self.services() {
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
        // A periodic save under way finishes first; none starts after this.
        self.savers.close();
        self.savers.wait().await;
        self.tracker.close();
        let open_before = self.tracker.len();
        if tokio::time::timeout(grace, self.tracker.wait())
            .await
            .is_ok()
        {
            self.save_tables();
            return 0;
        }
        let cut = self.tracker.len();
        tracing::warn!(
            connections = cut,
            of = open_before,
            "shutdown grace period over; closing remaining connections"
        );
        self.shared.hard_stop.cancel();
        if tokio::time::timeout(HARD_STOP_GRACE, self.tracker.wait())
            .await
            .is_err()
        {
            tracing::error!("some connections did not close after the hard stop");
        }
        self.save_tables();
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
