//! crossbar: a layer-4 TLS-passthrough load balancer for Puppet masters.
//!
//! One connection flows through the modules in this order:
//!
//! - [`listener`]: bind per-service addresses, accept, enforce connection limits.
//! - [`hello`]: read the client's ClientHello (bounded in bytes and time).
//! - [`route`]: listener + SNI -> service.
//! - [`stick`]: session ID / ticket / PSK / source -> the backend holding the session.
//! - [`balance`]: otherwise pick a backend with the service's algorithm.
//! - [`relay`]: connect, replay the hello, watch the server's handshake to learn
//!   stick entries, then pump bytes both ways untouched.
//!
//! Around them: [`config`] (YAML -> validated model), [`server`] (builds services,
//! owns listeners, reload and shutdown), [`conn`] (one connection's life),
//! [`health`] (active checks and passive failure counting: rise/fall),
//! [`metrics`] and [`live`] (since-when, peaks, last check and reload for the
//! status page), [`admin`] (the HTTP endpoint: the status page, /metrics,
//! /healthz, /api), [`cli`]
//! (the `crossbar status|table|backend|reload` clients of that API) and [`demo`]
//! (a self-contained run with local TLS backends).
#![deny(unsafe_code)]

pub mod admin;
pub mod balance;
pub mod cli;
pub mod config;
pub mod conn;
pub mod demo;
pub mod health;
pub mod hello;
pub mod listener;
pub mod live;
pub mod metrics;
pub mod probe;
pub mod proxy_protocol;
pub mod relay;
pub mod route;
pub mod run;
pub mod server;
pub mod stick;
pub mod system;
pub mod testbed;
pub mod upgrade;
