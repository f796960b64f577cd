//! The weight function of load feedback: from what each backend said of its load
//! to the factor its weight is multiplied by. Pure: no clock but the `now` it is
//! given, no I/O, so every property has a unit test.
//!
//! Per backend a [`Tracker`] keeps what the samples taught (smoothed, with the
//! blackout of a new backend, the expiry of an old sample, the largest pool seen);
//! [`Tracker::verdict`] is its say now, and [`factors`] turns a service's verdicts
//! into factors: a Puppet compiler's relative to the mean of the others (a weight,
//! never a choice: no node sends everything to the freest), an agent's percentage
//! as said, the floor under every one, 1 (the configured weight) where nothing is
//! known. The result is published for the balancer in a `cell::FeedbackCell`.
//!
//! What a compiler says is not believed blindly: an implausible sample is refused
//! ([`implausible`], counted as a bad answer), a pool counts at most
//! [`MAX_POOL_OVER_OTHERS`] times the others' (so one compiler's report never
//! pushes honest ones to the floor), a saturated compiler is at the floor whatever
//! the others say, and a larger pool than before is believed only once two samples
//! in a row report it.
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

pub use super::sample::{PoolLock, PuppetSample, Reading};

/// Largest factor: a compiler of 31 JRubies beside ones of 1 stays within 16 times
/// its weight, where the balancer's integer schedule keeps its precision.
pub const MAX_FACTOR: f64 = 16.0;
/// A compiler whose pool stays below the largest it reported for this long has a
/// new size (its `max-active-instances` was lowered): the ramp ends. Pools of dozens
/// of JRubies fill within a minute or two.
const RAMP_GIVE_UP: Duration = Duration::from_secs(300);
/// Most JRubies a compiler plausibly reports without a configured `jrubies`: the
/// largest `jrubies` the configuration accepts (each JRuby takes 0.5-2 GiB of heap:
/// the largest compilers run a few dozen); more is a lie or a broken endpoint.
pub const MAX_PLAUSIBLE_JRUBIES: u32 = crate::config::MAX_JRUBIES as u32;
/// A compiler's pool counts at most this many times the median pool of the other
/// compilers with a say: compilers of 1 and 3 JRubies keep their 1:3, one claiming
/// 64 beside compilers of 3 counts as 12 (its honest neighbours keep two thirds of
/// the weight they had). Fleets mixing pools more unlike than this set `weight:`
/// per backend, which multiplies the factor.
pub const MAX_POOL_OVER_OTHERS: f64 = 4.0;

/// The settings the function reads (from the service's `feedback:`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    /// Smallest factor while the backend passes its checks (0.05 = 5 %).
    pub floor: f64,
    /// A new backend's samples are not used for this long.
    pub blackout: Duration,
    /// After this long without a good sample the configured weight returns.
    pub expiry: Duration,
    /// EWMA time constant; zero takes every sample as it is.
    pub smoothing: Duration,
    /// The pool size a compiler should reach: with fewer JRubies ready (or a pool
    /// smaller than the largest it reported) it ramps.
    pub jrubies: Option<u32>,
    /// The compilers' `max-queued-requests`: a queue that long is full.
    pub queue_limit: Option<u32>,
    /// Count each compiler's JRubies in its weight.
    pub by_pool_size: bool,
}

/// Where a backend's feedback stands, as every view names it (on the wire by
/// [`Phase::as_str`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// No good sample yet: the configured weight.
    #[default]
    Waiting,
    /// Sampled, but new (`blackout`): the configured weight.
    Blackout,
    /// Its samples set its factor.
    Active,
    /// Its pool is filling (fewer JRubies ready than its size): the factor ramps
    /// with the pool.
    Ramping,
    /// Its pool is locked (a code deploy): the minimum factor.
    Locked,
    /// Its agent said drain, maint or down: the minimum factor.
    Stopped,
    /// No good sample for `expiry`: the configured weight again.
    Expired,
}

impl Phase {
    /// The name in the API, the metrics and the logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Waiting => "waiting",
            Phase::Blackout => "blackout",
            Phase::Active => "active",
            Phase::Ramping => "ramping",
            Phase::Locked => "locked",
            Phase::Stopped => "stopped",
            Phase::Expired => "expired",
        }
    }

    /// Its factor comes from the samples (else the configured weight applies).
    pub fn applies(self) -> bool {
        matches!(
            self,
            Phase::Active | Phase::Ramping | Phase::Locked | Phase::Stopped
        )
    }

    /// Every phase (its metric labels: [`crate::metrics::FEEDBACK_PHASES`]).
    pub const ALL: [Phase; 7] = [
        Phase::Waiting,
        Phase::Blackout,
        Phase::Active,
        Phase::Ramping,
        Phase::Locked,
        Phase::Stopped,
        Phase::Expired,
    ];
}

/// A backend's say now.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Verdict {
    /// Where it stands.
    pub phase: Phase,
    /// Its score: `None` when it has no say (the configured weight).
    pub score: Option<f64>,
    /// The score is a factor already (an agent's percentage), not relative to the
    /// others' (a compiler's capacity).
    pub absolute: bool,
    /// The pool the compiler reported (`num-jrubies`), which its score grows with:
    /// capped against the others' in [`factors`]; `None` for an agent.
    pub pool: Option<u32>,
}

impl Verdict {
    fn none(phase: Phase) -> Verdict {
        Verdict {
            phase,
            score: None,
            absolute: false,
            pool: None,
        }
    }
}

/// Why a compiler's sample can't be true, if it can't: more free JRubies than its
/// pool, a pool above the configured `jrubies` (the size every compiler of the
/// service should have) or, without it, above [`MAX_PLAUSIBLE_JRUBIES`]. (A negative count is
/// not a number the document parser takes.) Such a sample is refused like a
/// document that does not parse.
pub fn implausible(s: &PuppetSample, p: &Params) -> Option<String> {
    if s.free > s.jrubies {
        return Some(format!(
            "implausible sample: num-free-jrubies {} > num-jrubies {}",
            s.free, s.jrubies
        ));
    }
    if let Some(target) = p.jrubies {
        return (s.jrubies > target).then(|| {
            format!(
                "implausible sample: num-jrubies {} above feedback.jrubies {target}",
                s.jrubies
            )
        });
    }
    (s.jrubies > MAX_PLAUSIBLE_JRUBIES).then(|| {
        format!(
            "implausible sample: num-jrubies {} above {MAX_PLAUSIBLE_JRUBIES}",
            s.jrubies
        )
    })
}

/// What the samples of one backend taught.
#[derive(Debug, Clone, Default)]
pub struct Tracker {
    /// The first good sample since the backend was new (or its samples expired).
    first_ok: Option<Instant>,
    last_ok: Option<Instant>,
    /// The smoothed capacity (Puppet) or factor (agent), and when it was updated.
    smoothed: Option<(f64, Instant)>,
    /// The largest pool the compiler reported, and since when it is below it.
    largest_pool: u32,
    below_since: Option<Instant>,
    last: Option<Reading>,
    /// `queue-limit-hit-count` grew between the last two samples (503s were sent).
    hits_grew: bool,
    /// The last poll's failure, and when; cleared by a good sample.
    error: Option<(String, Instant)>,
}

impl Tracker {
    /// One good answer at `now`.
    pub fn observe(&mut self, reading: Reading, now: Instant, p: &Params) {
        if self.expired(now, p) || self.first_ok.is_none() {
            // New, or back after its samples expired: blackout again, from scratch.
            *self = Tracker {
                largest_pool: self.largest_pool,
                first_ok: Some(now),
                ..Tracker::default()
            };
        }
        let reading = match (reading, &self.last) {
            // An agent's words hold until it says otherwise (HAProxy's rule).
            (Reading::Agent(new), Some(Reading::Agent(old))) => Reading::Agent(old.then(&new)),
            (r, _) => r,
        };
        if let Reading::Puppet(s) = &reading {
            let previous = match &self.last {
                Some(Reading::Puppet(old)) => Some(old),
                _ => None,
            };
            self.hits_grew = previous.is_some_and(|old| s.queue_limit_hits > old.queue_limit_hits);
            self.note_pool(s.jrubies, previous.map(|old| old.jrubies), now);
        }
        if let Some(value) = self.instant_value(&reading, p) {
            let alpha = match self.smoothed {
                Some((_, at)) if !p.smoothing.is_zero() => {
                    let dt = now.saturating_duration_since(at).as_secs_f64();
                    1.0 - (-dt / p.smoothing.as_secs_f64()).exp()
                }
                _ => 1.0,
            };
            let old = self.smoothed.map_or(value, |(v, _)| v);
            self.smoothed = Some((old + alpha * (value - old), now));
        }
        self.last = Some(reading);
        self.last_ok = Some(now);
        self.error = None;
    }

    /// A poll that failed at `now`, and why (the last good sample holds until it expires).
    pub fn failed(&mut self, why: String, now: Instant) {
        let since = match &self.error {
            Some((_, since)) => *since,
            None => now,
        };
        self.error = Some((why, since));
    }

    /// The value the EWMA follows: a compiler's capacity ([`capacity`]), an
    /// agent's factor. `None` while a sample says nothing of load (a locked pool,
    /// an agent's stop word): those act at once and leave the average as it was.
    fn instant_value(&self, r: &Reading, p: &Params) -> Option<f64> {
        match r {
            Reading::Puppet(s) if s.lock != PoolLock::NotInUse => None,
            Reading::Puppet(s) => Some(capacity(s, p)),
            Reading::Agent(a) if a.stops() => None,
            Reading::Agent(a) => Some(f64::from(a.percent.unwrap_or(100)) / 100.0),
        }
    }

    /// A pool larger than the largest seen counts once two samples in a row
    /// report it (`previous`: the sample before), or at once when it is the first
    /// sample ever: one absurd answer does not hold the compiler ramping.
    fn note_pool(&mut self, jrubies: u32, previous: Option<u32>, now: Instant) {
        let confirmed = match previous {
            Some(before) => before.min(jrubies),
            None if self.largest_pool == 0 => jrubies,
            None => 0,
        };
        self.largest_pool = self.largest_pool.max(confirmed);
        if jrubies >= self.largest_pool {
            self.below_since = None;
            return;
        }
        let since = *self.below_since.get_or_insert(now);
        if now.saturating_duration_since(since) >= RAMP_GIVE_UP {
            self.largest_pool = jrubies; // a new size, not a pool still filling
            self.below_since = None;
        }
    }

    /// The pool a compiler should have: the configured target, else the largest seen.
    pub fn expected_pool(&self, p: &Params) -> u32 {
        p.jrubies.unwrap_or(0).max(self.largest_pool)
    }

    fn expired(&self, now: Instant, p: &Params) -> bool {
        self.last_ok
            .is_some_and(|t| now.saturating_duration_since(t) > p.expiry)
    }

    /// The backend's say at `now`.
    pub fn verdict(&self, now: Instant, p: &Params) -> Verdict {
        let (Some(first), Some(last)) = (self.first_ok, &self.last) else {
            return Verdict::none(Phase::Waiting);
        };
        if self.expired(now, p) {
            return Verdict::none(Phase::Expired);
        }
        let smoothed = self.smoothed.map(|(v, _)| v);
        let (v, ramp) = match last {
            Reading::Puppet(s) if self.saturated(now, p) => {
                // It refuses work: a score of 0, so the floor whatever the others
                // say (an average still decaying towards 0 could be the largest of
                // a few locked or expired compilers'), in its blackout too.
                let (v, _) = self.puppet_verdict(s, smoothed, p);
                return Verdict {
                    score: Some(0.0),
                    ..v
                };
            }
            Reading::Puppet(s) => self.puppet_verdict(s, smoothed, p),
            Reading::Agent(a) => {
                let stops = a.stops();
                let phase = if stops { Phase::Stopped } else { Phase::Active };
                let score = if stops { 0.0 } else { smoothed.unwrap_or(1.0) };
                (
                    Verdict {
                        phase,
                        score: Some(score),
                        absolute: true,
                        pool: None,
                    },
                    1.0,
                )
            }
        };
        if now.saturating_duration_since(first) >= p.blackout {
            return v;
        }
        // A newcomer's samples are not trusted to raise its weight, but a locked
        // or filling pool, or an agent's stop, says to send it less: that holds
        // during the blackout too, against the configured weight.
        match v.phase {
            Phase::Locked | Phase::Stopped => Verdict {
                score: Some(0.0),
                absolute: true,
                ..v
            },
            Phase::Ramping => Verdict {
                score: Some(ramp),
                absolute: true,
                ..v
            },
            _ => Verdict::none(Phase::Blackout),
        }
    }

    /// A compiler's say from its last sample: locked (the minimum), filling (its
    /// capacity times the share of its pool ready, which is returned too), or its
    /// smoothed capacity.
    fn puppet_verdict(
        &self,
        s: &PuppetSample,
        smoothed: Option<f64>,
        p: &Params,
    ) -> (Verdict, f64) {
        if s.lock != PoolLock::NotInUse {
            let v = Verdict {
                phase: Phase::Locked,
                score: Some(0.0),
                absolute: false,
                pool: Some(s.jrubies).filter(|_| p.by_pool_size),
            };
            return (v, 1.0);
        }
        let expected = self.expected_pool(p);
        let ready = s.ready();
        let (phase, ramp) = match ready < expected {
            true => (Phase::Ramping, f64::from(ready) / f64::from(expected)),
            false => (Phase::Active, 1.0),
        };
        let v = Verdict {
            phase,
            score: smoothed.map(|v| v * ramp),
            absolute: false,
            pool: Some(s.jrubies).filter(|_| p.by_pool_size),
        };
        (v, ramp)
    }

    /// The compiler refuses work now: its last sample showed no free JRuby and a
    /// full queue (`queue_limit`), or 503s since the sample before. A resumption
    /// stuck to it is placed like a new session.
    pub fn saturated(&self, now: Instant, p: &Params) -> bool {
        let Some(Reading::Puppet(s)) = &self.last else {
            return false;
        };
        if self.expired(now, p) {
            return false;
        }
        let full = s.free == 0 && p.queue_limit.is_some_and(|limit| s.queued >= limit);
        full || self.hits_grew
    }

    /// The connection limit an agent set (`maxconn:N`), while its answer holds.
    pub fn max_connections(&self, now: Instant, p: &Params) -> Option<u32> {
        match &self.last {
            Some(Reading::Agent(a)) if !self.expired(now, p) => a.maxconn.filter(|&n| n > 0),
            _ => None,
        }
    }

    /// The last good answer.
    pub fn last(&self) -> Option<&Reading> {
        self.last.as_ref()
    }

    /// Time since the last good answer.
    pub fn last_ok_age(&self, now: Instant) -> Option<Duration> {
        self.last_ok.map(|t| now.saturating_duration_since(t))
    }

    /// The failure of the last poll (cleared by a good one), and since when polls fail.
    pub fn error(&self) -> Option<(&str, Instant)> {
        self.error.as_ref().map(|(e, t)| (e.as_str(), *t))
    }

    /// `queue-limit-hit-count` grew between the last two samples.
    pub fn refused_since_last(&self) -> bool {
        self.hits_grew
    }
}

/// What a compiler can take now, from one sample. With its queue's limit known
/// (`queue_limit`: its `max-queued-requests`), the requests it takes before it
/// answers 503: free JRubies plus the queue's free places. An idle compiler of 1
/// JRuby and one of 3, both with a queue of 2, take a herd 3:5, which is where
/// neither refuses before the other. Without the limit, free JRubies against the
/// queue, (free + 1) / (JRubies + queued + 1), times the pool. `by_pool_size: false`
/// makes either a share of its own size (idle compilers alike).
pub fn capacity(s: &PuppetSample, p: &Params) -> f64 {
    let jrubies = f64::from(s.jrubies.max(1));
    let free = f64::from(s.free.min(s.jrubies));
    let queued = f64::from(s.queued);
    match p.queue_limit {
        Some(limit) => {
            let limit = f64::from(limit);
            let room = free + (limit - queued).max(0.0);
            if p.by_pool_size {
                room
            } else {
                room / (jrubies + limit)
            }
        }
        None => {
            let load = (free + 1.0) / (jrubies + queued + 1.0);
            if p.by_pool_size {
                load * jrubies
            } else {
                load
            }
        }
    }
}

/// The factors of a service's backends from their verdicts (same order): a
/// compiler's score (its pool capped at [`MAX_POOL_OVER_OTHERS`] times the others')
/// relative to the mean of those with a say, an agent's as said, 1 without a say;
/// then at least `floor` and at most [`MAX_FACTOR`].
pub fn factors(verdicts: &[Verdict], floor: f64) -> Vec<f64> {
    let scores = capped_scores(verdicts);
    let relative: Vec<f64> = verdicts
        .iter()
        .zip(&scores)
        .filter(|(v, _)| !v.absolute)
        .filter_map(|(_, s)| *s)
        .collect();
    let mean = relative.iter().sum::<f64>() / relative.len().max(1) as f64;
    verdicts
        .iter()
        .zip(scores)
        .map(|(v, score)| {
            let f = match score {
                None => 1.0,
                Some(s) if v.absolute => s,
                Some(_) if mean <= 0.0 => floor, // every compiler locked or empty
                Some(s) => s / mean,
            };
            f.clamp(floor, MAX_FACTOR)
        })
        .collect()
}

/// Each verdict's score, a compiler's scaled down when its pool is more than
/// [`MAX_POOL_OVER_OTHERS`] times the median pool of the other compilers with a
/// say (its score grows with its pool: a pool it made up must not take the share
/// of the honest ones).
fn capped_scores(verdicts: &[Verdict]) -> Vec<Option<f64>> {
    let pools: Vec<(usize, f64)> = verdicts
        .iter()
        .enumerate()
        .filter(|(_, v)| !v.absolute && v.score.is_some())
        .filter_map(|(i, v)| v.pool.map(|n| (i, f64::from(n.max(1)))))
        .collect();
    verdicts
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let (score, pool) = (v.score?, v.pool.filter(|_| !v.absolute));
            let Some(pool) = pool.map(|n| f64::from(n.max(1))) else {
                return Some(score);
            };
            let mut others: Vec<f64> = pools.iter().filter(|(j, _)| *j != i).map(|p| p.1).collect();
            let Some(median) = median(&mut others) else {
                return Some(score);
            };
            let cap = MAX_POOL_OVER_OTHERS * median;
            Some(if pool > cap {
                score * cap / pool
            } else {
                score
            })
        })
        .collect()
}

/// The median of `xs` (the lower middle one of an even count); `None` if empty.
fn median(xs: &mut [f64]) -> Option<f64> {
    xs.sort_by(f64::total_cmp);
    xs.get(xs.len().saturating_sub(1) / 2).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn the_metric_labels_are_the_phases() {
        let labels = Phase::ALL.map(Phase::as_str);
        assert_eq!(labels, crate::metrics::FEEDBACK_PHASES);
    }

    fn params() -> Params {
        Params {
            floor: 0.05,
            blackout: Duration::ZERO,
            expiry: 10 * S,
            smoothing: Duration::ZERO,
            jrubies: None,
            queue_limit: None,
            by_pool_size: true,
        }
    }

    fn pool(jrubies: u32, free: u32, queued: u32) -> Reading {
        Reading::Puppet(PuppetSample {
            jrubies,
            free,
            queued,
            borrowed: jrubies - free.min(jrubies),
            lock: PoolLock::NotInUse,
            queue_limit_hits: 0,
        })
    }

    fn with(r: Reading, f: impl FnOnce(&mut PuppetSample)) -> Reading {
        match r {
            Reading::Puppet(mut s) => {
                f(&mut s);
                Reading::Puppet(s)
            }
            other => other,
        }
    }

    /// A tracker fed `readings` one second apart from `t0`; the time of the last.
    fn fed(p: &Params, t0: Instant, readings: &[Reading]) -> (Tracker, Instant) {
        let mut t = Tracker::default();
        let mut at = t0;
        for (i, r) in readings.iter().enumerate() {
            at = t0 + S * i as u32;
            t.observe(r.clone(), at, p);
        }
        (t, at)
    }

    fn score(t: &Tracker, now: Instant, p: &Params) -> f64 {
        t.verdict(now, p).score.unwrap_or(f64::NAN)
    }

    #[test]
    fn capacity_counts_free_jrubies_against_the_queue_and_the_pool() {
        let (p, t0) = (params(), Instant::now());
        let idle1 = score(&fed(&p, t0, &[pool(1, 1, 0)]).0, t0, &p);
        let idle3 = score(&fed(&p, t0, &[pool(3, 3, 0)]).0, t0, &p);
        let busy3 = score(&fed(&p, t0, &[pool(3, 0, 2)]).0, t0, &p);
        assert_eq!((idle1, idle3), (1.0, 3.0), "an idle pool scores its size");
        assert_eq!(
            busy3,
            3.0 * 1.0 / 6.0,
            "(free + 1) / (total + queued + 1), times the pool"
        );
        let flat = Params {
            by_pool_size: false,
            ..p
        };
        assert_eq!(score(&fed(&flat, t0, &[pool(3, 3, 0)]).0, t0, &flat), 1.0);
        let f = factors(
            &[idle1, idle3].map(|s| Verdict {
                phase: Phase::Active,
                score: Some(s),
                absolute: false,
                pool: None,
            }),
            0.05,
        );
        assert_eq!(
            f,
            vec![0.5, 1.5],
            "relative to the mean: idle 1 and 3 JRubies share 1:3"
        );
    }

    #[test]
    fn with_the_queue_limit_capacity_is_the_requests_taken_before_a_503() {
        let (t0, p) = (
            Instant::now(),
            Params {
                queue_limit: Some(2),
                ..params()
            },
        );
        let take = |r: Reading| score(&fed(&p, t0, &[r]).0, t0, &p);
        assert_eq!(
            (take(pool(1, 1, 0)), take(pool(3, 3, 0))),
            (3.0, 5.0),
            "free JRubies + free queue places"
        );
        assert_eq!(take(pool(1, 0, 1)), 1.0, "one place left in the queue");
        assert_eq!(
            take(pool(1, 0, 2)),
            0.0,
            "full: the next request is refused"
        );
        assert_eq!(
            take(pool(1, 0, 7)),
            0.0,
            "a queue over the limit is full too"
        );
        let v = |s| Verdict {
            phase: Phase::Active,
            score: Some(s),
            absolute: false,
            pool: None,
        };
        let herd = factors(&[v(3.0), v(5.0)], 0.05);
        assert_eq!(
            herd,
            vec![0.75, 1.25],
            "an idle herd goes 3:5 to compilers of 1 and 3 JRubies"
        );
        let flat = Params {
            by_pool_size: false,
            ..p
        };
        assert_eq!(
            score(&fed(&flat, t0, &[pool(3, 3, 0)]).0, t0, &flat),
            1.0,
            "a share of its own room"
        );
    }

    #[test]
    fn smoothing_moves_a_step_in_gradually_and_without_it_at_once() {
        let t0 = Instant::now();
        let p = Params {
            smoothing: 2 * S,
            by_pool_size: false,
            ..params()
        };
        let (t, at) = fed(&p, t0, &[pool(1, 1, 0), pool(1, 0, 2)]);
        let (idle, busy) = (1.0, 1.0 / 4.0);
        let expected = idle + (1.0 - (-0.5f64).exp()) * (busy - idle); // one second of a 2 s EWMA
        assert!(
            (score(&t, at, &p) - expected).abs() < 1e-9,
            "{}",
            score(&t, at, &p)
        );
        let more: Vec<Reading> = std::iter::once(pool(1, 1, 0))
            .chain(std::iter::repeat(pool(1, 0, 2)).take(10))
            .collect();
        let (t, at) = fed(&p, t0, &more);
        assert!(
            (score(&t, at, &p) - busy).abs() < 0.01,
            "it converges: {}",
            score(&t, at, &p)
        );
        let raw = Params {
            smoothing: Duration::ZERO,
            ..p
        };
        let (t, at) = fed(&raw, t0, &[pool(1, 1, 0), pool(1, 0, 2)]);
        assert_eq!(score(&t, at, &raw), busy);
    }

    #[test]
    fn a_new_backend_is_blacked_out_then_counts() {
        let t0 = Instant::now();
        let p = Params {
            blackout: 3 * S,
            ..params()
        };
        assert_eq!(
            Tracker::default().verdict(t0, &p),
            Verdict::none(Phase::Waiting)
        );
        let (t, _) = fed(&p, t0, &[pool(1, 0, 2), pool(1, 0, 2)]);
        assert_eq!(t.verdict(t0 + 2 * S, &p), Verdict::none(Phase::Blackout));
        assert_eq!(
            factors(&[t.verdict(t0 + 2 * S, &p)], 0.05),
            vec![1.0],
            "the configured weight meanwhile"
        );
        assert_eq!(t.verdict(t0 + 3 * S, &p).phase, Phase::Active);
    }

    #[test]
    fn a_blackout_never_hides_a_reason_to_send_less() {
        let t0 = Instant::now();
        let p = Params {
            blackout: 3 * S,
            ..params()
        };
        // A compiler that (re)appears with 1 of its 3 JRubies: a third of its weight.
        let (t, at) = fed(&p, t0, &[filling(3, 1)]);
        let v = t.verdict(at, &p);
        assert_eq!(
            (v.phase, v.score, v.absolute),
            (Phase::Ramping, Some(1.0 / 3.0), true)
        );
        assert!((factors(&[v], 0.05)[0] - 1.0 / 3.0).abs() < 1e-9);
        let locked = with(pool(3, 3, 0), |s| s.lock = PoolLock::Acquired);
        let (t, at) = fed(&p, t0, &[locked]);
        assert_eq!(
            factors(&[t.verdict(at, &p)], 0.05),
            vec![0.05],
            "a locked pool: the floor at once"
        );
    }

    #[test]
    fn samples_expire_back_to_the_configured_weight_and_a_return_is_new_again() {
        let t0 = Instant::now();
        let p = Params {
            blackout: 2 * S,
            ..params()
        };
        let (mut t, at) = fed(&p, t0, &[pool(1, 0, 2), pool(1, 0, 2), pool(1, 0, 2)]);
        t.failed("answered 401".into(), at + S);
        assert_eq!(
            t.verdict(at + 5 * S, &p).phase,
            Phase::Active,
            "the last good sample holds"
        );
        assert_eq!(t.error().map(|(e, _)| e), Some("answered 401"));
        let gone = t.verdict(at + 11 * S, &p);
        assert_eq!(gone, Verdict::none(Phase::Expired));
        assert_eq!(factors(&[gone], 0.05), vec![1.0]);
        assert!(
            !t.saturated(at + 11 * S, &p),
            "an expired sample says nothing"
        );
        t.observe(pool(1, 1, 0), at + 12 * S, &p);
        assert_eq!(
            t.verdict(at + 12 * S, &p).phase,
            Phase::Blackout,
            "back after expiry: a blackout again"
        );
        assert!(t.error().is_none());
    }

    #[test]
    fn the_floor_holds_whatever_the_samples_say() {
        let v = |s: f64| Verdict {
            phase: Phase::Active,
            score: Some(s),
            absolute: false,
            pool: None,
        };
        let f = factors(&[v(0.0), v(3.0), v(3.0)], 0.05);
        assert_eq!(f[0], 0.05, "a compiler at 0 keeps the floor");
        assert!(f.iter().all(|&x| x >= 0.05));
        assert_eq!(
            factors(&[v(0.0), v(0.0)], 0.05),
            vec![0.05, 0.05],
            "all at 0: the floor, alike"
        );
        let agent = Verdict {
            phase: Phase::Stopped,
            score: Some(0.0),
            absolute: true,
            pool: None,
        };
        assert_eq!(factors(&[agent], 0.1), vec![0.1]);
        let crowd: Vec<Verdict> = std::iter::once(v(1000.0))
            .chain(std::iter::repeat(v(0.0)).take(30))
            .collect();
        assert_eq!(
            factors(&crowd, 0.05)[0],
            MAX_FACTOR,
            "one idle giant beside 30 busy: capped"
        );
        let loud = Verdict {
            phase: Phase::Active,
            score: Some(20.0),
            absolute: true,
            pool: None,
        };
        assert_eq!(factors(&[loud], 0.05), vec![MAX_FACTOR]);
        assert!(
            super::super::cell::fixed(0.05) > 0 && super::super::cell::fixed(0.0) > 0,
            "never 0 in fixed point either"
        );
    }

    #[test]
    fn a_locked_pool_is_the_minimum_at_once_and_leaves_the_average_alone() {
        let t0 = Instant::now();
        let p = Params {
            smoothing: 2 * S,
            ..params()
        };
        let locked = with(pool(3, 3, 0), |s| s.lock = PoolLock::Acquired);
        let (t, at) = fed(&p, t0, &[pool(3, 3, 0), locked.clone()]);
        let v = t.verdict(at, &p);
        assert_eq!((v.phase, v.score), (Phase::Locked, Some(0.0)));
        let other = Verdict {
            phase: Phase::Active,
            score: Some(3.0),
            absolute: false,
            pool: None,
        };
        assert_eq!(factors(&[v, other], 0.05)[0], 0.05);
        let requested = with(pool(3, 3, 0), |s| s.lock = PoolLock::Requested);
        let (t, at) = fed(&p, t0, &[pool(3, 3, 0), requested]);
        assert_eq!(t.verdict(at, &p).phase, Phase::Locked);
        let (t, at) = fed(&p, t0, &[pool(3, 3, 0), locked, pool(3, 3, 0)]);
        assert_eq!(
            score(&t, at, &p),
            3.0,
            "released: the average from before the lock"
        );
    }

    /// A pool of `jrubies` of which `ready` exist, all free (a compiler starting).
    fn filling(jrubies: u32, ready: u32) -> Reading {
        with(pool(jrubies, ready, 0), |s| s.borrowed = 0)
    }

    #[test]
    fn a_pool_still_filling_ramps_until_full() {
        let t0 = Instant::now();
        let p = params();
        // Restarted: running with 1 of its 3 JRubies (as measured on 7.9.5).
        let (t, at) = fed(&p, t0, &[pool(3, 3, 0), filling(3, 1)]);
        let v = t.verdict(at, &p);
        assert_eq!(v.phase, Phase::Ramping);
        let capacity = (1.0 + 1.0) / (3.0 + 1.0) * 3.0;
        assert_eq!(
            v.score,
            Some(capacity / 3.0),
            "its capacity, times the third of the pool ready"
        );
        let (t, at) = fed(&p, t0, &[filling(3, 1)]);
        assert_eq!(
            t.verdict(at, &p).phase,
            Phase::Ramping,
            "the first sample already shows the size"
        );
        let (t, at) = fed(&p, t0, &[filling(3, 1), filling(3, 2), pool(3, 3, 0)]);
        assert_eq!(t.verdict(at, &p).phase, Phase::Active);
        assert_eq!(score(&t, at, &p), 3.0);
        let busy = pool(3, 0, 1); // every JRuby borrowed: ready, not filling
        assert_eq!(fed(&p, t0, &[busy]).0.verdict(t0, &p).phase, Phase::Active);
        let (t, at) = fed(&p, t0, &[pool(3, 3, 0), pool(1, 1, 0)]); // a smaller pool than before
        assert_eq!(t.verdict(at, &p).phase, Phase::Ramping);
        let target = Params {
            jrubies: Some(4),
            ..p
        };
        let (t, at) = fed(&target, t0, &[pool(2, 2, 0)]);
        assert_eq!(
            t.verdict(at, &target).phase,
            Phase::Ramping,
            "below the configured target"
        );
        assert_eq!(t.expected_pool(&target), 4);
    }

    #[test]
    fn a_pool_that_stays_smaller_is_its_new_size() {
        let t0 = Instant::now();
        let p = Params {
            expiry: 2 * RAMP_GIVE_UP,
            ..params()
        };
        let mut t = Tracker::default();
        t.observe(pool(4, 4, 0), t0, &p);
        t.observe(pool(2, 2, 0), t0 + S, &p);
        t.observe(pool(2, 2, 0), t0 + S + RAMP_GIVE_UP / 2, &p);
        assert_eq!(
            t.verdict(t0 + S + RAMP_GIVE_UP / 2, &p).phase,
            Phase::Ramping
        );
        t.observe(pool(2, 2, 0), t0 + S + RAMP_GIVE_UP, &p);
        assert_eq!(
            t.expected_pool(&p),
            2,
            "max-active-instances was lowered: no ramp for ever"
        );
        assert_eq!(t.verdict(t0 + S + RAMP_GIVE_UP, &p).phase, Phase::Active);
    }

    #[test]
    fn saturated_means_no_free_jruby_and_a_full_queue_or_new_503s() {
        let t0 = Instant::now();
        let p = Params {
            queue_limit: Some(2),
            ..params()
        };
        let (t, at) = fed(&p, t0, &[pool(1, 0, 2)]);
        assert!(t.saturated(at, &p), "0 free, queue at queue_limit");
        let (t, at) = fed(&p, t0, &[pool(1, 0, 1)]);
        assert!(!t.saturated(at, &p), "queue below its limit");
        let (t, at) = fed(&p, t0, &[pool(3, 1, 2)]);
        assert!(!t.saturated(at, &p), "a free JRuby");
        let unknown = Params {
            queue_limit: None,
            ..p
        };
        let (t, at) = fed(&unknown, t0, &[pool(1, 0, 2)]);
        assert!(
            !t.saturated(at, &unknown),
            "the limit unknown: only new 503s tell"
        );
        let hits = |n| with(pool(1, 0, 1), |s| s.queue_limit_hits = n);
        let (t, at) = fed(&unknown, t0, &[hits(5), hits(7)]);
        assert!(
            t.saturated(at, &unknown) && t.refused_since_last(),
            "503s since the last sample"
        );
        let (t, at) = fed(&unknown, t0, &[hits(5), hits(7), hits(7)]);
        assert!(!t.saturated(at, &unknown), "none since");
        let (t, at) = fed(&unknown, t0, &[hits(7), hits(0)]);
        assert!(
            !t.saturated(at, &unknown),
            "a restarted compiler counts from 0"
        );
        let (t, at) = fed(&p, t0, &[pool(1, 0, 2)]);
        assert!(!t.saturated(at + 11 * S, &p), "not from an expired sample");
    }

    #[test]
    fn an_agent_sets_its_share_holds_its_words_and_stops_at_the_floor() {
        let t0 = Instant::now();
        let p = Params {
            queue_limit: None,
            by_pool_size: false,
            ..params()
        };
        let said = |s: &str| Reading::Agent(super::super::agent::parse(s.as_bytes()).unwrap());
        let (t, at) = fed(&p, t0, &[said("up 50%\n")]);
        let v = t.verdict(at, &p);
        assert_eq!(
            (v.phase, v.score, v.absolute),
            (Phase::Active, Some(0.5), true)
        );
        let other = Verdict {
            phase: Phase::Active,
            score: Some(3.0),
            absolute: false,
            pool: None,
        };
        assert_eq!(
            factors(&[v, other], 0.05),
            vec![0.5, 1.0],
            "a percentage is not relative to the others"
        );
        let (t, at) = fed(&p, t0, &[said("up 50% maxconn:7"), said("drain")]);
        assert_eq!(t.verdict(at, &p).phase, Phase::Stopped);
        assert_eq!(factors(&[t.verdict(at, &p)], 0.05), vec![0.05]);
        assert_eq!(
            t.max_connections(at, &p),
            Some(7),
            "maxconn holds until the agent changes it"
        );
        let (t, at) = fed(&p, t0, &[said("up 50%"), said("drain"), said("ready")]);
        assert_eq!(score(&t, at, &p), 0.5, "ready: the last percentage again");
        assert!(!t.saturated(at, &p), "an agent says nothing of a queue");
        assert_eq!(
            t.max_connections(at + 11 * S, &p),
            None,
            "an expired answer sets no limit"
        );
    }

    #[test]
    fn implausible_samples_are_named() {
        let p = params();
        let s = |jrubies, free| PuppetSample {
            jrubies,
            free,
            queued: 0,
            borrowed: 0,
            lock: PoolLock::NotInUse,
            queue_limit_hits: 0,
        };
        assert_eq!(implausible(&s(3, 3), &p), None);
        assert!(implausible(&s(3, u32::MAX), &p).is_some_and(|w| w.contains("num-free-jrubies")));
        assert!(implausible(&s(u32::MAX, u32::MAX), &p).is_some());
        assert_eq!(implausible(&s(MAX_PLAUSIBLE_JRUBIES, 0), &p), None);
        let target = Params {
            jrubies: Some(4),
            ..p
        };
        assert_eq!(implausible(&s(4, 4), &target), None);
        assert!(implausible(&s(64, 64), &target).is_some_and(|w| w.contains("feedback.jrubies 4")));
    }

    #[test]
    fn one_compiler_claiming_a_large_pool_does_not_push_the_others_to_the_floor() {
        let v = |score: f64, pool: u32| Verdict {
            phase: Phase::Active,
            score: Some(score),
            absolute: false,
            pool: Some(pool),
        };
        // With queue_limit 2: an idle liar of 64 scores 66, idle honest ones of 3, 5.
        let f = factors(&[v(66.0, 64), v(5.0, 3), v(5.0, 3)], 0.05);
        let liar = 66.0 * 12.0 / 64.0;
        let mean = (liar + 10.0) / 3.0;
        assert!((f[0] - liar / mean).abs() < 1e-9, "{f:?}");
        assert!(
            f[1] > 0.6 && f[1] == f[2],
            "the honest keep most of their weight: {f:?}"
        );
        let real = factors(&[v(3.0, 1), v(5.0, 3)], 0.05);
        assert_eq!(real, vec![0.75, 1.25], "1 and 3 JRubies: within the cap");
        let two = factors(&[v(66.0, 64), v(5.0, 3)], 0.05);
        assert!(
            two[1] > 0.3,
            "two compilers: the other's pool is the median: {two:?}"
        );
    }

    #[test]
    fn a_saturated_compiler_is_at_the_floor_whatever_the_others_say() {
        let t0 = Instant::now();
        let p = Params {
            queue_limit: Some(4),
            smoothing: 10 * S,
            ..params()
        };
        // Idle, then saturated: its average decays towards 0 but is not 0 yet.
        let (t, at) = fed(&p, t0, &[pool(3, 3, 0), pool(3, 0, 4)]);
        assert!(t.saturated(at, &p));
        let saturated = t.verdict(at, &p);
        let locked = fed(
            &p,
            t0,
            &[with(pool(3, 3, 0), |s| s.lock = PoolLock::Acquired)],
        )
        .0;
        let locked = locked.verdict(t0, &p);
        for others in [
            vec![locked],
            vec![locked, locked],
            vec![Verdict::none(Phase::Expired), locked],
        ] {
            let all: Vec<Verdict> = std::iter::once(saturated).chain(others).collect();
            assert_eq!(factors(&all, 0.05)[0], 0.05, "{all:?}");
        }
        let blackout = Params {
            blackout: 60 * S,
            ..p
        };
        let (t, at) = fed(&blackout, t0, &[pool(3, 0, 4)]);
        assert_eq!(
            factors(&[t.verdict(at, &blackout)], 0.05),
            vec![0.05],
            "in its blackout too"
        );
    }

    #[test]
    fn one_absurd_pool_size_does_not_hold_a_compiler_ramping() {
        let t0 = Instant::now();
        let p = params();
        let (t, at) = fed(&p, t0, &[pool(3, 3, 0), pool(64, 64, 0), pool(3, 3, 0)]);
        assert_eq!(
            t.verdict(at, &p).phase,
            Phase::Active,
            "one sample of 64 is not its size"
        );
        assert_eq!(t.expected_pool(&p), 3);
        let (t, at) = fed(
            &p,
            t0,
            &[pool(3, 3, 0), pool(4, 4, 0), pool(4, 4, 0), pool(3, 3, 0)],
        );
        assert_eq!(
            t.verdict(at, &p).phase,
            Phase::Ramping,
            "two samples of 4 are"
        );
    }
}
