//! The client's side: finding and parsing a ClientHello in the first bytes of a
//! connection (across TCP reads and TLS records), bounded in size.
use super::inline::{SessionId, Versions, MAX_SESSION_ID};
use super::wire::*;

/// What the client offered in its ClientHello (only what routing and stickiness need).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientHelloInfo {
    /// server_name (SNI) host name, lower-cased, trailing dot removed.
    pub sni: Option<String>,
    /// legacy_session_id (0..=32 bytes; empty when none).
    pub session_id: SessionId,
    /// Non-empty SessionTicket extension contents (RFC 5077); `None` if absent or empty.
    pub ticket: Option<Vec<u8>>,
    /// pre_shared_key identities (TLS 1.3), in offered order.
    pub psk_identities: Vec<Vec<u8>>,
    /// supported_versions (TLS 1.3 and later clients), e.g. 0x0304, 0x0303.
    pub supported_versions: Versions,
    /// The client announces TLS 1.3 early data (0-RTT) after its hello.
    pub early_data: bool,
    /// Number of bytes of the stream that make up the record(s) holding the hello.
    pub consumed: usize,
}

/// Why bytes from a client are not an acceptable ClientHello (the metric `reason` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HelloError {
    /// The first bytes are not a TLS handshake record.
    #[error("not a TLS handshake")]
    NotTls,
    /// The hello (or a record length it claims) exceeds the limit.
    #[error("ClientHello larger than the limit")]
    TooLarge,
    /// A TLS handshake record that does not hold a well-formed ClientHello.
    #[error("malformed ClientHello")]
    Malformed,
    /// The client closed before the hello was complete.
    #[error("connection closed before the ClientHello was complete")]
    Truncated,
    /// The client did not finish its hello within the client_hello timeout.
    #[error("timed out waiting for the ClientHello")]
    Timeout,
}

impl HelloError {
    /// The metric label / access-log reason for this error.
    pub fn reason(&self) -> &'static str {
        match self {
            HelloError::NotTls => "not_tls",
            HelloError::TooLarge => "too_large",
            HelloError::Malformed => "malformed",
            HelloError::Truncated => "truncated",
            HelloError::Timeout => "timeout",
        }
    }
}

/// Outcome of looking at the bytes received so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HelloParse {
    /// More bytes are needed.
    NeedMore,
    /// The bytes can't be a ClientHello within the limit.
    Invalid(HelloError),
    /// A complete ClientHello.
    Found(ClientHelloInfo),
}

/// Inspect the first bytes a client sent. Pure: call again with more bytes on `NeedMore`.
///
/// `buf` is everything received so far; `max` bounds the bytes of stream the hello may
/// take (record headers included): a hello that claims more is `TooLarge` at once,
/// without waiting for its bytes.
///
/// - `NotTls` as soon as the first byte is not 0x16 (handshake) or the second not 0x03,
///   so plain HTTP or an SSH banner is refused after one or two bytes.
/// - The hello may span several handshake records; their payloads are joined until the
///   handshake message is complete. Any other record type in between, a record longer
///   than [`MAX_RECORD_LEN`] or empty, or a first message that is not a ClientHello is
///   `Malformed`.
/// - `Found` only once every record carrying the hello is complete; `consumed` is the
///   end of the last of them. Bytes after it (early data) are not looked at.
/// - SNI: a host_name that is not UTF-8 or is empty is `Malformed` (RFC 6066 says
///   ASCII; a backend would refuse it too, and routing it to a default service would
///   hide a broken or hostile client).
/// - Extensions are parsed by tls-parser; where it gives up on one (it is strict about
///   some we don't need), a manual walk of the extension list reads the five we need,
///   so an odd extension from a real client does not cost us the connection.
pub fn parse_client_hello(buf: &[u8], max: usize) -> HelloParse {
    match client_hello_bytes(buf, max) {
        Ok(Some((message, consumed))) => match parse_hello_message(counted(message.bytes(buf))) {
            Some(mut info) => {
                info.consumed = consumed;
                HelloParse::Found(info)
            }
            None => HelloParse::Invalid(HelloError::Malformed),
        },
        Ok(None) => HelloParse::NeedMore,
        Err(e) => HelloParse::Invalid(e),
    }
}

/// Where the complete ClientHello message is.
pub(super) enum HelloMessage {
    /// Within one record of the buffer (every real client): borrowed, not copied.
    InRecord(std::ops::Range<usize>),
    /// Spread over several records: their payloads joined.
    Joined(Vec<u8>),
}

impl HelloMessage {
    /// The message's bytes, `buf` being the buffer it was found in.
    pub(super) fn bytes<'a>(&'a self, buf: &'a [u8]) -> &'a [u8] {
        match self {
            HelloMessage::InRecord(r) => buf.get(r.clone()).unwrap_or(&[]),
            HelloMessage::Joined(v) => v,
        }
    }
}

/// Find the first handshake message, joining handshake records until it is complete.
///
/// Returns the message (header included) and the stream bytes its records take,
/// `Ok(None)` when more bytes are needed.
pub(super) fn client_hello_bytes(
    buf: &[u8],
    max: usize,
) -> Result<Option<(HelloMessage, usize)>, HelloError> {
    match buf.first() {
        None => return Ok(None),
        Some(&CONTENT_HANDSHAKE) => {}
        Some(_) => return Err(HelloError::NotTls),
    }
    match buf.get(1) {
        None => return Ok(None),
        Some(&RECORD_VERSION_MAJOR) => {}
        Some(_) => return Err(HelloError::NotTls),
    }
    let mut joined: Vec<u8> = Vec::new();
    let mut pos = 0usize;
    loop {
        // A later record must also be a handshake record of TLS.
        match buf.get(pos) {
            None => return Ok(None),
            Some(&CONTENT_HANDSHAKE) => {}
            Some(_) => return Err(HelloError::Malformed),
        }
        match buf.get(pos + 1) {
            None => return Ok(None),
            Some(&RECORD_VERSION_MAJOR) => {}
            Some(_) => return Err(HelloError::Malformed),
        }
        let Some(len) = read_u16(buf, pos + 3) else {
            return Ok(None);
        };
        work::add(RECORD_HEADER_LEN);
        let len = usize::from(len);
        if len == 0 || len > MAX_RECORD_LEN {
            // RFC 8446 5.1: zero-length handshake fragments are not allowed.
            return Err(HelloError::Malformed);
        }
        let body_start = pos + RECORD_HEADER_LEN;
        let record_end = body_start + len;
        if record_end > max {
            return Err(HelloError::TooLarge);
        }
        // Look at what we have of this record: the handshake header may already be there.
        let available = buf
            .get(body_start..record_end.min(buf.len()))
            .unwrap_or(&[]);
        check_handshake_header(&joined, available, max)?;
        if buf.len() < record_end {
            return Ok(None);
        }
        if joined.is_empty() {
            if let Some(msg_len) = read_u24(available, 1) {
                let total = HANDSHAKE_HEADER_LEN + msg_len;
                if available.len() >= total {
                    let message = body_start..body_start + total;
                    return Ok(Some((HelloMessage::InRecord(message), record_end)));
                }
            }
        }
        joined.extend_from_slice(counted(available));
        if let Some(msg_len) = read_u24(&joined, 1) {
            let total = HANDSHAKE_HEADER_LEN + msg_len;
            if joined.len() >= total {
                joined.truncate(total);
                return Ok(Some((HelloMessage::Joined(joined), record_end)));
            }
            // The records still missing need at least one more header each.
            if record_end + RECORD_HEADER_LEN + (total - joined.len()) > max {
                return Err(HelloError::TooLarge);
            }
        }
        pos = record_end;
    }
}

/// Check as much of the handshake message's 4-byte header as `joined` and the
/// current record's `available` bytes hold: a ClientHello, not claiming more than
/// `max` bytes. Only the header is copied: copying all of `joined` per record made
/// a hello of many tiny records cost time cubic in their number over conn's
/// re-parses (many_tiny_records_parse_in_linear_time below).
fn check_handshake_header(joined: &[u8], available: &[u8], max: usize) -> Result<(), HelloError> {
    let mut head = [0u8; HANDSHAKE_HEADER_LEN];
    let mut head_len = 0;
    for (slot, &b) in head.iter_mut().zip(joined.iter().chain(available)) {
        *slot = b;
        head_len += 1;
    }
    let view = counted(&head[..head_len]);
    if let Some(&msg_type) = view.first() {
        if msg_type != HS_CLIENT_HELLO {
            return Err(HelloError::Malformed);
        }
    }
    if let Some(msg_len) = read_u24(view, 1) {
        if HANDSHAKE_HEADER_LEN + msg_len > max {
            return Err(HelloError::TooLarge);
        }
    }
    Ok(())
}

/// `bytes`, counted as work for tests ([`work`]): the parser looks at or copies them.
fn counted(bytes: &[u8]) -> &[u8] {
    work::add(bytes.len());
    bytes
}

/// The work of the parser, in bytes looked at or copied (each record header, the
/// handshake header read across records, each payload byte joined, the message
/// handed to tls-parser): counted in unit tests only, so a test can bound the work
/// of a parse without a clock (`many_tiny_records_parse_in_linear_time`).
mod work {
    #[cfg(test)]
    thread_local! {
        static DONE: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    /// Count `bytes` of work (nothing outside tests).
    #[inline]
    pub(super) fn add(bytes: usize) {
        #[cfg(test)]
        DONE.with(|d| d.set(d.get() + bytes));
        #[cfg(not(test))]
        let _ = bytes;
    }

    /// The work counted on this thread since the last call.
    #[cfg(test)]
    pub(super) fn take() -> usize {
        DONE.with(|d| d.replace(0))
    }
}

/// The parts of a ClientHello body we read, borrowed from the message.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct HelloParts<'a> {
    /// legacy_session_id.
    pub(super) session_id: &'a [u8],
    /// The extensions block without its length (empty when there is none).
    pub(super) extensions: &'a [u8],
}

/// Split a complete ClientHello message (header included) into its parts (RFC 8446
/// 4.1.2): `legacy_version(2) random(32) session_id<0..32> cipher_suites<2..2^16-2>
/// compression_methods<1..2^8-1> [extensions<8..2^16-1>]`. Borrows, allocates
/// nothing; `None` unless the parts add up to the message exactly (a trailing
/// byte, an odd cipher list or an overlong extensions block is malformed).
pub(super) fn client_hello_parts(message: &[u8]) -> Option<HelloParts<'_>> {
    let mut r = Reader::new(message);
    if r.u8()? != HS_CLIENT_HELLO {
        return None;
    }
    let len = read_u24(r.take(3)?, 0)?;
    let mut body = Reader::new(r.take(len)?);
    if !r.is_empty() {
        return None;
    }
    body.take(2 + 32)?; // legacy_version, random
    let session_id = body.vec8()?;
    let ciphers = body.vec16()?;
    let compression = body.vec8()?;
    if session_id.len() > MAX_SESSION_ID || ciphers.len() % 2 != 0 || compression.is_empty() {
        return None;
    }
    let extensions = if body.is_empty() {
        &[][..]
    } else {
        body.vec16()?
    };
    if !body.is_empty() {
        return None;
    }
    Some(HelloParts {
        session_id,
        extensions,
    })
}

/// Read one complete ClientHello handshake message (header included): the parts
/// ([`client_hello_parts`]) and the extensions ([`walk_extensions`]), borrowed; only
/// what the connection keeps (the normalised SNI, an offered ticket or PSK
/// identities) is copied.
pub(super) fn parse_hello_message(message: &[u8]) -> Option<ClientHelloInfo> {
    let parts = client_hello_parts(message)?;
    let ext = walk_extensions(parts.extensions, Side::Client)?;
    let sni = match ext.sni {
        None => None,
        Some(name) => Some(normalize_host_name(name)?),
    };
    let psk_identities = match ext.psk {
        None => Vec::new(),
        Some(psk) => parse_psk_identities(psk)?,
    };
    Some(ClientHelloInfo {
        sni,
        session_id: SessionId::new(parts.session_id)?,
        ticket: ext.ticket.filter(|t| !t.is_empty()).map(<[u8]>::to_vec),
        psk_identities,
        supported_versions: ext.versions,
        early_data: ext.early_data,
        consumed: 0,
    })
}

/// A SNI host name as routing compares it: lower-case, no trailing dot.
/// `None` (→ Malformed) if it is empty or not UTF-8.
pub(super) fn normalize_host_name(name: &[u8]) -> Option<String> {
    let name = std::str::from_utf8(name).ok()?;
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.is_empty() {
        return None;
    }
    Some(name.to_ascii_lowercase())
}

/// The identities of a ClientHello pre_shared_key extension (RFC 8446 4.2.11):
/// `identities<7..2^16-1>` of `{ opaque identity<1..2^16-1>; uint32 age; }`, then binders.
pub(super) fn parse_psk_identities(ext: &[u8]) -> Option<Vec<Vec<u8>>> {
    let mut r = Reader::new(ext);
    let mut list = Reader::new(r.vec16()?);
    let mut identities = Vec::new();
    while !list.is_empty() {
        identities.push(list.vec16()?.to_vec());
        list.take(4)?; // obfuscated_ticket_age
    }
    Some(identities)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A handshake message of `len` bytes (type ClientHello, body filler) carried in
    /// records of one payload byte each: 6 stream bytes per message byte, the most
    /// records a hello within `max_hello_size` can have.
    fn one_byte_records(len: usize) -> Vec<u8> {
        let mut message = vec![HS_CLIENT_HELLO];
        message.extend_from_slice(&((len - 4) as u32).to_be_bytes()[1..]);
        message.resize(len, 0x42);
        let mut out = Vec::with_capacity(len * 6);
        for b in message {
            out.extend_from_slice(&[CONTENT_HANDSHAKE, 0x03, 0x01, 0x00, 0x01, b]);
        }
        out
    }

    /// Work a linear parse may do per byte buffered: for 1-byte records, 5 header
    /// bytes, at most 4 bytes of handshake header and 1 payload byte per 6 bytes of
    /// stream, plus the message once (1/6): 1.84 at most. A parse that walks or
    /// copies what it already joined once per record does ~records / 12 per byte
    /// (over 200 at the end here).
    const WORK_PER_BUFFERED_BYTE: usize = 2;
    /// Work that doesn't grow with the buffer.
    const WORK_SLACK: usize = 64;

    /// Regression (found writing the fuzz properties): a hello cut into 1-byte
    /// records made each parse copy the joined payload once per record, and conn
    /// parses again after every read, so a client trickling such a hello cost CPU
    /// cubic in the number of records (seconds per connection at the default 16 KiB
    /// limit). A parse must be linear in the bytes buffered: measured in the work
    /// the parser counts (bytes looked at or copied, [`work`]), not in time or
    /// allocations, so neither a loaded machine nor a parser that re-walks its
    /// records without allocating can pass or fail it wrongly.
    #[test]
    fn many_tiny_records_parse_in_linear_time() {
        let max = 16 * 1024;
        // The largest message whose 1-byte records still fit within `max`.
        let framed = one_byte_records((max - 16) / 6);
        assert!(framed.len() <= max);
        let mut most = 0.0f64;
        // A read completes every record (6 bytes): conn parses the buffer again.
        for end in (6..=framed.len()).step_by(6) {
            work::take();
            let r = parse_client_hello(&framed[..end], max);
            let done = work::take();
            let want_more = end < framed.len();
            assert_eq!(r == HelloParse::NeedMore, want_more, "at {end}: {r:?}");
            assert!(
                done <= WORK_PER_BUFFERED_BYTE * end + WORK_SLACK,
                "parsing {end} bytes of 1-byte records took {done} bytes of work"
            );
            most = most.max(done as f64 / end as f64);
        }
        println!(
            "{} one-byte records: at most {most:.2} bytes of work per byte buffered",
            framed.len() / 6
        );
    }
}
