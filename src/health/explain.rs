//! A failed health check in an operator's words: which certificate, which issuer,
//! which name was checked, and the setting that fixes it, instead of the TLS
//! library's `UnknownIssuer` or `Other(OtherError(CaUsedAsEndEntity))`. Used by
//! `crossbar doctor` and by a reload refusing new health settings.
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::CertificateError;

use super::cert::CertInfo;
use super::{CheckError, NameSource};
use crate::config::{HttpsCheck, ServiceConfig};

/// Where Puppet keeps the CA certificate on a master and an agent.
const PUPPET_CA_PEM: &str = "/etc/puppetlabs/puppet/ssl/certs/ca.pem";

/// What the explanation may draw on besides the error.
pub struct Context<'a> {
    /// The https check, when the check is one.
    pub https: Option<&'a HttpsCheck>,
    /// The name the check sent and verified, and where it came from.
    pub name: &'a ServerName<'static>,
    /// Where that name came from.
    pub source: NameSource,
    /// The chain the backend presented (leaf first), from the doctor's own handshake.
    pub chain: &'a [CertInfo],
    /// Names agents dial for the service (to suggest a `health.server_name`).
    pub dialed: &'a [&'a str],
}

/// `err` as a sentence naming the certificate, the issuer and the fix.
pub fn check_failure(err: &CheckError, cx: &Context<'_>) -> String {
    let Some(tls) = err.tls_error() else {
        return match err {
            CheckError::Setup(why) => format!("{err}: fix the file in `health` ({why})"),
            _ => err.to_string(),
        };
    };
    let leaf = cx.chain.first();
    let subject = leaf.map_or_else(|| "presented".to_string(), |c| c.subject.clone());
    match tls {
        rustls::Error::InvalidCertificate(ce) => match ce {
            CertificateError::UnknownIssuer => unknown_issuer(cx, leaf),
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                wrong_name(cx, leaf)
            }
            CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                let when = leaf.map_or(String::new(), |c| format!(" on {}", c.not_after));
                format!("the certificate {subject} expired{when}: renew it on the backend")
            }
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                format!(
                    "the certificate {subject} is not valid yet: check the clocks of this \
                     machine and of its CA"
                )
            }
            CertificateError::Other(o) if format!("{o:?}").contains("CaUsedAsEndEntity") => {
                format!(
                    "the certificate {subject} is a CA certificate (basicConstraints CA:TRUE, \
                     which `openssl req -x509` sets by default) used as the server's own \
                     certificate, which TLS clients refuse. Fix: give the backend a server \
                     certificate issued by a CA (on Puppet: `puppetserver ca generate \
                     --certname NAME`), or make the self-signed one with `-addext \
                     basicConstraints=critical,CA:FALSE`, and keep `health.ca_file` on its issuer"
                )
            }
            other => format!("the certificate {subject} is refused: {other:?}"),
        },
        other => format!("TLS handshake failed: {other}"),
    }
}

fn unknown_issuer(cx: &Context<'_>, leaf: Option<&CertInfo>) -> String {
    let ca_file = cx.https.and_then(|h| h.ca_file.as_ref());
    let file = ca_file.map_or("`health.ca_file`".to_string(), |p| {
        format!("`health.ca_file` ({})", p.display())
    });
    let holds = match ca_file.map(|p| ca_subjects(p)) {
        Some(s) if s.is_empty() => "no certificate it can read".to_string(),
        Some(s) => s.join(", "),
        None => "nothing".to_string(),
    };
    let Some(leaf) = leaf else {
        return format!("the certificate is not issued by a CA in {file} (it holds {holds})");
    };
    let what = if leaf.subject == leaf.issuer {
        format!("the certificate {} is self-signed", leaf.subject)
    } else {
        format!(
            "the certificate {} is issued by {}",
            leaf.subject, leaf.issuer
        )
    };
    format!(
        "{what}, which is not in {file}: it holds {holds}. Fix: point `health.ca_file` at \
         the certificate of {} (on a Puppet master: {PUPPET_CA_PEM})",
        leaf.issuer
    )
}

fn wrong_name(cx: &Context<'_>, leaf: Option<&CertInfo>) -> String {
    let checked = name_text(cx.name);
    let why = match cx.source {
        NameSource::HealthServerName => "`health.server_name`",
        NameSource::ServerNames => "the service's first `server_names` entry",
        NameSource::BackendHost => "the backend's host name",
        NameSource::BackendIp => {
            "the backend's IP address: there is no `health.server_name` and no exact \
             `server_names` entry, and `names` is not used for checks"
        }
    };
    let Some(leaf) = leaf else {
        return format!("the certificate is not valid for `{checked}` (from {why})");
    };
    let has = if leaf.sans.is_empty() {
        "no subject alternative names".to_string()
    } else {
        leaf.sans.join(", ")
    };
    format!(
        "the check verifies the certificate {} against `{checked}` (from {why}), but the \
         certificate's names are {has}. {}",
        leaf.subject,
        name_fix(cx, leaf, &checked)
    )
}

/// The one fix for a certificate not valid for the name `checked`. A name agents
/// dial (from `server_names`, or listed in `names`) missing from the certificate is
/// the certificate's fault: re-issue it with the name, never check another name
/// (that would make the check pass while agents fail). Otherwise the check uses a
/// name agents don't dial: point `health.server_name` at one the certificate
/// carries.
fn name_fix(cx: &Context<'_>, leaf: &CertInfo, checked: &str) -> String {
    let dialed = cx.source == NameSource::ServerNames || cx.dialed.contains(&checked);
    if dialed {
        return format!(
            "Fix: add `{checked}` to `dns_alt_names` in this master's puppet.conf and \
             re-issue its certificate (signed with allow-subject-alt-names)"
        );
    }
    if let Some(n) = cx.dialed.iter().find(|n| leaf.covers(n)) {
        return format!(
            "Fix: set `health.server_name: {n}` (a name agents dial that the certificate carries)"
        );
    }
    if !cx.dialed.is_empty() {
        return format!(
            "Fix: re-issue the certificate with the names agents dial ({}: \
             `dns_alt_names` in this master's puppet.conf) and set `health.server_name` \
             to one of them",
            cx.dialed.join(", ")
        );
    }
    match leaf
        .sans
        .iter()
        .find_map(|s| s.strip_prefix("DNS:"))
        .filter(|n| !n.starts_with('*'))
    {
        Some(n) => format!(
            "Fix: list the names agents dial under `names:`; if they dial `{n}`, set \
             `health.server_name: {n}`"
        ),
        None => "Fix: re-issue the certificate with the names agents dial \
                 (`dns_alt_names`), and set `health.server_name` to one of them"
            .to_string(),
    }
}

/// The names agents may dial for `svc`: exact `server_names`, then `names` (a
/// wrong-name explanation suggests one the certificate carries).
pub fn dialed_names(svc: &ServiceConfig) -> Vec<&str> {
    let mut names: Vec<&str> = svc
        .server_names
        .iter()
        .filter(|n| !n.starts_with('*'))
        .map(String::as_str)
        .collect();
    for n in &svc.names {
        if !names.contains(&n.as_str()) {
            names.push(n);
        }
    }
    names
}

/// One backend's failed check, for [`grouped`].
#[derive(Debug, Clone, Copy)]
pub struct Failure<'a> {
    /// The backend.
    pub backend: &'a str,
    /// Why its check failed (from [`check_failure`]).
    pub reason: &'a str,
    /// The subject of the certificate it presented, if one was seen.
    pub subject: Option<&'a str>,
}

/// `b1: reason (and alike: b2, b3); b4: other reason`: backends whose reasons are
/// the same words but for their own certificate's subject are said once.
pub fn grouped(failures: &[Failure<'_>]) -> String {
    // (reason with the backend's own subject blanked, first reason, backends)
    let mut groups: Vec<(String, &str, Vec<&str>)> = Vec::new();
    for f in failures {
        let key = match f.subject {
            Some(s) if !s.is_empty() => f.reason.replace(s, "\u{0}"),
            _ => f.reason.to_string(),
        };
        match groups.iter_mut().find(|g| g.0 == key) {
            Some(g) => g.2.push(f.backend),
            None => groups.push((key, f.reason, vec![f.backend])),
        }
    }
    let why: Vec<String> = groups
        .iter()
        .map(|(_, reason, names)| match names.as_slice() {
            [one] => format!("{one}: {reason}"),
            [first, rest @ ..] => format!("{first}: {reason} (and alike: {})", rest.join(", ")),
            [] => String::new(),
        })
        .collect();
    why.join("; ")
}

/// The subjects of the certificates in a PEM file (empty when it can't be read).
fn ca_subjects(path: &std::path::Path) -> Vec<String> {
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let Ok(certs) = CertificateDer::pem_file_iter(path) else {
        return Vec::new();
    };
    certs
        .map_while(Result::ok)
        .filter_map(|c| CertInfo::parse(&c, now).ok())
        .map(|c| c.subject)
        .collect()
}

/// A server name as text (the IP for an IP address).
pub fn name_text(n: &ServerName<'_>) -> String {
    match n {
        ServerName::DnsName(d) => d.as_ref().to_string(),
        ServerName::IpAddress(ip) => std::net::IpAddr::from(*ip).to_string(),
        _ => String::new(),
    }
}
