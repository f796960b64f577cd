//! The `crossbar_backend_feedback_*` metric families (docs/metrics.md). Label sets
//! exist only for backends of services with `feedback:`, created by their poller.
use std::time::SystemTime;

use prometheus::{GaugeVec, IntCounterVec, IntGaugeVec, Opts, Registry};

/// The families, registered once per registry.
#[derive(Clone)]
pub struct FeedbackMetrics {
    factor: GaugeVec,
    effective_weight: GaugeVec,
    phase: IntGaugeVec,
    polls: IntCounterVec,
    jrubies: IntGaugeVec,
    free: IntGaugeVec,
    queued: IntGaugeVec,
    saturated: IntGaugeVec,
    last_sample: GaugeVec,
    sticky_replaced: IntCounterVec,
}

impl std::fmt::Debug for FeedbackMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FeedbackMetrics")
    }
}

const BACKEND: [&str; 2] = ["service", "backend"];

/// `phase` values of `crossbar_backend_feedback_phase` (`feedback::weight::Phase::as_str`).
pub const FEEDBACK_PHASES: [&str; 7] = [
    "waiting", "blackout", "active", "ramping", "locked", "stopped", "expired",
];
/// `result` values of `crossbar_backend_feedback_polls_total`: `ok`, or the failure's
/// reason (`FeedbackError::reason`).
pub const FEEDBACK_POLL_RESULTS: [&str; 10] = [
    "ok",
    "setup",
    "connect",
    "tls",
    "timeout",
    "http",
    "refused",
    "status",
    "too_large",
    "bad_answer",
];

fn register<C: prometheus::core::Collector + Clone + 'static>(r: &Registry, c: C) -> C {
    r.register(Box::new(c.clone())).expect("unique metric name"); // ok: static
    c
}

fn gauge(r: &Registry, name: &str, help: &str) -> GaugeVec {
    let v = GaugeVec::new(Opts::new(name, help), &BACKEND).expect("static metric definition"); // ok: static
    register(r, v)
}

fn int_gauge(r: &Registry, name: &str, help: &str) -> IntGaugeVec {
    let v = IntGaugeVec::new(Opts::new(name, help), &BACKEND).expect("static metric definition"); // ok: static
    register(r, v)
}

impl FeedbackMetrics {
    /// Register the families in `r`.
    pub fn register(r: &Registry) -> FeedbackMetrics {
        let phase = IntGaugeVec::new(
            Opts::new(
                "crossbar_backend_feedback_phase",
                "1 for where a backend's load feedback stands (waiting, blackout, active, \
                 ramping, locked, stopped, expired).",
            ),
            &["service", "backend", "phase"],
        )
        .expect("static metric definition"); // ok: static
        let polls = IntCounterVec::new(
            Opts::new(
                "crossbar_backend_feedback_polls_total",
                "Feedback polls by result (ok, setup, connect, tls, timeout, http, refused, \
                 status, too_large, bad_answer).",
            ),
            &["service", "backend", "result"],
        )
        .expect("static metric definition"); // ok: static
        let sticky = IntCounterVec::new(
            Opts::new(
                "crossbar_backend_feedback_sticky_replaced_total",
                "Resumptions stuck to this backend placed like new sessions because its last \
                 sample showed it saturated (feedback.saturated_sticky).",
            ),
            &BACKEND,
        )
        .expect("static metric definition"); // ok: static
        FeedbackMetrics {
            factor: gauge(
                r,
                "crossbar_backend_feedback_factor",
                "The factor load feedback multiplies the backend's weight by (1: the weight as set).",
            ),
            effective_weight: gauge(
                r,
                "crossbar_backend_feedback_effective_weight",
                "The weight new connections are balanced by: crossbar_backend_weight times the factor.",
            ),
            phase: register(r, phase),
            polls: register(r, polls),
            jrubies: int_gauge(r, "crossbar_backend_feedback_jrubies", "num-jrubies of the last sample."),
            free: int_gauge(r, "crossbar_backend_feedback_free_jrubies", "num-free-jrubies of the last sample."),
            queued: int_gauge(
                r,
                "crossbar_backend_feedback_queued",
                "Requests waiting for a JRuby in the last sample (requested-instances).",
            ),
            saturated: int_gauge(
                r,
                "crossbar_backend_feedback_saturated",
                "1 while the last sample shows no free JRuby and a full queue, or 503s since the one before.",
            ),
            last_sample: gauge(
                r,
                "crossbar_backend_feedback_last_sample_timestamp_seconds",
                "When the backend last answered a feedback poll (Unix time).",
            ),
            sticky_replaced: register(r, sticky),
        }
    }

    /// The handles of one backend (label sets appear when first written).
    pub fn backend(&self, service: &str, backend: &str) -> BackendFeedbackMetrics {
        BackendFeedbackMetrics {
            all: self.clone(),
            service: service.to_string(),
            backend: backend.to_string(),
        }
    }

    /// Remove a backend's label sets (it left the configuration, or feedback is off).
    pub fn forget(&self, service: &str, backend: &str) {
        let l = [service, backend];
        for v in [&self.factor, &self.effective_weight, &self.last_sample] {
            let _ = v.remove_label_values(&l); // ok: absent labels are fine
        }
        for v in [&self.jrubies, &self.free, &self.queued, &self.saturated] {
            let _ = v.remove_label_values(&l); // ok: absent labels are fine
        }
        let _ = self.sticky_replaced.remove_label_values(&l); // ok: absent labels are fine
        for p in FEEDBACK_PHASES {
            let _ = self.phase.remove_label_values(&[service, backend, p]); // ok
        }
        for r in FEEDBACK_POLL_RESULTS {
            let _ = self.polls.remove_label_values(&[service, backend, r]); // ok
        }
    }
}

/// What the poller publishes after each update.
#[derive(Debug, Clone, Copy)]
pub struct FeedbackPublished<'a> {
    /// The factor.
    pub factor: f64,
    /// The weight new connections are balanced by with that factor
    /// (`balance::Weight`: the weight x the factor x a slow-start ramp).
    pub effective_weight: f64,
    /// Where the backend's feedback stands: one of [`FEEDBACK_PHASES`].
    pub phase: &'a str,
    /// It refuses work now.
    pub saturated: bool,
    /// The JRuby pool of the last good answer, when it came from Puppet.
    pub jrubies: Option<JrubyCounts>,
}

/// A Puppet compiler's JRuby pool as its last good answer gave it.
#[derive(Debug, Clone, Copy)]
pub struct JrubyCounts {
    /// num-jrubies.
    pub jrubies: u32,
    /// num-free-jrubies.
    pub free: u32,
    /// Requests waiting for a JRuby (requested-instances).
    pub queued: u32,
}

/// One backend's handles.
#[derive(Clone)]
pub struct BackendFeedbackMetrics {
    all: FeedbackMetrics,
    service: String,
    backend: String,
}

impl std::fmt::Debug for BackendFeedbackMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BackendFeedbackMetrics")
    }
}

impl BackendFeedbackMetrics {
    fn labels(&self) -> [&str; 2] {
        [self.service.as_str(), self.backend.as_str()]
    }

    /// Count one poll: `failure` is `None` when it succeeded, else its reason (one
    /// of [`FEEDBACK_POLL_RESULTS`]).
    pub fn poll(&self, failure: Option<&str>) {
        let label = failure.unwrap_or("ok");
        self.all
            .polls
            .with_label_values(&[self.service.as_str(), self.backend.as_str(), label])
            .inc();
        if failure.is_none() {
            let now = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            self.all
                .last_sample
                .with_label_values(&self.labels())
                .set(now);
        }
    }

    /// Remove this backend's label sets (feedback turned off).
    pub fn forget(&self) {
        self.all.forget(&self.service, &self.backend);
    }

    /// A resumption stuck here was placed like a new session.
    pub fn sticky_replaced(&self) {
        self.all
            .sticky_replaced
            .with_label_values(&self.labels())
            .inc();
    }

    /// Set the gauges to what was just published.
    pub fn publish(&self, p: &FeedbackPublished<'_>) {
        let l = self.labels();
        self.all.factor.with_label_values(&l).set(p.factor);
        self.all
            .effective_weight
            .with_label_values(&l)
            .set(p.effective_weight);
        self.all
            .saturated
            .with_label_values(&l)
            .set(i64::from(p.saturated));
        self.all.sticky_replaced.with_label_values(&l);
        for phase in FEEDBACK_PHASES {
            self.all
                .phase
                .with_label_values(&[self.service.as_str(), self.backend.as_str(), phase])
                .set(i64::from(phase == p.phase));
        }
        if let Some(s) = p.jrubies {
            self.all
                .jrubies
                .with_label_values(&l)
                .set(i64::from(s.jrubies));
            self.all.free.with_label_values(&l).set(i64::from(s.free));
            self.all
                .queued
                .with_label_values(&l)
                .set(i64::from(s.queued));
        }
    }
}
