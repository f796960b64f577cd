//! `crossbar backend drain|disable SERVICE/BACKEND --wait [--timeout DURATION]`:
//! after the write, wait until the backend has no connection left (HAProxy's
//! runtime API leaves this to a script polling `show servers conn`).
//!
//! It polls `GET /api/connections?service=SERVICE` (the registry of open
//! connections, each from its backend choice to its end) and keeps those of the
//! backend: the same poll a script of the operator's can make. A backend that is
//! down is waited for like any other: its connections may still be alive (a
//! failing check is not a dead connection). Ctrl-C ends the wait and leaves the
//! drain in place; the timeout ends it with the connections left, their ages and
//! clients.
use std::fmt::Write as _;
use std::io::{IsTerminal, Write as _};
use std::time::{Duration, Instant};

use super::http::CliError;
use crate::admin::human::human_secs;
use crate::admin::view::ConnectionView;

/// How often the backend's connections are looked at: a drain's end is seen
/// within this, and a poll costs the endpoint one listing of one service.
const POLL: Duration = Duration::from_millis(250);
/// The most connections one poll lists (the API's bound).
pub(super) const LIST_LIMIT: usize = 10_000;
/// The longest timeout taken: a week (a drain that outlives it is not a drain).
pub(super) const MAX_WAIT: Duration = Duration::from_secs(7 * 24 * 3600);
/// The connections named when the wait times out.
const NAMED: usize = 10;

/// `--timeout`: a humantime duration above 0 (`90s`, `10m`), at most [`MAX_WAIT`].
pub(super) fn parse_timeout(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s.trim())
        .map_err(|e| format!("{s:?} is not a duration like 90s or 10m: {e}"))?;
    if d.is_zero() {
        return Err("a timeout of 0 would never wait: give one above 0, e.g. 10m".into());
    }
    if d > MAX_WAIT {
        return Err(format!("at most {}", humantime::format_duration(MAX_WAIT)));
    }
    Ok(d)
}

/// The backend waited for and the longest wait.
pub(super) struct Wait<'a> {
    /// Its service.
    pub service: &'a str,
    /// Its name.
    pub backend: &'a str,
    /// How long to wait at most.
    pub timeout: Duration,
}

impl Wait<'_> {
    fn at(&self) -> String {
        format!("{}/{}", self.service, self.backend)
    }
}

/// Wait until `w`'s backend has no connection left; what to print then. Progress
/// (connections left, the oldest's age) goes to stderr when it is a terminal.
///
/// `list` lists the open connections of `w`'s service (`GET
/// /api/connections?service=`), at most [`LIST_LIMIT`].
pub(super) async fn until_idle<F, Fut>(w: &Wait<'_>, mut list: F) -> Result<String, CliError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Vec<ConnectionView>, CliError>>,
{
    let started = Instant::now();
    let deadline = started + w.timeout;
    let progress = std::io::stderr().is_terminal();
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    loop {
        let left: Vec<ConnectionView> = list()
            .await?
            .into_iter()
            .filter(|c| c.backend == w.backend)
            .collect();
        if left.is_empty() {
            clear(progress);
            return Ok(format!(
                "{}: no connection left (waited {:.1}s)\n",
                w.at(),
                started.elapsed().as_secs_f64()
            ));
        }
        let now = Instant::now();
        if now >= deadline {
            clear(progress);
            return Err(CliError::WaitTimedOut(timed_out(w, &left)));
        }
        if progress {
            let oldest = left.iter().map(|c| c.age_seconds).max().unwrap_or(0);
            eprint!(
                "\r{}: {} connection(s) left, the oldest {}   ",
                w.at(),
                left.len(),
                human_secs(oldest)
            );
            let _ = std::io::stderr().flush(); // ok: progress only
        }
        tokio::select! {
            () = tokio::time::sleep(POLL.min(deadline - now)) => {}
            _ = &mut interrupted => {
                clear(progress);
                return Err(CliError::WaitInterrupted(format!(
                    "interrupted: {} stays as set, with {} connection(s) left \
                     (`crossbar backend enable {}` puts it back in rotation)",
                    w.at(),
                    left.len(),
                    w.at()
                )));
            }
        }
    }
}

/// The timeout's message: how many are left, and the oldest of them.
fn timed_out(w: &Wait<'_>, left: &[ConnectionView]) -> String {
    let mut oldest: Vec<&ConnectionView> = left.iter().collect();
    oldest.sort_by_key(|c| std::cmp::Reverse(c.age_seconds));
    let mut out = format!(
        "{}: {} connection(s) left after {} (it stays as set; `crossbar connections {}` \
         lists them, `crossbar backend shutdown-sessions {}` closes them):",
        w.at(),
        left.len(),
        humantime::format_duration(w.timeout),
        w.service,
        w.at()
    );
    for c in oldest.iter().take(NAMED) {
        let _ = write!(
            out,
            "\n  id {} from {}, open {}",
            c.id,
            c.client,
            human_secs(c.age_seconds)
        ); // ok: writing to a String
    }
    if left.len() > NAMED {
        let _ = write!(out, "\n  and {} more", left.len() - NAMED); // ok: a String
    }
    out
}

/// End a progress line.
fn clear(progress: bool) {
    if progress {
        eprint!("\r\x1b[K");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeout_is_a_duration_above_zero_and_at_most_a_week() {
        assert_eq!(parse_timeout("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_timeout(" 10m "), Ok(Duration::from_secs(600)));
        assert!(parse_timeout("0s").unwrap_err().contains("above 0"));
        assert!(parse_timeout("soon")
            .unwrap_err()
            .contains("not a duration"));
        assert!(parse_timeout("8d").unwrap_err().contains("at most"));
    }
}
