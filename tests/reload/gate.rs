//! Every reload path (SIGHUP, `POST /api/reload`, `crossbar reload` without `-c`)
//! checks what `crossbar check` checks, the files the config
//! names included, and probes new health settings before it commits them. A real
//! `crossbar run` with two rustls backends checked over https with a CA file:
//! - a missing `ca_file` is refused on each path (422, the log, the error counter,
//!   the last reload's reason in `/api/services` and `crossbar status`), and both
//!   backends keep passing their checks and stay up;
//! - a `ca_file` of another CA, or a `server_name` the certificates don't carry,
//!   fails every backend's check: refused, with the reason in the doctor's words;
//! - during an outage (no backend passing now) such a reload is applied with a
//!   warning, and so is a new service whose backends all fail.
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::common::*;
use crate::{crossbar, text};
use crossbar::testbed::{BackendTls, TestCa, TlsBackend};
use serde_json::Value;

/// Checks often enough that "passes its checks after the refused reload" is quick;
/// `fall: 2` so one slow check on a busy machine does not take a backend down.
const HEALTH: &str = "check: https, interval: 200ms, timeout: 5s, rise: 1, fall: 2";
/// Passed checks each backend must add after a refused reload before the test
/// looks at its state: more than `fall`, so a failing setting would have shown.
const MORE_PASSES: f64 = 3.0;

/// A running `crossbar run` with backends `a` and `b` (certificates for [`SNI`] from
/// `ca`), checked over https against `ca.pem`.
struct Site {
    proc: ChildGuard,
    file: PathBuf,
    admin: SocketAddr,
    listen: SocketAddr,
    log: PathBuf,
    a: TlsBackend,
    b: TlsBackend,
    dir: tempfile::TempDir,
}

impl Site {
    async fn start(ca: &TestCa) -> Site {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca.cert_pem()).unwrap();
        let (a, b) = (backend(ca, "a").await, backend(ca, "b").await);
        let (admin, listen) = (free_port(), free_port());
        let file = dir.path().join("crossbar.yaml");
        let log = dir.path().join("stderr.log");
        let mut site = Site {
            proc: ChildGuard(Command::new("true").spawn().unwrap()),
            file,
            admin,
            listen,
            log,
            a,
            b,
            dir,
        };
        std::fs::write(&site.file, site.yaml("")).unwrap();
        let stderr = Stdio::from(std::fs::File::create(&site.log).unwrap());
        site.proc = crossbar_run(&site.file, None, stderr);
        wait_until_async("the admin endpoint", || async {
            tokio::net::TcpStream::connect(admin).await.is_ok()
        })
        .await;
        site
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The config with `extra` added to the health block (settings given twice: the
    /// later wins).
    fn yaml(&self, extra: &str) -> String {
        format!(
            "admin: {{ listen: \"{}\" }}\nservices:\n  svc:\n    listen: [\"{}\"]\n    \
             server_names: [\"{SNI}\"]\n    \
             health: {{ {HEALTH}, ca_file: \"{}\"{extra} }}\n    backends:\n      \
             - {{ name: a, address: \"{}\" }}\n      - {{ name: b, address: \"{}\" }}\n",
            self.admin,
            self.listen,
            self.path("ca.pem").display(),
            self.a.addr,
            self.b.addr
        )
    }

    /// `POST /api/reload` of `yaml`: the status and the JSON answer.
    async fn api_reload(&self, yaml: &str) -> (Option<u16>, Value) {
        std::fs::write(&self.file, yaml).unwrap();
        let (status, body) = api_reload(self.admin).await;
        let json = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
        (status, json)
    }

    async fn services(&self) -> Value {
        serde_json::from_str(&admin_get(self.admin, "/api/services").await).unwrap()
    }

    async fn metrics(&self) -> String {
        admin_get(self.admin, "/metrics").await
    }

    async fn checks(&self, backend: &str, result: &str) -> f64 {
        let labels = [("service", "svc"), ("backend", backend), ("result", result)];
        metric_value(
            &self.metrics().await,
            "crossbar_health_checks_total",
            &labels,
        )
    }

    async fn reloads(&self, result: &str) -> f64 {
        metric_value(
            &self.metrics().await,
            "crossbar_config_reloads_total",
            &[("result", result)],
        )
    }

    /// Both backends pass [`MORE_PASSES`] more checks, none fails meanwhile, and
    /// both are up: the running health settings are still the ones in force.
    async fn assert_backends_stay_up(&self, what: &str) {
        for name in ["a", "b"] {
            let (ok, fail) = (
                self.checks(name, "ok").await,
                self.checks(name, "fail").await,
            );
            wait_until_async(
                &format!("{what}: {name} passes more checks"),
                || async move { self.checks(name, "ok").await >= ok + MORE_PASSES },
            )
            .await;
            assert_eq!(
                self.checks(name, "fail").await,
                fail,
                "{what}: {name} failed a check"
            );
        }
        let states = backend_states(&self.services().await);
        assert_eq!(
            states,
            [("a".into(), "up".into()), ("b".into(), "up".into())],
            "{what}"
        );
    }

    /// The last reload as `/api/services` reports it.
    async fn last_reload(&self) -> Value {
        self.services().await["crossbar"]["last_reload"].clone()
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap()
    }
}

async fn backend(ca: &TestCa, name: &str) -> TlsBackend {
    let bind = "127.0.0.1:0".parse().unwrap();
    TlsBackend::start(ca, name, &[SNI], BackendTls::default(), bind)
        .await
        .expect("a TLS backend")
}

fn backend_states(services: &Value) -> Vec<(String, String)> {
    services["services"][0]["backends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                b["name"].as_str().unwrap().into(),
                b["state"].as_str().unwrap().into(),
            )
        })
        .collect()
}

/// The error text of the last reload, asserting it failed.
fn failed_reason(last: &Value) -> String {
    assert_eq!(last["ok"], Value::Bool(false), "{last}");
    last["error"].as_str().unwrap_or_default().to_string()
}

/// A missing `ca_file`, through SIGHUP, the API and `crossbar reload` without `-c`:
/// refused on each, counted, logged, shown as the last reload with its reason, and
/// both backends keep passing their checks. (Before: `reload complete`, and every
/// backend went down.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_ca_file_is_refused_on_every_reload_path_and_backends_stay_up() {
    let ca = TestCa::new("Site CA").unwrap();
    let site = Site::start(&ca).await;
    let missing = site.path("missing.pem");
    let broken = site.yaml("").replace(
        &site.path("ca.pem").display().to_string(),
        &missing.display().to_string(),
    );
    let why = format!(
        "services.svc.health.ca_file: cannot read {} as PEM certificates",
        missing.display()
    );

    // SIGHUP
    std::fs::write(&site.file, &broken).unwrap();
    site.proc.signal("HUP");
    wait_until_async("the SIGHUP reload counted as failed", || async {
        site.reloads("error").await == 1.0
    })
    .await;
    assert_eq!(site.reloads("ok").await, 0.0);
    let reason = failed_reason(&site.last_reload().await);
    assert!(reason.contains(&why), "{reason}");
    // Log lines reach the file through the writer thread: wait for the line, not a time.
    wait_until("the refusal is logged", || {
        site.log_text()
            .contains("reload failed, keeping the running configuration")
    })
    .await;
    let log = site.log_text();
    assert!(
        log.contains("reload failed, keeping the running configuration") && log.contains(&why),
        "{log}"
    );
    assert!(!log.contains("reload complete"), "{log}");
    site.assert_backends_stay_up("after SIGHUP").await;

    // POST /api/reload
    let (status, answer) = site.api_reload(&broken).await;
    assert_eq!(status, Some(422), "{answer}");
    let error = answer["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("keeping the running configuration") && error.contains(&why),
        "{answer}"
    );
    assert_eq!(site.reloads("error").await, 2.0);
    site.assert_backends_stay_up("after the API").await;

    // `crossbar reload` without -c: it checks nothing itself, the server refuses.
    let url = format!("http://{}", site.admin);
    let out = crossbar(&["reload", "--admin", &url]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.starts_with("error: 422") && stderr.contains(&why),
        "{stderr}"
    );
    assert_eq!(site.reloads("error").await, 3.0);
    site.assert_backends_stay_up("after crossbar reload").await;

    // `crossbar status` shows the refusal and its reason; --json has it too.
    let out = crossbar(&["status", "--admin", &url]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let line = stdout
        .lines()
        .find(|l| l.starts_with("last reload: FAILED"))
        .unwrap_or_else(|| panic!("no failed last reload in:\n{stdout}"));
    assert!(
        line.contains("running configuration kept") && line.contains(&why),
        "{line}"
    );
    let out = crossbar(&["status", "--admin", &url, "--json"]);
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(failed_reason(&json["crossbar"]["last_reload"]).contains(&why));

    // And the status page.
    let page = admin_get(site.admin, "/").await;
    assert!(
        page.contains("FAILED") && page.contains("missing.pem"),
        "{page}"
    );

    // The file fixed: applied.
    let (status, answer) = site.api_reload(&site.yaml("")).await;
    assert_eq!(status, Some(200), "{answer}");
    assert_eq!(site.last_reload().await["ok"], Value::Bool(true));
    site.assert_backends_stay_up("after the fix").await;
}

/// New health settings that every backend fails, though each file is fine: a CA
/// file of another CA, a `server_name` the certificates don't carry. Refused with
/// the service, the backends passing now and why each would fail, as `doctor` says
/// it; the backends stay up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_settings_that_fail_every_backend_are_refused_with_the_reason() {
    let ca = TestCa::new("Site CA").unwrap();
    let other = TestCa::new("Other CA").unwrap();
    let site = Site::start(&ca).await;
    std::fs::write(site.path("other.pem"), other.cert_pem()).unwrap();

    let wrong_ca = site.yaml("").replace(
        &site.path("ca.pem").display().to_string(),
        &site.path("other.pem").display().to_string(),
    );
    let wrong_name = site.yaml(", server_name: wrong.example.com");
    let cases = [
        (
            "a ca_file of another CA",
            wrong_ca,
            vec![
                "the certificate CN=a is issued by CN=Site CA, which is not in `health.ca_file`",
                "it holds CN=Other CA",
                "(and alike: b)",
            ],
        ),
        (
            "a server_name the certificates don't carry",
            wrong_name,
            vec![
                "verifies the certificate CN=a against `wrong.example.com` (from `health.server_name`)",
                "Fix: set `health.server_name: puppet.example.com`",
                "(and alike: b)",
            ],
        ),
    ];
    for (n, (what, yaml, words)) in cases.into_iter().enumerate() {
        let (status, answer) = site.api_reload(&yaml).await;
        assert_eq!(status, Some(422), "{what}: {answer}");
        let error = answer["error"].as_str().unwrap_or_default();
        let lead = "service svc: no backend would pass its health check (https /status/v1/simple) \
                    under the new settings, while a, b pass their checks now";
        assert!(error.contains(lead), "{what}: {error}");
        for w in words {
            assert!(error.contains(w), "{what}: no {w:?} in {error}");
        }
        assert_eq!(
            failed_reason(&site.last_reload().await),
            error.trim_start_matches("reload failed, keeping the running configuration: ")
        );
        assert_eq!(site.reloads("error").await, (n + 1) as f64);
        site.assert_backends_stay_up(what).await;
    }
}

/// During an outage (no backend passing now) new health settings that fail too are
/// applied, with a warning: a reload is never blocked by the outage it may fix. A
/// new service none of whose backends passes is applied with a warning too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_does_not_block_a_reload_but_is_warned_about() {
    let ca = TestCa::new("Site CA").unwrap();
    let site = Site::start(&ca).await;
    site.a.stop();
    site.b.stop();
    wait_until_async("both backends down", || async {
        backend_states(&site.services().await)
            .iter()
            .all(|(_, s)| s == "down")
    })
    .await;

    let refusing = refusing_addr();
    let yaml = format!(
        "{}  extra:\n    mode: tcp\n    listen: [\"{}\"]\n    health: {{ check: tcp }}\n    \
         backends:\n      - {{ name: gone, address: \"{refusing}\" }}\n",
        site.yaml(", path: /status/v1/simple/server"),
        free_port()
    );
    let (status, answer) = site.api_reload(&yaml).await;
    assert_eq!(status, Some(200), "{answer}");
    let warnings: Vec<&str> = answer["warnings"]
        .as_array()
        .unwrap_or_else(|| panic!("no warnings in {answer}"))
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(warnings.len(), 2, "{answer}");
    assert!(
        warnings[0].starts_with(
            "service svc: no backend passes its health check now, and none would under the \
             new settings (https /status/v1/simple/server) either: a: connect: "
        ),
        "{}",
        warnings[0]
    );
    assert!(
        warnings[1].starts_with("new service extra: no backend passes its health check (tcp)"),
        "{}",
        warnings[1]
    );
    let last = site.last_reload().await;
    assert_eq!(last["ok"], Value::Bool(true), "{last}");
    assert_eq!(last["warnings"].as_array().map(Vec::len), Some(2), "{last}");
    assert_eq!(site.reloads("ok").await, 1.0);
    let services = site.services().await;
    assert_eq!(services["services"][1]["name"], "extra", "{services}");
    let page = admin_get(site.admin, "/").await;
    assert!(page.contains("with 2 warning(s)"), "{page}");

    // `crossbar reload` prints the warnings after `reloaded`; services whose checks
    // did not change are not probed again (`extra` is not warned about twice).
    let ca_path = yaml.replace("/status/v1/simple/server", "/status/v1/simple/ca");
    std::fs::write(&site.file, ca_path).unwrap();
    let out = crossbar(&["reload", "--admin", &format!("http://{}", site.admin)]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert_eq!(lines[0], "reloaded");
    assert!(
        lines[1].starts_with(
            "warning: service svc: no backend passes its health check now, and none would \
             under the new settings (https /status/v1/simple/ca) either"
        ),
        "{stdout}"
    );
}
