//! What the status page, `/api/services` and `/metrics` say about a service's DNS
//! discovery: when its name last resolved, whether the set in use is stale, why.
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};

use super::resolve::{Answer, LookupError};
use crate::config::DiscoverQuery;

/// Lookup results the metrics count, created at 0 for each service.
const RESULTS: [&str; 9] = [
    "ok", "timeout", "servfail", "nxdomain", "refused", "empty", "itself", "config", "error",
];

/// The discovery metric families.
#[derive(Clone)]
pub struct DiscoveryMetrics {
    lookups: IntCounterVec,
    stale: IntGaugeVec,
    backends: IntGaugeVec,
    dropped: IntGaugeVec,
    own: IntGaugeVec,
    last_ok: IntGaugeVec,
    info: IntGaugeVec,
}

impl std::fmt::Debug for DiscoveryMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DiscoveryMetrics")
    }
}

impl DiscoveryMetrics {
    /// Register the families in `r` (once per registry).
    pub fn register(r: &Registry) -> DiscoveryMetrics {
        let gauge = |name: &str, help: &str| {
            let v = IntGaugeVec::new(Opts::new(name, help), &["service", "name"])
                .expect("static metric definition"); // ok: static
            r.register(Box::new(v.clone())).expect("unique metric name"); // ok: static
            v
        };
        let lookups = IntCounterVec::new(
            Opts::new(
                "crossbar_discovery_lookups_total",
                "DNS lookups of a service's discover name by result (ok|timeout|servfail|nxdomain|refused|empty|itself|config|error).",
            ),
            &["service", "name", "result"],
        )
        .expect("static metric definition"); // ok: static
        r.register(Box::new(lookups.clone()))
            .expect("unique metric name"); // ok: static
        let info = IntGaugeVec::new(
            Opts::new(
                "crossbar_discovery_backend_info",
                "1 for each backend of a service found in DNS, labelled with the name it came from.",
            ),
            &["service", "name", "backend"],
        )
        .expect("static metric definition"); // ok: static
        r.register(Box::new(info.clone()))
            .expect("unique metric name"); // ok: static
        DiscoveryMetrics {
            info,
            lookups,
            stale: gauge(
                "crossbar_discovery_stale",
                "1 while the last lookup failed and the last good answer's backends serve on.",
            ),
            backends: gauge(
                "crossbar_discovery_backends",
                "Backends the last good answer gave (after max_backends).",
            ),
            dropped: gauge(
                "crossbar_discovery_dropped_records",
                "Records of the last good answer left out by max_backends.",
            ),
            own: gauge(
                "crossbar_discovery_own_records",
                "Records of the last answer left out because they name crossbar itself (its own listen address, 0.0.0.0 or ::, port 0).",
            ),
            last_ok: gauge(
                "crossbar_discovery_last_success_timestamp_seconds",
                "Unix time of the last good answer (0: none yet).",
            ),
        }
    }

    fn zero(&self, service: &str, name: &str) {
        for r in RESULTS {
            self.lookups.with_label_values(&[service, name, r]);
        }
        self.stale.with_label_values(&[service, name]).set(0);
        self.last_ok.with_label_values(&[service, name]);
        self.backends.with_label_values(&[service, name]);
        self.dropped.with_label_values(&[service, name]);
        self.own.with_label_values(&[service, name]);
    }

    /// Remove a service's series (its `discover` was removed or changed name).
    pub fn forget(&self, service: &str, name: &str) {
        for r in RESULTS {
            let _ = self.lookups.remove_label_values(&[service, name, r]); // ok: absent is fine
        }
        for g in [
            &self.stale,
            &self.backends,
            &self.dropped,
            &self.own,
            &self.last_ok,
        ] {
            let _ = g.remove_label_values(&[service, name]); // ok: absent is fine
        }
    }
}

/// The last lookups of one service's `discover` name.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Snapshot {
    /// `srv` or `host`.
    pub kind: &'static str,
    /// The name looked up.
    pub name: String,
    /// When it last gave a usable answer (Unix seconds).
    pub last_resolved: Option<u64>,
    /// When it was last looked up (Unix seconds).
    pub last_attempt: Option<u64>,
    /// The last lookup failed: the backends are those of the last good answer.
    pub stale: bool,
    /// Why the last lookup failed, if it did.
    pub error: Option<String>,
    /// Backends the last good answer gave.
    pub backends: usize,
    /// Records that answer had beyond `max_backends`.
    pub dropped: usize,
    /// Records of the last answer left out because they name crossbar itself:
    /// `name (address): why`.
    pub own: Vec<String>,
    /// Since when lookups fail (while stale).
    pub stale_since: Option<u64>,
    /// Failed lookups in a row (while stale).
    pub failures: u32,
    /// Milliseconds from the last lookup to the next (its TTL clamped to
    /// `min_ttl`..`max_ttl`; `min_ttl` after a failure).
    pub next_in_ms: Option<u64>,
}

/// The end of a stale period: a good answer after failed lookups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StaleEnd {
    /// Lookups that failed in a row.
    pub failures: u32,
    /// How long the set was stale, in seconds.
    pub seconds: u64,
}

/// Shared by the discovery task (writes) and readers (the status page, the API).
#[derive(Debug)]
pub struct DiscoveryStatus {
    service: String,
    metrics: DiscoveryMetrics,
    snap: Mutex<Snapshot>,
    /// The backends `crossbar_discovery_backend_info` shows now.
    published: Mutex<Vec<String>>,
}

fn unix(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl DiscoveryStatus {
    /// A status with nothing resolved yet; creates the service's series at 0.
    pub fn new(
        service: &str,
        query: &DiscoverQuery,
        metrics: &DiscoveryMetrics,
    ) -> DiscoveryStatus {
        metrics.zero(service, query.name());
        DiscoveryStatus {
            service: service.to_string(),
            metrics: metrics.clone(),
            snap: Mutex::new(Snapshot {
                kind: query.kind(),
                name: query.name().to_string(),
                ..Snapshot::default()
            }),
            published: Mutex::new(Vec::new()),
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut Snapshot) -> R) -> R {
        f(&mut self.snap.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// A copy for readers.
    pub fn snapshot(&self) -> Snapshot {
        self.with(|s| s.clone())
    }

    /// A usable answer; next lookup in `next`. Returns the stale period it ends, if
    /// the lookups before it failed.
    pub fn resolved(&self, a: &Answer, next: Duration) -> Option<StaleEnd> {
        let now = unix(SystemTime::now());
        let (backends, dropped) = (a.backends.len(), a.dropped);
        let (name, ended) = self.with(|s| {
            let ended = s.stale.then(|| StaleEnd {
                failures: s.failures,
                seconds: now.saturating_sub(s.stale_since.unwrap_or(now)),
            });
            s.last_resolved = Some(now);
            s.last_attempt = Some(now);
            s.stale = false;
            s.stale_since = None;
            s.failures = 0;
            s.error = None;
            s.backends = backends;
            s.dropped = dropped;
            s.own = a.own.clone();
            s.next_in_ms = Some(next.as_millis() as u64);
            (s.name.clone(), ended)
        });
        let l = [self.service.as_str(), name.as_str()];
        let m = &self.metrics;
        m.lookups.with_label_values(&[l[0], l[1], "ok"]).inc();
        m.stale.with_label_values(&l).set(0);
        m.backends.with_label_values(&l).set(backends as i64);
        m.dropped.with_label_values(&l).set(dropped as i64);
        m.own.with_label_values(&l).set(a.own.len() as i64);
        m.last_ok.with_label_values(&l).set(now as i64);
        ended
    }

    /// A failed lookup: the set in use is now stale; next try in `next`.
    pub fn failed(&self, e: &LookupError, next: Duration) {
        let now = unix(SystemTime::now());
        let name = self.with(|s| {
            s.last_attempt = Some(now);
            s.stale_since = s.stale_since.or(Some(now));
            s.failures = s.failures.saturating_add(1);
            if let LookupError::OnlyItself(why) = e {
                s.own = why.split("; ").map(str::to_string).collect();
            }
            s.stale = true;
            s.error = Some(e.to_string());
            s.next_in_ms = Some(next.as_millis() as u64);
            s.name.clone()
        });
        let m = &self.metrics;
        m.lookups
            .with_label_values(&[self.service.as_str(), name.as_str(), e.reason()])
            .inc();
        m.stale
            .with_label_values(&[self.service.as_str(), name.as_str()])
            .set(1);
    }

    /// The discovered backends the running pool has now (after a commit).
    pub fn publish(&self, backends: &[&str]) {
        let name = self.with(|s| s.name.clone());
        let mut published = self.published.lock().unwrap_or_else(|e| e.into_inner());
        let info = &self.metrics.info;
        for gone in published.iter().filter(|b| !backends.contains(&b.as_str())) {
            let _ = info.remove_label_values(&[&self.service, &name, gone]); // ok: absent is fine
        }
        for b in backends {
            info.with_label_values(&[&self.service, &name, b]).set(1);
        }
        *published = backends.iter().map(|b| b.to_string()).collect();
    }

    /// The discovery ended (its service or `discover` left the config).
    pub fn retire(&self) {
        let name = self.with(|s| s.name.clone());
        self.metrics.forget(&self.service, &name);
        self.publish(&[]);
    }
}
