//! The process's life with real `crossbar run` processes: a hitless binary upgrade
//! under continuous load and its upgrade socket (which only the next crossbar may
//! use), SIGTERM draining, stick tables that survive a restart and are saved whole
//! at SIGTERM, one crossbar per address, and `workers: 1` through a reload, an
//! upgrade and a drain. (Reloads themselves: tests/reload.)
mod common;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;
use crossbar::testbed::{self, BackendTls, TestCa, TlsBackend, Versions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

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

// ---------------------------------------------------------------------------
// Binary upgrades and SIGTERM

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

async fn echo_once(addr: SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect(addr).await else {
        return false;
    };
    let mut buf = [0u8; 4];
    s.write_all(b"ping").await.is_ok() && s.read_exact(&mut buf).await.is_ok() && &buf == b"ping"
}

/// The socket is created 0600 in a 0700 directory; a peer that sends an endless
/// line is cut off after a few bytes (before: read into memory without bound), one
/// that sends garbage or nothing is dropped, and through all of it the process
/// keeps serving and a real successor still takes over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_upgrade_socket_peers_are_refused() {
    use std::os::unix::fs::PermissionsExt;
    let echo = Backend::echo("echo", false).await;
    let dir = tempfile::tempdir().unwrap();
    let listen = free_port();
    let cfg = tcp_config(dir.path(), listen, echo.addr, "");
    let sock = dir.path().join("run").join("upgrade.sock");
    let mut old = crossbar_run(&cfg, Some(&sock), Stdio::inherit());
    let mode = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.permissions().mode() & 0o777);
    // The socket is bound, then given its mode (in a 0700 directory meanwhile):
    // wait for both; a mode that never comes fails here.
    wait_until("the upgrade socket exists with mode 0600", || {
        mode(&sock) == 0o600
    })
    .await;
    assert_eq!(mode(sock.parent().unwrap()), 0o700, "directory mode");
    assert!(echo_once(listen).await, "serving");

    // An endless line: the old process stops reading and closes, so writing fails.
    let long = sock.clone();
    let wrote_all = tokio::task::spawn_blocking(move || {
        let mut s = std::os::unix::net::UnixStream::connect(&long).unwrap();
        s.set_write_timeout(Some(WAIT)).unwrap();
        s.write_all(&vec![b'T'; 16 << 20]).is_ok()
    })
    .await
    .unwrap();
    assert!(!wrote_all, "16 MiB without a newline were all read");

    // Garbage: closed, no sockets handed out.
    let garbage = sock.clone();
    let answer = tokio::task::spawn_blocking(move || {
        let mut s = std::os::unix::net::UnixStream::connect(&garbage).unwrap();
        s.set_read_timeout(Some(WAIT)).unwrap();
        s.write_all(b"GIVE ME THE SOCKETS\n").unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out); // ok: a reset is also a refusal
        out
    })
    .await
    .unwrap();
    assert!(answer.is_empty(), "garbage got an answer: {answer:?}");

    // A silent peer stays connected while a real successor takes over.
    let _silent = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    assert!(
        echo_once(listen).await,
        "still serving after the hostile peers"
    );
    let mut new = crossbar_run(&cfg, Some(&sock), Stdio::inherit());
    assert_eq!(
        old.exited(WAIT).await,
        Some(0),
        "the old process handed over"
    );
    assert!(echo_once(listen).await, "the successor serves");
    assert_eq!(new.0.try_wait().unwrap(), None, "the successor runs");
    assert_eq!(mode(&sock), 0o600, "the successor's socket mode");
}

/// A socket path in a directory others can write to is refused at start, with the
/// reason (anyone could otherwise replace the socket and be handed the listeners).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrade_socket_in_a_shared_directory_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let echo = Backend::echo("echo", false).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = tcp_config(dir.path(), free_port(), echo.addr, "");
    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut p = crossbar_run(&cfg, Some(&shared.join("upgrade.sock")), Stdio::piped());
    assert_eq!(p.exited(WAIT).await, Some(1), "refused to start");
    let mut err = String::new();
    p.0.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(err.contains("not writable by group or others"), "{err}");
    // Nothing served there: the refusal does not speak of a predecessor.
    assert!(!err.contains("taking over"), "{err}");
}

// ---------------------------------------------------------------------------
// Stick tables across a restart

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

/// A stick table of `n` source entries on backend `echo`, saved to `path`.
fn write_table(path: &Path, n: u32) {
    use crossbar::stick::{KeyKind, StickTable, TableParams};
    let t = StickTable::new(TableParams {
        size: n as usize,
        expire: Duration::from_secs(3600),
        source_expire: Duration::from_secs(3600),
    });
    for i in 0..n {
        t.learn(t.key(KeyKind::Source, &i.to_be_bytes()), "echo");
    }
    assert_eq!(t.save(path).unwrap(), n as usize);
}

/// Entries in a saved table (it must load whole).
fn saved_entries(path: &Path, size: usize) -> usize {
    use crossbar::stick::{StickTable, TableParams};
    let t = StickTable::new(TableParams {
        size,
        expire: Duration::from_secs(3600),
        source_expire: Duration::from_secs(3600),
    });
    t.load(path, &["echo"])
        .unwrap_or_else(|e| panic!("{} must load whole: {e}", path.display()))
}

/// Connect from ever new loopback addresses (each learns a `source` entry, so
/// every save differs) until `stop`; bounded.
fn churn(
    to: SocketAddr,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        for i in 0..200_000u32 {
            if stop.load(std::sync::atomic::Ordering::Relaxed) {
                return;
            }
            let from = std::net::Ipv4Addr::new(127, 1, (i / 250) as u8, (i % 250 + 1) as u8);
            let Ok(sock) = tokio::net::TcpSocket::new_v4() else {
                continue;
            };
            if sock.bind(SocketAddr::from((from, 0))).is_ok() {
                let _ = sock.connect(to).await; // ok: refused once the process stops
            }
        }
    })
}

/// SIGTERM while periodic saves of a big, changing table run back to back
/// (`save_interval: 10ms`, clients from new addresses all the while): the process
/// waits for the running save, writes its last one, exits 0, and leaves one whole
/// file and no temporary files (before: the shutdown save and a periodic one shared
/// `<path>.tmp`, so two snapshots could be written into one file, or a rename
/// failed with nobody left to log it). Three rounds, since the overlap is up to
/// timing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_waits_for_a_running_table_save() {
    const ENTRIES: u32 = 200_000;
    let echo = Backend::echo("echo", false).await;
    for round in 0..3 {
        let dir = tempfile::tempdir().unwrap();
        let table = dir.path().join("svc.table");
        write_table(&table, ENTRIES);
        let listen = free_port();
        let stick = format!(
            "    stick: {{ on: [source], size: {}, save_interval: 10ms, state_file: {} }}\n",
            ENTRIES + 100,
            table.display()
        );
        let cfg = tcp_config(dir.path(), listen, echo.addr, &stick);
        let sock = dir.path().join("run").join("upgrade.sock");
        let mut p = crossbar_run(&cfg, Some(&sock), Stdio::piped());
        let saved_at = std::fs::metadata(&table).unwrap().modified().unwrap();
        wait_until("serving", || std::net::TcpStream::connect(listen).is_ok()).await;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let clients = churn(listen, stop.clone());
        wait_until("a periodic save replaced the file", || {
            std::fs::metadata(&table).is_ok_and(|m| m.modified().ok() != Some(saved_at))
        })
        .await;
        // Signal while a save is writing its temporary file.
        let writing = || {
            std::fs::read_dir(dir.path()).is_ok_and(|d| {
                d.filter_map(Result::ok)
                    .any(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            })
        };
        wait_until("a periodic save is writing", writing).await;
        // SAFETY: kill(2) on our own child's pid.
        #[allow(unsafe_code)]
        let sent = unsafe { libc::kill(p.0.id() as libc::pid_t, libc::SIGTERM) };
        assert_eq!(sent, 0);
        assert_eq!(p.exited(WAIT).await, Some(0), "round {round}: exit code");
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        clients.await.unwrap();
        let mut err = String::new();
        p.0.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        assert!(!err.contains("failed"), "round {round}: {err}");
        let n = saved_entries(&table, ENTRIES as usize + 100);
        assert!(n >= ENTRIES as usize, "round {round}: {n} entries");
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        let mut names = names;
        names.sort();
        assert_eq!(
            names,
            ["crossbar.yaml", "run", "svc.table"],
            "round {round}"
        );
    }
}

// ---------------------------------------------------------------------------
// One crossbar per address

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
    let admin = enable_admin(&cfg);
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
        assert!(try_admin_get(admin, "/metrics")
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
    let admin = enable_admin(&cfg);
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
        let text = try_admin_get(admin, "/metrics")
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

/// `timeouts.shutdown` of the stalled-log test.
const STALL_SHUTDOWN: Duration = Duration::from_secs(2);
/// How long past `timeouts.shutdown` a process with a stalled log may take to exit:
/// its bounded final flush (`log_writer::FINAL_FLUSH`) and a loaded machine's
/// scheduling, with room to spare (a liveness bound, not a measurement).
const STALL_EXIT_GRACE: Duration = Duration::from_secs(10);
/// Most connections made to stall the log writer (each logs a ~250-byte line: the
/// pipe's 64 KiB and the writer's queue of 4,096 lines take ~4,400).
const STALL_MAX_PINGS: usize = 20_000;
/// Connections made between two looks at crossbar_log_lines_dropped_total.
const STALL_PINGS_PER_LOOK: usize = 200;

/// Issue #42, 3: `crossbar run 2> fifo` whose reader never reads: serving goes on,
/// but after SIGTERM the process never exited (main waited on the log writer thread,
/// blocked in `write`), under systemd a window with nothing listening until
/// SIGKILL. Now the final flush is bounded: what is left is dropped and counted, and
/// the process exits 0 within `timeouts.shutdown` and a few seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_exits_in_time_when_the_log_destination_stalls() {
    use std::os::unix::fs::OpenOptionsExt;
    let echo = Backend::echo("echo", false).await;
    let dir = tempfile::tempdir().unwrap();
    let listen = free_port();
    let cfg = tcp_config(dir.path(), listen, echo.addr, "");
    let admin = enable_admin(&cfg);
    let yaml = std::fs::read_to_string(&cfg).unwrap().replace(
        "shutdown: 10s",
        &format!("shutdown: {}s", STALL_SHUTDOWN.as_secs()),
    );
    std::fs::write(&cfg, yaml).unwrap();
    let fifo = dir.path().join("stderr.fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    // The reader: open (so the writer's open does not wait), never read.
    let reader = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo)
        .unwrap();
    let writer = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
    let mut p = ChildGuard(
        std::process::Command::new(env!("CARGO_BIN_EXE_crossbar"))
            .arg("run")
            .arg("-c")
            .arg(&cfg)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(writer))
            .spawn()
            .expect("spawn crossbar"),
    );
    wait_listening(listen).await;
    // Connections, each an access-log line, until crossbar itself says its log
    // writer is stalled: the pipe is full, the writer blocked in write, and its
    // queue (log_writer::QUEUE_LINES) full too, so lines are dropped and counted.
    // (How full the pipe looks from here depends on the writer's batch sizes, so on
    // the machine's speed: the pipe's fill level is no signal.) The queue is full of
    // lines at SIGTERM, which the final flush must give up on.
    let mut pings = 0;
    loop {
        for _ in 0..STALL_PINGS_PER_LOOK {
            ping(listen).await.unwrap();
        }
        pings += STALL_PINGS_PER_LOOK;
        let dropped = metric_value(
            &admin_get(admin, "/metrics").await,
            "crossbar_log_lines_dropped_total",
            &[],
        );
        if dropped > 0.0 {
            break;
        }
        assert!(
            pings < STALL_MAX_PINGS,
            "the log writer never stalled: no line dropped after {pings} connections"
        );
    }
    let signalled = Instant::now();
    p.signal("TERM");
    let code = p.exited(STALL_SHUTDOWN + STALL_EXIT_GRACE).await;
    println!(
        "stalled log: lines dropped after {pings} connections; exit {code:?} {:?} after SIGTERM",
        signalled.elapsed()
    );
    assert_eq!(
        code,
        Some(0),
        "exit within timeouts.shutdown ({STALL_SHUTDOWN:?}) + {STALL_EXIT_GRACE:?} of SIGTERM, stderr stalled"
    );
    drop(reader);
}
