//! Health state changes: results (active checks and passive connect outcomes) counted
//! into rise/fall streaks, and the flip of a backend up, down or to standby.
use std::io;

use crate::balance::Backend;
use crate::config::{CheckKind, Failback, OnMarkedDown};
use crate::service::Service;

/// What a result did to a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flip {
    /// `fall` consecutive failures: the backend is now down.
    Down,
    /// `rise` consecutive passes: the backend is up and takes traffic.
    Up,
    /// `rise` consecutive passes, but held back for manual failback.
    Standby,
}

/// Count one result for `b` and flip its health if a streak is complete. Returns
/// the flip, if this result caused one (exactly one caller sees each flip).
pub fn observe(svc: &Service, b: &Backend, ok: bool) -> Option<Flip> {
    let h = &b.config.health;
    let streak = b.health().record(ok);
    if ok {
        if b.is_healthy() || streak < h.rise {
            return None;
        }
        // Held only if another backend took over: it is available and was given a
        // connection since this one went down. Backends that were down together and
        // come back together (the backup's checks pass first) start no failover.
        let hold = svc.config.failback == Failback::Manual
            && !b.config.backup
            && svc
                .pool
                .backends
                .iter()
                .any(|o| o.index != b.index && o.is_available() && o.served_since_down_of(b));
        // Standby first, so the backend never takes a connection in between.
        if hold {
            b.set_standby(true);
        }
        b.set_healthy(true).then_some(if hold || b.is_standby() {
            Flip::Standby
        } else {
            Flip::Up
        })
    } else {
        if !b.is_healthy() || streak < h.fall {
            return None;
        }
        b.set_healthy(false).then_some(Flip::Down)
    }
}

/// `observe`, then log a flip once, with its reason.
pub(super) fn observe_and_log(
    svc: &Service,
    b: &Backend,
    ok: bool,
    reason: &dyn std::fmt::Display,
) {
    let (service, backend) = (svc.name(), &*b.name);
    match observe(svc, b, ok) {
        None => {}
        Some(Flip::Down) => {
            tracing::warn!(service, backend, reason = %reason, "backend down");
            if svc.config.on_marked_down == OnMarkedDown::ShutdownSessions {
                let closed = svc.connections.kill(|c| *c.backend == *b.name).len();
                tracing::warn!(
                    service,
                    backend,
                    closed,
                    "backend down: its connections closed (on_marked_down: shutdown-sessions)"
                );
            }
        }
        Some(Flip::Up) => tracing::info!(service, backend, reason = %reason, "backend up"),
        Some(Flip::Standby) => tracing::info!(
            service,
            backend,
            reason = %reason,
            "backend recovered; standby until an operator enables it (failback: manual)"
        ),
    }
}

/// A client connection could not connect to `b`: counts toward `fall` like a
/// failed check.
pub fn passive_failure(svc: &Service, b: &Backend, err: &io::Error) {
    observe_and_log(svc, b, false, &format_args!("connect failed: {err}"));
}

/// A client connection connected to `b`. With `check: tcp` or `none` a connect
/// proves as much as the check, so it ends a failure streak. With `tls-hello` or
/// `https` it proves less (a hung puppetserver still accepts TCP), so only a
/// passing check ends it; otherwise traffic would keep such a backend up forever.
pub fn passive_success(b: &Backend) {
    if matches!(b.config.health.check, CheckKind::Tcp | CheckKind::None)
        && b.health().failures() != 0
    {
        b.health().reset_failures();
    }
}
