//! The admin HTTP endpoint: the status page at `/`, `/metrics`, `/healthz` and the `/api` to inspect
//! services and open connections, show, look up and delete stick entries,
//! drain/enable/disable backends, set their weights, close connections (one, a
//! client's, or a backend's) and reload.
//!
//! hyper HTTP/1.1, one task per connection, a bounded number of connections, a
//! header read timeout, no request bodies (no endpoint takes one: a request that
//! declares one is answered 413 at once, without reading it, so a body that never
//! comes holds nothing) and a bounded connection age. When every slot
//! is taken, the oldest connection without a request in progress makes room
//! (`slots.rs`), and a few reserved slots still answer `/healthz` and `/metrics`
//! while every regular one is busy, so a full admin endpoint never reads as a dead
//! host to keepalived or Prometheus. Every request must name this endpoint in
//! `Host`, and writes must not come from another site's page (`origin.rs`: DNS
//! rebinding and cross-site requests). Reads are open to whoever reaches the
//! address, so keep it on loopback or a management network; writes (POST/DELETE)
//! need the bearer token when `admin.token_file` is set, else they are accepted from
//! loopback peers only. Errors are JSON: `{"error": "..."}`.
mod api;
mod auth;
mod error;
pub mod human;
mod origin;
pub mod page;
mod page_feedback;
mod query;
mod slots;
mod throttle;
pub mod view;
mod weights;
mod writes;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{
    HeaderValue, ALLOW, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, TRANSFER_ENCODING,
};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde::Serialize;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use auth::{constant_time_eq, Secret, TokenError};
pub use error::ApiError;
pub use query::{
    parse_weight, WeightAsk, DEFAULT_CONNECTIONS_LIMIT, DEFAULT_SOURCES_LIMIT, DEFAULT_TABLE_LIMIT,
    MAX_TABLE_LIMIT,
};
pub use throttle::WARN_INTERVAL;
pub use writes::Action;

use crate::config::AdminConfig;
use crate::server::Server;
use slots::{Lease, Slot, Slots};
use throttle::Throttle;

/// Time a client has to send a request's headers (slowloris guard).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Concurrent admin connections: a scraper, a few operators and scripts.
pub const MAX_CONNECTIONS: usize = 64;
/// Time the request in progress gets to finish once its connection is to close
/// (shutdown, or [`MAX_CONNECTION_AGE`]). Every endpoint answers from memory (a
/// table dump at most builds 10,000 entries), so this only bounds a client that
/// never reads its answer.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections beyond [`MAX_CONNECTIONS`] that may still ask `/healthz` or
/// `/metrics` (a keepalived check, a scrape); other paths get 503 there.
pub const RESERVED_CONNECTIONS: usize = 8;
/// Whole life of a reserved connection: one small request and its answer.
const RESERVED_LIFETIME: Duration = Duration::from_secs(2);
/// A connection's age after which it is closed once its current request is done
/// (a scraper's keep-alive reconnects): bounds a client that never reads its answer.
const MAX_CONNECTION_AGE: Duration = Duration::from_secs(60);
/// Pause after an accept error (EMFILE) before trying again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// The Prometheus text exposition format.
const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The admin endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The listen address could not be bound.
    #[error("binding the admin endpoint on {addr}: {error}{hint}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        error: std::io::Error,
        /// What the error usually means, e.g. who holds an address in use.
        hint: String,
    },
    /// The token file is unusable.
    #[error(transparent)]
    Token(#[from] TokenError),
}

/// Bind the admin listen address, for this process alone: while another process
/// (another crossbar, or any program) listens there, this fails with
/// [`AdminError::Bind`] naming the address.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, AdminError> {
    bind_with(addr, false)
}

/// Bind the admin listen address next to a predecessor that is handing over to
/// this process (see [`crate::upgrade`]) but did not pass its admin socket (an older
/// crossbar: it set SO_REUSEPORT on it, so this one can join). Never used otherwise:
/// two instances sharing the address would answer API calls at random.
pub async fn bind_beside_predecessor(addr: SocketAddr) -> Result<TcpListener, AdminError> {
    bind_with(addr, true)
}

fn bind_with(addr: SocketAddr, reuseport: bool) -> Result<TcpListener, AdminError> {
    let sock = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()
    } else {
        tokio::net::TcpSocket::new_v6()
    };
    let bound = sock.and_then(|s| {
        s.set_reuseaddr(true)?;
        #[cfg(all(unix, not(any(target_os = "solaris", target_os = "illumos"))))]
        s.set_reuseport(reuseport)?;
        s.bind(addr)?;
        s.listen(ADMIN_BACKLOG)
    });
    bound.map_err(|error| AdminError::Bind {
        addr,
        hint: crate::listener::bind_hint(&error, addr),
        error,
    })
}

/// Pending admin connections (scrapes and CLI calls are few).
const ADMIN_BACKLOG: u32 = 128;

/// Read the token file of `config`, if one is set (trimmed; empty or unreadable is
/// an error). Read once: changing the token needs a restart.
pub fn load_token(config: &AdminConfig) -> Result<Option<Secret>, AdminError> {
    Ok(config
        .token_file
        .as_deref()
        .map(Secret::from_file)
        .transpose()?)
}

struct Ctx {
    server: Arc<Server>,
    token: Option<Secret>,
    /// Warnings for connections refused or closed to make room, and for refused
    /// requests: a client can cause them at will.
    refused_warn: Throttle,
    evicted_warn: Throttle,
    request_warn: Throttle,
}

/// Serve the admin API on `listener` until `stop` fires; open connections then
/// finish their current request.
pub async fn serve(
    listener: TcpListener,
    server: Arc<Server>,
    token: Option<Secret>,
    stop: CancellationToken,
) {
    let ctx = Arc::new(Ctx {
        server,
        token,
        refused_warn: Throttle::default(),
        evicted_warn: Throttle::default(),
        request_warn: Throttle::default(),
    });
    let slots = Slots::new(MAX_CONNECTIONS, RESERVED_CONNECTIONS);
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => return,
            r = listener.accept() => r,
        };
        let (tcp, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!("admin accept failed: {e}");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let Some(admitted) = admit(&ctx, &slots, peer) else {
            continue;
        };
        let (ctx, stop) = (ctx.clone(), stop.clone());
        tokio::spawn(connection(tcp, peer, ctx, stop, admitted.lease));
    }
}

/// A slot for the connection from `peer`, counting (and, throttled, logging) a
/// refusal or the idle connection closed to make room.
fn admit(ctx: &Ctx, slots: &Arc<Slots>, peer: SocketAddr) -> Option<slots::Admitted> {
    let metrics = &ctx.server.metrics().admin;
    let Some(admitted) = slots.admit() else {
        metrics.connections_refused.inc();
        if let Some(suppressed) = ctx.refused_warn.note() {
            tracing::warn!(%peer, suppressed, "admin: every connection slot holds a request in progress; connection closed");
        }
        return None;
    };
    if admitted.evicted {
        metrics.connections_evicted.inc();
        if let Some(suppressed) = ctx.evicted_warn.note() {
            tracing::warn!(%peer, suppressed, "admin: every connection slot taken; closed the oldest one without a request in progress to make room");
        }
    }
    Some(admitted)
}

/// How long a connection in `slot` may live, and then how long its last request gets.
fn lifetime(slot: Slot) -> (Duration, Duration) {
    match slot {
        Slot::Regular => (MAX_CONNECTION_AGE, REQUEST_TIMEOUT),
        Slot::Reserved => (RESERVED_LIFETIME, Duration::ZERO),
    }
}

async fn connection(
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
    ctx: Arc<Ctx>,
    stop: CancellationToken,
    lease: Lease,
) {
    let local = tcp.local_addr().map_or(peer.ip(), |a| a.ip());
    let (slot, evicted) = (lease.slot, lease.evicted());
    let lease = Arc::new(lease);
    let svc = hyper::service::service_fn(move |req| {
        let (ctx, lease) = (ctx.clone(), lease.clone());
        async move {
            let _busy = lease.busy();
            let _counted = InProgress::new(&ctx.server.metrics().admin.requests_in_progress);
            let from = Peer { addr: peer, local };
            Ok::<_, Infallible>(handle(&ctx, from, req, lease.slot).await)
        }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .keep_alive(slot == Slot::Regular)
        .serve_connection(TokioIo::new(tcp), svc);
    tokio::pin!(conn);
    let (age, last) = lifetime(slot);
    let ended = tokio::select! {
        r = conn.as_mut() => Some(r),
        // Its slot went to a new connection: nothing was in progress, close now.
        () = evicted.cancelled() => return,
        () = stop.cancelled() => None,
        () = tokio::time::sleep(age) => None,
    };
    // Stopping or too old: let the current request finish within `last`, then drop.
    let result = match ended {
        Some(r) => r,
        None => {
            conn.as_mut().graceful_shutdown();
            tokio::time::timeout(last, conn).await.unwrap_or(Ok(()))
        }
    };
    if let Err(e) = result {
        tracing::debug!(%peer, "admin connection: {e}");
    }
}

/// A request counted in `crossbar_admin_requests_in_progress` until dropped.
struct InProgress(prometheus::IntGauge);

impl InProgress {
    fn new(gauge: &prometheus::IntGauge) -> InProgress {
        gauge.inc();
        InProgress(gauge.clone())
    }
}

impl Drop for InProgress {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The two ends of an admin connection.
#[derive(Debug, Clone, Copy)]
struct Peer {
    /// The client.
    addr: SocketAddr,
    /// The address it connected to (for a wildcard listen address, the one it chose).
    local: std::net::IpAddr,
}

type Reply = Response<Full<Bytes>>;

fn reply(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Reply {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

/// A view as a 200 answer, or the error.
fn view_reply<V: Serialize>(r: Result<V, ApiError>) -> Reply {
    json_text(r.and_then(|v| api::json_text(&v)))
}

/// A JSON text already built, or the error.
fn json_text(r: Result<String, ApiError>) -> Reply {
    match r {
        Ok(body) => reply(StatusCode::OK, "application/json", body),
        Err(e) => error(e.status(), e),
    }
}

/// `{"error": msg}` ([`view::ErrorView`]) with `status`.
fn error(status: StatusCode, msg: impl std::fmt::Display) -> Reply {
    let body = view::ErrorView {
        error: msg.to_string(),
    };
    match api::json_text(&body) {
        Ok(text) => reply(status, "application/json", text),
        // A struct of one string always serialises; say so in plain text if not.
        Err(e) => reply(
            status,
            "text/plain; charset=utf-8",
            format!("{msg} ({e})\n"),
        ),
    }
}

/// The endpoints, with the methods each accepts.
#[derive(Debug)]
enum Route<'a> {
    Page,
    Metrics,
    Healthz,
    Services,
    Connections,
    Sources,
    Table(&'a str),
    Backend(&'a str, &'a str, Action),
    Weight(&'a str, &'a str),
    ShutdownSessions(&'a str, &'a str),
    Kill,
    Reload,
}

impl Route<'_> {
    fn parse(path: &str) -> Option<Route<'_>> {
        let segs: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
        Some(match segs.as_slice() {
            [] => Route::Page,
            ["metrics"] => Route::Metrics,
            ["healthz"] => Route::Healthz,
            ["api", "services"] => Route::Services,
            ["api", "connections"] => Route::Connections,
            ["api", "connections", "kill"] => Route::Kill,
            ["api", "sources"] => Route::Sources,
            ["api", "tables", s] if !s.is_empty() => Route::Table(s),
            ["api", "backends", s, b, "weight"] if !s.is_empty() && !b.is_empty() => {
                Route::Weight(s, b)
            }
            ["api", "backends", s, b, "shutdown-sessions"] if !s.is_empty() && !b.is_empty() => {
                Route::ShutdownSessions(s, b)
            }
            ["api", "backends", s, b, a] if !s.is_empty() && !b.is_empty() => {
                Route::Backend(s, b, Action::parse(a)?)
            }
            ["api", "reload"] => Route::Reload,
            _ => return None,
        })
    }

    fn allow(&self) -> &'static [Method] {
        match self {
            Route::Table(_) => &[Method::GET, Method::DELETE],
            Route::Backend(..)
            | Route::Weight(..)
            | Route::ShutdownSessions(..)
            | Route::Kill
            | Route::Reload => &[Method::POST],
            _ => &[Method::GET],
        }
    }
}

async fn handle(ctx: &Ctx, peer: Peer, req: Request<Incoming>, slot: Slot) -> Reply {
    let (parts, body) = req.into_parts();
    // Never read: hyper drains what already arrived with the headers, else closes.
    drop(body);
    let host = match origin::request_host(&parts) {
        Ok(h) => h,
        Err(r) => {
            let bad = closing(error(StatusCode::BAD_REQUEST, r.message()));
            return refuse(ctx, peer, &parts, r.reason(), bad);
        }
    };
    let route = Route::parse(parts.uri.path());
    if slot == Slot::Reserved && !matches!(route, Some(Route::Metrics | Route::Healthz)) {
        return closing(error(
            StatusCode::SERVICE_UNAVAILABLE,
            "admin endpoint busy: every connection slot is taken; only /healthz and /metrics are answered",
        ));
    }
    let allowed_hosts = ctx
        .server
        .config()
        .admin
        .as_ref()
        .map(|a| a.allowed_hosts.clone())
        .unwrap_or_default();
    // /metrics and /healthz are what Prometheus and health probers fetch, often by
    // the balancer's DNS name; they hold no power, so a drop-in keeps answering
    // them whatever the Host. Everything else (the page, /api, every write) is
    // guarded against DNS rebinding.
    let monitoring =
        matches!(route, Some(Route::Metrics | Route::Healthz)) && parts.method == Method::GET;
    if !monitoring {
        if let Err(r) = origin::check_host(host.as_deref(), peer.local, &allowed_hosts) {
            return refuse(ctx, peer, &parts, r.reason(), forbidden(r.message()));
        }
    }
    let Some(route) = route else {
        return error(
            StatusCode::NOT_FOUND,
            format!("no such endpoint: {}", parts.uri.path()),
        );
    };
    let allowed = route.allow();
    if !allowed.contains(&parts.method) {
        let list: Vec<&str> = allowed.iter().map(Method::as_str).collect();
        let mut r = error(
            StatusCode::METHOD_NOT_ALLOWED,
            format!(
                "method {} not allowed here (allowed: {})",
                parts.method,
                list.join(", ")
            ),
        );
        if let Ok(v) = HeaderValue::from_str(&list.join(", ")) {
            r.headers_mut().insert(ALLOW, v);
        }
        return r;
    }
    if parts.method != Method::GET {
        if let Err(r) = origin::check_write(&parts.headers, host.as_deref()) {
            return refuse(ctx, peer, &parts, r.reason(), forbidden(r.message()));
        }
        if let Err(d) = auth::check_write(ctx.token.as_ref(), &parts.headers, peer.addr.ip()) {
            return refuse(ctx, peer, &parts, d.reason(), denied_reply(d));
        }
    }
    // Last of the refusals, none of which waits: a guard's 403 says more.
    if declares_body(&parts.headers) {
        return refuse(ctx, peer, &parts, BODY_REFUSED, body_refused());
    }
    dispatch(ctx, route, &parts.method, parts.uri.query()).await
}

/// Count a refused request, warn about it (throttled: a client can send thousands)
/// and answer `reply`.
fn refuse(
    ctx: &Ctx,
    peer: Peer,
    parts: &hyper::http::request::Parts,
    reason: &'static str,
    reply: Reply,
) -> Reply {
    ctx.server.metrics().admin.refused(reason);
    if let Some(suppressed) = ctx.request_warn.note() {
        let header = |name| {
            parts
                .headers
                .get(name)
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        };
        tracing::warn!(
            peer = %peer.addr,
            method = %parts.method,
            path = parts.uri.path(),
            host = ?header(hyper::header::HOST),
            origin = ?header(hyper::header::ORIGIN),
            reason,
            suppressed,
            "admin: request refused"
        );
    }
    reply
}

fn forbidden(message: &str) -> Reply {
    error(StatusCode::FORBIDDEN, message)
}

/// The `reason` a request declaring a body is counted under.
const BODY_REFUSED: &str = "body";

/// Does the request declare a body (`Content-Length` above 0, or any
/// `Transfer-Encoding`)? hyper has refused a malformed length already.
fn declares_body(headers: &hyper::HeaderMap) -> bool {
    headers.contains_key(TRANSFER_ENCODING)
        || headers
            .get(CONTENT_LENGTH)
            .is_some_and(|v| v.to_str().ok().and_then(|n| n.trim().parse::<u64>().ok()) != Some(0))
}

/// 413 for a declared body, at once and without reading it (no endpoint takes one:
/// waiting for a body that never comes held the connection's slot as busy, and 74
/// such connections kept `/healthz` and `/api` from answering); the connection
/// closes, since the body's bytes would follow.
fn body_refused() -> Reply {
    closing(error(
        StatusCode::PAYLOAD_TOO_LARGE,
        "request body refused: no endpoint takes one (not read)",
    ))
}

/// `r` with `Connection: close`: hyper closes the connection once it is sent.
fn closing(mut r: Reply) -> Reply {
    r.headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
    r
}

fn denied_reply(d: auth::Denied) -> Reply {
    match d {
        auth::Denied::BadToken => {
            let mut r = error(
                StatusCode::UNAUTHORIZED,
                "write operations need `Authorization: Bearer <token>` with the admin token",
            );
            r.headers_mut().insert(
                hyper::header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer"),
            );
            r
        }
        auth::Denied::NotLoopback => error(
            StatusCode::FORBIDDEN,
            "write operations are accepted from loopback only unless admin.token_file is set",
        ),
    }
}

async fn dispatch(ctx: &Ctx, route: Route<'_>, method: &Method, query: Option<&str>) -> Reply {
    let server = &ctx.server;
    match route {
        Route::Page => page::response(server, query),
        Route::Metrics => reply(
            StatusCode::OK,
            METRICS_CONTENT_TYPE,
            server.metrics().encode(),
        ),
        Route::Healthz => match api::healthz(server) {
            Ok(()) => reply(StatusCode::OK, "text/plain; charset=utf-8", "ok\n"),
            Err(e) => reply(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain; charset=utf-8",
                e + "\n",
            ),
        },
        Route::Services => view_reply(Ok(api::services(server))),
        Route::Connections => match query::connections_query(query) {
            Ok(q) => json_text(api::connections_dump(server.clone(), q).await),
            Err(e) => error(e.status(), e),
        },
        Route::Sources => match query::sources_query(query) {
            Ok(limit) => json_text(api::sources_dump(server.clone(), limit).await),
            Err(e) => error(e.status(), e),
        },
        Route::Table(s) if method == Method::DELETE => match query::delete_query(query) {
            Ok(None) => view_reply(writes::flush(server, s)),
            Ok(Some(pick)) => view_reply(writes::delete(server, s, pick)),
            Err(e) => error(e.status(), e),
        },
        Route::Table(s) => match query::table_query(query) {
            Ok(q) => json_text(api::table_dump(server.clone(), s.to_string(), q).await),
            Err(e) => error(e.status(), e),
        },
        Route::Backend(s, b, Action::Reset) => match query::force_query(query) {
            Ok(force) => view_reply(writes::reset_backend(server, s, b, force).await),
            Err(e) => error(e.status(), e),
        },
        Route::Backend(s, b, a) => match query::force_query(query) {
            Ok(force) => view_reply(writes::set_backend(server, s, b, a, force).await),
            Err(e) => error(e.status(), e),
        },
        Route::Weight(s, b) => match query::weight_query(query) {
            Ok((ask, force)) => view_reply(writes::set_weight(server, s, b, ask, force).await),
            Err(e) => error(e.status(), e),
        },
        Route::ShutdownSessions(s, b) => view_reply(
            query::none_query(query).and_then(|()| writes::shutdown_sessions(server, s, b)),
        ),
        Route::Kill => view_reply(
            query::kill_query(query).and_then(|pick| writes::kill_connections(server, pick)),
        ),
        Route::Reload => match query::force_query(query) {
            Ok(force) => view_reply(writes::reload(server, force).await),
            Err(e) => error(e.status(), e),
        },
    }
}
