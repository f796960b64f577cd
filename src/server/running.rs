//! The running configuration as its readers see it (the admin API, the status page,
//! the upgrade handover, tests): one immutable snapshot that the reload task
//! publishes whole at each commit. Reading it copies nothing and waits for nothing.
use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use arc_swap::ArcSwap;

use super::listeners::{ListenKey, Listeners};
use crate::admission::Admission;
use crate::config::Config;
use crate::service::{ListenerRoutes, Service};

/// Where the reload task publishes the running configuration and readers load it.
pub(super) type Published = Arc<ArcSwap<Running>>;

/// One listen address as readers see it.
struct ListenerView {
    /// The address it is bound to (the port resolved when the config said 0).
    local: SocketAddr,
    /// Its routing: the per-source table lives there.
    routes: Arc<ArcSwap<ListenerRoutes>>,
    /// A duplicate of its socket, for a successor (none once shutdown began).
    fd: Option<Arc<OwnedFd>>,
}

/// The running configuration, its services and its listeners, as of the last commit.
pub(super) struct Running {
    /// The configuration in force (shared, not copied: a reload swaps in a new one).
    pub(super) config: Arc<Config>,
    /// The running services, in config order.
    pub(super) services: Vec<Arc<Service>>,
    listeners: HashMap<ListenKey, ListenerView>,
}

impl Running {
    /// Before the first commit: the config about to start, nothing running.
    pub(super) fn before_start(config: Config) -> Running {
        Running {
            config: Arc::new(config),
            services: Vec::new(),
            listeners: HashMap::new(),
        }
    }

    /// The snapshot of what the reload task runs now.
    pub(super) fn new(
        config: Arc<Config>,
        services: Vec<Arc<Service>>,
        listeners: &Listeners,
    ) -> Running {
        let listeners = listeners
            .handles()
            .iter()
            .map(|(k, h)| {
                let view = ListenerView {
                    local: h.local,
                    routes: h.routes.clone(),
                    fd: h.fd.clone(),
                };
                (k.clone(), view)
            })
            .collect();
        Running {
            config,
            services,
            listeners,
        }
    }

    /// One running service.
    pub(super) fn service(&self, name: &str) -> Option<Arc<Service>> {
        self.services.iter().find(|s| s.name() == name).cloned()
    }

    /// The addresses a service's listeners are bound to.
    pub(super) fn local_addrs(&self, service: &str) -> Vec<SocketAddr> {
        let Some(svc) = self.services.iter().find(|s| s.name() == service) else {
            return Vec::new();
        };
        svc.config
            .listen
            .iter()
            .enumerate()
            .filter_map(|(i, l)| {
                self.listeners
                    .get(&ListenKey::new(&svc.config, i, l))
                    .map(|h| h.local)
            })
            .collect()
    }

    /// The listening sockets (duplicated) with the addresses the configuration lists
    /// for them. Port-0 listeners are not included.
    pub(super) fn listen_sockets(&self) -> Vec<(SocketAddr, OwnedFd)> {
        self.listeners
            .iter()
            .filter(|(k, _)| k.owner.is_none())
            .filter_map(|(k, h)| Some((k.addr, h.fd.as_ref()?.try_clone().ok()?)))
            .collect()
    }

    /// Every listener's per-source table, by its bound address.
    pub(super) fn sources(&self) -> Vec<(SocketAddr, Arc<Admission>)> {
        let mut out: Vec<_> = self
            .listeners
            .values()
            .filter_map(|h| Some((h.local, h.routes.load().admission.clone()?)))
            .collect();
        out.sort_by_key(|(a, _)| *a);
        out
    }
}
