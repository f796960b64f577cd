//! Where a backend's values come from (file < DNS < operator), what the operator
//! set on it, and what a reload kept of that and reset.
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use super::{time, State};

/// Who decided a value a view shows: the config file, DNS (`discover:`), or the
/// operator at run time (`crossbar backend ...`), which wins over both until a
/// reload that changes the backend, or `crossbar backend reset`. Named for any
/// value, not only weights: load feedback, which scales a weight, fits as one
/// more variant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Origin {
    /// The config file (or a default).
    #[default]
    File,
    /// The DNS record the backend came from.
    Dns,
    /// The operator, at run time.
    Operator,
    /// Load feedback, which scaled the weight the others gave
    /// (`effective_origin` only).
    Feedback,
}

impl Origin {
    /// The name on the wire: `file`, `dns`, `operator`, `feedback`.
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::File => "file",
            Origin::Dns => "dns",
            Origin::Operator => "operator",
            Origin::Feedback => "feedback",
        }
    }
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the operator set on a backend and since when (kept in the state file).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorView {
    /// The state set (`drain`, `disabled`, or `up` for enabled against the file's
    /// `disabled: true`), if one was.
    pub state: Option<State>,
    /// The weight set, if one was.
    pub weight: Option<u32>,
    /// When it was set.
    #[serde(with = "time::rfc3339")]
    pub since: SystemTime,
}

/// An operator state a reload kept or reset (`crossbar backend reset` too).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldView {
    /// The service.
    pub service: String,
    /// The backend.
    pub backend: String,
    /// The state the operator had set, if one.
    pub state: Option<State>,
    /// The weight the operator had set, if one.
    pub weight: Option<u32>,
    /// Why it was reset (`null`: kept).
    pub why: Option<String>,
}

impl HeldView {
    /// In a line: `puppet/compile2 weight 5 (the reload changed the backend: ...)`.
    pub fn text(&self) -> String {
        let state = self.state.map(|s| s.as_str());
        let at = format!("{}/{}", self.service, self.backend);
        crate::server::override_text(&at, state, self.weight, self.why.as_deref())
    }
}

/// `POST /api/backends/{service}/{backend}/reset`: back to the file's (and DNS's)
/// values.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResetView {
    /// The service.
    pub service: String,
    /// The backend.
    pub backend: String,
    /// Its state now.
    pub state: State,
    /// Its weight now.
    pub weight: u32,
    /// What the operator had set (`null`: nothing, the reset changed nothing).
    pub reset: Option<HeldView>,
}
