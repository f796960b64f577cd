//! Zero-copy relaying on Linux: splice(2) socket -> pipe -> socket, so payload bytes
//! never enter user space.
//!
//! A pipe is needed only while bytes are in flight: each direction takes one from a
//! per-thread pool when its source is readable, moves what is there, drains the pipe
//! completely into the destination, and gives it back. Idle connections (most Puppet
//! keep-alives) therefore hold no pipe and no kernel pipe pages; a slow reader holds
//! at most one pipe's capacity (64 KiB) per direction, which is the backpressure bound.
#![allow(unsafe_code)]

use std::cell::RefCell;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus::IntCounter;
use tokio::io::Interest;
use tokio::net::TcpStream;

use super::{Activity, Side};

/// Bytes asked for per splice call: the default pipe capacity (16 pages).
const SPLICE_CHUNK: usize = 64 * 1024;
/// Empty pipes kept per worker thread for reuse; beyond that they are closed.
const POOL_PER_THREAD: usize = 64;

/// A pipe pair, both ends non-blocking.
pub(super) struct Pipe {
    r: OwnedFd,
    w: OwnedFd,
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
        Ok(Pipe { r, w })
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
pub(super) async fn pump(
    src: &TcpStream,
    dst: &TcpStream,
    counter: &IntCounter,
    total: &AtomicU64,
    activity: &Activity,
) -> Result<(), Side> {
    loop {
        src.readable().await.map_err(Side::Read)?;
        let mut lent = Lent::take().map_err(Side::Read)?;
        let (pr, pw) = match &lent.pipe {
            Some(p) => (p.r.as_raw_fd(), p.w.as_raw_fd()),
            None => return Err(Side::Read(io::Error::other("pipe pool"))),
        };
        let n = match src.try_io(Interest::READABLE, || {
            splice(src.as_raw_fd(), pw, SPLICE_CHUNK)
        }) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(Side::Read(e)),
        };
        lent.in_pipe = n;
        activity.touch();
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
        counter.inc_by(n as u64);
        total.fetch_add(n as u64, Ordering::Relaxed);
    }
}
