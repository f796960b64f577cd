//! `loadgen`: the load generator and backends of `bench/compare.sh`.
//!
//! Every measuring subcommand prints one JSON line on stdout, so the driver parses
//! results without scraping prose. Every load loop is bounded by `--seconds` (or
//! `--count`) and only loopback addresses are expected.
//!
//! - `backends`: N TLS backends (the real rustls servers of `crossbar::testbed`), or
//!   plain `echo` / `sink` TCP servers; prints their addresses, then `READY`.
//! - `throughput`: S parallel streams pushing bytes into a sink, Gbit/s.
//! - `connections`: rustls clients doing handshake + one tiny GET; conn/s, latency,
//!   resumption ratio (rustls's own `handshake_kind`), same-backend ratio. With
//!   `--mode tcp`, plain connections instead (connect, 64 bytes echoed, close).
//! - `latency`: 64-byte ping-pong over one connection to an echo server.
//! - `idle`: open N connections, ping each once, hold them until SIGTERM.
//! - `freeport`: print a free loopback port below the ephemeral range (for
//!   generated configs: a port the load's own connections can't take first).
//! - `probe` and `stick`: bench/scale.sh's reload pause and stick-table figures
//!   (`scale.rs`).
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream as StdStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use crossbar::testbed::{self, BackendTls, TestCa, Versions};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, HandshakeKind, RootCertStore};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio_rustls::TlsConnector;

#[path = "report.rs"]
mod report;
#[path = "scale.rs"]
mod scale;

/// Size of one write in `throughput` and of the sink's read buffer: large enough that
/// syscall overhead does not dominate, small enough to stay in L2.
const CHUNK: usize = 256 * 1024;
/// Bytes of one `latency` ping (the figure).
const PING: usize = 64;
/// Longest a single TLS connection (connect + handshake + GET) may take before it
/// counts as an error: keeps every worker loop bounded even if the proxy stalls.
const CONN_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest answer read from a test backend (headers + its name).
const MAX_ANSWER: usize = 16 * 1024;

#[derive(Parser)]
#[command(about = "crossbar benchmark load generator (loopback only)")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start backends, print their addresses and READY, run until SIGTERM/stdin EOF.
    Backends(BackendsArgs),
    /// Push bytes through ADDR into a sink backend for SECONDS; report Gbit/s.
    Throughput {
        #[arg(long)]
        addr: SocketAddr,
        #[arg(long, default_value_t = 1)]
        streams: usize,
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
    },
    /// New TLS connections (handshake + GET) for SECONDS; conn/s and latency
    /// (`--mode tcp`: plain connections to an echo service).
    Connections(ConnArgs),
    /// 64-byte ping-pong over one persistent connection to an echo backend.
    Latency {
        #[arg(long)]
        addr: SocketAddr,
        #[arg(long, default_value_t = 10_000)]
        count: usize,
    },
    /// Open COUNT connections to an echo backend, ping each once, print HELD, hold.
    Idle {
        #[arg(long)]
        addr: SocketAddr,
        #[arg(long, default_value_t = 10_000)]
        count: usize,
        /// Give up after this long (the hold itself ends at SIGTERM or stdin EOF).
        #[arg(long, default_value_t = 60.0)]
        seconds: f64,
        #[command(flatten)]
        wait: WaitArgs,
    },
    /// Print a free TCP port on 127.0.0.1 (racy by nature; fine on a quiet loopback).
    Freeport,
    /// New connections back to back for SECONDS; the longest is a reload's pause.
    Probe(scale::ProbeArgs),
    /// A stick table of N entries: memory, lookups/s, state-file save and load time.
    Stick(scale::StickArgs),
    /// Turn compare.sh's results (JSON lines) into a markdown table and a JSON summary.
    Report(report::ReportArgs),
}

#[derive(Args)]
struct WaitArgs {
    /// Don't watch stdin; run until SIGTERM/SIGINT only (for background jobs whose
    /// stdin is /dev/null).
    #[arg(long)]
    no_stdin: bool,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
enum Kind {
    /// rustls TLS backends answering HTTP/1.1 with their name.
    Tls,
    /// Plain TCP echo.
    Echo,
    /// Plain TCP: read and discard, close on EOF.
    Sink,
}

#[derive(Args)]
struct BackendsArgs {
    #[arg(long, default_value_t = 3)]
    count: usize,
    #[arg(long, value_enum, default_value_t = Kind::Tls)]
    kind: Kind,
    /// TLS 1.2 only.
    #[arg(long, conflicts_with = "tls13")]
    tls12: bool,
    /// TLS 1.3 only.
    #[arg(long)]
    tls13: bool,
    /// Stateless tickets (own key per backend); without: TLS 1.2 session IDs and
    /// TLS 1.3 stateful tickets.
    #[arg(long)]
    tickets: bool,
    #[arg(long, default_value = "127.0.0.1:0")]
    bind: SocketAddr,
    /// Where to write the CA certificate (PEM) that clients must trust.
    #[arg(long)]
    ca_out: Option<PathBuf>,
    /// Backend names are PREFIX0, PREFIX1, ...
    #[arg(long, default_value = "b")]
    name_prefix: String,
    #[command(flatten)]
    wait: WaitArgs,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
enum ConnMode {
    /// Every connection a full handshake (no resumption offered).
    Full,
    /// Each worker is one agent with its own session cache: a first (unmeasured)
    /// full handshake, then every connection offers to resume.
    Resumed,
    /// No TLS: connect, 64 bytes echoed (an echo service behind the proxy), close.
    Tcp,
}

#[derive(Args)]
struct ConnArgs {
    #[arg(long)]
    addr: SocketAddr,
    #[arg(long, default_value = "puppet")]
    sni: String,
    /// CA of the TLS backends (required unless `--mode tcp`).
    #[arg(long)]
    ca: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = ConnMode::Full)]
    mode: ConnMode,
    #[arg(long, conflicts_with = "tls13")]
    tls12: bool,
    #[arg(long)]
    tls13: bool,
    /// TLS 1.2 resumption by session ID only (no ticket offered).
    #[arg(long)]
    no_tickets: bool,
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Worker i connects from 127.0.(i/250).(i%250+2), one source address per
    /// simulated agent (else all share 127.0.0.1, like agents behind one NAT).
    #[arg(long)]
    distinct_sources: bool,
}

fn main() -> Result<()> {
    match Cli::parse().cmd {
        Cmd::Backends(a) => runtime()?.block_on(backends(a)),
        Cmd::Throughput {
            addr,
            streams,
            seconds,
        } => throughput(addr, streams, seconds),
        Cmd::Connections(a) => runtime()?.block_on(connections(a)),
        Cmd::Latency { addr, count } => latency(addr, count),
        Cmd::Idle {
            addr,
            count,
            seconds,
            wait,
        } => runtime()?.block_on(idle(addr, count, seconds, wait)),
        Cmd::Report(a) => report::run(a),
        Cmd::Probe(a) => runtime()?.block_on(scale::probe(a)),
        Cmd::Stick(a) => scale::stick(a),
        Cmd::Freeport => {
            println!("{}", testbed::free_port()?.port());
            Ok(())
        }
    }
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")
}

fn versions(tls12: bool, tls13: bool) -> Versions {
    match (tls12, tls13) {
        (true, _) => Versions::Tls12,
        (_, true) => Versions::Tls13,
        _ => Versions::Both,
    }
}

/// Wait for SIGTERM, SIGINT or (unless disabled) EOF on stdin.
async fn wait_for_stop(wait: &WaitArgs) -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    // tokio's `io-std` feature is not enabled in this crate: a plain thread watches stdin.
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    if !wait.no_stdin {
        std::thread::spawn(move || {
            let mut buf = [0u8; 256];
            while matches!(std::io::stdin().read(&mut buf), Ok(n) if n > 0) {}
            // The receiver is gone only if we already stopped.
            tx.send(()).unwrap_or_default();
        });
    } else {
        std::mem::forget(tx);
    }
    let stdin_closed = async {
        if rx.await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
        () = stdin_closed => {}
    }
    Ok(())
}

// ---------------------------------------------------------------- backends

/// Backlog of the plain backends: a proxy that accepts a burst of 200 connections
/// dials the backend 200 times at once, and std's default of 128 would drop SYNs
/// (a 1 s retransmit each), so the bench would measure the backend, not the proxy.
const BACKEND_BACKLOG: u32 = 4096;

/// A plain backend's listening socket with [`BACKEND_BACKLOG`].
fn listen(addr: SocketAddr) -> Result<TcpListener> {
    let sock = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    sock.set_reuseaddr(true)?;
    sock.bind(addr)?;
    Ok(sock.listen(BACKEND_BACKLOG)?)
}

async fn backends(a: BackendsArgs) -> Result<()> {
    let mut addrs = Vec::new();
    let mut keep_tls = Vec::new();
    match a.kind {
        Kind::Tls => {
            let ca = TestCa::new("crossbar bench CA")?;
            if let Some(path) = &a.ca_out {
                std::fs::write(path, ca.cert_pem())
                    .with_context(|| format!("writing {}", path.display()))?;
            }
            let tls = BackendTls {
                versions: versions(a.tls12, a.tls13),
                tickets: a.tickets,
            };
            for i in 0..a.count {
                let name = format!("{}{i}", a.name_prefix);
                let names = ["puppet", "localhost", "127.0.0.1"];
                let b = testbed::TlsBackend::start(&ca, &name, &names, tls, a.bind).await?;
                addrs.push(b.addr);
                keep_tls.push(b);
            }
        }
        Kind::Echo | Kind::Sink => {
            for _ in 0..a.count {
                let l = listen(a.bind)?;
                addrs.push(l.local_addr()?);
                tokio::spawn(serve_plain(l, a.kind == Kind::Echo));
            }
        }
    }
    let mut out = String::new();
    for addr in &addrs {
        out.push_str(&format!("{addr}\n"));
    }
    out.push_str("READY\n");
    print!("{out}");
    std::io::stdout().flush()?;
    wait_for_stop(&a.wait).await?;
    drop(keep_tls);
    Ok(())
}

async fn serve_plain(l: TcpListener, echo: bool) {
    loop {
        let Ok((mut s, _)) = l.accept().await else {
            // EMFILE and friends: back off instead of spinning.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        if let Err(e) = s.set_nodelay(true) {
            eprintln!("set_nodelay: {e}");
        }
        tokio::spawn(async move {
            let mut buf = vec![0u8; if echo { 4096 } else { CHUNK }];
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) if echo => {
                        if s.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                    Ok(_) => {}
                }
            }
        });
    }
}

// ---------------------------------------------------------------- throughput

/// One stream: write CHUNKs until the deadline, half-close, wait for the sink's EOF
/// (so every byte counted was delivered), return (bytes, seconds until EOF).
fn push_stream(addr: SocketAddr, deadline: Instant, start: Instant) -> Result<(u64, f64)> {
    let mut s = StdStream::connect(addr)?;
    s.set_write_timeout(Some(Duration::from_secs(5)))?;
    let buf = vec![0x5a_u8; CHUNK];
    let mut sent = 0u64;
    while Instant::now() < deadline {
        let n = s.write(&buf).context("write")?;
        sent += n as u64;
    }
    s.shutdown(std::net::Shutdown::Write)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut tail = [0u8; 64];
    while s.read(&mut tail).context("waiting for the sink's EOF")? > 0 {}
    Ok((sent, start.elapsed().as_secs_f64()))
}

fn throughput(addr: SocketAddr, streams: usize, seconds: f64) -> Result<()> {
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(seconds);
    let handles: Vec<_> = (0..streams)
        .map(|_| std::thread::spawn(move || push_stream(addr, deadline, start)))
        .collect();
    let (mut bytes, mut secs, mut errors) = (0u64, 0f64, Vec::new());
    for h in handles {
        match h.join().map_err(|_| anyhow!("stream thread panicked"))? {
            Ok((b, s)) => {
                bytes += b;
                secs = secs.max(s);
            }
            Err(e) => errors.push(format!("{e:#}")),
        }
    }
    let gbps = if secs > 0.0 {
        bytes as f64 * 8.0 / secs / 1e9
    } else {
        0.0
    };
    println!(
        "{}",
        json!({"kind": "throughput", "streams": streams, "bytes": bytes,
               "seconds": secs, "gbit_s": gbps, "errors": errors.len(),
               "first_error": errors.first()})
    );
    Ok(())
}

// ---------------------------------------------------------------- latency

fn latency(addr: SocketAddr, count: usize) -> Result<()> {
    let mut s = StdStream::connect(addr)?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let ping = [0xa5_u8; PING];
    let mut pong = [0u8; PING];
    // Warm-up: the first exchanges include connecting to the backend (tcp mode) and
    // page faults; they are not the steady state we compare.
    for _ in 0..100.min(count) {
        s.write_all(&ping)?;
        s.read_exact(&mut pong)?;
    }
    let mut us = Vec::with_capacity(count);
    for _ in 0..count {
        let t = Instant::now();
        s.write_all(&ping)?;
        s.read_exact(&mut pong).context("echo reply")?;
        us.push(t.elapsed().as_secs_f64() * 1e6);
    }
    us.sort_by(f64::total_cmp);
    println!(
        "{}",
        json!({"kind": "latency", "count": count, "p50_us": pct(&us, 0.50),
               "p99_us": pct(&us, 0.99), "mean_us": mean(&us)})
    );
    Ok(())
}

fn pct(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

// ---------------------------------------------------------------- idle

async fn idle(addr: SocketAddr, count: usize, seconds: f64, wait: WaitArgs) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let mut held = Vec::with_capacity(count);
    let mut errors = 0usize;
    let mut first_error = None;
    // Open in batches of 200 so the proxy's accept backlog is never the limit.
    while held.len() + errors < count && Instant::now() < deadline {
        let batch = (count - held.len() - errors).min(200);
        let opened = futures_join(batch, addr).await;
        for r in opened {
            match r {
                Ok(s) => held.push(s),
                Err(e) => {
                    errors += 1;
                    first_error.get_or_insert(format!("{e:#}"));
                }
            }
        }
    }
    println!(
        "{}",
        json!({"kind": "idle", "held": held.len(), "errors": errors, "first_error": first_error})
    );
    println!("HELD");
    std::io::stdout().flush()?;
    wait_for_stop(&wait).await?;
    drop(held);
    Ok(())
}

async fn futures_join(n: usize, addr: SocketAddr) -> Vec<Result<TcpStream>> {
    let tasks: Vec<_> = (0..n).map(|_| tokio::spawn(open_pinged(addr))).collect();
    let mut out = Vec::with_capacity(n);
    for t in tasks {
        out.push(t.await.unwrap_or_else(|e| Err(anyhow!("task: {e}"))));
    }
    out
}

/// Connect and exchange one byte, so the proxy has connected the backend and relayed
/// data both ways: an agent connection that did something and is now quiet.
async fn open_pinged(addr: SocketAddr) -> Result<TcpStream> {
    let fut = async {
        let mut s = TcpStream::connect(addr).await?;
        s.write_all(b"x").await?;
        let mut b = [0u8; 1];
        s.read_exact(&mut b).await?;
        Ok::<_, anyhow::Error>(s)
    };
    tokio::time::timeout(Duration::from_secs(10), fut)
        .await
        .map_err(|_| anyhow!("timed out"))?
}

// ---------------------------------------------------------------- connections

fn client_config(a: &ConnArgs) -> Result<ClientConfig> {
    let mut roots = RootCertStore::empty();
    let ca =
        a.ca.as_ref()
            .ok_or_else(|| anyhow!("--ca is needed for TLS"))?;
    for cert in
        CertificateDer::pem_file_iter(ca).with_context(|| format!("reading {}", ca.display()))?
    {
        roots.add(cert?)?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let vers: &[&rustls::SupportedProtocolVersion] = match versions(a.tls12, a.tls13) {
        Versions::Tls12 => &[&rustls::version::TLS12],
        Versions::Tls13 => &[&rustls::version::TLS13],
        Versions::Both => &[&rustls::version::TLS13, &rustls::version::TLS12],
    };
    let mut cfg = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(vers)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.resumption = resumption(a);
    Ok(cfg)
}

/// A fresh session cache (one per simulated agent), or none in `full` mode.
fn resumption(a: &ConnArgs) -> rustls::client::Resumption {
    use rustls::client::{Resumption, Tls12Resumption};
    match (a.mode, a.no_tickets) {
        (ConnMode::Full | ConnMode::Tcp, _) => Resumption::disabled(),
        (ConnMode::Resumed, true) => {
            Resumption::in_memory_sessions(64).tls12_resumption(Tls12Resumption::SessionIdOnly)
        }
        (ConnMode::Resumed, false) => Resumption::in_memory_sessions(64),
    }
}

/// What one connection showed.
struct Outcome {
    handshake: Duration,
    resumed: bool,
    /// The backend that answered (TLS backends name themselves; echo ones don't).
    backend: Option<String>,
}

/// Connect (from `source` if set), send PING bytes, read them back, close: a plain
/// TCP connection through the proxy to an echo backend. `handshake` is the connect.
async fn one_tcp(addr: SocketAddr, source: Option<IpAddr>) -> Result<Outcome> {
    let t = Instant::now();
    let sock = TcpSocket::new_v4()?;
    if let Some(ip) = source {
        sock.bind(SocketAddr::new(ip, 0))?;
    }
    let mut tcp = sock.connect(addr).await.context("connect")?;
    let handshake = t.elapsed();
    tcp.set_nodelay(true)?;
    let ping = [0xa5_u8; PING];
    tcp.write_all(&ping).await.context("ping")?;
    let mut pong = [0u8; PING];
    tcp.read_exact(&mut pong).await.context("echo")?;
    if pong != ping {
        bail!("the echo differs from the ping");
    }
    Ok(Outcome {
        handshake,
        resumed: false,
        backend: None,
    })
}

/// Connect (from `source` if set), handshake, GET /, read the answer to EOF.
async fn one_conn(
    addr: SocketAddr,
    source: Option<IpAddr>,
    name: ServerName<'static>,
    connector: &TlsConnector,
) -> Result<Outcome> {
    let t = Instant::now();
    let sock = TcpSocket::new_v4()?;
    if let Some(ip) = source {
        sock.bind(SocketAddr::new(ip, 0))?;
    }
    let tcp = sock.connect(addr).await.context("connect")?;
    tcp.set_nodelay(true)?;
    let mut tls = connector.connect(name, tcp).await.context("handshake")?;
    let handshake = t.elapsed();
    let resumed = tls.get_ref().1.handshake_kind() == Some(HandshakeKind::Resumed);
    tls.write_all(b"GET / HTTP/1.1\r\nhost: puppet\r\nconnection: close\r\n\r\n")
        .await
        .context("request")?;
    let mut answer = Vec::with_capacity(512);
    let mut buf = [0u8; 2048];
    // Read to EOF; a peer closing without close_notify still gave us the answer.
    while answer.len() < MAX_ANSWER {
        match tls.read(&mut buf).await {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            Err(e) if answer.is_empty() => return Err(e).context("answer"),
            Err(_) => break,
        }
    }
    let text = String::from_utf8_lossy(&answer);
    let backend = text
        .lines()
        .find_map(|l| l.strip_prefix("x-backend: "))
        .ok_or_else(|| anyhow!("no x-backend header in the answer"))?
        .trim()
        .to_string();
    Ok(Outcome {
        handshake,
        resumed,
        backend: Some(backend),
    })
}

/// Per-worker tallies, merged at the end.
#[derive(Default)]
struct Tally {
    conns: u64,
    errors: u64,
    first_error: Option<String>,
    resumed: u64,
    same_backend: u64,
    compared: u64,
    handshake_ms: Vec<f64>,
    per_backend: BTreeMap<String, u64>,
}

fn source_of(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, (i / 250) as u8, (i % 250 + 2) as u8)
}

async fn worker(
    a: Arc<ConnArgs>,
    cfg: Option<Arc<ClientConfig>>,
    i: usize,
    deadline: Instant,
) -> Tally {
    let mut t = Tally::default();
    // One agent = one session cache: give each worker its own config in resumed mode.
    let cfg = match cfg {
        Some(cfg) if a.mode == ConnMode::Resumed => {
            let mut own = (*cfg).clone();
            own.resumption = resumption(&a);
            Some(Arc::new(own))
        }
        cfg => cfg,
    };
    let connector = cfg.map(TlsConnector::from);
    let source = a.distinct_sources.then(|| IpAddr::V4(source_of(i)));
    let Ok(name) = ServerName::try_from(a.sni.clone()) else {
        t.errors += 1;
        t.first_error = Some("bad --sni".into());
        return t;
    };
    let mut previous: Option<String> = None;
    let mut primed = a.mode != ConnMode::Resumed;
    while Instant::now() < deadline {
        let r = match &connector {
            Some(c) => {
                tokio::time::timeout(CONN_TIMEOUT, one_conn(a.addr, source, name.clone(), c)).await
            }
            None => tokio::time::timeout(CONN_TIMEOUT, one_tcp(a.addr, source)).await,
        }
        .unwrap_or_else(|_| Err(anyhow!("connection timed out")));
        match r {
            Err(e) => {
                t.errors += 1;
                t.first_error.get_or_insert(format!("{e:#}"));
            }
            Ok(o) if !primed => {
                primed = true;
                previous = o.backend;
            }
            Ok(o) => {
                t.conns += 1;
                t.resumed += u64::from(o.resumed);
                t.handshake_ms.push(o.handshake.as_secs_f64() * 1e3);
                if let Some(b) = o.backend {
                    if let Some(p) = &previous {
                        t.compared += 1;
                        t.same_backend += u64::from(*p == b);
                    }
                    *t.per_backend.entry(b.clone()).or_default() += 1;
                    previous = Some(b);
                }
            }
        }
    }
    t
}

async fn connections(a: ConnArgs) -> Result<()> {
    if a.concurrency == 0 {
        bail!("--concurrency must be at least 1");
    }
    let cfg = match a.mode {
        ConnMode::Tcp => None,
        ConnMode::Full | ConnMode::Resumed => Some(Arc::new(client_config(&a)?)),
    };
    let a = Arc::new(a);
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(a.seconds);
    let handles: Vec<_> = (0..a.concurrency)
        .map(|i| tokio::spawn(worker(a.clone(), cfg.clone(), i, deadline)))
        .collect();
    let mut all = Tally::default();
    for h in handles {
        let t = h.await?;
        all.conns += t.conns;
        all.errors += t.errors;
        if all.first_error.is_none() {
            all.first_error = t.first_error;
        }
        all.resumed += t.resumed;
        all.same_backend += t.same_backend;
        all.compared += t.compared;
        all.handshake_ms.extend(t.handshake_ms);
        for (k, v) in t.per_backend {
            *all.per_backend.entry(k).or_default() += v;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    all.handshake_ms.sort_by(f64::total_cmp);
    let ratio = |n: u64, d: u64| if d == 0 { 0.0 } else { n as f64 / d as f64 };
    let mode = match a.mode {
        ConnMode::Full => "full",
        ConnMode::Resumed => "resumed",
        ConnMode::Tcp => "tcp",
    };
    println!(
        "{}",
        json!({"kind": "connections", "mode": mode, "conns": all.conns,
               "errors": all.errors, "first_error": all.first_error, "seconds": secs,
               "conn_per_s": all.conns as f64 / secs,
               "p50_ms": pct(&all.handshake_ms, 0.5), "p99_ms": pct(&all.handshake_ms, 0.99),
               "resumed_ratio": ratio(all.resumed, all.conns),
               "same_backend_ratio": ratio(all.same_backend, all.compared),
               "per_backend": all.per_backend})
    );
    Ok(())
}
