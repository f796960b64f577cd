//! Why a connection ended before or instead of a relay, and the access log's word
//! for it (the side at fault is in the word: `hello_error:`, `refused:`, ...).
use std::io;
use std::sync::Arc;
use std::time::Duration;

use crate::balance::PickError;
use crate::hello::HelloError;
use crate::proxy_protocol::FrontError;

/// Why a connection ended before or instead of a relay; knows the side at fault.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnError {
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
}

impl ConnError {
    /// The access log's `end` for this error.
    pub(crate) fn reason(&self) -> String {
        match self {
            ConnError::Front(e) => format!("proxy_error:{}", e.reason()),
            ConnError::Source(r) => format!("refused:{}", r.reason()),
            ConnError::Hello(e) => format!("hello_error:{}", e.reason()),
            ConnError::NoRoute(_) => "refused:no_route".into(),
            ConnError::Pick(e) => format!("refused:{}", e.reason()),
            ConnError::Connect { .. } => "connect_failed".into(),
            ConnError::BackendWrite { .. } => "server_error".into(),
            ConnError::ClientGone => "client_closed".into(),
            ConnError::ServerHelloTimeout { .. } => "server_hello_timeout".into(),
        }
    }
}
