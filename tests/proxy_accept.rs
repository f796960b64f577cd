//! Acceptance: PROXY headers received from trusted tiers (`listen[].proxy_protocol`).
//! Real peers: Debian's HAProxy in front of crossbar (`send-proxy`, `send-proxy-v2`,
//! `send-proxy-v2-ssl`), real TLS clients from many loopback source addresses to
//! real TLS backends; an independent implementation (the `proxy-protocol` package
//! from PyPI) writes headers crossbar receives and reads the one it sends; and
//! hostile headers, each closed with its own reason.
mod common;

use common::haproxy::{self, Haproxy};
use common::{backend_line, connect_from, tls, wait_until, within, Backend, Crossbar, LogBuffer};

use std::net::{IpAddr, SocketAddr};
use std::process::{Command, Stdio};

use crossbar::testbed::{self, BackendTls, TestCa, TlsBackend, Versions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// HAProxy (mode tcp) on a free port, sending every connection on to `to` with
/// `send` (`send-proxy`, `send-proxy-v2`, `send-proxy-v2-ssl`); returns it and its
/// address once it accepts.
async fn haproxy(to: SocketAddr, send: &str) -> (Haproxy, SocketAddr) {
    let front = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let proxies = format!(
        "frontend fe\n  bind {front}\n  default_backend be\n\
         backend be\n  server cb {to} {send}\n"
    );
    (haproxy::start("proxy_accept", front, &proxies).await, front)
}

/// An agent address: 127.0.<n/200>.<1 + n%200> (any of 127/8 is loopback on Linux).
fn agent(n: usize) -> IpAddr {
    IpAddr::from([127, 0, 1 + (n / 200) as u8, 1 + (n % 200) as u8])
}

/// Names on the test certificates.
const NAMES: &[&str] = &[tls::SNI];

async fn tls_backends(ca: &TestCa, n: usize) -> Vec<TlsBackend> {
    let mut out = Vec::new();
    for i in 0..n {
        let b = TlsBackend::start(
            ca,
            &format!("m{i}"),
            NAMES,
            BackendTls::default(),
            common::any_port(),
        )
        .await
        .unwrap();
        out.push(b);
    }
    out
}

fn backends_yaml(bs: &[TlsBackend]) -> String {
    let list: Vec<(String, SocketAddr)> = bs.iter().map(|b| (b.name.clone(), b.addr)).collect();
    tls::backends_yaml(&list)
}

/// A service `svc` with a listener trusting `127.0.0.1` (where HAProxy connects
/// from) and a second, direct one; `extra` is more YAML of the service.
fn two_listeners(extra: &str, backends: &str, required: bool) -> String {
    format!(
        "admin: {{ enabled: false }}\nservices:\n  svc:\n    listen:\n      - {{ address: \"127.0.0.1:0\", proxy_protocol: {{ accept_from: [\"127.0.0.1/32\"], required: {required} }} }}\n      - \"127.0.0.1:0\"\n    health: {{ check: none }}\n{extra}    backends:\n{backends}"
    )
}

/// Which backend answers a TLS request from `from` to `addr` (SNI [`tls::SNI`]).
async fn who_answers(from: IpAddr, addr: SocketAddr, ca: &TestCa) -> String {
    let cfg = testbed::client_config(ca, Versions::Both, false).unwrap();
    let tcp = connect_from(from, addr).await;
    let reply = within("a TLS request", testbed::get_on(tcp, tls::SNI, cfg, "/"))
        .await
        .unwrap_or_else(|e| panic!("request from {from} via {addr}: {e:#}"));
    reply.backend
}

/// `balance: source` through HAProxy spreads 250 agents exactly as it does when they
/// connect directly (the hash of the agent's address, not the tier's), for each of
/// HAProxy's header kinds; the access log names the agent and the tier.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn source_balance_behind_haproxy_sees_the_agents() {
    let log = LogBuffer::install();
    let ca = TestCa::new("proxy CA").unwrap();
    let bs = tls_backends(&ca, 4).await;
    let lb = Crossbar::start(&two_listeners(
        "    balance: source\n",
        &backends_yaml(&bs),
        true,
    ))
    .await;
    let addrs = lb.local_addrs("svc");
    let (behind, direct) = (addrs[0], addrs[1]);
    const AGENTS: usize = 250;
    let mut expected = Vec::new();
    for n in 0..AGENTS {
        expected.push(who_answers(agent(n), direct, &ca).await);
    }
    let spread: std::collections::HashSet<&String> = expected.iter().collect();
    assert_eq!(spread.len(), 4, "250 agents use every backend directly");
    for send in ["send-proxy", "send-proxy-v2", "send-proxy-v2-ssl"] {
        let (_h, front) = haproxy(behind, send).await;
        for (n, want) in expected.iter().enumerate() {
            let got = who_answers(agent(n), front, &ca).await;
            assert_eq!(&got, want, "{send}: agent {} through HAProxy", agent(n));
        }
    }
    // client= the agent, via= the tier (HAProxy connects from 127.0.0.1).
    let line = format!("client={}:", agent(7));
    let lines = log.lines_with(&line);
    assert!(
        lines.iter().any(|l| l.contains("via=127.0.0.1:")),
        "{lines:#?}"
    );
    assert!(
        lines.iter().any(|l| l.contains("via=-")),
        "direct connections have no tier: {lines:#?}"
    );
}

/// `source` stickiness (roundrobin otherwise): behind HAProxy each agent keeps its
/// backend, and agents are spread (without the header they would all share the
/// tier's entry and one backend).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn source_stickiness_behind_haproxy_is_per_agent() {
    let ca = TestCa::new("proxy CA").unwrap();
    let bs = tls_backends(&ca, 3).await;
    let extra = "    balance: roundrobin\n    stick: { on: [source] }\n";
    let lb = Crossbar::start(&two_listeners(extra, &backends_yaml(&bs), true)).await;
    let behind = lb.local_addrs("svc")[0];
    let (_h, front) = haproxy(behind, "send-proxy-v2").await;
    let mut first = Vec::new();
    for n in 0..9 {
        first.push(who_answers(agent(n), front, &ca).await);
    }
    let spread: std::collections::HashSet<&String> = first.iter().collect();
    assert!(spread.len() > 1, "agents spread over backends: {first:?}");
    for round in 0..2 {
        for (n, want) in first.iter().enumerate() {
            let got = who_answers(agent(n), front, &ca).await;
            assert_eq!(&got, want, "round {round}: agent {} sticks", agent(n));
        }
    }
}

/// A backend behind crossbar that asks for a PROXY header: `(header, payload)` of
/// each connection, read until `payload_len` payload bytes came.
async fn recording_backend(
    payload_len: usize,
) -> (SocketAddr, tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut buf = [0u8; 4096];
                // Read until the payload marker's end; the header comes first.
                while !got.ends_with(b"ping") && got.len() < 8192 + payload_len {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = s.write_all(b"pong").await; // ok: the test reads the report
                let _ = tx.send(got); // ok: as above
            });
        }
    });
    (addr, rx)
}

/// A `mode: tcp` service trusting 127.0.0.0/8 whose backend asks for `send_on`.
fn tcp_service(backend: SocketAddr, send_on: &str, accept_from: &str) -> String {
    format!(
        "admin: {{ enabled: false }}\nservices:\n  svc:\n    listen:\n      - {{ address: \"127.0.0.1:0\", proxy_protocol: {{ accept_from: [{accept_from}] }} }}\n    mode: tcp\n    timeouts: {{ client_hello: 2s }}\n    health: {{ check: none }}\n    backends:\n{}",
        backend_line("b", backend, &format!("proxy_protocol: {send_on}"))
    )
}

/// The header crossbar sends on names the agent behind HAProxy, not the tier.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_header_sent_on_names_the_agent_behind_haproxy() {
    let (back, mut reports) = recording_backend(4).await;
    let lb = Crossbar::start(&tcp_service(back, "v2", "\"127.0.0.1/32\"")).await;
    for send in ["send-proxy", "send-proxy-v2"] {
        let (_h, front) = haproxy(lb.addr("svc"), send).await;
        let from = agent(42);
        let mut c = connect_from(from, front).await;
        let port = c.local_addr().unwrap().port();
        c.write_all(b"ping").await.unwrap();
        let mut pong = [0u8; 4];
        within("pong", c.read_exact(&mut pong)).await.unwrap();
        // HAProxy's readiness probe went through as a connection of its own, without
        // a payload: the agent's is the one that carries one.
        let got = loop {
            let got = within("the backend's report", reports.recv())
                .await
                .unwrap();
            if got.ends_with(b"ping") {
                break got;
            }
        };
        let seen = python_parse(&got);
        assert_eq!(seen.0, format!("{from} {port}"), "{send}: {:?}", seen);
        assert_eq!(&got[seen.1..], b"ping");
    }
}

/// The `proxy-protocol` package from PyPI: `pack` writes a header, `parse` reads one.
const PY: &str = r#"
import sys
from ipaddress import ip_address
from socket import SOCK_STREAM
from proxyprotocol.v1 import ProxyProtocolV1
from proxyprotocol.v2 import ProxyProtocolV2
from proxyprotocol.result import ProxyResultIPv4, ProxyResultIPv6
from proxyprotocol.tlv import ProxyProtocolTLV
if sys.argv[1] == "pack":
    ver, src, sport, dst, dport = sys.argv[2:7]
    s, d = ip_address(src), ip_address(dst)
    cls = ProxyResultIPv4 if s.version == 4 else ProxyResultIPv6
    tlv = ProxyProtocolTLV(authority="puppet.example.com", alpn=b"h2", unique_id=b"u-123") if ver == "v2" else ProxyProtocolTLV()
    r = cls((s, int(sport)), (d, int(dport)), protocol=SOCK_STREAM, tlv=tlv)
    pp = ProxyProtocolV2() if ver == "v2" else ProxyProtocolV1()
    sys.stdout.write(pp.pack(r).hex())
else:
    data = bytes.fromhex(sys.stdin.read())
    pp = ProxyProtocolV2() if data.startswith(b"\r\n\r\n") else ProxyProtocolV1()
    if isinstance(pp, ProxyProtocolV1):
        n = data.index(b"\r\n") + 2
    else:
        n = 16 + int.from_bytes(data[14:16], "big")
    r = pp.unpack(data[:n])
    ip, port = r.source[0], r.source[1]
    if ip.version == 6 and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    print(ip, port, n)
"#;

fn python(args: &[&str], stdin: &str) -> String {
    let mut child = match Command::new("python3")
        .arg("-c")
        .arg(PY)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => crossbar::testbed::missing_tool("proxy_accept", &format!("python3: {e}")),
    };
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    if err.contains("No module named 'proxyprotocol'") {
        crossbar::testbed::missing_tool(
            "proxy_accept",
            "the PyPI package proxy-protocol is not installed (pip install proxy-protocol; tests/run.sh does)",
        );
    }
    assert!(out.status.success(), "python3 {args:?}: {err}");
    String::from_utf8(out.stdout).unwrap()
}

/// What the PyPI implementation reads from the front of `bytes`: ("ip port", length).
fn python_parse(bytes: &[u8]) -> (String, usize) {
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let out = python(&["parse"], &hex);
    let mut f = out.split_whitespace();
    let (ip, port, n) = (f.next().unwrap(), f.next().unwrap(), f.next().unwrap());
    (format!("{ip} {port}"), n.parse().unwrap())
}

fn python_pack(version: &str, src: SocketAddr, dst: SocketAddr) -> Vec<u8> {
    let (s, sp, d, dp) = (
        src.ip().to_string(),
        src.port().to_string(),
        dst.ip().to_string(),
        dst.port().to_string(),
    );
    let hex = python(&["pack", version, &s, &sp, &d, &dp], "");
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect()
}

/// Headers written by the PyPI implementation (v1 and v2, IPv4 and IPv6, v2 with
/// ALPN, authority and unique-ID TLVs) are received; the header crossbar sends on
/// (v1 and v2) is read back by the same implementation with the same client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_independent_implementation_writes_and_reads_the_headers() {
    let log = LogBuffer::install();
    for send_on in ["v1", "v2"] {
        let (back, mut reports) = recording_backend(4).await;
        let lb = Crossbar::start(&tcp_service(back, send_on, "\"127.0.0.0/8\"")).await;
        for (version, src) in [
            ("v1", "192.0.2.10:4000"),
            ("v1", "[2001:db8::5]:4001"),
            ("v2", "198.51.100.7:4002"),
            ("v2", "[2001:db8::6]:4003"),
        ] {
            let src: SocketAddr = src.parse().unwrap();
            let dst: SocketAddr = if src.is_ipv4() {
                "203.0.113.1:8140".parse().unwrap()
            } else {
                "[2001:db8::1]:8140".parse().unwrap()
            };
            let header = python_pack(version, src, dst);
            let mut c = TcpStream::connect(lb.addr("svc")).await.unwrap();
            c.write_all(&[&header[..], b"ping"].concat()).await.unwrap();
            let mut pong = [0u8; 4];
            within("pong", c.read_exact(&mut pong)).await.unwrap();
            let got = within("report", reports.recv()).await.unwrap();
            let (seen, len) = python_parse(&got);
            assert_eq!(
                seen,
                format!("{} {}", src.ip(), src.port()),
                "received {version}, sent on {send_on}"
            );
            assert_eq!(&got[len..], b"ping", "exactly the client's bytes follow");
            drop(c);
            let client = format!("client={src} via=127.0.0.1:");
            wait_until(&client, || log.contains(&client)).await;
        }
    }
}

/// A listener trusting 127.0.0.2 only; `mode: tcp` to an echo backend.
async fn hostile_setup(required: bool) -> (Crossbar, Backend) {
    let echo = Backend::echo("e", false).await;
    let yaml = format!(
        "admin: {{ enabled: false }}\nservices:\n  svc:\n    listen:\n      - {{ address: \"127.0.0.1:0\", proxy_protocol: {{ accept_from: [\"127.0.0.2\"], required: {required} }} }}\n    timeouts: {{ client_hello: 1s }}\n    health: {{ check: none }}\n    backends:\n{}",
        backend_line("e", echo.addr, "")
    );
    (Crossbar::start(&yaml).await, echo)
}

/// Send `bytes` from `from` (in `chunk`-byte writes; `close` half-closes after),
/// then read until crossbar closes; returns what came back.
async fn send_and_wait_close(
    addr: SocketAddr,
    from: &str,
    bytes: &[u8],
    chunk: usize,
    close: bool,
) -> Vec<u8> {
    let mut c = connect_from(from.parse().unwrap(), addr).await;
    for part in bytes.chunks(chunk) {
        if c.write_all(part).await.is_err() {
            break;
        }
    }
    if close {
        let _ = c.shutdown().await; // ok: crossbar may have closed first
    }
    let mut got = Vec::new();
    let _ = within("crossbar closes", c.read_to_end(&mut got)).await; // ok: EOF or reset
    got
}

fn v2(ver_cmd: u8, fam: u8, body: &[u8]) -> Vec<u8> {
    let mut h = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    h.extend_from_slice(&[ver_cmd, fam]);
    h.extend_from_slice(&(body.len() as u16).to_be_bytes());
    h.extend_from_slice(body);
    h
}

/// Every hostile header is closed with its own `end=` reason and counted under its
/// own `crossbar_listener_refused_total` reason; nothing reaches the backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_headers_each_end_with_their_own_reason() {
    let log = LogBuffer::install();
    let (lb, echo) = hostile_setup(true).await;
    let addr = lb.addr("svc");
    let hello = common::hello_fixture("openssl3_tls13.bin");
    let v1 = b"PROXY TCP4 192.0.2.1 192.0.2.2 1000 8140\r\n".to_vec();
    let cases: Vec<(&str, &str, Vec<u8>, usize, bool)> = vec![
        (
            "untrusted",
            "127.0.0.3",
            [&v1[..], &hello].concat(),
            4096,
            false,
        ),
        ("missing", "127.0.0.2", hello.clone(), 4096, false),
        (
            "malformed",
            "127.0.0.2",
            b"PROXY TCP4 192.0.2.1 nope 1 2\r\n".to_vec(),
            4096,
            false,
        ),
        (
            "malformed",
            "127.0.0.2",
            b"PROXY TCP4 1.2.3.4\x16\x03".to_vec(),
            1,
            false,
        ),
        ("truncated", "127.0.0.2", v1[..20].to_vec(), 4096, true),
        (
            "too_large",
            "127.0.0.2",
            v2(0x21, 0x11, &[0; 5000]),
            4096,
            false,
        ),
        (
            "too_large",
            "127.0.0.2",
            [&b"PROXY TCP4 "[..], &[b'1'; 200]].concat(),
            1,
            false,
        ),
        ("timeout", "127.0.0.2", v1[..20].to_vec(), 4096, false),
        ("version", "127.0.0.2", v2(0x31, 0x11, &[0; 12]), 1, false),
        (
            "command",
            "127.0.0.2",
            v2(0x2f, 0x11, &[0; 12]),
            4096,
            false,
        ),
        ("family", "127.0.0.2", v2(0x21, 0x12, &[0; 12]), 4096, false),
        (
            "family",
            "127.0.0.2",
            b"PROXY UDP4 1.2.3.4 1.2.3.4 1 2\r\n".to_vec(),
            4096,
            false,
        ),
    ];
    for (reason, from, bytes, chunk, close) in &cases {
        let before = lb.metric(
            "crossbar_listener_refused_total",
            &[("reason", &format!("proxy_{reason}"))],
        );
        let end = format!("end=proxy_error:{reason}");
        let logged = log.count(&end);
        let got = send_and_wait_close(addr, from, bytes, *chunk, *close).await;
        assert!(got.is_empty(), "{reason}: nothing answered");
        wait_until(&format!("{reason}: logged"), || log.count(&end) > logged).await;
        let after = lb.metric(
            "crossbar_listener_refused_total",
            &[("reason", &format!("proxy_{reason}"))],
        );
        assert_eq!(after, before + 1.0, "{reason}: counted once");
    }
    assert_eq!(
        echo.accepted(),
        0,
        "no hostile connection reached the backend"
    );
    // A valid header byte by byte, then the client's bytes: served, as the agent.
    let mut c = connect_from("127.0.0.2".parse().unwrap(), addr).await;
    for b in v2(
        0x21,
        0x11,
        &[192, 0, 2, 9, 127, 0, 0, 1, 0x10, 0x00, 0x1f, 0xcc],
    ) {
        c.write_all(&[b]).await.unwrap();
        c.flush().await.unwrap();
    }
    c.write_all(&hello).await.unwrap();
    let mut back = vec![0u8; hello.len()];
    within("echo", c.read_exact(&mut back)).await.unwrap();
    assert_eq!(
        back, hello,
        "the hello reached the backend whole, after the header"
    );
    drop(c);
    wait_until("logged as the agent", || {
        log.contains("client=192.0.2.9:4096 via=127.0.0.2:")
    })
    .await;
}

/// `required: false` (migration): a trusted source without a header is served as
/// itself; with one, as the agent; a LOCAL header (the tier's health check) as the
/// tier's own connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_mode_serves_trusted_sources_with_or_without_a_header() {
    let log = LogBuffer::install();
    let (lb, _echo) = hostile_setup(false).await;
    let addr = lb.addr("svc");
    let hello = common::hello_fixture("openssl3_tls13.bin");
    for (header, client) in [
        (Vec::new(), "client=127.0.0.2:"),
        (
            b"PROXY TCP6 2001:db8::9 ::1 7 8140\r\n".to_vec(),
            "client=[2001:db8::9]:7 via=127.0.0.2:",
        ),
        (v2(0x20, 0x00, &[]), "client=127.0.0.2:"),
    ] {
        let mut c = connect_from("127.0.0.2".parse().unwrap(), addr).await;
        c.write_all(&[&header[..], &hello].concat()).await.unwrap();
        let mut back = vec![0u8; hello.len()];
        within("echo", c.read_exact(&mut back)).await.unwrap();
        assert_eq!(back, hello);
        drop(c);
        wait_until(client, || log.contains(client)).await;
    }
    assert!(
        log.contains("via=-"),
        "the header-less one came through no tier"
    );
}

/// Slow PROXY headers held open at once.
const SLOW_HEADERS: usize = 10_000;

/// Raise the soft (and if need be the hard) RLIMIT_NOFILE to `n` (root may).
#[allow(unsafe_code)]
fn raise_nofile(n: u64) {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) }, 0);
    let want = n as libc::rlim_t;
    if l.rlim_cur < want {
        l.rlim_cur = want;
        l.rlim_max = l.rlim_max.max(want);
        // SAFETY: as above.
        let r = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &l) };
        assert_eq!(
            r,
            0,
            "raising RLIMIT_NOFILE to {n}: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// Hostile headers leave other connections alone: while 10,000 trusted connections
/// hold half a header, an agent's TLS connection through HAProxy is served; then
/// every slow one is closed at the header's deadline, each counted as
/// `proxy_timeout`. crossbar runs as its own process: 10,000 connections take
/// 10,000 descriptors on each side, more than one process may hold here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_headers_do_not_block_others() {
    raise_nofile(SLOW_HEADERS as u64 + 2_000);
    let ca = TestCa::new("proxy CA").unwrap();
    let bs = tls_backends(&ca, 1).await;
    let (behind, admin) = (common::process::free_port(), common::process::free_port());
    let yaml = format!(
        "admin: {{ listen: \"{admin}\" }}\nservices:\n  svc:\n    listen:\n      - {{ address: \"{behind}\", max_connections: 20000, backlog: 4096, \
         proxy_protocol: {{ accept_from: [\"127.0.0.1/32\"] }} }}\n    health: {{ check: none }}\n    \
         timeouts: {{ client_hello: 5s }}\n    backends:\n{}",
        backends_yaml(&bs)
    );
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("crossbar.yaml");
    std::fs::write(&config, yaml).unwrap();
    let _lb = common::process::crossbar_run(&config, None, Stdio::null());
    common::wait_until_async("crossbar ready", || async move {
        common::try_admin_get(admin, "/healthz").await.is_some()
    })
    .await;
    let start = std::time::Instant::now();
    let mut slow = Vec::new();
    for _ in 0..SLOW_HEADERS {
        let mut s = within("a connect", TcpStream::connect(behind))
            .await
            .unwrap();
        within("half a header", s.write_all(b"PROXY TCP4 1.2"))
            .await
            .unwrap();
        slow.push(s);
    }
    let opened = start.elapsed();
    let (_h, front) = haproxy(behind, "send-proxy-v2").await;
    assert_eq!(who_answers(agent(3), front, &ca).await, "m0");
    let mut buf = [0u8; 64];
    for s in &mut slow {
        // Closed without a byte (EOF, or a reset: either ends it).
        let n = within("the slow header's close", s.read(&mut buf))
            .await
            .unwrap_or(0);
        assert_eq!(n, 0);
    }
    let closed = start.elapsed();
    drop(slow);
    let metrics = common::admin_get(admin, "/metrics").await;
    let timeouts = common::metric_value(
        &metrics,
        "crossbar_listener_refused_total",
        &[("reason", "proxy_timeout")],
    );
    println!("{SLOW_HEADERS} slow headers opened in {opened:?}, all closed after {closed:?}");
    assert_eq!(timeouts, SLOW_HEADERS as f64);
}

/// TLS session stickiness behind HAProxy, many agents behind one NAT address: each
/// agent's resumptions return to the backend holding its session, whichever backend
/// that is, in all three TLS modes (TLS 1.2 session IDs, TLS 1.2 tickets, TLS 1.3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_stickiness_behind_haproxy_from_one_nat_address() {
    let ca = TestCa::new("proxy CA").unwrap();
    let bs = tls_backends(&ca, 3).await;
    let extra = "    balance: roundrobin\n    stick: { on: [session_id, ticket, psk] }\n";
    let lb = Crossbar::start(&two_listeners(extra, &backends_yaml(&bs), true)).await;
    let behind = lb.local_addrs("svc")[0];
    let (_h, front) = haproxy(behind, "send-proxy-v2").await;
    let nat = agent(77);
    for (versions, tickets) in [
        (Versions::Tls12, false),
        (Versions::Tls12, true),
        (Versions::Tls13, true),
    ] {
        // Four agents (each its own session cache) behind one address.
        let agents: Vec<_> = (0..4)
            .map(|_| testbed::client_config(&ca, versions, tickets).unwrap())
            .collect();
        let mut holders = Vec::new();
        for cfg in &agents {
            let tcp = connect_from(nat, front).await;
            let r = within(
                "full handshake",
                testbed::get_on(tcp, tls::SNI, cfg.clone(), "/"),
            )
            .await
            .unwrap();
            holders.push(r.backend);
        }
        let spread: std::collections::HashSet<&String> = holders.iter().collect();
        assert!(
            spread.len() > 1,
            "{versions:?} tickets {tickets}: round robin spread {holders:?}"
        );
        for round in 0..3 {
            for (cfg, holder) in agents.iter().zip(&holders) {
                let tcp = connect_from(nat, front).await;
                let r = within(
                    "resumption",
                    testbed::get_on(tcp, tls::SNI, cfg.clone(), "/"),
                )
                .await
                .unwrap();
                assert!(
                    r.resumed,
                    "{versions:?} tickets {tickets} round {round}: resumed"
                );
                assert_eq!(
                    &r.backend, holder,
                    "{versions:?} tickets {tickets} round {round}"
                );
            }
        }
    }
}

/// A reload applies a new PROXY policy to the next connection: once `proxy_protocol`
/// is removed, the tier's header is no longer read (ended as untrusted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_changes_whose_headers_are_read() {
    let log = LogBuffer::install();
    let echo = Backend::echo("e", false).await;
    let listen = |policy: &str| {
        format!(
            "admin: {{ enabled: false }}\nservices:\n  svc:\n    listen:\n      - {{ address: \"127.0.0.1:0\"{policy} }}\n    health: {{ check: none }}\n    backends:\n{}",
            backend_line("e", echo.addr, "")
        )
    };
    let lb = Crossbar::start(&listen(
        ", proxy_protocol: { accept_from: [\"127.0.0.2\"] }",
    ))
    .await;
    let addr = lb.addr("svc");
    let hello = common::hello_fixture("openssl3_tls13.bin");
    let bytes = [&b"PROXY TCP4 192.0.2.5 192.0.2.6 5 6\r\n"[..], &hello].concat();
    let mut c = connect_from("127.0.0.2".parse().unwrap(), addr).await;
    c.write_all(&bytes).await.unwrap();
    let mut back = vec![0u8; hello.len()];
    within("echo", c.read_exact(&mut back)).await.unwrap();
    drop(c);
    wait_until("served as the agent", || log.contains("client=192.0.2.5:5")).await;
    lb.reload(&listen("")).await;
    assert_eq!(lb.addr("svc"), addr, "the listener is kept");
    let got = send_and_wait_close(addr, "127.0.0.2", &bytes, 4096, false).await;
    assert!(got.is_empty());
    wait_until("untrusted after the reload", || {
        log.contains("end=proxy_error:untrusted")
    })
    .await;
}

/// Issue #42, 5: with `on_non_tls: forward`, a PROXY header from a source not in
/// `accept_from` was forwarded to the backend verbatim (the docs said it is refused
/// as `proxy_error:untrusted`), and a second header behind a trusted tier's header
/// was counted as `proxy_untrusted` (an alert meant for someone outside
/// accept_from). Now the untrusted check runs first, whole or trickled, and a
/// repeated header has its own reason, `proxy_error:repeated`, on a listener that
/// forwards non-TLS bytes and on one that refuses them; other non-TLS bytes, even
/// ones that start like a header, are still forwarded whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn untrusted_and_repeated_headers_are_refused_before_forwarding() {
    let log = LogBuffer::install();
    let echo = Backend::echo("e", false).await;
    let yaml = format!(
        "admin: {{ enabled: false }}\nservices:\n  svc:\n    listen:\n      - {{ address: \"127.0.0.1:0\", proxy_protocol: {{ accept_from: [\"127.0.0.2\"], required: false }} }}\n    \
         on_non_tls: forward\n    timeouts: {{ client_hello: 2s }}\n    health: {{ check: none }}\n    backends:\n{}",
        backend_line("e", echo.addr, "")
    );
    let lb = Crossbar::start(&yaml).await;
    let (refusing, _echo2) = hostile_setup(true).await;
    let v1 = b"PROXY TCP4 192.0.2.1 192.0.2.2 1000 8140\r\n".to_vec();
    let v2h = v2(
        0x21,
        0x11,
        &[192, 0, 2, 9, 127, 0, 0, 1, 0x10, 0x00, 0x1f, 0xcc],
    );
    let http = b"GET / HTTP/1.0\r\n\r\n".to_vec();
    let refused = |lb: &Crossbar, reason: &str| {
        lb.metric(
            "crossbar_listener_refused_total",
            &[("reason", &format!("proxy_{reason}"))],
        )
    };
    let cases: Vec<(&str, &Crossbar, &str, Vec<u8>, usize)> = vec![
        (
            "untrusted",
            &lb,
            "127.0.0.3",
            [&v1[..], &http].concat(),
            4096,
        ),
        (
            "untrusted",
            &lb,
            "127.0.0.3",
            [&v2h[..], &http].concat(),
            4096,
        ),
        ("untrusted", &lb, "127.0.0.3", [&v1[..], &http].concat(), 1),
        ("untrusted", &lb, "127.0.0.3", [&v2h[..], &http].concat(), 1),
        (
            "repeated",
            &lb,
            "127.0.0.2",
            [&v1[..], &v1, &http].concat(),
            4096,
        ),
        (
            "repeated",
            &lb,
            "127.0.0.2",
            [&v2h[..], &v1, &http].concat(),
            1,
        ),
        (
            "repeated",
            &refusing,
            "127.0.0.2",
            [&v2h[..], &v2h, &common::hello_fixture("openssl3_tls13.bin")].concat(),
            4096,
        ),
    ];
    for (reason, lb, from, bytes, chunk) in &cases {
        let before = (refused(lb, reason), refused(lb, "untrusted"));
        let end = format!("end=proxy_error:{reason}");
        let logged = log.count(&end);
        let got = send_and_wait_close(lb.addr("svc"), from, bytes, *chunk, true).await;
        assert!(
            got.is_empty(),
            "{reason} from {from} (chunk {chunk}): answered {got:?}"
        );
        wait_until(&format!("{reason}: logged"), || log.count(&end) > logged).await;
        let after = (refused(lb, reason), refused(lb, "untrusted"));
        let want = match *reason {
            "untrusted" => (before.0 + 1.0, before.0 + 1.0),
            _ => (before.0 + 1.0, before.1),
        };
        assert_eq!(
            after, want,
            "{reason} from {from} (chunk {chunk}): counted once, as itself"
        );
    }
    assert_eq!(echo.accepted(), 0, "no header reached the backend");
    // Non-TLS bytes that start like a header, whole or trickled, and a trusted
    // tier's one header: forwarded, the payload whole.
    let mut forwarded = 0;
    for (from, bytes, chunk, back) in [
        (
            "127.0.0.3",
            b"PUT / HTTP/1.0\r\n\r\n".to_vec(),
            1,
            b"PUT / HTTP/1.0\r\n\r\n".to_vec(),
        ),
        ("127.0.0.3", b"PROXZ\r\n".to_vec(), 1, b"PROXZ\r\n".to_vec()),
        (
            "127.0.0.3",
            b"\r\n\r\nhello".to_vec(),
            1,
            b"\r\n\r\nhello".to_vec(),
        ),
        ("127.0.0.2", [&v1[..], &http].concat(), 4096, http.clone()),
    ] {
        let got = send_and_wait_close(lb.addr("svc"), from, &bytes, chunk, true).await;
        forwarded += 1;
        assert_eq!(got, back, "{bytes:?} from {from} (chunk {chunk})");
    }
    assert_eq!(echo.accepted(), forwarded);
}

/// Probes of [`a_tiers_local_probes_are_not_errors`]: one every [`PROBE_EVERY`] for
/// 10 s, as the issue's (HAProxy's `check-send-proxy` sends one per `inter`).
const PROBES: usize = 100;
const PROBE_EVERY: std::time::Duration = std::time::Duration::from_millis(100);
/// HAProxy checks awaited, at `inter 100ms`.
const HAPROXY_CHECKS: f64 = 20.0;

/// Every `crossbar_client_hello_errors_total` sample summed.
fn hello_errors(lb: &Crossbar) -> f64 {
    lb.metric("crossbar_client_hello_errors_total", &[])
}

/// A PROXY v2 LOCAL header followed by a close (a tier's health check with
/// `check-send-proxy`) is a probe: counted in `crossbar_proxy_probes_total`, never a
/// hello error, never an INFO line, never a per-source entry (HAProxy's
/// `dontlognull`). Sent by hand every 100 ms for 10 s, then by HAProxy itself with
/// `send-proxy-v2 check check-send-proxy`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tiers_local_probes_are_not_errors() {
    let log = LogBuffer::install();
    let echo = Backend::echo("e", false).await;
    let yaml = format!(
        "admin: {{ enabled: false }}\nservices:\n  svc:\n    listen:\n      - {{ address: \"127.0.0.1:0\", proxy_protocol: {{ accept_from: [\"127.0.0.1\"] }}, per_source: {{ rate: 1, burst: 1000 }} }}\n    health: {{ check: none }}\n    backends:\n{}",
        backend_line("e", echo.addr, "")
    );
    let lb = Crossbar::start(&yaml).await;
    let addr = lb.addr("svc");
    let listener = addr.to_string();
    let admin = lb.serve_admin(None).await;
    let local = v2(0x20, 0x00, &[]);
    let info_before = log.count(" INFO ");
    let mut tick = tokio::time::interval(PROBE_EVERY);
    for _ in 0..PROBES {
        tick.tick().await;
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(&local).await.unwrap();
        drop(c);
    }
    let probes =
        |lb: &Crossbar| lb.metric("crossbar_proxy_probes_total", &[("listener", &listener)]);
    // Each probe ends as a probe or (before probes were told apart) as a hello error.
    wait_until("every probe counted", || {
        probes(&lb) + hello_errors(&lb) >= PROBES as f64
    })
    .await;
    assert_eq!(hello_errors(&lb), 0.0, "no probe is a hello error");
    assert_eq!(probes(&lb), PROBES as f64);
    let sources = common::admin_json(admin.addr, "/api/sources").await;
    assert_eq!(sources["listeners"][0]["tracked"], 0, "{sources}");
    let info = || log.lines_with(" INFO ");
    assert_eq!(
        log.count(" INFO "),
        info_before,
        "no INFO line: {:#?}",
        info()
    );

    // HAProxy's own checks of crossbar as its server.
    let front = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    // The frontend (which haproxy::start connects to, to see it up) leads elsewhere:
    // only the checks reach crossbar.
    let elsewhere = common::refusing_addr();
    let proxies = format!(
        "frontend fe\n  bind {front}\n  default_backend idle\n\
         backend idle\n  server none {elsewhere}\n\
         backend be\n  server cb {addr} send-proxy-v2 check check-send-proxy inter 100ms\n"
    );
    let _h = haproxy::start("proxy_accept", front, &proxies).await;
    wait_until("HAProxy's checks counted", || {
        probes(&lb) + hello_errors(&lb) >= PROBES as f64 + HAPROXY_CHECKS
    })
    .await;
    assert_eq!(hello_errors(&lb), 0.0, "no HAProxy check is a hello error");
    assert_eq!(
        log.count(" INFO "),
        info_before,
        "no INFO line: {:#?}",
        info()
    );
}
