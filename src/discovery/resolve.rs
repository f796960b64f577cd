//! One DNS lookup of a `discover:` name: SRV records or a host's A/AAAA records,
//! turned into the backends they describe, with the answer's TTL.
use std::net::{IpAddr, SocketAddr};
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
    /// The resolver refused to answer (a name outside the zones it serves, or a
    /// client it does not serve).
    #[error("the resolver answered REFUSED")]
    Refused,
    /// The name exists but has no records of the type asked (or none usable).
    #[error("the answer holds no records")]
    Empty,
    /// The resolver configuration could not be read.
    #[error("resolver configuration: {0}")]
    Config(String),
    /// Every record names crossbar itself (its own listen address, the wildcard
    /// address, port 0): none may become a backend.
    #[error("every record names crossbar itself: {0}")]
    OnlyItself(String),
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
            LookupError::Refused => "refused",
            LookupError::Empty => "empty",
            LookupError::Config(_) => "config",
            LookupError::OnlyItself(_) => "itself",
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
                ResponseCode::Refused => LookupError::Refused,
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
    /// Records left out because they name crossbar itself (its own listen address,
    /// `0.0.0.0`/`::`, port 0): `name (address): why`, one each.
    pub own: Vec<String>,
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

/// Look `cfg`'s name up once, everything under one deadline ([`deadline`]);
/// records that name crossbar itself (an address of `own`, see
/// [`crate::config::own_address`]) are left out. Never an empty `Ok`: no records
/// (or none usable) is [`LookupError::Empty`].
pub async fn lookup(
    r: &TokioAsyncResolver,
    cfg: &DiscoverConfig,
    own: &[SocketAddr],
) -> Result<Answer, LookupError> {
    let now = Instant::now();
    let until = tokio::time::Instant::now() + deadline(cfg);
    let found = tokio::time::timeout_at(until, async {
        match &cfg.query {
            DiscoverQuery::Host { name, port } => {
                let ips = r.lookup_ip(format!("{name}.")).await?;
                let valid = ips.valid_until();
                let found = ips
                    .iter()
                    .map(|ip| backend(cfg, name, &ip_label(ip), ip, *port, 1, false))
                    .collect();
                Ok((found, valid))
            }
            DiscoverQuery::Srv(name) => srv(r, cfg, name, until).await,
        }
    })
    .await;
    let (backends, valid) = match found {
        Ok(r) => r?,
        Err(_) => return Err(LookupError::Timeout),
    };
    let (backends, own) = leave_out_own(cfg, unique(backends), own);
    if backends.is_empty() {
        return Err(match own.is_empty() {
            true => LookupError::Empty,
            false => LookupError::OnlyItself(own.join("; ")),
        });
    }
    let mut backends = backends;
    let dropped = backends.len().saturating_sub(cfg.max_backends);
    backends.truncate(cfg.max_backends);
    Ok(Answer {
        backends,
        dropped,
        own,
        ttl: valid.saturating_duration_since(now),
    })
}

/// `a` again without the records that name an address of `own` (the first lookup
/// of a start ran before every listener was bound).
pub(super) fn refilter(
    a: Answer,
    cfg: &DiscoverConfig,
    own: &[SocketAddr],
) -> Result<Answer, LookupError> {
    let (backends, more) = leave_out_own(cfg, a.backends, own);
    let mut all = a.own;
    all.extend(more);
    if backends.is_empty() {
        return Err(LookupError::OnlyItself(all.join("; ")));
    }
    Ok(Answer {
        backends,
        own: all,
        ..a
    })
}

/// The longest one lookup may take, all its queries together: the SRV query, then
/// its targets' address queries (all at once), each up to [`ATTEMPTS`] tries of
/// `timeout`. A target that has not answered by then is left out.
pub fn deadline(cfg: &DiscoverConfig) -> Duration {
    cfg.timeout * (2 * ATTEMPTS as u32)
}

/// One backend per name: a target listed twice (at two priorities, or twice at
/// one) is kept once, as a primary if it is one anywhere, with its largest weight;
/// then sorted by tier and name.
fn unique(mut backends: Vec<BackendConfig>) -> Vec<BackendConfig> {
    backends.sort_by(|a, b| {
        (&a.name, a.backup, std::cmp::Reverse(a.weight)).cmp(&(
            &b.name,
            b.backup,
            std::cmp::Reverse(b.weight),
        ))
    });
    backends.dedup_by(|a, b| a.name == b.name);
    backends.sort_by(|a, b| (a.backup, &a.name).cmp(&(b.backup, &b.name)));
    backends
}

/// `backends` without those that are crossbar itself, and those, in words (each
/// logged once per lookup).
fn leave_out_own(
    cfg: &DiscoverConfig,
    backends: Vec<BackendConfig>,
    own: &[SocketAddr],
) -> (Vec<BackendConfig>, Vec<String>) {
    let mut left_out = Vec::new();
    let kept = backends
        .into_iter()
        .filter(|b| {
            let Some(sa) = b.address.as_socket_addr() else {
                return true;
            };
            let Some(why) = crate::config::own_address(sa, own, crate::config::is_local_address)
            else {
                return true;
            };
            tracing::warn!(
                name = cfg.query.name(),
                backend = %b.name,
                address = %b.address,
                "DNS record names crossbar itself, left out: {why}"
            );
            left_out.push(format!("{} ({}): {why}", b.name, b.address));
            false
        })
        .collect();
    (kept, left_out)
}

/// SRV records; each target's address looked up with the same resolver, all at
/// once, until `until`. A target that does not resolve (or not in time) is left out
/// (and logged); the lowest priority are the primaries, the others backups.
async fn srv(
    r: &TokioAsyncResolver,
    cfg: &DiscoverConfig,
    name: &str,
    until: tokio::time::Instant,
) -> Result<(Vec<BackendConfig>, Instant), LookupError> {
    let srv = r.srv_lookup(format!("{name}.")).await?;
    let mut valid = srv.as_lookup().valid_until();
    let mut records: Vec<(String, u16, u16, u16)> = srv
        .iter()
        .map(|s| {
            let target = s.target().to_ascii();
            let target = target.trim_end_matches('.').to_ascii_lowercase();
            (target, s.port(), s.priority(), s.weight())
        })
        .collect();
    let Some(primary) = records.iter().map(|r| r.2).min() else {
        return Err(LookupError::Empty);
    };
    // A target:port listed twice is looked up (and counted) once: its best record.
    records.sort_by(|a, b| {
        (&a.0, a.1, a.2, std::cmp::Reverse(a.3)).cmp(&(&b.0, b.1, b.2, std::cmp::Reverse(b.3)))
    });
    records.dedup_by(|a, b| a.0 == b.0 && a.1 == b.1);
    records.sort_by(|a, b| (a.2, &a.0, a.1).cmp(&(b.2, &b.0, b.1)));
    // Only as many targets as may become backends are looked up.
    records.truncate(cfg.max_backends.saturating_add(1));
    let mut asked = tokio::task::JoinSet::new();
    for (i, (target, ..)) in records.iter().enumerate() {
        let (r, target) = (r.clone(), format!("{target}."));
        asked.spawn(async move { (i, r.lookup_ip(target).await) });
    }
    let mut addresses = vec![None; records.len()];
    loop {
        match tokio::time::timeout_at(until, asked.join_next()).await {
            Ok(Some(Ok((i, Ok(ips))))) => addresses[i] = Some(ips),
            Ok(Some(Ok((i, Err(e))))) => {
                tracing::warn!(name, target = %records[i].0, "SRV target does not resolve, left out: {e}");
            }
            Ok(Some(Err(e))) => tracing::error!(name, "an SRV target's lookup failed: {e}"),
            Ok(None) => break,
            Err(_) => {
                tracing::warn!(
                    name,
                    unanswered = asked.len(),
                    "SRV targets did not resolve in time, left out"
                );
                asked.abort_all();
                break;
            }
        }
    }
    let mut out = Vec::new();
    for ((target, port, priority, weight), ips) in records.iter().zip(addresses) {
        let Some(ips) = ips else { continue };
        valid = valid.min(ips.valid_until());
        // One backend per record: its first address, IPv4 before IPv6 (stable).
        let mut addrs: Vec<IpAddr> = ips.iter().collect();
        addrs.sort_by_key(|a| (a.is_ipv6(), *a));
        let Some(&ip) = addrs.first() else { continue };
        let weight = (*weight).clamp(1, MAX_WEIGHT);
        out.push(backend(
            cfg,
            name,
            target,
            ip,
            *port,
            weight,
            *priority != primary,
        ));
    }
    if out.is_empty() && !records.is_empty() {
        return Err(LookupError::Timeout);
    }
    Ok((out, valid))
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
        max_connections: cfg.backend.max_connections,
        proxy_protocol: cfg.backend.proxy_protocol,
        health: cfg.health.clone(),
        disabled: false,
        from_dns: Some(from.to_string()),
        left_dns: false,
        source: cfg.backend.source,
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
            (no_records(ResponseCode::Refused), "refused"),
            (ResolveError::from(ResolveErrorKind::Timeout), "timeout"),
        ];
        for (e, reason) in cases {
            assert_eq!(LookupError::from(e).reason(), reason);
        }
    }

    fn srv_backend(name: &str, backup: bool, weight: u32) -> BackendConfig {
        BackendConfig {
            name: name.into(),
            address: crate::config::BackendAddress {
                host: "127.0.0.1".into(),
                port: 8140,
            },
            weight,
            backup,
            max_connections: None,
            proxy_protocol: None,
            health: Default::default(),
            disabled: false,
            from_dns: Some("_compilers._tcp.example.com".into()),
            left_dns: false,
            source: None,
        }
    }

    /// A target listed twice, the copies not side by side in the answer (and at
    /// two priorities), is one backend: a primary, with its largest weight.
    #[test]
    fn a_target_listed_twice_is_one_backend() {
        let got = unique(vec![
            srv_backend("c1-8140", false, 1),
            srv_backend("c2-8140", false, 1),
            srv_backend("c1-8140", true, 7),
            srv_backend("c1-8140", false, 5),
            srv_backend("c3-8140", true, 1),
            srv_backend("c2-8140", false, 1),
        ]);
        let seen: Vec<(&str, bool, u32)> = got
            .iter()
            .map(|b| (b.name.as_str(), b.backup, b.weight))
            .collect();
        assert_eq!(
            seen,
            [
                ("c1-8140", false, 5),
                ("c2-8140", false, 1),
                ("c3-8140", true, 1)
            ]
        );
    }

    #[test]
    fn names_come_from_target_and_port() {
        assert_eq!(ip_label("10.0.0.21".parse().unwrap()), "10.0.0.21");
        assert_eq!(ip_label("2001:db8::1".parse().unwrap()), "2001-db8--1");
    }
}
