//! Payloads arrive intact both ways (SHA-256), in `mode: tcp` and through a real
//! TLS session in `mode: tls`; half-closes pass through in both directions; the TLS
//! session is the backend's own (openssl); and a connection keeps its bytes when
//! the process runs out of file descriptors (no splice pipes: the relay copies).
use std::sync::Arc;

use crate::common::*;
use crossbar::testbed::{BackendTls, TestCa, TlsBackend};
use rstest::rstest;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const MIB: usize = 1024 * 1024;

fn tcp_service(b: &Backend) -> String {
    one_service("    mode: tcp\n", &[backend_line(&b.name, b.addr, "")])
}

fn tls_service(b: &Backend) -> String {
    one_service(
        &format!("    server_names: [\"{SNI}\"]\n"),
        &[backend_line(&b.name, b.addr, "")],
    )
}

/// Both directions of an echo exchange kept `data` intact: what came back to the
/// client (`got`: length, SHA-256) and what the backend received, up to a clean FIN.
async fn assert_echoed_intact(echo: &Backend, got: (u64, [u8; 32]), data: &[u8]) {
    // server -> client: what came back is what was sent.
    assert_eq!(got.0, data.len() as u64);
    assert_eq!(hex(&got.1), hex(&sha(data)));
    // client -> server: what the backend received is what was sent.
    let seen = echo.next_report().await;
    assert_eq!(seen.received, data.len() as u64);
    assert_eq!(hex(&seen.sha), hex(&sha(data)));
    assert!(
        seen.clean_eof,
        "the backend saw an error, not the client's FIN"
    );
}

#[rstest]
#[case::empty(0)]
#[case::one_byte(1)]
#[case::one_kib(1024)]
#[case::one_mib(MIB)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_mode_relays_payload_intact(#[case] len: usize) {
    let echo = Backend::echo("echo", false).await;
    let lb = Crossbar::start(&tcp_service(&echo)).await;
    let data = payload(len, len as u64);

    let client = TcpStream::connect(lb.addr("svc")).await.unwrap();
    let (got_len, got_sha) = exchange(client, &data).await;

    assert_echoed_intact(&echo, (got_len, got_sha), &data).await;
    assert_eq!(echo.accepted(), 1);
    assert_eq!(
        lb.metric(
            "crossbar_bytes_total",
            &[("backend", "echo"), ("direction", "client_to_server")]
        ),
        len as f64
    );
}

#[rstest]
#[case::empty(0)]
#[case::one_byte(1)]
#[case::one_kib(1024)]
#[case::one_mib(MIB)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_mode_relays_payload_intact(#[case] len: usize) {
    let ca = TestCa::new("relay test CA").unwrap();
    let echo = Backend::tls_echo(&ca, "tls-echo").await;
    let lb = Crossbar::start(&tls_service(&echo)).await;
    let data = payload(len, 1000 + len as u64);

    // A real rustls client whose session ends on the rustls backend behind crossbar.
    let tls = tls_connect(&ca, lb.addr("svc")).await;
    let (got_len, got_sha) = exchange(tls, &data).await;

    assert_echoed_intact(&echo, (got_len, got_sha), &data).await;
    // crossbar saw the handshake go by.
    assert_eq!(
        lb.metric(
            "crossbar_tls_handshakes_total",
            &[("backend", "tls-echo"), ("kind", "full")]
        ),
        1.0
    );
}

/// 64 MiB each way at the same time, so both pumps run full and concurrently.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_mode_relays_64_mib_both_ways_concurrently() {
    let echo = Backend::echo("echo", false).await;
    let lb = Crossbar::start(&tcp_service(&echo)).await;
    let data = payload(64 * MIB, 64);

    let client = TcpStream::connect(lb.addr("svc")).await.unwrap();
    let (got_len, got_sha) = exchange(client, &data).await;

    let want = hex(&sha(&data));
    assert_eq!(got_len, data.len() as u64);
    assert_eq!(hex(&got_sha), want);
    let seen = echo.next_report().await;
    assert_eq!(seen.received, data.len() as u64);
    assert_eq!(hex(&seen.sha), want);
    for dir in ["client_to_server", "server_to_client"] {
        assert_eq!(
            lb.metric(
                "crossbar_bytes_total",
                &[("backend", "echo"), ("direction", dir)]
            ),
            data.len() as f64,
            "{dir}"
        );
    }
}

/// The client sends, then half-closes; the backend sees EOF, answers, then closes;
/// the client gets the whole answer and then EOF.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_half_close_reaches_backend_and_answer_comes_back() {
    let sink = Backend::sink("sink").await;
    let lb = Crossbar::start(&tcp_service(&sink)).await;
    let data = payload(MIB + 17, 7);

    let mut client = TcpStream::connect(lb.addr("svc")).await.unwrap();
    client.write_all(&data).await.unwrap();
    client.shutdown().await.unwrap();
    // The backend's answer exists only because it saw EOF: it is sent after.
    let (answer, clean) = within("the answer", read_to_end_or_error(&mut client)).await;
    assert!(clean, "the answer ended with an error");
    assert_eq!(
        String::from_utf8(answer).unwrap(),
        format!("{} {}\n", data.len(), hex(&sha(&data)))
    );
    let seen = sink.next_report().await;
    assert!(seen.clean_eof);
    assert_eq!(seen.received, data.len() as u64);
}

/// The server speaks first and half-closes; the client reads to EOF and can still
/// send; the backend gets it all; the connection ends once both sides are done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_half_close_leaves_client_direction_open() {
    let greeting = Arc::new(payload(300 * 1024, 11));
    let srv = Backend::server_first("first", greeting.clone()).await;
    let lb = Crossbar::start(&tcp_service(&srv)).await;
    let baseline = lb.server.open_tasks();

    let mut client = TcpStream::connect(lb.addr("svc")).await.unwrap();
    let (got, clean) = within("the server's data", read_to_end_or_error(&mut client)).await;
    assert!(clean, "expected the server's FIN, got an error");
    assert_eq!(hex(&sha(&got)), hex(&sha(&greeting)));

    // The server's direction is closed; ours still works.
    let data = payload(256 * 1024, 12);
    client.write_all(&data).await.unwrap();
    client.shutdown().await.unwrap();
    let seen = srv.next_report().await;
    assert!(seen.clean_eof);
    assert_eq!(seen.received, data.len() as u64);
    assert_eq!(hex(&seen.sha), hex(&sha(&data)));

    // Both directions done: crossbar ends the connection.
    wait_until("the relay task ends", || lb.server.open_tasks() == baseline).await;
    let mut rest = [0u8; 1];
    assert_eq!(client.read(&mut rest).await.unwrap(), 0);
}

/// `openssl s_client` through crossbar sees the backend's certificate and verifies
/// it against the CA: the TLS session is end to end, crossbar holds no key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openssl_sees_the_backends_certificate_through_crossbar() {
    if std::process::Command::new("openssl")
        .arg("version")
        .output()
        .is_err()
    {
        crossbar::testbed::missing_tool(
            "openssl_sees_the_backends_certificate_through_crossbar",
            "no `openssl` on PATH (apt-get install openssl)",
        )
    }
    let ca = TestCa::new("crossbar passthrough CA").unwrap();
    let backend = TlsBackend::start(
        &ca,
        "compile1-backend-cert",
        &[SNI],
        BackendTls::default(),
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap();
    let lb = Crossbar::start(&one_service(
        &format!("    server_names: [\"{SNI}\"]\n"),
        &[backend_line("compile1", backend.addr, "")],
    ))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca.cert_pem()).unwrap();

    let addr = lb.addr("svc").to_string();
    let out = within(
        "openssl s_client",
        tokio::task::spawn_blocking(move || {
            std::process::Command::new("openssl")
                .args(["s_client", "-connect", &addr, "-servername", SNI, "-CAfile"])
                .arg(&ca_file)
                .arg("-verify_return_error")
                .stdin(std::process::Stdio::null())
                .output()
                .unwrap()
        }),
    )
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let compact: String = stdout.chars().filter(|c| *c != ' ').collect();
    assert!(
        out.status.success(),
        "openssl failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        compact.contains("subject=CN=compile1-backend-cert"),
        "not the backend's certificate:\n{stdout}"
    );
    assert!(
        compact.contains("issuer=CN=crossbarpassthroughCA"),
        "unexpected issuer:\n{stdout}"
    );
    assert!(
        stdout.contains("Verify return code: 0 (ok)"),
        "verification failed:\n{stdout}"
    );
    // The handshake went to the backend, through crossbar.
    assert_eq!(
        backend
            .stats
            .connections
            .load(std::sync::atomic::Ordering::SeqCst),
        1
    );
    assert_eq!(
        lb.metric("crossbar_connections_total", &[("backend", "compile1")]),
        1.0
    );
}

/// An IPv6 listener in front of an IPv4 backend relays like any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_loopback_listener_relays_payload_intact() {
    let echo = Backend::echo("echo", false).await;
    let yaml = tcp_service(&echo).replace("\"127.0.0.1:0\"", "\"[::1]:0\"");
    let lb = Crossbar::start(&yaml).await;
    let addr = lb.addr("svc");
    assert!(addr.is_ipv6(), "{addr}");
    let data = payload(100 * 1024, 6);

    let client = TcpStream::connect(addr).await.unwrap();
    let (got_len, got_sha) = exchange(client, &data).await;

    assert_eq!(got_len, data.len() as u64);
    assert_eq!(hex(&got_sha), hex(&sha(&data)));
    assert_eq!(hex(&echo.next_report().await.sha), hex(&sha(&data)));
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
