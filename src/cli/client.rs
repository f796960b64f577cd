//! The admin API's client commands (`status`, `table`, `backend`, `connections`,
//! `sources`, `reload`): the request each sends, and its answer read into the
//! view it is ([`crate::admin::view`]) and printed as text, or as the server
//! wrote it with `--json`.
use std::fmt::Write as _;
use std::net::IpAddr;

use hyper::Method;
use serde::de::DeserializeOwned;

use super::http::{request, CliError, REFUSED};
use super::options::ClientOptions;
use crate::admin::view::{
    BackendStateView, ConnectionsView, DeleteView, FlushView, ReloadAnswer, ResetView,
    ServicesView, SourcesView, TableView, WeightView,
};
use crate::admin::{Action, Secret, WeightAsk};

/// One client command.
#[derive(Debug, Clone)]
pub enum Command {
    /// Services, listeners and backends.
    Status,
    /// A stick table's most recent entries, or those of one key or client.
    TableShow {
        /// Service name.
        service: String,
        /// Entries to show (server default 1000).
        limit: Option<usize>,
        /// Only this entry or client's entries.
        pick: Option<Pick>,
    },
    /// Empty a stick table.
    TableFlush {
        /// Service name.
        service: String,
    },
    /// Delete one entry, or a client's entries.
    TableDelete {
        /// Service name.
        service: String,
        /// Which.
        pick: Pick,
    },
    /// Drain, enable or disable a backend.
    Backend {
        /// Service name.
        service: String,
        /// Backend name.
        backend: String,
        /// What to do.
        action: Action,
        /// Also when it is the service's last available backend.
        force: bool,
        /// After a drain or disable, wait this long at most for its last
        /// connection to end (`--wait`).
        wait: Option<std::time::Duration>,
    },
    /// Set a backend's weight until the next reload or restart.
    Weight {
        /// Service name.
        service: String,
        /// Backend name.
        backend: String,
        /// The new weight, or a percentage of the configured one.
        weight: WeightAsk,
        /// Also weight 0 on the service's last backend taking new connections.
        force: bool,
    },
    /// The open connections (the oldest first).
    Connections {
        /// Only this service's.
        service: Option<String>,
        /// Only this client's.
        client: Option<IpAddr>,
        /// At most this many (server default 100).
        limit: Option<usize>,
    },
    /// Close open connections: one by id, or a client's.
    Kill {
        /// `id=N` or `client=ADDR`.
        pick: String,
    },
    /// Close every open connection of a backend.
    ShutdownSessions {
        /// Service name.
        service: String,
        /// Backend name.
        backend: String,
    },
    /// The sources with the most open connections, per listener with `per_source`.
    Sources {
        /// At most this many per listener (server default 20).
        limit: Option<usize>,
    },
    /// Reload the configuration file.
    Reload {
        /// Even if it leaves a service with no backend for new connections.
        force: bool,
    },
}

/// Stick entries named by the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick {
    /// The entry with this key (the 16 hex digits `table show` prints).
    Key(u64),
    /// The entries learned from this client address.
    Client(IpAddr),
}

impl Pick {
    fn query(&self) -> String {
        match self {
            Pick::Key(k) => format!("key={k:016x}"),
            Pick::Client(ip) => format!("client={ip}"),
        }
    }
}

/// `?a&b` from the parameters given, or "".
fn query(params: &[Option<String>]) -> String {
    let given: Vec<&str> = params.iter().flatten().map(String::as_str).collect();
    if given.is_empty() {
        String::new()
    } else {
        format!("?{}", given.join("&"))
    }
}

impl Command {
    /// The request this command sends.
    fn request(&self) -> (Method, String) {
        match self {
            Command::Status => (Method::GET, "/api/services".into()),
            Command::TableShow {
                service,
                limit,
                pick,
            } => {
                let q = query(&[limit.map(|n| format!("limit={n}")), pick.map(|p| p.query())]);
                (Method::GET, format!("/api/tables/{service}{q}"))
            }
            Command::TableFlush { service } => (Method::DELETE, format!("/api/tables/{service}")),
            Command::TableDelete { service, pick } => (
                Method::DELETE,
                format!("/api/tables/{service}?{}", pick.query()),
            ),
            Command::Backend {
                service,
                backend,
                action,
                force,
                ..
            } => (
                Method::POST,
                format!(
                    "/api/backends/{service}/{backend}/{}{}",
                    action.as_str(),
                    if *force { "?force=true" } else { "" }
                ),
            ),
            Command::Weight {
                service,
                backend,
                weight,
                force,
            } => {
                let w = match weight {
                    WeightAsk::Absolute(w) => format!("weight={w}"),
                    WeightAsk::Percent(p) => format!("weight={p}%25"),
                };
                let q = query(&[Some(w), force.then(|| "force=true".to_string())]);
                (
                    Method::POST,
                    format!("/api/backends/{service}/{backend}/weight{q}"),
                )
            }
            Command::Connections {
                service,
                client,
                limit,
            } => {
                let q = query(&[
                    service.as_ref().map(|s| format!("service={s}")),
                    client.map(|c| format!("client={c}")),
                    limit.map(|n| format!("limit={n}")),
                ]);
                (Method::GET, format!("/api/connections{q}"))
            }
            Command::Sources { limit } => {
                let q = query(&[limit.map(|n| format!("limit={n}"))]);
                (Method::GET, format!("/api/sources{q}"))
            }
            Command::Kill { pick } => (Method::POST, format!("/api/connections/kill?{pick}")),
            Command::ShutdownSessions { service, backend } => (
                Method::POST,
                format!("/api/backends/{service}/{backend}/shutdown-sessions"),
            ),
            Command::Reload { force } => (
                Method::POST,
                format!("/api/reload{}", if *force { "?force=true" } else { "" }),
            ),
        }
    }
}

/// The admin endpoint of one command run: its options and token.
struct Endpoint<'a> {
    opts: &'a ClientOptions,
    token: Option<Secret>,
}

impl Endpoint<'_> {
    /// Send `method path`; the answer's body. A refused connect says where the
    /// address came from ([`CliError::NotRunning`]).
    async fn send(&self, method: Method, path: &str) -> Result<String, CliError> {
        match request(&self.opts.admin, method, path, self.token.as_ref()).await {
            Err(CliError::Transport { url, reason }) if reason.starts_with(REFUSED) => {
                Err(CliError::NotRunning {
                    url,
                    from: self.opts.source.clone(),
                })
            }
            Err(CliError::Api { status, body }) if status == hyper::StatusCode::UNAUTHORIZED => {
                Err(CliError::Unauthorized {
                    status,
                    body,
                    from: self.opts.token_source.clone(),
                })
            }
            r => r,
        }
    }
}

/// `body`, the answer to `path`, read as the view `V`: a field the server no
/// longer writes is an error naming it, never a blank.
fn decode<V: DeserializeOwned>(path: &str, body: &str) -> Result<V, CliError> {
    serde_json::from_str(body).map_err(|e| CliError::BadAnswer {
        path: path.to_string(),
        reason: e.to_string(),
    })
}

/// Run a command; returns what to print on stdout.
pub async fn run(opts: &ClientOptions, cmd: &Command) -> Result<String, CliError> {
    let token = opts
        .token_file
        .as_deref()
        .map(Secret::from_file)
        .transpose()?;
    let endpoint = Endpoint { opts, token };
    let (method, path) = cmd.request();
    let body = endpoint.send(method, &path).await?;
    let answer = answer(opts, cmd, &path, body)?;
    let Command::Backend {
        service,
        backend,
        wait: Some(timeout),
        ..
    } = cmd
    else {
        return Ok(answer);
    };
    // The write's answer first, then the wait (which may end in an error).
    print!("{answer}");
    let _ = std::io::Write::flush(&mut std::io::stdout()); // ok: best effort
    let w = super::wait::Wait {
        service,
        backend,
        timeout: *timeout,
    };
    let path = format!(
        "/api/connections?service={service}&limit={}",
        super::wait::LIST_LIMIT
    );
    let list = || async {
        let body = endpoint.send(Method::GET, &path).await?;
        Ok(decode::<ConnectionsView>(&path, &body)?.connections)
    };
    super::wait::until_idle(&w, list).await
}

/// What to print of `cmd`'s answer `body` to `path`.
fn answer(
    opts: &ClientOptions,
    cmd: &Command,
    path: &str,
    body: String,
) -> Result<String, CliError> {
    if opts.json {
        return Ok(body);
    }
    let p = path;
    Ok(match cmd {
        Command::Status => {
            let services: ServicesView = decode(p, &body)?;
            // The page's per-source tables, in the same document.
            let sources = SourcesView {
                listeners: services.per_source.clone(),
            };
            super::status::render(
                &services,
                &sources,
                &opts.flags(),
                std::time::SystemTime::now(),
            )
        }
        Command::TableShow { pick: None, .. } => super::tables::table(&decode(p, &body)?),
        Command::TableShow { pick: Some(_), .. } => {
            super::tables::picked(&decode::<TableView>(p, &body)?)
        }
        Command::TableFlush { service } => {
            let v: FlushView = decode(p, &body)?;
            format!("{service}: flushed {} entries\n", v.flushed)
        }
        Command::TableDelete { service, .. } => {
            super::tables::deleted(service, &decode::<DeleteView>(p, &body)?)
        }
        Command::Connections { .. } => super::traffic::connections(&decode(p, &body)?),
        Command::Sources { .. } => super::traffic::sources(&decode(p, &body)?),
        Command::Backend {
            action: Action::Reset,
            ..
        } => reset(&decode(p, &body)?),
        Command::Backend {
            service, backend, ..
        } => {
            let v: BackendStateView = decode(p, &body)?;
            format!(
                "{service}/{backend}: {} ({} active connections)\n",
                v.state, v.active_connections
            )
        }
        Command::Weight {
            service, backend, ..
        } => weighted(service, backend, &decode(p, &body)?),
        Command::Reload { .. } => reloaded(&decode(p, &body)?),
        Command::Kill { .. } | Command::ShutdownSessions { .. } => {
            super::traffic::killed(&decode(p, &body)?)
        }
    })
}

/// `crossbar backend weight`'s answer.
fn weighted(service: &str, backend: &str, v: &WeightView) -> String {
    format!(
        "{service}/{backend}: weight {} (was {}; {}, {} active connections)\n  \
         kept across reloads that leave the backend alone and restarts; `reset` returns it to the configured weight {}\n",
        v.weight, v.previous_weight, v.state, v.active_connections, v.configured_weight,
    )
}

/// `reloaded` (or that nothing changed), then each warning, each operator state
/// kept and each reset, on a line of its own.
fn reloaded(v: &ReloadAnswer) -> String {
    let mut out = match v.unchanged {
        true => "reloaded: the file is the configuration in force, nothing changed\n",
        false => "reloaded\n",
    }
    .to_string();
    for w in &v.warnings {
        let _ = writeln!(out, "warning: {w}"); // ok: writing to a String
    }
    for k in &v.kept {
        let _ = writeln!(out, "kept: {}", k.text()); // ok: writing to a String
    }
    for r in &v.reset {
        let _ = writeln!(out, "reset: {}", r.text()); // ok: writing to a String
    }
    out
}

/// `crossbar backend reset`'s answer: what it dropped, and the state and weight now.
fn reset(v: &ResetView) -> String {
    let dropped = match &v.reset {
        Some(h) => format!("dropped {}", h.text()),
        None => "the operator had set nothing".into(),
    };
    format!(
        "{}/{}: {} at weight {} (the file's); {dropped}\n",
        v.service, v.backend, v.state, v.weight
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_field_is_an_error_naming_it() {
        let e = decode::<WeightView>("/api/x", "{\"service\": \"s\"}").unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("/api/x") && text.contains("missing field `backend`"),
            "{text}"
        );
        let v: WeightView = decode(
            "/api/x",
            "{\"service\":\"s\",\"backend\":\"b\",\"weight\":10,\"previous_weight\":20,\
             \"configured_weight\":20,\"state\":\"up\",\"active_connections\":41,\"new\":1}",
        )
        .unwrap();
        assert_eq!(
            weighted("s", "b", &v),
            "s/b: weight 10 (was 20; up, 41 active connections)\n  kept across reloads that leave \
             the backend alone and restarts; `reset` returns it to the configured weight 20\n"
        );
    }
}
