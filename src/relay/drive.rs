//! Runs a relay: both directions' pumps polled to their ends, the idle timeout and
//! the shutdown deadline, and, when a peer aborted, where that abort goes
//! ([`ending::pass_on`]).
use std::future::Future;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::config::Keepalive;

use super::copy::{self, HandshakeObserver, Watch};
use super::ending::{self, Abort, Ending, Ends, Peer};
use super::hard_stop::HardStop;
use super::meter::{Activity, Meter, RelayCounters};
use super::outcome::{RelayEnd, RelayStats};

/// A relay's clocks: how long it may sit idle, and the backend socket's keepalive.
/// (Borrowed from the service: every connection's future holds this for its life.)
#[derive(Debug, Clone, Copy)]
pub struct Timing<'a> {
    /// Close after this long with no byte either way (`timeouts.idle`).
    pub idle: Duration,
    /// The backend socket's TCP keepalive (`keepalive:`), turned on only once the
    /// relay has run for half its `time` (`drive::LazyKeepalive`).
    pub backend_keepalive: Option<&'a Keepalive>,
}

impl From<Duration> for Timing<'_> {
    /// An idle timeout and no keepalive to arm.
    fn from(idle: Duration) -> Self {
        Timing {
            idle,
            backend_keepalive: None,
        }
    }
}

/// Relay `client` <-> `server` until both directions are closed, the connection is
/// idle for `timing.idle`, a peer aborts, or `hard_stop` fires.
///
/// A peer's abort is passed on as an abort ([`ending`]): the aborting peer's bytes
/// still in flight are delivered first, then the other peer is reset (it is marked
/// SO_LINGER 0 here and reset when the caller drops it).
///
/// A FIN is passed on as a half-close, except the second one: once both peers have
/// sent theirs, the caller's close sends it, so the caller must drop both sockets as
/// soon as this returns (`ending::Ends`).
pub async fn relay(
    client: &mut TcpStream,
    server: &mut TcpStream,
    timing: impl Into<Timing<'_>>,
    counters: &RelayCounters<'_>,
    watch: Option<Box<Watch<'_>>>,
    hard_stop: &HardStop,
) -> RelayStats {
    let Timing {
        idle,
        backend_keepalive,
    } = timing.into();
    let keepalive = backend_keepalive.map(|ka| LazyKeepalive::new(server, ka));
    let activity = Activity::new();
    let c2s_meter = Meter::new(counters.c2s, &counters.conn.c2s, &activity);
    let s2c_meter = Meter::new(counters.s2c, &counters.conn.s2c, &activity);
    let ends = Ends::default();
    let on_client = watch.as_ref().map(|w| w.observer());
    let (end, abort) = {
        let (cr, cw) = client.split();
        let (sr, sw) = server.split();
        let c2s = copy::pump(cr, sw, &c2s_meter, (Peer::Client, &ends), None);
        tokio::pin!(c2s);
        let c2s = on_moved(c2s, &c2s_meter, on_client);
        let s2c = copy::pump(sr, cw, &s2c_meter, (Peer::Backend, &ends), watch);
        tokio::pin!(c2s, s2c);
        let clocks = (idle, keepalive);
        drive(c2s, s2c, clocks, &activity, &ends, hard_stop).await
    };
    if let Some(to) = abort.and_then(|a| abort_goes_to(a, end, client, server)) {
        ending::pass_on(to, idle, hard_stop).await;
    }
    let totals = (c2s_meter.total(), s2c_meter.total());
    RelayStats::new(totals, end, abort)
}

/// `pump`, running `hook` each time its direction has moved more bytes (checked
/// after each poll: bytes are counted before a pump waits again), until the hook
/// says it has heard enough. Not an `async fn`, which would hold the pump's future
/// twice for the connection's life.
fn on_moved<'a, F: Future>(
    mut pump: Pin<&'a mut F>,
    meter: &'a Meter<'a>,
    mut hook: Option<&'a dyn HandshakeObserver>,
) -> impl Future<Output = F::Output> + 'a {
    let mut seen = 0;
    std::future::poll_fn(move |cx| {
        let polled = pump.as_mut().poll(cx);
        if let Some(h) = hook.as_mut() {
            let moved = meter.moved();
            if moved > seen {
                seen = moved;
                if h.client_moved() {
                    hook = None;
                }
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

/// The backend socket's keepalive, turned on when the relay has run for half of
/// `keepalive.time`: most connections (a Puppet agent's run) end long before, and
/// so never pay the four setsockopt calls.
///
/// The first probe still goes after `time` of silence, as if it had been on from
/// the start: Linux counts that silence from the last segment received, whenever
/// keepalive is turned on (setting TCP_KEEPIDLE on a live socket re-arms its timer
/// for what is left), and a connection younger than `time` cannot have been silent
/// longer. Half of `time` leaves a late timer all the margin it needs.
pub(super) struct LazyKeepalive<'a> {
    /// The backend socket, borrowed by the relay for as long as this lives.
    fd: RawFd,
    ka: &'a Keepalive,
}

impl<'a> LazyKeepalive<'a> {
    fn new(server: &TcpStream, ka: &'a Keepalive) -> LazyKeepalive<'a> {
        LazyKeepalive {
            fd: server.as_raw_fd(),
            ka,
        }
    }

    /// How long after the relay's start it is armed.
    fn due(&self) -> Duration {
        self.ka.time / 2
    }

    /// Turn keepalive on; a failure is logged, not fatal (as at connect before).
    #[allow(unsafe_code)]
    fn arm(self) {
        // SAFETY: `fd` is the backend socket `relay` holds `&mut` to while its
        // `drive` runs, the only caller: the descriptor is open and the same socket.
        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(self.fd) };
        let sock = socket2::SockRef::from(&fd);
        if let Err(e) = crate::listener::set_keepalive(&sock, Some(*self.ka)) {
            tracing::debug!("TCP keepalive not set on the backend socket: {e}");
        }
    }
}

/// When the relay's timer is next due: at `idle_at`, or earlier to arm `keepalive`
/// (due `k.due()` after the relay's start, `started`).
fn next_wake(idle_at: Instant, keepalive: Option<&LazyKeepalive>, started: Instant) -> Instant {
    keepalive.map_or(idle_at, |k| idle_at.min(started + k.due()))
}

/// Poll both directions until both are done, the relay is idle for `idle`, or
/// `hard_stop` fires; on the way, arm the backend's keepalive when it is due. Once
/// a peer aborts, the direction towards it stops and the direction from it runs on
/// until it has delivered what the aborting peer sent.
async fn drive(
    mut c2s: Pin<&mut impl Future<Output = Ending>>,
    mut s2c: Pin<&mut impl Future<Output = Ending>>,
    (idle, mut keepalive): (Duration, Option<LazyKeepalive<'_>>),
    activity: &Activity,
    ends: &Ends,
    hard_stop: &HardStop,
) -> (RelayEnd, Option<Abort>) {
    let (mut c2s_done, mut s2c_done) = (false, false);
    let mut first_close: Option<RelayEnd> = None;
    let mut abort: Option<Abort> = None;
    // One timer for both clocks: a short connection never sees it fire. The
    // relay's start is `activity`'s (no clock read here, no instant of its own in
    // this future).
    let started = activity.started();
    let first = next_wake(started + idle, keepalive.as_ref(), started);
    let idle_timer = tokio::time::sleep_until(first);
    // One wait for the whole relay, not one per loop turn (each registers a waiter).
    let stopped = hard_stop.stopped();
    tokio::pin!(idle_timer, stopped);
    loop {
        let (source, ending) = tokio::select! {
            r = c2s.as_mut(), if !c2s_done => { c2s_done = true; (Peer::Client, r) }
            r = s2c.as_mut(), if !s2c_done => { s2c_done = true; (Peer::Backend, r) }
            () = &mut idle_timer => {
                let now = Instant::now();
                let started = activity.started();
                if let Some(k) = keepalive.take_if(|k| started + k.due() <= now) {
                    k.arm();
                }
                let quiet = activity.idle_for();
                if quiet >= idle {
                    return (RelayEnd::IdleTimeout, abort);
                }
                let idle_at = now + (idle - quiet);
                idle_timer.as_mut().reset(next_wake(idle_at, keepalive.as_ref(), started));
                continue;
            }
            () = &mut stopped => return (RelayEnd::Shutdown, abort),
        };
        match (Abort::of(source, &ending), abort) {
            (Some(found), None) => {
                ends.set_aborted();
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

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::IntCounter;
    use sha2::{Digest, Sha256};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
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
            // A test relay's totals live as long as the test process.
            conn: Box::leak(Box::default()),
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
        let stop = HardStop::new();
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
                &HardStop::new(),
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

    /// One peer finishes first and keeps reading while the other still sends, then
    /// finishes too: the first FIN reaches the other side as a half-close (its
    /// sender still gets every byte it sends after it), and the second FIN, which
    /// the relay leaves to the close that follows it, reaches its peer as a clean
    /// EOF after every byte, never a reset. Both orders.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_fin_arrives_after_every_byte_in_either_order() {
        for client_first in [true, false] {
            let (mut client, mut proxy_client_side) = pair().await;
            let (mut proxy_server_side, mut server) = pair().await;
            let relay = tokio::spawn(async move {
                let cnt = counters();
                let stop = HardStop::new();
                let idle = Duration::from_secs(30);
                let c = &mut proxy_client_side;
                relay(c, &mut proxy_server_side, idle, &borrow(&cnt), None, &stop).await
                // Both sockets are closed here, as the relay's caller does.
            });
            let (first, second) = match client_first {
                true => (&mut client, &mut server),
                false => (&mut server, &mut client),
            };
            let early = data(1000, 3);
            let late = data(300_000, 4);
            first.write_all(&early).await.unwrap();
            first.shutdown().await.unwrap();
            // The half-close arrives after the bytes before it, as an EOF.
            let mut got = Vec::new();
            second.read_to_end(&mut got).await.unwrap();
            assert!(got == early, "the first sender's bytes");
            // The other way still carries everything, then the second FIN.
            let ((), (got, end)) = tokio::join!(
                async {
                    second.write_all(&late).await.unwrap();
                    second.shutdown().await.unwrap();
                },
                async {
                    let mut got = Vec::new();
                    let end = first.read_to_end(&mut got).await.map(|_| ());
                    (got, end.map_err(|e| e.kind()))
                }
            );
            assert_eq!(end, Ok(()), "a clean EOF, client first: {client_first}");
            assert!(got == late, "the second sender's bytes");
            let stats = relay.await.unwrap();
            assert_eq!(stats.abort, None);
        }
    }

    /// The backend socket's keepalive is off while the connection is younger than
    /// half of `keepalive.time` (short connections never pay for it), then on with
    /// the configured timing.
    #[tokio::test(start_paused = true)]
    async fn backend_keepalive_is_armed_once_the_connection_has_lived() {
        let (_client, mut a) = pair().await;
        let (mut b, _server) = pair().await;
        // The same socket through a second descriptor: its options are the socket's.
        let probe = socket2::SockRef::from(&b).try_clone().unwrap();
        // Borrowed for the spawned relay's life, as the service lends its own.
        let ka: &'static Keepalive = Box::leak(Box::new(Keepalive {
            time: Duration::from_secs(100),
            interval: Duration::from_secs(7),
            probes: 3,
        }));
        let timing = Timing {
            idle: Duration::from_secs(3600),
            backend_keepalive: Some(ka),
        };
        let relay = tokio::spawn(async move {
            let (cnt, stop) = (counters(), HardStop::new());
            relay(&mut a, &mut b, timing, &borrow(&cnt), None, &stop).await
        });
        tokio::time::sleep(Duration::from_secs(49)).await;
        assert!(!probe.keepalive().unwrap(), "on before half of `time`");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(probe.keepalive().unwrap(), "off after half of `time`");
        assert_eq!(probe.keepalive_time().unwrap(), ka.time);
        assert_eq!(probe.keepalive_interval().unwrap(), ka.interval);
        assert_eq!(probe.keepalive_retries().unwrap(), ka.probes);
        relay.abort();
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
            &HardStop::new(),
        )
        .await;
        assert_eq!(stats.end, RelayEnd::IdleTimeout);
    }

    #[tokio::test]
    async fn hard_stop_cuts() {
        let (_client, mut a) = pair().await;
        let (mut b, _server) = pair().await;
        let stop = HardStop::new();
        stop.stop();
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

    /// The hard stop ends every relay, busy or idle, started on either worker: each
    /// waits on its thread's shard and keeps its registration while chunks wake it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn hard_stop_ends_every_relay_busy_or_idle() {
        let stop = std::sync::Arc::new(HardStop::new());
        let mut relays = Vec::new();
        let mut clients = Vec::new();
        for i in 0..16 {
            let (mut client, mut a) = pair().await;
            let (mut b, mut server) = pair().await;
            let stop = stop.clone();
            relays.push(tokio::spawn(async move {
                let cnt = counters();
                let stats = relay(
                    &mut a,
                    &mut b,
                    Duration::from_secs(600),
                    &borrow(&cnt),
                    None,
                    &stop,
                )
                .await;
                (stats.end, cnt.0.get())
            }));
            // Half of them busy: bytes keep waking their relay's task.
            if i % 2 == 0 {
                client.write_all(b"ping").await.unwrap();
                let mut got = [0u8; 4];
                server.read_exact(&mut got).await.unwrap();
                clients.push(tokio::spawn(async move {
                    // Bounded: ends when the relay is cut (write or read fails).
                    for _ in 0..1_000_000u32 {
                        if client.write_all(&[7u8; 512]).await.is_err() {
                            break;
                        }
                        let mut sink = [0u8; 512];
                        match server.read(&mut sink).await {
                            Ok(0) | Err(_) => break,
                            Ok(_) => {}
                        }
                    }
                }));
            } else {
                clients.push(tokio::spawn(async move {
                    let mut sink = Vec::new();
                    let _ = client.read_to_end(&mut sink).await; // ok: ends with the cut
                    drop(server);
                }));
            }
        }
        // Every busy relay has moved bytes since it started waiting.
        stop.stop();
        for r in relays {
            // Hang guard only: a relay the stop did not wake never ends.
            let ended = tokio::time::timeout(Duration::from_secs(60), r).await;
            let (end, _) = ended.expect("the hard stop ended the relay").unwrap();
            assert_eq!(end, RelayEnd::Shutdown);
        }
        for c in clients {
            c.await.unwrap();
        }
    }
}
