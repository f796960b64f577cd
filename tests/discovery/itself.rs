//! Never dial yourself: a backend that is crossbar's own listener would make every
//! client connection open another, and that one another (issue 41: one ClientHello
//! raised `crossbar_listener_accepts_total` by 9,994 in a second).
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::dns::{ScriptedDns, Zone};
use crate::common::*;
use crossbar::config::BackendAddress;
use crossbar::metrics::Metrics;
use crossbar::server::Server;

/// Accepts of every listener, as the metric counts them.
fn accepts(cb: &Crossbar) -> f64 {
    cb.metric("crossbar_listener_accepts_total", &[])
}

/// One client sends one ClientHello and reads until crossbar closes.
async fn one_hello(to: SocketAddr) {
    let mut s = tokio::net::TcpStream::connect(to).await.expect("connect");
    s.write_all(&hello_fixture("curl7_openssl3.bin"))
        .await
        .expect("send the hello");
    let mut sink = Vec::new();
    let _ = within("crossbar closes", s.read_to_end(&mut sink)).await; // ok: reset or close
}

/// `host: loop.test` resolving to crossbar's own listen address: `check --resolve`
/// fails naming it; at run time the record is left out (a warning, a failed
/// lookup counted as `itself`), and one ClientHello is one accept, no cascade.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_resolving_to_crossbar_itself_fails_check_and_is_left_out() {
    let log = LogBuffer::install();
    let port = free_port().port();
    let zone = Zone::default().a("loop.test", "127.0.44.1".parse().expect("ip"));
    let dns = ScriptedDns::start(&zone).await;
    let yaml = format!(
        "admin: {{ enabled: false }}\nservices:\n  svc:\n    listen: [\"127.0.44.1:{port}\"]\n\
         \x20   health: {{ check: tcp, interval: 100ms, timeout: 1s }}\n\
         \x20   discover: {{ host: loop.test, port: {port}, resolvers: [\"{}\"], min_ttl: 300ms, max_ttl: 2s }}\n",
        dns.addr()
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("crossbar.yaml");
    std::fs::write(&path, &yaml).expect("write");
    let check = ["check", "--resolve", "-c", &path.display().to_string()].map(String::from);
    let (ok, out, err) = crossbar_cli(check.to_vec()).await;
    assert!(
        !ok,
        "check passes a backend that is crossbar itself: {out}{err}"
    );
    assert!(
        err.contains("crossbar's own listen address 127.0.44.1"),
        "{out}{err}"
    );

    let cb = Crossbar::start(&yaml).await;
    let itself = [
        ("service", "svc"),
        ("name", "loop.test"),
        ("result", "itself"),
    ];
    wait_until("the lookup left the record out", || {
        cb.metric("crossbar_discovery_lookups_total", &itself) >= 1.0
    })
    .await;
    assert!(log.contains("DNS record names crossbar itself, left out"));
    assert!(cb.service("svc").expect("svc").pool.backends.is_empty());
    one_hello(cb.addr("svc")).await;
    assert_eq!(accepts(&cb), 1.0, "one ClientHello, one accept");
    drop(dns);
}

/// Defence in depth, past every check (a library caller's config that names the
/// listen address itself): a connection that comes from one of crossbar's own
/// backend connections is refused at once, so one ClientHello costs a handful of
/// accepts, counted as `refused{reason="self"}`, never a cascade.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_is_crossbar_itself_past_every_check_costs_a_handful_of_accepts() {
    let port = free_port().port();
    let dir = tempfile::tempdir().expect("temp dir");
    let yaml = format!(
        "admin: {{ enabled: false }}\nservices:\n  svc:\n    listen: [\"127.0.44.2:{port}\"]\n\
         \x20   health: {{ check: none }}\n    timeouts: {{ server_hello: 2s }}\n\
         \x20   backends:\n      - {{ name: me, address: \"127.0.0.9:9\" }}\n"
    );
    let mut cfg = load_config(dir.path(), &yaml);
    cfg.services[0].backends[0].address = BackendAddress {
        host: "127.0.44.2".into(),
        port,
    };
    let server = Server::start(cfg, Metrics::new()).await.expect("start");
    let addr = server.local_addrs("svc")[0];
    let idle = server.open_tasks(); // the accept loops
    one_hello(addr).await;
    // Whatever a cascade would have opened has been opened by now: the client's
    // connection was closed, and every connection task it led to has ended.
    wait_until("every connection ended", || server.open_tasks() == idle).await;
    let text = server.metrics().encode();
    let accepted = metric_value(&text, "crossbar_listener_accepts_total", &[]);
    let refused = metric_value(
        &text,
        "crossbar_listener_refused_total",
        &[("reason", "self")],
    );
    println!("one ClientHello: {accepted} accepts, {refused} refused as crossbar's own");
    assert!(refused >= 1.0, "the loop was not seen: {text}");
    assert!(
        accepted <= 5.0,
        "a cascade: {accepted} accepts for one ClientHello"
    );
    server.shutdown(Duration::from_secs(1)).await;
}
