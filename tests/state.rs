//! Run-time state that survives restarts (issue 43 item 1): the top-level
//! `state_file` keeps what the operator set (drain, disable, enable, weight) and
//! each backend's last known health; a reload keeps the settings of backends whose
//! file settings did not change and says what it kept and reset; a started
//! crossbar sends no connection to a backend before its first check answered.
mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use common::*;
use serde_json::Value;

/// `admin`, one tcp service `svc` on `listen` over `a` and `b` (b's file weight
/// `b_weight`), no checks, the state file in `dir`.
fn config(
    dir: &Path,
    listen: SocketAddr,
    admin: SocketAddr,
    a: &Backend,
    b: &Backend,
    b_weight: u32,
) -> String {
    format!(
        "admin: {{ listen: \"{admin}\" }}\nstate_file: \"{}\"\n\
         defaults: {{ timeouts: {{ shutdown: 2s }} }}\n\
         services:\n  svc:\n    listen: [\"{listen}\"]\n    mode: tcp\n    health: {{ check: none }}\n\
         \x20   backends:\n      - {{ name: a, address: \"{}\" }}\n\
         \x20     - {{ name: b, address: \"{}\", weight: {b_weight} }}\n",
        dir.join("crossbar.state").display(),
        a.addr,
        b.addr
    )
}

/// `crossbar ARGS --admin URL`, which must succeed: its output.
async fn cli(admin: SocketAddr, args: &[&str]) -> String {
    let mut all: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    all.extend(["--admin".to_string(), format!("http://{admin}")]);
    let (ok, out, err) = crossbar_cli(all).await;
    assert!(ok, "crossbar {args:?}: {out}{err}");
    out
}

/// The state of backend `name` of `svc` as `/api/services` shows it.
async fn state_of(admin: SocketAddr, name: &str) -> String {
    let v = admin_json(admin, "/api/services").await;
    let backends = v["services"][0]["backends"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let b: Option<&Value> = backends.iter().find(|b| b["name"] == name);
    b.and_then(|b| b["state"].as_str())
        .unwrap_or("?")
        .to_string()
}

/// Who answers five new connections.
async fn five(listen: SocketAddr) -> Vec<String> {
    let mut out = Vec::new();
    for _ in 0..5 {
        out.push(who(listen).await.0);
    }
    out
}

/// A drained backend stays drained across `crossbar run` restarts and across
/// reloads that leave it alone; a reload that changes b's file weight resets b's
/// run-time weight and its answer says both; `backend reset` ends the drain, for
/// good (the restart after it keeps a enabled).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_backend_stays_drained_across_restarts_and_untouching_reloads() {
    let (a, b) = (
        Backend::echo("a", true).await,
        Backend::echo("b", true).await,
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let (listen, admin) = (free_port(), free_port());
    let cfg = dir.path().join("crossbar.yaml");
    std::fs::write(&cfg, config(dir.path(), listen, admin, &a, &b, 1)).expect("write");
    let mut p = serving(&cfg, None, listen).await;
    wait_listening(admin).await;
    cli(admin, &["backend", "drain", "svc/a"]).await;
    cli(admin, &["backend", "weight", "svc/b", "7"]).await;

    std::fs::write(&cfg, config(dir.path(), listen, admin, &a, &b, 2)).expect("write");
    let out = cli(admin, &["reload"]).await;
    assert!(
        out.contains("kept: svc/a drain")
            && out.contains(
                "reset: svc/b weight 7 (the reload changed the backend: weight 1 -> 2 in the file)"
            ),
        "{out}"
    );
    let status = cli(admin, &["status"]).await;
    assert!(
        status.contains("  kept (operator): svc/a drain")
            && status.contains("  reset to the file's: svc/b weight 7"),
        "{status}"
    );
    let out = cli(admin, &["reload"]).await;
    assert!(
        out.contains("kept: svc/a drain"),
        "an untouching reload: {out}"
    );
    assert_eq!(state_of(admin, "a").await, "drain");

    for round in 0..2 {
        terminate(p).await;
        p = serving(&cfg, None, listen).await;
        wait_listening(admin).await;
        assert_eq!(state_of(admin, "a").await, "drain", "after restart {round}");
        assert_eq!(five(listen).await, ["b"; 5], "after restart {round}");
    }
    let status = cli(admin, &["status"]).await;
    assert!(status.contains("drain"), "{status}");

    let out = cli(admin, &["backend", "reset", "svc/a"]).await;
    assert!(out.contains("dropped svc/a drain"), "{out}");
    terminate(p).await;
    let p = serving(&cfg, None, listen).await;
    wait_listening(admin).await;
    assert_eq!(
        state_of(admin, "a").await,
        "up",
        "reset holds across a restart"
    );
    terminate(p).await;
}

/// A backend whose check fails (an echo server asked for a TLS hello) while it
/// accepts TCP gets no client connection after a start: its first check ran
/// before crossbar listened (without it, `fall: 3` checks an hour apart would
/// have left it up for hours); after a restart the state file's last known health
/// says so before any check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_no_connection_reaches_a_backend_whose_first_check_fails() {
    let log = LogBuffer::install();
    let (good, bad) = (
        Backend::echo("good", true).await,
        Backend::echo("bad", true).await,
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let yaml = format!(
        "admin: {{ enabled: false }}\nstate_file: \"{}\"\n\
         services:\n  svc:\n    listen: [\"127.0.0.1:0\"]\n    mode: tcp\n    balance: roundrobin\n\
         \x20   health: {{ check: tcp, interval: 1h, timeout: 1s, fall: 3 }}\n\
         \x20   backends:\n      - {{ name: good, address: \"{}\" }}\n\
         \x20     - {{ name: bad, address: \"{}\", health: {{ check: tls-hello }} }}\n",
        dir.path().join("crossbar.state").display(),
        good.addr,
        bad.addr
    );
    for start in ["first start", "restart"] {
        let cb = Crossbar::start(&yaml).await;
        let answered = five(cb.addr("svc")).await;
        assert_eq!(answered, ["good"; 5], "{start}");
        assert!(!cb.backend("svc", "bad").is_healthy(), "{start}");
        cb.server.shutdown(Duration::from_secs(1)).await;
    }
    assert!(log.contains("backend down at start"));
    let saved = std::fs::read_to_string(dir.path().join("crossbar.state")).expect("state file");
    assert!(saved.contains("\"bad\""), "{saved}");
}
