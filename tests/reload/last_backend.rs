//! A reload that would leave a service with no backend for new connections (the
//! others drained at run time, the last one removed from the file) is refused as
//! the same drain is: 409 on `POST /api/reload`, exit 1 from `crossbar reload`,
//! naming the service and the backends; `--force` applies it and says so in the
//! answer, the log and `crossbar status`.
use std::net::SocketAddr;
use std::path::Path;

use crate::common::*;

/// One tcp service `svc` on `listen` over the echo backends `backends`, no checks,
/// the admin endpoint on `admin`.
fn yaml(listen: SocketAddr, admin: SocketAddr, backends: &[&Backend]) -> String {
    let lines: String = backends
        .iter()
        .map(|b| format!("      - {{ name: {}, address: \"{}\" }}\n", b.name, b.addr))
        .collect();
    format!(
        "admin: {{ listen: \"{admin}\" }}\n\
         defaults: {{ timeouts: {{ shutdown: 2s }} }}\n\
         services:\n  svc:\n    listen: [\"{listen}\"]\n    mode: tcp\n    health: {{ check: none }}\n\
         \x20   backends:\n{lines}"
    )
}

/// `crossbar ARGS --admin URL`: (exit ok, stdout and stderr).
async fn cli(admin: SocketAddr, args: &[&str]) -> (bool, String) {
    let mut all: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    all.extend(["--admin".to_string(), format!("http://{admin}")]);
    let (ok, out, err) = crossbar_cli(all).await;
    (ok, format!("{out}{err}"))
}

fn write(cfg: &Path, text: &str) {
    std::fs::write(cfg, text).expect("write the config");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_leaves_no_backend_is_refused_unless_forced() {
    let (a, b, c) = (
        Backend::echo("a", true).await,
        Backend::echo("b", true).await,
        Backend::echo("c", true).await,
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let (listen, admin) = (free_port(), free_port());
    let cfg = dir.path().join("crossbar.yaml");
    write(&cfg, &yaml(listen, admin, &[&a, &b, &c]));
    let (p, log) = run_logged(&cfg, dir.path(), listen, admin).await;
    for name in ["svc/a", "svc/b"] {
        let (ok, out) = cli(admin, &["backend", "drain", name]).await;
        assert!(ok, "{out}");
    }
    write(&cfg, &yaml(listen, admin, &[&a, &b]));

    let (ok, out) = cli(admin, &["reload"]).await;
    assert!(!ok, "crossbar reload exits 1: {out}");
    assert!(
        out.contains("service svc would have no backend for new connections")
            && out.contains("a drain (operator), b drain (operator), c leaves the configuration")
            && out.contains("--force"),
        "{out}"
    );
    let (status, body) = api_reload(admin).await;
    assert_eq!(status, Some(409), "{body}");
    assert_eq!(who(listen).await.0, "c", "the running configuration stays");

    let (ok, out) = cli(admin, &["reload", "--force"]).await;
    assert!(ok, "{out}");
    assert!(
        out.contains("forced: service svc would have no backend"),
        "the answer warns: {out}"
    );
    let (ok, status) = cli(admin, &["status"]).await;
    assert!(ok && status.contains("forced: service svc"), "{status}");
    let metrics = admin_get(admin, "/metrics").await;
    let refused = |m: &str| {
        metric_value(
            m,
            "crossbar_route_refused_total",
            &[("service", "svc"), ("reason", "no_backend")],
        )
    };
    let before = refused(&metrics);
    let _client = tokio::net::TcpStream::connect(listen)
        .await
        .expect("crossbar accepts, then refuses");
    wait_until_async("the next client refused: no_backend", || async move {
        refused(&admin_get(admin, "/metrics").await) > before
    })
    .await;
    terminate(p).await;
    let logged = std::fs::read_to_string(log).expect("the log");
    assert!(
        logged.contains("forced: service svc"),
        "the log warns: {logged}"
    );
}
