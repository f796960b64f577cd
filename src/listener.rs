//! Listening sockets: bind with socket2 options, accept in a loop that survives
//! resource exhaustion, enforce the per-listener connection limit.
use std::io;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus::IntCounter;
use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use crate::config::{Keepalive, ListenConfig};

/// What an accept loop counts, per listen address (registered by the metrics
/// registry: `crossbar_listener_accepts_total`, `crossbar_listener_refused_total`).
#[derive(Clone)]
pub struct AcceptCounters {
    /// Accepted connections.
    pub accepts: IntCounter,
    /// Refused: the listener's max_connections was reached.
    pub refused_full: IntCounter,
    /// accept(2) errors.
    pub accept_errors: IntCounter,
}

/// First pause after an accept error (EMFILE, ECONNABORTED...); doubles while
/// errors repeat, reset by the next successful accept.
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
/// Longest pause between accept retries while errors repeat.
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Binding a listen address failed.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {addr}: {error}{hint}")]
pub struct BindError {
    /// The address.
    pub addr: SocketAddr,
    /// The OS error; part of the message, not a chained source, so that a report
    /// of the whole chain (`{:#}`) names it once.
    pub error: io::Error,
    hint: String,
}

impl BindError {
    /// A bind error for `addr` without a hint.
    pub fn new(addr: SocketAddr, error: io::Error) -> BindError {
        BindError {
            addr,
            error,
            hint: String::new(),
        }
    }
}

/// What a bind error usually means, as a parenthesized hint after the OS error.
pub fn bind_hint(error: &io::Error, addr: SocketAddr) -> String {
    match error.kind() {
        io::ErrorKind::AddrInUse => {
            format!(" (address in use: another crossbar (or program) holds {addr})")
        }
        io::ErrorKind::AddrNotAvailable => {
            " (address not on this host: set `freebind: true` for a VIP)".into()
        }
        io::ErrorKind::PermissionDenied => " (ports below 1024 need CAP_NET_BIND_SERVICE)".into(),
        _ => String::new(),
    }
}

/// Create a listening socket with crossbar's options: SO_REUSEADDR (not
/// SO_REUSEPORT: a second crossbar must fail to bind, not share the address and
/// take half its connections; an upgrade hands the socket itself over, see
/// [`crate::upgrade`]), IPV6_V6ONLY for IPv6 addresses (so `[::]` and `0.0.0.0` can both be bound),
/// IP_FREEBIND when asked (a keepalived VIP not yet on this host), and the backlog.
pub fn bind(cfg: &ListenConfig) -> Result<TcpListener, BindError> {
    let err = |error: io::Error| BindError {
        addr: cfg.addr,
        hint: bind_hint(&error, cfg.addr),
        error,
    };
    let domain = Domain::for_address(cfg.addr);
    let socket = Socket::new(domain, Type::STREAM, Some(Protocol::TCP)).map_err(err)?;
    socket.set_reuse_address(true).map_err(err)?;
    if cfg.addr.is_ipv6() {
        socket.set_only_v6(true).map_err(err)?;
    }
    if cfg.freebind {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        {
            if cfg.addr.is_ipv6() {
                socket.set_freebind_ipv6(true).map_err(err)?;
            } else {
                socket.set_freebind(true).map_err(err)?;
            }
        }
    }
    socket.set_nonblocking(true).map_err(err)?;
    socket.bind(&cfg.addr.into()).map_err(err)?;
    let backlog = i32::try_from(cfg.backlog).unwrap_or(i32::MAX);
    socket.listen(backlog).map_err(err)?;
    TcpListener::from_std(socket.into()).map_err(err)
}

/// Set a new backlog on a listening socket: listen(2) again, which Linux allows on
/// a socket that already listens (it only changes the queue's length).
pub fn set_backlog(sock: &impl AsFd, backlog: u32) -> io::Result<()> {
    let backlog = i32::try_from(backlog).unwrap_or(i32::MAX);
    socket2::SockRef::from(sock).listen(backlog)
}

/// A listener's `max_connections`: admits a connection while fewer are open. A
/// reload resizes it in place; after a lowering, new connections are refused until
/// enough of the open ones ended (open ones are never cut).
#[derive(Debug)]
pub struct ConnLimit {
    max: AtomicUsize,
    open: AtomicUsize,
}

impl ConnLimit {
    /// A limit of `max` concurrent connections.
    pub fn new(max: usize) -> Arc<ConnLimit> {
        Arc::new(ConnLimit {
            max: AtomicUsize::new(max),
            open: AtomicUsize::new(0),
        })
    }

    /// The limit now.
    pub fn max(&self) -> usize {
        self.max.load(Ordering::Acquire)
    }

    /// Change the limit (a reload); connections already admitted stay.
    pub fn set_max(&self, max: usize) {
        self.max.store(max, Ordering::Release);
    }

    /// Connections admitted and not yet ended.
    #[cfg(test)]
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// A slot for one more connection, or `None` at the limit.
    pub fn try_admit(self: &Arc<Self>) -> Option<ConnSlot> {
        let max = self.max();
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()?;
        Some(ConnSlot(self.clone()))
    }
}

/// One admitted connection's place under its listener's [`ConnLimit`]; freed on drop.
#[derive(Debug)]
pub struct ConnSlot(Arc<ConnLimit>);

impl Drop for ConnSlot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Is this accept error one that goes away when resources free up?
fn is_exhaustion(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE) | Some(libc::ENFILE) | Some(libc::ENOBUFS) | Some(libc::ENOMEM)
    )
}

/// Does an accepted socket inherit TCP_NODELAY and the keepalive settings of its
/// listening socket? Linux copies them to each connection (when its handshake
/// completes), so setting them once on the listener saves five setsockopt calls
/// per connection.
const OPTIONS_INHERITED: bool = cfg!(any(target_os = "linux", target_os = "android"));

/// The options an accepted socket carries from its listener: TCP_NODELAY and this
/// keepalive setting (`None`: keepalive off).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InheritedOptions {
    /// The keepalive setting the socket inherited.
    pub keepalive: Option<Keepalive>,
}

/// Set on the listening socket what every accepted connection should start with:
/// TCP_NODELAY and `keepalive` (or keepalive off). Returns what accepted sockets
/// now inherit, or `None` where they inherit nothing (then each connection sets its
/// own, see [`Accepted::inherited`]).
pub fn set_inherited_options(
    listener: &TcpListener,
    keepalive: Option<Keepalive>,
) -> Option<InheritedOptions> {
    if !OPTIONS_INHERITED {
        return None;
    }
    let sock = socket2::SockRef::from(listener);
    match sock
        .set_nodelay(true)
        .and_then(|()| set_keepalive(&sock, keepalive))
    {
        Ok(()) => Some(InheritedOptions { keepalive }),
        Err(e) => {
            tracing::debug!("listener socket options not set, setting them per connection: {e}");
            None
        }
    }
}

/// Turn TCP keepalive on with `ka`'s timing, or off (`None`: a setting inherited
/// from a listener may have to be undone).
pub fn set_keepalive(sock: &socket2::SockRef<'_>, ka: Option<Keepalive>) -> io::Result<()> {
    match ka {
        Some(ka) => sock.set_tcp_keepalive(&keepalive_params(ka)),
        None => sock.set_keepalive(false),
    }
}

/// socket2's keepalive parameters for `ka`.
fn keepalive_params(ka: Keepalive) -> socket2::TcpKeepalive {
    let params = socket2::TcpKeepalive::new()
        .with_time(ka.time)
        .with_interval(ka.interval);
    #[cfg(any(
        target_os = "linux",
        target_os = "android",
        target_os = "freebsd",
        target_os = "macos"
    ))]
    let params = params.with_retries(ka.probes);
    params
}

/// A connection accepted within the listener's limit.
pub struct Accepted {
    /// The client socket.
    pub stream: TcpStream,
    /// The client's address.
    pub peer: SocketAddr,
    /// Held for the connection's lifetime: the listener's max_connections slot.
    pub permit: ConnSlot,
    /// What the socket inherited from the listener: TCP_NODELAY and this keepalive
    /// setting; `None` if nothing (the connection sets both itself).
    pub inherited: Option<InheritedOptions>,
}

/// Which options accepted sockets inherit from a listener, and whether that is
/// known for the next one accepted.
///
/// Linux copies a listener's options to a connection when its handshake completes,
/// not when it is accepted: after the listener's options change (at start, or when a
/// reload changes the keepalive), the connections already queued still carry the old
/// ones. So a change makes the inheritance uncertain (each connection sets its own
/// options) until an accept(2) finds the queue empty. (tokio's accept can't tell:
/// it may wait on readiness it hasn't been told of yet, with connections queued.)
struct Inheritance {
    /// What the listener carries now; `None` if it passes nothing on.
    on_listener: Option<InheritedOptions>,
    /// Every connection still queued was created under `on_listener`.
    sure: bool,
}

/// One accept(2) now, bypassing tokio's readiness: `None` if the queue is empty.
fn accept_now(listener: &TcpListener) -> io::Result<Option<(TcpStream, SocketAddr)>> {
    match socket2::SockRef::from(listener).accept() {
        Ok((sock, addr)) => {
            sock.set_nonblocking(true)?;
            let peer = addr
                .as_socket()
                .ok_or_else(|| io::Error::other("accepted a socket without an IP address"))?;
            Ok(Some((TcpStream::from_std(sock.into())?, peer)))
        }
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
        Err(e) => Err(e),
    }
}

impl Inheritance {
    /// What the connection just accepted inherited, for [`Accepted::inherited`].
    fn accepted(&self) -> Option<InheritedOptions> {
        self.on_listener.filter(|_| self.sure)
    }

    /// Make the listener pass on `wanted` from now on.
    fn want(&mut self, listener: &TcpListener, wanted: Option<Keepalive>) {
        if self.on_listener != Some(InheritedOptions { keepalive: wanted }) {
            self.on_listener = set_inherited_options(listener, wanted);
            self.sure = false;
        }
    }
}

/// Accept until `stop` fires, handing each connection to `spawn`. Accepted sockets
/// inherit TCP_NODELAY and the keepalive `keepalive()` returns (asked at each
/// accept, so a reload's new value reaches the listener). Connections over
/// `max_connections` are closed at once and counted. Never returns an error: accept
/// failures are logged, counted and backed off.
pub async fn accept_loop(
    listener: TcpListener,
    limit: Arc<ConnLimit>,
    metrics: AcceptCounters,
    stop: CancellationToken,
    keepalive: impl Fn() -> Option<Keepalive>,
    mut spawn: impl FnMut(Accepted),
) {
    let local = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let mut inheritance = Inheritance {
        on_listener: None,
        sure: false,
    };
    inheritance.want(&listener, keepalive());
    let mut backoff = ACCEPT_BACKOFF_MIN;
    loop {
        let res = if inheritance.on_listener.is_some() && !inheritance.sure {
            // Drain what was queued before the options changed, one accept(2) at a
            // time, until the queue is seen empty.
            if stop.is_cancelled() {
                return;
            }
            tokio::task::consume_budget().await;
            match accept_now(&listener) {
                Ok(Some(accepted)) => Ok(accepted),
                Ok(None) => {
                    inheritance.sure = true;
                    continue;
                }
                Err(e) => Err(e),
            }
        } else {
            tokio::select! {
                biased;
                () = stop.cancelled() => return,
                r = listener.accept() => r,
            }
        };
        match res {
            Ok((stream, peer)) => {
                backoff = ACCEPT_BACKOFF_MIN;
                let Some(permit) = limit.try_admit() else {
                    metrics.refused_full.inc();
                    tracing::debug!(listener = %local, %peer, "refused: listener max_connections reached");
                    drop(stream);
                    continue;
                };
                metrics.accepts.inc();
                let inherited = inheritance.accepted();
                inheritance.want(&listener, keepalive());
                spawn(Accepted {
                    stream,
                    peer,
                    permit,
                    inherited,
                });
            }
            Err(e) => {
                // Exhaustion (EMFILE...) is logged loudly; ECONNABORTED and friends
                // (a client gave up first) quietly. Either way: a pause before the
                // next try, so an error that repeats can't spin a core.
                metrics.accept_errors.inc();
                if is_exhaustion(&e) {
                    tracing::warn!(listener = %local, "accept failed: {e}; retrying in {backoff:?}");
                } else {
                    tracing::debug!(listener = %local, "accept failed: {e}; retrying in {backoff:?}");
                }
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lowered limit admits nothing until enough open connections ended (none is
    /// cut); a raised one admits more at once.
    #[test]
    fn a_resized_limit_applies_to_the_next_connection() {
        let limit = ConnLimit::new(3);
        let mut open: Vec<ConnSlot> = (0..3).filter_map(|_| limit.try_admit()).collect();
        assert_eq!((open.len(), limit.try_admit().is_none()), (3, true));
        limit.set_max(1);
        open.pop();
        assert!(limit.try_admit().is_none(), "2 open, limit 1");
        open.clear();
        open.extend(limit.try_admit());
        assert!(limit.try_admit().is_none(), "1 open, limit 1");
        limit.set_max(4);
        open.extend((0..3).filter_map(|_| limit.try_admit()));
        assert_eq!((limit.open(), limit.try_admit().is_none()), (4, true));
    }

    /// A socket that was bound but never listened on: every accept(2) fails with
    /// EINVAL at once, and epoll reports it ready forever (HUP).
    fn failing_listener() -> TcpListener {
        let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let s = Socket::new(Domain::for_address(addr), Type::STREAM, None).unwrap();
        s.bind(&addr.into()).unwrap();
        s.set_nonblocking(true).unwrap();
        TcpListener::from_std(s.into()).unwrap()
    }

    /// An error that is not resource exhaustion (EINVAL here, ECONNABORTED in life)
    /// is backed off too: while this test yields a thousand times, the loop gets a
    /// try or a few (its first pause is 10 ms, doubling); without a pause it retries
    /// over a hundred thousand times. (No tokio test-util here: it would build a
    /// second copy of tokio and everything on it for the tests.)
    #[tokio::test]
    async fn every_accept_error_is_backed_off() {
        let counter = |name: &str| IntCounter::new(name, "a test's count").unwrap();
        let metrics = AcceptCounters {
            accepts: counter("accepts"),
            refused_full: counter("refused_full"),
            accept_errors: counter("accept_errors"),
        };
        let errors = metrics.accept_errors.clone();
        let stop = CancellationToken::new();
        let task = tokio::spawn(accept_loop(
            failing_listener(),
            ConnLimit::new(1),
            metrics,
            stop.clone(),
            || None,
            |_| panic!("nothing to accept"),
        ));
        for _ in 0..1_000 {
            tokio::task::yield_now().await;
        }
        let tries = errors.get();
        stop.cancel();
        task.await.unwrap();
        assert!(
            (1..=8).contains(&tries),
            "{tries} accept attempts without a pause"
        );
    }
}
