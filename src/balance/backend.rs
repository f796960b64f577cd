//! A backend: its live state, which a reload carries over ([`Shared`]), its
//! rise/fall streaks, its weight and limit, and the connection slots it leases.
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Instant;

use tokio::sync::Notify;

use super::{AdminState, State};
use crate::config::BackendConfig;
use crate::feedback::cell::FeedbackCell;
use crate::metrics::BackendMetrics;

/// Largest weight (the config's bound, run-time weights share it).
pub use crate::config::MAX_WEIGHT;

/// The clock of [`Shared::served_ms`] and [`Shared::down_ms`]: one for
/// the process, so that times of different backends compare.
static SERVICE_CLOCK: LazyLock<Instant> = LazyLock::new(Instant::now);

/// The operator state stored as `AdminState as u8` in [`Shared::admin`].
fn admin_of(v: u8) -> AdminState {
    match v {
        1 => AdminState::Drain,
        2 => AdminState::Disabled,
        _ => AdminState::Enabled,
    }
}

/// Now on [`SERVICE_CLOCK`], in ms plus one (0 means "never").
fn clock_ms() -> u64 {
    SERVICE_CLOCK.elapsed().as_millis() as u64 + 1
}

/// The live state of a backend: connection count, health, the operator's state and
/// the slow-start clock.
///
/// Shared (one `Arc`) by the pools of successive reloads while the backend's name
/// and address are unchanged: a connection accepted under the old config releases
/// its slot on the same counter the new pool reserves from, so `max_connections` and
/// `leastconn` hold across a reload, and health seen by either pool is seen by both.
#[derive(Debug)]
pub struct Shared {
    pub(super) active: AtomicU32,
    pub(super) healthy: AtomicBool,
    pub(super) standby: AtomicBool,
    pub(super) admin: AtomicU8,
    /// When the backend last became available (for slow start), as ms since `epoch`
    /// plus one; 0 = available since it was first configured (no ramp).
    pub(super) up_since_ms: AtomicU64,
    pub(super) epoch: Instant,
    /// Consecutive check results (rise/fall), fed by active and passive checks.
    pub(super) health: HealthStreak,
    /// A slot was released: wakes one connection queued for this backend (one
    /// that has it among its candidates, so it can take the slot).
    pub(super) slot_freed: Notify,
    /// When it was last given a connection, on [`SERVICE_CLOCK`]; 0 = never.
    pub(super) served_ms: AtomicU64,
    /// When it last went down, on [`SERVICE_CLOCK`]; 0 = never.
    pub(super) down_ms: AtomicU64,
    /// Load feedback: the factor of its weight and what the samples taught.
    pub(super) feedback: FeedbackCell,
}

impl Shared {
    pub(super) fn new(admin: AdminState) -> Shared {
        Shared {
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
    pub(super) shared: Arc<Shared>,
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
            .field("state", &self.state())
            .field("weight", &self.weight())
            .finish()
    }
}

impl Backend {
    /// The backend `c` configures, at `index` of its pool, on the live state `state`
    /// (a fresh one, or the one a reload carried over); `disabled: true` in the file
    /// disables it whatever the operator set before.
    pub(super) fn new(
        c: &BackendConfig,
        index: usize,
        state: Arc<Shared>,
        metrics: BackendMetrics,
    ) -> Backend {
        if c.disabled {
            state
                .admin
                .store(AdminState::Disabled as u8, Ordering::Release);
        }
        let b = Backend {
            name: Arc::from(c.name.as_str()),
            config: c.clone(),
            index,
            shared: state,
            weight: AtomicU32::new(c.weight),
            metrics,
        };
        b.publish_state();
        b
    }

    /// Is it healthy (by active and passive checks)?
    pub fn is_healthy(&self) -> bool {
        self.shared.healthy.load(Ordering::Acquire)
    }

    /// The operator-set state.
    pub fn admin_state(&self) -> AdminState {
        admin_of(self.shared.admin.load(Ordering::Acquire))
    }

    /// A recovered primary held back until the operator enables it (`failback: manual`).
    pub fn is_standby(&self) -> bool {
        self.shared.standby.load(Ordering::Acquire)
    }

    /// Takes new connections (ignoring its connection limit)?
    pub fn is_available(&self) -> bool {
        self.is_healthy() && !self.is_standby() && self.admin_state() == AdminState::Enabled
    }

    /// Consecutive check results (rise/fall), fed by active and passive checks.
    pub fn health(&self) -> &HealthStreak {
        &self.shared.health
    }

    /// Open connections now (under this and earlier configs: see [`Shared`]).
    pub fn active(&self) -> u32 {
        self.shared.active.load(Ordering::Acquire)
    }

    /// Its state: the operator's, else its health (see [`State`]).
    pub fn state(&self) -> State {
        match self.admin_state() {
            AdminState::Disabled => State::Disabled,
            AdminState::Drain => State::Drain,
            AdminState::Enabled if !self.is_healthy() => State::Down,
            AdminState::Enabled if self.is_standby() => State::Standby,
            AdminState::Enabled => State::Up,
        }
    }

    fn publish_state(&self) {
        self.metrics.up.set(i64::from(self.is_available()));
        self.metrics.set_state(self.state());
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
        &self.shared.feedback
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
        let changed = self.shared.healthy.swap(up, Ordering::AcqRel) != up;
        if changed && up {
            self.mark_up_now();
        }
        if changed && !up {
            self.shared.down_ms.store(clock_ms(), Ordering::Release);
        }
        self.publish_state();
        changed
    }

    /// Set the operator state; enabling also clears `standby`.
    pub fn set_admin_state(&self, s: AdminState) {
        self.shared.admin.store(s as u8, Ordering::Release);
        if s == AdminState::Enabled && self.shared.standby.swap(false, Ordering::AcqRel) {
            self.mark_up_now();
        }
        self.publish_state();
    }

    /// Set the operator state as a commit applies it (the file's, or the operator's
    /// record): a standby stays one.
    pub fn apply_admin_state(&self, s: AdminState) {
        self.shared.admin.store(s as u8, Ordering::Release);
        self.publish_state();
    }

    /// Started down and has not been checked into service yet (a backend DNS added
    /// to a running pool, waiting for its first passing checks).
    pub fn awaiting_first_check(&self) -> bool {
        !self.is_healthy() && self.shared.down_ms.load(Ordering::Acquire) == 0
    }

    /// Has this backend been given a connection since `other` last went down? (A
    /// backup that took none while the primary was gone took over nothing: see
    /// `failback: manual` in [`crate::health`].)
    pub fn served_since_down_of(&self, other: &Backend) -> bool {
        // A backend never down (a discovered newcomer waiting for its first checks)
        // was never taken over from.
        let served = self.shared.served_ms.load(Ordering::Acquire);
        let down = other.shared.down_ms.load(Ordering::Acquire);
        served != 0 && down != 0 && served >= down
    }

    /// Hold a recovered primary back (or release it).
    pub fn set_standby(&self, standby: bool) {
        self.shared.standby.store(standby, Ordering::Release);
        self.publish_state();
    }

    fn mark_up_now(&self) {
        // Stored + 1 so that 0 keeps meaning "available since start" even for a
        // recovery in the pool's first millisecond.
        let ms = self.shared.epoch.elapsed().as_millis() as u64 + 1;
        self.shared.up_since_ms.store(ms, Ordering::Release);
    }

    /// Reserve a connection slot if below `max_connections`.
    pub(super) fn try_reserve(self: &Arc<Self>) -> Option<Lease> {
        let max = self.max_connections().unwrap_or(u32::MAX);
        let mut cur = self.shared.active.load(Ordering::Acquire);
        loop {
            if cur >= max {
                return None;
            }
            match self.shared.active.compare_exchange_weak(
                cur,
                cur + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    self.shared.served_ms.store(clock_ms(), Ordering::Release);
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

    pub(super) fn has_capacity(&self) -> bool {
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
        self.backend.shared.active.fetch_sub(1, Ordering::AcqRel);
        self.backend.metrics.active.dec();
        self.backend.shared.slot_freed.notify_one();
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
}
