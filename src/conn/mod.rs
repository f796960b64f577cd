//! One client connection, from accept to the access-log line, as named steps on
//! one [`Conn`]: decide the client (a trusted tier's PROXY header) -> read the hello -> route -> place -> open a backend (and replay the
//! hello) -> confirm the placement -> relay while watching the server's handshake
//! and learning from it -> log.
//!
//! Where a connection goes is decided by [`crate::stick`]'s placement policy (the
//! sticky backend) and [`crate::balance`] (everything else); this folder only runs
//! the steps in order, each bounded in time, and knows which side ended it. By job,
//! each file using only the ones listed after it:
//!
//! - `mod.rs`: [`handle`] and the steps in order;
//! - `confirm.rs`: offer a resumption to further backends until one resumes it;
//! - `watched.rs`: the relay, watching the server's handshake and learning from it;
//! - `upstream.rs`: open a backend (dial, PROXY header and hello, first answer),
//!   for the connect loop and confirmation alike;
//! - `capped.rs`: a capped read under a deadline (the hello, a backend's answer);
//! - `error.rs`: why a connection ended before its relay.
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use tokio::net::TcpStream;

use crate::access_log::AccessLog;
use crate::balance::Lease;
use crate::hello::{self, ClientHelloInfo, HelloError, HelloParse};
use crate::listener::{Accepted, InheritedOptions};
use crate::open_connections::Opening;
use crate::proxy_protocol::{self, FrontError};
use crate::service::{ListenerRoutes, ProcessWide, Service};

mod capped;
mod confirm;
mod error;
mod upstream;
mod watched;

use capped::{read_until, Cap, Short};
use confirm::{Outcome, Search, Wanted};
use error::ConnError;
use upstream::Offer;

/// Bytes beyond `max_hello_size` we accept in the first read burst (record headers,
/// a few bytes of data pipelined after the hello).
const HELLO_SLACK: usize = 1024;
/// Read granularity while waiting for the hello; a typical hello is 512 B - 2 KiB.
const HELLO_READ_CHUNK: usize = 4096;

/// Serve one accepted connection to the end. Never panics on client input; every
/// outcome is logged once on `crossbar::access`.
///
/// Not an `async fn`: an async fn keeps its arguments in the future twice (as
/// captured and as moved-in locals), and this future lives as long as the
/// connection, idle ones included; the `async move` block holds them once.
#[allow(clippy::manual_async_fn)]
pub fn handle(
    acc: Accepted,
    routes: Arc<ListenerRoutes>,
    shared: Arc<ProcessWide>,
    listener: Arc<str>,
) -> impl std::future::Future<Output = ()> + Send {
    async move {
        let started = Instant::now();
        let local = acc.stream.local_addr();
        if local.is_ok_and(|l| shared.own_sockets.is_ours(acc.peer, l)) {
            // Never dial yourself: a backend that is our own listener.
            shared.metrics.self_connection(&listener);
            if shared.log_limiter.allow() {
                tracing::warn!(peer = %acc.peer, %listener, "refused a connection from crossbar itself: a backend's address is one of its own listeners");
            }
            return;
        }
        if acc.inherited.is_none() {
            if let Err(e) = acc.stream.set_nodelay(true) {
                tracing::debug!(peer = %acc.peer, "TCP_NODELAY failed: {e}");
            }
        }
        let mut conn = Conn {
            client: acc.stream,
            peer: acc.peer,
            inherited: acc.inherited,
            routes: &routes,
            shared: &shared,
            log: AccessLog::default(),
            sni: None,
            started,
            source: None,
        };
        let failed = match conn.serve().await {
            Ok(()) => false,
            // A tier's health check: counted, never an error or an INFO line.
            Err(ConnError::Probe) => {
                shared.metrics.proxy_probe(&listener);
                tracing::debug!(target: "crossbar::access", peer = %acc.peer, %listener, "PROXY LOCAL probe");
                return;
            }
            Err(e) => {
                if let ConnError::Front(f) = &e {
                    shared.metrics.proxy_refused(&listener, f.reason());
                }
                conn.log.end = e.reason();
                conn.log.error = Some(e.to_string());
                true
            }
        };
        drop(acc.permit);
        if failed && !shared.log_limiter.allow() {
            return;
        }
        // The TCP peer: the log names the client a trusted tier's header gave too.
        conn.log
            .write(acc.peer, &listener, started, conn.sni.as_deref());
    }
}

/// One connection's state while its steps run (mini-redis's `Handler`).
struct Conn<'a> {
    /// The client socket.
    client: TcpStream,
    /// The client's address: the TCP peer until [`Conn::front`] has read a trusted
    /// tier's PROXY header, then the client that header names.
    peer: SocketAddr,
    /// What the socket inherited from its listener.
    inherited: Option<InheritedOptions>,
    /// The listen address's routing (and its hello limits).
    routes: &'a ListenerRoutes,
    /// What all connections share (metrics, the confirmation budget, shutdown).
    shared: &'a ProcessWide,
    /// The access-log line, filled in as the steps go.
    log: AccessLog,
    /// The SNI the client sent (moved out of the hello: routing, the upstream's
    /// PROXY header and the log line read it here).
    sni: Option<String>,
    /// When the connection was accepted.
    started: Instant,
    /// Its place in its source's count (`listen[].per_source`), held to the end;
    /// boxed so that connections without `per_source` carry one pointer, not the slot.
    source: Option<Box<crate::admission::SourceSlot>>,
}

impl Conn<'_> {
    /// The steps of a connection, in order.
    async fn serve(&mut self) -> Result<(), ConnError> {
        // The header and the hello share the `client_hello` budget, from accept.
        let deadline = tokio::time::Instant::from_std(self.started) + self.routes.hello_timeout;
        let mut buf = Vec::new();
        // From here on `peer` is the client (an agent behind a trusted tier).
        self.peer = self.front(&mut buf, deadline).await?;
        if let Some(a) = &self.routes.admission {
            self.source = a
                .admit(self.peer.ip())
                .map_err(ConnError::Source)?
                .map(Box::new);
        }
        let (svc, hello) = self.read_and_route(&mut buf, deadline).await?;
        self.log.service = Some(svc.clone());
        let keepalive = svc.config.keepalive;
        if self.inherited != Some(InheritedOptions { keepalive }) {
            set_keepalive(&self.client, keepalive);
        }
        let (sticky, certain) = self.place(&svc, hello.as_ref());
        let (mut server, lease, pending) = self
            .connect(&svc, hello.as_ref(), &buf, sticky, certain)
            .await?;
        let backend = lease.backend().clone();
        self.log.backend = Some(backend.name.clone());
        // The backend socket's keepalive is the relay's to turn on, once the
        // connection has lived long enough for it to matter (`relay::Timing`).
        backend.metrics.connections.inc();
        let client_ip = self.peer.ip().to_canonical();
        // With no handshake to watch, reaching a backend is all a connection shows;
        // a TLS client's address is learned once it completed its side (watched.rs).
        if let (Some(sticking), None) = (svc.sticking(), &hello) {
            sticking.learn_connect(client_ip, &backend.name);
        }
        let replayed = buf.len() as u64;
        backend.metrics.bytes_c2s.inc_by(replayed);
        // The hello buffer is not needed for the rest of a possibly hours-long connection.
        drop(buf);
        let open = (replayed, pending.len() as u64, hello.is_some());
        use std::os::fd::AsRawFd;
        let opening = Opening::new(self.peer, &backend.name, self.started, open)
            .with_sockets(self.client.as_raw_fd(), server.as_raw_fd());
        let listed = svc.connections.open(opening);
        let relaying = watched::Relaying {
            svc: &svc,
            backend: &backend,
            open: listed.conn(),
            hello: hello.as_ref(),
            ip: client_ip,
            pending: pending.as_slice(),
        };
        let hard_stop = &self.shared.hard_stop;
        let (stats, handshake) =
            watched::relay_watched(&mut self.client, &mut server, relaying, hard_stop).await?;
        // The relay leaves the second FIN to close(2): nothing awaits from here until
        // both sockets are dropped (the client's with `self`, after the log line).
        // No kill touches them once they may close.
        listed.conn().release_sockets();
        drop(server);
        watched::record_relay(&mut self.log, &stats, handshake, replayed, &svc, &backend);
        if listed.conn().was_killed() {
            self.log.end = crate::access_log::End::word("killed");
        }
        self.log.s2c += pending.len() as u64;
        let elapsed = self.started.elapsed().as_secs_f64();
        svc.metrics.duration.observe(elapsed);
        drop(lease);
        Ok(())
    }

    /// Step 0: who the client is. From a source the listener trusts, its PROXY header
    /// says ([`proxy_protocol::read_front`]); every later step reads the address this
    /// returns, never the TCP peer. Bytes read past the header stay in `buf`.
    async fn front(
        &mut self,
        buf: &mut Vec<u8>,
        deadline: tokio::time::Instant,
    ) -> Result<SocketAddr, ConnError> {
        let policy = self.routes.proxy.as_ref();
        let f = proxy_protocol::read_front(&mut self.client, self.peer, policy, buf, deadline)
            .await
            .map_err(ConnError::Front)?;
        if f.own && buf.is_empty() && closes_before_a_byte(&mut self.client, buf, deadline).await {
            return Err(ConnError::Probe);
        }
        if f.via.is_some() {
            self.log.proxied = Some(f.client);
        }
        Ok(f.client)
    }

    /// Steps 1-2: read the ClientHello (unless the address is `mode: tcp`) and route
    /// it by SNI; non-TLS bytes go to the service that forwards them, if any.
    async fn read_and_route(
        &mut self,
        buf: &mut Vec<u8>,
        deadline: tokio::time::Instant,
    ) -> Result<(Arc<Service>, Option<ClientHelloInfo>), ConnError> {
        let routes = self.routes;
        if routes.tcp {
            let svc = routes.routes.route(None).ok_or(ConnError::NoRoute(None))?;
            return Ok((svc.clone(), None));
        }
        let read = read_hello(&mut self.client, buf, routes.max_hello, deadline);
        let e = match read.await {
            Ok(mut h) => {
                self.sni = h.sni.take();
                let Some(svc) = routes.routes.route(self.sni.as_deref()) else {
                    crate::metrics::unrouted(&self.shared.metrics, None, Some("no_route"));
                    return Err(ConnError::NoRoute(self.sni.clone()));
                };
                return Ok((svc.clone(), Some(h)));
            }
            Err(e) => e,
        };
        // A PROXY header where the hello should be: from a source not trusted to send
        // one, or a second one behind a trusted tier's. Never parsed, named as what it
        // is, and refused before `on_non_tls` decides (forwarded, it would reach the
        // backend as if crossbar had sent it).
        if e == HelloError::NotTls && begins_with_header(&mut self.client, buf, deadline).await {
            let refused = match self.log.proxied {
                Some(_) => FrontError::Repeated,
                None => FrontError::Untrusted,
            };
            return Err(ConnError::Front(refused));
        }
        match (e, routes.non_tls.clone()) {
            (HelloError::NotTls | HelloError::Malformed, Some(svc)) => {
                svc.metrics.hello_error(e.reason());
                Ok((svc, None))
            }
            _ => Err(self.hello_failed(e)),
        }
    }

    /// Count a hello that failed: on the service when the address has only one,
    /// else as unrouted.
    fn hello_failed(&mut self, e: HelloError) -> ConnError {
        match self.routes.routes.route(None) {
            Some(s) if self.routes.routes.is_single() => {
                self.log.service = Some(s.clone());
                s.metrics.hello_error(e.reason());
            }
            _ => crate::metrics::unrouted(&self.shared.metrics, Some(e.reason()), None),
        }
        ConnError::Hello(e)
    }

    /// Step 3: the backend the stick table says holds this client's session, if any
    /// (the placement policy itself is [`crate::stick::Sticking::place`]), and
    /// whether that placement is certain (else confirmation may check it). A holder
    /// load feedback shows saturated is no placement (`feedback.saturated_sticky`).
    fn place(&mut self, svc: &Service, hello: Option<&ClientHelloInfo>) -> (Option<usize>, bool) {
        let ip = self.peer.ip().to_canonical();
        let Some(placement) = svc.sticking().and_then(|s| s.place(hello, ip)) else {
            return (None, false);
        };
        self.log.stick = Some(placement.kind.as_str());
        self.log.stick_hit = placement.backend.is_some();
        if let Some(b) = placement.backend.and_then(|i| svc.pool.backends.get(i)) {
            let rule = svc
                .config
                .feedback
                .as_ref()
                .is_some_and(|f| f.saturated_sticky);
            if rule && b.feedback().saturated() {
                // A 503'd agent's retry resumes its session on a new connection: sent
                // back, it would meet the compiler that just refused it. Placed like
                // a new session, unconfirmed (the search would find the same holder).
                b.metrics.feedback.sticky_replaced();
                self.log.stick_saturated = true;
                return (None, true);
            }
        }
        (placement.backend, placement.certain())
    }

    /// Steps 4-4b: open a backend, the sticky one first, retrying elsewhere on
    /// failure ([`upstream::connect`]), then confirm the placement of an offered
    /// session if that is wanted (`confirm.rs`). Returns the backend to relay to,
    /// its slot and the answer bytes already read from it.
    async fn connect(
        &mut self,
        svc: &Service,
        hello: Option<&ClientHelloInfo>,
        buf: &[u8],
        sticky: Option<usize>,
        certain: bool,
    ) -> Result<(TcpStream, Lease, Vec<u8>), ConnError> {
        // Only the ClientHello may reach more than one backend: the bytes behind it
        // are held for the one that answers (upstream.rs).
        let (hello_bytes, held) = match hello {
            Some(h) => buf.split_at(h.consumed.min(buf.len())),
            None => (buf, &[][..]),
        };
        let offer = Offer {
            svc,
            client: &self.client,
            peer: self.peer,
            sni: self.sni.as_deref(),
            hello: hello_bytes,
            own: &self.shared.own_sockets,
        };
        let log = &mut self.log;
        let (server, lease, tried) =
            upstream::connect(&offer, hello.is_some(), held, sticky, log).await?;
        let Some(h) = hello else {
            return Ok((server, lease, Vec::new()));
        };
        let outcome = match confirm::wanted(svc, h, buf.len(), certain) {
            Wanted::No => return Ok((server, lease, Vec::new())),
            Wanted::NotEligible => Outcome::NotEligible,
            Wanted::Yes => {
                // Backends that failed before the first answer count too.
                let before = tried.len();
                let search = Search {
                    offer,
                    shared: self.shared,
                    tried,
                };
                // Boxed: only connections that confirm pay for the search's state.
                let c = Box::pin(search.run(server, lease)).await;
                svc.metrics.confirm(c.outcome.as_str());
                log.confirm = Some(c.outcome.as_str());
                log.tried = u32::try_from(before + c.tried).unwrap_or(u32::MAX);
                return Ok((c.server, c.lease, c.pending));
            }
        };
        svc.metrics.confirm(outcome.as_str());
        log.confirm = Some(outcome.as_str());
        Ok((server, lease, Vec::new()))
    }
}

/// Turn TCP keepalive on with the service's timing (or off). A failure is logged,
/// not fatal: the connection works without it.
fn set_keepalive(stream: &TcpStream, ka: Option<crate::config::Keepalive>) {
    if let Err(e) = crate::listener::set_keepalive(&socket2::SockRef::from(stream), ka) {
        tracing::debug!("TCP keepalive not set: {e}");
    }
}

/// Do the bytes read where a hello was expected begin with a PROXY header's
/// signature ([`proxy_protocol::header_signature`])? While they are a proper prefix
/// of one, read on, by the hello's `deadline` and never past the longest signature:
/// a header trickled byte by byte is named as one, and other bytes that start the
/// same way (`PUT ...`) are not. Bytes that end or stall still a prefix of one
/// count as one (nothing shows them to be anything else).
async fn begins_with_header(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    deadline: tokio::time::Instant,
) -> bool {
    let cap = Cap {
        bytes: buf.len().max(proxy_protocol::SIGNATURE_MAX),
        chunk: proxy_protocol::SIGNATURE_MAX,
        deadline,
    };
    let decided = read_until(stream, buf, cap, std::future::pending(), |b, _| {
        proxy_protocol::header_signature(b)
    });
    decided.await.unwrap_or(true)
}

/// After a header describing the tier's own connection (PROXY v2 LOCAL), does the
/// tier close (or reset) before sending a byte? That is its health check
/// (HAProxy's `check-send-proxy`), a probe. Waits by the hello's `deadline`; a byte
/// read stays in `buf` for the hello, a stall is left to the hello's timeout.
async fn closes_before_a_byte(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    deadline: tokio::time::Instant,
) -> bool {
    let cap = Cap {
        bytes: HELLO_READ_CHUNK,
        chunk: HELLO_READ_CHUNK,
        deadline,
    };
    let first = read_until(stream, buf, cap, std::future::pending(), |b, _| {
        (!b.is_empty()).then_some(())
    });
    matches!(first.await, Err(Short::Closed))
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
    let cap = Cap {
        bytes: max + HELLO_SLACK,
        chunk: HELLO_READ_CHUNK,
        deadline,
    };
    let parsed = read_until(stream, buf, cap, std::future::pending(), |buf, _| {
        match hello::parse_client_hello(buf, max) {
            HelloParse::Found(h) => Some(Ok(h)),
            HelloParse::Invalid(e) => Some(Err(e)),
            HelloParse::NeedMore => None,
        }
    });
    match parsed.await {
        Ok(found) => found,
        Err(Short::Full) => Err(HelloError::TooLarge),
        Err(Short::Timeout) => Err(HelloError::Timeout),
        Err(Short::Closed | Short::Stopped) => Err(HelloError::Truncated),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

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
    /// holding their arguments twice); 2,304 B before the access log's `queue_ms` and
    /// `connect_ms`, 2,376 B with them: the queue's place times itself through a
    /// reference to the wait's deadline (its drop counts a client that left while
    /// queued), the dial adds to the log line through a reference, the timers are
    /// `u32` beside a `u32` `tried` (a first cut, with `Duration`s held across the
    /// awaits and an `Instant` per place, measured 2,432 B).
    const MAX_CONNECTION_FUTURE: usize = 2376;

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
