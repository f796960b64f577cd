//! The TLS clients of the checks (and of the ticket-key learner): rustls configured
//! for a modern ClientHello, with or without certificate verification.
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

use super::error::CheckError;
use crate::config::HttpsCheck;

pub(super) fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

pub(super) fn versions() -> &'static [&'static rustls::SupportedProtocolVersion] {
    static BOTH: [&rustls::SupportedProtocolVersion; 2] =
        [&rustls::version::TLS13, &rustls::version::TLS12];
    &BOTH
}

/// The tls-hello check's client: any certificate passes (the handshake is never
/// finished; we only need rustls to write a modern ClientHello).
pub(super) fn accept_any_config() -> Result<Arc<ClientConfig>, CheckError> {
    let p = provider();
    let cfg = ClientConfig::builder_with_provider(p.clone())
        .with_protocol_versions(versions())
        .map_err(|e| CheckError::Setup(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAnyCert(p)))
        .with_no_client_auth();
    Ok(Arc::new(cfg))
}

/// The https check's client, built at every check so renewed certificate files are
/// picked up: verifies against `ca_file` when set (else accepts any certificate),
/// presents `client_cert`/`client_key` when set.
pub(super) fn https_config(h: &HttpsCheck) -> Result<Arc<ClientConfig>, CheckError> {
    client_tls(h.ca_file.as_deref(), h.client_cert.as_ref())
}

/// An HTTPS client as the `https` check's (load feedback polls with it too): verifies
/// against `ca_file` when given (else accepts any certificate, still checking
/// handshake signatures), presents the client certificate and key when given,
/// offers HTTP/1.1. Reads the files now: build it per connection so renewed files
/// are picked up.
pub(crate) fn client_tls(
    ca_file: Option<&std::path::Path>,
    client_cert: Option<&(std::path::PathBuf, std::path::PathBuf)>,
) -> Result<Arc<ClientConfig>, CheckError> {
    let p = provider();
    let builder = ClientConfig::builder_with_provider(p.clone())
        .with_protocol_versions(versions())
        .map_err(|e| CheckError::Setup(e.to_string()))?;
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
                .map_err(|e| CheckError::Setup(format!("client certificate: {e}")))?
        }
        None => builder.with_no_client_auth(),
    };
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

pub(super) fn roots(path: &std::path::Path) -> Result<RootCertStore, CheckError> {
    let mut roots = RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| setup_err("ca_file", path, e))?;
    let (added, _ignored) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(CheckError::Setup(format!(
            "ca_file {}: no usable certificate",
            path.display()
        )));
    }
    Ok(roots)
}

pub(super) fn setup_err(
    key: &str,
    path: &std::path::Path,
    e: impl std::fmt::Display,
) -> CheckError {
    CheckError::Setup(format!("{key} {}: {e}", path.display()))
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
