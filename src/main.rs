//! The `crossbar` command: parses the CLI, starts logging, loads the config and
//! calls into the library.
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use crossbar::config::Config;

/// Layer-4 TLS-passthrough load balancer for Puppet masters.
#[derive(Parser)]
#[command(version, about, long_about = None, after_help = "\
Examples:
  crossbar demo                         # self-contained demo on loopback, exits when done
  crossbar check -c /etc/crossbar/crossbar.yaml
  crossbar run -c /etc/crossbar/crossbar.yaml
  RUST_LOG=crossbar=debug crossbar run -c crossbar.yaml --log-format json")]
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
    let default_level = if matches!(cli.command, Command::Demo { .. }) {
        "warn"
    } else {
        "info"
    };
    init_logging(cli.log_format, default_level);
    match cli.command {
        Command::Check { config } => match Config::load(&config) {
            Ok(cfg) => {
                print!("{}", cfg.summary());
                println!("{}: OK", config.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{e}");
                ExitCode::FAILURE
            }
        },
        Command::Run { config } => {
            let cfg = match Config::load(&config) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("{e}");
                    return ExitCode::FAILURE;
                }
            };
            report(runtime(cfg.workers).and_then(|rt| rt.block_on(crossbar::run::run(cfg))))
        }
        Command::Demo { serve } => {
            report(runtime(None).and_then(|rt| rt.block_on(crossbar::demo::run(serve))))
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
