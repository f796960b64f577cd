//! Endings pass through as they happened: each way a backend or a client can end a
//! connection is run once against the backend directly and once through crossbar,
//! in `mode: tcp` and `mode: tls`, with sizes that take the copy path and the splice
//! path, and what the other peer saw must be the same (bytes, and EOF vs reset).
//! Then under load: backends abort random connections mid-transfer and every
//! aborted exchange must look aborted to its client, every other one intact.
#![allow(unsafe_code)] // two ioctls that read a socket's queue lengths

use std::collections::HashSet;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::ending::{read_all, seen, Seen};
use crate::common::*;
use crossbar::testbed::{self, BackendTls, TestCa};
use rstest::rstest;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Notify};

/// Bytes the backend echoes before it ends (copy path: no read fills the relay's
/// 16 KiB buffer).
const SMALL: usize = 1000;
/// The same for the splice path: reads fill the buffer and the direction turns bulk.
const LARGE: usize = 1 << 20;
/// The load test's exchange size, clients and exchanges per client.
const LOAD_SIZE: usize = 256 * 1024;
const LOAD_CLIENTS: u64 = 40;
const LOAD_ROUNDS: u64 = 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Tcp,
    Tls,
}

/// How the backend ends the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BackendEnd {
    /// Echo, then SO_LINGER 0 and close: a RST.
    Reset,
    /// Echo, then close() while upload bytes sit unread: the kernel sends a RST.
    CloseUnread,
    /// Echo, then a clean half-close; it keeps reading the upload to its end.
    Fin,
}

/// What one peer received and how its stream ended.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Observed {
    received: usize,
    sha: String,
    end: Seen,
}

impl Observed {
    fn of(data: &[u8], end: Seen) -> Observed {
        Observed {
            received: data.len(),
            sha: hex(&sha(data)),
            end,
        }
    }
}

/// Poll a socket's queue until `done` holds (bounded by [`WAIT`]).
async fn until_queue(what: &str, tcp: &TcpStream, request: libc::c_ulong, done: fn(i32) -> bool) {
    within(what, async {
        loop {
            let mut n: libc::c_int = 0;
            // SAFETY: the ioctl writes one c_int we own; the fd is borrowed, so open.
            let rc = unsafe { libc::ioctl(tcp.as_raw_fd(), request, &mut n) };
            assert_eq!(rc, 0, "ioctl: {}", std::io::Error::last_os_error());
            if done(n) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
}

/// Until the peer has acknowledged everything written (so a reset can't discard it).
async fn sent_and_acked(tcp: &TcpStream) {
    until_queue("send queue acknowledged", tcp, libc::TIOCOUTQ, |n| n == 0).await
}

/// Until bytes are waiting unread in the receive queue.
async fn unread_bytes_waiting(tcp: &TcpStream) {
    until_queue("unread bytes", tcp, libc::FIONREAD, |n| n > 0).await
}

fn set_reset_on_close(tcp: &TcpStream) {
    socket2::SockRef::from(tcp)
        .set_linger(Some(Duration::ZERO))
        .expect("SO_LINGER 0");
}

// ---------------------------------------------------------------------------
// A backend that ends connections in a chosen way.

/// Either side's stream, plain or TLS.
trait Stream: AsyncRead + AsyncWrite + Unpin + Send {
    fn tcp(&self) -> &TcpStream;
}

impl Stream for TcpStream {
    fn tcp(&self) -> &TcpStream {
        self
    }
}

impl Stream for tokio_rustls::server::TlsStream<TcpStream> {
    fn tcp(&self) -> &TcpStream {
        self.get_ref().0
    }
}

impl Stream for tokio_rustls::client::TlsStream<TcpStream> {
    fn tcp(&self) -> &TcpStream {
        self.get_ref().0
    }
}

/// What a test backend does with each connection.
#[derive(Clone, Copy)]
enum Script {
    /// Echo `len` bytes, then end as told.
    EchoThen(usize, BackendEnd),
    /// Read everything, and report what arrived and how it ended.
    Receive,
}

/// A backend on loopback running `script` on every connection and reporting what it
/// received. With a `gate`, it waits for the gate before ending.
struct TestBackend {
    addr: SocketAddr,
    reports: tokio::sync::Mutex<mpsc::UnboundedReceiver<Observed>>,
}

impl TestBackend {
    async fn start(
        mode: Mode,
        ca: &TestCa,
        script: Script,
        gate: Option<Arc<Notify>>,
    ) -> TestBackend {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let acceptor = (mode == Mode::Tls).then(|| {
            let cfg = testbed::server_config(ca, "backend", &[SNI], BackendTls::default())
                .expect("server config");
            tokio_rustls::TlsAcceptor::from(cfg)
        });
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, tx, gate) = (acceptor.clone(), tx.clone(), gate.clone());
                tokio::spawn(async move {
                    let report = match acceptor {
                        None => run_script(tcp, script, gate).await,
                        Some(a) => match a.accept(tcp).await {
                            Ok(tls) => run_script(tls, script, gate).await,
                            Err(e) => panic!("backend TLS handshake: {e}"),
                        },
                    };
                    let _ = tx.send(report); // ok: not every test reads reports
                });
            }
        });
        TestBackend {
            addr,
            reports: tokio::sync::Mutex::new(rx),
        }
    }

    async fn next_report(&self) -> Observed {
        within("a backend report", self.reports.lock().await.recv())
            .await
            .expect("backend reports")
    }
}

async fn run_script<S: Stream>(mut s: S, script: Script, gate: Option<Arc<Notify>>) -> Observed {
    let Script::EchoThen(len, end) = script else {
        let (got, read) = read_all(&mut s).await;
        return Observed::of(&got, seen(read, Ok(())));
    };
    let mut echoed = 0;
    let mut buf = vec![0u8; 64 * 1024];
    let mut got = Vec::new();
    while echoed < len {
        let want = buf.len().min(len - echoed);
        let n = s.read(&mut buf[..want]).await.expect("backend read");
        assert!(n > 0, "the client ended its upload early");
        s.write_all(&buf[..n]).await.expect("backend echo");
        s.flush().await.expect("backend flush");
        got.extend_from_slice(&buf[..n]);
        echoed += n;
    }
    if let Some(g) = gate {
        g.notified().await;
    }
    match end {
        BackendEnd::Reset => {
            sent_and_acked(s.tcp()).await;
            set_reset_on_close(s.tcp());
        }
        BackendEnd::CloseUnread => {
            sent_and_acked(s.tcp()).await;
            unread_bytes_waiting(s.tcp()).await;
        }
        BackendEnd::Fin => {
            s.shutdown().await.expect("backend half-close");
            let (rest, read) = read_all(&mut s).await;
            got.extend_from_slice(&rest);
            return Observed::of(&got, seen(read, Ok(())));
        }
    }
    drop(s);
    Observed::of(&got, Seen::Eof)
}

// ---------------------------------------------------------------------------
// Clients

async fn connect(mode: Mode, ca: &TestCa, addr: SocketAddr) -> Box<dyn StreamBox> {
    match mode {
        Mode::Tcp => Box::new(
            within("connect", TcpStream::connect(addr))
                .await
                .expect("connect"),
        ),
        Mode::Tls => Box::new(tls_connect(ca, addr).await),
    }
}

/// A boxed client stream.
trait StreamBox: Stream {}
impl<T: Stream> StreamBox for T {}

/// Upload `data` (then half-close) while reading everything that comes back.
async fn upload_and_read<S: AsyncRead + AsyncWrite + Unpin>(s: S, data: &[u8]) -> Observed {
    let (mut r, mut w) = tokio::io::split(s);
    let write = async {
        for chunk in data.chunks(64 * 1024) {
            w.write_all(chunk).await.map_err(|e| e.kind())?;
        }
        w.shutdown().await.map_err(|e| e.kind())
    };
    let read = read_all(&mut r);
    let (wrote, (got, read)) = within("the exchange", async { tokio::join!(write, read) }).await;
    Observed::of(&got, seen(read, wrote))
}

/// Write `data`, wait until it is acknowledged, then reset the connection.
async fn upload_then_reset(mut s: Box<dyn StreamBox>, data: &[u8]) {
    within("client upload", s.write_all(data))
        .await
        .expect("client write");
    within("client flush", s.flush())
        .await
        .expect("client flush");
    sent_and_acked(s.tcp()).await;
    set_reset_on_close(s.tcp());
    drop(s);
}

fn service_yaml(mode: Mode, backend: SocketAddr) -> String {
    let settings = match mode {
        Mode::Tcp => "    mode: tcp\n".to_string(),
        Mode::Tls => format!("    server_names: [\"{SNI}\"]\n"),
    };
    one_service(&settings, &[backend_line("b", backend, "")])
}

// ---------------------------------------------------------------------------
// Each ending, direct vs through crossbar

/// The backend echoes part of the upload and ends as told: the client must see the
/// same bytes and the same ending through crossbar as directly, and that ending is
/// the backend's (a reset stays a reset, a FIN stays a clean half-close).
#[rstest]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_ending_reaches_the_client_as_it_happened(
    #[values(Mode::Tcp, Mode::Tls)] mode: Mode,
    #[values(SMALL, LARGE)] echo: usize,
    #[values(BackendEnd::Reset, BackendEnd::CloseUnread, BackendEnd::Fin)] end: BackendEnd,
) {
    let ca = TestCa::new("endings CA").expect("CA");
    let backend = TestBackend::start(mode, &ca, Script::EchoThen(echo, end), None).await;
    let lb = Crossbar::start(&service_yaml(mode, backend.addr)).await;
    let upload = payload(echo * 2 + 100_000, echo as u64);

    let direct = upload_and_read(connect(mode, &ca, backend.addr).await, &upload).await;
    let direct_backend = backend.next_report().await;
    let through = upload_and_read(connect(mode, &ca, lb.addr("svc")).await, &upload).await;
    let through_backend = backend.next_report().await;

    let expected_end = match end {
        BackendEnd::Fin => Seen::Eof,
        BackendEnd::Reset | BackendEnd::CloseUnread => Seen::Reset,
    };
    assert_eq!(
        direct,
        Observed::of(&upload[..echo], expected_end),
        "direct"
    );
    assert_eq!(through, direct, "through crossbar vs direct");
    if end == BackendEnd::Fin {
        // The half-close went one way only: the upload still arrived whole.
        assert_eq!(direct_backend, Observed::of(&upload, Seen::Eof));
        assert_eq!(through_backend, direct_backend);
        assert_eq!(resets(&lb, "backend").await, 0.0);
    } else {
        assert_eq!(resets(&lb, "backend").await, 1.0);
    }
    assert_eq!(resets(&lb, "client").await, 0.0);
}

/// The client resets mid-upload: the backend must see the bytes sent before it and
/// then a reset, not a FIN, through crossbar as directly.
#[rstest]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_reset_reaches_the_backend_as_a_reset(
    #[values(Mode::Tcp, Mode::Tls)] mode: Mode,
    #[values(SMALL, LARGE)] len: usize,
) {
    let ca = TestCa::new("endings CA").expect("CA");
    let backend = TestBackend::start(mode, &ca, Script::Receive, None).await;
    let lb = Crossbar::start(&service_yaml(mode, backend.addr)).await;
    let upload = payload(len, len as u64 + 7);

    upload_then_reset(connect(mode, &ca, backend.addr).await, &upload).await;
    let direct = backend.next_report().await;
    upload_then_reset(connect(mode, &ca, lb.addr("svc")).await, &upload).await;
    let through = backend.next_report().await;

    assert_eq!(direct, Observed::of(&upload, Seen::Reset), "direct");
    assert_eq!(through, direct, "through crossbar vs direct");
    assert_eq!(resets(&lb, "client").await, 1.0);
    assert_eq!(resets(&lb, "backend").await, 0.0);
}

/// While crossbar drains (shutdown with a grace period), a backend's reset still
/// reaches the client as a reset, after its bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_during_drain_is_still_a_reset() {
    let ca = TestCa::new("endings CA").expect("CA");
    let gate = Arc::new(Notify::new());
    let script = Script::EchoThen(SMALL, BackendEnd::Reset);
    let backend = TestBackend::start(Mode::Tcp, &ca, script, Some(gate.clone())).await;
    let lb = Crossbar::start(&service_yaml(Mode::Tcp, backend.addr)).await;
    let upload = payload(SMALL * 2, 3);

    let client = connect(Mode::Tcp, &ca, lb.addr("svc")).await;
    let exchange = tokio::spawn({
        let upload = upload.clone();
        async move { upload_and_read(client, &upload).await }
    });
    wait_until("the connection is relayed", || lb.active("svc", "b") == 1).await;
    let server = lb.server.clone();
    let drain = tokio::spawn(async move { server.shutdown(WAIT).await });
    wait_until("crossbar drains", || lb.server.is_draining()).await;
    gate.notify_one();

    let seen = within("the exchange", exchange).await.expect("client task");
    assert_eq!(seen, Observed::of(&upload[..SMALL], Seen::Reset));
    within("the drain", drain).await.expect("drain task");
    assert_eq!(resets(&lb, "backend").await, 1.0);
}

/// A reload while a connection is relayed doesn't change how it ends: the
/// backend's reset still reaches the client as a reset, after its bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_after_reload_is_still_a_reset() {
    let ca = TestCa::new("endings CA").expect("CA");
    let gate = Arc::new(Notify::new());
    let script = Script::EchoThen(SMALL, BackendEnd::Reset);
    let backend = TestBackend::start(Mode::Tcp, &ca, script, Some(gate.clone())).await;
    let yaml = service_yaml(Mode::Tcp, backend.addr);
    let lb = Crossbar::start(&yaml).await;
    let upload = payload(SMALL * 2, 4);

    let client = connect(Mode::Tcp, &ca, lb.addr("svc")).await;
    let exchange = tokio::spawn({
        let upload = upload.clone();
        async move { upload_and_read(client, &upload).await }
    });
    wait_until("the connection is relayed", || lb.active("svc", "b") == 1).await;
    // A new config (another idle timeout) for new connections; this one keeps its own.
    lb.reload(&yaml.replace(
        "    mode: tcp\n",
        "    mode: tcp\n    timeouts: { idle: 10m }\n",
    ))
    .await;
    gate.notify_one();

    let seen = within("the exchange", exchange).await.expect("client task");
    assert_eq!(seen, Observed::of(&upload[..SMALL], Seen::Reset));
}

/// The access log names the side that aborted: `end=backend_reset` when the
/// backend reset, `end=client_reset` when the client did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_log_names_the_side_that_reset() {
    let log = LogBuffer::install();
    let ca = TestCa::new("endings CA").expect("CA");
    let script = Script::EchoThen(SMALL, BackendEnd::Reset);
    let resetting = TestBackend::start(Mode::Tcp, &ca, script, None).await;
    let lb = Crossbar::start(&service_yaml(Mode::Tcp, resetting.addr)).await;
    let client = connect(Mode::Tcp, &ca, lb.addr("svc")).await;
    let seen = upload_and_read(client, &payload(SMALL * 2, 5)).await;
    assert_eq!(seen.end, Seen::Reset);
    wait_until("end=backend_reset logged", || {
        log.contains("end=backend_reset")
    })
    .await;

    let receiving = TestBackend::start(Mode::Tcp, &ca, Script::Receive, None).await;
    let lb = Crossbar::start(&service_yaml(Mode::Tcp, receiving.addr)).await;
    upload_then_reset(
        connect(Mode::Tcp, &ca, lb.addr("svc")).await,
        &payload(SMALL, 6),
    )
    .await;
    assert_eq!(receiving.next_report().await.end, Seen::Reset);
    wait_until("end=client_reset logged", || {
        log.contains("end=client_reset")
    })
    .await;
}

/// crossbar's count of relayed connections `side` aborted, read once the service's
/// backend `b` holds no connection: the reset reaches the other peer inside the
/// relay and the connection is counted after it, so that peer can report before the
/// count moves (a CI run read 0 for a client reset the backend had already seen).
async fn resets(lb: &Crossbar, side: &str) -> f64 {
    wait_until("the relayed connections to end", || {
        lb.active("svc", "b") == 0
    })
    .await;
    let text = lb.server.metrics().encode();
    let labels = [("service", "svc"), ("side", side)];
    assert!(
        text.lines()
            .any(|l| l.starts_with("crossbar_connection_resets_total{")
                && l.contains(&format!("side=\"{side}\""))),
        "crossbar_connection_resets_total{{side={side}}} exists from the start"
    );
    metric_value(&text, "crossbar_connection_resets_total", &labels)
}

// ---------------------------------------------------------------------------
// Under load

/// Where (after how many bytes) the load backend aborts exchange `id`, if it does:
/// a third of them, at a random point.
fn abort_point(id: u64) -> Option<usize> {
    let mut rng = fastrand::Rng::with_seed(id);
    let abort = rng.u8(..3) == 0;
    let at = rng.usize(8..LOAD_SIZE);
    abort.then_some(at)
}

/// Echo every byte; for exchanges chosen by [`abort_point`], reset mid-transfer.
async fn load_backend(aborted: Arc<Mutex<HashSet<u64>>>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let aborted = aborted.clone();
            tokio::spawn(async move {
                let mut id = [0u8; 8];
                if s.read_exact(&mut id).await.is_err() || s.write_all(&id).await.is_err() {
                    return;
                }
                let id = u64::from_be_bytes(id);
                let stop = abort_point(id).unwrap_or(usize::MAX);
                let mut buf = vec![0u8; 32 * 1024];
                let mut echoed = 8;
                loop {
                    let want = buf.len().min(stop.saturating_sub(echoed));
                    if want == 0 {
                        aborted.lock().expect("set").insert(id);
                        set_reset_on_close(&s);
                        return;
                    }
                    match s.read(&mut buf[..want]).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) if s.write_all(&buf[..n]).await.is_ok() => echoed += n,
                        Ok(_) => break,
                    }
                }
                let _ = s.shutdown().await; // ok: the client's view is what's checked
            });
        }
    });
    addr
}

/// 40 clients exchange 256 KiB echoes while the backend resets some mid-transfer:
/// every aborted exchange ends in a reset for its client, none ends in a clean EOF
/// with bytes missing, and every other one comes back whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aborts_under_load_are_seen_as_resets() {
    let aborted = Arc::new(Mutex::new(HashSet::new()));
    let backend = load_backend(aborted.clone()).await;
    let lb = Crossbar::start(&service_yaml(Mode::Tcp, backend)).await;
    let addr = lb.addr("svc");
    let mut clients = Vec::new();
    for c in 0..LOAD_CLIENTS {
        clients.push(tokio::spawn(async move {
            let mut outcomes = Vec::new();
            for round in 0..LOAD_ROUNDS {
                let id = c * LOAD_ROUNDS + round;
                let mut data = payload(LOAD_SIZE, id);
                data[..8].copy_from_slice(&id.to_be_bytes());
                let s = within("connect", TcpStream::connect(addr))
                    .await
                    .expect("connect");
                let (mut r, mut w) = s.into_split();
                let write = async {
                    w.write_all(&data).await.map_err(|e| e.kind())?;
                    w.shutdown().await.map_err(|e| e.kind())
                };
                let (wrote, (got, read)) = within("an exchange", async {
                    tokio::join!(write, read_all(&mut r))
                })
                .await;
                assert!(got == data[..got.len()], "exchange {id}: bytes differ");
                outcomes.push((id, got.len(), seen(read, wrote)));
            }
            outcomes
        }));
    }
    let mut results = Vec::new();
    for c in clients {
        results.extend(within("a client", c).await.expect("client task"));
    }
    let aborted = aborted.lock().expect("set").clone();
    let truncated_eof = results
        .iter()
        .filter(|(_, len, end)| *end == Seen::Eof && *len < LOAD_SIZE)
        .count();
    assert_eq!(
        truncated_eof, 0,
        "clean EOFs with bytes missing: {results:?}"
    );
    for (id, len, end) in &results {
        if aborted.contains(id) {
            assert_eq!(
                *end,
                Seen::Reset,
                "exchange {id} was aborted ({len} bytes back)"
            );
        } else {
            assert_eq!((*len, *end), (LOAD_SIZE, Seen::Eof), "exchange {id} intact");
        }
    }
    println!(
        "{} exchanges of {LOAD_SIZE} bytes: {} aborted by the backend, all seen as resets; {} intact",
        results.len(),
        aborted.len(),
        results.len() - aborted.len()
    );
    assert!(
        !aborted.is_empty() && aborted.len() < results.len(),
        "a mix of endings"
    );
    assert_eq!(resets(&lb, "backend").await, aborted.len() as f64);
}
