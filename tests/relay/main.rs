//! The byte pump through real sockets on loopback: what one peer sends, the other
//! receives, and however a peer ends the connection, the other sees that ending.
//!
//! - [`intact`]: payloads intact both ways in `mode: tcp` and `mode: tls`,
//!   half-closes, the backend's own TLS session, bulk data without descriptors left.
//! - [`endings`]: every way a connection can end, direct vs through crossbar, on the
//!   copy and the splice path, and under load.
#[path = "../common/mod.rs"]
mod common;

mod endings;
mod intact;
