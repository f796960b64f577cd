//! `crossbar run`: start the server, then serve signals: SIGHUP reloads the config
//! file (a bad file keeps the old config), SIGTERM/SIGINT drain and exit (a second
//! signal exits at once). The admin endpoint runs next to the balancer and stops
//! after the drain.
use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;

use crate::admin;
use crate::config::{Config, RelayMode};
use crate::metrics::Metrics;
use crate::server::Server;
use crate::upgrade;

/// Options of `crossbar run` beyond the configuration file.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Unix socket for hitless binary upgrades (see [`crate::upgrade`]): take the
    /// listening sockets of a crossbar serving there, then serve it ourselves.
    pub upgrade_socket: Option<PathBuf>,
}

/// Take over from a predecessor at `path`, if one serves there.
async fn take_over(path: Option<&PathBuf>) -> Result<Option<upgrade::Handover>> {
    let Some(path) = path.cloned() else {
        return Ok(None);
    };
    let shown = path.display().to_string();
    tokio::task::spawn_blocking(move || upgrade::take_over(&path))
        .await
        .context("upgrade task")?
        .with_context(|| format!("--upgrade-socket {shown}"))
}

/// After start: confirm a handover (or bind the upgrade socket fresh) and serve
/// future upgrade requests on a thread; the receiver fires once we handed over.
async fn serve_upgrades(
    path: Option<PathBuf>,
    handover: Option<upgrade::Handover>,
    server: &Arc<Server>,
    extra: Vec<(SocketAddr, OwnedFd)>,
) -> Result<Option<tokio::sync::oneshot::Receiver<()>>> {
    let Some(path) = path else { return Ok(None) };
    let listener = match handover {
        Some(h) => tokio::task::spawn_blocking(move || h.confirm())
            .await
            .context("upgrade task")?
            .context("confirming the takeover")?,
        None => upgrade::bind(&path)
            .with_context(|| format!("binding the upgrade socket {}", path.display()))?,
    };
    let (done, rx) = tokio::sync::oneshot::channel();
    let server = server.clone();
    // A plain thread, not spawn_blocking: it waits in accept() for as long as we run,
    // and the runtime must not wait for it at exit.
    std::thread::Builder::new()
        .name("crossbar-upgrade".into())
        .spawn(move || {
            upgrade::serve(listener, path, server, extra);
            let _ = done.send(()); // ok: the receiver may be gone at exit
        })
        .context("starting the upgrade thread")?;
    Ok(Some(rx))
}

/// Resolves once the upgrade thread handed our sockets over; never without one.
async fn handed_over_signal(rx: &mut Option<tokio::sync::oneshot::Receiver<()>>) {
    match rx {
        Some(r) => {
            let _ = r.await; // ok: a dropped sender also means the thread is gone
        }
        None => std::future::pending().await,
    }
}

/// Run with options until a termination signal or a handover to a successor.
pub async fn run_with(config: Config, opts: RunOptions) -> Result<()> {
    let metrics = Metrics::new();
    // Before any socket is bound: a SIGTERM that arrives once clients can connect
    // must drain them (it waits in the stream for the loop below), not kill the
    // process by the default action (seen under load).
    let mut signals = Signals::install()?;
    let source = config.source.clone();
    raise_open_files(&config);
    // The token first: a bad token file stops the start before anything is bound.
    // Both errors name the admin address or token file themselves.
    let token = config.admin.as_ref().map(admin::load_token).transpose()?;
    let mut handover = take_over(opts.upgrade_socket.as_ref()).await?;
    let mut inherited = handover
        .as_mut()
        .map(|h| std::mem::take(&mut h.listeners))
        .unwrap_or_default();
    if !inherited.is_empty() {
        tracing::info!(
            sockets = inherited.len(),
            "upgrade: took the predecessor's listening sockets"
        );
    }
    // The admin socket before any service address: a taken port stops the start.
    let admin_setup = match (&config.admin, token) {
        (Some(a), Some(token)) => {
            let listener = admin_listener(a.listen, &mut inherited, handover.is_some()).await?;
            Some((a.listen, listener, token))
        }
        _ => None,
    };
    config.log_warnings();
    log_relays(&config);
    let server = Server::start_inheriting(config, metrics, inherited)
        .await
        .context("starting")?;
    // A copy of the admin socket goes to a successor with the services' sockets.
    let admin_fd = admin_setup
        .as_ref()
        .and_then(|(addr, l, _)| Some((*addr, l.as_fd().try_clone_to_owned().ok()?)));
    let mut handed_over = serve_upgrades(
        opts.upgrade_socket.clone(),
        handover,
        &server,
        admin_fd.into_iter().collect(),
    )
    .await?;
    let admin_stop = CancellationToken::new();
    let admin_task =
        admin_setup.map(|(_, listener, token)| spawn_admin(listener, token, &server, &admin_stop));
    let (runtime, workers) = runtime_shape();
    tracing::info!(config = %source.display(), runtime, workers, "crossbar {} running", env!("CARGO_PKG_VERSION"));
    crate::system::sd_notify("READY=1");
    signals.serve(&server, &mut handed_over, &admin_stop).await;
    crate::system::sd_notify("STOPPING=1");
    let grace = shutdown_grace(&server.config());
    // Relayed connections (listed from their backend connect to their end); the
    // server's task count would also count each listener's accept loop.
    let open: usize = server.services().iter().map(|s| s.connections.len()).sum();
    tracing::info!(grace = ?grace, connections = open, "shutting down: no new connections, draining");
    tokio::select! {
        cut = server.shutdown(grace) => {
            tracing::info!(cut, "shutdown complete");
        }
        () = signals.stop() => tracing::warn!("second signal: exiting now"),
    }
    admin_stop.cancel();
    if let Some(task) = admin_task {
        if tokio::time::timeout(ADMIN_STOP_GRACE, task).await.is_err() {
            tracing::warn!("admin endpoint did not stop in time");
        }
    }
    Ok(())
}

/// The runtime this runs on, for the start line: its kind and its worker threads
/// (`crossbar run` uses the work-stealing one with `workers` threads; library
/// callers and tests may run it on a current-thread runtime).
fn runtime_shape() -> (&'static str, usize) {
    let rt = tokio::runtime::Handle::current();
    match rt.runtime_flavor() {
        tokio::runtime::RuntimeFlavor::CurrentThread => ("current-thread", 1),
        _ => ("work-stealing", rt.metrics().num_workers()),
    }
}

/// The signals `crossbar run` answers: SIGHUP reloads, SIGTERM and SIGINT stop.
struct Signals {
    hup: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> Result<Signals> {
        Ok(Signals {
            hup: signal(SignalKind::hangup()).context("installing SIGHUP handler")?,
            term: signal(SignalKind::terminate()).context("installing SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("installing SIGINT handler")?,
        })
    }

    /// Reload on every SIGHUP until a stop signal, or until the upgrade thread
    /// handed our sockets to a successor.
    async fn serve(
        &mut self,
        server: &Server,
        handed_over: &mut Option<tokio::sync::oneshot::Receiver<()>>,
        admin_stop: &CancellationToken,
    ) {
        loop {
            tokio::select! {
                _ = self.hup.recv() => {
                    // Logged and counted inside; on failure the running config stays.
                    let _outcome: crate::server::Outcome = server.reload_file().await;
                }
                _ = self.term.recv() => break,
                _ = self.int.recv() => break,
                () = handed_over_signal(handed_over) => {
                    // The successor answers on the admin socket now (this process would
                    // say "draining" to a health check): stop accepting there at once.
                    admin_stop.cancel();
                    break;
                }
            }
        }
    }

    /// Resolves at the next SIGTERM or SIGINT.
    async fn stop(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}

/// Raise the open-file limit to what the listeners' `max_connections` may use.
fn raise_open_files(config: &Config) {
    let (wanted, drivers) = open_file_demand(config);
    if let Err(e) = crate::system::raise_nofile(wanted, &drivers) {
        tracing::warn!("cannot read the open-file limit: {e}");
    }
}

/// The connections the listening sockets may hold at once, and the settings behind
/// the sum (`puppet, puppetca 10.0.0.10:8140 max_connections 10000`): each socket
/// once, however many services share its address (port 0 is a socket per entry).
fn open_file_demand(config: &Config) -> (u64, String) {
    // (address, services, max_connections), a shared address once
    let mut sockets: Vec<(std::net::SocketAddr, Vec<&str>, u64)> = Vec::new();
    for s in &config.services {
        for l in &s.listen {
            let max = l.max_connections as u64;
            match sockets
                .iter_mut()
                .find(|(a, ..)| l.addr.port() != 0 && *a == l.addr)
            {
                Some((_, names, _)) => names.push(&s.name),
                None => sockets.push((l.addr, vec![&s.name], max)),
            }
        }
    }
    let wanted = sockets.iter().map(|(.., n)| n).sum();
    let drivers = sockets
        .iter()
        .map(|(a, names, n)| format!("{} {a} max_connections {n}", names.join(", ")))
        .collect::<Vec<_>>()
        .join(", ");
    (wanted, drivers)
}

/// Say which relay each service with a `relay:` other than the default uses.
fn log_relays(config: &Config) {
    for s in config
        .services
        .iter()
        .filter(|s| s.relay != RelayMode::SpliceAuto)
    {
        let plan = crate::relay::plan(s.relay);
        tracing::info!(service = %s.name, relay = plan.relay, "{}", plan.why);
    }
}

/// Serve the admin endpoint on `listener` until `stop`.
fn spawn_admin(
    listener: tokio::net::TcpListener,
    token: Option<admin::Secret>,
    server: &Arc<Server>,
    stop: &CancellationToken,
) -> tokio::task::JoinHandle<()> {
    if let Ok(addr) = listener.local_addr() {
        let auth = if token.is_some() {
            "token"
        } else {
            "loopback writes only"
        };
        tracing::info!(listen = %addr, auth, "admin endpoint listening");
    }
    tokio::spawn(admin::serve(listener, server.clone(), token, stop.clone()))
}

/// The admin endpoint's listening socket: the predecessor's, when an upgrade handed
/// it over; else bound here, for this process alone (a second crossbar fails with
/// "address in use"), or beside a predecessor that handed over without it (an
/// older crossbar, which shares it by SO_REUSEPORT).
async fn admin_listener(
    addr: SocketAddr,
    inherited: &mut HashMap<SocketAddr, std::net::TcpListener>,
    upgrading: bool,
) -> Result<tokio::net::TcpListener> {
    if let Some(sock) = inherited.remove(&addr) {
        return tokio::net::TcpListener::from_std(sock)
            .with_context(|| format!("the admin socket {addr} handed over by the predecessor"));
    }
    Ok(if upgrading {
        admin::bind_beside_predecessor(addr).await?
    } else {
        admin::bind(addr).await?
    })
}

/// How long the admin endpoint's open requests get to finish at exit.
const ADMIN_STOP_GRACE: Duration = Duration::from_secs(2);

/// The longest shutdown timeout among the services.
fn shutdown_grace(config: &Config) -> std::time::Duration {
    config
        .services
        .iter()
        .map(|s| s.timeouts.shutdown)
        .max()
        .unwrap_or(std::time::Duration::from_secs(30))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A socket shared by three services counts once in the open-file budget.
    #[test]
    fn a_shared_socket_counts_once_in_the_open_file_demand() {
        let backends = "    backends:\n      - { name: a, address: \"127.0.0.1:1\" }\n";
        let svc = |name: &str, listen: &str, names: &str| {
            format!("  {name}:\n    listen: [{listen}]\n    server_names: [{names}]\n{backends}")
        };
        let shared = "{ address: \"10.0.0.10:8140\", max_connections: 10000 }";
        let yaml = format!(
            "admin: {{ enabled: false }}\nservices:\n{}{}{}",
            svc("puppet", shared, "puppet.example.com"),
            svc("puppetca", shared, "puppetca.example.com"),
            svc(
                "other",
                "{ address: \"10.0.0.11:8140\", max_connections: 5 }",
                "x.example.com"
            ),
        );
        let cfg = Config::from_str_at(&yaml, std::path::Path::new("fd.yaml")).unwrap();
        let (wanted, drivers) = open_file_demand(&cfg);
        assert_eq!(wanted, 10_005, "{drivers}");
        assert_eq!(
            drivers,
            "puppet, puppetca 10.0.0.10:8140 max_connections 10000, other 10.0.0.11:8140 \
             max_connections 5"
        );
    }
}
