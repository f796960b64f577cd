//! How a relayed connection ends, and how crossbar passes each ending on: a FIN
//! stays a half-close, an abort (reset or error) becomes a reset of the other peer
//! once every byte already received from the aborting peer has reached it.
//!
//! Any relay (copy, splice, any future one) reports each direction as an
//! [`Ending`]; [`Abort::of`] says which peer aborted, and [`pass_on`] delivers the
//! abort to the other peer. Linux keeps bytes a socket had received before a reset
//! readable ahead of the error, on crossbar's sockets and on the peer's, which is
//! what makes "every byte, then the reset" possible.
use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::net::TcpStream;

/// First wait between checks that a peer has acknowledged everything sent to it
/// (on loopback it has by the first check; on a LAN within a round trip or two).
const ACK_POLL_FIRST: Duration = Duration::from_millis(1);
/// Longest wait between those checks: a peer behind a WAN link or a slow reader
/// should not cost a busy loop, nor a reset arriving long after its last byte.
const ACK_POLL_MAX: Duration = Duration::from_millis(64);

/// One of the two peers of a relayed connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// The connection crossbar accepted.
    Client,
    /// The connection crossbar opened to a backend.
    Backend,
}

impl Peer {
    /// The other peer.
    pub fn other(self) -> Peer {
        match self {
            Peer::Client => Peer::Backend,
            Peer::Backend => Peer::Client,
        }
    }

    /// The `side` label of `crossbar_connection_resets_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            Peer::Client => "client",
            Peer::Backend => "backend",
        }
    }
}

/// How one direction (source -> destination) of a relay ended.
#[derive(Debug)]
pub enum Ending {
    /// The source sent a FIN and every byte before it reached the destination;
    /// the relay half-closes the destination (unless the other direction found an
    /// abort first: then the destination gets that reset, never a FIN).
    Fin,
    /// Reading from the source failed (it reset the connection, or the socket
    /// failed): the source aborted.
    SourceAborted(io::Error),
    /// Writing to the destination failed: the destination aborted.
    DestinationAborted(io::Error),
    /// crossbar itself could not go on (no pipe for splice, out of memory...);
    /// both peers are reset, since neither may take the stream as complete.
    Local(io::Error),
}

/// A peer's abort, found in one direction's [`Ending`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Abort {
    /// Which peer aborted (for a local failure: the peer whose direction failed).
    pub by: Peer,
    /// Whether crossbar itself failed rather than a peer.
    pub local: bool,
    /// The error behind it (`connection reset by peer`, `broken pipe`, ...).
    pub error: io::ErrorKind,
}

impl Abort {
    /// The abort in the ending of the direction whose source is `source`, if any.
    pub fn of(source: Peer, ending: &Ending) -> Option<Abort> {
        let (by, local, error) = match ending {
            Ending::Fin => return None,
            Ending::SourceAborted(e) => (source, false, e.kind()),
            Ending::DestinationAborted(e) => (source.other(), false, e.kind()),
            Ending::Local(e) => (source, true, e.kind()),
        };
        Some(Abort { by, local, error })
    }
}

/// Which side an I/O error came from.
#[derive(Debug)]
pub(super) enum Side {
    /// Reading from the source failed.
    Read(io::Error),
    /// Writing to the destination failed.
    Write(io::Error),
    /// Neither: crossbar's own resources (a pipe) failed.
    Local(io::Error),
}

/// How the relay's two directions stand, shared by both: which peers' FINs have
/// been read, and whether a direction found an abort.
///
/// The direction that finishes second leaves its FIN to close(2): the caller closes
/// both sockets as soon as the relay returns, which sends the same FIN, so its
/// shutdown(SHUT_WR) would be one system call per connection for nothing (HAProxy
/// and nginx just close). Only a socket whose FIN has been read is left so: close(2)
/// on a socket with unread bytes sends a reset, and after the FIN no byte can follow.
/// (One value for both facts: each pump's future holds one pointer to it.)
#[derive(Debug, Default)]
pub(super) struct Ends {
    client_fin: AtomicBool,
    backend_fin: AtomicBool,
    aborted: AtomicBool,
}

impl Ends {
    /// `from`'s FIN has been read (its direction's source reached EOF).
    fn read_fin(&self, from: Peer) {
        self.fin(from).store(true, Ordering::Relaxed);
    }

    /// Whether `from`'s FIN has been read.
    fn fin_seen(&self, from: Peer) -> bool {
        self.fin(from).load(Ordering::Relaxed)
    }

    fn fin(&self, peer: Peer) -> &AtomicBool {
        match peer {
            Peer::Client => &self.client_fin,
            Peer::Backend => &self.backend_fin,
        }
    }

    /// A direction found an abort: the other one must not half-close its
    /// destination (it is to be reset).
    pub(super) fn set_aborted(&self) {
        self.aborted.store(true, Ordering::Relaxed);
    }

    fn aborted(&self) -> bool {
        self.aborted.load(Ordering::Relaxed)
    }
}

/// The [`Ending`] of the direction from `source` whose bytes `moved` as far as
/// they went: on EOF the destination is half-closed by `fin` (awaited only then,
/// and only if `ends` says neither that the other direction found an abort nor that
/// the destination's own FIN was read: then close(2) sends it), else the side that
/// failed.
pub(super) async fn ending_of(
    moved: Result<(), Side>,
    (source, ends): (Peer, &Ends),
    fin: impl Future<Output = io::Result<()>>,
) -> Ending {
    match moved {
        Ok(()) if ends.aborted() => Ending::Fin,
        Ok(()) => {
            ends.read_fin(source);
            if ends.fin_seen(source.other()) {
                return Ending::Fin;
            }
            match fin.await {
                Ok(()) => Ending::Fin,
                Err(e) => Ending::DestinationAborted(e),
            }
        }
        Err(Side::Read(e)) => Ending::SourceAborted(e),
        Err(Side::Write(e)) => Ending::DestinationAborted(e),
        Err(Side::Local(e)) => Ending::Local(e),
    }
}

/// Reset `stream` when it is closed: SO_LINGER 0, so close(2) sends a RST and
/// discards anything unsent (callers wait for [`acknowledged`] first).
pub fn reset_on_close(stream: &TcpStream) {
    if let Err(e) = socket2::SockRef::from(stream).set_linger(Some(Duration::ZERO)) {
        tracing::debug!("SO_LINGER 0 failed, the peer gets a FIN instead of a reset: {e}");
    }
}

/// Pass an abort on to `to`, the peer that did not abort: wait until it has
/// acknowledged every byte sent to it (so the reset can't overtake them), then
/// mark it to be reset on close. The wait ends early when the peer makes no
/// progress for `idle` or `hard_stop` fires; the reset is sent regardless.
pub async fn pass_on(to: &TcpStream, idle: Duration, hard_stop: &super::HardStop) {
    tokio::select! {
        () = acknowledged(to, idle) => {}
        () = hard_stop.stopped() => {}
    }
    reset_on_close(to);
}

/// Wait until `stream`'s send queue is empty (every byte acknowledged), or it has
/// not shrunk for `idle`.
pub async fn acknowledged(stream: &TcpStream, idle: Duration) {
    let mut pause = ACK_POLL_FIRST;
    let mut last = usize::MAX;
    let mut stalled = Duration::ZERO;
    loop {
        let Some(queued) = unacknowledged(stream) else {
            return;
        };
        if queued == 0 || stalled >= idle {
            return;
        }
        if queued < last {
            last = queued;
            stalled = Duration::ZERO;
        }
        tokio::time::sleep(pause).await;
        stalled += pause;
        pause = (pause * 2).min(ACK_POLL_MAX);
    }
}

/// Bytes in `stream`'s send queue not yet acknowledged by the peer (SIOCOUTQ);
/// `None` where that can't be known.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn unacknowledged(stream: &TcpStream) -> Option<usize> {
    use std::os::fd::AsRawFd;
    let mut queued: libc::c_int = 0;
    // SAFETY: TIOCOUTQ (= SIOCOUTQ for TCP) writes one c_int into `queued`, which
    // we own; the fd stays open for the call since `stream` is borrowed.
    let rc = unsafe { libc::ioctl(stream.as_raw_fd(), libc::TIOCOUTQ, &mut queued) };
    if rc != 0 {
        return None;
    }
    usize::try_from(queued).ok()
}

#[cfg(not(target_os = "linux"))]
fn unacknowledged(_stream: &TcpStream) -> Option<usize> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(kind: io::ErrorKind) -> io::Error {
        io::Error::from(kind)
    }

    #[test]
    fn who_aborted() {
        use io::ErrorKind::{BrokenPipe, ConnectionReset, OutOfMemory};
        assert_eq!(Abort::of(Peer::Client, &Ending::Fin), None);
        let read = Abort::of(Peer::Backend, &Ending::SourceAborted(err(ConnectionReset)));
        assert_eq!(
            read,
            Some(Abort {
                by: Peer::Backend,
                local: false,
                error: ConnectionReset
            })
        );
        let write = Abort::of(Peer::Backend, &Ending::DestinationAborted(err(BrokenPipe)));
        assert_eq!(write.map(|a| a.by), Some(Peer::Client));
        let local = Abort::of(Peer::Client, &Ending::Local(err(OutOfMemory)));
        assert_eq!(local.map(|a| (a.by, a.local)), Some((Peer::Client, true)));
    }
}
