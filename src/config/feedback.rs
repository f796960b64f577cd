//! `feedback:`: a service's load feedback, which scales each backend's weight by
//! what the backend says of its load (a Puppet compiler's JRuby metrics, or an
//! HAProxy agent-check answer); see `crate::feedback`.
use std::path::PathBuf;
use std::time::Duration;

use super::address::server_name;
use super::checker::{join, Checker};
use super::raw::{RawDuration, RawFeedback, RawFeedbackKind, RawPercent};

/// Where Puppet Server publishes its JRuby pool (free JRubies, the queue, the pool
/// lock); `level=debug` adds the borrowed and requested lists whose lengths are
/// the counts used. PE names the service `pe-jruby-metrics`.
pub const DEFAULT_PUPPET_PATH: &str = "/status/v1/services/jruby-metrics?level=debug";
/// Default time between two polls of a backend: the 1-2 s; `level=debug`
/// is not free for the compiler, and a herd builds up over seconds.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);
/// Shortest interval: below it a poll costs the compiler more than it tells.
const MIN_INTERVAL: Duration = Duration::from_millis(100);
/// Longest interval: a sample older than a minute says nothing about a herd.
const MAX_INTERVAL: Duration = Duration::from_secs(60);
/// Default time one poll (connect, TLS, request, answer) may take.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);
/// Longest timeout: one request in flight per backend, so a poll never waits longer.
const MAX_TIMEOUT: Duration = Duration::from_secs(30);
/// Default blackout of a new backend's Puppet samples (Envoy's WRR has one for the
/// same reason: an idle newcomer looks best and would be flooded): 3 samples.
pub const DEFAULT_PUPPET_BLACKOUT: Duration = Duration::from_secs(3);
/// Default time after the last good sample when the configured weight returns.
pub const DEFAULT_EXPIRY: Duration = Duration::from_secs(10);
/// Default smoothing (EWMA time constant) of Puppet samples: a step is 39 % in
/// after one 1 s sample, 86 % after 4 s, so N balancers polling the same compilers
/// do not swing together onto the freest.
pub const DEFAULT_PUPPET_SMOOTHING: Duration = Duration::from_secs(2);
/// Default floor, percent of the weight: a backend that passes its checks keeps a
/// share of new connections whatever its metrics say.
pub const DEFAULT_FLOOR_PERCENT: u32 = 5;
/// Largest `jrubies` target: puppetserver's pools are sized by cores, dozens at most.
pub(crate) const MAX_JRUBIES: u64 = 1024;
/// Largest `queue_limit` (the compilers' `max-queued-requests`).
const MAX_QUEUE_LIMIT: u64 = 1_000_000;
/// Longest `send` string of an agent check (HAProxy's `agent-send`).
pub const MAX_AGENT_SEND: usize = 256;

/// Where a service's feedback comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FeedbackSource {
    /// Puppet Server's JRuby metrics, over TLS.
    Puppet(PuppetFeedback),
    /// HAProxy's agent-check protocol on a TCP port of the backend host.
    Agent(AgentFeedback),
}

/// `kind: puppet`: what to ask and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PuppetFeedback {
    /// Path and query to GET (default [`DEFAULT_PUPPET_PATH`]).
    pub path: String,
    /// CA bundle to verify the compiler; `None`: the https health check's, else none.
    pub ca_file: Option<PathBuf>,
    /// Client certificate and key to present (PEM); `None`: anonymous.
    pub client_cert: Option<(PathBuf, PathBuf)>,
    /// Server name to send and verify; `None`: the health check's rules.
    pub server_name: Option<String>,
    /// The pool size every compiler should reach (`max-active-instances`): one
    /// below it ramps up. `None`: the largest it reported.
    pub jrubies: Option<u32>,
    /// The compilers' `max-queued-requests`: a queue that long is full.
    pub queue_limit: Option<u32>,
    /// Count each compiler's JRubies in its weight (default true), so an idle
    /// compiler of 3 JRubies takes 3 times the new connections of one of 1.
    pub by_pool_size: bool,
}

/// `kind: agent`: HAProxy's agent-check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentFeedback {
    /// The agent's TCP port on the backend's host.
    pub port: u16,
    /// Bytes sent before reading the answer (HAProxy's `agent-send`).
    pub send: Option<String>,
}

/// A service's `feedback:` settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeedbackConfig {
    /// What is polled.
    pub source: FeedbackSource,
    /// Time between the starts of two polls of one backend (default 1 s).
    pub interval: Duration,
    /// Time one poll may take (default 1 s).
    pub timeout: Duration,
    /// A new backend's samples are not used for this long (puppet 3 s, agent 0).
    pub blackout: Duration,
    /// After this long without a good sample the configured weight returns (10 s).
    pub expiry: Duration,
    /// EWMA time constant of the samples (puppet 2 s, agent 0: taken as said).
    pub smoothing: Duration,
    /// Smallest factor, percent of the weight, while the backend passes its checks.
    pub floor_percent: u32,
    /// A resumption whose stuck compiler is saturated is placed like a new session
    /// (puppet only; default on).
    pub saturated_sticky: bool,
}

impl FeedbackConfig {
    /// `puppet` or `agent`.
    pub fn kind(&self) -> &'static str {
        match self.source {
            FeedbackSource::Puppet(_) => "puppet",
            FeedbackSource::Agent(_) => "agent",
        }
    }
}

impl Checker<'_> {
    /// Validate `feedback:` at YAML path `p`.
    pub(super) fn feedback(&mut self, raw: &RawFeedback, p: &str) -> Option<FeedbackConfig> {
        if raw.kind.is_none() {
            self.err(
                p,
                "`kind` is missing: `puppet` (JRuby metrics) or `agent` (agent-check)",
            );
        }
        // Without a kind the rest is still checked, as for `puppet`.
        let puppet = raw.kind != Some(RawFeedbackKind::Agent);
        let interval = self.bounded(
            raw.interval.as_ref(),
            &join(p, "interval"),
            DEFAULT_INTERVAL,
            (MIN_INTERVAL, MAX_INTERVAL),
        );
        let timeout = self.bounded(
            raw.timeout.as_ref(),
            &join(p, "timeout"),
            DEFAULT_TIMEOUT,
            (Duration::from_millis(1), MAX_TIMEOUT),
        );
        let blackout = self.duration(
            raw.blackout.as_ref(),
            &join(p, "blackout"),
            if puppet {
                DEFAULT_PUPPET_BLACKOUT
            } else {
                Duration::ZERO
            },
            false,
        );
        let expiry = self.duration(
            raw.expiry.as_ref(),
            &join(p, "expiry"),
            DEFAULT_EXPIRY,
            true,
        );
        if expiry <= interval {
            self.err(
                &join(p, "expiry"),
                "must be longer than `interval`: every sample would expire before the next",
            );
        }
        let smoothing = self.duration(
            raw.smoothing.as_ref(),
            &join(p, "smoothing"),
            if puppet {
                DEFAULT_PUPPET_SMOOTHING
            } else {
                Duration::ZERO
            },
            false,
        );
        let floor_percent = self.percent(raw.floor.as_ref(), &join(p, "floor"));
        let sticky = raw.saturated_sticky;
        if !puppet && sticky == Some(true) {
            self.err(
                &join(p, "saturated_sticky"),
                "applies only to `kind: puppet`: an agent's answer says nothing of a queue",
            );
        }
        let source = if puppet {
            FeedbackSource::Puppet(self.puppet_feedback(raw, p))
        } else {
            FeedbackSource::Agent(self.agent_feedback(raw, p)?)
        };
        raw.kind?;
        Some(FeedbackConfig {
            source,
            interval,
            timeout,
            blackout,
            expiry,
            smoothing,
            floor_percent,
            saturated_sticky: puppet && sticky.unwrap_or(true),
        })
    }

    /// A duration within `(lo, hi)`, or `default`.
    fn bounded(
        &mut self,
        v: Option<&RawDuration>,
        path: &str,
        default: Duration,
        (lo, hi): (Duration, Duration),
    ) -> Duration {
        let d = self.duration(v, path, default, true);
        if d < lo || d > hi {
            let (lo, hi) = (
                humantime::format_duration(lo),
                humantime::format_duration(hi),
            );
            self.err(path, format!("must be between {lo} and {hi}"));
            return default;
        }
        d
    }

    /// `floor:` as `N%`, 1..=100.
    fn percent(&mut self, v: Option<&RawPercent>, path: &str) -> u32 {
        let text = match v {
            None => return DEFAULT_FLOOR_PERCENT,
            Some(RawPercent::Bare(n)) => {
                self.err(
                    path,
                    format!("a percentage needs its sign: write {n}%, not {n}"),
                );
                return DEFAULT_FLOOR_PERCENT;
            }
            Some(RawPercent::Text(t)) => t,
        };
        match text
            .trim()
            .strip_suffix('%')
            .map(|n| n.trim().parse::<u32>())
        {
            Some(Ok(n)) if (1..=100).contains(&n) => n,
            _ => {
                self.err(
                    path,
                    format!("`{text}` is not a percentage from 1% to 100% (e.g. 5%)"),
                );
                DEFAULT_FLOOR_PERCENT
            }
        }
    }

    fn puppet_feedback(&mut self, raw: &RawFeedback, p: &str) -> PuppetFeedback {
        if raw.port.is_some() || raw.send.is_some() {
            let key = if raw.port.is_some() { "port" } else { "send" };
            self.err(
                &join(p, key),
                format!("`{key}` applies only to `kind: agent`"),
            );
        }
        let path = match &raw.path {
            Some(path) if !path.starts_with('/') => {
                self.err(&join(p, "path"), format!("`{path}` must start with `/`"));
                DEFAULT_PUPPET_PATH.to_string()
            }
            Some(path) => path.clone(),
            None => DEFAULT_PUPPET_PATH.to_string(),
        };
        let server_name = raw
            .server_name
            .as_ref()
            .and_then(|sn| match server_name(sn) {
                Ok(sn) if !sn.starts_with('*') => Some(sn),
                Ok(_) => {
                    self.err(
                        &join(p, "server_name"),
                        "a server name to verify cannot be a wildcard",
                    );
                    None
                }
                Err(why) => {
                    self.err(&join(p, "server_name"), why);
                    None
                }
            });
        self.cert_and_key(raw.client_cert.is_some(), raw.client_key.is_some(), p);
        let count = |c: &mut Self, v: Option<u64>, key: &str, hi: u64| {
            v.map(|n| c.int(Some(n), &join(p, key), 1, 1, hi) as u32)
        };
        PuppetFeedback {
            path,
            ca_file: raw.ca_file.clone(),
            client_cert: raw.client_cert.clone().zip(raw.client_key.clone()),
            server_name,
            jrubies: count(self, raw.jrubies, "jrubies", MAX_JRUBIES),
            queue_limit: count(self, raw.queue_limit, "queue_limit", MAX_QUEUE_LIMIT),
            by_pool_size: raw.by_pool_size.unwrap_or(true),
        }
    }

    fn agent_feedback(&mut self, raw: &RawFeedback, p: &str) -> Option<AgentFeedback> {
        for (key, set) in raw.puppet_keys() {
            if set {
                self.err(
                    &join(p, key),
                    format!("`{key}` applies only to `kind: puppet`"),
                );
            }
        }
        if let Some(send) = &raw.send {
            if send.len() > MAX_AGENT_SEND
                || send
                    .bytes()
                    .any(|b| b != b'\n' && b != b'\t' && !(0x20..0x7f).contains(&b))
            {
                self.err(&join(p, "send"), format!("must be at most {MAX_AGENT_SEND} printable ASCII characters (and newlines)"));
            }
        }
        let Some(port) = raw.port else {
            self.err(
                p,
                "`kind: agent` needs `port:`, the agent's TCP port on each backend's host",
            );
            return None;
        };
        let port = self.int(Some(port), &join(p, "port"), 0, 1, 65535) as u16;
        (port != 0).then(|| AgentFeedback {
            port,
            send: raw.send.clone(),
        })
    }
}
