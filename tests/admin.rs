//! The admin endpoint over real HTTP on loopback: /metrics after real TLS traffic
//! (exact counters, exposition syntax, every family of DESIGN.md), the /api end to
//! end (services, tables, drain observed in routing), auth, error codes, the CLI
//! binary, and the shipped monitoring files: the dashboard and alert rules only use
//! metrics that exist, every dashboard query is scoped to the chosen instance, and
//! the alert rules pass Prometheus's own `promtool` (each alert fires when it should,
//! the reload alert on the FIRST failed reload, and not before).
mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{any_port, refusing_addr, AdminEndpoint, Crossbar, SNI};
use crossbar::admin;
use crossbar::testbed::{self, BackendTls, TestCa, TlsBackend, Versions};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Bytes;
use hyper::{HeaderMap, Method, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// A running balancer with its admin endpoint and TLS backends, all on loopback.
struct Bed {
    xb: Crossbar,
    admin: SocketAddr,
    ca: TestCa,
    _endpoint: AdminEndpoint,
    _backends: Vec<TlsBackend>,
}

impl Bed {
    /// Services: `puppet` (roundrobin, stick on session_id/ticket/psk, b1 b2),
    /// `plain` (roundrobin, no stick, p1 p2) and `broken` (one backend on a closed port).
    async fn start(token: Option<&str>) -> Bed {
        let ca = TestCa::new("admin test CA").unwrap();
        let mut backends = Vec::new();
        for n in ["b1", "b2", "p1", "p2"] {
            let b = TlsBackend::start(&ca, n, &[SNI], BackendTls::default(), any_port())
                .await
                .unwrap();
            backends.push(b);
        }
        let closed = refusing_addr();
        let addr = |i: usize| backends[i].addr;
        let yaml = format!(
            "admin: {{ enabled: false }}\n\
             defaults:\n  health: {{ check: none }}\n  retries: 0\n\
             services:\n\
             \x20 puppet:\n    listen: [\"127.0.0.1:0\"]\n    balance: roundrobin\n\
             \x20   stick: {{ on: [session_id, ticket, psk], size: 1000, expire: 30m }}\n\
             \x20   backends:\n\
             \x20     - {{ name: b1, address: \"{}\" }}\n\
             \x20     - {{ name: b2, address: \"{}\" }}\n\
             \x20 plain:\n    listen: [\"127.0.0.1:0\"]\n    balance: roundrobin\n\
             \x20   backends:\n\
             \x20     - {{ name: p1, address: \"{}\" }}\n\
             \x20     - {{ name: p2, address: \"{}\", weight: 1 }}\n\
             \x20 broken:\n    listen: [\"127.0.0.1:0\"]\n\
             \x20   backends:\n\
             \x20     - {{ name: gone, address: \"{closed}\" }}\n",
            addr(0),
            addr(1),
            addr(2),
            addr(3),
        );
        let xb = Crossbar::start(&yaml).await;
        let token = token.map(|t| {
            let f = xb.dir().join("admin.token");
            std::fs::write(&f, format!("{t}\n")).unwrap();
            admin::Secret::from_file(&f).unwrap()
        });
        let endpoint = xb.serve_admin(token).await;
        Bed {
            admin: endpoint.addr,
            xb,
            ca,
            _endpoint: endpoint,
            _backends: backends,
        }
    }

    fn listen(&self, service: &str) -> SocketAddr {
        self.xb.addr(service)
    }

    fn url(&self) -> String {
        format!("http://{}", self.admin)
    }

    fn token_file(&self) -> PathBuf {
        self.xb.dir().join("admin.token")
    }

    /// One TLS connection with a fresh session cache; the backend that answered.
    async fn once(&self, service: &str) -> String {
        let cfg = testbed::client_config(&self.ca, Versions::Both, true).unwrap();
        testbed::get(self.listen(service), SNI, cfg, "/")
            .await
            .unwrap()
            .backend
    }
}

/// An HTTP answer: status, headers, body.
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

/// One request to the admin endpoint, optionally with a bearer token and a body.
async fn call(addr: SocketAddr, method: Method, path: &str, token: Option<&str>) -> Answer {
    call_with_body(addr, method, path, token, Bytes::new()).await
}

async fn call_with_body(
    addr: SocketAddr,
    method: Method,
    path: &str,
    token: Option<&str>,
    body: Bytes,
) -> Answer {
    let host = addr.to_string();
    let bearer = token.map(|t| format!("Bearer {t}"));
    let mut headers = vec![("host", host.as_str())];
    if let Some(b) = &bearer {
        headers.push(("authorization", b));
    }
    exchange(addr, method, path, &headers, body).await
}

/// One request on a fresh connection with exactly `headers` and `body`.
async fn exchange(
    addr: SocketAddr,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Bytes,
) -> Answer {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    let driver = tokio::spawn(conn);
    let mut req = hyper::Request::builder().method(method).uri(path);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = sender
        .send_request(req.body(Full::new(body)).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    driver.abort();
    Answer {
        status,
        headers,
        body: String::from_utf8(bytes.to_vec()).unwrap(),
    }
}

async fn get(bed: &Bed, path: &str) -> Answer {
    call(bed.admin, Method::GET, path, None).await
}

// ---------------------------------------------------------------------------
// A Prometheus text-format (0.0.4) parser, from the spec: lines are `# HELP name
// text`, `# TYPE name type`, other `#` comments, blank, or samples
// `name{label="value",...} value [timestamp]`.

#[derive(Debug, Default)]
struct Exposition {
    /// Family name -> type.
    types: BTreeMap<String, String>,
    /// Families with a HELP line.
    helps: BTreeSet<String>,
    /// (sample name, sorted labels) -> value.
    samples: BTreeMap<(String, Labels), f64>,
}

fn is_metric_name(s: &str) -> bool {
    let mut c = s.chars();
    c.next()
        .is_some_and(|f| f.is_ascii_alphabetic() || f == '_' || f == ':')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_' || x == ':')
}

fn is_label_name(s: &str) -> bool {
    let mut c = s.chars();
    c.next()
        .is_some_and(|f| f.is_ascii_alphabetic() || f == '_')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_')
}

fn parse_value(s: &str) -> Result<f64, String> {
    match s {
        "+Inf" | "Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        _ => s.parse::<f64>().map_err(|e| format!("value {s:?}: {e}")),
    }
}

/// Labels of `{a="x",b="y"}` (the text between the braces); returns the rest after `}`.
/// Label pairs of one sample.
type Labels = Vec<(String, String)>;

fn parse_labels(s: &str) -> Result<(Labels, &str), String> {
    let mut labels = Vec::new();
    let mut rest = s;
    loop {
        rest = rest.trim_start();
        if let Some(r) = rest.strip_prefix('}') {
            return Ok((labels, r));
        }
        let eq = rest.find('=').ok_or("label without '='")?;
        let name = rest[..eq].trim();
        if !is_label_name(name) {
            return Err(format!("bad label name {name:?}"));
        }
        let mut chars = rest[eq + 1..].char_indices();
        if chars.next().map(|(_, c)| c) != Some('"') {
            return Err("label value not quoted".into());
        }
        let mut value = String::new();
        let mut end = None;
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next().map(|(_, c)| c) {
                    Some('\\') => value.push('\\'),
                    Some('"') => value.push('"'),
                    Some('n') => value.push('\n'),
                    other => return Err(format!("bad escape {other:?}")),
                },
                '"' => {
                    end = Some(eq + 1 + i + 1);
                    break;
                }
                '\n' => return Err("newline in label value".into()),
                c => value.push(c),
            }
        }
        let end = end.ok_or("unterminated label value")?;
        labels.push((name.to_string(), value));
        rest = &rest[end..];
        if let Some(r) = rest.strip_prefix(',') {
            rest = r;
        } else if !rest.starts_with('}') {
            return Err(format!("expected ',' or '}}' at {rest:?}"));
        }
    }
}

/// The family a sample belongs to (histogram samples carry a suffix).
fn family_of<'a>(name: &'a str, types: &BTreeMap<String, String>) -> Option<&'a str> {
    if types.contains_key(name) {
        return Some(name);
    }
    ["_bucket", "_sum", "_count"].iter().find_map(|suf| {
        let base = name.strip_suffix(suf)?;
        matches!(
            types.get(base).map(String::as_str),
            Some("histogram" | "summary")
        )
        .then_some(base)
    })
}

fn parse_exposition(text: &str) -> Result<Exposition, String> {
    let mut e = Exposition::default();
    for (n, line) in text.lines().enumerate() {
        let err = |m: String| format!("line {}: {m}: {line:?}", n + 1);
        if line.trim().is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix('#') {
            let mut parts = rest.trim_start().splitn(3, ' ');
            match parts.next() {
                Some("HELP") => {
                    let name = parts
                        .next()
                        .ok_or_else(|| err("HELP without name".into()))?;
                    if !is_metric_name(name) || !e.helps.insert(name.to_string()) {
                        return Err(err("bad or repeated HELP".into()));
                    }
                }
                Some("TYPE") => {
                    let name = parts
                        .next()
                        .ok_or_else(|| err("TYPE without name".into()))?;
                    let ty = parts.next().unwrap_or("").trim();
                    if !is_metric_name(name)
                        || !["counter", "gauge", "histogram", "summary", "untyped"].contains(&ty)
                    {
                        return Err(err("bad TYPE".into()));
                    }
                    if e.types.insert(name.to_string(), ty.to_string()).is_some() {
                        return Err(err("repeated TYPE".into()));
                    }
                }
                _ => {} // any other comment
            }
            continue;
        }
        let name_end = line
            .find(['{', ' '])
            .ok_or_else(|| err("no value".into()))?;
        let name = &line[..name_end];
        if !is_metric_name(name) {
            return Err(err("bad metric name".into()));
        }
        let (mut labels, rest) = match line[name_end..].strip_prefix('{') {
            Some(r) => parse_labels(r).map_err(err)?,
            None => (Vec::new(), &line[name_end..]),
        };
        let mut fields = rest.split_whitespace();
        let value =
            parse_value(fields.next().ok_or_else(|| err("no value".into()))?).map_err(err)?;
        if let Some(ts) = fields.next() {
            ts.parse::<i64>()
                .map_err(|e| err(format!("timestamp: {e}")))?;
        }
        if fields.next().is_some() {
            return Err(err("trailing fields".into()));
        }
        let family =
            family_of(name, &e.types).ok_or_else(|| err("sample before its TYPE".into()))?;
        if e.types[family] == "histogram"
            && name.ends_with("_bucket")
            && !labels.iter().any(|(k, _)| k == "le")
        {
            return Err(err("bucket without le".into()));
        }
        labels.sort();
        if e.samples
            .insert((name.to_string(), labels), value)
            .is_some()
        {
            return Err(err("duplicate series".into()));
        }
    }
    Ok(e)
}

impl Exposition {
    /// The value of one series (0 when absent: a counter never incremented).
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let mut l: Vec<(String, String)> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        l.sort();
        self.samples
            .get(&(name.to_string(), l))
            .copied()
            .unwrap_or(0.0)
    }

    /// Sum over every series of `name` whose labels include `labels`.
    fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|((n, l), _)| {
                n == name
                    && labels
                        .iter()
                        .all(|(k, v)| l.iter().any(|(lk, lv)| lk == k && lv == v))
            })
            .map(|(_, v)| v)
            .sum()
    }
}

async fn scrape(bed: &Bed) -> Exposition {
    let a = get(bed, "/metrics").await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(
        a.headers["content-type"],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    parse_exposition(&a.body).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn exposition_parser_rejects_bad_lines() {
    for bad in [
        "1abc 1",
        "# TYPE x counter\nx{a=\"1\" 1",
        "# TYPE x counter\nx{a=1} 1",
        "# TYPE x counter\nx{1a=\"1\"} 1",
        "# TYPE x counter\nx one",
        "x 1",
        "# TYPE x gauge\n# TYPE x gauge",
        "# TYPE x counter\nx{a=\"\\q\"} 1",
    ] {
        assert!(parse_exposition(bad).is_err(), "{bad}");
    }
    let ok = "# HELP x a \"help\"\n# TYPE x counter\nx{a=\"q\\\"\\n\\\\\",b=\"\"} 1e3 1700000000\n\
              # TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_sum 0.5\nh_count 2\n";
    let e = parse_exposition(ok).unwrap();
    assert_eq!(e.get("x", &[("a", "q\"\n\\"), ("b", "")]), 1000.0);
    assert_eq!(e.get("h_count", &[]), 2.0);
}

// ---------------------------------------------------------------------------

/// The metric families DESIGN.md's "Metrics" section names.
const DESIGN_FAMILIES: &[&str] = &[
    "crossbar_stick_table_entries",
    "crossbar_stick_table_capacity",
    "crossbar_stick_lookups_total",
    "crossbar_stick_learned_total",
    "crossbar_stick_expired_total",
    "crossbar_stick_evicted_total",
    "crossbar_tls_handshakes_total",
    "crossbar_connections_total",
    "crossbar_active_connections",
    "crossbar_backend_up",
    "crossbar_bytes_total",
    "crossbar_connect_errors_total",
    "crossbar_client_hello_errors_total",
    "crossbar_connect_duration_seconds",
];

/// Real traffic, then exact counters: 6 connections of one TLS 1.3 agent (one full
/// handshake, five PSK resumptions kept on its backend), 6 fresh agents round-robin
/// on `plain`, one plain-HTTP client and one connect failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_after_traffic_are_exact_and_valid() {
    let bed = Bed::start(None).await;
    let agent = testbed::client_config(&bed.ca, Versions::Tls13, true).unwrap();
    let mut first = None;
    for i in 0..6 {
        let r = testbed::get(bed.listen("puppet"), SNI, agent.clone(), "/")
            .await
            .unwrap();
        assert_eq!(r.resumed, i > 0, "connection {i}");
        let b = first.get_or_insert_with(|| r.backend.clone());
        assert_eq!(*b, r.backend, "resumption {i} left its backend");
    }
    let stuck = first.unwrap();
    let other = if stuck == "b1" { "b2" } else { "b1" };
    let mut plain = BTreeMap::new();
    for _ in 0..6 {
        *plain.entry(bed.once("plain").await).or_insert(0) += 1;
    }
    assert_eq!(
        plain,
        BTreeMap::from([("p1".to_string(), 3), ("p2".to_string(), 3)])
    );
    // Not TLS: the balancer closes it after reading the first bytes.
    let mut http = TcpStream::connect(bed.listen("plain")).await.unwrap();
    http.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut sink = Vec::new();
    tokio::io::AsyncReadExt::read_to_end(&mut http, &mut sink)
        .await
        .unwrap();
    // The only backend of `broken` refuses connections.
    let cfg = testbed::client_config(&bed.ca, Versions::Both, true).unwrap();
    assert!(testbed::get(bed.listen("broken"), SNI, cfg, "/")
        .await
        .is_err());

    // The clients have their answers; crossbar may still be closing its side of the
    // last connection (the relay ends once both directions have), so wait for that.
    let mut m = scrape(&bed).await;
    let waiting = std::time::Instant::now();
    while m.sum("crossbar_active_connections", &[]) > 0.0
        && waiting.elapsed() < std::time::Duration::from_secs(10)
    {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        m = scrape(&bed).await;
    }
    fn sb(b: &str) -> [(&str, &str); 2] {
        [("service", "puppet"), ("backend", b)]
    }
    let conns = "crossbar_connections_total";
    assert_eq!(m.get(conns, &sb(&stuck)), 6.0);
    assert_eq!(m.get(conns, &sb(other)), 0.0);
    let hs = "crossbar_tls_handshakes_total";
    let kind = |k: &'static str| {
        [
            ("service", "puppet"),
            ("backend", stuck.as_str()),
            ("kind", k),
        ]
    };
    assert_eq!(m.get(hs, &kind("full")), 1.0);
    assert_eq!(m.get(hs, &kind("resumed")), 5.0);
    // Each resumption looks its PSK identity up once. The first identity is not in
    // the table yet, but its ticket-key name is (learned by crossbar's probe of the
    // backend), so all five hit.
    let look = |k: &'static str, r: &'static str| {
        m.get(
            "crossbar_stick_lookups_total",
            &[("service", "puppet"), ("key", k), ("result", r)],
        )
    };
    assert_eq!((look("psk", "hit"), look("psk", "miss")), (5.0, 0.0));
    assert_eq!(look("session_id", "hit") + look("session_id", "miss"), 0.0);
    assert_eq!(look("ticket", "hit") + look("ticket", "miss"), 0.0);
    let learned = |k: &'static str| {
        m.get(
            "crossbar_stick_learned_total",
            &[("service", "puppet"), ("key", k)],
        )
    };
    // Every accepted PSK is learned; the full handshake leaves a source hint.
    assert_eq!(learned("psk"), 5.0);
    assert_eq!(learned("source"), 1.0);
    assert_eq!(learned("session_id") + learned("ticket"), 0.0);
    for (b, n) in [("p1", 3.0), ("p2", 3.0)] {
        let l = [("service", "plain"), ("backend", b)];
        assert_eq!(m.get(conns, &l), n);
        assert_eq!(
            m.get(
                hs,
                &[("service", "plain"), ("backend", b), ("kind", "full")]
            ),
            n
        );
        assert_eq!(m.get("crossbar_active_connections", &l), 0.0);
        assert_eq!(m.get("crossbar_backend_up", &l), 1.0);
        assert_eq!(m.get("crossbar_connect_duration_seconds_count", &l), n);
        for dir in ["client_to_server", "server_to_client"] {
            let v = m.get(
                "crossbar_bytes_total",
                &[("service", "plain"), ("backend", b), ("direction", dir)],
            );
            assert!(v > 0.0, "{b} {dir}");
        }
    }
    assert_eq!(
        m.get("crossbar_stick_table_capacity", &[("service", "puppet")]),
        1000.0
    );
    let entries = m.get("crossbar_stick_table_entries", &[("service", "puppet")]);
    // 5 PSK identities, their key-name prefix, the source hint.
    assert!(entries >= 6.0, "{entries}");
    assert_eq!(
        m.get(
            "crossbar_connect_errors_total",
            &[("service", "broken"), ("backend", "gone")]
        ),
        1.0
    );
    assert_eq!(
        m.sum(
            "crossbar_client_hello_errors_total",
            &[("reason", "not_tls")]
        ),
        1.0
    );
    for f in DESIGN_FAMILIES {
        assert!(m.types.contains_key(*f), "family {f} missing from /metrics");
        assert!(m.helps.contains(*f), "family {f} has no HELP");
        assert!(
            m.samples
                .keys()
                .any(|(n, _)| family_of(n, &m.types) == Some(f)),
            "family {f} has no samples"
        );
    }
    assert_eq!(m.types["crossbar_connect_duration_seconds"], "histogram");
}

/// Every `crossbar_*` name in the dashboard and the alert rules is exported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_and_alerts_use_real_metrics() {
    let bed = Bed::start(None).await;
    let cfg = testbed::client_config(&bed.ca, Versions::Both, true).unwrap();
    testbed::get(bed.listen("puppet"), SNI, cfg, "/")
        .await
        .unwrap();
    let mut http = TcpStream::connect(bed.listen("plain")).await.unwrap();
    http.write_all(b"GET / HTTP/1.0\r\n\r\n").await.unwrap();
    let mut sink = Vec::new();
    tokio::io::AsyncReadExt::read_to_end(&mut http, &mut sink)
        .await
        .unwrap();
    // A refusal (no backend left) and a reload make their families appear.
    let a = call(
        bed.admin,
        Method::POST,
        "/api/backends/broken/gone/disable?force=true",
        None,
    )
    .await;
    assert_eq!(a.status, StatusCode::OK);
    let cfg = testbed::client_config(&bed.ca, Versions::Both, true).unwrap();
    assert!(testbed::get(bed.listen("broken"), SNI, cfg, "/")
        .await
        .is_err());
    let a = call(bed.admin, Method::POST, "/api/reload", None).await;
    assert_eq!(a.status, StatusCode::OK);
    let m = scrape(&bed).await;
    assert_eq!(
        m.get(
            "crossbar_route_refused_total",
            &[("service", "broken"), ("reason", "no_backend")]
        ),
        1.0
    );
    let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs");
    let dashboard = std::fs::read_to_string(docs.join("grafana-dashboard.json")).unwrap();
    let _: Value = serde_json::from_str(&dashboard).expect("dashboard is JSON");
    let alerts = std::fs::read_to_string(docs.join("prometheus-alerts.yaml")).unwrap();
    let _: serde_yaml::Value = serde_yaml::from_str(&alerts).expect("alerts are YAML");
    let metrics_md = std::fs::read_to_string(docs.join("metrics.md")).unwrap();
    for (file, text) in [
        ("grafana-dashboard.json", &dashboard),
        ("prometheus-alerts.yaml", &alerts),
        ("metrics.md", &metrics_md),
    ] {
        let names = metric_names(text);
        assert!(!names.is_empty(), "{file} uses no metric");
        // Discovery families exist only with `discover:` (a DNS server), load feedback
        // families only with `feedback:`, a backend's limit only with `max_connections`:
        // tests/discovery.rs, tests/feedback.rs and tests/balance.rs check those against
        // their own scrapes.
        for n in names.into_iter().filter(|n| {
            !n.starts_with("crossbar_discovery_")
                && !n.starts_with("crossbar_backend_feedback_")
                && n != "crossbar_backend_max_connections"
        }) {
            assert!(
                family_of(&n, &m.types).is_some(),
                "{file} uses {n}, which /metrics does not export"
            );
        }
    }
    // And the reference documents every family crossbar exports.
    for f in m.types.keys().filter(|f| f.starts_with("crossbar_")) {
        assert!(
            metrics_md.contains(f.as_str()),
            "docs/metrics.md misses {f}"
        );
    }
}

/// Run Prometheus's `promtool` (tests/run.sh installs it; without it the test fails).
fn promtool(args: &[&str]) -> std::process::Output {
    match Command::new("promtool").args(args).output() {
        Ok(out) => out,
        Err(e) => crossbar::testbed::missing_tool(
            "alert rule tests",
            &format!("promtool did not run: {e} (apt-get install prometheus)"),
        ),
    }
}

#[test]
fn alert_rules_pass_promtool_check_and_unit_tests() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let rules = root.join("docs/prometheus-alerts.yaml");
    let check = promtool(&["check", "rules", rules.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&check.stdout).into_owned();
    assert!(
        check.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&check.stderr)
    );
    let tests = root.join("tests/alerts/prometheus-alerts.test.yaml");
    let run = promtool(&["test", "rules", tests.to_str().unwrap()]);
    let out =
        String::from_utf8_lossy(&run.stdout).into_owned() + &String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{out}");
    assert!(out.contains("SUCCESS"), "{out}");
}

#[test]
fn the_dashboard_has_an_instance_variable_used_by_every_query() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("docs/grafana-dashboard.json")).unwrap();
    let dash: serde_json::Value = serde_json::from_str(&text).unwrap();
    let vars = dash["templating"]["list"].as_array().unwrap();
    assert!(
        vars.iter().any(|v| v["name"] == "instance"),
        "no instance variable"
    );
    let mut exprs = Vec::new();
    for panel in dash["panels"].as_array().unwrap() {
        for t in panel["targets"].as_array().into_iter().flatten() {
            exprs.push(t["expr"].as_str().unwrap_or_default().to_string());
        }
    }
    assert!(!exprs.is_empty());
    for e in exprs {
        // Every metric selector is scoped to the chosen instances.
        let selectors = e.matches("crossbar_").count() + e.matches("process_").count();
        let scoped = e.matches("instance=~\"$instance\"").count();
        assert_eq!(selectors, scoped, "unscoped selector in: {e}");
    }
}

/// `crossbar_[a-z0-9_]+` words of a text.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("crossbar_") {
        let boundary = rest[..i]
            .chars()
            .last()
            .map_or(true, |c| !(c.is_ascii_alphanumeric() || c == '_'));
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        if boundary {
            out.insert(tail[..end].to_string());
        }
        rest = &tail[end..];
    }
    out
}

/// While crossbar drains (shutdown begun), /healthz fails so that a keepalived
/// check moves the VIP away; the admin endpoint itself keeps answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_fails_while_draining() {
    let bed = Bed::start(None).await;
    assert_eq!(get(&bed, "/healthz").await.status, StatusCode::OK);
    let server = bed.xb.server.clone();
    let drain =
        tokio::spawn(async move { server.shutdown(std::time::Duration::from_secs(5)).await });
    let h = get(&bed, "/healthz").await;
    assert_eq!(h.status, StatusCode::SERVICE_UNAVAILABLE, "{}", h.body);
    assert!(h.body.contains("shutting down"), "{}", h.body);
    drain.await.unwrap();
}

/// An operator write once shutdown has begun is answered for what it is: 503, the
/// drain not applied because crossbar is shutting down; not a failed reload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_once_shutdown_began_says_it_was_not_applied() {
    let bed = Bed::start(None).await;
    let mut held = Held::open(&bed, "plain").await;
    let victim = held.who().await;
    let server = bed.xb.server.clone();
    let drain =
        tokio::spawn(async move { server.shutdown(std::time::Duration::from_secs(5)).await });
    common::wait_until("shutdown began", || bed.xb.is_draining()).await;
    let path = format!("/api/backends/plain/{victim}/drain");
    let a = call(bed.admin, Method::POST, &path, None).await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE, "{}", a.body);
    assert!(a.body.contains("drain not applied"), "{}", a.body);
    assert!(a.body.contains("shutting down"), "{}", a.body);
    assert!(!a.body.contains("reload failed"), "{}", a.body);
    let b = bed.xb.backend("plain", &victim);
    assert_eq!(b.state().as_str(), "up", "the drain was not applied");
    assert_eq!(held.who().await, victim, "the open connection goes on");
    drop(held);
    drain.await.unwrap();
}

/// With `admin.healthz_needs_backends`, /healthz fails (503, naming the service)
/// while a service has no backend that takes new connections, so keepalived moves
/// the VIP (HAProxy's `monitor fail if nbsrv lt 1`), and says ok again once one
/// does; without it, /healthz says ok over the same empty pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_can_need_a_backend_in_every_service() {
    for needs in [true, false] {
        let be = common::Backend::echo("e1", false).await;
        let yaml =
            common::one_service("", &[common::backend_line("e1", be.addr, "disabled: true")])
                .replace(
                    "admin: { enabled: false }",
                    &format!(
                        "admin: {{ listen: \"127.0.0.1:0\", healthz_needs_backends: {needs} }}"
                    ),
                );
        let cb = Crossbar::start(&yaml).await;
        let endpoint = cb.serve_admin(None).await;
        let h = call(endpoint.addr, Method::GET, "/healthz", None).await;
        if !needs {
            assert_eq!((h.status, h.body.as_str()), (StatusCode::OK, "ok\n"));
            continue;
        }
        assert_eq!(h.status, StatusCode::SERVICE_UNAVAILABLE, "{}", h.body);
        assert!(
            h.body.contains("svc") && h.body.contains("admin.healthz_needs_backends"),
            "{}",
            h.body
        );
        let e = call(
            endpoint.addr,
            Method::POST,
            "/api/backends/svc/e1/enable",
            None,
        )
        .await;
        assert_eq!(e.status, StatusCode::OK, "{}", e.body);
        let h = call(endpoint.addr, Method::GET, "/healthz", None).await;
        assert_eq!(
            (h.status, h.body.as_str()),
            (StatusCode::OK, "ok\n"),
            "after enable"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_and_services() {
    let bed = Bed::start(None).await;
    let h = get(&bed, "/healthz").await;
    assert_eq!((h.status, h.body.as_str()), (StatusCode::OK, "ok\n"));
    let a = get(&bed, "/api/services").await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.headers["content-type"], "application/json");
    let v = a.json();
    let services = v["services"].as_array().unwrap();
    let names: Vec<&str> = services
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["puppet", "plain", "broken"]);
    let puppet = &services[0];
    assert_eq!(puppet["mode"], "tls");
    assert_eq!(puppet["balance"], "roundrobin");
    assert_eq!(
        puppet["listeners"],
        serde_json::json!([bed.listen("puppet").to_string()])
    );
    assert_eq!(puppet["stick_table"]["capacity"], 1000);
    assert!(services[1]["stick_table"].is_null());
    let b1 = &puppet["backends"][0];
    assert_eq!(b1["name"], "b1");
    assert_eq!(b1["address"], bed._backends[0].addr.to_string());
    assert_eq!(b1["state"], "up");
    assert_eq!(b1["available"], true);
    assert_eq!(b1["active_connections"], 0);
    assert_eq!(b1["weight"], 1);
    assert_eq!(b1["backup"], false);
    // Nothing set by the operator: `null`, as docs/admin-api.md says (not absent).
    assert_eq!(b1.get("operator"), Some(&Value::Null), "{b1}");
    assert_eq!(puppet["backends"].as_array().unwrap().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_show_and_flush() {
    let bed = Bed::start(None).await;
    let agent = testbed::client_config(&bed.ca, Versions::Tls13, true).unwrap();
    for _ in 0..3 {
        testbed::get(bed.listen("puppet"), SNI, agent.clone(), "/")
            .await
            .unwrap();
    }
    let v = get(&bed, "/api/tables/puppet").await.json();
    assert_eq!(v["service"], "puppet");
    assert_eq!(v["limit"], admin::DEFAULT_TABLE_LIMIT);
    let entries = v["entries"].as_array().unwrap();
    assert_eq!(
        v["stats"]["entries"].as_u64().unwrap() as usize,
        entries.len()
    );
    assert!(entries.len() >= 3, "{v}");
    for e in entries {
        let kind = e["kind"].as_str().unwrap();
        assert!(["psk", "ticket_prefix", "source"].contains(&kind), "{e}");
        let key = e["key"].as_str().unwrap();
        assert!(
            key.len() == 16 && key.chars().all(|c| c.is_ascii_hexdigit()),
            "{e}"
        );
        assert!(e["backend"].is_string() || e["backend"].is_null());
        assert!(e["age_seconds"].is_u64() && e["expires_in_seconds"].is_u64());
    }
    assert!(entries.iter().any(|e| e["kind"] == "psk"));
    let one = get(&bed, "/api/tables/puppet?limit=1").await.json();
    assert_eq!(one["entries"].as_array().unwrap().len(), 1);
    for q in ["limit=0", "limit=100001", "limit=abc", "size=3"] {
        let a = get(&bed, &format!("/api/tables/puppet?{q}")).await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{q}");
        assert!(a.json()["error"].as_str().unwrap().contains("bad query"));
    }
    let f = call(bed.admin, Method::DELETE, "/api/tables/puppet", None).await;
    assert_eq!(f.status, StatusCode::OK);
    assert_eq!(f.json()["flushed"], v["stats"]["entries"]);
    let after = get(&bed, "/api/tables/puppet").await.json();
    assert_eq!(after["stats"]["entries"], 0);
    assert_eq!(after["entries"], serde_json::json!([]));
    // No table, no service.
    assert_eq!(
        get(&bed, "/api/tables/plain").await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        get(&bed, "/api/tables/nope").await.status,
        StatusCode::NOT_FOUND
    );
}

/// A table dump is capped: a limit over the cap is refused with a clear reason,
/// the cap itself is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_dumps_are_capped() {
    let bed = Bed::start(None).await;
    let limit = |n: usize| format!("/api/tables/puppet?limit={n}");
    let over = get(&bed, &limit(admin::MAX_TABLE_LIMIT + 1)).await;
    assert_eq!(over.status, StatusCode::BAD_REQUEST, "{}", over.body);
    assert!(over.body.contains("limit must be"), "{}", over.body);
    let old = get(&bed, &limit(100_000)).await;
    assert_eq!(
        old.status,
        StatusCode::BAD_REQUEST,
        "the old cap (100000) is refused now: {}",
        old.body
    );
    let at = get(&bed, &limit(admin::MAX_TABLE_LIMIT)).await;
    assert_eq!(at.status, StatusCode::OK, "{}", at.body);
}

/// A TLS connection kept open across API calls.
struct Held {
    sender: hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
}

impl Held {
    async fn open(bed: &Bed, service: &str) -> Held {
        let cfg = testbed::client_config(&bed.ca, Versions::Both, false).unwrap();
        let tcp = TcpStream::connect(bed.listen(service)).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from(SNI).unwrap();
        let tls = tokio_rustls::TlsConnector::from(cfg)
            .connect(name, tcp)
            .await
            .unwrap();
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .unwrap();
        tokio::spawn(conn);
        Held { sender }
    }

    async fn who(&mut self) -> String {
        let req = hyper::Request::get("/")
            .header("host", SNI)
            .body(Empty::new())
            .unwrap();
        let resp = self.sender.send_request(req).await.unwrap();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8_lossy(&body).trim().to_string()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_is_observed_in_routing() {
    let bed = Bed::start(None).await;
    let mut held = Held::open(&bed, "plain").await;
    let victim = held.who().await;
    let other = if victim == "p1" { "p2" } else { "p1" };
    let a = call(
        bed.admin,
        Method::POST,
        &format!("/api/backends/plain/{victim}/drain"),
        None,
    )
    .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    let v = a.json();
    assert_eq!(
        (v["state"].as_str(), v["active_connections"].as_u64()),
        (Some("drain"), Some(1))
    );
    for _ in 0..4 {
        assert_eq!(bed.once("plain").await, other);
    }
    // The connection that was open keeps working, on the drained backend.
    assert_eq!(held.who().await, victim);
    let s = get(&bed, "/api/services").await.json();
    let b = s["services"][1]["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["name"] == victim.as_str())
        .unwrap()
        .clone();
    assert_eq!(
        (b["state"].as_str(), b["available"].as_bool()),
        (Some("drain"), Some(false))
    );
    let m = scrape(&bed).await;
    let l = [("service", "plain"), ("backend", victim.as_str())];
    assert_eq!(m.get("crossbar_backend_up", &l), 0.0);
    assert_eq!(m.get("crossbar_active_connections", &l), 1.0);
    assert_eq!(
        m.get("crossbar_backend_state", &[l[0], l[1], ("state", "drain")]),
        1.0
    );
    let a = call(
        bed.admin,
        Method::POST,
        &format!("/api/backends/plain/{victim}/enable"),
        None,
    )
    .await;
    assert_eq!(a.json()["state"], "up");
    let back: BTreeSet<String> = [bed.once("plain").await, bed.once("plain").await].into();
    assert!(back.contains(&victim), "{back:?}");
    let d = call(
        bed.admin,
        Method::POST,
        &format!("/api/backends/plain/{victim}/disable"),
        None,
    )
    .await;
    assert_eq!(d.json()["state"], "disabled");
    for _ in 0..2 {
        assert_eq!(bed.once("plain").await, other);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_json_with_the_right_codes() {
    let bed = Bed::start(None).await;
    let cases: &[(Method, &str, StatusCode)] = &[
        (Method::GET, "/nope", StatusCode::NOT_FOUND),
        (Method::GET, "/api", StatusCode::NOT_FOUND),
        (Method::GET, "/api/tables/nope", StatusCode::NOT_FOUND),
        (
            Method::POST,
            "/api/backends/nope/b1/drain",
            StatusCode::NOT_FOUND,
        ),
        (
            Method::POST,
            "/api/backends/puppet/nope/drain",
            StatusCode::NOT_FOUND,
        ),
        (
            Method::POST,
            "/api/backends/puppet/b1/explode",
            StatusCode::NOT_FOUND,
        ),
        (Method::DELETE, "/api/tables/nope", StatusCode::NOT_FOUND),
        (Method::POST, "/metrics", StatusCode::METHOD_NOT_ALLOWED),
        (Method::GET, "/api/reload", StatusCode::METHOD_NOT_ALLOWED),
        (
            Method::GET,
            "/api/backends/puppet/b1/drain",
            StatusCode::METHOD_NOT_ALLOWED,
        ),
        (
            Method::PUT,
            "/api/tables/puppet",
            StatusCode::METHOD_NOT_ALLOWED,
        ),
    ];
    for (method, path, code) in cases {
        let a = call(bed.admin, method.clone(), path, None).await;
        assert_eq!(a.status, *code, "{method} {path}: {}", a.body);
        assert!(a.json()["error"].is_string(), "{method} {path}");
    }
    let a = call(bed.admin, Method::PUT, "/api/tables/puppet", None).await;
    assert_eq!(a.headers["allow"], "GET, DELETE");
    let a = call(bed.admin, Method::GET, "/api/reload", None).await;
    assert_eq!(a.headers["allow"], "POST");
    let big = Bytes::from(vec![b'x'; 2048]);
    let a = call_with_body(bed.admin, Method::POST, "/api/reload", None, big).await;
    assert_eq!(a.status, StatusCode::PAYLOAD_TOO_LARGE);
    // Reload through the API re-reads the file: fine as is, refused when broken.
    let a = call(bed.admin, Method::POST, "/api/reload", None).await;
    assert_eq!(
        (a.status, a.json()["reloaded"].as_bool()),
        (StatusCode::OK, Some(true))
    );
    let path = bed.xb.dir().join("crossbar.yaml");
    let good = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, "services: {}\nbogus: 1\n").unwrap();
    let a = call(bed.admin, Method::POST, "/api/reload", None).await;
    assert_eq!(a.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", a.body);
    assert!(a.json()["error"]
        .as_str()
        .unwrap()
        .contains("reload failed"));
    std::fs::write(&path, good).unwrap();
    let m = scrape(&bed).await;
    assert_eq!(
        m.get("crossbar_config_reloads_total", &[("result", "ok")]),
        1.0
    );
    assert_eq!(
        m.get("crossbar_config_reloads_total", &[("result", "error")]),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_need_the_token() {
    let bed = Bed::start(Some("s3cret-token")).await;
    let path = "/api/backends/plain/p1/drain";
    let none = call(bed.admin, Method::POST, path, None).await;
    assert_eq!(none.status, StatusCode::UNAUTHORIZED);
    assert_eq!(none.headers["www-authenticate"], "Bearer");
    assert!(none.json()["error"].is_string());
    let wrong = call(bed.admin, Method::POST, path, Some("s3cret-tokem")).await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    let short = call(
        bed.admin,
        Method::DELETE,
        "/api/tables/puppet",
        Some("s3cret"),
    )
    .await;
    assert_eq!(short.status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        bed.xb
            .server
            .service("plain")
            .unwrap()
            .pool
            .get("p1")
            .unwrap()
            .state()
            .as_str(),
        "up"
    );
    let right = call(bed.admin, Method::POST, path, Some("s3cret-token")).await;
    assert_eq!(right.status, StatusCode::OK, "{}", right.body);
    assert_eq!(
        bed.xb
            .server
            .service("plain")
            .unwrap()
            .pool
            .get("p1")
            .unwrap()
            .state()
            .as_str(),
        "drain"
    );
    // Reads stay open.
    assert_eq!(get(&bed, "/api/services").await.status, StatusCode::OK);
    assert_eq!(get(&bed, "/metrics").await.status, StatusCode::OK);
    // A token file that is empty or missing is refused.
    let empty = bed.xb.dir().join("empty.token");
    std::fs::write(&empty, " \n").unwrap();
    assert!(admin::Secret::from_file(&empty).is_err());
    assert!(admin::Secret::from_file(&bed.xb.dir().join("missing")).is_err());
}

/// Run the `crossbar` binary with arguments; (exit ok, stdout, stderr).
async fn cli(args: Vec<String>) -> (bool, String, String) {
    common::crossbar_cli(args).await
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_end_to_end() {
    let bed = Bed::start(Some("cli-token")).await;
    let url = bed.url();
    let token = bed.token_file().display().to_string();

    let (ok, out, err) = cli(args(&["status", "--admin", &url])).await;
    assert!(ok, "{err}");
    assert!(
        out.contains(&format!(
            "puppet (tls, roundrobin) on {}",
            bed.listen("puppet")
        )),
        "{out}"
    );
    let header = out.lines().find(|l| l.contains("BACKEND")).unwrap();
    assert_eq!(
        header.split_whitespace().collect::<Vec<_>>(),
        [
            "BACKEND",
            "ADDRESS",
            "STATE",
            "ACTIVE/LIMIT",
            "WEIGHT",
            "BACKUP",
            "FROM",
            "HEALTH",
            "FOR",
            "LAST",
            "CHECK"
        ]
    );
    let p1 = out
        .lines()
        .find(|l| l.trim_start().starts_with("p1 "))
        .unwrap();
    assert_eq!(p1.split_whitespace().nth(2), Some("up"), "{out}");

    let (ok, out, _) = cli(args(&["status", "--admin", &url, "--json"])).await;
    assert!(ok);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["services"].as_array().unwrap().len(), 3);

    // A write without the token fails with the server's error, exit 1.
    let (ok, _, err) = cli(args(&["backend", "drain", "plain/p1", "--admin", &url])).await;
    assert!(!ok);
    assert!(err.contains("401") && err.contains("Bearer"), "{err}");
    let (ok, _, err) = cli(args(&[
        "backend", "drain", "plain/p1", "--admin", &url, "--json",
    ]))
    .await;
    assert!(!ok);
    let e: Value = serde_json::from_str(&err).unwrap();
    assert!(e["error"].is_string());

    let (ok, out, err) = cli(args(&[
        "backend",
        "drain",
        "plain/p1",
        "--admin",
        &url,
        "--token-file",
        &token,
    ]))
    .await;
    assert!(ok, "{err}");
    assert_eq!(out, "plain/p1: drain (0 active connections)\n");
    assert_eq!(
        bed.xb
            .server
            .service("plain")
            .unwrap()
            .pool
            .get("p1")
            .unwrap()
            .state()
            .as_str(),
        "drain"
    );
    for _ in 0..3 {
        assert_eq!(bed.once("plain").await, "p2");
    }
    let (ok, _, err) = cli(args(&[
        "backend",
        "enable",
        "plain/nope",
        "--admin",
        &url,
        "--token-file",
        &token,
    ]))
    .await;
    assert!(!ok);
    assert!(
        err.contains("404") && err.contains("unknown backend"),
        "{err}"
    );

    let agent = testbed::client_config(&bed.ca, Versions::Tls13, true).unwrap();
    for _ in 0..2 {
        testbed::get(bed.listen("puppet"), SNI, agent.clone(), "/")
            .await
            .unwrap();
    }
    let (ok, out, err) = cli(args(&[
        "table", "show", "puppet", "--limit", "50", "--admin", &url,
    ]))
    .await;
    assert!(ok, "{err}");
    let mut lines = out.lines();
    assert!(lines.next().unwrap().starts_with("puppet: "), "{out}");
    assert_eq!(
        lines.next().unwrap().split_whitespace().collect::<Vec<_>>(),
        ["KIND", "KEY", "BACKEND", "AGE", "EXPIRES", "IN", "CLIENT"]
    );
    assert!(out.contains("psk"), "{out}");
    let (ok, out, _) = cli(args(&[
        "table",
        "flush",
        "puppet",
        "--admin",
        &url,
        "--token-file",
        &token,
    ]))
    .await;
    assert!(ok);
    assert!(out.starts_with("puppet: flushed "), "{out}");
    let (ok, _, err) = cli(args(&["table", "show", "nope", "--admin", &url])).await;
    assert!(!ok);
    assert!(err.contains("unknown service"), "{err}");

    // Environment variables stand in for the flags.
    let (ok, out, err) = tokio::task::spawn_blocking({
        let (url, token) = (url.clone(), token.clone());
        move || {
            let o = std::process::Command::new(env!("CARGO_BIN_EXE_crossbar"))
                .args(["reload"])
                .env("CROSSBAR_ADMIN", url)
                .env("CROSSBAR_TOKEN_FILE", token)
                .output()
                .unwrap();
            (
                o.status.success(),
                String::from_utf8_lossy(&o.stdout).into_owned(),
                String::from_utf8_lossy(&o.stderr).into_owned(),
            )
        }
    })
    .await
    .unwrap();
    assert!(ok, "{err}");
    // The same file again: nothing to commit, and the drain set above is kept.
    assert_eq!(
        out,
        "reloaded: the file is the configuration in force, nothing changed\nkept: plain/p1 drain\n"
    );

    // Nothing listening: a clear transport error.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let (ok, _, err) = cli(args(&["status", "--admin", &format!("http://{dead}")])).await;
    assert!(!ok);
    assert!(err.contains("connect"), "{err}");
}

// ---------------------------------------------------------------------------
// Browsers: cross-site writes and DNS rebinding

/// One request with exactly `headers` (no Host unless one is given) and `body`.
async fn send(
    addr: SocketAddr,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    let body = Bytes::copy_from_slice(body.as_bytes());
    exchange(addr, method, path, headers, body).await
}

/// A request a web page can make a browser send, and the refusal it must get:
/// (what, method, path, headers, body, the `reason` label it is counted under).
type Attack<'a> = (
    &'a str,
    Method,
    &'a str,
    Vec<(&'a str, &'a str)>,
    &'a str,
    &'a str,
);

/// What a web page can make an operator's browser send to the admin endpoint
/// (no token file: writes rely on the loopback rule): a form post, a no-cors
/// fetch, a DNS-rebound page reading /api and writing. Each is refused with 403
/// and counted, the backend's state and the configuration stay as they were,
/// and the refusals are logged (throttled).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_site_and_rebound_requests_are_refused() {
    let log = common::LogBuffer::install();
    let started = std::time::Instant::now();
    let bed = Bed::start(None).await;
    let own = bed.admin.to_string();
    let rebound = format!("attacker.example:{}", bed.admin.port());
    let disable = "/api/backends/puppet/b1/disable";
    let form = "application/x-www-form-urlencoded";
    let attacks: Vec<Attack> = vec![
        (
            "a form post from another site (a modern browser's headers)",
            Method::POST,
            disable,
            vec![
                ("host", &own),
                ("origin", "http://evil.example"),
                ("sec-fetch-site", "cross-site"),
                ("content-type", form),
            ],
            "x=1",
            "fetch_site",
        ),
        (
            "Origin of another site",
            Method::POST,
            disable,
            vec![("host", &own), ("origin", "http://evil.example")],
            "",
            "origin",
        ),
        (
            "Origin null (a sandboxed frame, a redirect)",
            Method::POST,
            disable,
            vec![("host", &own), ("origin", "null")],
            "",
            "origin",
        ),
        (
            "Referer of another site, no Origin",
            Method::DELETE,
            "/api/tables/puppet",
            vec![("host", &own), ("referer", "http://evil.example/page.html")],
            "",
            "origin",
        ),
        (
            "a form body without Origin or Referer (an old browser)",
            Method::POST,
            disable,
            vec![("host", &own), ("content-type", form)],
            "x=1",
            "form_content_type",
        ),
        (
            "a text/plain no-cors fetch",
            Method::POST,
            disable,
            vec![("host", &own), ("content-type", "text/plain;charset=UTF-8")],
            "{}",
            "form_content_type",
        ),
        (
            "Sec-Fetch-Site cross-site alone",
            Method::POST,
            disable,
            vec![("host", &own), ("sec-fetch-site", "cross-site")],
            "",
            "fetch_site",
        ),
        (
            "a rebound page's write",
            Method::POST,
            "/api/reload",
            vec![("host", &rebound), ("origin", "http://attacker.example")],
            "",
            "host",
        ),
        (
            "a rebound page's write, same-origin as far as the browser knows",
            Method::POST,
            disable,
            vec![
                ("host", "attacker.example"),
                ("origin", "http://attacker.example"),
                ("sec-fetch-site", "same-origin"),
            ],
            "",
            "host",
        ),
        (
            "a rebound page reading the topology",
            Method::GET,
            "/api/services",
            vec![("host", &rebound)],
            "",
            "host",
        ),
        (
            "a rebound page reading the status page",
            Method::GET,
            "/",
            vec![("host", &rebound)],
            "",
            "host",
        ),
    ];
    let reloads = || {
        bed.xb
            .metric("crossbar_config_reloads_total", &[("result", "ok")])
    };
    let mut expected: BTreeMap<&str, f64> = BTreeMap::new();
    for (what, method, path, headers, body, reason) in &attacks {
        let a = send(bed.admin, method.clone(), path, headers, body).await;
        assert_eq!(a.status, StatusCode::FORBIDDEN, "{what}: {}", a.body);
        let msg = a.json()["error"].as_str().unwrap().to_string();
        assert!(msg.contains("guard"), "{what}: {msg}");
        assert!(
            !a.body.contains("b1"),
            "{what} leaked the topology: {}",
            a.body
        );
        *expected.entry(reason).or_default() += 1.0;
        assert_eq!(
            bed.xb.backend("puppet", "b1").state().as_str(),
            "up",
            "{what}"
        );
        assert_eq!(reloads(), 0.0, "{what}");
    }
    for (reason, n) in &expected {
        assert_eq!(
            bed.xb.metric(
                "crossbar_admin_requests_refused_total",
                &[("reason", reason)]
            ),
            *n,
            "{reason}"
        );
    }
    // Refusals are logged, one line per interval however many there are.
    let lines = log.count("admin: request refused");
    let bound = 1 + (started.elapsed().as_secs() / admin::WARN_INTERVAL.as_secs()) as usize;
    assert!(
        (1..=bound).contains(&lines),
        "{lines} warnings for {} refusals",
        attacks.len()
    );
}

/// The ways an operator uses the endpoint keep working: the `crossbar` CLI, a
/// same-origin page's own write, and a browser through `ssh -L` (Host
/// `localhost:<any port>`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_same_origin_pages_and_ssh_tunnels_still_work() {
    let bed = Bed::start(None).await;
    let url = bed.url();
    let state = || bed.xb.backend("puppet", "b1").state().as_str();
    let (ok, out, err) = cli(args(&["backend", "disable", "puppet/b1", "--admin", &url])).await;
    assert!(ok, "{err}");
    assert_eq!(out, "puppet/b1: disabled (0 active connections)\n");
    assert_eq!(state(), "disabled");
    let (ok, _, err) = cli(args(&["status", "--admin", &url])).await;
    assert!(ok, "{err}");

    // A page served by this endpoint writing to it (what a button would send).
    let own = bed.admin.to_string();
    let origin = format!("http://{own}");
    let a = send(
        bed.admin,
        Method::POST,
        "/api/backends/puppet/b1/enable",
        &[
            ("host", &own),
            ("origin", &origin),
            ("referer", &format!("{origin}/")),
            ("sec-fetch-site", "same-origin"),
            ("content-type", "application/json"),
        ],
        "",
    )
    .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    assert_eq!(state(), "up");

    // `ssh -L 8140:127.0.0.1:9140`-style: the browser says localhost and its own port.
    let tunnel = format!("localhost:{}", bed.admin.port() ^ 1);
    let page = send(
        bed.admin,
        Method::GET,
        "/",
        &[("host", &tunnel), ("sec-fetch-site", "none")],
        "",
    )
    .await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(page.body.contains("puppet"), "{}", page.body);
    let api = send(
        bed.admin,
        Method::GET,
        "/api/services",
        &[("host", &tunnel)],
        "",
    )
    .await;
    assert_eq!(api.status, StatusCode::OK, "{}", api.body);
    let tunnel_origin = format!("http://{tunnel}");
    let a = send(
        bed.admin,
        Method::POST,
        "/api/backends/puppet/b1/drain",
        &[
            ("host", &tunnel),
            ("origin", &tunnel_origin),
            ("sec-fetch-site", "same-origin"),
        ],
        "",
    )
    .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    assert_eq!(state(), "drain");
    // A client without any of these headers (curl, scripts) is not a browser's.
    let a = send(
        bed.admin,
        Method::POST,
        "/api/backends/puppet/b1/enable",
        &[],
        "",
    )
    .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    assert_eq!(state(), "up");
    for reason in crossbar::metrics::ADMIN_REFUSED_REASONS {
        assert_eq!(
            bed.xb.metric(
                "crossbar_admin_requests_refused_total",
                &[("reason", reason)]
            ),
            0.0,
            "{reason}"
        );
    }
}

/// `admin.allowed_hosts` adds names (and addresses) a request's Host may give,
/// e.g. the name Prometheus scrapes by; other names stay refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_hosts_are_answered() {
    let yaml = common::one_service("", &[common::backend_line("b", refusing_addr(), "")]).replace(
        "admin: { enabled: false }",
        "admin: { listen: \"127.0.0.1:9140\", allowed_hosts: [LB1.example.com, \"192.0.2.7\"] }",
    );
    let xb = Crossbar::start(&yaml).await;
    let endpoint = xb.serve_admin(None).await;
    for (host, status) in [
        ("lb1.example.com:9140", StatusCode::OK),
        ("LB1.EXAMPLE.COM", StatusCode::OK),
        ("192.0.2.7:80", StatusCode::OK),
        ("lb2.example.com:9140", StatusCode::FORBIDDEN),
        ("192.0.2.8", StatusCode::FORBIDDEN),
    ] {
        let a = send(
            endpoint.addr,
            Method::GET,
            "/api/services",
            &[("host", host)],
            "",
        )
        .await;
        assert_eq!(a.status, status, "Host {host}: {}", a.body);
        // The monitoring endpoints answer any Host: Prometheus scrapes by name.
        for path in ["/metrics", "/healthz"] {
            let m = send(endpoint.addr, Method::GET, path, &[("host", host)], "").await;
            assert_eq!(
                m.status,
                StatusCode::OK,
                "{path} with Host {host}: {}",
                m.body
            );
        }
    }
}

// ---------------------------------------------------------------------------
// Idle connections

/// Silent connections opened beyond every slot (regular and reserved), more and
/// more of them: /healthz answers every time (the oldest connection that has not
/// sent a request makes room), every connection closed that way is counted, and
/// the warning about it is one line per interval, not one per connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_never_lock_out_health_checks() {
    const ROUNDS: usize = 20;
    const PER_ROUND: usize = 10;
    let log = common::LogBuffer::install();
    let started = std::time::Instant::now();
    let xb = Crossbar::start(&common::one_service(
        "",
        &[common::backend_line("b", refusing_addr(), "")],
    ))
    .await;
    let endpoint = xb.serve_admin(None).await;
    let mut silent = Vec::new();
    for _ in 0..admin::MAX_CONNECTIONS + admin::RESERVED_CONNECTIONS {
        silent.push(TcpStream::connect(endpoint.addr).await.unwrap());
    }
    let healthz = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    for round in 0..ROUNDS {
        for _ in 0..PER_ROUND {
            silent.push(TcpStream::connect(endpoint.addr).await.unwrap());
        }
        let (status, body) = common::raw_request(endpoint.addr, healthz, common::WAIT).await;
        assert_eq!(status, Some(200), "round {round}: {body}");
    }
    // Each silent connection beyond the slots pushed out an older one, except
    // where a health check's connection had just closed and left its slot free.
    let evicted = xb.metric("crossbar_admin_connections_evicted_total", &[]);
    assert!(
        evicted >= (ROUNDS * (PER_ROUND - 1)) as f64,
        "{evicted} connections made room"
    );
    let lines = log.count("closed the oldest one without a request in progress");
    let bound = 1 + (started.elapsed().as_secs() / admin::WARN_INTERVAL.as_secs()) as usize;
    assert!(
        (1..=bound).contains(&lines),
        "{lines} warnings for {evicted} connections closed"
    );
    assert!(
        !log.contains("every connection slot holds a request"),
        "none refused"
    );
    drop(silent);
}

// ---------------------------------------------------------------------------
// What an operator coming from HAProxy expects of the CLI and API

/// The state of `service/backend` as crossbar holds it.
fn state(bed: &Bed, service: &str, backend: &str) -> &'static str {
    bed.xb.backend(service, backend).state().as_str()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn taking_out_the_last_available_backend_needs_force() {
    let bed = Bed::start(None).await;
    let admin = bed.admin;
    let post = |path: String| async move { call(admin, Method::POST, &path, None).await };
    // `broken` has one backend (no health check: it counts as up).
    for action in ["drain", "disable"] {
        let a = post(format!("/api/backends/broken/gone/{action}")).await;
        assert_eq!(a.status, StatusCode::CONFLICT, "{}", a.body);
        let e = a.json()["error"].as_str().unwrap().to_string();
        assert!(
            e.contains(
                "gone is the last available backend of service \"broken\" (its only backend)"
            ) && e.contains(&format!("to {action} it leaves no backend"))
                && e.contains("force=true")
                && e.contains(&format!("crossbar backend {action} --force")),
            "{e}"
        );
        assert_eq!(state(&bed, "broken", "gone"), "up");
    }
    let a = post("/api/backends/broken/gone/drain?force=true".into()).await;
    assert_eq!(
        (a.status, a.json()["state"].as_str()),
        (StatusCode::OK, Some("drain"))
    );
    // Enabling is never refused; `force=false` is no force.
    let a = post("/api/backends/broken/gone/enable".into()).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    let a = post("/api/backends/broken/gone/disable?force=false".into()).await;
    assert_eq!(a.status, StatusCode::CONFLICT, "{}", a.body);
    let a = post("/api/backends/broken/gone/disable?force=maybe".into()).await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST, "{}", a.body);
    let a = post("/api/backends/broken/gone/disable?forse=1".into()).await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST, "{}", a.body);
    assert_eq!(state(&bed, "broken", "gone"), "up");

    // Two backends: the first goes, the second is then the last one.
    let a = post("/api/backends/plain/p1/drain".into()).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    let a = post("/api/backends/plain/p2/disable".into()).await;
    assert_eq!(a.status, StatusCode::CONFLICT, "{}", a.body);
    assert!(
        a.json()["error"]
            .as_str()
            .unwrap()
            .contains("p2 is the last available backend of service \"plain\" (others: p1 drain)"),
        "{}",
        a.body
    );
    assert_eq!(state(&bed, "plain", "p2"), "up");
    assert_eq!(bed.once("plain").await, "p2");
    // Re-draining a backend already out of rotation is no loss.
    let a = post("/api/backends/plain/p1/disable".into()).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    let a = post("/api/backends/plain/p1/enable".into()).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    let a = post("/api/backends/plain/p2/disable".into()).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    assert_eq!(bed.once("plain").await, "p1");
}

/// A full TLS 1.3 handshake and one request from the loopback address `from`, with a
/// fresh session cache; the backend that answered.
async fn agent_from(bed: &Bed, from: std::net::IpAddr) -> String {
    let cfg = testbed::client_config(&bed.ca, Versions::Tls13, true).unwrap();
    let tcp = common::connect_from(from, bed.listen("puppet")).await;
    let name = rustls::pki_types::ServerName::try_from(SNI).unwrap();
    let tls = tokio_rustls::TlsConnector::from(cfg)
        .connect(name, tcp)
        .await
        .unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    let driver = tokio::spawn(conn);
    let req = hyper::Request::get("/")
        .header("host", SNI)
        .body(Empty::<Bytes>::new())
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    driver.abort();
    String::from_utf8_lossy(&body).trim().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stick_entries_are_looked_up_and_deleted_by_client_and_by_key() {
    let bed = Bed::start(None).await;
    let (a, b): (std::net::IpAddr, std::net::IpAddr) =
        ("127.0.0.2".parse().unwrap(), "127.0.0.3".parse().unwrap());
    let on_a = agent_from(&bed, a).await;
    let on_b = agent_from(&bed, b).await;
    let table = |q: String| {
        let admin = bed.admin;
        async move { call(admin, Method::GET, &format!("/api/tables/puppet{q}"), None).await }
    };
    let delete = |q: &str| {
        let (admin, path) = (bed.admin, format!("/api/tables/puppet?{q}"));
        async move { call(admin, Method::DELETE, &path, None).await }
    };

    // By client: the resume hint each agent's full handshake left, on its backend.
    for (ip, backend) in [(a, &on_a), (b, &on_b)] {
        let v = table(format!("?client={ip}")).await.json();
        assert_eq!(v["lookup"]["client"], ip.to_string(), "{v}");
        assert_eq!(v["lookup"]["prefix"], format!("{ip}/32"), "{v}");
        let entries = v["entries"].as_array().unwrap();
        assert_eq!(entries.len(), 1, "{v}");
        assert_eq!(entries[0]["kind"], "source", "{v}");
        assert_eq!(entries[0]["backend"], backend.as_str(), "{v}");
    }
    let v = table("?client=127.0.0.9".into()).await.json();
    assert_eq!(v["entries"], serde_json::json!([]), "{v}");
    let a6 = table("?client=::ffff:127.0.0.2".into()).await.json();
    assert_eq!(a6["entries"].as_array().unwrap().len(), 1, "{a6}");

    // By key: an entry `table show` lists is found by its key alone.
    let all = table(String::new()).await.json();
    let before = all["stats"]["entries"].as_u64().unwrap();
    // (A full TLS 1.3 handshake teaches the ticket-key prefix of the backend.)
    let prefix = all["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "ticket_prefix")
        .unwrap_or_else(|| panic!("no ticket_prefix entry: {all}"))
        .clone();
    let key = prefix["key"].as_str().unwrap().to_string();
    let v = table(format!("?key={key}")).await.json();
    assert_eq!(v["entries"].as_array().unwrap().len(), 1, "{v}");
    for field in ["kind", "key", "backend"] {
        assert_eq!(v["entries"][0][field], prefix[field], "{v}");
    }

    // A typo on a DELETE is refused, not taken for "flush everything".
    let typo = delete(&format!("kye={key}")).await;
    assert_eq!(typo.status, StatusCode::BAD_REQUEST, "{}", typo.body);
    let both = delete(&format!("key={key}&client={a}")).await;
    assert_eq!(both.status, StatusCode::BAD_REQUEST, "{}", both.body);
    assert_eq!(
        table(String::new()).await.json()["stats"]["entries"],
        before
    );

    // Deleting one entry by key removes it alone.
    let d = delete(&format!("key={key}")).await;
    assert_eq!(d.status, StatusCode::OK, "{}", d.body);
    assert_eq!(d.json()["deleted"][0]["key"], key.as_str());
    assert_eq!(d.json()["deleted"][0]["kind"], "ticket_prefix");
    let v = table(format!("?key={key}")).await.json();
    assert_eq!(v["entries"], serde_json::json!([]), "{v}");
    assert_eq!(v["stats"]["entries"], before - 1);
    let again = delete(&format!("key={key}")).await;
    assert_eq!(again.status, StatusCode::NOT_FOUND, "{}", again.body);
    assert!(again.json()["error"].as_str().unwrap().contains(&format!(
        "no stick entry of service \"puppet\" for key {key}"
    )));

    // Deleting by client removes that client's entry, not the other's.
    let d = delete(&format!("client={a}")).await;
    assert_eq!(d.status, StatusCode::OK, "{}", d.body);
    assert_eq!(d.json()["deleted"][0]["kind"], "source");
    assert_eq!(d.json()["deleted"][0]["backend"], on_a.as_str());
    let gone = table(format!("?client={a}")).await.json();
    assert_eq!(gone["entries"], serde_json::json!([]), "{gone}");
    let kept = table(format!("?client={b}")).await.json();
    assert_eq!(kept["entries"].as_array().unwrap().len(), 1, "{kept}");
    assert_eq!(kept["stats"]["entries"], before - 2);
    let again = delete(&format!("client={a}")).await;
    assert_eq!(again.status, StatusCode::NOT_FOUND, "{}", again.body);
    for q in [
        "?key=xyz",
        "?client=host",
        "?client=127.0.0.2:80",
        "?key=12",
    ] {
        assert_eq!(table(q.into()).await.status, StatusCode::BAD_REQUEST, "{q}");
    }
    // No table, no lookup.
    let a = call(
        bed.admin,
        Method::GET,
        "/api/tables/plain?client=127.0.0.1",
        None,
    )
    .await;
    assert_eq!(a.status, StatusCode::NOT_FOUND);
}

/// `GET /api/connections` with a query, as JSON.
async fn open_connections(admin: SocketAddr, query: &str) -> Value {
    let a = call(
        admin,
        Method::GET,
        &format!("/api/connections{query}"),
        None,
    )
    .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    a.json()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_connections_are_listed_with_their_backend_and_bytes() {
    use tokio::io::AsyncReadExt;
    let echo = common::Backend::echo("e1", false).await;
    let xb = Crossbar::start(&format!(
        "admin: {{ enabled: false }}\ndefaults:\n  health: {{ check: none }}\n\
         services:\n  raw:\n    mode: tcp\n    listen: [\"127.0.0.1:0\"]\n    backends:\n      \
         - {{ name: e1, address: \"{}\" }}\n",
        echo.addr
    ))
    .await;
    let endpoint = xb.serve_admin(None).await;
    let admin = endpoint.addr;
    assert_eq!(open_connections(admin, "").await["total"], 0);

    // Three connections; the first moves 1000 bytes each way.
    let mut first = TcpStream::connect(xb.addr("raw")).await.unwrap();
    let data = common::payload(1000, 7);
    first.write_all(&data).await.unwrap();
    let mut back = vec![0u8; data.len()];
    first.read_exact(&mut back).await.unwrap();
    assert_eq!(back, data);
    let mut others = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(xb.addr("raw")).await.unwrap();
        s.write_all(b"x").await.unwrap();
        let mut one = [0u8; 1];
        s.read_exact(&mut one).await.unwrap();
        others.push(s);
    }
    let local = first.local_addr().unwrap().to_string();
    // The relay counts a byte just after writing it on: wait until the echo's last is.
    let svc = xb.server.service("raw").unwrap();
    common::wait_until("the echo counted", || {
        let (oldest, _) = svc.connections.oldest(1, |_| true);
        oldest[0]
            .bytes
            .s2c
            .load(std::sync::atomic::Ordering::Relaxed)
            == 1000
    })
    .await;
    let v = open_connections(admin, "?service=raw&limit=1").await;
    assert_eq!(v["total"], 3, "{v}");
    assert_eq!(v["limit"], 1, "{v}");
    let list = v["connections"].as_array().unwrap();
    assert_eq!(list.len(), 1, "{v}");
    let c = &list[0];
    // The oldest first: the one that moved the payload.
    assert_eq!(c["client"], local.as_str(), "{v}");
    assert_eq!(c["service"], "raw");
    assert_eq!(c["backend"], "e1");
    assert_eq!(c["state"], "relaying");
    assert_eq!(c["bytes"]["client_to_server"], 1000, "{v}");
    assert_eq!(c["bytes"]["server_to_client"], 1000, "{v}");
    assert!(c["age_seconds"].is_u64() && c["since"].is_string(), "{v}");
    let all = open_connections(admin, "").await;
    assert_eq!(all["connections"].as_array().unwrap().len(), 3, "{all}");
    assert_eq!(all["limit"], admin::DEFAULT_CONNECTIONS_LIMIT);
    let mine = open_connections(admin, "?client=127.0.0.1").await;
    assert_eq!(mine["total"], 3, "{mine}");
    let none = open_connections(admin, "?client=127.0.0.9").await;
    assert_eq!(
        (
            none["total"].as_u64(),
            none["connections"].as_array().map(Vec::len)
        ),
        (Some(0), Some(0))
    );
    for q in ["?service=nope"] {
        let a = call(admin, Method::GET, &format!("/api/connections{q}"), None).await;
        assert_eq!(a.status, StatusCode::NOT_FOUND, "{q}");
    }
    for q in ["?limit=0", "?backend=e1", "?client=x"] {
        let a = call(admin, Method::GET, &format!("/api/connections{q}"), None).await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{q}");
    }

    // Closed, it is gone (the others stay).
    drop(first);
    common::wait_until("the closed connection unlisted", || {
        svc.connections.len() == 2
    })
    .await;
    let v = open_connections(admin, "").await;
    assert_eq!(v["total"], 2, "{v}");
    assert!(
        v["connections"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["client"] != local.as_str()),
        "{v}"
    );
    drop(others);
    common::wait_until("every connection unlisted", || svc.connections.is_empty()).await;
    assert_eq!(open_connections(admin, "").await["total"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_connection_is_listed_on_the_backend_that_answers_it() {
    let bed = Bed::start(None).await;
    let mut held = Held::open(&bed, "plain").await;
    let backend = held.who().await;
    let v = open_connections(bed.admin, "?service=plain").await;
    assert_eq!(v["total"], 1, "{v}");
    let c = &v["connections"][0];
    assert_eq!(c["backend"], backend.as_str(), "{v}");
    assert_eq!(c["state"], "relaying", "{v}");
    // At least the ClientHello went one way and a certificate the other.
    assert!(
        c["bytes"]["client_to_server"].as_u64().unwrap() > 200,
        "{v}"
    );
    assert!(
        c["bytes"]["server_to_client"].as_u64().unwrap() > 500,
        "{v}"
    );
    assert_eq!(
        open_connections(bed.admin, "?service=puppet").await["total"],
        0
    );
    drop(held);
    common::wait_until("the TLS connection unlisted", || {
        bed.xb
            .server
            .service("plain")
            .unwrap()
            .connections
            .is_empty()
    })
    .await;
}

/// A config file for the CLI's `-c`: its admin endpoint is `admin` (with the
/// token file `token`, if any); its one service is never started.
fn cli_config(dir: &Path, admin: SocketAddr, token: Option<&Path>) -> PathBuf {
    let path = dir.join("cli.yaml");
    let token = token.map_or(String::new(), |t| {
        format!(", token_file: \"{}\"", t.display())
    });
    std::fs::write(
        &path,
        format!(
            "admin: {{ listen: \"{admin}\"{token} }}\nservices:\n  s:\n    listen: [\"127.0.0.1:0\"]\n    \
             backends:\n      - {{ name: a, address: \"127.0.0.1:1\" }}\n"
        ),
    )
    .unwrap();
    path
}

/// `crossbar ARGS` with `config` installed at the default path,
/// /etc/crossbar/crossbar.yaml, in a private mount namespace (`unshare -m`, root):
/// /etc is overlaid with a tmpfs upper layer in `scratch`, so nothing on the host
/// changes; (exit ok, stdout, stderr).
async fn cli_with_default_config(
    scratch: &Path,
    config: &Path,
    cmd: &[&str],
) -> (bool, String, String) {
    let script = r#"mount -t tmpfs none "$0" && mkdir "$0/up" "$0/work" &&
        mount -t overlay overlay -o "lowerdir=/etc,upperdir=$0/up,workdir=$0/work" /etc &&
        mkdir -p /etc/crossbar && cp "$1" /etc/crossbar/crossbar.yaml && shift && exec "$@""#;
    std::fs::create_dir_all(scratch).unwrap();
    let mut list = vec![
        "-m".to_string(),
        "sh".into(),
        "-c".into(),
        script.into(),
        scratch.display().to_string(),
        config.display().to_string(),
        env!("CARGO_BIN_EXE_crossbar").into(),
    ];
    list.extend(cmd.iter().map(|s| s.to_string()));
    tokio::task::spawn_blocking(move || {
        let out = Command::new("unshare")
            .args(&list)
            .env_remove("CROSSBAR_ADMIN")
            .env_remove("CROSSBAR_TOKEN_FILE")
            .output()
            .expect("unshare (util-linux) runs");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    })
    .await
    .expect("the CLI's thread")
}

/// Without -c, the admin commands read the config `check` and `run` read,
/// /etc/crossbar/crossbar.yaml, for the admin address and the token; when the
/// token is refused or nothing answers, the error names that file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_without_c_reads_the_default_config() {
    let bed = Bed::start(Some("cli-token")).await;
    let dir = bed.xb.dir();
    let file = cli_config(dir, bed.admin, Some(&bed.token_file()));
    let scratch = dir.join("ns");
    let (ok, out, err) = cli_with_default_config(&scratch, &file, &["status"]).await;
    assert!(ok, "{err}");
    assert!(out.contains("plain (tls, roundrobin)"), "{out}");
    let drain = ["backend", "drain", "plain/p1"];
    let (ok, out, err) = cli_with_default_config(&scratch.join("2"), &file, &drain).await;
    assert!(ok, "{err}");
    assert_eq!(out, "plain/p1: drain (0 active connections)\n");
    assert_eq!(state(&bed, "plain", "p1"), "drain");

    // A token the server refuses: the 401 names where the token came from.
    let wrong = dir.join("wrong.token");
    std::fs::write(&wrong, "not-the-token\n").unwrap();
    let file = cli_config(dir, bed.admin, Some(&wrong));
    let enable = ["backend", "enable", "plain/p1"];
    let (ok, _, err) = cli_with_default_config(&scratch.join("3"), &file, &enable).await;
    assert!(!ok);
    assert!(
        err.contains("401 Unauthorized")
            && err.contains("the token: admin.token_file of /etc/crossbar/crossbar.yaml")
            && err.contains("--token-file FILE"),
        "{err}"
    );
    // No token at all: said so.
    let file = cli_config(dir, bed.admin, None);
    let (ok, _, err) = cli_with_default_config(&scratch.join("4"), &file, &enable).await;
    assert!(!ok);
    assert!(
        err.contains("401") && err.contains("the token: none was sent"),
        "{err}"
    );
    // Nothing answers at the file's address: the error names the file.
    let file = cli_config(dir, refusing_addr(), None);
    let (ok, _, err) = cli_with_default_config(&scratch.join("5"), &file, &["status"]).await;
    assert!(!ok);
    assert!(
        err.contains("the address is admin.listen of /etc/crossbar/crossbar.yaml"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_with_a_config_file_force_lookups_and_connections() {
    let bed = Bed::start(Some("cli-token")).await;
    let token = bed.token_file();
    let file = cli_config(bed.xb.dir(), bed.admin, Some(&token));
    let c = file.display().to_string();

    // -c FILE: the address and the token come from the config.
    let (ok, out, err) = cli(args(&["status", "-c", &c])).await;
    assert!(ok, "{err}");
    assert!(out.contains("plain (tls, roundrobin)"), "{out}");
    let (ok, out, err) = cli(args(&["backend", "drain", "plain/p1", "-c", &c])).await;
    assert!(ok, "{err}");
    assert_eq!(out, "plain/p1: drain (0 active connections)\n");

    // The last available backend: refused, then done with --force.
    let (ok, out, err) = cli(args(&["backend", "disable", "plain/p2", "-c", &c])).await;
    assert!(!ok, "{out}");
    assert!(
        err.contains("409")
            && err.contains(
                "p2 is the last available backend of service \"plain\" (others: p1 drain)"
            )
            && err.contains("crossbar backend disable --force"),
        "{err}"
    );
    assert_eq!(state(&bed, "plain", "p2"), "up");
    let (ok, out, err) = cli(args(&[
        "backend", "disable", "plain/p2", "--force", "-c", &c,
    ]))
    .await;
    assert!(ok, "{err}");
    assert_eq!(out, "plain/p2: disabled (0 active connections)\n");
    for b in ["p1", "p2"] {
        let (ok, _, err) = cli(args(&[
            "backend",
            "enable",
            &format!("plain/{b}"),
            "-c",
            &c,
        ]))
        .await;
        assert!(ok, "{err}");
    }
    // --admin overrides the file (and nothing answers there).
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let (ok, _, err) = cli(args(&[
        "status",
        "-c",
        &c,
        "--admin",
        &format!("http://{dead}"),
    ]))
    .await;
    assert!(!ok);
    assert!(
        err.contains(&format!("nothing answers at http://{dead}")),
        "{err}"
    );
    assert!(
        err.contains("the address is the one given with --admin"),
        "{err}"
    );

    // Stick entries by client and by key.
    let on_a = agent_from(&bed, "127.0.0.2".parse().unwrap()).await;
    let (ok, out, err) = cli(args(&[
        "table",
        "show",
        "puppet",
        "--client",
        "127.0.0.2",
        "-c",
        &c,
    ]))
    .await;
    assert!(ok, "{err}");
    assert!(
        out.starts_with("puppet: client 127.0.0.2 (source prefix 127.0.0.2/32): 1 entry\n"),
        "{out}"
    );
    let row = out
        .lines()
        .find(|l| l.starts_with("source "))
        .unwrap_or_else(|| panic!("{out}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells[2], on_a, "{out}");
    let key = cells[1].to_string();
    assert!(
        out.contains("crossbar connections --client 127.0.0.2"),
        "{out}"
    );
    // `table show` lists the source entries with their client, not just the hash.
    let (ok, out, err) = cli(args(&["table", "show", "puppet", "-c", &c])).await;
    assert!(ok, "{err}");
    let source = out
        .lines()
        .find(|l| l.starts_with("source ") && l.contains(&key))
        .unwrap_or_else(|| panic!("no source entry {key}: {out}"));
    assert!(source.trim_end().ends_with(" 127.0.0.2/32"), "{out}");
    let (ok, out, err) = cli(args(&["table", "show", "puppet", "--key", &key, "-c", &c])).await;
    assert!(ok, "{err}");
    assert!(
        out.starts_with(&format!("puppet: key {key}: 1 entry\n")),
        "{out}"
    );
    let (ok, out, err) = cli(args(&[
        "table", "delete", "puppet", "--key", &key, "-c", &c,
    ]))
    .await;
    assert!(ok, "{err}");
    assert_eq!(out, format!("puppet: deleted source {key} ({on_a})\n"));
    let (ok, out, err) = cli(args(&[
        "table",
        "show",
        "puppet",
        "--client",
        "127.0.0.2",
        "-c",
        &c,
    ]))
    .await;
    assert!(ok, "{err}");
    assert!(out.contains(": no entry\n"), "{out}");
    let (ok, _, err) = cli(args(&[
        "table",
        "delete",
        "puppet",
        "--client",
        "127.0.0.2",
        "-c",
        &c,
    ]))
    .await;
    assert!(!ok);
    assert!(
        err.contains("404") && err.contains("no stick entry"),
        "{err}"
    );

    // Open connections: none, then one.
    let (ok, out, err) = cli(args(&["connections", "plain", "-c", &c])).await;
    assert!(ok, "{err}");
    assert_eq!(out, "no open connection\n", "not 'showing the 0 oldest'");
    let mut held = Held::open(&bed, "plain").await;
    let backend = held.who().await;
    let (ok, out, err) = cli(args(&["connections", "plain", "-c", &c])).await;
    assert!(ok, "{err}");
    let mut lines = out.lines();
    assert_eq!(
        lines.next(),
        Some("1 open connection(s), the oldest first"),
        "{out}"
    );
    assert_eq!(
        lines.next().unwrap().split_whitespace().collect::<Vec<_>>(),
        ["ID", "SERVICE", "CLIENT", "BACKEND", "AGE", "C->S", "BYTES", "S->C", "BYTES", "STATE"]
    );
    let row: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(
        (row[1], row[3], row[7]),
        ("plain", backend.as_str(), "relaying"),
        "{out}"
    );
    assert!(row[2].starts_with("127.0.0.1:"), "{out}");
    let (ok, out, _) = cli(args(&["connections", "--json", "-c", &c])).await;
    assert!(ok);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["total"], 1, "{v}");
    // Two more, each opened after the one before: listed the oldest first.
    let mut more = Vec::new();
    for _ in 0..2 {
        let mut h = Held::open(&bed, "plain").await;
        h.who().await;
        more.push(h);
    }
    let (ok, out, _) = cli(args(&["connections", "plain", "-c", &c])).await;
    assert!(ok);
    assert!(
        out.starts_with("3 open connection(s), the oldest first\n"),
        "{out}"
    );
    // docs/admin-api.md shows the same columns.
    let header: Vec<&str> = out
        .lines()
        .nth(1)
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/admin-api.md"))
            .unwrap();
    assert!(
        doc.lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == header),
        "docs/admin-api.md's `crossbar connections` example lacks the header {header:?}"
    );
    let ids: Vec<u64> = out
        .lines()
        .skip(2)
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect();
    assert_eq!(ids.len(), 3, "{out}");
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{out}");
    let (ok, out, _) = cli(args(&["connections", "plain", "--limit", "2", "-c", &c])).await;
    assert!(ok);
    assert!(
        out.starts_with("3 open connection(s); showing the 2 oldest (--limit for more)\n"),
        "{out}"
    );
    drop(more);
    drop(held);
}

/// `v` without the fields that count seconds of a clock (they move between two
/// reads of the same crossbar).
fn without_clocks(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .filter(|(k, _)| {
                    !matches!(
                        k.as_str(),
                        "uptime_seconds" | "state_seconds" | "seconds_ago"
                    )
                })
                .map(|(k, v)| (k, without_clocks(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.into_iter().map(without_clocks).collect()),
        other => other,
    }
}

/// `body` read into the view `V` and written again: the same JSON, so the view has
/// every field the server writes, by the same name, and no other.
fn reads_back_whole<V: serde::Serialize + serde::de::DeserializeOwned>(body: &str) {
    let served: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    let view: V = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    assert_eq!(serde_json::to_value(&view).unwrap(), served);
}

/// `crossbar status --json` prints the document `GET /api/services` serves (same
/// crossbar, traffic stopped, no health checks: only the clocks move between the
/// two reads), with a drained backend and a run-time weight in it; and every
/// document of the API the CLI reads (services, tables, a lookup, connections,
/// sources, the writes' answers, an error) reads back whole into its typed view.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_json_is_the_services_document_and_every_document_has_its_view() {
    use crossbar::admin::view;
    let bed = Bed::start(None).await;
    let on = agent_from(&bed, "127.0.0.2".parse().unwrap()).await;
    let post = |path: &'static str| call(bed.admin, Method::POST, path, None);
    let drained = post("/api/backends/plain/p1/drain").await;
    reads_back_whole::<view::BackendStateView>(&drained.body);
    for _ in 0..2 {
        assert_eq!(bed.once("plain").await, "p2");
    }
    let weighted = post("/api/backends/puppet/b1/weight?weight=7").await;
    reads_back_whole::<view::WeightView>(&weighted.body);

    let api = get(&bed, "/api/services").await;
    let (ok, out, err) = cli(args(&["status", "--admin", &bed.url(), "--json"])).await;
    assert!(ok, "{err}");
    let shown: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(without_clocks(shown), without_clocks(api.json()));
    reads_back_whole::<view::ServicesView>(&out);
    let v: view::ServicesView = serde_json::from_str(&out).unwrap();
    let plain = v.services.iter().find(|s| s.name == "plain").unwrap();
    assert_eq!(plain.backends[0].state, view::State::Drain);
    assert_eq!(plain.backends[1].connections_total, 2, "p2 took both");

    let mut held = Held::open(&bed, "plain").await;
    held.who().await;
    for (path, read) in [
        (
            "/api/tables/puppet",
            reads_back_whole::<view::TableView> as fn(&str),
        ),
        (
            "/api/tables/puppet?client=127.0.0.2",
            reads_back_whole::<view::TableView>,
        ),
        (
            "/api/connections",
            reads_back_whole::<view::ConnectionsView>,
        ),
        ("/api/sources", reads_back_whole::<view::SourcesView>),
        ("/api/tables/nope", reads_back_whole::<view::ErrorView>),
    ] {
        read(&get(&bed, path).await.body);
    }
    let table: view::TableView =
        serde_json::from_str(&get(&bed, "/api/tables/puppet?client=127.0.0.2").await.body).unwrap();
    assert_eq!(table.entries[0].backend.as_deref(), Some(on.as_str()));
    let connections: view::ConnectionsView =
        serde_json::from_str(&get(&bed, "/api/connections").await.body).unwrap();
    assert_eq!(connections.total, 1);
    assert_eq!(connections.connections[0].state, view::ConnState::Relaying);
    drop(held);
    let delete = |path: &'static str| call(bed.admin, Method::DELETE, path, None);
    reads_back_whole::<view::DeleteView>(&delete("/api/tables/puppet?client=127.0.0.2").await.body);
    reads_back_whole::<view::FlushView>(&delete("/api/tables/puppet").await.body);
    reads_back_whole::<view::ReloadAnswer>(&post("/api/reload").await.body);
}

// ---------------------------------------------------------------------------
// Declared bodies, and the Host a request names (issue #42, items 2 and 5)

/// Connections of the body flood: as many as the issue's (64 `/api/services` and 10
/// `/healthz`), more than every regular and reserved slot together.
const BODY_FLOOD_SERVICES: usize = 64;
const BODY_FLOOD_HEALTHZ: usize = 10;
/// How long a flood client waits for an answer before it gives up and reconnects:
/// shorter than the old 10 s wait for the body, so before the fix it never got one.
const BODY_FLOOD_GIVE_UP: std::time::Duration = std::time::Duration::from_secs(5);
/// A flood client's pause between connections (bounds the flood's rate once each
/// answer comes at once: at most 74 x 5 connections a second).
const BODY_FLOOD_PAUSE: std::time::Duration = std::time::Duration::from_millis(200);
/// Probes of each kind, one every [`PROBE_EVERY`], as the issue's 30 + 30.
const PROBES: usize = 30;
const PROBE_EVERY: std::time::Duration = std::time::Duration::from_millis(200);
/// A probe's whole budget: what a health checker such as keepalived gives a check.
const PROBE_LIMIT: std::time::Duration = std::time::Duration::from_secs(5);

/// One raw request on a fresh connection: the status of its answer, or `None` when
/// none came within `limit`.
async fn raw_status(addr: SocketAddr, request: &str, limit: std::time::Duration) -> Option<u16> {
    common::raw_request(addr, request.as_bytes(), limit).await.0
}

/// What became of one request of the body flood.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum FloodAnswer {
    /// Answered with this status.
    Status(u16),
    /// Closed (or reset) without a byte: the connection was closed to make room
    /// before its request was read (a fresh connection holds its slot idle).
    Closed,
    /// Nothing within [`BODY_FLOOD_GIVE_UP`]: the request was left waiting.
    GaveUp,
}

/// Send `request` on a fresh connection and wait for the answer, up to the flood
/// client's give-up time.
async fn flood_request(addr: SocketAddr, request: &str) -> FloodAnswer {
    use tokio::io::AsyncReadExt;
    let Ok(mut s) = TcpStream::connect(addr).await else {
        return FloodAnswer::Closed;
    };
    if s.write_all(request.as_bytes()).await.is_err() {
        return FloodAnswer::Closed;
    }
    let mut out = Vec::new();
    let read = tokio::time::timeout(BODY_FLOOD_GIVE_UP, s.read_to_end(&mut out)).await;
    match common::status_of(&String::from_utf8_lossy(&out)) {
        Some(status) => FloodAnswer::Status(status),
        None if read.is_ok() => FloodAnswer::Closed,
        None => FloodAnswer::GaveUp,
    }
}

/// Issue #42, 2: 74 connections that each declare a 1,000-byte body no endpoint
/// takes and never send it, reconnecting after each give-up, kept `/healthz` and
/// `/api` unreachable (1 of 30 and 0 of 30 answered): a request held its slot as
/// "busy" while crossbar waited 10 s for the body. Now a declared body is answered
/// 413 at once, without reading it, and the connection closed: every probe of
/// `/healthz` and `/api/services` is answered 200 during the flood, and every
/// flood request gets its 413.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declared_bodies_are_refused_at_once_and_health_checks_get_through() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    let bed = common::admin_bed("", None).await;
    let addr = bed.addr;
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicUsize::new(0));
    let mut flood = tokio::task::JoinSet::new();
    for i in 0..BODY_FLOOD_SERVICES + BODY_FLOOD_HEALTHZ {
        let path = if i < BODY_FLOOD_SERVICES {
            "/api/services"
        } else {
            "/healthz"
        };
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1000\r\n\r\n");
        let (stop, sent) = (stop.clone(), sent.clone());
        flood.spawn(async move {
            let mut answers: BTreeMap<FloodAnswer, usize> = BTreeMap::new();
            while !stop.load(Ordering::Relaxed) {
                sent.fetch_add(1, Ordering::Relaxed);
                let answer = flood_request(addr, &request).await;
                *answers.entry(answer).or_default() += 1;
                tokio::time::sleep(BODY_FLOOD_PAUSE).await;
            }
            answers
        });
    }
    let total = BODY_FLOOD_SERVICES + BODY_FLOOD_HEALTHZ;
    common::wait_until("every flood client sent its first request", || {
        sent.load(Ordering::Relaxed) >= total
    })
    .await;
    let mut probes = tokio::task::JoinSet::new();
    for i in 0..2 * PROBES {
        let path = if i % 2 == 0 {
            "/healthz"
        } else {
            "/api/services"
        };
        probes.spawn(async move {
            let request =
                format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
            (path, raw_status(addr, &request, PROBE_LIMIT).await)
        });
        tokio::time::sleep(PROBE_EVERY).await;
    }
    let mut answered: BTreeMap<&str, usize> = BTreeMap::new();
    while let Some(r) = probes.join_next().await {
        let (path, status) = r.unwrap();
        *answered.entry(path).or_default() += usize::from(status == Some(200));
    }
    stop.store(true, Ordering::Relaxed);
    let mut flood_answers: BTreeMap<FloodAnswer, usize> = BTreeMap::new();
    while let Some(r) = flood.join_next().await {
        for (status, n) in r.unwrap() {
            *flood_answers.entry(status).or_default() += n;
        }
    }
    println!(
        "body flood: {} requests declaring a body, answered {flood_answers:?}; probes answered 200: {answered:?} of {PROBES} each",
        sent.load(Ordering::Relaxed)
    );
    assert_eq!(answered.get("/healthz"), Some(&PROBES), "{answered:?}");
    assert_eq!(answered.get("/api/services"), Some(&PROBES), "{answered:?}");
    // Each declared body refused at once, but for connections closed to make room
    // before their request was read (counted as such).
    let closed = flood_answers
        .get(&FloodAnswer::Closed)
        .copied()
        .unwrap_or(0);
    let evicted = bed
        .cb
        .metric("crossbar_admin_connections_evicted_total", &[]);
    assert!(
        flood_answers
            .keys()
            .all(|a| matches!(a, FloodAnswer::Status(413) | FloodAnswer::Closed)),
        "every declared body refused at once: {flood_answers:?}"
    );
    assert!(
        closed as f64 <= evicted,
        "{closed} closed unanswered, {evicted} closed to make room"
    );
    assert_eq!(
        bed.cb.metric("crossbar_admin_requests_in_progress", &[]),
        0.0,
        "nothing left in progress"
    );
}

/// A body declared by `Content-Length` (sent or not) or by chunked encoding is
/// answered 413 at once and the connection closed; `Content-Length: 0` is no body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_body_gets_413_without_being_waited_for() {
    let bed = common::admin_bed("", None).await;
    let limit = PROBE_LIMIT;
    for (what, request, want) in [
        (
            "a body declared and never sent",
            "POST /api/reload HTTP/1.1\r\nHost: localhost\r\nContent-Length: 5\r\n\r\n",
            Some(413),
        ),
        (
            "a chunked body that never comes",
            "POST /api/reload HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n",
            Some(413),
        ),
        (
            "a small body sent along",
            "DELETE /api/tables/svc HTTP/1.1\r\nHost: localhost\r\nContent-Length: 5\r\n\r\nhello",
            Some(413),
        ),
        (
            "a health check declaring a body",
            "GET /healthz HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1000\r\n\r\n",
            Some(413),
        ),
        (
            "an empty body",
            "GET /healthz HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            Some(200),
        ),
    ] {
        let (status, text) = common::raw_request(bed.addr, request.as_bytes(), limit).await;
        assert_eq!(status, want, "{what}: {text}");
        if want == Some(413) {
            assert!(text.contains("connection: close"), "{what}: {text}");
        }
    }
    assert_eq!(
        bed.cb.metric(
            "crossbar_admin_requests_refused_total",
            &[("reason", "body")]
        ),
        4.0
    );
}

/// Issue #42, 5 (RFC 9112 3.2, 3.2.2): two `Host` header lines are a bad request,
/// whatever they say (the first decided before); a request in absolute form is
/// checked by its target's authority, and its `Host` is ignored (before, the
/// target's authority was ignored).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_hosts_are_bad_requests_and_absolute_targets_name_the_host() {
    let bed = common::admin_bed("", None).await;
    let port = bed.addr.port();
    let limit = PROBE_LIMIT;
    let cases = [
        (
            "two Host lines naming this endpoint",
            "GET /api/services HTTP/1.1\r\nHost: localhost\r\nHost: localhost\r\nConnection: close\r\n\r\n".to_string(),
            400,
        ),
        (
            "two Host lines on a health check",
            "GET /healthz HTTP/1.1\r\nHost: localhost\r\nHost: attacker.example\r\nConnection: close\r\n\r\n".to_string(),
            400,
        ),
        (
            "a Host that is no host",
            "GET /api/services HTTP/1.1\r\nHost: x y\r\nConnection: close\r\n\r\n".to_string(),
            400,
        ),
        (
            "an absolute target naming another host",
            "GET http://attacker.example/api/services HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".to_string(),
            403,
        ),
        (
            "a write to an absolute target naming another host",
            format!("POST http://attacker.example:{port}/api/backends/svc/e1/drain?force=1 HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"),
            403,
        ),
        (
            "an absolute target naming this endpoint",
            format!("GET http://127.0.0.1:{port}/api/services HTTP/1.1\r\nHost: attacker.example\r\nConnection: close\r\n\r\n"),
            200,
        ),
    ];
    for (what, request, want) in cases {
        let (status, text) = common::raw_request(bed.addr, request.as_bytes(), limit).await;
        assert_eq!(status, Some(want), "{what}: {text}");
    }
    assert_eq!(bed.cb.backend("svc", "e1").state().as_str(), "up");
    assert_eq!(
        bed.cb.metric(
            "crossbar_admin_requests_refused_total",
            &[("reason", "bad_host")]
        ),
        3.0
    );
}

/// The page's text with the clocks blanked: ages (`3s`, `2m13s`, `1h05m`) and RFC 3339
/// times move between two reads of the same crossbar.
fn page_without_clocks(html: &str) -> String {
    let mut out = String::with_capacity(html.len());
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        let clock = word.chars().next().is_some_and(|c| c.is_ascii_digit())
            && (word.ends_with('s')
                || word.ends_with('m')
                || word.ends_with('h')
                || word.ends_with('Z'))
            && word
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == ':' || c == '-');
        out.push_str(if clock { "#" } else { word });
        word.clear();
    };
    for c in html.chars() {
        if c.is_ascii_alphanumeric() || c == ':' || c == '-' {
            word.push(c);
        } else {
            flush(&mut word, &mut out);
            out.push(c);
        }
    }
    flush(&mut word, &mut out);
    out
}

/// `crossbar status --json` carries every field the status page shows: the page
/// rendered from its document is the page served (the clocks aside), with a DOWN
/// backend and its check's error, the ACTIVE one of `balance: first` ramping up
/// after recovery (slow start), one drained with its health, and a listener with
/// PROXY headers and `per_source` limits holding a source.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_json_carries_every_field_the_page_shows() {
    let echo = common::Backend::echo("ca3", false).await;
    let (dead, late) = (refusing_addr(), common::free_port());
    let yaml = format!(
        "admin: {{ enabled: false }}\nservices:\n  ca:\n    listen:\n      - {{ address: \"127.0.0.1:0\", proxy_protocol: {{ accept_from: [\"192.0.2.0/24\"] }}, per_source: {{ max_connections: 5, rate: 10, burst: 20 }} }}\n    balance: first\n    slow_start: 1h\n    timeouts: {{ client_hello: 1h }}\n    health: {{ check: tcp, interval: 2s, timeout: 1s, fall: 1, rise: 1 }}\n    backends:\n{}{}{}",
        common::backend_line("ca1", dead, ""),
        common::backend_line("ca2", late, ""),
        common::backend_line("ca3", echo.addr, ""),
    );
    let xb = Crossbar::start(&yaml).await;
    let endpoint = xb.serve_admin(None).await;
    common::wait_until("ca2 down", || !xb.backend("ca", "ca2").is_healthy()).await;
    let _late = tokio::net::TcpListener::bind(late).await.unwrap();
    common::wait_until("ca2 back up", || xb.backend("ca", "ca2").is_healthy()).await;
    let drained = call(
        endpoint.addr,
        Method::POST,
        "/api/backends/ca/ca3/drain",
        None,
    )
    .await;
    assert_eq!(drained.status, StatusCode::OK, "{}", drained.body);
    // A source holding a connection (waiting for its hello).
    let _held = TcpStream::connect(xb.addr("ca")).await.unwrap();
    let url = format!("http://{}", endpoint.addr);
    let mut last = String::new();
    // Checks every 2 s change the counters: compare reads between two of them.
    for _ in 0..10 {
        let before = call(endpoint.addr, Method::GET, "/?refresh=0", None)
            .await
            .body;
        let (ok, out, err) = cli(args(&["status", "--admin", &url, "--json"])).await;
        assert!(ok, "{err}");
        let after = call(endpoint.addr, Method::GET, "/?refresh=0", None)
            .await
            .body;
        let v: admin::view::ServicesView = serde_json::from_str(&out).unwrap();
        let rendered = admin::page::render(
            admin::page::PageData {
                services: &v,
                sources: &v.per_source,
            },
            0,
            "",
        );
        let (served, again) = (page_without_clocks(&before), page_without_clocks(&after));
        if served != again {
            continue; // a check ran in between
        }
        last = page_without_clocks(&rendered);
        if last == served {
            for shown in [
                "ramp ",
                "health up",
                "active",
                "sources on 127.0.0.1",
                "PROXY headers from 192.0.2.0/24",
                "tcp FAIL",
            ] {
                assert!(
                    served.contains(shown),
                    "the page shows no {shown:?}:\n{served}"
                );
            }
            return;
        }
        assert_eq!(
            last, served,
            "the page from status --json differs from the page served"
        );
    }
    panic!("no stable pair of reads in 10 tries: {last}");
}

/// `crossbar backend drain --wait` returns when the backend's last connection has
/// ended, not before; at its timeout it exits 1 naming the connection left, its
/// client and age; an idle backend returns at once; an unknown name or a bad
/// timeout is a usage error (exit 2), and the drain stays after a timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_wait_returns_at_the_last_connections_end_and_names_what_is_left_at_the_timeout() {
    let bed = Bed::start(Some("wait-token")).await;
    let (url, token) = (bed.url(), bed.token_file().display().to_string());
    let drain = |target: &str, more: &[&str]| {
        let mut a = args(&["backend", "drain", target, "--admin", &url]);
        a.extend(args(&["--token-file", &token, "--wait"]));
        a.extend(args(more));
        a
    };
    let mut held = Held::open(&bed, "plain").await;
    let victim = held.who().await;
    let other = if victim == "p1" { "p2" } else { "p1" };
    let target = format!("plain/{victim}");

    // The timeout, with the held connection open: exit 1, naming it.
    let (code, out, err) = common::crossbar_cli_exit(drain(&target, &["--timeout", "1s"])).await;
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(
        out.contains(&format!("{target}: drain (1 active connections)")),
        "{out}"
    );
    assert!(
        err.contains(&format!("{target}: 1 connection(s) left after 1s")),
        "{err}"
    );
    assert!(
        err.contains("id ") && err.contains("from 127.0.0.1"),
        "{err}"
    );
    assert_eq!(
        bed.xb.backend("plain", &victim).state().as_str(),
        "drain",
        "kept"
    );

    // Waiting without a timeout in reach: still running while the connection is
    // open (its polls see it), done once it ends.
    let waiting = {
        let a = drain(&target, &["--timeout", "5m"]);
        tokio::task::spawn_blocking(move || {
            Command::new(env!("CARGO_BIN_EXE_crossbar"))
                .args(&a)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("run crossbar")
        })
        .await
        .unwrap()
    };
    let mut waiting = common::ChildGuard(waiting);
    for _ in 0..8 {
        assert_eq!(
            held.who().await,
            victim,
            "the drained backend still serves it"
        );
        let ended = waiting.0.try_wait().expect("try_wait");
        assert!(ended.is_none(), "--wait returned with a connection open");
        tokio::time::sleep(std::time::Duration::from_millis(250)).await; // a poll's period
    }
    drop(held);
    let code = waiting.exited(std::time::Duration::from_secs(30)).await;
    let mut out = String::new();
    std::io::Read::read_to_string(&mut waiting.0.stdout.take().unwrap(), &mut out).unwrap();
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains(&format!("{target}: no connection left")),
        "{out}"
    );

    // An idle backend returns at once; an unknown one and a bad timeout are usage errors.
    let (code, out, err) =
        common::crossbar_cli_exit(drain(&format!("plain/{other}"), &["--force"])).await;
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.contains(&format!("plain/{other}: no connection left")),
        "{out}"
    );
    let (code, _, err) = common::crossbar_cli_exit(drain("plain/p3", &[])).await;
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("did you mean"), "{err}");
    for bad in ["0s", "soon"] {
        let (code, _, err) = common::crossbar_cli_exit(drain(&target, &["--timeout", bad])).await;
        assert_eq!(code, Some(2), "{bad}: {err}");
        assert!(err.contains("--timeout"), "{bad}: {err}");
    }
    let (code, _, err) = common::crossbar_cli_exit(args(&[
        "backend", "enable", &target, "--admin", &url, "--wait",
    ]))
    .await;
    assert_ne!(code, Some(0), "{err}");
    assert!(
        err.contains("--wait goes with `drain` and `disable`"),
        "{err}"
    );
}
