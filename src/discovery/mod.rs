//! Backends found in DNS (`discover:`): an SRV name or a host name's A/AAAA records,
//! re-resolved on the records' TTL clamped to `min_ttl`..`max_ttl`.
//!
//! DNS is an input like the config file. Each service with `discover` has one task
//! (its own resolver, off the connection path) that looks the name up and, when the
//! set of backends changes, has the server apply the running config again with the
//! new set: the same transaction as a reload, so a backend present in both answers
//! keeps its live state, counters and stick entries, a new one starts down until
//! `rise` checks pass (then ramps over `slow_start`), and a vanished one drains:
//! no new connections, its stick entries dropped, its open connections run to
//! their end. A failed lookup (timeout, SERVFAIL, NXDOMAIN, no records) changes
//! nothing: the last good set serves on, marked stale in the log, the metrics,
//! the API and the status page.
//!
//! A reload keeps the set found so far when the service's `discover` settings are
//! unchanged; changed ones are looked up once before the reload commits (and, if
//! that fails, the last good set stays).
mod resolve;
mod status;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

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
pub(crate) struct Fresh {
    service: String,
    config: DiscoverConfig,
    backends: Vec<BackendConfig>,
    status: Arc<DiscoveryStatus>,
    next: Duration,
}

/// Every service's discovery: its settings, the backends of its last good answer
/// and its status. The running server owns one.
#[derive(Default)]
pub(crate) struct Registry {
    entries: Mutex<HashMap<String, Entry>>,
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Look up, once each, the names of `config`'s services whose `discover` is new
    /// or changed. A failure keeps the running set of that service, if it has one.
    pub(crate) async fn first_lookups(
        &self,
        config: &Config,
        metrics: &DiscoveryMetrics,
    ) -> Vec<Fresh> {
        let todo: Vec<(String, DiscoverConfig, Vec<BackendConfig>)> = {
            let entries = self.lock();
            config
                .services
                .iter()
                .filter_map(|sc| {
                    let d = sc.discover.as_ref()?;
                    let running = entries.get(&sc.name);
                    if running.is_some_and(|e| &e.config == d) {
                        return None;
                    }
                    let last = running.map(|e| e.backends.clone()).unwrap_or_default();
                    Some((sc.name.clone(), d.clone(), last))
                })
                .collect()
        };
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
            out.push(Fresh {
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
    pub(crate) fn expand(&self, config: &mut Config, fresh: &[Fresh]) {
        let entries = self.lock();
        for sc in &mut config.services {
            sc.backends.retain(|b| b.from_dns.is_none());
            let Some(d) = &sc.discover else { continue };
            let found = match fresh.iter().find(|f| f.service == sc.name) {
                Some(f) => &f.backends,
                None => match entries.get(&sc.name).filter(|e| &e.config == d) {
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

    /// Make `fresh` the discoveries in force (starting their watchers with `spawn`)
    /// and end those of services that no longer have a `discover`.
    pub(crate) fn install(
        &self,
        config: &Config,
        fresh: Vec<Fresh>,
        spawn: impl Fn(
            &str,
            &DiscoverConfig,
            Arc<DiscoveryStatus>,
            Vec<BackendConfig>,
            Duration,
            CancellationToken,
        ),
    ) {
        let mut entries = self.lock();
        for f in fresh {
            let stop = CancellationToken::new();
            let f_name = f.config.query.name().to_string();
            spawn(
                &f.service,
                &f.config,
                f.status.clone(),
                f.backends.clone(),
                f.next,
                stop.clone(),
            );
            let new = Entry {
                config: f.config,
                backends: f.backends,
                status: f.status,
                stop,
            };
            if let Some(old) = entries.insert(f.service, new) {
                old.stop.cancel();
                if old.config.query.name() != f_name {
                    old.status.retire();
                }
            }
        }
        entries.retain(|name, e| {
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
        self.lock().get(service).map(|e| e.status.clone())
    }

    /// A watcher's new set: stored if its discovery is still the one in force.
    pub(crate) fn update(
        &self,
        service: &str,
        cfg: &DiscoverConfig,
        backends: Vec<BackendConfig>,
    ) -> bool {
        match self.lock().get_mut(service) {
            Some(e) if &e.config == cfg => {
                e.backends = backends;
                true
            }
            _ => false,
        }
    }

    /// Stop every watcher (shutdown).
    pub(crate) fn stop_all(&self) {
        for e in self.lock().values() {
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

/// What a watcher calls with a changed set (the server applies it).
pub(crate) type OnChange =
    Box<dyn Fn(Vec<BackendConfig>) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// A service's watcher: look the name up again when the last answer's TTL
/// (clamped) runs out, sooner after a failure; hand a changed set to `changed`.
pub(crate) async fn watch(
    service: String,
    cfg: DiscoverConfig,
    status: Arc<DiscoveryStatus>,
    mut last: Vec<BackendConfig>,
    mut wait: Duration,
    stop: CancellationToken,
    changed: OnChange,
) {
    let resolver = match resolver(&cfg) {
        Ok(r) => r,
        Err(e) => {
            log_failure(&service, &cfg, &e, last.len());
            status.failed(&e, Duration::ZERO);
            return;
        }
    };
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
        let result = tokio::select! {
            () = stop.cancelled() => return,
            r = lookup(&resolver, &cfg) => r,
        };
        match result {
            Ok(a) => {
                wait = next_lookup(&cfg, a.ttl);
                status.resolved(a.backends.len(), a.dropped, wait);
                if a.backends != last {
                    log_answer(&service, &cfg, &a, wait);
                    last = a.backends;
                    changed(last.clone()).await;
                }
            }
            Err(e) => {
                wait = retry_after(&cfg);
                log_failure(&service, &cfg, &e, last.len());
                status.failed(&e, wait);
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
