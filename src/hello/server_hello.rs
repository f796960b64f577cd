//! The server's side: watching its plaintext handshake flight to learn what it
//! chose (session ID, ticket, accepted PSK, full or resumed).
use tls_parser::{parse_tls_message_handshake, TlsMessage, TlsMessageHandshake};

use super::inline::SessionId;
use super::version;
use super::wire::*;

/// What the server's plaintext handshake showed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerHandshake {
    /// Negotiated version (supported_versions in the ServerHello, else its legacy_version).
    pub version: Option<u16>,
    /// The session ID in the ServerHello (TLS <= 1.2: assigned by the server).
    pub session_id: SessionId,
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
pub(super) enum Stage {
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
    pub(super) record: Vec<u8>,
    /// Handshake bytes of complete records not yet forming a complete message.
    pub(super) handshake: Vec<u8>,
    stage: Stage,
}

impl ServerWatcher {
    /// A watcher that looks at no more than `limit` server bytes (a full TLS 1.2
    /// flight with a certificate chain is a few KiB).
    ///
    /// Everything is learned from the server's side (what it assigned or accepted),
    /// never from the client's claims, so it needs nothing of the ClientHello.
    pub fn new(limit: usize) -> ServerWatcher {
        ServerWatcher {
            limit,
            done: limit == 0,
            ..ServerWatcher::default()
        }
    }

    /// Feed the next bytes the server sent; returns true when watching is over.
    ///
    /// Complete records are read where they are, in `data`; only the incomplete
    /// tail of a chunk is copied (into a buffer reserved once for its record).
    pub fn feed(&mut self, data: &[u8]) -> bool {
        if self.done {
            return true;
        }
        let room = self.limit.saturating_sub(self.fed);
        let data = data.get(..room.min(data.len())).unwrap_or(&[]);
        self.fed += data.len();
        if self.record.is_empty() {
            let used = self.process_records(data);
            self.keep(data.get(used..).unwrap_or(&[]));
        } else {
            let mut record = std::mem::take(&mut self.record);
            record.extend_from_slice(data);
            let used = self.process_records(&record);
            record.drain(..used.min(record.len()));
            self.record = record;
        }
        if self.fed >= self.limit {
            self.done = true;
        }
        if self.done {
            // Nothing more will be read: give the buffers back now.
            self.record = Vec::new();
            self.handshake = Vec::new();
        }
        self.done
    }

    /// Keep the incomplete record at the end of a chunk, reserving room for all of
    /// it (within what the limit still lets in) so it grows without reallocating.
    fn keep(&mut self, tail: &[u8]) {
        if self.done || tail.is_empty() {
            return;
        }
        let record = read_u16(tail, 3).map_or(0, |len| RECORD_HEADER_LEN + usize::from(len));
        let room = tail.len() + self.limit.saturating_sub(self.fed);
        self.record.reserve_exact(record.clamp(tail.len(), room));
        self.record.extend_from_slice(tail);
    }

    /// True once there is nothing more to learn.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// What was learned so far.
    pub fn info(&self) -> &ServerHandshake {
        &self.info
    }

    /// Handle every complete record at the start of `bytes`; returns the bytes used.
    fn process_records(&mut self, bytes: &[u8]) -> usize {
        let mut start = 0usize;
        while !self.done {
            let rest = bytes.get(start..).unwrap_or(&[]);
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
            start += RECORD_HEADER_LEN + len;
            self.on_record(content_type, body);
        }
        start
    }

    /// One complete record.
    fn on_record(&mut self, content_type: u8, body: &[u8]) {
        match content_type {
            CONTENT_ALERT => {
                self.info.alert = true;
                self.done = true;
            }
            CONTENT_CHANGE_CIPHER_SPEC => self.on_change_cipher_spec(),
            _ if self.handshake.is_empty() => {
                // Messages read where they are; only an incomplete one is kept.
                let used = self.process_messages(body);
                let tail = body.get(used..).unwrap_or(&[]);
                if !self.done && !tail.is_empty() {
                    self.handshake.extend_from_slice(tail);
                }
            }
            _ => {
                let mut handshake = std::mem::take(&mut self.handshake);
                handshake.extend_from_slice(body);
                let used = self.process_messages(&handshake);
                handshake.drain(..used.min(handshake.len()));
                self.handshake = handshake;
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

    /// Handle every complete handshake message at the start of `bytes`; returns
    /// the bytes used.
    fn process_messages(&mut self, bytes: &[u8]) -> usize {
        let mut start = 0usize;
        while !self.done {
            let rest = bytes.get(start..).unwrap_or(&[]);
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
            start += total;
            self.on_message(message);
        }
        start
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
pub(super) struct ServerHelloFields {
    version: u16,
    session_id: SessionId,
    psk_selected: Option<u16>,
    retry: bool,
}

/// Read a ServerHello message (header included), borrowing (RFC 8446 4.1.3):
/// `legacy_version(2) random(32) session_id<0..32> cipher_suite(2)
/// compression_method(1) [extensions<6..2^16-1>]`. As tls-parser did, bytes after
/// the extensions are ignored and an extensions block that does not fit is none.
pub(super) fn parse_server_hello(message: &[u8]) -> Option<ServerHelloFields> {
    let mut r = Reader::new(message);
    if r.u8()? != HS_SERVER_HELLO {
        return None;
    }
    let len = read_u24(r.take(3)?, 0)?;
    let mut body = Reader::new(r.take(len)?);
    let legacy_version = body.u16()?;
    let random = body.take(32)?;
    let session_id = SessionId::new(body.vec8()?)?;
    body.take(2 + 1)?; // cipher_suite, compression_method
    let extensions = if body.is_empty() {
        &[][..]
    } else {
        body.vec16().unwrap_or(&[])
    };
    let ext = walk_extensions(extensions, Side::Server)?;
    let psk_selected = match ext.psk {
        Some(p) => Some(Reader::new(p).u16()?),
        None => None,
    };
    Some(ServerHelloFields {
        version: ext.versions.first().copied().unwrap_or(legacy_version),
        session_id,
        psk_selected,
        retry: random == HELLO_RETRY_RANDOM,
    })
}
