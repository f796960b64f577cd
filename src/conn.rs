//! One client connection, from accept to the access-log line:
//! read the ClientHello -> route -> stick lookup -> pick and connect (with retries)
//! -> replay the hello -> relay while watching the server's handshake -> learn.
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::balance::{Backend, Lease, PickError};
use crate::config::{BackendAddress, StickOn};
use crate::hello::{self, ClientHelloInfo, HelloError, HelloParse, ServerHandshake, ServerWatcher};
use crate::listener::Accepted;
use crate::relay::{self, RelayCounters, RelayEnd, Watch};
use crate::server::{ListenerRoutes, Service, Shared};
use crate::stick::{KeyKind, StickKey, StickTable};

/// Lifetime of the source entry recorded at a full handshake when `source` is not a
/// stick key: long enough to route a client's first resumption (whose ticket prefix
/// may not be known yet) back to the backend that issued its ticket.
pub const RESUME_HINT_TTL: Duration = Duration::from_secs(300);
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
enum ConnError {
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
    #[error("the backend did not answer the ClientHello within the idle timeout")]
    NoAnswer,
}

impl ConnError {
    fn reason(&self) -> String {
        match self {
            ConnError::Hello(e) => format!("hello_error:{}", e.reason()),
            ConnError::NoRoute(_) => "refused:no_route".into(),
            ConnError::Pick(e) => format!("refused:{}", e.reason()),
            ConnError::Connect { .. } => "connect_failed".into(),
            ConnError::BackendWrite { .. } => "server_error".into(),
            ConnError::ClientGone => "client_closed".into(),
            ConnError::NoAnswer => "idle_timeout".into(),
        }
    }
}

/// The fields of one access-log line, filled in as the connection progresses.
#[derive(Default)]
struct AccessLog {
    sni: Option<String>,
    service: Option<Arc<str>>,
    stick: Option<&'static str>,
    stick_hit: bool,
    backend: Option<Arc<str>>,
    handshake: Option<&'static str>,
    c2s: u64,
    s2c: u64,
    end: String,
    error: Option<String>,
}

/// Serve one accepted connection to the end. Never panics on client input; every
/// outcome is logged once on `crossbar::access`.
pub async fn handle(
    acc: Accepted,
    routes: Arc<ListenerRoutes>,
    shared: Arc<Shared>,
    listener: Arc<str>,
) {
    let started = Instant::now();
    let Accepted {
        mut stream,
        peer,
        permit,
        inherited,
    } = acc;
    let mut log = AccessLog::default();
    if inherited.is_none() {
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(%peer, "TCP_NODELAY failed: {e}");
        }
    }
    let result = serve(
        &mut stream,
        peer,
        inherited,
        &routes,
        &shared,
        &mut log,
        started,
    )
    .await;
    let failed = match result {
        Ok(()) => false,
        Err(e) => {
            log.end = e.reason();
            log.error = Some(e.to_string());
            true
        }
    };
    drop(permit);
    if failed && !shared.log_limiter.allow() {
        return;
    }
    tracing::info!(
        target: "crossbar::access",
        client = %peer,
        listener = %listener,
        sni = log.sni.as_deref().unwrap_or("-"),
        service = log.service.as_deref().unwrap_or("-"),
        stick = log.stick.unwrap_or("-"),
        stick_result = if log.stick.is_none() { "-" } else if log.stick_hit { "hit" } else { "miss" },
        backend = log.backend.as_deref().unwrap_or("-"),
        handshake = log.handshake.unwrap_or("-"),
        bytes_in = log.c2s,
        bytes_out = log.s2c,
        duration_ms = started.elapsed().as_millis() as u64,
        end = %log.end,
        error = log.error.as_deref().unwrap_or(""),
    );
}

async fn serve(
    stream: &mut TcpStream,
    peer: SocketAddr,
    inherited: Option<Option<crate::config::Keepalive>>,
    routes: &ListenerRoutes,
    shared: &Shared,
    log: &mut AccessLog,
    started: Instant,
) -> Result<(), ConnError> {
    let mut buf = Vec::new();
    let (svc, hello) = if routes.tcp {
        let Some(svc) = routes.routes.route(None) else {
            return Err(ConnError::NoRoute(None));
        };
        (svc.clone(), None)
    } else {
        match read_hello(stream, &mut buf, routes.max_hello, routes.hello_timeout).await {
            Ok(h) => {
                log.sni = h.sni.clone();
                let Some(svc) = routes.routes.route(h.sni.as_deref()) else {
                    crate::metrics::unrouted(&shared.metrics, None, Some("no_route"));
                    return Err(ConnError::NoRoute(h.sni));
                };
                (svc.clone(), Some(h))
            }
            Err(e @ (HelloError::NotTls | HelloError::Malformed)) if routes.non_tls.is_some() => {
                let svc = routes.non_tls.clone().ok_or(ConnError::Hello(e))?;
                svc.metrics.hello_error(e.reason());
                (svc, None)
            }
            Err(e) => {
                let label = match routes.routes.route(None) {
                    Some(s) if routes.routes.is_single() => Some(s.clone()),
                    _ => None,
                };
                match label {
                    Some(s) => {
                        log.service = Some(Arc::from(s.name()));
                        s.metrics.hello_error(e.reason());
                    }
                    None => crate::metrics::unrouted(&shared.metrics, Some(e.reason()), None),
                }
                return Err(ConnError::Hello(e));
            }
        }
    };
    log.service = Some(Arc::from(svc.name()));
    if inherited != Some(svc.config.keepalive) {
        set_keepalive(stream, svc.config.keepalive);
    }
    let client_ip = peer.ip().to_canonical();
    let sticky = lookup(&svc, hello.as_ref(), client_ip);
    if let Some((kind, hit)) = &sticky.key {
        log.stick = Some(kind.as_str());
        log.stick_hit = hit.is_some();
    }
    // Like HAProxy's abortonclose: a client that gives up while queued or while we
    // connect gets no backend connection opened for nobody (a compile slot). A TLS
    // client never half-closes mid-handshake, so its EOF means it left; in tcp mode
    // an EOF may be a half-close that still wants the answer, so only a reset counts.
    let tls = hello.is_some();
    let mut tried: Vec<usize> = Vec::new();
    let mut preferred = sticky.backend();
    let (mut server, lease) = loop {
        let (mut server, lease) = tokio::select! {
            r = connect(&svc, preferred.take(), client_ip, log, &mut tried) => r?,
            () = client_gone(stream, tls) => return Err(ConnError::ClientGone),
        };
        let backend = lease.backend().clone();
        log.backend = Some(backend.name.clone());
        let sni = hello.as_ref().and_then(|h| h.sni.as_deref());
        let sent = send_prelude(&mut server, stream, peer, &backend, sni, &buf).await;
        if !tls {
            sent?;
            break (server, lease);
        }
        // Until the backend answers, the client has sent nothing but its hello: a
        // backend that closes or resets without a byte (it died with connections in
        // its accept queue) is retried like a refused connect, hello and all.
        let answer = match sent {
            Err(ConnError::BackendWrite { error, .. }) => Answer::Closed(error),
            Err(e) => return Err(e),
            Ok(()) => tokio::select! {
                a = first_answer(&server, svc.config.timeouts.idle) => a,
                () = client_gone(stream, true) => return Err(ConnError::ClientGone),
            },
        };
        match answer {
            Answer::Bytes => break (server, lease),
            Answer::Idle => return Err(ConnError::NoAnswer),
            Answer::Closed(e) => {
                backend.metrics.connect_errors.inc();
                crate::health::passive_failure(&svc, &backend, &e);
                tracing::warn!(service = %svc.name(), backend = %backend.name, "closed before answering the ClientHello: {e}; trying another backend");
                tried.push(backend.index);
            }
        }
    };
    let backend = lease.backend().clone();
    if svc.config.keepalive.is_some() {
        set_keepalive(&server, svc.config.keepalive);
    }
    backend.metrics.connections.inc();
    if let Some(table) = &svc.table {
        if svc.sticks_on(StickOn::Source) {
            learn(
                &svc,
                table,
                KeyKind::Source,
                &source_bytes(&svc, client_ip),
                &backend.name,
            );
        }
    }
    let replayed = buf.len() as u64;
    backend.metrics.bytes_c2s.inc_by(replayed);
    // The hello buffer is not needed for the rest of a possibly hours-long connection.
    drop(buf);
    let handshake_kind = std::sync::Mutex::new(None::<&'static str>);
    let watch = hello.as_ref().map(|h| {
        Box::new(Watch {
            watcher: ServerWatcher::new(h, SERVER_WATCH_LIMIT),
            on_handshake: Box::new({
                let svc = &svc;
                let backend = &backend;
                let handshake_kind = &handshake_kind;
                move |hs: &ServerHandshake| {
                    let kind = match hs.resumed {
                        Some(true) => {
                            backend.metrics.resumed.inc();
                            Some("resumed")
                        }
                        Some(false) => {
                            backend.metrics.full.inc();
                            Some("full")
                        }
                        None => None,
                    };
                    *handshake_kind.lock().unwrap_or_else(|e| e.into_inner()) = kind;
                    if let Some(table) = &svc.table {
                        learn_handshake(svc, table, &backend.name, h, hs, client_ip);
                    }
                }
            }) as Box<dyn FnOnce(&ServerHandshake) + Send + '_>,
        })
    });
    let counters = RelayCounters {
        c2s: &backend.metrics.bytes_c2s,
        s2c: &backend.metrics.bytes_s2c,
    };
    let stats = relay::relay(
        stream,
        &mut server,
        svc.config.timeouts.idle,
        &counters,
        watch,
        &shared.hard_stop,
    )
    .await;
    log.handshake = *handshake_kind.lock().unwrap_or_else(|e| e.into_inner());
    log.c2s = stats.client_to_server + replayed;
    log.s2c = stats.server_to_client;
    log.end = stats.end.as_str().to_string();
    if let Some(kind) = stats.error {
        log.error = Some(format!("{kind}"));
    }
    if let Some(abort) = stats.abort.filter(|a| !a.local) {
        svc.metrics.reset(abort.by);
    }
    if stats.end == RelayEnd::BackendReset && stats.server_to_client == 0 {
        tracing::warn!(service = %svc.name(), backend = %backend.name, "backend reset the connection before answering");
    }
    svc.metrics
        .duration
        .observe(started.elapsed().as_secs_f64());
    drop(lease);
    Ok(())
}

/// Write what goes to a backend before the relay: the PROXY header (if the backend
/// wants one) and the bytes read while looking at the hello.
async fn send_prelude(
    server: &mut TcpStream,
    client: &TcpStream,
    peer: SocketAddr,
    backend: &Backend,
    sni: Option<&str>,
    buf: &[u8],
) -> Result<(), ConnError> {
    if let Some(v) = backend.config.proxy_protocol {
        let local = client.local_addr().unwrap_or(peer);
        let header = crate::proxy_protocol::header(v, peer, local, sni);
        write_backend(server, &header, &backend.name).await?;
    }
    if !buf.is_empty() {
        write_backend(server, buf, &backend.name).await?;
    }
    Ok(())
}

/// What a backend did with the ClientHello.
enum Answer {
    /// It sent at least one byte (a ServerHello, an alert...): relay from here.
    Bytes,
    /// It closed or reset the connection without a byte.
    Closed(io::Error),
    /// Nothing within the idle timeout.
    Idle,
}

/// Wait (peeking, not reading) for the backend's first byte.
async fn first_answer(server: &TcpStream, idle: Duration) -> Answer {
    let mut probe = [0u8; 1];
    match tokio::time::timeout(idle, server.peek(&mut probe)).await {
        Err(_) => Answer::Idle,
        Ok(Ok(0)) => Answer::Closed(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed",
        )),
        Ok(Ok(_)) => Answer::Bytes,
        Ok(Err(e)) => Answer::Closed(e),
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

/// Read until a complete ClientHello (or a reason to give up), within `timeout`
/// and `max` bytes. Every byte read stays in `buf` to be replayed to the backend.
async fn read_hello(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    max: usize,
    timeout: Duration,
) -> Result<ClientHelloInfo, HelloError> {
    let deadline = tokio::time::Instant::now() + timeout;
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

/// Result of the stick lookup: the key that decided (or the last one tried) and the
/// backend's position in the service's pool.
struct Sticky {
    key: Option<(KeyKind, Option<usize>)>,
}

impl Sticky {
    fn backend(&self) -> Option<usize> {
        self.key.as_ref().and_then(|(_, b)| *b)
    }
}

/// The pool position of the backend an entry points at; an entry for a backend no
/// longer in the pool is a miss.
fn table_hit(svc: &Service, table: &StickTable, key: &StickKey) -> Option<usize> {
    table
        .lookup_with(key, |name| svc.pool.position(name))
        .flatten()
}

/// Does the client offer TLS 1.3? (Then its legacy session ID is random, not state.)
fn offers_tls13(h: &ClientHelloInfo) -> bool {
    h.supported_versions.contains(&hello::version::TLS13)
}

/// The key-name prefix of a ticket or PSK identity, if the service uses prefixes.
fn prefix<'a>(svc: &Service, raw: &'a [u8]) -> Option<&'a [u8]> {
    let p = svc.config.stick.as_ref()?.ticket_prefix;
    (p > 0 && raw.len() > p).then(|| &raw[..p])
}

fn source_bytes(svc: &Service, ip: IpAddr) -> Vec<u8> {
    let (v4, v6) = svc
        .config
        .stick
        .as_ref()
        .map(|s| (s.source_prefix_v4, s.source_prefix_v6))
        .unwrap_or((32, 128));
    match ip {
        IpAddr::V4(a) => mask(&a.octets(), v4),
        IpAddr::V6(a) => mask(&a.octets(), v6),
    }
}

fn mask(octets: &[u8], bits: u8) -> Vec<u8> {
    octets
        .iter()
        .enumerate()
        .map(|(i, &o)| {
            let keep = (usize::from(bits)).saturating_sub(i * 8).min(8);
            if keep == 0 {
                0
            } else {
                o & (0xffu8 << (8 - keep))
            }
        })
        .collect()
}

fn probe(svc: &Service, table: &StickTable, kind: KeyKind, raw: &[u8]) -> Option<usize> {
    let hit = table_hit(svc, table, &table.key(kind, raw));
    svc.metrics.lookup(kind, hit.is_some());
    hit
}

/// Look the client's session state up in the order of `stick.on`.
fn lookup(svc: &Service, hello: Option<&ClientHelloInfo>, ip: IpAddr) -> Sticky {
    let (Some(table), Some(stick)) = (&svc.table, &svc.config.stick) else {
        return Sticky { key: None };
    };
    let mut last = None;
    for key in &stick.on {
        let found = match (key, hello) {
            (StickOn::SessionId, Some(h)) if !h.session_id.is_empty() => {
                let k = table.key(KeyKind::SessionId, &h.session_id);
                let hit = table_hit(svc, table, &k);
                // A TLS 1.3 client's legacy session ID is random: only a hit counts then.
                if hit.is_some() || !offers_tls13(h) {
                    svc.metrics.lookup(KeyKind::SessionId, hit.is_some());
                    last = Some(KeyKind::SessionId);
                }
                hit.map(|b| (KeyKind::SessionId, b))
            }
            (StickOn::Ticket, Some(h)) => h.ticket.as_deref().and_then(|t| {
                last = Some(KeyKind::Ticket);
                by_ticket(svc, table, KeyKind::Ticket, t).map(|b| (KeyKind::Ticket, b))
            }),
            (StickOn::Psk, Some(h)) => h.psk_identities.iter().find_map(|id| {
                last = Some(KeyKind::Psk);
                by_ticket(svc, table, KeyKind::Psk, id).map(|b| (KeyKind::Psk, b))
            }),
            (StickOn::Source, _) => {
                last = Some(KeyKind::Source);
                probe(svc, table, KeyKind::Source, &source_bytes(svc, ip))
                    .map(|b| (KeyKind::Source, b))
            }
            _ => None,
        };
        if let Some((kind, b)) = found {
            return Sticky {
                key: Some((kind, Some(b))),
            };
        }
    }
    // A resumption attempt nothing else knows: the short-lived source hint recorded at
    // this client's last full handshake.
    let resuming = hello.is_some_and(|h| h.ticket.is_some() || !h.psk_identities.is_empty());
    if resuming && !stick.on.contains(&StickOn::Source) {
        let k = table.key(KeyKind::Source, &source_bytes(svc, ip));
        if let Some(b) = table_hit(svc, table, &k) {
            return Sticky {
                key: Some((KeyKind::Source, Some(b))),
            };
        }
    }
    Sticky {
        key: last.map(|k| (k, None)),
    }
}

/// A ticket or PSK identity: the whole value first, then its key-name prefix.
fn by_ticket(svc: &Service, table: &StickTable, kind: KeyKind, raw: &[u8]) -> Option<usize> {
    let k = table.key(kind, raw);
    if let Some(b) = table_hit(svc, table, &k) {
        svc.metrics.lookup(kind, true);
        return Some(b);
    }
    let hit =
        prefix(svc, raw).and_then(|p| table_hit(svc, table, &table.key(KeyKind::TicketPrefix, p)));
    svc.metrics.lookup(kind, hit.is_some());
    hit
}

fn learn(svc: &Service, table: &StickTable, kind: KeyKind, raw: &[u8], backend: &str) {
    table.learn(table.key(kind, raw), backend);
    svc.metrics.learned(kind);
}

fn learn_prefix(svc: &Service, table: &StickTable, raw: &[u8], backend: &str) {
    if let Some(p) = prefix(svc, raw) {
        table.learn_prefix(table.key(KeyKind::TicketPrefix, p), backend);
    }
}

/// Learn from what the server chose: never from what the client merely claimed.
fn learn_handshake(
    svc: &Service,
    table: &StickTable,
    backend: &str,
    h: &ClientHelloInfo,
    hs: &ServerHandshake,
    ip: IpAddr,
) {
    let tls13 = hs.version == Some(hello::version::TLS13);
    if hs.alert || hs.resumed.is_none() {
        return;
    }
    // A TLS <= 1.2 full handshake counts once the client finished it (the server's CCS
    // follows the client's Finished): before, its session ID is one nobody can resume,
    // and learning it let bare ClientHellos flush the table (tests/hostile_clients.rs).
    if !tls13 && hs.resumed == Some(false) && !hs.server_ccs {
        return;
    }
    // TLS <= 1.2: the server assigned (or, resuming, confirmed) this session ID.
    if !tls13 && !hs.session_id.is_empty() && svc.sticks_on(StickOn::SessionId) {
        learn(svc, table, KeyKind::SessionId, &hs.session_id, backend);
    }
    if svc.sticks_on(StickOn::Ticket) {
        // A ticket the server just issued (TLS 1.2 NewSessionTicket is plaintext).
        if let Some(t) = &hs.new_ticket {
            learn(svc, table, KeyKind::Ticket, t, backend);
            learn_prefix(svc, table, t, backend);
        }
        // A ticket the server accepted.
        if let (Some(t), Some(true), false) = (&h.ticket, hs.resumed, tls13) {
            learn(svc, table, KeyKind::Ticket, t, backend);
            learn_prefix(svc, table, t, backend);
        }
    }
    // TLS 1.3: the PSK identity the ServerHello says it accepted.
    if let (true, Some(i)) = (tls13, hs.psk_selected) {
        if let Some(id) = h.psk_identities.get(usize::from(i)) {
            if svc.sticks_on(StickOn::Psk) {
                learn(svc, table, KeyKind::Psk, id, backend);
            }
            if svc.sticks_on(StickOn::Psk) || svc.sticks_on(StickOn::Ticket) {
                learn_prefix(svc, table, id, backend);
            }
        }
    }
    // A full handshake: remember where this client went, briefly, for its first resumption.
    if hs.resumed == Some(false) && !svc.sticks_on(StickOn::Source) {
        learn(svc, table, KeyKind::Source, &source_bytes(svc, ip), backend);
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
        let started = Instant::now();
        match connect_to(&b.config.address, svc.config.timeouts.connect).await {
            Ok(s) => {
                crate::health::passive_success(&b);
                b.metrics
                    .connect_duration
                    .observe(started.elapsed().as_secs_f64());
                return Ok((s, l));
            }
            Err(e) => {
                b.metrics.connect_errors.inc();
                crate::health::passive_failure(svc, &b, &e);
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

/// Connect to a backend address within `timeout`; host names are resolved now, so
/// DNS changes are picked up, and each resolved address is tried in turn.
pub async fn connect_to(addr: &BackendAddress, timeout: Duration) -> io::Result<TcpStream> {
    let attempt = async {
        let stream = match addr.as_socket_addr() {
            Some(sa) => TcpStream::connect(sa).await?,
            None => {
                let mut last = io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("{} resolves to no address", addr.host),
                );
                let mut found = None;
                for sa in tokio::net::lookup_host((addr.host.as_str(), addr.port)).await? {
                    match TcpStream::connect(sa).await {
                        Ok(s) => {
                            found = Some(s);
                            break;
                        }
                        Err(e) => last = e,
                    }
                }
                found.ok_or(last)?
            }
        };
        stream.set_nodelay(true)?;
        Ok(stream)
    };
    tokio::time::timeout(timeout, attempt).await.map_err(|_| {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!("no answer within {timeout:?}"),
        )
    })?
}

/// Connect for a connection of crossbar's own (health checks, the ticket-key
/// probe): [`connect_to`], then a PROXY `LOCAL` header if the backend expects PROXY
/// protocol, so it doesn't reject the connection.
pub async fn connect_own(
    addr: &BackendAddress,
    timeout: Duration,
    proxy: Option<crate::config::ProxyProtocol>,
) -> io::Result<TcpStream> {
    let mut tcp = connect_to(addr, timeout).await?;
    if let Some(v) = proxy {
        tcp.write_all(&crate::proxy_protocol::local(v)).await?;
    }
    Ok(tcp)
}

async fn write_backend(
    server: &mut TcpStream,
    bytes: &[u8],
    backend: &Arc<str>,
) -> Result<(), ConnError> {
    server
        .write_all(bytes)
        .await
        .map_err(|error| ConnError::BackendWrite {
            backend: backend.clone(),
            error,
        })
}

/// Bounds error log lines (garbage floods must not fill a disk): at most
/// `LOG_PER_SECOND` per second, then one line saying how many were suppressed.
pub struct LogLimiter {
    window: AtomicU64,
    count: AtomicU64,
    suppressed: AtomicU64,
    epoch: Instant,
}

/// Error access-log lines allowed per second before suppression.
const LOG_PER_SECOND: u64 = 50;

impl LogLimiter {
    /// A fresh limiter.
    pub fn new() -> LogLimiter {
        LogLimiter {
            window: AtomicU64::new(0),
            count: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    /// May one more error line be logged now?
    pub fn allow(&self) -> bool {
        let now = self.epoch.elapsed().as_secs();
        if self.window.swap(now, Ordering::AcqRel) != now {
            self.count.store(0, Ordering::Release);
            let n = self.suppressed.swap(0, Ordering::AcqRel);
            if n > 0 {
                tracing::warn!(target: "crossbar::access", suppressed = n, "error log lines suppressed in the last second(s)");
            }
        }
        if self.count.fetch_add(1, Ordering::AcqRel) < LOG_PER_SECOND {
            true
        } else {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            false
        }
    }
}

impl Default for LogLimiter {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_keeps_prefix_bits() {
        assert_eq!(mask(&[10, 1, 2, 3], 32), vec![10, 1, 2, 3]);
        assert_eq!(mask(&[10, 1, 2, 3], 24), vec![10, 1, 2, 0]);
        assert_eq!(mask(&[10, 1, 255, 3], 20), vec![10, 1, 240, 0]);
        assert_eq!(mask(&[10, 1, 2, 3], 0), vec![0, 0, 0, 0]);
    }

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

    #[test]
    fn limiter_caps_a_burst() {
        let l = LogLimiter::new();
        let allowed = (0..1000).filter(|_| l.allow()).count() as u64;
        assert!(allowed <= LOG_PER_SECOND * 2, "allowed {allowed}");
    }
}

#[cfg(test)]
mod size_probe {
    /// Bytes of a connection task's future: held for the whole life of every
    /// connection, idle ones included (docs/performance.md, RSS per idle connection).
    const MAX_CONNECTION_FUTURE: usize = 2560;

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
