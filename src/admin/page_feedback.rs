//! The status page's load feedback: the settings in a service's caption, each
//! backend's condition in its row (coloured by meaning), and the weight cell of a
//! backend whose weight load feedback scales.
use std::fmt::{self, Write};

use super::human::Esc;
use super::view::{BackendView, FeedbackCondition, FeedbackKind, Origin, ServiceView};

/// A service's load feedback settings in its caption, if it has any: what is
/// polled and how often (each backend's condition is in its row).
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
        " &middot; load feedback ({kind} every {}, floor {}%)",
        f.interval_text(),
        f.floor_percent
    )
}

/// A backend's load feedback in its state cell: the condition's word on the
/// colour of its meaning (green only when fine: saturated, locked, stopped,
/// settling and failing each have their own), its last sample below, the whole
/// summary as the tooltip. Nothing for a backend without feedback.
pub(super) fn write_condition(o: &mut String, b: &BackendView) -> fmt::Result {
    let Some(f) = &b.feedback else {
        return Ok(());
    };
    let c = f.condition();
    write!(
        o,
        "<span class=\"hl fbk {}\" title=\"load feedback: {}\">feedback {}</span>\
         <span class=\"hl\">{}</span>",
        class(c),
        Esc(&f.summary()),
        c.word(),
        Esc(&f.sample_short()),
    )
}

/// The page's class for a condition's colour (page.css, `.fbk`).
fn class(c: FeedbackCondition) -> &'static str {
    match c {
        FeedbackCondition::Fine => "fine",
        FeedbackCondition::Failing => "failing",
        FeedbackCondition::Saturated => "saturated",
        FeedbackCondition::Locked => "locked",
        FeedbackCondition::Stopped => "stopped",
        FeedbackCondition::Settling(_)
        | FeedbackCondition::Ramping
        | FeedbackCondition::Expired => "settling",
    }
}

/// The weight cell when load feedback scales the weight: the weight balanced by,
/// who set the weight it scales and the factor (`operator 4 x0.31 feedback`, as
/// `crossbar status` says it), the file's weight when the operator set another, the slow-start
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
             {:.2}<span class=\"hl\">{} {}</span><span class=\"hl\">x{:.2} feedback</span>{file}{ramp}</td>",
        b.weight,
        b.weight_origin.as_str(),
        f.factor,
        Esc(&f.sample_text()),
        b.effective_weight,
        b.weight_origin.as_str(),
        b.weight,
        f.factor,
    ))
}
