//! The server-state file (`state_file:`, HAProxy's `server-state-file`): the
//! operator's run-time state of every backend (drain, disable, enable, weight: see
//! `operator.rs`) and each backend's last known health, saved by the reload task
//! when the operator changes something, every [`SAVE_INTERVAL`] while health
//! changes, and at shutdown; read back at start, so a drained compiler stays drained
//! across a restart or a package upgrade, and a restarted crossbar sends nothing to
//! a backend it last saw down. JSON, written atomically (a fresh temp file renamed
//! over it, as the stick tables' state files are).
use std::collections::BTreeMap;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::operator::OperatorState;
use crate::service::Service;

/// How often the task looks whether the backends' health changed since the last
/// save (a flip is rare; saving costs a small file write).
pub(super) const SAVE_INTERVAL: Duration = Duration::from_secs(5);
/// How old a saved health may be and still be trusted at start (a restart, an
/// upgrade): older, and a first round of checks decides instead.
const HEALTH_TRUSTED: Duration = Duration::from_secs(60);
/// The format version this build writes and reads.
const VERSION: u32 = 1;
/// Largest file read back: a few hundred bytes per backend.
const MAX_BYTES: u64 = 8 << 20;

/// A backend's health when last saved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Health {
    /// Its address then (a backend that moved is checked anew).
    pub(super) address: String,
    /// It passed its checks.
    pub(super) up: bool,
}

/// The file's content.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Saved {
    /// [`VERSION`].
    pub(super) version: u32,
    /// When it was written (Unix seconds).
    pub(super) saved_at: u64,
    /// What the operator set.
    pub(super) operator: OperatorState,
    /// service -> backend -> health.
    pub(super) health: BTreeMap<String, BTreeMap<String, Health>>,
}

/// Why the state file was not read back.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// Reading it failed (not a regular file, too large, permissions).
    #[error("reading {path}: {error}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        error: io::Error,
    },
    /// Its content is not a state file of this version.
    #[error("{path} is not a crossbar state file of version {VERSION}: {error}")]
    Format {
        /// The file.
        path: String,
        /// Why.
        error: String,
    },
}

impl Saved {
    /// What `services` and `operator` are now.
    pub(super) fn now(services: &[Arc<Service>], operator: &OperatorState) -> Saved {
        let health = services
            .iter()
            .map(|s| {
                let backends = s.pool.backends.iter().map(|b| {
                    let h = Health {
                        address: b.config.address.to_string(),
                        up: b.is_healthy(),
                    };
                    (b.name.to_string(), h)
                });
                (s.name().to_string(), backends.collect())
            })
            .collect();
        Saved {
            version: VERSION,
            saved_at: unix_now(),
            operator: operator.clone(),
            health,
        }
    }

    /// The health to trust for `backend` of `service` at `address` at start: the
    /// saved one if recent enough ([`HEALTH_TRUSTED`]) and of the same address.
    pub(super) fn known_health(&self, service: &str, backend: &str, address: &str) -> Option<bool> {
        let age = unix_now().saturating_sub(self.saved_at);
        if age > HEALTH_TRUSTED.as_secs() {
            return None;
        }
        let h = self.health.get(service)?.get(backend)?;
        (h.address == address).then_some(h.up)
    }

    /// The same content but for the time written (nothing new to save).
    pub(super) fn same_as(&self, other: &Saved) -> bool {
        self.operator == other.operator && self.health == other.health
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Read the state file at `path`; `Ok(None)` when there is none yet (blocking I/O).
pub(super) fn load(path: &Path) -> Result<Option<Saved>, StateError> {
    let shown = path.display().to_string();
    let bytes = match crate::stick::read_bounded(path, MAX_BYTES) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(StateError::Read { path: shown, error }),
    };
    let saved: Saved = serde_json::from_slice(&bytes).map_err(|e| StateError::Format {
        path: shown.clone(),
        error: e.to_string(),
    })?;
    if saved.version != VERSION {
        return Err(StateError::Format {
            path: shown,
            error: format!("version {}", saved.version),
        });
    }
    Ok(Some(saved))
}

/// Write `saved` to `path` atomically (blocking I/O).
pub(super) fn save(path: &Path, saved: &Saved) -> io::Result<()> {
    let mut bytes = serde_json::to_vec_pretty(saved).map_err(io::Error::other)?;
    bytes.push(b'\n');
    crate::stick::write_atomically(path, &bytes)
}
