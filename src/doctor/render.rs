//! The doctor's report as an aligned table with its findings, or as JSON.
use std::fmt::Write as _;

use super::inspect::TicketKey;
use super::{BackendReport, Report, Severity};

const HEADER: [&str; 10] = [
    "SERVICE",
    "BACKEND",
    "ADDRESS",
    "TLS",
    "SUBJECT",
    "SANS",
    "ISSUER",
    "EXPIRES",
    "STICKINESS",
    "STATUS",
];

/// One row per backend, then the findings and the verdict.
pub fn table(r: &Report) -> String {
    let mut rows = vec![HEADER.iter().map(|h| h.to_string()).collect::<Vec<_>>()];
    rows.extend(r.backends.iter().map(row));
    let mut out = crate::admin_client::columns(&rows);
    out.push_str("\nrelay:\n");
    for s in &r.relays {
        // ok: writing to a String cannot fail
        let _ = writeln!(out, "  {}: {} ({})", s.service, s.plan.relay, s.plan.why);
    }
    if !r.findings.is_empty() {
        out.push_str("\nfindings:\n");
    }
    for f in &r.findings {
        let place = match &f.backend {
            Some(b) => format!("{}/{b}", f.service),
            None => f.service.clone(),
        };
        // ok: writing to a String cannot fail
        let _ = writeln!(out, "  {:<8} {place}: {}", severity(f.severity), f.message);
    }
    let _ = writeln!(
        out,
        "\n{}: {} error(s), {} warning(s): exit {}",
        r.config, r.errors, r.warnings, r.exit_code
    );
    out
}

/// The whole report, pretty-printed.
pub fn json(r: &Report) -> String {
    serde_json::to_string_pretty(r).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

fn severity(s: Severity) -> &'static str {
    match s {
        Severity::Info => "info",
        Severity::Warning => "WARNING",
        Severity::Error => "ERROR",
    }
}

fn row(b: &BackendReport) -> Vec<String> {
    let seen = &b.inspection;
    let name = if b.backup {
        format!("{} (backup)", b.backend)
    } else {
        b.backend.clone()
    };
    let tls = match (&seen.unreachable, &seen.tls_error) {
        (Some(_), _) => "unreachable".to_string(),
        (None, Some(_)) => "failed".to_string(),
        (None, None) => seen.tls_versions.join(","),
    };
    let (subject, sans, issuer, expires) = match seen.chain.first() {
        Some(c) => (
            c.subject.clone(),
            c.sans
                .iter()
                .map(|s| s.strip_prefix("DNS:").unwrap_or(s))
                .collect::<Vec<_>>()
                .join(","),
            c.issuer.clone(),
            format!("{} ({}d)", c.not_after, c.days_left),
        ),
        None => dashes(),
    };
    let status = seen
        .status
        .as_ref()
        .map_or("-".to_string(), |s| s.answer.clone());
    vec![
        b.service.clone(),
        name,
        seen.address.clone(),
        tls,
        subject,
        sans,
        issuer,
        expires,
        stickiness(b),
        status,
    ]
}

fn dashes() -> (String, String, String, String) {
    let d = || "-".to_string();
    (d(), d(), d(), d())
}

/// Ticket key name and session-ID resumption, in a few words.
fn stickiness(b: &BackendReport) -> String {
    let seen = &b.inspection;
    let mut parts = Vec::new();
    match &seen.ticket_key {
        TicketKey::Found { length } => parts.push(format!("ticket key name {length}B")),
        TicketKey::NotFound => parts.push("no key name: server-confirmed".into()),
        TicketKey::NotProbed { .. } => {}
    }
    match seen.session_id_resumption {
        Some(true) => parts.push("session IDs resumed".into()),
        Some(false) => parts.push("session IDs not resumed".into()),
        None => {}
    }
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join("; ")
    }
}
