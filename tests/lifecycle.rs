//! The process's life with real `crossbar run` processes: a hitless binary upgrade
//! under continuous load, SIGTERM draining, a broken SIGHUP reload, and stick tables
//! that survive a restart; with `workers: 1`, a reload, an upgrade and a drain.
mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::snapshot::Snapshot;
use common::*;
use crossbar::testbed::{self, BackendTls, TestCa, TlsBackend, Versions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Load: each client connection sends this many bytes and expects them echoed.
const PING: usize = 64;
/// Longest the load phase of a test runs, whatever happens.
const LOAD_CAP: Duration = Duration::from_secs(30);

/// The pid of the process listening on the upgrade socket at `path` (SO_PEERCRED
/// of a connection to it), if one does. The connection says nothing and closes: the
/// listener drops it as an aborted handover.
fn upgrade_socket_pid(path: &Path) -> Option<i32> {
    use nix::sys::socket::{getsockopt, sockopt};
    let s = std::os::unix::net::UnixStream::connect(path).ok()?;
    getsockopt(&s, sockopt::PeerCredentials)
        .ok()
        .map(|c| c.pid())
}

async fn wait_listening(addr: SocketAddr) {
    wait_until_async(&format!("{addr} accepting"), || async move {
        TcpStream::connect(addr).await.is_ok()
    })
    .await;
}

async fn wait_until_async<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while start.elapsed() < WAIT {
        if cond().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

/// One echo round trip on a fresh connection.
async fn ping(addr: SocketAddr) -> Result<(), String> {
    let mut s = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let data = [7u8; PING];
    s.write_all(&data)
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut got = [0u8; PING];
    s.read_exact(&mut got)
        .await
        .map_err(|e| format!("read: {e}"))?;
    if got != data {
        return Err("echo differs".into());
    }
    Ok(())
}

struct Load {
    ok: Arc<AtomicUsize>,
    failed: Arc<std::sync::Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// `clients` tasks pinging `addr` back to back until stopped (or LOAD_CAP).
fn load(addr: SocketAddr, clients: usize) -> Load {
    let ok = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(std::sync::Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let tasks = (0..clients)
        .map(|_| {
            let (ok, failed, stop) = (ok.clone(), failed.clone(), stop.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) && started.elapsed() < LOAD_CAP {
                    match ping(addr).await {
                        Ok(()) => ok.fetch_add(1, Ordering::Relaxed),
                        Err(e) => {
                            failed.lock().unwrap().push(e);
                            0
                        }
                    };
                }
            })
        })
        .collect();
    Load {
        ok,
        failed,
        stop,
        tasks,
    }
}

impl Load {
    async fn finish(self) -> (usize, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            t.await.unwrap();
        }
        let failed = self.failed.lock().unwrap().clone();
        (self.ok.load(Ordering::Relaxed), failed)
    }
}

fn tcp_config(dir: &Path, listen: SocketAddr, backend: SocketAddr, extra: &str) -> PathBuf {
    let yaml = format!(
        "admin: {{ enabled: false }}\n\
         defaults: {{ timeouts: {{ shutdown: 10s }} }}\n\
         services:\n  svc:\n    listen: [\"{listen}\"]\n    mode: tcp\n    health: {{ check: none }}\n{extra}\
         \x20   backends:\n      - {{ name: echo, address: \"{backend}\" }}\n"
    );
    let path = dir.join("crossbar.yaml");
    std::fs::write(&path, yaml).unwrap();
    path
}

/// An echo backend behind a tcp-mode service (with `extra` settings) on a free
/// port, its config file in a temp dir: `(backend, dir, listen, config)`.
async fn echo_service(extra: &str) -> (Backend, tempfile::TempDir, SocketAddr, PathBuf) {
    let echo = Backend::echo("echo", false).await;
    let dir = tempfile::tempdir().unwrap();
    let listen = free_port();
    let cfg = tcp_config(dir.path(), listen, echo.addr, extra);
    (echo, dir, listen, cfg)
}

/// `crossbar run` on `cfg`, once it accepts connections on `listen`.
async fn serving(cfg: &Path, upgrade: Option<&Path>, listen: SocketAddr) -> ChildGuard {
    let p = crossbar_run(cfg, upgrade, Stdio::inherit());
    wait_listening(listen).await;
    p
}

/// Start a successor on `cfg` that takes over at `sock`; returns once the handover
/// is complete: the new process listens on the upgrade socket, which it binds only
/// after the old one let go of it (BYE).
async fn upgrade(cfg: &Path, sock: &Path) -> ChildGuard {
    let new = crossbar_run(cfg, Some(sock), Stdio::inherit());
    let new_pid = new.0.id() as i32;
    wait_until_async("the successor owns the upgrade socket", || async move {
        upgrade_socket_pid(sock) == Some(new_pid)
    })
    .await;
    new
}

/// SIGTERM, then the process must exit 0 (within [`WAIT`]).
async fn terminate(mut p: ChildGuard) {
    p.signal("TERM");
    assert_eq!(p.exited(WAIT).await, Some(0), "exit status after SIGTERM");
}

/// Two upgrades in a row under continuous load: not one connection attempt fails,
/// and a connection established before each upgrade keeps working until it is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_upgrade_under_load_loses_nothing() {
    let (_echo, dir, listen, cfg) = echo_service("").await;
    let sock = dir.path().join("upgrade.sock");

    let mut old = serving(&cfg, Some(&sock), listen).await;
    let load = load(listen, 4);
    for round in 0..2 {
        // A long-lived connection on the old process, mid-conversation.
        let mut long = TcpStream::connect(listen).await.unwrap();
        long.write_all(b"before").await.unwrap();
        let mut buf = [0u8; 6];
        long.read_exact(&mut buf).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;

        // The old one drains after the handover: it exits only when `long` is done.
        let new = upgrade(&cfg, &sock).await;
        assert_eq!(
            old.0.try_wait().unwrap(),
            None,
            "round {round}: old process drains"
        );
        long.write_all(b"during").await.unwrap();
        long.read_exact(&mut buf).await.unwrap();
        assert_eq!(
            &buf, b"during",
            "round {round}: established connection survived"
        );
        drop(long);
        assert_eq!(
            old.exited(WAIT).await,
            Some(0),
            "round {round}: old process drained and exited"
        );
        old = new;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let (ok, failed) = load.finish().await;
    println!(
        "upgrade under load: {ok} round trips, {} failed",
        failed.len()
    );
    assert!(failed.is_empty(), "failed connections: {failed:?}");
    assert!(ok > 50, "load ran ({ok})");
    terminate(old).await;
}

/// SIGTERM: new connections are refused at once, an established one finishes its
/// work, and the process exits 0 as soon as it is done (well within the timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_established_connections_then_exits() {
    let (_echo, _dir, listen, cfg) = echo_service("").await;
    let mut p = serving(&cfg, None, listen).await;

    let mut long = TcpStream::connect(listen).await.unwrap();
    long.write_all(b"ping").await.unwrap();
    let mut buf = [0u8; 4];
    long.read_exact(&mut buf).await.unwrap();
    p.signal("TERM");
    wait_until_async("listener closed", || async move {
        TcpStream::connect(listen).await.is_err()
    })
    .await;
    // Still served after the signal, and still running while it is open.
    let data = payload(1 << 20, 9);
    let (n, digest) = exchange(long, &data).await;
    assert_eq!((n, digest), (data.len() as u64, sha(&data)));
    assert_eq!(p.exited(WAIT).await, Some(0));
}

/// `GET /metrics` from an admin endpoint; `None` if it can't be reached.
async fn scrape(admin: SocketAddr) -> Option<String> {
    let mut s = TcpStream::connect(admin).await.ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .ok()?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.ok()?;
    String::from_utf8(out).ok()
}

/// Turn on the admin endpoint of a [`tcp_config`] file, on a free port: its address.
fn enable_admin(cfg: &Path) -> SocketAddr {
    let admin = free_port();
    let yaml = std::fs::read_to_string(cfg).unwrap().replace(
        "admin: { enabled: false }",
        &format!("admin: {{ listen: \"{admin}\" }}"),
    );
    std::fs::write(cfg, yaml).unwrap();
    admin
}

/// SIGHUP with a broken file, then with one that checks but can't be applied (an
/// address in use) and would disable the backend and add another: each reload is
/// attempted and fails (counted as an error), nothing of either file is applied
/// (services, backends and metrics as they were), and the process keeps serving
/// with the old config.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_reload_keeps_the_running_config() {
    let (_echo, _dir, listen, cfg) = echo_service("").await;
    let admin = enable_admin(&cfg);
    let yaml = std::fs::read_to_string(&cfg).unwrap();
    let mut p = serving(&cfg, None, listen).await;
    wait_listening(admin).await;
    let failed = |text: &str| {
        metric_value(
            text,
            "crossbar_config_reloads_total",
            &[("result", "error")],
        )
    };
    assert_eq!(failed(&scrape(admin).await.unwrap()), 0.0);
    let before = Snapshot::settled(admin, &[], 0).await;
    std::fs::write(&cfg, "services: [this is: not valid\n").unwrap();
    p.signal("HUP");
    wait_until_async("the reload counted as failed", || async move {
        scrape(admin).await.is_some_and(|t| failed(&t) == 1.0)
    })
    .await;
    let text = scrape(admin).await.unwrap();
    assert_eq!(
        metric_value(&text, "crossbar_config_reloads_total", &[("result", "ok")]),
        0.0,
        "no reload succeeded"
    );
    before.assert_same(&Snapshot::take(admin, &[]).await, "a bad file");

    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let extra = taken.local_addr().unwrap();
    let harmful = yaml
        .replace(
            &format!("listen: [\"{listen}\"]"),
            &format!("listen: [\"{listen}\", \"{extra}\"]"),
        )
        .replace("{ name: echo, ", "{ name: echo, disabled: true, ")
        + &format!("      - {{ name: ghost, address: \"{extra}\" }}\n");
    std::fs::write(&cfg, harmful).unwrap();
    p.signal("HUP");
    wait_until_async("the second reload counted as failed", || async move {
        scrape(admin).await.is_some_and(|t| failed(&t) == 2.0)
    })
    .await;
    before.assert_same(&Snapshot::take(admin, &[]).await, "an address in use");
    drop(taken);
    for _ in 0..5 {
        ping(listen)
            .await
            .expect("still serving after a bad reload");
    }
    assert_eq!(p.0.try_wait().unwrap(), None, "still running");
    terminate(p).await;
}

/// `crossbar run` on `cfg`, its stderr in a file in `dir`, once `listen` and `admin`
/// accept connections; the process and the file's path.
async fn run_logged(
    cfg: &Path,
    dir: &Path,
    listen: SocketAddr,
    admin: SocketAddr,
) -> (ChildGuard, PathBuf) {
    let log_path = dir.join("stderr.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let p = crossbar_run(cfg, None, Stdio::from(log));
    wait_listening(listen).await;
    wait_listening(admin).await;
    (p, log_path)
}

/// SIGHUP the first reload of `p`; returns once `admin` counts it as done.
async fn reload_done(p: &ChildGuard, admin: SocketAddr) {
    p.signal("HUP");
    let reloaded =
        |text: &str| metric_value(text, "crossbar_config_reloads_total", &[("result", "ok")]);
    wait_until_async("the reload counted as done", || async move {
        scrape(admin).await.is_some_and(|t| reloaded(&t) == 1.0)
    })
    .await;
}

/// An operator upgrades crossbar with a config that still names the retired
/// `relay: kernel`: the process starts and serves (with splice-auto), says so in a
/// warning at `file:line:col`, and a SIGHUP reload of that same file succeeds and
/// warns again; neither a start nor a reload is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retired_relay_kernel_starts_and_reloads_with_a_warning() {
    let (_echo, dir, listen, cfg) = echo_service("    relay: kernel\n").await;
    let admin = enable_admin(&cfg);
    let (p, log_path) = run_logged(&cfg, dir.path(), listen, admin).await;
    let warning = format!(
        "{}:8:12: services.svc.relay: warning: `kernel` was retired",
        cfg.display()
    );
    let warnings = || {
        let text = std::fs::read_to_string(&log_path).unwrap();
        text.matches(&warning).count()
    };
    // Log lines reach stderr through the writer thread: wait for it, not for a time.
    wait_until_async("the start warning is written", || {
        let n = warnings();
        async move { n == 1 }
    })
    .await;
    ping(listen)
        .await
        .expect("served with the retired relay named");

    reload_done(&p, admin).await;
    wait_until_async("the reload warns again", || {
        let n = warnings();
        async move { n == 2 }
    })
    .await;
    ping(listen).await.expect("served after the reload");
    terminate(p).await;
}

/// A reload that changes what only a start reads (`workers`, the admin address)
/// applies the rest and names each of those in a warning; the admin endpoint stays
/// where it was bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_names_the_settings_only_a_restart_applies() {
    let (_echo, dir, listen, cfg) = echo_service("").await;
    let admin = enable_admin(&cfg);
    let (p, log_path) = run_logged(&cfg, dir.path(), listen, admin).await;
    let moved = free_port();
    let yaml = std::fs::read_to_string(&cfg).unwrap();
    let yaml = yaml.replace(&admin.to_string(), &moved.to_string());
    std::fs::write(&cfg, format!("workers: 1\n{yaml}")).unwrap();
    reload_done(&p, admin).await;
    let workers = "`workers` changed from one per core to 1: the runtime keeps its threads until a restart or upgrade";
    let endpoint = format!("`admin` changed from {admin} to {moved}: the admin endpoint stays");
    let logged = |s: &str| std::fs::read_to_string(&log_path).unwrap().contains(s);
    wait_until_async("both warnings are written", || {
        let both = logged(workers) && logged(&endpoint);
        async move { both }
    })
    .await;
    assert!(
        scrape(admin).await.is_some(),
        "the admin endpoint stays where it was"
    );
    ping(listen).await.expect("served after the reload");
    terminate(p).await;
}

/// A reload that adds one backend and removes another, under continuous load through
/// the library API: zero failed connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_under_load_refuses_nothing() {
    let (a, b, c) = (
        Backend::echo("a", false).await,
        Backend::echo("b", false).await,
        Backend::echo("c", false).await,
    );
    let yaml = |x: &Backend, y: &Backend| {
        one_service(
            "    mode: tcp\n",
            &[
                backend_line(&x.name, x.addr, ""),
                backend_line(&y.name, y.addr, ""),
            ],
        )
    };
    let lb = Crossbar::start(&yaml(&a, &b)).await;
    let addr = lb.addr("svc");
    let load = load(addr, 4);
    for i in 0..6 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        if i % 2 == 0 {
            lb.reload(&yaml(&a, &c)).await;
        } else {
            lb.reload(&yaml(&a, &b)).await;
        }
        assert_eq!(lb.addr("svc"), addr, "the listener kept its socket");
    }
    let (ok, failed) = load.finish().await;
    println!(
        "reload under load: {ok} round trips, {} failed",
        failed.len()
    );
    assert!(failed.is_empty(), "{failed:?}");
    assert!(c.accepted() > 0, "the added backend took traffic");
}

/// A stick table saved at shutdown and loaded at start: a TLS 1.2 session-ID
/// resumption after the restart still lands on (and resumes with) its backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stick_table_survives_a_restart() {
    let ca = TestCa::new("restart test").unwrap();
    let tls = BackendTls {
        versions: Versions::Tls12,
        tickets: false,
    };
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let mut backends = Vec::new();
    for n in ["r1", "r2", "r3"] {
        backends.push(TlsBackend::start(&ca, n, &[SNI], tls, any).await.unwrap());
    }
    let dir = tempfile::tempdir().unwrap();
    let listen = free_port();
    let state = dir.path().join("puppet.table");
    let mut yaml = format!(
        "admin: {{ enabled: false }}\nservices:\n  puppet:\n    listen: [\"{listen}\"]\n    health: {{ check: none }}\n\
         \x20   stick: {{ on: [session_id], state_file: \"{}\" }}\n    backends:\n",
        state.display()
    );
    for b in &backends {
        yaml.push_str(&format!(
            "      - {{ name: {}, address: \"{}\" }}\n",
            b.name, b.addr
        ));
    }
    let cfg = dir.path().join("crossbar.yaml");
    std::fs::write(&cfg, yaml).unwrap();

    // Three agents: their first backends are spread by round robin.
    let agents: Vec<_> = (0..3)
        .map(|_| testbed::client_config(&ca, Versions::Tls12, false).unwrap())
        .collect();
    let p = serving(&cfg, None, listen).await;
    let mut first = Vec::new();
    for a in &agents {
        let r = testbed::get(listen, SNI, a.clone(), "/").await.unwrap();
        assert!(!r.resumed);
        first.push(r.backend);
    }
    terminate(p).await;
    assert!(state.exists(), "table saved at shutdown");

    let _p = serving(&cfg, None, listen).await;
    // In reverse order: a fresh round robin would now send agent 3 to r1 and agent 1
    // to r3, so only the loaded table can put them back where their sessions are.
    for (a, want) in agents.iter().zip(&first).rev() {
        let r = testbed::get(listen, SNI, a.clone(), "/").await.unwrap();
        assert_eq!(
            (&r.backend, r.resumed),
            (want, true),
            "resumed on its backend after the restart"
        );
    }
}

// ---------------------------------------------------------------------------
// One crossbar per address (issue #26, item 8)

/// The config at `cfg` with the admin endpoint on `admin`.
fn with_admin(cfg: &Path, admin: SocketAddr) {
    let yaml = std::fs::read_to_string(cfg).unwrap().replace(
        "admin: { enabled: false }",
        &format!("admin: {{ listen: \"{admin}\" }}"),
    );
    std::fs::write(cfg, yaml).unwrap();
}

/// `crossbar run -c cfg` that must fail at start: its exit code and stderr.
async fn failed_start(cfg: &Path) -> (Option<i32>, String) {
    let mut p = crossbar_run(cfg, None, Stdio::piped());
    let code = p.exited(WAIT).await;
    if code.is_none() {
        // Still running (it started): end it, so that its stderr can be read to the end.
        p.0.kill().unwrap();
        p.0.wait().unwrap();
    }
    let mut err = String::new();
    if let Some(mut e) = p.0.stderr.take() {
        std::io::Read::read_to_string(&mut e, &mut err).unwrap();
    }
    (code, err)
}

/// A second `crossbar run` on addresses a running one holds exits non-zero at
/// start, naming the address in use (before: SO_REUSEPORT let it start, and API
/// calls and connections landed on either process at random), whether the
/// address is the admin endpoint's or only a service's; the first keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_instance_fails_and_the_first_keeps_serving() {
    let (_echo, dir, listen, cfg) = echo_service("").await;
    let admin = free_port();
    with_admin(&cfg, admin);
    let mut first = serving(&cfg, None, listen).await;
    wait_listening(admin).await;

    let (code, err) = failed_start(&cfg).await;
    assert!(
        matches!(code, Some(c) if c != 0),
        "same config: exit {code:?}: {err}"
    );
    let held =
        |addr: SocketAddr| format!("address in use: another crossbar (or program) holds {addr}");
    assert!(err.contains(&held(admin)), "{err}");
    // Another admin address, the same service address.
    let other = dir.path().join("other.yaml");
    std::fs::copy(&cfg, &other).unwrap();
    let yaml = std::fs::read_to_string(&other).unwrap();
    std::fs::write(
        &other,
        yaml.replace(&admin.to_string(), &free_port().to_string()),
    )
    .unwrap();
    let (code, err) = failed_start(&other).await;
    assert!(
        matches!(code, Some(c) if c != 0),
        "service address: exit {code:?}: {err}"
    );
    assert!(err.contains(&held(listen)), "{err}");

    assert_eq!(first.0.try_wait().unwrap(), None, "the first still runs");
    for _ in 0..10 {
        ping(listen).await.expect("the first still serves");
        assert!(scrape(admin)
            .await
            .is_some_and(|t| t.contains("crossbar_build_info")));
    }
    terminate(first).await;
}

/// A hitless upgrade with the admin endpoint enabled: the successor takes the
/// admin socket with the others (nothing is bound twice), answers on it once the
/// predecessor is gone, and a plain second instance is still refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_hands_over_the_admin_socket() {
    let (_echo, dir, listen, cfg) = echo_service("").await;
    let admin = free_port();
    with_admin(&cfg, admin);
    let sock = dir.path().join("upgrade.sock");
    let mut old = serving(&cfg, Some(&sock), listen).await;
    wait_listening(admin).await;
    let new = upgrade(&cfg, &sock).await;
    assert_eq!(
        old.exited(WAIT).await,
        Some(0),
        "the predecessor drained and exited"
    );
    for _ in 0..10 {
        ping(listen).await.expect("the successor serves");
        let text = scrape(admin)
            .await
            .expect("the successor answers on the admin socket");
        assert!(text.contains("crossbar_build_info"), "{text}");
    }
    let (code, err) = failed_start(&cfg).await;
    assert!(matches!(code, Some(c) if c != 0), "exit {code:?}: {err}");
    assert!(err.contains("address in use"), "{err}");
    terminate(new).await;
}

/// `workers: 1` runs the connections on one worker of the work-stealing runtime
/// (the start line says so: a current-thread runtime was measured no cheaper,
/// docs/performance.md "Runtime") and loses nothing: a SIGHUP reload and a binary
/// upgrade under continuous load, then a SIGTERM drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_worker_reloads_upgrades_and_drains_losing_nothing() {
    let (_echo, dir, listen, cfg) = echo_service("").await;
    let yaml = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(&cfg, format!("workers: 1\n{yaml}")).unwrap();
    let sock = dir.path().join("upgrade.sock");
    let log = dir.path().join("first.log");
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_crossbar"));
    cmd.arg("run").arg("-c").arg(&cfg);
    cmd.arg("--upgrade-socket").arg(&sock);
    cmd.env("RUST_LOG", "crossbar=info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    let mut old = ChildGuard(cmd.spawn().unwrap());
    // The start line comes after the listeners accept, through the log thread.
    wait_for_log(&log, " running").await;
    let started = std::fs::read_to_string(&log).unwrap();
    let running = started.lines().find(|l| l.contains(" running"));
    assert!(
        running.is_some_and(|l| l.contains("runtime=\"work-stealing\"") && l.contains("workers=1")),
        "the start line names the runtime: {started}"
    );

    let load = load(listen, 4);
    old.signal("HUP");
    wait_for_log(&log, "reload complete").await;
    let new = upgrade(&cfg, &sock).await;
    assert_eq!(
        old.exited(WAIT).await,
        Some(0),
        "old process drained and exited"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (ok, failed) = load.finish().await;
    assert!(failed.is_empty(), "failed connections: {failed:?}");
    assert!(ok > 20, "load ran ({ok})");
    terminate(new).await;
}

/// Wait until the file `log` contains `what`.
async fn wait_for_log(log: &Path, what: &str) {
    let (log, what) = (log.to_path_buf(), what.to_string());
    wait_until_async(&format!("{what:?} in the log"), || {
        let (log, what) = (log.clone(), what.clone());
        async move { std::fs::read_to_string(&log).is_ok_and(|t| t.contains(&what)) }
    })
    .await;
}
