//! Balance algorithms, backups, retries and connection limits through real
//! connections (`mode: tcp`, backends that write their name first).
mod common;

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn tagged(names: &[&str]) -> Vec<Backend> {
    let mut v = Vec::new();
    for n in names {
        v.push(Backend::echo(n, true).await);
    }
    v
}

fn tcp_yaml(balance: &str, extra: &str, backends: &[String]) -> String {
    one_service(
        &format!("    mode: tcp\n    balance: {balance}\n{extra}"),
        backends,
    )
}

fn lines(bs: &[Backend]) -> Vec<String> {
    bs.iter()
        .map(|b| backend_line(&b.name, b.addr, ""))
        .collect()
}

/// `n` sequential connections; counts per answering backend.
async fn tally(lb: &Crossbar, n: usize) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for _ in 0..n {
        let (name, conn) = who(lb.addr("svc")).await;
        drop(conn);
        *counts.entry(name).or_insert(0) += 1;
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roundrobin_spreads_30_connections_evenly_over_3_backends() {
    let bs = tagged(&["a", "b", "c"]).await;
    let lb = Crossbar::start(&tcp_yaml("roundrobin", "", &lines(&bs))).await;

    let counts = tally(&lb, 30).await;

    for b in &bs {
        assert_eq!(counts.get(&b.name), Some(&10), "{counts:?}");
        assert_eq!(b.accepted(), 10);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roundrobin_respects_weights_3_to_1() {
    let bs = tagged(&["heavy", "light"]).await;
    let lb = Crossbar::start(&tcp_yaml(
        "roundrobin",
        "",
        &[
            backend_line("heavy", bs[0].addr, "weight: 3"),
            backend_line("light", bs[1].addr, "weight: 1"),
        ],
    ))
    .await;

    let counts = tally(&lb, 40).await;

    assert_eq!(counts.get("heavy"), Some(&30), "{counts:?}");
    assert_eq!(counts.get("light"), Some(&10), "{counts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leastconn_sends_new_connections_to_the_idle_backend() {
    let bs = tagged(&["a", "b"]).await;
    let lb = Crossbar::start(&tcp_yaml("leastconn", "", &lines(&bs))).await;

    // Four held connections: leastconn puts two on each.
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(who(lb.addr("svc")).await);
    }
    let on = |n: &str, held: &[(String, TcpStream)]| held.iter().filter(|(b, _)| b == n).count();
    assert_eq!((on("a", &held), on("b", &held)), (2, 2));

    // Close b's two: b is idle, a still holds two.
    held.retain(|(b, _)| b == "a");
    wait_until("crossbar sees b's connections closed", || {
        lb.active("svc", "b") == 0
    })
    .await;
    assert_eq!(lb.active("svc", "a"), 2);

    // The next two go to b (0 then 1 open, both fewer than a's 2).
    for _ in 0..2 {
        let (name, conn) = who(lb.addr("svc")).await;
        assert_eq!(name, "b");
        held.push((name, conn));
    }
    assert_eq!(lb.active("svc", "b"), 2);
    assert_eq!(bs[1].accepted(), 4);
}

/// Tagged backends p1, p2 and the backup bk behind crossbar with `balance`.
async fn primaries_and_backup(balance: &str) -> (Vec<Backend>, Crossbar) {
    let bs = tagged(&["p1", "p2", "bk"]).await;
    let lb = Crossbar::start(&tcp_yaml(
        balance,
        "",
        &[
            backend_line("p1", bs[0].addr, ""),
            backend_line("p2", bs[1].addr, ""),
            backend_line("bk", bs[2].addr, "backup: true"),
        ],
    ))
    .await;
    (bs, lb)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_uses_the_first_backend_and_backup_only_when_primaries_refuse() {
    let (bs, lb) = primaries_and_backup("first").await;

    let counts = tally(&lb, 10).await;
    assert_eq!(counts.get("p1"), Some(&10), "{counts:?}");

    bs[0].stop().await;
    let counts = tally(&lb, 5).await;
    assert_eq!(counts.get("p2"), Some(&5), "{counts:?}");

    bs[1].stop().await;
    let counts = tally(&lb, 5).await;
    assert_eq!(counts.get("bk"), Some(&5), "{counts:?}");

    // The backup took nothing while a primary answered.
    assert_eq!(bs[2].accepted(), 5);
    let errors = |b: &str| {
        lb.metric(
            "crossbar_connect_errors_total",
            &[("service", "svc"), ("backend", b)],
        )
    };
    // Each stopped primary refused `fall` (3) connects, which passive detection counts
    // like failed checks: then it was marked down and no longer tried.
    assert_eq!((errors("p1"), errors("p2"), errors("bk")), (3.0, 3.0, 0.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roundrobin_never_uses_a_backup_while_primaries_answer() {
    let (bs, lb) = primaries_and_backup("roundrobin").await;

    let counts = tally(&lb, 10).await;

    assert_eq!(counts.get("p1"), Some(&5), "{counts:?}");
    assert_eq!(counts.get("p2"), Some(&5), "{counts:?}");
    assert_eq!(bs[2].accepted(), 0);
}

fn client_ip(i: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2 + i))
}

async fn source_map(lb: &Crossbar, clients: u8) -> Vec<String> {
    let mut out = Vec::new();
    for i in 0..clients {
        let mut s = connect_from(client_ip(i), lb.addr("svc")).await;
        out.push(read_name(&mut s).await);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn source_is_stable_per_client_and_a_new_backend_moves_only_its_share() {
    const CLIENTS: u8 = 50;
    let bs = tagged(&["s1", "s2", "s3", "s4"]).await;
    let lb = Crossbar::start(&tcp_yaml("source", "", &lines(&bs[..3]))).await;

    let before = source_map(&lb, CLIENTS).await;
    // Stable: the same client address lands on the same backend again.
    assert_eq!(source_map(&lb, CLIENTS).await, before);
    // And every backend gets some of the 50.
    for b in &bs[..3] {
        assert!(before.contains(&b.name), "{} unused: {before:?}", b.name);
    }

    lb.reload(&tcp_yaml("source", "", &lines(&bs))).await;
    let after = source_map(&lb, CLIENTS).await;

    let moved: Vec<usize> = (0..before.len())
        .filter(|&i| before[i] != after[i])
        .collect();
    eprintln!("{} of {CLIENTS} clients moved to s4", moved.len());
    // Rendezvous hashing: a client moves only to the new backend ...
    for &i in &moved {
        assert_eq!(
            after[i], "s4",
            "client {} moved {} -> {}",
            i, before[i], after[i]
        );
    }
    // ... and the new backend gets about 1/4 of the clients (12.5 expected of 50).
    assert!(!moved.is_empty(), "the new backend got no client");
    assert!(
        moved.len() <= 20,
        "{} of {CLIENTS} clients moved, expected about 1/4",
        moved.len()
    );
    // Still stable after the reload.
    assert_eq!(source_map(&lb, CLIENTS).await, after);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_connect_is_retried_on_the_next_backend_and_counted() {
    let live = Backend::echo("live", true).await;
    let dead = refusing_addr();
    let lb = Crossbar::start(&tcp_yaml(
        "first",
        "",
        &[
            backend_line("dead", dead, ""),
            backend_line("live", live.addr, ""),
        ],
    ))
    .await;

    let (name, _conn) = who(lb.addr("svc")).await;

    assert_eq!(name, "live");
    let m = |name: &str, b: &str| lb.metric(name, &[("service", "svc"), ("backend", b)]);
    assert_eq!(m("crossbar_connect_errors_total", "dead"), 1.0);
    assert_eq!(m("crossbar_connect_errors_total", "live"), 0.0);
    assert_eq!(m("crossbar_connections_total", "live"), 1.0);
    assert_eq!(m("crossbar_connections_total", "dead"), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_connections_queues_the_excess_until_a_slot_frees() {
    let b = Backend::echo("one", true).await;
    let lb = Crossbar::start(&tcp_yaml(
        "roundrobin",
        "",
        &[backend_line("one", b.addr, "max_connections: 1")],
    ))
    .await;
    let pool = || lb.server.service("svc").unwrap();

    let (_, first) = who(lb.addr("svc")).await;
    let mut second = TcpStream::connect(lb.addr("svc")).await.unwrap();
    wait_until("the second connection is queued", || {
        pool().pool.queued() == 1
    })
    .await;
    assert_eq!(
        b.accepted(),
        1,
        "the backend got a second connection over its limit"
    );
    limit_and_queue_in_sight(&lb).await;

    drop(first);
    assert_eq!(read_name(&mut second).await, "one");
    assert_eq!(pool().pool.queued(), 0);
    assert_eq!(b.accepted(), 2);
}

/// With `one` at its limit (1) and one connection queued: the gauges, the API,
/// `crossbar status` and the page show the limit and the queue (issue #53 item 1:
/// the limit appeared nowhere, the page's `Max` was the peak, no queue gauge).
async fn limit_and_queue_in_sight(lb: &Crossbar) {
    let svc = [("service", "svc")];
    assert_eq!(lb.metric("crossbar_queue_waiting", &svc), 1.0);
    assert!(lb.metric("crossbar_queue_size", &svc) >= 1.0);
    let one = [("service", "svc"), ("backend", "one")];
    assert_eq!(lb.metric("crossbar_backend_max_connections", &one), 1.0);
    let admin = lb.serve_admin(None).await;
    let v = common::api::admin_json(admin.addr, "/api/services").await;
    let s = &v["services"][0];
    assert_eq!(s["queued"], 1, "{s}");
    assert_eq!(s["queue_timeout_ms"], 10_000, "{s}");
    assert_eq!(s["backends"][0]["max_connections"], 1, "{s}");
    let url = format!("http://{}", admin.addr);
    let (ok, shown, err) = crossbar_cli(vec!["status".into(), "--admin".into(), url]).await;
    let one_row = shown
        .lines()
        .find(|l| l.trim_start().starts_with("one "))
        .unwrap_or("");
    assert!(
        ok && one_row.split_whitespace().any(|c| c == "1/1"),
        "{shown}{err}"
    );
    assert!(shown.contains("queue 1/"), "{shown}");
    let page = common::api::admin_get(admin.addr, "/").await;
    assert!(
        page.contains(">Cur/Limit<") && page.contains(">Peak<") && !page.contains(">Max<"),
        "{page}"
    );
    assert!(
        page.contains("<td>1/1</td>") && page.contains("queue 1/"),
        "{page}"
    );
}

/// A queued client that gives up (resets, as a client timing out does) leaves the
/// queue at once, and no backend connection is opened for it when a slot frees
/// (HAProxy's abortonclose). In `mode: tcp` a plain close is not enough: it may be
/// a half-close that still wants the answer (tests/relay covers those).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_client_that_leaves_gets_no_backend_connection() {
    let b = Backend::echo("one", true).await;
    let lb = Crossbar::start(&tcp_yaml(
        "roundrobin",
        "",
        &[backend_line("one", b.addr, "max_connections: 1")],
    ))
    .await;
    let pool = || lb.server.service("svc").unwrap();

    let (_, first) = who(lb.addr("svc")).await;
    let second = TcpStream::connect(lb.addr("svc")).await.unwrap();
    wait_until("the second connection is queued", || {
        pool().pool.queued() == 1
    })
    .await;
    socket2::SockRef::from(&second)
        .set_linger(Some(std::time::Duration::ZERO))
        .unwrap();
    drop(second);
    wait_until("the queue is empty again", || pool().pool.queued() == 0).await;
    drop(first);
    // A third client is served; the backend never saw the one that left.
    let (name, _third) = who(lb.addr("svc")).await;
    assert_eq!(name, "one");
    assert_eq!(b.accepted(), 2, "first and third only");
}

/// In `mode: tls` a client that sent its hello and then closed while queued has
/// left (a TLS client never half-closes mid-handshake): no backend connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_tls_client_that_closes_gets_no_backend_connection() {
    let hello = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/hellos/openssl3_tls13.bin"
    ))
    .unwrap();
    let b = Backend::echo("one", false).await;
    let lb = Crossbar::start(&one_service(
        "",
        &[backend_line("one", b.addr, "max_connections: 1")],
    ))
    .await;
    let pool = || lb.server.service("svc").unwrap();
    // The first client takes the only slot (the echo backend answers its hello).
    let mut first = TcpStream::connect(lb.addr("svc")).await.unwrap();
    first.write_all(&hello).await.unwrap();
    let mut echoed = vec![0u8; hello.len()];
    first.read_exact(&mut echoed).await.unwrap();
    // The second sends its hello, is queued, then closes normally.
    let mut second = TcpStream::connect(lb.addr("svc")).await.unwrap();
    second.write_all(&hello).await.unwrap();
    wait_until("the second connection is queued", || {
        pool().pool.queued() == 1
    })
    .await;
    second.shutdown().await.unwrap();
    drop(second);
    wait_until("the queue is empty again", || pool().pool.queued() == 0).await;
    drop(first);
    wait_until("the slot is free", || lb.active("svc", "one") == 0).await;
    assert_eq!(
        b.accepted(),
        1,
        "no backend connection for the client that left"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn excess_connection_is_refused_when_the_queue_is_full() {
    let b = Backend::echo("one", true).await;
    let lb = Crossbar::start(&tcp_yaml(
        "roundrobin",
        "    queue_size: 0\n",
        &[backend_line("one", b.addr, "max_connections: 1")],
    ))
    .await;

    let (_, _first) = who(lb.addr("svc")).await;
    let mut second = TcpStream::connect(lb.addr("svc")).await.unwrap();
    let (got, _) = within("the refusal", read_to_end_or_error(&mut second)).await;

    assert!(got.is_empty(), "refused connection got data: {got:?}");
    assert_eq!(b.accepted(), 1);
    assert_eq!(
        lb.metric(
            "crossbar_route_refused_total",
            &[("service", "svc"), ("reason", "queue_full")]
        ),
        1.0
    );
}

/// Time is the subject: a short queue timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_connection_is_refused_after_the_queue_timeout() {
    let b = Backend::echo("one", true).await;
    let lb = Crossbar::start(&tcp_yaml(
        "roundrobin",
        "    timeouts: { queue: 200ms }\n",
        &[backend_line("one", b.addr, "max_connections: 1")],
    ))
    .await;

    let (_, _first) = who(lb.addr("svc")).await;
    let mut second = TcpStream::connect(lb.addr("svc")).await.unwrap();
    let started = std::time::Instant::now();
    let (got, _) = within("the refusal", read_to_end_or_error(&mut second)).await;

    assert!(got.is_empty(), "refused connection got data: {got:?}");
    assert!(started.elapsed() >= std::time::Duration::from_millis(150));
    assert_eq!(b.accepted(), 1);
    assert_eq!(
        lb.metric("crossbar_queue_timeouts_total", &[("service", "svc")]),
        1.0
    );
    assert_eq!(
        lb.metric(
            "crossbar_route_refused_total",
            &[("service", "svc"), ("reason", "queue_timeout")]
        ),
        1.0
    );
    let mut buf = [0u8; 1];
    assert_eq!(second.read(&mut buf).await.unwrap_or(0), 0);
}
