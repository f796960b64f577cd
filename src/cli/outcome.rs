//! How a command ends: exit 0, or the error on stderr (`error: ...`) and exit 1.
use std::process::ExitCode;

use anyhow::Result;

/// Exit 0, or print `error: E` with its causes and exit 1.
pub(super) fn report(r: Result<()>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Print `error: E` and exit 1.
pub(super) fn fail(e: &dyn std::fmt::Display) -> ExitCode {
    eprintln!("error: {e}");
    ExitCode::FAILURE
}
