//! Backend health: active checks (tcp, tls-hello, https), passive failure counting
//! from the data path, and the rise/fall streaks that flip a backend up or down.
//!
//! One task per backend runs its check every `interval` (±10% jitter, so checks of
//! many backends spread out), each bounded by `timeout`. Results, and connect
//! failures seen by client connections, feed one streak per backend: `fall`
//! consecutive failures take an up backend down, `rise` consecutive passing checks
//! bring a down one back. A flip is logged and published once, when it happens.
//!
//! Backends start up (as HAProxy's servers do): a restart of crossbar never refuses
//! traffic while it waits for first checks; a dead backend is found by the first
//! connects (which retry elsewhere) and by `fall` checks.
//!
//! `failback: manual`: a primary that recovers while another backend is serving
//! becomes `standby` (healthy, no traffic) until an operator enables it, so a
//! Puppet CA keeps one active signer.
use std::io;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    ClientConfig, ClientConnection, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::balance::Backend;
use crate::config::{BackendAddress, CheckKind, Failback, HttpsCheck};
use crate::conn::connect_own;
use crate::server::Service;

/// Checks run every `interval` ± this fraction, so many backends don't probe in step.
const JITTER: f64 = 0.1;
/// Largest status body the https check reads; `/status/v1/simple` answers 7 bytes.
const MAX_STATUS_BODY: usize = 64 * 1024;
/// Bytes of a non-TLS answer quoted in the failure reason (enough for "SSH-2.0-").
const QUOTE_BYTES: usize = 16;
/// Characters of an unexpected status body quoted in the failure reason.
const QUOTE_BODY_CHARS: usize = 64;
/// Read size while waiting for the server's first TLS record header.
const ANSWER_READ: usize = 512;
/// TLS record content types and handshake message type we look for.
const CONTENT_ALERT: u8 = 0x15;
const CONTENT_HANDSHAKE: u8 = 0x16;
const HANDSHAKE_SERVER_HELLO: u8 = 0x02;

/// Consecutive check results of one backend (the rise/fall streaks).
///
/// Lock-free: the data path reports connect outcomes concurrently with the active
/// check task. Only the flip itself must happen once, and `Backend::set_healthy`
/// (an atomic swap) guarantees that.
#[derive(Debug, Default)]
pub struct HealthStreak {
    passes: AtomicU32,
    failures: AtomicU32,
}

impl HealthStreak {
    /// Count one result and return the new streak length of that kind.
    fn record(&self, ok: bool) -> u32 {
        let (grow, reset) = if ok {
            (&self.passes, &self.failures)
        } else {
            (&self.failures, &self.passes)
        };
        reset.store(0, Ordering::Release);
        let prev = grow
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                Some(n.saturating_add(1))
            })
            .unwrap_or(u32::MAX);
        prev.saturating_add(1)
    }

    /// Consecutive failures so far.
    pub fn failures(&self) -> u32 {
        self.failures.load(Ordering::Acquire)
    }

    /// Consecutive passes so far.
    pub fn passes(&self) -> u32 {
        self.passes.load(Ordering::Acquire)
    }
}

/// Why a check failed; the text is the `reason` of the log line of a flip.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// The TCP connect failed (refused, unreachable, name not resolved, timed out).
    #[error("connect: {0}")]
    Connect(io::Error),
    /// The whole check took longer than `timeout`.
    #[error("no result within {0:?}")]
    Timeout(Duration),
    /// The peer answered, but not with TLS.
    #[error("not TLS: answer starts with {0:?}")]
    NotTls(String),
    /// The peer closed the connection before answering.
    #[error("closed without answering")]
    Closed,
    /// Reading or writing the socket failed.
    #[error("i/o: {0}")]
    Io(io::Error),
    /// The TLS handshake failed (certificate, name, protocol).
    #[error("TLS: {0}")]
    Tls(String),
    /// The HTTP exchange failed.
    #[error("HTTP: {0}")]
    Http(String),
    /// The status was not the expected one.
    #[error("status {got}, expected {want}")]
    Status {
        /// What the server answered.
        got: u16,
        /// `expect_status`.
        want: u16,
    },
    /// The body lacks `expect_body`.
    #[error("body {got:?} does not contain {want:?}")]
    Body {
        /// The start of what the server answered.
        got: String,
        /// `expect_body`.
        want: String,
    },
    /// A file the check needs (CA, client certificate or key) can't be used.
    #[error("check setup: {0}")]
    Setup(String),
}

/// What a check connects to and says.
#[derive(Debug, Clone)]
pub struct Target {
    /// The backend address (host names resolved at every check).
    pub address: BackendAddress,
    /// The TLS server name: sent as SNI when it is a DNS name, and verified.
    pub server_name: ServerName<'static>,
    /// The backend expects a PROXY header first: checks send a LOCAL one.
    pub proxy_protocol: Option<crate::config::ProxyProtocol>,
}

/// Run one check against `target` within `timeout`. `CheckKind::None` always passes.
pub async fn probe(
    check: &CheckKind,
    target: &Target,
    timeout: Duration,
) -> Result<(), CheckError> {
    let run = async {
        match check {
            CheckKind::None => Ok(()),
            CheckKind::Tcp => connect(target, timeout).await.map(drop),
            CheckKind::TlsHello => tls_hello(target, timeout).await,
            CheckKind::Https(h) => https(h, target, timeout).await,
        }
    };
    tokio::time::timeout(timeout, run)
        .await
        .unwrap_or(Err(CheckError::Timeout(timeout)))
}

async fn connect(target: &Target, timeout: Duration) -> Result<TcpStream, CheckError> {
    connect_own(&target.address, timeout, target.proxy_protocol)
        .await
        .map_err(CheckError::Connect)
}

/// What the first bytes of a server's answer to a ClientHello show.
#[derive(Debug, PartialEq, Eq)]
pub enum Answer {
    /// Not enough bytes yet.
    NeedMore,
    /// A TLS server: a handshake record starting with a ServerHello (or a
    /// HelloRetryRequest, which has the same type), or an alert record.
    Tls,
    /// Something else.
    NotTls,
}

/// Classify a server's answer to our ClientHello by its first record.
pub fn classify_answer(b: &[u8]) -> Answer {
    let Some(&content) = b.first() else {
        return Answer::NeedMore;
    };
    if content != CONTENT_HANDSHAKE && content != CONTENT_ALERT {
        return Answer::NotTls;
    }
    match b.get(1) {
        None => return Answer::NeedMore,
        Some(&0x03) => {}
        Some(_) => return Answer::NotTls,
    }
    if content == CONTENT_ALERT {
        return if b.len() >= 5 {
            Answer::Tls
        } else {
            Answer::NeedMore
        };
    }
    match b.get(5) {
        None => Answer::NeedMore,
        Some(&HANDSHAKE_SERVER_HELLO) => Answer::Tls,
        Some(_) => Answer::NotTls,
    }
}

/// Send the ClientHello rustls makes (TLS 1.3 and 1.2, modern ciphers, SNI), and
/// accept a ServerHello or an alert: either proves a TLS server is listening.
/// Java 17 rejects the SSLv3 hello of HAProxy's `ssl-hello-chk`; this one it answers.
async fn tls_hello(target: &Target, timeout: Duration) -> Result<(), CheckError> {
    let mut conn = ClientConnection::new(accept_any_config()?, target.server_name.clone())
        .map_err(|e| CheckError::Setup(e.to_string()))?;
    let mut hello = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut hello).map_err(CheckError::Io)?;
    }
    let mut tcp = connect(target, timeout).await?;
    tcp.write_all(&hello).await.map_err(CheckError::Io)?;
    let mut answer = Vec::new();
    let mut chunk = [0u8; ANSWER_READ];
    loop {
        match classify_answer(&answer) {
            Answer::Tls => return Ok(()),
            Answer::NotTls => return Err(CheckError::NotTls(quote(&answer))),
            Answer::NeedMore => {}
        }
        let n = tcp.read(&mut chunk).await.map_err(CheckError::Io)?;
        if n == 0 {
            return Err(CheckError::Closed);
        }
        answer.extend_from_slice(&chunk[..n]);
    }
}

/// The first bytes of a non-TLS answer, readable in a log line.
fn quote(b: &[u8]) -> String {
    String::from_utf8_lossy(&b[..b.len().min(QUOTE_BYTES)]).into_owned()
}

/// A full TLS handshake, then `GET path` over HTTP/1.1 (hyper), checking the
/// status and the body. This is Puppet's documented load-balancer check:
/// `/status/v1/simple` answers `running` without a client certificate.
async fn https(h: &HttpsCheck, target: &Target, timeout: Duration) -> Result<(), CheckError> {
    let config = https_config(h)?;
    let tcp = connect(target, timeout).await?;
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(target.server_name.clone(), tcp)
        .await
        .map_err(|e| CheckError::Tls(e.to_string()))?;
    let host = match &target.server_name {
        ServerName::DnsName(n) => n.as_ref().to_string(),
        _ => target.address.to_string(),
    };
    let (status, body) = http_get(TokioIo::new(tls), &h.path, &host).await?;
    expect(h, status, &body)
}

/// One HTTP/1.1 GET on an established stream: the status and (capped) body.
async fn http_get<S>(io: TokioIo<S>, path: &str, host: &str) -> Result<(u16, Bytes), CheckError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let http = |e: hyper::Error| CheckError::Http(e.to_string());
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(http)?;
    let req = hyper::Request::get(path)
        .header(hyper::header::HOST, host)
        .header(hyper::header::USER_AGENT, "crossbar-health-check")
        .header(hyper::header::CONNECTION, "close")
        .body(Empty::<Bytes>::new())
        .map_err(|e| CheckError::Http(e.to_string()))?;
    let exchange = async {
        let resp = sender.send_request(req).await.map_err(http)?;
        let status = resp.status().as_u16();
        let body = Limited::new(resp.into_body(), MAX_STATUS_BODY)
            .collect()
            .await
            .map_err(|e| CheckError::Http(format!("reading body: {e}")))?
            .to_bytes();
        Ok::<_, CheckError>((status, body))
    };
    let mut exchange = std::pin::pin!(exchange);
    let mut conn = std::pin::pin!(conn);
    // The connection future drives the exchange; it may end (Connection: close)
    // just before the exchange has taken the last bytes it delivered.
    tokio::select! {
        biased;
        r = &mut exchange => r,
        r = &mut conn => {
            r.map_err(http)?;
            exchange.await
        }
    }
}

/// Compare an answer with `expect_status` and `expect_body`.
fn expect(h: &HttpsCheck, status: u16, body: &[u8]) -> Result<(), CheckError> {
    if status != h.expect_status {
        return Err(CheckError::Status {
            got: status,
            want: h.expect_status,
        });
    }
    let Some(want) = &h.expect_body else {
        return Ok(());
    };
    let text = String::from_utf8_lossy(body);
    if text.contains(want.as_str()) {
        Ok(())
    } else {
        Err(CheckError::Body {
            got: text.chars().take(QUOTE_BODY_CHARS).collect(),
            want: want.clone(),
        })
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn versions() -> &'static [&'static rustls::SupportedProtocolVersion] {
    static BOTH: [&rustls::SupportedProtocolVersion; 2] =
        [&rustls::version::TLS13, &rustls::version::TLS12];
    &BOTH
}

/// The tls-hello check's client: any certificate passes (the handshake is never
/// finished; we only need rustls to write a modern ClientHello).
fn accept_any_config() -> Result<Arc<ClientConfig>, CheckError> {
    let p = provider();
    let cfg = ClientConfig::builder_with_provider(p.clone())
        .with_protocol_versions(versions())
        .map_err(|e| CheckError::Setup(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAnyCert(p)))
        .with_no_client_auth();
    Ok(Arc::new(cfg))
}

/// The https check's client, built at every check so renewed certificate files are
/// picked up: verifies against `ca_file` when set (else accepts any certificate),
/// presents `client_cert`/`client_key` when set.
fn https_config(h: &HttpsCheck) -> Result<Arc<ClientConfig>, CheckError> {
    let p = provider();
    let builder = ClientConfig::builder_with_provider(p.clone())
        .with_protocol_versions(versions())
        .map_err(|e| CheckError::Setup(e.to_string()))?;
    let builder = match &h.ca_file {
        Some(path) => builder.with_root_certificates(roots(path)?),
        None => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAnyCert(p))),
    };
    let mut cfg = match &h.client_cert {
        Some((cert, key)) => {
            let chain = CertificateDer::pem_file_iter(cert)
                .and_then(|it| it.collect::<Result<Vec<_>, _>>())
                .map_err(|e| setup_err("client_cert", cert, e))?;
            let key =
                PrivateKeyDer::from_pem_file(key).map_err(|e| setup_err("client_key", key, e))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| CheckError::Setup(format!("client certificate: {e}")))?
        }
        None => builder.with_no_client_auth(),
    };
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

fn roots(path: &std::path::Path) -> Result<RootCertStore, CheckError> {
    let mut roots = RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| setup_err("ca_file", path, e))?;
    let (added, _ignored) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(CheckError::Setup(format!(
            "ca_file {}: no usable certificate",
            path.display()
        )));
    }
    Ok(roots)
}

fn setup_err(key: &str, path: &std::path::Path, e: impl std::fmt::Display) -> CheckError {
    CheckError::Setup(format!("{key} {}: {e}", path.display()))
}

/// Accepts any server certificate, but still checks handshake signatures against the
/// certificate presented (so the peer holds its key).
/// Shared with the ticket-key probe ([`crate::probe`]), which only collects tickets.
#[derive(Debug)]
pub(crate) struct AcceptAnyCert(pub(crate) Arc<CryptoProvider>);

impl ServerCertVerifier for AcceptAnyCert {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The server name a backend's checks use: the https check's `server_name`, else
/// the service's first exact `server_names` entry, else the backend host when it is
/// a name, else its IP (then no SNI is sent).
pub fn server_name_for(svc: &Service, b: &Backend) -> ServerName<'static> {
    let explicit = match &b.config.health.check {
        CheckKind::Https(h) => h.server_name.clone(),
        _ => None,
    };
    let from_service = svc
        .config
        .server_names
        .iter()
        .find(|n| !n.starts_with('*'))
        .cloned();
    let host = &b.config.address.host;
    for name in [explicit, from_service, Some(host.clone())]
        .into_iter()
        .flatten()
    {
        if name.parse::<IpAddr>().is_ok() {
            continue;
        }
        if let Ok(sn) = ServerName::try_from(name) {
            return sn;
        }
    }
    match host.parse::<IpAddr>() {
        Ok(ip) => ServerName::IpAddress(ip.into()),
        // A host that is neither a valid DNS name nor an IP: validation rejects it.
        Err(_) => ServerName::IpAddress(IpAddr::from([0, 0, 0, 0]).into()),
    }
}

/// What a result did to a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flip {
    /// `fall` consecutive failures: the backend is now down.
    Down,
    /// `rise` consecutive passes: the backend is up and takes traffic.
    Up,
    /// `rise` consecutive passes, but held back for manual failback.
    Standby,
}

/// Count one result for `b` and flip its health if a streak is complete. Returns
/// the flip, if this result caused one (exactly one caller sees each flip).
pub fn observe(svc: &Service, b: &Backend, ok: bool) -> Option<Flip> {
    let h = &b.config.health;
    let streak = b.health.record(ok);
    if ok {
        if b.is_healthy() || streak < h.rise {
            return None;
        }
        let hold = svc.config.failback == Failback::Manual
            && !b.config.backup
            && svc
                .pool
                .backends
                .iter()
                .any(|o| o.index != b.index && o.is_available());
        // Standby first, so the backend never takes a connection in between.
        if hold {
            b.set_standby(true);
        }
        b.set_healthy(true).then_some(if hold || b.is_standby() {
            Flip::Standby
        } else {
            Flip::Up
        })
    } else {
        if !b.is_healthy() || streak < h.fall {
            return None;
        }
        b.set_healthy(false).then_some(Flip::Down)
    }
}

/// `observe`, then log a flip once, with its reason.
fn observe_and_log(svc: &Service, b: &Backend, ok: bool, reason: &dyn std::fmt::Display) {
    let (service, backend) = (svc.name(), &*b.name);
    match observe(svc, b, ok) {
        None => {}
        Some(Flip::Down) => tracing::warn!(service, backend, reason = %reason, "backend down"),
        Some(Flip::Up) => tracing::info!(service, backend, reason = %reason, "backend up"),
        Some(Flip::Standby) => tracing::info!(
            service,
            backend,
            reason = %reason,
            "backend recovered; standby until an operator enables it (failback: manual)"
        ),
    }
}

/// A client connection could not connect to `b`: counts toward `fall` like a
/// failed check.
pub fn passive_failure(svc: &Service, b: &Backend, err: &io::Error) {
    observe_and_log(svc, b, false, &format_args!("connect failed: {err}"));
}

/// A client connection connected to `b`. With `check: tcp` or `none` a connect
/// proves as much as the check, so it ends a failure streak. With `tls-hello` or
/// `https` it proves less (a hung puppetserver still accepts TCP), so only a
/// passing check ends it; otherwise traffic would keep such a backend up forever.
pub fn passive_success(b: &Backend) {
    if matches!(b.config.health.check, CheckKind::Tcp | CheckKind::None) && b.health.failures() != 0
    {
        b.health.failures.store(0, Ordering::Release);
    }
}

/// `d` ± 10%.
fn jittered(d: Duration) -> Duration {
    d.mul_f64(1.0 - JITTER + 2.0 * JITTER * fastrand::f64())
}

/// Start one check task per backend of `svc`; they end when `svc.tasks` is cancelled.
pub fn spawn_checks(svc: &Arc<Service>) {
    for b in &svc.pool.backends {
        tokio::spawn(check_loop(svc.clone(), b.clone(), svc.tasks.clone()));
    }
}

async fn check_loop(svc: Arc<Service>, b: Arc<Backend>, stop: CancellationToken) {
    let h = b.config.health.clone();
    let target = Target {
        address: b.config.address.clone(),
        server_name: server_name_for(&svc, &b),
        proxy_protocol: b.config.proxy_protocol,
    };
    let kind = check_label(&h.check);
    loop {
        let started = Instant::now();
        if h.check == CheckKind::None {
            // No probe: a backend taken down by failed connects is re-admitted after
            // `rise` intervals (it gets traffic again, and fails again if still dead).
            if !b.is_healthy() {
                observe_and_log(
                    &svc,
                    &b,
                    true,
                    &"no active check: re-admitted after rise x interval",
                );
            }
        } else {
            let result = tokio::select! {
                () = stop.cancelled() => return,
                r = probe(&h.check, &target, h.timeout) => r,
            };
            match result {
                Ok(()) => {
                    b.metrics.check_ok.inc();
                    b.metrics.live.note_check(None);
                    observe_and_log(&svc, &b, true, &format_args!("{kind} check passed"));
                }
                Err(e) => {
                    b.metrics.check_fail.inc();
                    b.metrics.live.note_check(Some(&e));
                    tracing::debug!(service = %svc.name(), backend = %b.name, "{kind} check failed: {e}");
                    observe_and_log(&svc, &b, false, &format_args!("{kind} check: {e}"));
                }
            }
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep_until(started + jittered(h.interval)) => {}
        }
    }
}

/// The config spelling of a check kind.
pub fn check_label(c: &CheckKind) -> &'static str {
    match c {
        CheckKind::None => "none",
        CheckKind::Tcp => "tcp",
        CheckKind::TlsHello => "tls-hello",
        CheckKind::Https(_) => "https",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::balance::{AdminState, Pool, PoolParams};
    use crate::metrics::Metrics;

    /// A service `s` with primary `p` and backup `b` (no tasks started).
    fn service(check: &str, failback: &str) -> Service {
        let yaml = format!(
            "admin: {{ enabled: false }}\nservices:\n  s:\n    listen: [\"127.0.0.1:0\"]\n    \
             balance: first\n    failback: {failback}\n    \
             health: {{ check: {check}, rise: 2, fall: 3 }}\n    backends:\n      \
             - {{ name: p, address: \"127.0.0.1:1\" }}\n      \
             - {{ name: b, address: \"127.0.0.1:2\", backup: true }}\n"
        );
        let config = crate::config::Config::from_str_at(&yaml, std::path::Path::new("t.yaml"))
            .unwrap_or_else(|e| panic!("{e}"));
        let sc = config.services[0].clone();
        let m = Metrics::new();
        let pool = Pool::new(
            &sc.backends,
            PoolParams {
                algo: sc.balance,
                slow_start: sc.slow_start,
                queue_size: 1,
                queue_timeout: Duration::from_millis(10),
            },
            |b| m.backend("s", &b.name),
            |_| None,
        );
        Service {
            metrics: m.service("s"),
            config: sc,
            pool,
            table: None,
            tasks: CancellationToken::new(),
        }
    }

    #[test]
    fn flips_once_after_fall_and_rise() {
        let svc = service("tcp", "auto");
        let p = svc.pool.get("p").unwrap().clone();
        assert_eq!(observe(&svc, &p, false), None);
        assert_eq!(observe(&svc, &p, false), None);
        assert_eq!(observe(&svc, &p, false), Some(Flip::Down));
        assert_eq!(observe(&svc, &p, false), None, "a flip is reported once");
        assert_eq!(p.state_name(), "down");
        assert_eq!(observe(&svc, &p, true), None);
        assert_eq!(observe(&svc, &p, true), Some(Flip::Up));
        assert_eq!(observe(&svc, &p, true), None);
        assert_eq!(p.state_name(), "up");
        // A pass in the middle breaks a failure streak.
        observe(&svc, &p, false);
        observe(&svc, &p, false);
        observe(&svc, &p, true);
        assert_eq!(observe(&svc, &p, false), None);
        assert!(p.is_healthy());
    }

    #[test]
    fn manual_failback_holds_a_recovered_primary_while_the_backup_serves() {
        let svc = service("tls-hello", "manual");
        let (p, b) = (
            svc.pool.get("p").unwrap().clone(),
            svc.pool.get("b").unwrap().clone(),
        );
        for _ in 0..3 {
            observe(&svc, &p, false);
        }
        assert!(b.is_available());
        observe(&svc, &p, true);
        assert_eq!(observe(&svc, &p, true), Some(Flip::Standby));
        assert_eq!(p.state_name(), "standby");
        assert!(!p.is_available());
        // Failing and recovering again keeps it held.
        for _ in 0..3 {
            observe(&svc, &p, false);
        }
        observe(&svc, &p, true);
        assert_eq!(observe(&svc, &p, true), Some(Flip::Standby));
        // The operator's enable releases it.
        p.set_admin_state(AdminState::Enabled);
        assert_eq!(p.state_name(), "up");
        // A backup is never held.
        for _ in 0..3 {
            observe(&svc, &b, false);
        }
        observe(&svc, &b, true);
        assert_eq!(observe(&svc, &b, true), Some(Flip::Up));
    }

    #[test]
    fn a_connect_ends_a_failure_streak_only_when_it_proves_as_much_as_the_check() {
        let err = io::Error::from(io::ErrorKind::ConnectionRefused);
        for (check, resets) in [("tcp", true), ("none", true), ("tls-hello", false)] {
            let svc = service(check, "auto");
            let p = svc.pool.get("p").unwrap().clone();
            passive_failure(&svc, &p, &err);
            passive_failure(&svc, &p, &err);
            passive_success(&p);
            assert_eq!(p.health.failures() == 0, resets, "{check}");
            passive_failure(&svc, &p, &err);
            assert_eq!(p.is_healthy(), resets, "{check}");
        }
    }

    #[test]
    fn classify_server_hello_alert_and_garbage() {
        // TLS 1.2 record header + ServerHello type.
        assert_eq!(
            classify_answer(&[0x16, 0x03, 0x03, 0x00, 0x5a, 0x02]),
            Answer::Tls
        );
        assert_eq!(
            classify_answer(&[0x15, 0x03, 0x03, 0x00, 0x02]),
            Answer::Tls
        );
        // A handshake record whose first message is not a ServerHello.
        assert_eq!(
            classify_answer(&[0x16, 0x03, 0x03, 0x00, 0x5a, 0x0b]),
            Answer::NotTls
        );
        assert_eq!(classify_answer(b"SSH-2.0-x\r\n"), Answer::NotTls);
        assert_eq!(classify_answer(b"HTTP/1.1 400"), Answer::NotTls);
        assert_eq!(classify_answer(&[0x16, 0x01]), Answer::NotTls);
        // Every prefix of a valid answer asks for more.
        let full = [0x16, 0x03, 0x03, 0x00, 0x5a, 0x02];
        for n in 0..full.len() {
            assert_eq!(classify_answer(&full[..n]), Answer::NeedMore, "prefix {n}");
        }
        assert_eq!(classify_answer(&[0x15, 0x03, 0x03]), Answer::NeedMore);
    }

    #[test]
    fn streaks_reset_each_other_and_saturate() {
        let s = HealthStreak::default();
        assert_eq!(s.record(false), 1);
        assert_eq!(s.record(false), 2);
        assert_eq!(s.record(true), 1);
        assert_eq!(s.failures(), 0);
        s.passes.store(u32::MAX, Ordering::Release);
        assert_eq!(s.record(true), u32::MAX);
    }

    #[test]
    fn jitter_stays_within_ten_percent() {
        let d = Duration::from_millis(1000);
        for _ in 0..1000 {
            let j = jittered(d);
            assert!(
                j >= Duration::from_millis(900) && j <= Duration::from_millis(1100),
                "{j:?}"
            );
        }
    }

    #[test]
    fn rustls_writes_a_modern_hello_with_sni() {
        let name = ServerName::try_from("puppet.example.com").unwrap();
        let mut conn = ClientConnection::new(accept_any_config().unwrap(), name).unwrap();
        let mut hello = Vec::new();
        while conn.wants_write() {
            conn.write_tls(&mut hello).unwrap();
        }
        match crate::hello::parse_client_hello(&hello, 16 * 1024) {
            crate::hello::HelloParse::Found(h) => {
                assert_eq!(h.sni.as_deref(), Some("puppet.example.com"));
                assert!(h.supported_versions.contains(&crate::hello::version::TLS13));
                assert!(h.supported_versions.contains(&crate::hello::version::TLS12));
            }
            _ => panic!("not a ClientHello"),
        }
    }
}
