//! The kernel relay (`relay: kernel`): a BPF stream verdict program on a SOCKHASH
//! forwards each socket's bytes to its peer inside the kernel (bpf/relay.bpf.c).
//!
//! Both sockets go into the map when the relay starts. The program redirects a
//! direction only while user space holds none of its bytes and the bytes queued
//! for the peer stay under [`QUEUE_LIMIT`]; everything else it passes up, and
//! [`pump`] forwards it with read/write, in order. That one mechanism covers the
//! handshake (the server's direction is passed up until the watcher is done), a
//! sender faster than its reader (past the limit, bytes are passed up and wait in
//! the source socket's receive buffer, so memory stays bounded and TCP flow control
//! stops the sender), and sockets that can't join the map (a half-closed socket is
//! refused by the kernel: that connection is copied in user space). Once user space
//! has forwarded every passed byte, the kernel takes over again: a bulk sender that
//! outruns the kernel's queue is mostly copied, at about splice's speed, while
//! request/response traffic stays in the kernel. A FIN still reaches user space
//! (read returns 0): the pump waits until every redirected byte is in the peer
//! socket, then half-closes it.
//! Byte counts come from the BPF program's per-direction counters.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use aya::maps::{HashMap as BpfHashMap, MapData, SockHash};
use aya::programs::SkSkb;
use aya::Ebpf;
use prometheus::{IntCounter, IntCounterVec, Opts, Registry};
use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use super::ending::{self, Abort, Ending, Peer};
use super::{
    abort_goes_to, drive, ending_of, Activity, RelayCounters, RelayEnd, RelayStats, Side, Watch,
    BUF_SIZE,
};

/// The compiled program (bpf/build.sh; tests/kernel_relay.rs checks it matches the source).
static OBJECT: &[u8] = aya::include_bytes_aligned!("../../bpf/relay.bpf.o");
/// Sockets the BPF maps hold (`MAX_SOCKETS` in bpf/relay.bpf.c): two per connection.
const MAX_SOCKETS: usize = 65_536;
/// Bytes redirected to a peer but not yet in its socket (waiting in the kernel's
/// psock queue, which has no bound of its own), per direction, before the program
/// passes bytes up instead: a reader that keeps up leaves the queue near empty,
/// while one that stops costs at most this plus the two sockets' own buffers.
const QUEUE_LIMIT: u64 = 4 << 20;
/// Most bytes user space reads at once from what the program passed up: a sender
/// that outruns the kernel's queue is copied in chunks this large (measured on
/// loopback: 11.7 Gbit/s with 1 MiB chunks), and the buffer is freed whenever user
/// space has caught up, so an idle connection holds none.
const READ_MAX: usize = 1 << 20;
/// First and longest pause between checks that redirected bytes have reached the
/// peer socket (the kernel gives no event for that; only a slow reader's connection
/// or a half-close waits here).
const DRAIN_POLL_FIRST: Duration = Duration::from_millis(1);
const DRAIN_POLL_MAX: Duration = Duration::from_millis(20);
/// `tcpi_state` values of a socket that can still send (include/net/tcp_states.h).
const TCP_ESTABLISHED: u8 = 1;
const TCP_CLOSE_WAIT: u8 = 8;
/// How often a long transfer's byte counts reach the metrics (and idleness is checked).
const METRICS_TICK: Duration = Duration::from_secs(10);

/// Why the kernel relay is not available.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// Parsing or loading the object failed (no privilege, old kernel, seccomp).
    #[error("loading the BPF object: {0}")]
    Load(#[from] aya::EbpfError),
    /// The program was refused by the verifier or could not be attached.
    #[error("loading the verdict program: {0}")]
    Program(#[from] aya::programs::ProgramError),
    /// A map is missing or has the wrong shape.
    #[error("BPF map: {0}")]
    Map(#[from] aya::maps::MapError),
    /// The object lacks a map or program crossbar expects.
    #[error("the BPF object has no `{0}`")]
    Missing(&'static str),
}

/// A socket's 4-tuple as the verdict program sees it (`struct tuple` in the C source).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Tuple {
    family: u32,
    local_ip: [u32; 4],
    remote_ip: [u32; 4],
    local_port: u32,
    remote_port: u32,
}

/// What the program counted for one direction (`struct flow`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct Flow {
    redirected: u64,
    passed: u64,
    queued: i64,
}

/// What user space tells the program about one direction (`struct ctl`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct Ctl {
    base: u64,
    consumed: u64,
    limit: u64,
}

// SAFETY: plain `repr(C)` integers without padding, valid for any bit pattern.
unsafe impl aya::Pod for Tuple {}
// SAFETY: as above.
unsafe impl aya::Pod for Flow {}
// SAFETY: as above.
unsafe impl aya::Pod for Ctl {}

/// The loaded program and its maps (one per process; dropped only at exit).
pub struct KernelRelay {
    /// Keeps the program loaded and attached.
    _ebpf: Ebpf,
    peers: Mutex<SockHash<MapData, Tuple>>,
    flows: Mutex<BpfHashMap<MapData, Tuple, Flow>>,
    ctls: Mutex<BpfHashMap<MapData, Tuple, Ctl>>,
    /// Connections currently in the maps (each holds two entries of each map).
    active: AtomicUsize,
}

static KERNEL: OnceLock<Result<KernelRelay, String>> = OnceLock::new();

/// Process-wide counters of the kernel relay (exported by [`register_metrics`]).
struct KernelMetrics {
    /// `crossbar_kernel_relay_bytes_total{path}`.
    bytes: IntCounterVec,
    /// `crossbar_kernel_relay_fallbacks_total`.
    fallbacks: IntCounter,
    /// `crossbar_kernel_relay_integrity_errors_total`.
    integrity_errors: IntCounter,
}

fn metrics() -> &'static KernelMetrics {
    static M: OnceLock<KernelMetrics> = OnceLock::new();
    M.get_or_init(|| {
        let bytes = IntCounterVec::new(
            Opts::new(
                "crossbar_kernel_relay_bytes_total",
                "Bytes kernel-relayed connections moved, by path: kernel (redirected by \
                 the BPF program) or user (passed up and copied by crossbar), counted \
                 when each connection ends.",
            ),
            &["path"],
        )
        .expect("static metric definition"); // ok: static
        for path in ["kernel", "user"] {
            bytes.with_label_values(&[path]);
        }
        let fallbacks = IntCounter::new(
            "crossbar_kernel_relay_fallbacks_total",
            "Times a kernel-relayed direction's destination fell behind by the queue \
             cap, so the BPF program passed bytes up and crossbar copied them until \
             it had caught up (then the kernel took over again).",
        )
        .expect("static metric definition"); // ok: static
        let integrity_errors = IntCounter::new(
            "crossbar_kernel_relay_integrity_errors_total",
            "Kernel-relayed directions whose BPF program saw more bytes than TCP \
             received on the source socket (the kernel delivered data twice): \
             crossbar reset both peers instead of ending the stream cleanly.",
        )
        .expect("static metric definition"); // ok: static
        KernelMetrics {
            bytes,
            fallbacks,
            integrity_errors,
        }
    })
}

/// Add the kernel relay's process-wide counters to a registry (every registry
/// shares them: they count for the whole process).
pub fn register_metrics(r: &Registry) {
    let m = metrics();
    for c in [
        Box::new(m.bytes.clone()) as Box<dyn prometheus::core::Collector>,
        Box::new(m.fallbacks.clone()),
        Box::new(m.integrity_errors.clone()),
    ] {
        if let Err(e) = r.register(c) {
            tracing::warn!("kernel relay metrics: {e}");
        }
    }
}

/// Bytes the kernel (not user space) moved for all kernel-relayed connections that
/// have ended, since start: tells operators and tests the BPF path carries the data.
pub fn redirected_total() -> u64 {
    metrics().bytes.with_label_values(&["kernel"]).get()
}

/// Bytes user space copied for kernel-relayed connections that have ended.
pub fn copied_total() -> u64 {
    metrics().bytes.with_label_values(&["user"]).get()
}

/// The kernel relay, loading it on first use; `Err` says why it can't be used (the
/// reason is logged once, on the first call).
pub fn get() -> Result<&'static KernelRelay, &'static str> {
    KERNEL
        .get_or_init(|| {
            let r = load().map_err(|e| e.to_string());
            match &r {
                Ok(_) => tracing::info!("kernel relay (BPF sockmap) loaded"),
                Err(why) => {
                    tracing::warn!("kernel relay unavailable, using splice instead: {why}")
                }
            }
            r
        })
        .as_ref()
        .map_err(String::as_str)
}

fn load() -> Result<KernelRelay, KernelError> {
    let mut ebpf = Ebpf::load(OBJECT)?;
    let peers: SockHash<MapData, Tuple> = ebpf
        .take_map("peers")
        .ok_or(KernelError::Missing("peers"))?
        .try_into()?;
    let flows = ebpf
        .take_map("flows")
        .ok_or(KernelError::Missing("flows"))?
        .try_into()?;
    let ctls = ebpf
        .take_map("ctls")
        .ok_or(KernelError::Missing("ctls"))?
        .try_into()?;
    let prog: &mut SkSkb = ebpf
        .program_mut("relay_verdict")
        .ok_or(KernelError::Missing("relay_verdict"))?
        .try_into()?;
    prog.load()?;
    prog.attach(peers.fd())?;
    Ok(KernelRelay {
        _ebpf: ebpf,
        peers: Mutex::new(peers),
        flows: Mutex::new(flows),
        ctls: Mutex::new(ctls),
        active: AtomicUsize::new(0),
    })
}

/// Lock a map, surviving a poisoned lock (the maps hold no invariant a panic breaks).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn tuple_of(s: &TcpStream) -> io::Result<Tuple> {
    let (local, remote) = (s.local_addr()?, s.peer_addr()?);
    let words = |ip: std::net::IpAddr| -> [u32; 4] {
        match ip {
            std::net::IpAddr::V4(v4) => [u32::from_ne_bytes(v4.octets()), 0, 0, 0],
            std::net::IpAddr::V6(v6) => {
                let o = v6.octets();
                let w = |i: usize| u32::from_ne_bytes([o[i], o[i + 1], o[i + 2], o[i + 3]]);
                [w(0), w(4), w(8), w(12)]
            }
        }
    };
    let family = if local.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    Ok(Tuple {
        family: family as u32,
        local_ip: words(local.ip()),
        remote_ip: words(remote.ip()),
        local_port: local.port().into(),
        remote_port: remote.port().into(),
    })
}

/// The socket's `TCP_INFO`.
fn tcp_info(fd: RawFd) -> io::Result<libc::tcp_info> {
    // SAFETY: an all-zero tcp_info is valid; getsockopt writes at most `len` bytes.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: fd is a TCP socket the caller keeps open; info/len are ours.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(info)
}

/// Bytes ever written into a socket (acknowledged + still queued), or an error if
/// the socket can no longer send.
fn written(fd: RawFd) -> io::Result<u64> {
    let info = tcp_info(fd)?;
    if ![TCP_ESTABLISHED, TCP_CLOSE_WAIT].contains(&info.tcpi_state) {
        return Err(io::ErrorKind::ConnectionReset.into());
    }
    let mut queued: libc::c_int = 0;
    // SAFETY: SIOCOUTQ (TIOCOUTQ) writes one int: the bytes not yet acknowledged.
    if unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut queued) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(info.tcpi_bytes_acked + u64::try_from(queued).unwrap_or(0))
}

/// What the verdict program may see of a socket's incoming stream from now on:
/// TCP's count of bytes received so far (`tcpi_bytes_received`, which also counts a
/// FIN as one) minus the bytes still unread (SIOCINQ, read second: a byte arriving
/// in between makes the bound looser, never tighter).
fn unseen_base(fd: RawFd) -> io::Result<u64> {
    let received = tcp_info(fd)?.tcpi_bytes_received;
    let mut unread: libc::c_int = 0;
    // SAFETY: SIOCINQ (FIONREAD) writes one int: the bytes not yet read.
    if unsafe { libc::ioctl(fd, libc::FIONREAD, &mut unread) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(received.saturating_sub(u64::try_from(unread).unwrap_or(0)))
}

/// Nudge a socket's data-ready callback so bytes queued before it joined the map go
/// through the verdict program now (SO_RCVLOWAT's setter re-checks readability).
fn kick(fd: RawFd) {
    let one: libc::c_int = 1;
    // SAFETY: setsockopt reads one int we own from a socket the caller keeps open.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        tracing::debug!("SO_RCVLOWAT kick: {}", io::Error::last_os_error());
    }
}

/// `recv(2)` into `buf` without blocking.
fn recv(s: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    s.try_io(Interest::READABLE, || {
        // SAFETY: recv writes at most buf.len() bytes into `buf` (ours) from a socket
        // the caller keeps open.
        let n = unsafe { libc::recv(s.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    })
}

/// One direction's keys and state; `src` is the socket bytes come from.
struct Dir<'k> {
    k: &'k KernelRelay,
    /// The source socket's tuple: the key of this direction in every map.
    key: Tuple,
    ctl: Ctl,
    /// Whether this direction's entries are in the maps at all.
    mapped: bool,
    /// A `redirected` count known to be all in the peer socket (it only grows, and
    /// stays put while user space holds passed bytes).
    drained_at: u64,
    /// Both sockets are in the map: with `ctl.limit` set the kernel may redirect
    /// this direction, and bytes passed up then mean the peer's queue is full.
    joined: bool,
    /// The source's `tcpi_bytes_received` less its unread bytes when it joined
    /// ([`unseen_base`]): the program can see at most what TCP received since.
    unseen_base: u64,
}

impl<'k> Dir<'k> {
    /// A direction in the maps: `base` bytes were written to its destination before
    /// the relay; the program may redirect once `limit` is non-zero.
    fn new(k: &'k KernelRelay, key: Tuple, base: u64, limit: u64) -> Self {
        Dir {
            k,
            key,
            ctl: Ctl {
                base,
                consumed: 0,
                limit,
            },
            mapped: true,
            drained_at: 0,
            joined: false,
            unseen_base: 0,
        }
    }

    fn flow(&self) -> Flow {
        if !self.mapped {
            return Flow::default();
        }
        lock(&self.k.flows).get(&self.key, 0).unwrap_or_default()
    }

    /// Bytes moved so far (by the kernel and by user space).
    fn moved(&self) -> u64 {
        self.flow().redirected + self.ctl.consumed
    }

    fn publish(&mut self) -> io::Result<()> {
        if !self.mapped {
            return Ok(());
        }
        lock(&self.k.ctls)
            .insert(self.key, self.ctl, 0)
            .map_err(io::Error::other)
    }

    /// Bytes the program passed up that user space has not forwarded yet.
    fn held(&self) -> u64 {
        self.flow().passed.saturating_sub(self.ctl.consumed)
    }

    /// Let the kernel redirect this direction from now on.
    fn enable(&mut self) -> io::Result<()> {
        self.ctl.limit = QUEUE_LIMIT;
        self.publish()
    }

    /// Whether the kernel may redirect this direction now (so bytes passed up
    /// mean the peer's queue is full, not that the handshake is still watched).
    fn in_kernel(&self) -> bool {
        self.joined && self.ctl.limit != 0
    }

    /// Check that the program saw no more bytes than TCP received on `src` since it
    /// joined the map. On kernel 6.18 the stream verdict path was measured to hand
    /// the program a 64 KiB segment twice now and then (docs/performance.md): the
    /// copy reached the destination, so the stream must not end as if complete.
    fn intact(&self, src: &TcpStream) -> io::Result<()> {
        if !self.joined {
            return Ok(());
        }
        // The program's count first: TCP's can only have grown by the time it is read.
        let f = self.flow();
        let seen = f.redirected + f.passed;
        let received = match tcp_info(src.as_raw_fd()) {
            Ok(info) => info.tcpi_bytes_received.saturating_sub(self.unseen_base),
            Err(e) => {
                tracing::debug!("kernel relay: reading TCP_INFO for the integrity check: {e}");
                return Ok(());
            }
        };
        if seen <= received {
            return Ok(());
        }
        metrics().integrity_errors.inc();
        let e = io::Error::other(format!(
            "kernel relay integrity: the kernel handed on {seen} bytes but TCP received \
             {received}: {} bytes were delivered twice; resetting the connection",
            seen - received
        ));
        tracing::error!("{e}");
        Err(e)
    }

    /// Wait until every byte the kernel redirected is in `dst` (so what user space
    /// writes next, or a FIN, comes after it).
    async fn drained(&mut self, dst: &TcpStream) -> io::Result<()> {
        let mut pause = DRAIN_POLL_FIRST;
        loop {
            let redirected = self.flow().redirected;
            if redirected == self.drained_at {
                return Ok(());
            }
            if written(dst.as_raw_fd())? >= self.ctl.base + self.ctl.consumed + redirected {
                self.drained_at = redirected;
                return Ok(());
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(DRAIN_POLL_MAX);
        }
    }
}

/// The map entries of one connection; removed on drop, whatever ended it.
struct Entries<'k> {
    k: &'k KernelRelay,
    keys: [Tuple; 2],
    peers_in: [bool; 2],
}

impl Drop for Entries<'_> {
    fn drop(&mut self) {
        for (key, peer_in) in self.keys.iter().zip(self.peers_in) {
            if peer_in {
                if let Err(e) = lock(&self.k.peers).remove(key) {
                    tracing::debug!("kernel relay: removing a socket: {e}");
                }
            }
            // Absent entries (never inserted) are fine to miss.
            let _ = lock(&self.k.flows).remove(key);
            let _ = lock(&self.k.ctls).remove(key);
        }
        self.k.active.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Put a connection into the maps: `c`/`s` are the client and backend sockets;
/// `watched`: the server's bytes go to the handshake watcher first, so that
/// direction starts passed up. Returns the two directions (client->server,
/// server->client) and the guard.
fn enter<'k>(
    k: &'k KernelRelay,
    c: &TcpStream,
    s: &TcpStream,
    watched: bool,
) -> io::Result<(Dir<'k>, Dir<'k>, Entries<'k>)> {
    let (kc, ks) = (tuple_of(c)?, tuple_of(s)?);
    if k.active.fetch_add(1, Ordering::Relaxed) * 2 + 2 > MAX_SOCKETS {
        k.active.fetch_sub(1, Ordering::Relaxed);
        return Err(io::Error::other("kernel relay maps full"));
    }
    let mut entries = Entries {
        k,
        keys: [kc, ks],
        peers_in: [false; 2],
    };
    let mut c2s = Dir::new(k, kc, written(s.as_raw_fd())?, QUEUE_LIMIT);
    let s2c_limit = if watched { 0 } else { QUEUE_LIMIT };
    let mut s2c = Dir::new(k, ks, written(c.as_raw_fd())?, s2c_limit);
    // Limits first: bytes that arrived before the sockets joined the map go through
    // the program at the kick below, and are redirected at once.
    for d in [&mut c2s, &mut s2c] {
        lock(&k.flows)
            .insert(d.key, Flow::default(), 0)
            .map_err(io::Error::other)?;
        d.publish()?;
    }
    // What each source has received but not given to user space, before the program
    // can see any of it.
    let (c_base, s_base) = (unseen_base(c.as_raw_fd())?, unseen_base(s.as_raw_fd())?);
    // The client first: it is the one likely to have half-closed already, which the
    // kernel refuses; then nothing is in the map and the connection is copied.
    entries.peers_in[1] = lock(&k.peers).insert(ks, c.as_raw_fd(), 0).is_ok();
    if entries.peers_in[1] {
        entries.peers_in[0] = lock(&k.peers).insert(kc, s.as_raw_fd(), 0).is_ok();
    }
    let joined = entries.peers_in == [true, true];
    c2s.joined = joined;
    s2c.joined = joined;
    c2s.unseen_base = c_base;
    s2c.unseen_base = s_base;
    kick(c.as_raw_fd());
    kick(s.as_raw_fd());
    Ok((c2s, s2c, entries))
}

/// Forward what the program passed up from `src` to `dst` until `src`'s EOF, then
/// half-close `dst` once the kernel's bytes are all in it (unless the other
/// direction found an abort: then `dst` is to be reset, never half-closed).
async fn pump(
    src: &TcpStream,
    dst: &TcpStream,
    dir: &mut Dir<'_>,
    activity: &Activity,
    aborted: &AtomicBool,
    watch: Option<Box<Watch<'_>>>,
) -> Ending {
    let moved = forward(src, dst, dir, activity, watch).await;
    ending_of(moved, aborted, async { shutdown_write(dst) }).await
}

/// The passed-up bytes of one direction, until `src`'s EOF and the kernel's bytes
/// are all in `dst`. Each chunk is read, written to `dst` once the kernel's earlier
/// bytes are all in it, and then counted as consumed: until then the program sees
/// user space holding bytes and passes the sender's next bytes up too, in order.
async fn forward(
    src: &TcpStream,
    dst: &TcpStream,
    dir: &mut Dir<'_>,
    activity: &Activity,
    mut watch: Option<Box<Watch<'_>>>,
) -> Result<(), Side> {
    // Allocated when bytes come up, freed once user space has caught up.
    let mut buf: Vec<u8> = Vec::new();
    // Copying bytes the program passed up because the peer's queue was full.
    let mut fallen_back = false;
    // A long transfer the kernel carries gives user space no event: check its
    // integrity every METRICS_TICK too, so a damaged stream is cut within one.
    let check = tokio::time::sleep(METRICS_TICK);
    tokio::pin!(check);
    loop {
        tokio::select! {
            r = src.readable() => r.map_err(Side::Read)?,
            () = &mut check => {
                check.as_mut().reset(tokio::time::Instant::now() + METRICS_TICK);
                dir.intact(src).map_err(Side::Local)?;
                continue;
            }
        }
        let held = dir.held();
        if held > 0 && buf.is_empty() {
            let want = usize::try_from(held).unwrap_or(READ_MAX);
            buf = vec![0; want.clamp(BUF_SIZE, READ_MAX)];
        }
        // Nothing held: the wake-up is an EOF, a spurious one, or bytes passed up
        // since `held` was read; one byte tells which, without a buffer an idle
        // connection would then keep.
        let mut probe = [0u8; 1];
        let into: &mut [u8] = if buf.is_empty() { &mut probe } else { &mut buf };
        let n = match recv(src, into) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(Side::Read(e)),
        };
        let chunk: &[u8] = if buf.is_empty() {
            &probe[..n]
        } else {
            &buf[..n]
        };
        if n == 0 && held > 0 {
            // The psock's queue still holds passed bytes (it delivers them late when
            // the receive buffer is full): not the end yet.
            tokio::time::sleep(DRAIN_POLL_FIRST).await;
            continue;
        }
        if n > 0 && !fallen_back && dir.in_kernel() {
            fallen_back = true;
            metrics().fallbacks.inc();
        }
        dir.drained(dst).await.map_err(Side::Write)?;
        if n == 0 {
            dir.intact(src).map_err(Side::Local)?;
            if let Some(w) = watch.take() {
                (w.on_handshake)(w.watcher.info());
            }
            return Ok(());
        }
        write_all(dst, chunk).await.map_err(Side::Write)?;
        activity.touch();
        dir.ctl.consumed += n as u64;
        dir.publish().map_err(Side::Local)?;
        if let Some(w) = watch.as_mut() {
            if w.watcher.feed(chunk) {
                if let Some(w) = watch.take() {
                    (w.on_handshake)(w.watcher.info());
                }
                dir.enable().map_err(Side::Local)?;
            }
        }
        if n as u64 >= held {
            // Caught up with what had come up before this read.
            buf = Vec::new();
            fallen_back = false;
        }
    }
}

async fn write_all(dst: &TcpStream, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        dst.writable().await?;
        match dst.try_io(Interest::WRITABLE, || {
            // SAFETY: write(2) reads `data` (ours) into a socket the caller keeps open.
            let n = unsafe { libc::write(dst.as_raw_fd(), data.as_ptr().cast(), data.len()) };
            if n < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(n as usize)
            }
        }) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => data = &data[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn shutdown_write(s: &TcpStream) -> io::Result<()> {
    socket2::SockRef::from(s).shutdown(std::net::Shutdown::Write)
}

/// Relay `client` <-> `server` through the kernel; the same contract as
/// [`super::relay`]. Falls back to it when the connection can't be put in the maps.
pub async fn relay(
    k: &KernelRelay,
    client: &mut TcpStream,
    server: &mut TcpStream,
    idle: Duration,
    counters: &RelayCounters<'_>,
    watch: Option<Box<Watch<'_>>>,
    hard_stop: &CancellationToken,
) -> RelayStats {
    let watched = watch.is_some();
    let (mut c2s, mut s2c, entries) = match enter(k, client, server, watched) {
        Ok(v) => v,
        Err(e) => {
            tracing::debug!("kernel relay: {e}; using splice for this connection");
            return super::relay(client, server, idle, counters, watch, hard_stop).await;
        }
    };
    let stats = run(
        client, server, &mut c2s, &mut s2c, idle, counters, watch, hard_stop,
    )
    .await;
    drop(entries);
    stats
}

/// The relay proper: both pumps under the splice relay's [`drive`] (idle timer,
/// endings, hard stop), with a ticker that turns the kernel's byte counts into
/// activity and metrics; then the abort, if any, is passed on.
#[allow(clippy::too_many_arguments)]
async fn run<'k>(
    client: &TcpStream,
    server: &TcpStream,
    c2s: &mut Dir<'k>,
    s2c: &mut Dir<'k>,
    idle: Duration,
    counters: &RelayCounters<'_>,
    watch: Option<Box<Watch<'_>>>,
    hard_stop: &CancellationToken,
) -> RelayStats {
    let activity = Activity::new();
    let aborted = AtomicBool::new(false);
    let ticker = Ticker {
        k: c2s.k,
        keys: [(c2s.key, c2s.mapped), (s2c.key, s2c.mapped)],
        counters,
        reported: Mutex::new((0, 0)),
        activity: &activity,
    };
    let (end, abort) = {
        let up = pump(client, server, c2s, &activity, &aborted, None);
        let down = pump(server, client, s2c, &activity, &aborted, watch);
        tokio::pin!(up, down);
        let refresh = || ticker.sample();
        tokio::select! {
            r = drive(up, down, idle, &activity, &aborted, hard_stop, refresh) => r,
            never = ticker.run(idle) => match never {},
        }
    };
    if let Some(a) = abort {
        pass_on_abort(a, client, server, c2s, s2c, end, idle, hard_stop).await;
    }
    let (c2s_total, s2c_total) = (c2s.moved(), s2c.moved());
    let by_kernel = c2s.flow().redirected + s2c.flow().redirected;
    let m = metrics();
    m.bytes.with_label_values(&["kernel"]).inc_by(by_kernel);
    m.bytes
        .with_label_values(&["user"])
        .inc_by(c2s.ctl.consumed + s2c.ctl.consumed);
    let reported = *lock(&ticker.reported);
    counters.c2s.inc_by(c2s_total.saturating_sub(reported.0));
    counters.s2c.inc_by(s2c_total.saturating_sub(reported.1));
    RelayStats::new((c2s_total, s2c_total), end, abort)
}

/// As the splice relay does: a local failure resets both peers; a peer's abort
/// reaches the other peer as a reset once the aborting peer's bytes (the kernel's
/// included) are in its socket and acknowledged.
#[allow(clippy::too_many_arguments)]
async fn pass_on_abort<'k>(
    a: Abort,
    client: &TcpStream,
    server: &TcpStream,
    c2s: &mut Dir<'k>,
    s2c: &mut Dir<'k>,
    end: RelayEnd,
    idle: Duration,
    hard_stop: &CancellationToken,
) {
    let Some(to) = abort_goes_to(a, end, client, server) else {
        return;
    };
    let dir = match a.by {
        Peer::Client => c2s,
        Peer::Backend => s2c,
    };
    tokio::select! {
        r = dir.drained(to) => {
            if let Err(e) = r {
                tracing::debug!("kernel relay: waiting for the kernel's bytes: {e}");
            }
        }
        () = tokio::time::sleep(idle) => {}
        () = hard_stop.cancelled() => {}
    }
    ending::pass_on(to, idle, hard_stop).await;
}

/// Turns the kernel's per-direction counters into activity (for the idle timeout)
/// and metrics: at every idle check, and every [`METRICS_TICK`] (or a quarter of
/// the idle timeout, if shorter).
struct Ticker<'a> {
    k: &'a KernelRelay,
    keys: [(Tuple, bool); 2],
    counters: &'a RelayCounters<'a>,
    /// The redirected counts (per direction) already in the metrics and activity.
    reported: Mutex<(u64, u64)>,
    activity: &'a Activity,
}

/// The ticker's samples per idle timeout: crossbar notices kernel-moved bytes at
/// most this fraction of the timeout late (and the idle check samples first).
const SAMPLES_PER_IDLE: u32 = 4;

impl Ticker<'_> {
    fn redirected(&self, (key, mapped): (Tuple, bool)) -> u64 {
        if !mapped {
            return 0;
        }
        lock(&self.k.flows)
            .get(&key, 0)
            .map(|f| f.redirected)
            .unwrap_or(0)
    }

    /// If the kernel moved bytes since the last sample: count them and note activity
    /// now (the bytes moved at or before now, so the idle timeout never fires early).
    fn sample(&self) {
        let now = (self.redirected(self.keys[0]), self.redirected(self.keys[1]));
        let mut last = lock(&self.reported);
        if now.0 > last.0 || now.1 > last.1 {
            self.activity.touch();
            self.counters.c2s.inc_by(now.0.saturating_sub(last.0));
            self.counters.s2c.inc_by(now.1.saturating_sub(last.1));
            *last = (now.0.max(last.0), now.1.max(last.1));
        }
    }

    /// Never returns.
    async fn run(&self, idle: Duration) -> std::convert::Infallible {
        let period = (idle / SAMPLES_PER_IDLE)
            .min(METRICS_TICK)
            .max(Duration::from_millis(1));
        loop {
            tokio::time::sleep(period).await;
            self.sample();
        }
    }
}
