//! The access log: one line per connection on target `crossbar::access`, written
//! once at its end (error lines are bounded by `log_writer::LogLimiter`).
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use crate::service::Service;

/// The fields of one access-log line, filled in as the connection progresses.
#[derive(Default)]
pub struct AccessLog {
    /// The client a trusted tier's PROXY header named (the TCP peer, logged as
    /// `via`, is then the tier); `None`: the peer is the client.
    pub proxied: Option<SocketAddr>,
    /// The service it was routed to (its `Arc`: naming it costs no allocation).
    pub service: Option<Arc<Service>>,
    /// The stick key kind that decided (or was last looked up).
    pub stick: Option<&'static str>,
    /// Whether that lookup hit.
    pub stick_hit: bool,
    /// The backend connected to (or last tried).
    pub backend: Option<Arc<str>>,
    /// Backends the ClientHello was offered to (more than one while confirming).
    pub tried: usize,
    /// How placement confirmation ended, if it ran.
    pub confirm: Option<&'static str>,
    /// `full` or `resumed`, once the server's handshake showed it.
    pub handshake: Option<&'static str>,
    /// Bytes client -> server, the replayed hello included.
    pub c2s: u64,
    /// Bytes server -> client.
    pub s2c: u64,
    /// How the connection ended (the termination reason), in two static words.
    pub end: End,
    /// The error, if it ended in one.
    pub error: Option<String>,
}

impl AccessLog {
    /// Write the line for the connection from `peer` on `listener`, begun at `started`:
    /// `client=` the client (named by a PROXY header, or the peer), `via=` the tier
    /// it came through (`-`: none); `sni` the name the client sent, kept by the
    /// connection (not copied here).
    pub fn write(&self, peer: SocketAddr, listener: &str, started: Instant, sni: Option<&str>) {
        let via = self.proxied.map(|_| peer);
        tracing::info!(
            target: "crossbar::access",
            client = %self.proxied.unwrap_or(peer),
            via = %Via(via),
            listener = %listener,
            sni = sni.unwrap_or("-"),
            service = self.service.as_deref().map_or("-", Service::name),
            stick = self.stick.unwrap_or("-"),
            stick_result = if self.stick.is_none() { "-" } else if self.stick_hit { "hit" } else { "miss" },
            backend = self.backend.as_deref().unwrap_or("-"),
            tried = self.tried,
            confirm = self.confirm.unwrap_or("-"),
            handshake = self.handshake.unwrap_or("-"),
            bytes_in = self.c2s,
            bytes_out = self.s2c,
            duration_ms = started.elapsed().as_millis() as u64,
            end = %self.end,
            error = self.error.as_deref().unwrap_or(""),
        );
    }
}

/// A termination reason: a side's prefix (`hello_error:`, `refused:`, ...; may be
/// empty) and the word, both static so that ending a connection allocates nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct End {
    /// The prefix naming the side or step (`""` for none).
    pub prefix: &'static str,
    /// The reason itself.
    pub word: &'static str,
}

impl End {
    /// A reason without a prefix.
    pub fn word(word: &'static str) -> End {
        End { prefix: "", word }
    }
}

impl std::fmt::Display for End {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.prefix)?;
        f.write_str(self.word)
    }
}

/// A `via` value: the address, or `-`.
struct Via(Option<SocketAddr>);

impl std::fmt::Display for Via {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(a) => a.fmt(f),
            None => f.write_str("-"),
        }
    }
}
