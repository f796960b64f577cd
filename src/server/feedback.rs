//! A service's load feedback at run time: one poller task per backend and their
//! owner, which alone updates the backends' trackers and publishes their factors
//! (the model and the polls are [`crate::feedback`]'s).
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::balance::Backend;
use crate::config::FeedbackConfig;
use crate::feedback::cell::fixed;
use crate::feedback::weight::{self, Params, Phase, Reading};
use crate::feedback::{params, FeedbackError, Poller};
use crate::metrics::{FeedbackPublished, JrubyCounts};
use crate::service::Service;

/// Polls start `interval` ± this fraction apart, so many backends are not asked in step.
const JITTER: f64 = 0.1;

/// Start the feedback of `svc` (its pollers and their owner; they end when
/// `svc.tasks` is cancelled); without `feedback:` every backend's factor returns to 1.
pub(super) fn spawn(svc: &Arc<Service>) {
    let Some(cfg) = svc.config.feedback.clone() else {
        for b in &svc.pool.backends {
            b.feedback().reset();
            b.metrics.feedback.forget();
        }
        return;
    };
    let (tx, rx) = mpsc::channel(svc.pool.backends.len().max(1) * 2);
    for (i, b) in svc.pool.backends.iter().enumerate() {
        let poller = Poller::new(&svc.config, &b.config, &cfg);
        let stop = svc.tasks.clone();
        tokio::spawn(poll_loop(poller, i, cfg.interval, tx.clone(), stop));
    }
    tokio::spawn(own(svc.clone(), cfg, rx, svc.tasks.clone()));
}

/// What a poller sends its owner: the backend's position and the poll's outcome.
type Outcome = (usize, Result<Reading, FeedbackError>, Instant);

async fn poll_loop(
    mut poller: Poller,
    index: usize,
    interval: Duration,
    tx: mpsc::Sender<Outcome>,
    stop: CancellationToken,
) {
    loop {
        let started = tokio::time::Instant::now();
        let result = tokio::select! {
            () = stop.cancelled() => return,
            r = poller.poll() => r,
        };
        if tx.send((index, result, Instant::now())).await.is_err() {
            return; // the owner is gone: the service was replaced
        }
        let next = started + interval.mul_f64(1.0 - JITTER + 2.0 * JITTER * fastrand::f64());
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep_until(next) => {}
        }
    }
}

/// The owner: every outcome into its backend's tracker, then every factor of the
/// service published; also every `interval` without outcomes, so blackouts end
/// and old samples expire on time.
async fn own(
    svc: Arc<Service>,
    cfg: FeedbackConfig,
    mut rx: mpsc::Receiver<Outcome>,
    stop: CancellationToken,
) {
    let p = params(&cfg);
    let mut phases: Vec<Option<Phase>> = vec![None; svc.pool.backends.len()];
    let mut tick = tokio::time::interval(cfg.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            got = rx.recv() => match got {
                Some(outcome) => observe(&svc, &cfg, &p, outcome),
                None => return,
            },
            _ = tick.tick() => {}
        }
        publish(&svc, &p, &mut phases, Instant::now());
    }
}

/// One poll's outcome into its backend's tracker; a failure is logged when it
/// starts or changes, a recovery once.
fn observe(svc: &Service, cfg: &FeedbackConfig, p: &Params, (i, result, at): Outcome) {
    let Some(b) = svc.pool.backends.get(i) else {
        return;
    };
    let result = result.and_then(|r| match &r {
        Reading::Puppet(s) => {
            weight::implausible(s, p).map_or(Ok(r), |why| Err(FeedbackError::Implausible(why)))
        }
        Reading::Agent(_) => Ok(r),
    });
    b.metrics
        .feedback
        .poll(result.as_ref().err().map(FeedbackError::reason));
    let mut t = b.feedback().tracker();
    match result {
        Ok(reading) => {
            if let Some((why, since)) = t.error() {
                let after = at.saturating_duration_since(since);
                tracing::info!(service = %svc.name(), backend = %b.name, "load feedback answers again after {after:.1?} ({why})");
            }
            t.observe(reading, at, p);
        }
        Err(e) => {
            let why = e.to_string();
            if t.error().map(|(w, _)| w) != Some(why.as_str()) {
                tracing::warn!(
                    service = %svc.name(), backend = %b.name, kind = cfg.kind(),
                    "load feedback failed: {why}; the weight falls back to the configured one \
                     {:?} after the last good sample; fix: {}", cfg.expiry, e.fix(cfg)
                );
            }
            t.failed(why, at);
        }
    }
}

/// Compute and publish every backend's factor from one view of the trackers.
fn publish(svc: &Service, p: &Params, phases: &mut [Option<Phase>], now: Instant) {
    let backends = &svc.pool.backends;
    let verdicts: Vec<_> = backends
        .iter()
        .map(|b| b.feedback().tracker().verdict(now, p))
        .collect();
    let factors = weight::factors(&verdicts, p.floor);
    for (i, b) in backends.iter().enumerate() {
        let t = b.feedback().tracker();
        let (saturated, maxconn) = (t.saturated(now, p), t.max_connections(now, p));
        b.feedback().publish(fixed(factors[i]), saturated, maxconn);
        b.metrics.feedback.publish(&FeedbackPublished {
            factor: factors[i],
            effective_weight: svc.pool.weight_of(b).as_f64(),
            phase: verdicts[i].phase.as_str(),
            saturated,
            jrubies: match t.last() {
                Some(Reading::Puppet(s)) => Some(JrubyCounts {
                    jrubies: s.jrubies,
                    free: s.free,
                    queued: s.queued,
                }),
                _ => None,
            },
        });
        drop(t);
        let phase = verdicts[i].phase;
        if phases[i].is_some_and(|was| was != phase) {
            log_phase(svc, b, phase, factors[i]);
        }
        phases[i] = Some(phase);
    }
}

fn log_phase(svc: &Service, b: &Backend, phase: Phase, factor: f64) {
    let (name, backend) = (svc.name(), &*b.name);
    match phase {
        Phase::Expired => {
            tracing::warn!(service = %name, backend = %backend, "load feedback expired: no good sample for feedback.expiry; back to the configured weight")
        }
        Phase::Locked => {
            tracing::info!(service = %name, backend = %backend, "JRuby pool locked (code deploy): minimum weight while it lasts")
        }
        Phase::Stopped => {
            tracing::info!(service = %name, backend = %backend, "its agent asked for no new connections: minimum weight")
        }
        other => {
            tracing::info!(service = %name, backend = %backend, factor, "load feedback {}", other.as_str())
        }
    }
}
