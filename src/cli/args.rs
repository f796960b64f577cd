//! The `crossbar` command line's arguments (clap): the subcommands, their flags and
//! the examples `--help` and crossbar(1) show. Plain declarations; what each
//! command does is in the other files of `cli/`.
use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};
use clap_complete::ArgValueCandidates;

use super::complete;
pub use super::options::AdminArgs;

use crate::admin::WeightAsk;
use crate::config::DEFAULT_CONFIG_PATH;

/// Command lines shown by `--help` and in crossbar(1).
pub const EXAMPLES: &str = "\
Examples:
  crossbar demo                         # self-contained demo on loopback, exits when done
  crossbar check                        # /etc/crossbar/crossbar.yaml unless -c FILE
  crossbar run -c /etc/crossbar/crossbar.yaml
  crossbar doctor -c /etc/crossbar/crossbar.yaml --status   # before switching traffic
  crossbar reload -c /etc/crossbar/crossbar.yaml   # check, then reload and wait
  RUST_LOG=crossbar=debug crossbar run -c crossbar.yaml --log-format json
  crossbar status                       # admin address and token from /etc/crossbar/crossbar.yaml
  crossbar backend drain puppet/compile1           # -c FILE for another config
  crossbar backend weight puppet/compile3 10 -c /etc/crossbar/crossbar.yaml   # until reload
  crossbar table show puppet --limit 20
  crossbar table show puppet --client 10.1.2.3     # where this agent's source entry points
  crossbar table delete puppet --key 3f2a0c9e51d7b864 -c /etc/crossbar/crossbar.yaml
  crossbar connections puppet                      # open connections, the oldest first
  crossbar connections kill 4711                   # close one (or --client 10.1.2.3)
  crossbar backend shutdown-sessions puppet/compile3   # close all of its connections
  crossbar sources                                 # per_source: the busiest client sources";

/// Layer-4 TLS-passthrough load balancer for Puppet masters.
#[derive(Parser)]
#[command(version, about, long_about = None, after_help = EXAMPLES)]
pub struct Cli {
    /// Log line format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// `--log-format`: a line of text, or a JSON object, per event.
// A doc line on a value's variant would become that value's help text and change
// every --help and man page, hence none on these value enums' variants.
#[allow(missing_docs)]
#[derive(Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// The subcommands.
#[derive(Subcommand)]
pub enum Command {
    /// Run the balancer. SIGHUP reloads the file; SIGTERM/SIGINT drain and exit.
    Run {
        /// Configuration file.
        #[arg(short, long, default_value = DEFAULT_CONFIG_PATH)]
        config: PathBuf,
        /// Unix socket for hitless upgrades: if a crossbar serves there, take over its
        /// listening sockets (it then drains and exits); then serve it for the next one.
        #[arg(long, value_name = "PATH")]
        upgrade_socket: Option<PathBuf>,
    },
    /// Validate a configuration file and print a summary (exit 1 on errors).
    Check {
        /// Configuration file.
        #[arg(short, long, default_value = DEFAULT_CONFIG_PATH)]
        config: PathBuf,
        /// Check the file alone, without opening the files it names (token file,
        /// certificates, state-file directory): for a config meant for another host.
        #[arg(long)]
        config_only: bool,
        /// Also look up every `discover` name now and print what it resolves to; exit 1
        /// when a service would start with no backend (a name that does not resolve
        /// and no backend in the file) or a record names crossbar itself.
        #[arg(long)]
        resolve: bool,
    },
    /// Connect to every backend and check what agents need: certificate names, issuer
    /// and expiry, the Puppet CA, TLS versions, stickiness, and each backend's health
    /// check run exactly as `run` runs it. Exit 0 clean, 1 warnings, 2 errors (among
    /// them: no backend of a service would pass its health check).
    Doctor {
        /// Configuration file.
        #[arg(short, long, default_value = DEFAULT_CONFIG_PATH)]
        config: PathBuf,
        /// Output format.
        #[arg(long, value_enum, default_value_t = ReportFormat::Table)]
        format: ReportFormat,
        /// Also ask `/status/v1/simple` of backends without an `https` check.
        #[arg(long)]
        status: bool,
        /// Show every column (server name, subject, names, issuer, stickiness,
        /// status); the default table fits 120 columns.
        #[arg(long, short)]
        wide: bool,
    },
    /// Start local TLS backends and crossbar in front, run clients, show what happened.
    Demo {
        /// Keep running after the client run (until Ctrl-C).
        #[arg(long)]
        serve: bool,
    },
    /// Show services, listeners and backends (admin API client).
    Status {
        /// How to reach the admin API.
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Show, look up, delete or flush a service's stick entries (admin API client).
    Table {
        /// show, delete or flush.
        #[command(subcommand)]
        command: TableCommand,
    },
    /// Drain, enable or disable a backend, or set its weight (admin API client).
    ///
    /// Draining or disabling the last available backend of a service is refused
    /// (the server refuses it: every new client would get no backend) unless
    /// --force is given; enabling never is. So is weight 0 on the last backend
    /// taking new connections.
    ///
    /// `weight` sets the weight new connections are balanced by (HAProxy's `set
    /// weight`): WEIGHT is 0..=256, or N% of the configured weight. 0 sends it no
    /// new connections while sticky clients still come back (not a drain).
    ///
    /// What the operator sets (drain, disable, enable, weight) wins over the file
    /// and DNS: it holds across DNS changes, reloads that leave the backend's own
    /// settings alone, and restarts (with `state_file`), until a reload changes
    /// the backend or `reset` returns it to the file's values.
    Backend {
        /// What to do: drain (no new connections, open ones continue), enable,
        /// disable, weight, reset (back to the file's state and weight),
        /// shutdown-sessions (close every open connection it has; its state stays:
        /// drain or disable it first to keep new ones away).
        action: BackendAction,
        /// The backend, as SERVICE/BACKEND.
        #[arg(add = ArgValueCandidates::new(complete::targets))]
        target: String,
        /// For `weight`: the new weight, 0..=256, or N% of the configured weight.
        #[arg(required_if_eq("action", "weight"), value_parser = parse_weight)]
        weight: Option<WeightAsk>,
        /// Drain or disable it, or set weight 0, even when it is the last backend of
        /// its service taking new connections.
        #[arg(long)]
        force: bool,
        /// With drain or disable: then wait until the backend has no connection
        /// left (exit 0), showing how many are left on a terminal; at --timeout,
        /// exit 1 naming those left, their ages and clients. Ctrl-C ends the wait
        /// (exit 130) and leaves the drain in place.
        #[arg(long)]
        wait: bool,
        /// How long --wait waits at most (e.g. 90s, 10m; above 0, at most a week).
        #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = super::wait::parse_timeout, requires = "wait")]
        timeout: std::time::Duration,
        /// How to reach the admin API.
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// The open connections, the oldest first: id, service, client, backend, age,
    /// bytes each way and state (admin API client; HAProxy's `show sess`); `kill`
    /// closes one (HAProxy's `shutdown session`).
    #[command(args_conflicts_with_subcommands = true)]
    Connections {
        /// `kill`: close a connection.
        #[command(subcommand)]
        action: Option<ConnectionsCommand>,
        /// Only this service's connections.
        #[arg(add = ArgValueCandidates::new(complete::services))]
        service: Option<String>,
        /// Only the connections from this client address.
        #[arg(long, value_name = "ADDR")]
        client: Option<std::net::IpAddr>,
        /// Connections to show (1..=10000; the server's default is 100).
        #[arg(long)]
        limit: Option<usize>,
        /// How to reach the admin API.
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// The client sources with the most open connections on each listener with
    /// `per_source` limits: open, tokens left, admitted, refused (admin API client).
    Sources {
        /// Sources to show per listener (1..=10000; the server's default is 20).
        #[arg(long)]
        limit: Option<usize>,
        /// How to reach the admin API.
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Reload the running configuration file and wait until it is live (admin API client).
    ///
    /// The server checks the file as `crossbar check` does (files it names included)
    /// and tries new health settings on the backends first; a refusal prints its
    /// reason and exits 1, an applied reload prints its warnings. With -c FILE, FILE is checked first (like `crossbar check`, files it names
    /// included) and nothing is sent when it has errors; the admin address and
    /// token file then come from FILE unless --admin/--token-file are given. This is
    /// the unit's ExecReload: `systemctl reload` fails on a bad file. A reload that
    /// would leave a service with no backend for new connections (the others
    /// drained, disabled, down or at weight 0, the last one removed) is refused
    /// like the same drain, unless --force.
    Reload {
        /// How to reach the admin API.
        #[command(flatten)]
        admin: AdminArgs,
        /// Apply it even if it leaves a service with no backend for new
        /// connections (the answer, the log and `crossbar status` warn of it).
        #[arg(long)]
        force: bool,
        /// Before sending, look up every `discover` name of FILE (needs -c FILE) as
        /// `crossbar check --resolve` does, and send nothing (exit 1) when a service
        /// would have no backend or a record names crossbar itself: a typo'd SRV name
        /// fails the reload (and the Puppet run that pushed it). Without it such a
        /// reload is applied with a warning (exit 0): the last good set serves on.
        #[arg(long, requires = "config")]
        strict: bool,
    },
    /// Print a shell completion script, or write the man pages, for packaging.
    #[command(hide = true)]
    Generate {
        /// What to generate.
        #[arg(value_enum)]
        what: Generated,
        /// For `man`: the directory to write crossbar.1 and crossbar-SUBCOMMAND.1 into.
        #[arg(required_if_eq("what", "man"))]
        dir: Option<PathBuf>,
    },
}

/// What `crossbar generate` prints.
#[derive(Clone, Copy, ValueEnum)]
pub enum Generated {
    /// crossbar(1) and a page per subcommand, in roff.
    Man,
    /// bash completions.
    Bash,
    /// zsh completions.
    Zsh,
    /// fish completions.
    Fish,
}

/// `crossbar doctor --format`: aligned columns, or one JSON document.
#[allow(missing_docs)] // as LogFormat: no help text per value
#[derive(Clone, Copy, ValueEnum)]
pub enum ReportFormat {
    Table,
    Json,
}

/// `crossbar connections`'s subcommand.
#[derive(Subcommand)]
pub enum ConnectionsCommand {
    /// Close open connections (the client sees its connection close): the one with
    /// ID (as `crossbar connections` lists it), or every one from --client ADDR
    /// (IP:PORT for one of them).
    #[command(group(clap::ArgGroup::new("which").required(true).args(["id", "client"])))]
    Kill {
        /// The connection's id.
        id: Option<u64>,
        /// The client address: IP (all its connections) or IP:PORT.
        #[arg(long, value_name = "ADDR")]
        client: Option<String>,
        /// How to reach the admin API.
        #[command(flatten)]
        admin: AdminArgs,
    },
}

/// `crossbar table`'s subcommands.
#[derive(Subcommand)]
pub enum TableCommand {
    /// The most recently used entries and the table's counters, or one entry
    /// (--key) or the entry a client address falls under (--client).
    Show {
        /// Service name.
        #[arg(add = ArgValueCandidates::new(complete::services))]
        service: String,
        /// Entries to show (1..=10000; the server's default is 1000).
        #[arg(long)]
        limit: Option<usize>,
        /// Only the entry with this key (16 hex digits, as `table show` prints it).
        #[arg(long, value_parser = parse_key, conflicts_with = "client")]
        key: Option<u64>,
        /// Only the source entry this client address falls under (`source`
        /// stickiness, or the resume hint of its last full handshake). Session,
        /// ticket and PSK entries keep no client address.
        #[arg(long, value_name = "ADDR")]
        client: Option<std::net::IpAddr>,
        /// How to reach the admin API.
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Delete one entry (--key) or the source entry of a client address (--client):
    /// that client then lands wherever balancing puts it.
    #[command(group(clap::ArgGroup::new("which").required(true).args(["key", "client"])))]
    Delete {
        /// Service name.
        #[arg(add = ArgValueCandidates::new(complete::services))]
        service: String,
        /// The entry's key (16 hex digits, as `table show` prints it).
        #[arg(long, value_parser = parse_key)]
        key: Option<u64>,
        /// The client address whose source entry goes.
        #[arg(long, value_name = "ADDR")]
        client: Option<std::net::IpAddr>,
        /// How to reach the admin API.
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Remove every entry (clients then land wherever balancing puts them).
    Flush {
        /// Service name.
        #[arg(add = ArgValueCandidates::new(complete::services))]
        service: String,
        /// How to reach the admin API.
        #[command(flatten)]
        admin: AdminArgs,
    },
}

/// `crossbar backend ACTION`: drain, enable, disable, set the weight, or close
/// every connection it has.
#[allow(missing_docs)] // as LogFormat: no help text per value
#[derive(Clone, Copy, ValueEnum)]
pub enum BackendAction {
    Drain,
    Enable,
    Disable,
    Weight,
    Reset,
    ShutdownSessions,
}

/// Parse a stick key as `table show` prints it (16 hex digits).
pub fn parse_key(s: &str) -> Result<u64, String> {
    u64::from_str_radix(s, 16)
        .ok()
        .filter(|_| s.len() == 16 && s.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| format!("expected the 16 hex digits `table show` prints, got {s:?}"))
}

/// `WEIGHT` of `crossbar backend weight`, checked before anything is sent.
fn parse_weight(s: &str) -> Result<WeightAsk, String> {
    crate::admin::parse_weight(s).map_err(|e| {
        let msg = e.to_string();
        msg.strip_prefix("bad query: ").unwrap_or(&msg).to_string()
    })
}

/// Did `--admin`'s value come from CROSSBAR_ADMIN (said when nothing answers there)?
pub fn admin_url_from_env(matches: &clap::ArgMatches) -> bool {
    let mut m = matches;
    while let Some((_, sub)) = m.subcommand() {
        m = sub;
    }
    m.ids().any(|id| id == "url")
        && m.value_source("url") == Some(clap::parser::ValueSource::EnvVariable)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_16_hex_digits() {
        assert_eq!(parse_key("00000000000000ff"), Ok(255));
        assert!(parse_key("ff").is_err());
        assert!(parse_key("+0000000000000ff").is_err());
        assert!(parse_key("0x000000000000ff").is_err());
    }
}
