//! The byte relay: once a backend is chosen, both directions are pumped until both
//! are done, passing half-closes and aborts through, with an idle timeout and
//! per-direction byte counts. The server's handshake is watched on the way.
//!
//! By job, each file using only the ones listed after it:
//!
//! - `drive.rs`: [`relay`] runs both directions to their ends and settles the
//!   outcome (idle timeout, shutdown, where an abort goes);
//! - `copy.rs`: one direction's pump, copying through a per-thread buffer until the
//!   direction carries bulk data, then handing it to
//! - `splice.rs`: splice(2) through a pooled pipe (Linux);
//! - `meter.rs`: bytes per direction and the idle clock;
//! - `outcome.rs`: what a relay reports ([`RelayStats`], [`RelayEnd`]);
//! - [`ending`]: how each direction ended, and passing an abort on;
//! - `hard_stop.rs`: [`HardStop`], the end of shutdown's grace period, sharded.
//!
//! `plan.rs` stands apart: which relay a service's `relay:` setting means
//! ([`plan`]), for `crossbar check`, `crossbar doctor` and the start-up log.

mod copy;
mod drive;
mod ending;
mod hard_stop;
mod meter;
mod outcome;
mod plan;
#[cfg(target_os = "linux")]
mod splice;

pub use copy::{HandshakeObserver, Watch};
pub use drive::{relay, Timing};
pub use ending::{Abort, Ending, Peer};
pub use hard_stop::HardStop;
pub use meter::{ConnBytes, RelayCounters};
pub use outcome::{RelayEnd, RelayStats};
pub use plan::{plan, RelayPlan};

/// File descriptors relaying holds beyond each connection's two sockets: (per
/// connection, per worker thread), the splice pipes and their per-thread pool.
pub fn pipe_fds() -> (u64, u64) {
    #[cfg(target_os = "linux")]
    {
        (
            splice::PIPE_FDS_PER_CONNECTION,
            splice::POOLED_FDS_PER_THREAD,
        )
    }
    #[cfg(not(target_os = "linux"))]
    {
        (0, 0)
    }
}
