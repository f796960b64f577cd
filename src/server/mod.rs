//! The running balancer: starts the services of a config, hands every change of the
//! running config to its reload task, shuts down gracefully and saves the stick
//! tables.
//!
//! - [`listeners`]: the listener lifecycle (bind, keep across reloads, accept, retire);
//! - `reload`: the reload task, the one owner of the running config; SIGHUP,
//!   `POST /api/reload` and the DNS watchers send it [requests](reload::Request);
//! - `running`: the snapshot of the running config that readers load;
//! - `services`: the services' background tasks and saving their stick tables.
//!
//! Connection tasks hold an `Arc<Service>` of the config they were accepted under,
//! so a reload never changes an established connection; each listen address keeps
//! its socket across reloads and only its routing table (and its limit, backlog)
//! changes. A reload is a transaction: everything that can fail is done off to the
//! side without writing live state, then one commit applies it.
mod feedback;
mod first_checks;
mod listeners;
mod operator;
mod reload;
mod reload_guard;
mod running;
mod services;
mod state_file;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Config;
use crate::log_writer::LogLimiter;
use crate::metrics::Metrics;
use crate::service::{ProcessWide, Service};

pub use listeners::FreebindChanged;
pub use operator::{override_text, Against, Judged, Operating, OperatorState, Override};
pub use reload::{Applied, ApplyError, Outcome};
pub use state_file::{problem as state_file_problem, StateError};

use reload::{Parts, ReloadTask, Request, Requests};
use running::{Published, Running};

/// How long start-up waits for the first ticket-key probe round, so that crossbar
/// knows its backends' key names before it reports ready (listeners already accept).
const FIRST_PROBE_WAIT: Duration = Duration::from_secs(1);
/// After the shutdown grace period, how long cut connections get to finish logging.
const HARD_STOP_GRACE: Duration = Duration::from_secs(2);

/// A running balancer.
pub struct Server {
    /// The running config as of the reload task's last commit.
    running: Published,
    /// The reload task's channel: every change of the running config goes there.
    requests: Requests,
    /// The reload task, until shutdown waits for its end.
    reload_task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    shared: Arc<ProcessWide>,
    tracker: TaskTracker,
    /// The periodic stick-table savers: shutdown waits for a running save before the
    /// last one (saves of one file never overlap: see [`crate::stick::StickTable::save`]).
    savers: TaskTracker,
    accepting: CancellationToken,
}

impl Server {
    /// Build every service, bind every listen address, start accepting.
    pub async fn start(config: Config, metrics: Arc<Metrics>) -> Result<Arc<Server>, ApplyError> {
        Server::start_inheriting(config, metrics, HashMap::new()).await
    }

    /// Like [`Server::start`], accepting on `inherited` sockets (from a predecessor
    /// process, see [`crate::upgrade`]) for the addresses they were listening on.
    /// Inherited sockets the configuration no longer lists are closed.
    pub async fn start_inheriting(
        config: Config,
        metrics: Arc<Metrics>,
        inherited: HashMap<SocketAddr, std::net::TcpListener>,
    ) -> Result<Arc<Server>, ApplyError> {
        let shared = Arc::new(ProcessWide {
            metrics,
            hard_stop: crate::relay::HardStop::new(),
            log_limiter: LogLimiter::new(),
            confirm_budget: crate::budget::Budget::new(config.confirm_budget),
            own_sockets: Default::default(),
        });
        let running = Arc::new(ArcSwap::from_pointee(Running::before_start(config.clone())));
        let (tracker, savers, accepting) = (
            TaskTracker::new(),
            TaskTracker::new(),
            CancellationToken::new(),
        );
        let (mut task, requests) = ReloadTask::new(Parts {
            config,
            inherited,
            published: running.clone(),
            shared: shared.clone(),
            tracker: tracker.clone(),
            savers: savers.clone(),
            accepting: accepting.clone(),
        });
        let (probes, unused) = task.start().await?;
        let reload_task = tokio::spawn(task.serve());
        let first_round = async {
            for rx in probes {
                let _ = rx.await; // ok: a probe task that ended early counts as done
            }
        };
        let _ = tokio::time::timeout(FIRST_PROBE_WAIT, first_round).await; // ok: bounded wait
        for addr in unused.keys() {
            tracing::info!(listen = %addr, "inherited socket not in the configuration: closed");
        }
        Ok(Arc::new(Server {
            running,
            requests,
            reload_task: Mutex::new(Some(reload_task)),
            shared,
            tracker,
            savers,
            accepting,
        }))
    }

    /// The metrics registry.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.shared.metrics
    }

    /// The current configuration (shared, not copied: a reload swaps in a new one).
    pub fn config(&self) -> Arc<Config> {
        self.running.load().config.clone()
    }

    /// The running services, in config order.
    pub fn services(&self) -> Vec<Arc<Service>> {
        self.running.load().services.clone()
    }

    /// One running service.
    pub fn service(&self, name: &str) -> Option<Arc<Service>> {
        self.running.load().service(name)
    }

    /// The addresses a service's listeners are bound to (ports resolved when the
    /// config said port 0).
    pub fn local_addrs(&self, service: &str) -> Vec<SocketAddr> {
        self.running.load().local_addrs(service)
    }

    /// The listening sockets (duplicated) with the addresses the configuration lists
    /// for them, for handing to a successor. Port-0 listeners are not included.
    pub fn listen_sockets(&self) -> Vec<(SocketAddr, OwnedFd)> {
        self.running.load().listen_sockets()
    }

    /// Every listener's per-source table, by its bound address.
    pub(crate) fn sources(&self) -> Vec<(SocketAddr, Arc<crate::admission::Admission>)> {
        self.running.load().sources()
    }

    /// Replace the running configuration with `config` (already loaded): services
    /// rebuilt (stick tables and backend state carried over by name), new addresses
    /// bound, removed ones closed, kept ones re-routed and their limits and backlog
    /// changed. Established connections are untouched. New health settings are
    /// probed first and refused when they would fail every backend of a service that
    /// has backends passing now (see [`crate::health::gate`]); returns the gate's
    /// warnings. On error nothing changed.
    pub async fn reload(&self, config: Config) -> Outcome {
        let config = Box::new(config);
        self.requests
            .ask(|reply| Request::Apply { config, reply })
            .await
    }

    /// Re-read the config file, check it as `crossbar check` does (the files it
    /// names opened too), and apply it; on any error keep the running config. Logs
    /// and counts the outcome (SIGHUP and `POST /api/reload` both come here); returns
    /// the warnings (the file's and the health gate's), or the reason. The admin
    /// endpoint itself (listen address, token) is not reloaded: that needs a restart.
    pub async fn reload_file(&self) -> Outcome {
        self.reload_file_forced(false).await
    }

    /// [`Server::reload_file`], and with `force` applied even if it leaves a
    /// service with no backend for new connections (refused otherwise:
    /// [`ApplyError::NoBackendLeft`]); the answer then warns of each such service.
    pub async fn reload_file_forced(&self, force: bool) -> Outcome {
        self.requests
            .ask(|reply| Request::ReloadFile { force, reply })
            .await
    }

    /// Run an operator write in the reload task (one at a time, between commits):
    /// `write` gets the running services and the operator's record, which is saved
    /// to the state file and published after it.
    pub async fn operate<R: Send + 'static>(
        &self,
        write: impl FnOnce(&mut Operating<'_>) -> R + Send + 'static,
    ) -> Result<R, ApplyError> {
        self.requests.operate(write).await
    }

    /// What the operator set at run time (drain, weight...), per service and backend.
    pub fn operator_state(&self) -> Arc<OperatorState> {
        self.running.load().operator.clone()
    }

    /// Save every stick table that has a `state_file`, on a blocking thread (file
    /// I/O stays off the runtime workers).
    pub async fn save_tables(&self) {
        let services = self.services();
        if let Err(e) = tokio::task::spawn_blocking(move || services::save_all(&services)).await {
            tracing::error!("saving the stick tables failed: {e}");
        }
    }

    /// Stop accepting, let established connections finish for up to `grace`, then cut
    /// the rest. Returns the number of connections that had to be cut.
    pub async fn shutdown(&self, grace: Duration) -> usize {
        self.accepting.cancel();
        // The reload task ends at once (a reload under way is abandoned before its
        // commit): it closes its copies of the listening sockets, stops the services'
        // background tasks and the DNS watchers.
        let reload_task = self
            .reload_task
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(task) = reload_task {
            if let Err(e) = task.await {
                tracing::error!("the reload task failed: {e}");
            }
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
