//! One DNS lookup of a `discover:` name: SRV records or a host's A/AAAA records,
//! turned into the backends they describe, with the answer's TTL.
use std::net::IpAddr;
use std::time::{Duration, Instant};

use hickory_resolver::config::{
    LookupIpStrategy, NameServerConfig, NameServerConfigGroup, Protocol, ResolverConfig,
    ResolverOpts,
};
use hickory_resolver::error::{ResolveError, ResolveErrorKind};
use hickory_resolver::proto::op::ResponseCode;
use hickory_resolver::TokioAsyncResolver;

use crate::config::{BackendAddress, BackendConfig, DiscoverConfig, DiscoverQuery};

/// Attempts per query and resolver (a lost UDP datagram is retried once).
const ATTEMPTS: usize = 2;
/// The largest weight a backend may have (as the config file's `weight`).
const MAX_WEIGHT: u16 = 256;

/// Why a lookup gave no usable answer: the last good set stays.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LookupError {
    /// No resolver answered in time (stopped, unreachable, or slow).
    #[error("no answer from the resolvers in time")]
    Timeout,
    /// The resolver answered SERVFAIL.
    #[error("the resolver answered SERVFAIL")]
    ServFail,
    /// The name does not exist.
    #[error("NXDOMAIN: the name does not exist")]
    NxDomain,
    /// The name exists but has no records of the type asked (or none usable).
    #[error("the answer holds no records")]
    Empty,
    /// The resolver configuration could not be read.
    #[error("resolver configuration: {0}")]
    Config(String),
    /// Anything else the resolver reported.
    #[error("{0}")]
    Other(String),
}

impl LookupError {
    /// The metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            LookupError::Timeout => "timeout",
            LookupError::ServFail => "servfail",
            LookupError::NxDomain => "nxdomain",
            LookupError::Empty => "empty",
            LookupError::Config(_) => "config",
            LookupError::Other(_) => "error",
        }
    }
}

impl From<ResolveError> for LookupError {
    fn from(e: ResolveError) -> LookupError {
        match e.kind() {
            ResolveErrorKind::Timeout => LookupError::Timeout,
            ResolveErrorKind::NoRecordsFound { response_code, .. } => match *response_code {
                ResponseCode::NXDomain => LookupError::NxDomain,
                ResponseCode::ServFail => LookupError::ServFail,
                ResponseCode::NoError => LookupError::Empty,
                other => LookupError::Other(format!("the resolver answered {other}")),
            },
            _ => {
                let text = e.to_string();
                if text.contains("ServFail") || text.contains("SERVFAIL") {
                    LookupError::ServFail
                } else if text.contains("timed out") || text.contains("ConnectionRefused") {
                    LookupError::Timeout
                } else {
                    LookupError::Other(text)
                }
            }
        }
    }
}

/// A usable answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// The backends, named from target and port, sorted by name, capped.
    pub backends: Vec<BackendConfig>,
    /// Records the cap (`max_backends`) left out.
    pub dropped: usize,
    /// The answer's shortest TTL (not yet clamped).
    pub ttl: Duration,
}

/// A resolver for `cfg`: its `resolvers`, else `/etc/resolv.conf`. No cache: each
/// lookup asks the server, so a change is seen at the next re-resolution.
pub fn resolver(cfg: &DiscoverConfig) -> Result<TokioAsyncResolver, LookupError> {
    let (config, mut opts) = if cfg.resolvers.is_empty() {
        hickory_resolver::system_conf::read_system_conf()
            .map_err(|e| LookupError::Config(format!("/etc/resolv.conf: {e}")))?
    } else {
        let mut group = NameServerConfigGroup::new();
        for &addr in &cfg.resolvers {
            // TCP too: a large answer (many SRV records) comes back truncated over UDP.
            group.push(NameServerConfig::new(addr, Protocol::Udp));
            group.push(NameServerConfig::new(addr, Protocol::Tcp));
        }
        (
            ResolverConfig::from_parts(None, vec![], group),
            ResolverOpts::default(),
        )
    };
    opts.cache_size = 0;
    opts.timeout = cfg.timeout;
    opts.attempts = ATTEMPTS;
    opts.use_hosts_file = false;
    opts.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
    Ok(TokioAsyncResolver::tokio(config, opts))
}

/// Look `cfg`'s name up once. Never an empty `Ok`: no records is [`LookupError::Empty`].
pub async fn lookup(r: &TokioAsyncResolver, cfg: &DiscoverConfig) -> Result<Answer, LookupError> {
    let now = Instant::now();
    let (mut backends, until) = match &cfg.query {
        DiscoverQuery::Host { name, port } => {
            let ips = r.lookup_ip(format!("{name}.")).await?;
            let until = ips.valid_until();
            let found = ips
                .iter()
                .map(|ip| backend(cfg, name, &ip_label(ip), ip, *port, 1, false))
                .collect();
            (found, until)
        }
        DiscoverQuery::Srv(name) => srv(r, cfg, name).await?,
    };
    backends.sort_by(|a, b| (a.backup, &a.name).cmp(&(b.backup, &b.name)));
    backends.dedup_by(|a, b| a.name == b.name);
    if backends.is_empty() {
        return Err(LookupError::Empty);
    }
    let dropped = backends.len().saturating_sub(cfg.max_backends);
    backends.truncate(cfg.max_backends);
    Ok(Answer {
        backends,
        dropped,
        ttl: until.saturating_duration_since(now),
    })
}

/// SRV records; each target's address looked up with the same resolver. A target
/// that does not resolve is left out (and logged); the lowest priority are the
/// primaries, the others backups.
async fn srv(
    r: &TokioAsyncResolver,
    cfg: &DiscoverConfig,
    name: &str,
) -> Result<(Vec<BackendConfig>, Instant), LookupError> {
    let srv = r.srv_lookup(format!("{name}.")).await?;
    let mut until = srv.as_lookup().valid_until();
    let mut records: Vec<_> = srv.iter().cloned().collect();
    records.sort_by_key(|s| (s.priority(), s.target().to_ascii(), s.port()));
    // Only as many targets as may become backends are looked up.
    records.truncate(cfg.max_backends.saturating_add(1));
    let Some(primary) = records.iter().map(|s| s.priority()).min() else {
        return Err(LookupError::Empty);
    };
    let mut out = Vec::new();
    for s in &records {
        let target = s
            .target()
            .to_ascii()
            .trim_end_matches('.')
            .to_ascii_lowercase();
        let ips = match r.lookup_ip(format!("{target}.")).await {
            Ok(ips) => ips,
            Err(e) => {
                tracing::warn!(name, target, "SRV target does not resolve, left out: {e}");
                continue;
            }
        };
        until = until.min(ips.valid_until());
        // One backend per record: its first address, IPv4 before IPv6 (stable).
        let mut addrs: Vec<IpAddr> = ips.iter().collect();
        addrs.sort_by_key(|a| (a.is_ipv6(), *a));
        let Some(&ip) = addrs.first() else { continue };
        let weight = s.weight().clamp(1, MAX_WEIGHT);
        let backup = s.priority() != primary;
        out.push(backend(cfg, name, &target, ip, s.port(), weight, backup));
    }
    Ok((out, until))
}

/// An IP as a name part: dots kept, IPv6 colons as `-` (names appear in URLs).
fn ip_label(ip: IpAddr) -> String {
    ip.to_string().replace(':', "-")
}

/// The backend one record describes. Its name, `target-port`, is what metrics,
/// stick tables, state files and other crossbar nodes know it by.
fn backend(
    cfg: &DiscoverConfig,
    from: &str,
    target: &str,
    ip: IpAddr,
    port: u16,
    weight: u16,
    backup: bool,
) -> BackendConfig {
    BackendConfig {
        name: format!("{target}-{port}"),
        address: BackendAddress {
            host: ip.to_string(),
            port,
        },
        weight: weight.into(),
        backup,
        max_connections: None,
        proxy_protocol: None,
        health: cfg.health.clone(),
        disabled: false,
        from_dns: Some(from.to_string()),
        source: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_resolver::proto::op::Query;

    fn no_records(code: ResponseCode) -> ResolveError {
        ResolveError::from(ResolveErrorKind::NoRecordsFound {
            query: Box::new(Query::new()),
            soa: None,
            negative_ttl: None,
            response_code: code,
            trusted: true,
        })
    }

    #[test]
    fn failures_are_named_by_their_cause() {
        let cases = [
            (no_records(ResponseCode::ServFail), "servfail"),
            (no_records(ResponseCode::NXDomain), "nxdomain"),
            (no_records(ResponseCode::NoError), "empty"),
            (no_records(ResponseCode::Refused), "error"),
            (ResolveError::from(ResolveErrorKind::Timeout), "timeout"),
        ];
        for (e, reason) in cases {
            assert_eq!(LookupError::from(e).reason(), reason);
        }
    }

    #[test]
    fn names_come_from_target_and_port() {
        assert_eq!(ip_label("10.0.0.21".parse().unwrap()), "10.0.0.21");
        assert_eq!(ip_label("2001:db8::1".parse().unwrap()), "2001-db8--1");
    }
}
