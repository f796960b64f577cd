//! Limits and queues read at scrape time: each service's queue (waiting now, its
//! size) and each backend's connection limit (HAProxy's `qcur`, `slim`).
use std::sync::{Arc, Mutex, Weak};

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{IntGaugeVec, Opts};

/// What the limit gauges read of a running service at each scrape (implemented
/// by `service::Service`, which sits above metrics: the collector knows it only
/// by this).
pub trait Limits: Send + Sync {
    /// The service's name (the `service` label).
    fn label(&self) -> &str;
    /// Connections waiting in its queue now.
    fn waiting(&self) -> usize;
    /// The places of its queue.
    fn queue_places(&self) -> usize;
    /// Each backend with a connection limit now, and that limit.
    fn backend_limits(&self) -> Vec<(std::sync::Arc<str>, u32)>;
}

/// `crossbar_queue_waiting`: connections waiting for a backend slot now.
pub const QUEUE_WAITING: &str = "crossbar_queue_waiting";
/// `crossbar_queue_size`: the places of the service's queue (`queue_size`).
pub const QUEUE_SIZE: &str = "crossbar_queue_size";
/// `crossbar_backend_max_connections`: a backend's connection limit now.
pub const BACKEND_MAX_CONNECTIONS: &str = "crossbar_backend_max_connections";

/// The gauges, filled from the running services at each scrape (the data path
/// never touches them; the queue's count is the atomic the pool keeps anyway).
pub(super) struct LimitCollector {
    /// Weak: the registry must not keep a retired config's services alive.
    services: Mutex<Vec<Weak<dyn Limits>>>,
    waiting: IntGaugeVec,
    size: IntGaugeVec,
    max_connections: IntGaugeVec,
}

impl LimitCollector {
    pub(super) fn new() -> LimitCollector {
        let g = |n: &str, h: &str, l: &[&str]| {
            IntGaugeVec::new(Opts::new(n, h), l).expect("static") // ok: static names and labels
        };
        LimitCollector {
            services: Mutex::new(Vec::new()),
            waiting: g(
                QUEUE_WAITING,
                "Connections of the service waiting in its queue for a backend slot now (every candidate at max_connections).",
                &["service"],
            ),
            size: g(
                QUEUE_SIZE,
                "Places in the service's queue (queue_size; 0: no queue, a connection finding every candidate full is refused).",
                &["service"],
            ),
            max_connections: g(
                BACKEND_MAX_CONNECTIONS,
                "A backend's connection limit now: max_connections, lowered by its agent's maxconn while that holds; absent while unlimited.",
                &["service", "backend"],
            ),
        }
    }

    /// The services read at the next scrape.
    pub(super) fn set(&self, services: Vec<Weak<dyn Limits>>) {
        *self.services.lock().unwrap_or_else(|e| e.into_inner()) = services;
    }
}

/// The registered handle of a [`LimitCollector`].
pub(super) struct LimitCollectorHandle(pub(super) Arc<LimitCollector>);

impl Collector for LimitCollectorHandle {
    fn desc(&self) -> Vec<&Desc> {
        let t = &self.0;
        [t.waiting.desc(), t.size.desc(), t.max_connections.desc()].concat()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let t = &self.0;
        let services = t.services.lock().unwrap_or_else(|e| e.into_inner());
        t.waiting.reset();
        t.size.reset();
        t.max_connections.reset();
        for s in services.iter().filter_map(Weak::upgrade) {
            let name = s.label();
            let waiting = i64::try_from(s.waiting()).unwrap_or(i64::MAX);
            t.waiting.with_label_values(&[name]).set(waiting);
            let size = i64::try_from(s.queue_places()).unwrap_or(i64::MAX);
            t.size.with_label_values(&[name]).set(size);
            for (backend, max) in s.backend_limits() {
                t.max_connections
                    .with_label_values(&[name, &*backend])
                    .set(i64::from(max));
            }
        }
        [
            t.waiting.collect(),
            t.size.collect(),
            t.max_connections.collect(),
        ]
        .concat()
    }
}
