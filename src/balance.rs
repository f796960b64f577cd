//! Backend pools: the four balance algorithms, backups, per-backend connection
//! limits and the bounded queue for when every backend is full.
//!
//! A backend takes new connections when it is healthy, enabled (not drained or
//! disabled, not a recovered primary waiting for manual failback) and below its
//! `max_connections`. Backups are candidates only when no primary is available.
//!
//! A backend's weight is the file's until the operator sets another at run time
//! ([`Backend::set_weight`], `crossbar backend weight`); weight 0 takes it out of
//! the choice for new connections while sticky hits still reach it (HAProxy's
//! `set weight ... 0`). The run-time weight lives on the [`Backend`], not on the
//! [`BackendState`] a reload carries over, so a reload (and a restart) returns
//! every backend to its configured weight.
//!
//! Load feedback (`crate::feedback`) multiplies that weight by a factor published in
//! the backend's [`FeedbackCell`]; every algorithm picks with the product (round
//! robin with the factor in [`FEEDBACK_STEPS`] steps), and an agent's `maxconn:N`
//! lowers the connection limit while it holds.
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use tokio::sync::futures::Notified;
use tokio::sync::Notify;

use crate::config::{BackendConfig, Balance};
use crate::feedback::cell::{FeedbackCell, FACTOR_ONE};
use crate::metrics::BackendMetrics;

/// Picks a backend that is not full, and may wait for one; bounded tries so that a
/// reservation race (two tasks taking the last slot) can't spin.
const MAX_PICK_RACES: usize = 8;

/// Longest round-robin cycle built: weights (reduced by their greatest common
/// divisor) summing to more are scaled down to it. 16 slow-start steps x weights up
/// to 256 stay exact up to 4 backends at the largest coprime weights, and for any
/// realistic pool (12:4:2 is a cycle of 9); 64k entries cost 512 KiB and ~1 ms to
/// build per dozen backends, once per weight change.
const MAX_SCHEDULE: u64 = 1 << 16;

/// Steps of a slow-start ramp as round robin sees it (the schedule is rebuilt at
/// each): the weight goes 1/16, 2/16 ... of the way up.
const RAMP_STEPS: u64 = 16;

/// Steps of a feedback factor as round robin sees it: the schedule is rebuilt when
/// a factor crosses a sixteenth, not at every sample's change of a per mille
/// (least connections and source hashing use the factor as published).
const FEEDBACK_STEPS: u64 = 16;

/// Largest weight (the config's bound, run-time weights share it).
pub use crate::config::MAX_WEIGHT;

/// The clock of [`BackendState::served_ms`] and [`BackendState::down_ms`]: one for
/// the process, so that times of different backends compare.
static SERVICE_CLOCK: LazyLock<Instant> = LazyLock::new(Instant::now);

/// Now on [`SERVICE_CLOCK`], in ms plus one (0 means "never").
fn clock_ms() -> u64 {
    SERVICE_CLOCK.elapsed().as_millis() as u64 + 1
}

/// Operator-set state of a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum AdminState {
    /// Takes traffic when healthy.
    Enabled = 0,
    /// No new connections; existing ones continue; sticky entries ignored.
    Drain = 1,
    /// Maintenance: no new connections, health checks keep running.
    Disabled = 2,
}

impl AdminState {
    fn from_u8(v: u8) -> AdminState {
        match v {
            1 => AdminState::Drain,
            2 => AdminState::Disabled,
            _ => AdminState::Enabled,
        }
    }
}

/// The live state of a backend: connection count, health, the operator's state and
/// the slow-start clock.
///
/// Shared (one `Arc`) by the pools of successive reloads while the backend's name
/// and address are unchanged: a connection accepted under the old config releases
/// its slot on the same counter the new pool reserves from, so `max_connections` and
/// `leastconn` hold across a reload, and health seen by either pool is seen by both.
#[derive(Debug)]
pub struct BackendState {
    active: AtomicU32,
    healthy: AtomicBool,
    standby: AtomicBool,
    admin: AtomicU8,
    /// When the backend last became available (for slow start), as ms since `epoch`
    /// plus one; 0 = available since it was first configured (no ramp).
    up_since_ms: AtomicU64,
    epoch: Instant,
    /// Consecutive check results (rise/fall), fed by active and passive checks.
    health: HealthStreak,
    /// A slot was released: wakes one connection queued for this backend (one
    /// that has it among its candidates, so it can take the slot).
    slot_freed: Notify,
    /// When it was last given a connection, on [`SERVICE_CLOCK`]; 0 = never.
    served_ms: AtomicU64,
    /// When it last went down, on [`SERVICE_CLOCK`]; 0 = never.
    down_ms: AtomicU64,
    /// Load feedback: the factor of its weight and what the samples taught.
    feedback: FeedbackCell,
}

impl BackendState {
    fn new(admin: AdminState) -> BackendState {
        BackendState {
            active: AtomicU32::new(0),
            healthy: AtomicBool::new(true),
            standby: AtomicBool::new(false),
            admin: AtomicU8::new(admin as u8),
            up_since_ms: AtomicU64::new(0),
            epoch: Instant::now(),
            health: HealthStreak::default(),
            slot_freed: Notify::new(),
            served_ms: AtomicU64::new(0),
            down_ms: AtomicU64::new(0),
            feedback: FeedbackCell::default(),
        }
    }
}

/// Connections waiting for a backend slot of a service, shared (like
/// [`BackendState`]) by the pools of successive reloads, so that the queue bound
/// holds across a reload. Each waits on the backends it can use (their
/// [`BackendState`], shared the same way, so a slot freed by a connection of the
/// old config wakes a connection queued under the new one).
#[derive(Debug, Default)]
struct Waiters {
    queued: AtomicUsize,
}

/// Consecutive check results of one backend (the rise/fall streaks).
///
/// Lock-free: the data path reports connect outcomes concurrently with the active
/// check task. Only the flip itself must happen once, and `Backend::set_healthy`
/// (an atomic swap) guarantees that.
#[derive(Debug, Default)]
pub struct HealthStreak {
    passes: AtomicU32,
    failures: AtomicU32,
}

impl HealthStreak {
    /// Count one result and return the new streak length of that kind.
    pub fn record(&self, ok: bool) -> u32 {
        let (grow, reset) = if ok {
            (&self.passes, &self.failures)
        } else {
            (&self.failures, &self.passes)
        };
        reset.store(0, Ordering::Release);
        let prev = grow
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                Some(n.saturating_add(1))
            })
            .unwrap_or(u32::MAX);
        prev.saturating_add(1)
    }

    /// Consecutive failures so far.
    pub fn failures(&self) -> u32 {
        self.failures.load(Ordering::Acquire)
    }

    /// End a failure streak (a connect proved the backend as well as its check would).
    pub fn reset_failures(&self) {
        self.failures.store(0, Ordering::Release);
    }
}

/// One backend of a service with its live state.
pub struct Backend {
    /// Name (unique in the service).
    pub name: Arc<str>,
    /// Its configuration.
    pub config: BackendConfig,
    /// Position in the service's backend list.
    pub index: usize,
    state: Arc<BackendState>,
    /// Weight now: `config.weight` until set at run time (0..=[`MAX_WEIGHT`]).
    weight: AtomicU32,
    /// Metric handles.
    pub metrics: BackendMetrics,
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend")
            .field("name", &self.name)
            .field("active", &self.active())
            .field("state", &self.state_name())
            .field("weight", &self.weight())
            .finish()
    }
}

impl Backend {
    /// Is it healthy (by active and passive checks)?
    pub fn is_healthy(&self) -> bool {
        self.state.healthy.load(Ordering::Acquire)
    }

    /// The operator-set state.
    pub fn admin_state(&self) -> AdminState {
        AdminState::from_u8(self.state.admin.load(Ordering::Acquire))
    }

    /// A recovered primary held back until the operator enables it (`failback: manual`).
    pub fn is_standby(&self) -> bool {
        self.state.standby.load(Ordering::Acquire)
    }

    /// Takes new connections (ignoring its connection limit)?
    pub fn is_available(&self) -> bool {
        self.is_healthy() && !self.is_standby() && self.admin_state() == AdminState::Enabled
    }

    /// Consecutive check results (rise/fall), fed by active and passive checks.
    pub fn health(&self) -> &HealthStreak {
        &self.state.health
    }

    /// Open connections now (under this and earlier configs: see [`BackendState`]).
    pub fn active(&self) -> u32 {
        self.state.active.load(Ordering::Acquire)
    }

    /// The state label: up, down, drain, disabled or standby.
    pub fn state_name(&self) -> &'static str {
        match self.admin_state() {
            AdminState::Disabled => "disabled",
            AdminState::Drain => "drain",
            AdminState::Enabled if !self.is_healthy() => "down",
            AdminState::Enabled if self.is_standby() => "standby",
            AdminState::Enabled => "up",
        }
    }

    fn publish_state(&self) {
        self.metrics.up.set(i64::from(self.is_available()));
        self.metrics.set_state(self.state_name());
        self.metrics.weight.set(i64::from(self.weight()));
    }

    /// The weight new connections are balanced by: the configured one, or the one
    /// last set at run time. 0 means no new connections (sticky hits still come).
    pub fn weight(&self) -> u32 {
        self.weight.load(Ordering::Acquire)
    }

    /// Set the weight at run time (clamped to [`MAX_WEIGHT`]); it holds until the
    /// next reload or restart, which return to `config.weight`. Applies to the next
    /// pick; a slow-start ramp under way continues towards the new weight.
    pub fn set_weight(&self, weight: u32) {
        self.weight.store(weight.min(MAX_WEIGHT), Ordering::Release);
        self.publish_state();
    }

    /// Its load feedback: the factor new connections are balanced by, on top of
    /// [`Backend::weight`], and whether it is saturated (`crate::feedback`).
    pub fn feedback(&self) -> &FeedbackCell {
        &self.state.feedback
    }

    /// The weight new connections are balanced by, load feedback included:
    /// [`Backend::weight`] times the factor (slow start aside).
    pub fn effective_weight(&self) -> f64 {
        f64::from(self.weight()) * f64::from(self.feedback().factor()) / f64::from(FACTOR_ONE)
    }

    /// Its connection limit now: `max_connections`, lowered by its agent's
    /// `maxconn:N` while that holds.
    pub fn max_connections(&self) -> Option<u32> {
        match (
            self.config.max_connections,
            self.feedback().max_connections(),
        ) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Takes new connections from the balancing (not only sticky hits): available
    /// and a weight above 0.
    pub fn takes_new(&self) -> bool {
        self.is_available() && self.weight() > 0
    }

    /// Set health; returns true if it changed.
    pub fn set_healthy(&self, up: bool) -> bool {
        let changed = self.state.healthy.swap(up, Ordering::AcqRel) != up;
        if changed && up {
            self.mark_up_now();
        }
        if changed && !up {
            self.state.down_ms.store(clock_ms(), Ordering::Release);
        }
        self.publish_state();
        changed
    }

    /// Set the operator state; enabling also clears `standby`.
    pub fn set_admin_state(&self, s: AdminState) {
        self.state.admin.store(s as u8, Ordering::Release);
        if s == AdminState::Enabled && self.state.standby.swap(false, Ordering::AcqRel) {
            self.mark_up_now();
        }
        self.publish_state();
    }

    /// Set the operator state as a commit applies it (the file's, or the operator's
    /// record): a standby stays one.
    pub fn apply_admin_state(&self, s: AdminState) {
        self.state.admin.store(s as u8, Ordering::Release);
        self.publish_state();
    }

    /// Started down and has not been checked into service yet (a backend DNS added
    /// to a running pool, waiting for its first passing checks).
    pub fn awaiting_first_check(&self) -> bool {
        !self.is_healthy() && self.state.down_ms.load(Ordering::Acquire) == 0
    }

    /// Has this backend been given a connection since `other` last went down? (A
    /// backup that took none while the primary was gone took over nothing: see
    /// `failback: manual` in [`crate::health`].)
    pub fn served_since_down_of(&self, other: &Backend) -> bool {
        // A backend never down (a discovered newcomer waiting for its first checks)
        // was never taken over from.
        let served = self.state.served_ms.load(Ordering::Acquire);
        let down = other.state.down_ms.load(Ordering::Acquire);
        served != 0 && down != 0 && served >= down
    }

    /// Hold a recovered primary back (or release it).
    pub fn set_standby(&self, standby: bool) {
        self.state.standby.store(standby, Ordering::Release);
        self.publish_state();
    }

    fn mark_up_now(&self) {
        // Stored + 1 so that 0 keeps meaning "available since start" even for a
        // recovery in the pool's first millisecond.
        let ms = self.state.epoch.elapsed().as_millis() as u64 + 1;
        self.state.up_since_ms.store(ms, Ordering::Release);
    }

    /// Weight now, times the feedback factor (in [`FACTOR_ONE`]ths), ramped over
    /// `slow_start` after the backend became available.
    fn ramped_weight(&self, slow_start: Duration) -> u64 {
        // At least 1: a pick racing a change to 0 still needs a number.
        let w = u64::from(self.weight().max(1)) * 16 * u64::from(self.feedback().factor().max(1));
        match self.ramp(slow_start) {
            Some((elapsed, total)) => (w * elapsed / total).max(1),
            None => w,
        }
    }

    /// The weight round robin's schedule is built for: [`Backend::ramped_weight`]
    /// with the ramp in [`RAMP_STEPS`] steps and the feedback factor in
    /// [`FEEDBACK_STEPS`], so a ramp rebuilds the schedule at most that many times,
    /// and feedback only when a factor crosses a step.
    fn scheduled_weight(&self, slow_start: Duration) -> u64 {
        let steps = u64::from(self.feedback().factor()) * FEEDBACK_STEPS;
        let level = ((steps + u64::from(FACTOR_ONE) / 2) / u64::from(FACTOR_ONE)).max(1);
        let w = u64::from(self.weight().max(1)) * level;
        match self.ramp(slow_start) {
            Some((elapsed, total)) => w * (RAMP_STEPS * elapsed / total).max(1),
            None => w * RAMP_STEPS,
        }
    }

    /// `(elapsed, total)` milliseconds of a slow-start ramp under way (`elapsed <
    /// total`, `total` > 0); `None` when not ramping.
    fn ramp(&self, slow_start: Duration) -> Option<(u64, u64)> {
        let total = slow_start.as_millis() as u64;
        let up = self.state.up_since_ms.load(Ordering::Acquire);
        if total == 0 || up == 0 {
            return None; // no ramp, or available since start
        }
        let since = self.state.epoch.elapsed().as_millis() as u64;
        let elapsed = since.saturating_sub(up - 1);
        (elapsed < total).then_some((elapsed, total))
    }

    /// Reserve a connection slot if below `max_connections`.
    fn try_reserve(self: &Arc<Self>) -> Option<Lease> {
        let max = self.max_connections().unwrap_or(u32::MAX);
        let mut cur = self.state.active.load(Ordering::Acquire);
        loop {
            if cur >= max {
                return None;
            }
            match self.state.active.compare_exchange_weak(
                cur,
                cur + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    self.state.served_ms.store(clock_ms(), Ordering::Release);
                    self.metrics.active.inc();
                    self.metrics.live.note_active(cur + 1);
                    return Some(Lease {
                        backend: self.clone(),
                        socket: arc_swap::ArcSwapOption::empty(),
                    });
                }
                Err(now) => cur = now,
            }
        }
    }

    fn has_capacity(&self) -> bool {
        self.active() < self.max_connections().unwrap_or(u32::MAX)
    }
}

/// A reserved connection slot on a backend; released on drop (wakes one connection
/// queued for that backend).
#[derive(Debug)]
pub struct Lease {
    backend: Arc<Backend>,
    /// The connection opened on the slot, known as crossbar's own while it lasts
    /// (behind one pointer: a lease lives in every connection's future).
    socket: arc_swap::ArcSwapOption<crate::dial::OwnSocket>,
}

impl Lease {
    /// The backend this slot is on.
    pub fn backend(&self) -> &Arc<Backend> {
        &self.backend
    }

    /// Keep the connection opened on this slot known as crossbar's own until the
    /// slot is released (a slot holds one connection at a time).
    pub fn hold(&self, socket: crate::dial::OwnSocket) {
        self.socket.store(Some(Arc::new(socket)));
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.backend.state.active.fetch_sub(1, Ordering::AcqRel);
        self.backend.metrics.active.dec();
        self.backend.state.slot_freed.notify_one();
    }
}

/// Why no backend could be had.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PickError {
    /// No backend is healthy and enabled (or all were tried).
    #[error("no backend available")]
    NoBackendAvailable,
    /// Every candidate is full and the queue is full too.
    #[error("all backends full and the queue is full")]
    QueueFull,
    /// Every candidate stayed full for the queue timeout.
    #[error("timed out waiting in the queue for a backend slot")]
    QueueTimeout,
}

impl PickError {
    /// Metric label / access-log reason.
    pub fn reason(&self) -> &'static str {
        match self {
            PickError::NoBackendAvailable => "no_backend",
            PickError::QueueFull => "queue_full",
            PickError::QueueTimeout => "queue_timeout",
        }
    }
}

enum Pick {
    Backend(usize),
    Full,
    Nothing,
}

/// The backends of one service and how to choose among them.
pub struct Pool {
    /// Backends in config order.
    pub backends: Vec<Arc<Backend>>,
    algo: Balance,
    slow_start: Duration,
    /// Smooth weighted round robin, precomputed for the weights in force: picks
    /// read it and advance its cursor, never lock ([`Schedule`]).
    rr: ArcSwap<Schedule>,
    /// Held while the schedule is rebuilt after the weights changed.
    rr_rebuild: Mutex<()>,
    /// Rotates leastconn tie-breaking so equal backends share the load.
    tie: AtomicUsize,
    waiters: Arc<Waiters>,
    queue_size: usize,
    queue_timeout: Duration,
}

/// A slow-start ramp under way: how far along it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ramp {
    /// Since the backend became available again.
    pub elapsed: Duration,
    /// The whole ramp (`slow_start`).
    pub total: Duration,
}

impl Pool {
    /// `b`'s slow-start ramp, while one is under way (it recovered less than
    /// `slow_start` ago): new connections reach it in proportion to how far along.
    pub fn ramp_of(&self, b: &Backend) -> Option<Ramp> {
        b.ramp(self.slow_start).map(|(elapsed, total)| Ramp {
            elapsed: Duration::from_millis(elapsed),
            total: Duration::from_millis(total),
        })
    }
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("algo", &self.algo)
            .field("backends", &self.backends)
            .finish()
    }
}

/// Settings of a pool beyond its backends.
#[derive(Debug, Clone, Copy)]
pub struct PoolParams {
    /// Algorithm.
    pub algo: Balance,
    /// Weight ramp after recovery.
    pub slow_start: Duration,
    /// Connections that may wait for a slot.
    pub queue_size: usize,
    /// How long one may wait.
    pub queue_timeout: Duration,
}

impl Pool {
    /// Build a pool. `make` gives each backend's metric handles. `previous`, the
    /// same service's pool of the running config, hands over the queue and the live
    /// state ([`BackendState`]) of every backend whose name and address are unchanged;
    /// the operator's drain or disable sticks unless the config now says `disabled`.
    pub fn new(
        configs: &[BackendConfig],
        params: PoolParams,
        make: impl Fn(&BackendConfig) -> BackendMetrics,
        previous: Option<&Pool>,
    ) -> Pool {
        let waiters = previous.map_or_else(Default::default, |p| p.waiters.clone());
        let backends: Vec<Arc<Backend>> = configs
            .iter()
            .enumerate()
            .map(|(index, c)| {
                let b = Backend {
                    name: Arc::from(c.name.as_str()),
                    config: c.clone(),
                    index,
                    state: carried_state(previous, c),
                    weight: AtomicU32::new(c.weight),
                    metrics: make(c),
                };
                if c.disabled {
                    b.state
                        .admin
                        .store(AdminState::Disabled as u8, Ordering::Release);
                }
                b.publish_state();
                Arc::new(b)
            })
            .collect();
        Pool {
            rr: ArcSwap::from_pointee(Schedule::default()),
            rr_rebuild: Mutex::new(()),
            backends,
            algo: params.algo,
            slow_start: params.slow_start,
            tie: AtomicUsize::new(0),
            waiters,
            queue_size: params.queue_size,
            queue_timeout: params.queue_timeout,
        }
    }

    /// The backend with this name.
    pub fn get(&self, name: &str) -> Option<&Arc<Backend>> {
        self.backends.iter().find(|b| &*b.name == name)
    }

    /// Connections waiting for a slot now.
    pub fn queued(&self) -> usize {
        self.waiters.queued.load(Ordering::Acquire)
    }

    /// The backend `balance: first` gives the next new connection to: the first
    /// candidate with a free slot, else the first candidate (where it would
    /// queue); `None` when no backend is available. Sticky hits aside.
    pub fn first_choice(&self) -> Option<&Arc<Backend>> {
        let cands = self.candidates(&[]);
        let open = cands.iter().find(|&&i| self.backends[i].has_capacity());
        open.or(cands.first()).map(|&i| &self.backends[i])
    }

    /// Candidates: available primaries of weight above 0 not yet tried; else (every
    /// primary down, disabled, at weight 0, or already tried for this connection)
    /// such backups not yet tried; else such backends that left DNS (make before
    /// break: they serve until a backend DNS still lists can).
    fn candidates(&self, tried: &[usize]) -> Vec<usize> {
        let ok = |b: &&Arc<Backend>| b.takes_new() && !tried.contains(&b.index);
        let tier = |backup: bool, left: bool| -> Vec<usize> {
            self.backends
                .iter()
                .filter(|b| b.config.backup == backup && b.config.left_dns == left)
                .filter(ok)
                .map(|b| b.index)
                .collect()
        };
        for (backup, left) in [(false, false), (true, false)] {
            let found = tier(backup, left);
            if !found.is_empty() {
                return found;
            }
        }
        let mut departed = tier(false, true);
        departed.extend(tier(true, true));
        departed
    }

    /// No backend DNS (or the file) still lists takes new connections: those that
    /// left DNS still do (they drain only once a listed one can).
    pub fn departed_serve(&self) -> bool {
        !self
            .backends
            .iter()
            .any(|b| !b.config.left_dns && b.takes_new())
    }

    fn pick(&self, client: IpAddr, tried: &[usize]) -> Pick {
        let cands = self.candidates(tried);
        if cands.is_empty() {
            return Pick::Nothing;
        }
        let open: Vec<usize> = cands
            .into_iter()
            .filter(|&i| self.backends[i].has_capacity())
            .collect();
        if open.is_empty() {
            return Pick::Full;
        }
        let chosen = match self.algo {
            Balance::First => open[0],
            Balance::RoundRobin => self.pick_round_robin(&open),
            Balance::LeastConn => self.pick_least_conn(&open),
            Balance::Source => self.pick_source(client, &open),
        };
        Pick::Backend(chosen)
    }

    /// Smooth weighted round robin (nginx's: each step adds every backend's weight
    /// to its current value, takes the largest and subtracts the total from it;
    /// 5,1,1 -> a a b a c a a), precomputed as one cycle ([`Schedule`]) for the
    /// weights of the candidates' tier and walked with an atomic cursor: a pick
    /// is a load and a fetch-add, the only lock a rebuild after the weights changed
    /// (run time, slow-start steps, a backend up or down), which picks meanwhile
    /// wait for. Backends of the schedule not open to this pick (full, or already
    /// tried) are stepped over, so the others keep their proportions.
    fn pick_round_robin(&self, open: &[usize]) -> usize {
        let backup = self.backends[open[0]].config.backup;
        let mut schedule = self.rr.load();
        if !self.schedule_fits(&schedule, backup) {
            let _rebuilding = self.rr_rebuild.lock().unwrap_or_else(|e| e.into_inner());
            schedule = self.rr.load();
            if !self.schedule_fits(&schedule, backup) {
                let weights = self
                    .backends
                    .iter()
                    .map(|b| self.schedule_weight(b, backup));
                // Carry the position on: feedback rebuilds the schedule every few
                // seconds, and a cycle always restarted at 0 would starve a backend
                // whose few places lie late in it.
                let at = schedule.cursor.load(Ordering::Relaxed);
                self.rr
                    .store(Arc::new(Schedule::build(weights.collect(), at)));
                schedule = self.rr.load();
            }
        }
        for _ in 0..schedule.order.len() {
            let at = schedule.cursor.fetch_add(1, Ordering::Relaxed) % schedule.order.len();
            let i = schedule.order[at];
            if open.contains(&i) {
                return i;
            }
        }
        open[0] // the schedule lost a race with a change: it is rebuilt next pick
    }

    /// A backend's weight in the schedule of the tier `backup`: 0 if it is not a
    /// candidate of that tier.
    fn schedule_weight(&self, b: &Backend, backup: bool) -> u64 {
        if b.config.backup == backup && b.takes_new() {
            b.scheduled_weight(self.slow_start)
        } else {
            0
        }
    }

    fn schedule_fits(&self, s: &Schedule, backup: bool) -> bool {
        s.weights.len() == self.backends.len()
            && self
                .backends
                .iter()
                .zip(&s.weights)
                .all(|(b, &w)| self.schedule_weight(b, backup) == w)
    }

    /// Fewest active connections per unit of weight; ties rotate.
    fn pick_least_conn(&self, open: &[usize]) -> usize {
        let start = self.tie.fetch_add(1, Ordering::Relaxed) % open.len();
        let mut best = open[start];
        let load = |i: usize| {
            let b = &self.backends[i];
            (u64::from(b.active()) + 1, b.ramped_weight(self.slow_start))
        };
        for k in 1..open.len() {
            let i = open[(start + k) % open.len()];
            let (ai, wi) = load(i);
            let (ab, wb) = load(best);
            if u128::from(ai) * u128::from(wb) < u128::from(ab) * u128::from(wi) {
                best = i;
            }
        }
        best
    }

    /// Weighted rendezvous hashing of the client address: adding or removing a
    /// backend moves only the clients that hash to it (about 1/N of them).
    fn pick_source(&self, client: IpAddr, open: &[usize]) -> usize {
        let mut best = open[0];
        let mut best_score = f64::NEG_INFINITY;
        for &i in open {
            let b = &self.backends[i];
            let mut h = std::collections::hash_map::DefaultHasher::new();
            client.hash(&mut h);
            b.name.hash(&mut h);
            let x = h.finish();
            // Uniform in (0, 1]; score = -w / ln(u) is the weighted HRW score.
            let u = ((x >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
            let score = -(b.ramped_weight(self.slow_start) as f64) / u.ln();
            if score > best_score {
                best_score = score;
                best = i;
            }
        }
        best
    }

    /// The position of the backend with this name.
    pub fn position(&self, name: &str) -> Option<usize> {
        self.backends.iter().position(|b| &*b.name == name)
    }

    /// Reserve a slot on the backend at `index` if it is available and not full (a
    /// sticky hit).
    pub fn try_preferred(&self, index: usize) -> Option<Lease> {
        let b = self.backends.get(index)?;
        if b.is_available() && (!b.config.left_dns || self.departed_serve()) {
            b.try_reserve()
        } else {
            None
        }
    }

    /// Choose a backend not in `tried` with the service's algorithm and reserve a slot
    /// if one is free now; `None` when every candidate is tried, down or full. Never
    /// queues: for optional extra connections (placement confirmation).
    pub fn try_pick(&self, client: IpAddr, tried: &[usize]) -> Option<Lease> {
        for _ in 0..MAX_PICK_RACES {
            match self.pick(client, tried) {
                Pick::Backend(i) => {
                    if let Some(lease) = self.backends[i].try_reserve() {
                        return Some(lease);
                    }
                }
                Pick::Full | Pick::Nothing => return None,
            }
        }
        None
    }

    /// Choose a backend not in `tried` and reserve a slot, waiting in the bounded
    /// queue up to the queue timeout when every candidate is full.
    ///
    /// A queued connection waits on its candidates only, so the slot a backend
    /// frees wakes a connection that can take it: one that already tried that
    /// backend (a retry) is never woken for it, and never swallows the wakeup
    /// another queued connection needed.
    pub async fn acquire(&self, client: IpAddr, tried: &[usize]) -> Result<Lease, PickError> {
        // A free slot is taken without listening for one first: no waiter to box
        // and register (a lock per candidate) on the common path (issue #32). Only
        // a full pool listens, then looks again, so no freed slot is missed.
        if let Pick::Backend(i) = self.pick(client, tried) {
            if let Some(lease) = self.backends[i].try_reserve() {
                return Ok(lease);
            }
        }
        let deadline = tokio::time::Instant::now() + self.queue_timeout;
        let mut waiting: Option<QueueSlot<'_>> = None;
        loop {
            // Listen before looking, so a slot freed in between is not missed.
            let mut freed: Vec<Pin<Box<Notified<'_>>>> = self
                .candidates(tried)
                .into_iter()
                .map(|i| Box::pin(self.backends[i].state.slot_freed.notified()))
                .collect();
            for n in &mut freed {
                n.as_mut().enable();
            }
            let mut full = false;
            for _ in 0..MAX_PICK_RACES {
                match self.pick(client, tried) {
                    Pick::Backend(i) => {
                        if let Some(lease) = self.backends[i].try_reserve() {
                            return Ok(lease);
                        }
                    }
                    Pick::Full => {
                        full = true;
                        break;
                    }
                    Pick::Nothing => return Err(PickError::NoBackendAvailable),
                }
            }
            if !full {
                continue; // lost several races in a row: try again right away
            }
            if waiting.is_none() {
                waiting = Some(QueueSlot::enter(self).ok_or(PickError::QueueFull)?);
            }
            if tokio::time::timeout_at(deadline, any_of(&mut freed))
                .await
                .is_err()
            {
                return Err(PickError::QueueTimeout);
            }
        }
    }
}

/// Completes when one of `notified` does. The others are dropped with it, and one
/// that was notified meanwhile hands its wakeup on to the next connection waiting
/// on that backend (tokio's `Notified` does so on drop), so no freed slot is lost.
async fn any_of(notified: &mut [Pin<Box<Notified<'_>>>]) {
    std::future::poll_fn(|cx| {
        if notified.iter_mut().any(|n| n.as_mut().poll(cx).is_ready()) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
}

/// The live state of the backend `c` names: the previous pool's if it has a backend
/// of that name at the same address, else a fresh one.
fn carried_state(previous: Option<&Pool>, c: &BackendConfig) -> Arc<BackendState> {
    let same = previous
        .and_then(|p| p.get(&c.name))
        .filter(|prev| prev.config.address == c.address);
    if let Some(prev) = same {
        return prev.state.clone();
    }
    let state = BackendState::new(if c.disabled {
        AdminState::Disabled
    } else {
        AdminState::Enabled
    });
    // A backend DNS adds to a running pool gets traffic only after `rise` checks
    // (then ramps over `slow_start`); at start it is up, like configured ones.
    if previous.is_some() && c.from_dns.is_some() {
        state.healthy.store(false, Ordering::Release);
    }
    Arc::new(state)
}

/// One cycle of smooth weighted round robin for fixed weights, and where the pool
/// is in it.
#[derive(Debug, Default)]
struct Schedule {
    /// The weight of each backend (by index) it was built for; 0 = not in it.
    weights: Vec<u64>,
    /// Backend indices in pick order: each backend as often as its weight (divided
    /// by the weights' greatest common divisor), spread evenly.
    order: Vec<usize>,
    /// Picks made from it (wrapping around `order`).
    cursor: AtomicUsize,
}

impl Schedule {
    fn build(weights: Vec<u64>, cursor: usize) -> Schedule {
        let gcd = weights.iter().fold(0, |g, &w| gcd(g, w)).max(1);
        let mut reduced: Vec<u64> = weights.iter().map(|&w| w / gcd).collect();
        let sum: u64 = reduced.iter().sum();
        if sum > MAX_SCHEDULE {
            // Proportions to within 1 / MAX_SCHEDULE; every backend keeps a place.
            for w in reduced.iter_mut().filter(|w| **w > 0) {
                *w = (*w * MAX_SCHEDULE / sum).max(1);
            }
        }
        let reduced: Vec<i64> = reduced.into_iter().map(|w| w as i64).collect();
        let total: i64 = reduced.iter().sum();
        let mut current = vec![0i64; reduced.len()];
        let mut order = Vec::with_capacity(total as usize);
        for _ in 0..total {
            let mut best = None;
            for (i, &w) in reduced.iter().enumerate().filter(|(_, &w)| w > 0) {
                current[i] += w;
                if best.map_or(true, |b: usize| current[i] > current[b]) {
                    best = Some(i);
                }
            }
            if let Some(b) = best {
                current[b] -= total;
                order.push(b);
            }
        }
        Schedule {
            weights,
            order,
            cursor: AtomicUsize::new(cursor),
        }
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// A place in a pool's queue, given back on drop.
struct QueueSlot<'a> {
    pool: &'a Pool,
}

impl<'a> QueueSlot<'a> {
    fn enter(pool: &'a Pool) -> Option<QueueSlot<'a>> {
        let mut cur = pool.waiters.queued.load(Ordering::Acquire);
        loop {
            if cur >= pool.queue_size {
                return None;
            }
            match pool.waiters.queued.compare_exchange_weak(
                cur,
                cur + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(QueueSlot { pool }),
                Err(now) => cur = now,
            }
        }
    }
}

impl Drop for QueueSlot<'_> {
    fn drop(&mut self) {
        self.pool.waiters.queued.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streaks_reset_each_other_and_saturate() {
        let s = HealthStreak::default();
        assert_eq!(s.record(false), 1);
        assert_eq!(s.record(false), 2);
        assert_eq!(s.record(true), 1);
        assert_eq!(s.failures(), 0);
        s.passes.store(u32::MAX, Ordering::Release);
        assert_eq!(s.record(true), u32::MAX);
    }
    use crate::config::BackendAddress;
    use crate::metrics::Metrics;

    fn backend(name: &str, weight: u32, backup: bool, max: Option<u32>) -> BackendConfig {
        let address = BackendAddress {
            host: "127.0.0.1".into(),
            port: 1,
        };
        BackendConfig {
            weight,
            backup,
            max_connections: max,
            ..BackendConfig::new(name, address)
        }
    }

    fn pool(algo: Balance, backends: &[BackendConfig]) -> Pool {
        let m = Metrics::new();
        Pool::new(
            backends,
            PoolParams {
                algo,
                slow_start: Duration::ZERO,
                queue_size: 4,
                queue_timeout: Duration::from_millis(200),
            },
            |b| m.backend("t", &b.name),
            None,
        )
    }

    #[test]
    fn first_choice_is_where_first_sends_the_next_connection() {
        let p = pool(
            Balance::First,
            &[
                backend("a", 1, false, Some(1)),
                backend("b", 1, false, None),
                backend("c", 1, true, None),
            ],
        );
        let first = |p: &Pool| p.first_choice().map(|b| b.name.to_string());
        assert_eq!(first(&p).as_deref(), Some("a"));
        let lease = p.try_pick(ip(1), &[]).expect("a slot");
        assert_eq!(&*lease.backend().name, "a");
        assert_eq!(first(&p).as_deref(), Some("b"), "a is full");
        drop(lease);
        p.backends[0].set_healthy(false);
        p.backends[1].set_admin_state(AdminState::Drain);
        assert_eq!(first(&p).as_deref(), Some("c"), "the backup");
        p.backends[2].set_healthy(false);
        assert_eq!(first(&p), None);
    }

    fn ip(n: u32) -> IpAddr {
        IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + n))
    }

    async fn names(p: &Pool, n: usize) -> Vec<String> {
        let mut out = Vec::new();
        for _ in 0..n {
            let l = p.acquire(ip(1), &[]).await.unwrap();
            out.push(l.backend().name.to_string());
        }
        out
    }

    #[tokio::test]
    async fn round_robin_is_even_and_smooth() {
        let p = pool(
            Balance::RoundRobin,
            &[
                backend("a", 1, false, None),
                backend("b", 1, false, None),
                backend("c", 1, false, None),
            ],
        );
        let got = names(&p, 9).await;
        for n in ["a", "b", "c"] {
            assert_eq!(got.iter().filter(|x| *x == n).count(), 3, "{got:?}");
        }
        let p = pool(
            Balance::RoundRobin,
            &[
                backend("a", 5, false, None),
                backend("b", 1, false, None),
                backend("c", 1, false, None),
            ],
        );
        let got = names(&p, 7).await;
        assert_eq!(got.iter().filter(|x| *x == "a").count(), 5, "{got:?}");
        // Smooth: never three a's in a row within one cycle of 7.
        assert!(
            !got.windows(3).any(|w| w.iter().all(|x| x == "a")),
            "{got:?}"
        );
    }

    /// Picks from several threads at once give every backend exactly its share
    /// per cycle, before and after the weights change at run time (the first pick
    /// after the change rebuilds the schedule, the others wait for it).
    #[test]
    fn round_robin_from_many_threads_keeps_exact_shares_across_weight_changes() {
        let p = pool(
            Balance::RoundRobin,
            &[
                backend("a", 12, false, None),
                backend("b", 4, false, None),
                backend("c", 2, false, None),
            ],
        );
        let picks = |p: &Pool, per_thread: usize| {
            let counts: [AtomicUsize; 3] = Default::default();
            std::thread::scope(|s| {
                for _ in 0..4 {
                    s.spawn(|| {
                        for _ in 0..per_thread {
                            let lease = p.try_pick(ip(1), &[]).expect("a free backend");
                            counts[lease.backend().index].fetch_add(1, Ordering::Relaxed);
                        }
                    });
                }
            });
            counts.map(|c| c.into_inner())
        };
        // 4 threads x 50 cycles of 18 picks.
        assert_eq!(picks(&p, 18 * 50), [2400, 800, 400]);
        p.backends[0].set_weight(1);
        p.backends[2].set_weight(3);
        // 4 threads x 100 cycles of 8 picks at 1:4:3.
        assert_eq!(picks(&p, 8 * 100), [400, 1600, 1200]);
    }

    /// A connection that already tried a backend is given the others in their
    /// proportions; the schedule stepping over the tried one.
    #[test]
    fn round_robin_steps_over_a_tried_backend_keeping_proportions() {
        let p = pool(
            Balance::RoundRobin,
            &[
                backend("a", 4, false, None),
                backend("b", 2, false, None),
                backend("c", 1, false, None),
            ],
        );
        let mut counts = [0usize; 3];
        for _ in 0..7 * 30 {
            counts[p.try_pick(ip(1), &[0]).expect("b or c").backend().index] += 1;
        }
        assert_eq!(counts, [0, 140, 70]);
        // Everyone else still gets the full cycle.
        let mut counts = [0usize; 3];
        for _ in 0..7 * 30 {
            counts[p
                .try_pick(ip(1), &[])
                .expect("a free backend")
                .backend()
                .index] += 1;
        }
        assert_eq!(counts, [120, 60, 30]);
    }

    #[tokio::test]
    async fn a_run_time_weight_applies_to_the_next_picks_and_zero_leaves_sticky_hits() {
        let p = pool(
            Balance::RoundRobin,
            &[backend("a", 1, false, None), backend("b", 1, false, None)],
        );
        p.backends[0].set_weight(3);
        let got = names(&p, 8).await;
        assert_eq!(got.iter().filter(|x| *x == "a").count(), 6, "{got:?}");
        p.backends[0].set_weight(0);
        assert_eq!(names(&p, 4).await, ["b", "b", "b", "b"]);
        assert_eq!(p.backends[0].state_name(), "up", "weight 0 is not a drain");
        let sticky = p.try_preferred(0).expect("a sticky hit still reaches it");
        assert_eq!(&*sticky.backend().name, "a");
        // Every primary at 0: the backup takes new connections, as when they are down.
        let p = pool(
            Balance::First,
            &[backend("a", 1, false, None), backend("bk", 1, true, None)],
        );
        p.backends[0].set_weight(0);
        assert_eq!(names(&p, 1).await, ["bk"]);
        assert_eq!(p.backends[0].metrics.weight.get(), 0);
        p.backends[0].set_weight(MAX_WEIGHT + 1);
        assert_eq!(p.backends[0].weight(), MAX_WEIGHT, "clamped");
    }

    #[tokio::test]
    async fn a_reloaded_pool_starts_from_the_configured_weight() {
        let m = Metrics::new();
        let params = PoolParams {
            algo: Balance::RoundRobin,
            slow_start: Duration::ZERO,
            queue_size: 4,
            queue_timeout: Duration::from_secs(1),
        };
        let configs = [backend("a", 2, false, None)];
        let old = Pool::new(&configs, params, |b| m.backend("t", &b.name), None);
        old.backends[0].set_weight(0);
        old.backends[0].set_admin_state(AdminState::Drain);
        let new = Pool::new(&configs, params, |b| m.backend("t", &b.name), Some(&old));
        assert_eq!(new.backends[0].weight(), 2);
        assert_eq!(new.backends[0].metrics.weight.get(), 2);
        assert_eq!(new.backends[0].admin_state(), AdminState::Drain, "carried");
    }

    #[tokio::test]
    async fn least_conn_prefers_the_idle_backend() {
        let p = pool(
            Balance::LeastConn,
            &[backend("a", 1, false, None), backend("b", 1, false, None)],
        );
        let first = p.acquire(ip(1), &[]).await.unwrap();
        let second = p.acquire(ip(1), &[]).await.unwrap();
        assert_ne!(first.backend().name, second.backend().name);
        let busy = first.backend().name.clone();
        drop(second);
        for _ in 0..5 {
            let l = p.acquire(ip(1), &[]).await.unwrap();
            assert_ne!(l.backend().name, busy);
        }
        drop(first);
    }

    #[tokio::test]
    async fn first_and_backup_order() {
        let p = pool(
            Balance::First,
            &[
                backend("ca1", 1, false, None),
                backend("ca2", 1, true, None),
                backend("ca3", 1, true, None),
            ],
        );
        assert_eq!(names(&p, 3).await, ["ca1", "ca1", "ca1"]);
        p.backends[0].set_healthy(false);
        assert_eq!(names(&p, 2).await, ["ca2", "ca2"]);
        p.backends[1].set_admin_state(AdminState::Drain);
        assert_eq!(names(&p, 1).await, ["ca3"]);
        p.backends[0].set_healthy(true);
        assert_eq!(names(&p, 1).await, ["ca1"]);
    }

    #[tokio::test]
    async fn backups_take_retries_once_every_primary_was_tried() {
        let p = pool(
            Balance::RoundRobin,
            &[backend("a", 1, false, None), backend("bk", 1, true, None)],
        );
        // Primary "a" refused this connection (tried): the retry goes to the backup.
        assert_eq!(&*p.acquire(ip(1), &[0]).await.unwrap().backend().name, "bk");
        assert_eq!(
            p.acquire(ip(1), &[0, 1]).await.unwrap_err(),
            PickError::NoBackendAvailable
        );
    }

    #[tokio::test]
    async fn source_is_stable_and_moves_about_one_nth_when_adding() {
        let three = [
            backend("a", 1, false, None),
            backend("b", 1, false, None),
            backend("c", 1, false, None),
        ];
        let four = [
            three[0].clone(),
            three[1].clone(),
            three[2].clone(),
            backend("d", 1, false, None),
        ];
        let (p3, p4) = (pool(Balance::Source, &three), pool(Balance::Source, &four));
        let clients = 2000;
        let mut moved = 0;
        for c in 0..clients {
            let a = p3.acquire(ip(c), &[]).await.unwrap().backend().name.clone();
            let again = p3.acquire(ip(c), &[]).await.unwrap().backend().name.clone();
            assert_eq!(a, again);
            let b = p4.acquire(ip(c), &[]).await.unwrap().backend().name.clone();
            if a != b {
                assert_eq!(&*b, "d", "a client moved between old backends");
                moved += 1;
            }
        }
        let share = f64::from(moved) / f64::from(clients);
        assert!((0.18..0.32).contains(&share), "moved {share}");
    }

    #[tokio::test]
    async fn max_connections_queue_and_timeout() {
        let p = pool(Balance::RoundRobin, &[backend("a", 1, false, Some(1))]);
        let held = p.acquire(ip(1), &[]).await.unwrap();
        assert_eq!(
            p.acquire(ip(1), &[]).await.unwrap_err(),
            PickError::QueueTimeout
        );
        // A queued connection gets the slot as soon as it is released.
        let p = Arc::new(p);
        let waiter = tokio::spawn({
            let p = p.clone();
            async move {
                p.acquire(ip(1), &[])
                    .await
                    .map(|l| l.backend().name.to_string())
            }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(p.queued(), 1);
        drop(held);
        assert_eq!(waiter.await.unwrap().unwrap(), "a");
    }

    /// Two queued connections, two full backends: one connection already tried `a`
    /// (a retry), the other can use either. The slot `a` frees goes to the one that
    /// can use it, at once, though the retry queued first; `b`'s goes to the retry.
    #[tokio::test]
    async fn a_freed_slot_wakes_a_waiter_that_can_use_it() {
        let m = Metrics::new();
        let p = Arc::new(Pool::new(
            &[
                backend("a", 1, false, Some(1)),
                backend("b", 1, false, Some(1)),
            ],
            PoolParams {
                algo: Balance::RoundRobin,
                slow_start: Duration::ZERO,
                queue_size: 4,
                queue_timeout: Duration::from_secs(60),
            },
            |b| m.backend("t", &b.name),
            None,
        ));
        let held_a = p.try_preferred(0).unwrap();
        let held_b = p.try_preferred(1).unwrap();
        let queue = |tried: Vec<usize>| {
            let p = p.clone();
            tokio::spawn(async move {
                p.acquire(ip(1), &tried)
                    .await
                    .map(|l| l.backend().name.to_string())
            })
        };
        let queued = |n| {
            let p = p.clone();
            async move {
                while p.queued() < n {
                    tokio::task::yield_now().await;
                }
            }
        };
        let retry = queue(vec![0]);
        queued(1).await;
        let fresh = queue(vec![]);
        queued(2).await;
        drop(held_a);
        // Before the fix the retry, first in the queue, took this wakeup, could not
        // use `a` and waited on: `fresh` waited for its queue timeout.
        assert_eq!(fresh.await.unwrap(), Ok("a".to_string()));
        drop(held_b);
        assert_eq!(retry.await.unwrap(), Ok("b".to_string()));
    }

    #[tokio::test]
    async fn a_reloaded_pool_shares_counts_and_queue_with_the_old_one() {
        let m = Metrics::new();
        let params = PoolParams {
            algo: Balance::RoundRobin,
            slow_start: Duration::ZERO,
            queue_size: 4,
            queue_timeout: Duration::from_secs(60),
        };
        let configs = [backend("a", 1, false, Some(1))];
        let old = Pool::new(&configs, params, |b| m.backend("t", &b.name), None);
        let held = old.acquire(ip(1), &[]).await.unwrap();
        old.backends[0].set_admin_state(AdminState::Drain);
        let new = Arc::new(Pool::new(
            &configs,
            params,
            |b| m.backend("t", &b.name),
            Some(&old),
        ));
        assert_eq!(new.backends[0].active(), 1, "the old connection counts");
        assert_eq!(new.backends[0].admin_state(), AdminState::Drain);
        new.backends[0].set_admin_state(AdminState::Enabled);
        let waiter = tokio::spawn({
            let new = new.clone();
            async move { new.acquire(ip(1), &[]).await.map(|l| l.backend().active()) }
        });
        for _ in 0..10_000 {
            if new.queued() == 1 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(new.queued(), 1, "full: the new client queues");
        drop(held); // released on the old pool: wakes the client queued on the new one
        assert_eq!(waiter.await.unwrap(), Ok(1));
        // Another address is another server: it starts from nothing.
        let _kept = new.try_pick(ip(1), &[]).unwrap();
        let mut moved = configs[0].clone();
        moved.address.port = 2;
        let fresh = Pool::new(&[moved], params, |b| m.backend("t", &b.name), Some(&new));
        assert_eq!(fresh.backends[0].active(), 0);
    }

    #[tokio::test]
    async fn slow_start_ramps_a_recovered_backend() {
        let m = Metrics::new();
        let p = Pool::new(
            &[backend("a", 1, false, None), backend("b", 1, false, None)],
            PoolParams {
                algo: Balance::RoundRobin,
                slow_start: Duration::from_secs(1),
                queue_size: 4,
                queue_timeout: Duration::from_millis(200),
            },
            |b| m.backend("t", &b.name),
            None,
        );
        p.backends[1].set_healthy(false);
        p.backends[1].set_healthy(true);
        // Just back: b's weight is a small fraction of a's.
        let early = names(&p, 40).await.iter().filter(|n| *n == "b").count();
        assert!(early <= 8, "b got {early}/40 right after recovery");
        // After the ramp: even again (time itself is what this test is about).
        tokio::time::sleep(Duration::from_millis(1050)).await;
        let late = names(&p, 40).await.iter().filter(|n| *n == "b").count();
        assert!((18..=22).contains(&late), "b got {late}/40 after the ramp");
    }

    #[tokio::test]
    async fn queue_is_bounded() {
        let p = Arc::new(pool(
            Balance::RoundRobin,
            &[backend("a", 1, false, Some(1))],
        ));
        let _held = p.acquire(ip(1), &[]).await.unwrap();
        let waiters: Vec<_> = (0..4)
            .map(|_| {
                let p = p.clone();
                tokio::spawn(async move { p.acquire(ip(1), &[]).await.map(|_| ()) })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(
            p.acquire(ip(1), &[]).await.unwrap_err(),
            PickError::QueueFull
        );
        for w in waiters {
            assert_eq!(w.await.unwrap().unwrap_err(), PickError::QueueTimeout);
        }
    }
}
