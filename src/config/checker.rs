//! The validator's cursor: where diagnostics are collected, with the helpers every
//! section's checks share (ranges, durations, YAML paths).
use std::path::Path;
use std::time::Duration;

use super::error::Diagnostic;
use super::position::{Pos, PositionIndex};
use super::raw::RawDuration;

/// The YAML path of `key` under `parent`.
pub(super) fn join(parent: &str, key: &str) -> String {
    format!("{parent}.{key}")
}

/// Walks the raw model, builds the runtime model and collects diagnostics.
pub(super) struct Checker<'a> {
    pub(super) file: &'a Path,
    pub(super) index: PositionIndex,
    pub(super) diagnostics: Vec<Diagnostic>,
    /// What is accepted but should be changed (see [`super::Config::warnings`]).
    pub(super) warnings: Vec<Diagnostic>,
}

impl Checker<'_> {
    /// Report a problem at `path` (positioned at it or its nearest written ancestor).
    pub(super) fn err(&mut self, path: &str, message: impl Into<String>) {
        let position = self.index.at(path);
        self.err_at(path, position, message);
    }

    pub(super) fn err_at(&mut self, path: &str, position: Option<Pos>, message: impl Into<String>) {
        self.diagnostics.push(Diagnostic {
            file: self.file.to_path_buf(),
            position,
            path: Some(path.to_string()),
            message: message.into(),
        });
    }

    /// Warn about something at `path` that is accepted but should be changed.
    pub(super) fn warn(&mut self, path: &str, message: impl Into<String>) {
        self.warnings.push(Diagnostic {
            file: self.file.to_path_buf(),
            position: self.index.at(path),
            path: Some(path.to_string()),
            message: message.into(),
        });
    }

    /// An integer in `lo..=hi`, or `default` when absent (and after an error).
    pub(super) fn int(
        &mut self,
        v: Option<u64>,
        path: &str,
        default: u64,
        lo: u64,
        hi: u64,
    ) -> u64 {
        let Some(v) = v else { return default };
        if (lo..=hi).contains(&v) {
            return v;
        }
        let range = if hi == u64::MAX {
            format!("at least {lo}")
        } else if lo == 0 {
            format!("at most {hi}")
        } else {
            format!("between {lo} and {hi}")
        };
        self.err(path, format!("must be {range}, not {v}"));
        default
    }

    /// A humantime duration, or `default` when absent (and after an error).
    pub(super) fn duration(
        &mut self,
        v: Option<&RawDuration>,
        path: &str,
        default: Duration,
        nonzero: bool,
    ) -> Duration {
        let text = match v {
            None => return default,
            Some(RawDuration::Bare(n)) => {
                let hint = format!("write {n}s, not {n} (units: ms, s, m, h, d)");
                self.err(path, format!("a duration needs a unit: {hint}"));
                return default;
            }
            Some(RawDuration::Text(t)) => t,
        };
        match humantime::parse_duration(text.trim()) {
            Ok(d) if nonzero && d.is_zero() => {
                self.err(path, "must be more than zero");
                default
            }
            Ok(d) => d,
            Err(e) => {
                let msg = format!("`{text}` is not a duration ({e}); write e.g. 5s, 30m or 1h 30m");
                self.err(path, msg);
                default
            }
        }
    }
}
