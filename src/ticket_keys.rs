//! Ticket-key probe: crossbar asks each backend for TLS 1.3 session tickets itself,
//! to learn the name of the key the backend encrypts its tickets with.
//!
//! TLS 1.3 tickets travel encrypted, so a passthrough balancer can't read the ones
//! a backend gives its clients. But OpenSSL-based servers (and rustls) start every
//! ticket with the 16-byte name of their ticket key. Connecting as an ordinary
//! client, crossbar receives tickets like anyone else; a fresh rustls connection
//! then writes a resumption ClientHello carrying a ticket as its PSK identity, which
//! [`crate::hello`] reads. When two tickets from one backend share their prefix, the
//! prefix is that backend's key name: learned as a `TicketPrefix` entry, it routes
//! every client's ticket from that backend back to it from the first resumption on,
//! even when all clients share one NAT address. Backends whose tickets share no
//! prefix (session-cache tickets, other stacks) are left alone; backends sharing a
//! key are recognised by the stick table as shared and not stuck.
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::TlsConnector;

use crate::balance::Backend;
use crate::config::{BackendAddress, ProxyProtocol, StickOn};
use crate::dial::tls::AcceptAnyCert;
use crate::hello::{parse_client_hello, HelloParse};
use crate::service::Service;
use crate::stick::KeyKind;

/// How long one probe handshake may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest wait after the handshake for the server's NewSessionTicket messages
/// (OpenSSL and rustls send them right after the client's Finished, so on a LAN
/// they are there within a millisecond; the wait ends as soon as two arrived).
const TICKET_WAIT: Duration = Duration::from_millis(300);
/// Granularity of that wait.
const TICKET_POLL: Duration = Duration::from_millis(5);
/// Tickets wanted: two agreeing prefixes make a key name.
const TICKETS_WANTED: usize = 2;
/// Largest resumption hello we parse (ours are ~300-600 bytes).
const MAX_PROBE_HELLO: usize = 16 * 1024;

/// Why a probe learned nothing.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// Connecting failed.
    #[error("connect: {0}")]
    Connect(std::io::Error),
    /// The TLS 1.3 handshake failed (a TLS 1.2-only backend ends here).
    #[error("TLS 1.3 handshake: {0}")]
    Handshake(std::io::Error),
    /// The handshake took too long.
    #[error("timed out")]
    Timeout,
    /// rustls refused to build a client.
    #[error("client: {0}")]
    Client(#[from] rustls::Error),
}

/// Start the probe loop of a service if it sticks on tickets or PSKs in `tls` mode.
/// The returned receiver fires when the first round (every healthy backend) is done.
pub fn spawn(svc: &Arc<Service>) -> Option<tokio::sync::oneshot::Receiver<()>> {
    let stick = svc.config.stick.as_ref()?;
    let (Some(interval), true) = (stick.probe_interval, stick.ticket_prefix > 0) else {
        return None;
    };
    if !(svc.sticks_on(StickOn::Ticket) || svc.sticks_on(StickOn::Psk)) || svc.table.is_none() {
        return None;
    }
    let svc = svc.clone();
    let (first_round, rx) = tokio::sync::oneshot::channel();
    let mut first_round = Some(first_round);
    tokio::spawn(async move {
        let stop = svc.tasks.clone();
        loop {
            // All backends at once: right after start, the sooner every key name is
            // known, the fewer first resumptions depend on the source hint.
            let round = svc
                .pool
                .backends
                .iter()
                .filter(|b| b.is_healthy())
                .map(|b| learn_key_name(&svc, b));
            tokio::select! {
                () = stop.cancelled() => return,
                _ = futures_join_all(round) => {}
            }
            if let Some(tx) = first_round.take() {
                let _ = tx.send(()); // ok: nobody waiting is fine
            }
            // ±10% jitter so probes of many crossbar instances don't synchronise.
            let jitter = 0.9 + fastrand::f64() * 0.2;
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(interval.mul_f64(jitter)) => {}
            }
        }
    });
    Some(rx)
}

/// Run futures concurrently on this task and wait for all (a few backends: no need
/// for a crate).
async fn futures_join_all<F: std::future::Future<Output = ()>>(futs: impl Iterator<Item = F>) {
    let mut set: Vec<std::pin::Pin<Box<F>>> = futs.map(Box::pin).collect();
    std::future::poll_fn(|cx| {
        set.retain_mut(|f| f.as_mut().poll(cx).is_pending());
        if set.is_empty() {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await
}

async fn learn_key_name(svc: &Service, b: &Backend) {
    let Some(table) = &svc.table else { return };
    let Some(stick) = &svc.config.stick else {
        return;
    };
    let name = crate::dial::tls::server_name_for(&svc.config, &b.config).0;
    match ask_key_name(
        b.config.proxy_protocol,
        &b.config.address,
        name,
        svc.config.timeouts.connect,
        stick.ticket_prefix,
    )
    .await
    {
        Ok(Some(prefix)) => {
            table.learn_prefix(table.key(KeyKind::TicketPrefix, &prefix), &b.name);
            tracing::debug!(service = %svc.name(), backend = %b.name, "ticket key name learned by probe");
        }
        Ok(None) => {
            tracing::debug!(service = %svc.name(), backend = %b.name, "probe: tickets carry no common key name");
        }
        Err(e) => tracing::debug!(service = %svc.name(), backend = %b.name, "probe: {e}"),
    }
}

/// Ask the backend at `addr` for tickets; `Some(prefix)` when every ticket received
/// starts with the same `prefix_len` bytes (its ticket-key name).
pub async fn ask_key_name(
    proxy: Option<ProxyProtocol>,
    addr: &BackendAddress,
    name: ServerName<'static>,
    connect_timeout: Duration,
    prefix_len: usize,
) -> Result<Option<Vec<u8>>, ProbeError> {
    let (cfg, tickets) = probe_config()?;
    let mut ids = Vec::new();
    // One connection usually brings two tickets (OpenSSL and rustls send two);
    // servers that send one get a second connection.
    for _ in 0..2 {
        handshake(&cfg, &tickets, proxy, addr, name.clone(), connect_timeout).await?;
        while let Some(id) = resumption_identity(&cfg, &name)? {
            ids.push(id);
        }
        if ids.len() >= 2 {
            break;
        }
    }
    Ok(common_prefix(&ids, prefix_len))
}

/// The first `len` bytes shared by every identity, if there are at least two.
fn common_prefix(ids: &[Vec<u8>], len: usize) -> Option<Vec<u8>> {
    let first = ids.first()?;
    if ids.len() < 2 || first.len() <= len {
        return None;
    }
    let p = &first[..len];
    ids.iter()
        .all(|id| id.len() > len && &id[..len] == p)
        .then(|| p.to_vec())
}

async fn handshake(
    cfg: &Arc<ClientConfig>,
    tickets: &CountingStore,
    proxy: Option<ProxyProtocol>,
    addr: &BackendAddress,
    name: ServerName<'static>,
    connect_timeout: Duration,
) -> Result<(), ProbeError> {
    let tcp = crate::dial::connect_own(addr, connect_timeout, proxy)
        .await
        .map_err(ProbeError::Connect)?;
    let connect = TlsConnector::from(cfg.clone()).connect(name, tcp);
    let mut tls = tokio::time::timeout(PROBE_TIMEOUT, connect)
        .await
        .map_err(|_| ProbeError::Timeout)?
        .map_err(ProbeError::Handshake)?;
    // Reading processes the post-handshake NewSessionTicket messages (the server
    // sends no data): read in short slices until enough tickets arrived.
    let mut buf = [0u8; 1024];
    let deadline = tokio::time::Instant::now() + TICKET_WAIT;
    let before = tickets.count();
    while tickets.count() < before + TICKETS_WANTED && tokio::time::Instant::now() < deadline {
        match tokio::time::timeout(TICKET_POLL, tls.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break, // the server closed: take what arrived
            _ => {}
        }
    }
    let _ = tokio::time::timeout(TICKET_WAIT, tls.shutdown()).await; // ok: best-effort close_notify
    Ok(())
}

/// The PSK identity a new connection would offer (consuming one stored ticket).
fn resumption_identity(
    cfg: &Arc<ClientConfig>,
    name: &ServerName<'static>,
) -> Result<Option<Vec<u8>>, ProbeError> {
    let mut conn = ClientConnection::new(cfg.clone(), name.clone())?;
    let mut hello = Vec::new();
    while conn.wants_write() {
        if conn.write_tls(&mut hello).is_err() {
            break;
        }
    }
    Ok(match parse_client_hello(&hello, MAX_PROBE_HELLO) {
        HelloParse::Found(h) => h.psk_identities.into_iter().next(),
        _ => None,
    })
}

/// A TLS 1.3 client that keeps its tickets in a counting store. It does not verify
/// the backend's certificate (and needs no CA file): it only collects tickets, sends
/// nothing and trusts nothing it receives.
fn probe_config() -> Result<(Arc<ClientConfig>, Arc<CountingStore>), ProbeError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAnyCert(provider)))
        .with_no_client_auth();
    let store = Arc::new(CountingStore::default());
    cfg.resumption = rustls::client::Resumption::store(store.clone());
    Ok((Arc::new(cfg), store))
}

/// rustls's in-memory session store, counting the TLS 1.3 tickets it is given so the
/// probe knows when to stop waiting.
#[derive(Debug)]
struct CountingStore {
    inner: rustls::client::ClientSessionMemoryCache,
    tickets: std::sync::atomic::AtomicUsize,
}

impl Default for CountingStore {
    fn default() -> Self {
        CountingStore {
            inner: rustls::client::ClientSessionMemoryCache::new(8),
            tickets: std::sync::atomic::AtomicUsize::new(0),
        }
    }
}

impl CountingStore {
    fn count(&self) -> usize {
        self.tickets.load(std::sync::atomic::Ordering::Acquire)
    }
}

impl rustls::client::ClientSessionStore for CountingStore {
    fn set_kx_hint(&self, n: ServerName<'static>, g: rustls::NamedGroup) {
        self.inner.set_kx_hint(n, g)
    }
    fn kx_hint(&self, n: &ServerName<'_>) -> Option<rustls::NamedGroup> {
        self.inner.kx_hint(n)
    }
    fn set_tls12_session(
        &self,
        n: ServerName<'static>,
        v: rustls::client::Tls12ClientSessionValue,
    ) {
        self.inner.set_tls12_session(n, v)
    }
    fn tls12_session(&self, n: &ServerName<'_>) -> Option<rustls::client::Tls12ClientSessionValue> {
        self.inner.tls12_session(n)
    }
    fn remove_tls12_session(&self, n: &ServerName<'static>) {
        self.inner.remove_tls12_session(n)
    }
    fn insert_tls13_ticket(
        &self,
        n: ServerName<'static>,
        v: rustls::client::Tls13ClientSessionValue,
    ) {
        self.tickets
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        self.inner.insert_tls13_ticket(n, v)
    }
    fn take_tls13_ticket(
        &self,
        n: &ServerName<'static>,
    ) -> Option<rustls::client::Tls13ClientSessionValue> {
        self.inner.take_tls13_ticket(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_prefix_needs_two_agreeing_ids() {
        let a = [vec![1u8; 16], vec![2u8; 20]].concat();
        let b = [vec![1u8; 16], vec![3u8; 20]].concat();
        let c = [vec![9u8; 16], vec![3u8; 20]].concat();
        assert_eq!(
            common_prefix(&[a.clone(), b.clone()], 16),
            Some(vec![1u8; 16])
        );
        assert_eq!(common_prefix(std::slice::from_ref(&a), 16), None);
        assert_eq!(common_prefix(&[a, c], 16), None);
        assert_eq!(
            common_prefix(&[vec![1u8; 16], vec![1u8; 16]], 16),
            None,
            "no bytes after the name"
        );
    }
}

#[cfg(test)]
mod probe_tests {
    use super::*;
    use crate::testbed::{BackendTls, TestCa, TlsBackend, Versions};

    /// A rustls test backend for `localhost` with the given versions and tickets.
    async fn backend(ca: &TestCa, name: &str, versions: Versions, tickets: bool) -> TlsBackend {
        let tls = BackendTls { versions, tickets };
        let any = "127.0.0.1:0".parse().unwrap();
        TlsBackend::start(ca, name, &["localhost"], tls, any)
            .await
            .unwrap()
    }

    /// One probe of `b`: the key-name prefix (16 bytes) of the tickets it issues.
    async fn ask(b: &TlsBackend) -> Result<Option<Vec<u8>>, ProbeError> {
        let addr = BackendAddress {
            host: b.addr.ip().to_string(),
            port: b.addr.port(),
        };
        let name = ServerName::try_from("localhost").unwrap();
        ask_key_name(None, &addr, name, Duration::from_secs(2), 16).await
    }

    #[tokio::test]
    async fn learns_a_stable_key_name_per_backend_and_distinct_across_backends() {
        let ca = TestCa::new("probe test").unwrap();
        let a = backend(&ca, "a", Versions::Both, true).await;
        let b = backend(&ca, "b", Versions::Both, true).await;
        let pa1 = ask(&a).await.unwrap().expect("prefix of a");
        let pa2 = ask(&a).await.unwrap().expect("prefix of a again");
        let pb = ask(&b).await.unwrap().expect("prefix of b");
        assert_eq!(pa1, pa2, "same backend, same key name");
        assert_ne!(pa1, pb, "independent backends, different key names");
    }

    #[tokio::test]
    async fn session_cache_tickets_have_no_key_name() {
        let ca = TestCa::new("probe test").unwrap();
        let a = backend(&ca, "a", Versions::Both, false).await;
        assert_eq!(ask(&a).await.unwrap(), None);
    }

    #[tokio::test]
    async fn tls12_only_backend_is_an_error_not_a_hang() {
        let ca = TestCa::new("probe test").unwrap();
        let a = backend(&ca, "a", Versions::Tls12, true).await;
        let r = ask(&a).await;
        assert!(matches!(r, Err(ProbeError::Handshake(_))), "{r:?}");
    }
}

#[cfg(test)]
mod openssl_tests {
    use super::*;
    use std::process::{Child, Command, Stdio};

    struct Kill(Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// Start `openssl s_server` on a free port; None when openssl is missing.
    fn s_server(
        dir: &std::path::Path,
        ca: &crate::testbed::TestCa,
    ) -> Option<(Kill, std::net::SocketAddr)> {
        let pem = ca.issue_pem("s_server", &["localhost"]).unwrap();
        std::fs::write(dir.join("c.pem"), pem.cert).unwrap();
        std::fs::write(dir.join("k.pem"), pem.key).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("openssl")
            .args(["s_server", "-quiet", "-www", "-accept"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("-cert")
            .arg(dir.join("c.pem"))
            .arg("-key")
            .arg(dir.join("k.pem"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        // Bounded wait for the port to open (s_server prints nothing with -quiet).
        for _ in 0..200 {
            if std::net::TcpStream::connect(addr).is_ok() {
                return Some((Kill(child), addr));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }

    #[tokio::test]
    async fn openssl_s_server_key_names() {
        let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let ca = crate::testbed::TestCa::new("probe openssl").unwrap();
        let (Some((_a, a)), Some((_b, b))) = (s_server(da.path(), &ca), s_server(db.path(), &ca))
        else {
            crate::testbed::missing_tool(
                "openssl_s_server_key_names",
                "`openssl s_server` did not start (apt-get install openssl)",
            )
        };
        let addr = |s: std::net::SocketAddr| BackendAddress {
            host: "127.0.0.1".into(),
            port: s.port(),
        };
        let name = || ServerName::try_from("localhost").unwrap();
        let t = Duration::from_secs(2);
        let pa = ask_key_name(None, &addr(a), name(), t, 16)
            .await
            .unwrap()
            .expect("openssl tickets carry a key name");
        let pa2 = ask_key_name(None, &addr(a), name(), t, 16)
            .await
            .unwrap()
            .expect("again");
        let pb = ask_key_name(None, &addr(b), name(), t, 16)
            .await
            .unwrap()
            .expect("second server");
        assert_eq!(pa, pa2);
        assert_ne!(pa, pb);
    }
}
