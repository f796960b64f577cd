//! Why a health check failed: the reason a flip is logged with.
use std::io;
use std::time::Duration;

/// Why a check failed; the text is the `reason` of the log line of a flip.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// The TCP connect failed (refused, unreachable, name not resolved, timed out).
    #[error("connect: {0}")]
    Connect(io::Error),
    /// The whole check took longer than `timeout`.
    #[error("no result within {0:?}")]
    Timeout(Duration),
    /// The peer answered, but not with TLS.
    #[error("not TLS: answer starts with {0:?}")]
    NotTls(String),
    /// The peer closed the connection before answering.
    #[error("closed without answering")]
    Closed,
    /// Reading or writing the socket failed.
    #[error("i/o: {0}")]
    Io(io::Error),
    /// The TLS handshake failed (certificate, name, protocol); the rustls error
    /// is inside ([`CheckError::tls_error`]).
    #[error("TLS: {0}")]
    Tls(io::Error),
    /// The HTTP exchange failed.
    #[error("HTTP: {0}")]
    Http(String),
    /// The status was not the expected one.
    #[error("status {got}, expected {want}")]
    Status {
        /// What the server answered.
        got: u16,
        /// `expect_status`.
        want: u16,
    },
    /// The body is not `expect_body`.
    #[error("body {got:?}, expected {want:?}")]
    Body {
        /// The start of what the server answered.
        got: String,
        /// `expect_body`.
        want: String,
    },
    /// A file the check needs (CA, client certificate or key) can't be used.
    #[error("check setup: {0}")]
    Setup(String),
}

impl CheckError {
    /// The TLS library's error of a failed handshake, to explain it in words.
    pub fn tls_error(&self) -> Option<&rustls::Error> {
        match self {
            CheckError::Tls(e) => e.get_ref()?.downcast_ref::<rustls::Error>(),
            _ => None,
        }
    }
}

impl From<crate::dial::tls::SetupError> for CheckError {
    fn from(e: crate::dial::tls::SetupError) -> CheckError {
        CheckError::Setup(e.0)
    }
}
