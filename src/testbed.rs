//! Real TLS peers for the demo, the tests and the benchmarks: a CA made with rcgen,
//! rustls backends that answer HTTP/1.1 with their own name, and a rustls client.
//!
//! Nothing here is a mock: the backends are complete TLS servers with their own
//! session caches and ticket keys (not shared between backends, like independent
//! Puppet masters), and the client reports what rustls itself says about resumption.
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::{anyhow, Context, Result};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::{ClientConfig, HandshakeKind, RootCertStore, ServerConfig};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tokio_util::sync::CancellationToken;

/// A certificate authority for local TLS peers.
pub struct TestCa {
    cert: rcgen::Certificate,
    key: KeyPair,
}

/// A certificate chain and its key, PEM-encoded, for tools such as `openssl s_server`.
pub struct PemPair {
    /// Leaf certificate (PEM).
    pub cert: String,
    /// Private key (PKCS#8 PEM).
    pub key: String,
}

impl TestCa {
    /// A fresh CA named `name`.
    pub fn new(name: &str) -> Result<TestCa> {
        let mut p = CertificateParams::new(Vec::<String>::new())?;
        p.distinguished_name.push(DnType::CommonName, name);
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate()?;
        let cert = p.self_signed(&key)?;
        Ok(TestCa { cert, key })
    }

    /// The CA certificate (DER).
    pub fn cert_der(&self) -> CertificateDer<'static> {
        self.cert.der().clone()
    }

    /// The CA certificate (PEM).
    pub fn cert_pem(&self) -> String {
        self.cert.pem()
    }

    /// A root store trusting only this CA.
    pub fn roots(&self) -> RootCertStore {
        let mut roots = RootCertStore::empty();
        // A certificate we just made parses; an error would be a bug in rcgen.
        if let Err(e) = roots.add(self.cert_der()) {
            tracing::error!("test CA rejected by rustls: {e}");
        }
        roots
    }

    fn issue_raw(&self, cn: &str, names: &[&str]) -> Result<(rcgen::Certificate, KeyPair)> {
        let mut p =
            CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())?;
        p.distinguished_name.push(DnType::CommonName, cn);
        let key = KeyPair::generate()?;
        let cert = p.signed_by(&key, &self.cert, &self.key)?;
        Ok((cert, key))
    }

    /// A leaf certificate for `names` (DNS names or IP literals), with its key.
    pub fn issue(
        &self,
        cn: &str,
        names: &[&str],
    ) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
        let (cert, key) = self.issue_raw(cn, names)?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        Ok((vec![cert.der().clone()], key))
    }

    /// A leaf certificate for `names` as PEM.
    pub fn issue_pem(&self, cn: &str, names: &[&str]) -> Result<PemPair> {
        let (cert, key) = self.issue_raw(cn, names)?;
        Ok(PemPair {
            cert: cert.pem(),
            key: key.serialize_pem(),
        })
    }
}

/// TLS versions a peer speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Versions {
    /// TLS 1.2 only.
    Tls12,
    /// TLS 1.3 only.
    Tls13,
    /// Both (1.3 preferred).
    Both,
}

impl Versions {
    fn list(self) -> &'static [&'static rustls::SupportedProtocolVersion] {
        static TLS12: [&rustls::SupportedProtocolVersion; 1] = [&rustls::version::TLS12];
        static TLS13: [&rustls::SupportedProtocolVersion; 1] = [&rustls::version::TLS13];
        static BOTH: [&rustls::SupportedProtocolVersion; 2] =
            [&rustls::version::TLS13, &rustls::version::TLS12];
        match self {
            Versions::Tls12 => &TLS12,
            Versions::Tls13 => &TLS13,
            Versions::Both => &BOTH,
        }
    }
}

/// How a test backend does resumption.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackendTls {
    /// Versions spoken.
    pub versions: Versions,
    /// Issue stateless tickets (RFC 5077 in 1.2; stateless PSKs in 1.3) with this
    /// backend's own ticket key. Without, TLS 1.2 resumes by session ID and TLS 1.3
    /// with stateful tickets from the session cache.
    pub tickets: bool,
}

impl Default for BackendTls {
    fn default() -> Self {
        BackendTls {
            versions: Versions::Both,
            tickets: true,
        }
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The rustls server configuration of a test backend.
pub fn server_config(
    ca: &TestCa,
    name: &str,
    names: &[&str],
    tls: BackendTls,
) -> Result<Arc<ServerConfig>> {
    let (chain, key) = ca.issue(name, names)?;
    let mut cfg = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(tls.versions.list())?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    if tls.tickets {
        cfg.ticketer = rustls::crypto::ring::Ticketer::new()?;
    }
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// Handshakes a backend completed, by kind (what the server itself saw).
#[derive(Debug, Default)]
pub struct BackendStats {
    /// Full handshakes.
    pub full: AtomicU64,
    /// Resumed handshakes.
    pub resumed: AtomicU64,
    /// Connections accepted.
    pub connections: AtomicU64,
}

/// A running TLS backend answering HTTP/1.1 with its own name.
pub struct TlsBackend {
    /// Its name (the body of every answer, and the `x-backend` header).
    pub name: String,
    /// Where it listens.
    pub addr: SocketAddr,
    /// What it has seen.
    pub stats: Arc<BackendStats>,
    stop: CancellationToken,
    /// Its port, held once it stopped ([`hold_port`]), until it is dropped: owned
    /// here only to be dropped with it.
    _held: Arc<std::sync::Mutex<Option<socket2::Socket>>>,
}

impl TlsBackend {
    /// Start a backend on `bind` (use port 0), serving `names` with a certificate from `ca`.
    pub async fn start(
        ca: &TestCa,
        name: &str,
        names: &[&str],
        tls: BackendTls,
        bind: SocketAddr,
    ) -> Result<TlsBackend> {
        let cfg = server_config(ca, name, names, tls)?;
        let listener = TcpListener::bind(bind)
            .await
            .with_context(|| format!("binding {bind}"))?;
        let addr = listener.local_addr()?;
        let stop = CancellationToken::new();
        let stats = Arc::new(BackendStats::default());
        let held = Arc::new(std::sync::Mutex::new(None));
        let serving = serve_backend(
            listener,
            TlsAcceptor::from(cfg),
            name.to_string(),
            stats.clone(),
            stop.clone(),
        );
        tokio::spawn({
            let held = held.clone();
            async move {
                serving.await;
                // The listener is closed: hold the port until the backend is dropped.
                if let Ok(mut h) = held.lock() {
                    *h = hold_port(addr);
                }
            }
        });
        Ok(TlsBackend {
            name: name.to_string(),
            addr,
            stats,
            stop,
            _held: held,
        })
    }

    /// Stop accepting and close the listening socket, so the port refuses connections
    /// (open connections finish on their own). Takes effect when the accept task next
    /// runs; a new backend can then bind the same address, and no other process gets
    /// the port while this one lives ([`hold_port`]).
    pub fn stop(&self) {
        self.stop.cancel();
    }
}

impl Drop for TlsBackend {
    fn drop(&mut self) {
        // The held port goes with the last of `_held`'s two owners: this or the
        // accept task, which ends once it has seen the cancellation.
        self.stop.cancel();
    }
}

async fn serve_backend(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    name: String,
    stats: Arc<BackendStats>,
    stop: CancellationToken,
) {
    loop {
        // Accept first: connections the kernel already completed are served, not
        // reset, when the backend stops; the listener closes (port refuses) on return.
        let accepted = tokio::select! {
            biased;
            r = listener.accept() => r,
            () = stop.cancelled() => return,
        };
        let Ok((tcp, _)) = accepted else { continue };
        let (acceptor, name, stats) = (acceptor.clone(), name.clone(), stats.clone());
        stats.connections.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let resumed = tls.get_ref().1.handshake_kind() == Some(HandshakeKind::Resumed);
            let counter = if resumed { &stats.resumed } else { &stats.full };
            counter.fetch_add(1, Ordering::Relaxed);
            let svc =
                hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let name = name.clone();
                    async move {
                        // Puppet's status page, also per service (`/status/v1/simple/server`).
                        let path = req.uri().path();
                        let body = if path == "/status/v1/simple"
                            || path.starts_with("/status/v1/simple/")
                        {
                            "running".to_string()
                        } else {
                            format!("{name}\n")
                        };
                        let resp = hyper::Response::builder()
                            .header("x-backend", name.as_str())
                            .header("x-resumed", if resumed { "true" } else { "false" })
                            .body(Full::new(Bytes::from(body)));
                        Ok::<_, Infallible>(resp.unwrap_or_default())
                    }
                });
            let conn =
                hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(tls), svc);
            if let Err(e) = conn.await {
                tracing::debug!("test backend connection: {e}");
            }
        });
    }
}

/// A rustls client configuration trusting `ca`, with its own session cache (one per
/// simulated agent: clients that share a config share resumable sessions).
pub fn client_config(ca: &TestCa, versions: Versions, tickets: bool) -> Result<Arc<ClientConfig>> {
    let mut cfg = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(versions.list())?
        .with_root_certificates(ca.roots())
        .with_no_client_auth();
    cfg.enable_sni = true;
    if !tickets {
        cfg.resumption = rustls::client::Resumption::in_memory_sessions(64)
            .tls12_resumption(rustls::client::Tls12Resumption::SessionIdOnly);
    }
    Ok(Arc::new(cfg))
}

/// What one request through a TLS connection showed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The backend that answered (its own name, from the body).
    pub backend: String,
    /// rustls (client side) says the handshake resumed a session.
    pub resumed: bool,
    /// Negotiated protocol version.
    pub version: Option<rustls::ProtocolVersion>,
}

/// Connect to `addr`, handshake with SNI `server_name`, `GET path`, and report who answered.
pub async fn get(
    addr: SocketAddr,
    server_name: &str,
    cfg: Arc<ClientConfig>,
    path: &str,
) -> Result<Reply> {
    get_from(None, addr, server_name, cfg, path).await
}

/// [`get`] from the local address `from` (any of 127.0.0.0/8 on Linux, to be a
/// client with an address of its own), or the system's choice with `None`.
pub async fn get_from(
    from: Option<std::net::IpAddr>,
    addr: SocketAddr,
    server_name: &str,
    cfg: Arc<ClientConfig>,
    path: &str,
) -> Result<Reply> {
    let tcp = match from {
        None => TcpStream::connect(addr).await,
        Some(ip) => {
            let sock = match ip {
                std::net::IpAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
                std::net::IpAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
            };
            sock.bind(SocketAddr::new(ip, 0))
                .with_context(|| format!("binding {ip}"))?;
            sock.connect(addr).await
        }
    }
    .with_context(|| format!("connecting to {addr}"))?;
    get_on(tcp, server_name, cfg, path).await
}

/// [`get`] on a connection already open (from a chosen source address, or through
/// another proxy).
pub async fn get_on(
    tcp: TcpStream,
    server_name: &str,
    cfg: Arc<ClientConfig>,
    path: &str,
) -> Result<Reply> {
    let name = ServerName::try_from(server_name.to_string())
        .map_err(|e| anyhow!("bad server name: {e}"))?;
    let tls = TlsConnector::from(cfg)
        .connect(name, tcp)
        .await
        .context("TLS handshake")?;
    let (_, conn) = tls.get_ref();
    let resumed = conn.handshake_kind() == Some(HandshakeKind::Resumed);
    let version = conn.protocol_version();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
    let driver = tokio::spawn(connection);
    let req = hyper::Request::get(path)
        .header("host", server_name)
        .body(Empty::<Bytes>::new())?;
    let resp = sender.send_request(req).await?;
    let body = resp.into_body().collect().await?.to_bytes();
    drop(sender);
    driver.abort();
    Ok(Reply {
        backend: String::from_utf8_lossy(&body).trim().to_string(),
        resumed,
        version,
    })
}

/// A test cannot find a tool it needs (`what` says which and how to get it): the
/// test fails, always. A test that could not run must never count as passed;
/// `tests/run.sh` (the README's test command) installs every tool first.
pub fn missing_tool(test: &str, what: &str) -> ! {
    panic!("{test} cannot run: {what} (tests/run.sh installs it)")
}

/// Keep a stopped server's port from being handed to another process: a socket
/// bound to `addr` with SO_REUSEADDR that never listens. Connections to `addr` are
/// still refused (nothing listens), a server of this test can bind `addr` again
/// (SO_REUSEADDR on both, and this one does not listen), but the kernel no longer
/// picks the port for anyone's port-0 bind. Without it a parallel test's backend
/// could get the port and answer in the stopped one's place (seen in CI: a
/// balancer's retries reached another test's TLS server, "BadSignature"). `None` if
/// the bind fails (the port is in use again already).
pub fn hold_port(addr: SocketAddr) -> Option<socket2::Socket> {
    let domain = socket2::Domain::for_address(addr);
    let s = socket2::Socket::new(domain, socket2::Type::STREAM, None).ok()?;
    s.set_reuse_address(true).ok()?;
    s.bind(&addr.into()).ok()?;
    Some(s)
}

/// A loopback address that was free a moment ago, for a process that binds it
/// itself (a listener in another process can't hand its port back): the tests'
/// crossbar processes and the benchmarks' generated configs.
///
/// Taken below the kernel's ephemeral range (`ip_local_port_range`): a port from
/// that range, released here, may become the source port of any outgoing
/// connection before the other process binds it (a proxy that then never
/// listened). Ports are tried in a sequence that differs per process and call, and
/// each is checked by binding it.
pub fn free_port() -> Result<SocketAddr> {
    use std::sync::atomic::AtomicU32;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32768);
    let (first, span) = (10_000u32, low.saturating_sub(10_000));
    if span >= 1000 {
        let seed = std::process::id().wrapping_mul(7919);
        for _ in 0..span {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let port = first + seed.wrapping_add(n.wrapping_mul(4099)) % span;
            if let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", port as u16)) {
                return Ok(l.local_addr()?);
            }
        }
    }
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_port_refuses_and_can_be_listened_on_again() {
        let first = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = first.local_addr().unwrap();
        drop(first);
        let held = hold_port(addr).expect("the port was just freed");
        // Nothing listens: a connect is refused, as to a stopped server.
        let refused = std::net::TcpStream::connect(addr).unwrap_err();
        assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
        // The test's own server can come back on it (tokio, like std, binds with
        // SO_REUSEADDR), and then answers.
        let again = std::net::TcpListener::bind(addr).expect("rebinding a held port");
        std::net::TcpStream::connect(addr).expect("connect to the server back on it");
        drop((again, held));
    }
}
