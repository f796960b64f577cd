//! Which relay a service gets, and why: what `crossbar check`, `crossbar doctor`
//! and the start-up log say per service.
use crate::config::RelayMode;

/// Which relay a service gets on this machine, and why: what `crossbar check` and
/// `crossbar doctor` print.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RelayPlan {
    /// `splice-auto`, for now the only relay.
    pub relay: &'static str,
    /// The configured mode and why it means that relay.
    pub why: String,
}

impl RelayPlan {
    /// The relay and why, without saying the relay twice: `splice-auto (the
    /// default)`, `splice-auto (relay: auto chooses ...)`.
    pub fn describe(&self) -> String {
        let said = format!("relay: {} ", self.relay);
        match self.why.strip_prefix(&said) {
            Some(rest) => format!("{} {rest}", self.relay),
            None => format!("{} ({})", self.relay, self.why),
        }
    }
}

/// The relay a service configured with `mode` uses here.
pub fn plan(mode: RelayMode) -> RelayPlan {
    let why = match mode {
        RelayMode::SpliceAuto => "relay: splice-auto (the default)",
        RelayMode::Auto => AUTO_WHY,
    };
    RelayPlan {
        relay: "splice-auto",
        why: why.into(),
    }
}

/// Why `relay: auto` chooses splice-auto on every machine for now.
const AUTO_WHY: &str = "relay: auto chooses splice-auto: it is the only relay since the \
                        kernel (BPF sockmap) relay was retired (docs/performance.md)";
