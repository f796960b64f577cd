//! One backend's poller: Puppet's jruby-metrics over TLS (hyper, HTTP/1.1, the
//! connection kept alive between polls so a compiler is not asked for a TLS
//! handshake every second), or an HAProxy agent over TCP. One request in flight;
//! every poll bounded by `feedback.timeout`, every answer by a size.
use std::path::PathBuf;
use std::time::Duration;

use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::agent::{self, MAX_ANSWER};
use super::error::FeedbackError;
use super::puppet;
use super::weight::Reading;
use crate::config::{
    BackendAddress, BackendConfig, CheckKind, FeedbackConfig, FeedbackSource, ProxyProtocol,
    ServiceConfig,
};
use crate::dial;
use crate::dial::tls::{client_tls, server_name_for};

/// Largest jruby-metrics document read: at `level=debug` each borrowed or queued
/// request is ~300 bytes, so a pool of 64 with a queue of 10,000 fits; more is not
/// a compiler's answer.
pub const MAX_DOCUMENT: usize = 4 * 1024 * 1024;
/// Read size of an agent's answer.
const AGENT_READ: usize = 128;

/// What is asked, and how.
#[derive(Debug, Clone)]
enum Ask {
    Puppet {
        path: String,
        server_name: ServerName<'static>,
        host: String,
        ca_file: Option<PathBuf>,
        client_cert: Option<(PathBuf, PathBuf)>,
    },
    Agent {
        send: Option<String>,
    },
}

/// A connection kept for the next poll; its driver task ends with it.
struct Http {
    sender: SendRequest<Empty<Bytes>>,
    driver: tokio::task::JoinHandle<()>,
}

impl Drop for Http {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

/// The poller of one backend.
pub struct Poller {
    ask: Ask,
    address: BackendAddress,
    proxy: Option<ProxyProtocol>,
    timeout: Duration,
    http: Option<Http>,
}

impl std::fmt::Debug for Poller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Poller")
            .field("address", &self.address)
            .finish()
    }
}

impl Poller {
    /// The poller of backend `b` of `svc`. Puppet: the backend's address (a PROXY
    /// LOCAL header first when it expects one), the server name and CA the https
    /// health check would use unless `feedback` names its own; agent: the backend's
    /// host on `feedback.port`.
    pub fn new(svc: &ServiceConfig, b: &BackendConfig, cfg: &FeedbackConfig) -> Poller {
        let https = match &b.health.check {
            CheckKind::Https(h) => Some(h),
            _ => None,
        };
        let (ask, address, proxy) = match &cfg.source {
            FeedbackSource::Puppet(p) => {
                let server_name = p
                    .server_name
                    .clone()
                    .and_then(|n| ServerName::try_from(n).ok())
                    .unwrap_or_else(|| server_name_for(svc, b).0);
                let host = match &server_name {
                    ServerName::DnsName(n) => n.as_ref().to_string(),
                    _ => b.address.to_string(),
                };
                let ask = Ask::Puppet {
                    path: p.path.clone(),
                    server_name,
                    host,
                    ca_file: p
                        .ca_file
                        .clone()
                        .or_else(|| https.and_then(|h| h.ca_file.clone())),
                    client_cert: p.client_cert.clone(),
                };
                (ask, b.address.clone(), b.proxy_protocol)
            }
            FeedbackSource::Agent(a) => {
                let address = BackendAddress {
                    host: b.address.host.clone(),
                    port: a.port,
                };
                (
                    Ask::Agent {
                        send: a.send.clone(),
                    },
                    address,
                    None,
                )
            }
        };
        Poller {
            ask,
            address,
            proxy,
            timeout: cfg.timeout,
            http: None,
        }
    }

    /// Ask once, within the timeout.
    pub async fn poll(&mut self) -> Result<Reading, FeedbackError> {
        let timeout = self.timeout;
        let asked = match self.ask.clone() {
            Ask::Puppet {
                path,
                server_name,
                host,
                ca_file,
                client_cert,
            } => {
                let tls = (server_name, ca_file, client_cert);
                tokio::time::timeout(timeout, self.puppet(&path, &host, tls)).await
            }
            Ask::Agent { send } => tokio::time::timeout(timeout, self.agent(send.as_deref())).await,
        };
        let result = asked.unwrap_or(Err(FeedbackError::Timeout(timeout)));
        if result.is_err() {
            self.http = None; // a failed or cut exchange leaves nothing to reuse
        }
        result
    }

    async fn puppet(
        &mut self,
        path: &str,
        host: &str,
        tls: (
            ServerName<'static>,
            Option<PathBuf>,
            Option<(PathBuf, PathBuf)>,
        ),
    ) -> Result<Reading, FeedbackError> {
        // A kept connection the compiler closed since the last poll (Jetty's idle
        // timeout, a restart) is seen here or fails before any answer: then once
        // more on a new connection.
        let kept = self.http.as_ref().is_some_and(|h| !h.sender.is_closed());
        if kept {
            match self.exchange(path, host).await {
                Err(FeedbackError::Http(_)) => self.http = None,
                done => return done,
            }
        }
        self.http = Some(self.connect(&tls).await?);
        self.exchange(path, host).await
    }

    async fn connect(
        &self,
        (server_name, ca_file, client_cert): &(
            ServerName<'static>,
            Option<PathBuf>,
            Option<(PathBuf, PathBuf)>,
        ),
    ) -> Result<Http, FeedbackError> {
        let config = client_tls(ca_file.as_deref(), client_cert.as_ref())
            .map_err(|e| FeedbackError::Setup(e.to_string()))?;
        let tcp = dial::connect_own(&self.address, self.timeout, self.proxy)
            .await
            .map_err(FeedbackError::Connect)?;
        let tls = tokio_rustls::TlsConnector::from(config)
            .connect(server_name.clone(), tcp)
            .await
            .map_err(FeedbackError::Tls)?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| FeedbackError::Http(e.to_string()))?;
        let driver = tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!("feedback connection ended: {e}");
            }
        });
        Ok(Http { sender, driver })
    }

    /// One GET on the kept connection: the status, then at most [`MAX_DOCUMENT`]
    /// bytes of body, read into a sample.
    async fn exchange(&mut self, path: &str, host: &str) -> Result<Reading, FeedbackError> {
        let http = |e: hyper::Error| FeedbackError::Http(e.to_string());
        let Some(conn) = self.http.as_mut() else {
            return Err(FeedbackError::Http("no connection".into()));
        };
        conn.sender.ready().await.map_err(http)?;
        let req = hyper::Request::get(path)
            .header(hyper::header::HOST, host)
            .header(hyper::header::USER_AGENT, "crossbar-feedback")
            .header(hyper::header::ACCEPT, "application/json")
            .body(Empty::<Bytes>::new())
            .map_err(|e| FeedbackError::Http(e.to_string()))?;
        let resp = conn.sender.send_request(req).await.map_err(http)?;
        match resp.status().as_u16() {
            200 => {}
            s @ (401 | 403) => return Err(FeedbackError::Refused(s)),
            s => return Err(FeedbackError::Status(s)),
        }
        let body = Limited::new(resp.into_body(), MAX_DOCUMENT)
            .collect()
            .await
            .map_err(|e| match e.downcast::<http_body_util::LengthLimitError>() {
                Ok(_) => FeedbackError::TooLarge(MAX_DOCUMENT),
                Err(e) => FeedbackError::Http(format!("reading the answer: {e}")),
            })?
            .to_bytes();
        Ok(Reading::Puppet(puppet::sample(&body)?))
    }

    /// Connect to the agent, send `send`, read one line (at most [`MAX_ANSWER`]
    /// bytes) or what comes before the agent closes.
    async fn agent(&mut self, send: Option<&str>) -> Result<Reading, FeedbackError> {
        let mut tcp = dial::connect_to(&self.address, self.timeout, None)
            .await
            .map_err(FeedbackError::Connect)?;
        if let Some(s) = send {
            tcp.write_all(s.as_bytes())
                .await
                .map_err(FeedbackError::Io)?;
        }
        let mut answer = Vec::with_capacity(AGENT_READ);
        let mut chunk = [0u8; AGENT_READ];
        loop {
            let n = tcp.read(&mut chunk).await.map_err(FeedbackError::Io)?;
            answer.extend_from_slice(&chunk[..n]);
            let line_ended = answer.iter().any(|&b| b == b'\n' || b == b'\r');
            if n == 0 || line_ended {
                break;
            }
            if answer.len() > MAX_ANSWER {
                return Err(agent::AgentError::TooLong.into());
            }
        }
        Ok(Reading::Agent(agent::parse(&answer)?))
    }
}
