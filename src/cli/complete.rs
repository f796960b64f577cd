//! Shell completion of service and backend names (`crossbar backend drain pu<TAB>`),
//! from the running crossbar's `/api/services` (its discovered backends included),
//! else from the config file it would read: the admin address comes from the
//! default config (or `CROSSBAR_ADMIN`), as for every admin command. Quiet and
//! quick: a completion prints no error and waits at most [`ASK_TIMEOUT`].
use std::path::Path;
use std::time::Duration;

use clap_complete::CompletionCandidate;
use hyper::Method;

use crate::admin::view::ServicesView;
use crate::config::{Config, DEFAULT_CONFIG_PATH};

/// Longest a completion waits for the running crossbar: a shell's tab is
/// interactive, and the config file answers too.
const ASK_TIMEOUT: Duration = Duration::from_millis(800);

/// The names a SERVICE argument completes to.
pub fn services() -> Vec<CompletionCandidate> {
    names()
        .into_iter()
        .map(|(s, _)| CompletionCandidate::new(s))
        .collect()
}

/// The names a SERVICE/BACKEND argument completes to.
pub fn targets() -> Vec<CompletionCandidate> {
    names()
        .into_iter()
        .flat_map(|(s, backends)| {
            backends
                .into_iter()
                .map(move |b| CompletionCandidate::new(format!("{s}/{b}")))
        })
        .collect()
}

/// Every service with its backends: the running crossbar's, else the config's.
fn names() -> Vec<(String, Vec<String>)> {
    let config = Config::load(Path::new(DEFAULT_CONFIG_PATH)).ok();
    let url = std::env::var("CROSSBAR_ADMIN").ok().or_else(|| {
        config
            .as_ref()
            .and_then(|c| c.admin.as_ref())
            .map(|a| crate::config::admin_url(a.listen))
    });
    let url = url.unwrap_or_else(|| super::options::DEFAULT_ADMIN_URL.to_string());
    if let Some(running) = running(&url) {
        return running;
    }
    config.map_or_else(Vec::new, |c| {
        c.services
            .iter()
            .map(|s| {
                (
                    s.name.clone(),
                    s.backends.iter().map(|b| b.name.clone()).collect(),
                )
            })
            .collect()
    })
}

/// The services and backends the crossbar at `url` runs, if it answers in time.
fn running(url: &str) -> Option<Vec<(String, Vec<String>)>> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .ok()?;
    let asked = super::http::request(url, Method::GET, "/api/services", None);
    let body = rt
        .block_on(async { tokio::time::timeout(ASK_TIMEOUT, asked).await })
        .ok()?
        .ok()?;
    let v: ServicesView = serde_json::from_str(&body).ok()?;
    Some(
        v.services
            .into_iter()
            .map(|s| (s.name, s.backends.into_iter().map(|b| b.name).collect()))
            .collect(),
    )
}
