//! One backend as `crossbar doctor` sees it: TLS handshakes per version, the
//! certificate chain, session-ID resumption, the ticket-key probe, the status page
//! and the Puppet CA certificate it serves.
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use rustls::client::{Resumption, Tls12Resumption};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::{ClientConfig, HandshakeKind, SupportedProtocolVersion};
use serde::Serialize;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use crate::config::{BackendConfig, CheckKind, HttpsCheck, ServiceConfig};
use crate::dial::tls::{server_name_for, AcceptAnyCert, NameSource};
use crate::health::explain::name_text;
use crate::health::{self, CertInfo, Target};

/// Time one TLS handshake (connect included) may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Time the status page or CA certificate request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Key-name length probed when the service has no stick table (crossbar's default).
const DEFAULT_TICKET_PREFIX: usize = 16;
/// Where Puppet Server serves its CA certificate (no client certificate needed).
pub const CA_CERT_PATH: &str = "/puppet-ca/v1/certificate/ca";
/// The status page asked with `--status` when the backend has no `https` check.
const STATUS_PATH: &str = "/status/v1/simple";

/// What one backend showed.
#[derive(Debug, Clone, Serialize)]
pub struct Inspection {
    /// The backend address as configured.
    pub address: String,
    /// The server name the health checks send (SNI, when it is a name) and verify;
    /// the doctor's own handshakes send it too.
    pub server_name: String,
    /// Where that name comes from.
    pub server_name_source: NameSource,
    /// The backend's own health check, as `crossbar run` runs it.
    pub check: CheckOutcome,
    /// Why nothing could be checked (connect failed), if so.
    pub unreachable: Option<String>,
    /// TLS versions the backend completed a handshake with (`1.3`, `1.2`).
    pub tls_versions: Vec<String>,
    /// Why a full handshake failed with every version, if so.
    pub tls_error: Option<String>,
    /// The certificate chain it presented, leaf first.
    pub chain: Vec<CertInfo>,
    /// TLS 1.2: a second connection resumed the first one's session ID
    /// (`None`: TLS 1.2 not offered).
    pub session_id_resumption: Option<bool>,
    /// TLS 1.3 ticket-key probe.
    pub ticket_key: TicketKey,
    /// The status page's answer, when asked.
    pub status: Option<StatusAnswer>,
    /// The Puppet CA certificate bundle it serves at [`CA_CERT_PATH`], if any.
    pub ca_certificate: Option<CaCert>,
    /// One load feedback poll, as `crossbar run` polls (with `feedback:`).
    pub feedback: Option<FeedbackProbe>,
}

/// One poll of the service's load feedback.
#[derive(Debug, Clone, Serialize)]
pub struct FeedbackProbe {
    /// `puppet` or `agent`.
    pub kind: String,
    /// It answered with a sample.
    pub ok: bool,
    /// The sample, in words.
    pub answer: Option<String>,
    /// Why it failed.
    pub reason: Option<String>,
    /// The one change that makes it answer.
    pub fix: Option<String>,
    /// The name the poll verifies, when the TLS handshake failed and the backend's
    /// certificate does not cover it: the same cause as a failing health check, with
    /// one fix (re-issue the certificate), not a second setting to change.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub missing_name: Option<String>,
}

/// What the ticket-key probe learned.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum TicketKey {
    /// Tickets share a key name of `length` bytes: crossbar routes them from the
    /// first resumption on.
    Found {
        /// Bytes of the key name (the service's `ticket_prefix`).
        length: usize,
    },
    /// Tickets carry no common key name: placement is confirmed by the server.
    NotFound,
    /// No TLS 1.3, or the probe failed.
    NotProbed {
        /// Why.
        reason: String,
    },
}

/// The result of the backend's configured health check.
#[derive(Debug, Clone, Serialize)]
pub struct CheckOutcome {
    /// The check (`tcp`, `tls-hello`, `https /status/v1/simple`, `none`).
    pub check: String,
    /// It passed.
    pub passed: bool,
    /// Why it failed, in words that name the fix.
    pub reason: Option<String>,
    /// It passed, but took longer than `health.timeout` (milliseconds taken).
    pub slow_ms: Option<u128>,
}

/// The status page's answer.
#[derive(Debug, Clone, Serialize)]
pub struct StatusAnswer {
    /// The path asked.
    pub path: String,
    /// The check passed (`running`).
    pub ok: bool,
    /// `running`, or why the check failed (status, body, TLS...).
    pub answer: String,
}

/// A CA certificate bundle served by a Puppet CA.
#[derive(Debug, Clone, Serialize)]
pub struct CaCert {
    /// The first certificate of the bundle.
    pub first: CertInfo,
    /// Certificates in the bundle.
    pub count: usize,
    /// The bundle (DER), to compare backends.
    #[serde(skip)]
    pub der: Vec<Vec<u8>>,
}

/// Everything the doctor asks one backend; never fails, records what went wrong.
pub async fn inspect(svc: &ServiceConfig, b: &BackendConfig, want_status: bool) -> Inspection {
    let target = health::target(svc, b);
    let (_, source) = server_name_for(svc, b);
    let mut out = Inspection {
        address: b.address.to_string(),
        server_name: name_text(&target.server_name),
        server_name_source: source,
        check: CheckOutcome {
            check: health::check_description(&b.health.check),
            passed: false,
            reason: None,
            slow_ms: None,
        },
        unreachable: None,
        tls_versions: Vec::new(),
        tls_error: None,
        chain: Vec::new(),
        session_id_resumption: None,
        ticket_key: TicketKey::NotProbed {
            reason: "TLS 1.3 not offered".into(),
        },
        status: None,
        ca_certificate: None,
        feedback: None,
    };
    if let Err(e) =
        crate::dial::connect_own(&target.address, svc.timeouts.connect, target.proxy_protocol).await
    {
        out.unreachable = Some(e.to_string());
        out.check.reason = Some(format!("unreachable: {e}"));
        out.check.passed = b.health.check == CheckKind::None;
        return out;
    }
    handshakes(&target, &mut out).await;
    out.check = health_check(svc, b, &out.chain).await;
    if out.tls_versions.iter().any(|v| v == "1.3") {
        out.ticket_key = ticket_key(svc, b, &target).await;
    }
    out.status = match &b.health.check {
        CheckKind::Https(h) => Some(StatusAnswer {
            path: h.path.clone(),
            ok: out.check.passed,
            answer: match &out.check.reason {
                None => h.expect_body.clone().unwrap_or_else(|| "ok".into()),
                Some(r) => r.clone(),
            },
        }),
        _ if want_status => Some(status(&puppet_status_check(), &target).await),
        _ => None,
    };
    if !out.tls_versions.is_empty() {
        out.ca_certificate = ca_certificate(&target).await;
    }
    if let Some(cfg) = &svc.feedback {
        out.feedback = Some(feedback(svc, b, cfg, out.chain.first()).await);
    }
    out
}

/// One poll by the poller `crossbar run` uses, with the same target and files.
/// `leaf` is the certificate the backend presented to the doctor's handshakes.
async fn feedback(
    svc: &ServiceConfig,
    b: &BackendConfig,
    cfg: &crate::config::FeedbackConfig,
    leaf: Option<&CertInfo>,
) -> FeedbackProbe {
    let mut poller = crate::feedback::Poller::new(svc, b, cfg);
    let (ok, answer, reason, fix, missing_name) = match poller.poll().await {
        Ok(r) => (true, Some(r.describe()), None, None, None),
        Err(e) => {
            let missing = match &e {
                crate::feedback::FeedbackError::Tls(_) => feedback_name(svc, b, cfg)
                    .filter(|name| leaf.is_some_and(|leaf| !leaf.covers(name))),
                _ => None,
            };
            (false, None, Some(e.to_string()), Some(e.fix(cfg)), missing)
        }
    };
    FeedbackProbe {
        kind: cfg.kind().to_string(),
        ok,
        answer,
        reason,
        fix,
        missing_name,
    }
}

/// The name a `kind: puppet` poll verifies (as `feedback::Poller` picks it), or
/// `None` for an agent (no TLS).
fn feedback_name(
    svc: &ServiceConfig,
    b: &BackendConfig,
    cfg: &crate::config::FeedbackConfig,
) -> Option<String> {
    let crate::config::FeedbackSource::Puppet(p) = &cfg.source else {
        return None;
    };
    if let Some(name) = &p.server_name {
        return Some(name.clone());
    }
    match server_name_for(svc, b).0 {
        rustls::pki_types::ServerName::DnsName(n) => Some(n.as_ref().to_string()),
        _ => None,
    }
}

/// The backend's configured check, run by the health checker's own code with the
/// same target (address, server name, PROXY header) and the same TLS settings (CA,
/// client certificate), see [`health::predict`]; bounded by [`REQUEST_TIMEOUT`]
/// rather than `health.timeout`, so a slow answer is reported as slow instead of as
/// a failure.
async fn health_check(svc: &ServiceConfig, b: &BackendConfig, chain: &[CertInfo]) -> CheckOutcome {
    let limit = REQUEST_TIMEOUT.max(b.health.timeout);
    let seen = health::predict(svc, b, limit, chain).await;
    CheckOutcome {
        check: health::check_description(&b.health.check),
        passed: seen.passed,
        reason: seen.reason,
        slow_ms: (seen.took > b.health.timeout).then_some(seen.took.as_millis()),
    }
}

/// One handshake per version; the chain from the first that succeeds; TLS 1.2
/// session-ID resumption tried on a second connection.
async fn handshakes(target: &Target, out: &mut Inspection) {
    let mut errors = Vec::new();
    for (label, version) in [
        ("1.3", &rustls::version::TLS13),
        ("1.2", &rustls::version::TLS12),
    ] {
        let cfg = match client(version, label == "1.2") {
            Ok(c) => c,
            Err(e) => {
                errors.push(format!("TLS {label}: {e}"));
                continue;
            }
        };
        match handshake(target, &cfg).await {
            Ok(tls) => {
                out.tls_versions.push(label.to_string());
                if out.chain.is_empty() {
                    out.chain = CertInfo::presented(&tls);
                }
                close(tls).await;
                if label == "1.2" {
                    out.session_id_resumption = Some(resumes(target, &cfg).await);
                }
            }
            Err(e) => errors.push(format!("TLS {label}: {e}")),
        }
    }
    if out.tls_versions.is_empty() {
        out.tls_error = Some(errors.join("; "));
    }
}

/// A client for one version that accepts any certificate (the doctor reports the
/// chain instead of trusting it) but checks handshake signatures, like the health
/// checks' client. TLS 1.2 resumes by session ID only, to test exactly that.
fn client(
    version: &'static SupportedProtocolVersion,
    session_ids: bool,
) -> Result<Arc<ClientConfig>, rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[version])?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAnyCert(provider)))
        .with_no_client_auth();
    if session_ids {
        cfg.resumption =
            Resumption::in_memory_sessions(4).tls12_resumption(Tls12Resumption::SessionIdOnly);
    }
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

async fn handshake(
    target: &Target,
    cfg: &Arc<ClientConfig>,
) -> Result<TlsStream<TcpStream>, String> {
    let run = async {
        let tcp =
            crate::dial::connect_own(&target.address, HANDSHAKE_TIMEOUT, target.proxy_protocol)
                .await
                .map_err(|e| format!("connect: {e}"))?;
        tokio_rustls::TlsConnector::from(cfg.clone())
            .connect(target.server_name.clone(), tcp)
            .await
            .map_err(|e| e.to_string())
    };
    tokio::time::timeout(HANDSHAKE_TIMEOUT, run)
        .await
        .unwrap_or_else(|_| Err(format!("no handshake within {HANDSHAKE_TIMEOUT:?}")))
}

/// Best-effort close_notify, so the backend logs a clean close.
async fn close(mut tls: TlsStream<TcpStream>) {
    // ok: the handshake is what was measured; a failed close changes nothing
    let _ = tokio::time::timeout(REQUEST_TIMEOUT, tls.shutdown()).await;
}

/// A second TLS 1.2 connection with the same client: did it resume by session ID?
async fn resumes(target: &Target, cfg: &Arc<ClientConfig>) -> bool {
    match handshake(target, cfg).await {
        Ok(tls) => {
            let resumed = tls.get_ref().1.handshake_kind() == Some(HandshakeKind::Resumed);
            close(tls).await;
            resumed
        }
        Err(_) => false,
    }
}

/// The ticket-key probe crossbar runs for stick tables ([`crate::ticket_keys`]).
async fn ticket_key(svc: &ServiceConfig, b: &BackendConfig, target: &Target) -> TicketKey {
    let length = svc
        .stick
        .as_ref()
        .map(|s| s.ticket_prefix)
        .filter(|&n| n > 0)
        .unwrap_or(DEFAULT_TICKET_PREFIX);
    let probe = crate::ticket_keys::ask_key_name(
        b.proxy_protocol,
        &b.address,
        target.server_name.clone(),
        HANDSHAKE_TIMEOUT,
        length,
    );
    match probe.await {
        Ok(Some(_)) => TicketKey::Found { length },
        Ok(None) => TicketKey::NotFound,
        Err(e) => TicketKey::NotProbed {
            reason: e.to_string(),
        },
    }
}

/// The check `--status` runs on backends without an `https` check: Puppet's
/// `/status/v1/simple` expecting `running`.
fn puppet_status_check() -> HttpsCheck {
    HttpsCheck {
        path: STATUS_PATH.into(),
        expect_status: 200,
        expect_body: Some("running".into()),
        ca_file: None,
        client_cert: None,
        server_name: None,
    }
}

/// The health check itself ([`health::run_check`]), with its verdict as the answer.
async fn status(h: &HttpsCheck, target: &Target) -> StatusAnswer {
    let r = health::run_check(&CheckKind::Https(h.clone()), target, REQUEST_TIMEOUT).await;
    StatusAnswer {
        path: h.path.clone(),
        ok: r.is_ok(),
        answer: match r {
            Ok(()) => h.expect_body.clone().unwrap_or_else(|| "ok".into()),
            Err(e) => e.to_string(),
        },
    }
}

/// `GET /puppet-ca/v1/certificate/ca`: the CA bundle a Puppet CA serves (PEM), or
/// `None` when the backend serves none (not a CA, or not Puppet).
async fn ca_certificate(target: &Target) -> Option<CaCert> {
    let mut tls = None;
    for version in [&rustls::version::TLS13, &rustls::version::TLS12] {
        let cfg = client(version, false).ok()?;
        if let Ok(t) = handshake(target, &cfg).await {
            tls = Some(t);
            break;
        }
    }
    let tls = tls?;
    let host = name_text(&target.server_name);
    let get = health::http_get(TokioIo::new(tls), CA_CERT_PATH, &host);
    let (status, body) = tokio::time::timeout(REQUEST_TIMEOUT, get)
        .await
        .ok()?
        .ok()?;
    if status != 200 {
        return None;
    }
    let der: Vec<Vec<u8>> = CertificateDer::pem_slice_iter(&body)
        .map_while(Result::ok)
        .map(|c| c.as_ref().to_vec())
        .collect();
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let first = CertInfo::parse(der.first()?, now).ok()?;
    Some(CaCert {
        first,
        count: der.len(),
        der,
    })
}
