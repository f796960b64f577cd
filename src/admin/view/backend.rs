//! A backend in `GET /api/services`: its state, health, weight, counters and last
//! check; and what a reader derives from them (failing now, takes new connections,
//! why not, the operator's next step), once, so the status page and `crossbar
//! status` say the same thing.
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use super::{time, Bytes, FeedbackView, Handshakes};
use crate::balance::State;

/// Where a backend comes from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendSource {
    /// Listed in the config file.
    #[default]
    Config,
    /// Found in DNS (`discover:`).
    Dns,
}

/// A backend's active health check.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CheckKind {
    /// No active check.
    None,
    /// A TCP connect.
    Tcp,
    /// A TLS handshake.
    #[default]
    TlsHello,
    /// An HTTPS request.
    Https,
}

impl CheckKind {
    /// The name on the wire: `none`, `tcp`, `tls-hello`, `https`.
    pub fn as_str(self) -> &'static str {
        match self {
            CheckKind::None => "none",
            CheckKind::Tcp => "tcp",
            CheckKind::TlsHello => "tls-hello",
            CheckKind::Https => "https",
        }
    }
}

impl std::fmt::Display for CheckKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A check's result.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckResult {
    /// Passed.
    #[default]
    Ok,
    /// Failed (`error` says why).
    Fail,
}

/// The last active check of a backend.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckView {
    /// When it finished.
    #[serde(with = "time::rfc3339")]
    pub at: SystemTime,
    /// Seconds since.
    pub seconds_ago: u64,
    /// Passed or failed.
    pub result: CheckResult,
    /// Why it failed.
    pub error: Option<String>,
}

/// One backend.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BackendView {
    /// Its name.
    pub name: String,
    /// `host:port`.
    pub address: String,
    /// Listed in the file or found in DNS.
    pub source: BackendSource,
    /// The DNS name it came from.
    pub dns_name: Option<String>,
    /// Its state.
    pub state: State,
    /// When it entered that state.
    #[serde(with = "time::rfc3339")]
    pub state_since: SystemTime,
    /// Seconds since.
    pub state_seconds: u64,
    /// Takes new connections (sticky hits included: weight 0 is available).
    pub available: bool,
    /// Passes its health checks, whatever the operator set.
    pub healthy: bool,
    /// Connections open now.
    pub active_connections: u32,
    /// Most connections open at once (the peak, not a limit: that is
    /// `max_connections`).
    pub peak_connections: u32,
    /// Its connection limit now: `max_connections`, lowered by its agent's
    /// `maxconn` while that holds (`null`: unlimited). At the limit, new
    /// connections go to another backend or wait in the service's queue.
    #[serde(default)]
    pub max_connections: Option<u32>,
    /// Connections relayed.
    pub connections_total: u64,
    /// The weight before load feedback: the file's, DNS's or the operator's.
    pub weight: u32,
    /// The file's weight (or the SRV record's, for a backend from DNS).
    pub configured_weight: u32,
    /// Who set `weight`: `file`, `dns` (the SRV record) or `operator`.
    #[serde(default)]
    pub weight_origin: super::Origin,
    /// Who set the state's operator part: `file` (`disabled:`, or enabled by
    /// default), `operator`, or `dns` (it left DNS: `drain (left DNS)`).
    #[serde(default)]
    pub state_origin: super::Origin,
    /// What the operator set on it (`null`: nothing; the file's and DNS's values hold).
    #[serde(default)]
    pub operator: Option<super::OperatorView>,
    /// It left DNS: it drains (or, while no listed backend can take new
    /// connections, still serves) and is listed until its last connection ends.
    #[serde(default)]
    pub left_dns: bool,
    /// The weight new connections are balanced by now: `weight` times the load
    /// feedback factor.
    pub effective_weight: f64,
    /// Who decided it: `weight_origin`, or `feedback` while a factor applies.
    #[serde(default)]
    pub effective_origin: super::Origin,
    /// Its load feedback (`null` without `feedback:`).
    pub feedback: Option<FeedbackView>,
    /// Used only when no primary is available.
    pub backup: bool,
    /// Bytes relayed each way.
    pub bytes: Bytes,
    /// Failed connects.
    pub connect_errors: u64,
    /// Its active check.
    pub check: CheckKind,
    /// Failed active checks.
    pub check_failures: u64,
    /// The last active check (`null` until one ran).
    pub last_check: Option<CheckView>,
    /// TLS handshakes through it.
    pub handshakes: Handshakes,
    /// Its slow-start ramp while one is under way (absent otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slow_start: Option<RampView>,
}

/// A slow-start ramp under way: a recovered backend takes new connections in
/// proportion to how far along it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RampView {
    /// How far along, in percent of its weight (0..=99).
    pub percent: u8,
    /// Seconds of the ramp left.
    pub seconds_left: u64,
    /// The whole ramp (`slow_start`), in seconds.
    pub seconds_total: u64,
}

impl RampView {
    /// The ramp in words, as the page and the CLI say it: `ramp 40%, 12s left`.
    pub fn text(&self) -> String {
        format!(
            "ramp {}%, {} left",
            self.percent,
            crate::admin::human::human_secs(self.seconds_left)
        )
    }
}

impl Default for BackendView {
    fn default() -> BackendView {
        BackendView {
            name: String::new(),
            address: String::new(),
            source: BackendSource::Config,
            dns_name: None,
            state: State::Up,
            state_since: SystemTime::UNIX_EPOCH,
            state_seconds: 0,
            available: true,
            healthy: true,
            active_connections: 0,
            peak_connections: 0,
            max_connections: None,
            connections_total: 0,
            weight: 1,
            configured_weight: 1,
            weight_origin: super::Origin::File,
            state_origin: super::Origin::File,
            operator: None,
            left_dns: false,
            effective_weight: 1.0,
            effective_origin: super::Origin::File,
            feedback: None,
            backup: false,
            bytes: Bytes::default(),
            connect_errors: 0,
            check: CheckKind::TlsHello,
            check_failures: 0,
            last_check: None,
            handshakes: Handshakes::default(),
            slow_start: None,
        }
    }
}

/// What the operator usually does next with a backend, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NextStep {
    /// Why this step (`draining; to put it back in rotation`).
    pub why: &'static str,
    /// The command after `crossbar backend ` (`enable puppet/compile1`).
    pub command: String,
}

impl BackendView {
    /// Takes new connections from the balancing: available, and not at weight 0
    /// (which leaves it sticky hits only).
    pub fn takes_new(&self) -> bool {
        self.available && self.weight != 0
    }

    /// Failing now: marked down, or its last active check failed.
    pub fn failing(&self) -> bool {
        !self.healthy || self.last_check_failed()
    }

    fn last_check_failed(&self) -> bool {
        self.last_check
            .as_ref()
            .is_some_and(|c| c.result == CheckResult::Fail)
    }

    /// Its weight was set at run time (`crossbar backend weight`).
    pub fn weight_set_at_run_time(&self) -> bool {
        self.weight_origin == super::Origin::Operator || self.weight != self.configured_weight
    }

    /// Who set the state, when it is not the plain default: `left DNS`,
    /// `operator`, `file` (the file's `disabled: true`).
    pub fn state_note(&self) -> Option<&'static str> {
        match (self.state_origin, self.state) {
            (super::Origin::Dns, _) => Some("left DNS"),
            (super::Origin::Operator, State::Up | State::Down) => Some("enabled by the operator"),
            (super::Origin::File, State::Disabled) => Some("file"),
            _ if self.left_dns => Some("left DNS, serving until a listed backend can"),
            _ => None,
        }
    }

    /// Who set the weight, when not the file: `dns` (the SRV record), or
    /// `operator; file 2` (`operator; dns 5` for a backend from DNS: the weight
    /// under the operator's is the SRV record's, not the file's).
    pub fn weight_note(&self) -> Option<String> {
        match self.weight_origin {
            super::Origin::File if !self.weight_set_at_run_time() => None,
            super::Origin::Dns if !self.weight_set_at_run_time() => Some("dns".into()),
            _ => Some(format!(
                "operator; {} {}",
                self.weight_source(),
                self.configured_weight
            )),
        }
    }

    /// Where its weight comes from without the operator: `file` or `dns`.
    pub fn weight_source(&self) -> &'static str {
        match self.source {
            BackendSource::Dns => "dns",
            BackendSource::Config => "file",
        }
    }

    /// It left DNS and drains: nothing the operator sets puts it back in rotation
    /// (it leaves the pool when its last connection ends; listing it in DNS again
    /// brings it back).
    pub fn draining_out_of_dns(&self) -> bool {
        self.state == State::Drain && self.state_origin == super::Origin::Dns
    }

    /// Open connections and the limit, as the CLI and the page show them: `12/20`,
    /// or `12` while unlimited.
    pub fn connections_text(&self) -> String {
        match self.max_connections {
            Some(max) => format!("{}/{max}", self.active_connections),
            None => self.active_connections.to_string(),
        }
    }

    /// At its connection limit: new connections go elsewhere or queue.
    pub fn at_limit(&self) -> bool {
        self.max_connections
            .is_some_and(|max| self.active_connections >= max)
    }

    /// Its health in a word: `up`, or `DOWN` while failing.
    pub fn health(&self) -> &'static str {
        if self.failing() {
            "DOWN"
        } else {
            "up"
        }
    }

    /// Why it takes no new connection, for the no-backend banner: `DOWN: its tcp
    /// check fails`, `DRAINED by the operator (health up)`.
    pub fn why_unavailable(&self) -> String {
        // The backend's row has the check's error in full; here, only which check.
        let health = match (self.failing(), self.last_check_failed()) {
            (false, _) => "health up".to_string(),
            (true, true) => format!("its {} check fails", self.check),
            (true, false) => "health DOWN".into(),
        };
        match self.state {
            State::Down => format!("DOWN: {health}"),
            State::Drain if self.state_origin == super::Origin::Dns => {
                format!("DRAINING: it left DNS ({health})")
            }
            State::Drain => format!("DRAINED by the operator ({health})"),
            State::Disabled if self.state_origin == super::Origin::File => {
                format!("DISABLED in the file ({health})")
            }
            State::Disabled => format!("DISABLED by the operator ({health})"),

            State::Standby => "in STANDBY: recovered, waiting for manual failback".into(),
            State::Up if self.weight == 0 => {
                "at WEIGHT 0 by the operator (sticky clients only)".into()
            }
            State::Up => "up".into(),
        }
    }

    /// The CLI command for the usual next step from its state, if any.
    pub fn next_step(&self, service: &str) -> Option<NextStep> {
        let target = format!("{service}/{}", self.name);
        if self.draining_out_of_dns() {
            // `enable` would not help: it is refused for a backend that left DNS.
            return None;
        }
        let (why, command) = match self.state {
            State::Standby => (
                "recovered primary held back (failback: manual); to hand traffic back",
                format!("enable {target}"),
            ),
            State::Drain => (
                "draining; to put it back in rotation",
                format!("enable {target}"),
            ),
            State::Disabled => (
                "in maintenance; to put it back in rotation",
                format!("enable {target}"),
            ),
            _ if self.weight_set_at_run_time() => (
                match self.source {
                    BackendSource::Dns => "weight set at run time (kept across reloads and DNS changes that leave the backend alone); to return to DNS's",
                    BackendSource::Config => "weight set at run time (kept across reloads that leave the backend alone); to return to the file's",
                },
                format!("reset {target}"),
            ),
            _ => return None,
        };
        Some(NextStep { why, command })
    }
}
