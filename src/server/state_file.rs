//! The server-state file (`state_file:`, HAProxy's `server-state-file`): the
//! operator's run-time state of every backend (drain, disable, enable, weight: see
//! `operator.rs`) and each backend's last known health, saved by the reload task
//! when the operator changes something, every [`SAVE_INTERVAL`] while health
//! changes, and at shutdown; read back at start, so a drained compiler stays drained
//! across a restart or a package upgrade, and a restarted crossbar sends nothing to
//! a backend it last saw down. JSON, written atomically (a fresh temp file renamed
//! over it, as the stick tables' state files are).
//!
//! Never fatal: a file that can't be read back (garbage, empty, truncated, another
//! version, an unknown word, a directory, a link) is logged, counted
//! (`crossbar_state_file_set_aside_total`), renamed aside to `<file>.bad.<unix
//! time>` (kept for a post-mortem, never deleted) and crossbar starts from the
//! configuration's states and weights, its first checks deciding each backend's
//! health. A health saved "in the future" or long ago is not trusted either.
use std::collections::BTreeMap;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus::{IntCounter, Registry};
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
/// How far ahead of this host's clock a `saved_at` may be and still be read as
/// "just now": two hosts' clocks kept by NTP differ by milliseconds, a file copied
/// from a host whose clock ran ahead by more is not trusted to say what is up.
const CLOCK_SKEW: Duration = Duration::from_secs(5);
/// The suffix of a file set aside: `<file>.bad.<unix seconds>`.
const ASIDE_SUFFIX: &str = "bad";

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
    /// A `saved_at` in the future (beyond [`CLOCK_SKEW`]) is as stale as an old one:
    /// the first checks decide.
    pub(super) fn known_health(&self, service: &str, backend: &str, address: &str) -> Option<bool> {
        if !self.health_fresh(unix_now()) {
            return None;
        }
        let h = self.health.get(service)?.get(backend)?;
        (h.address == address).then_some(h.up)
    }

    /// The saved health may be trusted at `now` (Unix seconds): written at most
    /// [`HEALTH_TRUSTED`] ago and not after `now` + [`CLOCK_SKEW`].
    fn health_fresh(&self, now: u64) -> bool {
        let future = self.saved_at > now.saturating_add(CLOCK_SKEW.as_secs());
        !future && now.saturating_sub(self.saved_at) <= HEALTH_TRUSTED.as_secs()
    }

    /// How far in the future the file says it was written, when beyond
    /// [`CLOCK_SKEW`] (its health is then not used: the log says why).
    pub(super) fn in_the_future(&self) -> Option<Duration> {
        let now = unix_now();
        (self.saved_at > now.saturating_add(CLOCK_SKEW.as_secs()))
            .then(|| Duration::from_secs(self.saved_at - now))
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

/// Read the state file at start, never failing: a file that can't be read back is
/// logged, counted in `set_aside` and renamed aside ([`set_aside`]); crossbar then
/// starts from the configuration (blocking I/O).
pub(super) fn load_at_start(path: &Path, set_aside_count: &IntCounter) -> Option<Saved> {
    let error = match load(path) {
        Ok(saved) => return saved,
        Err(e) => e,
    };
    set_aside_count.inc();
    let kept = match set_aside(path) {
        Ok(to) => format!("set aside as {}", to.display()),
        Err(e) => format!("could not be set aside ({e}): the next save replaces it"),
    };
    tracing::warn!(
        file = %path.display(),
        reason = %error,
        "the server-state file is unusable: {kept}; starting from the configuration's \
         backend states and weights (the operator's drains and weights set at run time are \
         not restored), the first checks decide each backend's health"
    );
    None
}

/// Why the state file at `path` would be set aside at start, in the words of
/// `crossbar check` and `crossbar doctor` (a warning: `run` starts anyway);
/// `None` when it reads back or is absent.
pub fn problem(path: &Path) -> Option<String> {
    let e = load(path).err()?;
    Some(format!(
        "{e}: `crossbar run` will set it aside (renamed to {}.{ASIDE_SUFFIX}.<unix time>) and \
         start from the configuration's backend states and weights, the first checks deciding \
         each backend's health",
        path.display()
    ))
}

/// Rename the unusable file at `path` to `<path>.bad.<unix seconds>` (a directory
/// or a link is renamed too, never followed); the new name.
fn set_aside(path: &Path) -> io::Result<std::path::PathBuf> {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{ASIDE_SUFFIX}.{}", unix_now()));
    let to = path.with_file_name(name);
    std::fs::rename(path, &to)?;
    Ok(to)
}

/// The counter of files set aside, registered in `registry` at 0 (so that
/// `increase()` sees the first one); an unregistered one if the registry has it.
pub(super) fn set_aside_counter(registry: &Registry) -> IntCounter {
    let c = IntCounter::new(
        "crossbar_state_file_set_aside_total",
        "Server-state files (state_file) found unusable at start and renamed aside \
         (<file>.bad.<unix time>); crossbar started from the configuration.",
    )
    .expect("static metric definition"); // ok: static
    if let Err(e) = registry.register(Box::new(c.clone())) {
        tracing::debug!("crossbar_state_file_set_aside_total not registered: {e}");
    }
    c
}

/// Write `saved` to `path` atomically (blocking I/O).
pub(super) fn save(path: &Path, saved: &Saved) -> io::Result<()> {
    let mut bytes = serde_json::to_vec_pretty(saved).map_err(io::Error::other)?;
    bytes.push(b'\n');
    crate::stick::write_atomically(path, &bytes)
}
