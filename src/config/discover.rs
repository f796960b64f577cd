//! `discover:`: a service's backends found in DNS, an SRV name or a host name's
//! A/AAAA records, re-resolved on the records' TTL (see `crate::discovery`).
use std::net::SocketAddr;
use std::time::Duration;

use super::address::{parse_socket_addr, valid_hostname};
use super::checker::{join, Checker};
use super::health::Health;
use super::raw::{RawDiscover, RawProxyProtocol};
use super::HealthConfig;

/// Default shortest re-resolution interval: a TTL of 0 must not become a query loop.
pub const DEFAULT_MIN_TTL: Duration = Duration::from_secs(5);
/// Default longest re-resolution interval: a day-long TTL must not hide a change for a day.
pub const DEFAULT_MAX_TTL: Duration = Duration::from_secs(300);
/// Default cap on the backends one answer may create (each gets a health-check task).
pub const DEFAULT_MAX_BACKENDS: u64 = 64;
/// Hard cap on `max_backends`: a pool is scanned per connection.
const MAX_MAX_BACKENDS: u64 = 1024;
/// Default time one query may take (per resolver, per attempt).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

/// What to look up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiscoverQuery {
    /// SRV records: priority -> primaries (the lowest) and backups, weight ->
    /// weight, target:port -> address.
    Srv(String),
    /// A host name whose every A/AAAA record becomes a backend on `port`.
    Host {
        /// The name.
        name: String,
        /// The port every address is dialled on.
        port: u16,
    },
}

impl DiscoverQuery {
    /// The name looked up (for logs, metrics and the status page).
    pub fn name(&self) -> &str {
        match self {
            DiscoverQuery::Srv(n) | DiscoverQuery::Host { name: n, .. } => n,
        }
    }

    /// `srv` or `host`.
    pub fn kind(&self) -> &'static str {
        match self {
            DiscoverQuery::Srv(_) => "srv",
            DiscoverQuery::Host { .. } => "host",
        }
    }
}

/// A service's `discover:` settings.
#[derive(Debug, Clone, PartialEq)]
pub struct DiscoverConfig {
    /// What to look up.
    pub query: DiscoverQuery,
    /// Resolvers to ask (`ip:port`); empty: those of `/etc/resolv.conf`.
    pub resolvers: Vec<SocketAddr>,
    /// Shortest time between two resolutions, whatever the TTL (default 5s).
    pub min_ttl: Duration,
    /// Longest time between two resolutions, whatever the TTL (default 5m).
    pub max_ttl: Duration,
    /// Most backends one answer may create (default 64); the rest are ignored.
    pub max_backends: usize,
    /// Time one query may take (default 2s).
    pub timeout: Duration,
    /// The health settings every discovered backend uses: the service's, with
    /// `discover.backend.health` over them.
    pub health: HealthConfig,
    /// The other options every discovered backend gets (`discover.backend`).
    pub backend: DiscoveredBackend,
}

/// `discover.backend`: what every backend an answer gives is configured with, as a
/// backend in the file would be (HAProxy's `server-template` options). Its weight,
/// tier and address come from the record.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DiscoveredBackend {
    /// Concurrent connections each takes; more wait in the service queue.
    pub max_connections: Option<u32>,
    /// PROXY protocol header sent before the client's bytes.
    pub proxy_protocol: Option<super::ProxyProtocol>,
    /// The local address connections to it are made from (over the service's).
    pub source: Option<std::net::IpAddr>,
}

/// The typed PROXY version.
pub(super) fn proxy_protocol(v: RawProxyProtocol) -> super::ProxyProtocol {
    match v {
        RawProxyProtocol::V1 => super::ProxyProtocol::V1,
        RawProxyProtocol::V2 => super::ProxyProtocol::V2,
    }
}

impl Checker<'_> {
    /// Validate `discover:` at YAML path `p`.
    pub(super) fn discover(
        &mut self,
        raw: &RawDiscover,
        health: &Health,
        p: &str,
    ) -> Option<DiscoverConfig> {
        let query = self.discover_query(raw, p);
        let mut resolvers = Vec::new();
        for (i, r) in raw.resolvers.iter().flatten().enumerate() {
            match parse_socket_addr(r) {
                Ok(a) => resolvers.push(a),
                Err(why) => self.err(
                    &format!("{}[{i}]", join(p, "resolvers")),
                    format!("`{r}` is not a resolver address (ip:port, e.g. 10.0.0.2:53): {why}"),
                ),
            }
        }
        let min_ttl = self.duration(
            raw.min_ttl.as_ref(),
            &join(p, "min_ttl"),
            DEFAULT_MIN_TTL,
            true,
        );
        let max_ttl = self.duration(
            raw.max_ttl.as_ref(),
            &join(p, "max_ttl"),
            DEFAULT_MAX_TTL,
            true,
        );
        if max_ttl < min_ttl {
            self.err(&join(p, "max_ttl"), "must not be shorter than `min_ttl`");
        }
        let max_backends = self.int(
            raw.max_backends,
            &join(p, "max_backends"),
            DEFAULT_MAX_BACKENDS,
            1,
            MAX_MAX_BACKENDS,
        ) as usize;
        let timeout = self.duration(
            raw.timeout.as_ref(),
            &join(p, "timeout"),
            DEFAULT_TIMEOUT,
            true,
        );
        let bp = join(p, "backend");
        let template = raw.backend.as_ref();
        let health = self.health(
            health,
            template.and_then(|t| t.health.as_ref()),
            &join(&bp, "health"),
        );
        let backend = DiscoveredBackend {
            max_connections: template.and_then(|t| t.max_connections).map(|m| {
                self.int(
                    Some(m),
                    &join(&bp, "max_connections"),
                    1,
                    1,
                    u32::MAX.into(),
                ) as u32
            }),
            proxy_protocol: template.and_then(|t| t.proxy_protocol).map(proxy_protocol),
            source: template
                .and_then(|t| t.source.as_deref())
                .and_then(|a| self.source_addr(a, &join(&bp, "source"))),
        };
        Some(DiscoverConfig {
            query: query?,
            resolvers,
            min_ttl,
            max_ttl,
            max_backends,
            timeout,
            health: health.to_config(),
            backend,
        })
    }

    fn discover_query(&mut self, raw: &RawDiscover, p: &str) -> Option<DiscoverQuery> {
        let name = |n: &str| n.strip_suffix('.').unwrap_or(n).to_ascii_lowercase();
        match (&raw.srv, &raw.host) {
            (Some(_), Some(_)) | (None, None) => {
                self.err(
                    p,
                    "give either `srv: _x-puppet._tcp.example.com` or `host:` with `port:`",
                );
                None
            }
            (Some(srv), None) => {
                if raw.port.is_some() {
                    self.err(
                        &join(p, "port"),
                        "an SRV record carries its own port: remove `port`",
                    );
                }
                let n = name(srv);
                if !valid_hostname(&n) {
                    self.err(&join(p, "srv"), format!("`{srv}` is not a DNS name"));
                    return None;
                }
                Some(DiscoverQuery::Srv(n))
            }
            (None, Some(host)) => {
                let n = name(host);
                if !valid_hostname(&n) {
                    self.err(&join(p, "host"), format!("`{host}` is not a DNS name"));
                }
                let Some(port) = raw.port else {
                    self.err(
                        p,
                        "`host:` needs `port:`, the port every address is dialled on",
                    );
                    return None;
                };
                let port = self.int(Some(port), &join(p, "port"), 0, 1, 65535) as u16;
                (valid_hostname(&n) && port != 0).then_some(DiscoverQuery::Host { name: n, port })
            }
        }
    }
}
