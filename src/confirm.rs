//! Confirm, then commit: offer a resumption's ClientHello to further backends until
//! one says in its ServerHello that it holds the session, before the client sees a byte.
//!
//! Every way crossbar learns where a session lives has blind spots (TLS 1.3 tickets
//! travel encrypted, JDK tickets carry no key name, another crossbar node saw the
//! handshake). The backend itself always knows, and says so in plaintext: its
//! ServerHello selects the PSK (TLS 1.3), or is followed by ChangeCipherSpec instead
//! of Certificate (TLS 1.2 session ID or ticket resumption). Until crossbar forwards
//! that answer the client has received nothing, so the same ClientHello can still be
//! offered to another backend. Safety rules (docs/stickiness.md):
//!
//! - only the ClientHello reaches more than one backend: a hello announcing early
//!   data, client bytes after the hello, or a HelloRetryRequest end the search;
//! - the client receives exactly one backend's bytes: answers are held, bounded by
//!   [`ANSWER_LIMIT`] bytes and `timeouts.server_hello` per backend, and only the chosen
//!   one is forwarded;
//! - the first backend's full-handshake answer is kept rather than asking it twice;
//! - a global token bucket ([`crate::budget::Budget`]) bounds the extra handshakes
//!   per second.
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use crate::balance::Lease;
use crate::config::StickOn;
use crate::hello::{ClientHelloInfo, ServerWatcher};
use crate::service::{Service, Shared};

/// Most bytes of one backend's answer held while waiting for its verdict: a TLS 1.2
/// ServerHello plus a certificate chain (Puppet's is ~4 KiB, long chains ~16 KiB).
pub const ANSWER_LIMIT: usize = 64 * 1024;
/// Read granularity of an answer; a ServerHello flight is usually one or two reads.
const ANSWER_READ_CHUNK: usize = 8 * 1024;

/// How a confirmation ended: the `result` label of `crossbar_stick_confirm_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The first backend resumed the session.
    First,
    /// A later backend resumed it; the earlier ones were dropped unseen.
    RetriedResumed,
    /// No backend tried resumed it: the client gets the first one's full handshake.
    NoneResumed,
    /// The first backend did a full handshake and the budget had no token left.
    BudgetEmpty,
    /// The hello can't be offered twice (early data, bytes after the hello).
    NotEligible,
    /// The first backend asked for a second hello: the search ends there.
    HelloRetry,
    /// No verdict (client bytes or close, an alert, a timeout, a closed backend):
    /// committed to the first backend as it is.
    Ended,
}

impl Outcome {
    /// The metric label and access-log value.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::First => "first",
            Outcome::RetriedResumed => "retried_resumed",
            Outcome::NoneResumed => "none_resumed",
            Outcome::BudgetEmpty => "budget_empty",
            Outcome::NotEligible => "not_eligible",
            Outcome::HelloRetry => "hello_retry",
            Outcome::Ended => "ended",
        }
    }
}

/// Whether a connection's placement is to be confirmed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wanted {
    /// Nothing to confirm: confirmation off, no session offered, or placement certain.
    No,
    /// A session of uncertain placement that can't be confirmed safely.
    NotEligible,
    /// Confirm it.
    Yes,
}

/// Decide for one ClientHello. `certain` is an exact session entry or a non-shared
/// key-name prefix hit; `buffered` is every client byte read so far.
pub fn wanted(svc: &Service, h: &ClientHelloInfo, buffered: usize, certain: bool) -> Wanted {
    let on = svc
        .config
        .stick
        .as_ref()
        .is_some_and(|s| s.confirm && s.confirm_tries > 1);
    if !on || certain || svc.table.is_none() || !offers_session(svc, h) {
        return Wanted::No;
    }
    if h.early_data || buffered > h.consumed {
        return Wanted::NotEligible;
    }
    Wanted::Yes
}

/// Does the hello offer session state the service sticks on? A TLS 1.3 client's
/// legacy session ID is random, not state.
fn offers_session(svc: &Service, h: &ClientHelloInfo) -> bool {
    let tls13 = h.supported_versions.contains(&crate::hello::version::TLS13);
    (svc.sticks_on(StickOn::Ticket) && h.ticket.is_some())
        || (svc.sticks_on(StickOn::Psk) && !h.psk_identities.is_empty())
        || (svc.sticks_on(StickOn::SessionId) && !tls13 && !h.session_id.is_empty())
}

/// The backend chosen, with the bytes of its answer that were read while deciding
/// (the client must receive them first).
pub struct Committed {
    /// Connection to the chosen backend.
    pub server: TcpStream,
    /// Its connection slot.
    pub lease: Lease,
    /// Its answer so far, not yet sent to the client.
    pub pending: Vec<u8>,
    /// Backends the ClientHello was offered to, the chosen one included.
    pub tried: usize,
    /// How the search ended.
    pub outcome: Outcome,
}

/// What one backend's answer showed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Resumed,
    Full,
    HelloRetry,
    /// Anything else: an alert, EOF, timeout, the byte limit, client activity.
    Unknown,
}

/// Everything a search needs about the connection.
pub struct Search<'a> {
    /// The service.
    pub svc: &'a Service,
    /// Process-wide state (the budget).
    pub shared: &'a Shared,
    /// The client (only watched, never read or written).
    pub client: &'a TcpStream,
    /// The client's address.
    pub peer: SocketAddr,
    /// The parsed hello.
    pub hello: &'a ClientHelloInfo,
    /// The hello's bytes, as sent to the first backend.
    pub hello_bytes: &'a [u8],
    /// Backends already tried (and failed) for this connection.
    pub tried: Vec<usize>,
}

impl Search<'_> {
    /// Read the first backend's verdict and, if it did a full handshake, offer the
    /// hello to further candidates until one resumes it.
    pub async fn run(mut self, mut server: TcpStream, lease: Lease) -> Committed {
        let limit = self.svc.config.timeouts.server_hello;
        let (verdict, pending) = answer(&mut server, self.client, limit).await;
        let outcome = match verdict {
            Verdict::Resumed => Outcome::First,
            Verdict::HelloRetry => Outcome::HelloRetry,
            Verdict::Unknown => Outcome::Ended,
            Verdict::Full => {
                self.tried.push(lease.backend().index);
                return self.retry(server, lease, pending).await;
            }
        };
        Committed {
            server,
            lease,
            pending,
            tried: 1,
            outcome,
        }
    }

    /// The first backend did a full handshake (held in `pending`): try the others.
    async fn retry(mut self, server: TcpStream, lease: Lease, pending: Vec<u8>) -> Committed {
        let tries = self
            .svc
            .config
            .stick
            .as_ref()
            .map_or(1, |s| s.confirm_tries);
        let ip: IpAddr = self.peer.ip().to_canonical();
        let mut offered = 1;
        let mut outcome = Outcome::NoneResumed;
        while offered < tries {
            // The budget first: a flood with an empty budget must not disturb the
            // balance order (round robin advances at every pick).
            if !self.shared.confirm_budget.try_take() {
                outcome = Outcome::BudgetEmpty;
                break;
            }
            let Some(next) = self.svc.pool.try_pick(ip, &self.tried) else {
                break;
            };
            self.tried.push(next.backend().index);
            offered += 1;
            match self.offer(&next).await {
                Some((s, Verdict::Resumed, bytes)) => {
                    return Committed {
                        server: s,
                        lease: next,
                        pending: bytes,
                        tried: offered,
                        outcome: Outcome::RetriedResumed,
                    };
                }
                // A later backend's HRR or a stir from the client ends the search
                // at the answer already held.
                Some((_, Verdict::HelloRetry | Verdict::Unknown, _)) => {
                    outcome = Outcome::Ended;
                    break;
                }
                Some((_, Verdict::Full, _)) | None => {}
            }
        }
        Committed {
            server,
            lease,
            pending,
            tried: offered,
            outcome,
        }
    }

    /// Connect to one more candidate, send it the hello, read its verdict. `None`
    /// if it could not be reached (counted like any failed connect).
    async fn offer(&self, lease: &Lease) -> Option<(TcpStream, Verdict, Vec<u8>)> {
        let b = lease.backend();
        let limit = self.svc.config.timeouts.connect;
        let mut s = match crate::dial::connect_to(&b.config.address, limit).await {
            Ok(s) => s,
            Err(e) => {
                b.metrics.connect_errors.inc();
                crate::health::passive_failure(self.svc, b, &e);
                tracing::debug!(backend = %b.name, "confirmation connect failed: {e}");
                return None;
            }
        };
        crate::health::passive_success(b);
        self.svc.metrics.confirm_extra(&b.name);
        let sni = self.hello.sni.as_deref();
        let proxy = b.config.proxy_protocol;
        let sent =
            crate::dial::send_prelude(&mut s, self.client, self.peer, proxy, sni, self.hello_bytes);
        if tokio::time::timeout(limit, sent).await.ok()?.is_err() {
            return None;
        }
        let (verdict, bytes) =
            answer(&mut s, self.client, self.svc.config.timeouts.server_hello).await;
        Some((s, verdict, bytes))
    }
}

/// Read a backend's answer until it shows whether the session resumed, within
/// `limit` and [`ANSWER_LIMIT`] bytes; stops early if the client stirs (sends a byte
/// or closes: it must not be kept waiting for a search).
async fn answer(server: &mut TcpStream, client: &TcpStream, limit: Duration) -> (Verdict, Vec<u8>) {
    let mut watcher = ServerWatcher::new(ANSWER_LIMIT);
    let mut held = Vec::new();
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let info = watcher.info();
        if info.hello_retry {
            return (Verdict::HelloRetry, held);
        }
        match info.resumed {
            Some(true) => return (Verdict::Resumed, held),
            Some(false) => return (Verdict::Full, held),
            None if watcher.is_done() || held.len() >= ANSWER_LIMIT => {
                return (Verdict::Unknown, held)
            }
            None => {}
        }
        let old = held.len();
        let room = (ANSWER_LIMIT - old).min(ANSWER_READ_CHUNK);
        held.resize(old + room, 0);
        let read = tokio::select! {
            r = tokio::time::timeout_at(deadline, server.read(&mut held[old..])) => r,
            () = client_stirs(client) => Ok(Err(std::io::ErrorKind::Interrupted.into())),
        };
        match read {
            Ok(Ok(n)) if n > 0 => {
                held.truncate(old + n);
                watcher.feed(&held[old..]);
            }
            _ => {
                held.truncate(old);
                return (Verdict::Unknown, held);
            }
        }
    }
}

/// Resolves when the client sends a byte, closes or fails; peeks, never reads.
async fn client_stirs(client: &TcpStream) {
    let mut probe = [0u8; 1];
    let _ = client.peek(&mut probe).await; // ok: any outcome is a stir
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcome_labels_are_distinct() {
        let all = [
            Outcome::First,
            Outcome::RetriedResumed,
            Outcome::NoneResumed,
            Outcome::BudgetEmpty,
            Outcome::NotEligible,
            Outcome::HelloRetry,
            Outcome::Ended,
        ];
        let labels: std::collections::HashSet<_> = all.iter().map(|o| o.as_str()).collect();
        assert_eq!(labels.len(), all.len());
        // Every label exists at 0 in /metrics from the start.
        for o in all {
            assert!(
                crate::metrics::CONFIRM_RESULTS.contains(&o.as_str()),
                "{o:?}"
            );
        }
    }
}
