//! TLS handshake inspection: the client's ClientHello and the server's plaintext flight.
//!
//! STUB: the types and signatures are the contract; the hello work fills in the bodies.

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
pub fn parse_client_hello(_buf: &[u8], _max: usize) -> HelloParse {
    HelloParse::Invalid(HelloError::NotTls)
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
}

/// Watches the server->client bytes of a handshake, chunk by chunk, until there is
/// nothing more to learn (ChangeCipherSpec/encrypted records, or a byte limit).
#[derive(Debug, Default)]
pub struct ServerWatcher {
    info: ServerHandshake,
    done: bool,
}

impl ServerWatcher {
    /// A watcher for a connection whose ClientHello was `client`.
    pub fn new(_client: &ClientHelloInfo, _limit: usize) -> ServerWatcher {
        ServerWatcher::default()
    }

    /// Feed the next bytes the server sent; returns true when watching is over.
    pub fn feed(&mut self, _data: &[u8]) -> bool {
        self.done = true;
        true
    }

    /// True once there is nothing more to learn.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// What was learned so far.
    pub fn info(&self) -> &ServerHandshake {
        &self.info
    }
}
