//! Before a started crossbar takes its first connection, every backend's health is
//! known (HAProxy's `init-state`): the state file's last known health when it is
//! recent and the backend has not moved, else one round of its own check, all
//! backends at once, each bounded by its `health.timeout`. A backend that fails it
//! starts down and needs `rise` passing checks; one without a check starts up.
use std::collections::HashMap;
use std::sync::Arc;

use super::state_file::Saved;
use crate::config::{CheckKind, Config};
use crate::service::Service;

/// Each backend's health to start with, by (service, backend).
pub(super) async fn initial_health(
    config: &Config,
    saved: Option<&Saved>,
) -> HashMap<(String, String), bool> {
    let mut known = HashMap::new();
    let mut checks = tokio::task::JoinSet::new();
    for svc in &config.services {
        for b in &svc.backends {
            if b.health.check == CheckKind::None {
                continue;
            }
            let key = (svc.name.clone(), b.name.clone());
            let address = b.address.to_string();
            if let Some(up) = saved.and_then(|s| s.known_health(&key.0, &key.1, &address)) {
                known.insert(key, up);
                continue;
            }
            let (h, target) = (b.health.clone(), crate::health::target(svc, b));
            checks.spawn(async move {
                let r = crate::health::run_check(&h.check, &target, h.timeout);
                let passed = matches!(tokio::time::timeout(h.timeout, r).await, Ok(Ok(())));
                (key, passed)
            });
        }
    }
    while let Some(r) = checks.join_next().await {
        match r {
            Ok((key, up)) => {
                known.insert(key, up);
            }
            Err(e) => tracing::error!("a first health check failed: {e}"),
        }
    }
    known
}

/// Mark down, before they serve, the backends `initial` says failed.
pub(super) fn set_initial(services: &[Arc<Service>], initial: &HashMap<(String, String), bool>) {
    for svc in services {
        for b in &svc.pool.backends {
            let key = (svc.name().to_string(), b.name.to_string());
            if initial.get(&key) == Some(&false) {
                b.set_healthy(false);
                tracing::warn!(service = %svc.name(), backend = %b.name, "backend down at start: its first check failed (or it was down when last saved)");
            }
        }
    }
}
