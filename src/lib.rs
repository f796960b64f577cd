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
//! - [`open_connections`]: the registry of open connections, from backend choice to
//!   the end (`crossbar connections`).
//! - [`access_log`]: one line per connection at its end, through [`log_writer`].
//!
//! The layers, each using only the ones below it:
//!
//! - commands: [`cli`] (the command line: arguments, `check`, the man pages, and the
//!   `crossbar status|table|backend|connections|sources|reload` clients of the admin
//!   API, which read its typed views), [`run`] (`crossbar run`: signals, upgrades, the
//!   admin endpoint), [`demo`] (a self-contained run with local TLS backends),
//!   [`doctor`] (`crossbar doctor`: every backend's certificates, TLS, stickiness and
//!   status checked before traffic is switched);
//! - endpoints: [`admin`] (the HTTP endpoint: the status page, /metrics, /healthz,
//!   /api, each document a typed view in `admin::view` that the page and the CLI read
//!   too) and [`upgrade`] (hitless binary upgrades);
//! - the running balancer: [`server`] (start, shutdown, saving; its listeners; its
//!   reload task, the one owner of the running config, which SIGHUP, `POST
//!   /api/reload` and the DNS watchers send requests to);
//! - per connection: [`conn`] (placement confirmation included);
//! - in the background: [`health`] (active checks and passive failure counting:
//!   rise/fall; the reload's health gate) and [`ticket_keys`] (learning backends'
//!   ticket-key names); `server` runs each service's load-feedback task;
//! - the model: [`service`] (a service at run time, a listen address's routing, what
//!   every connection of the process reaches), with the confirmation [`budget`];
//! - decisions and state: [`balance`] (with [`feedback`]: load feedback, each
//!   backend's weight scaled by its free JRubies or its agent's answer), `admission`,
//!   [`stick`], [`route`], [`access_log`], [`metrics`] (with [`live`]: since-when,
//!   peaks, last check and reload for the status page) and [`open_connections`];
//! - the wire and the system: [`listener`], [`hello`], [`dial`], [`proxy_protocol`],
//!   [`relay`], [`system`], [`log_writer`] (the bounded queue in front of stderr),
//!   `shard` (per-thread shards of the structures connections write); [`testbed`]
//!   holds the TLS peers tests and benches share;
//! - inputs, which every layer reads: [`config`] (YAML -> validated model) and
//!   [`discovery`] (DNS: backends found by name, each watcher sending its changes
//!   to the reload task).
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
mod dial;
mod listener;
mod live;
mod open_connections;
mod route;
mod service;
mod shard;
mod system;
mod ticket_keys;
mod upgrade;
