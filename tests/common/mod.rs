//! Shared helpers of the integration tests: a running crossbar started from YAML,
//! real TCP and TLS backends on loopback, clients, payloads and metric reading.
//!
//! Every listener binds port 0 and hands its address back; nothing waits with a
//! sleep for readiness (a bound listener accepts at once). Waits on outcomes are
//! bounded by [`WAIT`], a guard against hangs, never a performance threshold.
#![allow(dead_code)] // each test binary uses a different part of this module

pub mod api;
pub mod compiler;
pub mod dns;
pub mod ending;
pub mod haproxy;
pub mod hello;
pub mod java;
pub mod load;
pub mod log;
pub mod netns;
pub mod process;
pub mod snapshot;
pub mod tls;
pub mod wire;

#[allow(unused_imports)] // each test binary uses a different part of this module
pub use api::{admin_get, admin_json, api_reload, body_of, try_admin_get};
#[allow(unused_imports)] // see above
pub use load::{load, ping, Load};
#[allow(unused_imports)] // see above
pub use log::LogBuffer;
#[allow(unused_imports)] // see above
pub use process::{
    crossbar_cli, crossbar_cli_exit, crossbar_run, echo_service, enable_admin, free_port,
    run_logged, serving, tcp_config, terminate, wait_listening,
};
#[allow(unused_imports)] // see above
pub use tls::ChildGuard;

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbar::admin;
use crossbar::balance;
use crossbar::config::Config;
use crossbar::metrics::Metrics;
use crossbar::server::{ApplyError, Server};
use crossbar::testbed::{self, BackendTls, TestCa, TlsBackend};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Longest any single awaited outcome may take before the test fails as hung.
pub const WAIT: Duration = Duration::from_secs(90);

/// The SNI every TLS test uses.
pub const SNI: &str = "puppet.example.com";

/// A wildcard the openssl and JDK test backends' certificates also carry, so one
/// backend can serve any `NAME.stacks.example.com` (tests/client_stacks.rs routes
/// by such names).
pub const STACKS: &str = "*.stacks.example.com";

/// Await `fut`, failing the test (naming `what`) if it takes longer than [`WAIT`].
pub async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(WAIT, fut).await {
        Ok(v) => v,
        Err(_) => panic!("hung: {what} did not happen within {WAIT:?}"),
    }
}

/// Poll `cond` until it holds (for effects with no event to wait on, such as a
/// connection task finishing) and return how long that took; bounded (fails the test
/// after [`WAIT`]).
pub async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    let step = Duration::from_millis(5);
    let rounds = WAIT.as_millis() / step.as_millis();
    for _ in 0..rounds {
        if cond() {
            return started.elapsed();
        }
        tokio::time::sleep(step).await;
    }
    panic!("{what}: still not true after {WAIT:?}");
}

/// [`wait_until`] for a condition that must itself await (a connection, an HTTP
/// request); bounded by [`WAIT`].
pub async fn wait_until_async<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    while start.elapsed() < WAIT {
        if cond().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what}: still not true after {WAIT:?}");
}

// ---------------------------------------------------------------------------
// crossbar

/// A running balancer with its config file in a temporary directory (so config
/// errors name a real path).
pub struct Crossbar {
    pub server: Arc<Server>,
    pub path: PathBuf,
    _dir: tempfile::TempDir,
}

/// Write `yaml` to `dir/crossbar.yaml` and load it.
pub fn load_config(dir: &Path, yaml: &str) -> Config {
    let path = dir.join("crossbar.yaml");
    std::fs::write(&path, yaml).expect("writing the config file");
    Config::load(&path).unwrap_or_else(|e| panic!("config should load:\n{e}\n---\n{yaml}"))
}

impl Crossbar {
    /// Start crossbar from a YAML document (which must load: a bad document is a
    /// bug of the test).
    pub async fn start(yaml: &str) -> Crossbar {
        Crossbar::try_start(yaml)
            .await
            .unwrap_or_else(|e| panic!("crossbar should start: {e}"))
    }

    /// Load `yaml` and try to start a server, for tests of start-up errors and for
    /// callers that report the error themselves.
    pub async fn try_start(yaml: &str) -> Result<Crossbar, ApplyError> {
        let dir = tempfile::tempdir().expect("temp dir");
        let cfg = load_config(dir.path(), yaml);
        let path = cfg.source.clone();
        let server = Server::start(cfg, Metrics::new()).await?;
        Ok(Crossbar {
            server,
            path,
            _dir: dir,
        })
    }

    /// The directory of the config file (a place for the test's other files).
    pub fn dir(&self) -> &Path {
        self._dir.path()
    }

    /// Serve the admin API on a free loopback port, with `token` if given; it
    /// stops when the returned value is dropped.
    pub async fn serve_admin(&self, token: Option<admin::Secret>) -> AdminEndpoint {
        let listener = admin::bind(any_port())
            .await
            .expect("bind the admin endpoint");
        let addr = listener.local_addr().expect("admin addr");
        let stop = CancellationToken::new();
        tokio::spawn(admin::serve(
            listener,
            self.server.clone(),
            token,
            stop.clone(),
        ));
        AdminEndpoint { addr, stop }
    }

    /// The running backend `name` of `service` (its health, admin state, counts).
    pub fn backend(&self, service: &str, name: &str) -> Arc<balance::Backend> {
        self.server
            .service(service)
            .and_then(|s| s.pool.get(name).cloned())
            .unwrap_or_else(|| panic!("no backend {service}/{name}"))
    }

    /// The (first) address `service` listens on.
    pub fn addr(&self, service: &str) -> SocketAddr {
        *self
            .server
            .local_addrs(service)
            .first()
            .unwrap_or_else(|| panic!("service {service} has no listener"))
    }

    /// Replace the running configuration with `yaml` (rewrites the same file).
    pub async fn reload(&self, yaml: &str) {
        let dir = self.path.parent().expect("config dir");
        let cfg = load_config(dir, yaml);
        self.server
            .reload(cfg)
            .await
            .unwrap_or_else(|e| panic!("reload should succeed: {e}"));
    }

    /// The value of one metric sample; 0 when it has not been created yet.
    pub fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        metric_value(&self.server.metrics().encode(), name, labels)
    }

    /// Connections a backend of `service` holds open now, as crossbar counts them.
    pub fn active(&self, service: &str, backend: &str) -> u32 {
        self.backend(service, backend).active()
    }
}

/// A test reads a running crossbar as its [`Server`] (listeners, services, tasks).
impl std::ops::Deref for Crossbar {
    type Target = Server;

    fn deref(&self) -> &Server {
        &self.server
    }
}

/// The admin API of a [`Crossbar`], served until dropped.
pub struct AdminEndpoint {
    pub addr: SocketAddr,
    stop: CancellationToken,
}

impl Drop for AdminEndpoint {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A crossbar with one echo backend and its admin endpoint, served until dropped.
pub struct AdminBed {
    /// The admin endpoint's address.
    pub addr: SocketAddr,
    pub cb: Crossbar,
    _endpoint: AdminEndpoint,
    _backend: Backend,
}

/// Start an [`AdminBed`]: one service with `settings` over one echo backend, its
/// admin endpoint guarded by `token` (none: no token).
pub async fn admin_bed(settings: &str, token: Option<&str>) -> AdminBed {
    let be = Backend::echo("e1", false).await;
    let cb = Crossbar::start(&one_service(settings, &[backend_line("e1", be.addr, "")])).await;
    let endpoint = cb.serve_admin(token.and_then(admin::Secret::new)).await;
    AdminBed {
        addr: endpoint.addr,
        cb,
        _endpoint: endpoint,
        _backend: be,
    }
}

/// Find `name{labels...}` in Prometheus text and return its value (sum if several
/// samples match, 0 if none do).
pub fn metric_value(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (n, rest) = match series.split_once('{') {
                Some((n, rest)) => (n, rest),
                None => (series, ""),
            };
            if n != name {
                return None;
            }
            labels
                .iter()
                .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")))
                .then(|| value.parse::<f64>().ok())?
        })
        .sum()
}

/// Rustls backends, one per name, answering [`SNI`] and `localhost` on free
/// loopback ports.
pub async fn rustls_backends(
    ca: &TestCa,
    names: &[String],
    tls: BackendTls,
) -> anyhow::Result<Vec<TlsBackend>> {
    let mut v = Vec::new();
    for n in names {
        v.push(TlsBackend::start(ca, n, &[SNI, "localhost"], tls, any_port()).await?);
    }
    Ok(v)
}

/// A TLS backend `name` for [`SNI`] on a free port (a failure to start fails the test).
pub async fn tls_backend(ca: &TestCa, name: &str, tls: BackendTls) -> TlsBackend {
    TlsBackend::start(ca, name, &[SNI], tls, any_port())
        .await
        .unwrap_or_else(|e| panic!("start TLS backend {name}: {e:#}"))
}

/// A config with one service `svc` on `127.0.0.1:0`. `settings` are extra lines of
/// the service (4-space indented YAML, e.g. `"    mode: tcp\n"`); `backends` are
/// lines from [`backend_line`].
pub fn one_service(settings: &str, backends: &[String]) -> String {
    let mut y = String::from(
        "admin: { enabled: false }\nservices:\n  svc:\n    listen: [\"127.0.0.1:0\"]\n    health: { check: none }\n",
    );
    y.push_str(settings);
    y.push_str("    backends:\n");
    for b in backends {
        y.push_str(b);
    }
    y
}

/// One backend entry; `extra` is more flow-map keys, e.g. `"weight: 3"`.
pub fn backend_line(name: &str, addr: SocketAddr, extra: &str) -> String {
    let extra = if extra.is_empty() {
        String::new()
    } else {
        format!(", {extra}")
    };
    format!("      - {{ name: {name}, address: \"{addr}\"{extra} }}\n")
}

// ---------------------------------------------------------------------------
// Backends

/// What a backend connection saw, reported when it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// Bytes received from the client (through crossbar).
    pub received: u64,
    /// SHA-256 of those bytes.
    pub sha: [u8; 32],
    /// The peer saw EOF (a FIN) rather than an error.
    pub clean_eof: bool,
}

type Handler =
    Arc<dyn Fn(TcpStream, String) -> Pin<Box<dyn Future<Output = Report> + Send>> + Send + Sync>;

/// A real TCP backend on `127.0.0.1:0` that runs a handler per connection and
/// reports what each connection received when it ends.
pub struct Backend {
    pub name: String,
    pub addr: SocketAddr,
    /// Connections accepted so far.
    pub accepted: Arc<AtomicUsize>,
    reports: tokio::sync::Mutex<mpsc::UnboundedReceiver<Report>>,
    task: Mutex<Option<JoinHandle<()>>>,
    /// Its port once stopped (`testbed::hold_port`): no other test gets it.
    held: Mutex<Option<socket2::Socket>>,
}

impl Backend {
    async fn spawn(name: &str, handler: Handler) -> Backend {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind backend");
        let addr = listener.local_addr().expect("backend addr");
        let accepted = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn({
            let accepted = accepted.clone();
            let name = name.to_string();
            async move {
                loop {
                    let Ok((sock, _)) = listener.accept().await else {
                        continue;
                    };
                    accepted.fetch_add(1, Ordering::SeqCst);
                    let (h, tx, name) = (handler.clone(), tx.clone(), name.clone());
                    tokio::spawn(async move {
                        let report = h(sock, name).await;
                        let _ = tx.send(report); // ok: the test may not read reports
                    });
                }
            }
        });
        Backend {
            name: name.to_string(),
            addr,
            accepted,
            reports: tokio::sync::Mutex::new(rx),
            task: Mutex::new(Some(task)),
            held: Mutex::new(None),
        }
    }

    /// Echo every byte back; when `tagged`, first write `name\n` (so a `mode: tcp`
    /// client learns which backend answered). Half-closes after the client's EOF.
    pub async fn echo(name: &str, tagged: bool) -> Backend {
        Backend::spawn(
            name,
            Arc::new(move |mut s: TcpStream, name: String| {
                Box::pin(async move {
                    if tagged && s.write_all(format!("{name}\n").as_bytes()).await.is_err() {
                        return Report::failed();
                    }
                    echo_stream(&mut s).await
                })
            }),
        )
        .await
    }

    /// Read to EOF while hashing, then answer `"<len> <sha256 hex>\n"` and close.
    pub async fn sink(name: &str) -> Backend {
        Backend::spawn(
            name,
            Arc::new(|mut s: TcpStream, _| {
                Box::pin(async move {
                    let r = hash_to_eof(&mut s).await;
                    let answer = format!("{} {}\n", r.received, hex(&r.sha));
                    let _ = s.write_all(answer.as_bytes()).await; // ok: the report says what was read
                    let _ = s.shutdown().await; // ok: as above
                    r
                })
            }),
        )
        .await
    }

    /// Accept, write `name\n`, read (and drop) `n` bytes, then reset the connection
    /// (SO_LINGER 0 and close: the kernel sends RST).
    pub async fn reset_after(name: &str, n: u64) -> Backend {
        Backend::spawn(
            name,
            Arc::new(move |mut s: TcpStream, name: String| {
                Box::pin(async move {
                    let _ = s.write_all(format!("{name}\n").as_bytes()).await; // ok: reset follows anyway
                    let mut hasher = Sha256::new();
                    let mut got = 0u64;
                    let mut buf = vec![0u8; 16 * 1024];
                    while got < n {
                        let want = buf.len().min((n - got) as usize);
                        match s.read(&mut buf[..want]).await {
                            Ok(0) | Err(_) => break,
                            Ok(k) => {
                                hasher.update(&buf[..k]);
                                got += k as u64;
                            }
                        }
                    }
                    socket2::SockRef::from(&s)
                        .set_linger(Some(Duration::ZERO))
                        .expect("SO_LINGER 0");
                    drop(s);
                    Report {
                        received: got,
                        sha: hasher.finalize().into(),
                        clean_eof: false,
                    }
                })
            }),
        )
        .await
    }

    /// Accept and never write; read (hashing) until the peer closes.
    pub async fn silent(name: &str) -> Backend {
        Backend::spawn(
            name,
            Arc::new(|mut s: TcpStream, _| Box::pin(async move { hash_to_eof(&mut s).await })),
        )
        .await
    }

    /// The server speaks first: write `payload`, half-close, then read (hashing)
    /// what the client still sends until its EOF, then close.
    pub async fn server_first(name: &str, payload: Arc<Vec<u8>>) -> Backend {
        Backend::spawn(
            name,
            Arc::new(move |mut s: TcpStream, _| {
                let payload = payload.clone();
                Box::pin(async move {
                    if s.write_all(&payload).await.is_err() || s.shutdown().await.is_err() {
                        return Report::failed();
                    }
                    hash_to_eof(&mut s).await
                })
            }),
        )
        .await
    }

    /// A TLS server (rustls, certificate for [`SNI`] from `ca`, CN `name`) that echoes
    /// the plaintext and reports what it received.
    pub async fn tls_echo(ca: &TestCa, name: &str) -> Backend {
        let cfg = testbed::server_config(ca, name, &[SNI], BackendTls::default())
            .expect("TLS server config");
        let acceptor = tokio_rustls::TlsAcceptor::from(cfg);
        Backend::spawn(
            name,
            Arc::new(move |s: TcpStream, _| {
                let acceptor = acceptor.clone();
                Box::pin(async move {
                    match acceptor.accept(s).await {
                        Ok(mut tls) => echo_stream(&mut tls).await,
                        Err(_) => Report::failed(),
                    }
                })
            }),
        )
        .await
    }

    /// The report of the next connection to end (bounded wait).
    pub async fn next_report(&self) -> Report {
        let mut rx = self.reports.lock().await;
        within(
            &format!("a connection on backend {} to end", self.name),
            rx.recv(),
        )
        .await
        .expect("backend report channel open")
    }

    /// Stop listening: from now on its port refuses connections, and it is held so
    /// that no other test's server gets it (`testbed::hold_port`). Open connections
    /// continue.
    pub async fn stop(&self) {
        let task = self.task.lock().expect("backend task lock").take();
        if let Some(t) = task {
            t.abort();
            let _ = t.await; // ok: cancelled; awaiting makes sure the listener is closed
            *self.held.lock().expect("backend port lock") = crossbar::testbed::hold_port(self.addr);
        }
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        if let Ok(mut t) = self.task.lock() {
            if let Some(t) = t.take() {
                t.abort();
            }
        }
    }
}

impl Report {
    fn failed() -> Report {
        Report {
            received: 0,
            sha: Sha256::digest([]).into(),
            clean_eof: false,
        }
    }
}

/// Echo `s` to itself while hashing what came in; half-close at EOF.
async fn echo_stream<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S) -> Report {
    let mut hasher = Sha256::new();
    let mut got = 0u64;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match s.read(&mut buf).await {
            Ok(0) => break,
            Ok(n) => {
                hasher.update(&buf[..n]);
                got += n as u64;
                if s.write_all(&buf[..n]).await.is_err() {
                    return Report {
                        received: got,
                        sha: hasher.finalize().into(),
                        clean_eof: false,
                    };
                }
            }
            Err(_) => {
                return Report {
                    received: got,
                    sha: hasher.finalize().into(),
                    clean_eof: false,
                }
            }
        }
    }
    let clean = s.shutdown().await.is_ok();
    Report {
        received: got,
        sha: hasher.finalize().into(),
        clean_eof: clean,
    }
}

/// Read to EOF (or error), hashing.
async fn hash_to_eof<S: AsyncRead + Unpin>(s: &mut S) -> Report {
    let mut hasher = Sha256::new();
    let mut got = 0u64;
    let mut buf = vec![0u8; 64 * 1024];
    let clean_eof = loop {
        match s.read(&mut buf).await {
            Ok(0) => break true,
            Ok(n) => {
                hasher.update(&buf[..n]);
                got += n as u64;
            }
            Err(_) => break false,
        }
    };
    Report {
        received: got,
        sha: hasher.finalize().into(),
        clean_eof,
    }
}

/// The address a listener binds to have the kernel pick a free loopback port.
pub fn any_port() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// A ClientHello captured from a real client, from `tests/fixtures/hellos/`.
pub fn hello_fixture(name: &str) -> Vec<u8> {
    let path = format!(
        "{}/tests/fixtures/hellos/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// A loopback address whose port refuses connections: bind port 0, then close it.
pub fn refusing_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    drop(l);
    addr
}

/// A loopback listener that never completes a connect: backlog 0, never accepts, and
/// its one queue slot taken by a filler connection, so Linux drops further SYNs.
/// Keep the returned value alive as long as the black hole is needed.
pub struct BlackHole {
    pub addr: SocketAddr,
    _listener: socket2::Socket,
    _filler: std::net::TcpStream,
}

impl BlackHole {
    pub fn new() -> BlackHole {
        use socket2::{Domain, Socket, Type};
        let s = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
        let any: SocketAddr = "127.0.0.1:0".parse().expect("addr");
        s.bind(&any.into()).expect("bind");
        s.listen(0).expect("listen");
        let addr = s
            .local_addr()
            .expect("addr")
            .as_socket()
            .expect("inet addr");
        let filler = std::net::TcpStream::connect(addr).expect("filler connect");
        BlackHole {
            addr,
            _listener: s,
            _filler: filler,
        }
    }
}

impl Default for BlackHole {
    fn default() -> Self {
        Self::new()
    }
}

// ---------------------------------------------------------------------------
// Clients and payloads

/// Connect to `to` from the loopback address `from` (any of 127/8 on Linux).
pub async fn connect_from(from: IpAddr, to: SocketAddr) -> TcpStream {
    let sock = TcpSocket::new_v4().expect("socket");
    sock.bind(SocketAddr::new(from, 0))
        .unwrap_or_else(|e| panic!("bind {from}: {e}"));
    within("connect", sock.connect(to))
        .await
        .unwrap_or_else(|e| panic!("connect {from} -> {to}: {e}"))
}

/// Read a `name\n` line written by a tagged backend.
pub async fn read_name<S: AsyncRead + Unpin>(s: &mut S) -> String {
    let mut name = Vec::new();
    let mut byte = [0u8; 1];
    for _ in 0..256 {
        let n = within("the backend's name", s.read(&mut byte))
            .await
            .expect("reading the backend's name");
        assert_eq!(n, 1, "connection closed before the backend's name");
        if byte[0] == b'\n' {
            return String::from_utf8(name).expect("utf-8 name");
        }
        name.push(byte[0]);
    }
    panic!("no newline in 256 bytes of backend name");
}

/// Connect to a `mode: tcp` service and return the tagged backend that answered,
/// with the open connection.
pub async fn who(addr: SocketAddr) -> (String, TcpStream) {
    let mut s = within("connect", TcpStream::connect(addr))
        .await
        .expect("connect to crossbar");
    let name = read_name(&mut s).await;
    (name, s)
}

/// `len` bytes from a PRNG seeded with `seed` (reproducible content).
pub fn payload(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut v = vec![0u8; len];
    rng.fill(&mut v);
    v
}

/// SHA-256 of `data`.
pub fn sha(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}

/// Lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Write all of `data` then half-close, while reading everything that comes back
/// until EOF; returns (bytes received, their SHA-256).
pub async fn exchange<S>(stream: S, data: &[u8]) -> (u64, [u8; 32])
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (mut r, mut w) = tokio::io::split(stream);
    let write = async {
        for chunk in data.chunks(256 * 1024) {
            w.write_all(chunk).await.expect("client write");
        }
        w.shutdown().await.expect("client half-close");
    };
    let read = async {
        let r = hash_to_eof(&mut r).await;
        assert!(r.clean_eof, "client read ended with an error");
        (r.received, r.sha)
    };
    let ((), got) = within("the exchange", async { tokio::join!(write, read) }).await;
    got
}

/// Read everything until EOF or error; returns the bytes and whether it was a clean EOF.
pub async fn read_to_end_or_error<S: AsyncRead + Unpin>(s: &mut S) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match s.read(&mut buf).await {
            Ok(0) => return (out, true),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(_) => return (out, false),
        }
    }
}

/// A TLS client connection to `addr` with SNI [`SNI`], trusting `ca`.
pub async fn tls_connect(
    ca: &TestCa,
    addr: SocketAddr,
) -> tokio_rustls::client::TlsStream<TcpStream> {
    let cfg = testbed::client_config(ca, testbed::Versions::Both, true).expect("client config");
    let tcp = within("connect", TcpStream::connect(addr))
        .await
        .expect("connect to crossbar");
    let name = rustls::pki_types::ServerName::try_from(SNI).expect("server name");
    within(
        "TLS handshake",
        tokio_rustls::TlsConnector::from(cfg).connect(name, tcp),
    )
    .await
    .expect("TLS handshake through crossbar")
}

/// Send `request` on a fresh connection and read the answer until the server
/// closes (bounded by `limit`): the status code (`None` if closed without one).
pub async fn raw_request(
    addr: SocketAddr,
    request: &[u8],
    limit: Duration,
) -> (Option<u16>, String) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let (mut r, mut w) = s.split();
    let write = async {
        let _ = w.write_all(request).await; // ok: an early close is a valid answer
    };
    let read = async {
        let mut out = Vec::new();
        let _ = tokio::time::timeout(limit, r.read_to_end(&mut out)).await; // ok: partial
        out
    };
    let ((), out) = tokio::join!(write, read);
    let text = String::from_utf8_lossy(&out).into_owned();
    (status_of(&text), text)
}

/// The status code of a raw HTTP/1.1 answer (`None` if it is not one).
pub fn status_of(text: &str) -> Option<u16> {
    text.strip_prefix("HTTP/1.1 ")
        .and_then(|t| t.get(..3))
        .and_then(|c| c.parse().ok())
}
