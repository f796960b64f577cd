//! One backend's health check run once, exactly as the health checker runs it (same
//! target, server name, PROXY header, CA and client certificate), with a failure
//! explained in words: what `crossbar doctor` reports and what a reload tries before
//! it commits new health settings ([`super::gate`]).
use std::time::{Duration, Instant};

use super::cert::CertInfo;
use super::explain::{self, dialed_names};
use super::{checks, run_check, server_name_for, target, CheckError};
use crate::config::{BackendConfig, CheckKind, ServiceConfig};

/// One run of a backend's configured check.
#[derive(Debug, Clone)]
pub struct Predicted {
    /// It passed.
    pub passed: bool,
    /// Why it failed, in words that name the certificate, the issuer and the fix.
    pub reason: Option<String>,
    /// How long it took.
    pub took: Duration,
    /// The subject of the certificate the backend presented, when one was seen.
    pub subject: Option<String>,
}

/// Run the check of backend `b` of `svc` once within `timeout` and explain a failure.
/// `chain` is what the caller saw of the backend's certificates already (the doctor's
/// own handshakes); when it is empty and the check failed in the TLS handshake, one
/// more handshake that accepts any certificate (also within `timeout`) fetches the
/// chain, so the explanation can name the certificate and its issuer.
pub async fn predict(
    svc: &ServiceConfig,
    b: &BackendConfig,
    timeout: Duration,
    chain: &[CertInfo],
) -> Predicted {
    let target = target(svc, b);
    let started = Instant::now();
    let result = run_check(&b.health.check, &target, timeout).await;
    let took = started.elapsed();
    let fetched;
    let chain = match &result {
        Err(e) if chain.is_empty() && e.tls_error().is_some() => {
            fetched = tokio::time::timeout(timeout, presented_chain(&target, timeout))
                .await
                .unwrap_or_default();
            &fetched[..]
        }
        _ => chain,
    };
    let https = match &b.health.check {
        CheckKind::Https(h) => Some(h),
        _ => None,
    };
    let dialed = dialed_names(svc);
    let cx = explain::Context {
        https,
        name: &target.server_name,
        source: server_name_for(svc, b).1,
        chain,
        dialed: &dialed,
    };
    Predicted {
        passed: result.is_ok(),
        reason: result.err().map(|e| explain::check_failure(&e, &cx)),
        took,
        subject: chain.first().map(|c| c.subject.clone()),
    }
}

/// The chain a backend presents (leaf first), from a handshake that accepts any
/// certificate; empty when there is no handshake. The caller bounds the whole.
async fn presented_chain(target: &super::Target, connect: Duration) -> Vec<CertInfo> {
    let Ok(config) = crate::dial::tls::accept_any_config() else {
        return Vec::new();
    };
    let handshake = async {
        let tcp = checks::connect(target, connect).await?;
        tokio_rustls::TlsConnector::from(config)
            .connect(target.server_name.clone(), tcp)
            .await
            .map_err(CheckError::Tls)
    };
    let Ok(tls) = handshake.await else {
        return Vec::new();
    };
    CertInfo::presented(&tls)
}
