//! The byte pump: relays both directions until both are done, passing half-closes
//! and aborts through (see [`ending`]), with an idle timeout and per-direction byte
//! counts.
//!
//! While the TLS handshake is under way, the server->client bytes are also shown to
//! a [`ServerWatcher`] (after being forwarded, so inspection adds no latency); once it
//! is done, `on_handshake` runs. Small messages are copied through a per-thread
//! buffer; a direction that carries bulk data switches to splice(2) on Linux.
use std::cell::RefCell;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use prometheus::IntCounter;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use crate::hello::{ServerHandshake, ServerWatcher};

pub mod ending;
#[cfg(target_os = "linux")]
pub mod kernel;
#[cfg(target_os = "linux")]
mod splice;

pub use ending::{Abort, Ending, Peer};

/// File descriptors relaying holds beyond each connection's two sockets: (per
/// connection, per worker thread), the splice pipes and their per-thread pool.
pub fn pipe_fds() -> (u64, u64) {
    #[cfg(target_os = "linux")]
    {
        (
            splice::PIPE_FDS_PER_CONNECTION,
            splice::POOLED_FDS_PER_THREAD,
        )
    }
    #[cfg(not(target_os = "linux"))]
    {
        (0, 0)
    }
}

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
    /// The client reset the connection (or it failed); the backend was reset in turn
    /// after every byte the client had sent reached it.
    ClientReset,
    /// The backend reset the connection (or it failed); the client was reset in turn
    /// after every byte the backend had sent reached it.
    BackendReset,
    /// crossbar itself could not go on (no pipe for splice...); both peers were reset.
    LocalError,
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
            RelayEnd::ClientReset => "client_reset",
            RelayEnd::BackendReset => "backend_reset",
            RelayEnd::LocalError => "local_error",
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
    /// The I/O error behind a `ClientReset`/`BackendReset`/`LocalError` end.
    pub error: Option<io::ErrorKind>,
    /// The abort passed on, if a peer aborted (also when the relay then ended by
    /// idle timeout or shutdown while still delivering the aborting peer's bytes).
    pub abort: Option<Abort>,
}

impl RelayStats {
    /// The stats of a relay that moved `(client_to_server, server_to_client)` bytes.
    fn new((c2s, s2c): (u64, u64), end: RelayEnd, abort: Option<Abort>) -> RelayStats {
        RelayStats {
            client_to_server: c2s,
            server_to_client: s2c,
            end,
            error: abort.map(|a| a.error),
            abort,
        }
    }
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
    /// Called once when the client's first byte has been relayed (not at its EOF):
    /// its answer to what the server sent, which proves more than its hello did.
    pub on_client: Option<Box<dyn FnOnce() + Send + 'a>>,
}

/// Activity clock shared by both directions: milliseconds since `start` of the last byte.
struct Activity {
    start: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    /// A clock starting now, with the last byte at its start.
    fn new() -> Activity {
        Activity {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }
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
    /// Neither: crossbar's own resources (a pipe) failed.
    Local(io::Error),
}

/// Relay `src` to `dst` until EOF, then half-close `dst`, unless `aborted` says the
/// other direction found an abort: then `dst` is to be reset, and a FIN ahead of
/// the reset would let it take a truncated stream for a complete one (a reset's
/// error is reported once per socket, so after the other direction's write saw it,
/// this direction's read of the aborting peer ends in a plain EOF).
async fn pump(
    src: ReadHalf<'_>,
    mut dst: WriteHalf<'_>,
    counter: &IntCounter,
    total: &AtomicU64,
    activity: &Activity,
    aborted: &AtomicBool,
    watch: Option<Box<Watch<'_>>>,
) -> Ending {
    let moved = move_bytes(src, &mut dst, counter, total, activity, watch).await;
    ending_of(moved, aborted, dst.shutdown()).await
}

/// The [`Ending`] of a direction whose bytes `moved` as far as they went: on EOF
/// the destination is half-closed by `fin` (awaited only then, and only if
/// `aborted` doesn't say the other direction found an abort), else the side that
/// failed. Shared by every relay, so each reports endings the same way.
async fn ending_of(
    moved: Result<(), Side>,
    aborted: &AtomicBool,
    fin: impl std::future::Future<Output = io::Result<()>>,
) -> Ending {
    match moved {
        Ok(()) if aborted.load(Ordering::Relaxed) => Ending::Fin,
        Ok(()) => match fin.await {
            Ok(()) => Ending::Fin,
            Err(e) => Ending::DestinationAborted(e),
        },
        Err(Side::Read(e)) => Ending::SourceAborted(e),
        Err(Side::Write(e)) => Ending::DestinationAborted(e),
        Err(Side::Local(e)) => Ending::Local(e),
    }
}

/// Move bytes `src` -> `dst` until `src` reaches EOF.
///
/// Like HAProxy's `splice-auto`: bytes are first copied through a per-thread scratch
/// buffer, which for the small messages of a TLS handshake and a Puppet request costs
/// fewer and cheaper syscalls than splice (a read and a write, against two splices and
/// a pipe). Once a read fills the whole buffer the direction is carrying bulk data
/// (a catalog, a file), and on Linux it switches to splice(2) for the rest of its
/// life, unless the handshake is still being watched (the watcher must see the bytes).
/// No buffer is held per connection: bytes a slow destination doesn't take at once
/// wait in a `backlog` allocated for that moment only.
async fn move_bytes(
    mut src: ReadHalf<'_>,
    dst: &mut WriteHalf<'_>,
    counter: &IntCounter,
    total: &AtomicU64,
    activity: &Activity,
    mut watch: Option<Box<Watch<'_>>>,
) -> Result<(), Side> {
    let count = |n: usize| {
        counter.inc_by(n as u64);
        total.fetch_add(n as u64, Ordering::Relaxed);
    };
    let mut backlog: Vec<u8> = Vec::new();
    let mut bulk = false;
    loop {
        if !backlog.is_empty() {
            dst.write_all(&backlog).await.map_err(Side::Write)?;
            count(backlog.len());
            backlog = Vec::new();
        }
        if bulk && watch.is_none() && splice_enabled() {
            // Boxed: only bulk directions get here, and inline it would enlarge every
            // connection's future, idle ones included.
            #[cfg(target_os = "linux")]
            {
                Box::pin(splice::pump(
                    src.as_ref(),
                    dst.as_ref(),
                    counter,
                    total,
                    activity,
                ))
                .await?;
                return Ok(());
            }
        }
        let moved =
            std::future::poll_fn(|cx| copy_once(cx, &mut src, dst, &mut backlog, &mut watch))
                .await?;
        match moved {
            Copied::Eof => {
                if let Some(w) = watch.take() {
                    (w.on_handshake)(w.watcher.info());
                }
                return Ok(());
            }
            Copied::Bytes { written, full } => {
                activity.touch();
                count(written);
                bulk = full;
            }
        }
    }
}

/// What one [`copy_once`] did.
enum Copied {
    /// The source reached EOF.
    Eof,
    /// Bytes were read; `written` of them are already in `dst` (the rest in the
    /// backlog); `full` if the read filled the scratch buffer.
    Bytes { written: usize, full: bool },
}

/// One read from `src` into this thread's scratch buffer and as much of a write to
/// `dst` as it takes now; what it doesn't take goes to `backlog`. All synchronous
/// within one poll, so the scratch buffer is never held across an await.
fn copy_once(
    cx: &mut Context<'_>,
    src: &mut ReadHalf<'_>,
    dst: &mut WriteHalf<'_>,
    backlog: &mut Vec<u8>,
    watch: &mut Option<Box<Watch<'_>>>,
) -> Poll<Result<Copied, Side>> {
    with_scratch(|scratch| {
        let mut rb = ReadBuf::new(scratch);
        match Pin::new(&mut *src).poll_read(cx, &mut rb) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Err(e)) => return Poll::Ready(Err(Side::Read(e))),
            Poll::Ready(Ok(())) => {}
        }
        let full = rb.remaining() == 0;
        let data = rb.filled();
        if data.is_empty() {
            return Poll::Ready(Ok(Copied::Eof));
        }
        let mut written = 0;
        while written < data.len() {
            match Pin::new(&mut *dst).poll_write(cx, &data[written..]) {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(Side::Write(io::ErrorKind::WriteZero.into())))
                }
                Poll::Ready(Ok(m)) => written += m,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(Side::Write(e))),
                Poll::Pending => break,
            }
        }
        backlog.extend_from_slice(&data[written..]);
        // Inspection after forwarding, so it adds no latency.
        if let Some(w) = watch.as_mut() {
            if w.watcher.feed(data) {
                if let Some(w) = watch.take() {
                    (w.on_handshake)(w.watcher.info());
                }
            }
        }
        Poll::Ready(Ok(Copied::Bytes { written, full }))
    })
}

thread_local! {
    /// Each worker thread's copy buffer (see [`pump`]).
    static SCRATCH: RefCell<Box<[u8]>> = RefCell::new(vec![0; BUF_SIZE].into_boxed_slice());
}

/// Run `f` with this thread's scratch buffer (or, should it be in use, which the
/// synchronous callers never allow, a temporary one).
fn with_scratch<R>(f: impl FnOnce(&mut [u8]) -> R) -> R {
    SCRATCH.with(|s| match s.try_borrow_mut() {
        Ok(mut buf) => f(&mut buf),
        Err(_) => f(&mut vec![0; BUF_SIZE]),
    })
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
/// idle for `idle`, a peer aborts, or `hard_stop` fires.
///
/// A peer's abort is passed on as an abort ([`ending`]): the aborting peer's bytes
/// still in flight are delivered first, then the other peer is reset (it is marked
/// SO_LINGER 0 here and reset when the caller drops it).
pub async fn relay(
    client: &mut TcpStream,
    server: &mut TcpStream,
    idle: Duration,
    counters: &RelayCounters<'_>,
    mut watch: Option<Box<Watch<'_>>>,
    hard_stop: &CancellationToken,
) -> RelayStats {
    let activity = Activity::new();
    let (c2s_total, s2c_total) = (AtomicU64::new(0), AtomicU64::new(0));
    let aborted = AtomicBool::new(false);
    let on_client = watch.as_mut().and_then(|w| w.on_client.take());
    let (end, abort) = {
        let (cr, cw) = client.split();
        let (sr, sw) = server.split();
        let c2s = pump(cr, sw, counters.c2s, &c2s_total, &activity, &aborted, None);
        tokio::pin!(c2s);
        let c2s = once_moved(c2s, &c2s_total, on_client);
        let s2c = pump(sr, cw, counters.s2c, &s2c_total, &activity, &aborted, watch);
        tokio::pin!(c2s, s2c);
        drive(c2s, s2c, idle, &activity, &aborted, hard_stop, || {}).await
    };
    if let Some(to) = abort.and_then(|a| abort_goes_to(a, end, client, server)) {
        ending::pass_on(to, idle, hard_stop).await;
    }
    let totals = (c2s_total.into_inner(), s2c_total.into_inner());
    RelayStats::new(totals, end, abort)
}

/// `pump`, running `hook` once as soon as its direction has moved a byte (checked
/// after each poll: bytes are counted before a pump waits again). Not an `async fn`,
/// which would hold the pump's future twice for the connection's life.
fn once_moved<'a, F: std::future::Future>(
    mut pump: Pin<&'a mut F>,
    total: &'a AtomicU64,
    mut hook: Option<Box<dyn FnOnce() + Send + 'a>>,
) -> impl std::future::Future<Output = F::Output> + 'a {
    std::future::poll_fn(move |cx| {
        let polled = pump.as_mut().poll(cx);
        if hook.is_some() && total.load(Ordering::Relaxed) > 0 {
            if let Some(hook) = hook.take() {
                hook();
            }
        }
        polled
    })
}

/// Where an abort is still to be passed on once the relay stopped: the peer that
/// did not abort, to be reset after it acknowledged the aborting peer's bytes.
/// `None` when it is settled here: crossbar's own failure resets both peers, and
/// after an idle timeout or the shutdown deadline delivered bytes wait for no
/// acknowledgement, so the other peer is reset at once.
fn abort_goes_to<'s>(
    a: Abort,
    end: RelayEnd,
    client: &'s TcpStream,
    server: &'s TcpStream,
) -> Option<&'s TcpStream> {
    if a.local {
        ending::reset_on_close(client);
        ending::reset_on_close(server);
        return None;
    }
    let to = match a.by {
        Peer::Client => server,
        Peer::Backend => client,
    };
    if end == RelayEnd::IdleTimeout || end == RelayEnd::Shutdown {
        ending::reset_on_close(to);
        return None;
    }
    Some(to)
}

/// Poll both directions until both are done, the relay is idle for `idle`, or
/// `hard_stop` fires. Once a peer aborts, the direction towards it stops and the
/// direction from it runs on until it has delivered what the aborting peer sent.
/// `refresh` runs before each idle check, so traffic crossbar does not see itself
/// (the kernel relay's) is noted in `activity` before it is judged.
async fn drive(
    mut c2s: Pin<&mut impl std::future::Future<Output = Ending>>,
    mut s2c: Pin<&mut impl std::future::Future<Output = Ending>>,
    idle: Duration,
    activity: &Activity,
    aborted: &AtomicBool,
    hard_stop: &CancellationToken,
    refresh: impl Fn() + Sync,
) -> (RelayEnd, Option<Abort>) {
    let (mut c2s_done, mut s2c_done) = (false, false);
    let mut first_close: Option<RelayEnd> = None;
    let mut abort: Option<Abort> = None;
    let idle_timer = tokio::time::sleep(idle);
    tokio::pin!(idle_timer);
    loop {
        let (source, ending) = tokio::select! {
            r = c2s.as_mut(), if !c2s_done => { c2s_done = true; (Peer::Client, r) }
            r = s2c.as_mut(), if !s2c_done => { s2c_done = true; (Peer::Backend, r) }
            () = &mut idle_timer => {
                refresh();
                let quiet = activity.idle_for();
                if quiet >= idle {
                    return (RelayEnd::IdleTimeout, abort);
                }
                idle_timer.as_mut().reset(tokio::time::Instant::now() + (idle - quiet));
                continue;
            }
            () = hard_stop.cancelled() => return (RelayEnd::Shutdown, abort),
        };
        match (Abort::of(source, &ending), abort) {
            (Some(found), None) => {
                aborted.store(true, Ordering::Relaxed);
                abort = Some(found);
                if found.local {
                    return (RelayEnd::LocalError, abort);
                }
                // Nothing more goes to the peer that aborted.
                match found.by {
                    Peer::Client => s2c_done = true,
                    Peer::Backend => c2s_done = true,
                }
            }
            (Some(_), Some(_)) => {}
            (None, _) => {
                let closed = match source {
                    Peer::Client => RelayEnd::ClientClosed,
                    Peer::Backend => RelayEnd::ServerClosed,
                };
                first_close.get_or_insert(closed);
            }
        }
        if c2s_done && s2c_done {
            let end = match abort {
                Some(Abort {
                    by: Peer::Client, ..
                }) => RelayEnd::ClientReset,
                Some(Abort {
                    by: Peer::Backend, ..
                }) => RelayEnd::BackendReset,
                None => first_close.unwrap_or(RelayEnd::ClientClosed),
            };
            return (end, abort);
        }
    }
}

/// Which relay a service gets on this machine, and why: what `crossbar check` and
/// `crossbar doctor` print.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RelayPlan {
    /// `kernel` or `splice-auto`.
    pub relay: &'static str,
    /// The configured mode and, for `kernel`/`auto`, whether the BPF program loads.
    pub why: String,
}

/// The relay a service configured with `mode` uses here (loading the kernel relay's
/// program on first use: loading needs the privileges `crossbar run` will have).
pub fn plan(mode: crate::config::RelayMode) -> RelayPlan {
    use crate::config::RelayMode;
    match mode {
        RelayMode::SpliceAuto => {
            return RelayPlan {
                relay: "splice-auto",
                why: "relay: splice-auto (the default)".into(),
            }
        }
        RelayMode::Auto => {
            return RelayPlan {
                relay: "splice-auto",
                why: AUTO_WHY.into(),
            }
        }
        RelayMode::Kernel => {}
    }
    #[cfg(target_os = "linux")]
    let loaded = kernel::get().map(|_| ());
    #[cfg(not(target_os = "linux"))]
    let loaded: Result<(), &str> = Err("not Linux");
    match loaded {
        Ok(()) => RelayPlan {
            relay: "kernel",
            why: format!(
                "relay: {}; the BPF sockmap program loads here",
                mode.as_str()
            ),
        },
        Err(why) => RelayPlan {
            relay: "splice-auto",
            why: format!(
                "relay: {}, but the kernel relay can't load here: {why}",
                mode.as_str()
            ),
        },
    }
}

/// Why `relay: auto` chooses splice-auto on every machine for now.
const AUTO_WHY: &str = "relay: auto chooses splice-auto: measured, the kernel relay costs \
                        more CPU per connection and per GB than splice, and the kernel's \
                        sockmap can deliver a segment twice (docs/performance.md)";

/// [`relay`] with the service's `relay:` mode: the kernel relay when asked for by
/// name (`kernel`) and loaded (else, having said why once, splice-auto). `auto`
/// chooses splice-auto (see [`plan`]).
pub async fn relay_as(
    mode: crate::config::RelayMode,
    client: &mut TcpStream,
    server: &mut TcpStream,
    idle: Duration,
    counters: &RelayCounters<'_>,
    watch: Option<Box<Watch<'_>>>,
    hard_stop: &CancellationToken,
) -> RelayStats {
    #[cfg(target_os = "linux")]
    if mode == crate::config::RelayMode::Kernel {
        if let Ok(k) = kernel::get() {
            // Boxed: inline, it would enlarge every connection's future, splice ones too.
            let kernel = kernel::relay(k, client, server, idle, counters, watch, hard_stop);
            return Box::pin(kernel).await;
        }
    }
    let _ = mode;
    relay(client, server, idle, counters, watch, hard_stop).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};
    use tokio::io::AsyncReadExt;
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

    /// Write `data` and half-close while reading everything the peer sends until EOF.
    async fn send_and_drain(stream: &mut TcpStream, data: &[u8]) -> Vec<u8> {
        let (mut r, mut w) = stream.split();
        let send = async {
            w.write_all(data).await.unwrap();
            w.shutdown().await.unwrap();
        };
        let recv = async {
            let mut got = Vec::new();
            r.read_to_end(&mut got).await.unwrap();
            got
        };
        let ((), got) = tokio::join!(send, recv);
        got
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
        let srv =
            tokio::spawn(async move { Sha256::digest(send_and_drain(&mut server, &down2).await) });
        let got = send_and_drain(&mut client, &up2).await;
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

    /// A destination that takes bytes slowly: what it can't take at once waits in
    /// the backlog (and then in splice's pipe, once the direction is bulk); nothing
    /// is lost or reordered, small messages and bulk alike.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn slow_reader_gets_every_byte_in_order() {
        let (mut client, mut proxy_client_side) = pair().await;
        let (mut proxy_server_side, mut server) = pair().await;
        let cnt = counters();
        let relay = tokio::spawn(async move {
            relay(
                &mut proxy_client_side,
                &mut proxy_server_side,
                Duration::from_secs(30),
                &borrow(&cnt),
                None,
                &CancellationToken::new(),
            )
            .await
        });
        // Small writes first (copied), then bulk (spliced), with no reader yet.
        let mut sent = Vec::new();
        for i in 0..200u32 {
            sent.extend_from_slice(&data(1 + (i as usize * 37) % 300, u64::from(i)));
        }
        sent.extend_from_slice(&data(3 << 20, 99));
        let to_send = sent.clone();
        let writer = tokio::spawn(async move {
            let mut at = 0;
            for i in 0..200usize {
                let len = 1 + (i * 37) % 300;
                server.write_all(&to_send[at..at + len]).await.unwrap();
                at += len;
            }
            server.write_all(&to_send[at..]).await.unwrap();
            server.shutdown().await.unwrap();
            server
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut got = Vec::new();
        let mut chunk = [0u8; 1000];
        loop {
            let n = client.read(&mut chunk).await.unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&chunk[..n]);
        }
        assert_eq!(got.len(), sent.len());
        assert!(got == sent, "bytes differ");
        drop(client);
        drop(writer.await.unwrap());
        let stats = relay.await.unwrap();
        assert_eq!(stats.server_to_client, sent.len() as u64);
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
