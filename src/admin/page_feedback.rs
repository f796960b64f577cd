//! The status page's load feedback: the line in a service's caption (each
//! backend's factor and last sample) and the weight cell of a backend whose
//! weight load feedback scales.
use std::fmt::{self, Write};

use super::human::Esc;
use super::view::{BackendView, FeedbackKind, Origin, ServiceView};

/// A service's load feedback, if it has any: what is polled, then each backend's factor and last sample;
/// a failing poll (the weight falls back to the configured one) or a saturated
/// compiler in warning colour, never in the colour of health.
pub(super) fn write_caption(o: &mut String, svc: &ServiceView) -> fmt::Result {
    let Some(f) = &svc.feedback else {
        return Ok(());
    };
    let kind = match f.kind {
        FeedbackKind::Puppet => "JRuby metrics",
        FeedbackKind::Agent => "agent-check",
    };
    write!(
        o,
        "<div class=\"fb\">load feedback ({kind} every {}):",
        f.interval_text()
    )?;
    for b in &svc.backends {
        let Some(fb) = &b.feedback else { continue };
        let class = match fb.error.is_some() || fb.saturated {
            true => "warn",
            false => "ok",
        };
        write!(
            o,
            " <span class=\"{class}\">{} {}</span>;",
            Esc(&b.name),
            Esc(&fb.summary())
        )?;
    }
    o.push_str("</div>");
    Ok(())
}

/// The weight cell when load feedback scales the weight: the weight balanced by,
/// the factor, the file's weight when the operator set another, the slow-start
/// ramp under way; `None` otherwise.
pub(super) fn write_weight(o: &mut String, b: &BackendView) -> Option<fmt::Result> {
    let (Origin::Feedback, Some(f)) = (b.effective_origin, &b.feedback) else {
        return None;
    };
    let file = match b.weight_set_at_run_time() {
        true => format!(
            "<span class=\"hl\">{} {}</span>",
            b.weight_source(),
            b.configured_weight
        ),
        false => String::new(),
    };
    let ramp = match &b.slow_start {
        Some(r) => format!("<span class=\"hl\">{}</span>", r.text()),
        None => String::new(),
    };
    Some(write!(
        o,
        "<td class=\"rtw\" title=\"weight {} ({}) x{:.2} from load feedback: {}\">\
             {:.2}<span class=\"hl\">x{:.2} feedback</span>{file}{ramp}</td>",
        b.weight,
        b.weight_origin.as_str(),
        f.factor,
        Esc(&f.sample_text()),
        b.effective_weight,
        f.factor,
    ))
}
