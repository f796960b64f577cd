//! Steps 5-7: relay both ways while watching the server's handshake, learn stick
//! entries from it once the server has proven the client's side, and record how
//! the relay ended.
use std::net::IpAddr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::error::ConnError;
use crate::access_log::{AccessLog, End};
use crate::balance::Backend;
use crate::hello::{ClientHelloInfo, ServerHandshake, ServerProof, ServerWatcher};
use crate::open_connections::OpenConn;
use crate::relay::{self, HandshakeObserver, RelayCounters, RelayEnd, RelayStats, Watch};
use crate::service::Service;
use crate::stick::LearnWhen;

/// How many bytes of the server's handshake the watcher may look at: a full TLS 1.2
/// flight carries the certificate chain (Puppet's is ~4 KiB; big chains ~16 KiB).
const SERVER_WATCH_LIMIT: usize = 64 * 1024;

/// What the relay of one connection needs beyond its sockets: where it goes, what
/// the client said, and answer bytes already read.
pub(super) struct Relaying<'a> {
    /// The service.
    pub(super) svc: &'a Service,
    /// The backend it was placed on.
    pub(super) backend: &'a Backend,
    /// Its entry in the registry of open connections.
    pub(super) open: &'a OpenConn,
    /// The client's hello, in tls mode.
    pub(super) hello: Option<&'a ClientHelloInfo>,
    /// The client's address, as stickiness on `source` keys it.
    pub(super) ip: IpAddr,
    /// Answer bytes read while confirming the placement.
    pub(super) pending: &'a [u8],
}

/// Steps 5-6: relay both ways until both sides closed; in tls mode the server's
/// handshake is watched on the way and stick entries are learned from it, once the
/// client has proven enough ([`crate::stick::learn_when`]). Answer bytes read while
/// confirming the placement (`pending`) reach the client, and the watcher, first.
/// Returns the relay's outcome and the handshake kind (`full`/`resumed`) if it showed.
pub(super) async fn relay_watched(
    stream: &mut TcpStream,
    server: &mut TcpStream,
    r: Relaying<'_>,
    hard_stop: &relay::HardStop,
) -> Result<(RelayStats, Option<&'static str>), ConnError> {
    let learner = r.hello.map(|hello| Learner::new(&r, hello));
    let mut watch = learner
        .as_ref()
        .map(|l| Box::new(Watch::new(ServerWatcher::new(SERVER_WATCH_LIMIT), l)));
    replay_pending(stream, r.pending, r.backend, &mut watch).await?;
    let counters = RelayCounters {
        c2s: &r.backend.metrics.bytes_c2s,
        s2c: &r.backend.metrics.bytes_s2c,
        conn: &r.open.bytes,
    };
    let timing = relay::Timing {
        idle: r.svc.config.timeouts.idle,
        backend_keepalive: r.svc.config.keepalive.as_ref(),
    };
    let stats = relay::relay(stream, server, timing, &counters, watch, hard_stop).await;
    Ok((stats, learner.and_then(|l| l.kind())))
}

/// Answer bytes read while confirming the placement (`pending`) reach the client
/// first, counted, and pass through the watcher, which may finish on them.
async fn replay_pending(
    stream: &mut TcpStream,
    pending: &[u8],
    backend: &Backend,
    watch: &mut Option<Box<Watch<'_>>>,
) -> Result<(), ConnError> {
    if pending.is_empty() {
        return Ok(());
    }
    stream
        .write_all(pending)
        .await
        .map_err(|_| ConnError::ClientGone)?;
    backend.metrics.bytes_s2c.inc_by(pending.len() as u64);
    if let Some(w) = watch.as_mut() {
        w.feed(pending);
    }
    Ok(())
}

/// Where a connection is in proving its handshake ([`crate::stick::learn_when`]):
/// the server's handshake not seen yet (client bytes now answer nothing).
const WAITING: u8 = 0;
/// The server's handshake seen; what it teaches of the client's address waits for
/// the client's next flight ([`Learner::held`]).
const HELD: u8 = 1;
/// The client's next flight relayed; what the handshake teaches of its address
/// waits for a server record that proves the flight ([`crate::hello::server_proof`]).
const FLIGHT: u8 = 2;
/// Learned, or nothing to learn.
const DONE: u8 = 3;

/// Learns stick entries from the server's handshake as the relay shows it, and of
/// the client's address once the server answered the client's next flight with
/// more than an alert: the relay's
/// [`HandshakeObserver`] for one connection.
struct Learner<'a> {
    r: &'a Relaying<'a>,
    hello: &'a ClientHelloInfo,
    /// The handshake's kind for the access log, once seen: an index into
    /// [`HANDSHAKE_KINDS`] plus one, 0 while unseen. (The learner lives in the
    /// connection's future for the connection's life: a byte, not a pointer.)
    kind: AtomicU8,
    /// [`WAITING`], [`HELD`] or [`DONE`].
    flight: AtomicU8,
    /// The server's handshake while [`HELD`] (boxed: most connections never hold one).
    held: OnceLock<Box<ServerHandshake>>,
}

impl<'a> Learner<'a> {
    fn new(r: &'a Relaying<'a>, hello: &'a ClientHelloInfo) -> Learner<'a> {
        Learner {
            r,
            hello,
            kind: AtomicU8::new(0),
            flight: AtomicU8::new(WAITING),
            held: OnceLock::new(),
        }
    }
}

impl Learner<'_> {
    /// The handshake's kind (`full`/`resumed`), if the server's handshake showed it.
    fn kind(&self) -> Option<&'static str> {
        let i = usize::from(self.kind.load(Ordering::Acquire));
        i.checked_sub(1)
            .and_then(|i| HANDSHAKE_KINDS.get(i))
            .copied()
    }
}

/// The access log's words for a handshake.
const HANDSHAKE_KINDS: [&str; 2] = ["full", "resumed"];

impl HandshakeObserver for Learner<'_> {
    fn handshake(&self, hs: &ServerHandshake) {
        let (svc, backend) = (self.r.svc, self.r.backend);
        self.kind
            .store(handshake_kind(backend, hs), Ordering::Release);
        self.r.open.handshake_seen();
        let Some(s) = svc.sticking() else {
            self.flight.store(DONE, Ordering::Release);
            return;
        };
        s.learn_handshake(self.hello, hs, &backend.name);
        let next = match crate::stick::learn_when(self.hello, hs) {
            LearnWhen::Now => {
                s.learn_source(hs, self.r.ip, &backend.name);
                DONE
            }
            LearnWhen::AfterServerProof => {
                let _ = self.held.set(Box::new(hs.clone())); // ok: set once
                HELD
            }
            LearnWhen::Never => DONE,
        };
        self.flight.store(next, Ordering::Release);
    }

    fn client_moved(&self) -> bool {
        match self.flight.load(Ordering::Acquire) {
            // Bytes before the server's handshake answered nothing.
            WAITING => false,
            HELD => {
                // Only a server record proves the flight (`server_record`).
                let _ = self // ok: lost only to a concurrent DONE
                    .flight
                    .compare_exchange(HELD, FLIGHT, Ordering::AcqRel, Ordering::Acquire);
                true
            }
            _ => true,
        }
    }

    fn server_record(&self, content_type: u8, len: u16) -> bool {
        match self.flight.load(Ordering::Acquire) {
            // Records before the client's flight (the rest of the server's own).
            WAITING | HELD => false,
            FLIGHT => match crate::hello::server_proof(content_type, len) {
                ServerProof::Unknown => false,
                ServerProof::Refused => {
                    self.flight.store(DONE, Ordering::Release);
                    true
                }
                ServerProof::Proven => {
                    let won = self
                        .flight
                        .compare_exchange(FLIGHT, DONE, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok();
                    if let (true, Some(hs), Some(s)) = (won, self.held.get(), self.r.svc.sticking())
                    {
                        s.learn_source(hs, self.r.ip, &self.r.backend.name);
                    }
                    true
                }
            },
            _ => true,
        }
    }
}

/// Count a server handshake as full or resumed; its code for [`Learner::kind`]:
/// its access-log word's place in [`HANDSHAKE_KINDS`] plus one, 0 when not shown.
fn handshake_kind(backend: &Backend, hs: &ServerHandshake) -> u8 {
    match hs.resumed {
        Some(false) => {
            backend.metrics.full.inc();
            1
        }
        Some(true) => {
            backend.metrics.resumed.inc();
            2
        }
        None => 0,
    }
}

/// Step 7 (the part the relay decides): bytes, handshake kind and how it ended.
pub(super) fn record_relay(
    log: &mut AccessLog,
    stats: &RelayStats,
    handshake: Option<&'static str>,
    replayed: u64,
    svc: &Service,
    backend: &Backend,
) {
    log.handshake = handshake;
    log.c2s = stats.client_to_server + replayed;
    log.s2c = stats.server_to_client;
    log.end = End::word(stats.end.as_str());
    if let Some(kind) = &stats.error {
        log.error = Some(format!("{kind}"));
    }
    if let Some(abort) = stats.abort.filter(|a| !a.local) {
        svc.metrics.reset(abort.by);
    }
    if stats.end == RelayEnd::BackendReset && stats.server_to_client == 0 {
        tracing::warn!(service = %svc.name(), backend = %backend.name, "backend reset the connection before answering");
    }
}
