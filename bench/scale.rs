//! `loadgen probe` and `loadgen stick`: the two measurements of `bench/scale.sh`
//! that are not plain load (issue #32 item 6).
//!
//! - `probe`: new connections one after another (connect, one byte echoed, close)
//!   for SECONDS; the longest one is the pause a reload showed to new clients.
//! - `stick`: a stick table of N entries in this process: RSS growth, lookups/s on
//!   two threads, state-file save and load time; optionally leaves the file behind
//!   for a crossbar to load.
use std::hint::black_box;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use clap::Args;
use crossbar::stick::{KeyKind, StickTable, TableParams};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Longest one probe connection may take before it counts as an error (a hang guard:
/// a reload that stalls new connections this long has failed anyway).
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// Lookups per thread in `stick`: ~1 s at the bench's 5 M/s target on two threads.
const LOOKUPS_PER_THREAD: u64 = 4_000_000;
/// Threads looking up at once (the box has two cores).
const LOOKUP_THREADS: u64 = 2;

/// Arguments of `loadgen probe`.
#[derive(Args)]
pub struct ProbeArgs {
    /// An echo service (through the proxy).
    #[arg(long)]
    addr: SocketAddr,
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
}

/// Connect, send a byte, read it back, close: one new client's view of the proxy.
async fn one_probe(addr: SocketAddr) -> Result<()> {
    let fut = async {
        let mut s = TcpStream::connect(addr).await?;
        s.write_all(b"p").await?;
        let mut b = [0u8; 1];
        s.read_exact(&mut b).await?;
        Ok::<_, anyhow::Error>(())
    };
    tokio::time::timeout(PROBE_TIMEOUT, fut)
        .await
        .map_err(|_| anyhow!("timed out"))?
}

/// Probe ADDR back to back for SECONDS; print count, errors and latency (ms).
pub async fn probe(a: ProbeArgs) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs_f64(a.seconds);
    let mut ms = Vec::new();
    let (mut errors, mut first_error) = (0u64, None);
    while Instant::now() < deadline {
        let t = Instant::now();
        match one_probe(a.addr).await {
            Ok(()) => ms.push(t.elapsed().as_secs_f64() * 1e3),
            Err(e) => {
                errors += 1;
                first_error.get_or_insert(format!("{e:#}"));
            }
        }
    }
    ms.sort_by(f64::total_cmp);
    let q = |f: f64| super::pct(&ms, f);
    println!(
        "{}",
        json!({"kind": "probe", "count": ms.len(), "errors": errors,
               "first_error": first_error, "p50_ms": q(0.5), "p99_ms": q(0.99),
               "max_ms": ms.last().copied().unwrap_or(0.0)})
    );
    Ok(())
}

/// Arguments of `loadgen stick`.
#[derive(Args)]
pub struct StickArgs {
    /// Entries to fill the table with (its size, too).
    #[arg(long)]
    entries: usize,
    /// Where the state file is saved (and read back from).
    #[arg(long)]
    file: PathBuf,
    /// Backend names the entries are spread over.
    #[arg(long, value_delimiter = ',', default_value = "b0,b1,b2")]
    backends: Vec<String>,
    /// Keep the file (for a crossbar to load); removed otherwise.
    #[arg(long)]
    keep: bool,
    /// Table size when it should be larger than `entries` (a service's `size`).
    #[arg(long)]
    size: Option<usize>,
}

/// A 32-byte session ID for key number `i` (distinct for distinct `i`), as bench/stick.rs.
fn raw(i: u64) -> [u8; 32] {
    let mut r = [0u8; 32];
    for (n, chunk) in r.chunks_mut(8).enumerate() {
        chunk.copy_from_slice(&(i ^ (n as u64).wrapping_mul(0x9e37_79b9)).to_le_bytes());
    }
    r
}

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn table(size: usize) -> StickTable {
    StickTable::new(TableParams {
        size,
        expire: Duration::from_secs(1800),
        source_expire: Duration::from_secs(1800),
    })
}

/// Lookups of existing keys on LOOKUP_THREADS threads; lookups per second.
fn lookup_rate(t: &Arc<StickTable>, n: u64) -> f64 {
    let start = Instant::now();
    std::thread::scope(|s| {
        for th in 0..LOOKUP_THREADS {
            let t = t.clone();
            s.spawn(move || {
                let mut i = th.wrapping_mul(7919) % n;
                for _ in 0..LOOKUPS_PER_THREAD {
                    i = (i + 104_729) % n;
                    black_box(
                        t.lookup_with(&t.key(KeyKind::SessionId, &raw(i)), |name| name.len()),
                    );
                }
            });
        }
    });
    (LOOKUP_THREADS * LOOKUPS_PER_THREAD) as f64 / start.elapsed().as_secs_f64()
}

/// Fill, look up, save, load; print one JSON line.
pub fn stick(a: StickArgs) -> Result<()> {
    let n = a.entries as u64;
    let names: Vec<&str> = a.backends.iter().map(String::as_str).collect();
    let rss0 = rss_kib();
    let t0 = Instant::now();
    let t = Arc::new(table(a.size.unwrap_or(a.entries)));
    for i in 0..n {
        t.learn(
            t.key(KeyKind::SessionId, &raw(i)),
            names[i as usize % names.len()],
        );
    }
    let fill_s = t0.elapsed().as_secs_f64();
    let rss_filled = rss_kib();
    let lookups = lookup_rate(&t, n);
    let t1 = Instant::now();
    let saved = t.save(&a.file)?;
    let save_s = t1.elapsed().as_secs_f64();
    let file_bytes = std::fs::metadata(&a.file)?.len();
    drop(t);
    let rss_dropped = rss_kib();
    let fresh = table(a.size.unwrap_or(a.entries));
    let t2 = Instant::now();
    let loaded = fresh.load(&a.file, &names)?;
    let load_s = t2.elapsed().as_secs_f64();
    let rss_loaded = rss_kib();
    if !a.keep {
        std::fs::remove_file(&a.file)?;
    }
    println!(
        "{}",
        json!({"kind": "stick", "entries": n, "fill_s": fill_s,
               "rss_fill_kib": rss_filled.saturating_sub(rss0),
               "bytes_per_entry": rss_filled.saturating_sub(rss0) as f64 * 1024.0 / n as f64,
               "lookups_per_s": lookups, "saved": saved, "save_s": save_s,
               "file_bytes": file_bytes, "loaded": loaded, "load_s": load_s,
               "rss_after_drop_kib": rss_dropped, "rss_loaded_kib": rss_loaded})
    );
    Ok(())
}
