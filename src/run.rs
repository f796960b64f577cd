//! `crossbar run`: start the server, then serve signals: SIGHUP reloads the config
//! file (a bad file keeps the old config), SIGTERM/SIGINT drain and exit (a second
//! signal exits at once).
use std::sync::Arc;

use anyhow::{Context, Result};
use tokio::signal::unix::{signal, SignalKind};

use crate::config::Config;
use crate::metrics::Metrics;
use crate::server::Server;

/// Run until a termination signal; returns after a graceful drain.
pub async fn run(config: Config) -> Result<()> {
    let metrics = Metrics::new();
    let source = config.source.clone();
    let wanted: u64 = config
        .services
        .iter()
        .flat_map(|s| s.listen.iter().map(|l| l.max_connections as u64))
        .sum();
    if let Err(e) = crate::system::raise_nofile(wanted) {
        tracing::warn!("cannot read the open-file limit: {e}");
    }
    let server = Server::start(config, metrics).await.context("starting")?;
    tracing::info!(config = %source.display(), "crossbar {} running", env!("CARGO_PKG_VERSION"));
    crate::system::sd_notify("READY=1");
    let mut hup = signal(SignalKind::hangup()).context("installing SIGHUP handler")?;
    let mut term = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
    loop {
        tokio::select! {
            _ = hup.recv() => reload(&server),
            _ = term.recv() => break,
            _ = int.recv() => break,
        }
    }
    crate::system::sd_notify("STOPPING=1");
    let grace = shutdown_grace(&server.config());
    tracing::info!(grace = ?grace, open = server.open_tasks(), "shutting down: no new connections, draining");
    let srv = server.clone();
    tokio::select! {
        cut = srv.shutdown(grace) => {
            tracing::info!(cut, "shutdown complete");
        }
        _ = term.recv() => tracing::warn!("second signal: exiting now"),
        _ = int.recv() => tracing::warn!("second signal: exiting now"),
    }
    Ok(())
}

/// Re-read the config file and apply it; on any error keep the running config.
pub fn reload(server: &Arc<Server>) {
    let path = server.config().source;
    tracing::info!(config = %path.display(), "reloading");
    crate::system::sd_notify("RELOADING=1");
    let result = Config::load(&path)
        .map_err(|e| e.to_string())
        .and_then(|cfg| server.reload(cfg).map_err(|e| e.to_string()));
    crate::system::sd_notify("READY=1");
    match result {
        Ok(()) => {
            server.metrics().reload(true);
            tracing::info!("reload complete");
        }
        Err(e) => {
            server.metrics().reload(false);
            tracing::error!("reload failed, keeping the running configuration:\n{e}");
        }
    }
}

/// The longest shutdown timeout among the services.
fn shutdown_grace(config: &Config) -> std::time::Duration {
    config
        .services
        .iter()
        .map(|s| s.timeouts.shutdown)
        .max()
        .unwrap_or(std::time::Duration::from_secs(30))
}
