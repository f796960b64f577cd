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
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::listeners::{listen_groups, FreebindChanged, ListenGroup, Listeners, NewSockets};
use super::operator::{Judged, Operating, OperatorState};
use super::reload_guard;
use super::running::{Published, Running};
use super::services::{self, Probe};
use super::state_file::{self, Saved};
use crate::config::{Config, ConfigError};
use crate::discovery::{DnsChange, FirstLookups, Registry};
use crate::listener::BindError;
use crate::service::{prepare_table, PreparedTable, ProcessWide, Service};

/// How many requests may wait for the task; a sender beyond that waits its turn.
const QUEUE: usize = 64;
/// How long a reload that changes a `discover` name waits, at most, for the new
/// name's first answer, only so that its answer can say whether the lookup failed:
/// a resolver that answers at all (SERVFAIL, REFUSED, NXDOMAIN) does so in a few
/// milliseconds; one that is down or slow is reported as "no answer yet" and never
/// holds a reload up longer than this (the lookup goes on after the commit).
const RELOAD_DNS_GRACE: Duration = Duration::from_millis(250);

/// A change asked of the running configuration: what the reload task takes from its
/// channel, one at a time.
///
/// Operator writes that must outlive a reload, and DNS answers for several names at
/// once, are requests to add here. Load feedback is not one: it scales the weights
/// of the backends in force and never changes what runs.
pub(crate) enum Request {
    /// Re-read the config file, check it as `crossbar check` does (the files it
    /// names opened too), and apply it; logged, counted and shown on the status page
    /// (SIGHUP, `POST /api/reload`).
    ReloadFile {
        /// Apply it even if it leaves a service with no backend for new
        /// connections (see `reload_guard.rs`); the answer then warns.
        force: bool,
        /// Where the outcome goes.
        reply: Reply,
    },
    /// Apply a configuration already loaded, as a reload does (library callers and
    /// tests); not counted as a reload of the file. Never refused by the
    /// last-backend guard: its answer warns instead.
    Apply {
        /// The new configuration.
        config: Box<Config>,
        /// Where the outcome goes.
        reply: Reply,
    },
    /// A DNS watcher's name answered a new set of backends: the running config
    /// again, with that set. Nobody waits for the outcome; a failure is logged.
    Dns(Box<DnsChange>),
    /// An operator write that must outlive a reload (drain, enable, disable,
    /// weight, reset): run in the task against the running services and the
    /// operator's record, which it answers through its own channel; the record is
    /// saved and published after it.
    Operator(Box<dyn FnOnce(&mut Operating<'_>) + Send>),
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Request::ReloadFile { .. } => f.write_str("ReloadFile"),
            Request::Apply { .. } => f.write_str("Apply"),
            Request::Dns(c) => write!(f, "Dns({})", c.service),
            Request::Operator(_) => f.write_str("Operator"),
        }
    }
}

impl From<DnsChange> for Request {
    fn from(change: DnsChange) -> Request {
        Request::Dns(Box::new(change))
    }
}

/// What an applied request did: its warnings (the file's, the health gate's, what
/// only a restart applies, new DNS names that did not answer), and what it did to
/// the operator's run-time state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    /// Warnings, one a line.
    pub warnings: Vec<String>,
    /// Operator states (drain, weight...) kept: their backends did not change.
    pub kept: Vec<Judged>,
    /// Operator states reset to the file's: their backends changed, or left.
    pub reset: Vec<Judged>,
    /// Something changed (false: the configuration in force already was this one,
    /// and nothing was committed).
    pub changed: bool,
}

impl Applied {
    /// The kept and reset operator states, for the log line: `kept=a/b drain`.
    pub fn operator_text(&self) -> (String, String) {
        let join = |v: &[Judged]| v.iter().map(Judged::text).collect::<Vec<_>>().join("; ");
        (join(&self.kept), join(&self.reset))
    }
}

/// An applied change's [`Applied`], or why nothing changed.
pub type Outcome = Result<Applied, ApplyError>;

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
    /// The reload would leave a service that takes new connections now with no
    /// backend for them (drained, disabled, down, weight 0 or removed), and was
    /// not forced; the reason per service, one a line.
    #[error("{0}")]
    NoBackendLeft(String),
    /// Shutdown has begun: the reload task takes no more requests.
    #[error("crossbar is shutting down: the running configuration stays until it exits")]
    ShuttingDown,
    /// The reload task ended without shutdown (it panicked: see the log); the
    /// running configuration stays as it was, and no change can be applied until
    /// a restart.
    #[error("the reload task ended unexpectedly (see the log): the running configuration stays as it is, and changes need a restart")]
    TaskEnded,
}

/// The sending side of the reload task's channel.
#[derive(Clone)]
pub(crate) struct Requests {
    sender: mpsc::Sender<Request>,
    /// Cancelled when shutdown begins: a closed channel is then no surprise.
    stopping: CancellationToken,
}

impl Requests {
    /// Send a request made around its reply channel and wait for the outcome.
    pub(crate) async fn ask(&self, request: impl FnOnce(Reply) -> Request) -> Outcome {
        let (reply, outcome) = oneshot::channel();
        if self.sender.send(request(reply)).await.is_err() {
            return Err(self.gone());
        }
        outcome.await.unwrap_or_else(|_| Err(self.gone()))
    }

    /// Run `write` in the task on the running services and the operator's record;
    /// its result.
    pub(crate) async fn operate<R: Send + 'static>(
        &self,
        write: impl FnOnce(&mut Operating<'_>) -> R + Send + 'static,
    ) -> Result<R, ApplyError> {
        let (reply, answer) = oneshot::channel();
        let run = move |op: &mut Operating<'_>| {
            let _ = reply.send(write(op)); // ok: the asker may have gone
        };
        if self
            .sender
            .send(Request::Operator(Box::new(run)))
            .await
            .is_err()
        {
            return Err(self.gone());
        }
        answer.await.map_err(|_| self.gone())
    }

    /// Why the task no longer answers: shutdown, or its unexpected end.
    fn gone(&self) -> ApplyError {
        match self.stopping.is_cancelled() {
            true => ApplyError::ShuttingDown,
            false => ApplyError::TaskEnded,
        }
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
    /// First lookups of new or changed `discover` settings, under way.
    first: FirstLookups,
    /// Each backend's health before it serves, at start: the state file's last
    /// known, else its first check's (`None`: no check to wait for).
    initial: HashMap<(String, String), bool>,
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
    /// What the operator set at run time (file < DNS < operator), applied at
    /// every commit.
    operator: OperatorState,
    /// What the state file holds now (`None`: not saved yet).
    saved: Option<Saved>,
    /// What it held at start: the last known health of backends DNS gives later.
    at_start: Option<Saved>,
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
            stopping: p.accepting.clone(),
            requests: requests.clone(),
            inbox,
            operator: OperatorState::default(),
            saved: None,
            at_start: None,
        };
        let requests = Requests {
            sender: requests,
            stopping: p.accepting,
        };
        (task, requests)
    }

    /// The first transaction: build every service, bind every listen address, start
    /// accepting. Returns the first-round signals of the ticket-key learners and the
    /// inherited sockets the configuration does not use (the caller closes them).
    pub(super) async fn start(
        &mut self,
    ) -> Result<(Vec<Probe>, HashMap<SocketAddr, std::net::TcpListener>), ApplyError> {
        let config = (*self.config).clone();
        let known = self.load_state().await?;
        let (mut prepared, _no_gate) = self.prepare(config, Applying::Start).await?;
        prepared.initial =
            super::first_checks::initial_health(&prepared.config, known.as_ref()).await;
        let (probes, _) = self.commit(prepared);
        Ok((probes, std::mem::take(&mut self.inherited)))
    }

    /// At start: the state file's operator record becomes ours; its content, for
    /// the backends' last known health. Never fails: an unusable file is set aside
    /// (see `state_file.rs`) and the configuration's values are used.
    async fn load_state(&mut self) -> Result<Option<Saved>, ApplyError> {
        let counter = state_file::set_aside_counter(&self.shared.metrics.registry);
        let Some(path) = self.config.state_file.clone() else {
            return Ok(None);
        };
        let loaded =
            tokio::task::spawn_blocking(move || state_file::load_at_start(&path, &counter))
                .await
                .map_err(ApplyError::Read)?;
        if let Some(saved) = &loaded {
            self.operator = saved.operator.clone();
            tracing::info!(
                backends = saved
                    .operator
                    .services
                    .values()
                    .map(|b| b.len())
                    .sum::<usize>(),
                "operator state read from the state file"
            );
            if let Some(ahead) = saved.in_the_future() {
                tracing::warn!(
                    "the state file says it was saved {ahead:?} in the future (this host's clock \
                     went back, or the file was copied): its backend health is not used, the \
                     first checks decide"
                );
            }
        }
        self.saved = loaded.clone();
        self.at_start = loaded.clone();
        Ok(loaded)
    }

    /// Save the operator's record and the backends' health to `state_file`, if
    /// set and if either changed since the last save (blocking I/O, off the workers).
    async fn save_state(&mut self) {
        let Some(path) = self.config.state_file.clone() else {
            return;
        };
        let now = Saved::now(&self.services, &self.operator);
        if self.saved.as_ref().is_some_and(|s| s.same_as(&now)) {
            return;
        }
        let (p, content) = (path.clone(), now.clone());
        match tokio::task::spawn_blocking(move || state_file::save(&p, &content)).await {
            Ok(Ok(())) => self.saved = Some(now),
            Ok(Err(e)) => tracing::error!("saving the state file {} failed: {e}", path.display()),
            Err(e) => tracing::error!("saving the state file failed: {e}"),
        }
    }

    /// Take requests until shutdown begins; then close the listening sockets' copies,
    /// stop the services' background tasks and the DNS watchers. A request under way
    /// when shutdown begins is abandoned before its commit (nothing live was written)
    /// and answered [`ApplyError::ShuttingDown`].
    pub(super) async fn serve(mut self) {
        let stopping = self.stopping.clone();
        let mut tick = tokio::time::interval(state_file::SAVE_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let request = tokio::select! {
                biased;
                () = stopping.cancelled() => break,
                r = self.inbox.recv() => match r {
                    Some(r) => r,
                    None => break,
                },
                _ = tick.tick() => {
                    self.sweep_departed().await;
                    self.save_state().await;
                    continue;
                }
            };
            tokio::select! {
                biased;
                () = stopping.cancelled() => break,
                () = self.handle(request) => {}
            }
        }
        self.save_state().await;
        self.stop();
    }

    async fn handle(&mut self, request: Request) {
        match request {
            Request::ReloadFile { force, reply } => {
                let outcome = self.reload_file(force).await;
                let _ = reply.send(outcome); // ok: the asker may have gone
            }
            Request::Apply { config, reply } => {
                let outcome = self.reload(*config, true).await;
                let _ = reply.send(outcome); // ok: the asker may have gone
            }
            Request::Dns(change) => self.rediscover(*change).await,
            Request::Operator(write) => {
                let mut op = Operating::new(&self.services, &mut self.operator);
                write(&mut op);
                if op.changed() {
                    self.publish();
                    self.save_state().await;
                }
            }
        }
    }

    /// Re-read the config file, check it, and apply it; on any error keep the running
    /// config. Logs and counts the outcome. The admin endpoint itself (listen
    /// address, token) is not reloaded: that needs a restart.
    async fn reload_file(&mut self, force: bool) -> Outcome {
        let path = self.config.source.clone();
        tracing::info!(config = %path.display(), "reloading");
        crate::system::sd_notify("RELOADING=1");
        let result = match load_config(path).await {
            Ok(cfg) => {
                cfg.log_warnings();
                let warnings: Vec<String> = cfg.warnings.iter().map(|w| w.to_string()).collect();
                self.reload(cfg, force).await.map(|mut applied| {
                    for w in &applied.warnings {
                        tracing::warn!("{w}");
                    }
                    let gate = std::mem::replace(&mut applied.warnings, warnings);
                    applied.warnings.extend(gate);
                    applied
                })
            }
            Err(e) => Err(e),
        };
        crate::system::sd_notify("READY=1");
        let metrics = &self.shared.metrics;
        let shown = result
            .as_ref()
            .map(|a| {
                let (kept, reset) = (a.kept.iter(), a.reset.iter());
                crate::live::ReloadNote {
                    warnings: a.warnings.clone(),
                    kept: kept.map(Judged::text).collect(),
                    reset: reset.map(Judged::text).collect(),
                }
            })
            .map_err(|e| e.to_string());
        metrics.process.note_reload(&shown);
        match &result {
            Ok(a) => {
                metrics.reload(true);
                let (kept, reset) = a.operator_text();
                tracing::info!(
                    warnings = a.warnings.len(),
                    changed = a.changed,
                    kept,
                    reset,
                    "reload complete"
                );
            }
            Err(e) => {
                metrics.reload(false);
                // One log line per event (journald): the diagnostics joined with "; ".
                let reason = e.to_string().lines().collect::<Vec<_>>().join("; ");
                tracing::error!(reason, "reload failed, keeping the running configuration");
            }
        }
        result
    }

    /// Replace the running configuration: services rebuilt (stick tables and backend
    /// state carried over by name), new addresses bound, removed ones closed, kept
    /// ones re-routed and their limits and backlog changed. Established connections
    /// are untouched. New health settings are probed first and refused when they
    /// would fail every backend of a service that has backends passing now; one
    /// that leaves a service with no backend for new connections is refused unless
    /// `force` ([`reload_guard`]); returns the gate's and the guard's warnings.
    async fn reload(&mut self, config: Config, force: bool) -> Outcome {
        let (prepared, mut warnings) = self.prepare(config, Applying::Reload).await?;
        if same_running(&self.config, &prepared.config) && prepared.first.is_empty() {
            // Nothing to commit: every backend, and the operator's state, as it was.
            let kept = self.operator.apply(&self.services);
            return Ok(Applied {
                warnings,
                kept,
                reset: Vec::new(),
                changed: false,
            });
        }
        let stranded = reload_guard::stranded(&self.services, &self.operator, &prepared.config);
        if !stranded.is_empty() && !force {
            return Err(ApplyError::NoBackendLeft(stranded.join("\n")));
        }
        warnings.extend(stranded.into_iter().map(|s| format!("forced: {s}")));
        let (_, judged) = self.commit(prepared);
        let (kept, reset) = judged.into_iter().partition(|j| j.why.is_none());
        self.save_state().await;
        Ok(Applied {
            warnings,
            kept,
            reset,
            changed: true,
        })
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
        let before = self.service_backends(&service);
        match self.prepare(config, Applying::Discovery).await {
            Ok((prepared, _)) => {
                self.commit(prepared);
                self.restore_discovered_health(&service, &before);
                log_joins_and_leaves(&service, &before, &self.service_backends(&service));
            }
            Err(e) => tracing::error!(service, "applying the discovered backends failed: {e}"),
        }
    }

    /// Backends DNS just gave `service` (not in `before`) take the state file's
    /// last known health, by name and address, while it is recent (as static
    /// backends do at start): after a restart the compilers of an SRV pool come back
    /// up together, instead of one by one as their first checks pass (the first up
    /// took 26 of the first 30 agents). One it last saw down waits for its checks.
    fn restore_discovered_health(&self, service: &str, before: &[Listed]) {
        let (Some(saved), Some(svc)) = (
            &self.at_start,
            self.services.iter().find(|s| s.name() == service),
        ) else {
            return;
        };
        let joined =
            svc.pool.backends.iter().filter(|b| {
                b.config.from_dns.is_some() && !before.iter().any(|l| *l.name == *b.name)
            });
        for b in joined {
            let address = b.config.address.to_string();
            if saved.known_health(service, &b.name, &address) == Some(true) && !b.is_healthy() {
                b.set_healthy(true);
                tracing::info!(service, backend = %b.name, "discovered backend up from the state file's last known health");
            }
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
        // DNS is never waited for: new names are looked up off to the side, and the
        // set found so far (the last good answer) is what the gate and pools see.
        self.discovery
            .set_own(own_addresses(&config, &self.listeners));
        let mut first = self.discovery.begin(&config);
        self.discovery.expand(&mut config);
        let groups = listen_groups(&config);
        self.listeners.check_kept(&groups)?;
        let warnings = match applying {
            Applying::Start | Applying::Discovery => Vec::new(),
            Applying::Reload => {
                let mut w = start_only_changes(&self.config, &config);
                let gate = crate::health::gate::judge(&self.services, &config).await;
                w.extend(gate.map_err(ApplyError::HealthGate)?);
                w.extend(first.settle(RELOAD_DNS_GRACE, &self.discovery).await);
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
            first,
            initial: HashMap::new(),
        };
        Ok((prepared, warnings))
    }

    /// Make a prepared configuration the running one, in one step: build the
    /// services (this is where backend state, stick lifetimes and metric
    /// registrations are written), swap every listener's routes, retire what the new
    /// config drops, start the new services' tasks, publish. Cannot fail; returns the
    /// first-round signals of the new ticket-key learners.
    fn commit(&mut self, p: Prepared) -> (Vec<Probe>, Vec<Judged>) {
        self.discovery.install(
            &p.config,
            p.first,
            &self.shared.metrics.discovery,
            &self.requests,
        );
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
        let judged = self.operator.apply(&services);
        super::first_checks::set_initial(&services, &p.initial);
        self.listeners.commit(p.groups, p.fresh, &services);
        self.discovery
            .set_own(own_addresses(&p.config, &self.listeners));
        let old = std::mem::replace(&mut self.services, services);
        services::retire(&old, &self.services, &self.shared.metrics);
        let probes = services::spawn(&self.services, &self.shared.metrics, &self.savers);
        self.shared.confirm_budget.set_rate(p.config.confirm_budget);
        self.config = Arc::new(p.config);
        self.publish();
        (probes, judged)
    }

    /// Show readers what runs now.
    fn publish(&self) {
        let running = Running::new(
            self.config.clone(),
            self.services.clone(),
            &self.listeners,
            Arc::new(self.operator.clone()),
        );
        self.published.store(Arc::new(running));
    }

    /// `service`'s backends now: names, addresses, and whether each left DNS.
    fn service_backends(&self, service: &str) -> Vec<Listed> {
        self.services
            .iter()
            .find(|s| s.name() == service)
            .map(|s| {
                let b = s.pool.backends.iter();
                b.map(|b| Listed {
                    name: b.name.to_string(),
                    address: b.config.address.to_string(),
                    left_dns: b.config.left_dns,
                })
                .collect()
            })
            .unwrap_or_default()
    }

    /// Departed backends (left DNS, drained, no connection left) leave the pool:
    /// the running config again without them, their series all at once.
    async fn sweep_departed(&mut self) {
        let services = &self.services;
        let busy = |service: &str, backend: &str| {
            let Some(svc) = services.iter().find(|s| s.name() == service) else {
                return false;
            };
            let drained = !svc.pool.departed_serve();
            svc.pool
                .get(backend)
                .is_some_and(|b| !drained || b.active() > 0)
        };
        if !self.discovery.forget_departed(busy) {
            return;
        }
        let config = (*self.config).clone();
        match self.prepare(config, Applying::Discovery).await {
            Ok((prepared, _)) => {
                self.commit(prepared);
            }
            Err(e) => tracing::error!("removing the backends that left DNS failed: {e}"),
        }
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

/// A backend of a service's pool, as a DNS change's log line compares them.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Listed {
    name: String,
    address: String,
    /// It left DNS and is still in the pool while it drains.
    left_dns: bool,
}

/// A DNS change's effect on a service's pool in the log, by name: who joined, who
/// left (it drains, or is gone already), who moved. A backend that left DNS counts
/// as left although it is still in the pool while it drains. A change that moved
/// nobody (a watcher restarted by a reload, a new SRV weight) logs no empty line.
fn log_joins_and_leaves(service: &str, before: &[Listed], after: &[Listed]) {
    let (joined, left, moved) = joins_and_leaves(before, after);
    if joined.is_empty() && left.is_empty() && moved.is_empty() {
        return;
    }
    tracing::info!(
        service,
        joined = joined.join(", "),
        left = left.join(", "),
        moved = moved.join(", "),
        "DNS change applied"
    );
}

/// Who joined, who left and who moved between two listings, in words:
/// `c4 (10.0.0.4:8140)`, `c2 (10.0.0.2:8140 -> 10.0.0.9:8140)`.
fn joins_and_leaves(
    before: &[Listed],
    after: &[Listed],
) -> (Vec<String>, Vec<String>, Vec<String>) {
    let listed = |v: &[Listed]| {
        v.iter()
            .filter(|l| !l.left_dns)
            .cloned()
            .collect::<Vec<_>>()
    };
    let (before, after) = (listed(before), listed(after));
    let names = |v: &[Listed], other: &[Listed]| {
        v.iter()
            .filter(|l| !other.iter().any(|o| o.name == l.name))
            .map(|l| format!("{} ({})", l.name, l.address))
            .collect::<Vec<_>>()
    };
    let (joined, left) = (names(&after, &before), names(&before, &after));
    let moved = after
        .iter()
        .filter_map(|l| {
            let was = before.iter().find(|o| o.name == l.name)?;
            (was.address != l.address)
                .then(|| format!("{} ({} -> {})", l.name, was.address, l.address))
        })
        .collect();
    (joined, left, moved)
}

/// The configuration in force would not change: the same services (their
/// discovered backends included), listeners, admin endpoint and tuning.
fn same_running(old: &Config, new: &Config) -> bool {
    let admin = |c: &Config| {
        c.admin.as_ref().map(|a| {
            (
                a.listen,
                a.token_file.clone(),
                a.allowed_hosts.clone(),
                a.healthz_needs_backends,
            )
        })
    };
    old.services == new.services
        && old.workers == new.workers
        && old.confirm_budget == new.confirm_budget
        && old.state_file == new.state_file
        && admin(old) == admin(new)
}

/// crossbar's own listen addresses: the configured ones and those bound (a port 0
/// resolved), which no DNS record may name.
fn own_addresses(config: &Config, listeners: &Listeners) -> Vec<SocketAddr> {
    let mut own = crate::config::listen_addresses(&config.services);
    own.extend(listeners.handles().values().map(|h| h.local));
    own.retain(|a| a.port() != 0);
    own.sort();
    own.dedup();
    own
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

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(name: &str, address: &str, left_dns: bool) -> Listed {
        Listed {
            name: name.into(),
            address: address.into(),
            left_dns,
        }
    }

    /// A backend that left DNS stays in the pool while it drains: it is named as
    /// left all the same (the log said `left=""`), and a change that moved nobody
    /// gives nothing to log.
    #[test]
    fn a_departure_that_still_drains_is_named_as_left() {
        let before = [
            listed("c1", "10.0.0.1:8140", false),
            listed("c3", "10.0.0.3:8140", false),
        ];
        let after = [
            listed("c1", "10.0.0.1:8140", false),
            listed("c3", "10.0.0.3:8140", true),
        ];
        let (joined, left, moved) = joins_and_leaves(&before, &after);
        assert_eq!(left, vec!["c3 (10.0.0.3:8140)".to_string()]);
        assert!(joined.is_empty() && moved.is_empty());
        // The drain ends: c3 leaves the pool; it was told already.
        let gone = [listed("c1", "10.0.0.1:8140", false)];
        let (joined, left, moved) = joins_and_leaves(&after, &gone);
        assert!(joined.is_empty() && left.is_empty() && moved.is_empty());
        // It comes back and c1 moves.
        let back = [
            listed("c1", "10.0.0.9:8140", false),
            listed("c3", "10.0.0.3:8140", false),
        ];
        let (joined, left, moved) = joins_and_leaves(&gone, &back);
        assert_eq!(joined, vec!["c3 (10.0.0.3:8140)".to_string()]);
        assert_eq!(
            moved,
            vec!["c1 (10.0.0.1:8140 -> 10.0.0.9:8140)".to_string()]
        );
        assert!(left.is_empty());
    }
}
