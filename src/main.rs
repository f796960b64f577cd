//! The `crossbar` command: parses the command line, starts logging and calls the
//! subcommand's front end in [`crossbar::cli`].
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};
use crossbar::cli::args::{Cli, Command, LogFormat};
use crossbar::cli::{self, BackendArgs, ClientCommand};
use tracing_subscriber::fmt::writer::BoxMakeWriter;

/// Log to stderr through [`crossbar::log_writer`] (a worker never waits on the log
/// destination); the returned guard writes what is queued when dropped, so main
/// holds it to the end. Without a thread for the writer, synchronously.
fn init_logging(format: LogFormat, default: &str) -> Option<crossbar::log_writer::Flush> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    if let Some(file) = demo_log_file() {
        // The demo's story is on stdout alone: crossbar's own lines go to a file
        // the story names at its end.
        let builder = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_ansi(false)
            .with_writer(std::sync::Mutex::new(file));
        match format {
            LogFormat::Text => builder.init(),
            LogFormat::Json => builder.json().flatten_event(true).init(),
        }
        return None;
    }
    // Colour only for a person at a terminal: journald and files store escape codes as is.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi);
    let (writer, flush) = match crossbar::log_writer::stderr() {
        Ok((w, f)) => {
            // Plain text lines (the access log's) may skip the formatter: the same
            // bytes, a quarter of the formatting instructions (access_log.rs).
            if !ansi && matches!(format, LogFormat::Text) {
                crossbar::log_writer::allow_direct_lines(&w);
            }
            (BoxMakeWriter::new(w), Some(f))
        }
        Err(e) => {
            eprintln!("warning: no log writer thread ({e}): logging synchronously");
            (BoxMakeWriter::new(std::io::stderr), None)
        }
    };
    let builder = builder.with_writer(writer);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
    flush
}

/// The demo's log file, created (`None` for other commands, or when it cannot be:
/// then the lines go to stderr as for every command).
fn demo_log_file() -> Option<std::fs::File> {
    DEMO_LOG.get().and_then(|p| match std::fs::File::create(p) {
        Ok(f) => Some(f),
        Err(e) => {
            eprintln!(
                "warning: cannot create {} ({e}): logging to stderr",
                p.display()
            );
            None
        }
    })
}

/// The demo's log file, when its lines go there.
fn demo_log_file_path() -> Option<std::path::PathBuf> {
    DEMO_LOG.get().filter(|p| p.exists()).cloned()
}

/// Where the demo logs, set before logging starts when the command is `demo`.
static DEMO_LOG: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();

fn main() -> ExitCode {
    // `COMPLETE=bash crossbar -- ...`: the shell asks for completions; answered, it exits.
    clap_complete::CompleteEnv::with_factory(Cli::command).complete();
    let matches = Cli::command().get_matches();
    let url_from_env = cli::args::admin_url_from_env(&matches);
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    // The demo prints its own story; its access log is there with RUST_LOG=info.
    let default_level = match cli.command {
        Command::Run { .. } | Command::Check { .. } => "info",
        _ => "warn",
    };
    if let Command::Demo { .. } = cli.command {
        let _ = DEMO_LOG.set(crossbar::demo::log_path()); // ok: set once, here
    }
    let _flush = init_logging(cli.log_format, default_level);
    match cli.command {
        Command::Run {
            config,
            upgrade_socket,
        } => cli::run(&config, upgrade_socket),
        Command::Check {
            config,
            config_only,
            resolve,
        } => cli::check(&config, config_only, resolve),
        Command::Doctor {
            config,
            format,
            status,
            wide,
        } => cli::doctor(&config, format, crossbar::doctor::Options { status, wide }),
        Command::Demo { serve } => cli::demo(serve, demo_log_file_path()),
        Command::Generate { what, dir } => cli::generate(what, dir),
        Command::Status { admin } => cli::client(admin, url_from_env, ClientCommand::Status),
        Command::Table { command } => cli::table(command, url_from_env),
        Command::Backend {
            action,
            target,
            weight,
            force,
            wait,
            timeout,
            admin,
        } => {
            let args = BackendArgs {
                action,
                target,
                weight,
                force,
                wait: wait.then_some(timeout),
            };
            cli::backend(args, admin, url_from_env)
        }
        Command::Connections {
            action: Some(kill), ..
        } => cli::kill(kill, url_from_env),
        Command::Connections {
            action: None,
            service,
            client,
            limit,
            admin,
        } => {
            let cmd = ClientCommand::Connections {
                service,
                client,
                limit,
            };
            cli::client(admin, url_from_env, cmd)
        }
        Command::Sources { limit, admin } => {
            cli::client(admin, url_from_env, ClientCommand::Sources { limit })
        }
        Command::Reload {
            admin,
            force,
            strict,
        } => cli::reload(admin, url_from_env, force, strict),
    }
}
