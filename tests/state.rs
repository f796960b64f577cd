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

/// A service `svc` over `good` and `bad` (whose TLS-hello check an echo server
/// fails), checked once an hour so only the first check or the state file decides,
/// its state file at `state`.
fn checked_yaml(state: &Path, good: &Backend, bad: &Backend) -> String {
    format!(
        "admin: {{ enabled: false }}\nstate_file: \"{}\"\n\
         services:\n  svc:\n    listen: [\"127.0.0.1:0\"]\n    mode: tcp\n    balance: roundrobin\n\
         \x20   health: {{ check: tcp, interval: 1h, timeout: 1s, fall: 3 }}\n\
         \x20   backends:\n      - {{ name: good, address: \"{}\" }}\n\
         \x20     - {{ name: bad, address: \"{}\", health: {{ check: tls-hello }} }}\n",
        state.display(),
        good.addr,
        bad.addr
    )
}

/// A server-state file as crossbar writes it, saved at `saved_at` (Unix seconds),
/// saying `bad` at `bad_addr` was up.
fn state_json(version: u32, saved_at: u64, bad_addr: SocketAddr) -> String {
    format!(
        "{{\"version\":{version},\"saved_at\":{saved_at},\"operator\":{{\"services\":{{}}}},\
         \"health\":{{\"svc\":{{\"bad\":{{\"address\":\"{bad_addr}\",\"up\":true}}}}}}}}\n"
    )
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs()
}

/// The files of `dir` whose name starts with `prefix`.
fn named(dir: &Path, prefix: &str) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .expect("read dir")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix))
        })
        .collect()
}

/// Every kind of unusable server-state file (garbage, empty, truncated, another
/// version, an unknown state word, a directory, a symbolic link) is never fatal:
/// crossbar starts and serves from the configuration (the first checks deciding
/// health), the file is renamed aside (not deleted: its bytes kept) and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unusable_state_file_is_set_aside_and_never_stops_a_start() {
    let log = LogBuffer::install();
    let (good, bad) = (
        Backend::echo("good", true).await,
        Backend::echo("bad", true).await,
    );
    let valid = state_json(1, unix_now(), bad.addr);
    let unknown_word = valid.replace(
        "\"services\":{}",
        "\"services\":{\"svc\":{\"good\":{\"state\":\"frozen\",\"since\":1}}}",
    );
    let kinds: [(&str, Option<String>); 7] = [
        ("garbage", Some("\u{1}\u{2}not json at all".into())),
        ("empty", Some(String::new())),
        ("truncated", Some(valid[..valid.len() / 2].to_string())),
        ("version 2", Some(state_json(2, unix_now(), bad.addr))),
        ("unknown state word", Some(unknown_word)),
        ("directory", None),
        ("symbolic link", None),
    ];
    for (kind, content) in kinds {
        let dir = tempfile::tempdir().expect("temp dir");
        let state = dir.path().join("crossbar.state");
        match (kind, &content) {
            (_, Some(c)) => std::fs::write(&state, c).expect("write"),
            ("directory", None) => std::fs::create_dir(&state).expect("mkdir"),
            _ => {
                let target = dir.path().join("elsewhere.json");
                std::fs::write(&target, &valid).expect("write");
                std::os::unix::fs::symlink(&target, &state).expect("symlink");
            }
        }
        let cb = match Crossbar::try_start(&checked_yaml(&state, &good, &bad)).await {
            Ok(cb) => cb,
            Err(e) => panic!("{kind}: crossbar must start despite the state file: {e}"),
        };
        assert_eq!(five(cb.addr("svc")).await, ["good"; 5], "{kind}");
        let aside = named(dir.path(), "crossbar.state.bad.");
        assert_eq!(aside.len(), 1, "{kind}: set aside once: {aside:?}");
        if let Some(c) = &content {
            let kept = std::fs::read_to_string(&aside[0]).expect("the file set aside");
            assert_eq!(&kept, c, "{kind}: its bytes kept");
        }
        let now_there = std::fs::symlink_metadata(&state);
        assert!(
            now_there.is_err() || now_there.is_ok_and(|m| m.is_file()),
            "{kind}: the path is free for the next save (a regular file once saved)"
        );
        let counted = cb.metric("crossbar_state_file_set_aside_total", &[]);
        assert_eq!(counted, 1.0, "{kind}");
        cb.server.shutdown(Duration::from_secs(1)).await;
        assert!(
            std::fs::read_to_string(&state).is_ok_and(|s| s.contains("\"good\"")),
            "{kind}: a fresh file saved at shutdown"
        );
    }
    assert!(log.contains("the server-state file is unusable"));
}

/// `crossbar check` (the unit's ExecStartPre) warns of an unusable state file and
/// passes; `crossbar run` then starts, names the file in its log and counts it on
/// /metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_warns_of_an_unusable_state_file_and_run_starts_anyway() {
    let (a, b) = (
        Backend::echo("a", true).await,
        Backend::echo("b", true).await,
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let (listen, admin) = (free_port(), free_port());
    let cfg = dir.path().join("crossbar.yaml");
    std::fs::write(&cfg, config(dir.path(), listen, admin, &a, &b, 1)).expect("write");
    std::fs::write(
        dir.path().join("crossbar.state"),
        "{\"version\": 1, \"saved_at\"",
    )
    .expect("write");
    let (ok, out, err) =
        crossbar_cli(vec!["check".into(), "-c".into(), cfg.display().to_string()]).await;
    assert!(ok, "check passes: {out}{err}");
    assert!(
        err.contains("state_file: warning:") && err.contains("will set it aside"),
        "{err}"
    );
    let (_, out, err) = crossbar_cli(vec![
        "doctor".into(),
        "-c".into(),
        cfg.display().to_string(),
    ])
    .await;
    assert!(
        out.contains("WARNING  state_file:") && out.contains("will set it aside"),
        "doctor warns: {out}{err}"
    );
    let (p, log) = run_logged(&cfg, dir.path(), listen, admin).await;
    assert_eq!(five(listen).await.len(), 5);
    let metrics = admin_get(admin, "/metrics").await;
    assert_eq!(
        metric_value(&metrics, "crossbar_state_file_set_aside_total", &[]),
        1.0
    );
    terminate(p).await;
    let logged = std::fs::read_to_string(log).expect("the log");
    assert!(
        logged.contains("the server-state file is unusable") && logged.contains("crossbar.state"),
        "{logged}"
    );
}

/// A state file saved "in the future" (a clock gone back, a copied file) is stale:
/// its health is not trusted and the first checks decide, so a dead backend it
/// says was up gets no connection. The same file saved now is trusted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_file_saved_in_the_future_is_stale() {
    let log = LogBuffer::install();
    let (good, bad) = (
        Backend::echo("good", true).await,
        Backend::echo("bad", true).await,
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let state = dir.path().join("crossbar.state");
    const HOUR: u64 = 3600;
    std::fs::write(&state, state_json(1, unix_now() + HOUR, bad.addr)).expect("write");
    let cb = Crossbar::start(&checked_yaml(&state, &good, &bad)).await;
    assert_eq!(five(cb.addr("svc")).await, ["good"; 5]);
    assert!(!cb.backend("svc", "bad").is_healthy());
    assert!(log.contains("in the future"));
    cb.server.shutdown(Duration::from_secs(1)).await;

    // The control: saved now, the file's word holds until the next check.
    std::fs::write(&state, state_json(1, unix_now(), bad.addr)).expect("write");
    let cb = Crossbar::start(&checked_yaml(&state, &good, &bad)).await;
    assert!(
        cb.backend("svc", "bad").is_healthy(),
        "a fresh file is trusted"
    );
    cb.server.shutdown(Duration::from_secs(1)).await;
}
