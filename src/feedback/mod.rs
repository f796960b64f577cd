//! Load feedback: each backend's weight scaled by what it says of its load (a
//! Puppet compiler's free JRubies and queue, or an HAProxy agent's answer). A
//! weight, never a choice, and never a state: see docs/puppet.md.
//!
//! Per service with `feedback:`, one poller per backend ([`Poller`]: one request
//! in flight, bounded in time and size) sends what it got to one owner task
//! (`server/feedback.rs`), which alone updates the backends' trackers and
//! publishes their factors ([`weight`], a pure function), so the factors of a
//! service are computed from one consistent view. Trackers live in the backends'
//! live state ([`crate::balance::Backend::feedback`]) and so survive a reload.
//!
//! - [`weight`]: samples -> factor (smoothing, blackout, expiry, floor, lock, ramp);
//!   `sample`: what a backend said; [`cell`]: where the balancer reads the result.
//! - [`puppet`]: the jruby-metrics document; [`agent`]: the agent-check answer.
//! - `client`: the pollers; `error`: why a poll failed and the fix. Their metric
//!   families are [`crate::metrics`]'s, fed plain values.
pub mod agent;
pub mod cell;
mod client;
mod error;
pub mod puppet;
mod sample;
pub mod weight;

use std::time::{Duration, Instant};

use crate::config::{FeedbackConfig, FeedbackSource};

use cell::FeedbackCell;
pub use client::{Poller, MAX_DOCUMENT};
pub use error::FeedbackError;
use weight::{Params, Phase, Reading};

/// The weight function's settings from a service's `feedback:`.
pub fn params(cfg: &FeedbackConfig) -> Params {
    let (jrubies, queue_limit, by_pool_size) = match &cfg.source {
        FeedbackSource::Puppet(p) => (p.jrubies, p.queue_limit, p.by_pool_size),
        FeedbackSource::Agent(_) => (None, None, false),
    };
    Params {
        floor: f64::from(cfg.floor_percent) / 100.0,
        blackout: cfg.blackout,
        expiry: cfg.expiry,
        smoothing: cfg.smoothing,
        jrubies,
        queue_limit,
        by_pool_size,
    }
}

/// A backend's feedback as the views show it.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// Where it stands.
    pub phase: Phase,
    /// The factor in effect (1: the weight as set).
    pub factor: f64,
    /// It refuses work now (puppet).
    pub saturated: bool,
    /// The last good answer, and how long ago.
    pub last: Option<(Reading, Duration)>,
    /// The pool it should reach (puppet): target or largest seen.
    pub expected_jrubies: u32,
    /// The failure of the last poll, and for how long polls fail.
    pub error: Option<(String, Duration)>,
    /// 503s since the sample before (puppet).
    pub refused_since_last: bool,
    /// The connection limit its agent set.
    pub max_connections: Option<u32>,
}

/// What a backend with feedback `cfg` shows now, from its cell (`Backend::feedback`).
pub fn snapshot(published: &FeedbackCell, cfg: &FeedbackConfig) -> Snapshot {
    let p = params(cfg);
    let now = Instant::now();
    let t = published.tracker();
    Snapshot {
        phase: t.verdict(now, &p).phase,
        factor: f64::from(published.factor()) / f64::from(cell::FACTOR_ONE),
        saturated: published.saturated(),
        last: t.last().cloned().zip(t.last_ok_age(now)),
        expected_jrubies: t.expected_pool(&p),
        error: t
            .error()
            .map(|(e, since)| (e.to_string(), now.saturating_duration_since(since))),
        refused_since_last: t.refused_since_last(),
        max_connections: published.max_connections(),
    }
}
