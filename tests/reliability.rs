//! The reliability pass (issue #16): each defect an adversarial review found, as a
//! test that failed before its fix. Real sockets on loopback, real processes where
//! the defect lives between processes (the upgrade socket).
mod common;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;
use crossbar::admin;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// Bound on anything that should happen "at once" on loopback, with slack for a
/// loaded 2-core CI machine.
const PROMPT: Duration = Duration::from_secs(5);

// ---------------------------------------------------------------------------
// The admin endpoint

/// A running balancer with its admin endpoint on loopback (no token).
struct AdminBed {
    addr: SocketAddr,
    stop: CancellationToken,
    cb: Crossbar,
    _backend: Backend,
}

impl Drop for AdminBed {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn admin_bed(settings: &str) -> AdminBed {
    let be = Backend::echo("e1", false).await;
    let cb = Crossbar::start(&one_service(settings, &[backend_line("e1", be.addr, "")])).await;
    let listener = admin::bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    tokio::spawn(admin::serve(
        listener,
        cb.server.clone(),
        None,
        stop.clone(),
    ));
    AdminBed {
        addr,
        stop,
        cb,
        _backend: be,
    }
}

fn get(path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").into_bytes()
}

/// Every admin slot held by a request that declared a body and sent none: /healthz
/// and /metrics still answer at once, other endpoints are refused with 503, and
/// each stalled request is answered 408 and closed (the whole request is timed,
/// not only its headers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_admin_bodies_time_out_and_health_still_answers() {
    let bed = admin_bed("").await;
    let mut stalled = Vec::new();
    for _ in 0..admin::MAX_CONNECTIONS {
        let mut s = TcpStream::connect(bed.addr).await.unwrap();
        s.write_all(b"POST /api/reload HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n")
            .await
            .unwrap();
        stalled.push(s);
    }
    // Accepted in order after the stalled ones (the accept queue is FIFO): every
    // regular slot is taken by then.
    let t = Instant::now();
    let (status, body) = raw_request(bed.addr, &get("/healthz"), PROMPT).await;
    assert_eq!(status, Some(200), "healthz with the slots full: {body}");
    let (status, body) = raw_request(bed.addr, &get("/metrics"), PROMPT).await;
    assert_eq!(status, Some(200), "metrics with the slots full");
    assert!(body.contains("crossbar_"), "{body}");
    let (status, body) = raw_request(bed.addr, &get("/api/services"), PROMPT).await;
    assert_eq!(
        status,
        Some(503),
        "other endpoints with the slots full: {body}"
    );
    println!(
        "admin: slots full; healthz, metrics, services answered in {:?}",
        t.elapsed()
    );

    let t = Instant::now();
    for (i, mut s) in stalled.into_iter().enumerate() {
        let mut out = Vec::new();
        within("a stalled body's answer", s.read_to_end(&mut out))
            .await
            .unwrap();
        let text = String::from_utf8_lossy(&out);
        assert_eq!(status_of(&text), Some(408), "stalled request {i}: {text}");
    }
    let took = t.elapsed();
    println!(
        "admin: {} stalled bodies answered 408 and closed after {took:?}",
        admin::MAX_CONNECTIONS
    );
    assert!(
        took >= admin::REQUEST_TIMEOUT - PROMPT,
        "not before the timeout: {took:?}"
    );
    // The slots are free again: a regular endpoint answers.
    let (status, body) = raw_request(bed.addr, &get("/api/services"), PROMPT).await;
    assert_eq!(status, Some(200), "{body}");
}

/// A table dump is capped: a limit over the cap is refused with a clear reason,
/// the cap itself is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_dumps_are_capped() {
    let bed = admin_bed("    stick: { on: [source] }\n").await;
    let _ = &bed.cb;
    let over = format!("/api/tables/svc?limit={}", admin::MAX_TABLE_LIMIT + 1);
    let (status, body) = raw_request(bed.addr, &get(&over), PROMPT).await;
    assert_eq!(status, Some(400), "{body}");
    assert!(body.contains("limit must be"), "{body}");
    let (status, body) = raw_request(bed.addr, &get("/api/tables/svc?limit=100000"), PROMPT).await;
    assert_eq!(
        status,
        Some(400),
        "the old cap (100000) is refused now: {body}"
    );
    let at = format!("/api/tables/svc?limit={}", admin::MAX_TABLE_LIMIT);
    let (status, body) = raw_request(bed.addr, &get(&at), PROMPT).await;
    assert_eq!(status, Some(200), "{body}");
}

// ---------------------------------------------------------------------------
// The upgrade socket, between real `crossbar run` processes

/// A tcp-mode service on a free port in front of `backend`; the config file path.
fn tcp_config(dir: &Path, backend: SocketAddr) -> (PathBuf, SocketAddr) {
    let listen = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let yaml = format!(
        "admin: {{ enabled: false }}\n\
         services:\n  svc:\n    listen: [\"{listen}\"]\n    mode: tcp\n    health: {{ check: none }}\n\
         \x20   backends:\n      - {{ name: echo, address: \"{backend}\" }}\n"
    );
    let path = dir.join("crossbar.yaml");
    std::fs::write(&path, yaml).unwrap();
    (path, listen)
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
    let (cfg, listen) = tcp_config(dir.path(), echo.addr);
    let sock = dir.path().join("run").join("upgrade.sock");
    let mut old = crossbar_run(&cfg, Some(&sock), Stdio::inherit());
    wait_until("the upgrade socket exists", || sock.exists()).await;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&sock), 0o600, "socket mode");
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
    let (cfg, _) = tcp_config(dir.path(), echo.addr);
    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut p = crossbar_run(&cfg, Some(&shared.join("upgrade.sock")), Stdio::piped());
    assert_eq!(p.exited(WAIT).await, Some(1), "refused to start");
    let mut err = String::new();
    p.0.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(err.contains("not writable by group or others"), "{err}");
}

// ---------------------------------------------------------------------------
// Out of file descriptors mid-connection

/// Every descriptor number below a lowered RLIMIT_NOFILE is taken, restored on drop.
struct FdsExhausted {
    saved: libc::rlimit,
    _fillers: Vec<std::fs::File>,
}

impl FdsExhausted {
    #[allow(unsafe_code)]
    fn now() -> FdsExhausted {
        let mut saved = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit/setrlimit only read and write the struct passed.
        assert_eq!(
            unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut saved) },
            0
        );
        let highest = std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u64>().ok())
            .max()
            .unwrap();
        let low = libc::rlimit {
            rlim_cur: (highest + 1) as libc::rlim_t,
            rlim_max: saved.rlim_max,
        };
        // SAFETY: as above.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &low) }, 0);
        // Fill the holes below the limit, so no new descriptor can be had.
        let mut fillers = Vec::new();
        while let Ok(f) = std::fs::File::open("/dev/null") {
            fillers.push(f);
        }
        assert!(
            std::fs::File::open("/dev/null").is_err(),
            "descriptors exhausted"
        );
        FdsExhausted {
            saved,
            _fillers: fillers,
        }
    }
}

impl Drop for FdsExhausted {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        // SAFETY: setrlimit only reads the struct passed.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &self.saved) };
    }
}

/// A connection established before the process ran out of descriptors carries bulk
/// data (which wants splice pipes) both ways, intact: when pipe2 fails with EMFILE
/// the relay copies instead of cutting the client off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_data_survives_running_out_of_descriptors() {
    let echo = Backend::echo("echo", false).await;
    let cb = Crossbar::start(&one_service(
        "    mode: tcp\n",
        &[backend_line("echo", echo.addr, "")],
    ))
    .await;
    let mut client = TcpStream::connect(cb.addr("svc")).await.unwrap();
    let mut buf = [0u8; 5];
    client.write_all(b"hello").await.unwrap();
    client.read_exact(&mut buf).await.unwrap();
    let data = payload(8 << 20, 16);
    let exhausted = FdsExhausted::now();
    let (n, digest) = exchange(client, &data).await;
    drop(exhausted);
    assert_eq!(n, data.len() as u64, "bytes echoed");
    assert_eq!(digest, sha(&data), "content intact");
}
