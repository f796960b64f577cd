//! The `crossbar` command line, everything but parsing and dispatch (`main.rs`):
//! its arguments (`args.rs`), each subcommand's front end (`commands.rs`),
//! `check` and `generate`, and the clients of the admin API (`status`, `table`,
//! `backend`, `connections`, `sources`, `reload`): where the API is
//! (`options.rs`), one request (`http.rs`), the request of each command and its
//! answer read into the API's own views (`client.rs`, [`crate::admin::view`]) and
//! printed (`status.rs`, `tables.rs`, `traffic.rs`); and the shell completion of
//! service and backend names (`complete.rs`).
pub mod args;
mod check;
mod client;
mod commands;
pub mod complete;
mod generate;
mod http;
mod options;
mod outcome;
mod status;
mod tables;
mod traffic;
mod wait;

pub use args::parse_key;
pub use check::check;
pub use client::{run as run_client, Command as ClientCommand, Pick};
pub use commands::{backend, client, demo, doctor, kill, reload, run, table, BackendArgs};
pub use generate::generate;
pub use http::{request, CliError};
pub use options::{
    admin_url, AdminSource, ClientOptions, Given, NoAdminEndpoint, TokenSource, DEFAULT_ADMIN_URL,
};
