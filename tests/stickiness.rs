//! Acceptance: stick tables keep resumed TLS sessions on the backend that holds them.
//!
//! Three TLS backends that share no session state (`openssl s_server` processes, or
//! rustls testbed backends), crossbar in front with `balance: roundrobin` and
//! `stick: { on: [session_id, ticket, psk] }` — no `source`: every client comes from
//! 127.0.0.1, the NAT case where source affinity can't be what keeps them sticky.
//! Per case and client/backend pair, `CLIENTS` clients first do one full handshake
//! each (in parallel), then `RESUMPTIONS` resumption attempts each (in parallel). An
//! attempt counts as kept only if the client's OWN flag says it resumed and the
//! backend that answered is the one of its full handshake.
//!
//! Run with `--nocapture` to see the figures table (the test output is the record).
mod common;

use common::{rustls_backends, tls, Crossbar};

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use crossbar::testbed::{self, BackendTls, TestCa, TlsBackend, Versions};

use tls::OpensslBackend;

/// Clients per run: a multiple of the 3 backends, so round robin spreads first
/// connections 3/3/3 and the 45 % bound below is meaningful.
const CLIENTS: usize = 9;
/// Resumption attempts per client after its full handshake.
const RESUMPTIONS: usize = 20;
/// Share of resumption attempts that must resume on the first backend.
const TARGET: f64 = 0.99;
/// Largest share of first connections one backend may get.
const MAX_SPREAD_SHARE: f64 = 0.45;
/// Bound on one rustls request through crossbar.
const RUSTLS_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Case {
    /// TLS 1.2, session IDs only (no tickets on either side).
    SessionId,
    /// TLS 1.2 with RFC 5077 session tickets.
    Tls12Ticket,
    /// TLS 1.3 PSK resumption with tickets.
    Tls13,
}

impl Case {
    fn label(self) -> &'static str {
        match self {
            Case::SessionId => "TLS 1.2 session ID",
            Case::Tls12Ticket => "TLS 1.2 ticket",
            Case::Tls13 => "TLS 1.3 PSK/ticket",
        }
    }
    fn s_client_args(self) -> &'static [&'static str] {
        match self {
            Case::SessionId => &["-tls1_2", "-no_ticket"],
            Case::Tls12Ticket => &["-tls1_2"],
            Case::Tls13 => &["-tls1_3"],
        }
    }
    fn s_server_args(self) -> &'static [&'static str] {
        match self {
            Case::SessionId => &["-no_ticket"],
            _ => &[],
        }
    }
    fn rustls_backend(self) -> BackendTls {
        match self {
            Case::SessionId => BackendTls {
                versions: Versions::Tls12,
                tickets: false,
            },
            Case::Tls12Ticket => BackendTls {
                versions: Versions::Tls12,
                tickets: true,
            },
            Case::Tls13 => BackendTls {
                versions: Versions::Tls13,
                tickets: true,
            },
        }
    }
    fn rustls_client(self) -> (Versions, bool) {
        match self {
            Case::SessionId => (Versions::Tls12, false),
            Case::Tls12Ticket => (Versions::Tls12, true),
            Case::Tls13 => (Versions::Tls13, true),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Peer {
    Openssl,
    Rustls,
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Peer::Openssl => "openssl",
            Peer::Rustls => "rustls",
        })
    }
}

/// Backends of one run: kept alive (and killed on drop) for the run's duration.
enum Backends {
    Openssl(Vec<OpensslBackend>),
    Rustls(Vec<TlsBackend>),
}

impl Backends {
    async fn start(ca: &TestCa, kind: Peer, case: Case, tag: &str) -> Result<Backends> {
        let names: Vec<String> = (1..=3).map(|i| format!("{tag}-{kind}{i}")).collect();
        Ok(match kind {
            Peer::Openssl => {
                let mut v = Vec::new();
                for n in &names {
                    v.push(OpensslBackend::start(ca, n, case.s_server_args())?);
                }
                Backends::Openssl(v)
            }
            Peer::Rustls => {
                Backends::Rustls(rustls_backends(ca, &names, case.rustls_backend()).await?)
            }
        })
    }

    fn list(&self) -> Vec<(String, SocketAddr)> {
        match self {
            Backends::Openssl(v) => v.iter().map(|b| (b.name.clone(), b.addr)).collect(),
            Backends::Rustls(v) => v.iter().map(|b| (b.name.clone(), b.addr)).collect(),
        }
    }
}

/// One client's history: the backend of its full handshake, then each attempt.
#[derive(Debug, Default)]
struct History {
    first: String,
    first_resumed: bool,
    attempts: Vec<(bool, String)>,
}

/// The figures of one run (one row of the table).
#[derive(Debug)]
struct Row {
    case: Case,
    client: Peer,
    server: Peer,
    spread: BTreeMap<String, usize>,
    attempts: usize,
    kept: usize,
    resumed_elsewhere: usize,
    full: usize,
    secs: f64,
    failures: Vec<String>,
}

impl Row {
    fn kept_share(&self) -> f64 {
        self.kept as f64 / self.attempts.max(1) as f64
    }
    fn max_spread_share(&self) -> f64 {
        let max = self.spread.values().copied().max().unwrap_or(0);
        max as f64 / CLIENTS as f64
    }
    fn ok(&self) -> bool {
        self.failures.is_empty()
            && self.attempts == CLIENTS * RESUMPTIONS
            && self.kept_share() >= TARGET
            && self.max_spread_share() <= MAX_SPREAD_SHARE
    }
}

fn print_table(rows: &[Row]) {
    println!(
        "\n{:<20} {:<8} {:<8} {:>11} {:>8} {:>13} {:>10} {:>6} {:>6}  spread of first connections",
        "case",
        "client",
        "backend",
        "kept/tries",
        "kept %",
        "resumed else",
        "full hs",
        "secs",
        "ok"
    );
    for r in rows {
        let spread: Vec<String> = r.spread.values().map(|n| n.to_string()).collect();
        println!(
            "{:<20} {:<8} {:<8} {:>11} {:>7.1}% {:>13} {:>10} {:>6.1} {:>6}  {}",
            r.case.label(),
            r.client.to_string(),
            r.server.to_string(),
            format!("{}/{}", r.kept, r.attempts),
            100.0 * r.kept_share(),
            r.resumed_elsewhere,
            r.full,
            r.secs,
            if r.ok() { "yes" } else { "NO" },
            spread.join("/"),
        );
        for f in &r.failures {
            println!("    error: {f}");
        }
    }
}

/// Start the backends and crossbar in front of them.
async fn start_site(
    ca: &TestCa,
    case: Case,
    server: Peer,
    tag: &str,
) -> Result<(Backends, Crossbar, SocketAddr, Vec<String>)> {
    let backends = Backends::start(ca, server, case, tag).await?;
    let list = backends.list();
    let yaml = format!(
        "admin: {{ enabled: false }}\nservices:\n  puppet:\n    listen: [\"127.0.0.1:0\"]\n    balance: roundrobin\n    \
         health: {{ check: none }}\n    \
         stick: {{ on: [session_id, ticket, psk], size: 10000, expire: 30m }}\n    \
         backends:\n{}",
        tls::backends_yaml(&list)
    );
    let xb = Crossbar::try_start(&yaml).await?;
    let addr = xb.addr("puppet");
    let names = list.into_iter().map(|(n, _)| n).collect();
    Ok((backends, xb, addr, names))
}

/// Phase 1 (all clients' full handshakes, in parallel) then phase 2 (every client's
/// resumptions, clients in parallel) with `openssl s_client` ([`tls::openssl_agents`]).
async fn openssl_clients(case: Case, addr: SocketAddr, names: &[String]) -> Result<Vec<History>> {
    let args = case.s_client_args();
    let agents = tls::openssl_agents(&[addr], args, names, CLIENTS, RESUMPTIONS, false).await?;
    let mut hist = Vec::new();
    for runs in agents {
        let mut runs = runs.into_iter();
        let first = runs.next().context("no full handshake")??;
        let attempts = runs
            .map(|r| r.map(|run| (run.reused, run.backend)))
            .collect::<Result<Vec<_>>>()?;
        hist.push(History {
            first: first.backend,
            first_resumed: first.reused,
            attempts,
        });
    }
    Ok(hist)
}

/// The same two phases with rustls clients, each with its own session cache.
async fn rustls_clients(ca: &TestCa, case: Case, addr: SocketAddr) -> Result<Vec<History>> {
    let (versions, tickets) = case.rustls_client();
    let cfgs: Vec<_> = (0..CLIENTS)
        .map(|_| testbed::client_config(ca, versions, tickets))
        .collect::<Result<_>>()?;
    let get = move |cfg: Arc<rustls::ClientConfig>| async move {
        tokio::time::timeout(RUSTLS_TIMEOUT, testbed::get(addr, tls::SNI, cfg, "/who"))
            .await
            .context("rustls request timed out")?
    };
    let mut first = Vec::new();
    for cfg in &cfgs {
        first.push(tokio::spawn(get(cfg.clone())));
    }
    let mut hist = Vec::new();
    for h in first {
        let r = h.await??;
        hist.push(History {
            first: r.backend,
            first_resumed: r.resumed,
            attempts: Vec::new(),
        });
    }
    let mut tasks = Vec::new();
    for cfg in &cfgs {
        let cfg = cfg.clone();
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::new();
            for _ in 0..RESUMPTIONS {
                let r = get(cfg.clone()).await?;
                out.push((r.resumed, r.backend));
            }
            anyhow::Ok(out)
        }));
    }
    for (h, t) in hist.iter_mut().zip(tasks) {
        h.attempts = t.await??;
    }
    Ok(hist)
}

async fn run(ca: &TestCa, case: Case, client: Peer, server: Peer) -> Row {
    let started = Instant::now();
    let tag = format!("{case:?}").to_lowercase();
    let mut row = Row {
        case,
        client,
        server,
        spread: BTreeMap::new(),
        attempts: 0,
        kept: 0,
        resumed_elsewhere: 0,
        full: 0,
        secs: 0.0,
        failures: Vec::new(),
    };
    let outcome = async {
        let (backends, xb, addr, names) = start_site(ca, case, server, &tag).await?;
        for n in &names {
            row.spread.insert(n.clone(), 0);
        }
        let hist = match client {
            Peer::Openssl => openssl_clients(case, addr, &names).await?,
            Peer::Rustls => rustls_clients(ca, case, addr).await?,
        };
        xb.shutdown(Duration::from_secs(1)).await;
        drop(backends);
        anyhow::Ok(hist)
    }
    .await;
    row.secs = started.elapsed().as_secs_f64();
    match outcome {
        Err(e) => row.failures.push(format!("{e:#}")),
        Ok(hist) => {
            for h in hist {
                *row.spread.entry(h.first.clone()).or_default() += 1;
                if h.first_resumed {
                    row.failures
                        .push("a first connection claimed to resume".into());
                }
                for (resumed, backend) in h.attempts {
                    row.attempts += 1;
                    match (resumed, backend == h.first) {
                        (true, true) => row.kept += 1,
                        (true, false) => row.resumed_elsewhere += 1,
                        (false, _) => row.full += 1,
                    }
                }
            }
        }
    }
    row
}

/// Every client/backend pair of one case, concurrently; prints the rows; asserts.
async fn case(case: Case) {
    // `RUST_LOG=crossbar=debug` shows the access log (stick, stick_result, handshake).
    let filter = tracing_subscriber::EnvFilter::from_default_env();
    // Fails only when another test of this binary installed it first.
    let _ = tracing_subscriber::fmt() // ok: see above
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
    let ca = TestCa::new("stickiness test CA").expect("CA");
    let pairs = [
        (Peer::Openssl, Peer::Openssl),
        (Peer::Rustls, Peer::Rustls),
        (Peer::Openssl, Peer::Rustls),
        (Peer::Rustls, Peer::Openssl),
    ];
    let runs = pairs.map(|(c, s)| run(&ca, case, c, s));
    let [a, b, c, d] = runs;
    let (a, b, c, d) = tokio::join!(a, b, c, d);
    let rows = vec![a, b, c, d];
    print_table(&rows);
    let bad: Vec<String> = rows
        .iter()
        .filter(|r| !r.ok())
        .map(|r| {
            format!(
                "{} {} client -> {} backends: kept {}/{} ({:.1}%, target {:.0}%), largest first-connection share {:.0}% (max {:.0}%) {:?}",
                r.case.label(),
                r.client,
                r.server,
                r.kept,
                r.attempts,
                100.0 * r.kept_share(),
                100.0 * TARGET,
                100.0 * r.max_spread_share(),
                100.0 * MAX_SPREAD_SHARE,
                r.failures
            )
        })
        .collect();
    assert!(bad.is_empty(), "missed the target:\n{}", bad.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls12_session_ids_stick() {
    case(Case::SessionId).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls12_tickets_stick() {
    case(Case::Tls12Ticket).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls13_psk_sticks() {
    case(Case::Tls13).await;
}

/// Without confirmation (`confirm: false`, or `confirm_budget` spent)
/// resumptions the table can't place followed the source hint, and behind one NAT
/// address that herded every agent onto the backend of the last full handshake
/// (bench/confirm.sh: busiest backend 100 %). Here 24 TLS 1.3 agents behind
/// 127.0.0.1 resume with single-use stateful tickets (no key name: every resumption
/// is unknown to the table, as after a restart), 4 rounds: the busiest backend
/// answers at most 45 % of them. Beside them 6 TLS 1.2 agents resume by session ID,
/// which the table knows: every one of their resumptions stays on its backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unplaced_resumptions_spread_without_confirmation() {
    const COLD: usize = 24;
    const KNOWN: usize = 6;
    const ROUNDS: usize = 4;
    let ca = TestCa::new("herding CA").unwrap();
    let mut backends = Vec::new();
    for name in ["b1", "b2", "b3"] {
        let tls = BackendTls {
            versions: Versions::Both,
            tickets: false,
        };
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        backends.push(
            TlsBackend::start(&ca, name, &[tls::SNI], tls, any)
                .await
                .unwrap(),
        );
    }
    let list: Vec<_> = backends.iter().map(|b| (b.name.clone(), b.addr)).collect();
    let yaml = format!(
        "admin: {{ enabled: false }}\nservices:\n  puppet:\n    listen: [\"127.0.0.1:0\"]\n    balance: roundrobin\n    \
         health: {{ check: none }}\n    \
         stick: {{ on: [session_id, ticket, psk], confirm: false, probe_interval: 0s }}\n    \
         backends:\n{}",
        tls::backends_yaml(&list)
    );
    let xb = Crossbar::start(&yaml).await;
    let addr = xb.addr("puppet");
    let get = |cfg: Arc<rustls::ClientConfig>| async move {
        tokio::time::timeout(RUSTLS_TIMEOUT, testbed::get(addr, tls::SNI, cfg, "/who"))
            .await
            .expect("a request through crossbar timed out")
            .expect("a request through crossbar")
    };
    let cold: Vec<_> = (0..COLD)
        .map(|_| testbed::client_config(&ca, Versions::Tls13, false).unwrap())
        .collect();
    let known: Vec<_> = (0..KNOWN)
        .map(|_| testbed::client_config(&ca, Versions::Tls12, false).unwrap())
        .collect();
    let mut homes = Vec::new();
    for cfg in &known {
        homes.push(get(cfg.clone()).await.backend);
    }
    for cfg in &cold {
        get(cfg.clone()).await;
    }
    let mut answered: BTreeMap<String, usize> = BTreeMap::new();
    let mut resumed = 0;
    for _ in 0..ROUNDS {
        for (i, cfg) in cold.iter().enumerate() {
            let r = get(cfg.clone()).await;
            resumed += usize::from(r.resumed);
            *answered.entry(r.backend).or_default() += 1;
            // The known agents resume in between, from the same address.
            if i % (COLD / KNOWN) == 0 {
                let k = i / (COLD / KNOWN);
                let r = get(known[k].clone()).await;
                assert!(
                    r.resumed && r.backend == homes[k],
                    "a session the table knows moved: {r:?}, home {}",
                    homes[k]
                );
            }
        }
    }
    let total = COLD * ROUNDS;
    let busiest = answered.values().copied().max().unwrap_or(0);
    println!(
        "confirm: false, {COLD} agents behind one address x {ROUNDS} rounds: answered by {answered:?} \
         (busiest {:.0} %), {resumed}/{total} resumed",
        100.0 * busiest as f64 / total as f64
    );
    assert!(
        busiest as f64 <= MAX_SPREAD_SHARE * total as f64,
        "herded: {answered:?}"
    );
}
