//! What a relay reports when it is over: how the connection ended (the access
//! log's termination reason) and the bytes it moved each way.
use std::io;

use super::ending::Abort;

/// How a relayed connection ended (the access log's termination reason).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayEnd {
    /// Both sides closed; the client closed first.
    ClientClosed,
    /// Both sides closed; the server closed first.
    ServerClosed,
    /// No bytes either way for the idle timeout.
    IdleTimeout,
    /// The client reset the connection (or it failed); the backend was reset in turn
    /// after every byte the client had sent reached it.
    ClientReset,
    /// The backend reset the connection (or it failed); the client was reset in turn
    /// after every byte the backend had sent reached it.
    BackendReset,
    /// crossbar itself could not go on (no pipe for splice...); both peers were reset.
    LocalError,
    /// Cut by shutdown after the grace period.
    Shutdown,
}

impl RelayEnd {
    /// The access-log reason.
    pub fn as_str(&self) -> &'static str {
        match self {
            RelayEnd::ClientClosed => "client_closed",
            RelayEnd::ServerClosed => "server_closed",
            RelayEnd::IdleTimeout => "idle_timeout",
            RelayEnd::ClientReset => "client_reset",
            RelayEnd::BackendReset => "backend_reset",
            RelayEnd::LocalError => "local_error",
            RelayEnd::Shutdown => "shutdown",
        }
    }
}

/// What a relay did.
#[derive(Debug, Clone, Copy)]
pub struct RelayStats {
    /// Bytes client -> server (excluding bytes written before the relay started).
    pub client_to_server: u64,
    /// Bytes server -> client.
    pub server_to_client: u64,
    /// How it ended.
    pub end: RelayEnd,
    /// The I/O error behind a `ClientReset`/`BackendReset`/`LocalError` end.
    pub error: Option<io::ErrorKind>,
    /// The abort passed on, if a peer aborted (also when the relay then ended by
    /// idle timeout or shutdown while still delivering the aborting peer's bytes).
    pub abort: Option<Abort>,
}

impl RelayStats {
    /// The stats of a relay that moved `(client_to_server, server_to_client)` bytes.
    pub(super) fn new((c2s, s2c): (u64, u64), end: RelayEnd, abort: Option<Abort>) -> RelayStats {
        RelayStats {
            client_to_server: c2s,
            server_to_client: s2c,
            end,
            error: abort.map(|a| a.error),
            abort,
        }
    }
}
