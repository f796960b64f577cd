//! Backend pools: the four balance algorithms, backups, per-backend connection
//! limits and the bounded queue for when every backend is full.
//!
//! A backend takes new connections when it is healthy, enabled (not drained or
//! disabled, not a recovered primary waiting for manual failback) and below its
//! `max_connections`. Backups are candidates only when no primary is available.
//!
//! A backend's weight is the file's until the operator sets another at run time
//! ([`Backend::set_weight`], `crossbar backend weight`); weight 0 takes it out of
//! the choice for new connections while sticky hits still reach it (HAProxy's
//! `set weight ... 0`). The run-time weight lives on the [`Backend`], not on the
//! live state a reload carries over, so a reload (and a restart) returns
//! every backend to its configured weight.
//!
//! Load feedback (`crate::feedback`) multiplies that weight by a factor published in
//! the backend's `FeedbackCell`, and a slow-start ramp by how far along it is; one
//! function, [`Weight::of`], makes the product that every algorithm picks with and
//! every view shows. An agent's `maxconn:N` lowers the connection limit while it
//! holds.
//!
//! Rooms: [`backend`] (the backend, its live state, its slots), [`pool`] (the
//! algorithms), [`schedule`] (the weight and round robin's cycle), [`queue`] (the
//! bounded wait for a slot). A backend's one [`State`] and the operator's
//! [`AdminState`] are the model's (`config::state`, which every layer reads).
pub mod backend;
pub mod pool;
pub mod queue;
pub mod schedule;

pub use crate::config::state::{AdminState, State};
pub use backend::{Backend, HealthStreak, Lease, MAX_WEIGHT};
pub use pool::{Pool, PoolParams, Ramp};
pub use queue::PickError;
pub use schedule::Weight;

/// Picks of a backend that is not full in one look for a slot; bounded tries so
/// that a reservation race (two tasks taking the last slot) can't spin.
const MAX_PICK_RACES: usize = 8;

#[cfg(test)]
mod tests;
