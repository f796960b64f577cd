//! How a stream ended, as one peer saw it: what tests/relay/endings.rs and tests/netem.rs
//! compare between a path through crossbar and its direct twin.
use std::io::ErrorKind;

use tokio::io::{AsyncRead, AsyncReadExt};

/// How an exchange ended, as one peer saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// A clean EOF (TLS: a close_notify) and no error on writes.
    Eof,
    /// A connection reset, on a read or a write.
    Reset,
    /// Another error (TLS: EOF without close_notify is `UnexpectedEof`).
    Error(ErrorKind),
}

/// A reset, however the socket reported it.
pub fn is_reset(kind: ErrorKind) -> bool {
    matches!(kind, ErrorKind::ConnectionReset | ErrorKind::BrokenPipe)
}

/// Combine a read's ending and a write's result into what the peer saw: a reset
/// reported once per socket may reach either (the other then sees EOF or EPIPE).
pub fn seen(read: Result<(), ErrorKind>, write: Result<(), ErrorKind>) -> Seen {
    match (read, write) {
        (Err(k), _) if is_reset(k) => Seen::Reset,
        (_, Err(k)) if is_reset(k) => Seen::Reset,
        (Err(k), _) => Seen::Error(k),
        (Ok(()), Err(k)) => Seen::Error(k),
        (Ok(()), Ok(())) => Seen::Eof,
    }
}

/// Read until EOF or error, keeping the bytes.
pub async fn read_all<S: AsyncRead + Unpin>(s: &mut S) -> (Vec<u8>, Result<(), ErrorKind>) {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match s.read(&mut buf).await {
            Ok(0) => return (out, Ok(())),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) => return (out, Err(e.kind())),
        }
    }
}
