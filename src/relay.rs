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
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use crate::hello::{ServerHandshake, ServerWatcher};

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

/// Counters the relay adds to as bytes flow.
#[derive(Clone)]
pub struct RelayCounters {
    /// Client -> server bytes.
    pub c2s: IntCounter,
    /// Server -> client bytes.
    pub s2c: IntCounter,
}

/// Inspection of the server's handshake during the relay.
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
async fn pump<R, W>(
    mut src: R,
    mut dst: W,
    counter: &IntCounter,
    total: &AtomicU64,
    activity: &Activity,
    mut watch: Option<Watch<'_>>,
) -> Result<(), Side>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; BUF_SIZE];
    loop {
        let n = src.read(&mut buf).await.map_err(Side::Read)?;
        if n == 0 {
            if let Some(w) = watch.take() {
                (w.on_handshake)(w.watcher.info());
            }
            dst.shutdown().await.map_err(Side::Write)?;
            return Ok(());
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
            }
        }
    }
}

/// Relay `client` <-> `server` until both directions are closed, the connection is
/// idle for `idle`, an error occurs on either side, or `hard_stop` fires.
pub async fn relay(
    client: &mut TcpStream,
    server: &mut TcpStream,
    idle: Duration,
    counters: &RelayCounters,
    watch: Option<Watch<'_>>,
    hard_stop: &CancellationToken,
) -> RelayStats {
    let activity = Activity {
        start: Instant::now(),
        last_ms: AtomicU64::new(0),
    };
    let (c2s_total, s2c_total) = (AtomicU64::new(0), AtomicU64::new(0));
    let (cr, cw) = client.split();
    let (sr, sw) = server.split();
    let c2s = pump(cr, sw, &counters.c2s, &c2s_total, &activity, None);
    let s2c = pump(sr, cw, &counters.s2c, &s2c_total, &activity, watch);
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
