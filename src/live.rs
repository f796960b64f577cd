//! Live facts the status page and `/api/services` show that Prometheus counters do
//! not keep: when a backend entered its state, its peak connections, its last check,
//! the process start and the last reload's outcome.
//!
//! All of it is atomics written on state changes, connection starts and checks;
//! nothing per byte. A backend's facts are keyed by (service, backend) in
//! [`crate::metrics::Metrics`], like its counters, so they survive a reload.
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::config::state::State;

/// Longest check error kept for display; a TLS alert or an I/O error is < 200 bytes.
const MAX_CHECK_ERROR: usize = 256;

/// Milliseconds since the Unix epoch now (0 if the clock is before 1970).
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A wall-clock time stored as ms since the epoch.
fn at(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

/// The result of a backend's last active health check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastCheck {
    /// When it finished.
    pub at: SystemTime,
    /// `None` if it passed, else why it failed.
    pub error: Option<String>,
}

/// Live facts of one backend.
#[derive(Debug)]
pub struct BackendLive {
    /// Index into [`State::ALL`] plus one; 0 before the first state is published.
    state: AtomicU8,
    state_since_ms: AtomicU64,
    peak: AtomicU32,
    last_check_ms: AtomicU64,
    last_check: Mutex<Option<String>>,
}

impl Default for BackendLive {
    fn default() -> BackendLive {
        BackendLive {
            state: AtomicU8::new(0),
            state_since_ms: AtomicU64::new(now_ms()),
            peak: AtomicU32::new(0),
            last_check_ms: AtomicU64::new(0),
            last_check: Mutex::new(None),
        }
    }
}

impl BackendLive {
    /// Note the state just published; the since-time moves only on a change (the
    /// first state counts from when the backend was configured).
    pub fn note_state(&self, state: State) {
        let i = State::ALL.iter().position(|s| *s == state).unwrap_or(0);
        let code = i as u8 + 1;
        let prev = self.state.swap(code, Ordering::AcqRel);
        if prev != 0 && prev != code {
            self.state_since_ms.store(now_ms(), Ordering::Release);
        }
    }

    /// When the backend entered its current state.
    pub fn state_since(&self) -> SystemTime {
        at(self.state_since_ms.load(Ordering::Acquire))
    }

    /// Note the number of open connections after one more was opened.
    pub fn note_active(&self, active: u32) {
        self.peak.fetch_max(active, Ordering::AcqRel);
    }

    /// Most connections open at once since the backend was configured.
    pub fn peak(&self) -> u32 {
        self.peak.load(Ordering::Acquire)
    }

    /// Record an active check's result.
    pub fn note_check(&self, error: Option<&dyn std::fmt::Display>) {
        let text = error.map(|e| {
            let mut s = e.to_string();
            if s.len() > MAX_CHECK_ERROR {
                let cut = (0..=MAX_CHECK_ERROR)
                    .rev()
                    .find(|&i| s.is_char_boundary(i))
                    .unwrap_or(0);
                s.truncate(cut);
            }
            s
        });
        *self.last_check.lock().unwrap_or_else(|e| e.into_inner()) = text;
        self.last_check_ms.store(now_ms(), Ordering::Release);
    }

    /// The last active check, if one ran.
    pub fn last_check(&self) -> Option<LastCheck> {
        let ms = self.last_check_ms.load(Ordering::Acquire);
        if ms == 0 {
            return None;
        }
        let error = self
            .last_check
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        Some(LastCheck { at: at(ms), error })
    }
}

/// The outcome of the last configuration reload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReloadOutcome {
    /// When it was attempted.
    pub at: SystemTime,
    /// `None` if it was applied, else why the running configuration was kept.
    pub error: Option<String>,
    /// What an applied reload warned about (a retired setting, a service with no
    /// backend passing its check).
    pub warnings: Vec<String>,
    /// The operator states it kept (`puppet/compile1 drain`).
    pub kept: Vec<String>,
    /// The operator states it reset, and why.
    pub reset: Vec<String>,
}

/// What an applied reload reports: its warnings and what it did to the operator's
/// run-time state, each in a line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReloadNote {
    /// Warnings.
    pub warnings: Vec<String>,
    /// Operator states kept.
    pub kept: Vec<String>,
    /// Operator states reset, and why.
    pub reset: Vec<String>,
}

/// Live facts of the process.
#[derive(Debug)]
pub struct ProcessLive {
    started: Instant,
    started_at: SystemTime,
    last_reload: Mutex<Option<ReloadOutcome>>,
}

impl Default for ProcessLive {
    fn default() -> ProcessLive {
        ProcessLive {
            started: Instant::now(),
            started_at: SystemTime::now(),
            last_reload: Mutex::new(None),
        }
    }
}

impl ProcessLive {
    /// Time since start.
    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    /// When the process started.
    pub fn started_at(&self) -> SystemTime {
        self.started_at
    }

    /// Record a reload's outcome: its warnings, or why it was refused.
    pub fn note_reload(&self, result: &Result<ReloadNote, String>) {
        let note = result.clone().unwrap_or_default();
        let outcome = ReloadOutcome {
            at: SystemTime::now(),
            error: result.as_ref().err().cloned(),
            warnings: note.warnings,
            kept: note.kept,
            reset: note.reset,
        };
        *self.last_reload.lock().unwrap_or_else(|e| e.into_inner()) = Some(outcome);
    }

    /// The last reload, if there was one.
    pub fn last_reload(&self) -> Option<ReloadOutcome> {
        self.last_reload
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_moves_only_on_change() {
        let l = BackendLive::default();
        l.state_since_ms.store(1, Ordering::Release);
        l.note_state(State::Up);
        assert_eq!(l.state_since_ms.load(Ordering::Acquire), 1, "first state");
        l.note_state(State::Up);
        assert_eq!(l.state_since_ms.load(Ordering::Acquire), 1, "same state");
        l.note_state(State::Down);
        assert!(l.state_since_ms.load(Ordering::Acquire) > 1, "changed");
    }

    #[test]
    fn peak_and_check() {
        let l = BackendLive::default();
        l.note_active(3);
        l.note_active(1);
        assert_eq!(l.peak(), 3);
        assert!(l.last_check().is_none());
        let long = "é".repeat(MAX_CHECK_ERROR);
        l.note_check(Some(&long));
        let c = l.last_check().unwrap();
        assert!(c.error.unwrap().len() <= MAX_CHECK_ERROR);
        l.note_check(None);
        assert_eq!(l.last_check().unwrap().error, None);
    }
}
