//! The epoll engine: edge-triggered readiness and raw libc calls, so every syscall
//! a connection costs is one chosen here.
//!
//! Per connection: accept4, socket, setsockopt(TCP_NODELAY), connect, one
//! epoll_ctl(ADD) per fd (never MOD or DEL: the interest set is fixed for the
//! fd's life and close(2) removes it), recv and send only while epoll has said
//! the fd is ready, shutdown(SHUT_WR) to pass a half-close on, close for each fd.

use std::io;
use std::os::fd::RawFd;
use std::ptr;

use crate::pipe::{Pipe, BUF};
use crate::sys::{self, errno};
use crate::Route;

/// Events taken per epoll_wait: enough that a burst of connections is served in
/// one call, small enough to stay in cache.
const EVENTS: usize = 256;

/// Tokens with this bit name a listener (its route index below it); the others a
/// connection's side: generation << 32 | slot << 1 | side.
const LISTENER: u64 = 1 << 63;

/// Generations use 31 bits, leaving bit 63 to `LISTENER`.
const GEN_MASK: u32 = 0x7fff_ffff;

/// Every fd is added once with the whole interest set, edge-triggered: nothing is
/// ever modified, and each event means "something changed", read until drained.
const INTEREST: u32 = (libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLRDHUP | libc::EPOLLET) as u32;

const CLIENT: usize = 0;
const BACKEND: usize = 1;

/// What epoll last said about one socket of a connection.
struct Side {
    fd: RawFd,
    /// recv may find bytes or an EOF (cleared by EAGAIN or a short read).
    readable: bool,
    /// send may take bytes (cleared by EAGAIN or a short write).
    writable: bool,
    /// The peer's FIN (or a hang-up) has been seen: read on until recv says 0,
    /// even after a short read, since no further edge will come for it.
    rdhup: bool,
}

/// A relayed connection: `pipes[d]` carries bytes from `sides[d]` to `sides[1 - d]`.
struct Conn {
    generation: u32,
    live: bool,
    /// The backend's connect finished (its first writable event).
    connected: bool,
    sides: [Side; 2],
    pipes: [Pipe; 2],
}

/// Why a connection ends early; both fds are closed either way.
struct Broken;

/// The relay: one epoll instance, the routes' listeners and a slab of connections.
pub struct Relay {
    epfd: RawFd,
    routes: Vec<Route>,
    conns: Vec<Conn>,
    free: Vec<usize>,
    /// `epoll_ctl(DEL)` each fd before closing it, as tokio does (its I/O driver
    /// deregisters every socket it drops): `--engine epoll-del`, to measure what
    /// those two calls per connection cost.
    deregister: bool,
}

impl Relay {
    /// Creates the epoll instance and adds every (non-blocking) listener.
    pub fn new(routes: Vec<Route>, deregister: bool) -> io::Result<Relay> {
        // SAFETY: plain syscall; the result is checked.
        let epfd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if epfd < 0 {
            return Err(io::Error::last_os_error());
        }
        let relay = Relay {
            epfd,
            routes,
            conns: Vec::new(),
            free: Vec::new(),
            deregister,
        };
        for (i, r) in relay.routes.iter().enumerate() {
            // Listeners only ever need EPOLLIN.
            let events = (libc::EPOLLIN | libc::EPOLLET) as u32;
            relay.add(r.listener, events, LISTENER | i as u64)?;
        }
        Ok(relay)
    }

    /// Calls `ready`, then relays until the process is killed.
    pub fn run(mut self, ready: impl FnOnce() -> io::Result<()>) -> io::Result<()> {
        ready()?;
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; EVENTS];
        loop {
            // SAFETY: the buffer holds EVENTS entries.
            let n = unsafe {
                libc::epoll_wait(self.epfd, events.as_mut_ptr(), EVENTS as libc::c_int, -1)
            };
            if n < 0 {
                if errno() == libc::EINTR {
                    continue;
                }
                return Err(io::Error::last_os_error());
            }
            for ev in &events[..n as usize] {
                // Copies out of the packed struct.
                let (bits, token) = (ev.events, ev.u64);
                if token & LISTENER != 0 {
                    self.accept((token & !LISTENER) as usize);
                } else {
                    self.on_event(token, bits);
                }
            }
        }
    }

    fn add(&self, fd: RawFd, events: u32, token: u64) -> io::Result<()> {
        let mut ev = libc::epoll_event { events, u64: token };
        // SAFETY: ev is a valid epoll_event for the duration of the call.
        if unsafe { libc::epoll_ctl(self.epfd, libc::EPOLL_CTL_ADD, fd, &mut ev) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Accepts until EAGAIN: an edge-triggered listener reports a burst once.
    fn accept(&mut self, route: usize) {
        let listener = self.routes[route].listener;
        loop {
            // The flags save an fcntl per connection. No peer address is asked
            // for: the floor logs nothing.
            // SAFETY: null address pointers are allowed.
            let fd = unsafe {
                libc::accept4(
                    listener,
                    ptr::null_mut(),
                    ptr::null_mut(),
                    libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                )
            };
            if fd >= 0 {
                self.open(fd, route);
                continue;
            }
            match errno() {
                libc::EAGAIN => return,
                libc::EINTR | libc::ECONNABORTED => continue,
                // EMFILE and the like: the queued connections wait for the next
                // edge (a new connection); the floor is a bench tool, not a server.
                e => {
                    eprintln!("floor: accept: {}", io::Error::from_raw_os_error(e));
                    return;
                }
            }
        }
    }

    /// Starts the backend connect for a new client and registers both fds.
    fn open(&mut self, client: RawFd, route: usize) {
        let addr = self.routes[route].pick();
        let backend = match sys::backend_socket(addr.family(), true) {
            Ok(fd) => fd,
            Err(e) => {
                eprintln!("floor: backend socket: {e}");
                sys::close(client);
                return;
            }
        };
        // SAFETY: addr lives in self.routes for the whole run.
        let ret = unsafe { libc::connect(backend, addr.as_ptr(), addr.len()) };
        // A non-blocking connect answers EINPROGRESS even on loopback; success is
        // learnt from the first writable event, so no getsockopt(SO_ERROR) is made.
        let connected = ret == 0;
        if ret < 0 && errno() != libc::EINPROGRESS {
            sys::close(backend);
            sys::close(client);
            return;
        }
        let slot = self.slot(client, backend, connected);
        let generation = u64::from(self.conns[slot].generation) << 32;
        let token = |side: usize| generation | (slot as u64) << 1 | side as u64;
        if self.add(client, INTEREST, token(CLIENT)).is_err()
            || self.add(backend, INTEREST, token(BACKEND)).is_err()
        {
            self.close(slot);
        }
    }

    /// A slot for a new connection: a freed one (its buffers reused) or a new one.
    fn slot(&mut self, client: RawFd, backend: RawFd, connected: bool) -> usize {
        let side = |fd| Side {
            fd,
            readable: false,
            writable: false,
            rdhup: false,
        };
        let sides = [side(client), side(backend)];
        if let Some(slot) = self.free.pop() {
            let c = &mut self.conns[slot];
            c.generation = c.generation.wrapping_add(1) & GEN_MASK;
            c.live = true;
            c.connected = connected;
            c.sides = sides;
            c.pipes.iter_mut().for_each(Pipe::reset);
            return slot;
        }
        self.conns.push(Conn {
            generation: 0,
            live: true,
            connected,
            sides,
            pipes: [Pipe::new(), Pipe::new()],
        });
        self.conns.len() - 1
    }

    /// Records what epoll said about one side, then moves what can be moved.
    fn on_event(&mut self, token: u64, bits: u32) {
        let slot = (token as u32 >> 1) as usize;
        let side = (token & 1) as usize;
        let c = &mut self.conns[slot];
        // A connection closed earlier in this batch may have had its slot reused:
        // the generation tells its leftover events apart.
        if !c.live || c.generation != (token >> 32) as u32 {
            return;
        }
        let has = |flag: libc::c_int| bits & flag as u32 != 0;
        // A reset, or a refused or unreachable connect: nothing left to relay.
        if has(libc::EPOLLERR) {
            self.close(slot);
            return;
        }
        if side == BACKEND && !c.connected {
            if has(libc::EPOLLHUP) {
                self.close(slot);
                return;
            }
            c.connected = has(libc::EPOLLOUT);
        }
        let s = &mut c.sides[side];
        if has(libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLHUP) {
            s.readable = true;
        }
        if has(libc::EPOLLRDHUP | libc::EPOLLHUP) {
            s.rdhup = true;
        }
        if has(libc::EPOLLOUT) {
            s.writable = true;
        }
        self.pump(slot);
    }

    /// Moves bytes both ways until neither direction can progress; closes the
    /// connection when both directions have ended or on any error.
    fn pump(&mut self, slot: usize) {
        let c = &mut self.conns[slot];
        loop {
            let mut progress = false;
            for d in [CLIENT, BACKEND] {
                match step(c, d) {
                    Ok(p) => progress |= p,
                    Err(Broken) => return self.close(slot),
                }
            }
            if c.pipes[0].shut && c.pipes[1].shut {
                return self.close(slot);
            }
            if !progress {
                return;
            }
        }
    }

    /// Closes both fds (which also takes them out of the epoll set) and frees the slot.
    fn close(&mut self, slot: usize) {
        let c = &mut self.conns[slot];
        c.live = false;
        for s in &c.sides {
            if self.deregister {
                // SAFETY: plain syscall on an fd this slot owns; a failure changes
                // nothing (close below removes it anyway).
                unsafe {
                    libc::epoll_ctl(self.epfd, libc::EPOLL_CTL_DEL, s.fd, std::ptr::null_mut())
                };
            }
            sys::close(s.fd);
        }
        self.free.push(slot);
    }
}

/// One turn of direction `d` (from side `d` to side `1 - d`): read if its buffer is
/// empty, write what it holds, pass an EOF on. Returns whether anything happened.
fn step(c: &mut Conn, d: usize) -> Result<bool, Broken> {
    let (src, dst) = (d, 1 - d);
    // Nothing goes to or comes from the backend before its connect is done (a
    // shutdown of a connecting socket would abort it); the client may be read
    // meanwhile, into its buffer.
    let src_open = src == CLIENT || c.connected;
    let dst_open = dst == CLIENT || c.connected;
    let other_shut = c.pipes[dst].shut;
    let p = &mut c.pipes[d];
    let mut progress = false;
    if p.pending().is_empty() && !p.eof && src_open && c.sides[src].readable {
        let s = &mut c.sides[src];
        // SAFETY: the buffer holds BUF bytes.
        let n = unsafe { libc::recv(s.fd, p.buf.as_mut_ptr().cast(), BUF, 0) };
        match n {
            0 => (p.eof, s.readable) = (true, false),
            n if n > 0 => {
                p.filled(n as usize);
                // A short read emptied the socket: the next bytes bring a new edge,
                // so no recv is spent to hear EAGAIN. Not after a FIN, which
                // brings none: read on to the 0.
                if (n as usize) < BUF && !s.rdhup {
                    s.readable = false;
                }
            }
            _ => match errno() {
                libc::EAGAIN => s.readable = false,
                libc::EINTR => {}
                _ => return Err(Broken),
            },
        }
        progress = true;
    }
    if !p.pending().is_empty() && dst_open && c.sides[dst].writable {
        let s = &mut c.sides[dst];
        let bytes = p.pending();
        // MSG_NOSIGNAL: a peer gone is an EPIPE for this connection, not a
        // SIGPIPE for the process.
        // SAFETY: the pointer and length describe live bytes of the buffer.
        let n = unsafe { libc::send(s.fd, bytes.as_ptr().cast(), bytes.len(), libc::MSG_NOSIGNAL) };
        if n >= 0 {
            p.sent(n as usize);
            // A short write filled the socket buffer; its draining brings an edge.
            if !p.pending().is_empty() {
                s.writable = false;
            }
        } else {
            match errno() {
                libc::EAGAIN => s.writable = false,
                libc::EINTR => {}
                _ => return Err(Broken),
            }
        }
        progress = true;
    }
    if p.eof && p.pending().is_empty() && !p.shut && dst_open {
        // When the other direction is over too, both fds are closed next and
        // close sends this FIN (nothing is left unread on dst, whose EOF came),
        // so the shutdown would be a syscall for nothing.
        // SAFETY: plain syscall on an fd of this connection.
        if !other_shut && unsafe { libc::shutdown(c.sides[dst].fd, libc::SHUT_WR) } < 0 {
            return Err(Broken);
        }
        p.shut = true;
        progress = true;
    }
    Ok(progress)
}
