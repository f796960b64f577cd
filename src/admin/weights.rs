//! A backend's weights as the views show them: what load feedback made of the
//! weight and the last sample behind that (`GET /api/services`); who set the
//! weight is `api::origins`'s to say.
use std::time::Duration;

use super::view;
use crate::balance::{Backend, Weight};
use crate::config::{FeedbackConfig, FeedbackSource};
use crate::feedback::cell::FACTOR_ONE;
use crate::feedback::weight::Reading;
use crate::feedback::{self, Snapshot};

/// The weight new connections are balanced by (`weight`, the pool's
/// [`Weight`] of `b`: the very number the scheduler picks with), whether load feedback decides it
/// now (scales the weight), and the feedback behind it: the fields of
/// [`view::BackendView`] that say so. Who set the weight otherwise is
/// `api::origins`'s to say.
pub(super) fn effective(
    b: &Backend,
    weight: Weight,
    cfg: Option<&FeedbackConfig>,
) -> (f64, bool, Option<view::FeedbackView>) {
    let weight = (weight.as_f64() * 100.0).round() / 100.0;
    let Some(cfg) = cfg else {
        return (weight, false, None);
    };
    let snap = feedback::snapshot(b.feedback(), cfg);
    let v = feedback_view(&snap, cfg);
    let scaled = v.phase.applies() && b.feedback().factor() != FACTOR_ONE;
    (weight, scaled, Some(v))
}

fn feedback_view(s: &Snapshot, cfg: &FeedbackConfig) -> view::FeedbackView {
    let puppet = matches!(cfg.source, FeedbackSource::Puppet(_));
    view::FeedbackView {
        phase: s.phase,
        factor: (s.factor * 1000.0).round() / 1000.0,
        saturated: s.saturated,
        sample: s.last.as_ref().map(|(r, _)| sample(r)),
        sample_age_ms: s.last.as_ref().map(|(_, age)| age.as_millis() as u64),
        refused_since_last: s.refused_since_last,
        expected_jrubies: (puppet && s.expected_jrubies > 0).then_some(s.expected_jrubies),
        max_connections: s.max_connections,
        error: s.error.as_ref().map(|(e, _)| e.clone()),
        failing_seconds: s.error.as_ref().map(|(_, d)| Duration::as_secs(d)),
    }
}

fn sample(r: &Reading) -> view::FeedbackSample {
    match r {
        Reading::Puppet(s) => view::FeedbackSample::Puppet {
            jrubies: s.jrubies,
            free: s.free,
            queued: s.queued,
            borrowed: s.borrowed,
            lock: s.lock.as_str().to_string(),
            queue_limit_hits: s.queue_limit_hits,
        },
        Reading::Agent(a) => view::FeedbackSample::Agent { words: a.words() },
    }
}

/// A service's `feedback:` as the views show it.
pub(super) fn settings(cfg: &FeedbackConfig) -> view::FeedbackSettings {
    view::FeedbackSettings {
        kind: match cfg.source {
            FeedbackSource::Puppet(_) => view::FeedbackKind::Puppet,
            FeedbackSource::Agent(_) => view::FeedbackKind::Agent,
        },
        interval_ms: cfg.interval.as_millis() as u64,
        floor_percent: cfg.floor_percent,
        saturated_sticky: cfg.saturated_sticky,
    }
}
