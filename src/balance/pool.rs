//! A service's pool of backends and how the four algorithms choose among them:
//! candidates (primaries, then backups, then backends that left DNS), `first`,
//! smooth weighted round robin, least connections per unit of weight, and
//! weighted rendezvous hashing of the client's address; sticky hits; the live
//! state a reload carries over.
use std::hash::{Hash, Hasher};
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;

use super::backend::Shared;
use super::queue::{Look, PickError, Queue};
use super::schedule::{self, Schedule, Weight};
use super::{AdminState, Backend, Lease, MAX_PICK_RACES};
use crate::config::{BackendConfig, Balance};
use crate::metrics::BackendMetrics;

/// The backends of one service and how to choose among them.
pub struct Pool {
    /// Backends in config order.
    pub backends: Vec<Arc<Backend>>,
    algo: Balance,
    pub(super) slow_start: Duration,
    /// Smooth weighted round robin, precomputed for the weights in force: picks
    /// read it and advance its cursor, never lock ([`Schedule`]).
    rr: ArcSwap<Schedule>,
    /// Held while the schedule is rebuilt after the weights changed.
    rr_rebuild: Mutex<()>,
    /// Rotates leastconn tie-breaking so equal backends share the load.
    tie: AtomicUsize,
    /// Connections waiting for a slot: the bound and the count, which a reload
    /// carries over.
    queue: Queue,
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
    /// The weight `b` is balanced by now ([`Weight::of`] with this pool's
    /// `slow_start`): what every algorithm picks with and every view shows.
    pub fn weight_of(&self, b: &Backend) -> Weight {
        Weight::of(b, self.slow_start)
    }

    /// `b`'s slow-start ramp, while one is under way (it recovered less than
    /// `slow_start` ago): new connections reach it in proportion to how far along.
    pub fn ramp_of(&self, b: &Backend) -> Option<Ramp> {
        schedule::ramp(b, self.slow_start).map(|(elapsed, total)| Ramp {
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
    /// state ([`Shared`]) of every backend whose name and address are unchanged;
    /// the operator's drain or disable sticks unless the config now says `disabled`.
    pub fn new(
        configs: &[BackendConfig],
        params: PoolParams,
        make: impl Fn(&BackendConfig) -> BackendMetrics,
        previous: Option<&Pool>,
    ) -> Pool {
        let queue = Queue::new(
            params.queue_size,
            params.queue_timeout,
            previous.map(|p| &p.queue),
        );
        let backends: Vec<Arc<Backend>> = configs
            .iter()
            .enumerate()
            .map(|(index, c)| Arc::new(Backend::new(c, index, carried_state(previous, c), make(c))))
            .collect();
        Pool {
            rr: ArcSwap::from_pointee(Schedule::default()),
            rr_rebuild: Mutex::new(()),
            backends,
            algo: params.algo,
            slow_start: params.slow_start,
            tie: AtomicUsize::new(0),
            queue,
        }
    }

    /// The backend with this name.
    pub fn get(&self, name: &str) -> Option<&Arc<Backend>> {
        self.backends.iter().find(|b| &*b.name == name)
    }

    /// Connections waiting for a slot now.
    pub fn queued(&self) -> usize {
        self.queue.queued()
    }

    /// The most connections that waited for a slot at once since the process
    /// started (reloads carry it over, as they carry the queue).
    pub fn queue_peak(&self) -> usize {
        self.queue.peak()
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
            self.weight_of(b).units()
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
            (u64::from(b.active()) + 1, self.weight_of(b).units())
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
            let score = -(self.weight_of(b).units() as f64) / u.ln();
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
        match self.look(client, tried) {
            Look::Got(lease) => Some(lease),
            Look::Full | Look::Nothing | Look::Raced => None,
        }
    }

    /// Choose a backend not in `tried` and reserve a slot, waiting in the bounded
    /// queue up to the queue timeout when every candidate is full.
    ///
    /// A queued connection waits on its candidates only, so the slot a backend
    /// frees wakes a connection that can take it: one that already tried that
    /// backend (a retry) is never woken for it, and never swallows the wakeup
    /// another queued connection needed.
    pub async fn acquire(&self, client: IpAddr, tried: &[usize]) -> Result<Lease, PickError> {
        self.acquire_timed(client, tried, &mut 0).await
    }

    /// [`Pool::acquire`], adding the milliseconds spent in the queue to
    /// `waited_ms`, rounded up (nothing when a slot was free at once, at least 1
    /// when it queued at all).
    pub async fn acquire_timed(
        &self,
        client: IpAddr,
        tried: &[usize],
        waited_ms: &mut u32,
    ) -> Result<Lease, PickError> {
        // A free slot is taken without listening for one first: no waiter to box
        // and register (a lock per candidate) on the common path (issue #32). Only
        // a full pool listens, then looks again, so no freed slot is missed.
        if let Pick::Backend(i) = self.pick(client, tried) {
            if let Some(lease) = self.backends[i].try_reserve() {
                return Ok(lease);
            }
        }
        let listen = || {
            self.candidates(tried)
                .into_iter()
                .map(|i| Box::pin(self.backends[i].shared.slot_freed.notified()))
                .collect()
        };
        let look = || self.look(client, tried);
        self.queue.wait(listen, look, waited_ms).await
    }

    /// One look for a free slot among the candidates not in `tried`, reserved;
    /// bounded tries so that a reservation race (two tasks taking the last slot)
    /// can't spin.
    fn look(&self, client: IpAddr, tried: &[usize]) -> Look<Lease> {
        for _ in 0..MAX_PICK_RACES {
            match self.pick(client, tried) {
                Pick::Backend(i) => {
                    if let Some(lease) = self.backends[i].try_reserve() {
                        return Look::Got(lease);
                    }
                }
                Pick::Full => return Look::Full,
                Pick::Nothing => return Look::Nothing,
            }
        }
        Look::Raced
    }
}

/// The live state of the backend `c` names: the previous pool's if it has a backend
/// of that name at the same address, else a fresh one.
fn carried_state(previous: Option<&Pool>, c: &BackendConfig) -> Arc<Shared> {
    let same = previous
        .and_then(|p| p.get(&c.name))
        .filter(|prev| prev.config.address == c.address);
    if let Some(prev) = same {
        return prev.shared.clone();
    }
    let state = Shared::new(if c.disabled {
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

/// What one pick found.
enum Pick {
    /// The backend at this index has a free slot.
    Backend(usize),
    /// Every candidate is full.
    Full,
    /// No candidate.
    Nothing,
}
