//! TLS handshake inspection: the client's ClientHello and the server's plaintext flight.
//!
//! crossbar never terminates TLS. It reads the client's first bytes to route (SNI) and
//! to find the session the client wants to resume (session ID, ticket, PSK identities),
//! then watches the server's plaintext reply to learn what the server actually chose.
//! Both sides are parsed with `tls-parser`, on top of a small record/handshake
//! reassembly layer of our own: a ClientHello with post-quantum key shares is
//! 1.5-2 KiB and can arrive split over TCP reads and over several TLS records.
//!
//! Nothing here panics on hostile input: every length is checked before use.

use tls_parser::{
    parse_tls_client_hello_extensions, parse_tls_message_handshake,
    parse_tls_server_hello_extensions, TlsExtension, TlsMessage, TlsMessageHandshake,
};

/// TLS record header: content type (1), legacy version (2), length (2).
const RECORD_HEADER_LEN: usize = 5;
/// Handshake message header: type (1), length (3).
const HANDSHAKE_HEADER_LEN: usize = 4;
/// Largest record body we accept: 2^14 plaintext (RFC 8446 5.1) plus the 2048 bytes of
/// expansion TLS 1.2 allows for ciphertext (RFC 5246 6.2.3); anything longer is garbage.
const MAX_RECORD_LEN: usize = 16384 + 2048;

/// Record content types (RFC 8446 5.1).
const CONTENT_CHANGE_CIPHER_SPEC: u8 = 0x14;
const CONTENT_ALERT: u8 = 0x15;
const CONTENT_HANDSHAKE: u8 = 0x16;
/// Major byte of every SSL 3.0 / TLS record version (0x0300..=0x0304).
const RECORD_VERSION_MAJOR: u8 = 0x03;

/// Handshake message types (RFC 8446 4, RFC 5246 7.4).
const HS_CLIENT_HELLO: u8 = 1;
const HS_SERVER_HELLO: u8 = 2;
const HS_NEW_SESSION_TICKET: u8 = 4;
const HS_CERTIFICATE: u8 = 11;
const HS_SERVER_KEY_EXCHANGE: u8 = 12;
const HS_CERTIFICATE_REQUEST: u8 = 13;
const HS_SERVER_HELLO_DONE: u8 = 14;

/// Extension types we read (IANA "TLS ExtensionType Values").
const EXT_SERVER_NAME: u16 = 0;
const EXT_ALPN: u16 = 16;
const EXT_SESSION_TICKET: u16 = 35;
const EXT_PRE_SHARED_KEY: u16 = 41;
const EXT_EARLY_DATA: u16 = 42;
const EXT_SUPPORTED_VERSIONS: u16 = 43;
/// server_name NameType host_name (RFC 6066 3).
const SNI_HOST_NAME: u8 = 0;

/// The ServerHello.random that marks a HelloRetryRequest: SHA-256("HelloRetryRequest")
/// (RFC 8446 4.1.3). A test recomputes it.
const HELLO_RETRY_RANDOM: [u8; 32] = [
    0xcf, 0x21, 0xad, 0x74, 0xe5, 0x9a, 0x61, 0x11, 0xbe, 0x1d, 0x8c, 0x02, 0x1e, 0x65, 0xb8, 0x91,
    0xc2, 0xa2, 0x11, 0x16, 0x7a, 0xbb, 0x8c, 0x5e, 0x07, 0x9e, 0x09, 0xe2, 0xc8, 0xa8, 0x33, 0x9c,
];

/// What the client offered in its ClientHello (only what routing and stickiness need).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientHelloInfo {
    /// server_name (SNI) host name, lower-cased, trailing dot removed.
    pub sni: Option<String>,
    /// legacy_session_id (0..=32 bytes; empty when none).
    pub session_id: Vec<u8>,
    /// Non-empty SessionTicket extension contents (RFC 5077); `None` if absent or empty.
    pub ticket: Option<Vec<u8>>,
    /// True if the SessionTicket extension was present (even empty).
    pub ticket_ext: bool,
    /// pre_shared_key identities (TLS 1.3), in offered order.
    pub psk_identities: Vec<Vec<u8>>,
    /// supported_versions (TLS 1.3 and later clients), e.g. 0x0304, 0x0303.
    pub supported_versions: Vec<u16>,
    /// ALPN protocol names.
    pub alpn: Vec<Vec<u8>>,
    /// legacy_version of the ClientHello body (0x0303 for TLS 1.2 and 1.3).
    pub legacy_version: u16,
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
        Ok(Some((message, consumed))) => match parse_hello_message(&message) {
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

/// Join handshake records until the first handshake message is complete.
///
/// Returns the message (header included) and the stream bytes its records take,
/// `Ok(None)` when more bytes are needed.
fn client_hello_bytes(buf: &[u8], max: usize) -> Result<Option<(Vec<u8>, usize)>, HelloError> {
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
        // Only the 4-byte handshake header is needed from it: copying all of `joined`
        // per record made a hello of many tiny records cost time cubic in their number
        // over conn.rs's re-parses (tests/fuzz_props.rs, many_tiny_records_...).
        let mut head = [0u8; HANDSHAKE_HEADER_LEN];
        let mut head_len = 0;
        for (slot, &b) in head.iter_mut().zip(joined.iter().chain(available)) {
            *slot = b;
            head_len += 1;
        }
        let view = &head[..head_len];
        if let Some(&msg_type) = view.first() {
            if msg_type != HS_CLIENT_HELLO {
                return Err(HelloError::Malformed);
            }
        }
        if let Some(msg_len) = read_u24(view, 1) {
            let total = HANDSHAKE_HEADER_LEN + msg_len;
            if total > max {
                return Err(HelloError::TooLarge);
            }
        }
        if buf.len() < record_end {
            return Ok(None);
        }
        joined.extend_from_slice(available);
        if let Some(msg_len) = read_u24(&joined, 1) {
            let total = HANDSHAKE_HEADER_LEN + msg_len;
            if joined.len() >= total {
                joined.truncate(total);
                return Ok(Some((joined, record_end)));
            }
            // The records still missing need at least one more header each.
            if record_end + RECORD_HEADER_LEN + (total - joined.len()) > max {
                return Err(HelloError::TooLarge);
            }
        }
        pos = record_end;
    }
}

/// Parse one complete ClientHello handshake message (header included) with tls-parser.
fn parse_hello_message(message: &[u8]) -> Option<ClientHelloInfo> {
    let (_, parsed) = parse_tls_message_handshake(message).ok()?;
    let TlsMessage::Handshake(TlsMessageHandshake::ClientHello(hello)) = parsed else {
        return None;
    };
    // tls-parser drops trailing bytes and turns an overlong extensions block into "no
    // extensions": check that the parts it found add up to the whole message.
    let session_id = hello.session_id.unwrap_or(&[]);
    let ext_len = hello.ext.map_or(0, |e| 2 + e.len());
    let body_len = 2
        + 32
        + 1
        + session_id.len()
        + 2
        + 2 * hello.ciphers.len()
        + 1
        + hello.comp.len()
        + ext_len;
    if HANDSHAKE_HEADER_LEN + body_len != message.len() {
        return None;
    }
    let ext = read_extensions(hello.ext.unwrap_or(&[]), Side::Client)?;
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
        session_id: session_id.to_vec(),
        ticket: ext.ticket.filter(|t| !t.is_empty()).map(<[u8]>::to_vec),
        ticket_ext: ext.ticket.is_some(),
        psk_identities,
        supported_versions: ext.versions,
        alpn: ext.alpn.into_iter().map(<[u8]>::to_vec).collect(),
        legacy_version: hello.version.0,
        early_data: ext.early_data,
        consumed: 0,
    })
}

/// A SNI host name as routing compares it: lower-case, no trailing dot.
/// `None` (→ Malformed) if it is empty or not UTF-8.
fn normalize_host_name(name: &[u8]) -> Option<String> {
    let name = std::str::from_utf8(name).ok()?;
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.is_empty() {
        return None;
    }
    Some(name.to_ascii_lowercase())
}

/// The identities of a ClientHello pre_shared_key extension (RFC 8446 4.2.11):
/// `identities<7..2^16-1>` of `{ opaque identity<1..2^16-1>; uint32 age; }`, then binders.
fn parse_psk_identities(ext: &[u8]) -> Option<Vec<Vec<u8>>> {
    let mut r = Reader::new(ext);
    let mut list = Reader::new(r.vec16()?);
    let mut identities = Vec::new();
    while !list.is_empty() {
        identities.push(list.vec16()?.to_vec());
        list.take(4)?; // obfuscated_ticket_age
    }
    Some(identities)
}

/// Which hello an extension list belongs to (supported_versions differs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Client,
    Server,
}

/// The extension contents we care about, borrowed from the hello.
#[derive(Debug, Default)]
struct Extensions<'a> {
    /// First host_name of server_name.
    sni: Option<&'a [u8]>,
    /// SessionTicket contents (maybe empty).
    ticket: Option<&'a [u8]>,
    /// Raw pre_shared_key contents (client: identities + binders; server: u16 index).
    psk: Option<&'a [u8]>,
    /// supported_versions (client: the offered list; server: the selected one).
    versions: Vec<u16>,
    /// ALPN protocol names.
    alpn: Vec<&'a [u8]>,
    /// early_data is present.
    early_data: bool,
}

/// Read the extensions we need: tls-parser first, a manual walk if it gave up early.
fn read_extensions(ext: &[u8], side: Side) -> Option<Extensions<'_>> {
    let parsed = match side {
        Side::Client => parse_tls_client_hello_extensions(ext),
        Side::Server => parse_tls_server_hello_extensions(ext),
    };
    match parsed {
        // tls-parser's list parser stops silently at the first extension it can't
        // parse and returns the rest: only an empty rest means it read them all.
        Ok((&[], list)) => Some(from_tls_parser(&list)),
        _ => walk_extensions(ext, side),
    }
}

/// Pick our fields out of tls-parser's extension list.
fn from_tls_parser<'a>(list: &[TlsExtension<'a>]) -> Extensions<'a> {
    let mut out = Extensions::default();
    for ext in list {
        match ext {
            TlsExtension::SNI(names) if out.sni.is_none() => {
                out.sni = names
                    .iter()
                    .find(|(kind, _)| kind.0 == SNI_HOST_NAME)
                    .map(|&(_, name)| name);
            }
            TlsExtension::SessionTicket(t) => out.ticket = Some(t),
            TlsExtension::PreSharedKey(p) => out.psk = Some(p),
            TlsExtension::SupportedVersions(v) => out.versions = v.iter().map(|v| v.0).collect(),
            TlsExtension::ALPN(names) => out.alpn = names.clone(),
            TlsExtension::EarlyData(_) => out.early_data = true,
            _ => {}
        }
    }
    out
}

/// The fallback: walk `extensions<..>` by hand and decode only the five we need.
/// `None` if the list itself or one of those five is malformed.
fn walk_extensions(ext: &[u8], side: Side) -> Option<Extensions<'_>> {
    let mut out = Extensions::default();
    let mut r = Reader::new(ext);
    while !r.is_empty() {
        let kind = r.u16()?;
        let data = r.vec16()?;
        let mut d = Reader::new(data);
        match kind {
            EXT_SERVER_NAME if side == Side::Client && out.sni.is_none() => {
                let mut names = Reader::new(d.vec16()?);
                while !names.is_empty() {
                    let name_type = names.u8()?;
                    let name = names.vec16()?;
                    if name_type == SNI_HOST_NAME && out.sni.is_none() {
                        out.sni = Some(name);
                    }
                }
            }
            EXT_SESSION_TICKET => out.ticket = Some(data),
            EXT_PRE_SHARED_KEY => out.psk = Some(data),
            EXT_EARLY_DATA => out.early_data = true,
            EXT_SUPPORTED_VERSIONS => {
                out.versions.clear();
                let mut list = match side {
                    Side::Client => Reader::new(d.vec8()?),
                    Side::Server => d,
                };
                while !list.is_empty() {
                    out.versions.push(list.u16()?);
                }
            }
            EXT_ALPN => {
                let mut names = Reader::new(d.vec16()?);
                out.alpn.clear();
                while !names.is_empty() {
                    out.alpn.push(names.vec8()?);
                }
            }
            _ => {}
        }
    }
    Some(out)
}

/// Big-endian u16 at `at`, if there.
fn read_u16(buf: &[u8], at: usize) -> Option<u16> {
    let b = buf.get(at..at.checked_add(2)?)?;
    Some(u16::from_be_bytes([b[0], b[1]]))
}

/// Big-endian u24 at `at`, if there.
fn read_u24(buf: &[u8], at: usize) -> Option<usize> {
    let b = buf.get(at..at.checked_add(3)?)?;
    Some(usize::from(b[0]) << 16 | usize::from(b[1]) << 8 | usize::from(b[2]))
}

/// A bounds-checked cursor over TLS wire structures: every read is an `Option`.
#[derive(Debug, Clone, Copy)]
struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Reader { buf }
    }

    fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.buf.len() {
            return None;
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Some(head)
    }

    fn u8(&mut self) -> Option<u8> {
        self.take(1)?.first().copied()
    }

    fn u16(&mut self) -> Option<u16> {
        let b = self.take(2)?;
        read_u16(b, 0)
    }

    /// `opaque x<0..2^8-1>`.
    fn vec8(&mut self) -> Option<&'a [u8]> {
        let n = self.u8()?;
        self.take(usize::from(n))
    }

    /// `opaque x<0..2^16-1>`.
    fn vec16(&mut self) -> Option<&'a [u8]> {
        let n = self.u16()?;
        self.take(usize::from(n))
    }
}

/// TLS version numbers as they appear on the wire.
pub mod version {
    /// TLS 1.0.
    pub const TLS10: u16 = 0x0301;
    /// TLS 1.1.
    pub const TLS11: u16 = 0x0302;
    /// TLS 1.2.
    pub const TLS12: u16 = 0x0303;
    /// TLS 1.3.
    pub const TLS13: u16 = 0x0304;
}

/// What the server's plaintext handshake showed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerHandshake {
    /// Negotiated version (supported_versions in the ServerHello, else its legacy_version).
    pub version: Option<u16>,
    /// The session ID in the ServerHello (TLS <= 1.2: assigned by the server).
    pub session_id: Vec<u8>,
    /// A HelloRetryRequest was seen.
    pub hello_retry: bool,
    /// TLS 1.3: index of the PSK identity the server accepted (pre_shared_key extension).
    pub psk_selected: Option<u16>,
    /// TLS 1.2: the ticket of a NewSessionTicket (without its 2-byte length).
    pub new_ticket: Option<Vec<u8>>,
    /// Whether the handshake resumed a session; `None` until known.
    pub resumed: Option<bool>,
    /// The server sent a TLS alert during the handshake.
    pub alert: bool,
    /// TLS <= 1.2: the server sent its ChangeCipherSpec. In a full handshake that
    /// comes only after the client's Finished, so the client completed the handshake.
    pub server_ccs: bool,
}

/// Where the watcher is in the server's flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Stage {
    /// Nothing yet, or a HelloRetryRequest: the next handshake message must be a ServerHello.
    #[default]
    ExpectServerHello,
    /// TLS <= 1.2 ServerHello seen: the next message tells full from resumed.
    AfterServerHello,
    /// TLS <= 1.2, kind known: watching for a NewSessionTicket until the server's CCS.
    UntilChangeCipherSpec,
}

/// Watches the server->client bytes of a handshake, chunk by chunk, until there is
/// nothing more to learn (ChangeCipherSpec/encrypted records, or a byte limit).
///
/// Records and handshake messages are reassembled across chunks. It stops (done):
/// - TLS 1.3: at the real ServerHello (after any HelloRetryRequest), since the rest is
///   encrypted; `resumed` is whether the server selected a PSK.
/// - TLS <= 1.2: at the server's ChangeCipherSpec or an application-data record; the
///   message after the ServerHello tells full (Certificate, ServerKeyExchange, ...) from
///   resumed (NewSessionTicket or CCS); a NewSessionTicket's ticket is kept.
/// - at an alert (`alert = true`), at anything that is not a TLS record, and once `limit`
///   bytes have been fed: it never holds more than `limit` bytes.
#[derive(Debug, Default)]
pub struct ServerWatcher {
    info: ServerHandshake,
    done: bool,
    /// Bytes fed so far (what `limit` bounds).
    fed: usize,
    /// Most bytes this watcher will look at.
    limit: usize,
    /// The incomplete record at the end of what was fed.
    record: Vec<u8>,
    /// Handshake bytes of complete records not yet forming a complete message.
    handshake: Vec<u8>,
    stage: Stage,
}

impl ServerWatcher {
    /// A watcher for a connection whose ClientHello was `client`.
    ///
    /// Everything is learned from the server's side (what it assigned or accepted), never
    /// from the client's claims, so `client` is not used to decide anything; `limit` is
    /// the most server bytes looked at (a full TLS 1.2 flight with a certificate chain
    /// is a few KiB).
    pub fn new(_client: &ClientHelloInfo, limit: usize) -> ServerWatcher {
        ServerWatcher {
            limit,
            done: limit == 0,
            ..ServerWatcher::default()
        }
    }

    /// Feed the next bytes the server sent; returns true when watching is over.
    pub fn feed(&mut self, data: &[u8]) -> bool {
        if self.done {
            return true;
        }
        let room = self.limit.saturating_sub(self.fed);
        let data = data.get(..room.min(data.len())).unwrap_or(&[]);
        self.fed += data.len();
        self.record.extend_from_slice(data);
        self.process_records();
        if self.fed >= self.limit {
            self.done = true;
        }
        self.done
    }

    /// True once there is nothing more to learn.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// What was learned so far.
    pub fn info(&self) -> &ServerHandshake {
        &self.info
    }

    /// Handle every complete record in `self.record`.
    fn process_records(&mut self) {
        let mut start = 0usize;
        while !self.done {
            let rest = self.record.get(start..).unwrap_or(&[]);
            let Some(&content_type) = rest.first() else {
                break;
            };
            if !matches!(
                content_type,
                CONTENT_HANDSHAKE | CONTENT_ALERT | CONTENT_CHANGE_CIPHER_SPEC
            ) || rest
                .get(1)
                .is_some_and(|&major| major != RECORD_VERSION_MAJOR)
            {
                // Application data (encrypted from here on) or not TLS at all.
                self.done = true;
                break;
            }
            let Some(len) = read_u16(rest, 3).map(usize::from) else {
                break;
            };
            if len > MAX_RECORD_LEN {
                self.done = true;
                break;
            }
            let Some(body) = rest.get(RECORD_HEADER_LEN..RECORD_HEADER_LEN + len) else {
                break;
            };
            let body = body.to_vec();
            start += RECORD_HEADER_LEN + len;
            self.on_record(content_type, &body);
        }
        self.record.drain(..start.min(self.record.len()));
    }

    /// One complete record.
    fn on_record(&mut self, content_type: u8, body: &[u8]) {
        match content_type {
            CONTENT_ALERT => {
                self.info.alert = true;
                self.done = true;
            }
            CONTENT_CHANGE_CIPHER_SPEC => self.on_change_cipher_spec(),
            _ => {
                self.handshake.extend_from_slice(body);
                self.process_messages();
            }
        }
    }

    /// The server's ChangeCipherSpec.
    fn on_change_cipher_spec(&mut self) {
        match self.stage {
            // TLS 1.3 middlebox compatibility: a CCS follows the HelloRetryRequest.
            Stage::ExpectServerHello if self.info.hello_retry && self.handshake.is_empty() => {}
            // TLS 1.2 abbreviated handshake: CCS right after the ServerHello.
            Stage::AfterServerHello => {
                self.info.resumed = Some(true);
                self.info.server_ccs = true;
                self.done = true;
            }
            Stage::UntilChangeCipherSpec => {
                self.info.server_ccs = true;
                self.done = true;
            }
            _ => self.done = true,
        }
    }

    /// Handle every complete handshake message in `self.handshake`.
    fn process_messages(&mut self) {
        let mut start = 0usize;
        while !self.done {
            let rest = self.handshake.get(start..).unwrap_or(&[]);
            let Some(len) = read_u24(rest, 1) else {
                break;
            };
            let total = HANDSHAKE_HEADER_LEN + len;
            if total > self.limit {
                // It can never be complete within the limit.
                self.done = true;
                break;
            }
            let Some(message) = rest.get(..total) else {
                break;
            };
            let message = message.to_vec();
            start += total;
            self.on_message(&message);
        }
        self.handshake.drain(..start.min(self.handshake.len()));
    }

    /// One complete handshake message (header included).
    fn on_message(&mut self, message: &[u8]) {
        let msg_type = message.first().copied().unwrap_or_default();
        match (self.stage, msg_type) {
            (Stage::ExpectServerHello, HS_SERVER_HELLO) => self.on_server_hello(message),
            (Stage::ExpectServerHello, _) => self.done = true,
            (Stage::AfterServerHello, HS_NEW_SESSION_TICKET) => {
                self.info.resumed = Some(true);
                self.stage = Stage::UntilChangeCipherSpec;
                self.on_new_session_ticket(message);
            }
            (
                Stage::AfterServerHello,
                HS_CERTIFICATE
                | HS_SERVER_KEY_EXCHANGE
                | HS_CERTIFICATE_REQUEST
                | HS_SERVER_HELLO_DONE,
            ) => {
                self.info.resumed = Some(false);
                self.stage = Stage::UntilChangeCipherSpec;
            }
            (Stage::UntilChangeCipherSpec, HS_NEW_SESSION_TICKET) => {
                self.on_new_session_ticket(message)
            }
            // Other messages (CertificateStatus, ...) teach us nothing.
            _ => {}
        }
    }

    /// A ServerHello or HelloRetryRequest.
    fn on_server_hello(&mut self, message: &[u8]) {
        let Some(hello) = parse_server_hello(message) else {
            self.done = true;
            return;
        };
        self.info.version = Some(hello.version);
        self.info.session_id = hello.session_id;
        if hello.retry {
            // The real ServerHello follows the client's second hello.
            self.info.hello_retry = true;
            return;
        }
        if hello.version >= version::TLS13 {
            self.info.psk_selected = hello.psk_selected;
            self.info.resumed = Some(hello.psk_selected.is_some());
            self.done = true;
        } else {
            self.stage = Stage::AfterServerHello;
        }
    }

    /// A TLS 1.2 NewSessionTicket: `uint32 lifetime_hint; opaque ticket<0..2^16-1>`
    /// (RFC 5077 3.3). An empty ticket means "none after all".
    fn on_new_session_ticket(&mut self, message: &[u8]) {
        let Ok((_, TlsMessage::Handshake(TlsMessageHandshake::NewSessionTicket(nst)))) =
            parse_tls_message_handshake(message)
        else {
            return;
        };
        // tls-parser leaves the ticket's own 2-byte length in front of it.
        if let Some(ticket) = Reader::new(nst.ticket).vec16() {
            if !ticket.is_empty() {
                self.info.new_ticket = Some(ticket.to_vec());
            }
        }
    }
}

/// The fields of a ServerHello the watcher needs.
struct ServerHelloFields {
    version: u16,
    session_id: Vec<u8>,
    psk_selected: Option<u16>,
    retry: bool,
}

/// Parse a ServerHello message (header included) with tls-parser.
fn parse_server_hello(message: &[u8]) -> Option<ServerHelloFields> {
    let (_, parsed) = parse_tls_message_handshake(message).ok()?;
    let TlsMessage::Handshake(TlsMessageHandshake::ServerHello(hello)) = parsed else {
        return None;
    };
    let ext = read_extensions(hello.ext.unwrap_or(&[]), Side::Server)?;
    let psk_selected = match ext.psk {
        Some(p) => Some(Reader::new(p).u16()?),
        None => None,
    };
    Some(ServerHelloFields {
        version: ext.versions.first().copied().unwrap_or(hello.version.0),
        session_id: hello.session_id.unwrap_or(&[]).to_vec(),
        psk_selected,
        retry: hello.random == HELLO_RETRY_RANDOM,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
    use rustls::{ClientConfig, ClientConnection, HandshakeKind, ServerConfig, ServerConnection};
    use std::sync::Arc;

    /// Generous hello limit for tests.
    const MAX: usize = 64 * 1024;
    /// Generous watcher limit for tests.
    const LIMIT: usize = 64 * 1024;
    const HOST: &str = "puppet.example.com";

    /// Deterministic xorshift64 PRNG: no new dependency, reproducible failures.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            let mut x = self.0;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            self.0 = x;
            x
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n.max(1) as u64) as usize
        }
    }

    // ---- in-memory rustls handshakes -------------------------------------------------

    struct Pki {
        ca: CertificateDer<'static>,
        chain: Vec<CertificateDer<'static>>,
        key: PrivatePkcs8KeyDer<'static>,
    }

    fn pki() -> Pki {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let leaf = rcgen::CertificateParams::new(vec![HOST.to_string()])
            .unwrap()
            .signed_by(&key, &ca, &ca_key)
            .unwrap();
        Pki {
            ca: ca.der().clone(),
            chain: vec![leaf.der().clone()],
            key: PrivatePkcs8KeyDer::from(key.serialize_der()),
        }
    }

    fn provider() -> rustls::crypto::CryptoProvider {
        rustls::crypto::ring::default_provider()
    }

    fn client_config(
        pki: &Pki,
        versions: &[&'static rustls::SupportedProtocolVersion],
    ) -> Arc<ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(pki.ca.clone()).unwrap();
        let config = ClientConfig::builder_with_provider(Arc::new(provider()))
            .with_protocol_versions(versions)
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        Arc::new(config)
    }

    fn server_config(
        pki: &Pki,
        versions: &[&'static rustls::SupportedProtocolVersion],
        tickets: bool,
        provider: rustls::crypto::CryptoProvider,
    ) -> Arc<ServerConfig> {
        let mut config = ServerConfig::builder_with_provider(Arc::new(provider))
            .with_protocol_versions(versions)
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(pki.chain.clone(), PrivateKeyDer::Pkcs8(pki.key.clone_key()))
            .unwrap();
        if tickets {
            config.ticketer = rustls::crypto::ring::Ticketer::new().unwrap();
        }
        Arc::new(config)
    }

    /// The bytes of one handshake, as each side wrote them.
    struct Handshake {
        /// Client->server writes, in order (the first is the ClientHello flight).
        client_flights: Vec<Vec<u8>>,
        /// All server->client bytes.
        server_bytes: Vec<u8>,
        kind: HandshakeKind,
    }

    macro_rules! deliver {
        ($conn:expr, $data:expr) => {{
            let mut data: &[u8] = $data;
            while !data.is_empty() {
                $conn.read_tls(&mut data).unwrap();
                $conn.process_new_packets().unwrap();
            }
        }};
    }

    /// Run a whole handshake in memory (no sockets), recording both directions.
    fn handshake(client: &Arc<ClientConfig>, server: &Arc<ServerConfig>) -> Handshake {
        let mut c =
            ClientConnection::new(client.clone(), ServerName::try_from(HOST).unwrap()).unwrap();
        let mut s = ServerConnection::new(server.clone()).unwrap();
        let mut client_flights = Vec::new();
        let mut server_bytes = Vec::new();
        for _ in 0..20 {
            let mut moved = false;
            while c.wants_write() {
                let mut buf = Vec::new();
                c.write_tls(&mut buf).unwrap();
                deliver!(s, &buf);
                client_flights.push(buf);
                moved = true;
            }
            while s.wants_write() {
                let mut buf = Vec::new();
                s.write_tls(&mut buf).unwrap();
                deliver!(c, &buf);
                server_bytes.extend_from_slice(&buf);
                moved = true;
            }
            if !moved {
                break;
            }
        }
        assert!(!c.is_handshaking() && !s.is_handshaking());
        Handshake {
            client_flights,
            server_bytes,
            kind: c.handshake_kind().unwrap(),
        }
    }

    fn found(buf: &[u8]) -> ClientHelloInfo {
        match parse_client_hello(buf, MAX) {
            HelloParse::Found(info) => info,
            other => panic!("expected Found, got {other:?}"),
        }
    }

    /// Split a single-record hello into `n` records of its handshake message.
    fn reframe(hello: &[u8], n: usize) -> Vec<u8> {
        let info = found(hello);
        let message = &hello[RECORD_HEADER_LEN..info.consumed];
        let step = message.len().div_ceil(n);
        let mut out = Vec::new();
        for part in message.chunks(step) {
            out.extend_from_slice(&[0x16, 0x03, 0x01]);
            out.extend_from_slice(&(part.len() as u16).to_be_bytes());
            out.extend_from_slice(part);
        }
        out
    }

    /// The hello parses the same whole, at every prefix (NeedMore) and re-framed.
    fn check_hello(hello: &[u8]) -> ClientHelloInfo {
        let info = found(hello);
        let hello = &hello[..info.consumed];
        for cut in 0..hello.len() {
            assert_eq!(
                parse_client_hello(&hello[..cut], MAX),
                HelloParse::NeedMore,
                "prefix {cut}"
            );
        }
        for n in [2, 3, 7] {
            let framed = reframe(hello, n);
            for cut in 0..framed.len() {
                assert_eq!(
                    parse_client_hello(&framed[..cut], MAX),
                    HelloParse::NeedMore
                );
            }
            let again = found(&framed);
            assert_eq!(again.consumed, framed.len());
            assert_eq!(
                ClientHelloInfo {
                    consumed: info.consumed,
                    ..again
                },
                info
            );
        }
        // Exactly as big as the limit is fine; one byte less is TooLarge.
        assert!(matches!(
            parse_client_hello(hello, hello.len()),
            HelloParse::Found(_)
        ));
        assert_eq!(
            parse_client_hello(hello, hello.len() - 1),
            HelloParse::Invalid(HelloError::TooLarge)
        );
        // The manual extension walk agrees with tls-parser on real hellos.
        let message = &hello[RECORD_HEADER_LEN..];
        let (_, parsed) = parse_tls_message_handshake(message).unwrap();
        let TlsMessage::Handshake(TlsMessageHandshake::ClientHello(ch)) = parsed else {
            panic!("not a ClientHello");
        };
        let ext = ch.ext.unwrap_or(&[]);
        let a = read_extensions(ext, Side::Client).unwrap();
        let b = walk_extensions(ext, Side::Client).unwrap();
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
        info
    }

    /// Watch a server stream in one chunk, byte by byte and in random chunks; all agree.
    fn watch(client: &ClientHelloInfo, server: &[u8]) -> ServerHandshake {
        let mut whole = ServerWatcher::new(client, LIMIT);
        whole.feed(server);
        assert!(
            whole.is_done(),
            "the watcher should finish on a whole flight"
        );
        let mut bytes = ServerWatcher::new(client, LIMIT);
        for b in server {
            bytes.feed(std::slice::from_ref(b));
        }
        assert_eq!(bytes.info(), whole.info());
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for _ in 0..20 {
            let mut w = ServerWatcher::new(client, LIMIT);
            let mut rest = server;
            while !rest.is_empty() {
                let n = 1 + rng.below(700).min(rest.len() - 1);
                let (chunk, tail) = rest.split_at(n);
                let was_done = w.is_done();
                let done = w.feed(chunk);
                assert!(!was_done || done);
                rest = tail;
            }
            assert_eq!(w.info(), whole.info());
        }
        // The byte limit: never more buffered than allowed, done when reached.
        for limit in [1, 5, 60, 200] {
            let mut w = ServerWatcher::new(client, limit);
            for chunk in server.chunks(33) {
                w.feed(chunk);
                assert!(w.record.len() + w.handshake.len() <= limit);
            }
            assert!(w.is_done());
        }
        whole.info().clone()
    }

    #[test]
    fn hello_retry_magic_is_sha256_of_its_name() {
        use sha2::Digest;
        assert_eq!(
            sha2::Sha256::digest(b"HelloRetryRequest").as_slice(),
            &HELLO_RETRY_RANDOM
        );
    }

    #[test]
    fn rustls_tls13_full_then_resumed() {
        let pki = pki();
        let client = client_config(&pki, &[&rustls::version::TLS13]);
        let server = server_config(&pki, &[&rustls::version::TLS13], true, provider());

        let first = handshake(&client, &server);
        let hello = check_hello(&first.client_flights[0]);
        assert_eq!(hello.sni.as_deref(), Some(HOST));
        assert_eq!(hello.supported_versions, vec![version::TLS13]);
        assert!(hello.psk_identities.is_empty());
        assert_eq!(hello.legacy_version, version::TLS12);
        let seen = watch(&hello, &first.server_bytes);
        assert_eq!(first.kind, HandshakeKind::Full);
        assert_eq!(seen.version, Some(version::TLS13));
        assert_eq!(seen.resumed, Some(false));
        assert_eq!(seen.psk_selected, None);
        assert!(!seen.hello_retry && !seen.alert);

        let second = handshake(&client, &server);
        let hello = check_hello(&second.client_flights[0]);
        assert_eq!(hello.psk_identities.len(), 1);
        assert!(!hello.psk_identities[0].is_empty());
        let seen = watch(&hello, &second.server_bytes);
        assert_eq!(second.kind, HandshakeKind::Resumed);
        assert_eq!(seen.resumed, Some(true));
        assert_eq!(seen.psk_selected, Some(0));
        assert_eq!(seen.version, Some(version::TLS13));
    }

    #[test]
    fn rustls_tls12_session_id_full_then_resumed() {
        let pki = pki();
        let client = client_config(&pki, &[&rustls::version::TLS12]);
        let server = server_config(&pki, &[&rustls::version::TLS12], false, provider());

        let first = handshake(&client, &server);
        let hello = check_hello(&first.client_flights[0]);
        assert_eq!(hello.sni.as_deref(), Some(HOST));
        assert!(!hello.supported_versions.contains(&version::TLS13));
        let seen = watch(&hello, &first.server_bytes);
        assert_eq!(first.kind, HandshakeKind::Full);
        assert_eq!(seen.version, Some(version::TLS12));
        assert_eq!(seen.resumed, Some(false));
        assert!(!seen.session_id.is_empty());
        assert_eq!(seen.new_ticket, None);

        let second = handshake(&client, &server);
        let hello = check_hello(&second.client_flights[0]);
        assert_eq!(
            hello.session_id, seen.session_id,
            "the client offers the server's ID"
        );
        let again = watch(&hello, &second.server_bytes);
        assert_eq!(second.kind, HandshakeKind::Resumed);
        assert_eq!(again.resumed, Some(true));
        assert_eq!(again.session_id, hello.session_id);
    }

    #[test]
    fn rustls_tls12_ticket_issued_then_resumed() {
        let pki = pki();
        let client = client_config(&pki, &[&rustls::version::TLS12]);
        let server = server_config(&pki, &[&rustls::version::TLS12], true, provider());

        let first = handshake(&client, &server);
        let hello = check_hello(&first.client_flights[0]);
        assert!(hello.ticket_ext);
        assert_eq!(hello.ticket, None);
        let seen = watch(&hello, &first.server_bytes);
        assert_eq!(first.kind, HandshakeKind::Full);
        assert_eq!(seen.resumed, Some(false));
        let ticket = seen
            .new_ticket
            .clone()
            .expect("a NewSessionTicket before the CCS");

        let second = handshake(&client, &server);
        let hello = check_hello(&second.client_flights[0]);
        assert_eq!(
            hello.ticket.as_ref(),
            Some(&ticket),
            "the client offers the ticket"
        );
        let again = watch(&hello, &second.server_bytes);
        assert_eq!(second.kind, HandshakeKind::Resumed);
        assert_eq!(again.resumed, Some(true));
        assert_eq!(again.version, Some(version::TLS12));
    }

    #[test]
    fn rustls_hello_retry_request() {
        let pki = pki();
        let client = client_config(&pki, &[&rustls::version::TLS13]);
        // The client sends an X25519 share first; a server that only takes P-384 retries.
        let mut only_p384 = provider();
        only_p384.kx_groups = vec![rustls::crypto::ring::kx_group::SECP384R1];
        let server = server_config(&pki, &[&rustls::version::TLS13], false, only_p384);

        let hs = handshake(&client, &server);
        assert_eq!(hs.kind, HandshakeKind::FullWithHelloRetryRequest);
        let hello = check_hello(&hs.client_flights[0]);
        let seen = watch(&hello, &hs.server_bytes);
        assert!(seen.hello_retry);
        assert_eq!(seen.version, Some(version::TLS13));
        assert_eq!(seen.resumed, Some(false));
        // The second hello (after a CCS in compat mode) is found too.
        let retry = hs.client_flights[1..].concat();
        let start = retry.iter().position(|&b| b == CONTENT_HANDSHAKE).unwrap();
        assert_eq!(found(&retry[start..]).sni.as_deref(), Some(HOST));
    }

    // ---- captured hellos from real clients (tests/fixtures/hellos, see its README) ----

    fn fixture(name: &str) -> Vec<u8> {
        let path = format!(
            "{}/tests/fixtures/hellos/{name}.bin",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    #[rstest::rstest]
    #[case::openssl3_tls13("openssl3_tls13", true)]
    #[case::openssl3_tls12("openssl3_tls12", false)]
    #[case::openssl3_tls13_psk("openssl3_tls13_psk", true)]
    #[case::openssl3_tls12_ticket("openssl3_tls12_ticket", false)]
    #[case::curl7_openssl3("curl7_openssl3", true)]
    #[case::curl7_openssl3_tls12("curl7_openssl3_tls12", false)]
    #[case::java17("java17", true)]
    #[case::java17_tls12("java17_tls12", false)]
    fn captured_hellos_parse(#[case] name: &str, #[case] tls13: bool) {
        let bytes = fixture(name);
        let info = check_hello(&bytes);
        assert_eq!(info.consumed, bytes.len());
        assert_eq!(info.sni.as_deref(), Some(HOST));
        assert_eq!(info.legacy_version, version::TLS12);
        assert_eq!(
            info.supported_versions.contains(&version::TLS13),
            tls13,
            "{info:?}"
        );
    }

    #[test]
    fn captured_resumption_offers() {
        let psk = check_hello(&fixture("openssl3_tls13_psk"));
        assert_eq!(psk.psk_identities.len(), 1);
        // OpenSSL tickets start with the 16-byte key name (DESIGN.md "TLS 1.3 note").
        assert!(psk.psk_identities[0].len() > 16);
        let ticket = check_hello(&fixture("openssl3_tls12_ticket"));
        assert!(ticket.ticket.as_ref().is_some_and(|t| t.len() > 16));
        assert!(ticket.psk_identities.is_empty());
        let fresh = check_hello(&fixture("openssl3_tls12"));
        assert!(fresh.ticket_ext && fresh.ticket.is_none());
    }

    #[test]
    fn captured_gnutls_and_curl_details() {
        let gnutls = check_hello(&fixture("wget_gnutls_localhost"));
        assert_eq!(gnutls.sni.as_deref(), Some("localhost"));
        assert_eq!(
            gnutls.supported_versions[..2],
            [version::TLS13, version::TLS12]
        );
        let curl = check_hello(&fixture("curl7_openssl3"));
        assert_eq!(curl.alpn, vec![b"h2".to_vec(), b"http/1.1".to_vec()]);
    }

    /// A hello and the server's bytes recorded through a relay to `openssl s_server`.
    fn flight(name: &str) -> (ClientHelloInfo, ServerHandshake) {
        let dir = format!(
            "{}/tests/fixtures/server_flights",
            env!("CARGO_MANIFEST_DIR")
        );
        let hello = std::fs::read(format!("{dir}/{name}.hello.bin")).unwrap();
        let server = std::fs::read(format!("{dir}/{name}.server.bin")).unwrap();
        let hello = check_hello(&hello);
        let seen = watch(&hello, &server);
        (hello, seen)
    }

    #[test]
    fn openssl_server_tls12_ticket_full_then_resumed() {
        let (_, full) = flight("openssl3_tls12_full");
        assert_eq!(full.version, Some(version::TLS12));
        assert_eq!(full.resumed, Some(false));
        let ticket = full
            .new_ticket
            .expect("OpenSSL issues a ticket in a full handshake");
        let (hello, resumed) = flight("openssl3_tls12_resumed");
        assert_eq!(hello.ticket.as_ref(), Some(&ticket));
        assert_eq!(resumed.resumed, Some(true));
        assert_eq!(
            resumed.session_id, hello.session_id,
            "the server echoes the ID to resume"
        );
        // OpenSSL 3 puts its 16-byte key name in front of every ticket.
        if let Some(new) = resumed.new_ticket {
            assert_eq!(new[..16], ticket[..16]);
        }
    }

    #[test]
    fn openssl_server_tls13_full_then_resumed() {
        let (_, full) = flight("openssl3_tls13_full");
        assert_eq!(full.version, Some(version::TLS13));
        assert_eq!(full.resumed, Some(false));
        let (hello, resumed) = flight("openssl3_tls13_resumed");
        assert_eq!(hello.psk_identities.len(), 1);
        assert_eq!(resumed.psk_selected, Some(0));
        assert_eq!(resumed.resumed, Some(true));
    }

    // ---- synthetic hellos and garbage --------------------------------------------------

    #[test]
    fn not_tls_is_refused_early() {
        for text in [
            &b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"[..],
            b"SSH-2.0-OpenSSH_9.2p1\r\n",
            b"\x00\x01",
        ] {
            assert_eq!(
                parse_client_hello(&text[..1], MAX),
                HelloParse::Invalid(HelloError::NotTls)
            );
            assert_eq!(
                parse_client_hello(text, MAX),
                HelloParse::Invalid(HelloError::NotTls)
            );
        }
        assert_eq!(parse_client_hello(b"", MAX), HelloParse::NeedMore);
        assert_eq!(parse_client_hello(b"\x16", MAX), HelloParse::NeedMore);
        assert_eq!(
            parse_client_hello(b"\x16\x02", MAX),
            HelloParse::Invalid(HelloError::NotTls)
        );
        // An SSLv2-compatible hello (0x80 ...) is not supported.
        assert_eq!(
            parse_client_hello(b"\x80\x2e\x01", MAX),
            HelloParse::Invalid(HelloError::NotTls)
        );
    }

    #[test]
    fn bad_framing_is_malformed_or_too_large() {
        let malformed = HelloParse::Invalid(HelloError::Malformed);
        // Not a ClientHello first (a ServerHello type).
        assert_eq!(
            parse_client_hello(b"\x16\x03\x01\x00\x04\x02\x00\x00\x00", MAX),
            malformed
        );
        // Empty record; record over the RFC limit.
        assert_eq!(parse_client_hello(b"\x16\x03\x01\x00\x00", MAX), malformed);
        assert_eq!(parse_client_hello(b"\x16\x03\x01\x48\x01", MAX), malformed);
        // A 16 MB handshake claim is refused from its 9 header bytes.
        let huge = b"\x16\x03\x01\x00\x04\x01\xff\xff\xff";
        assert_eq!(
            parse_client_hello(huge, MAX),
            HelloParse::Invalid(HelloError::TooLarge)
        );
        // A record bigger than max.
        assert_eq!(
            parse_client_hello(b"\x16\x03\x01\x40\x00", 1024),
            HelloParse::Invalid(HelloError::TooLarge)
        );
        // A handshake message spanning records interrupted by an alert record.
        let msg = b"\x16\x03\x01\x00\x02\x01\x00\x15\x03\x03\x00\x02\x02\x28";
        assert_eq!(parse_client_hello(msg, MAX), malformed);
        // A complete but empty ClientHello body.
        assert_eq!(
            parse_client_hello(b"\x16\x03\x01\x00\x04\x01\x00\x00\x00", MAX),
            malformed
        );
    }

    /// A minimal hand-built ClientHello with the given extensions block.
    fn synthetic_hello(extensions: &[u8]) -> Vec<u8> {
        let mut body = vec![0x03, 0x03];
        body.extend_from_slice(&[7; 32]);
        body.extend_from_slice(&[0, 0, 2, 0x13, 0x01, 1, 0]);
        body.extend_from_slice(&(extensions.len() as u16).to_be_bytes());
        body.extend_from_slice(extensions);
        let mut msg = vec![HS_CLIENT_HELLO, 0];
        msg.extend_from_slice(&(body.len() as u16).to_be_bytes());
        msg.extend_from_slice(&body);
        let mut rec = vec![0x16, 0x03, 0x01];
        rec.extend_from_slice(&(msg.len() as u16).to_be_bytes());
        rec.extend_from_slice(&msg);
        rec
    }

    fn sni_ext(name: &[u8]) -> Vec<u8> {
        let mut e = vec![0, 0];
        e.extend_from_slice(&((name.len() + 5) as u16).to_be_bytes());
        e.extend_from_slice(&((name.len() + 3) as u16).to_be_bytes());
        e.push(0);
        e.extend_from_slice(&(name.len() as u16).to_be_bytes());
        e.extend_from_slice(name);
        e
    }

    #[test]
    fn sni_is_normalized_and_bad_names_are_malformed() {
        let info = found(&synthetic_hello(&sni_ext(b"Puppet.Example.COM.")));
        assert_eq!(info.sni.as_deref(), Some(HOST));
        assert_eq!(found(&synthetic_hello(&[])).sni, None);
        let malformed = HelloParse::Invalid(HelloError::Malformed);
        assert_eq!(
            parse_client_hello(&synthetic_hello(&sni_ext(b"\xff\xfe")), MAX),
            malformed
        );
        assert_eq!(
            parse_client_hello(&synthetic_hello(&sni_ext(b".")), MAX),
            malformed
        );
    }

    #[test]
    fn early_data_is_seen_by_both_extension_readers() {
        let mut ext = sni_ext(HOST.as_bytes());
        ext.extend_from_slice(&[0, 42, 0, 0]);
        assert!(found(&synthetic_hello(&ext)).early_data);
        // Behind an extension tls-parser refuses, the manual walk finds it too.
        let mut odd = vec![0, 49, 0, 1, 0];
        odd.extend_from_slice(&ext);
        assert!(found(&synthetic_hello(&odd)).early_data);
        assert!(!found(&synthetic_hello(&sni_ext(HOST.as_bytes()))).early_data);
        assert!(!check_hello(&fixture("openssl3_tls13_psk")).early_data);
    }

    #[test]
    fn extension_tls_parser_rejects_falls_back_to_manual_walk() {
        // post_handshake_auth (49) must be empty; tls-parser stops at a non-empty one.
        let mut ext = vec![0, 49, 0, 1, 0];
        ext.extend_from_slice(&sni_ext(HOST.as_bytes()));
        ext.extend_from_slice(&[0, 35, 0, 3, 1, 2, 3]);
        let info = found(&synthetic_hello(&ext));
        assert_eq!(info.sni.as_deref(), Some(HOST));
        assert_eq!(info.ticket, Some(vec![1, 2, 3]));
        // A broken extension list is malformed.
        let broken = synthetic_hello(&[0, 0, 0, 9, 0]);
        assert_eq!(
            parse_client_hello(&broken, MAX),
            HelloParse::Invalid(HelloError::Malformed)
        );
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        for i in 0..4000 {
            let len = rng.below(if i % 2 == 0 { 64 } else { 2048 });
            let mut buf: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            if buf.len() >= 5 {
                buf[0] = 0x16;
                buf[1] = 0x03;
                // Mostly plausible record lengths so the parser gets past the header.
                let rec = (buf.len() - 5) as u16;
                buf[3..5].copy_from_slice(&rec.to_be_bytes());
                if buf.len() >= 6 && i % 3 != 0 {
                    buf[5] = HS_CLIENT_HELLO;
                }
            }
            let _ = parse_client_hello(&buf, MAX);
            let mut w = ServerWatcher::new(&ClientHelloInfo::default(), LIMIT);
            w.feed(&buf);
        }
    }

    #[test]
    fn mutated_real_handshakes_never_panic() {
        let pki = pki();
        let client = client_config(&pki, &[&rustls::version::TLS12]);
        let server = server_config(&pki, &[&rustls::version::TLS12], true, provider());
        let hs = handshake(&client, &server);
        let hello = hs.client_flights[0].clone();
        let mut rng = Rng(42);
        for _ in 0..3000 {
            let mut h = hello.clone();
            let mut s = hs.server_bytes.clone();
            for _ in 0..1 + rng.below(4) {
                let i = rng.below(h.len());
                h[i] = rng.next() as u8;
                let j = rng.below(s.len().min(2000));
                s[j] = rng.next() as u8;
            }
            h.truncate(rng.below(h.len() + 1));
            let _ = parse_client_hello(&h, MAX);
            let mut w = ServerWatcher::new(&ClientHelloInfo::default(), LIMIT);
            for chunk in s.chunks(1 + rng.below(300)) {
                w.feed(chunk);
            }
        }
    }

    #[test]
    fn watcher_alert_and_non_tls() {
        let info = ClientHelloInfo::default();
        let mut w = ServerWatcher::new(&info, LIMIT);
        assert!(w.feed(b"\x15\x03\x03\x00\x02\x02\x28"));
        assert!(w.info().alert);
        assert!(w.feed(b"\x16\x03\x03"), "done stays done");
        let mut w = ServerWatcher::new(&info, LIMIT);
        assert!(w.feed(b"HTTP/1.1 400 Bad Request\r\n"));
        assert_eq!(w.info(), &ServerHandshake::default());
        let mut w = ServerWatcher::new(&info, LIMIT);
        assert!(!w.feed(b"\x16\x03"));
        assert!(!w.is_done());
    }
}
