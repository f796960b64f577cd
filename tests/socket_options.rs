//! Socket-level behaviour with real peers: IP_FREEBIND shown in a fresh network
//! namespace, and PROXY protocol headers understood by a real HAProxy.
mod common;

use std::net::{IpAddr, SocketAddr};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use crossbar::testbed::{self, TestCa};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Run `crossbar run` inside a new network namespace (only its loopback interface,
/// no routes out) for up to `limit`; returns (exited?, stderr). The address used,
/// 192.0.2.10 (TEST-NET-1, documentation only), is on no interface there; it is
/// only bound, never sent to.
fn run_in_fresh_netns(yaml: &str, limit: Duration) -> Option<(bool, String)> {
    let usable = Command::new("unshare")
        .args(["-n", "ip", "link", "set", "lo", "up"])
        .status()
        .is_ok_and(|s| s.success());
    if !usable {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.yaml");
    std::fs::write(&cfg, yaml).unwrap();
    let log = dir.path().join("stderr");
    // With lo down, Linux lets any address be bound; with it up, it behaves like a
    // real host: only configured addresses, unless IP_FREEBIND.
    let mut child = Command::new("unshare")
        .args([
            "-n",
            "sh",
            "-c",
            "ip link set lo up && exec \"$0\" run -c \"$1\"",
        ])
        .arg(env!("CARGO_BIN_EXE_crossbar"))
        .arg(&cfg)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let mut exited = false;
    while start.elapsed() < limit {
        if child.try_wait().unwrap().is_some() {
            exited = true;
            break;
        }
        if std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("running")
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    Some((exited, std::fs::read_to_string(&log).unwrap_or_default()))
}

fn freebind_yaml(freebind: bool) -> String {
    format!(
        "admin: {{ enabled: false }}\nservices:\n  svc:\n    mode: tcp\n    health: {{ check: none }}\n\
         \x20   listen: [{{ address: \"192.0.2.10:18140\", freebind: {freebind} }}]\n\
         \x20   backends: [{{ name: b, address: \"127.0.0.1:1\" }}]\n"
    )
}

/// Without freebind, an address not on any interface can't be bound (and the error
/// says so and suggests freebind); with it, crossbar binds it and runs, as a standby
/// balancer must for a keepalived VIP it doesn't hold yet. No packet is sent: the
/// namespace has no working interface at all.
#[test]
fn freebind_binds_an_address_not_on_any_interface() {
    let Some((exited, log)) = run_in_fresh_netns(&freebind_yaml(false), WAIT) else {
        crossbar::testbed::missing_tool(
            "freebind_binds_an_address_not_on_any_interface",
            "cannot create a network namespace here (`unshare -n` needs root and util-linux)",
        )
    };
    assert!(exited, "without freebind the start fails:\n{log}");
    assert!(
        log.contains("192.0.2.10:18140") && log.contains("freebind"),
        "{log}"
    );

    let (exited, log) = run_in_fresh_netns(&freebind_yaml(true), WAIT).unwrap();
    assert!(!exited, "with freebind crossbar runs:\n{log}");
    assert!(
        log.contains("listening") && log.contains("192.0.2.10:18140"),
        "{log}"
    );
}

/// Read a PROXY v2 header (written from the spec) and return the source address.
async fn read_v2_source(s: &mut tokio::net::TcpStream) -> Option<SocketAddr> {
    let mut head = [0u8; 16];
    s.read_exact(&mut head).await.ok()?;
    if &head[..12] != b"\r\n\r\n\0\r\nQUIT\n" || head[12] >> 4 != 2 {
        return None;
    }
    let len = u16::from_be_bytes([head[14], head[15]]) as usize;
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).await.ok()?;
    match head[13] {
        0x11 if len >= 12 => {
            let ip = IpAddr::from([body[0], body[1], body[2], body[3]]);
            Some(SocketAddr::new(ip, u16::from_be_bytes([body[8], body[9]])))
        }
        0x21 if len >= 36 => {
            let mut o = [0u8; 16];
            o.copy_from_slice(&body[..16]);
            Some(SocketAddr::new(
                IpAddr::from(o),
                u16::from_be_bytes([body[32], body[33]]),
            ))
        }
        _ => None,
    }
}

/// A client through HAProxy (which reads crossbar's PROXY `version` header and sends
/// what it parsed on as v2) reaches the decoder backend with its own source address.
async fn proxy_protocol_through_haproxy(version: &str) {
    // The decoder backend: reads HAProxy's v2 header, reports the source, echoes.
    let decoder = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let back = decoder.local_addr().unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = decoder.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let src = read_v2_source(&mut s).await;
                let _ = tx.send(src);
                let mut buf = [0u8; 4];
                if s.read_exact(&mut buf).await.is_ok() {
                    let _ = s.write_all(&buf).await;
                }
            });
        }
    });
    let front = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    // HAProxy accepting PROXY headers on `front` and re-sending what it parsed, as
    // a v2 header, to `back`.
    let proxies = format!(
        "frontend fe\n  bind {front} accept-proxy\n  default_backend be\n\
         backend be\n  server s1 {back} send-proxy-v2\n"
    );
    let test = format!("proxy_protocol_through_haproxy({version})");
    let _h = common::haproxy::start(&test, front, &proxies).await;
    // The connection haproxy's readiness poll made carries no PROXY header from us:
    // drain what it reported.
    while rx.try_recv().is_ok() {}

    let yaml = one_service(
        "    mode: tcp\n",
        &[backend_line(
            "hap",
            front,
            &format!("proxy_protocol: {version}"),
        )],
    );
    let lb = Crossbar::start(&yaml).await;
    let client_ip: IpAddr = "127.0.0.7".parse().unwrap();
    let mut c = connect_from(client_ip, lb.addr("svc")).await;
    let client_port = c.local_addr().unwrap().port();
    c.write_all(b"ping").await.unwrap();
    let mut buf = [0u8; 4];
    within("echo through haproxy", c.read_exact(&mut buf))
        .await
        .unwrap();
    assert_eq!(&buf, b"ping");
    let src = within("decoder report", rx.recv()).await.flatten();
    assert_eq!(
        src,
        Some(SocketAddr::new(client_ip, client_port)),
        "haproxy understood crossbar's {version} header and passed the client's address on"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_v1_understood_by_haproxy() {
    proxy_protocol_through_haproxy("v1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_v2_understood_by_haproxy() {
    proxy_protocol_through_haproxy("v2").await;
}

/// Seconds left on the keepalive timer of crossbar's side of the connection from
/// `client` to `listen`, as `ss` shows it; `None` if keepalive is off there.
///
/// `ss` shows one timer per socket, and a retransmission timer (unacknowledged
/// data) hides the keepalive one, so this waits (up to [`WAIT`]) until no other
/// timer runs; the backends of these tests never send, so that is at once in practice.
fn keepalive_timer(listen: SocketAddr, client: SocketAddr) -> Option<u64> {
    let filter = format!(
        "( sport = :{} and dport = :{} )",
        listen.port(),
        client.port()
    );
    let ss = || {
        let out = Command::new("ss")
            .args(["-tnoH", "state", "established", &filter])
            .output()
            .expect("ss (iproute2) runs");
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let mut text = ss();
    let start = Instant::now();
    while text.contains("timer:(") && !text.contains("timer:(keepalive,") && start.elapsed() < WAIT
    {
        std::thread::sleep(Duration::from_millis(20));
        text = ss();
    }
    assert_eq!(text.lines().count(), 1, "one socket expected: {text:?}");
    let timer = text.split("timer:(keepalive,").nth(1)?.split(',').next()?;
    // "1min16sec", "59min", "42sec", "800ms"
    let (min, rest) = match timer.split_once("min") {
        Some((m, r)) => (m.parse::<u64>().ok()?, r),
        None => (0, timer),
    };
    let sec = match rest.strip_suffix("sec") {
        Some(s) => s.parse::<u64>().ok()?,
        None => 0,
    };
    Some(min * 60 + sec)
}

/// Both services on one address, their backends silent. In tls mode crossbar gives
/// up on a backend that does not answer the hello within `timeouts.server_hello`
/// (default 5 s): it closes the connection and counts a passive health failure, and
/// `fall` of those take the backend down. This test's connections must stay open
/// however slowly it runs (a loaded machine once took more than 5 s from the burst
/// to the next connection, which then found the backend down and never reached
/// it), so the wait is set longer than nextest lets any test run.
fn keepalive_yaml(port: u16, a_keepalive: &str, a: SocketAddr, b: SocketAddr) -> String {
    format!(
        "admin: {{ enabled: false }}\n\
         defaults: {{ health: {{ check: none }}, timeouts: {{ server_hello: 1h }} }}\nservices:\n\
         \x20 a:\n    listen: [\"127.0.0.1:{port}\"]\n    default: true\n    keepalive: {a_keepalive}\n\
         \x20   backends: [{{ name: a, address: \"{a}\" }}]\n\
         \x20 b:\n    listen: [\"127.0.0.1:{port}\"]\n    server_names: [b.test]\n\
         \x20   keepalive: {{ enabled: false }}\n    backends: [{{ name: b, address: \"{b}\" }}]\n"
    )
}

/// A ClientHello naming `sni`, as rustls writes it.
fn hello_for(sni: &str) -> Vec<u8> {
    let ca = TestCa::new("keepalive test").unwrap();
    let cfg = testbed::client_config(&ca, testbed::Versions::Both, false).unwrap();
    let name = rustls::pki_types::ServerName::try_from(sni.to_string()).unwrap();
    let mut conn = rustls::ClientConnection::new(cfg, name).unwrap();
    let mut out = Vec::new();
    conn.write_tls(&mut out).unwrap();
    out
}

/// Open a connection to `listen` with a ClientHello for `sni` and wait until
/// `backend` has it (by then crossbar has set the client socket's options).
async fn routed(listen: SocketAddr, sni: &str, backend: &Backend) -> tokio::net::TcpStream {
    let before = backend.accepted();
    let mut s = tokio::net::TcpStream::connect(listen).await.unwrap();
    s.write_all(&hello_for(sni)).await.unwrap();
    wait_until("the backend gets the connection", || {
        backend.accepted() > before
    })
    .await;
    s
}

/// Asserts that crossbar's side of the connection from `client` to `listen` runs a
/// keepalive timer of `idle`, set no earlier than `since`: the seconds `ss` shows
/// left are at most `idle`, and at least `idle` less the time since `since` (the
/// timer runs down from the last byte received, which came after `since`). The
/// bound follows the clock, so a loaded machine that takes seconds to run `ss`
/// can't fail it; a timer of another setting falls outside it.
fn assert_keepalive(listen: SocketAddr, client: SocketAddr, idle: u64, since: Instant, what: &str) {
    let left = keepalive_timer(listen, client);
    // Whole seconds as `ss` prints them, rounded down: one more of slack.
    let ran_down = since.elapsed().as_secs() + 1;
    let lowest = idle.saturating_sub(ran_down);
    assert!(
        left.is_some_and(|t| (lowest..=idle).contains(&t)),
        "{what}: keepalive timer {left:?}, expected {lowest}..={idle} s ({idle} s set within the last {ran_down} s)"
    );
}

/// TCP keepalive reaches each client socket with its own service's timing, whether
/// it comes from the listening socket (Linux copies options at accept, so crossbar
/// sets them there once) or is set per connection because the service sharing the
/// address differs; and a reload changes it for new connections only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_sockets_get_their_services_keepalive() {
    // Silent backends: nothing is sent to the clients, so no retransmission timer
    // hides the keepalive timer from `ss`.
    let a = Backend::silent("a").await;
    let b = Backend::silent("b").await;
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let listen: SocketAddr = ([127, 0, 0, 1], port).into();
    let xb = Crossbar::start(&keepalive_yaml(port, "{ time: 77s }", a.addr, b.addr)).await;

    let since = Instant::now();
    let s1 = routed(listen, "a.test", &a).await;
    let at = |s: &tokio::net::TcpStream| s.local_addr().unwrap();
    assert_keepalive(listen, at(&s1), 77, since, "service a (77s)");
    let s2 = routed(listen, "b.test", &b).await;
    assert_eq!(
        keepalive_timer(listen, at(&s2)),
        None,
        "service b has keepalive off"
    );
    let since = Instant::now();
    let s3 = routed(listen, "a.test", &a).await;
    assert_keepalive(listen, at(&s3), 77, since, "service a again");

    xb.reload(&keepalive_yaml(port, "{ time: 200s }", a.addr, b.addr))
        .await;
    // A burst right after the reload: Linux gives a queued connection the options
    // the listener had when its handshake completed, so those queued before the
    // listener changed still carry 77s and must get 200s from crossbar itself.
    let before = a.accepted();
    let hello = hello_for("a.test");
    let since = Instant::now();
    let burst: Vec<std::net::TcpStream> = (0..30)
        .map(|_| std::net::TcpStream::connect(listen).unwrap())
        .collect();
    for mut s in &burst {
        std::io::Write::write_all(&mut s, &hello).unwrap();
    }
    wait_until("the backend gets the burst", || a.accepted() >= before + 30).await;
    for s in &burst {
        let client = s.local_addr().unwrap();
        assert_keepalive(listen, client, 200, since, "burst after reload");
    }
    let since = Instant::now();
    let s4 = routed(listen, "a.test", &a).await;
    assert_keepalive(listen, at(&s4), 200, since, "after reload");
    let t1 = keepalive_timer(listen, at(&s1));
    assert!(
        matches!(t1, Some(0..=77)),
        "an old connection keeps its timing: {t1:?}"
    );

    xb.reload(&keepalive_yaml(port, "{ enabled: false }", a.addr, b.addr))
        .await;
    let s5 = routed(listen, "a.test", &a).await;
    assert_eq!(keepalive_timer(listen, at(&s5)), None);
    let s6 = routed(listen, "a.test", &a).await;
    assert_eq!(keepalive_timer(listen, at(&s6)), None);
}
