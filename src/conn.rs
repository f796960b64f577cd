//! One client connection, from accept to the access-log line, as named steps:
//! decide the client (a trusted tier's PROXY header) -> read the hello -> route ->
//! place -> connect (and replay the hello) -> relay while watching the server's
//! handshake and learning from it -> log.
//!
//! Where a connection goes is decided by [`crate::stick`]'s placement policy (the
//! sticky backend) and [`crate::balance`] (everything else); this file only runs the
//! steps in order, each bounded in time, and knows which side ended it.
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::access_log::AccessLog;
use crate::balance::{Backend, Lease, PickError};
use crate::connections::{OpenConn, Opening};
use crate::hello::{self, ClientHelloInfo, HelloError, HelloParse, ServerHandshake, ServerWatcher};
use crate::listener::{Accepted, InheritedOptions};
use crate::proxy_protocol::{self, FrontError};
use crate::relay::{self, RelayCounters, RelayEnd, RelayStats, Watch};
use crate::service::{ListenerRoutes, Service, Shared};
use crate::stick::LearnWhen;
use crate::{dial, health};

/// Bytes beyond `max_hello_size` we accept in the first read burst (record headers,
/// a few bytes of data pipelined after the hello).
const HELLO_SLACK: usize = 1024;
/// How many bytes of the server's handshake the watcher may look at: a full TLS 1.2
/// flight carries the certificate chain (Puppet's is ~4 KiB; big chains ~16 KiB).
const SERVER_WATCH_LIMIT: usize = 64 * 1024;
/// Read granularity while waiting for the hello; a typical hello is 512 B - 2 KiB.
const HELLO_READ_CHUNK: usize = 4096;

/// Why a connection ended before or instead of a relay; knows the side at fault.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnError {
    #[error("{0}")]
    Front(FrontError),
    #[error("client hello: {0}")]
    Hello(HelloError),
    #[error("no service for server name {0:?}")]
    NoRoute(Option<String>),
    #[error("{0}")]
    Pick(PickError),
    #[error("connect to {backend} failed: {error}")]
    Connect { backend: Arc<str>, error: io::Error },
    #[error("writing to backend {backend} failed: {error}")]
    BackendWrite { backend: Arc<str>, error: io::Error },
    #[error("the client closed while waiting for a backend")]
    ClientGone,
    #[error("backend {backend} did not answer the ClientHello within {after:?}")]
    ServerHelloTimeout { backend: Arc<str>, after: Duration },
}

impl ConnError {
    fn reason(&self) -> String {
        match self {
            ConnError::Front(e) => format!("proxy_error:{}", e.reason()),
            ConnError::Hello(e) => format!("hello_error:{}", e.reason()),
            ConnError::NoRoute(_) => "refused:no_route".into(),
            ConnError::Pick(e) => format!("refused:{}", e.reason()),
            ConnError::Connect { .. } => "connect_failed".into(),
            ConnError::BackendWrite { .. } => "server_error".into(),
            ConnError::ClientGone => "client_closed".into(),
            ConnError::ServerHelloTimeout { .. } => "server_hello_timeout".into(),
        }
    }
}

/// Serve one accepted connection to the end. Never panics on client input; every
/// outcome is logged once on `crossbar::access`.
///
/// Not an `async fn`: an async fn keeps its arguments in the future twice (as
/// captured and as moved-in locals), and this future lives as long as the
/// connection, idle ones included; the `async move` block holds them once.
#[allow(clippy::manual_async_fn)]
pub fn handle(
    mut acc: Accepted,
    routes: Arc<ListenerRoutes>,
    shared: Arc<Shared>,
    listener: Arc<str>,
) -> impl std::future::Future<Output = ()> + Send {
    async move {
        let started = Instant::now();
        let mut log = AccessLog::default();
        if acc.inherited.is_none() {
            if let Err(e) = acc.stream.set_nodelay(true) {
                tracing::debug!(peer = %acc.peer, "TCP_NODELAY failed: {e}");
            }
        }
        let peer = acc.peer;
        let result = serve(
            &mut acc.stream,
            peer,
            acc.inherited,
            &routes,
            &shared,
            &mut log,
            started,
        )
        .await;
        let failed = match result {
            Ok(()) => false,
            Err(e) => {
                if let ConnError::Front(f) = &e {
                    shared.metrics.proxy_refused(&listener, f.reason());
                }
                log.end = e.reason();
                log.error = Some(e.to_string());
                true
            }
        };
        drop(acc.permit);
        if failed && !shared.log_limiter.allow() {
            return;
        }
        log.write(peer, &listener, started);
    }
}

/// The steps of a connection, in order. (Not an `async fn`, for the reason given
/// at [`handle`]: its arguments are held once, not twice, for the connection's life.)
#[allow(clippy::manual_async_fn)]
fn serve<'a>(
    stream: &'a mut TcpStream,
    peer: SocketAddr,
    inherited: Option<InheritedOptions>,
    routes: &'a ListenerRoutes,
    shared: &'a Shared,
    log: &'a mut AccessLog,
    started: Instant,
) -> impl std::future::Future<Output = Result<(), ConnError>> + Send + 'a {
    async move {
        // The header and the hello share the `client_hello` budget, from accept.
        let deadline = tokio::time::Instant::from_std(started) + routes.hello_timeout;
        let mut buf = Vec::new();
        // From here on `peer` is the client (an agent behind a trusted tier).
        let peer = front(stream, peer, routes, &mut buf, log, deadline).await?;
        let (svc, hello) = read_and_route(stream, &mut buf, routes, shared, log, deadline).await?;
        log.service = Some(Arc::from(svc.name()));
        let keepalive = svc.config.keepalive;
        if inherited != Some(InheritedOptions { keepalive }) {
            set_keepalive(stream, keepalive);
        }
        let client_ip = peer.ip().to_canonical();
        let (sticky, certain) = place(&svc, hello.as_ref(), client_ip, log);
        let (server, lease, tried) =
            connect_and_replay(stream, peer, &svc, hello.as_ref(), &buf, sticky, log).await?;
        let (mut server, lease, pending) = match hello.as_ref() {
            Some(h) => {
                let search = crate::confirm::Search {
                    svc: &svc,
                    shared,
                    client: stream,
                    peer,
                    hello: h,
                    hello_bytes: &buf,
                    tried,
                };
                confirm_placement(search, certain, server, lease, log).await
            }
            None => (server, lease, Vec::new()),
        };
        let backend = lease.backend().clone();
        log.backend = Some(backend.name.clone());
        if keepalive.is_some() {
            set_keepalive(&server, keepalive);
        }
        backend.metrics.connections.inc();
        if let Some(sticking) = svc.sticking() {
            sticking.learn_connect(client_ip, &backend.name);
        }
        let replayed = buf.len() as u64;
        backend.metrics.bytes_c2s.inc_by(replayed);
        // The hello buffer is not needed for the rest of a possibly hours-long connection.
        drop(buf);
        let open = (replayed, pending.len() as u64, hello.is_some());
        let listed = svc
            .connections
            .open(Opening::new(peer, &backend.name, started, open));
        let watched = (hello.as_ref(), client_ip, pending.as_slice());
        let (stats, handshake) = relay_watched(
            stream,
            &mut server,
            (&svc, &backend, listed.conn()),
            watched,
            &shared.hard_stop,
        )
        .await?;
        record_relay(log, &stats, handshake, replayed, &svc, &backend);
        log.s2c += pending.len() as u64;
        svc.metrics
            .duration
            .observe(started.elapsed().as_secs_f64());
        drop(lease);
        Ok(())
    }
}

/// Step 0: who the client is. From a source the listener trusts, its PROXY header
/// says ([`proxy_protocol::read_front`]); every later step reads the address this
/// returns, never the TCP peer. Bytes read past the header stay in `buf`.
async fn front(
    stream: &mut TcpStream,
    peer: SocketAddr,
    routes: &ListenerRoutes,
    buf: &mut Vec<u8>,
    log: &mut AccessLog,
    deadline: tokio::time::Instant,
) -> Result<SocketAddr, ConnError> {
    let policy = routes.proxy.as_ref();
    let f = proxy_protocol::read_front(stream, peer, policy, buf, deadline)
        .await
        .map_err(ConnError::Front)?;
    if f.via.is_some() {
        log.proxied = Some(f.client);
    }
    Ok(f.client)
}

/// Steps 1-2: read the ClientHello (unless the address is `mode: tcp`) and route it
/// by SNI; non-TLS bytes go to the service that forwards them, if any.
async fn read_and_route(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    routes: &ListenerRoutes,
    shared: &Shared,
    log: &mut AccessLog,
    deadline: tokio::time::Instant,
) -> Result<(Arc<Service>, Option<ClientHelloInfo>), ConnError> {
    if routes.tcp {
        let svc = routes.routes.route(None).ok_or(ConnError::NoRoute(None))?;
        return Ok((svc.clone(), None));
    }
    match read_hello(stream, buf, routes.max_hello, deadline).await {
        Ok(h) => {
            log.sni = h.sni.clone();
            let Some(svc) = routes.routes.route(h.sni.as_deref()) else {
                crate::metrics::unrouted(&shared.metrics, None, Some("no_route"));
                return Err(ConnError::NoRoute(h.sni));
            };
            Ok((svc.clone(), Some(h)))
        }
        Err(e @ (HelloError::NotTls | HelloError::Malformed)) if routes.non_tls.is_some() => {
            let svc = routes.non_tls.clone().ok_or(ConnError::Hello(e))?;
            svc.metrics.hello_error(e.reason());
            Ok((svc, None))
        }
        // A PROXY header from a source not trusted to send one: never parsed, but
        // named as what it is.
        Err(HelloError::NotTls) if proxy_protocol::untrusted_header(buf) => {
            Err(ConnError::Front(FrontError::Untrusted))
        }
        Err(e) => Err(hello_failed(routes, shared, log, e)),
    }
}

/// Count a hello that failed: on the service when the address has only one, else
/// as unrouted.
fn hello_failed(
    routes: &ListenerRoutes,
    shared: &Shared,
    log: &mut AccessLog,
    e: HelloError,
) -> ConnError {
    match routes.routes.route(None) {
        Some(s) if routes.routes.is_single() => {
            log.service = Some(Arc::from(s.name()));
            s.metrics.hello_error(e.reason());
        }
        _ => crate::metrics::unrouted(&shared.metrics, Some(e.reason()), None),
    }
    ConnError::Hello(e)
}

/// Step 3: the backend the stick table says holds this client's session, if any
/// (the placement policy itself is [`crate::stick::Sticking::place`]), and whether
/// that placement is certain (else [`crate::confirm`] may check it).
fn place(
    svc: &Service,
    hello: Option<&ClientHelloInfo>,
    ip: IpAddr,
    log: &mut AccessLog,
) -> (Option<usize>, bool) {
    let Some(placement) = svc.sticking().and_then(|s| s.place(hello, ip)) else {
        return (None, false);
    };
    log.stick = Some(placement.kind.as_str());
    log.stick_hit = placement.backend.is_some();
    (placement.backend, placement.certain())
}

/// Step 4b: confirm the placement of an offered session if that is wanted
/// ([`crate::confirm`]): returns the backend to relay to and the answer bytes
/// already read from it.
async fn confirm_placement(
    search: crate::confirm::Search<'_>,
    certain: bool,
    server: TcpStream,
    lease: Lease,
    log: &mut AccessLog,
) -> (TcpStream, Lease, Vec<u8>) {
    use crate::confirm::{Outcome, Wanted};
    let svc = search.svc;
    match crate::confirm::wanted(svc, search.hello, search.hello_bytes.len(), certain) {
        Wanted::No => (server, lease, Vec::new()),
        Wanted::NotEligible => {
            svc.metrics.confirm(Outcome::NotEligible.as_str());
            log.confirm = Some(Outcome::NotEligible.as_str());
            (server, lease, Vec::new())
        }
        Wanted::Yes => {
            // Backends that failed before the first answer count too.
            let before = search.tried.len();
            // Boxed: only connections that confirm pay for the search's state.
            let c = Box::pin(search.run(server, lease)).await;
            svc.metrics.confirm(c.outcome.as_str());
            log.confirm = Some(c.outcome.as_str());
            log.tried = before + c.tried;
            (c.server, c.lease, c.pending)
        }
    }
}

/// Step 4: reserve a backend and connect (retrying elsewhere on failure), then send
/// the PROXY header and the hello. In tls mode a backend that closes before its
/// first byte, or sends none within `timeouts.server_hello`, is retried like a
/// refused connect (the client has seen nothing yet), and the client bytes read
/// behind the hello go only to the backend that answered, once it has.
///
/// Like HAProxy's abortonclose: a client that gives up while queued or while we
/// connect gets no backend connection opened for nobody (a compile slot). A TLS
/// client never half-closes mid-handshake, so its EOF means it left; in tcp mode
/// an EOF may be a half-close that still wants the answer, so only a reset counts.
async fn connect_and_replay(
    stream: &TcpStream,
    peer: SocketAddr,
    svc: &Service,
    hello: Option<&ClientHelloInfo>,
    buf: &[u8],
    mut preferred: Option<usize>,
    log: &mut AccessLog,
) -> Result<(TcpStream, Lease, Vec<usize>), ConnError> {
    let tls = hello.is_some();
    let ip = peer.ip().to_canonical();
    // Only the ClientHello may reach more than one backend. What the client sent
    // behind it (0-RTT early data, a pipelined record) is held until a backend has
    // answered and goes to that one alone: early data carries a request, and two
    // backends that share no anti-replay state would both act on it (RFC 8446 8).
    let (hello_bytes, held) = match hello {
        Some(h) => buf.split_at(h.consumed.min(buf.len())),
        None => (buf, &[][..]),
    };
    let mut tried: Vec<usize> = Vec::new();
    let mut timed_out = None;
    loop {
        let (mut server, lease) = tokio::select! {
            r = connect(svc, preferred.take(), ip, log, &mut tried) => match (r, timed_out.take()) {
                (Err(ConnError::Pick(PickError::NoBackendAvailable)), Some(e)) => return Err(e),
                (r, _) => r?,
            },
            () = client_gone(stream, tls) => return Err(ConnError::ClientGone),
        };
        let backend = lease.backend().clone();
        log.backend = Some(backend.name.clone());
        let sni = hello.and_then(|h| h.sni.as_deref());
        let proxy = backend.config.proxy_protocol;
        let sent = dial::send_prelude(&mut server, stream, peer, proxy, sni, hello_bytes)
            .await
            .map_err(|error| ConnError::BackendWrite {
                backend: backend.name.clone(),
                error,
            });
        if !tls {
            sent?;
            return Ok((server, lease, tried));
        }
        match answered(&server, stream, sent, svc.config.timeouts.server_hello).await? {
            BackendAnswer::Bytes => {
                if !held.is_empty() {
                    server
                        .write_all(held)
                        .await
                        .map_err(|error| ConnError::BackendWrite {
                            backend: backend.name.clone(),
                            error,
                        })?;
                }
                return Ok((server, lease, tried));
            }
            BackendAnswer::Timeout => {
                let e = server_hello_timeout(svc, &backend);
                tried.push(backend.index);
                if tried.len() > svc.config.retries as usize {
                    return Err(e);
                }
                timed_out = Some(e);
            }
            BackendAnswer::Closed(e) => {
                backend.metrics.connect_errors.inc();
                health::passive_failure(svc, &backend, &e);
                tracing::warn!(service = %svc.name(), backend = %backend.name, "closed before answering the ClientHello: {e}; trying another backend");
                tried.push(backend.index);
            }
        }
    }
}

/// A backend sent nothing within `timeouts.server_hello` of the hello: counted
/// (`crossbar_server_hello_timeouts_total`), a passive health failure, logged.
fn server_hello_timeout(svc: &Service, backend: &Backend) -> ConnError {
    let after = svc.config.timeouts.server_hello;
    backend.metrics.server_hello_timeouts.inc();
    let e = io::Error::new(io::ErrorKind::TimedOut, "no answer to the ClientHello");
    health::passive_failure(svc, backend, &e);
    tracing::warn!(service = %svc.name(), backend = %backend.name, "did not answer the ClientHello within {after:?}; trying another backend if one is left");
    ConnError::ServerHelloTimeout {
        backend: backend.name.clone(),
        after,
    }
}

/// What a backend did with the hello just sent. Until it answers, it has been sent
/// nothing but the hello: a backend that closes or resets without a byte (it died
/// with connections in its accept queue) can be retried, hello and all.
async fn answered(
    server: &TcpStream,
    client: &TcpStream,
    sent: Result<(), ConnError>,
    limit: Duration,
) -> Result<BackendAnswer, ConnError> {
    match sent {
        Err(ConnError::BackendWrite { error, .. }) => Ok(BackendAnswer::Closed(error)),
        Err(e) => Err(e),
        Ok(()) => tokio::select! {
            a = first_answer(server, limit) => Ok(a),
            () = client_gone(client, true) => Err(ConnError::ClientGone),
        },
    }
}

/// Steps 5-6: relay both ways until both sides closed; in tls mode the server's
/// handshake is watched on the way and stick entries are learned from it, once the
/// client has proven enough ([`crate::stick::learn_when`]). Answer bytes read while
/// confirming the placement (`pending`) reach the client, and the watcher, first.
/// Returns the relay's outcome and the handshake kind (`full`/`resumed`) if it showed.
async fn relay_watched(
    stream: &mut TcpStream,
    server: &mut TcpStream,
    (svc, backend, open): (&Service, &Backend, &OpenConn),
    (hello, ip, pending): (Option<&ClientHelloInfo>, IpAddr, &[u8]),
    hard_stop: &tokio_util::sync::CancellationToken,
) -> Result<(RelayStats, Option<&'static str>), ConnError> {
    let mut handshake = None;
    let flight = std::sync::Mutex::new(Flight::Waiting);
    let mut watch = hello.map(|h| {
        let seen = &mut handshake;
        let flight = &flight;
        let sticking = svc.sticking();
        let learn = move |hs: &ServerHandshake| {
            if let Some(s) = svc.sticking() {
                s.learn_handshake(h, hs, ip, &backend.name);
            }
        };
        Box::new(Watch {
            watcher: ServerWatcher::new(SERVER_WATCH_LIMIT),
            on_handshake: Box::new(move |hs: &ServerHandshake| {
                *seen = handshake_kind(backend, hs);
                open.handshake_seen();
                let mut f = flight.lock().unwrap_or_else(PoisonError::into_inner);
                match (crate::stick::learn_when(h, hs), &*f) {
                    (LearnWhen::Now, _) => learn(hs),
                    (LearnWhen::AfterClientFlight, Flight::Waiting) => {
                        *f = Flight::Held(Box::new(hs.clone()));
                    }
                    _ => {}
                }
            }) as Box<dyn FnOnce(&ServerHandshake) + Send + '_>,
            on_client: sticking.map(|_| {
                Box::new(move || {
                    let mut f = flight.lock().unwrap_or_else(PoisonError::into_inner);
                    if let Flight::Held(hs) = std::mem::replace(&mut *f, Flight::ClientSpoke) {
                        learn(&hs);
                    }
                }) as Box<dyn FnOnce() + Send + '_>
            }),
        })
    });
    if !pending.is_empty() {
        stream
            .write_all(pending)
            .await
            .map_err(|_| ConnError::ClientGone)?;
        backend.metrics.bytes_s2c.inc_by(pending.len() as u64);
        if let Some(w) = watch.as_mut() {
            if w.watcher.feed(pending) && w.on_client.is_some() {
                // Done; the relay still runs `on_client` (the done watcher passes
                // the server's next bytes straight to a no-op).
                let on_handshake = std::mem::replace(&mut w.on_handshake, Box::new(|_| {}));
                on_handshake(w.watcher.info());
            } else if w.watcher.is_done() {
                if let Some(w) = watch.take() {
                    (w.on_handshake)(w.watcher.info());
                }
            }
        }
    }
    let counters = RelayCounters {
        c2s: &backend.metrics.bytes_c2s,
        s2c: &backend.metrics.bytes_s2c,
        conn: &open.bytes,
    };
    let idle = svc.config.timeouts.idle;
    let stats = relay::relay_as(
        svc.config.relay,
        stream,
        server,
        idle,
        &counters,
        watch,
        hard_stop,
    )
    .await;
    Ok((stats, handshake))
}

/// Where a connection is in proving its TLS 1.3 full handshake
/// ([`crate::stick::learn_when`]): what the server's handshake teaches waits for the
/// client's next flight.
enum Flight {
    /// Neither the server's handshake nor a client byte seen yet.
    Waiting,
    /// The server's handshake, held until the client answers it.
    Held(Box<ServerHandshake>),
    /// The client has sent a byte during the relay (before the server's handshake
    /// showed, that byte answered nothing: then it teaches nothing).
    ClientSpoke,
}

/// Count a server handshake as full or resumed; its access-log word.
fn handshake_kind(backend: &Backend, hs: &ServerHandshake) -> Option<&'static str> {
    match hs.resumed {
        Some(true) => {
            backend.metrics.resumed.inc();
            Some("resumed")
        }
        Some(false) => {
            backend.metrics.full.inc();
            Some("full")
        }
        None => None,
    }
}

/// Step 7 (the part the relay decides): bytes, handshake kind and how it ended.
fn record_relay(
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
    log.end = stats.end.as_str().to_string();
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

/// Reserve a backend (the sticky one if it can take the connection) and connect,
/// moving on to other backends on failure, up to `retries` more attempts.
async fn connect(
    svc: &Service,
    sticky: Option<usize>,
    ip: IpAddr,
    log: &mut AccessLog,
    tried: &mut Vec<usize>,
) -> Result<(TcpStream, Lease), ConnError> {
    let mut lease = sticky.and_then(|i| svc.pool.try_preferred(i));
    let mut last_err = None;
    // `tried` is shared with the caller, which adds backends that accepted but
    // closed before answering: all attempts together are bounded by `retries`.
    while tried.len() <= svc.config.retries as usize {
        let l = match lease.take() {
            Some(l) => l,
            None => match svc.pool.acquire(ip, tried).await {
                Ok(l) => l,
                Err(PickError::NoBackendAvailable) if !tried.is_empty() => break,
                Err(e) => {
                    if e == PickError::QueueTimeout {
                        svc.metrics.queue_timeouts.inc();
                    }
                    svc.metrics.refused(e.reason());
                    return Err(ConnError::Pick(e));
                }
            },
        };
        let b = l.backend().clone();
        // Every backend this connection went to counts, the failed ones included.
        log.tried = tried.len() + 1;
        let started = Instant::now();
        match dial::connect_to(&b.config.address, svc.config.timeouts.connect).await {
            Ok(s) => {
                health::passive_success(&b);
                b.metrics
                    .connect_duration
                    .observe(started.elapsed().as_secs_f64());
                return Ok((s, l));
            }
            Err(e) => {
                b.metrics.connect_errors.inc();
                health::passive_failure(svc, &b, &e);
                tracing::warn!(service = %svc.name(), backend = %b.name, address = %b.config.address, "connect failed: {e}");
                tried.push(b.index);
                log.backend = Some(b.name.clone());
                last_err = Some(ConnError::Connect {
                    backend: b.name.clone(),
                    error: e,
                });
            }
        }
    }
    if last_err.is_none() {
        svc.metrics.refused(PickError::NoBackendAvailable.reason());
    }
    Err(last_err.unwrap_or(ConnError::Pick(PickError::NoBackendAvailable)))
}

/// What a backend did with the ClientHello.
enum BackendAnswer {
    /// It sent at least one byte (a ServerHello, an alert...): relay from here.
    Bytes,
    /// It closed or reset the connection without a byte.
    Closed(io::Error),
    /// Nothing within `timeouts.server_hello`.
    Timeout,
}

/// Wait (peeking, not reading) for the backend's first byte, up to `limit`.
async fn first_answer(server: &TcpStream, limit: Duration) -> BackendAnswer {
    let mut probe = [0u8; 1];
    match tokio::time::timeout(limit, server.peek(&mut probe)).await {
        Err(_) => BackendAnswer::Timeout,
        Ok(Ok(0)) => BackendAnswer::Closed(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed",
        )),
        Ok(Ok(_)) => BackendAnswer::Bytes,
        Ok(Err(e)) => BackendAnswer::Closed(e),
    }
}

/// Resolves when the client reset the connection, or (with `eof_is_gone`) closed
/// it; never while it is open. Bytes it sends meanwhile stay in the socket (peeked,
/// not read).
async fn client_gone(stream: &TcpStream, eof_is_gone: bool) {
    let mut probe = [0u8; 1];
    match stream.peek(&mut probe).await {
        Err(_) => {}
        Ok(0) if eof_is_gone => {}
        Ok(_) => std::future::pending().await,
    }
}

/// Turn TCP keepalive on with the service's timing (or off). A failure is logged,
/// not fatal: the connection works without it.
fn set_keepalive(stream: &TcpStream, ka: Option<crate::config::Keepalive>) {
    if let Err(e) = crate::listener::set_keepalive(&socket2::SockRef::from(stream), ka) {
        tracing::debug!("TCP keepalive not set: {e}");
    }
}

/// Read until a complete ClientHello (or a reason to give up), by `deadline` and
/// within `max` bytes, after what `buf` holds already (read past a PROXY header).
/// Every byte read stays in `buf` to be replayed to the backend.
async fn read_hello(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    max: usize,
    deadline: tokio::time::Instant,
) -> Result<ClientHelloInfo, HelloError> {
    let cap = max + HELLO_SLACK;
    loop {
        match hello::parse_client_hello(buf, max) {
            HelloParse::Found(h) => return Ok(h),
            HelloParse::Invalid(e) => return Err(e),
            HelloParse::NeedMore => {}
        }
        let room = cap.saturating_sub(buf.len()).min(HELLO_READ_CHUNK);
        if room == 0 {
            return Err(HelloError::TooLarge);
        }
        let old = buf.len();
        buf.resize(old + room, 0);
        let read = tokio::time::timeout_at(deadline, stream.read(&mut buf[old..])).await;
        let n = match read {
            Err(_) => {
                buf.truncate(old);
                return Err(HelloError::Timeout);
            }
            Ok(Err(_)) | Ok(Ok(0)) => {
                buf.truncate(old);
                return Err(HelloError::Truncated);
            }
            Ok(Ok(n)) => n,
        };
        buf.truncate(old + n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn keepalive_options_reach_the_socket() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let s = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let ka = crate::config::Keepalive {
            time: Duration::from_secs(77),
            interval: Duration::from_secs(11),
            probes: 5,
        };
        set_keepalive(&s, Some(ka));
        let r = socket2::SockRef::from(&s);
        assert!(r.keepalive().unwrap());
        assert_eq!(r.keepalive_time().unwrap(), Duration::from_secs(77));
        assert_eq!(r.keepalive_interval().unwrap(), Duration::from_secs(11));
        assert_eq!(r.keepalive_retries().unwrap(), 5);
    }
}

#[cfg(test)]
mod size_probe {
    /// Bytes of a connection task's future: held for the whole life of every
    /// connection, idle ones included (docs/performance.md, RSS per idle connection).
    /// 2,176 B in a debug build when set (2,544 B before `handle` and `serve` stopped
    /// holding their arguments twice).
    const MAX_CONNECTION_FUTURE: usize = 2304;

    fn size_of_return<A, B, C, D, F: std::future::Future>(_: fn(A, B, C, D) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    #[test]
    fn connection_future_stays_small() {
        let n = size_of_return(super::handle);
        println!("connection future: {n} bytes");
        assert!(
            n <= MAX_CONNECTION_FUTURE,
            "connection future grew to {n} bytes"
        );
    }
}
