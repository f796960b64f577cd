//! The operator's run-time state: what `crossbar backend drain|enable|disable|
//! weight` set on each backend. File < DNS < operator: the reload task owns this
//! one record, applies it at every commit (so a DNS change never undoes it, nor a
//! reload that leaves the backend's own settings alone), answers each operator
//! write as a request on its channel (so the last-backend guard sees every commit),
//! and the state file keeps it across restarts (`state_file`, see `state_file.rs`).
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::balance::{AdminState, Backend};
use crate::config::BackendConfig;
use crate::service::Service;

/// The settings of the file an override was set against: a reload that changes
/// one of them "changes the backend" and resets the override. A backend found in
/// DNS has none (`None`): DNS may move it or reweigh it, the operator still wins.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Against {
    /// Its address.
    pub address: String,
    /// Its `weight`.
    pub weight: u32,
    /// Its `disabled`.
    pub disabled: bool,
}

impl Against {
    /// What `b`'s file says, for a backend of the file.
    pub fn of(b: &BackendConfig) -> Option<Against> {
        b.from_dns.is_none().then(|| Against {
            address: b.address.to_string(),
            weight: b.weight,
            disabled: b.disabled,
        })
    }
}

/// What the operator set on one backend.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Override {
    /// The state, if the operator set one other than the file's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<AdminState>,
    /// The weight, if the operator set one other than the file's (or DNS's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    /// When it was last set (Unix seconds).
    pub since: u64,
    /// The file's settings it was set against (`None`: a backend from DNS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub against: Option<Against>,
}

/// One override in a reload's answer: kept, or reset and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Judged {
    /// The service.
    pub service: String,
    /// The backend.
    pub backend: String,
    /// The override.
    pub held: Override,
    /// Why it was reset (`None`: kept).
    pub why: Option<String>,
}

impl Judged {
    /// In a line: `puppet/compile1 drain, weight 3`.
    pub fn text(&self) -> String {
        let state = self.held.state.map(AdminState::as_str);
        let at = format!("{}/{}", self.service, self.backend);
        override_text(&at, state, self.held.weight, self.why.as_deref())
    }
}

/// An override in a line, as reloads and the views say it: `at` (`service/backend`),
/// the state and weight set, and why it was reset, if it was:
/// `puppet/compile2 weight 5 (the reload changed the backend: ...)`.
pub fn override_text(
    at: &str,
    state: Option<&str>,
    weight: Option<u32>,
    why: Option<&str>,
) -> String {
    let weight = weight.map(|w| format!("weight {w}"));
    let what: Vec<&str> = state.into_iter().chain(weight.as_deref()).collect();
    let why = why.map(|w| format!(" ({w})")).unwrap_or_default();
    format!("{at} {}{why}", what.join(", "))
}

/// Every backend's override, by service and backend name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorState {
    /// service -> backend -> what the operator set.
    pub services: BTreeMap<String, BTreeMap<String, Override>>,
}

/// Unix seconds now.
fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl OperatorState {
    /// What the operator set on `backend` of `service`, if anything.
    pub fn get(&self, service: &str, backend: &str) -> Option<&Override> {
        self.services.get(service)?.get(backend)
    }

    /// Apply the record to the services of a commit (before they serve): every
    /// backend takes its override, or its file's state and weight. An override whose
    /// backend's file settings changed, or whose backend left the file, is dropped;
    /// returns the kept and the reset ones (the reload's answer says both).
    pub fn apply(&mut self, services: &[Arc<Service>]) -> Vec<Judged> {
        let mut judged = Vec::new();
        for (service, backends) in &mut self.services {
            let svc = services.iter().find(|s| s.name() == service);
            backends.retain(|name, held| {
                let why = reset_why(svc.map(|s| &**s), name, held);
                judged.push(Judged {
                    service: service.clone(),
                    backend: name.clone(),
                    held: held.clone(),
                    why: why.clone(),
                });
                why.is_none()
            });
        }
        self.services.retain(|_, b| !b.is_empty());
        for svc in services {
            for b in &svc.pool.backends {
                let file = AdminState::of_file(&b.config);
                match self.get(svc.name(), &b.name) {
                    Some(o) => {
                        b.apply_admin_state(o.state.unwrap_or(file));
                        b.set_weight(o.weight.unwrap_or(b.config.weight));
                    }
                    None => b.apply_admin_state(file),
                }
            }
        }
        judged
    }

    /// Record `state` (and, with `weight`, a weight) set on `b` of `service`, and
    /// apply it; a value equal to the file's is no override.
    pub fn set(
        &mut self,
        service: &str,
        b: &Backend,
        state: Option<AdminState>,
        weight: Option<u32>,
    ) {
        let file = AdminState::of_file(&b.config);
        let entry = self
            .services
            .entry(service.to_string())
            .or_default()
            .entry(b.name.to_string())
            .or_insert_with(|| Override {
                state: None,
                weight: None,
                since: now(),
                against: Against::of(&b.config),
            });
        if let Some(s) = state {
            entry.state = (s != file).then_some(s);
            b.set_admin_state(s);
        }
        if let Some(w) = weight {
            entry.weight = (w != b.config.weight).then_some(w);
            b.set_weight(w);
        }
        entry.since = now();
        entry.against = Against::of(&b.config);
        if entry.state.is_none() && entry.weight.is_none() {
            self.forget(service, &b.name);
        }
    }

    /// Drop what the operator set on `b` of `service` and return it to its file's
    /// (and DNS's) state and weight; what was dropped, if anything.
    pub fn reset(&mut self, service: &str, b: &Backend) -> Option<Override> {
        let was = self.forget(service, &b.name);
        b.set_admin_state(AdminState::of_file(&b.config));
        b.set_weight(b.config.weight);
        was
    }

    fn forget(&mut self, service: &str, backend: &str) -> Option<Override> {
        let backends = self.services.get_mut(service)?;
        let was = backends.remove(backend);
        if backends.is_empty() {
            self.services.remove(service);
        }
        was
    }
}

/// Why an override no longer holds in `svc` (`None`: it holds). One of a backend
/// that DNS has not (yet) given holds while the service has `discover`.
fn reset_why(svc: Option<&Service>, name: &str, held: &Override) -> Option<String> {
    let Some(svc) = svc else {
        return Some("its service left the configuration".into());
    };
    match svc.pool.get(name) {
        None if held.against.is_none() && svc.config.discover.is_some() => None,
        None => Some("the backend left the configuration".into()),
        Some(b) => {
            let (was, now) = (held.against.as_ref()?, Against::of(&b.config)?);
            let changed: Vec<String> = [
                (was.address != now.address)
                    .then(|| format!("address {} -> {}", was.address, now.address)),
                (was.weight != now.weight)
                    .then(|| format!("weight {} -> {} in the file", was.weight, now.weight)),
                (was.disabled != now.disabled)
                    .then(|| format!("disabled {} -> {} in the file", was.disabled, now.disabled)),
            ]
            .into_iter()
            .flatten()
            .collect();
            (!changed.is_empty())
                .then(|| format!("the reload changed the backend: {}", changed.join(", ")))
        }
    }
}

/// An operator write under way in the reload task: the running services and the
/// record, one write at a time (so two operators draining the last two backends
/// can't both pass the last-backend check, and no DNS commit comes in between).
pub struct Operating<'a> {
    services: &'a [Arc<Service>],
    record: &'a mut OperatorState,
    changed: bool,
}

impl<'a> Operating<'a> {
    pub(super) fn new(
        services: &'a [Arc<Service>],
        record: &'a mut OperatorState,
    ) -> Operating<'a> {
        Operating {
            services,
            record,
            changed: false,
        }
    }

    /// The write changed the record (it is saved and published).
    pub(super) fn changed(&self) -> bool {
        self.changed
    }

    /// The running services.
    pub fn services(&self) -> &'a [Arc<Service>] {
        self.services
    }

    /// The running service `name`.
    pub fn service(&self, name: &str) -> Option<&'a Arc<Service>> {
        self.services.iter().find(|s| s.name() == name)
    }

    /// What the operator set on `backend` of `service`.
    pub fn held(&self, service: &str, backend: &str) -> Option<&Override> {
        self.record.get(service, backend)
    }

    /// The record, to set a backend's state or weight in ([`OperatorState::set`]) or
    /// reset it ([`OperatorState::reset`]): the write is then saved and published.
    pub fn record(&mut self) -> &mut OperatorState {
        self.changed = true;
        self.record
    }
}
