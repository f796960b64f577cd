//! `GET /`: the status page, one self-contained HTML table per service like
//! HAProxy's stats page, rendered from the same JSON as `GET /api/services`.
//!
//! No script at all: the page reloads itself with `<meta http-equiv="refresh">`
//! (`?refresh=N` seconds, 0 = off) and its only inline style is allowed by hash in
//! the Content-Security-Policy, which allows nothing else. Every string that comes
//! from outside (names, addresses, the config path, error messages) is escaped.
use std::fmt::{self, Write};
use std::sync::LazyLock;

use base64::Engine;
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::{HeaderName, HeaderValue, CACHE_CONTROL, CONTENT_TYPE};
use hyper::{Response, StatusCode};
use serde_json::Value;

use crate::server::Server;

/// The page's stylesheet, inlined in a `<style>` element.
const CSS: &str = include_str!("page.css");
/// Refresh interval without `?refresh=`: fresh enough during an incident, and one
/// small request per open tab.
pub const DEFAULT_REFRESH: u64 = 10;
/// Longest `?refresh=`: an hour; beyond that, turn it off (0).
pub const MAX_REFRESH: u64 = 3600;
/// The intervals offered as links in the header.
const REFRESH_CHOICES: [u64; 5] = [0, 5, 10, 30, 60];
/// The admin address the CLI uses when `--admin` is not given.
const CLI_DEFAULT_ADMIN: &str = "127.0.0.1:9140";

/// `Content-Security-Policy`: nothing may load, only the page's own style runs,
/// no framing, no forms, no base URL changes.
static CSP: LazyLock<String> = LazyLock::new(|| {
    let digest = ring::digest::digest(&ring::digest::SHA256, CSS.as_bytes());
    let hash = base64::engine::general_purpose::STANDARD.encode(digest.as_ref());
    format!(
        "default-src 'none'; style-src 'sha256-{hash}'; base-uri 'none'; \
         form-action 'none'; frame-ancestors 'none'"
    )
});

/// The response to `GET /?refresh=N`.
pub fn response(server: &Server, query: Option<&str>) -> Response<Full<Bytes>> {
    let refresh = match refresh_param(query) {
        Ok(r) => r,
        Err(msg) => return text(StatusCode::BAD_REQUEST, msg),
    };
    let mut data = super::api::services(server);
    data["sources"] = super::api::sources(server, PAGE_SOURCES)["listeners"].take();
    let html = render(&data, refresh, &cli_flags(server));
    let mut r = Response::new(Full::new(Bytes::from(html)));
    let h = r.headers_mut();
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    if let Ok(v) = HeaderValue::from_str(&CSP) {
        h.insert(hyper::header::CONTENT_SECURITY_POLICY, v);
    }
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        hyper::header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        hyper::header::X_FRAME_OPTIONS,
        HeaderValue::from_static("DENY"),
    );
    h.insert(
        hyper::header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(
        HeaderName::from_static("cross-origin-resource-policy"),
        HeaderValue::from_static("same-origin"),
    );
    r
}

fn text(status: StatusCode, msg: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(msg + "\n")));
    *r.status_mut() = status;
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// Parse `refresh=N` (seconds, 0..=3600) out of the query; anything else is refused
/// so that a typo does not silently mean the default.
pub fn refresh_param(query: Option<&str>) -> Result<u64, String> {
    let mut refresh = DEFAULT_REFRESH;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if k != "refresh" {
            return Err(format!("unknown parameter {k:?} (only `refresh`)"));
        }
        refresh = v
            .parse::<u64>()
            .ok()
            .filter(|n| *n <= MAX_REFRESH)
            .ok_or_else(|| format!("refresh must be seconds in 0..={MAX_REFRESH}, got {v:?}"))?;
    }
    Ok(refresh)
}

/// The flags a CLI command needs to reach this admin endpoint with write access.
fn cli_flags(server: &Server) -> String {
    let config = server.config();
    let Some(admin) = &config.admin else {
        return String::new();
    };
    let mut flags = String::new();
    // Port 0 (tests, demos) is not an address a CLI could use: leave it out.
    // A wildcard address is reached on loopback (the endpoint refuses a Host of
    // 0.0.0.0: it is neither the address connected to nor loopback).
    let url = crate::config::admin_url(admin.listen);
    if admin.listen.port() != 0 && url != format!("http://{CLI_DEFAULT_ADMIN}") {
        flags += &format!(" --admin {url}");
    }
    if let Some(t) = &admin.token_file {
        flags += &format!(" --token-file {}", t.display());
    }
    flags
}

/// HTML-escapes a string for text and attribute values.
pub struct Esc<'a>(pub &'a str);

impl fmt::Display for Esc<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut rest = self.0;
        while let Some(i) = rest.find(['&', '<', '>', '"', '\'']) {
            f.write_str(&rest[..i])?;
            f.write_str(match rest.as_bytes()[i] {
                b'&' => "&amp;",
                b'<' => "&lt;",
                b'>' => "&gt;",
                b'"' => "&quot;",
                _ => "&#39;",
            })?;
            rest = &rest[i + 1..];
        }
        f.write_str(rest)
    }
}

/// A string field of a JSON object ("" when absent).
fn s<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or("")
}

/// A number field of a JSON object (0 when absent).
fn n(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or(0)
}

/// Bytes as an operator reads them: `512 B`, `12.3 KiB`, `4.0 GiB`.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if b < 1024 {
        return format!("{b} B");
    }
    let mut v = b as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

/// A duration in two units at most: `42s`, `12m05s`, `3h12m`, `4d03h`.
pub fn human_secs(s: u64) -> String {
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        3600..=86399 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86400, s % 86400 / 3600),
    }
}

/// The whole page for the `/api/services` JSON `data`; `cli` is appended to the
/// CLI commands shown as hints.
pub fn render(data: &Value, refresh: u64, cli: &str) -> String {
    let mut out = String::with_capacity(8 * 1024);
    // Writing to a String cannot fail.
    let _ = write_page(&mut out, data, refresh, cli); // ok: fmt::Write for String is infallible
    out
}

fn write_page(o: &mut String, data: &Value, refresh: u64, cli: &str) -> fmt::Result {
    let p = &data["crossbar"];
    o.push_str("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">");
    if refresh > 0 {
        write!(o, "<meta http-equiv=\"refresh\" content=\"{refresh}\">")?;
    }
    writeln!(
        o,
        "<meta name=\"viewport\" content=\"width=device-width\">\
         <title>crossbar status</title><style>{CSS}</style></head><body>"
    )?;
    write_header(o, p, refresh)?;
    let empty = Vec::new();
    for svc in data["services"].as_array().unwrap_or(&empty) {
        write_service(o, svc, cli)?;
    }
    for l in data["sources"].as_array().unwrap_or(&empty) {
        write_sources(o, l)?;
    }
    write_footer(o)?;
    o.push_str("</body></html>\n");
    Ok(())
}

fn write_header(o: &mut String, p: &Value, refresh: u64) -> fmt::Result {
    write!(
        o,
        "<header><h1>crossbar {}</h1><span>up <b id=\"uptime\">{}</b> (since {})</span>\
         <span>config <b id=\"config\">{}</b></span><span>last reload: ",
        Esc(s(p, "version")),
        human_secs(n(p, "uptime_seconds")),
        Esc(s(p, "started_at")),
        Esc(s(p, "config")),
    )?;
    let r = &p["last_reload"];
    if r.is_null() {
        o.push_str("<span id=\"reload\">none since start</span>");
    } else if r["ok"].as_bool() == Some(true) {
        write!(
            o,
            "<span id=\"reload\" class=\"ok\">OK, {} ago</span>",
            human_secs(n(r, "seconds_ago"))
        )?;
        let warnings: Vec<&str> = r["warnings"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        if !warnings.is_empty() {
            write!(
                o,
                " <span id=\"reload-warnings\" class=\"warn\">with {} warning(s): {}</span>",
                warnings.len(),
                Esc(&warnings.join("; ")),
            )?;
        }
    } else {
        write!(
            o,
            "<span id=\"reload\" class=\"bad\">FAILED {} ago, running config kept: {}</span>",
            human_secs(n(r, "seconds_ago")),
            Esc(s(r, "error")),
        )?;
    }
    o.push_str("</span><span>refresh:");
    for c in REFRESH_CHOICES {
        let label = if c == 0 {
            "off".into()
        } else {
            format!("{c}s")
        };
        let class = if c == refresh { " class=\"cur\"" } else { "" };
        write!(o, " <a{class} href=\"/?refresh={c}\">{label}</a>")?;
    }
    o.push_str("</span></header>\n");
    Ok(())
}

/// Backend table columns: (heading, tooltip).
const COLUMNS: [(&str, &str); 16] = [
    ("Backend", "name in the config"),
    ("Address", "host:port"),
    ("State", "state and how long it has held"),
    (
        "Wt",
        "weight new connections are balanced by; highlighted when set at run time (crossbar backend weight), with the file's below",
    ),
    ("Bck", "backup: used only when no primary is available"),
    ("Cur", "connections open now"),
    ("Max", "most connections open at once"),
    ("Total", "connections relayed"),
    ("In", "bytes client to server"),
    ("Out", "bytes server to client"),
    (
        "Connect errors",
        "failed connects; red while the backend fails, grey once it passes again",
    ),
    (
        "Check failures",
        "failed health checks; red while the backend fails, grey once it passes again",
    ),
    ("Last check", "result and age of the last active check"),
    ("Resumed", "resumed TLS handshakes"),
    ("Full", "full TLS handshakes"),
    ("Operator hint", "the CLI command for the usual next step"),
];

fn write_service(o: &mut String, svc: &Value, cli: &str) -> fmt::Result {
    let name = s(svc, "name");
    write!(
        o,
        "<table data-service=\"{}\"><caption><b>{}</b> &middot; {} &middot; balance {} &middot; on {}",
        Esc(name),
        Esc(name),
        Esc(s(svc, "mode")),
        Esc(s(svc, "balance")),
        Esc(&join(&svc["listeners"])),
    )?;
    for p in svc["proxy_protocol"].as_array().into_iter().flatten() {
        write!(o, " &middot; {}", Esc(s(p, "text")))?;
    }
    write_stick(o, &svc["stick_table"])?;
    write_discovery(o, &svc["discovery"])?;
    let hs = &svc["handshakes"];
    write!(
        o,
        " &middot; handshakes {} resumed / {} full &middot; queue {}/{}",
        n(hs, "resumed"),
        n(hs, "full"),
        n(svc, "queued"),
        n(svc, "queue_size"),
    )?;
    let empty = Vec::new();
    let backends = svc["backends"].as_array().unwrap_or(&empty);
    let active = svc["active_backend"].as_str();
    if s(svc, "balance") == "first" {
        match active {
            Some(a) => write!(o, " &middot; <span class=\"act\">active: {}</span>", Esc(a))?,
            None => o.push_str(" &middot; active: none"),
        }
    }
    write_banner(o, backends)?;
    o.push_str("</caption>\n<tr>");
    for (h, tip) in COLUMNS {
        write!(o, "<th title=\"{tip}\">{h}</th>")?;
    }
    o.push_str("</tr>\n");
    for b in backends {
        let is_active = active.is_some_and(|a| a == s(b, "name"));
        write_backend(o, name, b, is_active, cli)?;
    }
    write_total(o, backends)?;
    o.push_str("</table>\n");
    Ok(())
}

/// Where DNS-discovered backends come from, when the name last resolved, and a
/// STALE mark while lookups fail (the last good set serves on).
fn write_discovery(o: &mut String, d: &Value) -> fmt::Result {
    if d.is_null() {
        return Ok(());
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |t| t.as_secs());
    let ago = d["last_resolved"]
        .as_u64()
        .map_or("never".to_string(), |t| {
            format!("{} ago", human_secs(now.saturating_sub(t)))
        });
    write!(
        o,
        " &middot; <span class=\"dns\">DNS {} <code>{}</code>: {} backend(s), resolved {ago}",
        Esc(s(d, "kind")),
        Esc(s(d, "name")),
        n(d, "backends"),
    )?;
    if n(d, "dropped") > 0 {
        write!(
            o,
            ", <span class=\"warn\">{} record(s) over max_backends left out</span>",
            n(d, "dropped")
        )?;
    }
    o.push_str("</span>");
    if d["stale"].as_bool() == Some(true) {
        write!(
            o,
            " <span class=\"bad\">STALE: {}; the last good set serves on</span>",
            Esc(s(d, "error")),
        )?;
    }
    Ok(())
}

fn write_stick(o: &mut String, t: &Value) -> fmt::Result {
    if t.is_null() {
        return o.write_str(" &middot; no stick table");
    }
    let ratio = t["hit_ratio"]
        .as_f64()
        .map_or("no lookups yet".to_string(), |r| {
            format!("hit ratio {:.1}%", r * 100.0)
        });
    write!(
        o,
        " &middot; stick table {}/{} entries, {} ({} hits / {} misses)",
        n(t, "entries"),
        n(t, "capacity"),
        ratio,
        n(&t["lookups"], "hit"),
        n(&t["lookups"], "miss"),
    )
}

fn join(list: &Value) -> String {
    let empty = Vec::new();
    let parts: Vec<&str> = list
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .filter_map(Value::as_str)
        .collect();
    if parts.is_empty() {
        "(not bound)".into()
    } else {
        parts.join(", ")
    }
}

/// A red line in the caption of a service that has no backend to give a new
/// connection to, with each backend's reason.
fn write_banner(o: &mut String, backends: &[Value]) -> fmt::Result {
    if backends.iter().any(takes_new) {
        return Ok(());
    }
    o.push_str(
        "<div class=\"none\" role=\"alert\"><strong>NO BACKEND AVAILABLE</strong>: \
         new connections are refused (refused:no_backend).",
    );
    if backends.is_empty() {
        o.push_str(" The service has no backends.");
    }
    for (i, b) in backends.iter().enumerate() {
        let sep = if i == 0 { " " } else { "; " };
        write!(o, "{sep}{} {}", Esc(s(b, "name")), why_unavailable(b))?;
    }
    o.push_str("</div>");
    Ok(())
}

/// Does the backend take new connections from the balancing: available, and not
/// at weight 0 (which leaves it sticky hits only)?
fn takes_new(b: &Value) -> bool {
    b["available"].as_bool() == Some(true) && b["weight"].as_u64() != Some(0)
}

/// Why a backend takes no new connections, for the banner (already escaped).
fn why_unavailable(b: &Value) -> String {
    // The row below has the check's error in full; here, only which check.
    let health = match (failing(b), b["last_check"]["result"] == "fail") {
        (false, _) => "health up".to_string(),
        (true, true) => format!("its {} check fails", Esc(s(b, "check"))),
        (true, false) => "health DOWN".into(),
    };
    match s(b, "state") {
        "down" => format!("DOWN: {health}"),
        "drain" => format!("DRAINED by the operator ({health})"),
        "disabled" => format!("DISABLED by the operator ({health})"),
        "standby" => "in STANDBY: recovered, waiting for manual failback".into(),
        "up" if b["weight"].as_u64() == Some(0) => {
            "at WEIGHT 0 by the operator (sticky clients only)".into()
        }
        other => Esc(other).to_string(),
    }
}

/// Is the backend failing now: marked down, or its last active check failed?
fn failing(b: &Value) -> bool {
    b["healthy"].as_bool() == Some(false) || b["last_check"]["result"] == "fail"
}

fn write_backend(o: &mut String, svc: &str, b: &Value, active: bool, cli: &str) -> fmt::Result {
    let state = s(b, "state");
    let bytes = &b["bytes"];
    let hs = &b["handshakes"];
    let (row_class, tag) = if active {
        (" act", " <span class=\"tag\">active</span>")
    } else {
        ("", "")
    };
    let dns = match b["dns_name"].as_str() {
        Some(from) => format!(
            " <span class=\"tag\" title=\"from DNS: {}\">dns</span>",
            Esc(from)
        ),
        None => String::new(),
    };
    write!(
        o,
        "<tr class=\"{}{row_class}\"><td>{}{tag}{dns}</td><td>{}</td>",
        Esc(state),
        Esc(s(b, "name")),
        Esc(s(b, "address")),
    )?;
    write_state(o, b, state)?;
    let backup = if b["backup"].as_bool() == Some(true) {
        "Y"
    } else {
        "-"
    };
    write_weight(o, b)?;
    write!(
        o,
        "<td>{backup}</td><td>{}</td><td>{}</td>\
         <td>{}</td><td title=\"{}\">{}</td><td title=\"{}\">{}</td>",
        n(b, "active_connections"),
        n(b, "peak_connections"),
        n(b, "connections_total"),
        n(bytes, "client_to_server"),
        human_bytes(n(bytes, "client_to_server")),
        n(bytes, "server_to_client"),
        human_bytes(n(bytes, "server_to_client")),
    )?;
    let now = failing(b);
    write_count(o, n(b, "connect_errors"), now)?;
    write_count(o, n(b, "check_failures"), now)?;
    write_check(o, b)?;
    writeln!(
        o,
        "<td>{}</td><td>{}</td><td>{}</td></tr>",
        n(hs, "resumed"),
        n(hs, "full"),
        hint(svc, b, state, cli),
    )
}

/// The weight cell: the weight, and when it was set at run time, highlighted with
/// the file's below it.
fn write_weight(o: &mut String, b: &Value) -> fmt::Result {
    let (now, file) = (n(b, "weight"), n(b, "configured_weight"));
    if now == file {
        return write!(o, "<td>{now}</td>");
    }
    write!(
        o,
        "<td class=\"rtw\" title=\"file {file}: the config file's weight; {now} set at run time \
         (crossbar backend weight) until the next reload or restart\">\
         {now}<span class=\"hl\">file {file}</span></td>"
    )
}

/// The state cell: state and age; under DRAIN or DISABLED also the health, since
/// operator state and health are two things (DOWN and UP say it already).
fn write_state(o: &mut String, b: &Value, state: &str) -> fmt::Result {
    write!(
        o,
        "<td title=\"since {}\">{} {}",
        Esc(s(b, "state_since")),
        Esc(&state.to_uppercase()),
        human_secs(n(b, "state_seconds")),
    )?;
    if matches!(state, "drain" | "disabled") {
        if failing(b) {
            o.push_str("<span class=\"hl down\">health DOWN</span>");
        } else {
            o.push_str("<span class=\"hl\">health up</span>");
        }
    }
    o.push_str("</td>");
    Ok(())
}

/// A failure counter: red while the backend is failing, grey (history) once it
/// passes again, so red on the page always means "now".
fn write_count(o: &mut String, v: u64, failing_now: bool) -> fmt::Result {
    match (v, failing_now) {
        (0, _) => write!(o, "<td>0</td>"),
        (_, true) => write!(o, "<td class=\"err\">{v}</td>"),
        (_, false) => write!(
            o,
            "<td class=\"hist\" title=\"{v} in the past; passing now\">{v}</td>"
        ),
    }
}

fn write_check(o: &mut String, b: &Value) -> fmt::Result {
    let c = &b["last_check"];
    if c.is_null() {
        return write!(o, "<td>{}</td>", check_none(s(b, "check")));
    }
    let age = human_secs(n(c, "seconds_ago"));
    match c["error"].as_str() {
        None => write!(
            o,
            "<td title=\"{}\">{} OK {age} ago</td>",
            Esc(s(c, "at")),
            Esc(s(b, "check"))
        ),
        // Wraps, up to three lines; the whole error is the tooltip.
        Some(e) => write!(
            o,
            "<td class=\"err\" title=\"{}: {}\"><div>{} FAIL {age} ago: {}</div></td>",
            Esc(s(c, "at")),
            Esc(e),
            Esc(s(b, "check")),
            Esc(e)
        ),
    }
}

fn check_none(kind: &str) -> &'static str {
    if kind == "none" {
        "no active check"
    } else {
        "not run yet"
    }
}

/// The CLI command for the usual next step from `state`, if any; the reason is
/// the cell's tooltip so the command stays on one line.
fn hint(svc: &str, b: &Value, state: &str, cli: &str) -> String {
    let target = format!("{}/{}", Esc(svc), Esc(s(b, "name")));
    let file = n(b, "configured_weight");
    let (why, cmd) = match state {
        "standby" => (
            "recovered primary held back (failback: manual); to hand traffic back",
            format!("enable {target}"),
        ),
        "drain" => (
            "draining; to put it back in rotation",
            format!("enable {target}"),
        ),
        "disabled" => (
            "in maintenance; to put it back in rotation",
            format!("enable {target}"),
        ),
        _ if n(b, "weight") != file => (
            "weight set at run time; to return to the file's (a reload does too)",
            format!("weight {target} {file}"),
        ),
        _ => return String::new(),
    };
    format!(
        "<code title=\"{why}\">crossbar backend {cmd}{}</code>",
        Esc(cli)
    )
}

fn write_total(o: &mut String, backends: &[Value]) -> fmt::Result {
    let sum = |f: &dyn Fn(&Value) -> u64| backends.iter().map(f).sum::<u64>();
    let up = backends.iter().filter(|b| s(b, "state") == "up").count();
    writeln!(
        o,
        "<tr class=\"tot\"><td>Total</td><td></td><td>{up}/{} up</td><td>{}</td><td></td>\
         <td>{}</td><td></td><td>{}</td><td>{}</td><td>{}</td>\
         <td>{}</td><td>{}</td><td></td><td>{}</td><td>{}</td><td></td></tr>",
        backends.len(),
        sum(&|b| n(b, "weight")),
        sum(&|b| n(b, "active_connections")),
        sum(&|b| n(b, "connections_total")),
        human_bytes(sum(&|b| n(&b["bytes"], "client_to_server"))),
        human_bytes(sum(&|b| n(&b["bytes"], "server_to_client"))),
        sum(&|b| n(b, "connect_errors")),
        sum(&|b| n(b, "check_failures")),
        sum(&|b| n(&b["handshakes"], "resumed")),
        sum(&|b| n(&b["handshakes"], "full")),
    )
}

/// Top sources by open connections the page shows per listener with `per_source`.
const PAGE_SOURCES: usize = 10;

/// A listener's per-source table: its limits, then its top sources by open
/// connections (`/api/sources`).
fn write_sources(o: &mut String, l: &Value) -> fmt::Result {
    let lim = &l["limits"];
    let open = lim["max_connections"]
        .as_u64()
        .map_or("-".into(), |m| m.to_string());
    let rate = lim["rate"]
        .as_u64()
        .map_or("-".into(), |r| format!("{r}/s, burst {}", n(lim, "burst")));
    write!(
        o,
        "<table data-sources=\"{}\"><caption><b>sources on {}</b> &middot; per source: open {} \
         &middot; new {} &middot; {}/{} tracked</caption>\n<tr><th>Source</th>\
         <th title=\"open connections\">Open</th><th title=\"new connections it may open now\">Tokens</th>\
         <th>Admitted</th><th>Refused</th></tr>\n",
        Esc(s(l, "listener")),
        Esc(s(l, "listener")),
        Esc(&open),
        Esc(&rate),
        n(l, "tracked"),
        n(lim, "table_size"),
    )?;
    let list = l["sources"].as_array().map_or(&[][..], Vec::as_slice);
    if list.is_empty() {
        o.push_str(
            "<tr><td colspan=\"5\">no source tracked now (a source leaves the table once it \
             has no open connection and a full bucket)</td></tr>\n",
        );
    }
    for src in list {
        let tokens = src["tokens"]
            .as_f64()
            .map_or("-".into(), |t| format!("{t:.1}"));
        writeln!(
            o,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            Esc(s(src, "source")),
            n(src, "open"),
            Esc(&tokens),
            n(src, "admitted"),
            n(src, "refused"),
        )?;
    }
    o.push_str("</table>\n");
    Ok(())
}

fn write_footer(o: &mut String) -> fmt::Result {
    o.push_str(
        "<footer>States: <span class=\"lg up\">UP</span>takes traffic \
         <span class=\"lg down\">DOWN</span>failed health checks \
         <span class=\"lg drain\">DRAIN</span>no new connections, open ones finish \
         <span class=\"lg disabled\">DISABLED</span>maintenance \
         <span class=\"lg standby\">STANDBY</span>recovered, waiting for manual failback; \
         under DRAIN and DISABLED, the backend's health. <span class=\"tag\">active</span> where \
         <code>balance: first</code> sends new connections now. Red counts: failing now; grey: \
         in the past. \
         Read-only: changes go through <code>crossbar backend</code> and the token-protected API \
         (JSON of this page: <a href=\"/api/services\">/api/services</a>, \
         metrics: <a href=\"/metrics\">/metrics</a>).</footer>\n",
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_are_listed_with_their_limits() {
        let l = serde_json::json!({
            "listener": "127.0.0.1:8140",
            "limits": { "max_connections": 4, "rate": 20, "burst": 10, "table_size": 100 },
            "tracked": 2,
            "sources": [
                { "source": "<b>", "open": 4, "tokens": 0.5, "admitted": 9, "refused": 1996 },
                { "source": "overflow", "open": 1, "tokens": null, "admitted": 1, "refused": 0 },
            ],
        });
        let mut o = String::new();
        write_sources(&mut o, &l).unwrap();
        assert!(
            o.contains("open 4 &middot; new 20/s, burst 10 &middot; 2/100 tracked"),
            "{o}"
        );
        assert!(
            o.contains("<td>&lt;b&gt;</td><td>4</td><td>0.5</td><td>9</td><td>1996</td>"),
            "{o}"
        );
        assert!(o.contains("<td>overflow</td><td>1</td><td>-</td>"), "{o}");
    }

    #[test]
    fn escapes_everything_outside() {
        let s = Esc("<b>&amp;\"x'</b>").to_string();
        assert_eq!(s, "&lt;b&gt;&amp;amp;&quot;x&#39;&lt;/b&gt;");
        assert_eq!(Esc("plain ü").to_string(), "plain ü");
    }

    #[test]
    fn refresh_values() {
        assert_eq!(refresh_param(None), Ok(DEFAULT_REFRESH));
        assert_eq!(refresh_param(Some("refresh=0")), Ok(0));
        assert_eq!(refresh_param(Some("refresh=3600")), Ok(3600));
        for bad in ["refresh=3601", "refresh=-1", "refresh=", "x=1", "refresh"] {
            assert!(refresh_param(Some(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn human_units() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(5 << 30), "5.0 GiB");
        assert_eq!(human_secs(42), "42s");
        assert_eq!(human_secs(725), "12m05s");
        assert_eq!(human_secs(3 * 3600 + 12 * 60), "3h12m");
        assert_eq!(human_secs(4 * 86400 + 3 * 3600), "4d03h");
    }

    #[test]
    fn hostile_names_are_text() {
        let data = serde_json::json!({
            "crossbar": {"version": "1", "config": "/tmp/<b>&amp;/c.yaml", "uptime_seconds": 5,
                         "last_reload": {"ok": false, "error": "<script>x</script>", "seconds_ago": 1}},
            "services": [{"name": "<i>s", "listeners": [], "stick_table": null, "handshakes": {},
                          "backends": [{"name": "\"><b", "state": "standby", "bytes": {}, "handshakes": {}}]}]
        });
        let html = render(&data, 5, "");
        assert!(html.contains("/tmp/&lt;b&gt;&amp;amp;/c.yaml"));
        assert!(!html.contains("<script>") && !html.contains("<i>") && !html.contains("\"><b"));
        assert!(html.contains("crossbar backend enable &lt;i&gt;s/&quot;&gt;&lt;b"));
        assert!(html.contains("content=\"5\""));
    }

    fn one_service(balance: &str, active: Option<&str>, backends: Value) -> Value {
        serde_json::json!({
            "crossbar": {"version": "1", "last_reload": null},
            "services": [{"name": "ca", "balance": balance, "listeners": [], "stick_table": null,
                          "handshakes": {}, "active_backend": active, "backends": backends}]
        })
    }

    #[test]
    fn banner_only_without_an_available_backend() {
        let failed = serde_json::json!({"result": "fail", "error": "refused <x>"});
        let data = one_service(
            "roundrobin",
            None,
            serde_json::json!([
                {"name": "a", "state": "down", "available": false, "healthy": false,
                 "check": "tcp", "last_check": failed},
                {"name": "b", "state": "drain", "available": false, "healthy": false,
                 "check": "tcp", "last_check": failed},
                {"name": "c", "state": "disabled", "available": false, "healthy": true},
            ]),
        );
        let html = render(&data, 0, "");
        assert!(html.contains(
            "<strong>NO BACKEND AVAILABLE</strong>: new connections are refused (refused:no_backend). \
             a DOWN: its tcp check fails; b DRAINED by the operator (its tcp check fails); \
             c DISABLED by the operator (health up)</div>"
        ));
        assert!(html.contains("DRAIN 0s<span class=\"hl down\">health DOWN</span>"));
        assert!(html.contains("DISABLED 0s<span class=\"hl\">health up</span>"));
        let mut data = data;
        data["services"][0]["backends"][2]["available"] = true.into();
        assert!(!render(&data, 0, "").contains("NO BACKEND AVAILABLE"));
        // Up at weight 0 takes sticky clients only: no backend for new ones.
        let c = &mut data["services"][0]["backends"][2];
        (c["state"], c["weight"], c["configured_weight"]) = ("up".into(), 0.into(), 2.into());
        let html = render(&data, 0, "");
        assert!(html.contains("; c at WEIGHT 0 by the operator (sticky clients only)</div>"));
        assert!(
            html.contains("crossbar backend weight ca/c 2"),
            "the way back"
        );
    }

    #[test]
    fn active_backend_of_first_and_history_counts() {
        let data = one_service(
            "first",
            Some("b"),
            serde_json::json!([
                {"name": "a", "state": "down", "available": false, "healthy": false,
                 "check_failures": 4, "last_check": {"result": "fail", "error": "x"}},
                {"name": "b", "state": "up", "available": true, "healthy": true,
                 "check_failures": 7, "last_check": {"result": "ok"}},
            ]),
        );
        let html = render(&data, 0, "");
        assert!(html.contains("<span class=\"act\">active: b</span>"));
        assert!(html.contains("<tr class=\"up act\"><td>b <span class=\"tag\">active</span>"));
        assert!(!html.contains("<tr class=\"down act\""));
        assert!(
            html.contains("<td class=\"err\">4</td>"),
            "failing now: red"
        );
        assert!(html.contains("<td class=\"hist\" title=\"7 in the past; passing now\">7</td>"));
        let none = one_service("first", None, serde_json::json!([]));
        let html = render(&none, 0, "");
        assert!(html.contains("active: none") && html.contains("The service has no backends."));
    }
}
