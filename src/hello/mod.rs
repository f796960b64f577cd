//! TLS handshake inspection: the client's ClientHello and the server's plaintext flight.
//!
//! crossbar never terminates TLS. It reads the client's first bytes to route (SNI) and
//! to find the session the client wants to resume (session ID, ticket, PSK identities),
//! then watches the server's plaintext reply to learn what the server actually chose.
//! Both sides are read by a bounded scan of our own that borrows from the buffer
//! (tls-parser, which allocates a Vec per list, only for NewSessionTicket and as
//! the reference in tests), on top of a small record/handshake reassembly layer:
//! a ClientHello with post-quantum key shares is 1.5-2 KiB and can arrive split
//! over TCP reads and over several TLS records.
//!
//! Nothing here panics on hostile input: every length is checked before use.

mod client;
mod inline;
mod records;
mod server_hello;
mod wire;

pub use client::{parse_client_hello, ClientHelloInfo, HelloError, HelloParse};
pub use inline::{SessionId, Versions};
pub use records::{server_proof, RecordScan, ServerProof, MAX_ENCRYPTED_ALERT};
pub use server_hello::{ServerHandshake, ServerWatcher};

/// TLS version numbers as they appear on the wire.
pub(crate) mod version {
    /// TLS 1.2.
    #[cfg(test)]
    pub const TLS12: u16 = 0x0303;
    /// TLS 1.3.
    pub const TLS13: u16 = 0x0304;
}

#[cfg(test)]
mod tests {
    use super::client::*;
    use super::server_hello::*;
    use super::wire::*;
    use super::*;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
    use rustls::{ClientConfig, ClientConnection, HandshakeKind, ServerConfig, ServerConnection};
    use std::sync::Arc;
    use tls_parser::{parse_tls_message_handshake, TlsMessage, TlsMessageHandshake};

    /// Generous hello limit for tests.
    const MAX: usize = 64 * 1024;
    /// Generous watcher limit for tests.
    const LIMIT: usize = 64 * 1024;
    const HOST: &str = "puppet.example.com";

    /// Deterministic xorshift64 PRNG: no new dependency, reproducible failures.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            let mut x = self.0;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            self.0 = x;
            x
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n.max(1) as u64) as usize
        }
    }

    // ---- in-memory rustls handshakes -------------------------------------------------

    struct Pki {
        ca: CertificateDer<'static>,
        chain: Vec<CertificateDer<'static>>,
        key: PrivatePkcs8KeyDer<'static>,
    }

    fn pki() -> Pki {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let leaf = rcgen::CertificateParams::new(vec![HOST.to_string()])
            .unwrap()
            .signed_by(&key, &ca, &ca_key)
            .unwrap();
        Pki {
            ca: ca.der().clone(),
            chain: vec![leaf.der().clone()],
            key: PrivatePkcs8KeyDer::from(key.serialize_der()),
        }
    }

    fn provider() -> rustls::crypto::CryptoProvider {
        rustls::crypto::ring::default_provider()
    }

    fn client_config(
        pki: &Pki,
        versions: &[&'static rustls::SupportedProtocolVersion],
    ) -> Arc<ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(pki.ca.clone()).unwrap();
        let config = ClientConfig::builder_with_provider(Arc::new(provider()))
            .with_protocol_versions(versions)
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        Arc::new(config)
    }

    fn server_config(
        pki: &Pki,
        versions: &[&'static rustls::SupportedProtocolVersion],
        tickets: bool,
        provider: rustls::crypto::CryptoProvider,
    ) -> Arc<ServerConfig> {
        let mut config = ServerConfig::builder_with_provider(Arc::new(provider))
            .with_protocol_versions(versions)
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(pki.chain.clone(), PrivateKeyDer::Pkcs8(pki.key.clone_key()))
            .unwrap();
        if tickets {
            config.ticketer = rustls::crypto::ring::Ticketer::new().unwrap();
        }
        Arc::new(config)
    }

    /// The bytes of one handshake, as each side wrote them.
    struct Handshake {
        /// Client->server writes, in order (the first is the ClientHello flight).
        client_flights: Vec<Vec<u8>>,
        /// All server->client bytes.
        server_bytes: Vec<u8>,
        kind: HandshakeKind,
    }

    macro_rules! deliver {
        ($conn:expr, $data:expr) => {{
            let mut data: &[u8] = $data;
            while !data.is_empty() {
                $conn.read_tls(&mut data).unwrap();
                $conn.process_new_packets().unwrap();
            }
        }};
    }

    /// Run a whole handshake in memory (no sockets), recording both directions.
    fn handshake(client: &Arc<ClientConfig>, server: &Arc<ServerConfig>) -> Handshake {
        let mut c =
            ClientConnection::new(client.clone(), ServerName::try_from(HOST).unwrap()).unwrap();
        let mut s = ServerConnection::new(server.clone()).unwrap();
        let mut client_flights = Vec::new();
        let mut server_bytes = Vec::new();
        for _ in 0..20 {
            let mut moved = false;
            while c.wants_write() {
                let mut buf = Vec::new();
                c.write_tls(&mut buf).unwrap();
                deliver!(s, &buf);
                client_flights.push(buf);
                moved = true;
            }
            while s.wants_write() {
                let mut buf = Vec::new();
                s.write_tls(&mut buf).unwrap();
                deliver!(c, &buf);
                server_bytes.extend_from_slice(&buf);
                moved = true;
            }
            if !moved {
                break;
            }
        }
        assert!(!c.is_handshaking() && !s.is_handshaking());
        Handshake {
            client_flights,
            server_bytes,
            kind: c.handshake_kind().unwrap(),
        }
    }

    fn found(buf: &[u8]) -> ClientHelloInfo {
        match parse_client_hello(buf, MAX) {
            HelloParse::Found(info) => info,
            other => panic!("expected Found, got {other:?}"),
        }
    }

    /// Split a single-record hello into `n` records of its handshake message.
    fn reframe(hello: &[u8], n: usize) -> Vec<u8> {
        let info = found(hello);
        let message = &hello[RECORD_HEADER_LEN..info.consumed];
        let step = message.len().div_ceil(n);
        let mut out = Vec::new();
        for part in message.chunks(step) {
            out.extend_from_slice(&[0x16, 0x03, 0x01]);
            out.extend_from_slice(&(part.len() as u16).to_be_bytes());
            out.extend_from_slice(part);
        }
        out
    }

    /// The hello parses the same whole, at every prefix (NeedMore) and re-framed.
    fn check_hello(hello: &[u8]) -> ClientHelloInfo {
        let info = found(hello);
        let hello = &hello[..info.consumed];
        for cut in 0..hello.len() {
            assert_eq!(
                parse_client_hello(&hello[..cut], MAX),
                HelloParse::NeedMore,
                "prefix {cut}"
            );
        }
        for n in [2, 3, 7] {
            let framed = reframe(hello, n);
            for cut in 0..framed.len() {
                assert_eq!(
                    parse_client_hello(&framed[..cut], MAX),
                    HelloParse::NeedMore
                );
            }
            let again = found(&framed);
            assert_eq!(again.consumed, framed.len());
            assert_eq!(
                ClientHelloInfo {
                    consumed: info.consumed,
                    ..again
                },
                info
            );
        }
        // Exactly as big as the limit is fine; one byte less is TooLarge.
        assert!(matches!(
            parse_client_hello(hello, hello.len()),
            HelloParse::Found(_)
        ));
        assert_eq!(
            parse_client_hello(hello, hello.len() - 1),
            HelloParse::Invalid(HelloError::TooLarge)
        );
        // The manual extension walk agrees with tls-parser on real hellos.
        let message = &hello[RECORD_HEADER_LEN..];
        let (_, parsed) = parse_tls_message_handshake(message).unwrap();
        let TlsMessage::Handshake(TlsMessageHandshake::ClientHello(ch)) = parsed else {
            panic!("not a ClientHello");
        };
        let ext = ch.ext.unwrap_or(&[]);
        let a = read_extensions(ext, Side::Client).unwrap();
        let b = walk_extensions(ext, Side::Client).unwrap();
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
        info
    }

    /// Watch a server stream in one chunk, byte by byte and in random chunks; all agree.
    fn watch(server: &[u8]) -> ServerHandshake {
        let mut whole = ServerWatcher::new(LIMIT);
        whole.feed(server);
        assert!(
            whole.is_done(),
            "the watcher should finish on a whole flight"
        );
        let mut bytes = ServerWatcher::new(LIMIT);
        for b in server {
            bytes.feed(std::slice::from_ref(b));
        }
        assert_eq!(bytes.info(), whole.info());
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for _ in 0..20 {
            let mut w = ServerWatcher::new(LIMIT);
            let mut rest = server;
            while !rest.is_empty() {
                let n = 1 + rng.below(700).min(rest.len() - 1);
                let (chunk, tail) = rest.split_at(n);
                let was_done = w.is_done();
                let done = w.feed(chunk);
                assert!(!was_done || done);
                rest = tail;
            }
            assert_eq!(w.info(), whole.info());
        }
        // The byte limit: never more buffered than allowed, done when reached.
        for limit in [1, 5, 60, 200] {
            let mut w = ServerWatcher::new(limit);
            for chunk in server.chunks(33) {
                w.feed(chunk);
                assert!(w.record.len() + w.handshake.len() <= limit);
            }
            assert!(w.is_done());
        }
        whole.info().clone()
    }

    #[test]
    fn hello_retry_magic_is_sha256_of_its_name() {
        use sha2::Digest;
        assert_eq!(
            sha2::Sha256::digest(b"HelloRetryRequest").as_slice(),
            &HELLO_RETRY_RANDOM
        );
    }

    #[test]
    fn rustls_tls13_full_then_resumed() {
        let pki = pki();
        let client = client_config(&pki, &[&rustls::version::TLS13]);
        let server = server_config(&pki, &[&rustls::version::TLS13], true, provider());

        let first = handshake(&client, &server);
        let hello = check_hello(&first.client_flights[0]);
        assert_eq!(hello.sni.as_deref(), Some(HOST));
        assert_eq!(*hello.supported_versions, [version::TLS13]);
        assert!(hello.psk_identities.is_empty());
        let seen = watch(&first.server_bytes);
        assert_eq!(first.kind, HandshakeKind::Full);
        assert_eq!(seen.version, Some(version::TLS13));
        assert_eq!(seen.resumed, Some(false));
        assert_eq!(seen.psk_selected, None);
        assert!(!seen.hello_retry && !seen.alert);

        let second = handshake(&client, &server);
        let hello = check_hello(&second.client_flights[0]);
        assert_eq!(hello.psk_identities.len(), 1);
        assert!(!hello.psk_identities[0].is_empty());
        let seen = watch(&second.server_bytes);
        assert_eq!(second.kind, HandshakeKind::Resumed);
        assert_eq!(seen.resumed, Some(true));
        assert_eq!(seen.psk_selected, Some(0));
        assert_eq!(seen.version, Some(version::TLS13));
    }

    #[test]
    fn rustls_tls12_session_id_full_then_resumed() {
        let pki = pki();
        let client = client_config(&pki, &[&rustls::version::TLS12]);
        let server = server_config(&pki, &[&rustls::version::TLS12], false, provider());

        let first = handshake(&client, &server);
        let hello = check_hello(&first.client_flights[0]);
        assert_eq!(hello.sni.as_deref(), Some(HOST));
        assert!(!hello.supported_versions.contains(&version::TLS13));
        let seen = watch(&first.server_bytes);
        assert_eq!(first.kind, HandshakeKind::Full);
        assert_eq!(seen.version, Some(version::TLS12));
        assert_eq!(seen.resumed, Some(false));
        assert!(!seen.session_id.is_empty());
        assert_eq!(seen.new_ticket, None);

        let second = handshake(&client, &server);
        let hello = check_hello(&second.client_flights[0]);
        assert_eq!(
            hello.session_id, seen.session_id,
            "the client offers the server's ID"
        );
        let again = watch(&second.server_bytes);
        assert_eq!(second.kind, HandshakeKind::Resumed);
        assert_eq!(again.resumed, Some(true));
        assert_eq!(again.session_id, hello.session_id);
    }

    #[test]
    fn rustls_tls12_ticket_issued_then_resumed() {
        let pki = pki();
        let client = client_config(&pki, &[&rustls::version::TLS12]);
        let server = server_config(&pki, &[&rustls::version::TLS12], true, provider());

        let first = handshake(&client, &server);
        let hello = check_hello(&first.client_flights[0]);
        assert_eq!(hello.ticket, None);
        let seen = watch(&first.server_bytes);
        assert_eq!(first.kind, HandshakeKind::Full);
        assert_eq!(seen.resumed, Some(false));
        let ticket = seen
            .new_ticket
            .clone()
            .expect("a NewSessionTicket before the CCS");

        let second = handshake(&client, &server);
        let hello = check_hello(&second.client_flights[0]);
        assert_eq!(
            hello.ticket.as_ref(),
            Some(&ticket),
            "the client offers the ticket"
        );
        let again = watch(&second.server_bytes);
        assert_eq!(second.kind, HandshakeKind::Resumed);
        assert_eq!(again.resumed, Some(true));
        assert_eq!(again.version, Some(version::TLS12));
    }

    #[test]
    fn rustls_hello_retry_request() {
        let pki = pki();
        let client = client_config(&pki, &[&rustls::version::TLS13]);
        // The client sends an X25519 share first; a server that only takes P-384 retries.
        let mut only_p384 = provider();
        only_p384.kx_groups = vec![rustls::crypto::ring::kx_group::SECP384R1];
        let server = server_config(&pki, &[&rustls::version::TLS13], false, only_p384);

        let hs = handshake(&client, &server);
        assert_eq!(hs.kind, HandshakeKind::FullWithHelloRetryRequest);
        check_hello(&hs.client_flights[0]);
        let seen = watch(&hs.server_bytes);
        assert!(seen.hello_retry);
        assert_eq!(seen.version, Some(version::TLS13));
        assert_eq!(seen.resumed, Some(false));
        // The second hello (after a CCS in compat mode) is found too.
        let retry = hs.client_flights[1..].concat();
        let start = retry.iter().position(|&b| b == CONTENT_HANDSHAKE).unwrap();
        assert_eq!(found(&retry[start..]).sni.as_deref(), Some(HOST));
    }

    // ---- captured hellos from real clients (tests/fixtures/hellos, see its README) ----

    fn fixture(name: &str) -> Vec<u8> {
        let path = format!(
            "{}/tests/fixtures/hellos/{name}.bin",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    #[rstest::rstest]
    #[case::openssl3_tls13("openssl3_tls13", true)]
    #[case::openssl3_tls12("openssl3_tls12", false)]
    #[case::openssl3_tls13_psk("openssl3_tls13_psk", true)]
    #[case::openssl3_tls12_ticket("openssl3_tls12_ticket", false)]
    #[case::curl7_openssl3("curl7_openssl3", true)]
    #[case::curl7_openssl3_tls12("curl7_openssl3_tls12", false)]
    #[case::java17("java17", true)]
    #[case::java17_tls12("java17_tls12", false)]
    fn captured_hellos_parse(#[case] name: &str, #[case] tls13: bool) {
        let bytes = fixture(name);
        let info = check_hello(&bytes);
        assert_eq!(info.consumed, bytes.len());
        assert_eq!(info.sni.as_deref(), Some(HOST));
        assert_eq!(
            info.supported_versions.contains(&version::TLS13),
            tls13,
            "{info:?}"
        );
    }

    #[test]
    fn captured_resumption_offers() {
        let psk = check_hello(&fixture("openssl3_tls13_psk"));
        assert_eq!(psk.psk_identities.len(), 1);
        // OpenSSL tickets start with the 16-byte key name (DESIGN.md "TLS 1.3 note").
        assert!(psk.psk_identities[0].len() > 16);
        let ticket = check_hello(&fixture("openssl3_tls12_ticket"));
        assert!(ticket.ticket.as_ref().is_some_and(|t| t.len() > 16));
        assert!(ticket.psk_identities.is_empty());
        let fresh = check_hello(&fixture("openssl3_tls12"));
        assert!(fresh.ticket.is_none());
    }

    #[test]
    fn captured_gnutls_and_curl_details() {
        let gnutls = check_hello(&fixture("wget_gnutls_localhost"));
        assert_eq!(gnutls.sni.as_deref(), Some("localhost"));
        assert_eq!(
            gnutls.supported_versions[..2],
            [version::TLS13, version::TLS12]
        );
        check_hello(&fixture("curl7_openssl3"));
    }

    /// A hello and the server's bytes recorded through a relay to `openssl s_server`.
    fn flight(name: &str) -> (ClientHelloInfo, ServerHandshake) {
        let dir = format!(
            "{}/tests/fixtures/server_flights",
            env!("CARGO_MANIFEST_DIR")
        );
        let hello = std::fs::read(format!("{dir}/{name}.hello.bin")).unwrap();
        let server = std::fs::read(format!("{dir}/{name}.server.bin")).unwrap();
        let hello = check_hello(&hello);
        let seen = watch(&server);
        (hello, seen)
    }

    #[test]
    fn openssl_server_tls12_ticket_full_then_resumed() {
        let (_, full) = flight("openssl3_tls12_full");
        assert_eq!(full.version, Some(version::TLS12));
        assert_eq!(full.resumed, Some(false));
        let ticket = full
            .new_ticket
            .expect("OpenSSL issues a ticket in a full handshake");
        let (hello, resumed) = flight("openssl3_tls12_resumed");
        assert_eq!(hello.ticket.as_ref(), Some(&ticket));
        assert_eq!(resumed.resumed, Some(true));
        assert_eq!(
            resumed.session_id, hello.session_id,
            "the server echoes the ID to resume"
        );
        // OpenSSL 3 puts its 16-byte key name in front of every ticket.
        if let Some(new) = resumed.new_ticket {
            assert_eq!(new[..16], ticket[..16]);
        }
    }

    #[test]
    fn openssl_server_tls13_full_then_resumed() {
        let (_, full) = flight("openssl3_tls13_full");
        assert_eq!(full.version, Some(version::TLS13));
        assert_eq!(full.resumed, Some(false));
        let (hello, resumed) = flight("openssl3_tls13_resumed");
        assert_eq!(hello.psk_identities.len(), 1);
        assert_eq!(resumed.psk_selected, Some(0));
        assert_eq!(resumed.resumed, Some(true));
    }

    // ---- synthetic hellos and garbage --------------------------------------------------

    #[test]
    fn not_tls_is_refused_early() {
        for text in [
            &b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"[..],
            b"SSH-2.0-OpenSSH_9.2p1\r\n",
            b"\x00\x01",
        ] {
            assert_eq!(
                parse_client_hello(&text[..1], MAX),
                HelloParse::Invalid(HelloError::NotTls)
            );
            assert_eq!(
                parse_client_hello(text, MAX),
                HelloParse::Invalid(HelloError::NotTls)
            );
        }
        assert_eq!(parse_client_hello(b"", MAX), HelloParse::NeedMore);
        assert_eq!(parse_client_hello(b"\x16", MAX), HelloParse::NeedMore);
        assert_eq!(
            parse_client_hello(b"\x16\x02", MAX),
            HelloParse::Invalid(HelloError::NotTls)
        );
        // An SSLv2-compatible hello (0x80 ...) is not supported.
        assert_eq!(
            parse_client_hello(b"\x80\x2e\x01", MAX),
            HelloParse::Invalid(HelloError::NotTls)
        );
    }

    #[test]
    fn bad_framing_is_malformed_or_too_large() {
        let malformed = HelloParse::Invalid(HelloError::Malformed);
        // Not a ClientHello first (a ServerHello type).
        assert_eq!(
            parse_client_hello(b"\x16\x03\x01\x00\x04\x02\x00\x00\x00", MAX),
            malformed
        );
        // Empty record; record over the RFC limit.
        assert_eq!(parse_client_hello(b"\x16\x03\x01\x00\x00", MAX), malformed);
        assert_eq!(parse_client_hello(b"\x16\x03\x01\x48\x01", MAX), malformed);
        // A 16 MB handshake claim is refused from its 9 header bytes.
        let huge = b"\x16\x03\x01\x00\x04\x01\xff\xff\xff";
        assert_eq!(
            parse_client_hello(huge, MAX),
            HelloParse::Invalid(HelloError::TooLarge)
        );
        // A record bigger than max.
        assert_eq!(
            parse_client_hello(b"\x16\x03\x01\x40\x00", 1024),
            HelloParse::Invalid(HelloError::TooLarge)
        );
        // A handshake message spanning records interrupted by an alert record.
        let msg = b"\x16\x03\x01\x00\x02\x01\x00\x15\x03\x03\x00\x02\x02\x28";
        assert_eq!(parse_client_hello(msg, MAX), malformed);
        // A complete but empty ClientHello body.
        assert_eq!(
            parse_client_hello(b"\x16\x03\x01\x00\x04\x01\x00\x00\x00", MAX),
            malformed
        );
    }

    /// A minimal hand-built ClientHello with the given extensions block.
    fn synthetic_hello(extensions: &[u8]) -> Vec<u8> {
        let mut body = vec![0x03, 0x03];
        body.extend_from_slice(&[7; 32]);
        body.extend_from_slice(&[0, 0, 2, 0x13, 0x01, 1, 0]);
        body.extend_from_slice(&(extensions.len() as u16).to_be_bytes());
        body.extend_from_slice(extensions);
        let mut msg = vec![HS_CLIENT_HELLO, 0];
        msg.extend_from_slice(&(body.len() as u16).to_be_bytes());
        msg.extend_from_slice(&body);
        let mut rec = vec![0x16, 0x03, 0x01];
        rec.extend_from_slice(&(msg.len() as u16).to_be_bytes());
        rec.extend_from_slice(&msg);
        rec
    }

    fn sni_ext(name: &[u8]) -> Vec<u8> {
        let mut e = vec![0, 0];
        e.extend_from_slice(&((name.len() + 5) as u16).to_be_bytes());
        e.extend_from_slice(&((name.len() + 3) as u16).to_be_bytes());
        e.push(0);
        e.extend_from_slice(&(name.len() as u16).to_be_bytes());
        e.extend_from_slice(name);
        e
    }

    #[test]
    fn sni_is_normalized_and_bad_names_are_malformed() {
        let info = found(&synthetic_hello(&sni_ext(b"Puppet.Example.COM.")));
        assert_eq!(info.sni.as_deref(), Some(HOST));
        assert_eq!(found(&synthetic_hello(&[])).sni, None);
        let malformed = HelloParse::Invalid(HelloError::Malformed);
        assert_eq!(
            parse_client_hello(&synthetic_hello(&sni_ext(b"\xff\xfe")), MAX),
            malformed
        );
        assert_eq!(
            parse_client_hello(&synthetic_hello(&sni_ext(b".")), MAX),
            malformed
        );
    }

    #[test]
    fn early_data_is_seen_by_both_extension_readers() {
        let mut ext = sni_ext(HOST.as_bytes());
        ext.extend_from_slice(&[0, 42, 0, 0]);
        assert!(found(&synthetic_hello(&ext)).early_data);
        // Behind an extension tls-parser refuses, the manual walk finds it too.
        let mut odd = vec![0, 49, 0, 1, 0];
        odd.extend_from_slice(&ext);
        assert!(found(&synthetic_hello(&odd)).early_data);
        assert!(!found(&synthetic_hello(&sni_ext(HOST.as_bytes()))).early_data);
        assert!(!check_hello(&fixture("openssl3_tls13_psk")).early_data);
    }

    #[test]
    fn extension_tls_parser_rejects_falls_back_to_manual_walk() {
        // post_handshake_auth (49) must be empty; tls-parser stops at a non-empty one.
        let mut ext = vec![0, 49, 0, 1, 0];
        ext.extend_from_slice(&sni_ext(HOST.as_bytes()));
        ext.extend_from_slice(&[0, 35, 0, 3, 1, 2, 3]);
        let info = found(&synthetic_hello(&ext));
        assert_eq!(info.sni.as_deref(), Some(HOST));
        assert_eq!(info.ticket, Some(vec![1, 2, 3]));
        // A broken extension list is malformed.
        let broken = synthetic_hello(&[0, 0, 0, 9, 0]);
        assert_eq!(
            parse_client_hello(&broken, MAX),
            HelloParse::Invalid(HelloError::Malformed)
        );
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        for i in 0..4000 {
            let len = rng.below(if i % 2 == 0 { 64 } else { 2048 });
            let mut buf: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            if buf.len() >= 5 {
                buf[0] = 0x16;
                buf[1] = 0x03;
                // Mostly plausible record lengths so the parser gets past the header.
                let rec = (buf.len() - 5) as u16;
                buf[3..5].copy_from_slice(&rec.to_be_bytes());
                if buf.len() >= 6 && i % 3 != 0 {
                    buf[5] = HS_CLIENT_HELLO;
                }
            }
            let _ = parse_client_hello(&buf, MAX);
            let mut w = ServerWatcher::new(LIMIT);
            w.feed(&buf);
        }
    }

    #[test]
    fn mutated_real_handshakes_never_panic() {
        let pki = pki();
        let client = client_config(&pki, &[&rustls::version::TLS12]);
        let server = server_config(&pki, &[&rustls::version::TLS12], true, provider());
        let hs = handshake(&client, &server);
        let hello = hs.client_flights[0].clone();
        let mut rng = Rng(42);
        for _ in 0..3000 {
            let mut h = hello.clone();
            let mut s = hs.server_bytes.clone();
            for _ in 0..1 + rng.below(4) {
                let i = rng.below(h.len());
                h[i] = rng.next() as u8;
                let j = rng.below(s.len().min(2000));
                s[j] = rng.next() as u8;
            }
            h.truncate(rng.below(h.len() + 1));
            let _ = parse_client_hello(&h, MAX);
            let mut w = ServerWatcher::new(LIMIT);
            for chunk in s.chunks(1 + rng.below(300)) {
                w.feed(chunk);
            }
        }
    }

    #[test]
    fn watcher_alert_and_non_tls() {
        let mut w = ServerWatcher::new(LIMIT);
        assert!(w.feed(b"\x15\x03\x03\x00\x02\x02\x28"));
        assert!(w.info().alert);
        assert!(w.feed(b"\x16\x03\x03"), "done stays done");
        let mut w = ServerWatcher::new(LIMIT);
        assert!(w.feed(b"HTTP/1.1 400 Bad Request\r\n"));
        assert_eq!(w.info(), &ServerHandshake::default());
        let mut w = ServerWatcher::new(LIMIT);
        assert!(!w.feed(b"\x16\x03"));
        assert!(!w.is_done());
    }
}
