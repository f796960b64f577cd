//! The active checks: tcp, tls-hello and https, each one connection bounded by the
//! check's timeout, and why one failed.
use std::time::Duration;

use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use rustls::ClientConnection;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::error::CheckError;
use crate::config::{BackendAddress, CheckKind, HttpsCheck};
use crate::dial::connect_own;
use crate::dial::tls::{accept_any_config, client_tls};

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
pub async fn run_check(
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

pub(super) async fn connect(target: &Target, timeout: Duration) -> Result<TcpStream, CheckError> {
    connect_own(&target.address, timeout, target.proxy_protocol)
        .await
        .map_err(CheckError::Connect)
}

/// What the first bytes of a server's answer to a ClientHello show.
#[derive(Debug, PartialEq, Eq)]
pub enum HelloReply {
    /// Not enough bytes yet.
    NeedMore,
    /// A TLS server: a handshake record starting with a ServerHello (or a
    /// HelloRetryRequest, which has the same type), or an alert record.
    Tls,
    /// Something else.
    NotTls,
}

/// Classify a server's answer to our ClientHello by its first record.
pub fn classify_answer(b: &[u8]) -> HelloReply {
    let Some(&content) = b.first() else {
        return HelloReply::NeedMore;
    };
    if content != CONTENT_HANDSHAKE && content != CONTENT_ALERT {
        return HelloReply::NotTls;
    }
    match b.get(1) {
        None => return HelloReply::NeedMore,
        Some(&0x03) => {}
        Some(_) => return HelloReply::NotTls,
    }
    if content == CONTENT_ALERT {
        return if b.len() >= 5 {
            HelloReply::Tls
        } else {
            HelloReply::NeedMore
        };
    }
    match b.get(5) {
        None => HelloReply::NeedMore,
        Some(&HANDSHAKE_SERVER_HELLO) => HelloReply::Tls,
        Some(_) => HelloReply::NotTls,
    }
}

/// Send the ClientHello rustls makes (TLS 1.3 and 1.2, modern ciphers, SNI), and
/// accept a ServerHello or an alert: either proves a TLS server is listening.
/// Java 17 rejects the SSLv3 hello of HAProxy's `ssl-hello-chk`; this one it answers.
pub(super) async fn tls_hello(target: &Target, timeout: Duration) -> Result<(), CheckError> {
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
            HelloReply::Tls => return Ok(()),
            HelloReply::NotTls => return Err(CheckError::NotTls(quote(&answer))),
            HelloReply::NeedMore => {}
        }
        let n = tcp.read(&mut chunk).await.map_err(CheckError::Io)?;
        if n == 0 {
            return Err(CheckError::Closed);
        }
        answer.extend_from_slice(&chunk[..n]);
    }
}

/// The first bytes of a non-TLS answer, readable in a log line.
pub(super) fn quote(b: &[u8]) -> String {
    String::from_utf8_lossy(&b[..b.len().min(QUOTE_BYTES)]).into_owned()
}

/// A full TLS handshake, then `GET path` over HTTP/1.1 (hyper), checking the
/// status and the body. This is Puppet's documented load-balancer check:
/// `/status/v1/simple` answers `running` without a client certificate.
pub(super) async fn https(
    h: &HttpsCheck,
    target: &Target,
    timeout: Duration,
) -> Result<(), CheckError> {
    // Built at every check, so renewed certificate files are picked up.
    let config = client_tls(h.ca_file.as_deref(), h.client_cert.as_ref())?;
    let tcp = connect(target, timeout).await?;
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(target.server_name.clone(), tcp)
        .await
        .map_err(CheckError::Tls)?;
    let host = match &target.server_name {
        ServerName::DnsName(n) => n.as_ref().to_string(),
        _ => target.address.to_string(),
    };
    let (status, body) = http_get(TokioIo::new(tls), &h.path, &host).await?;
    expect(h, status, &body)
}

/// One HTTP/1.1 GET on an established stream: the status and (capped) body.
pub(crate) async fn http_get<S>(
    io: TokioIo<S>,
    path: &str,
    host: &str,
) -> Result<(u16, Bytes), CheckError>
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

/// Compare an answer with `expect_status` and `expect_body`. The body must be
/// exactly `expect_body` (surrounding whitespace aside): Puppet's status page
/// answers 200 only with `running`, and anything else (`starting`, `error`,
/// `unknown`, a proxy's error page) is not healthy.
pub(super) fn expect(h: &HttpsCheck, status: u16, body: &[u8]) -> Result<(), CheckError> {
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
    if text.trim() == want.as_str() {
        Ok(())
    } else {
        Err(CheckError::Body {
            got: text.chars().take(QUOTE_BODY_CHARS).collect(),
            want: want.clone(),
        })
    }
}
