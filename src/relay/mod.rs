//! The byte pump: relays both directions until both are done, passing half-closes
//! through, with an idle timeout and per-direction byte counts.
//!
//! While the TLS handshake is under way, the server->client bytes are also shown to
//! a [`ServerWatcher`] (after being forwarded, so inspection adds no latency); once it
//! is done, `on_handshake` runs and the relay continues as a plain copy.
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use prometheus::IntCounter;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use crate::hello::{ServerHandshake, ServerWatcher};

#[cfg(target_os = "linux")]
mod splice;

/// Per-direction copy buffer: large enough for a full TLS record (16 KiB + overhead)
/// in one read.
const BUF_SIZE: usize = 16 * 1024 + 256;

/// How a relayed connection ended (the access log's termination reason).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayEnd {
    /// Both sides closed; the client closed first.
    ClientClosed,
    /// Both sides closed; the server closed first.
    ServerClosed,
    /// No bytes either way for the idle timeout.
    IdleTimeout,
    /// Reading from or writing to the client failed (reset, ...).
    ClientError,
    /// Reading from or writing to the server failed.
    ServerError,
    /// Cut by shutdown after the grace period.
    Shutdown,
}

impl RelayEnd {
    /// The access-log reason.
    pub fn as_str(&self) -> &'static str {
        match self {
            RelayEnd::ClientClosed => "client_closed",
            RelayEnd::ServerClosed => "server_closed",
            RelayEnd::IdleTimeout => "idle_timeout",
            RelayEnd::ClientError => "client_error",
            RelayEnd::ServerError => "server_error",
            RelayEnd::Shutdown => "shutdown",
        }
    }
}

/// What a relay did.
#[derive(Debug, Clone, Copy)]
pub struct RelayStats {
    /// Bytes client -> server (excluding bytes written before the relay started).
    pub client_to_server: u64,
    /// Bytes server -> client.
    pub server_to_client: u64,
    /// How it ended.
    pub end: RelayEnd,
    /// The I/O error behind a `ClientError`/`ServerError` end.
    pub error: Option<io::ErrorKind>,
}

/// Counters the relay adds to as bytes flow, borrowed from the backend's metric handles: no per-connection clone (and so no
/// reference-count traffic on a cache line every connection to the backend shares).
#[derive(Clone, Copy)]
pub struct RelayCounters<'a> {
    /// Client -> server bytes.
    pub c2s: &'a IntCounter,
    /// Server -> client bytes.
    pub s2c: &'a IntCounter,
}

/// Inspection of the server's handshake during the relay (boxed by callers: it is
/// only needed during the handshake, and inline it would enlarge every connection's
/// future for its whole life).
pub struct Watch<'a> {
    /// The watcher fed with server->client bytes.
    pub watcher: ServerWatcher,
    /// Called once when the watcher is done.
    pub on_handshake: Box<dyn FnOnce(&ServerHandshake) + Send + 'a>,
}

/// Activity clock shared by both directions: milliseconds since `start` of the last byte.
struct Activity {
    start: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn touch(&self) {
        self.last_ms
            .store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
    fn idle_for(&self) -> Duration {
        let now = self.start.elapsed().as_millis() as u64;
        Duration::from_millis(now.saturating_sub(self.last_ms.load(Ordering::Relaxed)))
    }
}

/// Which side an I/O error came from.
#[derive(Debug)]
enum Side {
    Read(io::Error),
    Write(io::Error),
}

/// Copy `src` to `dst` until EOF, then shut down `dst`'s write side (half-close).
/// Bytes go through user space while the handshake is watched (the watcher must see
/// them), then through splice(2) on Linux.
async fn pump(
    src: ReadHalf<'_>,
    mut dst: WriteHalf<'_>,
    counter: &IntCounter,
    total: &AtomicU64,
    activity: &Activity,
    watch: Option<Box<Watch<'_>>>,
) -> Result<(), Side> {
    let zero_copy = cfg!(target_os = "linux") && splice_enabled();
    let eof = if watch.is_some() || !zero_copy {
        // Boxed: the copy phase is short (the handshake) in the usual case, and inline
        // it would make every idle connection's future ~560 bytes bigger.
        Box::pin(copy(
            src, &mut dst, counter, total, activity, watch, zero_copy,
        ))
        .await?
    } else {
        Phase::Switch(src)
    };
    #[cfg(target_os = "linux")]
    if let Phase::Switch(src) = eof {
        splice::pump(src.as_ref(), dst.as_ref(), counter, total, activity).await?;
    }
    #[cfg(not(target_os = "linux"))]
    let _ = eof; // ok: only Linux switches to splice
    dst.shutdown().await.map_err(Side::Write)
}

/// Why the user-space copy stopped.
enum Phase<'a> {
    /// The source reached EOF.
    Eof,
    /// The watcher is done and splice can take over.
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    Switch(ReadHalf<'a>),
}

async fn copy<'a>(
    mut src: ReadHalf<'a>,
    dst: &mut WriteHalf<'_>,
    counter: &IntCounter,
    total: &AtomicU64,
    activity: &Activity,
    mut watch: Option<Box<Watch<'_>>>,
    switch_when_done: bool,
) -> Result<Phase<'a>, Side> {
    let mut buf = vec![0u8; BUF_SIZE];
    loop {
        let n = src.read(&mut buf).await.map_err(Side::Read)?;
        if n == 0 {
            if let Some(w) = watch.take() {
                (w.on_handshake)(w.watcher.info());
            }
            return Ok(Phase::Eof);
        }
        activity.touch();
        dst.write_all(&buf[..n]).await.map_err(Side::Write)?;
        counter.inc_by(n as u64);
        total.fetch_add(n as u64, Ordering::Relaxed);
        if let Some(w) = watch.as_mut() {
            if w.watcher.feed(&buf[..n]) {
                if let Some(w) = watch.take() {
                    (w.on_handshake)(w.watcher.info());
                }
                if switch_when_done {
                    return Ok(Phase::Switch(src));
                }
            }
        }
    }
}

/// Zero-copy is on unless `CROSSBAR_NO_SPLICE=1` (for benchmarks and diagnosis).
fn splice_enabled() -> bool {
    #[cfg(target_os = "linux")]
    {
        splice::supported()
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}

/// Relay `client` <-> `server` until both directions are closed, the connection is
/// idle for `idle`, an error occurs on either side, or `hard_stop` fires.
pub async fn relay(
    client: &mut TcpStream,
    server: &mut TcpStream,
    idle: Duration,
    counters: &RelayCounters<'_>,
    watch: Option<Box<Watch<'_>>>,
    hard_stop: &CancellationToken,
) -> RelayStats {
    let activity = Activity {
        start: Instant::now(),
        last_ms: AtomicU64::new(0),
    };
    let (c2s_total, s2c_total) = (AtomicU64::new(0), AtomicU64::new(0));
    let (cr, cw) = client.split();
    let (sr, sw) = server.split();
    let c2s = pump(cr, sw, counters.c2s, &c2s_total, &activity, None);
    let s2c = pump(sr, cw, counters.s2c, &s2c_total, &activity, watch);
    tokio::pin!(c2s, s2c);
    let (mut c2s_done, mut s2c_done) = (false, false);
    let mut first_close: Option<RelayEnd> = None;
    let mut error = None;
    let idle_timer = tokio::time::sleep(idle);
    tokio::pin!(idle_timer);
    let end = loop {
        tokio::select! {
            r = &mut c2s, if !c2s_done => {
                c2s_done = true;
                match r {
                    Ok(()) => { first_close.get_or_insert(RelayEnd::ClientClosed); }
                    Err(Side::Read(e)) => { error = Some(e.kind()); break RelayEnd::ClientError }
                    Err(Side::Write(e)) => { error = Some(e.kind()); break RelayEnd::ServerError }
                }
            }
            r = &mut s2c, if !s2c_done => {
                s2c_done = true;
                match r {
                    Ok(()) => { first_close.get_or_insert(RelayEnd::ServerClosed); }
                    Err(Side::Read(e)) => { error = Some(e.kind()); break RelayEnd::ServerError }
                    Err(Side::Write(e)) => { error = Some(e.kind()); break RelayEnd::ClientError }
                }
            }
            () = &mut idle_timer => {
                let quiet = activity.idle_for();
                if quiet >= idle {
                    break RelayEnd::IdleTimeout;
                }
                idle_timer.as_mut().reset(tokio::time::Instant::now() + (idle - quiet));
            }
            () = hard_stop.cancelled() => break RelayEnd::Shutdown,
        }
        if c2s_done && s2c_done {
            break first_close.unwrap_or(RelayEnd::ClientClosed);
        }
    };
    RelayStats {
        client_to_server: c2s_total.load(Ordering::Relaxed),
        server_to_client: s2c_total.load(Ordering::Relaxed),
        end,
        error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};
    use tokio::net::TcpListener;

    async fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (b, _) = l.accept().await.unwrap();
        (a, b)
    }

    /// Owned test counters (client->server, server->client).
    fn counters() -> (IntCounter, IntCounter) {
        let c = |n: &str| IntCounter::new(n, "test").unwrap();
        (c("c2s"), c("s2c"))
    }

    fn borrow(c: &(IntCounter, IntCounter)) -> RelayCounters<'_> {
        RelayCounters {
            c2s: &c.0,
            s2c: &c.1,
        }
    }

    fn data(len: usize, seed: u64) -> Vec<u8> {
        let mut rng = fastrand::Rng::with_seed(seed);
        (0..len).map(|_| rng.u8(..)).collect()
    }

    /// client <-> [relay] <-> server, both directions at once, then half-closes.
    async fn roundtrip(len: usize) {
        let (mut client, mut proxy_client_side) = pair().await;
        let (mut proxy_server_side, mut server) = pair().await;
        let up = data(len, 1);
        let down = data(len, 2);
        let (up2, down2) = (up.clone(), down.clone());
        let cnt = counters();
        let stop = CancellationToken::new();
        let relay = tokio::spawn(async move {
            let s = relay(
                &mut proxy_client_side,
                &mut proxy_server_side,
                Duration::from_secs(30),
                &borrow(&cnt),
                None,
                &stop,
            )
            .await;
            (s, cnt.0.get(), cnt.1.get())
        });
        let srv = tokio::spawn(async move {
            let (mut r, mut w) = server.split();
            let send = async {
                w.write_all(&down2).await.unwrap();
                w.shutdown().await.unwrap();
            };
            let recv = async {
                let mut got = Vec::new();
                r.read_to_end(&mut got).await.unwrap();
                got
            };
            let ((), got) = tokio::join!(send, recv);
            Sha256::digest(&got)
        });
        let (mut r, mut w) = client.split();
        let send = async {
            w.write_all(&up2).await.unwrap();
            w.shutdown().await.unwrap();
        };
        let recv = async {
            let mut got = Vec::new();
            r.read_to_end(&mut got).await.unwrap();
            got
        };
        let ((), got) = tokio::join!(send, recv);
        assert_eq!(
            Sha256::digest(&got),
            Sha256::digest(&down),
            "server->client bytes"
        );
        assert_eq!(
            srv.await.unwrap(),
            Sha256::digest(&up),
            "client->server bytes"
        );
        let (stats, c2s, s2c) = relay.await.unwrap();
        assert_eq!(stats.client_to_server, len as u64);
        assert_eq!(stats.server_to_client, len as u64);
        assert_eq!((c2s, s2c), (len as u64, len as u64));
        assert!(
            matches!(stats.end, RelayEnd::ClientClosed | RelayEnd::ServerClosed),
            "{:?}",
            stats.end
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn bytes_intact_both_ways_with_half_close() {
        for len in [0, 1, 1000, 70_000, 4 << 20] {
            roundtrip(len).await;
        }
    }

    #[tokio::test]
    async fn idle_timeout_closes() {
        let (_client, mut a) = pair().await;
        let (mut b, _server) = pair().await;
        let stats = relay(
            &mut a,
            &mut b,
            Duration::from_millis(200),
            &borrow(&counters()),
            None,
            &CancellationToken::new(),
        )
        .await;
        assert_eq!(stats.end, RelayEnd::IdleTimeout);
    }

    #[tokio::test]
    async fn hard_stop_cuts() {
        let (_client, mut a) = pair().await;
        let (mut b, _server) = pair().await;
        let stop = CancellationToken::new();
        stop.cancel();
        let stats = relay(
            &mut a,
            &mut b,
            Duration::from_secs(60),
            &borrow(&counters()),
            None,
            &stop,
        )
        .await;
        assert_eq!(stats.end, RelayEnd::Shutdown);
    }
}
