//! The admin API's writes: a backend's state (drain, enable, disable) and weight,
//! stick entries deleted or a table flushed, and reload; each answers its view
//! ([`super::view`]). Taking the last backend that takes new connections out of
//! rotation is refused unless forced.
use std::sync::Arc;

use super::api::{entry, picked, service, table_of};
use super::error::ApiError;
use super::query::{KillPick, Pick, WeightAsk};
use super::view;
use crate::balance::{AdminState, Backend, State};
use crate::open_connections::OpenConn;
use crate::server::Server;
use crate::service::Service;

/// A backend state change requested by `POST /api/backends/{service}/{backend}/{action}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Set the operator's state: `drain`, `enable` or `disable` ([`AdminState::verb`]).
    Set(AdminState),
    /// Back to the file's (and DNS's) state and weight.
    Reset,
}

impl Action {
    /// Parse the last path segment.
    pub fn parse(s: &str) -> Option<Action> {
        if s == "reset" {
            return Some(Action::Reset);
        }
        AdminState::ALL
            .into_iter()
            .find(|a| a.verb() == s)
            .map(Action::Set)
    }

    /// The path segment (`drain`, `enable`, `disable`, `reset`).
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Set(state) => state.verb(),
            Action::Reset => "reset",
        }
    }
}

/// `DELETE /api/tables/{service}?key=|client=`: remove the entry a pick names; a
/// pick that names nothing is [`ApiError::NoEntry`].
pub fn delete(server: &Server, name: &str, pick: Pick) -> Result<view::DeleteView, ApiError> {
    let svc = service(server, name)?;
    let table = table_of(&svc, name)?;
    let (found, lookup) = picked(&svc, table, pick, true);
    let Some(e) = found else {
        return Err(ApiError::NoEntry {
            service: name.to_string(),
            what: lookup.to_string(),
        });
    };
    tracing::info!(
        service = name,
        kind = e.kind.as_str(),
        key = e.hash_hex,
        backend = e.backend.as_deref(),
        "admin: stick entry deleted"
    );
    Ok(view::DeleteView {
        service: name.to_string(),
        lookup,
        deleted: vec![entry(&e)],
    })
}

/// `DELETE /api/tables/{service}`: remove every entry.
pub fn flush(server: &Server, name: &str) -> Result<view::FlushView, ApiError> {
    let svc = service(server, name)?;
    let table = table_of(&svc, name)?;
    let before = table.stats().entries;
    table.clear();
    tracing::info!(
        service = name,
        entries = before,
        "admin: stick table flushed"
    );
    Ok(view::FlushView {
        service: name.to_string(),
        flushed: before,
    })
}

/// `backend` of `svc`, or the API's 404 naming both.
fn backend_of<'a>(svc: &'a Service, backend: &str) -> Result<&'a Arc<Backend>, ApiError> {
    svc.pool
        .get(backend)
        .ok_or_else(|| ApiError::UnknownBackend {
            service: svc.name().to_string(),
            backend: backend.to_string(),
            nearest: crate::config::nearest(backend, svc.pool.backends.iter().map(|b| &*b.name))
                .map(str::to_string),
        })
}

/// `POST /api/backends/{service}/{backend}/{action}`: set the operator state, in
/// the reload task (so it is recorded, outlives reloads that don't change the
/// backend and DNS changes, is saved in the state file, and the guard below sees
/// every commit). Draining or disabling the last available backend of the service
/// is refused ([`ApiError::LastBackend`]) unless `force`; enabling never is.
pub async fn set_backend(
    server: &Server,
    name: &str,
    backend: &str,
    action: Action,
    force: bool,
) -> Result<view::BackendStateView, ApiError> {
    let Action::Set(state) = action else {
        return Err(ApiError::BadQuery(
            "reset answers a ResetView: use reset_backend".into(),
        ));
    };
    let (name, backend) = (name.to_string(), backend.to_string());
    let written = server.operate(move |op| {
        let svc = op_service(op, &name)?;
        let b = backend_of(svc, &backend)?;
        if !force && state != AdminState::Enabled {
            last_available(svc, b, action)?;
        }
        if state == AdminState::Enabled && b.config.left_dns {
            return Err(left_dns(svc, b));
        }
        op.record().set(&name, b, Some(state), None);
        tracing::info!(service = %name, backend = %backend, state = %b.state(), "admin: backend state set (kept across reloads that leave the backend alone, and restarts with state_file)");
        Ok(view::BackendStateView {
            service: name,
            backend,
            state: b.state(),
            active_connections: b.active(),
        })
    });
    written.await.map_err(not_applied(action.as_str()))?
}

/// `POST /api/backends/{service}/{backend}/reset`: drop what the operator set on
/// the backend and return it to its file's (and DNS's) state and weight. Refused
/// like a drain when the file's state takes the last available backend out.
pub async fn reset_backend(
    server: &Server,
    name: &str,
    backend: &str,
    force: bool,
) -> Result<view::ResetView, ApiError> {
    let (name, backend) = (name.to_string(), backend.to_string());
    let written = server.operate(move |op| {
        let svc = op_service(op, &name)?;
        let b = backend_of(svc, &backend)?;
        if !force && b.config.disabled {
            last_available(svc, b, Action::Set(AdminState::Disabled))?;
        }
        let held = op.record().reset(&name, b).map(|o| super::api::held_view(&name, &backend, &o, None));
        tracing::info!(service = %name, backend = %backend, state = %b.state(), weight = b.weight(), "admin: backend reset to the file's values");
        Ok(view::ResetView {
            service: name,
            backend,
            state: b.state(),
            weight: b.weight(),
            reset: held,
        })
    });
    written.await.map_err(not_applied("reset"))?
}

/// `enable` on `b`, which left DNS: refused, saying what happens to it instead.
fn left_dns(svc: &Service, b: &Backend) -> ApiError {
    ApiError::LeftDns {
        service: svc.name().to_string(),
        backend: b.name.to_string(),
        name: svc
            .discovery
            .as_ref()
            .map_or_else(|| "DNS".to_string(), |d| d.snapshot().name),
    }
}

/// An operator write the reload task could not take (shutdown has begun, or the
/// task ended): said as what it is, not as a failed reload.
fn not_applied(action: &'static str) -> impl FnOnce(crate::server::ApplyError) -> ApiError {
    move |why| ApiError::NotApplied { action, why }
}

/// The running service `name` of an operator write, or the API's 404.
fn op_service<'a>(
    op: &crate::server::Operating<'a>,
    name: &str,
) -> Result<&'a Arc<Service>, ApiError> {
    op.service(name).ok_or_else(|| ApiError::UnknownService {
        name: name.to_string(),
        nearest: crate::config::nearest(name, op.services().iter().map(|s| s.name()))
            .map(str::to_string),
    })
}

/// Refuse to take `b` out of rotation when it is the only backend left that takes
/// new connections (available, weight above 0).
fn last_available(svc: &Service, b: &Backend, action: Action) -> Result<(), ApiError> {
    match others_out(svc, b) {
        None => Ok(()),
        Some(others) => Err(ApiError::LastBackend {
            service: svc.name().to_string(),
            backend: b.name.to_string(),
            action: action.as_str(),
            others,
        }),
    }
}

/// `None` when `b` takes no new connections or another backend of `svc` does;
/// else the other backends and why each takes none: `" (others: b2 down)"`, or
/// `" (its only backend)"`.
fn others_out(svc: &Service, b: &Backend) -> Option<String> {
    let others: Vec<&Arc<Backend>> = svc
        .pool
        .backends
        .iter()
        .filter(|o| o.name != b.name)
        .collect();
    if !b.takes_new() || others.iter().any(|o| o.takes_new()) {
        return None;
    }
    let list: Vec<String> = others
        .iter()
        .map(|o| match o.state() {
            State::Up => format!("{} up at weight 0", o.name),
            state => format!("{} {state}", o.name),
        })
        .collect();
    Some(if list.is_empty() {
        " (its only backend)".to_string()
    } else {
        format!(" (others: {})", list.join(", "))
    })
}

/// `POST /api/backends/{service}/{backend}/weight`: set the weight new connections
/// are balanced by, in the reload task like a state; kept until a reload that
/// changes the backend, or `reset`. Weight 0 on the last backend that takes new
/// connections is refused ([`ApiError::LastWeighted`]) unless `force`.
pub async fn set_weight(
    server: &Server,
    name: &str,
    backend: &str,
    ask: WeightAsk,
    force: bool,
) -> Result<view::WeightView, ApiError> {
    let (name, backend) = (name.to_string(), backend.to_string());
    let written = server.operate(move |op| {
        let svc = op_service(op, &name)?;
        let b = backend_of(svc, &backend)?;
        let weight = ask.resolve(b.config.weight)?;
        if weight == 0 && !force {
            if let Some(others) = others_out(svc, b) {
                return Err(ApiError::LastWeighted {
                    service: name,
                    backend,
                    others,
                });
            }
        }
        let previous = b.weight();
        op.record().set(&name, b, None, Some(weight));
        tracing::info!(
            service = %name,
            backend = %backend,
            weight,
            previous,
            configured = b.config.weight,
            "admin: backend weight set (kept until a reload that changes the backend, or reset)"
        );
        Ok(view::WeightView {
            service: name,
            backend,
            weight,
            previous_weight: previous,
            configured_weight: b.config.weight,
            state: b.state(),
            active_connections: b.active(),
        })
    });
    written.await.map_err(not_applied("weight"))?
}

/// `POST /api/connections/kill?id=N|client=ADDR`: close open connections (HAProxy's
/// `shutdown session`); a pick that names none is [`ApiError::NoConnection`].
pub fn kill_connections(server: &Server, pick: KillPick) -> Result<view::KilledView, ApiError> {
    let matches = |c: &OpenConn| match pick {
        KillPick::Id(id) => c.id == id,
        KillPick::Client(ip) => c.client.ip().to_canonical() == ip,
        KillPick::ClientPort(sa) => {
            c.client.ip().to_canonical() == sa.ip() && c.client.port() == sa.port()
        }
    };
    let mut killed = Vec::new();
    for svc in server.services() {
        for c in svc.connections.kill(matches) {
            killed.push(super::api::connection_view(
                svc.name().to_string(),
                &c,
                false,
            ));
        }
    }
    if killed.is_empty() {
        return Err(ApiError::NoConnection(pick_text(pick)));
    }
    tracing::info!(connections = killed.len(), pick = %pick_text(pick), "admin: connections killed");
    Ok(view::KilledView { killed })
}

/// What a kill picked, in words: `id 7`, `client 10.2.0.17`.
fn pick_text(pick: KillPick) -> String {
    match pick {
        KillPick::Id(id) => format!("id {id}"),
        KillPick::Client(ip) => format!("client {ip}"),
        KillPick::ClientPort(sa) => format!("client {sa}"),
    }
}

/// `POST /api/backends/{service}/{backend}/shutdown-sessions`: close every open
/// connection of the backend (HAProxy's `shutdown sessions server`). Its state is
/// not changed: new connections still go to it unless it is drained or disabled.
pub fn shutdown_sessions(
    server: &Server,
    name: &str,
    backend: &str,
) -> Result<view::KilledView, ApiError> {
    let svc = service(server, name)?;
    let b = backend_of(&svc, backend)?;
    let killed: Vec<view::ConnectionView> = svc
        .connections
        .kill(|c| *c.backend == *b.name)
        .iter()
        .map(|c| super::api::connection_view(name.to_string(), c, false))
        .collect();
    tracing::info!(
        service = name,
        backend,
        connections = killed.len(),
        "admin: backend's connections shut down"
    );
    Ok(view::KilledView { killed })
}

/// `POST /api/reload[?force=true]`: the same path as SIGHUP; an applied reload's
/// warnings. One that leaves a service with no backend for new connections is
/// refused (409) unless `force`.
pub async fn reload(server: &Arc<Server>, force: bool) -> Result<view::ReloadAnswer, ApiError> {
    let applied = server
        .reload_file_forced(force)
        .await
        .map_err(ApiError::ReloadFailed)?;
    let held = |v: &[crate::server::Judged]| {
        v.iter()
            .map(|j| super::api::held_view(&j.service, &j.backend, &j.held, j.why.clone()))
            .collect()
    };
    Ok(view::ReloadAnswer {
        reloaded: true,
        warnings: applied.warnings.clone(),
        unchanged: !applied.changed,
        kept: held(&applied.kept),
        reset: held(&applied.reset),
    })
}
