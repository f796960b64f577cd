//! Warnings a client can cause at will (connections refused or closed to make
//! room, requests refused): at most one line per [`WARN_INTERVAL`] for each kind,
//! saying how many more happened since; the metrics count every one.
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// At most one warning of a kind per interval: a flood of thousands of refusals a
/// second writes one line per 10 s instead of filling the journal.
pub const WARN_INTERVAL: Duration = Duration::from_secs(10);

/// One kind of warning's state.
#[derive(Default)]
pub struct Throttle(Mutex<State>);

#[derive(Default)]
struct State {
    last: Option<Instant>,
    suppressed: u64,
}

impl Throttle {
    /// Record an event: `Some(n)` if a line is due now (`n` events were not logged
    /// since the last line), `None` if this one is only counted.
    pub fn note(&self) -> Option<u64> {
        self.note_at(Instant::now())
    }

    fn note_at(&self, now: Instant) -> Option<u64> {
        let mut st = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match st.last {
            Some(t) if now.saturating_duration_since(t) < WARN_INTERVAL => {
                st.suppressed += 1;
                None
            }
            _ => {
                st.last = Some(now);
                Some(std::mem::take(&mut st.suppressed))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_with_the_count() {
        let t = Throttle::default();
        let start = Instant::now();
        assert_eq!(t.note_at(start), Some(0));
        let within = (1..1000)
            .filter_map(|i| t.note_at(start + Duration::from_millis(i)))
            .count();
        assert_eq!(within, 0);
        assert_eq!(t.note_at(start + WARN_INTERVAL), Some(999));
        assert_eq!(t.note_at(start + WARN_INTERVAL), None);
    }
}
