//! Why a connection ended before or instead of a relay, and the access log's word
//! for it (the side at fault is in the word: `hello_error:`, `refused:`, ...).
use std::io;
use std::sync::Arc;
use std::time::Duration;

use crate::access_log::End;
use crate::balance::PickError;
use crate::hello::HelloError;
use crate::proxy_protocol::FrontError;

/// Why a connection ended before or instead of a relay; knows the side at fault.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnError {
    /// A PROXY header for the tier's own connection, then a close: its health check.
    #[error("a PROXY LOCAL header and a close: the tier's health check")]
    Probe,
    #[error("{0}")]
    Front(FrontError),
    #[error("{0}")]
    Source(crate::admission::Refusal),
    #[error("client hello: {0}")]
    Hello(HelloError),
    #[error("no service for server name {0:?}")]
    NoRoute(Option<String>),
    #[error("{0}")]
    Pick(PickError),
    #[error("connect to {backend} failed: {error}")]
    Connect { backend: Arc<str>, error: io::Error },
    #[error("writing to backend {backend} failed: {error}")]
    BackendWrite { backend: Arc<str>, error: io::Error },
    #[error("the client closed while waiting for a backend")]
    ClientGone,
    #[error("backend {backend} did not answer the ClientHello within {after:?}")]
    ServerHelloTimeout { backend: Arc<str>, after: Duration },
    #[error("backend {backend} closed without answering the ClientHello")]
    ClosedUnanswered { backend: Arc<str> },
}

impl ConnError {
    /// The access log's `end` for this error.
    pub(crate) fn reason(&self) -> End {
        let with = |prefix, word| End { prefix, word };
        match self {
            ConnError::Probe => End::word("probe"),
            ConnError::Front(e) => with("proxy_error:", e.reason()),
            ConnError::Source(r) => with("refused:", r.reason()),
            ConnError::Hello(e) => with("hello_error:", e.reason()),
            ConnError::NoRoute(_) => with("refused:", "no_route"),
            ConnError::Pick(e) => with("refused:", e.reason()),
            ConnError::Connect { .. } => End::word("connect_failed"),
            ConnError::BackendWrite { .. } => End::word("server_error"),
            ConnError::ClientGone => End::word("client_closed"),
            ConnError::ServerHelloTimeout { .. } => End::word("server_hello_timeout"),
            ConnError::ClosedUnanswered { .. } => End::word("server_closed_unanswered"),
        }
    }
}
