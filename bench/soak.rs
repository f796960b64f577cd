//! Soak: mixed traffic through one crossbar for N minutes, sampling its memory and
//! every table, pool and metric family once a minute, then a report. `#[ignore]`d,
//! so the test command does not pay for it (nextest reports it as skipped, never as
//! passed); run it with:
//!
//! ```text
//! CROSSBAR_SOAK_MINUTES=2 cargo test --test soak -- --ignored --nocapture
//! ```
//!
//! crossbar runs as its own process (`crossbar run -c FILE`, the binary cargo built
//! with this test), so its memory is measured alone: the load generator (this
//! process: TLS clients and their session caches, the test backends, payload
//! buffers) is sampled separately. Optional settings:
//! - `CROSSBAR_SOAK_SAMPLE_SECS` (default 60): the sampling period;
//! - `CROSSBAR_SOAK_BIN`: another crossbar binary (e.g. `target/release/crossbar`);
//! - `CROSSBAR_SOAK_WRAP`: a command to run crossbar under, split on spaces (e.g.
//!   `heaptrack -o /tmp/cb` or `valgrind --tool=massif --massif-out-file=/tmp/m`);
//!   the sampled process is then the wrapped `crossbar` (found by its name).
//! - `CROSSBAR_SOAK_ENV`: `KEY=VALUE` pairs (space-separated) for crossbar's
//!   environment (e.g. `MALLOC_ARENA_MAX=1`).
//!
//! Traffic, all real TLS (rustls testbed) on loopback:
//! - agents: HTTPS requests to `puppet` (3 backends, stick on session_id/ticket/psk),
//!   resuming their sessions, with a fresh session cache every 20 requests, half on
//!   TLS 1.2 and half on TLS 1.3;
//! - bulk: TLS echo transfers of 64 KiB..4 MiB to `bulk`, SHA-256 checked end to end;
//! - keep-alives: TLS connections to `bulk` that sit idle and ping every few seconds;
//! - chaos: every 20 s one `puppet` backend stops for 5 s, then restarts on its port;
//! - `POST /api/reload` every 30 s, alternating two configurations (weights differ).
//!
//! Each sample (a table row): crossbar's RSS split into anonymous memory (heap,
//! stacks) and file pages (its binary's code, touched as paths run for the first
//! time), its threads, memory mappings and open fds by kind; from its admin
//! endpoint: the number of `crossbar_*` metric series, stick-table entries, open
//! connections, queued connections and admin requests in progress; then the load
//! generator's RSS, live tasks and fds. The report: connections attempted / succeeded
//! / failed (by reason), bytes verified, checksum mismatches (must be 0), resumption
//! ratio, series per metric family at the start and end, and crossbar's counters.
//! Then it checks the bounds of docs/performance.md ("Memory under load"): metric
//! series unchanged, stick entries within the table's size, crossbar's sockets
//! closed, pipes within splice's pools, its anonymous memory within start + stick
//! entries x `STICK_ENTRY_BYTES` + `ANON_SLACK_KIB`.
#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use crossbar::testbed::{self, BackendTls, TestCa, TlsBackend, Versions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Counters shared by the traffic tasks.
#[derive(Default)]
struct Tally {
    attempted: AtomicU64,
    succeeded: AtomicU64,
    resumed: AtomicU64,
    agent_ok: AtomicU64,
    bytes_verified: AtomicU64,
    mismatches: AtomicU64,
    pings: AtomicU64,
    failures: Mutex<BTreeMap<String, u64>>,
}

impl Tally {
    fn fail(&self, kind: &str, e: impl std::fmt::Display) {
        // The reason without addresses or ports, so like failures group together.
        let reason: String = format!("{kind}: {e}")
            .chars()
            .map(|c| if c.is_ascii_digit() { '#' } else { c })
            .take(120)
            .collect();
        *self.failures.lock().unwrap().entry(reason).or_default() += 1;
    }
}

// ---------------------------------------------------------------------------
// What /proc says about a process

/// Memory, threads and descriptors of one process, from /proc.
#[derive(Debug, Clone, Default)]
struct ProcStats {
    /// VmRSS, KiB.
    rss: u64,
    /// RssAnon (heap, stacks, anonymous mappings), KiB.
    anon: u64,
    /// RssFile (pages of the binary and libraries), KiB.
    file: u64,
    /// VmHWM (peak RSS), KiB.
    hwm: u64,
    threads: u64,
    /// Lines of /proc/PID/maps (each glibc arena and large allocation is one or two).
    maps: usize,
    /// Open descriptors by kind (socket, pipe, anon_inode:[eventpoll], /path...).
    fds: BTreeMap<String, usize>,
}

impl ProcStats {
    fn read(pid: u32) -> ProcStats {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let field = |name: &str| -> u64 {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
                .unwrap_or(0)
        };
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))
            .map(|m| m.lines().count())
            .unwrap_or(0);
        ProcStats {
            rss: field("VmRSS:"),
            anon: field("RssAnon:"),
            file: field("RssFile:"),
            hwm: field("VmHWM:"),
            threads: field("Threads:"),
            maps,
            fds: fd_kinds(pid),
        }
    }

    fn fd(&self, kind: &str) -> usize {
        self.fds.get(kind).copied().unwrap_or(0)
    }

    fn fd_total(&self) -> usize {
        self.fds.values().sum()
    }
}

/// Open descriptors of `pid` grouped by what they are (socket, pipe, ...).
fn fd_kinds(pid: u32) -> BTreeMap<String, usize> {
    let mut kinds = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return kinds;
    };
    for e in dir.flatten() {
        if let Ok(target) = std::fs::read_link(e.path()) {
            let t = target.to_string_lossy().into_owned();
            let kind = t.split(':').next().unwrap_or("?").to_string();
            *kinds.entry(kind).or_default() += 1;
        }
    }
    kinds
}

/// The TCP sockets `pid` holds, as "local -> remote STATE" (from /proc/PID/net/tcp,
/// matched by inode), to name what stayed open.
fn tcp_sockets(pid: u32) -> Vec<String> {
    const STATES: [&str; 12] = [
        "?",
        "ESTABLISHED",
        "SYN_SENT",
        "SYN_RECV",
        "FIN_WAIT1",
        "FIN_WAIT2",
        "TIME_WAIT",
        "CLOSE",
        "CLOSE_WAIT",
        "LAST_ACK",
        "LISTEN",
        "CLOSING",
    ];
    let mut inodes = Vec::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
    {
        if let Ok(t) = std::fs::read_link(e.path()) {
            let t = t.to_string_lossy().into_owned();
            if let Some(i) = t.strip_prefix("socket:[").and_then(|i| i.strip_suffix(']')) {
                inodes.push(i.to_string());
            }
        }
    }
    // "sl local rem st ... inode": hex IPv4 address:port, the state in hex.
    let endpoint = |hex: &str| -> String {
        let (a, p) = hex.split_once(':').unwrap_or((hex, "0"));
        let a = u32::from_str_radix(a, 16).unwrap_or(0).to_le_bytes();
        let p = u16::from_str_radix(p, 16).unwrap_or(0);
        format!("{}.{}.{}.{}:{p}", a[0], a[1], a[2], a[3])
    };
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")).unwrap_or_default();
    let mut out = Vec::new();
    for line in table.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() > 9 && inodes.iter().any(|i| i == f[9]) {
            let st = usize::from_str_radix(f[3], 16).unwrap_or(0);
            let state = STATES.get(st).copied().unwrap_or("?");
            out.push(format!("{} -> {} {state}", endpoint(f[1]), endpoint(f[2])));
            inodes.retain(|i| i != f[9]);
        }
    }
    // The rest: Unix sockets (tokio's signal pipe), netlink.
    if !inodes.is_empty() {
        out.push(format!("{} other sockets (not TCP/IPv4)", inodes.len()));
    }
    out
}

/// (pid, parent pid, command name) of every process.
fn processes() -> Vec<(u32, u32, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|p| p.parse().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // "pid (comm) state ppid ...": comm may hold spaces, so split at the last ')'.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let comm = stat[open + 1..close].to_string();
        let ppid = stat[close + 1..]
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        out.push((pid, ppid, comm));
    }
    out
}

/// The process named `crossbar` among `root` and its descendants, if there is one.
fn find_crossbar(root: u32) -> Option<u32> {
    let all = processes();
    let mut family = vec![root];
    let mut i = 0;
    while i < family.len() {
        let parent = family[i];
        family.extend(all.iter().filter(|p| p.1 == parent).map(|p| p.0));
        i += 1;
    }
    all.iter()
        .find(|p| family.contains(&p.0) && p.2 == "crossbar")
        .map(|p| p.0)
}

// ---------------------------------------------------------------------------
// crossbar as a child process

/// A running `crossbar run -c FILE`, with its admin endpoint and listen addresses.
struct Balancer {
    proc: ChildGuard,
    /// The crossbar process itself (the child, or its descendant under a wrapper).
    pid: u32,
    admin: SocketAddr,
    puppet: SocketAddr,
    bulk: SocketAddr,
    file: PathBuf,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Balancer {
    async fn start(puppet: &[SocketAddr], bulk: &[SocketAddr]) -> Balancer {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("crossbar.yaml");
        let log = dir.path().join("crossbar.log");
        let (admin, p, b) = (free_port(), free_port(), free_port());
        std::fs::write(&file, yaml(admin, p, b, puppet, bulk, false)).unwrap();
        let bin = std::env::var("CROSSBAR_SOAK_BIN")
            .unwrap_or_else(|_| env!("CARGO_BIN_EXE_crossbar").to_string());
        let wrap = std::env::var("CROSSBAR_SOAK_WRAP").unwrap_or_default();
        let mut argv: Vec<&str> = wrap.split_whitespace().collect();
        argv.push(&bin);
        let mut cmd = Command::new(argv[0]);
        cmd.args(&argv[1..]).arg("run").arg("-c").arg(&file);
        for kv in std::env::var("CROSSBAR_SOAK_ENV")
            .unwrap_or_default()
            .split_whitespace()
        {
            if let Some((k, v)) = kv.split_once('=') {
                cmd.env(k, v);
            }
        }
        cmd.env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(&log).unwrap()));
        let proc = ChildGuard(cmd.spawn().expect("spawn crossbar"));
        // Ready when the admin endpoint answers: it is served only once every listen
        // address is bound (a wrapper such as valgrind may take seconds to get there).
        let mut ready = false;
        for _ in 0..(WAIT.as_millis() / 10) {
            if TcpStream::connect(admin).await.is_ok() {
                ready = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(ready, "crossbar never served its admin endpoint {admin}");
        let root = proc.0.id();
        let pid = find_crossbar(root).unwrap_or(root);
        Balancer {
            proc,
            pid,
            admin,
            puppet: p,
            bulk: b,
            file,
            log,
            _dir: dir,
        }
    }

    /// Write the configuration (`heavy_first`: p0 weighs 3) and `POST /api/reload` it.
    async fn reload(&self, puppet: &[SocketAddr], bulk: &[SocketAddr], heavy_first: bool) {
        let y = yaml(
            self.admin,
            self.puppet,
            self.bulk,
            puppet,
            bulk,
            heavy_first,
        );
        std::fs::write(&self.file, y).unwrap();
        let (status, text) = api_reload(self.admin).await;
        assert_eq!(status, Some(200), "the reload should succeed: {text}");
    }

    /// What crossbar reports about itself now.
    async fn sample(&self) -> Inside {
        let metrics = admin_get(self.admin, "/metrics").await;
        let services: serde_json::Value =
            serde_json::from_str(&admin_get(self.admin, "/api/services").await).expect("JSON");
        let queued = services["services"]
            .as_array()
            .map_or(0, |s| s.iter().filter_map(|s| s["queued"].as_u64()).sum());
        Inside {
            families: series_per_family(&metrics),
            stick: metric_value(&metrics, "crossbar_stick_table_entries", &[]) as u64,
            active: metric_value(&metrics, "crossbar_active_connections", &[]) as u64,
            admin_busy: metric_value(&metrics, "crossbar_admin_requests_in_progress", &[]) as u64,
            queued,
            metrics,
        }
    }

    /// SIGTERM (to crossbar itself, not a wrapper); it must exit 0 (it drains what is
    /// still open), and so must a wrapper.
    async fn stop(mut self) -> String {
        let sent = Command::new("kill")
            .arg("-TERM")
            .arg(self.pid.to_string())
            .status()
            .expect("kill");
        assert!(sent.success(), "kill -TERM {} failed", self.pid);
        let code = self.proc.exited(WAIT).await;
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        assert_eq!(
            code,
            Some(0),
            "crossbar's exit after SIGTERM; its log:\n{log}"
        );
        log
    }
}

/// What crossbar's admin endpoint says.
struct Inside {
    /// Series of each `crossbar_*` family (histograms: their bucket, sum and count lines).
    families: BTreeMap<String, usize>,
    /// Stick-table entries, every table.
    stick: u64,
    /// Connections open to backends.
    active: u64,
    /// Admin requests in progress (this sample's own included).
    admin_busy: u64,
    /// Connections waiting in service queues.
    queued: u64,
    metrics: String,
}

impl Inside {
    fn series(&self) -> usize {
        self.families.values().sum()
    }

    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        metric_value(&self.metrics, name, labels)
    }
}

/// Series per `crossbar_*` family in Prometheus text (a sample belongs to the family
/// of the `# TYPE` line before it).
fn series_per_family(text: &str) -> BTreeMap<String, usize> {
    let mut families = BTreeMap::new();
    let mut family = String::new();
    for line in text.lines() {
        if let Some(t) = line.strip_prefix("# TYPE ") {
            family = t.split(' ').next().unwrap_or("").to_string();
        } else if !line.starts_with('#') && family.starts_with("crossbar_") {
            *families.entry(family.clone()).or_default() += 1;
        }
    }
    families
}

fn yaml(
    admin: SocketAddr,
    p: SocketAddr,
    b: SocketAddr,
    puppet: &[SocketAddr],
    bulk: &[SocketAddr],
    heavy_first: bool,
) -> String {
    let w = |i: usize| if heavy_first && i == 0 { 3 } else { 1 };
    let mut y = format!(
        "admin: {{ listen: \"{admin}\" }}\n\
         defaults:\n  health: {{ check: none }}\n  retries: 2\n\
         services:\n\
         \x20 puppet:\n    listen: [\"{p}\"]\n    balance: leastconn\n\
         \x20   stick: {{ on: [session_id, ticket, psk], size: {STICK_SIZE}, expire: 30m }}\n\
         \x20   backends:\n",
    );
    for (i, a) in puppet.iter().enumerate() {
        y.push_str(&format!(
            "      - {{ name: p{i}, address: \"{a}\", weight: {} }}\n",
            w(i)
        ));
    }
    y.push_str(&format!(
        "  bulk:\n    listen: [\"{b}\"]\n    balance: roundrobin\n    backends:\n"
    ));
    for (i, a) in bulk.iter().enumerate() {
        y.push_str(&format!("      - {{ name: e{i}, address: \"{a}\" }}\n"));
    }
    y
}

// ---------------------------------------------------------------------------
// Samples

/// One row of the table.
struct Sample {
    at: Duration,
    cb: ProcStats,
    inside: Inside,
    gen: ProcStats,
    gen_tasks: usize,
    connections: u64,
}

const MIB: f64 = 1024.0;

/// The `puppet` stick table's size: agents start a fresh session every 20 requests, so
/// it fills (in ~5 minutes) and then evicts.
const STICK_SIZE: u64 = 10_000;
/// Heap a stick entry may cost crossbar once the table has churned: its map's shards
/// hold at most 2 x next_power_of_two(8/7 x entries) slots of 25 B (hashbrown doubles
/// a shard once when tombstones of evicted keys use up its free slots), < 115 B an
/// entry, and its queue at most 1.5 records of 12 B (docs/performance.md).
const STICK_ENTRY_BYTES: u64 = 160;
/// Anonymous memory crossbar may grow by beyond its stick entries (docs/performance.md,
/// "Memory under load"): the few connections open at the end (~3 KiB idle, up to 64 KiB
/// of copy buffer each in the rare user-space path), the splice pool's lists, and what
/// glibc keeps on its per-thread arenas' free lists (observed: < 1 MiB).
const ANON_SLACK_KIB: u64 = 4 * 1024;

fn header() -> String {
    format!(
        "{:>6} | {:>7} {:>7} {:>6} {:>7} {:>4} {:>5} {:>5} {:>5} | {:>6} {:>6} {:>6} {:>5} {:>5} | {:>7} {:>6} {:>5} | {:>8}",
        "min",
        "cb_rss",
        "anon",
        "file",
        "peak",
        "thr",
        "maps",
        "sock",
        "pipe",
        "series",
        "stick",
        "active",
        "queue",
        "admin",
        "gen_rss",
        "tasks",
        "fds",
        "conns"
    )
}

fn row(s: &Sample) -> String {
    let mib = |k: u64| k as f64 / MIB;
    format!(
        "{:>6.1} | {:>7.1} {:>7.1} {:>6.1} {:>7.1} {:>4} {:>5} {:>5} {:>5} | {:>6} {:>6} {:>6} {:>5} {:>5} | {:>7.1} {:>6} {:>5} | {:>8}",
        s.at.as_secs_f64() / 60.0,
        mib(s.cb.rss),
        mib(s.cb.anon),
        mib(s.cb.file),
        mib(s.cb.hwm),
        s.cb.threads,
        s.cb.maps,
        s.cb.fd("socket"),
        s.cb.fd("pipe"),
        s.inside.series(),
        s.inside.stick,
        s.inside.active,
        s.inside.queued,
        s.inside.admin_busy,
        mib(s.gen.rss),
        s.gen_tasks,
        s.gen.fd_total(),
        s.connections,
    )
}

async fn take_sample(lb: &Balancer, started: Instant, tally: &Tally) -> Sample {
    let inside = lb.sample().await;
    Sample {
        at: started.elapsed(),
        cb: ProcStats::read(lb.pid),
        inside,
        gen: ProcStats::read(std::process::id()),
        gen_tasks: tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks(),
        connections: tally.attempted.load(Ordering::Relaxed),
    }
}

/// Families whose series count differs between two samples, as "name a -> b".
fn family_changes(a: &Inside, b: &Inside) -> Vec<String> {
    let mut names: Vec<&String> = a.families.keys().chain(b.families.keys()).collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .filter_map(|n| {
            let (x, y) = (
                a.families.get(n).copied().unwrap_or(0),
                b.families.get(n).copied().unwrap_or(0),
            );
            (x != y).then(|| format!("{n} {x} -> {y}"))
        })
        .collect()
}

// ---------------------------------------------------------------------------
// Traffic

async fn agent(id: usize, ca: Arc<TestCa>, addr: SocketAddr, tally: Arc<Tally>, until: Instant) {
    let versions = if id % 2 == 0 {
        Versions::Tls12
    } else {
        Versions::Tls13
    };
    let mut cfg = testbed::client_config(&ca, versions, id % 4 < 2).unwrap();
    let mut n = 0u64;
    while Instant::now() < until {
        if n % 20 == 0 {
            cfg = testbed::client_config(&ca, versions, id % 4 < 2).unwrap();
        }
        n += 1;
        tally.attempted.fetch_add(1, Ordering::Relaxed);
        let r = tokio::time::timeout(
            Duration::from_secs(10),
            testbed::get(addr, SNI, cfg.clone(), "/"),
        )
        .await;
        match r {
            Ok(Ok(reply)) if reply.backend.starts_with('p') => {
                tally.succeeded.fetch_add(1, Ordering::Relaxed);
                tally.agent_ok.fetch_add(1, Ordering::Relaxed);
                tally
                    .resumed
                    .fetch_add(u64::from(reply.resumed), Ordering::Relaxed);
            }
            Ok(Ok(reply)) => tally.fail("agent", format!("unexpected body {:?}", reply.backend)),
            Ok(Err(e)) => tally.fail("agent", format!("{e:#}")),
            Err(_) => tally.fail("agent", "timed out"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn bulk(id: u64, ca: Arc<TestCa>, addr: SocketAddr, tally: Arc<Tally>, until: Instant) {
    let mut rng = fastrand::Rng::with_seed(id);
    let mut round = 0u64;
    while Instant::now() < until {
        round += 1;
        let len = rng.usize(64 * 1024..=4 * 1024 * 1024);
        let data = Arc::new(payload(len, id << 32 | round));
        tally.attempted.fetch_add(1, Ordering::Relaxed);
        let (ca2, sent) = (ca.clone(), data.clone());
        let work = async move {
            let tls = tls_connect(&ca2, addr).await;
            exchange(tls, &sent).await
        };
        // tls_connect/exchange panic on failure: run them as a task to catch that.
        match tokio::time::timeout(Duration::from_secs(60), tokio::spawn(work)).await {
            Ok(Ok((got, digest))) => {
                if got == len as u64 && digest == sha(&data) {
                    tally.succeeded.fetch_add(1, Ordering::Relaxed);
                    tally.bytes_verified.fetch_add(got, Ordering::Relaxed);
                } else {
                    tally.mismatches.fetch_add(1, Ordering::Relaxed);
                    tally.fail("bulk", format!("checksum mismatch: {got} of {len} bytes"));
                }
            }
            Ok(Err(e)) => tally.fail("bulk", e),
            Err(_) => tally.fail("bulk", "timed out"),
        }
    }
}

/// Hold a TLS connection open, sending a small ping every 3 s and checking its echo,
/// for 30 s at a time.
async fn keepalive(ca: Arc<TestCa>, addr: SocketAddr, tally: Arc<Tally>, until: Instant) {
    while Instant::now() + Duration::from_secs(5) < until {
        tally.attempted.fetch_add(1, Ordering::Relaxed);
        let ca2 = ca.clone();
        let t2 = tally.clone();
        let held = tokio::spawn(async move {
            let mut tls = tls_connect(&ca2, addr).await;
            let opened = Instant::now();
            while opened.elapsed() < Duration::from_secs(30) && Instant::now() < until {
                tokio::time::sleep(Duration::from_secs(3)).await;
                let ping = b"ping-keepalive";
                tls.write_all(ping).await.expect("ping");
                let mut back = [0u8; 14];
                tls.read_exact(&mut back).await.expect("pong");
                assert_eq!(&back, ping, "echo differs");
                t2.pings.fetch_add(1, Ordering::Relaxed);
            }
        });
        match held.await {
            Ok(()) => {
                tally.succeeded.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => tally.fail("keepalive", e),
        }
    }
}

/// Drop the reports the echo backends queue per connection (nobody reads them here):
/// they would otherwise grow the load generator by one report per connection.
async fn drain_reports(echoes: &[Backend]) {
    for e in echoes {
        // A zero timeout polls once: a queued report is taken, an empty queue ends it.
        while tokio::time::timeout(Duration::ZERO, e.next_report())
            .await
            .is_ok()
        {}
    }
}

/// Stop puppet backend `i` for 5 s, then start it again on its port.
async fn restart(puppet: &mut [TlsBackend], i: usize, ca: &TestCa, addr: SocketAddr) {
    puppet[i].stop();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let name = format!("p{i}");
    // The port was just released: rebind it (retry briefly if still in use).
    for _ in 0..50 {
        match TlsBackend::start(ca, &name, &[SNI], BackendTls::default(), addr).await {
            Ok(b) => {
                puppet[i] = b;
                return;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    panic!("backend {name} does not restart on {addr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "minutes long: cargo test --test soak -- --ignored (CROSSBAR_SOAK_MINUTES, default 2)"]
async fn soak() {
    let env_f64 = |name: &str, default: f64| {
        std::env::var(name)
            .ok()
            .and_then(|m| m.parse().ok())
            .unwrap_or(default)
    };
    let minutes = env_f64("CROSSBAR_SOAK_MINUTES", 2.0);
    let period = Duration::from_secs_f64(env_f64("CROSSBAR_SOAK_SAMPLE_SECS", 60.0).max(1.0));
    let run_for = Duration::from_secs_f64(minutes * 60.0);
    let ca = Arc::new(TestCa::new("soak CA").unwrap());
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let mut puppet = Vec::new();
    for i in 0..3 {
        puppet.push(
            TlsBackend::start(&ca, &format!("p{i}"), &[SNI], BackendTls::default(), any)
                .await
                .unwrap(),
        );
    }
    let echoes = [
        Backend::tls_echo(&ca, "e0").await,
        Backend::tls_echo(&ca, "e1").await,
    ];
    let paddrs: Vec<SocketAddr> = puppet.iter().map(|b| b.addr).collect();
    let baddrs: Vec<SocketAddr> = echoes.iter().map(|b| b.addr).collect();
    let lb = Balancer::start(&paddrs, &baddrs).await;
    let (p_addr, b_addr) = (lb.puppet, lb.bulk);
    let started = Instant::now();
    let until = started + run_for;
    let tally = Arc::new(Tally::default());
    println!(
        "crossbar pid {} (sampled), load generator pid {}",
        lb.pid,
        std::process::id()
    );
    println!("{}", header());
    let first = take_sample(&lb, started, &tally).await;
    println!("{}", row(&first));

    let mut tasks = tokio::task::JoinSet::new();
    for id in 0..4 {
        tasks.spawn(agent(id, ca.clone(), p_addr, tally.clone(), until));
    }
    for id in 0..2 {
        tasks.spawn(bulk(id, ca.clone(), b_addr, tally.clone(), until));
    }
    for _ in 0..3 {
        tasks.spawn(keepalive(ca.clone(), b_addr, tally.clone(), until));
    }

    // Chaos, reloads and samples on this task.
    let (mut restarts, mut reloads) = (0u32, 0u32);
    let mut next_chaos = started + Duration::from_secs(20);
    let mut next_reload = started + Duration::from_secs(30);
    let mut next_sample = started + period;
    let mut samples = vec![first];
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(200)).await;
        drain_reports(&echoes).await;
        if Instant::now() >= next_sample {
            let s = take_sample(&lb, started, &tally).await;
            println!("{}", row(&s));
            samples.push(s);
            next_sample += period;
        }
        if Instant::now() >= next_chaos {
            let i = restarts as usize % puppet.len();
            restart(&mut puppet, i, &ca, paddrs[i]).await;
            restarts += 1;
            next_chaos += Duration::from_secs(20);
        }
        if Instant::now() >= next_reload {
            lb.reload(&paddrs, &baddrs, reloads % 2 == 0).await;
            reloads += 1;
            next_reload += Duration::from_secs(30);
        }
    }
    while let Some(r) = tasks.join_next().await {
        r.expect("traffic task");
    }
    let elapsed = started.elapsed();
    drain_reports(&echoes).await;
    // Let the last connections close: crossbar counts none open, and its sockets are
    // back to what they were (listeners and the admin endpoint).
    let sockets = |p: &ProcStats| p.fd("socket");
    let settle = Instant::now();
    while settle.elapsed() < WAIT {
        let s = lb.sample().await;
        if s.active == 0 && sockets(&ProcStats::read(lb.pid)) <= sockets(&samples[0].cb) + 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "settled in {:?}; crossbar's TCP sockets: {:#?}",
        settle.elapsed(),
        tcp_sockets(lb.pid)
    );
    let last = take_sample(&lb, started, &tally).await;
    println!("{}   (end, traffic stopped)", row(&last));
    let first = &samples[0];
    println!("crossbar fds at the start: {:?}", first.cb.fds);
    println!(
        "crossbar fds at the end:   {:?} (pipes: splice's per-thread pool)",
        last.cb.fds
    );
    println!(
        "metric series: {} -> {}; families that changed: {:?}",
        first.inside.series(),
        last.inside.series(),
        family_changes(&first.inside, &last.inside)
    );
    let log = lb.stop().await;

    let t = &tally;
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let failures = t.failures.lock().unwrap().clone();
    let failed: u64 = failures.values().sum();
    let m = |name: &str, labels: &[(&str, &str)]| last.inside.counter(name, labels);
    println!("==== soak report: {elapsed:?} ({minutes} min requested)");
    println!(
        "connections attempted {} succeeded {} failed {failed}",
        get(&t.attempted),
        get(&t.succeeded)
    );
    for (reason, n) in &failures {
        println!("  failed x{n}: {reason}");
    }
    println!(
        "bytes verified (SHA-256, both ways echoed) {} ({:.1} MiB); checksum mismatches {}",
        get(&t.bytes_verified),
        get(&t.bytes_verified) as f64 / f64::from(1 << 20),
        get(&t.mismatches)
    );
    println!(
        "agent requests ok {}; resumed {} (ratio {:.2}); keep-alive pings {}",
        get(&t.agent_ok),
        get(&t.resumed),
        get(&t.resumed) as f64 / get(&t.agent_ok).max(1) as f64,
        get(&t.pings)
    );
    println!("backend restarts {restarts}; reloads {reloads}");
    let mut summary = String::new();
    for (what, a, b) in [
        ("crossbar", &first.cb, &last.cb),
        ("load generator", &first.gen, &last.gen),
    ] {
        let _ = writeln!(
            summary,
            "{what}: RSS {} KiB -> {} KiB (anon {} -> {}, peak {}); threads {} -> {}; fds {} -> {}",
            a.rss,
            b.rss,
            a.anon,
            b.anon,
            b.hwm,
            a.threads,
            b.threads,
            a.fd_total(),
            b.fd_total()
        );
    }
    print!("{summary}");
    println!(
        "crossbar: handshakes full {} resumed {}; stick hits {} misses {}; evicted {}; connect errors {}; log lines {}",
        m("crossbar_tls_handshakes_total", &[("kind", "full")]),
        m("crossbar_tls_handshakes_total", &[("kind", "resumed")]),
        m("crossbar_stick_lookups_total", &[("result", "hit")]),
        m("crossbar_stick_lookups_total", &[("result", "miss")]),
        m("crossbar_stick_evicted_total", &[]),
        m("crossbar_connect_errors_total", &[]),
        log.lines().count(),
    );
    assert_eq!(get(&t.mismatches), 0, "checksum mismatches");
    assert!(get(&t.succeeded) > 0);
    assert!(
        failed * 20 <= get(&t.attempted),
        "more than 5% of connections failed: {failures:?}"
    );
    // crossbar's sockets must all be closed again. Pipes may stay: relay/splice.rs
    // keeps up to 64 empty pipes (2 fds each) per worker thread for reuse.
    assert!(
        sockets(&last.cb) <= sockets(&first.cb) + 2,
        "sockets left open: {:?} -> {:?}",
        first.cb.fds,
        last.cb.fds
    );
    assert!(
        last.cb.fd("pipe") <= first.cb.fd("pipe") + last.cb.threads as usize * 64 * 2,
        "pipes beyond the pool bound: {:?}",
        last.cb.fds
    );
    // Every table and family is bounded by the configuration: the metric families
    // keep their series (labels are services, backends and fixed reasons, never
    // clients), the stick table its size, and crossbar's heap the sum of the two.
    assert_eq!(
        family_changes(&first.inside, &last.inside),
        Vec::<String>::new(),
        "metric series changed"
    );
    assert!(
        last.inside.stick <= STICK_SIZE,
        "stick entries {}",
        last.inside.stick
    );
    let bound = first.cb.anon + last.inside.stick * STICK_ENTRY_BYTES / 1024 + ANON_SLACK_KIB;
    assert!(
        last.cb.anon <= bound,
        "crossbar's anonymous memory grew past its bound: {} KiB > {bound} KiB",
        last.cb.anon
    );
}
