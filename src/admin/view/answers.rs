//! The answers to writes (a backend's state or weight set, a reload applied) and
//! the error document every failed request answers.
use serde::{Deserialize, Serialize};

use super::State;

/// `POST /api/backends/{service}/{backend}/{drain|enable|disable}`: the new state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendStateView {
    /// The service.
    pub service: String,
    /// The backend.
    pub backend: String,
    /// Its state now.
    pub state: State,
    /// Its open connections (a drain is done at 0).
    pub active_connections: u32,
}

/// `POST /api/backends/{service}/{backend}/weight`: the weight set and the one before.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WeightView {
    /// The service.
    pub service: String,
    /// The backend.
    pub backend: String,
    /// The weight now.
    pub weight: u32,
    /// The weight before.
    pub previous_weight: u32,
    /// The file's (a reload or restart returns to it).
    pub configured_weight: u32,
    /// Its state.
    pub state: State,
    /// Its open connections.
    pub active_connections: u32,
}

/// `POST /api/reload`: applied, with its warnings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReloadAnswer {
    /// Always `true` (a refused reload answers an [`ErrorView`]).
    pub reloaded: bool,
    /// What the applied configuration warned about.
    pub warnings: Vec<String>,
    /// The file was the configuration in force already: nothing was committed.
    #[serde(default)]
    pub unchanged: bool,
    /// Operator states (drain, weight...) the reload kept: their backends did not change.
    #[serde(default)]
    pub kept: Vec<super::HeldView>,
    /// Operator states the reload reset to the file's, and why.
    #[serde(default)]
    pub reset: Vec<super::HeldView>,
}

/// Every error: `{"error": "..."}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorView {
    /// What went wrong, for a person.
    pub error: String,
}
