//! What is read from a backend's certificate (x509-parser) for `crossbar doctor`
//! and for explaining a failed check, and whether its subject alternative names
//! cover a name an agent dials.
use std::net::IpAddr;

use serde::Serialize;
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::prelude::FromDer;

/// Seconds per day, for "expires in N days".
const DAY: i64 = 24 * 60 * 60;

/// One certificate of a backend's chain, as the doctor reports it.
#[derive(Debug, Clone, Serialize)]
pub struct CertInfo {
    /// Subject distinguished name (`CN=compile1.example.com`).
    pub subject: String,
    /// Issuer distinguished name.
    pub issuer: String,
    /// Subject alternative names, `DNS:name` and `IP:address`.
    pub sans: Vec<String>,
    /// Serial number (hex).
    pub serial: String,
    /// Authority key identifier (hex), when the certificate carries one.
    pub authority_key_id: Option<String>,
    /// End of validity, `YYYY-MM-DD`.
    pub not_after: String,
    /// End of validity, Unix seconds.
    pub not_after_unix: i64,
    /// Whole days from now to the end of validity (negative: expired).
    pub days_left: i64,
}

/// A certificate the parser rejects.
#[derive(Debug, thiserror::Error)]
#[error("certificate does not parse: {0}")]
pub struct CertError(String);

impl CertInfo {
    /// Parse a DER certificate; `now` is the Unix time expiry is measured from.
    pub fn parse(der: &[u8], now: i64) -> Result<CertInfo, CertError> {
        let (_, cert) = X509Certificate::from_der(der).map_err(|e| CertError(e.to_string()))?;
        let not_after_unix = cert.validity().not_after.timestamp();
        Ok(CertInfo {
            subject: cert.subject().to_string(),
            issuer: cert.issuer().to_string(),
            sans: sans(&cert),
            serial: cert.raw_serial_as_string(),
            authority_key_id: authority_key_id(&cert),
            not_after: date(not_after_unix),
            not_after_unix,
            days_left: (not_after_unix - now).div_euclid(DAY),
        })
    }

    /// The chain a TLS server presented on `tls`, each certificate that parses, with
    /// expiry measured from now.
    pub fn presented<IO>(tls: &tokio_rustls::client::TlsStream<IO>) -> Vec<CertInfo> {
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        tls.get_ref()
            .1
            .peer_certificates()
            .unwrap_or_default()
            .iter()
            .filter_map(|c| CertInfo::parse(c, now).ok())
            .collect()
    }

    /// Whether the SANs cover `name` (a DNS name, lower case, or an IP literal):
    /// exactly, or a DNS name through a `*.` wildcard of its first label.
    pub fn covers(&self, name: &str) -> bool {
        if let Ok(ip) = name.parse::<IpAddr>() {
            return self.sans.iter().any(|s| {
                s.strip_prefix("IP:")
                    .and_then(|a| a.parse::<IpAddr>().ok())
                    .is_some_and(|a| a == ip)
            });
        }
        let name = name.to_ascii_lowercase();
        self.sans
            .iter()
            .filter_map(|s| s.strip_prefix("DNS:"))
            .map(|s| s.trim_end_matches('.').to_ascii_lowercase())
            .any(|san| san == name || wildcard_covers(&san, &name))
    }

    /// What identifies the issuing CA: its name and, when present, its key.
    pub fn issuer_id(&self) -> String {
        match &self.authority_key_id {
            Some(k) => format!("{} (key {k})", self.issuer),
            None => self.issuer.clone(),
        }
    }
}

/// `*.example.com` covers `a.example.com`, not `example.com` nor `a.b.example.com`.
fn wildcard_covers(san: &str, name: &str) -> bool {
    let Some(suffix) = san.strip_prefix("*.") else {
        return false;
    };
    name.split_once('.')
        .is_some_and(|(first, rest)| !first.is_empty() && rest == suffix)
}

fn sans(cert: &X509Certificate<'_>) -> Vec<String> {
    let Ok(Some(ext)) = cert.subject_alternative_name() else {
        return Vec::new();
    };
    ext.value
        .general_names
        .iter()
        .filter_map(|g| match g {
            GeneralName::DNSName(n) => Some(format!("DNS:{n}")),
            GeneralName::IPAddress(b) => ip(b).map(|a| format!("IP:{a}")),
            _ => None,
        })
        .collect()
}

fn ip(b: &[u8]) -> Option<IpAddr> {
    match b.len() {
        4 => <[u8; 4]>::try_from(b).ok().map(IpAddr::from),
        16 => <[u8; 16]>::try_from(b).ok().map(IpAddr::from),
        _ => None,
    }
}

fn authority_key_id(cert: &X509Certificate<'_>) -> Option<String> {
    cert.extensions()
        .iter()
        .find_map(|e| match e.parsed_extension() {
            ParsedExtension::AuthorityKeyIdentifier(aki) => {
                aki.key_identifier.as_ref().map(|k| hex(k.0))
            }
            _ => None,
        })
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// `YYYY-MM-DD` of a Unix time (UTC).
fn date(unix: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(unix)
        .map(|t| t.date().to_string())
        .unwrap_or_else(|_| format!("@{unix}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(sans: &[&str]) -> CertInfo {
        CertInfo {
            subject: "CN=x".into(),
            issuer: "CN=ca".into(),
            sans: sans.iter().map(|s| s.to_string()).collect(),
            serial: "01".into(),
            authority_key_id: None,
            not_after: "2030-01-01".into(),
            not_after_unix: 0,
            days_left: 100,
        }
    }

    #[test]
    fn names_are_covered_exactly_or_by_a_first_label_wildcard() {
        let c = info(&[
            "DNS:puppet.example.com",
            "DNS:*.files.example.com",
            "IP:10.0.0.10",
        ]);
        assert!(c.covers("puppet.example.com"));
        assert!(c.covers("PUPPET.example.com"));
        assert!(c.covers("a.files.example.com"));
        assert!(!c.covers("files.example.com"));
        assert!(!c.covers("a.b.files.example.com"));
        assert!(!c.covers("puppetca.example.com"));
        assert!(c.covers("10.0.0.10"));
        assert!(!c.covers("10.0.0.11"));
    }

    #[test]
    fn parses_an_rcgen_certificate() {
        let ca = crate::testbed::TestCa::new("Doctor CA").unwrap();
        let (chain, _) = ca.issue("c1", &["puppet.example.com", "10.1.2.3"]).unwrap();
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        let c = CertInfo::parse(&chain[0], now).unwrap();
        assert_eq!(c.subject, "CN=c1");
        assert_eq!(c.issuer, "CN=Doctor CA");
        assert_eq!(c.sans, ["DNS:puppet.example.com", "IP:10.1.2.3"]);
        assert!(c.days_left > 1000, "rcgen's default validity ends in 4096");
        assert!(CertInfo::parse(b"not a certificate", now).is_err());
    }
}
