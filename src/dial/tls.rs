//! The TLS clients crossbar dials backends with (the health checks, the load-feedback
//! polls, the ticket-key learner, the doctor): rustls configured for a modern
//! ClientHello, with or without certificate verification, and the server name a
//! backend is asked for.
use std::net::IpAddr;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

use crate::config::{BackendConfig, CheckKind, ServiceConfig};

/// A file a TLS client needs (CA, client certificate or key) can't be used, or
/// rustls refused the settings. The text is the one the https check has always
/// logged (the feedback poll quotes it whole).
#[derive(Debug, thiserror::Error)]
#[error("check setup: {0}")]
pub struct SetupError(pub String);

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn versions() -> &'static [&'static rustls::SupportedProtocolVersion] {
    static BOTH: [&rustls::SupportedProtocolVersion; 2] =
        [&rustls::version::TLS13, &rustls::version::TLS12];
    &BOTH
}

/// The tls-hello check's client: any certificate passes (the handshake is never
/// finished; we only need rustls to write a modern ClientHello).
pub(crate) fn accept_any_config() -> Result<Arc<ClientConfig>, SetupError> {
    let p = provider();
    let cfg = ClientConfig::builder_with_provider(p.clone())
        .with_protocol_versions(versions())
        .map_err(|e| SetupError(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAnyCert(p)))
        .with_no_client_auth();
    Ok(Arc::new(cfg))
}

/// An HTTPS client as the `https` check's (load feedback polls with it too): verifies
/// against `ca_file` when given (else accepts any certificate, still checking
/// handshake signatures), presents the client certificate and key when given,
/// offers HTTP/1.1. Reads the files now: build it per connection so renewed files
/// are picked up.
pub(crate) fn client_tls(
    ca_file: Option<&std::path::Path>,
    client_cert: Option<&(std::path::PathBuf, std::path::PathBuf)>,
) -> Result<Arc<ClientConfig>, SetupError> {
    let p = provider();
    let builder = ClientConfig::builder_with_provider(p.clone())
        .with_protocol_versions(versions())
        .map_err(|e| SetupError(e.to_string()))?;
    let builder = match ca_file {
        Some(path) => builder.with_root_certificates(roots(path)?),
        None => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAnyCert(p))),
    };
    let mut cfg = match client_cert {
        Some((cert, key)) => {
            let chain = CertificateDer::pem_file_iter(cert)
                .and_then(|it| it.collect::<Result<Vec<_>, _>>())
                .map_err(|e| setup_err("client_cert", cert, e))?;
            let key =
                PrivateKeyDer::from_pem_file(key).map_err(|e| setup_err("client_key", key, e))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| SetupError(format!("client certificate: {e}")))?
        }
        None => builder.with_no_client_auth(),
    };
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

fn roots(path: &std::path::Path) -> Result<RootCertStore, SetupError> {
    let mut roots = RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| setup_err("ca_file", path, e))?;
    let (added, _ignored) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(SetupError(format!(
            "ca_file {}: no usable certificate",
            path.display()
        )));
    }
    Ok(roots)
}

fn setup_err(key: &str, path: &std::path::Path, e: impl std::fmt::Display) -> SetupError {
    SetupError(format!("{key} {}: {e}", path.display()))
}

/// Where the server name of a backend's checks comes from (the doctor names it when
/// a certificate does not match).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NameSource {
    /// The https check's `health.server_name`.
    HealthServerName,
    /// The service's first exact `server_names` entry.
    ServerNames,
    /// The backend address's host name.
    BackendHost,
    /// The backend address's IP (no SNI is sent; the certificate is verified
    /// against the IP).
    BackendIp,
}

/// The server name a backend's checks (and the ticket-key probe) send and verify:
/// the https check's `server_name`, else the service's first exact `server_names`
/// entry, else the backend host when it is a name, else its IP (then no SNI is
/// sent). `names` is not used: those are what agents dial, which the doctor checks
/// separately. `crossbar doctor` calls this too, so it probes what `run` will.
pub fn server_name_for(
    svc: &ServiceConfig,
    b: &BackendConfig,
) -> (ServerName<'static>, NameSource) {
    let explicit = match &b.health.check {
        CheckKind::Https(h) => h.server_name.clone(),
        _ => None,
    };
    let from_service = svc
        .server_names
        .iter()
        .find(|n| !n.starts_with('*'))
        .cloned();
    let host = &b.address.host;
    let candidates = [
        (explicit, NameSource::HealthServerName),
        (from_service, NameSource::ServerNames),
        (Some(host.clone()), NameSource::BackendHost),
    ];
    for (name, source) in candidates {
        let Some(name) = name else { continue };
        if name.parse::<IpAddr>().is_ok() {
            continue;
        }
        if let Ok(sn) = ServerName::try_from(name) {
            return (sn, source);
        }
    }
    let ip = match host.parse::<IpAddr>() {
        Ok(ip) => ip,
        // A host that is neither a valid DNS name nor an IP: validation rejects it.
        Err(_) => IpAddr::from([0, 0, 0, 0]),
    };
    (ServerName::IpAddress(ip.into()), NameSource::BackendIp)
}

/// Accepts any server certificate, but still checks handshake signatures against the
/// certificate presented (so the peer holds its key).
/// Shared with the ticket-key probe ([`crate::ticket_keys`]), which only collects tickets.
#[derive(Debug)]
pub(crate) struct AcceptAnyCert(pub(crate) Arc<CryptoProvider>);

impl ServerCertVerifier for AcceptAnyCert {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
