//! Backends found in DNS (`discover:`): an SRV name or a host name's A/AAAA records,
//! re-resolved on the records' TTL clamped to `min_ttl`..`max_ttl`.
//!
//! DNS is an input like the config file. Each service with `discover` has one task
//! (its own resolver, off the connection path) that looks the name up and, when the
//! set of backends changes, sends the new set ([`DnsChange`]) to the reload task,
//! which applies the running config again with it: the same transaction as a
//! reload, so a backend present in both answers keeps its live state, counters and
//! stick entries, a new one starts down until `rise` checks pass (then ramps over
//! `slow_start`), and a vanished one drains: no new connections, its stick entries
//! dropped, its open connections run to their end. A failed lookup (timeout,
//! SERVFAIL, NXDOMAIN, no records) changes nothing: the last good set serves on,
//! marked stale in the log, the metrics, the API and the status page.
//!
//! A reload keeps the set found so far when the service's `discover` settings are
//! unchanged; changed ones are looked up once before the reload commits (and, if
//! that fails, the last good set stays).
mod resolve;
mod status;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::config::{BackendConfig, Config, DiscoverConfig};

pub use resolve::{lookup, resolver, Answer, LookupError};
pub use status::{DiscoveryMetrics, DiscoveryStatus, Snapshot, StaleEnd};

/// The TTL clamped to the operator's bounds: when to look again.
fn next_lookup(cfg: &DiscoverConfig, ttl: Duration) -> Duration {
    ttl.clamp(cfg.min_ttl, cfg.max_ttl)
}

/// After a failure, the next try comes after `min_ttl`: a failed lookup has no TTL,
/// and a recovered server should be seen soon.
fn retry_after(cfg: &DiscoverConfig) -> Duration {
    cfg.min_ttl
}

/// Look `cfg`'s name up once with a resolver made for it (records naming an
/// address of `own`, crossbar's listen addresses, left out).
pub async fn lookup_once(cfg: &DiscoverConfig, own: &[SocketAddr]) -> Result<Answer, LookupError> {
    lookup(&resolver(cfg)?, cfg, own).await
}

/// One service's discovery in force.
struct Entry {
    config: DiscoverConfig,
    /// The last good answer's backends (the set in use); empty until one came.
    backends: Vec<BackendConfig>,
    /// Backends that left the answer and still serve or drain (`left_dns`), until
    /// they are drained and idle ([`Registry::forget_departed`]).
    departed: Vec<BackendConfig>,
    status: Arc<DiscoveryStatus>,
    stop: CancellationToken,
}

/// A first lookup, begun when a configuration started being prepared, for a
/// service whose `discover` is new or changed: its watcher starts with it.
enum First {
    /// Still under way.
    Running(tokio::task::JoinHandle<Result<Answer, LookupError>>),
    /// Answered (or failed) while the configuration was prepared.
    Done(Result<Answer, LookupError>),
}

/// The first lookups of a configuration being prepared ([`Registry::begin`]):
/// nothing waits for them; [`FirstLookups::settle`] says how far they got.
pub(crate) struct FirstLookups {
    started: Vec<(String, DiscoverConfig, First)>,
}

impl Drop for FirstLookups {
    fn drop(&mut self) {
        for (_, _, first) in &self.started {
            if let First::Running(h) = first {
                h.abort(); // a refused configuration's lookups end with it
            }
        }
    }
}

impl FirstLookups {
    /// No `discover` is new or changed.
    pub(crate) fn is_empty(&self) -> bool {
        self.started.is_empty()
    }

    /// Wait at most `grace` for the lookups still under way (none: no wait), then
    /// a warning per new name that failed or has not answered: what serves meanwhile.
    pub(crate) async fn settle(&mut self, grace: Duration, registry: &Registry) -> Vec<String> {
        let until = tokio::time::Instant::now() + grace;
        let mut warnings = Vec::new();
        for (service, cfg, first) in &mut self.started {
            if let First::Running(h) = first {
                if let Ok(joined) = tokio::time::timeout_at(until, &mut *h).await {
                    *first = First::Done(
                        joined.unwrap_or_else(|e| Err(LookupError::Other(e.to_string()))),
                    );
                }
            }
            let kept = registry
                .entries
                .get(service.as_str())
                .map_or(0, |e| e.backends.len());
            let what = format!(
                "service {service}: DNS {} {}",
                cfg.query.kind(),
                cfg.query.name()
            );
            let meanwhile = serving_meanwhile(kept);
            match first {
                First::Done(Ok(_)) => {}
                First::Done(Err(e)) => warnings.push(format!("{what}: the lookup failed ({}): {e}; {meanwhile}", e.reason())),
                First::Running(_) => warnings.push(format!(
                    "{what}: no answer yet after {}ms (the reload does not wait for DNS; the lookup goes on); {meanwhile} until it answers",
                    grace.as_millis()
                )),
            }
        }
        warnings
    }
}

/// What serves while a service's name gives no answer, in words.
fn serving_meanwhile(kept: usize) -> String {
    match kept {
        0 => "no backend has ever been resolved: the service has only its configured backends, if any".into(),
        n => format!("the last good set of {n} backend(s) serves on"),
    }
}

/// What a watcher sends when its name answers a new set of backends: the whole set,
/// for the reload task to apply.
#[derive(Debug)]
pub(crate) struct DnsChange {
    /// The service whose `discover` name it is.
    pub service: String,
    /// The `discover` settings the watcher was started for: a change from a watcher
    /// that a reload has replaced since is dropped.
    pub discover: DiscoverConfig,
    /// Every backend of the new answer.
    pub backends: Vec<BackendConfig>,
}

/// Every service's discovery: its settings, the backends of its last good answer
/// and its status. The reload task owns the one of the running config.
#[derive(Default)]
pub(crate) struct Registry {
    entries: HashMap<String, Entry>,
    /// crossbar's own listen addresses (bound ones included), which no answer's
    /// record may name (`crate::config::own_address`); kept current by the reload task.
    own: Arc<ArcSwap<Vec<SocketAddr>>>,
}

impl Registry {
    /// Begin the first lookups of `config`'s services whose `discover` is new or
    /// changed, off to the side: nothing waits for them.
    pub(crate) fn begin(&self, config: &Config) -> FirstLookups {
        let started = config
            .services
            .iter()
            .filter_map(|sc| {
                let d = sc.discover.as_ref()?;
                if self.entries.get(&sc.name).is_some_and(|e| &e.config == d) {
                    return None;
                }
                let (cfg, own) = (d.clone(), self.own.clone());
                let task = tokio::spawn(async move { lookup_once(&cfg, &own.load()).await });
                Some((sc.name.clone(), d.clone(), First::Running(task)))
            })
            .collect();
        FirstLookups { started }
    }

    /// crossbar's own listen addresses now (after a commit).
    pub(crate) fn set_own(&self, addresses: Vec<SocketAddr>) {
        self.own.store(Arc::new(addresses));
    }

    /// Put the discovered backends into `config`: each service's file backends,
    /// then the last good answer of its discovery (the one in force, or the one a
    /// changed `discover` replaces until its own first answer), with the options of
    /// `config`'s `discover.backend`. A configured backend of the same name wins.
    pub(crate) fn expand(&self, config: &mut Config) {
        for sc in &mut config.services {
            sc.backends.retain(|b| b.from_dns.is_none());
            let Some(d) = &sc.discover else { continue };
            let Some(e) = self.entries.get(&sc.name) else {
                continue;
            };
            for b in e.backends.iter().chain(&e.departed) {
                if sc.backends.iter().any(|o| o.name == b.name) {
                    continue; // the file's (see `crossbar status`: its source is config)
                }
                sc.backends.push(with_template(b.clone(), d));
            }
        }
    }

    /// Make `first`'s discoveries the ones in force, starting their watchers (which
    /// send their changes to `requests`), and end those of services that no longer
    /// have a `discover`. A changed `discover` keeps the last good set until its
    /// own first answer.
    pub(crate) fn install<R>(
        &mut self,
        config: &Config,
        mut first: FirstLookups,
        metrics: &DiscoveryMetrics,
        requests: &mpsc::Sender<R>,
    ) where
        R: From<DnsChange> + Send + 'static,
    {
        for (service, cfg, lookup) in std::mem::take(&mut first.started) {
            let stop = CancellationToken::new();
            let status = Arc::new(DiscoveryStatus::new(&service, &cfg.query, metrics));
            let (kept, departed) = match self.entries.remove(&service) {
                Some(old) => {
                    old.stop.cancel();
                    if old.config.query.name() != cfg.query.name() {
                        old.status.retire();
                    }
                    (old.backends, old.departed)
                }
                None => (Vec::new(), Vec::new()),
            };
            let watcher = Watcher {
                service: service.clone(),
                config: cfg.clone(),
                status: status.clone(),
                last: kept.clone(),
                own: self.own.clone(),
                stop: stop.clone(),
            };
            tokio::spawn(watcher.watch(lookup, requests.clone()));
            let entry = Entry {
                config: cfg,
                backends: kept,
                departed,
                status,
                stop,
            };
            self.entries.insert(service, entry);
        }
        self.entries.retain(|name, e| {
            let keep = config
                .service(name)
                .and_then(|s| s.discover.as_ref())
                .is_some_and(|d| d == &e.config);
            if !keep {
                e.stop.cancel();
                e.status.retire();
            }
            keep
        });
    }

    /// The status of a service's discovery, if it has one.
    pub(crate) fn status(&self, service: &str) -> Option<Arc<DiscoveryStatus>> {
        self.entries.get(service).map(|e| e.status.clone())
    }

    /// A watcher's new set: stored if its discovery is still the one in force and
    /// the set differs from the stored one; says whether it was stored (whether the
    /// running config has something to apply).
    pub(crate) fn update(&mut self, change: DnsChange) -> bool {
        match self.entries.get_mut(&change.service) {
            Some(e) if e.config == change.discover && e.backends != change.backends => {
                let listed = |name: &str| change.backends.iter().any(|b| b.name == name);
                e.departed.retain(|d| !listed(&d.name));
                for old in &e.backends {
                    if !listed(&old.name) {
                        e.departed.push(BackendConfig {
                            left_dns: true,
                            ..old.clone()
                        });
                    }
                }
                e.backends = change.backends;
                true
            }
            _ => false,
        }
    }

    /// Let go of the departed backends for which `busy(service, backend)` says no
    /// (the reload task asks its pools: still taking new connections, or still
    /// holding some); says whether any was let go. Takes a question rather than
    /// the services: discovery imports nothing above `config`.
    pub(crate) fn forget_departed(&mut self, busy: impl Fn(&str, &str) -> bool) -> bool {
        let mut any = false;
        for (service, e) in &mut self.entries {
            e.departed.retain(|d| {
                let keep = busy(service, &d.name);
                any |= !keep;
                keep
            });
        }
        any
    }

    /// Stop every watcher (shutdown).
    pub(crate) fn stop_all(&self) {
        for e in self.entries.values() {
            e.stop.cancel();
        }
    }
}

/// A discovered backend with the options `d` gives every one (`discover.backend`,
/// its health settings).
fn with_template(mut b: BackendConfig, d: &DiscoverConfig) -> BackendConfig {
    b.health = d.health.clone();
    b.max_connections = d.backend.max_connections;
    b.proxy_protocol = d.backend.proxy_protocol;
    b.source = d.backend.source;
    b
}

fn log_answer(service: &str, cfg: &DiscoverConfig, a: &Answer, next: Duration) {
    let name = cfg.query.name();
    let next_ms = next.as_millis() as u64;
    if a.dropped > 0 {
        tracing::warn!(
            service,
            name,
            backends = a.backends.len(),
            dropped = a.dropped,
            "DNS answer has more records than max_backends allows: the rest left out"
        );
    }
    tracing::info!(
        service,
        name,
        backends = a.backends.len(),
        ttl_s = a.ttl.as_secs(),
        next_ms,
        "DNS name resolved"
    );
}

fn log_failure(service: &str, cfg: &DiscoverConfig, e: &LookupError, kept: usize) {
    let name = cfg.query.name();
    let reason = e.reason();
    if kept == 0 {
        tracing::warn!(
            service,
            name,
            reason,
            kept,
            "DNS lookup failed ({e}): no backend has ever been resolved for this name"
        );
    } else {
        tracing::warn!(
            service,
            name,
            reason,
            kept,
            "DNS lookup failed ({e}): keeping the last good set of backends, now stale"
        );
    }
}

/// One service's watcher: what it looks up, what it found last, when to look again.
struct Watcher {
    service: String,
    config: DiscoverConfig,
    status: Arc<DiscoveryStatus>,
    last: Vec<BackendConfig>,
    own: Arc<ArcSwap<Vec<SocketAddr>>>,
    stop: CancellationToken,
}

impl Watcher {
    /// Take the first lookup's result, then look the name up again when the last
    /// answer's TTL (clamped) runs out, sooner after a failure; send a changed set to
    /// `requests` (the reload task's channel). Ends at `stop`, or when the reload
    /// task is gone.
    async fn watch<R: From<DnsChange>>(mut self, first: First, requests: mpsc::Sender<R>) {
        let first = match first {
            First::Done(r) => r,
            First::Running(mut h) => tokio::select! {
                () = self.stop.cancelled() => { h.abort(); return }
                r = &mut h => r.unwrap_or_else(|e| Err(LookupError::Other(e.to_string()))),
            },
        };
        let Some(mut wait) = self.take(first, &requests).await else {
            return;
        };
        let resolver = match resolver(&self.config) {
            Ok(r) => r,
            Err(e) => {
                log_failure(&self.service, &self.config, &e, self.last.len());
                self.status.failed(&e, Duration::ZERO);
                return;
            }
        };
        loop {
            tokio::select! {
                () = self.stop.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
            }
            let own = self.own.load_full();
            let result = tokio::select! {
                () = self.stop.cancelled() => return,
                r = lookup(&resolver, &self.config, &own) => r,
            };
            match self.take(result, &requests).await {
                Some(w) => wait = w,
                None => return,
            }
        }
    }

    /// One lookup's result: the status and the log say it, a changed set goes to
    /// `requests`; when to look next (`None`: the reload task is gone).
    async fn take<R: From<DnsChange>>(
        &mut self,
        result: Result<Answer, LookupError>,
        requests: &mpsc::Sender<R>,
    ) -> Option<Duration> {
        let (service, cfg) = (&self.service, &self.config);
        let result = result.and_then(|a| resolve::refilter(a, cfg, &self.own.load()));
        match result {
            Ok(a) => {
                let wait = next_lookup(cfg, a.ttl);
                if let Some(stale) = self.status.resolved(&a, wait) {
                    tracing::info!(service = %service, name = cfg.query.name(), failed = stale.failures, stale_s = stale.seconds, "DNS lookups succeed again: the set is current, no longer stale");
                }
                if a.backends == self.last {
                    return Some(wait);
                }
                log_answer(service, cfg, &a, wait);
                self.last = a.backends;
                let change = DnsChange {
                    service: service.clone(),
                    discover: cfg.clone(),
                    backends: self.last.clone(),
                };
                requests.send(R::from(change)).await.ok()?; // else: shutting down
                Some(wait)
            }
            Err(e) => {
                let wait = retry_after(cfg);
                log_failure(service, cfg, &e, self.last.len());
                self.status.failed(&e, wait);
                Some(wait)
            }
        }
    }
}

/// What `crossbar check --resolve` and `crossbar doctor` learned from DNS.
#[derive(Debug, Default)]
pub struct Resolved {
    /// One line per service with `discover`: what its name resolves to today, or why not.
    pub lines: Vec<String>,
    /// Per service that would start with no backend at all (no configured one, and
    /// its name gives none): the service and the DNS reason.
    pub no_backend: Vec<(String, String)>,
    /// Per record left out because it names crossbar itself: the service and why.
    pub own: Vec<(String, String)>,
}

/// Look up every service's `discover` name (all at once, under one deadline: the
/// longest of theirs) and add the backends found to `config` (for `crossbar check
/// --resolve` and `crossbar doctor`); records naming crossbar itself (its listen
/// addresses in `config`, a wildcard one on this machine's addresses) are left out.
pub async fn resolve_into(config: &mut Config) -> Resolved {
    let own = crate::config::listen_addresses(&config.services);
    let mut asked = tokio::task::JoinSet::new();
    for (i, sc) in config.services.iter().enumerate() {
        let Some(d) = sc.discover.clone() else {
            continue;
        };
        let own = own.clone();
        asked.spawn(async move {
            let r = tokio::time::timeout(resolve::deadline(&d), lookup_once(&d, &own)).await;
            (i, r.unwrap_or(Err(LookupError::Timeout)))
        });
    }
    let mut answers = Vec::new();
    while let Some(r) = asked.join_next().await {
        match r {
            Ok(x) => answers.push(x),
            Err(e) => tracing::error!("a lookup failed: {e}"),
        }
    }
    answers.sort_by_key(|(i, _)| *i);
    let mut out = Resolved::default();
    for (i, answer) in answers {
        let sc = &mut config.services[i];
        let Some(d) = sc.discover.clone() else {
            continue;
        };
        let what = format!(
            "service {}: DNS {} {}",
            sc.name,
            d.query.kind(),
            d.query.name()
        );
        match answer {
            Ok(a) => {
                out.lines.push(format!("{what}: {}", answer_text(&a)));
                for o in &a.own {
                    out.own
                        .push((sc.name.clone(), format!("{what}: record left out: {o}")));
                }
                for b in a.backends {
                    if !sc.backends.iter().any(|o| o.name == b.name) {
                        sc.backends.push(b);
                    }
                }
            }
            Err(e) => {
                out.lines
                    .push(format!("{what}: lookup failed ({}): {e}", e.reason()));
                if sc.backends.is_empty() {
                    let why = format!("{what}: no backend: the lookup failed ({}): {e}; the service would start with no backend and refuse every client", e.reason());
                    out.no_backend.push((sc.name.clone(), why));
                }
            }
        }
    }
    out
}

/// An answer in a line: `2 backend(s), TTL 30s: c1-8140 = 10.0.0.21:8140 weight 1, ...`.
fn answer_text(a: &Answer) -> String {
    let list: Vec<String> = a
        .backends
        .iter()
        .map(|b| {
            let backup = if b.backup { " (backup)" } else { "" };
            format!("{} = {} weight {}{backup}", b.name, b.address, b.weight)
        })
        .collect();
    let dropped = if a.dropped > 0 {
        format!(" ({} more left out by max_backends)", a.dropped)
    } else {
        String::new()
    };
    let own = if a.own.is_empty() {
        String::new()
    } else {
        format!(" ({} naming crossbar itself left out)", a.own.len())
    };
    format!(
        "{} backend(s), TTL {}s{dropped}{own}: {}",
        a.backends.len(),
        a.ttl.as_secs(),
        list.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{DiscoverQuery, HealthConfig};

    fn cfg() -> DiscoverConfig {
        DiscoverConfig {
            query: DiscoverQuery::Srv("_x-puppet._tcp.example.com".into()),
            resolvers: vec![],
            min_ttl: Duration::from_secs(5),
            max_ttl: Duration::from_secs(300),
            max_backends: 64,
            timeout: Duration::from_secs(2),
            health: HealthConfig::default(),
            backend: Default::default(),
        }
    }

    #[test]
    fn ttl_is_clamped_to_the_operator_bounds() {
        let c = cfg();
        assert_eq!(next_lookup(&c, Duration::ZERO), Duration::from_secs(5));
        assert_eq!(
            next_lookup(&c, Duration::from_secs(60)),
            Duration::from_secs(60)
        );
        assert_eq!(
            next_lookup(&c, Duration::from_secs(86_400)),
            Duration::from_secs(300)
        );
        assert_eq!(retry_after(&c), Duration::from_secs(5));
    }
}
