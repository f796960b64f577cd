//! A backend's one [`State`] and the operator's [`AdminState`]: the types the
//! balancer (which re-exports them as `balance::State` and `balance::AdminState`),
//! the server-state file, the metric labels, the live facts, the admin views and
//! the CLI share. Here, in the model every layer reads, because the file sets an
//! `AdminState` too (`disabled: true`) and the lowest readers (metrics, live facts)
//! must not import the balancer above them.
use serde::{Deserialize, Serialize};

use super::BackendConfig;

/// A backend's state: the operator's ([`AdminState`]), else its health. One type
/// for the balancer, the server-state file, the metric labels, the admin views and
/// the CLI; on the wire (JSON, labels) by [`State::as_str`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// Takes traffic.
    #[default]
    Up,
    /// Failed its health checks.
    Down,
    /// No new connections, open ones finish (the operator).
    Drain,
    /// Maintenance (the operator).
    Disabled,
    /// Recovered, waiting for manual failback.
    Standby,
}

impl State {
    /// Every state, in the order the metrics list them.
    pub const ALL: [State; 5] = [
        State::Up,
        State::Down,
        State::Drain,
        State::Disabled,
        State::Standby,
    ];

    /// The name on the wire and in labels: `up`, `down`, `drain`, `disabled`, `standby`.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Up => "up",
            State::Down => "down",
            State::Drain => "drain",
            State::Disabled => "disabled",
            State::Standby => "standby",
        }
    }

    /// Set by the operator, so the state says nothing of health (drain, disabled).
    pub fn hides_health(self) -> bool {
        matches!(self, State::Drain | State::Disabled)
    }
}

impl From<AdminState> for State {
    /// What an operator's state shows as: enabled is `up` (set against the file's
    /// `disabled: true`), drain and disabled are themselves.
    fn from(s: AdminState) -> State {
        match s {
            AdminState::Enabled => State::Up,
            AdminState::Drain => State::Drain,
            AdminState::Disabled => State::Disabled,
        }
    }
}

impl std::fmt::Display for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The operator's state of a backend (`crossbar backend drain|enable|disable`, the
/// file's `disabled: true`); as the state file and the views name it: `enabled`,
/// `drain`, `disabled`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[repr(u8)]
pub enum AdminState {
    /// Takes traffic when healthy.
    Enabled = 0,
    /// No new connections; existing ones continue; sticky entries ignored.
    Drain = 1,
    /// Maintenance: no new connections, health checks keep running.
    Disabled = 2,
}

impl AdminState {
    /// Every operator state.
    pub const ALL: [AdminState; 3] = [AdminState::Enabled, AdminState::Drain, AdminState::Disabled];

    /// `enabled`, `drain`, `disabled`.
    pub fn as_str(self) -> &'static str {
        match self {
            AdminState::Enabled => "enabled",
            AdminState::Drain => "drain",
            AdminState::Disabled => "disabled",
        }
    }

    /// The word that asks for it, in the CLI (`crossbar backend drain`) and the
    /// admin API's path (`/api/backends/{service}/{backend}/drain`): `enable`,
    /// `drain`, `disable`.
    pub fn verb(self) -> &'static str {
        match self {
            AdminState::Enabled => "enable",
            AdminState::Drain => "drain",
            AdminState::Disabled => "disable",
        }
    }

    /// The state the file gives a backend (`disabled: true`, else enabled).
    pub fn of_file(c: &BackendConfig) -> AdminState {
        if c.disabled {
            AdminState::Disabled
        } else {
            AdminState::Enabled
        }
    }
}
