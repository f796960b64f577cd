//! The reload task: the one owner of the running configuration. Every change to it
//! (SIGHUP, `POST /api/reload`, a DNS watcher's new answer, a library caller's
//! config) is a [`Request`] on one channel; the task takes them one at a time,
//! builds the new runtime off to the side ([`ReloadTask::prepare`]), commits it in
//! one step ([`ReloadTask::commit`]), publishes the result for readers and answers.
//! Nothing else prepares or commits, so reloads never overlap and no lock is held.
//!
//! What can fail includes the new health settings: a reload that would leave a
//! serving service with no backend able to pass its check is refused (see
//! [`crate::health::gate`]). A failed request leaves routes, backend states, stick
//! tables, metrics and listener limits exactly as they were.
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::listeners::{listen_groups, FreebindChanged, ListenGroup, Listeners, NewSockets};
use super::running::{Published, Running};
use super::services::{self, Probe};
use crate::config::{Config, ConfigError};
use crate::discovery::{DnsChange, FirstLookup, Registry};
use crate::listener::BindError;
use crate::service::{prepare_table, PreparedTable, ProcessWide, Service};

/// How many requests may wait for the task; a sender beyond that waits its turn.
const QUEUE: usize = 64;

/// A change asked of the running configuration: what the reload task takes from its
/// channel, one at a time.
///
/// Operator writes that must outlive a reload, and DNS answers for several names at
/// once, are requests to add here. Load feedback is not one: it scales the weights
/// of the backends in force and never changes what runs.
#[derive(Debug)]
pub(crate) enum Request {
    /// Re-read the config file, check it as `crossbar check` does (the files it
    /// names opened too), and apply it; logged, counted and shown on the status page
    /// (SIGHUP, `POST /api/reload`).
    ReloadFile {
        /// Where the outcome goes.
        reply: Reply,
    },
    /// Apply a configuration already loaded, as a reload does (library callers and
    /// tests); not counted as a reload of the file.
    Apply {
        /// The new configuration.
        config: Box<Config>,
        /// Where the outcome goes.
        reply: Reply,
    },
    /// A DNS watcher's name answered a new set of backends: the running config
    /// again, with that set. Nobody waits for the outcome; a failure is logged.
    Dns(Box<DnsChange>),
}

impl From<DnsChange> for Request {
    fn from(change: DnsChange) -> Request {
        Request::Dns(Box::new(change))
    }
}

/// An applied change's warnings (the file's, the health gate's, what only a
/// restart applies), or why nothing changed.
pub type Outcome = Result<Vec<String>, ApplyError>;

/// Where the task sends a request's [`Outcome`].
pub(crate) type Reply = oneshot::Sender<Outcome>;

/// A configuration could not be applied (at start, at a reload, or for a DNS
/// answer); the running one, if any, is unchanged.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The config file does not load, or fails a check (`file:line:col: ...`, one
    /// problem a line).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The thread reading the config file ended before it answered.
    #[error("reading the config file failed: {0}")]
    Read(tokio::task::JoinError),
    /// A listen address could not be bound.
    #[error(transparent)]
    Bind(#[from] BindError),
    /// A kept listen address changed `freebind`, which only matters when binding.
    #[error(transparent)]
    FreebindChanged(#[from] FreebindChanged),
    /// Preparing the stick tables failed unexpectedly (the task preparing them ended).
    #[error("preparing the stick tables failed: {0}")]
    Tables(tokio::task::JoinError),
    /// The new health settings would fail every backend of a service that has
    /// backends passing now; the reason per service, one a line.
    #[error("{0}")]
    HealthGate(String),
    /// Shutdown has begun: the reload task takes no more requests.
    #[error("crossbar is shutting down: the running configuration stays until it exits")]
    ShuttingDown,
}

/// The sending side of the reload task's channel.
#[derive(Clone)]
pub(crate) struct Requests(mpsc::Sender<Request>);

impl Requests {
    /// Send a request made around its reply channel and wait for the outcome.
    pub(crate) async fn ask(&self, request: impl FnOnce(Reply) -> Request) -> Outcome {
        let (reply, outcome) = oneshot::channel();
        if self.0.send(request(reply)).await.is_err() {
            return Err(ApplyError::ShuttingDown);
        }
        outcome.await.unwrap_or(Err(ApplyError::ShuttingDown))
    }
}

/// What a request applies: a start builds everything new; a reload first probes
/// the new health settings ([`crate::health::gate`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Applying {
    Start,
    Reload,
    /// A `discover` name's answer changed: the running config again, with the new set.
    Discovery,
}

/// A configuration made ready off to the side by [`ReloadTask::prepare`]: everything
/// that can fail is done, nothing live is written yet.
struct Prepared {
    config: Config,
    /// Each service's stick table (config order), kept or new.
    tables: Vec<Option<PreparedTable>>,
    groups: Vec<ListenGroup>,
    /// Sockets bound for the addresses the running config does not listen on.
    fresh: NewSockets,
    /// First lookups of new or changed `discover` settings.
    discovered: Vec<FirstLookup>,
    /// A DNS change, not the operator's reload: run-time weights carry over.
    keep_weights: bool,
}

/// What the reload task is started with.
pub(super) struct Parts {
    /// The configuration about to start.
    pub(super) config: Config,
    /// Listening sockets received from a predecessor (upgrade), used instead of
    /// binding at start when the address matches.
    pub(super) inherited: HashMap<SocketAddr, std::net::TcpListener>,
    /// Where readers find the running configuration.
    pub(super) published: Published,
    /// What every connection shares.
    pub(super) shared: Arc<ProcessWide>,
    /// Where connection tasks and accept loops are tracked.
    pub(super) tracker: TaskTracker,
    /// Where the periodic stick-table savers are tracked.
    pub(super) savers: TaskTracker,
    /// Cancelled when shutdown begins; the task then ends.
    pub(super) accepting: CancellationToken,
}

/// The reload task's state: the running configuration and everything that changes
/// with it. Only the task itself reads or writes it.
pub(super) struct ReloadTask {
    config: Arc<Config>,
    services: Vec<Arc<Service>>,
    listeners: Listeners,
    /// Every service's DNS discovery (`discover:`): the backends found so far.
    discovery: Registry,
    inherited: HashMap<SocketAddr, std::net::TcpListener>,
    published: Published,
    shared: Arc<ProcessWide>,
    savers: TaskTracker,
    stopping: CancellationToken,
    /// Handed to the DNS watchers this task starts: their changes come back here.
    requests: mpsc::Sender<Request>,
    inbox: mpsc::Receiver<Request>,
}

impl ReloadTask {
    /// Make the task's state and its channel (nothing runs yet).
    pub(super) fn new(p: Parts) -> (ReloadTask, Requests) {
        let (requests, inbox) = mpsc::channel(QUEUE);
        let listeners = Listeners::new(super::listeners::AcceptContext {
            shared: p.shared.clone(),
            tracker: p.tracker,
            accepting: p.accepting.clone(),
        });
        let task = ReloadTask {
            config: Arc::new(p.config),
            services: Vec::new(),
            listeners,
            discovery: Registry::default(),
            inherited: p.inherited,
            published: p.published,
            shared: p.shared,
            savers: p.savers,
            stopping: p.accepting,
            requests: requests.clone(),
            inbox,
        };
        (task, Requests(requests))
    }

    /// The first transaction: build every service, bind every listen address, start
    /// accepting. Returns the first-round signals of the ticket-key learners and the
    /// inherited sockets the configuration does not use (the caller closes them).
    pub(super) async fn start(
        &mut self,
    ) -> Result<(Vec<Probe>, HashMap<SocketAddr, std::net::TcpListener>), ApplyError> {
        let config = (*self.config).clone();
        let (prepared, _no_gate) = self.prepare(config, Applying::Start).await?;
        let probes = self.commit(prepared);
        Ok((probes, std::mem::take(&mut self.inherited)))
    }

    /// Take requests until shutdown begins; then close the listening sockets' copies,
    /// stop the services' background tasks and the DNS watchers. A request under way
    /// when shutdown begins is abandoned before its commit (nothing live was written)
    /// and answered [`ApplyError::ShuttingDown`].
    pub(super) async fn serve(mut self) {
        let stopping = self.stopping.clone();
        loop {
            let request = tokio::select! {
                biased;
                () = stopping.cancelled() => break,
                r = self.inbox.recv() => match r {
                    Some(r) => r,
                    None => break,
                },
            };
            tokio::select! {
                biased;
                () = stopping.cancelled() => break,
                () = self.handle(request) => {}
            }
        }
        self.stop();
    }

    async fn handle(&mut self, request: Request) {
        match request {
            Request::ReloadFile { reply } => {
                let outcome = self.reload_file().await;
                let _ = reply.send(outcome); // ok: the asker may have gone
            }
            Request::Apply { config, reply } => {
                let outcome = self.reload(*config).await;
                let _ = reply.send(outcome); // ok: the asker may have gone
            }
            Request::Dns(change) => self.rediscover(*change).await,
        }
    }

    /// Re-read the config file, check it, and apply it; on any error keep the running
    /// config. Logs and counts the outcome. The admin endpoint itself (listen
    /// address, token) is not reloaded: that needs a restart.
    async fn reload_file(&mut self) -> Outcome {
        let path = self.config.source.clone();
        tracing::info!(config = %path.display(), "reloading");
        crate::system::sd_notify("RELOADING=1");
        let result = match load_config(path).await {
            Ok(cfg) => {
                cfg.log_warnings();
                let mut warnings: Vec<String> =
                    cfg.warnings.iter().map(|w| w.to_string()).collect();
                self.reload(cfg).await.map(|gate| {
                    for w in &gate {
                        tracing::warn!("{w}");
                    }
                    warnings.extend(gate);
                    warnings
                })
            }
            Err(e) => Err(e),
        };
        crate::system::sd_notify("READY=1");
        let metrics = &self.shared.metrics;
        let shown = result.as_ref().map(Clone::clone).map_err(|e| e.to_string());
        metrics.process.note_reload(&shown);
        match &shown {
            Ok(warnings) => {
                metrics.reload(true);
                tracing::info!(warnings = warnings.len(), "reload complete");
            }
            Err(e) => {
                metrics.reload(false);
                // One log line per event (journald): the diagnostics joined with "; ".
                let reason = e.lines().collect::<Vec<_>>().join("; ");
                tracing::error!(reason, "reload failed, keeping the running configuration");
            }
        }
        result
    }

    /// Replace the running configuration: services rebuilt (stick tables and backend
    /// state carried over by name), new addresses bound, removed ones closed, kept
    /// ones re-routed and their limits and backlog changed. Established connections
    /// are untouched. New health settings are probed first and refused when they
    /// would fail every backend of a service that has backends passing now; returns
    /// the gate's warnings.
    async fn reload(&mut self, config: Config) -> Outcome {
        let (prepared, warnings) = self.prepare(config, Applying::Reload).await?;
        self.commit(prepared);
        Ok(warnings)
    }

    /// A discovery watcher found a new set: apply the running config again with it,
    /// as one transaction like a reload (backends in both sets keep their state; new
    /// ones start down until they pass `rise` checks). A change that is stale (its
    /// watcher was replaced) or changes nothing commits nothing.
    async fn rediscover(&mut self, change: DnsChange) {
        let service = change.service.clone();
        if !self.discovery.update(change) {
            return;
        }
        let config = (*self.config).clone();
        match self.prepare(config, Applying::Discovery).await {
            Ok((prepared, _)) => {
                self.commit(prepared);
            }
            Err(e) => tracing::error!(service, "applying the discovered backends failed: {e}"),
        }
    }

    /// Build the new runtime off to the side: on a reload, probe the new health
    /// settings (the gate's warnings are returned); choose (and load) stick tables,
    /// group the listen addresses, check what changes on kept ones, bind new ones.
    /// Writes nothing live: the running config serves on meanwhile.
    async fn prepare(
        &mut self,
        mut config: Config,
        applying: Applying,
    ) -> Result<(Prepared, Vec<String>), ApplyError> {
        // DNS first: the gate, the state files and the pools see the discovered backends.
        let discovered = self
            .discovery
            .first_lookups(&config, &self.shared.metrics.discovery)
            .await;
        self.discovery.expand(&mut config, &discovered);
        let groups = listen_groups(&config);
        self.listeners.check_kept(&groups)?;
        let warnings = match applying {
            Applying::Start | Applying::Discovery => Vec::new(),
            Applying::Reload => {
                let mut w = start_only_changes(&self.config, &config);
                let gate = crate::health::gate::judge(&self.services, &config).await;
                w.extend(gate.map_err(ApplyError::HealthGate)?);
                w
            }
        };
        let tables = prepare_tables(&config, self.services.clone()).await?;
        let fresh = self.listeners.bind_new(&groups, &mut self.inherited)?;
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

    /// Make a prepared configuration the running one, in one step: build the
    /// services (this is where backend state, stick lifetimes and metric
    /// registrations are written), swap every listener's routes, retire what the new
    /// config drops, start the new services' tasks, publish. Cannot fail; returns the
    /// first-round signals of the new ticket-key learners.
    fn commit(&mut self, p: Prepared) -> Vec<Probe> {
        self.discovery
            .install(&p.config, p.discovered, &self.requests);
        let services: Vec<Arc<Service>> = p
            .config
            .services
            .iter()
            .zip(p.tables)
            .map(|(sc, table)| {
                let old = self.services.iter().find(|s| s.name() == sc.name);
                let discovery = self.discovery.status(&sc.name);
                Service::build(sc, old, table, &self.shared.metrics, discovery)
            })
            .collect();
        publish_discovered(&services);
        if p.keep_weights {
            services::keep_run_time_weights(&self.services, &services);
        }
        self.listeners.commit(p.groups, p.fresh, &services);
        let old = std::mem::replace(&mut self.services, services);
        services::retire(&old, &self.services, &self.shared.metrics);
        let probes = services::spawn(&self.services, &self.shared.metrics, &self.savers);
        self.shared.confirm_budget.set_rate(p.config.confirm_budget);
        self.config = Arc::new(p.config);
        self.publish();
        probes
    }

    /// Show readers what runs now.
    fn publish(&self) {
        let running = Running::new(self.config.clone(), self.services.clone(), &self.listeners);
        self.published.store(Arc::new(running));
    }

    /// Shutdown: our copies of the listening sockets close (while any copy is open
    /// the kernel keeps completing handshakes that nobody would accept), the
    /// services' background tasks and the DNS watchers stop.
    fn stop(mut self) {
        self.listeners.close_sockets();
        self.publish();
        for s in &self.services {
            s.tasks.cancel();
        }
        self.discovery.stop_all();
    }
}

/// Each service's discovery status learns which of its backends came from DNS.
fn publish_discovered(services: &[Arc<Service>]) {
    for svc in services {
        if let Some(d) = &svc.discovery {
            let found = svc
                .pool
                .backends
                .iter()
                .filter(|b| b.config.from_dns.is_some());
            d.publish(&found.map(|b| &*b.name).collect::<Vec<_>>());
        }
    }
}

/// Load the config file on a blocking thread (a reload reads it while serving) and
/// check it as `crossbar check` does: every file it names is opened too, so a
/// missing `ca_file` is refused here rather than taking every backend down.
async fn load_config(path: std::path::PathBuf) -> Result<Config, ApplyError> {
    match tokio::task::spawn_blocking(move || Config::load_and_check_files(&path)).await {
        Ok(loaded) => Ok(loaded?),
        Err(e) => Err(ApplyError::Read(e)),
    }
}

/// Choose every service's stick table off to the side (see [`prepare_table`]), on a
/// blocking thread: a new table is filled from its state file.
async fn prepare_tables(
    config: &Config,
    old: Vec<Arc<Service>>,
) -> Result<Vec<Option<PreparedTable>>, ApplyError> {
    let services = config.services.clone();
    tokio::task::spawn_blocking(move || {
        services
            .iter()
            .map(|sc| prepare_table(sc, old.iter().find(|s| s.name() == sc.name)))
            .collect()
    })
    .await
    .map_err(ApplyError::Tables)
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
