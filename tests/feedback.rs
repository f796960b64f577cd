//! Load feedback against stand-in compilers (real rustls servers on loopback that
//! serve the jruby-metrics document captured from Debian's puppetserver 7.9.5,
//! tests/common/compiler.rs) and stand-in HAProxy agents: which backend answered
//! each new connection, through a running crossbar.
//!
//! No timing threshold: every wait is for an outcome (a factor published, a
//! connection answered), bounded only against hangs.
mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use common::compiler::{Answer, Compiler};
use common::{within, Crossbar, SNI};
use crossbar::testbed::{self, TestCa, Versions};
use rustls::ClientConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// New connections opened per measurement: enough that a share of 1/20 shows as
/// several connections and a share of 1/2 as dozens.
const CONNECTIONS: usize = 120;

/// A crossbar whose `svc` balances `compilers` with `feedback` (YAML flow map
/// inside `feedback: { ... }`), `balance`, and the test CA's file for TLS.
async fn balancer(ca: &TestCa, compilers: &[&Compiler], balance: &str, feedback: &str) -> Crossbar {
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca.cert_pem()).unwrap();
    let mut yaml = format!(
        "admin: {{ enabled: false }}\nservices:\n  svc:\n    listen: [\"127.0.0.1:0\"]\n    \
         server_names: [\"{SNI}\"]\n    balance: {balance}\n    \
         health: {{ check: https, ca_file: \"{}\", interval: 100ms, timeout: 1s }}\n",
        ca_file.display()
    );
    if !feedback.is_empty() {
        yaml.push_str(&format!("    feedback: {{ {feedback} }}\n"));
    }
    yaml.push_str("    backends:\n");
    for c in compilers {
        yaml.push_str(&format!(
            "      - {{ name: {}, address: \"{}\" }}\n",
            c.name, c.addr
        ));
    }
    let cb = Crossbar::start(&yaml).await;
    std::mem::forget(dir); // the CA file is read at every poll, for the whole test
    cb
}

/// The factor published for `backend`, as the metric says (0 before the first).
fn factor(cb: &Crossbar, backend: &str) -> f64 {
    cb.metric("crossbar_backend_feedback_factor", &[("backend", backend)])
}

/// Wait until both compilers' samples set their factors (phase `active`).
async fn both_active(cb: &Crossbar) {
    let active = |b: &str| {
        cb.metric(
            "crossbar_backend_feedback_phase",
            &[("backend", b), ("phase", "active")],
        ) == 1.0
    };
    common::wait_until("both compilers sampled", || active("c1") && active("c2")).await;
}

/// Wait until `cond` holds of the published factors of (c1, c2).
async fn factors_until(cb: &Crossbar, what: &str, cond: impl Fn(f64, f64) -> bool) {
    common::wait_until(what, || cond(factor(cb, "c1"), factor(cb, "c2"))).await;
}

/// A fresh client (no session to resume) for every connection.
fn fresh() -> Arc<ClientConfig> {
    let ca = CA.with(|c| c.clone());
    testbed::client_config(&ca, Versions::Both, true).unwrap()
}

thread_local! {
    static CA: Arc<TestCa> = Arc::new(TestCa::new("feedback test CA").unwrap());
}

fn test_ca() -> Arc<TestCa> {
    CA.with(|c| c.clone())
}

/// Open `n` new connections, each held open until all are (so least connections
/// sees them), and count who answered each.
async fn shares(cb: &Crossbar, n: usize) -> BTreeMap<String, usize> {
    let addr = cb.addr("svc");
    let mut held = Vec::new();
    let mut seen = BTreeMap::new();
    for _ in 0..n {
        let (name, conn) = within("a connection through crossbar", open(addr)).await;
        *seen.entry(name).or_insert(0) += 1;
        held.push(conn);
    }
    seen
}

/// One TLS connection: the name of the compiler that answered `GET /`, and the
/// connection, still open.
async fn open(
    addr: SocketAddr,
) -> (
    String,
    tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
) {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from(SNI).unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(fresh())
        .connect(name, tcp)
        .await
        .unwrap();
    let req = format!("GET / HTTP/1.1\r\nHost: {SNI}\r\n\r\n");
    tls.write_all(req.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let mut got = Vec::new();
    while !got.ends_with(b"\n") || !got.windows(4).any(|w| w == b"\r\n\r\n") {
        let k = tls.read(&mut buf).await.unwrap();
        assert!(k > 0, "closed before an answer");
        got.extend_from_slice(&buf[..k]);
    }
    let text = String::from_utf8_lossy(&got);
    let body = text
        .split("\r\n\r\n")
        .nth(1)
        .unwrap_or_default()
        .trim()
        .to_string();
    (body, tls)
}

async fn two_compilers(ca: &TestCa) -> (Compiler, Compiler) {
    let any = common::any_port();
    (
        Compiler::start(ca, "c1", &[SNI], any).await,
        Compiler::start(ca, "c2", &[SNI], any).await,
    )
}

/// Fast feedback for tests: 100 ms polls, no blackout, no smoothing (each sample
/// counts at once), a 2 s expiry, the compilers' queue limit 2.
const FAST: &str =
    "kind: puppet, interval: 100ms, blackout: 0s, smoothing: 0s, expiry: 2s, queue_limit: 2";

#[rstest::rstest]
#[case::roundrobin("roundrobin")]
#[case::leastconn("leastconn")]
#[tokio::test]
async fn a_compiler_without_free_jrubies_gets_a_small_share_and_recovers(#[case] balance: &str) {
    let ca = test_ca();
    let (c1, c2) = two_compilers(&ca).await;
    let cb = balancer(&ca, &[&c1, &c2], balance, FAST).await;
    both_active(&cb).await;

    // c1: its one JRuby borrowed and ten requests waiting (a catalog herd on it).
    c1.answer(Answer::pool(1, 0, 10));
    factors_until(&cb, "c1's factor drops", |a, b| a < 0.5 && b > 1.0).await;
    let busy = shares(&cb, CONNECTIONS).await;
    let on_c1 = busy.get("c1").copied().unwrap_or(0);
    assert!(
        on_c1 * 5 < CONNECTIONS,
        "a saturated compiler gets a small share: {busy:?}"
    );
    assert!(
        on_c1 > 0,
        "never 0 new connections while it passes its checks: {busy:?}"
    );

    // It has a free JRuby again: back to an even share.
    c1.answer(Answer::pool(1, 1, 0));
    factors_until(&cb, "c1 recovers", |a, b| a == 1.0 && b == 1.0).await;
    let idle = shares(&cb, CONNECTIONS).await;
    let on_c1 = idle.get("c1").copied().unwrap_or(0);
    assert!(
        on_c1 * 3 > CONNECTIONS,
        "recovered, it takes its share again: {idle:?}"
    );
}

#[tokio::test]
async fn a_refusing_endpoint_falls_back_to_the_configured_weight_and_says_why() {
    let ca = test_ca();
    let (c1, c2) = two_compilers(&ca).await;
    let cb = balancer(&ca, &[&c1, &c2], "roundrobin", FAST).await;
    c1.answer(Answer::pool(1, 0, 10));
    both_active(&cb).await;
    factors_until(&cb, "c1's factor drops", |a, _| a < 0.5).await;

    // The compiler's auth.conf now wants a certificate: 401 (PE's allowlist).
    c1.answer(Answer::Status(401));
    let refused = [("backend", "c1"), ("result", "refused")];
    common::wait_until("a refused poll counted", || {
        cb.metric("crossbar_backend_feedback_polls_total", &refused) > 0.0
    })
    .await;
    factors_until(
        &cb,
        "the last sample expires: the configured weight",
        |a, b| a == 1.0 && b == 1.0,
    )
    .await;
    let back = shares(&cb, CONNECTIONS).await;
    assert!(
        back.get("c1").copied().unwrap_or(0) * 3 > CONNECTIONS,
        "{back:?}"
    );

    let admin = cb.serve_admin(None).await;
    let v: serde_json::Value = common::admin_json(admin.addr, "/api/services").await;
    let b = &v["services"][0]["backends"][0];
    assert_eq!(b["name"], "c1");
    assert_eq!(b["feedback"]["phase"], "expired", "{b}");
    assert_eq!(b["effective_origin"], "file");
    let error = b["feedback"]["error"].as_str().unwrap_or_default();
    assert!(error.contains("401"), "{b}");

    // The doctor names the one fix.
    let report =
        crossbar::doctor::run(&cb.server.config(), Default::default(), &Default::default()).await;
    let f = report
        .findings
        .iter()
        .find(|f| f.backend.as_deref() == Some("c1") && f.message.contains("load feedback"));
    let msg = f.map(|f| f.message.clone()).unwrap_or_default();
    assert!(
        msg.contains("set feedback.client_cert"),
        "{:#?}",
        report.findings
    );
}

/// `crossbar doctor` on a compiler whose certificate lacks the service's name: the
/// feedback poll fails for the same cause as the health check, and the one fix
/// (re-issue with `dns_alt_names`) is said once, never a setting that would hide
/// the certificate (`feedback.server_name`). The text report lists each poll's
/// result, not only `--format json`.
#[tokio::test]
async fn doctor_gives_one_fix_for_a_certificate_without_the_name_and_prints_each_poll() {
    let ca = test_ca();
    let any = common::any_port();
    let good = Compiler::start(&ca, "c1", &[SNI], any).await;
    let bad = Compiler::start(&ca, "c2", &["c2.example.com"], any).await;
    good.answer(Answer::pool(4, 3, 0));
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca.cert_pem()).unwrap();
    let yaml = format!(
        "admin: {{ enabled: false }}\nservices:\n  svc:\n    listen: [\"127.0.0.1:0\"]\n    \
         server_names: [\"{SNI}\"]\n    health: {{ check: https, ca_file: \"{}\" }}\n    \
         feedback: {{ kind: puppet }}\n    backends:\n      - {{ name: c1, address: \"{}\" }}\n      \
         - {{ name: c2, address: \"{}\" }}\n",
        ca_file.display(),
        good.addr,
        bad.addr
    );
    let cfg = crossbar::config::Config::from_str_at(&yaml, std::path::Path::new("doctor.yaml"))
        .unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    let report = crossbar::doctor::run(&cfg, Default::default(), &Default::default()).await;
    let table = report.table();
    let c2: Vec<&str> = report
        .findings
        .iter()
        .filter(|f| f.backend.as_deref() == Some("c2"))
        .map(|f| f.message.as_str())
        .collect();
    assert!(
        c2.iter().all(|m| !m.contains("feedback.server_name")),
        "a second fix that hides the certificate: {c2:#?}"
    );
    assert_eq!(
        c2.iter().filter(|m| m.contains("dns_alt_names")).count(),
        1,
        "one fix, said once: {c2:#?}"
    );
    assert!(
        c2.iter().any(
            |m| m.contains("load feedback (puppet) fails for the same cause")
                && m.contains(&format!("`{SNI}` missing"))
        ),
        "{c2:#?}"
    );
    assert!(
        table.contains("svc/c1: puppet: 3/4 JRubies free, 0 queued"),
        "{table}"
    );
    assert!(table.contains("svc/c2: puppet: FAILS: "), "{table}");
}

#[tokio::test]
async fn the_services_view_shows_the_effective_weight_its_origin_and_the_sample() {
    let ca = test_ca();
    let (c1, c2) = two_compilers(&ca).await;
    let cb = balancer(&ca, &[&c1, &c2], "leastconn", FAST).await;
    c1.answer(Answer::pool(3, 0, 2));
    c2.answer(Answer::pool(3, 3, 0));
    both_active(&cb).await;
    factors_until(&cb, "c1 the busier", |a, b| a < b).await;
    let admin = cb.serve_admin(None).await;
    let v: serde_json::Value = common::admin_json(admin.addr, "/api/services").await;
    let svc = &v["services"][0];
    assert_eq!(svc["feedback"]["kind"], "puppet");
    assert_eq!(svc["feedback"]["saturated_sticky"], true);
    let c1v = &svc["backends"][0];
    assert_eq!(c1v["weight"], 1);
    assert_eq!(c1v["weight_origin"], "file");
    assert_eq!(c1v["effective_origin"], "feedback");
    assert!(c1v["effective_weight"].as_f64().unwrap() < 1.0, "{c1v}");
    assert_eq!(c1v["feedback"]["phase"], "active");
    assert_eq!(
        c1v["feedback"]["saturated"], true,
        "0 free, queue at queue_limit 2: {c1v}"
    );
    let s = &c1v["feedback"]["sample"];
    assert_eq!(
        (
            s["kind"].as_str(),
            s["jrubies"].as_u64(),
            s["free"].as_u64(),
            s["queued"].as_u64()
        ),
        (Some("puppet"), Some(3), Some(0), Some(2))
    );
    // The typed view reads it back, and its words are what the page and the CLI print.
    let typed: crossbar::admin::view::ServicesView = serde_json::from_value(v.clone()).unwrap();
    let words = typed.services[0].backends[0]
        .feedback
        .as_ref()
        .unwrap()
        .summary();
    assert!(
        words.contains("0/3 JRubies free, 2 queued") && words.contains("SATURATED"),
        "{words}"
    );
    let page = common::admin_get(admin.addr, "/").await;
    assert!(
        page.contains("x0.") && page.contains("0/3 JRubies free, 2 queued"),
        "the page shows it"
    );
    let url = format!("http://{}", admin.addr);
    let (ok, text, err) = common::crossbar_cli(vec!["status".into(), "--admin".into(), url]).await;
    assert!(ok, "{err}");
    assert!(
        text.contains("feedback") && text.contains("0/3 JRubies free"),
        "{text}"
    );
    // Every load feedback family docs/metrics.md lists is exported.
    let exported = cb.server.metrics().encode();
    let docs =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/metrics.md")).unwrap();
    let documented: std::collections::BTreeSet<&str> = docs
        .split('`')
        .filter(|w| w.starts_with("crossbar_backend_feedback_"))
        .collect();
    assert!(documented.len() >= 10, "{documented:?}");
    for f in documented {
        assert!(
            exported.contains(&format!("# TYPE {f} ")),
            "{f} is documented but not exported"
        );
    }
}

#[tokio::test]
async fn hostile_answers_are_bounded_and_counted_never_a_crash() {
    let ca = test_ca();
    let (c1, c2) = two_compilers(&ca).await;
    let cb = balancer(&ca, &[&c1, &c2], "roundrobin", FAST).await;
    let cases = [
        (
            Answer::Body(b"<html>not json</html>".to_vec()),
            "bad_answer",
        ),
        (Answer::Body(b"{\"status\":{}}".to_vec()), "bad_answer"),
        (
            Answer::Body(vec![b' '; crossbar::feedback::MAX_DOCUMENT + 1]),
            "too_large",
        ),
        (Answer::Endless, "timeout"),
        (Answer::Status(500), "status"),
    ];
    for (answer, result) in cases {
        c1.answer(answer);
        let labels = [("backend", "c1"), ("result", result)];
        common::wait_until(&format!("a poll counted as {result}"), || {
            cb.metric("crossbar_backend_feedback_polls_total", &labels) > 0.0
        })
        .await;
    }
    c1.answer(Answer::pool(1, 1, 0));
    let ok = [("backend", "c1"), ("result", "ok")];
    let before = cb.metric("crossbar_backend_feedback_polls_total", &ok);
    common::wait_until("c1 answers again", || {
        cb.metric("crossbar_backend_feedback_polls_total", &ok) > before
    })
    .await;
    let served = shares(&cb, 10).await;
    assert_eq!(served.values().sum::<usize>(), 10, "{served:?}");
}

#[tokio::test]
async fn a_resumption_stuck_to_a_saturated_compiler_is_placed_like_a_new_session() {
    let ca = test_ca();
    let (c1, c2) = two_compilers(&ca).await;
    // TLS 1.2 session IDs: crossbar learns each from the ServerHello, exactly.
    let stick = "    stick: { on: [session_id] }\n";
    let cb = balancer_with(&ca, &[&c1, &c2], stick, FAST).await;
    both_active(&cb).await;
    let client = testbed::client_config(&ca, Versions::Tls12, false).unwrap();
    let addr = cb.addr("svc");
    let first = testbed::get(addr, SNI, client.clone(), "/").await.unwrap();
    let home = first.backend.clone();
    let again = testbed::get(addr, SNI, client.clone(), "/").await.unwrap();
    assert_eq!(
        (again.backend.as_str(), again.resumed),
        (home.as_str(), true),
        "sticky while not saturated"
    );

    let stuck = if home == "c1" { &c1 } else { &c2 };
    stuck.answer(Answer::pool(1, 0, 2)); // no free JRuby, the queue at its limit: 503s
    common::wait_until("saturated", || {
        cb.metric("crossbar_backend_feedback_saturated", &[("backend", &home)]) == 1.0
    })
    .await;
    // Its weight is at the floor now: a new session goes to the other compiler, and
    // so must the stuck client's resumption (a 503'd agent's retry).
    let moved = testbed::get(addr, SNI, client.clone(), "/").await.unwrap();
    assert_ne!(
        moved.backend, home,
        "placed like a new session, not sent back"
    );
    assert!(!moved.resumed, "the other compiler does a full handshake");
    let replaced = cb.metric(
        "crossbar_backend_feedback_sticky_replaced_total",
        &[("backend", &home)],
    );
    assert_eq!(replaced, 1.0);
}

#[tokio::test]
async fn without_the_saturated_rule_a_resumption_goes_back() {
    let ca = test_ca();
    let (c1, c2) = two_compilers(&ca).await;
    let stick = "    stick: { on: [session_id] }\n";
    let cb = balancer_with(
        &ca,
        &[&c1, &c2],
        stick,
        &format!("{FAST}, saturated_sticky: false"),
    )
    .await;
    both_active(&cb).await;
    let client = testbed::client_config(&ca, Versions::Tls12, false).unwrap();
    let addr = cb.addr("svc");
    let home = testbed::get(addr, SNI, client.clone(), "/")
        .await
        .unwrap()
        .backend;
    let stuck = if home == "c1" { &c1 } else { &c2 };
    stuck.answer(Answer::pool(1, 0, 2));
    common::wait_until("its factor drops", || factor(&cb, &home) < 0.5).await;
    let back = testbed::get(addr, SNI, client, "/").await.unwrap();
    assert_eq!((back.backend.as_str(), back.resumed), (home.as_str(), true));
}

/// [`balancer`] with extra service lines (`stick:`), round robin.
async fn balancer_with(
    ca: &TestCa,
    compilers: &[&Compiler],
    extra: &str,
    feedback: &str,
) -> Crossbar {
    let cb = balancer(ca, compilers, "roundrobin", feedback).await;
    let yaml = std::fs::read_to_string(&cb.path).unwrap();
    let yaml = yaml.replace("    backends:\n", &format!("{extra}    backends:\n"));
    cb.reload(&yaml).await;
    cb
}

/// A stand-in HAProxy agent on `ip:port` answering `answer` to every connection.
async fn agent(ip: &str, port: u16, answer: &'static str) -> Option<tokio::task::JoinHandle<()>> {
    let listener = TcpListener::bind((ip, port)).await.ok()?;
    Some(tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let _ = s.write_all(answer.as_bytes()).await; // ok: the poller may have gone
        }
    }))
}

#[tokio::test]
async fn an_agent_sets_a_share_and_drain_holds_the_floor() {
    let ca = test_ca();
    // Two hosts (127.0.0.2 and .3), each with a compiler and an agent on one port.
    let c1 = Compiler::start(&ca, "c1", &[SNI], "127.0.0.2:0".parse().unwrap()).await;
    let c2 = Compiler::start(&ca, "c2", &[SNI], "127.0.0.3:0".parse().unwrap()).await;
    let mut agents = None;
    for _ in 0..20 {
        let port = common::free_port().port();
        if let (Some(a), Some(b)) = (
            agent("127.0.0.2", port, "up 10%\n").await,
            agent("127.0.0.3", port, "up 100%\n").await,
        ) {
            agents = Some((port, a, b));
            break;
        }
    }
    let (port, _a1, _a2) = agents.expect("a port free on both addresses");
    let fb = format!("kind: agent, port: {port}, interval: 100ms, expiry: 2s");
    let cb = balancer(&ca, &[&c1, &c2], "roundrobin", &fb).await;
    factors_until(&cb, "the agents' percentages", |a, b| a == 0.1 && b == 1.0).await;
    let seen = shares(&cb, CONNECTIONS).await;
    let on_c1 = seen.get("c1").copied().unwrap_or(0);
    assert!(
        on_c1 > 0 && on_c1 * 5 < CONNECTIONS,
        "10% of c2's share: {seen:?}"
    );
}

/// Round robin rebuilds its schedule whenever a factor crosses a sixteenth, which
/// load feedback does every few seconds: a backend with few places in the cycle
/// must still get its turn, so a rebuild carries the position on (a schedule
/// restarted at its first place each time never reached it).
#[test]
fn round_robin_keeps_a_small_share_in_turn_while_factors_change() {
    use crossbar::balance::{Pool, PoolParams};
    use crossbar::config::{BackendAddress, BackendConfig, Balance};
    use crossbar::feedback::cell::fixed;
    let backend = |name: &str, port| {
        let address = BackendAddress {
            host: "127.0.0.1".into(),
            port,
        };
        BackendConfig::new(name, address)
    };
    let metrics = crossbar::metrics::Metrics::new();
    let params = PoolParams {
        algo: Balance::RoundRobin,
        slow_start: std::time::Duration::ZERO,
        queue_size: 0,
        queue_timeout: std::time::Duration::from_secs(1),
    };
    let configs = [backend("small", 1), backend("big", 2)];
    let pool = Pool::new(&configs, params, |b| metrics.backend("svc", &b.name), None);
    pool.backends[0]
        .feedback()
        .publish(fixed(0.05), false, None);
    let client = std::net::IpAddr::from([127, 0, 0, 1]);
    let mut small = 0;
    for round in 0..400 {
        // 1.6 and 1.7: 26 and 27 sixteenths, a new schedule every round
        let f = if round % 2 == 0 { 1.6 } else { 1.7 };
        pool.backends[1].feedback().publish(fixed(f), false, None);
        for _ in 0..5 {
            let lease = pool.try_pick(client, &[]).expect("a backend");
            small += usize::from(&*lease.backend().name == "small");
        }
    }
    // its share is 1 place in 27 or 28: about 2000 / 27.5 = 73
    assert!(
        small > 2000 / 28 / 2,
        "the small share got {small} of 2000 picks"
    );
}

/// Three compilers c1, c2, c3.
async fn three_compilers(ca: &TestCa) -> [Compiler; 3] {
    let any = common::any_port();
    [
        Compiler::start(ca, "c1", &[SNI], any).await,
        Compiler::start(ca, "c2", &[SNI], any).await,
        Compiler::start(ca, "c3", &[SNI], any).await,
    ]
}

/// The polls of `backend` counted with `result` so far.
fn polls(cb: &Crossbar, backend: &str, result: &str) -> f64 {
    cb.metric(
        "crossbar_backend_feedback_polls_total",
        &[("backend", backend), ("result", result)],
    )
}

/// `backend`'s feedback is in `phase` (the metric says 1).
fn in_phase(cb: &Crossbar, backend: &str, phase: &str) -> bool {
    cb.metric(
        "crossbar_backend_feedback_phase",
        &[("backend", backend), ("phase", phase)],
    ) == 1.0
}

/// A compiler that lies about its pool takes no more than its share: an absurd
/// sample (4294967295 JRubies, or more free than its pool) is refused and counted
/// as a bad answer; a plausible but high one (64 beside compilers of 3) counts as
/// at most 4 times the others' pool, so the honest ones keep most of their weight
/// (before: the liar got x3.0 and the others the 5 % floor, 200/200 connections).
#[tokio::test]
async fn a_compiler_lying_about_its_pool_never_pushes_the_honest_ones_to_the_floor() {
    let ca = test_ca();
    let [c1, c2, c3] = three_compilers(&ca).await;
    for c in [&c2, &c3] {
        c.answer(Answer::pool(3, 3, 0));
    }
    c1.answer(Answer::pool(3, 3, 0));
    let cb = balancer(&ca, &[&c1, &c2, &c3], "leastconn", FAST).await;
    common::wait_until("all three sampled", || {
        ["c1", "c2", "c3"]
            .iter()
            .all(|b| in_phase(&cb, b, "active"))
    })
    .await;

    for absurd in [
        Answer::pool(u32::MAX, u32::MAX, 0),
        Answer::pool(3, u32::MAX, 0),
    ] {
        let before = polls(&cb, "c1", "bad_answer");
        c1.answer(absurd.clone());
        common::wait_until("the absurd sample refused as a bad answer", || {
            polls(&cb, "c1", "bad_answer") > before
        })
        .await;
        assert!(
            factor(&cb, "c1") <= 1.0 && factor(&cb, "c2") >= 1.0 && factor(&cb, "c3") >= 1.0,
            "{absurd:?}: c1 x{} c2 x{} c3 x{}",
            factor(&cb, "c1"),
            factor(&cb, "c2"),
            factor(&cb, "c3")
        );
    }

    c1.answer(Answer::pool(64, 64, 0));
    common::wait_until("c1's claim of 64 JRubies sampled", || {
        factor(&cb, "c1") > 1.0
    })
    .await;
    let (f1, f2, f3) = (factor(&cb, "c1"), factor(&cb, "c2"), factor(&cb, "c3"));
    assert!(f2 > 0.5 && f3 > 0.5, "c1 x{f1} c2 x{f2} c3 x{f3}");
    let seen = shares(&cb, CONNECTIONS).await;
    let on_c1 = seen.get("c1").copied().unwrap_or(0);
    eprintln!("claiming 64 JRubies beside two of 3: c1 x{f1:.2} c2 x{f2:.2} c3 x{f3:.2}, new connections {seen:?}");
    assert!(
        on_c1 * 3 < CONNECTIONS * 2,
        "at most two thirds to the liar: {seen:?}"
    );
}

/// A saturated compiler (no free JRuby, its queue full, its borrowed JRubies
/// listed as puppetserver lists them) is at the floor whatever the others report:
/// with c2's samples expired and c3's pool locked (before: x2.00, 52 of 60 new
/// connections), then with both locked (before: x3.00, 60/60). The status page
/// draws SATURATED in the warning colour.
#[tokio::test]
async fn a_saturated_compiler_stays_at_the_floor_when_the_others_are_silent_or_locked() {
    let ca = test_ca();
    let [c1, c2, c3] = three_compilers(&ca).await;
    for c in [&c1, &c2, &c3] {
        c.answer(Answer::pool(3, 3, 0));
    }
    let fb =
        "kind: puppet, interval: 100ms, blackout: 0s, smoothing: 30s, expiry: 2s, queue_limit: 4";
    let cb = balancer(&ca, &[&c1, &c2, &c3], "leastconn", fb).await;
    common::wait_until("all three sampled", || {
        ["c1", "c2", "c3"]
            .iter()
            .all(|b| in_phase(&cb, b, "active"))
    })
    .await;
    let locked = Answer::Pool {
        jrubies: 3,
        free: 3,
        queued: 0,
        hits: 0,
        lock: ":acquired",
    };
    c1.answer(Answer::pool(3, 0, 4));
    c2.answer(Answer::Status(403));
    c3.answer(locked.clone());
    common::wait_until("c1 saturated, c2 expired, c3 locked", || {
        cb.metric("crossbar_backend_feedback_saturated", &[("backend", "c1")]) == 1.0
            && in_phase(&cb, "c2", "expired")
            && in_phase(&cb, "c3", "locked")
    })
    .await;
    assert_eq!(
        factor(&cb, "c1"),
        0.05,
        "c1 at the floor beside an expired c2"
    );
    let seen = shares(&cb, 60).await;
    eprintln!("saturated c1 beside an expired c2 and a locked c3: new connections {seen:?}");
    assert!(seen.get("c1").copied().unwrap_or(0) * 5 < 60, "{seen:?}");
    let admin = cb.serve_admin(None).await;
    let page = common::admin_get(admin.addr, "/").await;
    // Each row says its feedback in the colour of its meaning, never fine's.
    let row = |name: &str| {
        page.lines()
            .find(|l| l.contains(&format!("><td>{name}<")))
            .unwrap_or_else(|| panic!("no row of {name} in {page}"))
    };
    assert!(
        row("c1").contains("<span class=\"hl fbk saturated\"")
            && row("c3").contains("<span class=\"hl fbk locked\"")
            && ["c1", "c2", "c3"]
                .iter()
                .all(|b| !row(b).contains("fbk fine")),
        "SATURATED and locked in their own colours: {page}"
    );

    c2.answer(locked);
    common::wait_until("c2 locked too", || in_phase(&cb, "c2", "locked")).await;
    assert_eq!(factor(&cb, "c1"), 0.05, "c1 at the floor beside two locked");
}

/// One absurd sample (refused) or one sample of a pool far larger than before
/// (64 JRubies, once) does not hold the compiler at the floor: the next honest
/// samples set its factor again (before: ramping at 3/64 for RAMP_GIVE_UP, 300 s).
#[tokio::test]
async fn one_absurd_sample_does_not_hold_a_compiler_at_the_floor() {
    let ca = test_ca();
    let (c1, c2) = two_compilers(&ca).await;
    for c in [&c1, &c2] {
        c.answer(Answer::pool(3, 3, 0));
    }
    let cb = balancer(&ca, &[&c1, &c2], "roundrobin", FAST).await;
    both_active(&cb).await;
    for once in [Answer::pool(u32::MAX, u32::MAX, 0), Answer::pool(64, 64, 0)] {
        let before = polls(&cb, "c1", "ok") + polls(&cb, "c1", "bad_answer");
        c1.answer_once(once.clone());
        // The one sample was taken once two more polls are counted (one may have
        // been under way when it was set).
        common::wait_until("the one sample taken", || {
            polls(&cb, "c1", "ok") + polls(&cb, "c1", "bad_answer") >= before + 2.0
        })
        .await;
        factors_until(&cb, "both back at their share", |a, b| a == 1.0 && b == 1.0).await;
        assert!(in_phase(&cb, "c1", "active"), "{once:?}: not ramping");
    }
}
