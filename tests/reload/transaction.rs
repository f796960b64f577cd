//! Reload as a transaction, with a real `crossbar run` process and its admin API: a
//! reload that fails for any reason (a bad file, an unreadable one, an address in
//! use, a listener change it can't apply), by `POST /api/reload` or by SIGHUP,
//! leaves `/api/services`, the `crossbar_*` metrics, the stick tables and every
//! backend state exactly as they were, though the file would disable a backend,
//! shorten the stick lifetimes, add a backend and lower the listener's limit.
//! Changes a kept listen address can take (its `max_connections`, its `backlog`)
//! apply. A FIFO at a `state_file` path blocks neither start-up nor a reload (which
//! refuses it, as `check` does).
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::snapshot::Snapshot;
use crate::common::*;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// The stick lifetime of the running config; the failing files say 5 s.
const EXPIRE_SECS: u64 = 3600;

/// A running `crossbar run -c file` with its admin endpoint and one listen address.
struct Running {
    proc: ChildGuard,
    file: PathBuf,
    admin: SocketAddr,
    listen: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Running {
    async fn start(yaml: impl Fn(SocketAddr, SocketAddr) -> String) -> Running {
        Running::start_in(tempfile::tempdir().unwrap(), yaml, Stdio::inherit()).await
    }

    /// Start with the config file in `dir`, logging to `stderr`. Ready when the admin
    /// endpoint answers a request: it is served only once the start committed (every
    /// listen address bound, every stick table loaded). Its socket accepts earlier
    /// (it is bound first), so a connect alone says nothing about the start.
    async fn start_in(
        dir: tempfile::TempDir,
        yaml: impl Fn(SocketAddr, SocketAddr) -> String,
        stderr: Stdio,
    ) -> Running {
        let file = dir.path().join("crossbar.yaml");
        let (admin, listen) = (free_port(), free_port());
        std::fs::write(&file, yaml(admin, listen)).unwrap();
        let proc = crossbar_run(&file, None, stderr);
        wait_listening(admin).await;
        admin_get(admin, "/healthz").await;
        Running {
            proc,
            file,
            admin,
            listen,
            _dir: dir,
        }
    }

    /// `POST /api/reload`: the status and the answer.
    async fn reload(&self) -> (Option<u16>, String) {
        api_reload(self.admin).await
    }

    /// Write `yaml` and reload it, expecting a refusal whose answer contains `why`.
    async fn refused(&self, yaml: &str, why: &str) {
        std::fs::write(&self.file, yaml).unwrap();
        self.refused_as_is(why).await;
    }

    /// Reload whatever is at the config path now, expecting a refusal naming `why`.
    async fn refused_as_is(&self, why: &str) {
        let (status, text) = self.reload().await;
        assert_eq!(status, Some(422), "the reload should fail: {text}");
        assert!(text.contains(why), "refusal should say {why:?}: {text}");
    }

    async fn reloaded(&self, yaml: &str) {
        std::fs::write(&self.file, yaml).unwrap();
        let (status, text) = self.reload().await;
        assert_eq!(status, Some(200), "the reload should succeed: {text}");
    }

    async fn metrics(&self) -> String {
        admin_get(self.admin, "/metrics").await
    }

    async fn refused_total(&self) -> f64 {
        metric_value(
            &self.metrics().await,
            "crossbar_listener_refused_total",
            &[("reason", "max_connections")],
        )
    }
}

/// A connection over the listener's limit is closed before a backend answers.
async fn is_refused(addr: SocketAddr) -> bool {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let mut byte = [0u8; 1];
    matches!(
        within("an answer or a close", s.read(&mut byte)).await,
        Ok(0) | Err(_)
    )
}

/// The running config: `svc` on `listen` (at most 4 connections), source
/// stickiness for an hour, backends a and b.
fn good(admin: SocketAddr, listen: SocketAddr, a: &Backend, b: &Backend) -> String {
    format!(
        "admin: {{ listen: \"{admin}\" }}\nservices:\n  svc:\n    mode: tcp\n    \
         listen: [{{ address: \"{listen}\", max_connections: 4 }}]\n    health: {{ check: none }}\n    \
         stick: {{ on: [source], expire: {EXPIRE_SECS}s, source_expire: {EXPIRE_SECS}s }}\n    backends:\n      \
         - {{ name: a, address: \"{}\" }}\n      - {{ name: b, address: \"{}\" }}\n",
        a.addr, b.addr
    )
}

/// What every failing file would change if any of it were applied: `a` disabled,
/// 5 s stick lifetimes, a backend `ghost`, the listener's limit down to 1.
fn harmful(good: &str, ghost: SocketAddr) -> String {
    let ghost_line = format!("      - {{ name: ghost, address: \"{ghost}\" }}\n");
    let mut y = good
        .replace(
            "- { name: a, address: ",
            "- { name: a, disabled: true, address: ",
        )
        .replace(&format!("expire: {EXPIRE_SECS}s"), "expire: 5s")
        .replace("max_connections: 4", "max_connections: 1");
    y.push_str(&ghost_line);
    y
}

/// Stick entries from two client addresses; the connections stay open (idle), so
/// nothing changes while the test compares.
async fn learn(listen: SocketAddr) -> Vec<TcpStream> {
    let mut held = Vec::new();
    for last in [2u8, 3] {
        let from = IpAddr::from([127, 0, 0, last]);
        let mut s = connect_from(from, listen).await;
        read_name(&mut s).await;
        held.push(s);
    }
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_reload_changes_nothing() {
    let (a, b) = (
        Backend::echo("a", true).await,
        Backend::echo("b", true).await,
    );
    let ghost = Backend::echo("ghost", true).await;
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = taken.local_addr().map(|addr| (taken, addr)).unwrap();
    let lb = Running::start(|admin, listen| good(admin, listen, &a, &b)).await;
    let good = good(lb.admin, lb.listen, &a, &b);
    let harmful = harmful(&good, ghost.addr);
    let _held = learn(lb.listen).await;

    let in_use = harmful.replace(
        &format!("address: \"{}\", max_connections: 1 }}", lb.listen),
        &format!(
            "address: \"{}\", max_connections: 1 }}, \"{}\"",
            lb.listen, taken.1
        ),
    );
    let freebind = harmful.replace(
        "max_connections: 1 }",
        "max_connections: 1, freebind: true }",
    );
    let cases: [(&str, Option<String>, &str); 5] = [
        (
            "invalid YAML",
            Some(format!("{harmful}    - [unclosed\n")),
            "crossbar.yaml",
        ),
        (
            "an unknown key",
            Some(harmful.replace("    mode: tcp\n", "    mode: tcp\n    bogus: 1\n")),
            "bogus",
        ),
        (
            "an address in use",
            Some(in_use),
            &format!("cannot listen on {}", taken.1),
        ),
        ("a freebind change", Some(freebind), "freebind"),
        ("an unreadable file", None, "crossbar.yaml"),
    ];
    for (what, file, why) in cases {
        let before = Snapshot::take(lb.admin, &["svc"]).await;
        assert_eq!(before.expires_in()[0].len(), 2, "two entries learned");
        assert_eq!(
            metric_value(&before.metrics, "crossbar_active_connections", &[]),
            2.0
        );
        match file {
            Some(yaml) => lb.refused(&yaml, why).await,
            None => {
                // A directory where the file was: reading it fails.
                std::fs::remove_file(&lb.file).unwrap();
                std::fs::create_dir(&lb.file).unwrap();
                lb.refused_as_is(why).await;
                std::fs::remove_dir(&lb.file).unwrap();
            }
        }
        let after = Snapshot::take(lb.admin, &["svc"]).await;
        before.assert_same(&after, what);
        for left in &after.expires_in()[0] {
            assert!(
                *left > EXPIRE_SECS - 60,
                "{what}: a stick entry expires in {left} s"
            );
        }
        assert!(
            !after.metrics.contains("ghost"),
            "{what}: {}",
            after.metrics
        );
    }
    // The limit is still 4, not the failed files' 1: two more (four open) are served.
    let (_, _third) = who(lb.listen).await;
    let (_, _fourth) = who(lb.listen).await;

    // A good reload without `ghost`: it never appears.
    lb.reloaded(&good.replace("max_connections: 4", "max_connections: 5"))
        .await;
    let text = lb.metrics().await;
    assert!(!text.contains("ghost"), "{text}");
    let after = Snapshot::take(lb.admin, &["svc"]).await;
    assert!(
        after.services.contains("\"state\": \"up\""),
        "{}",
        after.services
    );
    assert!(!after.services.contains("disabled"), "{}", after.services);
    drop(taken);
}

/// `svc` on `listen` with the listen settings `settings`, backend `a`.
fn listener_yaml(admin: SocketAddr, listen: SocketAddr, settings: &str, a: &Backend) -> String {
    format!(
        "admin: {{ listen: \"{admin}\" }}\nservices:\n  svc:\n    mode: tcp\n    \
         listen: [{{ address: \"{listen}\", {settings} }}]\n    health: {{ check: none }}\n    \
         backends:\n      - {{ name: a, address: \"{}\" }}\n",
        a.addr
    )
}

/// A kept listen address takes a new `max_connections` at once: lowered, the
/// connections over it are refused (and counted with reason `max_connections`);
/// raised, more are admitted. Open connections are never cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_listener_takes_its_new_max_connections() {
    let a = Backend::echo("a", true).await;
    let yaml =
        |admin, listen, max| listener_yaml(admin, listen, &format!("max_connections: {max}"), &a);
    let lb = Running::start(|admin, listen| yaml(admin, listen, 6)).await;
    lb.reloaded(&yaml(lb.admin, lb.listen, 2)).await;

    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(who(lb.listen).await);
    }
    for _ in 0..4 {
        assert!(is_refused(lb.listen).await, "admitted over a limit of 2");
    }
    assert_eq!(lb.refused_total().await, 4.0);

    // Raised: two more admitted, the fifth refused.
    lb.reloaded(&yaml(lb.admin, lb.listen, 4)).await;
    for _ in 0..2 {
        held.push(who(lb.listen).await);
    }
    assert!(is_refused(lb.listen).await, "admitted over a limit of 4");
    assert_eq!(lb.refused_total().await, 5.0);

    // Lowered below what is open: nothing is cut, nothing new admitted until the
    // open ones are fewer than the limit.
    lb.reloaded(&yaml(lb.admin, lb.listen, 1)).await;
    assert!(is_refused(lb.listen).await, "admitted over a limit of 1");
    for (name, s) in &mut held {
        assert_eq!(name, "a");
        exchange_one(s).await;
    }
    held.clear();
    let mut n = 0;
    // The held connections' ends reach crossbar asynchronously: bounded retries.
    while is_refused(lb.listen).await {
        n += 1;
        assert!(n < 1000, "never admitted again after the connections ended");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// An echo round trip on a held connection (it was not cut).
async fn exchange_one(s: &mut TcpStream) {
    use tokio::io::AsyncWriteExt;
    s.write_all(b"x").await.expect("write on a held connection");
    let mut byte = [0u8; 1];
    within("the echo", s.read_exact(&mut byte))
        .await
        .expect("echo on a held connection");
    assert_eq!(&byte, b"x");
}

/// The backlog of the socket listening on `addr`, as the kernel reports it
/// (`ss`: Send-Q of a listening socket is its backlog).
fn kernel_backlog(addr: SocketAddr) -> u32 {
    let out = Command::new("ss")
        .args(["-Hltn", &format!("sport = :{}", addr.port())])
        .output()
        .expect("ss (iproute2) is needed for this test");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.contains(&addr.to_string()))
        .unwrap_or_else(|| panic!("{addr} not listed by ss: {text}"));
    line.split_whitespace()
        .nth(2)
        .and_then(|q| q.parse().ok())
        .unwrap_or_else(|| panic!("no Send-Q in {line:?}"))
}

/// A kept listen address takes a new `backlog` (listen(2) again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_listener_takes_its_new_backlog() {
    let a = Backend::echo("a", true).await;
    let yaml =
        |admin, listen, backlog| listener_yaml(admin, listen, &format!("backlog: {backlog}"), &a);
    let lb = Running::start(|admin, listen| yaml(admin, listen, 16)).await;
    assert_eq!(kernel_backlog(lb.listen), 16);
    lb.reloaded(&yaml(lb.admin, lb.listen, 100)).await;
    assert_eq!(kernel_backlog(lb.listen), 100);
    assert_eq!(who(lb.listen).await.0, "a");
}

/// SIGHUP with a broken file, then with one that checks but can't be applied (an
/// address in use) and would disable the backend and add another: each reload is
/// attempted and fails (counted as an error), nothing of either file is applied
/// (services, backends and metrics as they were), and the process keeps serving
/// with the old config.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_sighup_reload_changes_nothing() {
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
    assert_eq!(failed(&admin_get(admin, "/metrics").await), 0.0);
    let before = Snapshot::settled(admin, &[], 0).await;
    std::fs::write(&cfg, "services: [this is: not valid\n").unwrap();
    p.signal("HUP");
    wait_until_async("the reload counted as failed", || async move {
        try_admin_get(admin, "/metrics")
            .await
            .is_some_and(|t| failed(&t) == 1.0)
    })
    .await;
    let text = admin_get(admin, "/metrics").await;
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
        try_admin_get(admin, "/metrics")
            .await
            .is_some_and(|t| failed(&t) == 2.0)
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

// ---------------------------------------------------------------------------
// A FIFO at the state_file path

fn mkfifo(path: &Path) {
    nix::unistd::mkfifo(path, nix::sys::stat::Mode::from_bits_truncate(0o600))
        .unwrap_or_else(|e| panic!("mkfifo {}: {e}", path.display()));
}

fn stick_yaml(
    admin: SocketAddr,
    listen: SocketAddr,
    a: &Backend,
    state: &Path,
    size: u32,
) -> String {
    format!(
        "admin: {{ listen: \"{admin}\" }}\nservices:\n  svc:\n    mode: tcp\n    listen: [\"{listen}\"]\n    \
         health: {{ check: none }}\n    stick: {{ on: [source], size: {size}, state_file: \"{}\" }}\n    \
         backends:\n      - {{ name: a, address: \"{}\" }}\n",
        state.display(),
        a.addr
    )
}

/// `crossbar check` names a state_file path that is not a regular file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_names_a_fifo_at_the_state_file_path() {
    let a = Backend::echo("a", true).await;
    let dir = tempfile::tempdir().unwrap();
    let (state, file) = (dir.path().join("svc.table"), dir.path().join("c.yaml"));
    mkfifo(&state);
    std::fs::write(&file, stick_yaml(free_port(), free_port(), &a, &state, 100)).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_crossbar"))
        .arg("check")
        .arg("-c")
        .arg(&file)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "services.svc.stick.state_file: {} is a FIFO, not a regular file",
            state.display()
        )),
        "{stderr}"
    );
}

/// `crossbar run` with a FIFO at its state_file path starts (saying it ignores the
/// FIFO), serves and answers SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_state_file_blocks_neither_start_nor_sigterm() {
    let a = Backend::echo("a", true).await;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("svc.table");
    mkfifo(&state);
    let log = dir.path().join("stderr");
    let stderr = Stdio::from(std::fs::File::create(&log).unwrap());
    let yaml = |admin, listen| stick_yaml(admin, listen, &a, &state, 100);
    let mut lb = Running::start_in(dir, yaml, stderr).await;
    assert_eq!(who(lb.listen).await.0, "a");

    lb.proc.signal("TERM");
    assert_eq!(lb.proc.exited(WAIT).await, Some(0), "exits on SIGTERM");
    assert_eq!(ignoring_fifo(&log, &state), 1);
}

/// A FIFO put at the state_file path while running: a reload to another table size
/// is refused at once, as `crossbar check` refuses the file (every reload checks
/// the files a config names), rather than hanging on reading it for the new table;
/// the old config serves on and SIGTERM is answered. (That reading a FIFO for a
/// table does not block is the start-up test's.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_state_file_blocks_neither_a_reload_nor_sigterm() {
    let a = Backend::echo("a", true).await;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("svc.table");
    let log = dir.path().join("stderr");
    let stderr = Stdio::from(std::fs::File::create(&log).unwrap());
    let yaml = |admin, listen, size| stick_yaml(admin, listen, &a, &state, size);
    let mut lb = Running::start_in(dir, |admin, listen| yaml(admin, listen, 100), stderr).await;
    mkfifo(&state);
    let why = format!("{} is a FIFO, not a regular file", state.display());
    lb.refused(&yaml(lb.admin, lb.listen, 200), &why).await;
    assert_eq!(who(lb.listen).await.0, "a");

    lb.proc.signal("TERM");
    assert_eq!(lb.proc.exited(WAIT).await, Some(0), "exits on SIGTERM");
    assert_eq!(
        ignoring_fifo(&log, &state),
        0,
        "the refused file was not read"
    );
}

/// How often the log at `log` says the FIFO at `state` was ignored.
fn ignoring_fifo(log: &Path, state: &Path) -> usize {
    let text = std::fs::read_to_string(log).unwrap();
    let said = format!(
        "ignoring stick table file {p}: {p} is a FIFO, not a regular file",
        p = state.display()
    );
    text.matches(&said).count()
}

/// Once shutdown has begun, the reload task takes no more requests: a reload is
/// answered "shutting down" and the running config stays as it was, while the
/// drain waits for the connection still open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_once_shutdown_began_changes_nothing() {
    use crossbar::server::ApplyError;
    let (a, b) = (
        Backend::echo("a", false).await,
        Backend::echo("b", false).await,
    );
    let yaml = |lines: &[String]| one_service("    mode: tcp\n", lines);
    let cb = Crossbar::start(&yaml(&[backend_line("a", a.addr, "")])).await;
    let mut held = TcpStream::connect(cb.addr("svc")).await.unwrap();
    exchange_one(&mut held).await;
    let server = cb.server.clone();
    let drain = tokio::spawn(async move { server.shutdown(WAIT).await });
    wait_until("shutdown began", || cb.is_draining()).await;

    let both = yaml(&[backend_line("a", a.addr, ""), backend_line("b", b.addr, "")]);
    let config = load_config(cb.dir(), &both);
    let err = cb
        .server
        .reload(config)
        .await
        .expect_err("a reload while draining");
    assert!(matches!(err, ApplyError::ShuttingDown), "{err}");
    assert!(err.to_string().contains("shutting down"), "{err}");
    assert_eq!(cb.config().services[0].backends.len(), 1);
    assert!(cb.service("svc").unwrap().pool.get("b").is_none());

    exchange_one(&mut held).await;
    drop(held);
    let cut = within("the drain", drain).await.unwrap();
    assert_eq!(cut, 0, "the open connection ended by itself");
}
