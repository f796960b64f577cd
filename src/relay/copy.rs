//! One direction's pump, like HAProxy's `splice-auto`: small messages are copied
//! through a per-thread buffer, and a direction that carries bulk data switches to
//! splice(2) on Linux. While the TLS handshake is under way the server->client bytes
//! are also shown to a [`ServerWatcher`] (after being forwarded, so inspection adds
//! no latency).
use std::cell::RefCell;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::tcp::{ReadHalf, WriteHalf};

use super::ending::{ending_of, Ending, Ends, Peer, Side};
use super::meter::Meter;
#[cfg(target_os = "linux")]
use super::splice;
use crate::hello::{RecordScan, ServerHandshake, ServerWatcher};

/// Per-direction copy buffer: large enough for a full TLS record (16 KiB + overhead)
/// in one read.
const BUF_SIZE: usize = 16 * 1024 + 256;

/// Who hears what the relay saw of the handshake: the connection, which learns
/// stick entries from it. Both directions' pumps call it, within the connection's
/// one task.
pub trait HandshakeObserver: Sync {
    /// The server's handshake as the watcher saw it (once: when the watcher is done,
    /// or the server's direction ended).
    fn handshake(&self, hs: &ServerHandshake);
    /// The client's direction relayed more bytes (not its EOF): the client's answers
    /// to what the server sent, which prove more than its hello did. True once it
    /// needs to hear no more.
    fn client_moved(&self) -> bool;
    /// The server sent a record (its content type and length, from its header; the
    /// body is encrypted): after the client's flight, what proves that flight. True
    /// once it needs to hear no more.
    fn server_record(&self, content_type: u8, len: u16) -> bool;
}

/// Inspection of the server's handshake during the relay (boxed by callers: it is
/// only needed during the handshake, and inline it would enlarge every
/// connection's future for its whole life; the pump drops it once done).
pub struct Watch<'a> {
    /// The watcher fed with server->client bytes, until it is done.
    watcher: Option<ServerWatcher>,
    /// Who hears of the handshake, of the client's bytes after it and of the
    /// server's records.
    observer: &'a dyn HandshakeObserver,
    /// The server's record boundaries, followed while the observer listens.
    records: RecordScan,
    /// Does the observer still want the server's records?
    listening: bool,
}

impl<'a> Watch<'a> {
    /// Watch the server's handshake with `watcher`, telling `observer`.
    pub fn new(watcher: ServerWatcher, observer: &'a dyn HandshakeObserver) -> Watch<'a> {
        Watch {
            watcher: Some(watcher),
            observer,
            records: RecordScan::default(),
            listening: true,
        }
    }

    /// Who hears of the handshake.
    pub fn observer(&self) -> &'a dyn HandshakeObserver {
        self.observer
    }

    /// Feed `data` (server->client bytes) to the record scan, while the observer
    /// listens, and to the watcher; once the watcher is done, tell the observer and
    /// drop it.
    pub fn feed(&mut self, data: &[u8]) {
        if self.listening {
            let observer = self.observer;
            if self
                .records
                .feed(data, |t, len| observer.server_record(t, len))
            {
                self.listening = false;
            }
        }
        if let Some(w) = self.watcher.as_mut() {
            if w.feed(data) || w.is_done() {
                if let Some(w) = self.watcher.take() {
                    self.observer.handshake(w.info());
                }
            }
        }
    }

    /// The server's direction ended: tell the observer what the watcher saw, if it
    /// still watched; no record follows.
    pub fn finish(&mut self) {
        self.listening = false;
        if let Some(w) = self.watcher.take() {
            self.observer.handshake(w.info());
        }
    }

    /// Still watching the server's bytes (its handshake, or records for the
    /// observer)?
    pub fn watching(&self) -> bool {
        self.watcher.is_some() || self.listening
    }
}

/// Relay `src` (the socket of `from.0`) to `dst` until EOF, then half-close `dst`,
/// unless `from.1` says the other direction found an abort: then `dst` is to be
/// reset, and a FIN ahead of the reset would let it take a truncated stream for a
/// complete one (a reset's error is reported once per socket, so after the other
/// direction's write saw it, this direction's read of the aborting peer ends in a
/// plain EOF). Nor when `dst`'s own FIN was read already (`from.1`): the close that
/// follows the relay sends that FIN ([`Ends`]).
pub(super) async fn pump(
    src: ReadHalf<'_>,
    mut dst: WriteHalf<'_>,
    meter: &Meter<'_>,
    from: (Peer, &Ends),
    watch: Option<Box<Watch<'_>>>,
) -> Ending {
    let moved = move_bytes(src, &mut dst, meter, watch).await;
    ending_of(moved, from, dst.shutdown()).await
}

/// Move bytes `src` -> `dst` until `src` reaches EOF.
///
/// Like HAProxy's `splice-auto`: bytes are first copied through a per-thread scratch
/// buffer, which for the small messages of a TLS handshake and a Puppet request costs
/// fewer and cheaper syscalls than splice (a read and a write, against two splices and
/// a pipe). Once a read fills the whole buffer the direction is carrying bulk data
/// (a catalog, a file), and on Linux it switches to splice(2) for the rest of its
/// life, unless the handshake is still being watched (the watcher must see the bytes).
/// No buffer is held per connection: bytes a slow destination doesn't take at once
/// wait in a `backlog` allocated for that moment only.
async fn move_bytes(
    mut src: ReadHalf<'_>,
    dst: &mut WriteHalf<'_>,
    meter: &Meter<'_>,
    mut watch: Option<Box<Watch<'_>>>,
) -> Result<(), Side> {
    let mut backlog: Vec<u8> = Vec::new();
    let mut bulk = false;
    loop {
        if !backlog.is_empty() {
            dst.write_all(&backlog).await.map_err(Side::Write)?;
            meter.count(backlog.len());
            backlog = Vec::new();
        }
        if watch.as_ref().is_some_and(|w| !w.watching()) {
            watch = None; // done during the replay of answer bytes
        }
        if bulk && watch.is_none() && splice_enabled() {
            // Boxed: only bulk directions get here, and inline it would enlarge every
            // connection's future, idle ones included.
            #[cfg(target_os = "linux")]
            {
                Box::pin(splice::pump(src.as_ref(), dst.as_ref(), meter)).await?;
                return Ok(());
            }
        }
        let moved =
            std::future::poll_fn(|cx| copy_once(cx, &mut src, dst, &mut backlog, &mut watch))
                .await?;
        match moved {
            Copied::Eof => {
                if let Some(mut w) = watch.take() {
                    w.finish();
                }
                return Ok(());
            }
            Copied::Bytes { written, full } => {
                meter.touch();
                meter.count(written);
                bulk = full;
            }
        }
    }
}

/// What one [`copy_once`] did.
enum Copied {
    /// The source reached EOF.
    Eof,
    /// Bytes were read; `written` of them are already in `dst` (the rest in the
    /// backlog); `full` if the read filled the scratch buffer.
    Bytes { written: usize, full: bool },
}

/// One read from `src` into this thread's scratch buffer and as much of a write to
/// `dst` as it takes now; what it doesn't take goes to `backlog`. All synchronous
/// within one poll, so the scratch buffer is never held across an await.
fn copy_once(
    cx: &mut Context<'_>,
    src: &mut ReadHalf<'_>,
    dst: &mut WriteHalf<'_>,
    backlog: &mut Vec<u8>,
    watch: &mut Option<Box<Watch<'_>>>,
) -> Poll<Result<Copied, Side>> {
    with_scratch(|scratch| {
        let mut rb = ReadBuf::new(scratch);
        match Pin::new(&mut *src).poll_read(cx, &mut rb) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Err(e)) => return Poll::Ready(Err(Side::Read(e))),
            Poll::Ready(Ok(())) => {}
        }
        let full = rb.remaining() == 0;
        let data = rb.filled();
        if data.is_empty() {
            return Poll::Ready(Ok(Copied::Eof));
        }
        let mut written = 0;
        while written < data.len() {
            match Pin::new(&mut *dst).poll_write(cx, &data[written..]) {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(Side::Write(io::ErrorKind::WriteZero.into())))
                }
                Poll::Ready(Ok(m)) => written += m,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(Side::Write(e))),
                Poll::Pending => break,
            }
        }
        backlog.extend_from_slice(&data[written..]);
        // Inspection after forwarding, so it adds no latency.
        if let Some(w) = watch.as_mut() {
            w.feed(data);
            if !w.watching() {
                *watch = None;
            }
        }
        Poll::Ready(Ok(Copied::Bytes { written, full }))
    })
}

thread_local! {
    /// Each worker thread's copy buffer (see [`pump`]).
    static SCRATCH: RefCell<Box<[u8]>> = RefCell::new(vec![0; BUF_SIZE].into_boxed_slice());
}

/// Run `f` with this thread's scratch buffer (or, should it be in use, which the
/// synchronous callers never allow, a temporary one).
fn with_scratch<R>(f: impl FnOnce(&mut [u8]) -> R) -> R {
    SCRATCH.with(|s| match s.try_borrow_mut() {
        Ok(mut buf) => f(&mut buf),
        Err(_) => f(&mut vec![0; BUF_SIZE]),
    })
}

/// Zero-copy is on unless `CROSSBAR_NO_SPLICE=1` (for benchmarks and diagnosis).
fn splice_enabled() -> bool {
    #[cfg(target_os = "linux")]
    {
        splice::supported()
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}
