//! Opening a backend for a client, in one place: dial -> passive health and
//! metrics -> the prelude (PROXY header and ClientHello) -> the backend's first
//! answer, all while watching the client. The connect loop (the first pick and its
//! retries) and placement confirmation (each further candidate) both open backends
//! through [`Offer::open`].
//!
//! Only the ClientHello ever reaches more than one backend: what the client sent
//! behind it (0-RTT early data, a pipelined record) is held until a backend has
//! answered and goes to that one alone: early data carries a request, and two
//! backends that share no anti-replay state would both act on it (RFC 8446 8).
use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::TcpStream;

use super::error::ConnError;
use crate::access_log::AccessLog;
use crate::balance::{Lease, PickError};
use crate::service::Service;
use crate::{dial, health};

/// What the client is watched for while a backend is opened for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ClientWatch {
    /// A reset. In tcp mode an EOF may be a half-close that still wants the answer.
    Resets,
    /// A reset or a close: a TLS client never half-closes mid-handshake, so its EOF
    /// means it left (like HAProxy's abortonclose: no backend connection is opened
    /// for nobody).
    Leaves,
    /// Any byte, a close or a reset: a search must not keep a client waiting.
    Stirs,
}

impl ClientWatch {
    /// Resolves when the client does what is watched for; never otherwise. Peeks,
    /// never reads: bytes the client sends meanwhile stay in the socket.
    ///
    /// [`ClientWatch::Resets`] first waits for the socket's error, which a reset
    /// sets and epoll reports (`EPOLLERR`): no system call until then, where the
    /// peek it replaced ran on every tcp-mode connection (the client's first bytes
    /// made the socket readable). The peek then says whether bytes came before the
    /// reset: those, and the reset after them, are passed on as they would reach
    /// the backend directly (`tests/relay/endings.rs`). Leaves and Stirs peek once the
    /// socket shows readable; tokio clears a stale readable on the hello's short
    /// last read, so they make no system call when nothing happened.
    pub(super) async fn fired(self, client: &TcpStream) {
        if self == Self::Resets && client.ready(Interest::ERROR).await.is_err() {
            return; // the runtime is going away
        }
        let mut probe = [0u8; 1];
        match (client.peek(&mut probe).await, self) {
            (Err(_), _) | (Ok(0), Self::Leaves | Self::Stirs) | (Ok(_), Self::Stirs) => {}
            _ => std::future::pending().await,
        }
    }
}

/// Why a backend could not be opened (each already counted and logged).
#[derive(Debug)]
pub(super) enum Unopened {
    /// The dial failed.
    Connect(io::Error),
    /// The prelude could not be written and no answer was awaited (tcp mode).
    Write(io::Error),
    /// Reached, but it closed, reset or refused the prelude before its first byte:
    /// it has been sent nothing but the hello, so another backend may have it.
    Closed,
    /// Reached, but silent for `timeouts.server_hello`.
    Silent,
    /// The client did what it was watched for.
    Client,
}

/// One client's side of opening backends: who it is and what each backend is sent
/// before it answers.
pub(super) struct Offer<'a> {
    /// The service the client was routed to.
    pub svc: &'a Service,
    /// The client (only peeked at, never read or written).
    pub client: &'a TcpStream,
    /// The client's address (the PROXY header's source).
    pub peer: SocketAddr,
    /// The SNI (the PROXY v2 authority).
    pub sni: Option<&'a str>,
    /// The ClientHello's bytes, empty in tcp mode.
    pub hello: &'a [u8],
    /// Where the opened connections are known as crossbar's own.
    pub own: &'a std::sync::Arc<crate::dial::OwnSockets>,
}

impl Offer<'_> {
    /// Open `backend`: dial it (a passive health result and the connect metrics
    /// either way; the dial's whole milliseconds, failed or not, added to
    /// `dialed`), send it the
    /// PROXY header and the hello, then, given `answer`, wait that long for its
    /// first byte (it stays in the socket). Gives up as soon as the client does
    /// what `watch` looks for.
    pub(super) async fn open(
        &self,
        lease: &Lease,
        watch: ClientWatch,
        answer: Option<Duration>,
        dialed: &mut Option<u32>,
    ) -> Result<TcpStream, Unopened> {
        tokio::select! {
            r = self.reach(lease, answer, dialed) => r,
            () = watch.fired(self.client) => Err(Unopened::Client),
        }
    }

    async fn reach(
        &self,
        lease: &Lease,
        answer: Option<Duration>,
        dialed: &mut Option<u32>,
    ) -> Result<TcpStream, Unopened> {
        let (svc, b) = (self.svc, &**lease.backend());
        let dial = {
            // Scoped to the dial: no clock held across the awaits after it.
            let started = Instant::now();
            let dialing = dial::connect_to(
                &b.config.address,
                svc.config.timeouts.connect,
                b.config.source.or(svc.config.source),
            );
            let r = dialing.await;
            let took = started.elapsed();
            let ms = u32::try_from(took.as_millis()).unwrap_or(u32::MAX);
            *dialed = Some(dialed.unwrap_or(0).saturating_add(ms));
            if r.is_ok() {
                b.metrics.connect_duration.observe(took.as_secs_f64());
            }
            r
        };
        let mut server = match dial {
            Ok(s) => s,
            Err(e) => {
                b.metrics.connect_errors.inc();
                health::passive_failure(svc, b, &e);
                tracing::warn!(service = %svc.name(), backend = %b.name, address = %b.config.address, "connect failed: {e}");
                return Err(Unopened::Connect(e));
            }
        };
        if let Some(own) = self.own.hold(&server) {
            lease.hold(own);
        }
        health::passive_success(b);
        let proxy = b.config.proxy_protocol;
        let (client, peer, sni) = (self.client, self.peer, self.sni);
        let Some(limit) = answer else {
            let sent = dial::send_prelude(&mut server, client, peer, proxy, sni, self.hello);
            sent.await.map_err(Unopened::Write)?;
            return Ok(server);
        };
        let answered = async {
            dial::send_prelude(&mut server, client, peer, proxy, sni, self.hello).await?;
            first_byte(&server).await
        };
        match tokio::time::timeout(limit, answered).await {
            Ok(Ok(())) => Ok(server),
            // Counted, retried, but not held against the backend's health: a
            // client can provoke it at will (a JDK server closes on a hello it
            // will not serve), so counting it would let any client take a
            // backend down for everyone. A master that is really gone refuses
            // the next connect, and active checks see one that closes on all.
            Ok(Err(e)) => {
                b.metrics.connect_errors.inc();
                tracing::warn!(service = %svc.name(), backend = %b.name, "closed before answering the ClientHello: {e}");
                Err(Unopened::Closed)
            }
            Err(_) => {
                b.metrics.server_hello_timeouts.inc();
                let e = io::Error::new(io::ErrorKind::TimedOut, "no answer to the ClientHello");
                health::passive_failure(svc, b, &e);
                tracing::warn!(service = %svc.name(), backend = %b.name, "did not answer the ClientHello within {limit:?}");
                Err(Unopened::Silent)
            }
        }
    }
}

/// Wait for a backend's first byte without taking it (the relay reads it, with
/// what follows, in one read); EOF or a reset first is an error.
///
/// Readiness alone tells, without a system call, in the usual case: nothing has
/// read this socket yet, so a readable without a hang-up or an error means bytes
/// are waiting. Only a close or a reset, which may come after bytes (an alert,
/// then FIN), takes a peek to tell whether anything came first.
async fn first_byte(server: &TcpStream) -> io::Result<()> {
    let ready = server.ready(Interest::READABLE | Interest::ERROR).await?;
    if ready.is_readable() && !ready.is_read_closed() && !ready.is_error() {
        return Ok(());
    }
    let mut probe = [0u8; 1];
    match server.peek(&mut probe).await? {
        0 => Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed",
        )),
        _ => Ok(()),
    }
}

/// Step 4: reserve a backend (the sticky one if it can take the connection) and
/// open it, moving on to other backends on failure, up to `retries` more attempts
/// in all. In tls mode a backend that closes before its first byte, or sends none
/// within `timeouts.server_hello`, is retried like a refused connect (the client
/// has seen nothing yet), and `held` (the client's bytes behind the hello) goes
/// only to the backend that answered, once it has. Returns the backend, its slot
/// and the backends that failed before it.
///
/// The log gets the time spent in the queue (`queue_ms`, 0 once a pick was
/// reached without waiting) and the dials' time (`connect_ms`: every try's TCP
/// connect, the failed ones included, as HAProxy's `Tc` counts retries; not the
/// wait for the backend's answer). Both go straight into the log line, which the
/// connection holds anyway: no more state in this future.
pub(super) async fn connect(
    offer: &Offer<'_>,
    tls: bool,
    held: &[u8],
    mut sticky: Option<usize>,
    log: &mut AccessLog,
) -> Result<(TcpStream, Lease, Vec<usize>), ConnError> {
    let svc = offer.svc;
    let ip = offer.peer.ip().to_canonical();
    let (watch, answer) = match tls {
        true => (ClientWatch::Leaves, Some(svc.config.timeouts.server_hello)),
        false => (ClientWatch::Resets, None),
    };
    let mut tried: Vec<usize> = Vec::new();
    let mut last = None;
    log.queue_ms = Some(0);
    while tried.len() <= svc.config.retries as usize {
        let lease = match sticky.take().and_then(|i| svc.pool.try_preferred(i)) {
            Some(l) => l,
            None => {
                let picked = tokio::select! {
                    r = svc.pool.acquire_timed(ip, &tried, log.queue_ms.get_or_insert(0)) => Some(r),
                    () = watch.fired(offer.client) => None,
                };
                match picked {
                    Some(Ok(l)) => l,
                    Some(Err(PickError::NoBackendAvailable)) if !tried.is_empty() => break,
                    Some(Err(e)) => return Err(refused(svc, e)),
                    None => return Err(ConnError::ClientGone),
                }
            }
        };
        let b = lease.backend().clone();
        // Every backend this connection went to counts, the failed ones included.
        log.tried = u32::try_from(tried.len() + 1).unwrap_or(u32::MAX);
        let opened = offer.open(&lease, watch, answer, &mut log.connect_ms).await;
        let backend = b.name.clone();
        if !matches!(opened, Err(Unopened::Client)) {
            log.backend = Some(backend.clone());
        }
        last = match opened {
            Ok(mut server) => {
                if !held.is_empty() {
                    let sent = server.write_all(held).await;
                    sent.map_err(|error| ConnError::BackendWrite { backend, error })?;
                }
                return Ok((server, lease, tried));
            }
            Err(Unopened::Client) => return Err(ConnError::ClientGone),
            Err(Unopened::Write(error)) => return Err(ConnError::BackendWrite { backend, error }),
            Err(Unopened::Connect(error)) => Some(ConnError::Connect { backend, error }),
            Err(Unopened::Silent) => Some(ConnError::ServerHelloTimeout {
                backend,
                after: svc.config.timeouts.server_hello,
            }),
            // Tried again elsewhere; if none is left, the client is closed the same
            // way (it would be directly), and the log says it was the backend.
            Err(Unopened::Closed) => Some(ConnError::ClosedUnanswered { backend }),
        };
        tried.push(b.index);
    }
    // The last failure, else: no backend was left to try.
    Err(last.unwrap_or_else(|| refused(svc, PickError::NoBackendAvailable)))
}

/// Count a refusal to pick a backend (`crossbar_route_refused_total`).
fn refused(svc: &Service, e: PickError) -> ConnError {
    if e == PickError::QueueTimeout {
        svc.metrics.queue_timeouts.inc();
    }
    svc.metrics.refused(e.reason());
    ConnError::Pick(e)
}
