//! A faulty network between every hop: through crossbar must equal direct.
//!
//! The namespace lab (tests/common/netns.rs) with faulty cables (tests/common/wire.rs,
//! netem's fault model) on the client's link and the backend host's link; crossbar
//! runs on node A with splice and on node B with `CROSSBAR_NO_SPLICE=1` (the copy
//! path). Under each fault, the same work runs at the same time over three paths:
//! directly from the client to the backend (crossing both faulty cables), through
//! node A and through node B (crossing the same two cables):
//!
//! - TLS agents (rustls; TLS 1.2 session ID, TLS 1.2 ticket, TLS 1.3) do a full
//!   handshake and resume; kept = the client's own flag says resumed, on the backend
//!   of its full handshake; ≥ 99 % on every path;
//! - bulk echoes: every byte back (length and SHA-256), a clean end;
//! - endings: the backend half-closes and keeps reading, the backend resets, the
//!   client resets: the bytes and the ending (EOF or reset) each peer sees must be
//!   those of the direct twin.
//!
//! After each fault, no connection may stay open in either crossbar; at the end its
//! RSS must be back near the level after the fault-free round. `CROSSBAR_NETEM_FULL=1`
//! runs the full matrix (each fault on the client link, the backend link and both;
//! echoes up to 64 MiB); the default set is the faults on both links with smaller
//! sizes. Run with `--nocapture` for the figures (docs/security.md quotes them).
#![allow(unsafe_code)] // one ioctl that reads a socket's send queue

mod common;

use std::collections::HashMap;
use std::io::ErrorKind;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use common::ending::{read_all, seen, Seen};
use common::netns::{self, Faults, Host, Lab, LabProcess, BACKEND_IPS, LAB_WAIT};
use common::{hex, payload, within};
use crossbar::testbed::{self, BackendTls, TestCa, TlsBackend, Versions};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};

/// The admin endpoint on each node.
const ADMIN: &str = "127.0.0.1:9140";
/// `mode: tcp` echo service.
const ECHO_PORT: u16 = 7000;
/// `mode: tcp` services whose backend ends as [`End`] says.
const END_PORTS: [(End, u16); 3] = [
    (End::BackendFin, 7101),
    (End::BackendReset, 7102),
    (End::ClientReset, 7103),
];
/// TLS services, one per resumption mode.
const TLS_PORTS: [(Mode, u16); 3] = [
    (Mode::SessionId, 8141),
    (Mode::Ticket12, 8142),
    (Mode::Tls13, 8143),
];
/// Share of resumptions that must land on the agent's first backend.
const TARGET: f64 = 0.99;
/// How long the cable stays pulled in the outage round.
const OUTAGE: Duration = Duration::from_secs(3);
/// RSS crossbar may hold above its level after the fault-free round once every
/// connection is gone: the allocator keeps some freed pages; a buffer kept per
/// connection (16 KiB x the hundreds relayed) or per byte would exceed it.
const RSS_SLACK_KIB: u64 = 8 * 1024;
/// TCP keepalive of every test peer and of crossbar: a reset lost on the wire is
/// found by the next probe (as a real agent's would be, only sooner), on every path
/// alike, instead of leaving a reader waiting forever.
const KEEPALIVE: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Mode {
    SessionId,
    Ticket12,
    Tls13,
}

impl Mode {
    fn backend(self) -> BackendTls {
        let (versions, tickets) = self.client();
        BackendTls { versions, tickets }
    }
    fn client(self) -> (Versions, bool) {
        match self {
            Mode::SessionId => (Versions::Tls12, false),
            Mode::Ticket12 => (Versions::Tls12, true),
            Mode::Tls13 => (Versions::Tls13, true),
        }
    }
}

/// How an exchange of the endings part ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum End {
    /// The backend echoes, half-closes, and reads the rest of the upload.
    BackendFin,
    /// The backend echoes, then resets (SO_LINGER 0).
    BackendReset,
    /// The client uploads, then resets.
    ClientReset,
}

/// Where a connection goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Path {
    /// Straight to the backend.
    Direct,
    /// Through node A's crossbar (splice for bulk directions).
    Splice,
    /// Through node B's crossbar (`CROSSBAR_NO_SPLICE=1`: the copy path only).
    Copy,
}

const PATHS: [Path; 3] = [Path::Direct, Path::Splice, Path::Copy];

impl Path {
    /// The address for `port`, reaching backend `be` when direct.
    fn addr(self, port: u16, be: usize) -> SocketAddr {
        let ip = match self {
            Path::Direct => BACKEND_IPS[be % BACKEND_IPS.len()],
            Path::Splice => Host::NodeA.ip(),
            Path::Copy => Host::NodeB.ip(),
        };
        SocketAddr::new(IpAddr::V4(ip), port)
    }
    fn index(self) -> u32 {
        self as u32
    }
}

/// What one peer received and how its stream ended.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Observed {
    received: usize,
    sha: String,
    end: Seen,
}

// ---------------------------------------------------------------------------
// The rounds

/// One fault and the work done under it.
#[derive(Debug, Clone)]
struct Round {
    name: String,
    client_link: Faults,
    backend_link: Faults,
    /// Pull both cables for [`OUTAGE`] once every bulk echo is half-way.
    outage: bool,
    bulk: Vec<usize>,
    /// Echo sizes of the endings part (the upload is 2x + 100 KB).
    ending_sizes: Vec<usize>,
    agents: usize,
    resumptions: usize,
}

const KIB: usize = 1024;
const MIB: usize = 1024 * 1024;

fn rounds(full: bool) -> Vec<Round> {
    let ms = Duration::from_millis;
    let f = Faults::default();
    let faults: Vec<(&str, Faults, bool)> = vec![
        ("loss 1%", Faults { loss: 0.01, ..f }, false),
        ("loss 5%", Faults { loss: 0.05, ..f }, false),
        (
            "reorder 25% (delay 10ms)",
            Faults {
                reorder: 0.25,
                delay: ms(10),
                ..f
            },
            false,
        ),
        (
            "duplicate 5%",
            Faults {
                duplicate: 0.05,
                ..f
            },
            false,
        ),
        (
            "delay 50ms ± 20ms",
            Faults {
                delay: ms(50),
                jitter: ms(20),
                ..f
            },
            false,
        ),
        (
            "rate 1 Mbit/s",
            Faults {
                rate_bps: 1_000_000,
                ..f
            },
            false,
        ),
        ("link down 3 s mid-transfer", f, true),
    ];
    let mut out = vec![Round {
        name: "none (baseline)".into(),
        client_link: f,
        backend_link: f,
        outage: false,
        bulk: vec![MIB, 16 * MIB, 64 * MIB],
        ending_sizes: vec![1000, 256 * KIB],
        agents: 3,
        resumptions: if full { 10 } else { 4 },
    }];
    for (name, fault, outage) in faults {
        let slow = fault.rate_bps > 0 || !fault.delay.is_zero();
        let bulk = match (full, fault.rate_bps > 0, slow) {
            (false, true, _) => vec![64 * KIB],
            (true, true, _) => vec![64 * KIB, MIB],
            (false, _, true) => vec![MIB],
            (true, _, true) => vec![MIB, 8 * MIB],
            (false, _, false) => vec![MIB, 16 * MIB],
            (true, _, false) => vec![MIB, 16 * MIB, 64 * MIB],
        };
        let ending_sizes = match fault.rate_bps > 0 {
            true => vec![1000],
            false => vec![1000, 256 * KIB],
        };
        let legs: Vec<(&str, Faults, Faults)> = if full && !outage {
            vec![
                ("client link", fault, f),
                ("backend link", f, fault),
                ("both links", fault, fault),
            ]
        } else {
            vec![("both links", fault, fault)]
        };
        for (leg, c, b) in legs {
            out.push(Round {
                name: format!("{name}, {leg}"),
                client_link: c,
                backend_link: b,
                outage,
                bulk: bulk.clone(),
                ending_sizes: ending_sizes.clone(),
                agents: 3,
                resumptions: if full { 10 } else { 4 },
            });
        }
    }
    out
}

// ---------------------------------------------------------------------------
// The test

#[test]
fn through_crossbar_equals_direct_on_a_faulty_network() {
    lab_tools();
    let full = std::env::var("CROSSBAR_NETEM_FULL").as_deref() == Ok("1");
    let started = Instant::now();
    let lab = Lab::with_wires(&[Host::Client, Host::Backends]).expect("lab");
    let ca = Arc::new(TestCa::new("crossbar netem test CA").expect("CA"));
    let (reports_tx, reports_rx) = mpsc::unbounded_channel();
    let _servers = start_backends(&lab, ca.clone(), reports_tx);
    let cfg = lab.dir.path().join("crossbar.yaml");
    std::fs::write(&cfg, node_yaml()).expect("config");
    let nodes = [
        start_node(&lab, Host::NodeA, &cfg, false),
        start_node(&lab, Host::NodeB, &cfg, true),
    ];
    let reports = Arc::new(tokio::sync::Mutex::new(reports_rx));

    let mut problems = Vec::new();
    let mut totals = Totals::default();
    let mut idle_rss = None;
    println!(
        "{:<36} {:>6} {:>11} {:>9} {:>8} {:>6}",
        "fault", "conns", "bytes", "resumed", "kept %", "secs"
    );
    for round in rounds(full) {
        let t0 = Instant::now();
        lab.faults(Host::Client, round.client_link).expect("faults");
        lab.faults(Host::Backends, round.backend_link)
            .expect("faults");
        let outcome = run_round(&lab, &round, &ca, &reports);
        lab.faults(Host::Client, Faults::default()).expect("faults");
        lab.faults(Host::Backends, Faults::default())
            .expect("faults");
        let mut found = judge(&round, &outcome);
        for node in [Host::NodeA, Host::NodeB] {
            if let Err(e) = no_connections_left(&lab, node) {
                found.push(format!("{node:?}: {e}"));
            }
        }
        let secs = t0.elapsed().as_secs_f64();
        println!(
            "{:<36} {:>6} {:>11} {:>9} {:>8.1} {:>6.1}",
            round.name,
            outcome.connections,
            outcome.bytes,
            format!("{}/{}", outcome.kept(), outcome.attempts()),
            100.0 * outcome.kept() as f64 / outcome.attempts().max(1) as f64,
            secs
        );
        for p in &found {
            println!("  DIFFERS: {p}");
        }
        totals.add(&outcome);
        problems.extend(found.into_iter().map(|p| format!("{}: {p}", round.name)));
        if idle_rss.is_none() {
            idle_rss = Some(nodes.each_ref().map(|n| rss_kib(n.pid())));
        }
        if !problems.is_empty() {
            break; // the differences are the finding; the next faults add only time
        }
    }
    let after = nodes.each_ref().map(|n| rss_kib(n.pid()));
    let idle = idle_rss.unwrap_or(after);
    for (i, node) in ["A (splice)", "B (copy)"].iter().enumerate() {
        println!(
            "crossbar {node}: RSS {} KiB after the fault-free round, {} KiB at the end",
            idle[i], after[i]
        );
        if after[i] > idle[i] + RSS_SLACK_KIB {
            problems.push(format!(
                "crossbar {node}: RSS {} KiB at the end, {} KiB after the fault-free round",
                after[i], idle[i]
            ));
        }
    }
    println!(
        "{} rounds ({}), {} connections, {} bytes echoed, resumptions kept {}/{} ({:.1} %), {:.0} s",
        totals.rounds,
        if full { "full matrix" } else { "default set" },
        totals.connections,
        totals.bytes,
        totals.kept,
        totals.attempts,
        100.0 * totals.kept as f64 / totals.attempts.max(1) as f64,
        started.elapsed().as_secs_f64()
    );
    for n in &nodes {
        let log = n.log_text();
        let panicked = log.lines().any(|l| l.contains("panicked"));
        assert!(!panicked, "crossbar {} panicked:\n{log}", n.name);
    }
    assert!(
        problems.is_empty(),
        "through crossbar differs from direct:\n{}",
        problems.join("\n")
    );
}

fn lab_tools() {
    let missing: Vec<&str> = ["ip", "curl"]
        .into_iter()
        .filter(|t| !netns::have(t))
        .collect();
    let usable = netns::usable();
    let tun = std::path::Path::new("/dev/net/tun").exists();
    if !missing.is_empty() || usable.is_err() || !tun {
        crossbar::testbed::missing_tool(
            "netem lab",
            &format!("missing {missing:?}; namespaces: {usable:?}; /dev/net/tun: {tun}"),
        );
    }
}

#[derive(Default)]
struct Totals {
    rounds: usize,
    connections: usize,
    bytes: u64,
    kept: usize,
    attempts: usize,
}

impl Totals {
    fn add(&mut self, o: &Outcome) {
        self.rounds += 1;
        self.connections += o.connections;
        self.bytes += o.bytes;
        self.kept += o.kept();
        self.attempts += o.attempts();
    }
}

// ---------------------------------------------------------------------------
// The lab's parts

fn node_yaml() -> String {
    let one = |port: u16| {
        format!(
            "      - {{ name: be0, address: \"{}:{port}\" }}\n",
            BACKEND_IPS[0]
        )
    };
    let three = |port: u16| -> String {
        BACKEND_IPS
            .iter()
            .enumerate()
            .map(|(i, ip)| format!("      - {{ name: be{i}, address: \"{ip}:{port}\" }}\n"))
            .collect()
    };
    let k = KEEPALIVE.as_secs();
    // Health checks off and generous handshake timeouts: the oracle is the relay;
    // a check or a timeout failing on a lossy link would make crossbar refuse what
    // the direct path waits out, by the operator's choice, not by a relay fault.
    let mut y = format!(
        "admin: {{ listen: \"{ADMIN}\" }}\n\
         defaults:\n  health: {{ check: none }}\n  \
         timeouts: {{ client_hello: 60s, connect: 60s, server_hello: 60s }}\n  \
         keepalive: {{ time: {k}s, interval: {k}s, probes: 30 }}\n\
         services:\n  echo:\n    mode: tcp\n    listen: [\"0.0.0.0:{ECHO_PORT}\"]\n    backends:\n{}",
        one(ECHO_PORT)
    );
    for (end, port) in END_PORTS {
        y += &format!(
            "  end{port}:  # {end:?}\n    mode: tcp\n    listen: [\"0.0.0.0:{port}\"]\n    backends:\n{}",
            one(port)
        );
    }
    for (_, port) in TLS_PORTS {
        y += &format!(
            "  tls{port}:\n    listen: [\"0.0.0.0:{port}\"]\n    balance: roundrobin\n    \
             stick: {{ on: [session_id, ticket, psk] }}\n    \
             backends:\n{}",
            three(port)
        );
    }
    y
}

/// Every backend on the backend host: the rustls TLS backends (`be0..be2` per
/// mode), the echo and the ending scripts; returns once all listen.
fn start_backends(
    lab: &Lab,
    ca: Arc<TestCa>,
    reports: mpsc::UnboundedSender<(u64, Observed)>,
) -> netns::Served {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let served = lab.serve_in(Host::Backends, move || async move {
        let mut tls = Vec::new();
        for (mode, port) in TLS_PORTS {
            for (i, ip) in BACKEND_IPS.iter().enumerate() {
                let bind = SocketAddr::new(IpAddr::V4(*ip), port);
                let b =
                    TlsBackend::start(&ca, &format!("be{i}"), &[common::SNI], mode.backend(), bind)
                        .await
                        .expect("TLS backend");
                tls.push(b);
            }
        }
        let echo = TcpListener::bind((BACKEND_IPS[0], ECHO_PORT))
            .await
            .expect("bind echo");
        tokio::spawn(serve(echo, None, reports.clone()));
        for (end, port) in END_PORTS {
            let l = TcpListener::bind((BACKEND_IPS[0], port))
                .await
                .expect("bind");
            tokio::spawn(serve(l, Some(end), reports.clone()));
        }
        let _ = ready_tx.send(()); // ok: the test waits for it below
        std::future::pending::<()>().await;
        drop(tls);
    });
    ready_rx
        .recv_timeout(LAB_WAIT)
        .expect("backends never started");
    served
}

/// Accept forever; echo (`None`) or run the ending script.
async fn serve(l: TcpListener, end: Option<End>, reports: mpsc::UnboundedSender<(u64, Observed)>) {
    loop {
        let Ok((s, _)) = l.accept().await else {
            continue;
        };
        keepalive(&s);
        let reports = reports.clone();
        tokio::spawn(async move {
            match end {
                None => echo(s).await,
                Some(end) => {
                    if let Some(r) = ending_script(s, end).await {
                        let _ = reports.send(r); // ok: the test may have failed already
                    }
                }
            }
        });
    }
}

async fn echo(mut s: TcpStream) {
    let (mut r, mut w) = s.split();
    if tokio::io::copy(&mut r, &mut w).await.is_ok() {
        let _ = w.shutdown().await; // ok: the client's view is what's checked
    }
}

/// Every ending exchange opens with a header: (its id, the echo length), 8 bytes
/// each, big-endian; they count as part of the upload.
const HEADER: usize = 16;

/// Run `end` on `s`; what the backend saw, with the exchange's id (whatever
/// happens after the header: an early end is what the twins compare).
async fn ending_script(mut s: TcpStream, end: End) -> Option<(u64, Observed)> {
    let mut head = [0u8; HEADER];
    s.read_exact(&mut head).await.ok()?;
    let id = u64::from_be_bytes(head[..8].try_into().ok()?);
    let echo_len = u64::from_be_bytes(head[8..].try_into().ok()?) as usize;
    let mut got = head.to_vec();
    let end_seen = match end {
        End::ClientReset => rest_of_upload(&mut s, &mut got).await,
        _ => match echo_part(&mut s, &mut got, echo_len).await {
            Err(seen) => seen,
            Ok(()) if end == End::BackendFin => match s.shutdown().await {
                Err(e) => seen(Ok(()), Err(e.kind())),
                Ok(()) => rest_of_upload(&mut s, &mut got).await,
            },
            Ok(()) => {
                sent_and_acked(&s).await;
                set_reset_on_close(&s);
                Seen::Eof
            }
        },
    };
    Some((id, ending_observed(&got, end_seen)))
}

/// Echo the upload until `got` holds `echo_len` bytes; how it ended if early.
async fn echo_part(s: &mut TcpStream, got: &mut Vec<u8>, echo_len: usize) -> Result<(), Seen> {
    s.write_all(got)
        .await
        .map_err(|e| seen(Ok(()), Err(e.kind())))?;
    let mut buf = vec![0u8; 64 * 1024];
    while got.len() < echo_len {
        let want = buf.len().min(echo_len - got.len());
        let n = match s.read(&mut buf[..want]).await {
            Ok(0) => return Err(Seen::Eof),
            Ok(n) => n,
            Err(e) => return Err(seen(Err(e.kind()), Ok(()))),
        };
        s.write_all(&buf[..n])
            .await
            .map_err(|e| seen(Ok(()), Err(e.kind())))?;
        got.extend_from_slice(&buf[..n]);
    }
    Ok(())
}

/// Read the rest of the upload into `got`; how it ended.
async fn rest_of_upload(s: &mut TcpStream, got: &mut Vec<u8>) -> Seen {
    let (rest, read) = read_all(s).await;
    got.extend_from_slice(&rest);
    seen(read, Ok(()))
}

static STARTS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Start crossbar on `node` (`copy`: without splice); waits until /healthz answers.
fn start_node(lab: &Lab, node: Host, cfg: &std::path::Path, copy: bool) -> LabProcess {
    let cfg = cfg.to_string_lossy().to_string();
    let splice = if copy {
        "CROSSBAR_NO_SPLICE=1"
    } else {
        "CROSSBAR_NO_SPLICE=0"
    };
    let n = STARTS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let p = lab
        .spawn(
            node,
            &format!("crossbar-{node:?}-{n}"),
            &[
                "env",
                splice,
                env!("CARGO_BIN_EXE_crossbar"),
                "run",
                "-c",
                &cfg,
            ],
            None,
        )
        .expect("start crossbar");
    let end = Instant::now() + LAB_WAIT;
    while admin_get(lab, node, "/healthz").is_err() {
        assert!(
            Instant::now() < end,
            "crossbar on {node:?} never became healthy:\n{}",
            p.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    p
}

/// `GET` an admin path on `node`; the body.
fn admin_get(lab: &Lab, node: Host, path: &str) -> anyhow::Result<String> {
    let url = format!("http://{ADMIN}{path}");
    let out = lab.output(node, &["curl", "-fsS", "-m", "5", &url])?;
    if !out.status.success() {
        anyhow::bail!("GET {path}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8(out.stdout)?)
}

/// Wait (bounded) until `node`'s crossbar holds no connection: every one ended
/// with its peers, none left open past its timeouts.
fn no_connections_left(lab: &Lab, node: Host) -> anyhow::Result<()> {
    let end = Instant::now() + LAB_WAIT;
    loop {
        let body = admin_get(lab, node, "/api/connections")?;
        let v: serde_json::Value = serde_json::from_str(&body)?;
        if v["total"].as_u64() == Some(0) {
            return Ok(());
        }
        if Instant::now() > end {
            anyhow::bail!("connections still open {LAB_WAIT:?} after the round: {body}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A process's resident set in KiB (`VmRSS` in /proc).
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------
// One round

/// What the client and the backend of one ending exchange saw (the client's is
/// `None` when it reset: the backend's view is the one that counts then).
type Views = (Option<Observed>, Option<Observed>);

/// Everything seen in one round, per path.
#[derive(Default)]
struct Outcome {
    /// (mode, path) -> (kept, attempts, errors).
    tls: HashMap<(Mode, Path), (usize, usize, Vec<String>)>,
    /// (size, path) -> what the client got back.
    bulk: HashMap<(usize, Path), Result<Observed, String>>,
    /// (end, size, path) -> (client's view, backend's view).
    endings: HashMap<(End, usize, Path), Views>,
    connections: usize,
    bytes: u64,
    /// Bulk echoes' expected results.
    expected: HashMap<usize, Observed>,
}

impl Outcome {
    fn kept(&self) -> usize {
        self.tls
            .iter()
            .filter(|((_, p), _)| *p != Path::Direct)
            .map(|(_, v)| v.0)
            .sum()
    }
    fn attempts(&self) -> usize {
        self.tls
            .iter()
            .filter(|((_, p), _)| *p != Path::Direct)
            .map(|(_, v)| v.1)
            .sum()
    }
}

/// Permits the pulled cable hands out: more than the round's waiters.
const EVERY_WAITER: usize = 1 << 20;

/// The outage's meeting point: bulk echoes report half-way; the cable is pulled
/// once all have, and their writers then send the second half into the outage;
/// TLS agents begin their resumptions, and ending exchanges go on after their
/// first 16 bytes, once the cable is pulled, so the outage hits every kind of work.
struct Gate {
    halfway: Mutex<usize>,
    arrived: Condvar,
    pulled: Semaphore,
}

fn run_round(
    lab: &Lab,
    round: &Round,
    ca: &Arc<TestCa>,
    reports: &Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<(u64, Observed)>>>,
) -> Outcome {
    let gate = round.outage.then(|| {
        Arc::new(Gate {
            halfway: Mutex::new(0),
            arrived: Condvar::new(),
            pulled: Semaphore::new(0),
        })
    });
    let transfers = round.bulk.len() * PATHS.len();
    std::thread::scope(|sc| {
        let work = {
            let (round, ca, reports, gate) =
                (round.clone(), ca.clone(), reports.clone(), gate.clone());
            sc.spawn(move || lab.block_in(Host::Client, move || workload(round, ca, reports, gate)))
        };
        if let Some(g) = &gate {
            let mut n = g.halfway.lock().unwrap_or_else(|p| p.into_inner());
            let end = Instant::now() + LAB_WAIT;
            while *n < transfers && Instant::now() < end {
                n = g
                    .arrived
                    .wait_timeout(n, Duration::from_millis(100))
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
            drop(n);
            let down = Faults {
                down: true,
                ..Faults::default()
            };
            lab.faults(Host::Client, down).expect("faults");
            lab.faults(Host::Backends, down).expect("faults");
            g.pulled.add_permits(EVERY_WAITER);
            std::thread::sleep(OUTAGE); // the fault itself, not a wait for readiness
            lab.faults(Host::Client, round.client_link).expect("faults");
            lab.faults(Host::Backends, round.backend_link)
                .expect("faults");
        }
        work.join().expect("workload thread")
    })
}

/// The round's work on the client host, all of it at once.
async fn workload(
    round: Round,
    ca: Arc<TestCa>,
    reports: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<(u64, Observed)>>>,
    gate: Option<Arc<Gate>>,
) -> Outcome {
    let mut out = Outcome::default();
    let mut tls = Vec::new();
    for (mode, port) in TLS_PORTS {
        for path in PATHS {
            let (ca, gate) = (ca.clone(), gate.clone());
            let (agents, resumptions) = (round.agents, round.resumptions);
            tls.push(tokio::spawn(async move {
                let run = agents_run(&ca, mode, path, port, (agents, resumptions), gate);
                ((mode, path), run.await)
            }));
        }
    }
    let mut bulk = Vec::new();
    for (i, size) in round.bulk.iter().copied().enumerate() {
        let data = Arc::new(payload(size, i as u64 + 1));
        out.expected.insert(size, observed(&data, Seen::Eof));
        for path in PATHS {
            let (data, gate) = (data.clone(), gate.clone());
            bulk.push(tokio::spawn(async move {
                (
                    (size, path),
                    bulk_echo(path.addr(ECHO_PORT, 0), &data, gate).await,
                )
            }));
        }
    }
    let mut endings = Vec::new();
    for (end, port) in END_PORTS {
        for (si, size) in round.ending_sizes.iter().copied().enumerate() {
            for path in PATHS {
                let id = (path.index() as u64) << 32 | (si as u64) << 8 | port as u64 & 0xff;
                let gate = gate.clone();
                endings.push(tokio::spawn(async move {
                    let client = ending_client(path.addr(port, 0), end, id, size, gate);
                    ((end, size, path), id, client.await)
                }));
            }
        }
    }
    for t in tls {
        let (k, v) = within("TLS agents", t).await.expect("TLS task");
        out.connections += v.1 + round.agents;
        out.tls.insert(k, v);
    }
    for t in bulk {
        let (k, v) = within("a bulk echo", t).await.expect("bulk task");
        out.connections += 1;
        if let Ok(o) = &v {
            out.bytes += 2 * o.received as u64;
        }
        out.bulk.insert(k, v);
    }
    let mut ids = HashMap::new();
    for t in endings {
        let (k, id, client) = within("an ending", t).await.expect("ending task");
        out.connections += 1;
        ids.insert(id, k);
        out.endings.insert(k, (client, None));
    }
    let mut rx = reports.lock().await;
    let mut missing = ids.len();
    while missing > 0 {
        // A backend that never reports (its exchange hung past every keepalive) is
        // left as `None`: a difference from its twin, or a hang on both paths.
        let Ok(Some((id, seen))) = tokio::time::timeout(common::WAIT, rx.recv()).await else {
            break;
        };
        if let Some(k) = ids.get(&id) {
            if let Some(e) = out.endings.get_mut(k) {
                if e.1.is_none() {
                    missing -= 1;
                }
                e.1 = Some(seen);
            }
        }
    }
    out
}

/// `agents` agents, each with its own session cache: a full handshake, then
/// `resumptions` more on the same address (with a gate: once the cable is pulled).
/// (kept, attempts, errors).
async fn agents_run(
    ca: &TestCa,
    mode: Mode,
    path: Path,
    port: u16,
    (agents, resumptions): (usize, usize),
    gate: Option<Arc<Gate>>,
) -> (usize, usize, Vec<String>) {
    let mut tasks = Vec::new();
    for a in 0..agents {
        let (versions, tickets) = mode.client();
        let cfg = testbed::client_config(ca, versions, tickets).expect("client config");
        let addr = path.addr(port, a);
        let gate = gate.clone();
        tasks.push(tokio::spawn(async move {
            let get = || async {
                let get = testbed::get(addr, common::SNI, cfg.clone(), "/who");
                match tokio::time::timeout(common::WAIT, get).await {
                    Ok(r) => r,
                    Err(_) => Err(anyhow::anyhow!("no answer within {:?}", common::WAIT)),
                }
            };
            let first = match get().await {
                Ok(r) => r.backend,
                Err(e) => return (0, Vec::from([format!("{addr} full handshake: {e:#}")])),
            };
            pulled(&gate).await;
            let (mut kept, mut errors) = (0, Vec::new());
            for _ in 0..resumptions {
                match get().await {
                    Ok(r) if r.resumed && r.backend == first => kept += 1,
                    Ok(r) => errors.push(format!("{addr}: {r:?}, first on {first}")),
                    Err(e) => errors.push(format!("{addr}: {e:#}")),
                }
            }
            (kept, errors)
        }));
    }
    let (mut kept, mut errors) = (0, Vec::new());
    for t in tasks {
        let (k, e) = t.await.expect("agent task");
        kept += k;
        errors.extend(e);
    }
    (kept, agents * resumptions, errors)
}

/// Upload `data` while reading the echo; with a gate, report half-way and send the
/// second half once the cable is pulled.
async fn bulk_echo(
    addr: SocketAddr,
    data: &[u8],
    gate: Option<Arc<Gate>>,
) -> Result<Observed, String> {
    let s = within("connect", TcpStream::connect(addr))
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    keepalive(&s);
    let (mut r, mut w) = s.into_split();
    let half = data.len() / 2;
    let write = async {
        w.write_all(&data[..half]).await.map_err(|e| e.kind())?;
        pulled(&gate).await;
        w.write_all(&data[half..]).await.map_err(|e| e.kind())?;
        w.shutdown().await.map_err(|e| e.kind())
    };
    let read = async {
        let mut h = Sha256::new();
        let (mut n, mut told) = (0, gate.is_none());
        let mut buf = vec![0u8; 64 * 1024];
        let end = loop {
            match r.read(&mut buf).await {
                Ok(0) => break Ok(()),
                Ok(k) => {
                    h.update(&buf[..k]);
                    n += k;
                }
                Err(e) => break Err(e.kind()),
            }
            if !told && n >= half {
                told = true;
                if let Some(g) = &gate {
                    *g.halfway.lock().unwrap_or_else(|p| p.into_inner()) += 1;
                    g.arrived.notify_all();
                }
            }
        };
        (n, hex(&h.finalize()), end)
    };
    let exchange = async { tokio::join!(write, read) };
    match tokio::time::timeout(common::WAIT, exchange).await {
        Ok((wrote, (n, sha, read))) => Ok(Observed {
            received: n,
            sha,
            end: seen(read, wrote),
        }),
        Err(_) => Err(format!("{addr}: no end within {:?}", common::WAIT)),
    }
}

/// Until the cable is pulled, in the outage round (at once otherwise).
async fn pulled(gate: &Option<Arc<Gate>>) {
    if let Some(g) = gate {
        if let Ok(permit) = within("the cable pulled", g.pulled.acquire()).await {
            permit.forget();
        }
    }
}

/// The client's part of an ending exchange; its view (none for a client reset,
/// where the backend's view is the one that counts).
async fn ending_client(
    addr: SocketAddr,
    end: End,
    id: u64,
    echo_len: usize,
    gate: Option<Arc<Gate>>,
) -> Option<Observed> {
    let s = within("connect", TcpStream::connect(addr)).await.ok()?;
    keepalive(&s);
    let len = match end {
        End::ClientReset => echo_len,
        _ => 2 * echo_len + 100_000,
    };
    // The same bytes on every path but the id (which names the path).
    let mut data = payload(len, id & 0xffff_ffff);
    data[..8].copy_from_slice(&id.to_be_bytes());
    data[8..16].copy_from_slice(&(echo_len as u64).to_be_bytes());
    if end == End::ClientReset {
        let mut s = s;
        within("client upload", s.write_all(&data[..HEADER]))
            .await
            .ok()?;
        pulled(&gate).await;
        within("client upload", s.write_all(&data[HEADER..]))
            .await
            .ok()?;
        sent_and_acked(&s).await;
        set_reset_on_close(&s);
        return None;
    }
    let (mut r, mut w) = s.into_split();
    let write = async {
        w.write_all(&data[..HEADER]).await.map_err(|e| e.kind())?;
        pulled(&gate).await;
        for chunk in data[HEADER..].chunks(64 * 1024) {
            w.write_all(chunk).await.map_err(|e| e.kind())?;
        }
        w.shutdown().await.map_err(|e| e.kind())
    };
    let exchange = async { tokio::join!(write, read_all(&mut r)) };
    match tokio::time::timeout(common::WAIT, exchange).await {
        Ok((wrote, (got, read))) => Some(ending_observed(&got, seen(read, wrote))),
        Err(_) => Some(ending_observed(&[], Seen::Error(ErrorKind::TimedOut))),
    }
}

// ---------------------------------------------------------------------------
// Judging

/// Every way `round`'s outcome through crossbar differs from direct (or direct
/// from what the exchange must give).
fn judge(round: &Round, o: &Outcome) -> Vec<String> {
    let mut found = Vec::new();
    for (mode, _) in TLS_PORTS {
        for path in PATHS {
            let Some((kept, n, errors)) = o.tls.get(&(mode, path)) else {
                found.push(format!("{mode:?} {path:?}: no result"));
                continue;
            };
            if (*kept as f64) < TARGET * *n as f64 || !errors.is_empty() {
                found.push(format!("{mode:?} {path:?}: kept {kept}/{n}; {errors:?}"));
            }
        }
    }
    for size in &round.bulk {
        let want = o.expected.get(size).map(|w| Ok(w.clone()));
        let direct = o.bulk.get(&(*size, Path::Direct)).cloned();
        if direct != want {
            found.push(format!("bulk {size} direct: {direct:?}, not {want:?}"));
        }
        for path in [Path::Splice, Path::Copy] {
            let got = o.bulk.get(&(*size, path)).cloned();
            if got != want {
                found.push(format!("bulk {size} {path:?}: {got:?}, not {want:?}"));
            }
        }
    }
    for (end, _) in END_PORTS {
        for size in &round.ending_sizes {
            let direct = o.endings.get(&(end, *size, Path::Direct)).cloned();
            if let Some(why) = direct.as_ref().and_then(|d| unexpected(end, *size, d)) {
                found.push(format!("{end:?} {size} direct: {why}"));
            }
            for path in [Path::Splice, Path::Copy] {
                let got = o.endings.get(&(end, *size, path)).cloned();
                if got != direct {
                    found.push(format!(
                        "{end:?} {size} {path:?}: (client, backend) saw {got:?}, direct {direct:?}"
                    ));
                }
            }
        }
    }
    found
}

/// What is wrong with the direct twin's outcome, if anything (the network faults
/// must not change how an ending looks on a direct path either).
fn unexpected(
    end: End,
    size: usize,
    (client, backend): &(Option<Observed>, Option<Observed>),
) -> Option<String> {
    let upload = 2 * size + 100_000;
    let (c, b) = match end {
        End::BackendFin => ((Some(size), Seen::Eof), (Some(upload), Seen::Eof)),
        End::BackendReset => ((Some(size), Seen::Reset), (Some(size), Seen::Eof)),
        End::ClientReset => ((None, Seen::Eof), (Some(size), Seen::Reset)),
    };
    let view = |o: &Option<Observed>| o.as_ref().map(|o| (Some(o.received), o.end));
    let want_c = c.0.map(|n| (Some(n), c.1));
    let want_b = Some((b.0, b.1));
    (view(client) != want_c || view(backend) != want_b)
        .then(|| format!("client {client:?} backend {backend:?}"))
}

// ---------------------------------------------------------------------------
// Socket helpers

fn observed(data: &[u8], end: Seen) -> Observed {
    Observed {
        received: data.len(),
        sha: hex(&Sha256::digest(data)),
        end,
    }
}

/// [`observed`] for an ending exchange: the hash leaves out the id, which differs
/// per path, so the twins' bytes compare equal.
fn ending_observed(data: &[u8], end: Seen) -> Observed {
    Observed {
        received: data.len(),
        sha: hex(&Sha256::digest(data.get(8..).unwrap_or_default())),
        end,
    }
}

/// Until the peer has acknowledged everything written (so a reset can't discard
/// it); bounded like every wait.
async fn sent_and_acked(tcp: &TcpStream) {
    let acked = async {
        loop {
            let mut n: libc::c_int = 0;
            // SAFETY: the ioctl writes one c_int we own; the fd is borrowed, so open.
            let rc = unsafe { libc::ioctl(tcp.as_raw_fd(), libc::TIOCOUTQ, &mut n) };
            if rc != 0 || n == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    // Past the guard the reset goes out anyway: what the peer then sees is compared.
    let _ = tokio::time::timeout(common::WAIT, acked).await; // ok: see above
}

fn set_reset_on_close(tcp: &TcpStream) {
    if let Err(e) = socket2::SockRef::from(tcp).set_linger(Some(Duration::ZERO)) {
        panic!("SO_LINGER 0: {e}");
    }
}

fn keepalive(tcp: &TcpStream) {
    let ka = socket2::TcpKeepalive::new()
        .with_time(KEEPALIVE)
        .with_interval(KEEPALIVE)
        .with_retries(30);
    if let Err(e) = socket2::SockRef::from(tcp).set_tcp_keepalive(&ka) {
        panic!("keepalive: {e}");
    }
}
