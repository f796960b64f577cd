//! crossbar: a layer-4 TLS-passthrough load balancer for Puppet masters.
//!
//! One connection flows through the modules in this order:
//!
//! - [`listener`]: bind per-service addresses, accept, enforce connection limits.
//! - [`proxy_protocol`]: from a trusted tier, its PROXY header names the client.
//! - `admission`: per-source limits on that client, before anything is read from it.
//! - [`conn`]: one connection's life as named steps, calling the modules below.
//! - [`hello`]: read the client's ClientHello (bounded in bytes and time).
//! - [`route`]: listener + SNI -> service.
//! - [`stick`]: session ID / ticket / PSK / source -> the backend holding the session
//!   (the placement policy and what a handshake teaches the table).
//! - [`balance`]: otherwise pick a backend with the service's algorithm (the pool:
//!   the config file's backends and those [`discovery`] finds in DNS).
//! - `conn`'s confirmation: a resumption whose holder is uncertain is offered to further
//!   backends until one resumes it, within the process-wide [`budget`].
//! - [`dial`]: connect to the backend; [`proxy_protocol`]: the PROXY header first.
//! - [`relay`]: replay the hello, watch the server's handshake, then pump bytes both
//!   ways untouched.
//! - [`connections`]: listed from backend choice to its end (`crossbar connections`).
//! - [`access_log`]: one line per connection at its end.
//!
//! The layers, each using only the ones below it:
//!
//! - commands: [`cli`] (the command line: arguments, `check`, the man pages, and the
//!   `crossbar status|table|backend|connections|sources|reload` clients of the admin
//!   API, which read its typed views), [`run`] (`crossbar run`: signals, upgrades, the
//!   admin endpoint), [`demo`] (a self-contained run with local TLS backends),
//!   [`doctor`] (`crossbar doctor`: every backend's certificates, TLS, stickiness and
//!   status checked before traffic is switched);
//! - [`admin`] (the HTTP endpoint: the status page, /metrics, /healthz, /api, each
//!   document a typed view in `admin::view` that the page and the CLI read too) and
//!   [`upgrade`] (hitless binary upgrades);
//! - [`server`]: the running balancer: builds services, owns listeners, reload and
//!   shutdown;
//! - [`conn`] (placement confirmation included), [`health`] (active checks and passive failure
//!   counting: rise/fall), [`feedback`] (load feedback: each backend's weight scaled by
//!   its free JRubies or its agent's answer) and [`ticket_keys`] (learning backends'
//!   ticket-key names), all working on
//! - [`service`]: the runtime model (a service, a listen address's routing, what
//!   connections share, among it the confirmation [`budget`]), built from [`config`]
//!   (YAML -> validated model) over [`balance`], [`stick`], [`route`], [`metrics`]
//!   (with [`live`]: since-when,
//!   peaks, last check and reload for the status page), [`connections`] (the open
//!   ones, per service) and [`access_log`];
//! - the wire and the system: [`listener`], [`hello`], [`dial`], [`proxy_protocol`],
//!   [`relay`], [`system`]; [`testbed`] holds the TLS peers tests and benches share.
#![deny(unsafe_code)]
#![warn(missing_docs)]

// What main.rs, the tests, the benches and the fuzz targets use.
pub mod admin;
pub mod balance;
pub mod cli;
pub mod config;
pub mod demo;
pub mod discovery;
pub mod doctor;
pub mod feedback;
pub mod health;
pub mod hello;
pub mod log_writer;
pub mod metrics;
pub mod proxy_protocol;
pub mod relay;
pub mod run;
pub mod server;
pub mod stick;
pub mod testbed;

// Inside the crate only.
mod access_log;
mod admission;
mod budget;
mod conn;
mod connections;
mod dial;
mod listener;
mod live;
mod route;
mod service;
mod shard;
mod system;
mod ticket_keys;
mod upgrade;
