//! The reload's last-backend guard: a reload that would leave a serving service
//! with no backend for new connections (the others drained or disabled by the
//! operator, down, at weight 0, or gone from the file) is refused as the same
//! drain is (`409`, `crossbar reload` exits 1), unless forced; forced, it says so
//! in the answer, the log and `crossbar status`.
use std::sync::Arc;

use super::operator::{Against, OperatorState, Override};
use crate::balance::AdminState;
use crate::config::{BackendConfig, Config};
use crate::service::Service;

/// Each service `new` would leave with no backend for new connections while one
/// takes them now, in a line naming the service and why each backend takes none.
pub(super) fn stranded(
    running: &[Arc<Service>],
    operator: &OperatorState,
    new: &Config,
) -> Vec<String> {
    let mut out = Vec::new();
    for sc in &new.services {
        let Some(svc) = running.iter().find(|s| s.name() == sc.name) else {
            continue; // a new service: its file says what it wants
        };
        if !svc.pool.backends.iter().any(|b| b.takes_new()) {
            continue; // none takes new connections now: the reload changes nothing of that
        }
        let why: Option<Vec<String>> = sc
            .backends
            .iter()
            .map(|bc| out_of_rotation(svc, operator.get(&sc.name, &bc.name), bc))
            .collect();
        let Some(mut why) = why else {
            continue; // one backend at least may take new connections
        };
        let gone = svc
            .pool
            .backends
            .iter()
            .filter(|b| !sc.backends.iter().any(|n| n.name.as_str() == &*b.name))
            .map(|b| format!("{} leaves the configuration", b.name));
        why.extend(gone);
        out.push(format!(
            "service {} would have no backend for new connections (every new client \
             refused: no_backend): {}; add force to reload anyway (crossbar reload --force)",
            sc.name,
            why.join(", ")
        ));
    }
    out
}

/// Why backend `bc` of the new configuration would take no new connection (`None`:
/// it may take them): the operator's override that the reload keeps, its file's
/// `disabled` or weight 0, or, for a backend running at the same address, its
/// health now (a new one's is not known yet: it counts).
fn out_of_rotation(svc: &Service, held: Option<&Override>, bc: &BackendConfig) -> Option<String> {
    let kept = held.filter(|o| match (&o.against, Against::of(bc)) {
        (Some(was), Some(now)) => *was == now,
        _ => true, // set on a backend from DNS: DNS may move it, the operator wins
    });
    let state = kept.and_then(|o| o.state);
    let weight = kept.and_then(|o| o.weight).unwrap_or(bc.weight);
    match state {
        Some(AdminState::Enabled) => {}
        Some(s) => return Some(format!("{} {} (operator)", bc.name, s.as_str())),
        None if bc.disabled => return Some(format!("{} disabled in the file", bc.name)),
        None => {}
    }
    if weight == 0 {
        return Some(format!("{} weight 0", bc.name));
    }
    let now = svc.pool.get(&bc.name)?;
    (now.config.address == bc.address && !now.is_healthy()).then(|| format!("{} down", bc.name))
}
