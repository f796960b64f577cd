//! Acceptance: per-source admission (`listen[].per_source`). Real sockets from many
//! loopback source addresses (all of 127.0.0.0/8 is loopback on Linux), real TLS
//! agents resuming sessions through crossbar to real TLS backends, Debian's HAProxy
//! as the tier in front; what crossbar decided is read back from `/api/sources` and
//! the refusal counters.
mod common;

use common::haproxy;
use common::{
    backend_line, connect_from, hello_fixture, tls, wait_until, wait_until_async, within, Backend,
    Crossbar, LogBuffer,
};

use std::net::{IpAddr, SocketAddr};
use std::time::Instant;

use crossbar::testbed::{self, BackendTls, TestCa, TlsBackend, Versions};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;

/// Agents resuming TLS sessions beside the flood.
const AGENTS: usize = 50;
/// Resumptions per agent after its full handshake.
const RESUMPTIONS: usize = 3;
/// Connection attempts of each flooding loop (bounded: every load loop is).
const FLOOD: usize = 2_000;

/// An address of its own for agent `n`: 127.0.1.(n+1).
fn agent(n: usize) -> IpAddr {
    IpAddr::from([127, 0, 1 + (n / 250) as u8, 1 + (n % 250) as u8])
}

/// `GET /api/sources` on `admin`, as JSON: the first listener's entry.
async fn sources(admin: SocketAddr) -> Value {
    common::admin_json(admin, "/api/sources?limit=10000").await["listeners"][0].clone()
}

/// The entry of `source` in a `/api/sources` listener entry.
fn entry(listener: &Value, source: &str) -> Option<Value> {
    listener["sources"]
        .as_array()?
        .iter()
        .find(|s| s["source"] == source)
        .cloned()
}

/// Open a TCP connection from `from` without a timeout guard that fails the test:
/// a refused connection may already be reset when the connect completes.
async fn try_connect(from: IpAddr, to: SocketAddr) -> Option<tokio::net::TcpStream> {
    let sock = TcpSocket::new_v4().ok()?;
    sock.bind(SocketAddr::new(from, 0)).ok()?;
    within("connect", sock.connect(to)).await.ok()
}

/// One source opens connections as fast as it can, holding them (held to
/// `max_connections`), another opens and drops them (held to `rate` and `burst`),
/// while 50 agents from other addresses do a full TLS handshake and resume it 3
/// times: every agent connection succeeds and resumes on the backend holding its
/// session (the stick table kept every agent's entry).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_source_is_held_to_its_limits_while_agents_resume() {
    let ca = TestCa::new("admission CA").unwrap();
    let tls12 = BackendTls {
        versions: Versions::Tls12,
        tickets: false,
    };
    let mut backends = Vec::new();
    for name in ["m1", "m2", "m3"] {
        let b = TlsBackend::start(&ca, name, &[tls::SNI], tls12, common::any_port());
        backends.push(b.await.unwrap());
    }
    let list: Vec<_> = backends.iter().map(|b| (b.name.clone(), b.addr)).collect();
    let yaml = format!(
        "admin: {{ enabled: false }}\nservices:\n  puppet:\n    listen:\n      - address: \"127.0.0.1:0\"\n        max_connections: 100000\n        \
         per_source: {{ max_connections: 4, rate: 20, burst: 10 }}\n    balance: roundrobin\n    \
         timeouts: {{ client_hello: 60s }}\n    health: {{ check: none }}\n    \
         stick: {{ on: [session_id], size: 10000, confirm: false, probe_interval: 0s }}\n    backends:\n{}",
        tls::backends_yaml(&list)
    );
    let xb = Crossbar::start(&yaml).await;
    let admin = xb.serve_admin(None).await;
    let addr = xb.addr("puppet");
    let holder: IpAddr = [127, 0, 2, 1].into();
    let churner: IpAddr = [127, 0, 2, 2].into();

    let hold = tokio::spawn(async move {
        let mut held = Vec::new();
        for _ in 0..FLOOD {
            held.extend(try_connect(holder, addr).await);
        }
        held
    });
    // Each churned connection sends a ClientHello and waits for the first byte: a
    // backend's answer means admitted, a close without one means refused (counted
    // by what happened to it, not by metrics that may not have caught up yet).
    let hello = hello_fixture("openssl3_tls13.bin");
    let churn = tokio::spawn(async move {
        let start = Instant::now();
        let (mut admitted, mut refused) = (0u64, 0u64);
        for _ in 0..FLOOD {
            let Some(mut conn) = try_connect(churner, addr).await else {
                continue;
            };
            let mut first = [0u8; 1];
            let answer = async {
                conn.write_all(&hello).await?;
                conn.read(&mut first).await
            };
            match within("an answer or a close", answer).await {
                Ok(n) if n > 0 => admitted += 1,
                _ => refused += 1,
            }
        }
        (admitted, refused, start.elapsed())
    });
    let mut agents = Vec::new();
    for n in 0..AGENTS {
        let cfg = testbed::client_config(&ca, Versions::Tls12, false).unwrap();
        agents.push(tokio::spawn(async move {
            let mut replies = Vec::new();
            for _ in 0..=RESUMPTIONS {
                let get = testbed::get_from(Some(agent(n)), addr, tls::SNI, cfg.clone(), "/who");
                let r = within("an agent's request", get).await;
                replies.push(r.unwrap_or_else(|e| panic!("agent {}: {e:#}", agent(n))));
            }
            replies
        }));
    }
    for (n, a) in agents.into_iter().enumerate() {
        let replies = a.await.unwrap();
        let home = &replies[0].backend;
        for r in &replies[1..] {
            assert!(
                r.resumed && &r.backend == home,
                "agent {}: {r:?}, home {home}",
                agent(n)
            );
        }
    }
    let held = hold.await.unwrap();
    let (c_admitted, c_refused, churned_for) = churn.await.unwrap();

    let l = sources(admin.addr).await;
    let h = entry(&l, &holder.to_string()).expect("the holder is tracked");
    let h_refused = h["refused"].as_u64().unwrap();
    let refused = |reason| xb.metric("crossbar_listener_refused_total", &[("reason", reason)]);
    // The bucket holds 10 and refills 20 per second: nothing can have had more.
    let bound = 10 + (20.0 * churned_for.as_secs_f64()).ceil() as u64;
    println!(
        "holder: {} open of {FLOOD} attempts ({} connects completed), refused {h_refused}; \
         churner: {c_admitted} admitted in {churned_for:?} (bound {bound}), refused {c_refused}",
        h["open"],
        held.len(),
    );
    assert_eq!(h["open"], 4, "{h}");
    assert_eq!(h["admitted"], 4, "{h}");
    assert!(
        c_admitted <= bound,
        "churner admitted {c_admitted}, bound {bound}"
    );
    assert!(c_refused > 0);
    assert!(refused("source_rate") > 0.0 && refused("source_connections") > 0.0);
    drop(held);
    wait_until_async("the holder's connections released", || {
        released(admin.addr, holder)
    })
    .await;
}

/// Did crossbar close `s` without a byte (a refusal)?
async fn closed(s: &mut tokio::net::TcpStream) -> bool {
    let mut buf = [0u8; 8];
    within("the refusal", s.read(&mut buf)).await.unwrap_or(0) == 0
}

/// Is `source` down to no open connection? (`wait_until_async` polls it.)
async fn released(admin: SocketAddr, source: IpAddr) -> bool {
    let Some(body) = common::try_admin_get(admin, "/api/sources?limit=10000").await else {
        return false;
    };
    let Ok(v) = serde_json::from_str::<Value>(&body) else {
        return false;
    };
    entry(&v["listeners"][0], &source.to_string()).map_or(true, |e| e["open"] == 0)
}

/// Thousands of distinct source addresses, each draining its bucket, fill the table
/// but evict nothing: a source holding its two connections keeps its count (its
/// third is still refused for `source_connections`), the table never keeps more
/// than its size of sources without an open connection (plus that one source,
/// which holds two), and sources beyond it share the overflow entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distinct_sources_cannot_evict_a_tracked_source() {
    const DISTINCT: usize = 3_000;
    const SIZE: usize = 100;
    let echo = Backend::echo("e1", true).await;
    let yaml = format!(
        "admin: {{ enabled: false }}\nservices:\n  svc:\n    listen:\n      - address: \"127.0.0.1:0\"\n        max_connections: 100000\n        \
         per_source: {{ max_connections: 2, rate: 1, burst: 2, table_size: {SIZE} }}\n    mode: tcp\n    health: {{ check: none }}\n    backends:\n{}",
        backend_line("e1", echo.addr, "")
    );
    let xb = Crossbar::start(&yaml).await;
    let admin = xb.serve_admin(None).await;
    let addr = xb.addr("svc");
    let good: IpAddr = [127, 0, 3, 1].into();
    let mut kept = Vec::new();
    for _ in 0..2 {
        let mut s = connect_from(good, addr).await;
        assert_eq!(common::read_name(&mut s).await, "e1");
        kept.push(s);
    }
    let tasks = xb.open_tasks();
    let start = Instant::now();
    for i in 0..DISTINCT {
        let from = IpAddr::from([127, 1 + (i / 250) as u8, 0, 1 + (i % 250) as u8]);
        drop(try_connect(from, addr).await);
    }
    println!("{DISTINCT} distinct sources in {:?}", start.elapsed());
    // Every flood connection ended in crossbar too (each released its source).
    let server = xb.server.clone();
    wait_until("the flood's connections ended", || {
        server.open_tasks() <= tasks
    })
    .await;
    let l = sources(admin.addr).await;
    assert_eq!(
        l["tracked"].as_u64().unwrap(),
        SIZE as u64 + 1,
        "{}",
        l["tracked"]
    );
    let g = entry(&l, &good.to_string()).expect("the well-behaved source is still tracked");
    assert_eq!(g["open"], 2, "{g}");
    let overflow = xb.metric(
        "crossbar_listener_refused_total",
        &[("reason", "source_overflow")],
    );
    assert!(
        overflow > 0.0,
        "sources beyond the table share the overflow entry"
    );
    let before = xb.metric(
        "crossbar_listener_refused_total",
        &[("reason", "source_connections")],
    );
    let mut third = connect_from(good, addr).await;
    let mut buf = [0u8; 16];
    let n = within("the refusal", third.read(&mut buf))
        .await
        .unwrap_or(0);
    assert_eq!(n, 0, "a third connection is refused");
    let after = xb.metric(
        "crossbar_listener_refused_total",
        &[("reason", "source_connections")],
    );
    assert_eq!(after, before + 1.0);
    drop(kept);
    wait_until_async("the well-behaved source released", || {
        released(admin.addr, good)
    })
    .await;
}

/// The allow list is never limited nor tracked; a refusal has its access-log
/// `end=refused:source_connections`; a reload that changes the limits
/// keeps counting the connections opened before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_networks_are_never_limited_and_reloads_keep_counts() {
    let log = LogBuffer::install();
    let echo = Backend::echo("e1", true).await;
    let yaml = |max: u32| {
        format!(
            "admin: {{ enabled: false }}\nservices:\n  svc:\n    listen:\n      - address: \"127.0.0.1:0\"\n        \
             per_source: {{ max_connections: {max}, allow: [\"127.0.4.0/24\"] }}\n    mode: tcp\n    health: {{ check: none }}\n    backends:\n{}",
            backend_line("e1", echo.addr, "")
        )
    };
    let xb = Crossbar::start(&yaml(1)).await;
    let admin = xb.serve_admin(None).await;
    let addr = xb.addr("svc");
    let mut allowed = Vec::new();
    for _ in 0..30 {
        let mut s = connect_from([127, 0, 4, 7].into(), addr).await;
        assert_eq!(common::read_name(&mut s).await, "e1");
        allowed.push(s);
    }
    let l = sources(admin.addr).await;
    assert_eq!(l["tracked"], 0, "{l}");

    let src: IpAddr = [127, 0, 5, 1].into();
    let mut first = connect_from(src, addr).await;
    assert_eq!(common::read_name(&mut first).await, "e1");
    let mut second = connect_from(src, addr).await;
    assert!(closed(&mut second).await, "max_connections 1");
    let line = "client=127.0.5.1:";
    wait_until("the refusal's access-log line", || {
        log.lines_with(line)
            .iter()
            .any(|l| l.contains("end=refused:source_connections"))
    })
    .await;
    // The table (and `first`'s count) survives a reload that raises the limit.
    let path = xb.path.clone();
    std::fs::write(&path, yaml(2)).unwrap();
    xb.server.reload_file().await.unwrap();
    let mut again = connect_from(src, addr).await;
    assert_eq!(common::read_name(&mut again).await, "e1", "2 allowed now");
    let mut third = connect_from(src, addr).await;
    assert!(
        closed(&mut third).await,
        "`first` still counts after the reload"
    );
    assert_eq!(
        entry(&sources(admin.addr).await, &src.to_string()).unwrap()["open"],
        2
    );
    drop((first, again));
    wait_until_async("both released", || released(admin.addr, src)).await;

    // A reload that moves the listener elsewhere drops the old address's gauge.
    let gauge = format!("crossbar_listener_sources_tracked{{listener=\"{addr}\"}}");
    assert!(
        xb.server.metrics().encode().contains(&gauge),
        "{gauge} before"
    );
    std::fs::write(&path, yaml(2).replace("127.0.0.1:0", "127.0.0.3:0")).unwrap();
    xb.server.reload_file().await.unwrap();
    let text = xb.server.metrics().encode();
    assert!(!text.contains(&gauge), "{gauge} after the reload:\n{text}");
}

/// Behind a PROXY tier (HAProxy `send-proxy-v2`), the limit applies to each agent's
/// address, not to the tier's: 20 agents each hold their one allowed connection,
/// and an agent's second is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_proxy_tier_the_agents_are_limited_not_the_tier() {
    let echo = Backend::echo("e1", true).await;
    let yaml = format!(
        "admin: {{ enabled: false }}\nservices:\n  svc:\n    listen:\n      - address: \"127.0.0.1:0\"\n        \
         proxy_protocol: {{ accept_from: [\"127.0.0.1/32\"] }}\n        per_source: {{ max_connections: 1 }}\n    \
         mode: tcp\n    health: {{ check: none }}\n    backends:\n{}",
        backend_line("e1", echo.addr, "")
    );
    let xb = Crossbar::start(&yaml).await;
    let admin = xb.serve_admin(None).await;
    let front = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let proxies = format!(
        "frontend fe\n  bind {front}\n  default_backend be\n\
         backend be\n  server cb {} send-proxy-v2\n",
        xb.addr("svc")
    );
    let _tier = haproxy::start("admission", front, &proxies).await;
    let mut held = Vec::new();
    for n in 0..20 {
        let mut s = connect_from(agent(n), front).await;
        assert_eq!(common::read_name(&mut s).await, "e1", "agent {}", agent(n));
        held.push(s);
    }
    let mut second = connect_from(agent(0), front).await;
    let mut buf = [0u8; 8];
    let n = within("the refusal", second.read(&mut buf))
        .await
        .unwrap_or(0);
    assert_eq!(n, 0, "an agent's second connection is refused");
    let l = sources(admin.addr).await;
    for n in 0..20 {
        assert_eq!(entry(&l, &agent(n).to_string()).unwrap()["open"], 1, "{l}");
    }
    // The tier's address is a source only for the readiness probe the test sent
    // through it from 127.0.0.1 (its header named 127.0.0.1): never its 21 connections.
    if let Some(tier) = entry(&l, "127.0.0.1") {
        assert_eq!(
            (&tier["open"], &tier["admitted"]),
            (&0.into(), &1.into()),
            "{l}"
        );
    }
    assert_eq!(entry(&l, &agent(0).to_string()).unwrap()["refused"], 1);
    drop(held);
}

/// Issue #42, 4: `per_source: { max_connections: 3, table_size: 50 }`, 53
/// connections held from 53 sources (the first 50 filled the table, the last 3 the
/// overflow entry, held to one source's limits), then 10 new agents with one
/// connection each: all 10 were refused `source_overflow`, against the promise that
/// a new agent still gets a share. Now a source with an open connection always has
/// its own entry (those are bounded by the listener's `max_connections`);
/// `table_size` bounds the sources kept without one: the 10 agents are served,
/// each tracked with its connection, and an agent's fourth connection is still
/// refused `source_connections`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_sources_get_their_share_beside_held_connections_from_many_sources() {
    const TABLE: usize = 50;
    const HELD: usize = 53;
    const NEW: usize = 10;
    let echo = Backend::echo("e1", true).await;
    let yaml = format!(
        "admin: {{ enabled: false }}\nservices:\n  svc:\n    listen:\n      - address: \"127.0.0.1:0\"\n        \
         per_source: {{ max_connections: 3, table_size: {TABLE} }}\n    mode: tcp\n    health: {{ check: none }}\n    backends:\n{}",
        backend_line("e1", echo.addr, "")
    );
    let xb = Crossbar::start(&yaml).await;
    let admin = xb.serve_admin(None).await;
    let addr = xb.addr("svc");
    let from = |i: usize| IpAddr::from([127, 0, 6 + (i / 250) as u8, 1 + (i % 250) as u8]);
    let mut held = Vec::new();
    for i in 0..HELD {
        let mut s = connect_from(from(i), addr).await;
        assert_eq!(common::read_name(&mut s).await, "e1", "held connection {i}");
        held.push(s);
    }
    let mut admitted = 0;
    let mut agents = Vec::new();
    for i in 0..NEW {
        let Some(mut s) = try_connect(agent(200 + i), addr).await else {
            continue;
        };
        let mut name = [0u8; 3];
        if within("the agent's answer", s.read_exact(&mut name))
            .await
            .is_ok()
            && &name == b"e1\n"
        {
            admitted += 1;
            agents.push(s);
        }
    }
    let overflow = xb.metric(
        "crossbar_listener_refused_total",
        &[("reason", "source_overflow")],
    );
    println!("{HELD} held from {HELD} sources, table_size {TABLE}: {admitted}/{NEW} new agents admitted, {overflow} refused source_overflow");
    assert_eq!(
        admitted, NEW,
        "new agents admitted beside the held connections"
    );
    assert_eq!(overflow, 0.0);
    let l = sources(admin.addr).await;
    assert_eq!(l["tracked"], (HELD + NEW) as u64, "{l}");
    // Each still held to its own limits.
    let a = agent(200);
    let mut more = Vec::new();
    for _ in 0..2 {
        let mut s = connect_from(a, addr).await;
        assert_eq!(common::read_name(&mut s).await, "e1");
        more.push(s);
    }
    let mut fourth = connect_from(a, addr).await;
    assert!(closed(&mut fourth).await, "a fourth connection is refused");
    assert_eq!(
        xb.metric(
            "crossbar_listener_refused_total",
            &[("reason", "source_connections")],
        ),
        1.0
    );
    drop((held, agents, more));
}
