//! `crossbar status`: what the status page shows, as text. The process and its
//! last reload; per service its listeners (and which read PROXY headers), stick
//! table, DNS discovery, handshakes and queue, the active backend of `balance:
//! first` and the no-backend banner; per backend a state table (state, health,
//! weight, last check) and a traffic table (peak, total, bytes, errors,
//! handshakes) with their totals; the operator's next steps; then the busiest
//! sources of each listener with `per_source` limits.
use std::fmt::Write as _;
use std::time::SystemTime;

use crate::admin::human::{columns, human_bytes, human_secs, row};
use crate::admin::page::{check_none, hit_ratio, listeners};
use crate::admin::view::time::seconds_between;
use crate::admin::view::{
    BackendView, Balance, DiscoveryView, Origin, ProcessView, ServiceView, ServicesView,
    SourcesView,
};

/// The whole status: `v` and `sources` of the same moment, `flags` appended to the
/// commands it suggests, `now` for the ages of discovery's times.
pub fn render(v: &ServicesView, sources: &SourcesView, flags: &str, now: SystemTime) -> String {
    let mut out = process_lines(&v.crossbar);
    for svc in &v.services {
        out.push('\n');
        out.push_str(&service(svc, flags, now));
    }
    if !sources.listeners.is_empty() {
        let _ = writeln!(
            out,
            "\nper-source limits and the busiest sources (`crossbar sources` lists more):"
        ); // ok: writing to a String
        out.push_str(&super::traffic::sources(sources));
    }
    out
}

/// The process line and the last reload's result (and why it failed, or what it
/// warned about), as the status page's header shows them.
fn process_lines(p: &ProcessView) -> String {
    let mut out = format!(
        "crossbar {}, up {} (since {}); config {}\n",
        p.version,
        human_secs(p.uptime_seconds),
        humantime::format_rfc3339_seconds(p.started_at),
        p.config,
    );
    let _ = match &p.last_reload {
        None => writeln!(out, "last reload: none since start"),
        Some(r) if r.ok => writeln!(out, "last reload: OK {} ago", human_secs(r.seconds_ago)),
        Some(r) => writeln!(
            out,
            "last reload: FAILED {} ago, running configuration kept: {}",
            human_secs(r.seconds_ago),
            one_line(r.error.as_deref().unwrap_or("-"))
        ),
    }; // ok: writing to a String
    for w in p.last_reload.iter().flat_map(|r| &r.warnings) {
        let _ = writeln!(out, "  warning: {w}"); // ok: writing to a String
    }
    for k in p.last_reload.iter().flat_map(|r| &r.kept) {
        let _ = writeln!(out, "  kept (operator): {k}"); // ok: writing to a String
    }
    for r in p.last_reload.iter().flat_map(|r| &r.reset) {
        let _ = writeln!(out, "  reset to the file's: {r}"); // ok: writing to a String
    }
    out
}

/// A message of several lines on one.
fn one_line(s: &str) -> String {
    s.replace('\n', "; ")
}

/// One service: its caption lines, its two backend tables, its next steps.
fn service(svc: &ServiceView, flags: &str, now: SystemTime) -> String {
    let mut out = caption(svc, now);
    let mut state = state_rows(svc);
    let mut traffic = traffic_rows(svc);
    let t = svc.totals();
    state.push(row(&[
        "Total",
        "-",
        &format!("{}/{} up", t.up, t.backends),
        &t.active_connections.to_string(),
        &t.weight.to_string(),
    ]));
    traffic.push(vec![
        "Total".into(),
        "-".into(),
        t.connections_total.to_string(),
        human_bytes(t.bytes.client_to_server),
        human_bytes(t.bytes.server_to_client),
        t.connect_errors.to_string(),
        t.check_failures.to_string(),
        t.handshakes.resumed.to_string(),
        t.handshakes.full.to_string(),
    ]);
    for table in [state, traffic] {
        for line in columns(&table).lines() {
            let _ = writeln!(out, "  {line}"); // ok: writing to a String
        }
    }
    if let Some(f) = &svc.feedback {
        let _ = writeln!(
            out,
            "  load feedback ({} every {}, floor {}%):",
            f.kind_str(),
            f.interval_text(),
            f.floor_percent
        ); // ok: writing to a String
        for b in &svc.backends {
            if let Some(fb) = &b.feedback {
                let _ = writeln!(out, "    {} {}", b.name, fb.summary()); // ok: writing to a String
            }
        }
    }
    for b in &svc.backends {
        if let Some(step) = b.next_step(&svc.name) {
            let _ = writeln!(
                out,
                "  next: crossbar backend {}{flags}  # {}",
                step.command, step.why
            ); // ok: writing to a String
        }
    }
    out
}

/// The lines above a service's tables: name, mode, balance, listeners and stick
/// table; PROXY listeners; lookups, handshakes and queue; discovery; the active
/// backend of `balance: first`; the no-backend banner.
fn caption(svc: &ServiceView, now: SystemTime) -> String {
    let mut out = format!(
        "{} ({}, {}) on {}",
        svc.name,
        svc.mode.as_str(),
        svc.balance.as_str(),
        listeners(&svc.listeners),
    );
    let _ = match &svc.stick_table {
        Some(t) => writeln!(
            out,
            "; stick table {}/{}",
            t.counts.entries, t.counts.capacity
        ),
        None => writeln!(out, "; no stick table"),
    }; // ok: writing to a String
    for p in &svc.proxy_protocol {
        let _ = writeln!(out, "  listener {}", p.text); // ok: writing to a String
    }
    let mut line = String::new();
    if let Some(t) = &svc.stick_table {
        let _ = write!(
            line,
            "stick lookups: {} ({} hits / {} misses); ",
            hit_ratio(t.hit_ratio),
            t.lookups.hit,
            t.lookups.miss
        ); // ok: writing to a String
    }
    let _ = writeln!(
        out,
        "  {line}handshakes {} resumed / {} full; {}",
        svc.handshakes.resumed,
        svc.handshakes.full,
        svc.queue_text()
    ); // ok: writing to a String
    if let Some(d) = &svc.discovery {
        let _ = writeln!(out, "  {}", discovery_line(d, now)); // ok: writing to a String
    }
    if svc.balance == Balance::First {
        let _ = match &svc.active_backend {
            Some(a) => writeln!(
                out,
                "  active: {a} (balance: first sends new connections there)"
            ),
            None => writeln!(out, "  active: none"),
        }; // ok: writing to a String
    }
    if svc.none_available() {
        out.push_str(&banner(svc));
    }
    out
}

/// The red line of the page, for a service with no backend for new connections.
fn banner(svc: &ServiceView) -> String {
    let mut out =
        "  NO BACKEND AVAILABLE: new connections are refused (refused:no_backend).".to_string();
    if svc.backends.is_empty() {
        out.push_str(" The service has no backends.");
    }
    let why: Vec<String> = svc
        .backends
        .iter()
        .map(|b| format!("{} {}", b.name, b.why_unavailable()))
        .collect();
    if !why.is_empty() {
        let _ = write!(out, " {}", why.join("; ")); // ok: writing to a String
    }
    out.push('\n');
    out
}

/// The state table: what the operator acts on.
fn state_rows(svc: &ServiceView) -> Vec<Vec<String>> {
    let mut rows = vec![row(&[
        "BACKEND",
        "ADDRESS",
        "STATE",
        "ACTIVE/LIMIT",
        "WEIGHT",
        "BACKUP",
        "FROM",
        "HEALTH",
        "FOR",
        "LAST CHECK",
    ])];
    for b in &svc.backends {
        let state = match (svc.is_active(b), b.state_note()) {
            (true, _) => format!("{} (active)", b.state),
            (false, Some(note)) => format!("{} ({note})", b.state),
            (false, None) => b.state.to_string(),
        };
        rows.push(vec![
            b.name.clone(),
            b.address.clone(),
            state,
            b.connections_text(),
            weight_cell(b),
            if b.backup { "yes" } else { "no" }.to_string(),
            match b.dns_name {
                Some(_) => "dns",
                None => "config",
            }
            .to_string(),
            b.health().to_string(),
            human_secs(b.state_seconds),
            last_check(b),
        ]);
    }
    rows
}

/// The traffic table: counters since the backend was first configured.
fn traffic_rows(svc: &ServiceView) -> Vec<Vec<String>> {
    let mut rows = vec![row(&[
        "BACKEND",
        "PEAK",
        "TOTAL",
        "IN",
        "OUT",
        "CONNECT ERRORS",
        "CHECK FAILURES",
        "RESUMED",
        "FULL",
    ])];
    for b in &svc.backends {
        rows.push(vec![
            b.name.clone(),
            b.peak_connections.to_string(),
            b.connections_total.to_string(),
            human_bytes(b.bytes.client_to_server),
            human_bytes(b.bytes.server_to_client),
            b.connect_errors.to_string(),
            b.check_failures.to_string(),
            b.handshakes.resumed.to_string(),
            b.handshakes.full.to_string(),
        ]);
    }
    rows
}

/// The weight, and the slow-start ramp under way (`3 (ramp 40%, 12s left)`) or
/// the file's weight when one was set at run time (`10 (file 20)`); with load
/// feedback the weight balanced by, who set the weight and the factor:
/// `0.35 (file 1 x0.35 feedback)`, `1.24 (operator 4 x0.31 feedback; dns 2)` (the weight
/// under the operator's: the file's, or the SRV record's for a backend from DNS).
fn weight_cell(b: &BackendView) -> String {
    if let (Origin::Feedback, Some(f)) = (b.effective_origin, &b.feedback) {
        let file = match b.weight_set_at_run_time() {
            true => format!("; {} {}", b.weight_source(), b.configured_weight),
            false => String::new(),
        };
        let ramp = match &b.slow_start {
            Some(r) => format!("; {}", r.text()),
            None => String::new(),
        };
        return format!(
            "{:.2} ({} {} x{:.2} feedback{file}{ramp})",
            b.effective_weight,
            b.weight_origin.as_str(),
            b.weight,
            f.factor
        );
    }
    if let Some(r) = &b.slow_start {
        return format!("{} ({})", b.weight, r.text());
    }
    match b.weight_note() {
        Some(note) => format!("{} ({note})", b.weight),
        None => b.weight.to_string(),
    }
}

/// The last check as the page's cell says it: `tls-hello OK 3s ago`, `tcp FAIL 1s
/// ago: connection refused`, `not run yet`.
fn last_check(b: &BackendView) -> String {
    match &b.last_check {
        None => check_none(b.check).to_string(),
        Some(c) => {
            let age = human_secs(c.seconds_ago);
            match &c.error {
                None => format!("{} OK {age} ago", b.check),
                Some(e) => format!("{} FAIL {age} ago: {}", b.check, one_line(e)),
            }
        }
    }
}

/// A service's backends from DNS: `backends from DNS: srv _x8140._tcp.example, 3
/// backends, resolved 12s ago, next lookup 30s after the last`, then `; STALE:
/// ...` while lookups fail.
fn discovery_line(d: &DiscoveryView, now: SystemTime) -> String {
    let ago = |t: Option<SystemTime>| match t {
        Some(t) => format!("{}s ago", seconds_between(t, now)),
        None => "never".to_string(),
    };
    let mut line = format!(
        "backends from DNS: {} {}, {}",
        d.kind,
        d.name,
        d.set_text(&ago(d.last_resolved))
    );
    if d.dropped > 0 {
        let _ = write!(line, " ({} more records left out: max_backends)", d.dropped);
        // ok: String
    }
    if let Some(ms) = d.next_in_ms {
        let _ = write!(line, ", next lookup {}s after the last", ms.div_ceil(1000));
        // ok: String
    }
    if !d.own.is_empty() {
        let _ = write!(
            line,
            "; {} record(s) naming crossbar itself left out: {}",
            d.own.len(),
            d.own.join("; ")
        ); // ok: String
    }
    if d.stale {
        let _ = write!(
            line,
            "; STALE: the last lookup ({}) failed ({}): {}",
            ago(d.last_attempt),
            d.error.as_deref().unwrap_or("-"),
            d.meanwhile()
        ); // ok: String
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::page::{render as page, PageData};
    use crate::admin::view::fixture::{self, at};
    use crate::admin::view::CheckResult;

    /// The lines of `text` from the one starting with `head` to the next blank one.
    fn block<'a>(text: &'a str, head: &str) -> &'a str {
        let start = text
            .find(head)
            .unwrap_or_else(|| panic!("no {head:?} in\n{text}"));
        let rest = &text[start..];
        &rest[..rest.find("\n\n").unwrap_or(rest.len())]
    }

    /// The lines of `text` about backend `name`: the CLI's two table rows, the
    /// page's one (`<td>name`).
    /// The status page and `crossbar status` of one document.
    fn page_and_status(v: &ServicesView, s: &SourcesView) -> (String, String) {
        let data = PageData {
            services: v,
            sources: &s.listeners,
        };
        (page(data, 0, ""), render(v, s, "", at(120)))
    }

    fn rows(text: &str, name: &str) -> String {
        text.lines()
            .filter(|l| {
                l.trim_start().starts_with(&format!("{name} "))
                    || l.contains(&format!("><td>{name}"))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// `want` in both (letter case aside: the page writes states in capitals).
    fn in_both(page: &str, cli: &str, what: &str, want: &str) {
        let want = want.to_lowercase();
        assert!(
            page.to_lowercase().contains(&want),
            "page lacks {what} {want:?}:\n{page}"
        );
        assert!(
            cli.to_lowercase().contains(&want),
            "status lacks {what} {want:?}:\n{cli}"
        );
    }

    /// Everything the status page shows of a document with every optional part
    /// present is in `crossbar status` too: the header, each service's caption, each
    /// backend's row (field by field), the totals and the per-source tables.
    #[test]
    fn every_field_the_page_shows_is_in_the_status() {
        let (v, s) = (fixture::everything(), fixture::sources());
        let (html, cli) = page_and_status(&v, &s);
        let p = &v.crossbar;
        let r = p.last_reload.as_ref().unwrap();
        for (what, want) in [
            ("version", p.version.clone()),
            ("uptime", human_secs(p.uptime_seconds)),
            (
                "start",
                humantime::format_rfc3339_seconds(p.started_at).to_string(),
            ),
            ("config", p.config.clone()),
            ("reload", "OK".to_string()),
            ("reload's age", format!("{} ago", human_secs(r.seconds_ago))),
            ("reload warning", r.warnings[0].clone()),
        ] {
            in_both(&html, &cli, what, &want);
        }
        for svc in &v.services {
            caption_fields(&html, &cli, svc);
            for b in &svc.backends {
                backend_fields(&rows(&html, &b.name), &rows(&cli, &b.name), b);
                if let Some(step) = b.next_step(&svc.name) {
                    in_both(
                        &html,
                        &cli,
                        "hint",
                        &format!("crossbar backend {}", step.command),
                    );
                }
            }
            let t = svc.totals();
            let (page_total, cli_total) = (
                block(&html, &format!("data-service=\"{}\"", svc.name)),
                block(&cli, &format!("{} (", svc.name)),
            );
            for want in [
                format!("{}/{} up", t.up, t.backends),
                t.weight.to_string(),
                t.connections_total.to_string(),
                human_bytes(t.bytes.client_to_server),
                human_bytes(t.bytes.server_to_client),
                t.check_failures.to_string(),
                t.handshakes.resumed.to_string(),
            ] {
                in_both(page_total, cli_total, "total", &want);
            }
        }
        sources_fields(&html, &cli, &s);
    }

    /// A compiler ramping after recovery while load feedback scales its weight:
    /// the status and the page say both, the factor and the ramp.
    #[test]
    fn a_slow_start_ramp_shows_beside_the_feedback_factor() {
        let (mut v, s) = (fixture::everything(), fixture::sources());
        let b = v.services[0]
            .backends
            .iter_mut()
            .find(|b| b.feedback.is_some())
            .expect("a fixture backend with load feedback");
        b.slow_start = Some(crate::admin::view::RampView {
            percent: 40,
            seconds_left: 12,
            seconds_total: 20,
        });
        let b = b.clone();
        assert_eq!(
            weight_cell(&b),
            "1.24 (operator 4 x0.31 feedback; dns 2; ramp 40%, 12s left)"
        );
        let (html, cli) = page_and_status(&v, &s);
        backend_fields(&rows(&html, &b.name), &rows(&cli, &b.name), &b);
    }

    /// The per-source tables: each listener's limits and each source's row.
    fn sources_fields(html: &str, cli: &str, s: &SourcesView) {
        for l in &s.listeners {
            let lim = &l.limits;
            for want in [
                l.listener.clone(),
                format!("{}", l.tracked),
                format!("{}", lim.table_size),
                format!("{}", lim.max_connections.unwrap()),
                format!("{}", lim.rate.unwrap()),
                format!("{}", lim.burst),
            ] {
                in_both(html, cli, "per-source limits", &want);
            }
            for src in &l.sources {
                let row = |text: &str| rows(text, &src.source);
                for want in [
                    src.open.to_string(),
                    crate::admin::page::tokens(src.tokens),
                    src.admitted.to_string(),
                    src.refused.to_string(),
                ] {
                    in_both(&row(html), &row(cli), "source", &want);
                }
            }
        }
    }

    /// A service's caption: what the page writes above its table.
    fn caption_fields(html: &str, cli: &str, svc: &ServiceView) {
        let page = block(html, &format!("data-service=\"{}\"", svc.name));
        let page = &page[..page.find("</caption>").unwrap()];
        let cli = block(cli, &format!("{} (", svc.name));
        let mut want = vec![
            svc.name.clone(),
            svc.mode.as_str().into(),
            svc.balance.as_str().into(),
            listeners(&svc.listeners),
            format!(
                "{} resumed / {} full",
                svc.handshakes.resumed, svc.handshakes.full
            ),
            format!("{}/{}", svc.queued, svc.queue_size),
        ];
        want.extend(svc.proxy_protocol.iter().map(|p| p.text.clone()));
        if let Some(t) = &svc.stick_table {
            want.push(format!("{}/{}", t.counts.entries, t.counts.capacity));
            want.push(hit_ratio(t.hit_ratio));
            want.push(format!(
                "{} hits / {} misses",
                t.lookups.hit, t.lookups.miss
            ));
        }
        if let Some(d) = &svc.discovery {
            want.extend([d.kind.clone(), d.name.clone(), d.error.clone().unwrap()]);
            want.push(format!("{} backend", d.backends));
            want.push(d.dropped.to_string());
            want.push("STALE".into());
        }
        if let Some(a) = &svc.active_backend {
            want.push(format!("active: {a}"));
        }
        if let Some(f) = &svc.feedback {
            want.push(format!("every {}", f.interval_text()));
            want.extend(
                svc.backends
                    .iter()
                    .filter_map(|b| b.feedback.as_ref())
                    .map(|f| f.summary()),
            );
        }
        if svc.none_available() {
            want.push("NO BACKEND AVAILABLE".into());
            want.extend(svc.backends.iter().map(|b| b.why_unavailable()));
        }
        for w in want {
            in_both(page, cli, &format!("{}'s caption", svc.name), &w);
        }
    }

    /// A backend's row on the page, field by field, in its rows of the status.
    fn backend_fields(page: &str, cli: &str, b: &BackendView) {
        let mut want = vec![
            b.address.clone(),
            b.state.to_string(),
            human_secs(b.state_seconds),
            b.weight.to_string(),
            b.active_connections.to_string(),
            b.peak_connections.to_string(),
            b.connections_total.to_string(),
            human_bytes(b.bytes.client_to_server),
            human_bytes(b.bytes.server_to_client),
            b.connect_errors.to_string(),
            b.check_failures.to_string(),
            b.handshakes.resumed.to_string(),
            b.handshakes.full.to_string(),
        ];
        if let Some(r) = &b.slow_start {
            want.push(r.text());
        } else if b.weight_set_at_run_time() {
            want.push(format!("{} {}", b.weight_source(), b.configured_weight));
        }
        if let (Origin::Feedback, Some(f)) = (b.effective_origin, &b.feedback) {
            want.push(format!("{:.2}", b.effective_weight));
            want.push(format!("x{:.2} feedback", f.factor));
        }
        if b.state.hides_health() {
            want.push(b.health().into());
        }
        if b.dns_name.is_some() {
            want.push("dns".into());
        }
        if b.backup {
            // The page's Bck column says Y, the status's BACKUP column yes.
            assert!(
                page.contains("<td>Y</td>") && cli.contains(" yes "),
                "{page}\n{cli}"
            );
        }
        match &b.last_check {
            None => want.push(check_none(b.check).into()),
            Some(c) => {
                let result = match c.result {
                    CheckResult::Ok => "OK",
                    CheckResult::Fail => "FAIL",
                };
                want.push(format!("{} {result}", b.check));
                want.push(format!("{} ago", human_secs(c.seconds_ago)));
                want.extend(c.error.clone());
            }
        }
        for w in want {
            in_both(page, cli, &format!("backend {}", b.name), &w);
        }
    }

    #[test]
    fn discovery_says_where_the_backends_come_from_and_when_it_went_stale() {
        let fresh = DiscoveryView {
            kind: "srv".into(),
            name: "_x8140._tcp.example".into(),
            last_resolved: Some(at(990)),
            last_attempt: Some(at(990)),
            stale: false,
            error: None,
            backends: 3,
            dropped: 2,
            next_in_ms: Some(30_000),
            serving: 3,
            ..DiscoveryView::default()
        };
        assert_eq!(
            discovery_line(&fresh, at(1000)),
            "backends from DNS: srv _x8140._tcp.example, 3 backends, resolved 10s ago (2 more \
             records left out: max_backends), next lookup 30s after the last"
        );
        let stale = DiscoveryView {
            kind: "host".into(),
            name: "pool.example".into(),
            last_resolved: Some(at(900)),
            last_attempt: Some(at(995)),
            stale: true,
            error: Some("timed out".into()),
            backends: 1,
            dropped: 0,
            next_in_ms: Some(5_000),
            serving: 1,
            ..DiscoveryView::default()
        };
        assert_eq!(
            discovery_line(&stale, at(1000)),
            "backends from DNS: host pool.example, 1 backend, resolved 100s ago, next lookup \
             5s after the last; STALE: the last lookup (5s ago) failed (timed out): the last \
             good set serves on"
        );
    }
}

#[cfg(test)]
mod documented {
    use super::*;

    /// The text of the first fenced block after `after` in docs/admin-api.md.
    fn block_after(doc: &str, after: &str) -> String {
        let at = doc.find(after).unwrap_or_else(|| panic!("no {after:?}"));
        let rest = &doc[at + after.len()..];
        let start = rest.find("```").expect("a fenced block");
        let body = &rest[start..];
        let body = &body[body.find('\n').expect("fence line") + 1..];
        body[..body.find("```").expect("its end")].to_string()
    }

    /// docs/admin-api.md's `/api/services` example reads into the view, and the
    /// `crossbar status` output it shows is what the CLI prints for it.
    #[test]
    fn the_documented_example_is_what_status_prints() {
        let doc = include_str!("../../docs/admin-api.md");
        let json = block_after(doc, "### `GET /api/services`");
        let v: ServicesView = serde_json::from_str(&json).expect("the example is the view");
        let shown = block_after(doc, "crossbar status\n```\n");
        let printed = render(&v, &SourcesView::default(), "", SystemTime::now());
        assert_eq!(
            shown, printed,
            "docs/admin-api.md shows:\n{shown}\nstatus prints:\n{printed}"
        );
    }
}
