//! The doctor's report as an aligned table with its findings, or as JSON.
//!
//! The default table fits a 120-column terminal: one short cell per fact and the
//! findings wrapped; a name is never cut (an operator copies it into `crossbar
//! backend`): when a row would not fit, each backend is listed as `key value`
//! lines instead (psql's `\x auto`). `--wide` adds the subject, names, issuer,
//! stickiness and status columns in full. Each load feedback poll's result is
//! listed under `feedback:`.
use std::fmt::Write as _;

use super::inspect::TicketKey;
use super::{BackendReport, Report, Severity};

/// Width the default table and the findings are laid out for.
const WIDTH: usize = 120;

const NARROW: [&str; 7] = [
    "SERVICE", "BACKEND", "ADDRESS", "TLS", "CERT", "EXPIRES", "CHECK",
];
const WIDE: [&str; 12] = [
    "SERVICE",
    "BACKEND",
    "ADDRESS",
    "SNI",
    "TLS",
    "SUBJECT",
    "SANS",
    "ISSUER",
    "EXPIRES",
    "CHECK",
    "STICKINESS",
    "STATUS",
];

/// One row per backend, then the relays, the findings and the verdict.
pub fn table(r: &Report) -> String {
    let header: &[&str] = if r.wide { &WIDE } else { &NARROW };
    let mut rows = vec![header.iter().map(|h| h.to_string()).collect::<Vec<_>>()];
    for b in &r.backends {
        rows.push(if r.wide { wide_row(b) } else { narrow_row(b) });
    }
    let mut out = crate::admin::human::columns(&rows);
    if !r.wide && out.lines().any(|l| l.chars().count() > WIDTH) {
        out = expanded(header, &rows[1..]);
    }
    out.push_str("\nrelay:\n");
    for s in &r.relays {
        // ok: writing to a String cannot fail
        let _ = writeln!(out, "  {}: {}", s.service, s.plan.describe());
    }
    let polled: Vec<&BackendReport> = r
        .backends
        .iter()
        .filter(|b| b.inspection.feedback.is_some())
        .collect();
    if !polled.is_empty() {
        out.push_str("\nfeedback:\n");
    }
    for b in polled {
        out.push_str(&wrap(
            &format!("{}/{}: {}", b.service, b.backend, feedback(b)),
            "  ",
            "    ",
        ));
    }
    if !r.findings.is_empty() {
        out.push_str("\nfindings:\n");
    }
    for f in &r.findings {
        let place = match &f.backend {
            Some(b) => format!("{}/{b}", f.service),
            None => f.service.clone(),
        };
        let text = format!("{:<8} {place}: {}", severity(f.severity), f.message);
        out.push_str(&wrap(&text, "  ", &" ".repeat(11)));
    }
    // ok: writing to a String cannot fail
    let _ = writeln!(
        out,
        "\n{}: {} error(s), {} warning(s): exit {}",
        r.config, r.errors, r.warnings, r.exit_code
    );
    if !r.wide {
        out.push_str("(--wide: names, issuer, stickiness and status columns)\n");
    }
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

/// `text` broken at spaces into lines of at most [`WIDTH`] columns: the first
/// starts with `first`, the rest with `rest`.
fn wrap(text: &str, first: &str, rest: &str) -> String {
    let mut out = String::new();
    let mut line = first.to_string();
    let mut empty = true;
    for word in text.split(' ') {
        let fits = line.chars().count() + 1 + word.chars().count() <= WIDTH;
        if !empty && !fits {
            out.push_str(line.trim_end());
            out.push('\n');
            line = rest.to_string();
            empty = true;
        }
        if !empty {
            line.push(' ');
        }
        line.push_str(word);
        empty = false;
    }
    out.push_str(line.trim_end());
    out.push('\n');
    out
}

/// Each row as a block of `key value` lines under its `SERVICE/BACKEND`: the
/// default table's layout when a row is wider than [`WIDTH`].
fn expanded(header: &[&str], rows: &[Vec<String>]) -> String {
    let key_width = header.iter().map(|h| h.len()).max().unwrap_or(0);
    let mut out = String::new();
    for row in rows {
        let (service, backend) = (&row[0], &row[1]);
        // ok: writing to a String cannot fail
        let _ = writeln!(out, "{service}/{backend}");
        for (h, cell) in header.iter().zip(row).skip(2) {
            let key = h.to_lowercase();
            let _ = writeln!(out, "  {key:<key_width$}  {cell}"); // ok: as above
        }
    }
    out
}

/// One load feedback poll's result: the sample in words, or why it failed.
fn feedback(b: &BackendReport) -> String {
    let Some(f) = &b.inspection.feedback else {
        return "-".into();
    };
    match (&f.answer, &f.reason) {
        (Some(answer), _) if f.ok => format!("{}: {answer}", f.kind),
        (_, Some(reason)) => format!("{}: FAILS: {reason}", f.kind),
        _ => format!("{}: FAILS", f.kind),
    }
}

fn backend_name(b: &BackendReport) -> String {
    if b.backup {
        format!("{} (backup)", b.backend)
    } else {
        b.backend.clone()
    }
}

fn tls(b: &BackendReport) -> String {
    let seen = &b.inspection;
    match (&seen.unreachable, &seen.tls_error) {
        (Some(_), _) => "unreachable".to_string(),
        (None, Some(_)) => "failed".to_string(),
        (None, None) => seen.tls_versions.join(","),
    }
}

/// The check's verdict in a word or two (the reason is in the findings).
fn check(b: &BackendReport) -> String {
    let c = &b.inspection.check;
    let kind = c.check.split(' ').next().unwrap_or("");
    match (c.passed, c.slow_ms) {
        (false, _) => format!("{kind}: FAILS"),
        (true, Some(_)) => format!("{kind}: slow"),
        (true, None) => format!("{kind}: ok"),
    }
}

/// `CN=x` of a distinguished name (the whole name when it has no CN).
fn common_name(dn: &str) -> &str {
    dn.split(", ")
        .find_map(|p| p.strip_prefix("CN="))
        .unwrap_or(dn)
}

fn narrow_row(b: &BackendReport) -> Vec<String> {
    let seen = &b.inspection;
    let (cert, expires) = match seen.chain.first() {
        Some(c) => (
            common_name(&c.subject).to_string(),
            format!("{} ({}d)", c.not_after, c.days_left),
        ),
        None => ("-".into(), "-".into()),
    };
    vec![
        b.service.clone(),
        backend_name(b),
        seen.address.clone(),
        tls(b),
        cert,
        expires,
        check(b),
    ]
}

fn wide_row(b: &BackendReport) -> Vec<String> {
    let seen = &b.inspection;
    let d = || "-".to_string();
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
        None => (d(), d(), d(), d()),
    };
    let status = seen.status.as_ref().map_or_else(d, |s| {
        if s.ok {
            s.answer.clone()
        } else {
            "failed".into()
        }
    });
    vec![
        b.service.clone(),
        backend_name(b),
        seen.address.clone(),
        seen.server_name.clone(),
        tls(b),
        subject,
        sans,
        issuer,
        expires,
        check(b),
        stickiness(b),
        status,
    ]
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn findings_wrap_at_the_width_with_a_hanging_indent() {
        let long = "word ".repeat(60);
        let out = wrap(long.trim_end(), "  ", "     ");
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines.len() > 1);
        assert!(lines.iter().all(|l| l.chars().count() <= WIDTH), "{out}");
        assert!(lines[1].starts_with("     word"), "{out}");
        assert_eq!(out.split_whitespace().count(), 60);
    }

    #[test]
    fn common_names_are_taken() {
        assert_eq!(common_name("CN=c1, O=Example"), "c1");
        assert_eq!(common_name("O=Example"), "O=Example");
    }
}
