//! Why a feedback poll failed, the metric label of each cause, and the one fix
//! `crossbar doctor` names for it.
use std::io;
use std::time::Duration;

use super::agent::AgentError;
use super::puppet::DocumentError;
use crate::config::{FeedbackConfig, FeedbackSource};

/// Why a poll of a backend gave no sample (its weight falls back to the
/// configured one once the last good sample expires).
#[derive(Debug, thiserror::Error)]
pub enum FeedbackError {
    /// A file the poll needs (CA, client certificate or key) can't be used.
    #[error("setup: {0}")]
    Setup(String),
    /// The TCP connect failed.
    #[error("connect: {0}")]
    Connect(io::Error),
    /// The TLS handshake failed.
    #[error("TLS: {0}")]
    Tls(io::Error),
    /// The poll took longer than `feedback.timeout`.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The HTTP exchange failed (closed, malformed).
    #[error("HTTP: {0}")]
    Http(String),
    /// 401 or 403: the compiler's auth.conf does not let this client read it.
    #[error("answered {0}: the compiler's auth.conf refuses this client")]
    Refused(u16),
    /// Another status than 200.
    #[error("answered HTTP {0}")]
    Status(u16),
    /// The answer is larger than crossbar reads.
    #[error("the answer is larger than {0} bytes")]
    TooLarge(usize),
    /// The body is not a jruby-metrics document.
    #[error("{0}")]
    Document(#[from] DocumentError),
    /// The agent's answer was refused.
    #[error("{0}")]
    Agent(#[from] AgentError),
    /// A jruby-metrics document that parses but can't be true (more free JRubies
    /// than the pool, a pool above `feedback.jrubies` or any compiler's):
    /// refused like a bad document (see [`crate::feedback::weight::implausible`]).
    #[error("{0}")]
    Implausible(String),
    /// Reading or writing the agent's socket failed.
    #[error("i/o: {0}")]
    Io(io::Error),
}

impl FeedbackError {
    /// The `result` label of `crossbar_backend_feedback_polls_total` (one of
    /// [`crate::metrics::FEEDBACK_POLL_RESULTS`]).
    pub fn reason(&self) -> &'static str {
        match self {
            FeedbackError::Setup(_) => "setup",
            FeedbackError::Connect(_) => "connect",
            FeedbackError::Tls(_) => "tls",
            FeedbackError::Timeout(_) => "timeout",
            FeedbackError::Http(_) | FeedbackError::Io(_) => "http",
            FeedbackError::Refused(_) => "refused",
            FeedbackError::Status(_) => "status",
            FeedbackError::TooLarge(_) => "too_large",
            FeedbackError::Document(_)
            | FeedbackError::Agent(_)
            | FeedbackError::Implausible(_) => "bad_answer",
        }
    }

    /// The one change that makes the poll succeed, in the words `crossbar doctor`
    /// prints after the reason.
    pub fn fix(&self, cfg: &FeedbackConfig) -> String {
        let puppet = match &cfg.source {
            FeedbackSource::Puppet(p) => Some(p),
            FeedbackSource::Agent(_) => None,
        };
        match (self, puppet) {
            (FeedbackError::Refused(_), Some(p)) if p.client_cert.is_none() => {
                "jruby-metrics needs a certificate on this compiler: set feedback.client_cert and \
                 feedback.client_key (a certificate from the Puppet CA)"
                    .into()
            }
            (FeedbackError::Refused(_), Some(_)) => {
                "the compiler's auth.conf refuses feedback.client_cert: add its certname to the \
                 rule \"puppetlabs status service - full\" (path /status/v1/services)"
                    .into()
            }
            (FeedbackError::Status(404), Some(_)) => {
                "no jruby-metrics service at feedback.path: this is not a compiler (a CA or \
                 PuppetDB has no JRuby pool: turn feedback off for this service), or set \
                 feedback.path (PE: /status/v1/services/pe-jruby-metrics?level=debug)"
                    .into()
            }
            (FeedbackError::Document(DocumentError::NoQueue), Some(_)) => {
                "add `?level=debug` to feedback.path: without it the document has no queue".into()
            }
            (FeedbackError::Document(_) | FeedbackError::TooLarge(_), Some(_)) => {
                "feedback.path does not serve Puppet's jruby-metrics: point it at \
                 /status/v1/services/jruby-metrics?level=debug"
                    .into()
            }
            (FeedbackError::Timeout(_), _) => {
                format!(
                    "raise feedback.timeout (now {:?}) or find why the backend answers slowly",
                    cfg.timeout
                )
            }
            (FeedbackError::Connect(_), Some(_)) => {
                "the compiler is unreachable: its health check says more".into()
            }
            (FeedbackError::Connect(_), None) => {
                "nothing answers on feedback.port: start the agent or correct the port".into()
            }
            (FeedbackError::Tls(_), _) => {
                "set feedback.ca_file to the Puppet CA and feedback.server_name to a name in the \
                 compiler's certificate (or the health check's)"
                    .into()
            }
            (FeedbackError::Setup(_), _) => "correct the file named above".into(),
            (FeedbackError::Implausible(_), _) => {
                "the compiler reports a pool it can't have: correct feedback.jrubies if its pool \
                 was enlarged, else check that feedback.path reaches this compiler's own \
                 puppetserver (not a proxy or another service)"
                    .into()
            }
            (FeedbackError::Agent(_), _) => {
                "feedback.port is not an HAProxy agent: it must answer a line such as `up 75%`"
                    .into()
            }
            (FeedbackError::Status(_) | FeedbackError::Http(_) | FeedbackError::Io(_), _)
            | (
                FeedbackError::Document(_) | FeedbackError::TooLarge(_) | FeedbackError::Refused(_),
                None,
            ) => "see the compiler's log for why it refused the request".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::FEEDBACK_POLL_RESULTS;

    #[test]
    fn the_metric_lists_every_reason() {
        let io = || io::Error::other("x");
        for e in [
            FeedbackError::Setup(String::new()),
            FeedbackError::Connect(io()),
            FeedbackError::Tls(io()),
            FeedbackError::Timeout(Duration::ZERO),
            FeedbackError::Http(String::new()),
            FeedbackError::Refused(403),
            FeedbackError::Status(500),
            FeedbackError::TooLarge(1),
            FeedbackError::Document(DocumentError::NoQueue),
            FeedbackError::Agent(AgentError::Empty),
            FeedbackError::Io(io()),
            FeedbackError::Implausible(String::new()),
        ] {
            assert!(
                FEEDBACK_POLL_RESULTS.contains(&e.reason()),
                "{}",
                e.reason()
            );
        }
    }
}
