//! The listener lifecycle: which listen addresses a config has, binding the new ones
//! off to the side, keeping a socket across reloads (new routes, limit, backlog),
//! starting accept loops, and retiring the addresses a config no longer lists.
//!
//! A kept listen address keeps its socket: the connections queued on it are never
//! dropped by a reload; only its routing table is swapped (see [`ListenerRoutes`]).
use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use arc_swap::ArcSwap;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::admission::{Admission, SourceMetrics};
use crate::config::{Config, ListenConfig, ServiceConfig};
use crate::listener::{self, BindError, ConnLimit};
use crate::service::{ListenerRoutes, ProcessWide, Service};

/// Sockets bound off to the side for the addresses the running config does not
/// listen on yet; nobody accepts on them before the commit.
pub(super) type NewSockets = HashMap<ListenKey, tokio::net::TcpListener>;

/// Identifies a listener across reloads: its address, or for port 0 (an ephemeral
/// port, used by tests and the demo) the service and position that asked for it,
/// since two `:0` entries are two different sockets.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct ListenKey {
    pub(super) addr: SocketAddr,
    pub(super) owner: Option<(String, usize)>,
}

impl ListenKey {
    /// The key of `svc`'s `index`th listen entry `l`.
    pub(super) fn new(svc: &ServiceConfig, index: usize, l: &ListenConfig) -> ListenKey {
        ListenKey {
            addr: l.addr,
            owner: (l.addr.port() == 0).then(|| (svc.name.clone(), index)),
        }
    }
}

/// One listen address of a config and the services (indices, config order) on it.
pub(super) struct ListenGroup {
    pub(super) key: ListenKey,
    pub(super) config: ListenConfig,
    services: Vec<usize>,
}

/// The listen addresses of `config`, each with the services (indices) on it.
pub(super) fn listen_groups(config: &Config) -> Vec<ListenGroup> {
    let mut groups: Vec<ListenGroup> = Vec::new();
    for (si, sc) in config.services.iter().enumerate() {
        for (i, l) in sc.listen.iter().enumerate() {
            let key = ListenKey::new(sc, i, l);
            match groups.iter_mut().find(|g| g.key == key) {
                Some(g) => g.services.push(si),
                None => groups.push(ListenGroup {
                    key,
                    config: l.clone(),
                    services: vec![si],
                }),
            }
        }
    }
    groups
}

/// A listen address that accepts: its routing (swapped whole by a reload), its
/// limit and the settings in force.
pub(super) struct ListenerHandle {
    pub(super) routes: Arc<ArcSwap<ListenerRoutes>>,
    pub(super) local: SocketAddr,
    stop: CancellationToken,
    /// A duplicate of the listening socket: to hand to a successor on upgrade, and
    /// to apply a reload's new backlog. Closed at shutdown.
    pub(super) fd: Option<Arc<OwnedFd>>,
    /// Its `max_connections`, resized by a reload.
    limit: Arc<ConnLimit>,
    /// The settings in force (the first sharing service's `listen` entry).
    pub(super) config: ListenConfig,
}

impl ListenerHandle {
    /// Apply a reload's settings to this kept listener: `max_connections` at once
    /// (see [`ConnLimit`]), a new `backlog` by listen(2) again. (A `freebind` change
    /// never gets here: [`Listeners::check_kept`] refuses it before the commit.)
    fn update(&mut self, mut new: ListenConfig) {
        if new.max_connections != self.config.max_connections {
            self.limit.set_max(new.max_connections);
            tracing::info!(listen = %self.local, max_connections = new.max_connections, "listener limit changed");
        }
        if new.backlog != self.config.backlog {
            match self
                .fd
                .as_ref()
                .map(|fd| listener::set_backlog(fd, new.backlog))
            {
                Some(Ok(())) => {
                    tracing::info!(listen = %self.local, backlog = new.backlog, "listener backlog changed")
                }
                Some(Err(e)) => {
                    tracing::error!(listen = %self.local, "setting backlog {} failed, keeping {}: {e}", new.backlog, self.config.backlog);
                    new.backlog = self.config.backlog;
                }
                None => {} // shutting down: the socket is closing
            }
        }
        self.config = new;
    }
}

/// What an accept loop needs from the running balancer: what connections share,
/// where their tasks are tracked, and the token that ends accepting at shutdown.
#[derive(Clone)]
pub(super) struct AcceptContext {
    pub(super) shared: Arc<ProcessWide>,
    /// Every connection task and accept loop (shutdown waits for them).
    pub(super) tracker: TaskTracker,
    /// Cancelled when shutdown begins: every listener's stop is a child of it.
    pub(super) accepting: CancellationToken,
}

/// The listeners in force, owned by the reload task.
pub(super) struct Listeners {
    handles: HashMap<ListenKey, ListenerHandle>,
    ctx: AcceptContext,
}

impl Listeners {
    /// No listener yet.
    pub(super) fn new(ctx: AcceptContext) -> Listeners {
        Listeners {
            handles: HashMap::new(),
            ctx,
        }
    }

    /// The listeners in force, by key.
    pub(super) fn handles(&self) -> &HashMap<ListenKey, ListenerHandle> {
        &self.handles
    }

    /// Refuse what a kept listen address can't change without a new socket:
    /// `freebind` only matters when binding, and the address is bound already. (A
    /// rebind would drop the connections queued on the socket; a refusal is clear,
    /// ignoring is not.)
    pub(super) fn check_kept(&self, groups: &[ListenGroup]) -> Result<(), FreebindChanged> {
        for g in groups {
            if let Some(now) = self.handles.get(&g.key) {
                if now.config.freebind != g.config.freebind {
                    return Err(FreebindChanged {
                        addr: g.config.addr,
                        now: g.config.freebind,
                    });
                }
            }
        }
        Ok(())
    }

    /// Bind every listen address not listened on yet (or take the socket a
    /// predecessor handed over, from `inherited`). If one fails, the ones bound here
    /// close. Writes nothing live.
    pub(super) fn bind_new(
        &self,
        groups: &[ListenGroup],
        inherited: &mut HashMap<SocketAddr, std::net::TcpListener>,
    ) -> Result<NewSockets, BindError> {
        let mut fresh = HashMap::new();
        for g in groups.iter().filter(|g| !self.handles.contains_key(&g.key)) {
            let l = &g.config;
            let sock = match inherited.remove(&l.addr).filter(|_| g.key.owner.is_none()) {
                Some(std_sock) => tokio::net::TcpListener::from_std(std_sock)
                    .map_err(|source| BindError::new(l.addr, source))?,
                None => listener::bind(l)?,
            };
            fresh.insert(g.key.clone(), sock);
        }
        Ok(fresh)
    }

    /// Make `groups` the listeners in force over the committed `services`: kept ones
    /// get their new routes and settings, new ones start accepting on their `fresh`
    /// socket, and the addresses no longer configured stop accepting (their
    /// connections continue). Cannot fail.
    pub(super) fn commit(
        &mut self,
        groups: Vec<ListenGroup>,
        mut fresh: NewSockets,
        services: &[Arc<Service>],
    ) {
        let mut listeners = HashMap::new();
        for g in groups {
            let svcs = g.services.iter().map(|&i| services[i].clone()).collect();
            let proxy = g.config.proxy_protocol.clone();
            let mut routes = ListenerRoutes::build(svcs, proxy);
            routes.admission = self.admission(&g, &fresh);
            let routes = Arc::new(routes);
            if let Some(mut h) = self.handles.remove(&g.key) {
                h.routes.store(routes);
                h.update(g.config);
                listeners.insert(g.key, h);
            } else if let Some(sock) = fresh.remove(&g.key) {
                let handle = self.start(sock, g.config, routes);
                listeners.insert(g.key, handle);
            }
        }
        let removed = std::mem::replace(&mut self.handles, listeners);
        for h in removed.into_values() {
            tracing::info!(listen = %h.local, "listener removed");
            h.stop.cancel();
            self.ctx
                .shared
                .metrics
                .forget_listener(&h.local.to_string());
        }
    }

    /// Close our duplicates of the listening sockets (shutdown): while any copy is
    /// open the kernel keeps completing handshakes that nobody would accept. (After
    /// an upgrade handover the successor holds its own copies.)
    pub(super) fn close_sockets(&mut self) {
        for h in self.handles.values_mut() {
            h.fd = None;
        }
    }

    /// A listener's per-source table under the new config: the running one kept
    /// (open connections stay counted), a new one, or none.
    fn admission(&self, g: &ListenGroup, fresh: &NewSockets) -> Option<Arc<Admission>> {
        let running = self.handles.get(&g.key);
        let old = running.and_then(|h| h.routes.load().admission.clone());
        let local = running
            .map(|h| h.local)
            .or_else(|| fresh.get(&g.key).and_then(|s| s.local_addr().ok()))
            .unwrap_or(g.config.addr);
        let metrics = || SourceMetrics::new(&self.ctx.shared.metrics, &local.to_string());
        Admission::carry(old, g.config.per_source.as_ref(), metrics)
    }

    /// Start accepting on a freshly bound socket.
    fn start(
        &self,
        sock: tokio::net::TcpListener,
        config: ListenConfig,
        routes: Arc<ListenerRoutes>,
    ) -> ListenerHandle {
        let handle = ListenerHandle {
            routes: Arc::new(ArcSwap::new(routes)),
            local: sock.local_addr().unwrap_or(config.addr),
            stop: self.ctx.accepting.child_token(),
            fd: sock.as_fd().try_clone_to_owned().ok().map(Arc::new),
            limit: ConnLimit::new(config.max_connections),
            config,
        };
        self.spawn_accept(sock, &handle);
        tracing::info!(listen = %handle.local, "listening");
        handle
    }

    fn spawn_accept(&self, sock: tokio::net::TcpListener, h: &ListenerHandle) {
        let routes = h.routes.clone();
        let shared = self.ctx.shared.clone();
        let tracker = self.ctx.tracker.clone();
        let label: Arc<str> = Arc::from(h.local.to_string());
        let counters = shared.metrics.listener(&label);
        let keepalive = {
            let routes = routes.clone();
            move || routes.load().keepalive
        };
        self.ctx.tracker.spawn(listener::accept_loop(
            sock,
            h.limit.clone(),
            counters,
            h.stop.clone(),
            keepalive,
            move |acc| {
                let routes = routes.load_full();
                tracker.spawn(crate::conn::handle(
                    acc,
                    routes,
                    shared.clone(),
                    label.clone(),
                ));
            },
        ));
    }
}

/// A kept listen address changed `freebind`, which only matters when binding.
#[derive(Debug, thiserror::Error)]
#[error(
    "listen {addr}: `freebind` changed to {now}, which applies only when the address is bound, \
     and it is bound already: restart crossbar to apply it (or remove the address in one reload \
     and add it back in the next)"
)]
pub struct FreebindChanged {
    /// The address.
    pub addr: SocketAddr,
    /// The new setting.
    pub now: bool,
}
