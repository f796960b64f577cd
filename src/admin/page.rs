//! `GET /`: the status page, one self-contained HTML table per service like
//! HAProxy's stats page, rendered from the views of `GET /api/services` and
//! `GET /api/sources` ([`super::view`]), as `crossbar status` renders them.
//!
//! No script at all: the page reloads itself with `<meta http-equiv="refresh">`
//! (`?refresh=N` seconds, 0 = off) and its only inline style is allowed by hash in
//! the Content-Security-Policy, which allows nothing else. Every string that comes
//! from outside (names, addresses, the config path, error messages) is escaped.
use std::fmt::{self, Write};
use std::sync::LazyLock;

use super::human::Esc;
use super::view::time::seconds_between;
use super::view::{
    BackendView, Balance, CheckKind, DiscoveryView, ListenerSourcesView, ProcessView, ServiceView,
    ServicesView, SourceLimitsView, StickTableView, Totals,
};
use crate::server::Server;
use base64::Engine;
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::{HeaderName, HeaderValue, CACHE_CONTROL, CONTENT_TYPE};
use hyper::{Response, StatusCode};

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
    let services = super::api::services(server);
    let data = PageData {
        services: &services,
        sources: &services.per_source,
    };
    let html = render(data, refresh, &cli_flags(server));
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
    // The CLI reads the default config without -c: its address and token file.
    if config.source == std::path::Path::new(crate::config::DEFAULT_CONFIG_PATH) {
        return String::new();
    }
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

pub use super::human::{human_bytes, human_secs};

/// What the page shows: `/api/services` and `/api/sources` of the same moment.
#[derive(Debug, Clone, Copy)]
pub struct PageData<'a> {
    /// The services document.
    pub services: &'a ServicesView,
    /// The per-source listeners (their top [`super::view::PAGE_SOURCES`] sources).
    pub sources: &'a [ListenerSourcesView],
}

/// The whole page for `data`; `cli` is appended to the CLI commands shown as hints.
pub fn render(data: PageData<'_>, refresh: u64, cli: &str) -> String {
    let mut out = String::with_capacity(8 * 1024);
    // Writing to a String cannot fail.
    let _ = write_page(&mut out, data, refresh, cli); // ok: fmt::Write for String is infallible
    out
}

fn write_page(o: &mut String, data: PageData<'_>, refresh: u64, cli: &str) -> fmt::Result {
    o.push_str("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">");
    if refresh > 0 {
        write!(o, "<meta http-equiv=\"refresh\" content=\"{refresh}\">")?;
    }
    writeln!(
        o,
        "<meta name=\"viewport\" content=\"width=device-width\">\
         <title>crossbar status</title><style>{CSS}</style></head><body>"
    )?;
    write_header(o, &data.services.crossbar, refresh)?;
    for svc in &data.services.services {
        write_service(o, svc, cli)?;
    }
    for l in data.sources {
        write_sources(o, l)?;
    }
    write_footer(o)?;
    o.push_str("</body></html>\n");
    Ok(())
}

fn write_header(o: &mut String, p: &ProcessView, refresh: u64) -> fmt::Result {
    write!(
        o,
        "<header><h1>crossbar {}</h1><span>up <b id=\"uptime\">{}</b> (since {})</span>\
         <span>config <b id=\"config\">{}</b></span><span>last reload: ",
        Esc(&p.version),
        human_secs(p.uptime_seconds),
        Rfc3339(p.started_at),
        Esc(&p.config),
    )?;
    match &p.last_reload {
        None => o.push_str("<span id=\"reload\">none since start</span>"),
        Some(r) if r.ok => {
            write!(
                o,
                "<span id=\"reload\" class=\"ok\">OK, {} ago</span>",
                human_secs(r.seconds_ago)
            )?;
            if !r.warnings.is_empty() {
                write!(
                    o,
                    " <span id=\"reload-warnings\" class=\"warn\">with {} warning(s): {}</span>",
                    r.warnings.len(),
                    Esc(&r.warnings.join("; ")),
                )?;
            }
        }
        Some(r) => write!(
            o,
            "<span id=\"reload\" class=\"bad\">FAILED {} ago, running config kept: {}</span>",
            human_secs(r.seconds_ago),
            Esc(r.error.as_deref().unwrap_or("")),
        )?,
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

/// A time as the views write it (RFC 3339, whole seconds).
struct Rfc3339(std::time::SystemTime);

impl fmt::Display for Rfc3339 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_rfc3339_seconds(self.0))
    }
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
    (
        "Cur/Limit",
        "connections open now / the connection limit (max_connections, or the agent's maxconn while lower); no limit: the count alone",
    ),
    ("Peak", "most connections open at once"),
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

fn write_service(o: &mut String, svc: &ServiceView, cli: &str) -> fmt::Result {
    write!(
        o,
        "<table data-service=\"{}\"><caption><b>{}</b> &middot; {} &middot; balance {} &middot; on {}",
        Esc(&svc.name),
        Esc(&svc.name),
        svc.mode.as_str(),
        svc.balance.as_str(),
        Esc(&listeners(&svc.listeners)),
    )?;
    for p in &svc.proxy_protocol {
        write!(o, " &middot; {}", Esc(&p.text))?;
    }
    write_stick(o, svc.stick_table.as_ref())?;
    if let Some(d) = &svc.discovery {
        write_discovery(o, d)?;
    }
    super::page_feedback::write_caption(o, svc)?;
    write!(
        o,
        " &middot; handshakes {} resumed / {} full &middot; {}",
        svc.handshakes.resumed,
        svc.handshakes.full,
        svc.queue_text(),
    )?;
    if svc.balance == Balance::First {
        match &svc.active_backend {
            Some(a) => write!(o, " &middot; <span class=\"act\">active: {}</span>", Esc(a))?,
            None => o.push_str(" &middot; active: none"),
        }
    }
    write_banner(o, svc)?;
    o.push_str("</caption>\n<tr>");
    for (h, tip) in COLUMNS {
        write!(o, "<th title=\"{tip}\">{h}</th>")?;
    }
    o.push_str("</tr>\n");
    for b in &svc.backends {
        write_backend(o, &svc.name, b, svc.is_active(b), cli)?;
    }
    write_total(o, &svc.totals())?;
    o.push_str("</table>\n");
    Ok(())
}

/// Where DNS-discovered backends come from, when the name last resolved, and a
/// STALE mark while lookups fail (the last good set serves on).
fn write_discovery(o: &mut String, d: &DiscoveryView) -> fmt::Result {
    let now = std::time::SystemTime::now();
    let ago = d.last_resolved.map_or("never".to_string(), |t| {
        format!("{} ago", human_secs(seconds_between(t, now)))
    });
    write!(
        o,
        " &middot; <span class=\"dns\">DNS {} <code>{}</code>: {}",
        Esc(&d.kind),
        Esc(&d.name),
        d.set_text(&ago),
    )?;
    if d.dropped > 0 {
        write!(
            o,
            ", <span class=\"warn\">{} record(s) over max_backends left out</span>",
            d.dropped
        )?;
    }
    o.push_str("</span>");
    if !d.own.is_empty() {
        write!(
            o,
            " <span class=\"warn\">{} record(s) naming crossbar itself left out: {}</span>",
            d.own.len(),
            Esc(&d.own.join("; ")),
        )?;
    }
    if d.stale {
        write!(
            o,
            " <span class=\"bad\">STALE: {}; {}</span>",
            Esc(d.error.as_deref().unwrap_or("")),
            d.meanwhile(),
        )?;
    }
    Ok(())
}

fn write_stick(o: &mut String, t: Option<&StickTableView>) -> fmt::Result {
    let Some(t) = t else {
        return o.write_str(" &middot; no stick table");
    };
    write!(
        o,
        " &middot; stick table {}/{} entries, {} ({} hits / {} misses)",
        t.counts.entries,
        t.counts.capacity,
        hit_ratio(t.hit_ratio),
        t.lookups.hit,
        t.lookups.miss,
    )
}

/// `hit ratio 96.8%`, or `no lookups yet`.
pub fn hit_ratio(r: Option<f64>) -> String {
    r.map_or("no lookups yet".to_string(), |r| {
        format!("hit ratio {:.1}%", r * 100.0)
    })
}

/// The bound addresses, or `(not bound)`.
pub fn listeners(list: &[String]) -> String {
    if list.is_empty() {
        "(not bound)".into()
    } else {
        list.join(", ")
    }
}

/// A red line in the caption of a service that has no backend to give a new
/// connection to, with each backend's reason.
fn write_banner(o: &mut String, svc: &ServiceView) -> fmt::Result {
    if !svc.none_available() {
        return Ok(());
    }
    o.push_str(
        "<div class=\"none\" role=\"alert\"><strong>NO BACKEND AVAILABLE</strong>: \
         new connections are refused (refused:no_backend).",
    );
    if svc.backends.is_empty() {
        o.push_str(" The service has no backends.");
    }
    for (i, b) in svc.backends.iter().enumerate() {
        let sep = if i == 0 { " " } else { "; " };
        write!(o, "{sep}{} {}", Esc(&b.name), Esc(&b.why_unavailable()))?;
    }
    o.push_str("</div>");
    Ok(())
}

fn write_backend(
    o: &mut String,
    svc: &str,
    b: &BackendView,
    active: bool,
    cli: &str,
) -> fmt::Result {
    let (row_class, tag) = if active {
        (" act", " <span class=\"tag\">active</span>")
    } else {
        ("", "")
    };
    let dns = match &b.dns_name {
        Some(from) => format!(
            " <span class=\"tag\" title=\"from DNS: {}\">dns</span>",
            Esc(from)
        ),
        None => String::new(),
    };
    write!(
        o,
        "<tr class=\"{}{row_class}\"><td>{}{tag}{dns}</td><td>{}</td>",
        b.state,
        Esc(&b.name),
        Esc(&b.address),
    )?;
    write_state(o, b)?;
    super::page_feedback::write_weight(o, b).unwrap_or_else(|| write_weight(o, b))?;
    let (c2s, s2c) = (b.bytes.client_to_server, b.bytes.server_to_client);
    write!(
        o,
        "<td>{}</td><td>{}</td><td>{}</td>\
         <td>{}</td><td title=\"{c2s}\">{}</td><td title=\"{s2c}\">{}</td>",
        if b.backup { "Y" } else { "-" },
        b.connections_text(),
        b.peak_connections,
        b.connections_total,
        human_bytes(c2s),
        human_bytes(s2c),
    )?;
    let now = b.failing();
    write_count(o, b.connect_errors, now)?;
    write_count(o, b.check_failures, now)?;
    write_check(o, b)?;
    writeln!(
        o,
        "<td>{}</td><td>{}</td><td>{}</td></tr>",
        b.handshakes.resumed,
        b.handshakes.full,
        hint(svc, b, cli),
    )
}

/// The weight cell: the weight, and when it was set at run time, highlighted with
/// the file's below it.
fn write_weight(o: &mut String, b: &BackendView) -> fmt::Result {
    let (now, file) = (b.weight, b.configured_weight);
    if let Some(r) = &b.slow_start {
        return write!(
            o,
            "<td title=\"slow_start: a recovered backend takes new connections in proportion \
             to how far along its {}s ramp is\">{now}<span class=\"hl\">{}</span></td>",
            r.seconds_total,
            r.text()
        );
    }
    match b.weight_note() {
        None => write!(o, "<td>{now}</td>"),
        Some(_) if b.weight_origin == super::view::Origin::Dns => write!(
            o,
            "<td title=\"the SRV record's weight\">{now}<span class=\"hl\">dns</span></td>"
        ),
        Some(_) => {
            let (source, whose) = match b.source {
                super::view::BackendSource::Dns => ("dns", "the SRV record's weight"),
                super::view::BackendSource::Config => ("file", "the config file's weight"),
            };
            write!(
                o,
                "<td class=\"rtw\" title=\"{source} {file}: {whose}; {now} set at run time \
                 (crossbar backend weight), kept across reloads that leave the backend alone, \
                 until crossbar backend reset\">{now}<span class=\"hl\">operator; {source} {file}</span></td>"
            )
        }
    }
}

/// The state cell: state and age; under DRAIN or DISABLED also the health, since
/// operator state and health are two things (DOWN and UP say it already).
fn write_state(o: &mut String, b: &BackendView) -> fmt::Result {
    write!(
        o,
        "<td title=\"since {}\">{} {}",
        Rfc3339(b.state_since),
        b.state.as_str().to_uppercase(),
        human_secs(b.state_seconds),
    )?;
    if let Some(note) = b.state_note() {
        write!(o, "<span class=\"hl\">{}</span>", Esc(note))?;
    }
    if b.state.hides_health() {
        if b.failing() {
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

fn write_check(o: &mut String, b: &BackendView) -> fmt::Result {
    let Some(c) = &b.last_check else {
        return write!(o, "<td>{}</td>", check_none(b.check));
    };
    let age = human_secs(c.seconds_ago);
    match &c.error {
        None => write!(
            o,
            "<td title=\"{}\">{} OK {age} ago</td>",
            Rfc3339(c.at),
            b.check
        ),
        // Wraps, up to three lines; the whole error is the tooltip.
        Some(e) => write!(
            o,
            "<td class=\"err\" title=\"{}: {}\"><div>{} FAIL {age} ago: {}</div></td>",
            Rfc3339(c.at),
            Esc(e),
            b.check,
            Esc(e)
        ),
    }
}

/// What the last-check cell says before any check ran.
pub fn check_none(kind: CheckKind) -> &'static str {
    if kind == CheckKind::None {
        "no active check"
    } else {
        "not run yet"
    }
}

/// The CLI command for the usual next step from its state, if any; the reason is
/// the cell's tooltip so the command stays on one line.
fn hint(svc: &str, b: &BackendView, cli: &str) -> String {
    match b.next_step(svc) {
        Some(step) => format!(
            "<code title=\"{}\">crossbar backend {}{}</code>",
            step.why,
            Esc(&step.command),
            Esc(cli)
        ),
        None => String::new(),
    }
}

fn write_total(o: &mut String, t: &Totals) -> fmt::Result {
    writeln!(
        o,
        "<tr class=\"tot\"><td>Total</td><td></td><td>{}/{} up</td><td>{}</td><td></td>\
         <td>{}</td><td></td><td>{}</td><td>{}</td><td>{}</td>\
         <td>{}</td><td>{}</td><td></td><td>{}</td><td>{}</td><td></td></tr>",
        t.up,
        t.backends,
        t.weight,
        t.active_connections,
        t.connections_total,
        human_bytes(t.bytes.client_to_server),
        human_bytes(t.bytes.server_to_client),
        t.connect_errors,
        t.check_failures,
        t.handshakes.resumed,
        t.handshakes.full,
    )
}

/// A listener's per-source table: its limits, then its top sources by open
/// connections (`/api/sources`).
fn write_sources(o: &mut String, l: &ListenerSourcesView) -> fmt::Result {
    let lim = &l.limits;
    write!(
        o,
        "<table data-sources=\"{}\"><caption><b>sources on {}</b> &middot; per source: open {} \
         &middot; new {} &middot; {}/{} tracked</caption>\n<tr><th>Source</th>\
         <th title=\"open connections\">Open</th><th title=\"new connections it may open now\">Tokens</th>\
         <th>Admitted</th><th>Refused</th></tr>\n",
        Esc(&l.listener),
        Esc(&l.listener),
        Esc(&per_source_open(lim)),
        Esc(&per_source_rate(lim)),
        l.tracked,
        lim.table_size,
    )?;
    if l.sources.is_empty() {
        o.push_str(
            "<tr><td colspan=\"5\">no source tracked now (a source leaves the table once it \
             has no open connection and a full bucket)</td></tr>\n",
        );
    }
    for src in &l.sources {
        writeln!(
            o,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            Esc(&src.source),
            src.open,
            Esc(&tokens(src.tokens)),
            src.admitted,
            src.refused,
        )?;
    }
    o.push_str("</table>\n");
    Ok(())
}

/// `per_source`'s open-connection limit: `20`, or `-` without one.
fn per_source_open(l: &SourceLimitsView) -> String {
    l.max_connections.map_or("-".into(), |m| m.to_string())
}

/// `per_source`'s rate: `10/s, burst 40`, or `-` without one.
fn per_source_rate(l: &SourceLimitsView) -> String {
    l.rate
        .map_or("-".into(), |r| format!("{r}/s, burst {}", l.burst))
}

/// A source's tokens to a tenth, or `-` without a rate.
pub fn tokens(t: Option<f64>) -> String {
    t.map_or("-".into(), |t| format!("{t:.1}"))
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
    use crate::admin::view::fixture::{self, backend, failed_check, service};
    use crate::admin::view::{ReloadView, State};

    fn page(services: &ServicesView, sources: &[ListenerSourcesView]) -> String {
        render(PageData { services, sources }, 0, "")
    }

    fn one_service(svc: ServiceView) -> ServicesView {
        ServicesView {
            crossbar: fixture::process(),
            services: vec![svc],
            per_source: Vec::new(),
        }
    }

    #[test]
    fn sources_are_listed_with_their_limits() {
        let mut l = fixture::sources().listeners.remove(0);
        l.sources[0].source = "<b>".into();
        let mut o = String::new();
        write_sources(&mut o, &l).unwrap();
        assert!(
            o.contains("open 20 &middot; new 10/s, burst 40 &middot; 1734/100000 tracked"),
            "{o}"
        );
        assert!(
            o.contains("<td>&lt;b&gt;</td><td>20</td><td>0.0</td><td>311</td><td>18220</td>"),
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
    fn hostile_names_are_text() {
        let mut data = one_service(service(
            "<i>s",
            Balance::RoundRobin,
            vec![backend("\"><b", State::Standby)],
        ));
        data.crossbar.config = "/tmp/<b>&amp;/c.yaml".into();
        data.crossbar.last_reload = Some(ReloadView {
            ok: false,
            error: Some("<script>x</script>".into()),
            warnings: Vec::new(),
            ..data.crossbar.last_reload.unwrap()
        });
        let html = render(
            PageData {
                services: &data,
                sources: &[],
            },
            5,
            "",
        );
        assert!(html.contains("/tmp/&lt;b&gt;&amp;amp;/c.yaml"));
        assert!(!html.contains("<script>") && !html.contains("<i>") && !html.contains("\"><b"));
        assert!(html.contains("crossbar backend enable &lt;i&gt;s/&quot;&gt;&lt;b"));
        assert!(html.contains("content=\"5\""));
    }

    #[test]
    fn banner_only_without_an_available_backend() {
        let a = BackendView {
            check: CheckKind::Tcp,
            last_check: failed_check("refused <x>"),
            ..backend("a", State::Down)
        };
        let b = BackendView {
            check: CheckKind::Tcp,
            healthy: false,
            last_check: failed_check("refused <x>"),
            ..backend("b", State::Drain)
        };
        let c = backend("c", State::Disabled);
        let mut data = one_service(service("ca", Balance::RoundRobin, vec![a, b, c]));
        let html = page(&data, &[]);
        assert!(html.contains(
            "<strong>NO BACKEND AVAILABLE</strong>: new connections are refused (refused:no_backend). \
             a DOWN: its tcp check fails; b DRAINED by the operator (its tcp check fails); \
             c DISABLED by the operator (health up)</div>"
        ));
        assert!(html.contains("DRAIN 0s<span class=\"hl down\">health DOWN</span>"));
        assert!(html.contains("DISABLED 0s<span class=\"hl\">health up</span>"));
        data.services[0].backends[2].available = true;
        assert!(!page(&data, &[]).contains("NO BACKEND AVAILABLE"));
        // Up at weight 0 takes sticky clients only: no backend for new ones.
        let c = &mut data.services[0].backends[2];
        (c.state, c.weight, c.configured_weight) = (State::Up, 0, 2);
        let html = page(&data, &[]);
        assert!(html.contains("; c at WEIGHT 0 by the operator (sticky clients only)</div>"));
        assert!(html.contains("crossbar backend reset ca/c"), "the way back");
    }

    #[test]
    fn active_backend_of_first_and_history_counts() {
        let a = BackendView {
            check_failures: 4,
            last_check: failed_check("x"),
            ..backend("a", State::Down)
        };
        let b = BackendView {
            check_failures: 7,
            ..backend("b", State::Up)
        };
        let data = one_service(ServiceView {
            active_backend: Some("b".into()),
            ..service("ca", Balance::First, vec![a, b])
        });
        let html = page(&data, &[]);
        assert!(html.contains("<span class=\"act\">active: b</span>"));
        assert!(html.contains("<tr class=\"up act\"><td>b <span class=\"tag\">active</span>"));
        assert!(!html.contains("<tr class=\"down act\""));
        assert!(
            html.contains("<td class=\"err\">4</td>"),
            "failing now: red"
        );
        assert!(html.contains("<td class=\"hist\" title=\"7 in the past; passing now\">7</td>"));
        let none = one_service(service("ca", Balance::First, Vec::new()));
        let html = page(&none, &[]);
        assert!(html.contains("active: none") && html.contains("The service has no backends."));
    }
}
