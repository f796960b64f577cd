//! `crossbar doctor`: connects to every backend of a configuration and reports
//! what will break agents before traffic is switched: certificates (names agents
//! dial, issuer, expiry), the Puppet CA each backend serves, TLS versions and how
//! stickiness will work, the status page, and which relay each service uses here.
//!
//! Findings carry a severity; the exit code is 0 (clean), 1 (warnings) or 2
//! (errors), so the command can gate CI or run as `ExecStartPre`.
//!
//! - [`inspect`]: what one backend shows (handshakes, chain, probes, status).
//! - [`findings`]: per backend and per service rules over those inspections.
//! - [`render`]: the table and the JSON.
mod findings;
mod inspect;
mod render;

use serde::Serialize;

pub use crate::health::CertInfo;
pub use inspect::{CaCert, CheckOutcome, FeedbackProbe, Inspection, StatusAnswer, TicketKey};

use crate::config::Config;

/// A certificate expiring within this many days is a warning: Puppet's own
/// certificate-expiry alerting uses the same 30-day window.
pub const EXPIRY_WARNING_DAYS: i64 = 30;

/// What the operator asked for.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// Ask the status page of backends without an `https` check too.
    pub status: bool,
    /// Every column in the table (subject, names, issuer, stickiness, status).
    pub wide: bool,
}

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Worth knowing; does not change the exit code.
    Info,
    /// Some agents or some of the time will fail, or soon: exit 1.
    Warning,
    /// Agents will fail: exit 2.
    Error,
}

/// One thing the doctor found.
#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    /// How bad.
    pub severity: Severity,
    /// The service.
    pub service: String,
    /// The backend, when the finding is about one.
    pub backend: Option<String>,
    /// What is wrong and how to fix it.
    pub message: String,
}

/// One backend's inspection, with where it belongs.
#[derive(Debug, Clone, Serialize)]
pub struct BackendReport {
    /// The service.
    pub service: String,
    /// The backend.
    pub backend: String,
    /// A backup (standby) backend.
    pub backup: bool,
    /// What it showed.
    #[serde(flatten)]
    pub inspection: Inspection,
}

/// The relay one service will use on this machine.
#[derive(Debug, Clone, Serialize)]
pub struct ServiceRelay {
    /// The service.
    pub service: String,
    /// Which relay and why.
    #[serde(flatten)]
    pub plan: crate::relay::RelayPlan,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The configuration file.
    pub config: String,
    /// Every service's relay and why (`relay:` as configured).
    pub relays: Vec<ServiceRelay>,
    /// Every backend, in configuration order.
    pub backends: Vec<BackendReport>,
    /// Findings, most severe first.
    pub findings: Vec<Finding>,
    /// Count of error findings.
    pub errors: usize,
    /// Count of warning findings.
    pub warnings: usize,
    /// 0 clean, 1 warnings, 2 errors.
    pub exit_code: u8,
    /// The table shows every column.
    #[serde(skip)]
    pub wide: bool,
}

impl Report {
    /// The table and findings, for a terminal.
    pub fn table(&self) -> String {
        render::table(self)
    }

    /// The report as JSON.
    pub fn json(&self) -> String {
        render::json(self)
    }
}

/// Inspect every backend of `config` (all at once) and judge what was seen.
/// `dns` is what the `discover` names resolved to: a service left with no backend,
/// a record naming crossbar itself, are errors.
pub async fn run(config: &Config, opts: Options, dns: &crate::discovery::Resolved) -> Report {
    let mut tasks = tokio::task::JoinSet::new();
    for (s, svc) in config.services.iter().enumerate() {
        for (i, b) in svc.backends.iter().enumerate() {
            let (svc, b) = (svc.clone(), b.clone());
            tasks.spawn(async move {
                let seen = inspect::inspect(&svc, &b, opts.status).await;
                ((s, i), seen)
            });
        }
    }
    let mut seen = Vec::new();
    while let Some(r) = tasks.join_next().await {
        match r {
            Ok(x) => seen.push(x),
            Err(e) => tracing::error!("doctor: a backend inspection failed: {e}"),
        }
    }
    seen.sort_by_key(|(at, _)| *at);
    let backends: Vec<BackendReport> = seen
        .into_iter()
        .map(|((s, i), inspection)| {
            let (svc, b) = (&config.services[s], &config.services[s].backends[i]);
            BackendReport {
                service: svc.name.clone(),
                backend: b.name.clone(),
                backup: b.backup,
                inspection,
            }
        })
        .collect();
    let mut findings = findings::judge(config, &backends);
    if let Some(why) = config
        .state_file
        .as_deref()
        .and_then(crate::server::state_file_problem)
    {
        findings.push(Finding {
            severity: Severity::Warning,
            service: "state_file".into(),
            backend: None,
            message: why,
        });
    }
    for (service, message) in dns.no_backend.iter().chain(&dns.own) {
        findings.push(Finding {
            severity: Severity::Error,
            service: service.clone(),
            backend: None,
            message: message.clone(),
        });
    }
    report(config, backends, findings, opts)
}

fn report(
    config: &Config,
    backends: Vec<BackendReport>,
    mut findings: Vec<Finding>,
    opts: Options,
) -> Report {
    findings.sort_by_key(|f| std::cmp::Reverse(f.severity));
    let count = |s| findings.iter().filter(|f| f.severity == s).count();
    let (errors, warnings) = (count(Severity::Error), count(Severity::Warning));
    let exit_code = match (errors, warnings) {
        (0, 0) => 0,
        (0, _) => 1,
        _ => 2,
    };
    let relays = config
        .services
        .iter()
        .map(|s| ServiceRelay {
            service: s.name.clone(),
            plan: crate::relay::plan(s.relay),
        })
        .collect();
    Report {
        config: config.source.display().to_string(),
        relays,
        backends,
        findings,
        errors,
        warnings,
        exit_code,
        wide: opts.wide,
    }
}
