//! The admin API's query strings: `limit=`, `key=`/`client=`, `force`, `weight=`,
//! `service=`. Every parameter must be known and given once: a typo is refused,
//! never silently ignored (on a `DELETE`, ignoring it would flush the whole table).
use std::net::IpAddr;

use super::error::ApiError;
use crate::balance::MAX_WEIGHT;

/// Entries `GET /api/tables/{service}` returns without `?limit=`.
pub const DEFAULT_TABLE_LIMIT: usize = 1000;
/// Connections `GET /api/connections` returns without `?limit=` (the oldest).
pub const DEFAULT_CONNECTIONS_LIMIT: usize = 100;
/// Largest `?limit=`: the walk keeps a heap of this size and the answer is ~150 bytes
/// an entry, so ~1.5 MB of JSON: enough to debug, small enough that an
/// unauthenticated reader can't make crossbar build tens of MB per request.
pub const MAX_TABLE_LIMIT: usize = 10_000;

/// The parameters of a query string, `k=v` or bare `k` (value ""), each known
/// (one of `allowed`) and given once: a typo is refused, not silently ignored
/// (on a DELETE, ignoring it would flush the whole table).
fn params<'q>(
    query: Option<&'q str>,
    allowed: &[&str],
) -> Result<Vec<(&'q str, &'q str)>, ApiError> {
    let mut seen: Vec<(&str, &str)> = Vec::new();
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if !allowed.contains(&k) {
            return Err(ApiError::BadQuery(format!(
                "unknown parameter {k:?} (here: {})",
                allowed.join(", ")
            )));
        }
        if seen.iter().any(|(s, _)| *s == k) {
            return Err(ApiError::BadQuery(format!("{k:?} given twice")));
        }
        seen.push((k, v));
    }
    Ok(seen)
}

/// `limit=N`: an integer in 1..=`max`.
fn limit_param(v: &str, max: usize) -> Result<usize, ApiError> {
    v.parse::<usize>()
        .ok()
        .filter(|n| (1..=max).contains(n))
        .ok_or_else(|| {
            ApiError::BadQuery(format!("limit must be an integer in 1..={max}, got {v:?}"))
        })
}

/// `client=ADDR`: an IP address (a port after it is refused: entries and
/// connections are looked up by address).
fn client_param(v: &str) -> Result<IpAddr, ApiError> {
    v.parse::<IpAddr>()
        .map(|ip| ip.to_canonical())
        .map_err(|_| ApiError::BadQuery(format!("client must be an IP address, got {v:?}")))
}

/// Which stick entries a table request is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick {
    /// The entry with this key hash (the 16 hex digits `table show` prints).
    Key(u64),
    /// The source entry a client address falls under (`source` stickiness or the
    /// resume hint); session, ticket and PSK entries keep no client address.
    Client(IpAddr),
}

/// `GET /api/tables/{service}`'s parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableQuery {
    /// Entries to return at most.
    pub limit: usize,
    /// Only these entries (else the most recently used).
    pub pick: Option<Pick>,
}

/// Parse `key=HEX` or `client=ADDR` (at most one of them).
fn pick(params: &[(&str, &str)]) -> Result<Option<Pick>, ApiError> {
    let mut pick = None;
    for (k, v) in params {
        let p = match *k {
            "key" => u64::from_str_radix(v, 16)
                .ok()
                .filter(|_| v.len() == 16 && v.bytes().all(|b| b.is_ascii_hexdigit()))
                .map(Pick::Key)
                .ok_or_else(|| {
                    ApiError::BadQuery(format!(
                        "key must be the 16 hex digits `table show` prints, got {v:?}"
                    ))
                })?,
            "client" => Pick::Client(client_param(v)?),
            _ => continue,
        };
        if pick.replace(p).is_some() {
            return Err(ApiError::BadQuery("give key or client, not both".into()));
        }
    }
    Ok(pick)
}

/// Parse `GET /api/tables/{service}`'s query: `limit=N`, and `key=HEX` or
/// `client=ADDR`; other parameters are refused.
pub fn table_query(query: Option<&str>) -> Result<TableQuery, ApiError> {
    let params = params(query, &["limit", "key", "client"])?;
    let mut limit = DEFAULT_TABLE_LIMIT;
    if let Some((_, v)) = params.iter().find(|(k, _)| *k == "limit") {
        limit = limit_param(v, MAX_TABLE_LIMIT)?;
    }
    Ok(TableQuery {
        limit,
        pick: pick(&params)?,
    })
}

/// Parse `DELETE /api/tables/{service}`'s query: nothing (flush the table), or
/// `key=HEX` or `client=ADDR` (those entries only).
pub fn delete_query(query: Option<&str>) -> Result<Option<Pick>, ApiError> {
    pick(&params(query, &["key", "client"])?)
}

/// Parse `POST /api/backends/...`'s query: nothing, or `force` (`force=true`,
/// `force=1`; `force=false` and `force=0` are the default).
pub fn force_query(query: Option<&str>) -> Result<bool, ApiError> {
    force_param(params(query, &["force"])?.first().map(|(_, v)| *v))
}

/// A query where none is taken: any parameter is refused.
pub fn none_query(query: Option<&str>) -> Result<(), ApiError> {
    params(query, &[]).map(|_| ())
}

/// The value of `force` (absent: false).
fn force_param(v: Option<&str>) -> Result<bool, ApiError> {
    match v {
        None | Some("false" | "0") => Ok(false),
        Some("" | "true" | "1") => Ok(true),
        Some(v) => Err(ApiError::BadQuery(format!(
            "force must be true or false, got {v:?}"
        ))),
    }
}

/// A weight asked of `POST /api/backends/{service}/{backend}/weight`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightAsk {
    /// This weight, 0..=[`MAX_WEIGHT`].
    Absolute(u32),
    /// This percentage of the configured weight (HAProxy's `set weight ... 50%`).
    Percent(u32),
}

impl WeightAsk {
    /// The weight this asks of a backend configured with `configured`: a percentage
    /// rounds to the nearest integer, and one above 0 never gives 0 (`1%` must not
    /// stop a backend's traffic by accident); above [`MAX_WEIGHT`] is refused.
    pub fn resolve(self, configured: u32) -> Result<u32, ApiError> {
        let w = match self {
            WeightAsk::Absolute(w) => u64::from(w),
            WeightAsk::Percent(0) => 0,
            WeightAsk::Percent(p) => ((u64::from(configured) * u64::from(p) + 50) / 100).max(1),
        };
        u32::try_from(w)
            .ok()
            .filter(|w| *w <= MAX_WEIGHT)
            .ok_or_else(|| {
                ApiError::BadQuery(format!(
                    "weight must be 0..={MAX_WEIGHT}; {self} of the configured weight {configured} is {w}"
                ))
            })
    }
}

impl std::fmt::Display for WeightAsk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WeightAsk::Absolute(w) => write!(f, "{w}"),
            WeightAsk::Percent(p) => write!(f, "{p}%"),
        }
    }
}

/// Parse a weight as the CLI and the API take it: `N` (0..=256) or `N%` (of the
/// configured weight; `%25` is the URL-encoded `%`).
pub fn parse_weight(v: &str) -> Result<WeightAsk, ApiError> {
    let bad = |why: &str| {
        ApiError::BadQuery(format!(
            "weight must be an integer 0..={MAX_WEIGHT} or a percentage of the configured weight (50%){why}, got {v:?}"
        ))
    };
    let (digits, percent) = match v.strip_suffix("%25").or_else(|| v.strip_suffix('%')) {
        Some(d) => (d, true),
        None => (v, false),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad(""));
    }
    let n: u32 = digits.parse().map_err(|_| bad(": out of range"))?;
    match (percent, n) {
        (true, _) => Ok(WeightAsk::Percent(n)),
        (false, n) if n <= MAX_WEIGHT => Ok(WeightAsk::Absolute(n)),
        (false, _) => Err(bad(": out of range")),
    }
}

/// Parse `POST /api/backends/{service}/{backend}/weight`'s query: `weight=N` or
/// `weight=N%` (required) and `force`.
pub fn weight_query(query: Option<&str>) -> Result<(WeightAsk, bool), ApiError> {
    let params = params(query, &["weight", "force"])?;
    let Some((_, v)) = params.iter().find(|(k, _)| *k == "weight") else {
        return Err(ApiError::BadQuery(format!(
            "give the new weight: weight=N (0..={MAX_WEIGHT}) or weight=N%25 (of the configured weight)"
        )));
    };
    let force = force_param(params.iter().find(|(k, _)| *k == "force").map(|(_, v)| *v))?;
    Ok((parse_weight(v)?, force))
}

/// `GET /api/connections`'s parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionsQuery {
    /// Only this service's connections.
    pub service: Option<String>,
    /// Only connections from this client address.
    pub client: Option<IpAddr>,
    /// Connections to return at most (the oldest).
    pub limit: usize,
}

/// Parse `GET /api/connections`'s query: `service=NAME`, `client=ADDR`, `limit=N`.
pub fn connections_query(query: Option<&str>) -> Result<ConnectionsQuery, ApiError> {
    let mut q = ConnectionsQuery {
        service: None,
        client: None,
        limit: DEFAULT_CONNECTIONS_LIMIT,
    };
    for (k, v) in params(query, &["service", "client", "limit"])? {
        match k {
            "service" => q.service = Some(v.to_string()),
            "client" => q.client = Some(client_param(v)?),
            _ => q.limit = limit_param(v, MAX_TABLE_LIMIT)?,
        }
    }
    Ok(q)
}

/// Which open connections `POST /api/connections/kill` closes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillPick {
    /// The one with this id (`crossbar connections` lists them).
    Id(u64),
    /// Those from this client address (every one of its connections).
    Client(IpAddr),
    /// The one from this client address and port.
    ClientPort(std::net::SocketAddr),
}

/// Parse `POST /api/connections/kill`'s query: `id=N`, or `client=ADDR` (an IP:
/// all its connections; IP:PORT, or [IPv6]:PORT: that one), exactly one of them.
pub fn kill_query(query: Option<&str>) -> Result<KillPick, ApiError> {
    let params = params(query, &["id", "client"])?;
    let picks: Vec<KillPick> = params
        .iter()
        .map(|&(k, v)| match k {
            "id" => v
                .parse::<u64>()
                .map(KillPick::Id)
                .map_err(|_| ApiError::BadQuery(format!("id must be a connection id, got {v:?}"))),
            _ => match v.parse::<std::net::SocketAddr>() {
                Ok(sa) => Ok(KillPick::ClientPort(std::net::SocketAddr::new(
                    sa.ip().to_canonical(),
                    sa.port(),
                ))),
                Err(_) => client_param(v).map(KillPick::Client),
            },
        })
        .collect::<Result<_, _>>()?;
    match picks.as_slice() {
        [one] => Ok(*one),
        _ => Err(ApiError::BadQuery(
            "give id=N or client=ADDR (one of them): which connection to close".into(),
        )),
    }
}

/// Sources `GET /api/sources` lists per listener without `?limit=`.
pub const DEFAULT_SOURCES_LIMIT: usize = 20;

/// Parse `GET /api/sources`'s query: `limit=N` (sources per listener).
pub fn sources_query(query: Option<&str>) -> Result<usize, ApiError> {
    let mut limit = DEFAULT_SOURCES_LIMIT;
    for (_, v) in params(query, &["limit"])? {
        limit = limit_param(v, MAX_TABLE_LIMIT)?;
    }
    Ok(limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table_limit(q: Option<&str>) -> Result<usize, ApiError> {
        table_query(q).map(|q| q.limit)
    }

    #[test]
    fn picks() {
        let q = |s| table_query(Some(s)).map(|q| q.pick);
        assert_eq!(
            q("key=00000000000000ff&limit=3").unwrap(),
            Some(Pick::Key(255))
        );
        assert_eq!(
            q("client=::ffff:10.1.2.3").unwrap(),
            Some(Pick::Client("10.1.2.3".parse().unwrap()))
        );
        for bad in [
            "key=ff",
            "key=zz00000000000000",
            "key=+00000000000000f",
            "client=10.1.2.3:80",
            "client=host",
            "key=00000000000000ff&client=::1",
            "limit=1&limit=2",
        ] {
            assert!(q(bad).is_err(), "{bad}");
        }
        assert_eq!(delete_query(None).unwrap(), None);
        for bad in ["limit=3", "kye=00000000000000ff", "force"] {
            assert!(delete_query(Some(bad)).is_err(), "{bad}");
        }
        assert!(force_query(Some("force")).unwrap());
        assert!(force_query(Some("force=true")).unwrap());
        assert!(!force_query(Some("force=0")).unwrap());
        assert!(!force_query(None).unwrap());
        assert!(force_query(Some("force=yes please")).is_err());
        assert!(force_query(Some("forse")).is_err());
        let c = connections_query(Some("service=puppet&client=127.0.0.2&limit=5")).unwrap();
        assert_eq!(
            (c.service.as_deref(), c.client, c.limit),
            (Some("puppet"), Some("127.0.0.2".parse().unwrap()), 5)
        );
        assert_eq!(
            connections_query(None).unwrap().limit,
            DEFAULT_CONNECTIONS_LIMIT
        );
        assert!(connections_query(Some("limit=0")).is_err());
        assert!(connections_query(Some("backend=b1")).is_err());
    }

    #[test]
    fn weights() {
        assert_eq!(parse_weight("0").unwrap(), WeightAsk::Absolute(0));
        assert_eq!(parse_weight("256").unwrap(), WeightAsk::Absolute(256));
        assert_eq!(parse_weight("50%").unwrap(), WeightAsk::Percent(50));
        assert_eq!(parse_weight("150%25").unwrap(), WeightAsk::Percent(150));
        for bad in [
            "", "%", "257", "-1", "+3", "1.5", "0x10", "ten", " 5", "5 %",
        ] {
            assert!(parse_weight(bad).is_err(), "{bad}");
        }
        let r = |ask, configured| WeightAsk::resolve(ask, configured).ok();
        assert_eq!(r(WeightAsk::Percent(50), 5), Some(3), "rounded");
        assert_eq!(r(WeightAsk::Percent(1), 1), Some(1), "never 0 by rounding");
        assert_eq!(r(WeightAsk::Percent(0), 100), Some(0));
        assert_eq!(r(WeightAsk::Percent(200), 128), Some(256));
        assert_eq!(r(WeightAsk::Percent(201), 128), None);
        assert_eq!(r(WeightAsk::Percent(u32::MAX), 256), None);
        assert_eq!(r(WeightAsk::Absolute(7), 1), Some(7));
        assert_eq!(
            weight_query(Some("weight=0&force")).unwrap(),
            (WeightAsk::Absolute(0), true)
        );
        assert!(weight_query(None).is_err());
        assert!(weight_query(Some("force=1")).is_err());
    }

    #[test]
    fn limits() {
        assert_eq!(table_limit(None).unwrap(), DEFAULT_TABLE_LIMIT);
        assert_eq!(table_limit(Some("")).unwrap(), DEFAULT_TABLE_LIMIT);
        assert_eq!(table_limit(Some("limit=5")).unwrap(), 5);
        assert_eq!(table_limit(Some("limit=10000")).unwrap(), 10_000);
        for bad in [
            "limit=0",
            "limit=10001",
            "limit=100000",
            "limit=x",
            "limit",
            "lmit=3",
            "limit=-1",
        ] {
            assert!(table_limit(Some(bad)).is_err(), "{bad}");
        }
    }
}
