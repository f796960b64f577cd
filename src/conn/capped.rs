//! Reading a peer's first flight into a capped buffer under a deadline, until a
//! parser has a verdict: the client's ClientHello, and a backend's answer while a
//! placement is confirmed, are read this one way (never `peek` in a loop).
use std::future::Future;

use bytes::BufMut;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::time::Instant;

/// How much may be read, in what steps, and until when.
pub(super) struct Cap {
    /// Most bytes the buffer may hold.
    pub bytes: usize,
    /// Most bytes one read asks for (the buffer grows by at most this much a read).
    pub chunk: usize,
    /// When to give up waiting.
    pub deadline: Instant,
}

/// Why a capped read ended without a verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Short {
    /// The buffer reached [`Cap::bytes`].
    Full,
    /// [`Cap::deadline`] passed.
    Timeout,
    /// The peer closed, reset or failed.
    Closed,
    /// The `stop` future resolved.
    Stopped,
}

/// Read from `stream` into `buf` until `verdict` has one, within `cap`, or until
/// `stop` resolves. `verdict(buf, fresh)` is asked first and after every read, with
/// all bytes so far and where the last read's bytes begin. Every byte read stays in
/// `buf` (to be replayed or forwarded).
pub(super) async fn read_until<T>(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    cap: Cap,
    stop: impl Future<Output = ()>,
    mut verdict: impl FnMut(&[u8], usize) -> Option<T>,
) -> Result<T, Short> {
    tokio::pin!(stop);
    let mut fresh = buf.len();
    loop {
        if let Some(v) = verdict(buf, fresh) {
            return Ok(v);
        }
        let old = buf.len();
        let room = cap.bytes.saturating_sub(old).min(cap.chunk);
        if room == 0 {
            return Err(Short::Full);
        }
        // Read into the buffer's spare capacity, at most `room` bytes: nothing is
        // zeroed first (a 4 KiB memset per connection when the buffer was resized
        // to its full room before each read).
        buf.reserve(room);
        let mut spare = (&mut *buf).limit(room);
        let read = tokio::select! {
            biased;
            r = tokio::time::timeout_at(cap.deadline, stream.read_buf(&mut spare)) => match r {
                Err(_) => Err(Short::Timeout),
                Ok(Err(_) | Ok(0)) => Err(Short::Closed),
                Ok(Ok(_)) => Ok(()),
            },
            () = &mut stop => Err(Short::Stopped),
        };
        match read {
            Ok(()) => fresh = old,
            // A read that did not complete appended nothing.
            Err(short) => return Err(short),
        }
    }
}
