//! The few socket syscalls both engines share: addresses, listeners, backend sockets.

use std::io;
use std::mem;
use std::net::SocketAddr;
use std::os::fd::RawFd;

/// Listen backlog: as deep as crossbar's and HAProxy's in the bench, so a burst of
/// new connections never waits on the accept queue of one proxy only.
const BACKLOG: libc::c_int = 4096;

/// A socket address in the form the kernel takes it, built once per backend at
/// startup so no connect converts or allocates anything.
pub struct SockAddr {
    storage: libc::sockaddr_storage,
    len: libc::socklen_t,
}

impl SockAddr {
    /// Converts a std address into a `sockaddr_in` or `sockaddr_in6`.
    pub fn new(addr: SocketAddr) -> SockAddr {
        // SAFETY: sockaddr_storage is plain data; all zeroes is a valid value.
        let mut storage: libc::sockaddr_storage = unsafe { mem::zeroed() };
        let len = match addr {
            SocketAddr::V4(a) => {
                let sin = libc::sockaddr_in {
                    sin_family: libc::AF_INET as libc::sa_family_t,
                    sin_port: a.port().to_be(),
                    sin_addr: libc::in_addr {
                        s_addr: u32::from_ne_bytes(a.ip().octets()),
                    },
                    sin_zero: [0; 8],
                };
                // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
                unsafe { (&mut storage as *mut _ as *mut libc::sockaddr_in).write(sin) };
                mem::size_of::<libc::sockaddr_in>()
            }
            SocketAddr::V6(a) => {
                let sin6 = libc::sockaddr_in6 {
                    sin6_family: libc::AF_INET6 as libc::sa_family_t,
                    sin6_port: a.port().to_be(),
                    sin6_flowinfo: a.flowinfo(),
                    sin6_addr: libc::in6_addr {
                        s6_addr: a.ip().octets(),
                    },
                    sin6_scope_id: a.scope_id(),
                };
                // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
                unsafe { (&mut storage as *mut _ as *mut libc::sockaddr_in6).write(sin6) };
                mem::size_of::<libc::sockaddr_in6>()
            }
        };
        SockAddr {
            storage,
            len: len as libc::socklen_t,
        }
    }

    /// The address family (AF_INET or AF_INET6), for socket(2).
    pub fn family(&self) -> libc::c_int {
        libc::c_int::from(self.storage.ss_family)
    }

    /// A pointer for connect(2) or bind(2); valid as long as `self` does not move.
    pub fn as_ptr(&self) -> *const libc::sockaddr {
        &self.storage as *const _ as *const libc::sockaddr
    }

    /// The length that goes with [`SockAddr::as_ptr`].
    pub fn len(&self) -> libc::socklen_t {
        self.len
    }
}

/// The errno of the syscall that just failed.
pub fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Turns a libc return value into a Result, keeping errno.
fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Sets an int-valued socket option.
fn set_int(fd: RawFd, level: libc::c_int, opt: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: the pointer and length describe a live c_int.
    let ret = unsafe {
        libc::setsockopt(
            fd,
            level,
            opt,
            &value as *const _ as *const libc::c_void,
            mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    check(ret).map(drop)
}

/// A listening socket on `addr`: SO_REUSEADDR (a restarted bench binds the same
/// port while old connections sit in TIME_WAIT) and TCP_NODELAY, which Linux copies
/// into every accepted socket, so the client side gets it without a syscall per
/// connection. `nonblocking` for epoll, whose accept4 must return EAGAIN; io_uring
/// wants a blocking listener (it polls internally and never blocks the thread).
pub fn listen(addr: SocketAddr, nonblocking: bool) -> io::Result<RawFd> {
    let sa = SockAddr::new(addr);
    let fd = socket(sa.family(), nonblocking)?;
    let setup = || -> io::Result<()> {
        set_int(fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1)?;
        set_int(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY, 1)?;
        // SAFETY: sa outlives the call; the length matches its family.
        check(unsafe { libc::bind(fd, sa.as_ptr(), sa.len()) })?;
        // SAFETY: plain syscall on an fd we own.
        check(unsafe { libc::listen(fd, BACKLOG) })?;
        Ok(())
    };
    setup().inspect_err(|_| close(fd))?;
    Ok(fd)
}

/// A TCP socket with close-on-exec, blocking or not.
fn socket(family: libc::c_int, nonblocking: bool) -> io::Result<RawFd> {
    let mut ty = libc::SOCK_STREAM | libc::SOCK_CLOEXEC;
    if nonblocking {
        ty |= libc::SOCK_NONBLOCK;
    }
    // SAFETY: plain syscall; the result is checked.
    check(unsafe { libc::socket(family, ty, 0) })
}

/// A socket for a backend connection, with TCP_NODELAY: a relay forwards what it
/// was given at once, and Nagle would hold a small TLS record back for an ACK.
/// (crossbar sets it on its backend sockets too: src/dial/mod.rs.)
pub fn backend_socket(family: libc::c_int, nonblocking: bool) -> io::Result<RawFd> {
    let fd = socket(family, nonblocking)?;
    set_int(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY, 1).inspect_err(|_| close(fd))?;
    Ok(fd)
}

/// Closes an fd. A failed close(2) of a socket leaves nothing to do: the fd is
/// released either way, so the error is ignored.
pub fn close(fd: RawFd) {
    // SAFETY: the caller owns fd and never uses it again.
    unsafe { libc::close(fd) };
}
