//! Backends discovered from DNS (`discover:`), against a real DNS server: a dnsmasq
//! started by each test on a free loopback port, whose records the test rewrites
//! (SRV records need a restart of dnsmasq on the same port: lookups in between
//! fail, which the pool must survive too).
//!
//! Backends are separate TLS servers on their own 127.0.0.x addresses; agents are
//! rustls clients with their own session caches, running through crossbar while
//! the records change.
//!
//! DNS as safe as static pools (issue 41), against a scripted DNS server
//! (`common::dns`, answers SERVFAIL, REFUSED, late or never, per name):
//! - [`itself`]: never dial yourself;
//! - [`off_the_path`]: start and reload never wait for DNS, and the tools say
//!   when a service would have no backend;
//! - [`operator`]: the operator's state wins over DNS changes;
//! - [`swap`]: make before break, with the `discover.backend` template;
//! - [`restart`]: a restart keeps the stick entries and the health of an SRV pool.
#[path = "../common/mod.rs"]
mod common;

mod itself;
mod off_the_path;
mod operator;
mod restart;
mod swap;

use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use common::*;
use crossbar::testbed::{self, BackendTls, TestCa, TlsBackend, Versions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const DNSMASQ: &str = "/usr/sbin/dnsmasq";
/// The SRV name the tests publish their compilers under (Puppet's own record).
const SRV: &str = "_x-puppet._tcp.test";

/// A dnsmasq serving only the records the test wrote, on a free loopback port.
struct Dns {
    dir: tempfile::TempDir,
    port: u16,
    child: Option<ChildGuard>,
}

impl Dns {
    async fn start(records: &str) -> Dns {
        if !std::path::Path::new(DNSMASQ).exists() {
            testbed::missing_tool("discovery", "dnsmasq (apt-get install dnsmasq-base)");
        }
        let mut dns = Dns {
            dir: tempfile::tempdir().expect("temp dir"),
            port: free_port().port(),
            child: None,
        };
        dns.serve(records).await;
        dns
    }

    /// `ip:port` for `discover.resolvers`.
    fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// (Re)start dnsmasq with `records` (dnsmasq config lines) on the same port.
    async fn serve(&mut self, records: &str) {
        self.stop();
        let conf = self.dir.path().join("dnsmasq.conf");
        let text = format!(
            "port={}\nlisten-address=127.0.0.1\nbind-interfaces\nno-resolv\nno-hosts\n\
             user=root\npid-file=\nlocal=/test/\n{records}\n",
            self.port
        );
        std::fs::write(&conf, text).expect("write dnsmasq.conf");
        let child = Command::new(DNSMASQ)
            .arg("--keep-in-foreground")
            .arg(format!("--conf-file={}", conf.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start dnsmasq");
        self.child = Some(ChildGuard(child));
        // Ready when its TCP socket accepts (it binds UDP and TCP before serving).
        let addr: SocketAddr = self.addr().parse().expect("address");
        wait_until("dnsmasq listening", || {
            std::net::TcpStream::connect(addr).is_ok()
        })
        .await;
    }

    /// Stop dnsmasq (lookups then time out or are refused).
    fn stop(&mut self) {
        self.child = None;
    }
}

/// An SRV record line for dnsmasq.
fn srv(target: &str, port: u16, priority: u16, weight: u16) -> String {
    format!("srv-host={SRV},{target}.test,{port},{priority},{weight}\n")
}

/// An A record line.
fn a(name: &str, ip: IpAddr) -> String {
    format!("host-record={name}.test,{ip}\n")
}

/// The names of the backends `service` runs with now that DNS (or the file) still
/// lists (sorted); those that left DNS and still drain are [`departed`].
fn pool(cb: &Crossbar, service: &str) -> BTreeSet<String> {
    backends_where(cb, service, false)
}

/// The backends of `service` that left DNS and are still listed (draining).
fn departed(cb: &Crossbar, service: &str) -> BTreeSet<String> {
    backends_where(cb, service, true)
}

fn backends_where(cb: &Crossbar, service: &str, left_dns: bool) -> BTreeSet<String> {
    let Some(svc) = cb.server.service(service) else {
        return BTreeSet::new();
    };
    let found = svc
        .pool
        .backends
        .iter()
        .filter(|b| b.config.left_dns == left_dns);
    found.map(|b| b.name.to_string()).collect()
}

/// Metric series that name `backend` (every family), as text lines.
fn series_of(cb: &Crossbar, backend: &str) -> Vec<String> {
    let label = format!("backend=\"{backend}\"");
    let text = cb.server.metrics().encode();
    let named = text
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains(&label));
    named.map(str::to_string).collect()
}

/// Wait until `svc` runs with exactly `want` and every one of them takes new
/// connections: DNS is not on the start path, so a started crossbar fills its pool
/// when the first answer comes, and each newcomer serves once its checks pass.
async fn serving(cb: &Crossbar, want: &BTreeSet<String>) {
    wait_until(&format!("pool {want:?} serving"), || {
        let Some(svc) = cb.server.service("svc") else {
            return false;
        };
        let names: BTreeSet<String> = svc
            .pool
            .backends
            .iter()
            .map(|b| b.name.to_string())
            .collect();
        &names == want && svc.pool.backends.iter().all(|b| b.is_available())
    })
    .await;
}

/// A TLS compiler on its own loopback address.
async fn compiler(ca: &TestCa, name: &str, ip: &str) -> TlsBackend {
    let bind: SocketAddr = format!("{ip}:0").parse().expect("address");
    TlsBackend::start(ca, name, &[SNI], BackendTls::default(), bind)
        .await
        .unwrap_or_else(|e| panic!("start compiler {name}: {e:#}"))
}

fn service_yaml(dns: &Dns, discover: &str, extra: &str) -> String {
    format!(
        "admin: {{ enabled: false }}\nservices:\n  svc:\n    listen: [\"127.0.0.1:0\"]\n\
         {extra}    health: {{ check: tls-hello, interval: 100ms, timeout: 1s, rise: 2, fall: 2 }}\n\
         \x20   discover: {{ {discover}, resolvers: [\"{}\"], min_ttl: 300ms, max_ttl: 2s }}\n",
        dns.addr()
    )
}

/// What the agents saw, request by request.
#[derive(Default)]
struct Seen {
    /// (agent, backend answering, resumed, backend of that agent's previous request)
    replies: Vec<(usize, String, bool, Option<String>)>,
    failures: Vec<String>,
}

/// Agents: each its own session cache, requests in a loop until `stop` (bounded).
fn agents(
    ca: &Arc<TestCa>,
    n: usize,
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Seen>>,
    rounds: Arc<AtomicUsize>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..n)
        .map(|i| {
            let mut cfg = testbed::client_config(ca, Versions::Both, true).expect("client config");
            let (stop, seen, rounds, ca) = (stop.clone(), seen.clone(), rounds.clone(), ca.clone());
            tokio::spawn(async move {
                let mut last: Option<String> = None;
                for n in 0..20_000 {
                    if stop.load(Ordering::Acquire) {
                        return;
                    }
                    // Every fourth request is a new agent (no session): new compilers
                    // get their share of new agents.
                    if n % 4 == 3 {
                        cfg = testbed::client_config(&ca, Versions::Both, true)
                            .expect("client config");
                        last = None;
                    }
                    let r =
                        within("agent request", testbed::get(addr, SNI, cfg.clone(), "/")).await;
                    match r {
                        Ok(reply) => {
                            let prev = last.replace(reply.backend.clone());
                            let mut s = seen.lock().expect("seen");
                            s.replies.push((i, reply.backend, reply.resumed, prev));
                        }
                        Err(e) => seen.lock().expect("seen").failures.push(format!("{e:#}")),
                    }
                    rounds.fetch_add(1, Ordering::AcqRel);
                }
            })
        })
        .collect()
}

/// Wait until every agent has completed at least one more request.
async fn one_more_round(rounds: &AtomicUsize, agents: usize) {
    let start = rounds.load(Ordering::Acquire);
    wait_until("agents make progress", || {
        rounds.load(Ordering::Acquire) >= start + 2 * agents
    })
    .await;
}

/// An HTTP/1.1 connection through crossbar held open across changes: who answered.
async fn held_request(tls: &mut tokio_rustls::client::TlsStream<tokio::net::TcpStream>) -> String {
    tls.write_all(b"GET / HTTP/1.1\r\nhost: puppet.example.com\r\n\r\n")
        .await
        .expect("request on the held connection");
    let mut buf = vec![0u8; 4096];
    let mut got = Vec::new();
    loop {
        let n = within("answer on the held connection", tls.read(&mut buf))
            .await
            .expect("read on the held connection");
        assert!(n > 0, "the held connection was closed");
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got).to_string();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            if !body.is_empty() {
                return head
                    .lines()
                    .find_map(|l| l.strip_prefix("x-backend: "))
                    .unwrap_or("?")
                    .to_string();
            }
        }
    }
}

/// Ten changes of the SRV records while agents run: new compilers get traffic only
/// after passing their checks (a dead one never gets a connection), removed ones
/// drain (a held connection finishes intact, no new ones), compilers that stay keep
/// every resumption, and no agent connection fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn srv_changes_are_hitless() {
    let log = LogBuffer::install();
    let ca = Arc::new(TestCa::new("discovery CA").expect("CA"));
    let c: Vec<TlsBackend> = vec![
        compiler(&ca, "c1", "127.0.0.11").await,
        compiler(&ca, "c2", "127.0.0.12").await,
        compiler(&ca, "c3", "127.0.0.13").await,
        compiler(&ca, "c4", "127.0.0.14").await,
    ];
    let dead = refusing_on("127.0.0.15");
    let ips = [
        "127.0.0.11",
        "127.0.0.12",
        "127.0.0.13",
        "127.0.0.14",
        "127.0.0.15",
    ];
    let hosts: String = ["c1", "c2", "c3", "c4", "dead"]
        .iter()
        .zip(ips)
        .map(|(n, ip)| a(n, ip.parse().expect("ip")))
        .collect();
    let name = |i: usize| format!("c{}.test-{}", i + 1, c[i].addr.port());
    let dead_name = format!("dead.test-{}", dead.port());
    let rec = |list: &[(usize, u16, u16)], with_dead: bool| {
        let mut r = hosts.clone();
        for &(i, prio, w) in list {
            r.push_str(&srv(&format!("c{}", i + 1), c[i].addr.port(), prio, w));
        }
        if with_dead {
            r.push_str(&srv("dead", dead.port(), 10, 1));
        }
        r
    };
    let mut dns = Dns::start(&rec(&[(0, 10, 1), (1, 10, 1)], false)).await;
    let cb = Crossbar::start(&service_yaml(
        &dns,
        &format!("srv: {SRV}"),
        "    stick: { on: [session_id, ticket, psk] }\n",
    ))
    .await;
    let admin = cb.serve_admin(None).await;
    serving(&cb, &BTreeSet::from([name(0), name(1)])).await;

    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let rounds = Arc::new(AtomicUsize::new(0));
    const AGENTS: usize = 6;
    let tasks = agents(
        &ca,
        AGENTS,
        cb.addr("svc"),
        stop.clone(),
        seen.clone(),
        rounds.clone(),
    );
    one_more_round(&rounds, AGENTS).await;

    // (records, expected pool, live newcomers that must come up by their checks)
    let steps: Vec<(String, Vec<String>, Vec<usize>)> = vec![
        (
            rec(&[(0, 10, 1), (1, 10, 1), (2, 10, 1)], false),
            vec![name(0), name(1), name(2)],
            vec![2],
        ),
        (
            rec(&[(0, 10, 1), (1, 10, 1), (2, 10, 1)], true),
            vec![name(0), name(1), name(2), dead_name.clone()],
            vec![],
        ),
        (
            rec(&[(0, 10, 1), (1, 10, 1)], true),
            vec![name(0), name(1), dead_name.clone()],
            vec![],
        ),
        (
            rec(&[(0, 10, 1), (1, 10, 1), (3, 20, 1)], true),
            vec![name(0), name(1), name(3), dead_name.clone()],
            vec![3],
        ),
        (
            rec(&[(0, 10, 1), (1, 10, 1), (3, 10, 1)], true),
            vec![name(0), name(1), name(3), dead_name.clone()],
            vec![3],
        ),
        (
            rec(&[(0, 10, 1), (1, 10, 1), (3, 10, 1)], false),
            vec![name(0), name(1), name(3)],
            vec![],
        ),
        (
            rec(&[(0, 10, 1), (1, 10, 1), (2, 10, 1), (3, 10, 1)], false),
            vec![name(0), name(1), name(2), name(3)],
            vec![2],
        ),
        (
            rec(&[(0, 10, 1), (1, 10, 5), (2, 10, 1), (3, 10, 1)], false),
            vec![name(0), name(1), name(2), name(3)],
            vec![],
        ),
        (
            rec(&[(0, 10, 1), (1, 10, 5), (2, 10, 1)], false),
            vec![name(0), name(1), name(2)],
            vec![],
        ),
        (
            rec(&[(0, 10, 1), (1, 10, 1)], false),
            vec![name(0), name(1)],
            vec![],
        ),
    ];
    let mut held = None;
    for (k, (records, want, newcomers)) in steps.into_iter().enumerate() {
        if k == 2 {
            // Hold a connection on c3 before it is removed.
            let mut tls = None;
            let mut got = Vec::new();
            for _ in 0..200 {
                let mut t = tls_connect(&ca, cb.addr("svc")).await;
                let who = held_request(&mut t).await;
                if who == "c3" {
                    tls = Some(t);
                    break;
                }
                got.push(who);
            }
            held = Some(tls.unwrap_or_else(|| panic!("no connection landed on c3: {got:?}")));
        }
        if k == 5 {
            // The dead newcomer is removed next: it failed every check, got no traffic.
            let l = [("service", "svc"), ("backend", dead_name.as_str())];
            assert_eq!(cb.metric("crossbar_connect_errors_total", &l), 0.0);
            assert_eq!(cb.metric("crossbar_connections_total", &l), 0.0);
            let fails = [
                ("service", "svc"),
                ("backend", dead_name.as_str()),
                ("result", "fail"),
            ];
            assert!(
                cb.metric("crossbar_health_checks_total", &fails) > 0.0,
                "it was checked"
            );
        }
        dns.serve(&records).await;
        let want: BTreeSet<String> = want.into_iter().collect();
        let took = wait_until(&format!("change {k}: pool {want:?}"), || {
            pool(&cb, "svc") == want
        })
        .await;
        println!("change {k}: applied {took:?} after dnsmasq restarted with the new records");
        // Changes that keep the names: c4 becomes a primary, c2's weight goes to 5.
        let config = |i: usize| {
            cb.server
                .service("svc")
                .and_then(|s| s.pool.get(&name(i)).map(|b| b.config.clone()))
        };
        if k == 4 {
            wait_until("c4 a primary", || config(3).is_some_and(|c| !c.backup)).await;
        }
        if k == 7 {
            wait_until("c2 weight 5", || config(1).is_some_and(|c| c.weight == 5)).await;
        }
        for i in newcomers {
            wait_until(&format!("change {k}: {} up", name(i)), || {
                cb.server
                    .service("svc")
                    .and_then(|s| s.pool.get(&name(i)).map(|b| b.is_available()))
                    .unwrap_or(false)
            })
            .await;
        }
        one_more_round(&rounds, AGENTS).await;
        if k == 2 {
            // c3 drains: the held connection still works; no new connections reach it.
            let t = held.as_mut().expect("held connection");
            assert_eq!(
                held_request(t).await,
                "c3",
                "the held connection still answers from c3"
            );
            // Counted by crossbar: client connections only (c3 is still listed while
            // it drains, so its health checks go on and reach the compiler).
            let n3 = name(2);
            let c3 = [("service", "svc"), ("backend", n3.as_str())];
            let clients = || cb.metric("crossbar_connections_total", &c3);
            let before = clients();
            one_more_round(&rounds, AGENTS).await;
            one_more_round(&rounds, AGENTS).await;
            assert_eq!(clients(), before, "a removed compiler got new connections");
            assert_eq!(held_request(t).await, "c3");
            // Listed (draining, left DNS) while its connection is open; gone with
            // every one of its series once that connection ends.
            assert_eq!(departed(&cb, "svc"), BTreeSet::from([name(2)]));
            assert!(!series_of(&cb, &name(2)).is_empty());
            told_as_left(&cb, admin.addr, &log, &name(2)).await;
            drop(held.take());
            wait_until("c3 gone once idle", || {
                departed(&cb, "svc").is_empty() && series_of(&cb, &name(2)).is_empty()
            })
            .await;
        }
    }
    stop.store(true, Ordering::Release);
    for t in tasks {
        within("agents stop", t).await.expect("agent task");
    }

    let s = seen.lock().expect("seen");
    assert!(
        s.failures.is_empty(),
        "failed agent connections: {:?}",
        s.failures
    );
    // Resumptions of sessions held by compilers that stayed (c1, c2) are all kept.
    let stayed = |b: &Option<String>| matches!(b.as_deref(), Some("c1" | "c2"));
    let resumable: Vec<_> = s.replies.iter().filter(|r| stayed(&r.3)).collect();
    let kept = resumable
        .iter()
        .filter(|r| r.2 && Some(&r.1) == r.3.as_ref())
        .count();
    println!(
        "{} requests, {} resumptions to c1/c2, {kept} kept",
        s.replies.len(),
        resumable.len()
    );
    assert!(
        resumable.len() > 100,
        "too few resumptions to judge: {}",
        resumable.len()
    );
    assert_eq!(
        kept,
        resumable.len(),
        "resumptions to compilers that stayed were lost"
    );
    // Newcomers came up by their checks, the dead one never got a connection.
    assert!(
        log.lines_with("backend up")
            .iter()
            .any(|l| l.contains(&name(2))),
        "c3 did not start down and pass its checks"
    );
    let per: HashMap<&str, u64> = c
        .iter()
        .map(|b| (b.name.as_str(), b.stats.connections.load(Ordering::Acquire)))
        .collect();
    println!("connections per compiler (checks included): {per:?}");
    for b in &c[2..] {
        assert!(
            b.stats.full.load(Ordering::Acquire) > 0,
            "{} got no agents",
            b.name
        );
    }
    drop(dns);
}

/// `backend` left DNS and drains: the log names it as left, `enable` is refused
/// saying what happens instead (it answered `up` while it stayed `drain (left
/// DNS)`), and neither the page nor `crossbar status` hints `backend enable` for it
/// (issue #53 item 5).
async fn told_as_left(cb: &Crossbar, admin: SocketAddr, log: &LogBuffer, backend: &str) {
    let applied = log.lines_with("DNS change applied");
    // The value of `left=` (a quoted list), not just anywhere in the line: the
    // line that told c3 joining names it too.
    let left_of = |l: &str| {
        let rest = l.split_once("left=\"").map_or("", |(_, r)| r);
        rest.split_once('"').map_or("", |(v, _)| v).to_string()
    };
    assert!(
        applied
            .iter()
            .any(|l| left_of(l).contains(&format!("{backend} ("))),
        "no log line names {backend} as left: {applied:?}"
    );
    let path = format!("/api/backends/svc/{backend}/enable");
    let (status, text) = raw_request(admin, &common::api::request("POST", &path), WAIT).await;
    assert_eq!(status, Some(409), "{text}");
    assert!(
        text.contains("left DNS") && text.contains("drains"),
        "{text}"
    );
    let hint = format!("backend enable svc/{backend}");
    let page = admin_get(admin, "/").await;
    assert!(!page.contains(&hint), "the page hints {hint}");
    let status = vec![
        "status".to_string(),
        "--admin".to_string(),
        format!("http://{admin}"),
    ];
    let (ok, shown, err) = common::crossbar_cli(status).await;
    assert!(
        ok && !shown.contains(&hint) && shown.contains("left DNS"),
        "{shown}{err}"
    );
    assert_eq!(
        cb.backend("svc", backend).admin_state(),
        crossbar::balance::AdminState::Enabled,
        "the refused enable set nothing"
    );
}

/// A loopback address and port where nothing listens (connections are refused).
fn refusing_on(ip: &str) -> SocketAddr {
    let l = std::net::TcpListener::bind(format!("{ip}:0")).expect("bind");
    l.local_addr().expect("addr")
}

/// DNS failures never empty the pool: the server stopped, NXDOMAIN, an empty answer
/// keep the last good set, marked stale in a log line and a metric each time; an
/// answer of 1,000 records is capped at `max_backends`; a TTL of 0 is clamped to
/// `min_ttl`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_failures_keep_the_last_good_set() {
    let log = LogBuffer::install();
    let ca = TestCa::new("discovery CA").expect("CA");
    let port = free_port().port();
    let mut live = Vec::new();
    for ip in ["127.0.0.21", "127.0.0.22"] {
        let bind: SocketAddr = format!("{ip}:{port}").parse().expect("address");
        live.push(
            TlsBackend::start(&ca, ip, &[SNI], BackendTls::default(), bind)
                .await
                .expect("compiler on the shared port"),
        );
    }
    let two = format!(
        "{}{}",
        a("pool", live[0].addr.ip()),
        a("pool", live[1].addr.ip())
    );
    let mut dns = Dns::start(&two).await;
    let discover = format!("host: pool.test, port: {port}, max_backends: 8");
    let yaml = service_yaml(&dns, &discover, "");
    let cb = Crossbar::start(&yaml).await;
    let admin = cb.serve_admin(None).await;
    let want: BTreeSet<String> = ["127.0.0.21", "127.0.0.22"]
        .iter()
        .map(|ip| format!("{ip}-{port}"))
        .collect();
    serving(&cb, &want).await;
    let snap = || {
        cb.server
            .service("svc")
            .and_then(|s| s.discovery.clone())
            .expect("status")
            .snapshot()
    };
    // TTL 0 (dnsmasq's default for local records) is clamped to min_ttl.
    assert_eq!(snap().next_in_ms, Some(300), "TTL 0 clamped to min_ttl");
    assert!(log.contains("ttl_s=0 next_ms=300"), "the clamp is logged");
    let failures = |reason: &str| {
        cb.metric(
            "crossbar_discovery_lookups_total",
            &[
                ("service", "svc"),
                ("name", "pool.test"),
                ("result", reason),
            ],
        )
    };
    let stale = || cb.metric("crossbar_discovery_stale", &[("service", "svc")]);
    let cases: Vec<(&str, Option<String>)> = vec![
        ("timeout", None),
        ("nxdomain", Some(String::new())),
        (
            "empty",
            Some("txt-record=pool.test,\"no addresses\"\n".to_string()),
        ),
    ];
    for (reason, records) in cases {
        match records {
            None => dns.stop(),
            Some(r) => dns.serve(&r).await,
        }
        wait_until(&format!("a `{reason}` failure counted"), || {
            failures(reason) >= 1.0
        })
        .await;
        assert_eq!(pool(&cb, "svc"), want, "after {reason}: the pool stays");
        assert_eq!(stale(), 1.0, "after {reason}: marked stale");
        assert!(snap().stale && snap().error.is_some());
        assert!(
            log.lines_with("DNS lookup failed")
                .iter()
                .any(|l| l.contains(&format!("reason=\"{reason}\""))
                    || l.contains(&format!("reason={reason}"))),
            "a log line names {reason}"
        );
        for b in cb.server.service("svc").expect("svc").pool.backends.iter() {
            assert!(b.is_available(), "{} still serves", b.name);
        }
        if reason == "timeout" {
            // The API and the status page say so; a reload with the same `discover`
            // keeps the set (no lookup, no empty window) while DNS is down.
            let api = admin_get(admin.addr, "/api/services").await;
            assert!(
                api.contains("\"stale\":true") && api.contains("\"source\":\"dns\""),
                "{api}"
            );
            let page = admin_get(admin.addr, "/").await;
            assert!(
                page.contains("STALE:") && page.contains("pool.test"),
                "{page}"
            );
            // And `crossbar status`, the operator's terminal view.
            let url = format!("http://{}", admin.addr);
            let status = vec!["status".to_string(), "--admin".to_string(), url];
            let (ok, shown, err) = common::crossbar_cli(status).await;
            assert!(
                ok && shown.contains("backends from DNS: host pool.test, 2 backends, resolved ")
                    && shown.contains("; STALE: the last lookup (")
                    && shown.contains("the last good set serves on"),
                "{shown}{err}"
            );
            cb.reload(&yaml).await;
            assert_eq!(pool(&cb, "svc"), want, "a reload keeps the discovered set");
            let empty = log.lines_with("DNS change applied");
            assert!(
                !empty
                    .iter()
                    .any(|l| l.contains("joined=\"\" left=\"\" moved=\"\"")),
                "an empty DNS change logged: {empty:?}"
            );
        }
        dns.serve(&two).await;
        wait_until("stale cleared", || stale() == 0.0).await;
    }
    // 1,000 records: capped at max_backends (8), the rest counted as dropped.
    let mut many = two.clone();
    for i in 0..998u32 {
        many.push_str(&a(
            "pool",
            IpAddr::from([127, 1, (i / 250) as u8, (i % 250 + 1) as u8]),
        ));
    }
    dns.serve(&many).await;
    wait_until("the capped answer applied", || pool(&cb, "svc").len() == 8).await;
    let dropped = cb.metric("crossbar_discovery_dropped_records", &[("service", "svc")]);
    assert_eq!(dropped, 992.0);
    assert!(log.contains("more records than max_backends"));
    // Every discovery family docs/metrics.md lists is exported.
    let text = cb.server.metrics().encode();
    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/metrics.md"))
        .expect("docs/metrics.md");
    let documented: BTreeSet<&str> = docs
        .split('`')
        .filter(|w| w.starts_with("crossbar_discovery_"))
        .collect();
    assert!(documented.len() >= 6, "{documented:?}");
    for f in &documented {
        assert!(
            text.contains(&format!("# TYPE {f} ")),
            "{f} is documented but not exported"
        );
    }
    // ...and every one exported is documented.
    for f in text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .filter(|f| f.starts_with("crossbar_discovery_"))
    {
        assert!(
            documented.contains(f),
            "{f} is exported but not in docs/metrics.md"
        );
    }
    drop(dns);
}

/// Two crossbar nodes reading the same records place `balance: source` clients on
/// the same compilers, before and after a record is removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_place_source_clients_alike() {
    let ca = TestCa::new("discovery CA").expect("CA");
    let ips = ["127.0.0.31", "127.0.0.32", "127.0.0.33", "127.0.0.34"];
    let (port, _live) = compilers_on_one_port(&ca, &ips).await;
    let records = |n: usize| pool_records(&ips[..n]);
    let mut dns = Dns::start(&records(4)).await;
    let discover = format!("host: pool.test, port: {port}");
    let yaml = service_yaml(&dns, &discover, "    balance: source\n");
    let (n1, n2) = (Crossbar::start(&yaml).await, Crossbar::start(&yaml).await);
    let all: BTreeSet<String> = ips.iter().map(|ip| format!("{ip}-{port}")).collect();
    for cb in [&n1, &n2] {
        serving(cb, &all).await;
    }
    let (a1, a2) = (place(&ca, &n1).await, place(&ca, &n2).await);
    assert_eq!(a1, a2, "both nodes place each client alike");
    assert!(
        a1.iter().collect::<BTreeSet<_>>().len() >= 3,
        "clients spread: {a1:?}"
    );
    dns.serve(&records(3)).await;
    for cb in [&n1, &n2] {
        wait_until("the removal applied", || pool(cb, "svc").len() == 3).await;
    }
    let (b1, b2) = (place(&ca, &n1).await, place(&ca, &n2).await);
    assert_eq!(
        b1, b2,
        "both nodes place each client alike after the change"
    );
    // Rendezvous hashing: only the removed compiler's clients moved.
    for (before, after) in a1.iter().zip(&b1) {
        if before != ips[3] {
            assert_eq!(before, after, "a client of a compiler that stayed moved");
        }
    }
    drop(dns);
}

/// A TLS compiler on each of `ips`, all on one free port (as A records give them).
async fn compilers_on_one_port(ca: &TestCa, ips: &[&str]) -> (u16, Vec<TlsBackend>) {
    let port = free_port().port();
    let mut live = Vec::new();
    for ip in ips {
        let bind: SocketAddr = format!("{ip}:{port}").parse().expect("address");
        live.push(
            TlsBackend::start(ca, ip, &[SNI], BackendTls::default(), bind)
                .await
                .expect("compiler on the shared port"),
        );
    }
    (port, live)
}

/// An A record of `pool.test` for each of `ips`.
fn pool_records(ips: &[&str]) -> String {
    ips.iter()
        .map(|ip| a("pool", ip.parse().expect("ip")))
        .collect()
}

/// The compiler (its name) each of 40 clients, from their own source addresses, reaches.
async fn place(ca: &TestCa, cb: &Crossbar) -> Vec<String> {
    let addr = cb.addr("svc");
    let mut out = Vec::new();
    for i in 0..40u8 {
        let from = IpAddr::from([127, 2, 0, i + 1]);
        let cfg = testbed::client_config(ca, Versions::Both, false).expect("client config");
        let r = within("client", testbed::get_from(Some(from), addr, SNI, cfg, "/")).await;
        out.push(r.expect("client request").backend);
    }
    out
}

/// `crossbar check --resolve` prints what the names resolve to today, and passes
/// when they do not (the file is what is checked).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_resolve_says_what_names_resolve_to() {
    let records = format!(
        "{}{}{}",
        a("c1", "127.0.0.41".parse().expect("ip")),
        a("c2", "127.0.0.42".parse().expect("ip")),
        srv("c1", 8140, 10, 3) + &srv("c2", 8140, 20, 1),
    );
    let mut dns = Dns::start(&records).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("crossbar.yaml");
    std::fs::write(&path, service_yaml(&dns, &format!("srv: {SRV}"), "")).expect("write");
    let check = vec![
        "check".to_string(),
        "--resolve".into(),
        "-c".into(),
        path.display().to_string(),
    ];
    let (ok, out, err) = common::crossbar_cli(check.clone()).await;
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("c1.test-8140 = 127.0.0.41:8140 weight 3")
            && out.contains("c2.test-8140 = 127.0.0.42:8140 weight 1 (backup)"),
        "{out}"
    );
    // doctor checks the backends DNS gives today (nothing listens there: it says so).
    let doctor = vec![
        "doctor".to_string(),
        "-c".into(),
        path.display().to_string(),
    ];
    let (_, report, _) = common::crossbar_cli(doctor).await;
    assert!(
        report.contains("c1.test-8140") && report.contains("c2.test-8140"),
        "{report}"
    );
    dns.stop();
    let (ok, out, err) = common::crossbar_cli(check).await;
    assert!(
        !ok,
        "a service left with no backend fails check: {out}{err}"
    );
    assert!(
        format!("{out}{err}").contains("service svc: DNS srv _x-puppet._tcp.test: no backend"),
        "{out}{err}"
    );
}

/// `crossbar check` without `--resolve` names what a `discover` service looks up
/// and what its backends get; `crossbar reload --strict` with a name that does not
/// resolve sends nothing and exits 1 (without `--strict`, such a reload is applied
/// with a warning).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_names_the_discovery_and_a_strict_reload_refuses_a_typo() {
    let dns =
        Dns::start(&(a("c1", "127.0.0.41".parse().expect("ip")) + &srv("c1", 8140, 10, 3))).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("crossbar.yaml");
    let yaml = service_yaml(&dns, &format!("srv: {SRV}"), "").replace(
        "max_ttl: 2s }",
        "max_ttl: 2s, backend: { max_connections: 24, proxy_protocol: v2 } }",
    );
    std::fs::write(&path, &yaml).expect("write");
    let file = path.display().to_string();
    let (ok, out, err) =
        common::crossbar_cli(["check", "-c", &file].map(String::from).to_vec()).await;
    assert!(ok, "{out}{err}");
    assert!(
        out.contains(&format!("from DNS  SRV {SRV} (not resolved"))
            && out.contains(&format!("asking {}, every 300ms..2s by the TTL", dns.addr()))
            && out.contains(
                "each backend: weight from the record, max 24, proxy v2; tls-hello every 100ms (rise 2, fall 2)"
            ),
        "{out}"
    );

    // A typo'd name, and an admin endpoint that must see no request.
    let admin = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    admin.set_nonblocking(true).expect("nonblocking");
    let typo = yaml.replace(SRV, "_x-pupet._tcp.test").replace(
        "admin: { enabled: false }",
        &format!(
            "admin: {{ listen: \"{}\" }}",
            admin.local_addr().expect("addr")
        ),
    );
    std::fs::write(&path, &typo).expect("write");
    let reload = ["reload", "--strict", "-c", &file]
        .map(String::from)
        .to_vec();
    let (ok, out, err) = common::crossbar_cli(reload).await;
    assert!(!ok, "{out}{err}");
    assert!(
        err.contains("service svc: DNS srv _x-pupet._tcp.test: no backend")
            && err.contains("reload refused (--strict)"),
        "{out}{err}"
    );
    assert_eq!(
        admin.accept().map(|_| ()).map_err(|e| e.kind()),
        Err(std::io::ErrorKind::WouldBlock),
        "nothing was sent"
    );
    // --strict needs the file it resolves.
    let bare = ["reload", "--strict"].map(String::from).to_vec();
    let (ok, _, err) = common::crossbar_cli(bare).await;
    assert!(!ok && err.contains("--config"), "{err}");
}

/// A weight the operator set at run time on a discovered backend survives a DNS
/// change (the pool is rebuilt from the new answer) and a reload that leaves the
/// backend alone (file < DNS < operator); `backend reset` returns it to the
/// record's weight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_time_weights_survive_dns_changes_and_reloads_until_reset() {
    let ca = TestCa::new("discovery CA").expect("CA");
    let ips = ["127.0.0.41", "127.0.0.42", "127.0.0.43"];
    let (port, _live) = compilers_on_one_port(&ca, &ips).await;
    let records = |n: usize| pool_records(&ips[..n]);
    let mut dns = Dns::start(&records(3)).await;
    let yaml = service_yaml(&dns, &format!("host: pool.test, port: {port}"), "");
    let cb = Crossbar::start(&yaml).await;
    let all: BTreeSet<String> = ips.iter().map(|ip| format!("{ip}-{port}")).collect();
    serving(&cb, &all).await;
    let first = format!("{}-{port}", ips[0]);
    let backend = |name: &str| cb.backend("svc", name);
    let configured = backend(&first).config.weight;
    let set = first.clone();
    cb.server
        .operate(move |op| {
            let b = op.service("svc").and_then(|s| s.pool.get(&set)).cloned();
            let b = b.expect("the discovered backend");
            op.record().set("svc", &b, None, Some(configured + 6));
        })
        .await
        .expect("operator write");
    dns.serve(&records(2)).await;
    wait_until("the removal applied", || {
        cb.server.service("svc").is_some_and(|s| {
            s.pool
                .backends
                .iter()
                .filter(|b| !b.config.left_dns)
                .count()
                == 2
        })
    })
    .await;
    assert_eq!(
        backend(&first).weight(),
        configured + 6,
        "kept across the DNS change"
    );
    let second = format!("{}-{port}", ips[1]);
    assert_eq!(backend(&second).weight(), backend(&second).config.weight);
    cb.reload(&yaml).await;
    assert_eq!(
        backend(&first).weight(),
        configured + 6,
        "kept across a reload that leaves the backend alone"
    );
    let reset = first.clone();
    cb.server
        .operate(move |op| {
            let b = op.service("svc").and_then(|s| s.pool.get(&reset)).cloned();
            op.record()
                .reset("svc", &b.expect("the discovered backend"))
        })
        .await
        .expect("operator reset");
    assert_eq!(
        backend(&first).weight(),
        configured,
        "reset: the record's weight"
    );
    drop(dns);
}

/// A configured backend named like a discovered one (`c1.test-PORT`: backend names
/// may hold dots) wins: the pool has it at its configured address, and the address
/// the record gives gets no client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configured_backend_named_like_a_discovered_one_wins() {
    let ca = TestCa::new("discovery CA").expect("CA");
    let ips = ["127.0.0.51", "127.0.0.52", "127.0.0.53"];
    let (port, _live) = compilers_on_one_port(&ca, &ips).await;
    let ip = |i: usize| ips[i].parse::<IpAddr>().expect("ip");
    let records =
        a("c1", ip(0)) + &a("c2", ip(1)) + &srv("c1", port, 10, 1) + &srv("c2", port, 10, 1);
    let dns = Dns::start(&records).await;
    let name = format!("c1.test-{port}");
    let extra = format!(
        "    balance: roundrobin\n    backends:\n      - {{ name: {name}, address: \"{}:{port}\" }}\n",
        ips[2]
    );
    let cb = Crossbar::start(&service_yaml(&dns, &format!("srv: {SRV}"), &extra)).await;
    let want: BTreeSet<String> = [name.clone(), format!("c2.test-{port}")].into();
    serving(&cb, &want).await;
    let svc = cb.server.service("svc").expect("service svc");
    let ours = svc.pool.get(&name).expect("the configured backend");
    assert_eq!(
        ours.config.address.to_string(),
        format!("{}:{port}", ips[2])
    );
    assert!(
        ours.config.from_dns.is_none(),
        "the configured one, not the record's"
    );
    let answered: BTreeSet<String> = place(&ca, &cb).await.into_iter().collect();
    assert_eq!(
        answered,
        [ips[1].to_string(), ips[2].to_string()].into(),
        "the record's own address for c1 gets no client"
    );
    drop(dns);
}
