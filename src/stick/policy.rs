//! The placement policy: which of a client's offers (session ID, ticket, PSK
//! identity, source address) are looked up and in which order, the short source hint
//! for a first resumption, and what a server's handshake teaches the table.
//!
//! Entries are learned only from what the server chose, never from what a client
//! merely claimed: a client can't create an entry, so it can't steer itself onto a
//! backend of its choice or fill the table without completing real handshakes.
use std::net::IpAddr;
use std::time::Duration;

use super::{KeyKind, StickTable};
use crate::config::{StickConfig, StickOn};
use crate::hello::{self, ClientHelloInfo, ServerHandshake};

/// Lifetime of the source entry recorded at a full handshake when `source` is not a
/// stick key: long enough to route a client's first resumption (whose ticket prefix
/// may not be known yet) back to the backend that issued its ticket.
pub const RESUME_HINT_TTL: Duration = Duration::from_secs(300);

/// Where the counters of lookups and learned entries go (a service's metrics).
pub trait StickMetrics {
    /// One lookup of a key kind, and whether it hit.
    fn lookup(&self, kind: KeyKind, hit: bool);
    /// One entry of a key kind learned.
    fn learned(&self, kind: KeyKind);
}

/// The backends an entry may point at: a name's position in the service's pool,
/// `None` for a backend no longer there (then the entry is a miss).
pub trait BackendIndex {
    /// The position of the backend called `name`.
    fn position(&self, name: &str) -> Option<usize>;
}

/// The stick table's answer for one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// The key kind that decided (or, on a miss, the last one looked up).
    pub kind: KeyKind,
    /// The pool position of the backend holding the session, on a hit.
    pub backend: Option<usize>,
}

/// One service's stickiness: its table and rules, its pool and its counters.
pub struct Sticking<'a> {
    /// The service's table.
    pub table: &'a StickTable,
    /// The service's `stick` settings.
    pub config: &'a StickConfig,
    /// The service's backends.
    pub backends: &'a dyn BackendIndex,
    /// The service's counters.
    pub metrics: &'a dyn StickMetrics,
}

impl Sticking<'_> {
    /// Look the client's session state up in the order of `stick.on`; then, for a
    /// resumption nothing else knows, the source hint of its last full handshake.
    /// `None` when no key applied to this connection.
    pub fn place(&self, hello: Option<&ClientHelloInfo>, ip: IpAddr) -> Option<Placement> {
        let mut last = None;
        for key in &self.config.on {
            let found = match (key, hello) {
                (StickOn::SessionId, Some(h)) if !h.session_id.is_empty() => {
                    let hit = self.hit(KeyKind::SessionId, &h.session_id);
                    // A TLS 1.3 client's legacy session ID is random: only a hit counts then.
                    if hit.is_some() || !offers_tls13(h) {
                        self.metrics.lookup(KeyKind::SessionId, hit.is_some());
                        last = Some(KeyKind::SessionId);
                    }
                    hit.map(|b| (KeyKind::SessionId, b))
                }
                (StickOn::Ticket, Some(h)) => h.ticket.as_deref().and_then(|t| {
                    last = Some(KeyKind::Ticket);
                    self.by_ticket(KeyKind::Ticket, t)
                        .map(|b| (KeyKind::Ticket, b))
                }),
                (StickOn::Psk, Some(h)) => h.psk_identities.iter().find_map(|id| {
                    last = Some(KeyKind::Psk);
                    self.by_ticket(KeyKind::Psk, id).map(|b| (KeyKind::Psk, b))
                }),
                (StickOn::Source, _) => {
                    last = Some(KeyKind::Source);
                    self.counted(KeyKind::Source, &self.source_bytes(ip))
                        .map(|b| (KeyKind::Source, b))
                }
                _ => None,
            };
            if let Some((kind, b)) = found {
                return Some(Placement {
                    kind,
                    backend: Some(b),
                });
            }
        }
        self.resume_hint(hello, ip).or(last.map(|kind| Placement {
            kind,
            backend: None,
        }))
    }

    /// A resumption attempt nothing else knows: the short-lived source hint recorded
    /// at this client's last full handshake.
    fn resume_hint(&self, hello: Option<&ClientHelloInfo>, ip: IpAddr) -> Option<Placement> {
        let resuming = hello.is_some_and(|h| h.ticket.is_some() || !h.psk_identities.is_empty());
        if !resuming || self.sticks_on(StickOn::Source) {
            return None;
        }
        let b = self.hit(KeyKind::Source, &self.source_bytes(ip))?;
        Some(Placement {
            kind: KeyKind::Source,
            backend: Some(b),
        })
    }

    /// A connection reached `backend`: with `source` a stick key, that is where this
    /// client address goes from now on.
    pub fn learn_connect(&self, ip: IpAddr, backend: &str) {
        if self.sticks_on(StickOn::Source) {
            self.learn(KeyKind::Source, &self.source_bytes(ip), backend);
        }
    }

    /// Learn from what the server chose: never from what the client merely claimed.
    pub fn learn_handshake(
        &self,
        h: &ClientHelloInfo,
        hs: &ServerHandshake,
        ip: IpAddr,
        backend: &str,
    ) {
        let tls13 = hs.version == Some(hello::version::TLS13);
        if hs.alert || hs.resumed.is_none() {
            return;
        }
        // A TLS <= 1.2 full handshake counts once the client finished it (the server's CCS
        // follows the client's Finished): before, its session ID is one nobody can resume,
        // and learning it let bare ClientHellos flush the table (tests/hostile_clients.rs).
        if !tls13 && hs.resumed == Some(false) && !hs.server_ccs {
            return;
        }
        // TLS <= 1.2: the server assigned (or, resuming, confirmed) this session ID.
        if !tls13 && !hs.session_id.is_empty() && self.sticks_on(StickOn::SessionId) {
            self.learn(KeyKind::SessionId, &hs.session_id, backend);
        }
        if self.sticks_on(StickOn::Ticket) {
            self.learn_tickets(h, hs, tls13, backend);
        }
        // TLS 1.3: the PSK identity the ServerHello says it accepted.
        if let (true, Some(i)) = (tls13, hs.psk_selected) {
            if let Some(id) = h.psk_identities.get(usize::from(i)) {
                if self.sticks_on(StickOn::Psk) {
                    self.learn(KeyKind::Psk, id, backend);
                }
                if self.sticks_on(StickOn::Psk) || self.sticks_on(StickOn::Ticket) {
                    self.learn_prefix(id, backend);
                }
            }
        }
        // A full handshake: remember where this client went, briefly, for its first resumption.
        if hs.resumed == Some(false) && !self.sticks_on(StickOn::Source) {
            self.learn(KeyKind::Source, &self.source_bytes(ip), backend);
        }
    }

    /// TLS 1.2 tickets: one the server just issued (NewSessionTicket is plaintext),
    /// and one it accepted.
    fn learn_tickets(&self, h: &ClientHelloInfo, hs: &ServerHandshake, tls13: bool, backend: &str) {
        if let Some(t) = &hs.new_ticket {
            self.learn(KeyKind::Ticket, t, backend);
            self.learn_prefix(t, backend);
        }
        if let (Some(t), Some(true), false) = (&h.ticket, hs.resumed, tls13) {
            self.learn(KeyKind::Ticket, t, backend);
            self.learn_prefix(t, backend);
        }
    }

    /// Is this key kind enabled for the service?
    fn sticks_on(&self, key: StickOn) -> bool {
        self.config.on.contains(&key)
    }

    /// The pool position of the backend an entry points at; an entry for a backend
    /// no longer in the pool is a miss.
    fn hit(&self, kind: KeyKind, raw: &[u8]) -> Option<usize> {
        self.table
            .lookup(kind, raw, |name| self.backends.position(name))
            .flatten()
    }

    /// [`Sticking::hit`], counted.
    fn counted(&self, kind: KeyKind, raw: &[u8]) -> Option<usize> {
        let hit = self.hit(kind, raw);
        self.metrics.lookup(kind, hit.is_some());
        hit
    }

    /// A ticket or PSK identity: the whole value first, then its key-name prefix.
    fn by_ticket(&self, kind: KeyKind, raw: &[u8]) -> Option<usize> {
        if let Some(b) = self.hit(kind, raw) {
            self.metrics.lookup(kind, true);
            return Some(b);
        }
        let hit = self
            .prefix(raw)
            .and_then(|p| self.hit(KeyKind::TicketPrefix, p));
        self.metrics.lookup(kind, hit.is_some());
        hit
    }

    fn learn(&self, kind: KeyKind, raw: &[u8], backend: &str) {
        self.table.learn(self.table.key(kind, raw), backend);
        self.metrics.learned(kind);
    }

    fn learn_prefix(&self, raw: &[u8], backend: &str) {
        if let Some(p) = self.prefix(raw) {
            self.table
                .learn_prefix(self.table.key(KeyKind::TicketPrefix, p), backend);
        }
    }

    /// The key-name prefix of a ticket or PSK identity, if the service uses prefixes.
    fn prefix<'r>(&self, raw: &'r [u8]) -> Option<&'r [u8]> {
        let p = self.config.ticket_prefix;
        (p > 0 && raw.len() > p).then(|| &raw[..p])
    }

    /// The client address as a source key: masked to `source_prefix_v4`/`_v6`.
    fn source_bytes(&self, ip: IpAddr) -> Vec<u8> {
        source_bytes(self.config, ip)
    }
}

/// The bytes a client address is keyed by: masked to the service's source prefix.
pub fn source_bytes(config: &StickConfig, ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(a) => mask(&a.octets(), config.source_prefix_v4),
        IpAddr::V6(a) => mask(&a.octets(), config.source_prefix_v6),
    }
}

/// Does the client offer TLS 1.3? (Then its legacy session ID is random, not state.)
fn offers_tls13(h: &ClientHelloInfo) -> bool {
    h.supported_versions.contains(&hello::version::TLS13)
}

fn mask(octets: &[u8], bits: u8) -> Vec<u8> {
    octets
        .iter()
        .enumerate()
        .map(|(i, &o)| {
            let keep = (usize::from(bits)).saturating_sub(i * 8).min(8);
            if keep == 0 {
                0
            } else {
                o & (0xffu8 << (8 - keep))
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_keeps_prefix_bits() {
        assert_eq!(mask(&[10, 1, 2, 3], 32), vec![10, 1, 2, 3]);
        assert_eq!(mask(&[10, 1, 2, 3], 24), vec![10, 1, 2, 0]);
        assert_eq!(mask(&[10, 1, 255, 3], 20), vec![10, 1, 240, 0]);
        assert_eq!(mask(&[10, 1, 2, 3], 0), vec![0, 0, 0, 0]);
    }
}
