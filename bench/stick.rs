//! Stick-table cost (`cargo bench --bench stick`). Targets: >= 5 M lookups/s on 2
//! threads; a 1M-entry table in <= 128 MiB (printed before the groups run, from the
//! process's RSS growth while filling it).
//!
//! Every lookup includes hashing a 32-byte session ID (`StickTable::key`), as on the
//! connection path. Tables are filled to their size, so `learn_new` always evicts.
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use crossbar::stick::{KeyKind, StickTable, TableParams};

const SIZES: [usize; 2] = [10_000, 1_000_000];
const BACKENDS: [&str; 3] = ["compile1", "compile2", "compile3"];
/// Threads of the contention benchmarks (the figure: a 2-core balancer).
const THREADS: usize = 2;

/// A 32-byte session ID for key number `i` (distinct for distinct `i`).
fn raw(i: u64) -> [u8; 32] {
    let mut r = [0u8; 32];
    for (n, chunk) in r.chunks_mut(8).enumerate() {
        chunk.copy_from_slice(&(i ^ (n as u64).wrapping_mul(0x9e37_79b9)).to_le_bytes());
    }
    r
}

fn filled(size: usize) -> StickTable {
    let t = StickTable::new(TableParams {
        size,
        expire: Duration::from_secs(1800),
        source_expire: Duration::from_secs(1800),
    });
    for i in 0..size as u64 {
        t.learn(
            t.key(KeyKind::SessionId, &raw(i)),
            BACKENDS[i as usize % BACKENDS.len()],
        );
    }
    t
}

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// `per_thread` lookups of existing keys on each of THREADS threads; wall time.
fn lookups_on_threads(t: &Arc<StickTable>, size: u64, per_thread: u64) -> Duration {
    let start = Instant::now();
    std::thread::scope(|s| {
        for th in 0..THREADS as u64 {
            let t = t.clone();
            s.spawn(move || {
                let mut i = th.wrapping_mul(7919);
                for _ in 0..per_thread {
                    i = (i + 104_729) % size;
                    black_box(
                        t.lookup_with(&t.key(KeyKind::SessionId, &raw(i)), |name| name.len()),
                    );
                }
            });
        }
    });
    start.elapsed()
}

fn bench_stick(c: &mut Criterion) {
    let before = rss_kib();
    let t0 = Instant::now();
    let big = Arc::new(filled(1_000_000));
    let mib = (rss_kib().saturating_sub(before)) as f64 / 1024.0;
    println!(
        "stick table: 1,000,000 entries filled in {:.2} s, RSS grew by {mib:.1} MiB \
         ({:.0} bytes/entry; target <= 128 MiB)",
        t0.elapsed().as_secs_f64(),
        mib * 1024.0 * 1024.0 / 1e6,
    );
    let small = Arc::new(filled(10_000));

    let mut g = c.benchmark_group("stick");
    g.warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .throughput(Throughput::Elements(1));
    for (size, table) in SIZES.iter().zip([&small, &big]) {
        let n = *size as u64;
        let mut i = 0u64;
        g.bench_with_input(BenchmarkId::new("lookup_hit", size), table, |b, t| {
            b.iter(|| {
                i = (i + 104_729) % n;
                t.lookup_with(&t.key(KeyKind::SessionId, &raw(i)), |name| name.len())
            })
        });
        let mut m = 0u64;
        g.bench_with_input(BenchmarkId::new("lookup_miss", size), table, |b, t| {
            b.iter(|| {
                m += 1;
                t.lookup_with(&t.key(KeyKind::SessionId, &raw(n + m)), |name| name.len())
            })
        });
        let mut o = 0u64;
        g.bench_with_input(BenchmarkId::new("learn_overwrite", size), table, |b, t| {
            b.iter(|| {
                o = (o + 104_729) % n;
                t.learn(
                    t.key(KeyKind::SessionId, &raw(o)),
                    BACKENDS[(o % 3) as usize],
                );
            })
        });
        g.bench_with_input(
            BenchmarkId::new("lookup_hit_2_threads", size),
            table,
            |b, t| b.iter_custom(|iters| lookups_on_threads(t, n, iters.div_ceil(THREADS as u64))),
        );
    }
    // One thread looking up while another learns new keys (each evicting one entry).
    let fresh = Arc::new(AtomicU64::new(1 << 40));
    g.bench_function("lookup_while_learning_new_1M", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            std::thread::scope(|s| {
                let (t, fresh) = (big.clone(), fresh.clone());
                s.spawn(move || {
                    for _ in 0..iters {
                        let k = fresh.fetch_add(1, Ordering::Relaxed);
                        t.learn(t.key(KeyKind::SessionId, &raw(k)), BACKENDS[0]);
                    }
                });
                let t = big.clone();
                let mut i = 0u64;
                for _ in 0..iters {
                    i = (i + 104_729) % 1_000_000;
                    black_box(
                        t.lookup_with(&t.key(KeyKind::SessionId, &raw(i)), |name| name.len()),
                    );
                }
            });
            start.elapsed()
        })
    });
    // Two threads learning new keys into the full 1M table (each insert evicts one
    // entry): with one eviction queue they take turns on its lock; with a queue per
    // 4,096 entries (at most 4 per CPU) they rarely meet. Time per key learned.
    g.bench_function("learn_new_2_threads_1M", |b| {
        b.iter_custom(|iters| {
            let per_thread = iters.div_ceil(THREADS as u64);
            let start = Instant::now();
            std::thread::scope(|s| {
                for _ in 0..THREADS {
                    let (t, fresh) = (big.clone(), fresh.clone());
                    s.spawn(move || {
                        for _ in 0..per_thread {
                            let k = fresh.fetch_add(1, Ordering::Relaxed);
                            t.learn(t.key(KeyKind::SessionId, &raw(k)), BACKENDS[0]);
                        }
                    });
                }
            });
            start.elapsed()
        })
    });
    g.finish();
}

criterion_group!(benches, bench_stick);
criterion_main!(benches);
