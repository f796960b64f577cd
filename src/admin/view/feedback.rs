//! Load feedback in `GET /api/services`: where a backend's weight comes from, the
//! weight new connections are balanced by, and its last sample; and the words the
//! status page and `crossbar status` both say about them.
use serde::{Deserialize, Serialize};

use super::FeedbackPhase;

/// What is polled.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FeedbackKind {
    /// Puppet Server's JRuby metrics.
    #[default]
    Puppet,
    /// An HAProxy agent-check.
    Agent,
}

/// The last good answer of a backend.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum FeedbackSample {
    /// A compiler's `jruby-metrics`.
    Puppet {
        /// `num-jrubies`.
        jrubies: u32,
        /// `num-free-jrubies`.
        free: u32,
        /// Requests waiting for a JRuby.
        queued: u32,
        /// JRubies lent out.
        borrowed: u32,
        /// `not-in-use`, `requested` or `acquired`.
        lock: String,
        /// `queue-limit-hit-count`: 503s since the compiler started.
        queue_limit_hits: u64,
    },
    /// An agent's words in effect (`up 75% maxconn:30`).
    Agent {
        /// The words.
        words: String,
    },
}

/// A backend's load feedback.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FeedbackView {
    /// Where it stands.
    pub phase: FeedbackPhase,
    /// The factor its weight is multiplied by (1: the weight as set).
    pub factor: f64,
    /// Saturated: a resumption stuck to it is placed like a new session.
    pub saturated: bool,
    /// The last good answer (`null` before the first).
    pub sample: Option<FeedbackSample>,
    /// Milliseconds since it.
    pub sample_age_ms: Option<u64>,
    /// 503s between the last two samples.
    pub refused_since_last: bool,
    /// The pool size it should reach (puppet: the target or the largest seen).
    pub expected_jrubies: Option<u32>,
    /// The connection limit its agent set.
    pub max_connections: Option<u32>,
    /// Why the last poll failed (the last good sample holds until it expires).
    pub error: Option<String>,
    /// Seconds polls have been failing.
    pub failing_seconds: Option<u64>,
}

/// A service's `feedback:` settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FeedbackSettings {
    /// What is polled.
    pub kind: FeedbackKind,
    /// Milliseconds between polls of a backend.
    pub interval_ms: u64,
    /// Smallest factor, percent, while a backend passes its checks.
    pub floor_percent: u32,
    /// Saturated compilers' resumptions are placed like new sessions.
    pub saturated_sticky: bool,
}

impl FeedbackSettings {
    /// The interval as an operator writes it: `1s`, `250ms`.
    pub fn interval_text(&self) -> String {
        match self.interval_ms % 1000 {
            0 => format!("{}s", self.interval_ms / 1000),
            _ => format!("{}ms", self.interval_ms),
        }
    }

    /// `puppet` or `agent`.
    pub fn kind_str(&self) -> &'static str {
        match self.kind {
            FeedbackKind::Puppet => "puppet",
            FeedbackKind::Agent => "agent",
        }
    }
}

/// What a backend's load feedback says in one word, by meaning: the word the
/// status page draws in its row, in a colour of its own (only [`Self::Fine`] in
/// the colour of health).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FeedbackCondition {
    /// Its samples set its weight and it has room.
    Fine,
    /// Polls fail now (the last good sample holds until it expires).
    Failing,
    /// No free JRuby and a full queue, or 503s since the sample before.
    Saturated,
    /// Its JRuby pool is locked (a code deploy): the minimum factor.
    Locked,
    /// Its agent said drain, maint or down: the minimum factor.
    Stopped,
    /// Not used yet: no sample, or sampled for less than `blackout`.
    Settling(FeedbackPhase),
    /// Its pool is filling: the factor ramps with it.
    Ramping,
    /// No good sample for `expiry`: the configured weight again.
    Expired,
}

impl FeedbackCondition {
    /// The word: alarms in capitals, as `health DOWN` is.
    pub fn word(self) -> &'static str {
        match self {
            Self::Fine => "ok",
            Self::Failing => "FAILING",
            Self::Saturated => "SATURATED",
            Self::Locked => "locked",
            Self::Stopped => "stopped",
            Self::Settling(p) => p.as_str(),
            Self::Ramping => "ramping",
            Self::Expired => "expired",
        }
    }
}

impl FeedbackView {
    /// Its condition: a failing poll first, then saturation, then the phase.
    pub fn condition(&self) -> FeedbackCondition {
        if self.error.is_some() {
            return FeedbackCondition::Failing;
        }
        if self.saturated {
            return FeedbackCondition::Saturated;
        }
        match self.phase {
            FeedbackPhase::Active => FeedbackCondition::Fine,
            FeedbackPhase::Locked => FeedbackCondition::Locked,
            FeedbackPhase::Stopped => FeedbackCondition::Stopped,
            FeedbackPhase::Ramping => FeedbackCondition::Ramping,
            FeedbackPhase::Expired => FeedbackCondition::Expired,
            p @ (FeedbackPhase::Waiting | FeedbackPhase::Blackout) => {
                FeedbackCondition::Settling(p)
            }
        }
    }

    /// The sample in words: `0/1 JRubies free, 2 queued` or the agent's words, with
    /// its age; `no sample yet`.
    pub fn sample_text(&self) -> String {
        let age = match self.sample_age_ms {
            Some(ms) => format!(", {:.1}s ago", ms as f64 / 1000.0),
            None => String::new(),
        };
        match &self.sample {
            None => "no sample yet".into(),
            Some(FeedbackSample::Puppet {
                jrubies,
                free,
                queued,
                borrowed,
                lock,
                ..
            }) => {
                let lock = match lock.as_str() {
                    "not-in-use" => String::new(),
                    other => format!(", pool lock {other}"),
                };
                // JRubies still being created are neither free nor borrowed.
                let ready = (free + borrowed).min(*jrubies);
                let pool = match self.expected_jrubies {
                    Some(e) if e > ready => format!(" (pool filling: {ready} of {e} up)"),
                    _ => String::new(),
                };
                let refused = if self.refused_since_last {
                    ", 503s since the last"
                } else {
                    ""
                };
                format!("{free}/{jrubies} JRubies free{pool}, {queued} queued{lock}{refused}{age}")
            }
            Some(FeedbackSample::Agent { words }) => format!("agent: {words}{age}"),
        }
    }

    /// The sample in a few words, for a table cell: `0/1 free, 2 queued`, the
    /// agent's words, or `no sample yet`.
    pub fn sample_short(&self) -> String {
        match &self.sample {
            None => "no sample yet".into(),
            Some(FeedbackSample::Puppet {
                jrubies,
                free,
                queued,
                ..
            }) => format!("{free}/{jrubies} free, {queued} queued"),
            Some(FeedbackSample::Agent { words }) => words.clone(),
        }
    }

    /// One line: `x0.35 active: 0/1 JRubies free, 2 queued, 1.0s ago; SATURATED`,
    /// then the failure when polls fail.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "x{:.2} {}: {}",
            self.factor,
            self.phase.as_str(),
            self.sample_text()
        );
        if self.saturated {
            s.push_str("; SATURATED (resumptions placed like new sessions)");
        }
        if let Some(n) = self.max_connections {
            s.push_str(&format!("; agent maxconn {n}"));
        }
        if let Some(e) = &self.error {
            let for_s = self
                .failing_seconds
                .map_or(String::new(), |s| format!(" for {s}s"));
            s.push_str(&format!("; FAILING{for_s}: {e}"));
        }
        s
    }
}
