//! The front of a connection: from a source the listener trusts
//! (`listen[].proxy_protocol.accept_from`), read the PROXY header, bounded in bytes
//! ([`MAX_HEADER`]) and time (the `client_hello` budget, counted from accept), and
//! decide the connection's client address once; every consumer (access log, source
//! hash, stickiness, the PROXY header sent on) reads that one value. From any other
//! source nothing is parsed: its bytes are the ClientHello's.
use std::net::SocketAddr;

use tokio::io::{AsyncRead, AsyncReadExt};

use super::receive::{parse, wanted, ProxyError, ProxyParse, MAX_HEADER};
use super::{V1_PREFIX, V2_SIGNATURE};
use crate::config::ProxyAccept;

/// Who a connection is from, decided at its front.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Front {
    /// The client: the header's source, or the TCP peer (no header; or a header
    /// describing the tier's own connection: v2 LOCAL, UNSPEC, v1 UNKNOWN).
    pub client: SocketAddr,
    /// The tier the connection came through (the TCP peer), when a header was read.
    pub via: Option<SocketAddr>,
    /// The header described the tier's own connection (v2 LOCAL or UNSPEC, v1
    /// UNKNOWN): followed by a close, it is the tier's health check (a probe).
    pub own: bool,
}

/// Why a connection was ended at its front; each has its own reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FrontError {
    /// The header was refused.
    #[error(transparent)]
    Header(ProxyError),
    /// The header was not complete within the `client_hello` timeout.
    #[error("PROXY header not complete within the client_hello timeout")]
    Timeout,
    /// The peer closed (or reset) before its header was complete.
    #[error("closed before the PROXY header was complete")]
    Truncated,
    /// A PROXY header from a source the listener does not trust (never parsed: the
    /// bytes were read as a ClientHello and were not one).
    #[error("a PROXY header from a source not in this listener's accept_from")]
    Untrusted,
    /// A second PROXY header behind the one a trusted tier sent (never parsed): the
    /// tier relays a header it was sent, or sends two. Its own reason, so that the
    /// alert on `proxy_untrusted` (someone outside accept_from sends headers) does
    /// not fire for a tier's bug.
    #[error("a second PROXY header after the trusted tier's header")]
    Repeated,
}

impl FrontError {
    /// The reason word: access log `end=proxy_error:<reason>`, metric
    /// `crossbar_listener_refused_total{reason="proxy_<reason>"}`.
    pub fn reason(&self) -> &'static str {
        match self {
            FrontError::Header(e) => e.reason(),
            FrontError::Timeout => "timeout",
            FrontError::Truncated => "truncated",
            FrontError::Untrusted => "untrusted",
            FrontError::Repeated => "repeated",
        }
    }
}

/// Decide the client of a connection from `peer` under the listener's `policy`.
/// From a trusted source, read the header (never past it when it is v2; what is read
/// past a v1 line stays in `buf`, the start of the ClientHello) and remove it from
/// `buf`; without a header, `required: false` serves the peer as the client, with
/// every byte read left in `buf`.
pub async fn read_front<S: AsyncRead + Unpin>(
    stream: &mut S,
    peer: SocketAddr,
    policy: Option<&ProxyAccept>,
    buf: &mut Vec<u8>,
    deadline: tokio::time::Instant,
) -> Result<Front, FrontError> {
    let direct = Front {
        client: peer,
        via: None,
        own: false,
    };
    let Some(policy) = policy.filter(|p| p.trusts(peer.ip())) else {
        return Ok(direct);
    };
    loop {
        match parse(buf) {
            ProxyParse::Found(h, len) => {
                buf.drain(..len);
                return Ok(Front {
                    client: h.source.unwrap_or(peer),
                    via: Some(peer),
                    own: h.source.is_none(),
                });
            }
            ProxyParse::Invalid(ProxyError::Missing) if !policy.required => return Ok(direct),
            ProxyParse::Invalid(e) => return Err(FrontError::Header(e)),
            ProxyParse::NeedMore => {}
        }
        let old = buf.len();
        let room = wanted(buf).min(MAX_HEADER.saturating_sub(old)).max(1);
        buf.resize(old + room, 0);
        let read = tokio::time::timeout_at(deadline, stream.read(&mut buf[old..])).await;
        let n = match read {
            Err(_) => 0,
            Ok(Ok(n)) => n,
            Ok(Err(_)) => 0,
        };
        buf.truncate(old + n);
        match read {
            Err(_) => return Err(FrontError::Timeout),
            Ok(Ok(0)) | Ok(Err(_)) => return Err(FrontError::Truncated),
            Ok(Ok(_)) => {}
        }
    }
}

/// The longest PROXY signature (v2's): what [`header_signature`] needs at most.
pub const SIGNATURE_MAX: usize = V2_SIGNATURE.len();

/// Do bytes read where a ClientHello was expected (and which were not one) begin
/// with a PROXY header's signature, v1's `PROXY ` or v2's 12 bytes? Only the
/// signature is compared, never parsed. `None` while they are a proper prefix of
/// one: more bytes decide.
pub fn header_signature(buf: &[u8]) -> Option<bool> {
    let mut undecided = false;
    for sig in [&V1_PREFIX[..], &V2_SIGNATURE[..]] {
        let n = buf.len().min(sig.len());
        if buf.get(..n) == sig.get(..n) {
            if n == sig.len() {
                return Some(true);
            }
            undecided = true;
        }
    }
    (!undecided).then_some(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::IpNet;
    use std::time::Duration;
    use tokio::io::AsyncWriteExt;

    fn policy(required: bool) -> ProxyAccept {
        ProxyAccept {
            accept_from: vec!["127.0.0.0/8".parse::<IpNet>().unwrap()],
            required,
        }
    }

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    async fn front_of(
        bytes: &[u8],
        peer: &str,
        policy: Option<&ProxyAccept>,
        chunk: usize,
    ) -> (Result<Front, FrontError>, Vec<u8>) {
        let (mut a, mut b) = tokio::io::duplex(64);
        let data = bytes.to_vec();
        let writer = tokio::spawn(async move {
            for c in data.chunks(chunk.max(1)) {
                if b.write_all(c).await.is_err() {
                    return;
                }
            }
            // Keep the stream open a moment past the last byte, then EOF.
            tokio::task::yield_now().await;
        });
        let mut buf = Vec::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        let r = read_front(&mut a, sa(peer), policy, &mut buf, deadline).await;
        writer.abort();
        (r, buf)
    }

    const HELLO: &[u8] = &[0x16, 0x03, 0x01, 0x00, 0x05, 1, 2, 3, 4, 5];

    #[tokio::test]
    async fn a_trusted_header_names_the_client_and_leaves_the_hello() {
        let p = policy(true);
        for chunk in [1, 7, 1000] {
            for h in [
                &b"PROXY TCP4 10.9.8.7 10.0.0.1 4000 8140\r\n"[..],
                &crate::proxy_protocol::header(
                    crate::config::ProxyProtocol::V2,
                    sa("10.9.8.7:4000"),
                    sa("10.0.0.1:8140"),
                    Some("puppet"),
                ),
            ] {
                let bytes = [h, HELLO].concat();
                let (r, buf) = front_of(&bytes, "127.0.0.2:999", Some(&p), chunk).await;
                let f = r.unwrap();
                assert_eq!(f.client, sa("10.9.8.7:4000"));
                assert_eq!(f.via, Some(sa("127.0.0.2:999")));
                // Whatever was read past the header is the hello's first bytes.
                assert!(HELLO.starts_with(&buf), "{buf:?} (chunk {chunk})");
            }
        }
    }

    #[tokio::test]
    async fn untrusted_sources_and_migration_mode_parse_nothing() {
        let header = &b"PROXY TCP4 10.9.8.7 10.0.0.1 4000 8140\r\n"[..];
        // Not trusted: nothing read, the peer is the client.
        let (r, buf) = front_of(header, "192.0.2.1:5", Some(&policy(true)), 100).await;
        assert_eq!(r.unwrap().via, None);
        assert!(buf.is_empty());
        let (r, _) = front_of(header, "127.0.0.2:5", None, 100).await;
        assert_eq!(r.unwrap().via, None);
        // Trusted, no header: refused when required, the peer's when not.
        let (r, _) = front_of(HELLO, "127.0.0.2:5", Some(&policy(true)), 1).await;
        assert_eq!(r, Err(FrontError::Header(ProxyError::Missing)));
        let (r, buf) = front_of(HELLO, "127.0.0.2:5", Some(&policy(false)), 1).await;
        assert_eq!(r.unwrap().client, sa("127.0.0.2:5"));
        assert!(
            !buf.is_empty() && HELLO.starts_with(&buf),
            "the bytes read stay for the hello"
        );
        // A header cut short.
        let (r, _) = front_of(&header[..20], "127.0.0.2:5", Some(&policy(false)), 3).await;
        assert_eq!(r, Err(FrontError::Truncated));
        assert_eq!(header_signature(b"PROXY TCP4"), Some(true));
        assert_eq!(header_signature(&V2_SIGNATURE), Some(true));
        assert_eq!(header_signature(&V2_SIGNATURE[..5]), None);
        assert_eq!(header_signature(b"PRO"), None);
        assert_eq!(header_signature(b""), None);
        assert_eq!(header_signature(b"PUT /"), Some(false));
        assert_eq!(header_signature(b"PROXZ"), Some(false));
        assert_eq!(header_signature(b"\r\n\r\nhello"), Some(false));
        assert_eq!(header_signature(HELLO), Some(false));
    }

    #[tokio::test]
    async fn a_slow_header_times_out() {
        let (mut a, mut b) = tokio::io::duplex(64);
        b.write_all(b"PROXY TCP4 1.2").await.unwrap();
        let mut buf = Vec::new();
        let deadline = tokio::time::Instant::now() + Duration::from_millis(50);
        let p = policy(true);
        let r = read_front(&mut a, sa("127.0.0.1:1"), Some(&p), &mut buf, deadline).await;
        assert_eq!(r, Err(FrontError::Timeout));
        drop(b);
    }
}
