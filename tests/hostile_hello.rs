//! Acceptance: SNI routing on a shared listener, and clients that send hellos slowly,
//! fragmented, oversized, not at all, not TLS, or with forged session state.
//! Real clients and servers on loopback; every port is picked by the kernel.
mod common;

use common::hello::{forge, parsed};
use common::{any_port, hello_fixture, tls, wait_until, Crossbar};

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbar::stick::KeyKind;
use crossbar::testbed::{self, BackendTls, TestCa, TlsBackend, Versions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Names on every test backend's certificate (SNI routing sends several).
const NAMES: &[&str] = &[
    tls::SNI,
    "a.example.com",
    "x.wild.example.com",
    "other.example.com",
    "b.example.com",
    "nomatch.example.com",
    "localhost",
];
/// Bound on a whole exchange that should succeed.
const EXCHANGE: Duration = Duration::from_secs(10);

async fn backend(ca: &TestCa, name: &str, tls: BackendTls) -> TlsBackend {
    TlsBackend::start(ca, name, NAMES, tls, any_port())
        .await
        .unwrap()
}

/// crossbar with one service `svc` in front of `backends`; `extra` is more YAML of the
/// service (indented 4 spaces).
async fn single(backends: &[(String, SocketAddr)], extra: &str) -> (Crossbar, SocketAddr) {
    let yaml = format!(
        "admin: {{ enabled: false }}\nservices:\n  svc:\n    listen: [\"127.0.0.1:0\"]\n    health: {{ check: none }}\n{extra}    backends:\n{}",
        tls::backends_yaml(backends)
    );
    let server = Crossbar::start(&yaml).await;
    let addr = server.addr("svc");
    (server, addr)
}

/// Read until the peer closes (EOF or reset); returns how long that took and what came.
async fn until_closed(s: &mut TcpStream, limit: Duration) -> (Duration, Vec<u8>) {
    let started = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at((started + limit).into(), s.read(&mut buf)).await {
            Err(_) => panic!("still open after {limit:?}"),
            Ok(Ok(0)) | Ok(Err(_)) => return (started.elapsed(), got),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
}

fn hello_errors(server: &Crossbar, reason: &str) -> f64 {
    server.metric(
        "crossbar_client_hello_errors_total",
        &[("service", "svc"), ("reason", reason)],
    )
}

async fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sni_routes_on_a_shared_listener() {
    let ca = TestCa::new("routing CA").unwrap();
    let tls = BackendTls::default();
    let (exact, wild, dflt, b, c) = (
        backend(&ca, "exact-b", tls).await,
        backend(&ca, "wild-b", tls).await,
        backend(&ca, "default-b", tls).await,
        backend(&ca, "b-b", tls).await,
        backend(&ca, "c-b", tls).await,
    );
    let (shared, strict) = (free_addr().await, free_addr().await);
    let svc = |name: &str, addr: SocketAddr, names: &str, be: &TlsBackend| {
        format!(
            "  {name}:\n    listen: [\"{addr}\"]\n    health: {{ check: none }}\n{names}    backends:\n      - {{ name: {}, address: \"{}\" }}\n",
            be.name, be.addr
        )
    };
    let yaml = [
        "admin: { enabled: false }\nservices:\n".to_string(),
        svc(
            "exact",
            shared,
            "    server_names: [a.example.com]\n",
            &exact,
        ),
        svc(
            "wild",
            shared,
            "    server_names: [\"*.wild.example.com\"]\n",
            &wild,
        ),
        svc("dflt", shared, "    default: true\n", &dflt),
        svc("bsvc", strict, "    server_names: [b.example.com]\n", &b),
        svc("csvc", strict, "    server_names: [c.example.com]\n", &c),
    ]
    .concat();
    let server = Crossbar::start(&yaml).await;
    let cfg = testbed::client_config(&ca, Versions::Both, true).unwrap();
    let ask = |addr: SocketAddr, sni: &str| {
        let (cfg, sni) = (cfg.clone(), sni.to_string());
        async move { tokio::time::timeout(EXCHANGE, testbed::get(addr, &sni, cfg, "/")).await }
    };
    for (sni, want) in [
        ("a.example.com", "exact-b"),
        ("A.Example.COM", "exact-b"),
        ("x.wild.example.com", "wild-b"),
        ("other.example.com", "default-b"),
        ("b.example.com", "default-b"),
    ] {
        let r = ask(shared, sni).await.unwrap().unwrap();
        assert_eq!(r.backend, want, "SNI {sni} on the listener with a default");
    }
    let r = ask(strict, "b.example.com").await.unwrap().unwrap();
    assert_eq!(r.backend, "b-b");
    let refused = ask(strict, "nomatch.example.com").await.unwrap();
    assert!(refused.is_err(), "no match, no default: {refused:?}");
    assert_eq!(
        server.metric(
            "crossbar_route_refused_total",
            &[("service", "unrouted"), ("reason", "no_route")]
        ),
        1.0
    );
}

/// Relay one client through to `upstream`, writing its first flight (the ClientHello
/// record) one byte per TCP segment with short pauses, then relaying normally.
async fn trickle_proxy(upstream: SocketAddr) -> (SocketAddr, tokio::task::JoinHandle<usize>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let (mut client, _) = l.accept().await.unwrap();
        let mut header = [0u8; 5];
        client.read_exact(&mut header).await.unwrap();
        let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
        let mut body = vec![0u8; len];
        client.read_exact(&mut body).await.unwrap();
        let hello = [&header[..], &body].concat();
        let mut server = TcpStream::connect(upstream).await.unwrap();
        server.set_nodelay(true).unwrap();
        for b in &hello {
            server.write_all(std::slice::from_ref(b)).await.unwrap();
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // Either side closing ends the relay; the test only needs the exchange.
        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await; // ok: see above
        hello.len()
    });
    (addr, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hello_sent_one_byte_per_write_still_routes() {
    let ca = TestCa::new("trickle CA").unwrap();
    let be = backend(&ca, "b1", BackendTls::default()).await;
    let (server, addr) = single(&[(be.name.clone(), be.addr)], "").await;
    let (proxy, task) = trickle_proxy(addr).await;
    let cfg = testbed::client_config(&ca, Versions::Both, true).unwrap();
    let r = tokio::time::timeout(EXCHANGE, testbed::get(proxy, tls::SNI, cfg, "/"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r.backend, "b1");
    let sent = task.await.unwrap();
    assert!(sent > 200, "hello of {sent} bytes sent one byte at a time");
    assert_eq!(hello_errors(&server, "timeout"), 0.0);
}

/// Split the one record of `hello` into `parts` records of the same type and version.
fn reframe(hello: &[u8], parts: usize) -> Vec<u8> {
    let body = &hello[5..];
    let chunk = body.len().div_ceil(parts);
    body.chunks(chunk)
        .flat_map(|c| {
            let len = u16::try_from(c.len()).unwrap().to_be_bytes();
            [&hello[..3], &len[..], c].concat()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hello_in_three_records_reaches_the_backend_byte_identical() {
    let raw = tcp_capture().await;
    let (server, addr) = single(&[("raw".into(), raw.0)], "").await;
    for name in ["openssl3_tls13.bin", "curl7_openssl3.bin", "java17.bin"] {
        let framed = reframe(&hello_fixture(name), 3);
        assert_eq!(
            framed.len(),
            hello_fixture(name).len() + 10,
            "{name}: three records"
        );
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(&framed).await.unwrap();
        let (mut at_backend, _) = tokio::time::timeout(EXCHANGE, raw.1.accept())
            .await
            .unwrap()
            .unwrap();
        let mut got = vec![0u8; framed.len()];
        tokio::time::timeout(EXCHANGE, at_backend.read_exact(&mut got))
            .await
            .unwrap()
            .unwrap();
        assert!(got == framed, "{name}: the backend got other bytes");
    }
    assert_eq!(hello_errors(&server, "malformed"), 0.0);
}

/// A plain TCP "backend" whose accepted sockets the test reads itself.
async fn tcp_capture() -> (SocketAddr, TcpListener) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    (l.local_addr().unwrap(), l)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_tls_bytes_are_closed_and_counted() {
    let raw = tcp_capture().await;
    // A hello timeout far beyond the exchange: a close before it is the parser's.
    let extra = "    timeouts: { client_hello: 60s }\n";
    let (server, addr) = single(&[("raw".into(), raw.0)], extra).await;
    let mut garbage: Vec<u8> = (0..300).map(|_| fastrand::u8(..)).collect();
    if garbage[0] == 0x16 {
        garbage[0] = 0x17;
    }
    let inputs: [&[u8]; 3] = [
        &garbage,
        b"GET / HTTP/1.1\r\nHost: puppet.example.com\r\n\r\n",
        b"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n",
    ];
    for input in inputs {
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(input).await.unwrap();
        let (took, answer) = until_closed(&mut c, EXCHANGE).await;
        assert!(answer.is_empty(), "nothing is answered to non-TLS bytes");
        eprintln!("{} non-TLS bytes: closed after {took:?}", input.len());
    }
    // Closed for what was sent, not by the hello timer.
    assert_eq!(hello_errors(&server, "not_tls"), 3.0);
    assert_eq!(hello_errors(&server, "timeout"), 0.0);
    let reached = tokio::time::timeout(Duration::from_millis(100), raw.1.accept()).await;
    assert!(reached.is_err(), "non-TLS bytes never reach the backend");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_hellos_are_too_large() {
    let ca = TestCa::new("size CA").unwrap();
    let be = backend(&ca, "b1", BackendTls::default()).await;
    let extra = "    max_hello_size: 1024\n    timeouts: { client_hello: 10s }\n";
    let (server, addr) = single(&[(be.name.clone(), be.addr)], extra).await;

    // A real rustls hello made big by 60 ALPN names (~1.9 KB > 1024).
    let mut cfg = (*testbed::client_config(&ca, Versions::Both, true).unwrap()).clone();
    cfg.alpn_protocols = (0..60)
        .map(|i| format!("protocol-name-{i:016}").into())
        .collect();
    let r = tokio::time::timeout(EXCHANGE, testbed::get(addr, tls::SNI, Arc::new(cfg), "/"))
        .await
        .unwrap();
    assert!(r.is_err(), "a hello over max_hello_size is refused: {r:?}");
    assert_eq!(hello_errors(&server, "too_large"), 1.0);

    // A header claiming a 16 MB handshake message: closed at once, not after 10 s.
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(&[
        0x16, 0x03, 0x01, 0x01, 0x00, 0x01, 0xff, 0xff, 0xff, 0x03, 0x03,
    ])
    .await
    .unwrap();
    let (took, _) = until_closed(&mut c, EXCHANGE).await;
    eprintln!("a declared-oversized record: closed after {took:?}");
    // Closed on the declared length, not by the (10 s) hello timer.
    assert_eq!(hello_errors(&server, "too_large"), 2.0);
    assert_eq!(hello_errors(&server, "timeout"), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_client_is_closed_at_the_hello_timeout() {
    let raw = tcp_capture().await;
    let extra = "    timeouts: { client_hello: 1s }\n";
    let (server, addr) = single(&[("raw".into(), raw.0)], extra).await;
    let mut c = TcpStream::connect(addr).await.unwrap();
    // until_closed's limit is a guard against "never", not a performance bound.
    let (took, _) = until_closed(&mut c, EXCHANGE).await;
    eprintln!("a silent client: closed after {took:?}, timeout 1s");
    assert!(
        took >= Duration::from_millis(900),
        "closed after {took:?}, before the 1s timeout"
    );
    wait_until("the timeout counted", || {
        hello_errors(&server, "timeout") == 1.0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_session_state_creates_no_stick_entries() {
    let ca = TestCa::new("forgery CA").unwrap();
    let mut list = Vec::new();
    let mut keep = Vec::new();
    for (i, versions) in [Versions::Tls12, Versions::Both].into_iter().enumerate() {
        let b = backend(
            &ca,
            &format!("b{i}"),
            BackendTls {
                versions,
                tickets: true,
            },
        )
        .await;
        list.push((b.name.clone(), b.addr));
        keep.push(b);
    }
    // The ticket-key probe is off: this test is about what client traffic can (not)
    // create, and the probe's own entries (key names of tickets issued to crossbar)
    // are covered by src/probe.rs.
    let extra = "    stick: { on: [session_id, ticket, psk], size: 1000, expire: 30m, probe_interval: 0s }\n";
    let (server, addr) = single(&list, extra).await;
    let table = server.service("svc").unwrap().table.clone().unwrap();

    // A TLS 1.2 hello offering a session ID and a ticket, and a TLS 1.3 hello offering
    // a PSK identity: each value replaced by random bytes of the same length.
    let mut t12 = hello_fixture("openssl3_tls12_ticket.bin");
    let info = parsed(&t12);
    let mut rng = fastrand::Rng::new();
    let fake_id = forge(&mut t12, &info.session_id, &mut rng);
    let fake_ticket = forge(&mut t12, info.ticket.as_ref().unwrap(), &mut rng);
    let mut t13 = hello_fixture("openssl3_tls13_psk.bin");
    let info = parsed(&t13);
    let fake_psk = forge(&mut t13, &info.psk_identities[0], &mut rng);
    assert_eq!(parsed(&t12).session_id, fake_id);
    assert_eq!(parsed(&t13).psk_identities[0], fake_psk);

    let idle = server.open_tasks();
    for round in 0..6 {
        let hello = if round % 2 == 0 { &t12 } else { &t13 };
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(hello).await.unwrap();
        if round < 4 {
            // Wait for the backend's answer (a full handshake), then walk away.
            let mut buf = [0u8; 1];
            let n = tokio::time::timeout(EXCHANGE, c.read(&mut buf))
                .await
                .unwrap();
            assert!(matches!(n, Ok(1)), "the backend answered: {n:?}");
        }
        drop(c);
    }
    wait_until("connections finished", || server.open_tasks() == idle).await;

    let forged = [
        (KeyKind::SessionId, &fake_id[..]),
        (KeyKind::Ticket, &fake_ticket[..]),
        (KeyKind::TicketPrefix, &fake_ticket[..16]),
        (KeyKind::Psk, &fake_psk[..]),
        (KeyKind::TicketPrefix, &fake_psk[..16]),
    ];
    for (kind, raw) in forged {
        assert_eq!(
            table.lookup(kind, raw, str::to_string),
            None,
            "forged {kind:?}"
        );
    }
    // Only what the servers issued themselves (a TLS 1.2 ServerHello's session ID) and
    // the short-lived source hint of a full handshake may be there.
    for e in table.entries(100) {
        assert!(
            matches!(e.kind, KeyKind::SessionId | KeyKind::Source),
            "unexpected entry {e:?}"
        );
    }
    let learned: f64 = ["ticket", "psk", "ticket_prefix"]
        .iter()
        .map(|k| server.metric("crossbar_stick_learned_total", &[("key", k)]))
        .sum();
    assert_eq!(learned, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_table_size_bound_holds() {
    let ca = TestCa::new("size CA").unwrap();
    let tls12_ids = BackendTls {
        versions: Versions::Tls12,
        tickets: false,
    };
    let (b1, b2) = (
        backend(&ca, "b1", tls12_ids).await,
        backend(&ca, "b2", tls12_ids).await,
    );
    let list = [(b1.name.clone(), b1.addr), (b2.name.clone(), b2.addr)];
    let extra = "    stick: { on: [session_id, ticket, psk], size: 5, expire: 30m }\n";
    let (server, addr) = single(&list, extra).await;
    let table = server.service("svc").unwrap().table.clone().unwrap();
    let mut resumed = 0;
    for _ in 0..20 {
        let cfg = testbed::client_config(&ca, Versions::Tls12, false).unwrap();
        for _ in 0..2 {
            let r = testbed::get(addr, tls::SNI, cfg.clone(), "/")
                .await
                .unwrap();
            resumed += usize::from(r.resumed);
        }
        assert!(table.stats().entries <= 5, "{:?}", table.stats());
    }
    assert!(
        resumed >= 19,
        "20 real resumable sessions (resumed {resumed})"
    );
    assert!(table.stats().evicted > 0, "{:?}", table.stats());
    let evicted = server.metric("crossbar_stick_evicted_total", &[("service", "svc")]);
    assert!(evicted > 0.0, "crossbar_stick_evicted_total = {evicted}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_expire() {
    let ca = TestCa::new("expiry CA").unwrap();
    let be = backend(&ca, "b1", BackendTls::default()).await;
    let extra = "    stick: { on: [session_id, ticket, psk], size: 100, expire: 2s }\n";
    let (server, addr) = single(&[(be.name.clone(), be.addr)], extra).await;
    let table = server.service("svc").unwrap().table.clone().unwrap();
    for _ in 0..3 {
        let cfg = testbed::client_config(&ca, Versions::Tls12, true).unwrap();
        testbed::get(addr, tls::SNI, cfg, "/").await.unwrap();
    }
    let learned = table.stats().entries;
    assert!(learned >= 3, "{:?}", table.stats());
    let took = wait_until("every entry expires", || {
        table.sweep();
        table.stats().entries == 0
    })
    .await;
    assert!(took >= Duration::from_secs(1), "expired too early");
    assert!(
        table.stats().expired >= learned as u64,
        "{:?}",
        table.stats()
    );
}
