//! The io_uring engine: completions instead of readiness, so a connection's
//! accept, connect, recv, send, shutdown and close are ring entries, batched into
//! one io_uring_enter per loop turn.
//!
//! Per connection: one multishot-accept completion (no syscall), socket and
//! setsockopt(TCP_NODELAY) by libc (IORING_OP_SOCKET would need a second turn
//! before the connect could be queued, and the option has no ring op this simple),
//! then only entries: connect, one recv per side at a time, a send of what it got,
//! a shutdown to pass a half-close on, a close per fd.

use std::io;
use std::os::fd::RawFd;

use io_uring::{cqueue, opcode, squeue, types, IoUring};

use crate::pipe::{Pipe, BUF};
use crate::sys;
use crate::Route;

/// Submission queue entries; the completion queue is twice as deep (the default).
const RING: u32 = 4096;

/// What a completion is for; the low bits of its user_data.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Op {
    Accept = 0,
    Connect = 1,
    Recv = 2,
    Send = 3,
    Shutdown = 4,
    Cancel = 5,
    Close = 6,
}

const OPS: [Op; 7] = [
    Op::Accept,
    Op::Connect,
    Op::Recv,
    Op::Send,
    Op::Shutdown,
    Op::Cancel,
    Op::Close,
];

/// user_data = index << 4 | side << 3 | op, where index is the slot (or the
/// route, for an accept) and side the socket the entry works on.
fn user_data(index: usize, side: usize, op: Op) -> u64 {
    (index as u64) << 4 | (side as u64) << 3 | op as u64
}

const CLIENT: usize = 0;
const BACKEND: usize = 1;

/// A relayed connection: `pipes[d]` carries bytes from `fds[d]` to `fds[1 - d]`.
struct Conn {
    live: bool,
    fds: [RawFd; 2],
    connected: bool,
    /// Entries in flight: the slot (and its buffers, which the kernel writes
    /// into) is reused only once this is back to 0.
    inflight: u32,
    /// An error ended the connection: its entries are being cancelled.
    closing: bool,
    pipes: [Pipe; 2],
    /// `busy[d]`: a recv, send or shutdown of direction `d` is in flight: one at
    /// a time, so its buffer is never read and written by the kernel at once.
    busy: [bool; 2],
}

/// The relay: one ring, the routes' listeners and a slab of connections.
pub struct Relay {
    ring: IoUring,
    routes: Vec<Route>,
    conns: Vec<Conn>,
    free: Vec<usize>,
    /// Completions copied out of the ring, so handling them can queue entries.
    done: Vec<(u64, i32, u32)>,
}

impl Relay {
    /// Sets the ring up and arms a multishot accept on each (blocking) listener.
    pub fn new(routes: Vec<Route>) -> io::Result<Relay> {
        // One thread submits and reaps: SINGLE_ISSUER lets the kernel skip
        // locking, DEFER_TASKRUN runs completion work only inside our
        // io_uring_enter (no interrupting the thread), SUBMIT_ALL keeps queueing
        // the batch past an entry that fails at submission.
        let ring = IoUring::builder()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .setup_submit_all()
            .build(RING)
            .map_err(|e| io::Error::new(e.kind(), format!("io_uring setup: {e}")))?;
        let mut relay = Relay {
            ring,
            routes,
            conns: Vec::new(),
            free: Vec::new(),
            done: Vec::new(),
        };
        for route in 0..relay.routes.len() {
            relay.arm_accept(route)?;
        }
        Ok(relay)
    }

    /// Calls `ready`, then relays until the process is killed.
    pub fn run(mut self, ready: impl FnOnce() -> io::Result<()>) -> io::Result<()> {
        ready()?;
        loop {
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                // EBUSY: completions overflowed; reaping them below makes room.
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {}
                Err(e) => return Err(e),
            }
            let mut done = std::mem::take(&mut self.done);
            done.extend(
                self.ring
                    .completion()
                    .map(|c| (c.user_data(), c.result(), c.flags())),
            );
            for &(data, res, flags) in &done {
                self.complete(data, res, flags)?;
            }
            done.clear();
            self.done = done;
        }
    }

    /// Queues an entry, submitting what is queued first if the queue is full.
    ///
    /// # Safety
    /// Every buffer and address `entry` points to must stay valid until its
    /// completion: buffers live in slots reused only when no entry is in flight,
    /// addresses in `routes`, which never change.
    unsafe fn push(&mut self, entry: squeue::Entry) -> io::Result<()> {
        while self.ring.submission().push(&entry).is_err() {
            match self.ring.submit() {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn arm_accept(&mut self, route: usize) -> io::Result<()> {
        let fd = types::Fd(self.routes[route].listener);
        let entry = opcode::AcceptMulti::new(fd)
            .flags(libc::SOCK_CLOEXEC)
            .build()
            .user_data(user_data(route, 0, Op::Accept));
        // SAFETY: a multishot accept points to no memory.
        unsafe { self.push(entry) }
    }

    /// Dispatches one completion.
    fn complete(&mut self, data: u64, res: i32, flags: u32) -> io::Result<()> {
        let index = (data >> 4) as usize;
        let side = (data >> 3 & 1) as usize;
        match OPS[(data & 7) as usize] {
            Op::Accept => self.accepted(index, res, flags),
            // Cancels and closes carry no state: a failed cancel means the entry
            // completed anyway, and a failed close(2) of a socket still frees it.
            Op::Cancel | Op::Close => Ok(()),
            op => self.conn_done(index, side, op, res),
        }
    }

    fn accepted(&mut self, route: usize, res: i32, flags: u32) -> io::Result<()> {
        // The kernel ends a multishot accept on some errors (and on overflow of
        // the completion queue): without MORE, nothing more comes unless re-armed.
        if !cqueue::more(flags) {
            self.arm_accept(route)?;
        }
        if res < 0 {
            eprintln!("floor: accept: {}", io::Error::from_raw_os_error(-res));
            return Ok(());
        }
        self.open(res, route)
    }

    /// Opens the backend socket for a new client and queues its connect and the
    /// client's first recv.
    fn open(&mut self, client: RawFd, route: usize) -> io::Result<()> {
        let addr = self.routes[route].pick();
        let (addr_ptr, addr_len) = (addr.as_ptr(), addr.len());
        let backend = match sys::backend_socket(addr.family(), false) {
            Ok(fd) => fd,
            Err(e) => {
                eprintln!("floor: backend socket: {e}");
                sys::close(client);
                return Ok(());
            }
        };
        let slot = self.slot(client, backend);
        let connect = opcode::Connect::new(types::Fd(backend), addr_ptr, addr_len)
            .build()
            .user_data(user_data(slot, BACKEND, Op::Connect));
        self.conns[slot].inflight += 1;
        // SAFETY: the address lives in self.routes for the whole run.
        unsafe { self.push(connect)? };
        // The client is read while the connect goes on: its first bytes wait in
        // the buffer until the backend can take them.
        self.advance(slot, CLIENT)
    }

    /// A slot for a new connection: a freed one (its buffers reused) or a new one.
    fn slot(&mut self, client: RawFd, backend: RawFd) -> usize {
        if let Some(slot) = self.free.pop() {
            let c = &mut self.conns[slot];
            (c.live, c.fds, c.connected, c.closing) = (true, [client, backend], false, false);
            c.pipes.iter_mut().for_each(Pipe::reset);
            c.busy = [false; 2];
            return slot;
        }
        self.conns.push(Conn {
            live: true,
            fds: [client, backend],
            connected: false,
            inflight: 0,
            closing: false,
            pipes: [Pipe::new(), Pipe::new()],
            busy: [false; 2],
        });
        self.conns.len() - 1
    }

    /// The completion of a connection's connect, recv, send or shutdown.
    fn conn_done(&mut self, slot: usize, side: usize, op: Op, res: i32) -> io::Result<()> {
        let c = &mut self.conns[slot];
        c.inflight -= 1;
        if c.closing {
            return self.finish_if_idle(slot);
        }
        // A reset, a refused connect, a send to a closed peer: the connection ends.
        // (ECANCELED and ENOBUFS land here too; nothing here cancels or selects
        // buffers while the connection is open.)
        if res < 0 || (op == Op::Send && res == 0) {
            return self.abort(slot);
        }
        if op == Op::Connect {
            // Success is the completion itself: no getsockopt(SO_ERROR).
            c.connected = true;
            self.advance(slot, BACKEND)?;
            return self.advance(slot, CLIENT);
        }
        // The direction this completion belongs to: a recv reads its own side's
        // direction, a send or shutdown works on the other side's.
        let d = if op == Op::Recv { side } else { 1 - side };
        let p = &mut c.pipes[d];
        match op {
            Op::Recv if res == 0 => p.eof = true,
            Op::Recv => p.filled(res as usize),
            Op::Send => p.sent(res as usize),
            _ => p.shut = true,
        }
        c.busy[d] = false;
        self.advance(slot, d)
    }

    /// Queues the next entry of direction `d` (from side `d` to side `1 - d`), if
    /// none is in flight: a send of what the buffer holds (the rest after a short
    /// send), else the shutdown passing an EOF on, else a recv. Closes the
    /// connection once both directions are over.
    fn advance(&mut self, slot: usize, d: usize) -> io::Result<()> {
        let c = &mut self.conns[slot];
        let (src, dst) = (d, 1 - d);
        // Nothing goes to or comes from the backend before its connect is done (a
        // shutdown of a connecting socket would abort it).
        let src_open = src == CLIENT || c.connected;
        let dst_open = dst == CLIENT || c.connected;
        let other_shut = c.pipes[dst].shut;
        let p = &mut c.pipes[d];
        if c.busy[d] || p.shut {
            return self.finish_if_idle(slot);
        }
        let (fd, op) = (types::Fd(c.fds[dst]), user_data(slot, dst, Op::Send));
        let entry = if !p.pending().is_empty() {
            if !dst_open {
                return Ok(());
            }
            let bytes = p.pending();
            opcode::Send::new(fd, bytes.as_ptr(), bytes.len() as u32)
                .build()
                .user_data(op)
        } else if p.eof {
            if !dst_open {
                return Ok(());
            }
            if other_shut {
                // Both directions are over: the closes come next and send this
                // FIN (nothing is left unread on dst, whose EOF came), so the
                // shutdown would be an entry for nothing.
                p.shut = true;
                return self.finish_if_idle(slot);
            }
            opcode::Shutdown::new(fd, libc::SHUT_WR)
                .build()
                .user_data(user_data(slot, dst, Op::Shutdown))
        } else {
            if !src_open {
                return Ok(());
            }
            let fd = types::Fd(c.fds[src]);
            opcode::Recv::new(fd, p.buf.as_mut_ptr(), BUF as u32)
                .build()
                .user_data(user_data(slot, src, Op::Recv))
        };
        c.busy[d] = true;
        c.inflight += 1;
        // SAFETY: the buffer belongs to this slot, which is not reused while the
        // entry is in flight (inflight counts it).
        unsafe { self.push(entry) }
    }

    /// Ends a connection on an error: cancels what it has in flight; the fds are
    /// closed once every entry has completed (the kernel may still write into
    /// the buffers until then, and a closed fd would not stop a pending recv).
    fn abort(&mut self, slot: usize) -> io::Result<()> {
        let c = &mut self.conns[slot];
        c.closing = true;
        if c.inflight == 0 {
            return self.finish_if_idle(slot);
        }
        let fds = c.fds;
        for (side, fd) in fds.into_iter().enumerate() {
            let cancel = types::CancelBuilder::fd(types::Fd(fd)).all();
            let entry = opcode::AsyncCancel2::new(cancel)
                .build()
                .user_data(user_data(slot, side, Op::Cancel));
            // SAFETY: a cancel points to no memory.
            unsafe { self.push(entry)? };
        }
        Ok(())
    }

    /// Closes both fds and frees the slot, once nothing is in flight and either
    /// both directions are over or an error ended the connection.
    fn finish_if_idle(&mut self, slot: usize) -> io::Result<()> {
        let c = &mut self.conns[slot];
        let over = c.closing || (c.pipes[0].shut && c.pipes[1].shut);
        if !c.live || c.inflight > 0 || !over {
            return Ok(());
        }
        c.live = false;
        let fds = c.fds;
        self.free.push(slot);
        for fd in fds {
            let entry = opcode::Close::new(types::Fd(fd))
                .build()
                .user_data(user_data(0, 0, Op::Close));
            // SAFETY: a close points to no memory.
            unsafe { self.push(entry)? };
        }
        Ok(())
    }
}
