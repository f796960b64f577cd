//! The running services' background tasks (health checks, stick-table sweeper,
//! load feedback, ticket-key learners, periodic saver), what a commit retires of
//! the old services, and saving the stick tables.
use std::sync::Arc;
use std::time::Duration;

use tokio_util::task::TaskTracker;

use crate::metrics::Metrics;
use crate::service::Service;

/// How often each stick table's sweeper removes expired entries.
const SWEEP_INTERVAL: Duration = Duration::from_secs(5);

/// Signals the end of a ticket-key learner's first probe round.
pub(super) type Probe = tokio::sync::oneshot::Receiver<()>;

/// Start the committed services' tasks (health checks, sweeper, load feedback,
/// ticket-key learners, saver) and publish their stick tables to the metrics; returns the
/// learners' first-round signals.
pub(super) fn spawn(
    services: &[Arc<Service>],
    metrics: &Metrics,
    savers: &TaskTracker,
) -> Vec<Probe> {
    let mut probes = Vec::new();
    for svc in services {
        crate::health::spawn_checks(svc);
        spawn_sweeper(svc);
        super::feedback::spawn(svc);
        probes.extend(crate::ticket_keys::spawn(svc));
        spawn_saver(svc, savers);
    }
    metrics.set_services(services);
    metrics.set_tables(
        services
            .iter()
            .filter_map(|s| s.table.clone().map(|t| (s.name().to_string(), t)))
            .collect(),
    );
    probes
}

/// After the commit: the old services' background tasks stop; backends the new
/// config removed leave the stick tables and the metrics.
pub(super) fn retire(old: &[Arc<Service>], new: &[Arc<Service>], metrics: &Metrics) {
    for o in old {
        o.tasks.cancel();
        let Some(n) = new.iter().find(|s| s.name() == o.name()) else {
            continue;
        };
        for b in o
            .pool
            .backends
            .iter()
            .filter(|b| n.pool.get(&b.name).is_none())
        {
            if let Some(t) = &n.table {
                t.remove_backend(&b.name);
            }
            metrics.forget_backend(o.name(), &b.name);
        }
    }
}

/// Remove a service's expired stick entries every [`SWEEP_INTERVAL`].
fn spawn_sweeper(svc: &Arc<Service>) {
    let Some(table) = svc.table.clone() else {
        return;
    };
    let stop = svc.tasks.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(SWEEP_INTERVAL);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tick.tick() => { table.sweep(); }
            }
        }
    });
}

/// Save a service's stick table every `save_interval` when it has a `state_file`
/// (and once more at shutdown, by [`save_all`], after this task ended).
fn spawn_saver(svc: &Arc<Service>, savers: &TaskTracker) {
    let (Some(table), Some(stick)) = (svc.table.clone(), svc.config.stick.as_ref()) else {
        return;
    };
    let Some(path) = stick.state_file.clone() else {
        return;
    };
    let (every, stop, name) = (
        stick.save_interval,
        svc.tasks.clone(),
        svc.config.name.clone(),
    );
    savers.spawn(async move {
        let mut tick = tokio::time::interval(every);
        // Saves longer than the interval are followed by the next one, not a burst.
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await; // the first tick is immediate: nothing new to save yet
        loop {
            tokio::select! {
                biased;
                () = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let (t, p) = (table.clone(), path.clone());
            match tokio::task::spawn_blocking(move || t.save(&p)).await {
                Ok(Ok(n)) => tracing::debug!(service = %name, entries = n, "stick table saved"),
                Ok(Err(e)) => {
                    tracing::error!(service = %name, "saving stick table to {} failed: {e}", path.display())
                }
                Err(e) => tracing::error!(service = %name, "stick table save task failed: {e}"),
            }
        }
    });
}

/// Save every stick table of `services` that has a `state_file` (blocking I/O).
pub(super) fn save_all(services: &[Arc<Service>]) {
    for svc in services {
        let (Some(t), Some(path)) = (
            &svc.table,
            svc.config
                .stick
                .as_ref()
                .and_then(|s| s.state_file.as_ref()),
        ) else {
            continue;
        };
        match t.save(path) {
            Ok(n) => {
                tracing::info!(service = %svc.name(), entries = n, "stick table saved to {}", path.display())
            }
            Err(e) => {
                tracing::error!(service = %svc.name(), "saving stick table to {} failed: {e}", path.display())
            }
        }
    }
}
