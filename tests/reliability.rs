//! The reliability pass (issue #16): each defect an adversarial review found, as a
//! test that failed before its fix. Real sockets on loopback, real processes where
//! the defect lives between processes (the upgrade socket).
mod common;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use crossbar::admin;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Bound on anything that should happen "at once" on loopback, with slack for a
/// loaded 2-core CI machine.
const PROMPT: Duration = Duration::from_secs(5);

// ---------------------------------------------------------------------------
// The admin endpoint

fn get(path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").into_bytes()
}

/// Every admin slot held by a request that declared a body and sent none: /healthz
/// and /metrics still answer at once, other endpoints are refused with 503, and
/// each stalled request is answered 408 and closed (the whole request is timed,
/// not only its headers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_admin_bodies_time_out_and_health_still_answers() {
    let bed = admin_bed("", None).await;
    let mut stalled = Vec::new();
    for _ in 0..admin::MAX_CONNECTIONS {
        let mut s = TcpStream::connect(bed.addr).await.unwrap();
        s.write_all(b"POST /api/reload HTTP/1.1\r\nHost: localhost\r\nContent-Length: 10\r\n\r\n")
            .await
            .unwrap();
        stalled.push(s);
    }
    // Every stalled request in progress (headers read, body awaited): none of them
    // is an idle connection that a new one could push out.
    wait_until("every stalled request in progress", || {
        bed.cb.metric("crossbar_admin_requests_in_progress", &[]) == admin::MAX_CONNECTIONS as f64
    })
    .await;
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
    let bed = admin_bed("    stick: { on: [source] }\n", None).await;
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

// ---------------------------------------------------------------------------
// Reload while backends are at their limit

/// `POST /api/reload` on the admin endpoint at `admin` (the SIGHUP path); its status.
async fn post_reload(admin: SocketAddr) -> Option<u16> {
    let req =
        b"POST /api/reload HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    raw_request(admin, req, WAIT).await.0
}

/// Backend `a` is full (`max_connections: 2`, two held connections) when the config
/// is reloaded: new clients queue instead of getting a third slot (before: the new
/// pool counted from 0 and let two more in), releasing one held connection lets
/// exactly one queued client in, and the active-connections gauge stays exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_keeps_a_full_backend_full() {
    let a = Backend::echo("a", true).await;
    let config = |extra: &str| {
        one_service(
            &format!("    mode: tcp\n    queue_size: 4\n    timeouts: {{ queue: 1h }}\n{extra}"),
            &[backend_line("a", a.addr, "max_connections: 2")],
        )
    };
    let lb = Crossbar::start(&config("")).await;
    let admin = lb.serve_admin(None).await;
    let gauge = |lb: &Crossbar| lb.metric("crossbar_active_connections", &[("backend", "a")]);
    let mut held = Vec::new();
    for _ in 0..2 {
        let (name, s) = who(lb.addr("svc")).await;
        assert_eq!(name, "a");
        held.push(s);
    }
    assert_eq!(gauge(&lb), 2.0);

    std::fs::write(&lb.path, config("    retries: 3\n")).unwrap();
    assert_eq!(post_reload(admin.addr).await, Some(200), "reload");
    assert_eq!(lb.config().services[0].retries, 3, "the new config runs");
    assert_eq!(
        lb.active("svc", "a"),
        2,
        "the new pool counts the old connections"
    );
    assert_eq!(gauge(&lb), 2.0);

    let mut waiting = Vec::new();
    for _ in 0..2 {
        waiting.push(TcpStream::connect(lb.addr("svc")).await.unwrap());
    }
    let queued = || lb.service("svc").map_or(0, |s| s.pool.queued());
    wait_until("both new clients queued (or let in)", || {
        queued() == 2 || a.accepted() > 2
    })
    .await;
    assert_eq!(
        a.accepted(),
        2,
        "a full backend took a connection after the reload"
    );
    assert_eq!(gauge(&lb), 2.0);

    drop(held.pop());
    wait_until("a queued client gets the freed slot", || a.accepted() == 3).await;
    wait_until("the other stays queued", || queued() == 1).await;
    assert_eq!(lb.active("svc", "a"), 2, "exactly one queued client let in");
    assert_eq!(gauge(&lb), 2.0);

    drop(held);
    wait_until("the last queued client gets a slot", || a.accepted() == 4).await;
    drop(waiting);
    wait_until("every connection closed", || {
        lb.active("svc", "a") == 0 && queued() == 0
    })
    .await;
    assert_eq!(gauge(&lb), 0.0, "the gauge ends exactly at 0");
}

/// `leastconn` remembers the load across a reload: `a` holds two connections when
/// `b` is added, so the next two connections both go to `b` (before: both counted 0
/// and one of them went to `a`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_keeps_leastconn_load() {
    let a = Backend::echo("a", true).await;
    let b = Backend::echo("b", true).await;
    let lines = |with_b: bool| {
        let mut l = vec![backend_line("a", a.addr, "")];
        if with_b {
            l.push(backend_line("b", b.addr, ""));
        }
        one_service("    mode: tcp\n    balance: leastconn\n", &l)
    };
    let lb = Crossbar::start(&lines(false)).await;
    let admin = lb.serve_admin(None).await;
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(who(lb.addr("svc")).await);
    }
    std::fs::write(&lb.path, lines(true)).unwrap();
    assert_eq!(post_reload(admin.addr).await, Some(200), "reload");
    for i in 0..2 {
        let (name, s) = who(lb.addr("svc")).await;
        assert_eq!(name, "b", "connection {i} after the reload");
        held.push((name, s));
    }
    assert_eq!(lb.active("svc", "a"), 2);
    assert_eq!(lb.active("svc", "b"), 2);
}

// ---------------------------------------------------------------------------
// A backend that accepts and never answers the ClientHello

/// `quiet` accepts and never answers the hello: after `timeouts.server_hello` the
/// client's hello goes to the next backend and its handshake completes there (before:
/// it waited for the 30-minute idle timeout). With no backend left, the client is
/// closed with `end=server_hello_timeout`. Both are counted on the backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_never_answers_the_hello_is_timed_out() {
    let log = LogBuffer::install();
    let ca = crossbar::testbed::TestCa::new("answer CA").expect("CA");
    let quiet = Backend::silent("quiet").await;
    let good = Backend::tls_echo(&ca, "good").await;
    let settings =
        "    balance: first\n    retries: 1\n    timeouts: { server_hello: 300ms, idle: 1h }\n";
    let lb = Crossbar::start(&one_service(
        settings,
        &[
            backend_line("quiet", quiet.addr, ""),
            backend_line("good", good.addr, ""),
        ],
    ))
    .await;
    let mut tls = tls_connect(&ca, lb.addr("svc")).await;
    tls.write_all(b"ping").await.unwrap();
    let mut echoed = [0u8; 4];
    within("the echo", tls.read_exact(&mut echoed))
        .await
        .unwrap();
    assert_eq!(&echoed, b"ping");
    assert_eq!((quiet.accepted(), good.accepted()), (1, 1));
    let timeouts = |lb: &Crossbar| {
        lb.metric(
            "crossbar_server_hello_timeouts_total",
            &[("backend", "quiet")],
        )
    };
    assert_eq!(timeouts(&lb), 1.0);
    assert!(log.contains("did not answer the ClientHello within 300ms"));
    drop(tls);

    let only = Crossbar::start(&one_service(
        "    retries: 0\n    timeouts: { server_hello: 300ms, idle: 1h }\n",
        &[backend_line("quiet", quiet.addr, "")],
    ))
    .await;
    let mut client = TcpStream::connect(only.addr("svc")).await.unwrap();
    client
        .write_all(&hello_fixture("openssl3_tls13.bin"))
        .await
        .unwrap();
    let (got, _) = within("the client is closed", read_to_end_or_error(&mut client)).await;
    assert!(got.is_empty(), "nothing came from the silent backend");
    wait_until("end=server_hello_timeout logged", || {
        log.contains("end=server_hello_timeout")
    })
    .await;
    assert_eq!(timeouts(&only), 1.0);
}

// ---------------------------------------------------------------------------
// Bytes behind the hello (0-RTT early data) reach one backend only (issue #26, 4)

/// A backend that reads the hello (`hello_len` bytes), closes its sending side
/// without a byte (crossbar sees it close unanswered), then reads what else comes
/// until crossbar lets go; sends everything it received on `got`.
async fn unanswering_closer(
    hello_len: usize,
) -> (SocketAddr, tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let mut got = vec![0u8; hello_len];
            if s.read_exact(&mut got).await.is_err() {
                continue;
            }
            let _ = s.shutdown().await; // ok: crossbar may be gone already
            let _ = s.read_to_end(&mut got).await; // ok: what came is what counts
            let _ = tx.send(got); // ok: the test may have ended
        }
    });
    (addr, rx)
}

/// A client writes its ClientHello, an early-data record and an application record
/// in one write. The first backend never answers (then, second variant, closes
/// unanswered): the hello goes to the second backend, which answers. Only the
/// hello may reach both: the bytes behind it go to the backend that answered, once,
/// and the access log counts both backends (`tried=2`). Before: they were sent to
/// both backends, and the log said `tried=1`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_behind_the_hello_reach_only_the_backend_that_answered() {
    let log = LogBuffer::install();
    let hello = hello_fixture("openssl3_tls13.bin");
    let mut extra = vec![0x17, 0x03, 0x03, 0x00, 0x05, 1, 2, 3, 4, 5];
    extra.extend_from_slice(&[0x17, 0x03, 0x03, 0x00, 0x04, 9, 9, 9, 9]);
    let sent: Vec<u8> = [hello.clone(), extra.clone()].concat();
    let answer = std::sync::Arc::new(b"answer".to_vec());
    let settings =
        "    balance: first\n    retries: 1\n    timeouts: { server_hello: 300ms, idle: 1h }\n";
    for (i, variant) in ["never answers", "closes unanswered"].iter().enumerate() {
        let quiet = Backend::silent("quiet").await;
        let (closer, mut closer_got) = unanswering_closer(hello.len()).await;
        let first = if i == 0 { quiet.addr } else { closer };
        let second = Backend::server_first("second", answer.clone()).await;
        let lb = Crossbar::start(&one_service(
            settings,
            &[
                backend_line("first", first, ""),
                backend_line("second", second.addr, ""),
            ],
        ))
        .await;
        let from: std::net::IpAddr = format!("127.0.0.{}", 20 + i).parse().unwrap();
        let mut client = connect_from(from, lb.addr("svc")).await;
        client.write_all(&sent).await.unwrap();
        let (got, _) = within("the answer", read_to_end_or_error(&mut client)).await;
        assert_eq!(got, *answer, "{variant}");
        drop(client);

        let first_got = if i == 0 {
            let r = quiet.next_report().await;
            assert_eq!(r.received, hello.len() as u64, "{variant}: first backend");
            (r.sha == sha(&hello)).then(|| hello.clone())
        } else {
            within("the closer's report", closer_got.recv()).await
        };
        assert_eq!(
            first_got.as_deref(),
            Some(&hello[..]),
            "{variant}: the backend that never answered got only the hello"
        );
        let r = second.next_report().await;
        assert_eq!(
            (r.received, r.sha),
            (sent.len() as u64, sha(&sent)),
            "{variant}: the backend that answered got the hello and what followed, once"
        );
        let client = format!("client={from}:");
        wait_until("the access-log line", || {
            !log.lines_with(&client).is_empty()
        })
        .await;
        let lines = log.lines_with(&client);
        assert!(
            lines[0].contains("tried=2") && lines[0].contains("backend=\"second\""),
            "{variant}: {}",
            lines[0]
        );
    }
}

/// A backend whose answer to the hello is a few bytes and a close (an alert, then
/// FIN; this one sends both at accept, so they are usually both there when crossbar
/// looks) has answered: the client gets those bytes and the close, and no other
/// backend is tried. crossbar tells an answer from a close before answering by the
/// backend socket's readiness, peeking only when it shows a close; counting that
/// close as unanswered would hand the hello to `spare`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_answers_and_closes_at_once_has_answered() {
    let alert = std::sync::Arc::new(vec![0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x28]);
    let answers = Backend::server_first("answers", alert.clone()).await;
    let spare = Backend::server_first("spare", std::sync::Arc::new(b"spare".to_vec())).await;
    let lb = Crossbar::start(&one_service(
        "    balance: first\n    retries: 1\n",
        &[
            backend_line("answers", answers.addr, ""),
            backend_line("spare", spare.addr, ""),
        ],
    ))
    .await;
    let hello = hello_fixture("openssl3_tls13.bin");
    for round in 0..5 {
        let mut client = TcpStream::connect(lb.addr("svc")).await.unwrap();
        client.write_all(&hello).await.unwrap();
        let (got, clean) = within("the answer", read_to_end_or_error(&mut client)).await;
        assert_eq!(got, *alert, "round {round}: the first backend's answer");
        assert!(clean, "round {round}: then its close, as a FIN");
        drop(client);
        let r = answers.next_report().await;
        assert_eq!(r.received, hello.len() as u64, "round {round}");
    }
    assert_eq!(spare.accepted(), 0, "no hello went to the spare backend");
    let errors = lb.metric("crossbar_connect_errors_total", &[("backend", "answers")]);
    assert_eq!(errors, 0.0);
}

// ---------------------------------------------------------------------------
// A reload that keeps a stick table applies its new lifetimes

/// The remaining lifetime of the only entry of `svc`'s table.
fn only_entry_expires_in(lb: &Crossbar) -> Duration {
    let svc = lb.service("svc").expect("svc");
    let entries = svc.table.as_ref().expect("a stick table").entries(10);
    assert_eq!(entries.len(), 1, "{entries:?}");
    entries[0].expires_in
}

/// `source_expire` shortened by a reload that keeps the table (same size and
/// expire) applies to the entry already learned at once (before: the old lifetime
/// stayed in force until restart), and lengthened again, too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_applies_a_new_source_lifetime() {
    let a = Backend::echo("a", true).await;
    let config = |source_expire: &str| {
        one_service(
            &format!("    mode: tcp\n    stick: {{ on: [source], expire: 2h, source_expire: {source_expire} }}\n"),
            &[backend_line("a", a.addr, "")],
        )
    };
    let lb = Crossbar::start(&config("1h")).await;
    let (name, _held) = who(lb.addr("svc")).await;
    assert_eq!(name, "a");
    let table = lb.service("svc").unwrap().table.clone().unwrap();
    assert!(only_entry_expires_in(&lb) > Duration::from_secs(50 * 60));

    lb.reload(&config("10s")).await;
    let kept = lb.service("svc").unwrap().table.clone().unwrap();
    assert!(std::sync::Arc::ptr_eq(&table, &kept), "the table is kept");
    let left = only_entry_expires_in(&lb);
    assert!(
        left <= Duration::from_secs(10),
        "expires in {left:?} after the reload"
    );

    lb.reload(&config("3h")).await;
    let left = only_entry_expires_in(&lb);
    assert!(
        left > Duration::from_secs(2 * 3600),
        "expires in {left:?} after the second reload"
    );
}

// ---------------------------------------------------------------------------
// State files

/// Two services naming one state file would overwrite each other's table: `check`
/// refuses it at the second one's line.
#[test]
fn check_refuses_a_state_file_shared_by_two_services() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("shared.table");
    let yaml = format!(
        "admin: {{ enabled: false }}\nservices:\n  a:\n    listen: [\"127.0.0.1:0\"]\n    \
         stick: {{ state_file: {t} }}\n    backends: [{{ name: x, address: \"127.0.0.1:1\" }}]\n  \
         b:\n    listen: [\"127.0.0.1:0\"]\n    stick: {{ state_file: {t} }}\n    \
         backends: [{{ name: y, address: \"127.0.0.1:2\" }}]\n",
        t = table.display()
    );
    let path = dir.path().join("crossbar.yaml");
    std::fs::write(&path, yaml).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_crossbar"))
        .arg("check")
        .arg("-c")
        .arg(&path)
        .output()
        .expect("run crossbar check");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let at = format!("{}:9:", path.display());
    let what = format!(
        "services.b.stick.state_file: {} is already the state file of service a",
        table.display()
    );
    assert!(err.contains(&at) && err.contains(&what), "{err}");
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
        let (cfg, listen) = tcp_config(dir.path(), echo.addr);
        let yaml = std::fs::read_to_string(&cfg).unwrap().replace(
            "    mode: tcp\n",
            &format!(
                "    mode: tcp\n    stick: {{ on: [source], size: {}, save_interval: 10ms, state_file: {} }}\n",
                ENTRIES + 100,
                table.display()
            ),
        );
        std::fs::write(&cfg, yaml).unwrap();
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
