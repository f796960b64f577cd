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
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::config::{BackendConfig, Config, DiscoverConfig};

pub use resolve::{lookup, resolver, Answer, LookupError};
pub use status::{DiscoveryMetrics, DiscoveryStatus, Snapshot};

/// The TTL clamped to the operator's bounds: when to look again.
fn next_lookup(cfg: &DiscoverConfig, ttl: Duration) -> Duration {
    ttl.clamp(cfg.min_ttl, cfg.max_ttl)
}

/// After a failure, the next try comes after `min_ttl`: a failed lookup has no TTL,
/// and a recovered server should be seen soon.
fn retry_after(cfg: &DiscoverConfig) -> Duration {
    cfg.min_ttl
}

/// Look `cfg`'s name up once with a resolver made for it.
pub async fn lookup_once(cfg: &DiscoverConfig) -> Result<Answer, LookupError> {
    lookup(&resolver(cfg)?, cfg).await
}

/// One service's discovery in force.
struct Entry {
    config: DiscoverConfig,
    backends: Vec<BackendConfig>,
    status: Arc<DiscoveryStatus>,
    stop: CancellationToken,
}

/// A first lookup made off to the side while a configuration is prepared, for a
/// service whose `discover` is new or changed; installed by [`Registry::install`].
pub(crate) struct FirstLookup {
    service: String,
    config: DiscoverConfig,
    backends: Vec<BackendConfig>,
    status: Arc<DiscoveryStatus>,
    next: Duration,
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
}

impl Registry {
    /// Look up, once each, the names of `config`'s services whose `discover` is new
    /// or changed. A failure keeps the running set of that service, if it has one.
    pub(crate) async fn first_lookups(
        &self,
        config: &Config,
        metrics: &DiscoveryMetrics,
    ) -> Vec<FirstLookup> {
        let todo: Vec<(String, DiscoverConfig, Vec<BackendConfig>)> = config
            .services
            .iter()
            .filter_map(|sc| {
                let d = sc.discover.as_ref()?;
                let running = self.entries.get(&sc.name);
                if running.is_some_and(|e| &e.config == d) {
                    return None;
                }
                let last = running.map(|e| e.backends.clone()).unwrap_or_default();
                Some((sc.name.clone(), d.clone(), last))
            })
            .collect();
        let mut out = Vec::new();
        for (service, cfg, last) in todo {
            let status = Arc::new(DiscoveryStatus::new(&service, &cfg.query, metrics));
            let (backends, next) = match lookup_once(&cfg).await {
                Ok(a) => {
                    let next = next_lookup(&cfg, a.ttl);
                    log_answer(&service, &cfg, &a, next);
                    status.resolved(a.backends.len(), a.dropped, next);
                    (a.backends, next)
                }
                Err(e) => {
                    let next = retry_after(&cfg);
                    log_failure(&service, &cfg, &e, last.len());
                    status.failed(&e, next);
                    let kept = last.into_iter().map(|b| with_health(b, &cfg)).collect();
                    (kept, next)
                }
            };
            out.push(FirstLookup {
                service,
                config: cfg,
                backends,
                status,
                next,
            });
        }
        out
    }

    /// Put the discovered backends into `config`: each service's file backends,
    /// then those of its discovery in force (or of `fresh`). File names win a clash.
    pub(crate) fn expand(&self, config: &mut Config, fresh: &[FirstLookup]) {
        for sc in &mut config.services {
            sc.backends.retain(|b| b.from_dns.is_none());
            let Some(d) = &sc.discover else { continue };
            let found = match fresh.iter().find(|f| f.service == sc.name) {
                Some(f) => &f.backends,
                None => match self.entries.get(&sc.name).filter(|e| &e.config == d) {
                    Some(e) => &e.backends,
                    None => continue,
                },
            };
            for b in found {
                if sc.backends.iter().any(|o| o.name == b.name) {
                    tracing::warn!(service = %sc.name, backend = %b.name, "a discovered backend has the name of a configured one: left out");
                    continue;
                }
                sc.backends.push(b.clone());
            }
        }
    }

    /// Make `fresh` the discoveries in force, starting their watchers (which send
    /// their changes to `requests`), and end those of services that no longer have a
    /// `discover`.
    pub(crate) fn install<R>(
        &mut self,
        config: &Config,
        fresh: Vec<FirstLookup>,
        requests: &mpsc::Sender<R>,
    ) where
        R: From<DnsChange> + Send + 'static,
    {
        for f in fresh {
            let stop = CancellationToken::new();
            let f_name = f.config.query.name().to_string();
            let watcher = Watcher {
                service: f.service.clone(),
                config: f.config.clone(),
                status: f.status.clone(),
                last: f.backends.clone(),
                first_wait: f.next,
                stop: stop.clone(),
            };
            tokio::spawn(watcher.watch(requests.clone()));
            let new = Entry {
                config: f.config,
                backends: f.backends,
                status: f.status,
                stop,
            };
            if let Some(old) = self.entries.insert(f.service, new) {
                old.stop.cancel();
                if old.config.query.name() != f_name {
                    old.status.retire();
                }
            }
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
                e.backends = change.backends;
                true
            }
            _ => false,
        }
    }

    /// Stop every watcher (shutdown).
    pub(crate) fn stop_all(&self) {
        for e in self.entries.values() {
            e.stop.cancel();
        }
    }
}

/// A kept backend with the health settings of a changed `discover`.
fn with_health(mut b: BackendConfig, cfg: &DiscoverConfig) -> BackendConfig {
    b.health = cfg.health.clone();
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
    tracing::warn!(
        service,
        name,
        reason,
        kept,
        "DNS lookup failed ({e}): keeping the last good set of backends, now stale"
    );
}

/// One service's watcher: what it looks up, what it found last, when to look again.
struct Watcher {
    service: String,
    config: DiscoverConfig,
    status: Arc<DiscoveryStatus>,
    last: Vec<BackendConfig>,
    /// Until the first lookup (the first answer's TTL, clamped).
    first_wait: Duration,
    stop: CancellationToken,
}

impl Watcher {
    /// Look the name up again when the last answer's TTL (clamped) runs out, sooner
    /// after a failure; send a changed set to `requests` (the reload task's channel).
    /// Ends at `stop`, or when the reload task is gone.
    async fn watch<R: From<DnsChange>>(mut self, requests: mpsc::Sender<R>) {
        let (service, cfg) = (&self.service, &self.config);
        let resolver = match resolver(cfg) {
            Ok(r) => r,
            Err(e) => {
                log_failure(service, cfg, &e, self.last.len());
                self.status.failed(&e, Duration::ZERO);
                return;
            }
        };
        let mut wait = self.first_wait;
        loop {
            tokio::select! {
                () = self.stop.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
            }
            let result = tokio::select! {
                () = self.stop.cancelled() => return,
                r = lookup(&resolver, cfg) => r,
            };
            match result {
                Ok(a) => {
                    wait = next_lookup(cfg, a.ttl);
                    self.status.resolved(a.backends.len(), a.dropped, wait);
                    if a.backends == self.last {
                        continue;
                    }
                    log_answer(service, cfg, &a, wait);
                    self.last = a.backends;
                    let change = DnsChange {
                        service: service.clone(),
                        discover: cfg.clone(),
                        backends: self.last.clone(),
                    };
                    if requests.send(R::from(change)).await.is_err() {
                        return; // the reload task ended: shutting down
                    }
                }
                Err(e) => {
                    wait = retry_after(cfg);
                    log_failure(service, cfg, &e, self.last.len());
                    self.status.failed(&e, wait);
                }
            }
        }
    }
}

/// Look up every service's `discover` name once and add the backends found to
/// `config` (for `crossbar check --resolve` and `crossbar doctor`); one line per
/// service says what each name resolves to today, or why it does not.
pub async fn resolve_into(config: &mut Config) -> Vec<String> {
    let mut lines = Vec::new();
    for sc in &mut config.services {
        let Some(d) = sc.discover.clone() else {
            continue;
        };
        let what = format!(
            "service {}: DNS {} {}",
            sc.name,
            d.query.kind(),
            d.query.name()
        );
        match lookup_once(&d).await {
            Ok(a) => {
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
                lines.push(format!(
                    "{what}: {} backend(s), TTL {}s{dropped}: {}",
                    a.backends.len(),
                    a.ttl.as_secs(),
                    list.join(", ")
                ));
                for b in a.backends {
                    if !sc.backends.iter().any(|o| o.name == b.name) {
                        sc.backends.push(b);
                    }
                }
            }
            Err(e) => lines.push(format!("{what}: lookup failed ({}): {e}", e.reason())),
        }
    }
    lines
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
