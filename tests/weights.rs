//! Backend weights changed at run time by the operator: `crossbar backend
//! weight` and `POST /api/backends/{service}/{backend}/weight` against a real
//! `crossbar run`, new connections counted per backend over real sockets, real
//! HTTP for the API and real TLS resumption for stickiness.
mod common;

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{connect_from, crossbar_run, free_port, read_name, within, Backend, ChildGuard, SNI};
use crossbar::testbed::{self, BackendTls, TestCa, TlsBackend, Versions};
use serde_json::Value;
use tokio::net::TcpStream;

/// The admin token every bed uses.
const TOKEN: &str = "weights-test-token";

/// A `crossbar run` with its admin endpoint, config file and token file.
struct Bed {
    _dir: tempfile::TempDir,
    cfg: PathBuf,
    admin: SocketAddr,
    process: ChildGuard,
}

impl Bed {
    /// Write `services` (the YAML under `services:`) with an admin section and a
    /// token file, start `crossbar run` on it and wait until it answers.
    async fn start(services: &str, listens: &[SocketAddr]) -> Bed {
        let dir = tempfile::tempdir().unwrap();
        let admin = free_port();
        let token = dir.path().join("admin.token");
        std::fs::write(&token, format!("{TOKEN}\n")).unwrap();
        let private = std::os::unix::fs::PermissionsExt::from_mode(0o600);
        std::fs::set_permissions(&token, private).unwrap();
        let cfg = dir.path().join("crossbar.yaml");
        std::fs::write(&cfg, config(admin, &token, services)).unwrap();
        let process = crossbar_run(&cfg, None, Stdio::inherit());
        for addr in listens.iter().chain([&admin]) {
            wait_listening(*addr).await;
        }
        Bed {
            _dir: dir,
            cfg,
            admin,
            process,
        }
    }

    /// Run `crossbar ARGS -c CONFIG` (the admin address and token from the file);
    /// (exit ok, stdout, stderr).
    async fn cli(&self, args: &[&str]) -> (bool, String, String) {
        let mut all: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        all.extend(["-c".into(), self.cfg.display().to_string()]);
        cli(all).await
    }

    /// `crossbar backend weight TARGET WEIGHT`, which must succeed; its output.
    async fn set_weight(&self, target: &str, weight: &str) -> String {
        let (ok, out, err) = self.cli(&["backend", "weight", target, weight]).await;
        assert!(ok, "crossbar backend weight {target} {weight}: {err}");
        out
    }

    /// One admin request with the token; (status, body).
    async fn call(&self, method: &str, path: &str, extra: &str) -> (u16, String) {
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {TOKEN}\r\n\
             Connection: close\r\n{extra}Content-Length: 0\r\n\r\n",
            self.admin
        );
        http(self.admin, &req).await
    }

    /// A write's answer: (status, the JSON error's text, or "" when it succeeded).
    async fn write(&self, path: &str) -> (u16, String) {
        let (status, body) = self.call("POST", path, "").await;
        let v: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
        (status, v["error"].as_str().unwrap_or("").to_string())
    }

    /// `/api/services`: `service/backend` -> (weight, configured weight).
    async fn weights(&self) -> BTreeMap<String, (u64, u64)> {
        let (status, body) = self.call("GET", "/api/services", "").await;
        assert_eq!(status, 200, "{body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        let mut out = BTreeMap::new();
        for svc in v["services"].as_array().unwrap() {
            for b in svc["backends"].as_array().unwrap() {
                let key = format!(
                    "{}/{}",
                    svc["name"].as_str().unwrap(),
                    b["name"].as_str().unwrap()
                );
                let w = (
                    b["weight"].as_u64().unwrap(),
                    b["configured_weight"].as_u64().unwrap(),
                );
                out.insert(key, w);
            }
        }
        out
    }

    /// The `crossbar_backend_weight` gauge of `service/backend`.
    async fn weight_gauge(&self, service: &str, backend: &str) -> f64 {
        let (status, body) = self.call("GET", "/metrics", "").await;
        assert_eq!(status, 200);
        let labels = [("service", service), ("backend", backend)];
        assert!(body.contains("crossbar_backend_weight{"), "no weight gauge");
        common::metric_value(&body, "crossbar_backend_weight", &labels)
    }
}

/// The whole config: an admin section with `token` and the services.
fn config(admin: SocketAddr, token: &Path, services: &str) -> String {
    format!(
        "admin: {{ listen: \"{admin}\", token_file: \"{}\" }}\n\
         defaults:\n  health: {{ check: none }}\n  retries: 0\n\
         services:\n{services}",
        token.display()
    )
}

/// A `mode: tcp` service `name` on `listen` over tagged echo backends with weights.
fn tcp_service(
    name: &str,
    listen: SocketAddr,
    balance: &str,
    backends: &[(&Backend, u32)],
) -> String {
    let mut y = format!(
        "  {name}:\n    listen: [\"{listen}\"]\n    mode: tcp\n    balance: {balance}\n    backends:\n"
    );
    for (b, w) in backends {
        y.push_str(&format!(
            "      - {{ name: {}, address: \"{}\", weight: {w} }}\n",
            b.name, b.addr
        ));
    }
    y
}

async fn wait_listening(addr: SocketAddr) {
    let start = Instant::now();
    while TcpStream::connect(addr).await.is_err() {
        assert!(
            start.elapsed() < common::WAIT,
            "{addr} not accepting after {:?}",
            common::WAIT
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Run the `crossbar` binary; (exit ok, stdout, stderr).
async fn cli(args: Vec<String>) -> (bool, String, String) {
    common::crossbar_cli(args).await
}

/// Send a raw HTTP/1.1 request and read the answer to the server's close; (status, body).
async fn http(addr: SocketAddr, req: &str) -> (u16, String) {
    let (status, text) = common::raw_request(addr, req.as_bytes(), common::WAIT).await;
    let status = status.unwrap_or_else(|| panic!("no HTTP answer: {text:?}"));
    (status, common::body_of(&text).to_string())
}

/// Client address `i` of a spread over 127.1.0.0/16 (each its own source).
fn client(i: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 1, (i / 250) as u8, (i % 250 + 1) as u8))
}

/// Open `n` connections one after the other (from `from(i)`, or 127.0.0.1) and
/// return the backend that answered each.
async fn backends_of(listen: SocketAddr, n: u32, from: Option<fn(u32) -> IpAddr>) -> Vec<String> {
    let mut out = Vec::with_capacity(n as usize);
    for i in 0..n {
        let src = from.map_or(IpAddr::V4(Ipv4Addr::LOCALHOST), |f| f(i));
        let mut s = connect_from(src, listen).await;
        out.push(read_name(&mut s).await);
    }
    out
}

/// How many of `names` are `name`.
fn count(names: &[String], name: &str) -> usize {
    names.iter().filter(|n| *n == name).count()
}

/// Assert that `names` split over `expected` (backend, weight) in proportion to
/// the weights, each count within five binomial standard deviations of its
/// expectation (a statistical tolerance: the chance that a correct balancer lands
/// outside is under one in a million; a split by the old weights is far outside).
fn assert_in_proportion(names: &[String], expected: &[(&str, u32)]) {
    let n = names.len() as f64;
    let total: u32 = expected.iter().map(|(_, w)| w).sum();
    let mut seen = 0;
    for (name, w) in expected {
        let p = f64::from(*w) / f64::from(total);
        let (want, got) = (n * p, count(names, name) as f64);
        let tol = 5.0 * (n * p * (1.0 - p)).sqrt();
        assert!(
            (got - want).abs() <= tol.max(1.0),
            "{name}: {got} of {n} connections, expected {want:.0} ± {tol:.0} for weight {w} of {total}"
        );
        seen += count(names, name);
    }
    assert_eq!(
        seen,
        names.len(),
        "connections went to backends outside {expected:?}"
    );
}

/// Round robin and source hashing, 3,000 new connections each after the change
/// through the CLI: the split follows the new weights; the CLI says what changed
/// and that a reload or restart returns to the file; `/api/services` and the gauge
/// show both weights.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_weight_set_by_the_cli_shifts_new_connections_in_proportion() {
    let (a, b, c) = (
        Backend::echo("a", true).await,
        Backend::echo("b", true).await,
        Backend::echo("c", true).await,
    );
    let (rr, src) = (free_port(), free_port());
    let services = tcp_service("rr", rr, "roundrobin", &[(&a, 4), (&b, 4), (&c, 4)])
        + &tcp_service("src", src, "source", &[(&a, 4), (&b, 4), (&c, 4)]);
    let bed = Bed::start(&services, &[rr, src]).await;
    let even = [("a", 4), ("b", 4), ("c", 4)];
    assert_in_proportion(&backends_of(rr, 300, None).await, &even);
    let src_before = backends_of(src, 3000, Some(client)).await;
    assert_in_proportion(&src_before, &even);

    for svc in ["rr", "src"] {
        let out = bed.set_weight(&format!("{svc}/a"), "12").await;
        assert_eq!(
            out,
            format!(
                "{svc}/a: weight 12 (was 4; up, 0 active connections)\n  \
                 kept across reloads that leave the backend alone and restarts; `reset` returns it to the configured weight 4\n"
            )
        );
        let out = bed.set_weight(&format!("{svc}/c"), "50%").await;
        assert!(
            out.starts_with(&format!("{svc}/c: weight 2 (was 4;")),
            "{out}"
        );
    }
    let weights = bed.weights().await;
    assert_eq!(weights["rr/a"], (12, 4));
    assert_eq!(weights["rr/b"], (4, 4));
    assert_eq!(weights["src/c"], (2, 4));
    assert_eq!(bed.weight_gauge("src", "a").await, 12.0);
    assert_eq!(bed.weight_gauge("src", "c").await, 2.0);
    let (ok, status, _) = bed.cli(&["status"]).await;
    assert!(
        ok && status.contains("12 (operator; file 4)") && status.contains("2 (operator; file 4)"),
        "{status}"
    );

    let shifted = [("a", 12), ("b", 4), ("c", 2)];
    let started = Instant::now();
    assert_in_proportion(&backends_of(rr, 3000, None).await, &shifted);
    let src_after = backends_of(src, 3000, Some(client)).await;
    assert_in_proportion(&src_after, &shifted);
    eprintln!(
        "6,000 connections after the change in {:?}",
        started.elapsed()
    );
    // Source hashing moves only what the change asks for: no client leaves the
    // backend whose weight went up, none joins the one whose weight went down.
    for (i, (before, after)) in src_before.iter().zip(&src_after).enumerate() {
        assert!(
            before == after || (before != "a" && after != "c"),
            "client {} moved from {before} to {after}",
            client(i as u32)
        );
    }
}

/// Least connections balances open connections per unit of weight: 360 held
/// connections after `a` goes from 1 to 5 split 300/60. Weight 0 on `balance:
/// first`'s first backend sends new connections to the next one while it stays
/// up (not a drain).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leastconn_and_first_follow_the_new_weight() {
    let (a, b) = (
        Backend::echo("a", true).await,
        Backend::echo("b", true).await,
    );
    let (lc, first) = (free_port(), free_port());
    let services = tcp_service("lc", lc, "leastconn", &[(&a, 1), (&b, 1)])
        + &tcp_service("first", first, "first", &[(&a, 1), (&b, 1)]);
    let bed = Bed::start(&services, &[lc, first]).await;
    bed.set_weight("lc/a", "5").await;
    let mut held = Vec::new();
    let mut names = Vec::new();
    for _ in 0..360 {
        let (name, s) = common::who(lc).await;
        names.push(name);
        held.push(s);
    }
    let (on_a, on_b) = (count(&names, "a"), count(&names, "b"));
    assert_eq!(on_a + on_b, 360);
    assert!(
        (299..=301).contains(&on_a),
        "a holds {on_a} of 360 at weight 5 to 1"
    );
    drop(held);

    assert_eq!(backends_of(first, 5, None).await, ["a"; 5]);
    bed.set_weight("first/a", "0").await;
    assert_eq!(backends_of(first, 5, None).await, ["b"; 5]);
    let (status, body) = bed.call("GET", "/api/services", "").await;
    assert_eq!(status, 200);
    let v: Value = serde_json::from_str(&body).unwrap();
    let services = v["services"].as_array().unwrap();
    let svc = services.iter().find(|s| s["name"] == "first").unwrap();
    assert_eq!(svc["active_backend"], "b");
    assert_eq!(svc["backends"][0]["state"], "up", "weight 0 is not a drain");
    assert_eq!(bed.weight_gauge("first", "a").await, 0.0);
}

/// Bad weights, unknown names, weight 0 on the last backend taking new
/// connections, a missing token and cross-site requests are refused with clear
/// errors, and change nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_refuses_bad_weights_and_unauthorized_writes() {
    let (a, b) = (
        Backend::echo("a", true).await,
        Backend::echo("b", true).await,
    );
    let (two, one) = (free_port(), free_port());
    let services = tcp_service("two", two, "roundrobin", &[(&a, 2), (&b, 2)])
        + &tcp_service("one", one, "roundrobin", &[(&a, 200)]);
    let bed = Bed::start(&services, &[two, one]).await;
    let path = |q: &str| format!("/api/backends/two/a/weight{q}");
    for (query, status, says) in [
        ("", 400, "give the new weight: weight=N (0..=256)"),
        (
            "?weight=",
            400,
            "weight must be an integer 0..=256 or a percentage",
        ),
        ("?weight=abc", 400, "got \"abc\""),
        ("?weight=-1", 400, "got \"-1\""),
        ("?weight=1.5", 400, "got \"1.5\""),
        ("?weight=257", 400, "out of range, got \"257\""),
        ("?weight=99999999999", 400, "out of range"),
        (
            "?weight=20000%25",
            400,
            "20000% of the configured weight 2 is 400",
        ),
        ("?weight=5&weight=6", 400, "\"weight\" given twice"),
        ("?weight=5&force=maybe", 400, "force must be true or false"),
        ("?wieght=5", 400, "unknown parameter \"wieght\""),
    ] {
        let (got, error) = bed.write(&path(query)).await;
        assert_eq!(got, status, "{query}: {error}");
        assert!(error.contains(says), "{query}: {error}");
    }
    for (p, says) in [
        (
            "/api/backends/nope/a/weight?weight=1",
            "unknown service \"nope\"",
        ),
        (
            "/api/backends/two/zz/weight?weight=1",
            "unknown backend \"zz\" in service \"two\"",
        ),
    ] {
        let (got, error) = bed.write(p).await;
        assert_eq!((got, error.contains(says)), (404, true), "{p}: {error}");
    }
    let (got, _) = bed.call("GET", &path("?weight=1"), "").await;
    assert_eq!(got, 405);
    // The only backend of `one`: weight 0 needs force; 50% of 200 is 100.
    let (got, error) = bed.write("/api/backends/one/a/weight?weight=0").await;
    assert_eq!(got, 409, "{error}");
    assert!(
        error.contains(
            "a is the last backend of service \"one\" taking new connections (its only backend)"
        ) && error.contains("crossbar backend weight one/a 0 --force"),
        "{error}"
    );
    let (got, error) = bed.write("/api/backends/one/a/weight?weight=50%25").await;
    assert_eq!(got, 200, "{error}");
    // Two backends: b at 0 is fine, then a at 0 is the last one; draining `a`
    // too (b takes none at weight 0).
    assert_eq!(
        bed.write("/api/backends/two/b/weight?weight=0").await.0,
        200
    );
    let (got, error) = bed.write(&path("?weight=0")).await;
    assert_eq!(got, 409, "{error}");
    assert!(error.contains("(others: b up at weight 0)"), "{error}");
    let (got, error) = bed.write("/api/backends/two/a/drain").await;
    assert_eq!(got, 409, "{error}");
    assert!(error.contains("(others: b up at weight 0)"), "{error}");
    // The CLI checks the weight before sending, and says how to force.
    let (ok, _, err) = bed.cli(&["backend", "weight", "two/a", "lots"]).await;
    assert!(
        !ok && err.contains("weight must be an integer 0..=256"),
        "{err}"
    );
    let (ok, _, err) = bed.cli(&["backend", "weight", "two/a", "0"]).await;
    assert!(!ok && err.contains("--force"), "{err}");
    let (ok, out, err) = bed
        .cli(&["backend", "weight", "two/a", "0", "--force"])
        .await;
    assert!(ok, "{err}");
    assert!(out.starts_with("two/a: weight 0 (was 2;"), "{out}");
    let (ok, _, err) = bed.cli(&["backend", "drain", "two/a", "7"]).await;
    assert!(
        !ok && err.contains("goes with `crossbar backend weight` only"),
        "{err}"
    );
    assert_eq!(bed.write(&path("?weight=3")).await.0, 200);

    // Writes without the token, with a wrong one, or from another site's page.
    let admin = bed.admin;
    let write = |headers: &str| {
        format!(
            "POST /api/backends/two/a/weight?weight=9 HTTP/1.1\r\nHost: {admin}\r\n{headers}\
             Connection: close\r\nContent-Length: 0\r\n\r\n"
        )
    };
    for (headers, status) in [
        (String::new(), 401),
        ("Authorization: Bearer wrong\r\n".to_string(), 401),
        (
            format!("Authorization: Bearer {TOKEN}\r\nOrigin: http://evil.example\r\n"),
            403,
        ),
        (
            format!("Authorization: Bearer {TOKEN}\r\nSec-Fetch-Site: cross-site\r\n"),
            403,
        ),
        (
            format!("Authorization: Bearer {TOKEN}\r\nContent-Type: text/plain\r\n"),
            403,
        ),
    ] {
        let (got, body) = http(admin, &write(&headers)).await;
        assert_eq!(got, status, "{headers:?}: {body}");
    }
    let rebound = format!(
        "POST /api/backends/two/a/weight?weight=9 HTTP/1.1\r\nHost: attacker.example\r\n\
         Authorization: Bearer {TOKEN}\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
    );
    assert_eq!(http(admin, &rebound).await.0, 403);
    let w = bed.weights().await;
    assert_eq!(
        (w["two/a"], w["two/b"], w["one/a"]),
        ((3, 2), (0, 2), (100, 200))
    );
}

/// A reload keeps the run-time weights of the backends it leaves alone and returns
/// one whose file weight changed to the file's, and its answer says which (a failed
/// one changes nothing); a restart without a top-level `state_file` returns to the
/// file's weights: the stick table's state file keeps entries, not weights.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_resets_only_the_weights_of_backends_it_changes_and_a_restart_all() {
    let (a, b) = (
        Backend::echo("a", true).await,
        Backend::echo("b", true).await,
    );
    let listen = free_port();
    let state = |dir: &Path| dir.join("svc.table");
    let tmp = tempfile::tempdir().unwrap();
    let services = tcp_service("svc", listen, "source", &[(&a, 3), (&b, 3)]).replace(
        "    backends:\n",
        &format!(
            "    stick: {{ on: [source], state_file: \"{}\", save_interval: 1h }}\n    backends:\n",
            state(tmp.path()).display()
        ),
    );
    let mut bed = Bed::start(&services, &[listen]).await;
    bed.set_weight("svc/a", "7").await;
    bed.set_weight("svc/b", "0").await;
    // New clients only: 127.0.0.1 has a source entry since `wait_listening`, and a
    // sticky hit goes to its backend whatever that backend's weight.
    assert_eq!(backends_of(listen, 3, Some(client)).await, ["a"; 3]);

    // A refused reload (an unknown key) keeps the run-time weights.
    let good = std::fs::read_to_string(&bed.cfg).unwrap();
    std::fs::write(
        &bed.cfg,
        good.replace("mode: tcp", "mode: tcp\n    wieght: 1"),
    )
    .unwrap();
    let (status, body) = bed.call("POST", "/api/reload", "").await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(bed.weights().await["svc/a"], (7, 3));
    std::fs::write(&bed.cfg, &good).unwrap();
    let (ok, out, err) = bed.cli(&["reload"]).await;
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("kept: svc/a weight 7") && out.contains("kept: svc/b weight 0"),
        "{out}"
    );
    assert_eq!(bed.weights().await["svc/a"], (7, 3));
    // b's weight in the file changes: its run-time weight is reset, a's kept.
    let b_line = format!("name: b, address: \"{}\", weight: 3", b.addr);
    let changed = good.replace(&b_line, &b_line.replace("weight: 3", "weight: 4"));
    std::fs::write(&bed.cfg, &changed).unwrap();
    let (ok, out, err) = bed.cli(&["reload"]).await;
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("kept: svc/a weight 7")
            && out.contains(
                "reset: svc/b weight 0 (the reload changed the backend: weight 3 -> 4 in the file)"
            ),
        "{out}"
    );
    let w = bed.weights().await;
    assert_eq!((w["svc/a"], w["svc/b"]), ((7, 3), (4, 4)));
    assert_eq!(bed.weight_gauge("svc", "b").await, 4.0);
    let after_reload = backends_of(listen, 200, Some(client)).await;
    assert!(
        count(&after_reload, "b") > 0,
        "b takes new connections again"
    );

    // A restart too: the table comes back from its state file, the weights from
    // the config file.
    bed.set_weight("svc/a", "9").await;
    bed.process.signal("TERM");
    assert_eq!(bed.process.exited(common::WAIT).await, Some(0));
    assert!(
        state(tmp.path()).exists(),
        "the table was saved at shutdown"
    );
    bed.process = crossbar_run(&bed.cfg, None, Stdio::inherit());
    wait_listening(bed.admin).await;
    let (status, body) = bed.call("GET", "/api/tables/svc", "").await;
    assert_eq!(status, 200, "{body}");
    let table: Value = serde_json::from_str(&body).unwrap();
    assert!(table["stats"]["entries"].as_u64().unwrap() >= 200, "{body}");
    assert_eq!(bed.weights().await["svc/a"], (3, 3));
}

/// A TLS 1.2 session resumes on its backend whatever that backend's weight
/// becomes, 0 included (a sticky hit wins over the balancing), while new clients
/// follow the weights.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_tls_session_returns_to_its_backend_after_its_weight_changes() {
    let ca = TestCa::new("weights test CA").unwrap();
    let tls = BackendTls {
        versions: Versions::Tls12,
        tickets: false,
    };
    let mut backends = Vec::new();
    for n in ["t1", "t2"] {
        backends.push(
            TlsBackend::start(&ca, n, &[SNI], tls, common::any_port())
                .await
                .unwrap(),
        );
    }
    let listen = free_port();
    let services = format!(
        "  puppet:\n    listen: [\"{listen}\"]\n    balance: roundrobin\n\
         \x20   stick: {{ on: [session_id], size: 1000 }}\n    backends:\n\
         \x20     - {{ name: t1, address: \"{}\" }}\n\
         \x20     - {{ name: t2, address: \"{}\" }}\n",
        backends[0].addr, backends[1].addr
    );
    let bed = Bed::start(&services, &[listen]).await;
    let agent = || testbed::client_config(&ca, Versions::Tls12, false).unwrap();
    let get = |cfg| async move {
        within("a TLS request", testbed::get(listen, SNI, cfg, "/"))
            .await
            .unwrap()
    };
    let (one, two) = (agent(), agent());
    let first = get(one.clone()).await;
    let second = get(two.clone()).await;
    assert!(!first.resumed && !second.resumed);
    assert_ne!(
        first.backend, second.backend,
        "round robin spreads the first two"
    );

    // `one`'s backend to weight 0, the other's up: new agents go to the other...
    bed.set_weight(&format!("puppet/{}", first.backend), "0")
        .await;
    bed.set_weight(&format!("puppet/{}", second.backend), "256")
        .await;
    for _ in 0..4 {
        assert_eq!(get(agent()).await.backend, second.backend);
    }
    // ...and `one` still resumes where its session is.
    let again = get(one.clone()).await;
    assert_eq!((&again.backend, again.resumed), (&first.backend, true));
    // The other way round: `two`'s backend to 0, `one`'s to 1.
    bed.set_weight(&format!("puppet/{}", first.backend), "1")
        .await;
    bed.set_weight(&format!("puppet/{}", second.backend), "0")
        .await;
    assert_eq!(get(agent()).await.backend, first.backend);
    let again = get(two).await;
    assert_eq!((&again.backend, again.resumed), (&second.backend, true));
}
