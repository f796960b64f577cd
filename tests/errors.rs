//! Failures on either side: a backend reset, a silent backend and the idle timeout,
//! clients that leave early, a listen address already taken, and backends that do
//! not answer the ClientHello (timed out, the hello retried elsewhere, the bytes
//! behind it sent to one backend only).
mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Backend `r` resets after 64 KiB mid-stream: that client's connection is closed
/// (EOF or error, no hang); a concurrent connection on another backend is unaffected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_reset_closes_the_client_and_spares_other_connections() {
    let resetter = Backend::reset_after("r", 64 * 1024).await;
    let echo = Backend::echo("e", true).await;
    let lb = Crossbar::start(&one_service(
        "    mode: tcp\n    balance: roundrobin\n",
        &[
            backend_line("r", resetter.addr, ""),
            backend_line("e", echo.addr, ""),
        ],
    ))
    .await;

    let mut conns = vec![who(lb.addr("svc")).await, who(lb.addr("svc")).await];
    conns.sort_by(|a, b| a.0.cmp(&b.0));
    let [(en, good), (rn, mut doomed)] = <[_; 2]>::try_from(conns).unwrap();
    assert_eq!((en.as_str(), rn.as_str()), ("e", "r"));

    // The doomed client streams until its connection breaks; its reader must end.
    let (mut dr, mut dw) = doomed.split();
    let data = payload(4 * 1024 * 1024, 3);
    let writer = async {
        for chunk in data.chunks(16 * 1024) {
            if dw.write_all(chunk).await.is_err() {
                return;
            }
        }
    };
    let ((), (got, _clean)) = within("the reset to reach the client", async {
        tokio::join!(writer, read_to_end_or_error(&mut dr))
    })
    .await;
    assert!(
        got.is_empty(),
        "the resetting backend sent no data, got {got:?}"
    );
    let seen = resetter.next_report().await;
    assert_eq!(seen.received, 64 * 1024);

    // The other connection still relays, intact.
    let data = payload(1024 * 1024, 4);
    let (n, digest) = exchange(good, &data).await;
    assert_eq!(n, data.len() as u64);
    assert_eq!(hex(&digest), hex(&sha(&data)));
}

/// Time is the subject: `timeouts: { idle: 1s }` closes a connection whose backend
/// accepted but never answers, on both sides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_timeout_closes_a_connection_to_a_silent_backend() {
    let silent = Backend::silent("quiet").await;
    let lb = Crossbar::start(&one_service(
        "    mode: tcp\n    timeouts: { idle: 1s }\n",
        &[backend_line("quiet", silent.addr, "")],
    ))
    .await;

    let mut client = TcpStream::connect(lb.addr("svc")).await.unwrap();
    // The clock starts before the write: crossbar may read the bytes (its last
    // activity) before this thread runs again, and on a loaded machine that can be
    // long before a clock read after the write.
    let started = Instant::now();
    client.write_all(b"hello?").await.unwrap();
    let (got, _) = within("the idle timeout", read_to_end_or_error(&mut client)).await;

    assert!(got.is_empty());
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "closed after {:?}, before the idle timeout",
        started.elapsed()
    );
    // crossbar closed the backend side too; it had received the 6 bytes.
    let seen = silent.next_report().await;
    assert_eq!(seen.received, 6);
}

/// A client that leaves while crossbar is still connecting (the backend's SYNs are
/// dropped): the connection task ends after the connect timeout; nothing leaks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_leaving_during_a_black_holed_connect_leaks_nothing() {
    let hole = BlackHole::new();
    let lb = Crossbar::start(&one_service(
        "    mode: tcp\n    retries: 0\n    timeouts: { connect: 300ms }\n",
        &[backend_line("hole", hole.addr, "")],
    ))
    .await;
    let baseline = lb.server.open_tasks();

    let client = TcpStream::connect(lb.addr("svc")).await.unwrap();
    wait_until("crossbar accepts", || {
        lb.metric("crossbar_listener_accepts_total", &[]) == 1.0
    })
    .await;
    drop(client);

    wait_until("the connect attempt fails", || {
        lb.metric("crossbar_connect_errors_total", &[("backend", "hole")]) == 1.0
    })
    .await;
    wait_until("the connection task ends", || {
        lb.server.open_tasks() == baseline
    })
    .await;
    assert_eq!(lb.active("svc", "hole"), 0);
}

/// tcp mode watches a waiting client for a reset by the socket's error, without a
/// system call. A client that resets with no byte sent, while crossbar is still
/// connecting (the backend's SYNs are dropped), ends the attempt at once
/// (`end=client_closed`, the backend not blamed); one that sent bytes before its
/// reset has them, and then the reset, delivered to the backend that is reached
/// next (the first connect times out), as directly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_reset_during_a_connect_ends_it_unless_bytes_came_first() {
    let log = common::log::LogBuffer::install();
    let hole = BlackHole::new();
    let lb = Crossbar::start(&one_service(
        "    mode: tcp\n    retries: 0\n    timeouts: { connect: 10m }\n",
        &[backend_line("hole", hole.addr, "")],
    ))
    .await;
    let baseline = lb.server.open_tasks();
    let client = TcpStream::connect(lb.addr("svc")).await.unwrap();
    wait_until("crossbar accepts", || {
        lb.metric("crossbar_listener_accepts_total", &[]) == 1.0
    })
    .await;
    socket2::SockRef::from(&client)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(client);
    wait_until("end=client_closed logged", || {
        log.contains("end=client_closed")
    })
    .await;
    wait_until("the connection task ends", || {
        lb.server.open_tasks() == baseline
    })
    .await;
    let failed = lb.metric("crossbar_connect_errors_total", &[("backend", "hole")]);
    assert_eq!(failed, 0.0, "abandoned, not failed");

    let after = Backend::silent("after").await;
    let lb = Crossbar::start(&one_service(
        "    mode: tcp\n    balance: first\n    retries: 1\n    timeouts: { connect: 1s }\n",
        &[
            backend_line("hole", hole.addr, ""),
            backend_line("after", after.addr, ""),
        ],
    ))
    .await;
    let mut client = TcpStream::connect(lb.addr("svc")).await.unwrap();
    client.write_all(b"first bytes").await.unwrap();
    socket2::SockRef::from(&client)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
    drop(client);
    let seen = within("the next backend's report", after.next_report()).await;
    assert_eq!(seen.received, 11, "the bytes sent before the reset");
    assert!(!seen.clean_eof, "then the reset, not a FIN");
}

/// A client that leaves right after connecting to a backend that never speaks: the
/// backend sees EOF (crossbar closes its side) and the task ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_leaving_early_closes_the_backend_side() {
    let silent = Backend::silent("quiet").await;
    let lb = Crossbar::start(&one_service(
        "    mode: tcp\n",
        &[backend_line("quiet", silent.addr, "")],
    ))
    .await;
    let baseline = lb.server.open_tasks();

    for _ in 0..5 {
        let client = TcpStream::connect(lb.addr("svc")).await.unwrap();
        drop(client);
    }
    for _ in 0..5 {
        let seen = silent.next_report().await;
        assert_eq!(seen.received, 0);
    }
    wait_until("the connection tasks end", || {
        lb.server.open_tasks() == baseline
    })
    .await;
    assert_eq!(silent.accepted(), 5);
    assert_eq!(lb.active("svc", "quiet"), 0);
}

/// Same in `mode: tls`: a client that sends half a ClientHello and leaves never
/// reaches a backend, and its task ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_leaving_mid_hello_ends_without_a_backend_connection() {
    let silent = Backend::silent("quiet").await;
    let lb = Crossbar::start(&one_service("", &[backend_line("quiet", silent.addr, "")])).await;
    let baseline = lb.server.open_tasks();

    let mut client = TcpStream::connect(lb.addr("svc")).await.unwrap();
    // A handshake record header announcing 512 bytes, and only 4 of them.
    client
        .write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc])
        .await
        .unwrap();
    drop(client);

    wait_until("crossbar accepts", || {
        lb.metric("crossbar_listener_accepts_total", &[]) == 1.0
    })
    .await;
    wait_until("the connection task ends", || {
        lb.server.open_tasks() == baseline
    })
    .await;
    assert_eq!(silent.accepted(), 0);
    assert_eq!(
        lb.metric(
            "crossbar_client_hello_errors_total",
            &[("service", "svc"), ("reason", "truncated")]
        ),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_address_in_use_is_an_error_naming_the_address() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let yaml = format!(
        "admin: {{ enabled: false }}\nservices:\n  svc:\n    listen: [\"{addr}\"]\n    backends:\n      - {{ name: b, address: \"127.0.0.1:1\" }}\n"
    );

    let err = match Crossbar::try_start(&yaml).await {
        Ok(_) => panic!("crossbar started on {addr}, which is taken"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains(&addr.to_string()), "{err}");
    assert!(err.contains("in use"), "{err}");
}

/// A listener's own `max_connections`: the connection over the limit is closed at
/// once, without reaching a backend, and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listener_max_connections_closes_the_excess() {
    let echo = Backend::echo("e", true).await;
    let yaml = one_service("    mode: tcp\n", &[backend_line("e", echo.addr, "")]).replace(
        "listen: [\"127.0.0.1:0\"]",
        "listen: [{ address: \"127.0.0.1:0\", max_connections: 1 }]",
    );
    let lb = Crossbar::start(&yaml).await;

    let (_, held) = who(lb.addr("svc")).await;
    let mut excess = TcpStream::connect(lb.addr("svc")).await.unwrap();
    let (got, _) = within(
        "the excess connection to close",
        read_to_end_or_error(&mut excess),
    )
    .await;

    assert!(got.is_empty(), "{got:?}");
    assert_eq!(echo.accepted(), 1);
    assert_eq!(
        lb.metric("crossbar_listener_refused_total", &[]),
        1.0,
        "{}",
        lb.server.metrics().encode()
    );
    // The slot frees when the held connection ends.
    drop(held);
    wait_until("the held connection ends", || lb.active("svc", "e") == 0).await;
    let (name, _) = who(lb.addr("svc")).await;
    assert_eq!(name, "e");
}

/// Shutdown stops accepting, lets a connection that finishes within the grace period
/// finish, and cuts (and counts) one that doesn't. Time is the subject: a 1 s grace
/// (the finishing connection needs a few ms of it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_accepting_and_cuts_what_outlives_the_grace() {
    let echo = Backend::echo("e", true).await;
    let lb = Crossbar::start(&one_service(
        "    mode: tcp\n",
        &[backend_line("e", echo.addr, "")],
    ))
    .await;
    let addr = lb.addr("svc");
    let (_, mut lingering) = who(addr).await;
    let (_, finishing) = who(addr).await;

    let server = lb.server.clone();
    let shutdown = tokio::spawn(async move { server.shutdown(Duration::from_secs(1)).await });
    // The finishing connection still relays during the grace period.
    let data = payload(64 * 1024, 9);
    let (n, digest) = exchange(finishing, &data).await;
    assert_eq!((n, hex(&digest)), (data.len() as u64, hex(&sha(&data))));

    let cut = within("shutdown", shutdown).await.unwrap();
    assert_eq!(cut, 1, "exactly the lingering connection is cut");
    let (got, _) = within("the cut", read_to_end_or_error(&mut lingering)).await;
    assert!(got.is_empty());
    assert_eq!(lb.server.open_tasks(), 0);
    // The listener is closed.
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "still accepting after shutdown"
    );
}

/// A "backend" that accepts, reads what arrives, then closes (FIN) or resets
/// without sending a byte: a master dying with connections in its accept queue.
async fn mute_closer(
    reset: bool,
) -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    use tokio::io::AsyncReadExt;
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf).await; // ok: the hello, discarded
            if reset {
                let _ = socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO));
                // ok: test peer
            }
            drop(s);
        }
    });
    (addr, seen)
}

/// TLS mode: a backend that takes the ClientHello and closes or resets without a
/// byte is retried like a refused connect; the client's handshake completes on the
/// next backend and never notices.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_closing_before_answering_the_hello_is_retried() {
    for reset in [false, true] {
        let ca = crossbar::testbed::TestCa::new("retry test").unwrap();
        let (mute, seen) = mute_closer(reset).await;
        let good = Backend::tls_echo(&ca, "good").await;
        let lb = Crossbar::start(&one_service(
            "    balance: first\n",
            &[
                backend_line("mute", mute, ""),
                backend_line("good", good.addr, ""),
            ],
        ))
        .await;
        let data = payload(10_000, 3);
        let tls = tls_connect(&ca, lb.addr("svc")).await;
        let (n, digest) = exchange(tls, &data).await;
        assert_eq!(
            (n, digest),
            (data.len() as u64, sha(&data)),
            "reset={reset}"
        );
        assert_eq!(
            seen.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "the mute backend got the hello once"
        );
        let m = |name: &str, b: &str| lb.metric(name, &[("service", "svc"), ("backend", b)]);
        assert_eq!(m("crossbar_connect_errors_total", "mute"), 1.0);
        assert_eq!(m("crossbar_connections_total", "mute"), 0.0);
        assert_eq!(m("crossbar_connections_total", "good"), 1.0);
    }
}

// ---------------------------------------------------------------------------
// A backend that does not answer the ClientHello

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
// Bytes behind the hello (0-RTT early data) reach one backend only

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
