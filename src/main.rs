//! The `crossbar` command: parses the CLI, starts logging, loads the config and
//! calls into the library.
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use crossbar::admin::Action;
use crossbar::admin_client::{ClientOptions, Command as ClientCommand, DEFAULT_ADMIN_URL};
use crossbar::config::{Config, RelayMode};

/// Layer-4 TLS-passthrough load balancer for Puppet masters.
#[derive(Parser)]
#[command(version, about, long_about = None, after_help = "\
Examples:
  crossbar demo                         # self-contained demo on loopback, exits when done
  crossbar check -c /etc/crossbar/crossbar.yaml
  crossbar run -c /etc/crossbar/crossbar.yaml
  RUST_LOG=crossbar=debug crossbar run -c crossbar.yaml --log-format json
  crossbar status                       # services and backends, from the admin API
  crossbar backend drain puppet/compile1 --token-file /etc/crossbar/admin.token
  crossbar table show puppet --limit 20")]
struct Cli {
    /// Log line format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run the balancer. SIGHUP reloads the file; SIGTERM/SIGINT drain and exit.
    Run {
        /// Configuration file.
        #[arg(short, long)]
        config: PathBuf,
        /// Unix socket for hitless upgrades: if a crossbar serves there, take over its
        /// listening sockets (it then drains and exits); then serve it for the next one.
        #[arg(long, value_name = "PATH")]
        upgrade_socket: Option<PathBuf>,
    },
    /// Validate a configuration file and print a summary (exit 1 on errors).
    Check {
        /// Configuration file.
        #[arg(short, long)]
        config: PathBuf,
    },
    /// Start local TLS backends and crossbar in front, run clients, show what happened.
    Demo {
        /// Keep running after the client run (until Ctrl-C).
        #[arg(long)]
        serve: bool,
    },
    /// Show services, listeners and backends (admin API client).
    Status {
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Show or flush a service's stick table (admin API client).
    Table {
        #[command(subcommand)]
        command: TableCommand,
    },
    /// Drain, enable or disable a backend (admin API client).
    Backend {
        /// What to do: drain (no new connections, open ones continue), enable, disable.
        action: BackendAction,
        /// The backend, as SERVICE/BACKEND.
        target: String,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Reload the running configuration file, like SIGHUP (admin API client).
    Reload {
        #[command(flatten)]
        admin: AdminArgs,
    },
}

#[derive(Subcommand)]
enum TableCommand {
    /// The most recently used entries and the table's counters.
    Show {
        /// Service name.
        service: String,
        /// Entries to show (1..=100000; the server's default is 1000).
        #[arg(long)]
        limit: Option<usize>,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Remove every entry (clients then land wherever balancing puts them).
    Flush {
        /// Service name.
        service: String,
        #[command(flatten)]
        admin: AdminArgs,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum BackendAction {
    Drain,
    Enable,
    Disable,
}

/// How to reach the admin API.
#[derive(clap::Args)]
struct AdminArgs {
    /// Admin endpoint URL.
    #[arg(long = "admin", env = "CROSSBAR_ADMIN", default_value = DEFAULT_ADMIN_URL)]
    url: String,
    /// File holding the bearer token (needed for writes when the server has admin.token_file).
    #[arg(long, env = "CROSSBAR_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// Print the server's JSON instead of a table.
    #[arg(long)]
    json: bool,
}

impl AdminArgs {
    fn options(self) -> ClientOptions {
        ClientOptions {
            admin: self.url,
            token_file: self.token_file,
            json: self.json,
        }
    }
}

fn init_logging(format: LogFormat, default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The demo prints its own story; its access log is there with RUST_LOG=info.
    let default_level = match cli.command {
        Command::Run { .. } | Command::Check { .. } => "info",
        _ => "warn",
    };
    init_logging(cli.log_format, default_level);
    match cli.command {
        Command::Check { config } => match Config::load(&config) {
            Ok(cfg) => {
                print!("{}", cfg.summary());
                #[cfg(target_os = "linux")]
                if cfg.services.iter().any(|s| s.relay == RelayMode::Kernel) {
                    println!("{}", crossbar::relay::kernel::status());
                }
                println!("{}: OK", config.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{e}");
                ExitCode::FAILURE
            }
        },
        Command::Run {
            config,
            upgrade_socket,
        } => {
            let cfg = match Config::load(&config) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("{e}");
                    return ExitCode::FAILURE;
                }
            };
            let opts = crossbar::run::RunOptions { upgrade_socket };
            report(
                runtime(cfg.workers).and_then(|rt| rt.block_on(crossbar::run::run_with(cfg, opts))),
            )
        }
        Command::Demo { serve } => {
            report(runtime(None).and_then(|rt| rt.block_on(crossbar::demo::run(serve))))
        }
        Command::Status { admin } => client(admin, ClientCommand::Status),
        Command::Table {
            command:
                TableCommand::Show {
                    service,
                    limit,
                    admin,
                },
        } => client(admin, ClientCommand::TableShow { service, limit }),
        Command::Table {
            command: TableCommand::Flush { service, admin },
        } => client(admin, ClientCommand::TableFlush { service }),
        Command::Backend {
            action,
            target,
            admin,
        } => {
            let Some((service, backend)) = target.split_once('/') else {
                eprintln!("error: expected SERVICE/BACKEND, got {target:?}");
                return ExitCode::FAILURE;
            };
            let action = match action {
                BackendAction::Drain => Action::Drain,
                BackendAction::Enable => Action::Enable,
                BackendAction::Disable => Action::Disable,
            };
            client(
                admin,
                ClientCommand::Backend {
                    service: service.to_string(),
                    backend: backend.to_string(),
                    action,
                },
            )
        }
        Command::Reload { admin } => client(admin, ClientCommand::Reload),
    }
}

/// Run one admin API client command: its output on stdout, or the error on stderr
/// and exit 1 (with `--json`, the server's JSON error as is).
fn client(args: AdminArgs, cmd: ClientCommand) -> ExitCode {
    let opts = args.options();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return report(Err(e).context("starting the runtime")),
    };
    match rt.block_on(crossbar::admin_client::run(&opts, &cmd)) {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(crossbar::admin_client::CliError::Api { body, .. }) if opts.json => {
            eprint!("{body}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn runtime(workers: Option<usize>) -> Result<tokio::runtime::Runtime> {
    let mut b = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = workers {
        b.worker_threads(n);
    }
    b.enable_all().build().context("starting the runtime")
}

fn report(r: Result<()>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
