//! Reloading the configuration of a running crossbar, every way an operator can:
//! SIGHUP, `POST /api/reload`, `crossbar reload` (the systemd unit's ExecReload,
//! with sd_notify) and the library's reload.
//!
//! - [`transaction`]: a reload that fails for any reason changes nothing, on every
//!   path; the changes a kept listener can take apply.
//! - [`gate`]: every path checks what `crossbar check` checks and probes new health
//!   settings before committing them.
//! - [`command`]: `crossbar reload` and the unit's notifications.
//! - [`carry_over`]: what a reload keeps (connections counted on their backends,
//!   stick entries with their new lifetimes) and that it refuses no connection.
//! - [`last_backend`]: a reload that leaves a service with no backend for new
//!   connections is refused unless forced.
//! - [`warnings`]: settings a reload accepts but names (retired, or applied only by
//!   a restart).
//!
//! Reloads seen from other features (weights, admission counts, PROXY tiers, DNS)
//! are tested with those features.
#[path = "../common/mod.rs"]
mod common;

mod carry_over;
mod command;
mod gate;
mod last_backend;
mod transaction;
mod warnings;

use std::net::SocketAddr;
use std::process::{Command, Output, Stdio};

use common::{admin_get, metric_value, wait_until_async, ChildGuard};

/// Run the `crossbar` CLI with `args` (no admin address from this process's
/// environment), to the end.
fn crossbar(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_crossbar"))
        .args(args)
        .env_remove("CROSSBAR_ADMIN")
        .stdin(Stdio::null())
        .output()
        .expect("run crossbar")
}

/// Bytes a process printed, as text.
fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// SIGHUP the first reload of `p`; returns once `admin` counts it as done.
async fn reload_done(p: &ChildGuard, admin: SocketAddr) {
    p.signal("HUP");
    let reloaded =
        |text: &str| metric_value(text, "crossbar_config_reloads_total", &[("result", "ok")]);
    wait_until_async("the reload counted as done", || async move {
        reloaded(&admin_get(admin, "/metrics").await) == 1.0
    })
    .await;
}
