//! `crossbar doctor` against real rustls backends on loopback: certificates from
//! rcgen CAs with and without the dialed names, from different issuers, near expiry
//! and expired; Puppet CA certificates served (or not); TLS 1.2-only and TLS 1.3
//! peers; a status page that is not `running`; a PROXY-protocol backend. Each
//! finding must appear with its severity, and the exit code must follow.
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use crossbar::config::Config;
use crossbar::doctor::{self, Report, Severity, TicketKey};
use http_body_util::Full;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::{ServerConfig, SupportedProtocolVersion};
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

const NAME: &str = "puppet.example.com";
const DAY: time::Duration = time::Duration::days(1);
static BOTH: [&SupportedProtocolVersion; 2] = [&rustls::version::TLS13, &rustls::version::TLS12];
static TLS12: [&SupportedProtocolVersion; 1] = [&rustls::version::TLS12];
/// Bytes of a PROXY v2 LOCAL header (12-byte signature, version/command, family, length 0).
const PROXY_V2_LOCAL_LEN: usize = 16;
const PROXY_V2_SIG: &[u8; 12] = b"\r\n\r\n\0\r\nQUIT\n";

/// A CA made with rcgen.
struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl Ca {
    fn new(name: &str) -> Ca {
        Ca::valid_for(name, None)
    }

    /// A CA valid until `days` from now (`None`: rcgen's default, far away).
    fn valid_for(name: &str, days: Option<i64>) -> Ca {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        if let Some(days) = days {
            let now = time::OffsetDateTime::now_utc();
            p.not_before = now - DAY * 30;
            p.not_after = now + DAY * (days as i32) + time::Duration::hours(1);
        }
        p.distinguished_name.push(DnType::CommonName, name);
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().unwrap();
        let cert = p.self_signed(&key).unwrap();
        Ca { cert, key }
    }

    /// A leaf for `sans`, valid from yesterday until `days` from now (negative: expired).
    fn leaf(&self, cn: &str, sans: &[&str], days: i64) -> Identity {
        let mut p =
            CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
        p.distinguished_name.push(DnType::CommonName, cn);
        let now = time::OffsetDateTime::now_utc();
        p.not_before = now - DAY * 30;
        p.not_after = now + DAY * (days as i32) + time::Duration::hours(1);
        let key = KeyPair::generate().unwrap();
        let cert = p.signed_by(&key, &self.cert, &self.key).unwrap();
        Identity {
            chain: vec![cert.der().clone()],
            key: PrivatePkcs8KeyDer::from(key.serialize_der()),
        }
    }
}

struct Identity {
    chain: Vec<CertificateDer<'static>>,
    key: PrivatePkcs8KeyDer<'static>,
}

/// How a test peer behaves.
struct Spec {
    identity: Identity,
    versions: &'static [&'static SupportedProtocolVersion],
    tickets: bool,
    status_body: &'static str,
    /// Served at /puppet-ca/v1/certificate/ca (PEM) when set.
    ca_pem: Option<String>,
    /// Expect a PROXY v2 LOCAL header before the TLS handshake.
    proxy_v2: bool,
}

impl Spec {
    fn new(identity: Identity) -> Spec {
        Spec {
            identity,
            versions: &BOTH,
            tickets: true,
            status_body: "running",
            ca_pem: None,
            proxy_v2: false,
        }
    }
}

/// A running TLS peer answering Puppet's status and CA endpoints.
struct Peer {
    addr: SocketAddr,
    stop: CancellationToken,
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn peer(spec: Spec) -> Peer {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(spec.versions)
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(spec.identity.chain, PrivateKeyDer::Pkcs8(spec.identity.key))
        .unwrap();
    if spec.tickets {
        cfg.ticketer = rustls::crypto::ring::Ticketer::new().unwrap();
    }
    let acceptor = TlsAcceptor::from(Arc::new(cfg));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    let (status, ca_pem, proxy) = (spec.status_body, spec.ca_pem, spec.proxy_v2);
    let token = stop.clone();
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                r = listener.accept() => r,
                () = token.cancelled() => return,
            };
            let Ok((mut tcp, _)) = accepted else { continue };
            let (acceptor, ca_pem) = (acceptor.clone(), ca_pem.clone());
            tokio::spawn(async move {
                if proxy {
                    let mut h = [0u8; PROXY_V2_LOCAL_LEN];
                    if tcp.read_exact(&mut h).await.is_err() || &h[..12] != PROXY_V2_SIG {
                        return;
                    }
                }
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let svc = hyper::service::service_fn(move |req: hyper::Request<_>| {
                    let ca_pem = ca_pem.clone();
                    async move {
                        let path = req.uri().path();
                        let (code, body) = if path.starts_with("/status/v1/simple") {
                            (200, status.to_string())
                        } else if path == "/puppet-ca/v1/certificate/ca" {
                            ca_pem.map_or((404, "not found".into()), |p| (200, p))
                        } else {
                            (404, "not found".into())
                        };
                        let resp = hyper::Response::builder()
                            .status(code)
                            .body(Full::new(Bytes::from(body)))
                            .unwrap_or_default();
                        Ok::<_, Infallible>(resp)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    Peer { addr, stop }
}

/// A config with one service `svc_yaml` (indented service keys) and backends.
fn config(service: &str, svc_yaml: &str, backends: &[(&str, SocketAddr, &str)]) -> Config {
    let mut y = format!(
        "admin: {{ enabled: false }}\nservices:\n  {service}:\n    listen: [\"127.0.0.1:0\"]\n{svc_yaml}    backends:\n"
    );
    for (name, addr, extra) in backends {
        y.push_str(&format!(
            "      - {{ name: {name}, address: \"{addr}\"{extra} }}\n"
        ));
    }
    Config::from_str_at(&y, std::path::Path::new("doctor-test.yaml"))
        .unwrap_or_else(|e| panic!("{e}\n{y}"))
}

async fn doctor_run(cfg: &Config, status: bool) -> Report {
    let r = doctor::run(
        cfg,
        doctor::Options { status, wide: true },
        &Default::default(),
    )
    .await;
    eprintln!("{}", r.table());
    r
}

fn messages(r: &Report, sev: Severity) -> Vec<String> {
    r.findings
        .iter()
        .filter(|f| f.severity == sev)
        .map(|f| format!("{}: {}", f.backend.as_deref().unwrap_or("-"), f.message))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_pool_is_clean_and_reports_chain_tls_and_stickiness() {
    let ca = Ca::new("Puppet CA: ca1");
    let a = peer(Spec::new(ca.leaf("c1", &[NAME, "c1.example.com"], 400))).await;
    let mut tls12 = Spec::new(ca.leaf("c2", &[NAME], 400));
    tls12.versions = &TLS12;
    tls12.tickets = false;
    let b = peer(tls12).await;
    let cfg = config(
        "puppet",
        "    names: [\"puppet.example.com\"]\n    balance: leastconn\n    stick: { on: [session_id, ticket, psk, source] }\n    health: { check: https, path: /status/v1/simple/server }\n",
        &[("c1", a.addr, ""), ("c2", b.addr, "")],
    );
    let r = doctor_run(&cfg, false).await;
    assert_eq!(r.exit_code, 0, "{:?}", r.findings);
    assert_eq!((r.errors, r.warnings), (0, 0));
    let c1 = &r.backends[0].inspection;
    assert_eq!(c1.tls_versions, ["1.3", "1.2"]);
    assert_eq!(c1.chain[0].subject, "CN=c1");
    assert_eq!(c1.chain[0].issuer, "CN=Puppet CA: ca1");
    assert!(c1.chain[0].sans.contains(&format!("DNS:{NAME}")));
    assert!(
        (399..=400).contains(&c1.chain[0].days_left),
        "{}",
        c1.chain[0].days_left
    );
    assert!(
        matches!(c1.ticket_key, TicketKey::Found { length: 16 }),
        "{:?}",
        c1.ticket_key
    );
    let status = c1
        .status
        .as_ref()
        .expect("https check configured: status asked");
    assert!(status.ok && status.answer == "running" && status.path == "/status/v1/simple/server");
    let c2 = &r.backends[1].inspection;
    assert_eq!(c2.tls_versions, ["1.2"]);
    assert_eq!(c2.session_id_resumption, Some(true));
    assert!(matches!(c2.ticket_key, TicketKey::NotProbed { .. }));
    let table = r.table();
    assert!(table.contains("ticket key name 16B"), "{table}");
    assert!(table.contains("session IDs resumed"), "{table}");
    let json: serde_json::Value = serde_json::from_str(&r.json()).unwrap();
    assert_eq!(json["exit_code"], 0);
    assert_eq!(json["backends"][0]["chain"][0]["subject"], "CN=c1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_dialed_name_is_an_error_naming_it_and_the_fix() {
    let ca = Ca::new("Puppet CA: ca1");
    let good = peer(Spec::new(ca.leaf(
        "c1",
        &[NAME, "puppetfiles.example.com"],
        400,
    )))
    .await;
    let bad = peer(Spec::new(ca.leaf("c3", &["c3.example.com"], 400))).await;
    let cfg = config(
        "puppet",
        "    server_names: [\"puppet.example.com\", \"*.example.com\"]\n    names: [\"puppetfiles.example.com\"]\n",
        &[("c1", good.addr, ""), ("c3", bad.addr, "")],
    );
    let r = doctor_run(&cfg, false).await;
    assert_eq!(r.exit_code, 2);
    let errors = messages(&r, Severity::Error);
    assert_eq!(errors.len(), 2, "{errors:?}");
    for name in [NAME, "puppetfiles.example.com"] {
        assert!(
            errors.iter().any(|e| e.starts_with("c3: ")
                && e.contains(&format!(
                    "`{name}` is not in the certificate's subject alternative names"
                ))
                && e.contains("DNS:c3.example.com")
                && e.contains("dns_alt_names")),
            "{errors:?}"
        );
    }
    assert!(
        r.table()
            .contains("ERROR    puppet/c3: `puppet.example.com`"),
        "{}",
        r.table()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn different_issuers_warn_and_expiry_warns_then_errors() {
    let (ca1, ca2) = (Ca::new("Puppet CA: one"), Ca::new("Puppet CA: two"));
    let a = peer(Spec::new(ca1.leaf("a", &[NAME], 400))).await;
    let b = peer(Spec::new(ca2.leaf("b", &[NAME], 400))).await;
    let names = "    names: [\"puppet.example.com\"]\n";
    let r = doctor_run(
        &config("puppet", names, &[("a", a.addr, ""), ("b", b.addr, "")]),
        false,
    )
    .await;
    assert_eq!(r.exit_code, 1, "{:?}", r.findings);
    let warnings = messages(&r, Severity::Warning);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("different CAs")
            && warnings[0].contains("a: CN=Puppet CA: one")
            && warnings[0].contains("b: CN=Puppet CA: two"),
        "{warnings:?}"
    );

    let soon = peer(Spec::new(ca1.leaf("soon", &[NAME], 10))).await;
    let r = doctor_run(&config("puppet", names, &[("soon", soon.addr, "")]), false).await;
    assert_eq!(r.exit_code, 1);
    let warnings = messages(&r, Severity::Warning);
    assert!(
        warnings.len() == 1 && warnings[0].contains("CN=soon expires in 10 days"),
        "{warnings:?}"
    );

    let old = peer(Spec::new(ca1.leaf("old", &[NAME], -2))).await;
    let r = doctor_run(&config("puppet", names, &[("old", old.addr, "")]), false).await;
    assert_eq!(r.exit_code, 2);
    let errors = messages(&r, Severity::Error);
    assert!(
        errors.len() == 1 && errors[0].contains("CN=old expired on"),
        "{errors:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ca_service_primary_and_standby_must_serve_the_same_ca() {
    let ca = Ca::new("Puppet CA: ca1");
    let other = Ca::new("Puppet CA: ca1"); // same name, a new key: an empty cadir's new CA
    let spec = |ca_pem: String| {
        let mut s = Spec::new(ca.leaf("ca", &["puppetca.example.com"], 400));
        s.ca_pem = Some(ca_pem);
        s
    };
    let svc = "    names: [\"puppetca.example.com\"]\n    balance: first\n";
    let ca1 = peer(spec(ca.cert.pem())).await;
    let ca2 = peer(spec(ca.cert.pem())).await;
    let backends = |b: SocketAddr| [("ca1", ca1.addr, ""), ("ca2", b, ", backup: true")];
    let r = doctor_run(&config("puppetca", svc, &backends(ca2.addr)), false).await;
    assert_eq!(r.exit_code, 0, "{:?}", r.findings);
    let info = messages(&r, Severity::Info);
    assert!(
        info.iter()
            .any(|m| m.contains("ca1 and ca2 serve the same CA certificate (CN=Puppet CA: ca1")),
        "{info:?}"
    );

    let stale = peer(spec(other.cert.pem())).await;
    let r = doctor_run(&config("puppetca", svc, &backends(stale.addr)), false).await;
    assert_eq!(r.exit_code, 2);
    let errors = messages(&r, Severity::Error);
    assert!(
        errors.len() == 1 && errors[0].contains("different Puppet CA certificates"),
        "{errors:?}"
    );

    let mut not_ca = Spec::new(ca.leaf("ca", &["puppetca.example.com"], 400));
    not_ca.ca_pem = None;
    let not_ca = peer(not_ca).await;
    let r = doctor_run(&config("puppetca", svc, &backends(not_ca.addr)), false).await;
    assert_eq!(r.exit_code, 1);
    let warnings = messages(&r, Severity::Warning);
    assert!(
        warnings.len() == 1 && warnings[0].contains("ca2 serve no CA certificate"),
        "{warnings:?}"
    );

    // Neither serves one: a warning too, not silence.
    let only_tls = [
        ("ca1", not_ca.addr, ""),
        ("ca2", not_ca.addr, ", backup: true"),
    ];
    let r = doctor_run(&config("puppetca", svc, &only_tls), false).await;
    assert_eq!(r.exit_code, 1, "{:?}", r.findings);
    let warnings = messages(&r, Severity::Warning);
    assert!(
        warnings.len() == 1 && warnings[0].contains("no backend serves a Puppet CA certificate"),
        "{warnings:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_unreachable_and_proxy_protocol_backends() {
    let ca = Ca::new("Puppet CA: ca1");
    let mut starting = Spec::new(ca.leaf("s", &[NAME], 400));
    starting.status_body = "starting";
    let starting = peer(starting).await;
    let mut proxied = Spec::new(ca.leaf("p", &[NAME], 400));
    proxied.proxy_v2 = true;
    let proxied = peer(proxied).await;
    let refused = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let names = "    names: [\"puppet.example.com\"]\n";
    let backends = [
        ("s", starting.addr, ""),
        ("p", proxied.addr, ", proxy_protocol: v2"),
        ("gone", refused, ""),
    ];
    // Without --status and without an https check, no status is asked.
    let r = doctor_run(&config("puppet", names, &backends), false).await;
    assert!(r.backends[0].inspection.status.is_none());
    let r = doctor_run(&config("puppet", names, &backends), true).await;
    assert_eq!(r.exit_code, 1, "{:?}", r.findings);
    let warnings = messages(&r, Severity::Warning);
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(
        warnings
            .iter()
            .any(|w| w.starts_with("s: status /status/v1/simple: ") && w.contains("\"starting\"")),
        "{warnings:?}"
    );
    assert!(
        warnings.iter().any(|w| w.starts_with("gone: unreachable")),
        "{warnings:?}"
    );
    let p = &r.backends[1].inspection;
    assert_eq!(
        p.tls_versions,
        ["1.3", "1.2"],
        "PROXY LOCAL sent before each handshake"
    );
    assert!(p.status.as_ref().is_some_and(|s| s.ok));
    assert!(matches!(p.ticket_key, TicketKey::Found { .. }));

    // The only backend of a service: there is no other to send agents to; the
    // service's finding says every client is refused.
    let r = doctor_run(&config("puppet", names, &[("gone", refused, "")]), false).await;
    let errors = messages(&r, Severity::Error);
    assert!(
        errors.len() == 1 && errors[0].contains("refuse every client"),
        "{errors:?}"
    );
    let warnings = messages(&r, Severity::Warning);
    assert_eq!(
        warnings,
        ["gone: unreachable (Connection refused (os error 111)): nothing else was checked"]
    );
    assert!(
        r.findings
            .iter()
            .all(|f| !f.message.contains("other backends")),
        "{:?}",
        r.findings
    );
}

/// The binary: exit codes, the table and `--format json`, and a bad config.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_exits_with_the_verdict() {
    let ca = Ca::new("Puppet CA: ca1");
    let good = peer(Spec::new(ca.leaf("c1", &[NAME], 400))).await;
    let bad = peer(Spec::new(ca.leaf("c3", &["c3.example.com"], 400))).await;
    let dir = tempfile::tempdir().unwrap();
    let write = |file: &str, addr: SocketAddr| {
        let path = dir.path().join(file);
        let y = format!(
            "admin: {{ enabled: false }}\nservices:\n  puppet:\n    listen: [\"127.0.0.1:0\"]\n    names: [\"{NAME}\"]\n    backends:\n      - {{ name: c, address: \"{addr}\" }}\n"
        );
        std::fs::write(&path, y).unwrap();
        path
    };
    let run = |path: &std::path::Path, json: bool| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_crossbar"));
        cmd.arg("doctor").arg("-c").arg(path);
        if json {
            cmd.args(["--format", "json"]);
        }
        let out = tokio::task::block_in_place(|| cmd.output().unwrap());
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, out, err) = run(&write("good.yaml", good.addr), false);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.starts_with("SERVICE") && out.contains("0 error(s), 0 warning(s): exit 0"),
        "{out}"
    );
    let (code, out, _) = run(&write("bad.yaml", bad.addr), true);
    assert_eq!(code, Some(2), "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["exit_code"], 2);
    assert_eq!(v["findings"][0]["severity"], "error");
    assert_eq!(v["findings"][0]["backend"], "c");
    let broken = dir.path().join("broken.yaml");
    std::fs::write(
        &broken,
        "services:\n  p:\n    listen: []\n    nmes: [x]\n    backends: []\n",
    )
    .unwrap();
    let (code, _, err) = run(&broken, false);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("broken.yaml:"), "{err}");
}

/// A backend that speaks no TLS: an error for a `tls` service, only information
/// for a `mode: tcp` one (which passes any protocol).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_without_tls_is_an_error_only_in_tls_mode() {
    let plain = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = plain.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = plain.accept().await {
            use tokio::io::AsyncWriteExt;
            // ok: the doctor may have closed already
            let _ = s.write_all(b"SSH-2.0-OpenSSH_9.2\r\n").await;
        }
    });
    let r = doctor_run(&config("svc", "", &[("plain", addr, "")]), false).await;
    assert_eq!(r.exit_code, 2);
    let errors = messages(&r, Severity::Error);
    assert!(
        errors.len() == 1 && errors[0].starts_with("plain: no TLS handshake: TLS 1.3: "),
        "{errors:?}"
    );
    let r = doctor_run(
        &config("svc", "    mode: tcp\n", &[("plain", addr, "")]),
        false,
    )
    .await;
    assert_eq!(r.exit_code, 0, "{:?}", r.findings);
    assert!(messages(&r, Severity::Info)
        .iter()
        .any(|m| m.starts_with("plain: no TLS handshake")));
}

/// Exit 2 with exactly one error, which contains every `want`; the error.
fn the_one_error(r: &Report, want: &[&str]) -> String {
    assert_eq!(r.exit_code, 2, "{:?}", r.findings);
    let errors = messages(r, Severity::Error);
    assert_eq!(errors.len(), 1, "{errors:?}");
    for w in want {
        assert!(errors[0].contains(w), "{w:?} missing from {}", errors[0]);
    }
    errors[0].clone()
}

/// A PEM file in `dir` holding `pem`.
fn pem_file(dir: &tempfile::TempDir, name: &str, pem: &str) -> std::path::PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, pem).unwrap();
    path
}

/// Three backends given by IP address, certificates carrying only the name agents
/// dial (`names`), and an https check verifying against the right CA without
/// `health.server_name`: `run`'s checker verifies against the IP and takes every
/// backend down, so the doctor must say so, as an error, with the setting to change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ip_backends_checked_without_server_name_are_an_error_naming_the_fix() {
    let ca = Ca::new("Puppet CA: ca1");
    let dir = tempfile::tempdir().unwrap();
    let ca_file = pem_file(&dir, "ca.pem", &ca.cert.pem());
    let mut peers = Vec::new();
    for n in ["c1", "c2", "c3"] {
        peers.push(peer(Spec::new(ca.leaf(n, &[NAME], 400))).await);
    }
    let backends: Vec<(&str, SocketAddr, &str)> = ["c1", "c2", "c3"]
        .into_iter()
        .zip(&peers)
        .map(|(n, p)| (n, p.addr, ""))
        .collect();
    let health = |extra: &str| {
        format!(
            "    names: [\"{NAME}\"]\n    health: {{ check: https, ca_file: \"{}\"{extra} }}\n",
            ca_file.display()
        )
    };
    let r = doctor_run(&config("puppet", &health(""), &backends), false).await;
    the_one_error(
        &r,
        &[
            "no backend of puppet will pass its health check",
            "against `127.0.0.1`",
            "the backend's IP address",
            &format!("DNS:{NAME}"),
            &format!("set `health.server_name: {NAME}`"),
        ],
    );
    assert!(r.backends.iter().all(|b| !b.inspection.check.passed));
    assert_eq!(r.backends[0].inspection.server_name, "127.0.0.1");
    // The fix the message names makes the same backends pass.
    let fixed = health(&format!(", server_name: {NAME}"));
    let r = doctor_run(&config("puppet", &fixed, &backends), false).await;
    assert_eq!(r.exit_code, 0, "{:?}", r.findings);
    assert!(r.backends.iter().all(|b| b.inspection.check.passed));
}

/// `health.ca_file` holding another CA: every check fails with UnknownIssuer. The
/// doctor says it once, as an error, naming the certificate, its issuer, what the
/// file holds and the fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_ca_file_is_an_error_naming_issuer_and_file() {
    let (ca, other) = (Ca::new("Puppet CA: ca1"), Ca::new("Some Other CA"));
    let dir = tempfile::tempdir().unwrap();
    let wrong = pem_file(&dir, "wrong-ca.pem", &other.cert.pem());
    let a = peer(Spec::new(ca.leaf("c1", &[NAME], 400))).await;
    let b = peer(Spec::new(ca.leaf("c2", &[NAME], 400))).await;
    let svc = format!(
        "    names: [\"{NAME}\"]\n    health: {{ check: https, server_name: {NAME}, ca_file: \"{}\" }}\n",
        wrong.display()
    );
    let r = doctor_run(
        &config("puppet", &svc, &[("c1", a.addr, ""), ("c2", b.addr, "")]),
        false,
    )
    .await;
    let e = the_one_error(
        &r,
        &[
            "no backend of puppet will pass its health check",
            "the certificate CN=c1 is issued by CN=Puppet CA: ca1",
            &format!("not in `health.ca_file` ({})", wrong.display()),
            "it holds CN=Some Other CA",
            "Fix: point `health.ca_file` at the certificate of CN=Puppet CA: ca1",
        ],
    );
    assert!(
        !e.contains("UnknownIssuer") && messages(&r, Severity::Warning).is_empty(),
        "{:?}",
        r.findings
    );
}

/// A backend whose certificate is an `openssl req -x509` self-signed certificate
/// (CA:TRUE by default) with `ca_file` pointing at it: TLS clients refuse a CA
/// certificate as a server's own. The doctor explains that and the openssl fix,
/// and the fixed certificate (CA:FALSE) passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_openssl_req_x509_certificate_is_explained() {
    let dir = tempfile::tempdir().unwrap();
    let make = |name: &str, extra: &[&str]| {
        let (crt, key) = (
            dir.path().join(format!("{name}.crt")),
            dir.path().join(format!("{name}.key")),
        );
        let mut cmd = std::process::Command::new("openssl");
        cmd.args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            // Well past doctor's 30-day expiry warning: at 30 days the warning came
            // whenever the check ran in a later second than `openssl req` (whole
            // days are counted down from the second), failing the leaf's exit 0.
            "-days",
            "365",
        ])
        .args([
            "-subj",
            &format!("/CN={NAME}"),
            "-addext",
            &format!("subjectAltName=DNS:{NAME}"),
        ])
        .args(extra)
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&crt);
        let out = cmd.output().expect("the openssl CLI");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&crt)
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let key = PrivatePkcs8KeyDer::from_pem_file(&key).unwrap();
        (crt, Identity { chain, key })
    };
    for (name, extra, passes) in [
        ("default", &[][..], false),
        (
            "leaf",
            &["-addext", "basicConstraints=critical,CA:FALSE"][..],
            true,
        ),
    ] {
        let (crt, identity) = make(name, extra);
        let p = peer(Spec::new(identity)).await;
        let svc = format!(
            "    names: [\"{NAME}\"]\n    health: {{ check: https, server_name: {NAME}, ca_file: \"{}\" }}\n",
            crt.display()
        );
        let r = doctor_run(&config("puppet", &svc, &[("c1", p.addr, "")]), false).await;
        if passes {
            assert_eq!(r.exit_code, 0, "{:?}", r.findings);
            continue;
        }
        assert_eq!(r.exit_code, 2, "{:?}", r.findings);
        let errors = messages(&r, Severity::Error);
        let e = errors.join("\n");
        for want in [
            &format!("the certificate CN={NAME} is a CA certificate"),
            "`openssl req -x509`",
            "basicConstraints=critical,CA:FALSE",
        ] {
            assert!(e.contains(want), "{want:?} missing from {e}");
        }
        assert!(!e.contains("OtherError"), "{e}");
    }
}

/// The default table fits 120 columns; `--wide` has the long columns; the relay
/// line does not repeat itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_table_fits_120_columns() {
    let ca = Ca::new("Puppet CA: a rather long name for a certificate authority");
    let long = "compile-master-with-a-long-name.puppet.example.com";
    let a = peer(Spec::new(ca.leaf(
        long,
        &[NAME, long, "c1.example.com"],
        400,
    )))
    .await;
    let cfg = config(
        "puppet",
        "    names: [\"puppet.example.com\"]\n    stick: { on: [session_id, ticket] }\n",
        &[("compile1", a.addr, "")],
    );
    let mut r = doctor::run(&cfg, doctor::Options::default(), &Default::default()).await;
    let table = r.table();
    eprintln!("{table}");
    assert!(table.lines().all(|l| l.chars().count() <= 120), "{table}");
    // A DNS name is never cut short: the certificate's CN and the address whole.
    assert!(table.contains(long) && !table.contains('…'), "{table}");
    assert!(table.contains(&a.addr.to_string()), "{table}");
    assert!(table.contains("tcp: ok"), "{table}");
    assert!(
        table.contains("puppet: splice-auto (the default)"),
        "{table}"
    );
    assert!(!table.contains("(relay: splice-auto"), "{table}");
    r.wide = true;
    let wide = r.table();
    assert!(
        wide.contains("c1.example.com") && wide.contains("ticket key name"),
        "{wide}"
    );
}
/// The doctor says which relay each service uses and why: `auto` chooses
/// splice-auto, and a retired `relay: kernel` is splice-auto too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_are_splice_auto_whatever_relay_says() {
    let plain = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = plain.local_addr().unwrap();
    tokio::spawn(async move {
        // Accepted and dropped: a `mode: tcp` service passes any protocol.
        while let Ok((s, _)) = plain.accept().await {
            drop(s);
        }
    });
    for (relay, relay_says) in [
        ("auto", "svc: splice-auto (relay: auto chooses splice-auto:"),
        ("kernel", "svc: splice-auto (the default)"),
    ] {
        let svc = format!("    mode: tcp\n    relay: {relay}\n");
        let r = doctor_run(&config("svc", &svc, &[("plain", addr, "")]), false).await;
        let relays: Vec<(&str, &str)> = r
            .relays
            .iter()
            .map(|r| (r.service.as_str(), r.plan.relay))
            .collect();
        assert_eq!(relays, [("svc", "splice-auto")]);
        let table = r.table();
        assert!(table.contains(relay_says), "{table}");
        assert!(r.json().contains("\"relay\": \"splice-auto\""));
    }
}

/// The commonest Puppet mistake, a compiler whose certificate lacks the name agents
/// dial (the VIP's): one error with the one right fix (`dns_alt_names`), its failed
/// check said as the same cause, and no finding anywhere suggesting
/// `health.server_name` (which would make the check pass while agents fail). The CA
/// certificate every backend serves in its chain, near expiry, is said once for
/// the service, not once per backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_right_fix_per_finding_and_repeated_findings_said_once() {
    let ca = Ca::valid_for("Puppet CA: soon", Some(12));
    let with_ca = |mut id: Identity| {
        id.chain.push(ca.cert.der().clone());
        id
    };
    let mut peers = Vec::new();
    for (n, sans) in [
        ("c1", vec![NAME, "c1.example.com"]),
        ("c2", vec![NAME, "c2.example.com"]),
        ("c4", vec!["c4.example.com"]),
    ] {
        peers.push(peer(Spec::new(with_ca(ca.leaf(n, &sans, 400)))).await);
    }
    let backends: Vec<(&str, SocketAddr, &str)> = ["c1", "c2", "c4"]
        .into_iter()
        .zip(&peers)
        .map(|(n, p)| (n, p.addr, ""))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let ca_file = pem_file(&dir, "ca.pem", &ca.cert.pem());
    let svc = format!(
        "    server_names: [\"{NAME}\"]\n    health: {{ check: https, ca_file: \"{}\" }}\n",
        ca_file.display()
    );
    let r = doctor_run(&config("puppet", &svc, &backends), false).await;
    let all: Vec<String> = r
        .findings
        .iter()
        .map(|f| format!("{}: {}", f.backend.as_deref().unwrap_or("-"), f.message))
        .collect();
    assert!(
        all.iter().all(|f| !f.contains("health.server_name")),
        "a fix that hides the broken certificate: {all:#?}"
    );
    let errors = messages(&r, Severity::Error);
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(
        errors[0].starts_with("c4: ") && errors[0].contains("dns_alt_names"),
        "{errors:#?}"
    );
    let c4: Vec<&String> = all.iter().filter(|f| f.starts_with("c4: ")).collect();
    assert!(
        c4.iter().filter(|f| f.contains("dns_alt_names")).count() <= 1,
        "the fix said once: {c4:#?}"
    );
    let expiry: Vec<&String> = all
        .iter()
        .filter(|f| f.contains("CN=Puppet CA: soon expires in"))
        .collect();
    assert_eq!(expiry.len(), 1, "said once: {all:#?}");
    assert!(
        expiry[0].starts_with("-: ") && expiry[0].contains("c1, c2, c4"),
        "{expiry:#?}"
    );
}
