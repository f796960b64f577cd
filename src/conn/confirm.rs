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
use std::net::IpAddr;

use tokio::net::TcpStream;

use super::capped::{read_until, Cap};
use super::upstream::{ClientWatch, Offer, Unopened};
use crate::balance::Lease;
use crate::config::StickOn;
use crate::hello::{ClientHelloInfo, ServerWatcher};
use crate::service::{ProcessWide, Service};

/// Most bytes of one backend's answer held while waiting for its verdict: a TLS 1.2
/// ServerHello plus a certificate chain (Puppet's is ~4 KiB, long chains ~16 KiB).
const ANSWER_LIMIT: usize = 64 * 1024;
/// Read granularity of an answer; a ServerHello flight is usually one or two reads.
const ANSWER_READ_CHUNK: usize = 8 * 1024;

/// How a confirmation ended: the `result` label of `crossbar_stick_confirm_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
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
    pub(super) fn as_str(self) -> &'static str {
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
pub(super) enum Wanted {
    /// Nothing to confirm: confirmation off, no session offered, or placement certain.
    No,
    /// A session of uncertain placement that can't be confirmed safely.
    NotEligible,
    /// Confirm it.
    Yes,
}

/// Decide for one ClientHello. `certain` is an exact session entry or a non-shared
/// key-name prefix hit; `buffered` is every client byte read so far.
pub(super) fn wanted(svc: &Service, h: &ClientHelloInfo, buffered: usize, certain: bool) -> Wanted {
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
pub(super) struct Committed {
    /// Connection to the chosen backend.
    pub(super) server: TcpStream,
    /// Its connection slot.
    pub(super) lease: Lease,
    /// Its answer so far, not yet sent to the client.
    pub(super) pending: Vec<u8>,
    /// Backends the ClientHello was offered to, the chosen one included.
    pub(super) tried: usize,
    /// How the search ended.
    pub(super) outcome: Outcome,
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
pub(super) struct Search<'a> {
    /// The client's side of opening backends (its hello, its address).
    pub offer: Offer<'a>,
    /// Process-wide state (the budget).
    pub shared: &'a ProcessWide,
    /// Backends already tried (and failed) for this connection.
    pub tried: Vec<usize>,
}

impl Search<'_> {
    /// Read the first backend's verdict and, if it did a full handshake, offer the
    /// hello to further candidates until one resumes it.
    pub(super) async fn run(mut self, mut server: TcpStream, lease: Lease) -> Committed {
        let limit = self.offer.svc.config.timeouts.server_hello;
        let deadline = tokio::time::Instant::now() + limit;
        let (verdict, pending) = answer(&mut server, self.offer.client, deadline).await;
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
        let svc = self.offer.svc;
        let tries = svc.config.stick.as_ref().map_or(1, |s| s.confirm_tries);
        let ip: IpAddr = self.offer.peer.ip().to_canonical();
        let mut offered = 1;
        let mut outcome = Outcome::NoneResumed;
        while offered < tries {
            // The budget first: a flood with an empty budget must not disturb the
            // balance order (round robin advances at every pick).
            if !self.shared.confirm_budget.try_take() {
                outcome = Outcome::BudgetEmpty;
                break;
            }
            let Some(next) = svc.pool.try_pick(ip, &self.tried) else {
                break;
            };
            self.tried.push(next.backend().index);
            offered += 1;
            match self.offer_to(&next).await {
                Offered::Resumed(server, pending) => {
                    return Committed {
                        server,
                        lease: next,
                        pending,
                        tried: offered,
                        outcome: Outcome::RetriedResumed,
                    };
                }
                // A later backend's HRR, silence or close, or a stir from the client
                // ends the search at the answer already held.
                Offered::Ended => {
                    outcome = Outcome::Ended;
                    break;
                }
                Offered::Full | Offered::Unreached => {}
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

    /// Open one more candidate ([`Offer::open`]) and read its verdict.
    async fn offer_to(&self, lease: &Lease) -> Offered {
        let b = lease.backend();
        let svc = self.offer.svc;
        let limit = svc.config.timeouts.server_hello;
        // Its dial is not the connection's `connect_ms` (the connect loop's).
        let mut dialed = None;
        let opened = self
            .offer
            .open(lease, ClientWatch::Stirs, Some(limit), &mut dialed)
            .await;
        let mut s = match opened {
            Ok(s) => s,
            Err(Unopened::Connect(_)) => return Offered::Unreached,
            Err(e) => {
                if !matches!(e, Unopened::Client) {
                    svc.metrics.confirm_extra(&b.name);
                }
                return Offered::Ended;
            }
        };
        svc.metrics.confirm_extra(&b.name);
        // It has answered (a first byte): the rest of its flight follows at once.
        let deadline = tokio::time::Instant::now() + limit;
        match answer(&mut s, self.offer.client, deadline).await {
            (Verdict::Resumed, bytes) => Offered::Resumed(s, bytes),
            (Verdict::Full, _) => Offered::Full,
            (Verdict::HelloRetry | Verdict::Unknown, _) => Offered::Ended,
        }
    }
}

/// What offering the hello to one more candidate came to.
enum Offered {
    /// It could not be reached (counted like any failed connect): try the next.
    Unreached,
    /// It resumed the session: its connection and answer so far.
    Resumed(TcpStream, Vec<u8>),
    /// A full handshake: try the next.
    Full,
    /// No verdict, a HelloRetryRequest, or the client stirred: the search ends.
    Ended,
}

/// Read a backend's answer until it shows whether the session resumed, by
/// `deadline` and within [`ANSWER_LIMIT`] bytes; stops early if the client stirs
/// (sends a byte or closes: it must not be kept waiting for a search).
async fn answer(
    server: &mut TcpStream,
    client: &TcpStream,
    deadline: tokio::time::Instant,
) -> (Verdict, Vec<u8>) {
    let mut watcher = ServerWatcher::new(ANSWER_LIMIT);
    let mut held = Vec::new();
    let cap = Cap {
        bytes: ANSWER_LIMIT,
        chunk: ANSWER_READ_CHUNK,
        deadline,
    };
    let stirs = ClientWatch::Stirs.fired(client);
    let verdict = read_until(server, &mut held, cap, stirs, |held, fresh| {
        if fresh < held.len() {
            watcher.feed(&held[fresh..]);
        }
        let info = watcher.info();
        match info.resumed {
            _ if info.hello_retry => Some(Verdict::HelloRetry),
            Some(true) => Some(Verdict::Resumed),
            Some(false) => Some(Verdict::Full),
            None if watcher.is_done() => Some(Verdict::Unknown),
            None => None,
        }
    });
    (verdict.await.unwrap_or(Verdict::Unknown), held)
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
