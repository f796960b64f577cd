//! Acceptance: confirmed placement keeps resumptions on the backend holding the
//! session when nothing crossbar can learn names it (backends without ticket key
//! names, a second crossbar node that never saw the full handshake), and its cost is
//! bounded by the budget when sessions are forged.
//!
//! Real peers only: rustls backends with a server-side session cache and no
//! ticketer, JDK HTTPS servers (`tests/java/JdkServers.java`,
//! compiled with javac into the test's temp dir, one JVM hosting the three backends,
//! each with its own certificate and default session settings); clients are `openssl
//! s_client` and JDK clients with their own default session cache
//! (`tests/java/JdkClients.java`, one JVM running every agent as a thread). Every
//! client comes from 127.0.0.1 (the NAT case). An attempt counts as kept only if the
//! client's OWN flag says it resumed and the answer came from the backend holding its
//! session (the backend of its last full handshake).
//!
//! Run with `--nocapture` to see the figures (the test output is the record).
mod common;

use common::java::Java;
use common::{rustls_backends, tls, Crossbar};

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use crossbar::stick::KeyKind;
use crossbar::testbed::{BackendTls, TestCa, TlsBackend, Versions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use tls::ChildGuard;

/// Agents in parallel, all from one address.
const CLIENTS: usize = 32;
/// Resumption attempts per agent after its full handshake.
const RESUMPTIONS: usize = 10;
/// Share of resumption attempts that must resume on the backend holding the session.
const TARGET: f64 = 0.99;
/// Largest share of first connections one backend may get.
const MAX_SPREAD_SHARE: f64 = 0.45;
/// Longest the JVMs may take to start, compile or finish a run on a loaded 2-core box.
/// Tries to find one port free on every node's loopback address.
const NODE_PORT_ATTEMPTS: usize = 5;
/// Extra handshakes per second the acceptance runs allow: 32 agents resuming at
/// once on a cold table need up to 2 extra handshakes each within a second or two.
const ACCEPTANCE_BUDGET: u32 = 1000;

/// TLS mode of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Tls13,
    Tls12SessionId,
    Tls12Ticket,
}

impl Mode {
    fn s_client_args(self) -> &'static [&'static str] {
        match self {
            Mode::Tls13 => &["-tls1_3"],
            Mode::Tls12SessionId => &["-tls1_2", "-no_ticket"],
            Mode::Tls12Ticket => &["-tls1_2"],
        }
    }
    fn rustls(self) -> BackendTls {
        BackendTls {
            versions: match self {
                Mode::Tls13 => Versions::Tls13,
                _ => Versions::Tls12,
            },
            tickets: self == Mode::Tls12Ticket,
        }
    }
    /// JVM properties of the servers: the default settings but for the version.
    fn jdk_server_props(self) -> Vec<&'static str> {
        match self {
            Mode::Tls13 => vec![],
            Mode::Tls12SessionId => vec![
                "-Djdk.tls.server.protocols=TLSv1.2",
                "-Djdk.tls.server.enableSessionTicketExtension=false",
            ],
            Mode::Tls12Ticket => vec!["-Djdk.tls.server.protocols=TLSv1.2"],
        }
    }
    fn jdk_client_props(self) -> Vec<&'static str> {
        match self {
            Mode::Tls13 => vec!["-Djdk.tls.client.protocols=TLSv1.3"],
            Mode::Tls12SessionId => vec![
                "-Djdk.tls.client.protocols=TLSv1.2",
                "-Djdk.tls.client.enableSessionTicketExtension=false",
            ],
            Mode::Tls12Ticket => vec!["-Djdk.tls.client.protocols=TLSv1.2"],
        }
    }
}

/// Backend stacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stack {
    Rustls,
    Jdk,
}

/// Client programs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Client {
    Openssl,
    Jdk,
}

/// One agent's connections: the first (full), then its attempts as (kept, resumed).
#[derive(Debug, Default)]
struct History {
    first: String,
    first_resumed: bool,
    /// (resumed, answered by the backend holding the session).
    attempts: Vec<(bool, bool)>,
}

impl History {
    /// From (resumed, backend) of each connection in order. The session lives where
    /// the last full handshake was.
    fn from_runs(runs: impl Iterator<Item = (bool, String)>) -> History {
        let mut h = History::default();
        let mut holder = String::new();
        for (i, (resumed, backend)) in runs.enumerate() {
            if i == 0 {
                h.first = backend.clone();
                h.first_resumed = resumed;
            } else {
                h.attempts.push((resumed, backend == holder));
            }
            if !resumed {
                holder = backend;
            }
        }
        h
    }
}

/// Backends of one run, stopped when dropped (held only for that).
#[allow(dead_code)]
enum Backends {
    Rustls(Vec<TlsBackend>),
    Jdk(ChildGuard),
}

/// Three backends of `stack` in `mode`, named `tag-1..3`.
async fn backends(
    ca: &TestCa,
    java: Option<&Java>,
    stack: Stack,
    mode: Mode,
    tag: &str,
) -> Result<(Backends, Vec<(String, SocketAddr)>)> {
    let names: Vec<String> = (1..=3).map(|i| format!("{tag}-{i}")).collect();
    Ok(match stack {
        Stack::Rustls => {
            let v = rustls_backends(ca, &names, mode.rustls()).await?;
            let list = v.iter().map(|b| (b.name.clone(), b.addr)).collect();
            (Backends::Rustls(v), list)
        }
        Stack::Jdk => {
            let java = java.context("no JDK")?;
            let (guard, list) = java.servers(ca, &names, &mode.jdk_server_props())?;
            (Backends::Jdk(guard), list)
        }
    })
}

/// crossbar nodes with the same config and nothing shared, one per loopback address
/// (127.0.0.1, .2, ...), all on the same port as behind a VIP: JDK clients cache
/// sessions by host name and port.
async fn nodes(list: &[(String, SocketAddr)], count: usize, budget: u32) -> Result<Vec<Crossbar>> {
    let yaml = |ip: usize, port: u16| {
        format!(
            "admin: {{ enabled: false }}\nconfirm_budget: {budget}\nservices:\n  puppet:\n    listen: [\"127.0.0.{ip}:{port}\"]\n    \
             balance: roundrobin\n    health: {{ check: none }}\n    \
             stick: {{ on: [session_id, ticket, psk] }}\n    backends:\n{}",
            tls::backends_yaml(list)
        )
    };
    // The first node takes a free port; the others take the same port on their own
    // address (free there unless another test raced for it: then pick again).
    for _ in 0..NODE_PORT_ATTEMPTS {
        let first = Crossbar::try_start(&yaml(1, 0)).await?;
        let port = first.addr("puppet").port();
        let mut out = vec![first];
        for i in 2..=count {
            match Crossbar::try_start(&yaml(i, port)).await {
                Ok(x) => out.push(x),
                Err(_) => break,
            }
        }
        if out.len() == count {
            return Ok(out);
        }
        for x in out {
            x.shutdown(Duration::from_secs(1)).await;
        }
    }
    bail!("no common free port for {count} nodes")
}

/// `openssl s_client` agents ([`tls::openssl_agents`], each resumption saving the
/// session it got), alternating over `addrs`: their histories and failures.
async fn openssl_clients(
    mode: Mode,
    addrs: &[SocketAddr],
    names: &[String],
) -> Result<(Vec<History>, Vec<String>)> {
    let args = mode.s_client_args();
    let agents = tls::openssl_agents(addrs, args, names, CLIENTS, RESUMPTIONS, true).await?;
    let mut hist = Vec::new();
    let mut errors = Vec::new();
    for runs in agents {
        let mut ok = Vec::new();
        for r in runs {
            match r {
                Ok(run) => ok.push((run.reused, run.backend)),
                Err(e) => errors.push(format!("{e:#}")),
            }
        }
        hist.push(History::from_runs(ok.into_iter()));
    }
    Ok((hist, errors))
}

/// The figures of one run, printed as a table row; its failures.
struct Row {
    label: String,
    attempts: usize,
    kept: usize,
    full: usize,
    elsewhere: usize,
    spread: BTreeMap<String, usize>,
    errors: Vec<String>,
    extra: f64,
    outcomes: String,
    secs: f64,
}

impl Row {
    fn new(label: String, hist: &[History], errors: Vec<String>, nodes: &[Crossbar]) -> Row {
        let mut r = Row {
            label,
            attempts: 0,
            kept: 0,
            full: 0,
            elsewhere: 0,
            spread: BTreeMap::new(),
            errors,
            extra: 0.0,
            outcomes: String::new(),
            secs: 0.0,
        };
        for h in hist {
            *r.spread.entry(h.first.clone()).or_default() += 1;
            if h.first_resumed {
                r.errors.push("a first connection claimed to resume".into());
            }
            for &(resumed, home) in &h.attempts {
                r.attempts += 1;
                match (resumed, home) {
                    (true, true) => r.kept += 1,
                    (true, false) => r.elsewhere += 1,
                    (false, _) => r.full += 1,
                }
            }
        }
        let mut parts = Vec::new();
        for res in crossbar::metrics::CONFIRM_RESULTS {
            let n: f64 = nodes
                .iter()
                .map(|n| n.metric("crossbar_stick_confirm_total", &[("result", res)]))
                .sum::<f64>()
                .max(0.0);
            if n > 0.0 {
                parts.push(format!("{res} {n}"));
            }
        }
        // What took backends down or closed clients unanswered, if anything did:
        // a failed run names its cause in its row.
        for (metric, label) in [
            (
                "crossbar_server_hello_timeouts_total",
                "server_hello_timeouts",
            ),
            ("crossbar_route_refused_total", "refused"),
        ] {
            let n: f64 = nodes.iter().map(|x| x.metric(metric, &[])).sum();
            if n > 0.0 {
                parts.push(format!("{label} {n}"));
            }
        }
        r.outcomes = parts.join(", ");
        r.extra = nodes
            .iter()
            .map(|n| n.metric("crossbar_stick_confirm_extra_handshakes_total", &[]))
            .sum::<f64>()
            .max(0.0);
        r
    }

    fn failures(&self) -> Vec<String> {
        let mut f = self.errors.clone();
        let expected = CLIENTS * RESUMPTIONS;
        if self.attempts != expected {
            f.push(format!("{} attempts, expected {expected}", self.attempts));
        }
        let share = self.kept as f64 / self.attempts.max(1) as f64;
        if share < TARGET {
            f.push(format!(
                "kept {:.1} % < {:.0} %",
                100.0 * share,
                100.0 * TARGET
            ));
        }
        let max = self.spread.values().copied().max().unwrap_or(0);
        if max as f64 > MAX_SPREAD_SHARE * CLIENTS as f64 {
            f.push(format!("first connections {:?}", self.spread));
        }
        f
    }

    fn print(&self) {
        let spread: Vec<String> = self.spread.values().map(|n| n.to_string()).collect();
        println!(
            "| {} | {}/{} ({:.1} %) | {} | {} | {} | {} extra handshakes ({:.2}/resumption) | {} | {:.0} s |",
            self.label,
            self.kept,
            self.attempts,
            100.0 * self.kept as f64 / self.attempts.max(1) as f64,
            self.full,
            self.elsewhere,
            spread.join("/"),
            self.extra,
            self.extra / self.attempts.max(1) as f64,
            self.outcomes,
            self.secs,
        );
        for e in self.errors.iter().take(5) {
            println!("    error: {e}");
        }
    }
}

/// One run: backends, `node_count` crossbar nodes, each client program in turn.
async fn run(
    ca: &TestCa,
    java: Option<&Java>,
    stack: Stack,
    mode: Mode,
    node_count: usize,
    clients: &[Client],
) -> Vec<Row> {
    let tag = format!("{stack:?}-{mode:?}").to_lowercase();
    let (guard, list) = backends(ca, java, stack, mode, &tag)
        .await
        .expect("backends start");
    let names: Vec<String> = list.iter().map(|(n, _)| n.clone()).collect();
    let mut rows = Vec::new();
    for &client in clients {
        // Fresh nodes per client program: each starts with an empty table.
        let xbs = nodes(&list, node_count, ACCEPTANCE_BUDGET)
            .await
            .expect("crossbar starts");
        let addrs: Vec<SocketAddr> = xbs.iter().map(|x| x.local_addrs("puppet")[0]).collect();
        let started = Instant::now();
        let (hist, errors) = match client {
            Client::Openssl => openssl_clients(mode, &addrs, &names).await,
            Client::Jdk => {
                let java = java.expect("JDK");
                let props = mode.jdk_client_props();
                tokio::task::block_in_place(|| {
                    java.clients(ca, CLIENTS, RESUMPTIONS, &addrs, &props, &[])
                })
                .map(|(runs, errors)| {
                    let hist = runs
                        .into_iter()
                        .map(|v| History::from_runs(v.into_iter()))
                        .collect();
                    (hist, errors)
                })
            }
        }
        .unwrap_or_else(|e| (Vec::new(), vec![format!("{e:#}")]));
        let label =
            format!("{mode:?}, {stack:?} backends, {client:?} clients, {node_count} node(s)");
        let mut row = Row::new(label, &hist, errors, &xbs);
        row.secs = started.elapsed().as_secs_f64();
        row.print();
        rows.push(row);
        for x in xbs {
            x.shutdown(Duration::from_secs(1)).await;
        }
    }
    drop(guard);
    rows
}

/// Assert every row met the acceptance figures.
fn check(rows: &[Row]) {
    let bad: Vec<String> = rows
        .iter()
        .filter_map(|r| {
            let f = r.failures();
            (!f.is_empty()).then(|| format!("{}: {f:?}", r.label))
        })
        .collect();
    assert!(bad.is_empty(), "missed the target:\n{}", bad.join("\n"));
}

fn header() {
    println!("| run | kept | full | resumed elsewhere | first connections | extra cost | confirmations | time |");
    println!("|---|---|---|---|---|---|---|---|");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rustls_session_cache_backends_keep_tls13_resumptions() {
    let ca = TestCa::new("confirm test CA").unwrap();
    header();
    check(&run(&ca, None, Stack::Rustls, Mode::Tls13, 1, &[Client::Openssl]).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rustls_session_cache_backends_keep_tls12_session_ids() {
    let ca = TestCa::new("confirm test CA").unwrap();
    header();
    let rows = run(
        &ca,
        None,
        Stack::Rustls,
        Mode::Tls12SessionId,
        1,
        &[Client::Openssl],
    )
    .await;
    check(&rows);
}

/// JDK backends, s_client and JDK agents, one mode.
async fn jdk_backends(mode: Mode) {
    let java = Java::compile();
    let ca = TestCa::new("confirm test CA").unwrap();
    header();
    let clients = [Client::Openssl, Client::Jdk];
    check(&run(&ca, Some(&java), Stack::Jdk, mode, 1, &clients).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jdk_backends_keep_tls13_resumptions() {
    jdk_backends(Mode::Tls13).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jdk_backends_keep_tls12_session_ids() {
    jdk_backends(Mode::Tls12SessionId).await;
}

/// Two nodes, one mode: rustls backends with s_client agents, JDK backends with JDK
/// agents (one agent program per stack keeps the run near a minute). Not `openssl
/// s_server`: it serves one connection at a time, so two connections each holding
/// one backend's answer while offering the hello to the other wait on each other
/// until `timeouts.connect` (real OpenSSL servers such as nginx are concurrent).
async fn two_nodes(mode: Mode) {
    let java = Java::compile();
    let ca = TestCa::new("confirm test CA").unwrap();
    header();
    let mut rows = run(&ca, None, Stack::Rustls, mode, 2, &[Client::Openssl]).await;
    rows.extend(run(&ca, Some(&java), Stack::Jdk, mode, 2, &[Client::Jdk]).await);
    check(&rows);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_sharing_nothing_keep_tls12_session_ids() {
    two_nodes(Mode::Tls12SessionId).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_sharing_nothing_keep_tls12_tickets() {
    two_nodes(Mode::Tls12Ticket).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_sharing_nothing_keep_tls13_resumptions() {
    two_nodes(Mode::Tls13).await;
}

/// A TLS 1.2 hello and a TLS 1.3 hello whose session ID / ticket / PSK identity are
/// replaced by fresh random bytes for every connection.
fn forged_hello(round: usize, seed: u64) -> (Vec<u8>, Vec<(KeyKind, Vec<u8>)>) {
    let name = if round % 2 == 0 {
        "openssl3_tls12_ticket.bin"
    } else {
        "openssl3_tls13_psk.bin"
    };
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hellos")
        .join(name);
    let mut hello = std::fs::read(path).expect("fixture");
    let crossbar::hello::HelloParse::Found(info) =
        crossbar::hello::parse_client_hello(&hello, 64 * 1024)
    else {
        panic!("fixture parses");
    };
    let mut state = seed ^ (round as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut forge = |hello: &mut Vec<u8>, what: &[u8]| -> Vec<u8> {
        let fake: Vec<u8> = (0..what.len())
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect();
        let at = hello
            .windows(what.len())
            .position(|w| w == what)
            .expect("value in the hello");
        hello[at..at + what.len()].copy_from_slice(&fake);
        fake
    };
    let mut forged = Vec::new();
    if !info.session_id.is_empty() && info.psk_identities.is_empty() {
        forged.push((KeyKind::SessionId, forge(&mut hello, &info.session_id)));
    }
    if let Some(t) = &info.ticket {
        forged.push((KeyKind::Ticket, forge(&mut hello, t)));
    }
    for id in &info.psk_identities {
        forged.push((KeyKind::Psk, forge(&mut hello, id)));
    }
    (hello, forged)
}

/// Forged sessions cost the backends at most one handshake per connection plus the
/// budget per second, and create no entries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_session_flood_is_bounded_by_the_budget() {
    /// Forged connections in the flood.
    const FLOOD: usize = 120;
    /// Extra handshakes per second allowed in this test.
    const BUDGET: u32 = 5;
    /// Connections in flight at once.
    const PARALLEL: usize = 8;
    let ca = TestCa::new("flood CA").unwrap();
    let mut keep = Vec::new();
    let mut list = Vec::new();
    for i in 0..3 {
        let tls = BackendTls {
            versions: Versions::Both,
            tickets: true,
        };
        let b = TlsBackend::start(
            &ca,
            &format!("f{i}"),
            &[tls::SNI],
            tls,
            "127.0.0.1:0".parse().unwrap(),
        )
        .await
        .unwrap();
        list.push((b.name.clone(), b.addr));
        keep.push(b);
    }
    let yaml = format!(
        "admin: {{ enabled: false }}\nconfirm_budget: {BUDGET}\nservices:\n  puppet:\n    listen: [\"127.0.0.1:0\"]\n    \
         health: {{ check: none }}\n    \
         stick: {{ on: [session_id, ticket, psk], probe_interval: 0s }}\n    backends:\n{}",
        tls::backends_yaml(&list)
    );
    let xb = Crossbar::start(&yaml).await;
    let addr = xb.addr("puppet");
    let accepted = |k: &[TlsBackend]| -> u64 {
        k.iter()
            .map(|b| {
                b.stats
                    .connections
                    .load(std::sync::atomic::Ordering::Relaxed)
            })
            .sum()
    };
    let before = accepted(&keep);
    let started = Instant::now();
    let mut all_forged = Vec::new();
    for wave in 0..FLOOD / PARALLEL {
        let mut tasks = Vec::new();
        for k in 0..PARALLEL {
            let (hello, forged) = forged_hello(wave * PARALLEL + k, 0x5eed);
            all_forged.extend(forged);
            tasks.push(tokio::spawn(async move {
                let mut c = TcpStream::connect(addr).await?;
                c.write_all(&hello).await?;
                // The answer of one backend (a full handshake), then walk away.
                let mut buf = [0u8; 1];
                let n = tokio::time::timeout(Duration::from_secs(10), c.read(&mut buf)).await??;
                anyhow::ensure!(n == 1, "no answer");
                anyhow::Ok(())
            }));
        }
        for t in tasks {
            t.await.unwrap().unwrap();
        }
    }
    let secs = started.elapsed().as_secs_f64();
    // Backends accept the extra connections before crossbar's tasks end; each task
    // ended when its client got an answer, so every accept is counted by now.
    let cost = accepted(&keep) - before;
    let extra = xb.metric("crossbar_stick_confirm_extra_handshakes_total", &[]);
    let bound = FLOOD as f64 + f64::from(BUDGET) * (secs.ceil() + 1.0);
    println!(
        "flood: {FLOOD} forged hellos in {secs:.1} s cost the backends {cost} handshakes \
         ({extra} extra; bound {bound}); budget_empty {}",
        xb.metric(
            "crossbar_stick_confirm_total",
            &[("result", "budget_empty")]
        )
    );
    assert!(cost as f64 <= bound, "cost {cost} > bound {bound}");
    assert_eq!(
        cost as f64,
        FLOOD as f64 + extra,
        "every extra handshake is counted"
    );
    assert!(extra > 0.0, "the budget was used");
    let table = xb.service("puppet").unwrap().table.clone().unwrap();
    for (kind, raw) in &all_forged {
        let found = table.lookup(*kind, raw, str::to_string);
        assert_eq!(found, None, "forged {kind:?}");
        if raw.len() > 16 {
            let p = table.lookup(KeyKind::TicketPrefix, &raw[..16], str::to_string);
            assert_eq!(p, None, "forged prefix");
        }
    }
    for e in table.entries(1000) {
        assert!(
            matches!(e.kind, KeyKind::Source),
            "only the source hint of full handshakes may be there: {e:?}"
        );
    }
    xb.shutdown(Duration::from_secs(1)).await;
}
