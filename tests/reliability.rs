//! The reliability pass (issue #16): each defect an adversarial review found, as a
//! test that failed before its fix. Real sockets on loopback, real processes where
//! the defect lives between processes (the upgrade socket).
mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use crossbar::admin;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// Bound on anything that should happen "at once" on loopback, with slack for a
/// loaded 2-core CI machine.
const PROMPT: Duration = Duration::from_secs(5);

// ---------------------------------------------------------------------------
// The admin endpoint

/// A running balancer with its admin endpoint on loopback (no token).
struct AdminBed {
    addr: SocketAddr,
    stop: CancellationToken,
    cb: Crossbar,
    _backend: Backend,
}

impl Drop for AdminBed {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn admin_bed(settings: &str) -> AdminBed {
    let be = Backend::echo("e1", false).await;
    let cb = Crossbar::start(&one_service(settings, &[backend_line("e1", be.addr, "")])).await;
    let listener = admin::bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    tokio::spawn(admin::serve(
        listener,
        cb.server.clone(),
        None,
        stop.clone(),
    ));
    AdminBed {
        addr,
        stop,
        cb,
        _backend: be,
    }
}

/// Send `request` on a fresh connection and read the answer until the server
/// closes (bounded by `limit`): the status code (`None` if closed without one).
async fn raw_request(addr: SocketAddr, request: &[u8], limit: Duration) -> (Option<u16>, String) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let (mut r, mut w) = s.split();
    let write = async {
        let _ = w.write_all(request).await; // ok: an early close is a valid answer
    };
    let read = async {
        let mut out = Vec::new();
        let _ = tokio::time::timeout(limit, r.read_to_end(&mut out)).await; // ok: partial
        out
    };
    let ((), out) = tokio::join!(write, read);
    let text = String::from_utf8_lossy(&out).into_owned();
    (status_of(&text), text)
}

fn status_of(text: &str) -> Option<u16> {
    text.strip_prefix("HTTP/1.1 ")
        .and_then(|t| t.get(..3))
        .and_then(|c| c.parse().ok())
}

fn get(path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").into_bytes()
}

/// Every admin slot held by a request that declared a body and sent none: /healthz
/// and /metrics still answer at once, other endpoints are refused with 503, and
/// each stalled request is answered 408 and closed (the whole request is timed,
/// not only its headers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_admin_bodies_time_out_and_health_still_answers() {
    let bed = admin_bed("").await;
    let mut stalled = Vec::new();
    for _ in 0..admin::MAX_CONNECTIONS {
        let mut s = TcpStream::connect(bed.addr).await.unwrap();
        s.write_all(b"POST /api/reload HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n")
            .await
            .unwrap();
        stalled.push(s);
    }
    // Accepted in order after the stalled ones (the accept queue is FIFO): every
    // regular slot is taken by then.
    let t = Instant::now();
    let (status, body) = raw_request(bed.addr, &get("/healthz"), PROMPT).await;
    assert_eq!(status, Some(200), "healthz with the slots full: {body}");
    let (status, body) = raw_request(bed.addr, &get("/metrics"), PROMPT).await;
    assert_eq!(status, Some(200), "metrics with the slots full");
    assert!(body.contains("crossbar_"), "{body}");
    let (status, body) = raw_request(bed.addr, &get("/api/services"), PROMPT).await;
    assert_eq!(status, Some(503), "other endpoints with the slots full: {body}");
    println!("admin: slots full; healthz, metrics, services answered in {:?}", t.elapsed());

    let t = Instant::now();
    for (i, mut s) in stalled.into_iter().enumerate() {
        let mut out = Vec::new();
        within("a stalled body's answer", s.read_to_end(&mut out))
            .await
            .unwrap();
        let text = String::from_utf8_lossy(&out);
        assert_eq!(status_of(&text), Some(408), "stalled request {i}: {text}");
    }
    let took = t.elapsed();
    println!("admin: {} stalled bodies answered 408 and closed after {took:?}", admin::MAX_CONNECTIONS);
    assert!(took >= admin::REQUEST_TIMEOUT - PROMPT, "not before the timeout: {took:?}");
    // The slots are free again: a regular endpoint answers.
    let (status, body) = raw_request(bed.addr, &get("/api/services"), PROMPT).await;
    assert_eq!(status, Some(200), "{body}");
}

/// A table dump is capped: a limit over the cap is refused with a clear reason,
/// the cap itself is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_dumps_are_capped() {
    let bed = admin_bed("    stick: { on: [source] }\n").await;
    let _ = &bed.cb;
    let over = format!("/api/tables/svc?limit={}", admin::MAX_TABLE_LIMIT + 1);
    let (status, body) = raw_request(bed.addr, &get(&over), PROMPT).await;
    assert_eq!(status, Some(400), "{body}");
    assert!(body.contains("limit must be"), "{body}");
    let (status, body) = raw_request(bed.addr, &get("/api/tables/svc?limit=100000"), PROMPT).await;
    assert_eq!(status, Some(400), "the old cap (100000) is refused now: {body}");
    let at = format!("/api/tables/svc?limit={}", admin::MAX_TABLE_LIMIT);
    let (status, body) = raw_request(bed.addr, &get(&at), PROMPT).await;
    assert_eq!(status, Some(200), "{body}");
}
