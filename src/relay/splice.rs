//! Zero-copy relaying on Linux: splice(2) socket -> pipe -> socket, so payload bytes
//! never enter user space.
//!
//! A pipe is needed only while bytes are in flight: each direction takes one from a
//! per-thread pool when its source is readable, moves what is there, drains the pipe
//! completely into the destination, and gives it back. Idle connections (most Puppet
//! keep-alives) therefore hold no pipe and no kernel pipe pages; a slow reader holds
//! at most one pipe's capacity (256 KiB, see `PIPE_SIZE`) per direction, which is
//! the backpressure bound.
//!
//! Pipes cost file descriptors: up to [`PIPE_FDS_PER_CONNECTION`] per connection
//! while both directions move bytes, plus [`POOLED_FDS_PER_THREAD`] kept per worker
//! thread; the open-file budget (`system::fd_budget`) counts both. When no pipe can
//! be created (EMFILE/ENFILE), the bytes are copied through user space instead, so
//! the client is served a little slower rather than cut off.
#![allow(unsafe_code)]

use std::cell::RefCell;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::io::Interest;
use tokio::net::TcpStream;

use super::ending::Side;
use super::meter::Meter;

/// Capacity asked for each pipe (F_SETPIPE_SZ), and so the bytes one splice call
/// can move. Against the default 64 KiB, 256 KiB gave ~25% more single-stream
/// throughput for ~25% less CPU per GB (docs/performance.md); 1 MiB saved a little
/// more CPU but pins 4x the memory per bulk transfer in flight. If the kernel
/// refuses (pipe-max-size, a user's pipe page quota), the pipe keeps its size.
const PIPE_SIZE: usize = 256 * 1024;
/// `PIPE_SIZE`, or `CROSSBAR_PIPE_SIZE` (bytes) when set, read once: for
/// bench/bulk.sh to measure other sizes with one binary. The kernel rounds it up to a
/// power-of-two number of pages and caps it at fs.pipe-max-size.
fn pipe_size() -> usize {
    static SIZE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *SIZE.get_or_init(|| {
        std::env::var("CROSSBAR_PIPE_SIZE")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|&n| n > 0)
            .unwrap_or(PIPE_SIZE)
    })
}
/// Empty pipes kept per worker thread for reuse; beyond that they are closed.
const POOL_PER_THREAD: usize = 64;
/// Descriptors a connection's pipes hold at most: one pipe (2 fds) per direction.
pub(crate) const PIPE_FDS_PER_CONNECTION: u64 = 4;
/// Descriptors the pool of one worker thread can keep open.
pub(crate) const POOLED_FDS_PER_THREAD: u64 = 2 * POOL_PER_THREAD as u64;
/// Bytes copied per read while no pipe can be created (a buffer allocated only then).
const FALLBACK_CHUNK: usize = 64 * 1024;

/// A pipe pair, both ends non-blocking.
pub(super) struct Pipe {
    r: OwnedFd,
    w: OwnedFd,
    /// Its capacity in bytes.
    size: usize,
}

impl Pipe {
    fn new() -> io::Result<Pipe> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: pipe2 writes two fds into the 2-element array we own.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: pipe2 succeeded, so both fds are open and owned by nobody else.
        let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let want = libc::c_int::try_from(pipe_size()).unwrap_or(libc::c_int::MAX);
        // SAFETY: fcntl on a pipe fd we own; F_SETPIPE_SZ returns the new capacity.
        let set = unsafe { libc::fcntl(w.as_raw_fd(), libc::F_SETPIPE_SZ, want) };
        // SAFETY: as above; F_GETPIPE_SZ only reads the capacity.
        let got = if set > 0 {
            set
        } else {
            unsafe { libc::fcntl(w.as_raw_fd(), libc::F_GETPIPE_SZ) }
        };
        // The default capacity (16 pages) if even asking fails.
        let size = usize::try_from(got)
            .ok()
            .filter(|&n| n > 0)
            .unwrap_or(64 * 1024);
        Ok(Pipe { r, w, size })
    }
}

thread_local! {
    static POOL: RefCell<Vec<Pipe>> = const { RefCell::new(Vec::new()) };
}

/// An empty pipe from this thread's pool (or a new one); returned on drop if still empty.
struct Lent {
    pipe: Option<Pipe>,
    in_pipe: usize,
}

impl Lent {
    fn take() -> io::Result<Lent> {
        let pipe = match POOL.with(|p| p.borrow_mut().pop()) {
            Some(p) => p,
            None => Pipe::new()?,
        };
        Ok(Lent {
            pipe: Some(pipe),
            in_pipe: 0,
        })
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        // A pipe with bytes left in it (an error cut the drain) is closed, never reused.
        if let (Some(p), 0) = (self.pipe.take(), self.in_pipe) {
            POOL.with(|pool| {
                let mut pool = pool.borrow_mut();
                if pool.len() < POOL_PER_THREAD {
                    pool.push(p);
                }
            });
        }
    }
}

fn splice(from: RawFd, to: RawFd, len: usize) -> io::Result<usize> {
    // SAFETY: splice only reads/writes the kernel objects behind the two fds, which
    // the caller keeps open for the duration of the call; null offsets = fd positions.
    let n = unsafe {
        libc::splice(
            from,
            std::ptr::null_mut(),
            to,
            std::ptr::null_mut(),
            len,
            libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Zero-copy is used unless `CROSSBAR_NO_SPLICE=1` is set (to compare, or to rule
/// splice out when diagnosing). TCP sockets on Linux >= 2.6.17 always support it.
pub(super) fn supported() -> bool {
    !matches!(std::env::var("CROSSBAR_NO_SPLICE").as_deref(), Ok("1"))
}

/// Move bytes `src` -> `dst` with splice until `src` reaches EOF (the caller then
/// half-closes `dst`). Errors say which side failed.
///
/// Filling and draining take turns. Overlapping them (reading into the pipe's free
/// room while the destination drains it) was measured and brought nothing on this
/// 2-core loopback: 1.02x the bytes of one stream for 1.10x the CPU per GB
/// (docs/performance.md, "Scale curves and bulk").
pub(super) async fn pump(src: &TcpStream, dst: &TcpStream, meter: &Meter<'_>) -> Result<(), Side> {
    loop {
        src.readable().await.map_err(Side::Read)?;
        let mut lent = match Lent::take() {
            Ok(lent) => lent,
            Err(e) if is_fd_exhaustion(&e) => {
                note_fallback(&e);
                match copy_chunk(src, dst, meter).await? {
                    0 => return Ok(()),
                    n => {
                        meter.count(n);
                        continue;
                    }
                }
            }
            Err(e) => return Err(Side::Local(e)),
        };
        let (pr, pw, size) = match &lent.pipe {
            Some(p) => (p.r.as_raw_fd(), p.w.as_raw_fd(), p.size),
            None => return Err(Side::Local(io::Error::other("pipe pool"))),
        };
        let n = match src.try_io(Interest::READABLE, || splice(src.as_raw_fd(), pw, size)) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(Side::Read(e)),
        };
        lent.in_pipe = n;
        meter.touch();
        while lent.in_pipe > 0 {
            dst.writable().await.map_err(Side::Write)?;
            match dst.try_io(Interest::WRITABLE, || {
                splice(pr, dst.as_raw_fd(), lent.in_pipe)
            }) {
                Ok(m) => lent.in_pipe -= m,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(Side::Write(e)),
            }
        }
        meter.count(n);
    }
}

/// Out of file descriptors, for the process (EMFILE) or the system (ENFILE).
fn is_fd_exhaustion(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE))
}

/// Say once per process, loudly, that pipes ran out (then at debug level: this can
/// happen on every read while the limit is reached).
fn note_fallback(e: &io::Error) {
    static WARNED: AtomicBool = AtomicBool::new(false);
    if WARNED.swap(true, Ordering::Relaxed) {
        tracing::debug!("no pipe for splice ({e}): copying instead");
    } else {
        tracing::warn!(
            "no pipe for splice ({e}): copying instead; raise the open-file limit (LimitNOFILE)"
        );
    }
}

/// One read from `src` and all of it written to `dst`, through a temporary buffer:
/// the path when no pipe can be had. The bytes moved; 0 at EOF.
async fn copy_chunk(src: &TcpStream, dst: &TcpStream, meter: &Meter<'_>) -> Result<usize, Side> {
    let mut buf = vec![0u8; FALLBACK_CHUNK];
    let n = loop {
        src.readable().await.map_err(Side::Read)?;
        match src.try_read(&mut buf) {
            Ok(n) => break n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(Side::Read(e)),
        }
    };
    if n == 0 {
        return Ok(0);
    }
    meter.touch();
    let mut written = 0;
    while written < n {
        dst.writable().await.map_err(Side::Write)?;
        match dst.try_write(&buf[written..n]) {
            Ok(m) => written += m,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(Side::Write(e)),
        }
    }
    Ok(n)
}
