//! A reload's health gate: before a new configuration is committed, the health
//! checks it asks for are run once on the backends, so that a reload cannot take a
//! service that serves now to a state where no backend can pass its check (a
//! `ca_file` of the wrong CA, a `server_name` the certificates don't carry).
//!
//! The rule (docs/operations.md, "Reloading"):
//! - Probed: every service of the new config whose checks change: a new service,
//!   a backend added or removed, or a backend whose check, timeout, address, server
//!   name or PROXY header changes. One round, every backend of those services in
//!   parallel, each bounded by its `health.timeout` (and as much again to fetch
//!   the certificate that explains a TLS failure). Unchanged services are not
//!   probed: their checks keep running as they are.
//! - Refused: a probed service with at least one backend passing its checks now,
//!   none of whose backends passes under the new settings. The reason names the
//!   service, the backends passing now and why each backend fails, in the words
//!   `crossbar doctor` uses.
//! - Warned, not refused: a probed service none of whose backends passes now (an
//!   outage: a reload may be the fix and is never blocked by it) and a new service
//!   none of whose backends passes.
//!
//! Nothing live is written: the probes are connections of their own.
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;

use super::explain::{grouped, Failure};
use super::predict::{predict, Predicted};
use super::{check_description, target};
use crate::config::{BackendAddress, CheckKind, Config, ProxyProtocol, ServiceConfig};
use crate::service::Service;

/// What decides a backend's check result.
#[derive(Debug, PartialEq)]
struct CheckKey {
    address: BackendAddress,
    name: ServerName<'static>,
    proxy: Option<ProxyProtocol>,
    check: CheckKind,
    timeout: Duration,
}

/// Each backend's [`CheckKey`], by backend name.
fn keys(svc: &ServiceConfig) -> BTreeMap<&str, CheckKey> {
    svc.backends
        .iter()
        .map(|b| {
            let t = target(svc, b);
            let key = CheckKey {
                address: t.address,
                name: t.server_name,
                proxy: t.proxy_protocol,
                check: b.health.check.clone(),
                timeout: b.health.timeout,
            };
            (b.name.as_str(), key)
        })
        .collect()
}

/// One probed service: its new config, the running service of that name (if any)
/// and each backend's result (config order).
struct Probed<'a> {
    new: &'a ServiceConfig,
    running: Option<&'a Arc<Service>>,
    seen: Vec<Predicted>,
}

/// Judge `new` against the `running` services: the warnings to show when the reload
/// may go on, else the reason it is refused (one line per refused service).
pub async fn judge(running: &[Arc<Service>], new: &Config) -> Result<Vec<String>, String> {
    let mut probed: Vec<Probed<'_>> = new
        .services
        .iter()
        .map(|s| (s, running.iter().find(|r| r.name() == s.name)))
        .filter(|(s, old)| match old {
            Some(o) => keys(&o.config) != keys(s),
            None => true,
        })
        .map(|(new, running)| Probed {
            new,
            running,
            seen: Vec::new(),
        })
        .collect();
    probe(&mut probed).await;
    let (mut refusals, mut warnings) = (Vec::new(), Vec::new());
    for p in &probed {
        if p.seen.is_empty() || p.seen.iter().any(|s| s.passed) {
            continue;
        }
        match p.running.map(|r| passing_now(r)) {
            Some(now) if !now.is_empty() => refusals.push(refusal(p, &now)),
            Some(_) => warnings.push(format!(
                "service {}: no backend passes its health check now, and none would under \
                 the new settings ({}) either: {}",
                p.new.name,
                check_of(p.new),
                why(p)
            )),
            None => warnings.push(format!(
                "new service {}: no backend passes its health check ({}): its backends \
                 start up and go down after `fall` failed checks: {}",
                p.new.name,
                check_of(p.new),
                why(p)
            )),
        }
    }
    if refusals.is_empty() {
        Ok(warnings)
    } else {
        Err(refusals.join("\n"))
    }
}

/// Run every backend's check of every probed service once, all at once.
async fn probe(probed: &mut [Probed<'_>]) {
    let mut tasks = tokio::task::JoinSet::new();
    for (s, p) in probed.iter().enumerate() {
        for (i, b) in p.new.backends.iter().enumerate() {
            let (svc, b) = (p.new.clone(), b.clone());
            tasks.spawn(async move { ((s, i), predict(&svc, &b, b.health.timeout, &[]).await) });
        }
    }
    let mut seen = Vec::new();
    while let Some(r) = tasks.join_next().await {
        match r {
            Ok(x) => seen.push(x),
            // A probe task that panicked: that backend counts as passing (the gate
            // refuses only on evidence).
            Err(e) => tracing::error!("reload: a health probe failed: {e}"),
        }
    }
    seen.sort_by_key(|(at, _)| *at);
    for ((s, _), p) in seen {
        probed[s].seen.push(p);
    }
    for p in probed.iter_mut() {
        if p.seen.len() != p.new.backends.len() {
            p.seen.clear(); // not every backend was probed: no verdict
        }
    }
}

/// The running service's backends passing their checks now.
fn passing_now(s: &Service) -> Vec<&str> {
    s.pool
        .backends
        .iter()
        .filter(|b| b.is_healthy())
        .map(|b| &*b.name)
        .collect()
}

fn refusal(p: &Probed<'_>, now: &[&str]) -> String {
    let verb = if now.len() == 1 {
        "passes its check"
    } else {
        "pass their checks"
    };
    format!(
        "service {}: no backend would pass its health check ({}) under the new settings, \
         while {} {verb} now: applied, they would all go down and every client would be \
         refused. {}",
        p.new.name,
        check_of(p.new),
        now.join(", "),
        why(p)
    )
}

/// The check of the service's first backend (`https /status/v1/simple`).
fn check_of(svc: &ServiceConfig) -> String {
    svc.backends
        .first()
        .map(|b| check_description(&b.health.check))
        .unwrap_or_default()
}

/// Why each backend failed, backends failing alike said once.
fn why(p: &Probed<'_>) -> String {
    let failures: Vec<Failure<'_>> = p
        .new
        .backends
        .iter()
        .zip(&p.seen)
        .map(|(b, s)| Failure {
            backend: &b.name,
            reason: s.reason.as_deref().unwrap_or("failed"),
            subject: s.subject.as_deref(),
        })
        .collect();
    grouped(&failures)
}
