//! The placement policy: which of a client's offers (session ID, ticket, PSK
//! identity, source address) are looked up and in which order, the short source hint
//! for a first resumption, and what a server's handshake teaches the table.
//!
//! Entries are learned only from what the server chose, never from what a client
//! merely claimed: a client can't create an entry, so it can't steer itself onto a
//! backend of its choice or fill the table without completing real handshakes.
use std::net::IpAddr;
use std::time::Duration;

use super::{KeyKind, StickKey, StickTable};
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

impl Placement {
    /// An exact session entry or a (non-shared) key-name prefix hit: the session's
    /// holder is known. A source entry or the resume hint is only a guess.
    pub fn certain(&self) -> bool {
        self.backend.is_some() && self.kind != KeyKind::Source
    }
}

/// When a connection may teach the table where its client's address goes (the
/// `source` key, or the resume hint): see [`learn_when`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LearnWhen {
    /// As soon as the server's handshake shows.
    Now,
    /// Once the client has sent bytes after the server's handshake showed, and the
    /// server then sent a record that is not an alert
    /// ([`crate::hello::server_proof`]).
    AfterServerProof,
    /// Not at all.
    Never,
}

/// When a server's handshake may teach the table its client's address: only once
/// the client has completed its side of the handshake, or as near as crossbar can
/// see, since a ClientHello costs nothing from any address. Without that, bare
/// hellos from many addresses each taught a `source` entry (or a resume hint) and
/// evicted what completed clients had taught.
///
/// TLS <= 1.2 full handshake: at the server's ChangeCipherSpec, which follows the
/// client's Finished (the server checked it); never without it. Every other
/// handshake (TLS 1.3, or a resumption, where the server answers the hello alone):
/// once the client has sent bytes after the server's handshake showed (a TLS 1.3
/// client's Finished, encrypted; a TLS 1.2 client's ChangeCipherSpec and Finished)
/// *and the server answered them* with a record longer than an alert: a
/// NewSessionTicket or data, which a server sends only once it checked the
/// client's Finished. crossbar can't read that encrypted flight, but the server
/// can: a junk record after the ServerHello (a flood without keys) gets an alert
/// and teaches nothing. Client bytes before the server's handshake (a second hello after a
/// HelloRetryRequest) answer nothing and count for nothing; a hello that announced
/// 0-RTT early data never teaches its address (its bytes after the ServerHello may
/// be early data sent before it). What the session state itself teaches (session
/// ID, ticket, PSK) has rules of its own ([`Sticking::learn_handshake`]).
pub fn learn_when(h: &ClientHelloInfo, hs: &ServerHandshake) -> LearnWhen {
    if hs.alert || hs.resumed.is_none() {
        LearnWhen::Never
    } else if hs.version != Some(hello::version::TLS13) && hs.resumed == Some(false) {
        match hs.server_ccs {
            true => LearnWhen::Now,
            false => LearnWhen::Never,
        }
    } else if h.early_data {
        LearnWhen::Never
    } else {
        LearnWhen::AfterServerProof
    }
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
    /// at this client's last full handshake, unless its address is shared by many
    /// clients (then the hint is a miss and the balance algorithm places it).
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

    /// A connection with no handshake to watch (`mode: tcp`, or non-TLS bytes
    /// forwarded) reached `backend`: with `source` a stick key, that is where this
    /// client address goes from now on. A TLS connection's address is learned from
    /// its handshake instead, once the client completed it ([`Sticking::learn_source`]).
    pub fn learn_connect(&self, ip: IpAddr, backend: &str) {
        if self.sticks_on(StickOn::Source) {
            self.learn(KeyKind::Source, &self.source_bytes(ip), backend, false);
            self.note_client(ip);
        }
    }

    /// Keep the client prefix of `ip`'s source entry, for `table show`.
    fn note_client(&self, ip: IpAddr) {
        let (key, prefix) = source_key(self.table, self.config, ip);
        self.table.note_client(key.hash, prefix);
    }

    /// The client at `ip` completed its side of a handshake with `backend`
    /// ([`learn_when`]): with `source` a stick key, that is where this address goes
    /// from now on; else a full handshake records the short resume hint for the
    /// client's first resumption, unless the address is evidently many clients
    /// (NAT), see `StickTable::learn_hint`: following one hint there herded them all.
    /// A resumption's address entry is protected ([`StickTable::protect`]).
    pub fn learn_source(&self, hs: &ServerHandshake, ip: IpAddr, backend: &str) {
        if self.sticks_on(StickOn::Source) {
            let proven = hs.resumed == Some(true);
            self.learn(KeyKind::Source, &self.source_bytes(ip), backend, proven);
            self.note_client(ip);
        } else if hs.resumed == Some(false) {
            let key = self.table.key(KeyKind::Source, &self.source_bytes(ip));
            self.table.learn_hint(key, backend);
            self.metrics.learned(KeyKind::Source);
            self.note_client(ip);
        }
    }

    /// Learn the session state from what the server chose: never from what the
    /// client merely claimed. (The client's address waits for [`learn_when`].)
    pub fn learn_handshake(&self, h: &ClientHelloInfo, hs: &ServerHandshake, backend: &str) {
        let tls13 = hs.version == Some(hello::version::TLS13);
        if hs.alert || hs.resumed.is_none() {
            return;
        }
        // A resumption proves its session state: the server accepted it (a PSK's
        // binder, a ticket it decrypted, a session ID it kept). Protected entries.
        let proven = hs.resumed == Some(true);
        // A TLS <= 1.2 full handshake counts once the client finished it (the server's CCS
        // follows the client's Finished): before, its session ID is one nobody can resume,
        // and learning it let bare ClientHellos flush the table (tests/hostile_clients.rs).
        if !tls13 && hs.resumed == Some(false) && !hs.server_ccs {
            return;
        }
        // TLS <= 1.2: the server assigned (or, resuming, confirmed) this session ID. On a
        // ticket resumption it merely echoes the ID the client chose (RFC 5077 3.4):
        // learning that let one valid ticket and random IDs add an entry per cheap
        // abbreviated handshake.
        let ticket_resumption = h.ticket.is_some() && hs.resumed == Some(true);
        if !tls13
            && !ticket_resumption
            && !hs.session_id.is_empty()
            && self.sticks_on(StickOn::SessionId)
        {
            self.learn(KeyKind::SessionId, &hs.session_id, backend, proven);
        }
        if self.sticks_on(StickOn::Ticket) {
            self.learn_tickets(h, hs, tls13, backend);
        }
        // TLS 1.3: the PSK identity the ServerHello says it accepted. After a
        // HelloRetryRequest its index points into the client's second hello, which we
        // don't parse: learn nothing then (a client could offer `[forged, real]` first).
        if let (true, false, Some(i)) = (tls13, hs.hello_retry, hs.psk_selected) {
            if let Some(id) = h.psk_identities.get(usize::from(i)) {
                if self.sticks_on(StickOn::Psk) {
                    self.learn(KeyKind::Psk, id, backend, proven);
                }
                if self.sticks_on(StickOn::Psk) || self.sticks_on(StickOn::Ticket) {
                    self.learn_prefix(id, backend, proven);
                }
            }
        }
    }

    /// TLS 1.2 tickets: one the server just issued (NewSessionTicket is plaintext),
    /// and one it accepted.
    fn learn_tickets(&self, h: &ClientHelloInfo, hs: &ServerHandshake, tls13: bool, backend: &str) {
        // A new ticket is not yet proven; one the server accepted is.
        if let Some(t) = &hs.new_ticket {
            self.learn(KeyKind::Ticket, t, backend, false);
            self.learn_prefix(t, backend, false);
        }
        if let (Some(t), Some(true), false) = (&h.ticket, hs.resumed, tls13) {
            self.learn(KeyKind::Ticket, t, backend, true);
            self.learn_prefix(t, backend, true);
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

    /// Learn one entry; `proven` when a resumption proved it: it is then protected
    /// from eviction by unproven entries ([`StickTable::protect`]).
    fn learn(&self, kind: KeyKind, raw: &[u8], backend: &str, proven: bool) {
        let key = self.table.key(kind, raw);
        self.table.learn(key, backend);
        if proven {
            self.table.protect(&key);
        }
        self.metrics.learned(kind);
    }

    fn learn_prefix(&self, raw: &[u8], backend: &str, proven: bool) {
        if let Some(p) = self.prefix(raw) {
            let key = self.table.key(KeyKind::TicketPrefix, p);
            self.table.learn_prefix(key, backend);
            if proven {
                self.table.protect(&key);
            }
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

/// The source entry (`source` stickiness or the resume hint) a client address
/// falls under: its key, and the prefix it covers (`10.1.2.0/24`; every client of
/// the prefix shares the entry).
pub fn source_key(table: &StickTable, config: &StickConfig, ip: IpAddr) -> (StickKey, String) {
    let ip = ip.to_canonical();
    let bytes = source_bytes(config, ip);
    let (net, bits) = match ip {
        IpAddr::V4(_) => (
            <[u8; 4]>::try_from(bytes.as_slice()).map(IpAddr::from),
            config.source_prefix_v4,
        ),
        IpAddr::V6(_) => (
            <[u8; 16]>::try_from(bytes.as_slice()).map(IpAddr::from),
            config.source_prefix_v6,
        ),
    };
    let prefix = format!("{}/{bits}", net.unwrap_or(ip));
    (table.key(KeyKind::Source, &bytes), prefix)
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

    use crate::hello::{HelloParse, ServerWatcher};
    use crate::stick::TableParams;

    /// Counts nothing, places on a pool of one backend `b1`.
    struct One;
    impl StickMetrics for One {
        fn lookup(&self, _: KeyKind, _: bool) {}
        fn learned(&self, _: KeyKind) {}
    }
    impl BackendIndex for One {
        fn position(&self, name: &str) -> Option<usize> {
            (name == "b1").then_some(0)
        }
    }

    /// The `stick` settings of a service sticking on every TLS key.
    fn stick_config() -> StickConfig {
        let yaml =
            "admin: { enabled: false }\nservices:\n  svc:\n    listen: [\"127.0.0.1:0\"]\n    \
                    stick: { on: [session_id, ticket, psk] }\n    \
                    backends:\n      - { name: b1, address: \"127.0.0.1:9\" }\n";
        let c = crate::config::Config::from_str_at(yaml, std::path::Path::new("t.yaml")).unwrap();
        c.services[0].stick.clone().unwrap()
    }

    fn table() -> StickTable {
        StickTable::new(TableParams {
            size: 100,
            expire: Duration::from_secs(60),
            source_expire: Duration::from_secs(60),
        })
    }

    /// The policy over `table` and `config`, for a pool of one backend `b1`.
    fn sticking<'a>(table: &'a StickTable, config: &'a StickConfig) -> Sticking<'a> {
        Sticking {
            table,
            config,
            backends: &One,
            metrics: &One,
        }
    }

    /// A captured ClientHello and what the watcher saw in the server's real answer.
    fn captured(name: &str) -> (ClientHelloInfo, ServerHandshake) {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/server_flights/"
        );
        let hello = std::fs::read(format!("{dir}{name}.hello.bin")).unwrap();
        let server = std::fs::read(format!("{dir}{name}.server.bin")).unwrap();
        let HelloParse::Found(h) = hello::parse_client_hello(&hello, 64 * 1024) else {
            panic!("{name}: no hello");
        };
        let mut w = ServerWatcher::new(64 * 1024);
        w.feed(&server);
        (h, w.info().clone())
    }

    /// After a HelloRetryRequest the ServerHello's `selected_identity` indexes the
    /// client's second hello: applied to the first hello's list it named whatever the
    /// client put first there (a forged identity, learned with its prefix).
    #[test]
    fn no_psk_is_learned_after_a_hello_retry() {
        let (config, table) = (stick_config(), table());
        let s = sticking(&table, &config);
        let (mut h, mut hs) = captured("openssl3_tls13_resumed");
        assert_eq!(hs.psk_selected, Some(0));
        let real = h.psk_identities[0].clone();
        let forged = vec![0x5a; real.len()];
        // First hello `[forged, real]`, HRR, second hello `[real]`, selected_identity 0.
        h.psk_identities = vec![forged.clone(), real.clone()];
        hs.hello_retry = true;
        s.learn_handshake(&h, &hs, "b1");
        for id in [&forged, &real] {
            assert_eq!(s.hit(KeyKind::Psk, id), None);
            assert_eq!(s.hit(KeyKind::TicketPrefix, s.prefix(id).unwrap()), None);
        }
    }

    /// On a TLS 1.2 ticket resumption the server echoes the session ID the client
    /// chose: learning it let one valid ticket and random IDs add an entry per
    /// abbreviated handshake.
    #[test]
    fn no_session_id_is_learned_from_a_ticket_resumption() {
        let (config, table) = (stick_config(), table());
        let s = sticking(&table, &config);
        let (h, hs) = captured("openssl3_tls12_resumed");
        assert!(h.ticket.is_some());
        assert_eq!(hs.resumed, Some(true));
        assert_eq!(
            hs.session_id, h.session_id,
            "the server echoes the client's ID"
        );
        s.learn_handshake(&h, &hs, "b1");
        assert_eq!(s.hit(KeyKind::SessionId, &hs.session_id), None);
        // The accepted ticket itself is still learned.
        assert_eq!(
            s.hit(KeyKind::Ticket, h.ticket.as_deref().unwrap()),
            Some(0)
        );
    }

    /// When a handshake may teach the client's address, on captured real flights:
    /// a TLS 1.2 full handshake at the server's ChangeCipherSpec (after the client's
    /// Finished), never before it; TLS 1.3 and resumptions once the client sent its
    /// next flight; never after early data or an alert.
    #[test]
    fn the_address_waits_for_the_client_to_complete_its_side() {
        let (h12, full12) = captured("openssl3_tls12_full");
        assert!(full12.server_ccs && full12.resumed == Some(false));
        assert_eq!(learn_when(&h12, &full12), LearnWhen::Now);
        let mut bare = full12.clone();
        bare.server_ccs = false;
        assert_eq!(
            learn_when(&h12, &bare),
            LearnWhen::Never,
            "a bare TLS 1.2 hello"
        );
        let (h, resumed12) = captured("openssl3_tls12_resumed");
        assert_eq!(learn_when(&h, &resumed12), LearnWhen::AfterServerProof);
        for name in ["openssl3_tls13_full", "openssl3_tls13_resumed"] {
            let (mut h, mut hs) = captured(name);
            assert_eq!(learn_when(&h, &hs), LearnWhen::AfterServerProof, "{name}");
            hs.hello_retry = true;
            assert_eq!(learn_when(&h, &hs), LearnWhen::AfterServerProof, "{name}");
            h.early_data = true;
            assert_eq!(learn_when(&h, &hs), LearnWhen::Never, "{name} with 0-RTT");
            h.early_data = false;
            hs.alert = true;
            assert_eq!(
                learn_when(&h, &hs),
                LearnWhen::Never,
                "{name} then an alert"
            );
        }
        // Session state is another matter: a full TLS 1.2 handshake's ticket is
        // learned at its ChangeCipherSpec, the address with it.
        let (config, table) = (stick_config(), table());
        let s = sticking(&table, &config);
        s.learn_handshake(&h12, &full12, "b1");
        let ticket = full12.new_ticket.as_deref().unwrap();
        assert_eq!(s.hit(KeyKind::Ticket, ticket), Some(0));
        s.learn_handshake(&h12, &bare, "b1");
        assert_eq!(table.stats().entries, 2, "the ticket and its prefix, once");
    }

    #[test]
    fn mask_keeps_prefix_bits() {
        assert_eq!(mask(&[10, 1, 2, 3], 32), vec![10, 1, 2, 3]);
        assert_eq!(mask(&[10, 1, 2, 3], 24), vec![10, 1, 2, 0]);
        assert_eq!(mask(&[10, 1, 255, 3], 20), vec![10, 1, 240, 0]);
        assert_eq!(mask(&[10, 1, 2, 3], 0), vec![0, 0, 0, 0]);
    }
}
