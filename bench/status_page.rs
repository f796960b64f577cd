//! Status page cost (`cargo bench --bench status_page`): page weight and the time to
//! serve `GET /` for 10 services x 10 backends, over real HTTP on loopback, next to
//! `GET /api/services` (the same data as JSON) in the same run. Targets: < 50 KiB,
//! < 10 ms.
//!
//! Each request is a fresh connection (a browser's refresh may reuse one, so this is
//! the pessimistic case); the time is from connect to the last body byte.
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crossbar::config::Config;
use crossbar::metrics::Metrics;
use crossbar::server::Server;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

const SERVICES: usize = 10;
const BACKENDS: usize = 10;
/// Requests per endpoint: enough for a stable p99 in a few seconds.
const REQUESTS: usize = 500;
/// Requests before measuring (connections, allocator, caches).
const WARMUP: usize = 20;

/// 10 services of 10 backends each; backends never checked (`check: none`) and
/// never dialed, so only the admin side runs.
fn config_yaml() -> String {
    let mut y = String::from(
        "admin: { enabled: false }\ndefaults:\n  health: { check: none }\nservices:\n",
    );
    for s in 0..SERVICES {
        y += &format!(
            "  service{s:02}:\n    listen: [\"127.0.0.1:0\"]\n    balance: leastconn\n\
             \x20   stick: {{ on: [session_id, ticket, psk], size: 100000 }}\n    backends:\n"
        );
        for b in 0..BACKENDS {
            y += &format!(
                "      - {{ name: compile{b:02}, address: \"192.0.2.{}:8140\" }}\n",
                b + 1
            );
        }
    }
    y
}

/// GET `path` on a fresh connection; (body bytes, elapsed).
async fn get(admin: SocketAddr, path: &str) -> (usize, Duration) {
    let start = Instant::now();
    let mut s = TcpStream::connect(admin).await.expect("connect");
    let req = format!("GET {path} HTTP/1.1\r\nHost: {admin}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.expect("write");
    let mut buf = Vec::with_capacity(64 * 1024);
    s.read_to_end(&mut buf).await.expect("read");
    let elapsed = start.elapsed();
    let head_end = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a complete HTTP response");
    assert!(buf.starts_with(b"HTTP/1.1 200"), "{path}: not 200");
    (buf.len() - head_end - 4, elapsed)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

async fn measure(admin: SocketAddr, path: &str) -> (usize, Vec<Duration>) {
    for _ in 0..WARMUP {
        get(admin, path).await;
    }
    let mut times = Vec::with_capacity(REQUESTS);
    let mut size = 0;
    for _ in 0..REQUESTS {
        let (n, t) = get(admin, path).await;
        size = n;
        times.push(t);
    }
    times.sort();
    (size, times)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("crossbar.yaml");
    std::fs::write(&path, config_yaml()).expect("write config");
    let config = Config::load(&path).expect("valid config");
    let server = Server::start(config, Metrics::new()).await.expect("start");
    let admin = crossbar::admin::bind("127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("bind admin");
    let addr = admin.local_addr().expect("addr");
    let stop = CancellationToken::new();
    tokio::spawn(crossbar::admin::serve(
        admin,
        server.clone(),
        None,
        stop.clone(),
    ));
    println!("status page, {SERVICES} services x {BACKENDS} backends, {REQUESTS} GETs each, fresh connection per GET");
    println!(
        "{:<22} {:>9} {:>9} {:>9} {:>9}",
        "endpoint", "bytes", "p50", "p99", "max"
    );
    for path in ["/?refresh=10", "/api/services"] {
        let (size, t) = measure(addr, path).await;
        println!(
            "{path:<22} {size:>9} {:>9.2?} {:>9.2?} {:>9.2?}",
            percentile(&t, 0.5),
            percentile(&t, 0.99),
            t[t.len() - 1]
        );
    }
    // The same page built in-process: crossbar's own cost, without loopback and
    // scheduling (which dominate on a loaded machine).
    let mut t: Vec<Duration> = (0..REQUESTS)
        .map(|_| {
            let start = Instant::now();
            std::hint::black_box(crossbar::admin::page::response(&server, None));
            start.elapsed()
        })
        .collect();
    t.sort();
    println!(
        "{:<22} {:>9} {:>9.2?} {:>9.2?} {:>9.2?}",
        "page built in-process",
        "",
        percentile(&t, 0.5),
        percentile(&t, 0.99),
        t[t.len() - 1]
    );
    stop.cancel();
    server.shutdown(Duration::from_secs(1)).await;
}
