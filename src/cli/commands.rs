//! Each subcommand's front end: its parsed arguments into the library call, the
//! outcome printed, and the exit code. `main.rs` parses and calls one of these.
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};

use super::args::{AdminArgs, BackendAction, ConnectionsCommand, ReportFormat, TableCommand};
use super::client::{Command as ClientCommand, Pick};
use super::http::CliError;
use super::options::{options, ClientOptions};
use super::outcome::{fail, report};
use crate::admin::{Action, WeightAsk};
use crate::balance::AdminState;
use crate::config::Config;

/// `crossbar doctor`'s exit code when the configuration itself is invalid.
const DOCTOR_CONFIG_ERROR: u8 = 2;

/// `crossbar run`: load the file, then serve until a signal stops it.
pub fn run(config: &Path, upgrade_socket: Option<PathBuf>) -> ExitCode {
    let cfg = match Config::load(config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let opts = crate::run::RunOptions { upgrade_socket };
    let rt = match runtime(cfg.workers) {
        Ok(rt) => rt,
        Err(e) => return report(Err(e)),
    };
    let ran = rt.block_on(crate::run::run_with(cfg, opts));
    // Everything that matters ended inside (connections drained, tables saved, the
    // admin endpoint stopped); a blocking task still running (a health check's name
    // lookup waiting on a slow resolver) must not hold the exit: dropping the runtime
    // would wait for it.
    rt.shutdown_background();
    report(ran)
}

/// `crossbar demo`: local TLS backends, crossbar in front, clients; the story, and
/// at its end the file crossbar's own log lines went to (`log`), if they did.
pub fn demo(serve: bool, log: Option<PathBuf>) -> ExitCode {
    report(runtime(None).and_then(|rt| rt.block_on(crate::demo::run(serve, log.as_deref()))))
}

/// `crossbar doctor`: the report on stdout, its verdict as the exit code.
pub fn doctor(config: &Path, format: ReportFormat, opts: crate::doctor::Options) -> ExitCode {
    let mut cfg = match Config::load(config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(DOCTOR_CONFIG_ERROR);
        }
    };
    let report = match runtime(None) {
        // The backends `discover` finds today are checked like the configured ones.
        Ok(rt) => rt.block_on(async {
            let dns = crate::discovery::resolve_into(&mut cfg).await;
            for line in &dns.lines {
                eprintln!("{line}");
            }
            crate::doctor::run(&cfg, opts, &dns).await
        }),
        Err(e) => return self::report(Err(e)),
    };
    match format {
        ReportFormat::Table => print!("{}", report.table()),
        ReportFormat::Json => println!("{}", report.json()),
    }
    ExitCode::from(report.exit_code)
}

/// Run one admin API client command: its output on stdout, or the error on stderr
/// and exit 1 (with `--json`, the server's JSON error as is).
pub fn client(args: AdminArgs, url_from_env: bool, cmd: ClientCommand) -> ExitCode {
    match options(args, url_from_env, false) {
        Ok(opts) => send(&opts, &cmd),
        Err(code) => code,
    }
}

/// `crossbar reload [-c FILE] [--strict] [--force]`: check FILE first (with
/// `--strict`, its `discover` names resolved too), then reload through the admin API
/// (which answers once the new config is live, or with the reason it was refused).
/// With `force`, a reload that leaves a service with no backend for new connections
/// is applied (with a warning) rather than refused.
pub fn reload(admin: AdminArgs, url_from_env: bool, force: bool, strict: bool) -> ExitCode {
    if strict {
        if let Some(path) = &admin.config {
            if let Err(code) = super::check::resolves(path) {
                return code;
            }
        }
    }
    match options(admin, url_from_env, true) {
        Ok(opts) => send(&opts, &ClientCommand::Reload { force }),
        Err(code) => code,
    }
}

/// Exit code of a wait ended by Ctrl-C (128 + SIGINT, as shells say it).
const EXIT_INTERRUPTED: u8 = 130;
/// Exit code of a usage error (clap's): an unknown name given to `--wait`.
const EXIT_USAGE: u8 = 2;

/// Does `cmd` wait for a backend's last connection?
fn waits(cmd: &ClientCommand) -> bool {
    matches!(cmd, ClientCommand::Backend { wait: Some(_), .. })
}

/// Send `cmd` with `opts`; print the answer or the error.
fn send(opts: &ClientOptions, cmd: &ClientCommand) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return report(Err(e).context("starting the runtime")),
    };
    match rt.block_on(super::client::run(opts, cmd)) {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(CliError::WaitInterrupted(why)) => {
            eprintln!("{why}");
            ExitCode::from(EXIT_INTERRUPTED)
        }
        Err(e @ CliError::Api { status, .. })
            if status == hyper::StatusCode::NOT_FOUND && waits(cmd) =>
        {
            // An unknown name is a usage error (clap's exit code), before any wait.
            fail(&e);
            ExitCode::from(EXIT_USAGE)
        }
        Err(CliError::Api { body, .. } | CliError::Unauthorized { body, .. }) if opts.json => {
            eprint!("{body}");
            ExitCode::FAILURE
        }
        Err(e) => fail(&e),
    }
}

/// `crossbar table show|delete|flush`.
pub fn table(command: TableCommand, url_from_env: bool) -> ExitCode {
    let pick =
        |key: Option<u64>, addr: Option<IpAddr>| key.map(Pick::Key).or(addr.map(Pick::Client));
    let (admin, cmd) = match command {
        TableCommand::Show {
            service,
            limit,
            key,
            client,
            admin,
        } => (
            admin,
            ClientCommand::TableShow {
                service,
                limit,
                pick: pick(key, client),
            },
        ),
        TableCommand::Delete {
            service,
            key,
            client,
            admin,
        } => match pick(key, client) {
            Some(pick) => (admin, ClientCommand::TableDelete { service, pick }),
            None => return fail(&"give --key KEY or --client ADDR"),
        },
        TableCommand::Flush { service, admin } => (admin, ClientCommand::TableFlush { service }),
    };
    self::client(admin, url_from_env, cmd)
}

/// `crossbar connections kill ID | --client ADDR`.
pub fn kill(command: ConnectionsCommand, url_from_env: bool) -> ExitCode {
    let ConnectionsCommand::Kill { id, client, admin } = command;
    let pick = match (id, client) {
        (Some(id), None) => format!("id={id}"),
        (None, Some(addr)) => match addr.parse::<std::net::SocketAddr>() {
            // The brackets and colons of an address are query characters as they are.
            Ok(_) => format!("client={addr}"),
            Err(_) => match addr.parse::<IpAddr>() {
                Ok(ip) => format!("client={ip}"),
                Err(_) => return fail(&format!("--client: expected IP or IP:PORT, got {addr:?}")),
            },
        },
        _ => return fail(&"give the connection's ID or --client ADDR"),
    };
    self::client(admin, url_from_env, ClientCommand::Kill { pick })
}

/// What `crossbar backend ACTION SERVICE/BACKEND [WEIGHT]` asks.
pub struct BackendArgs {
    /// drain, enable, disable or weight.
    pub action: BackendAction,
    /// `SERVICE/BACKEND`.
    pub target: String,
    /// For `weight`.
    pub weight: Option<WeightAsk>,
    /// Also the last backend taking new connections.
    pub force: bool,
    /// `--wait`, with its `--timeout`: after a drain or disable, wait for the
    /// backend's last connection.
    pub wait: Option<std::time::Duration>,
}

/// `crossbar backend drain|enable|disable|weight`.
pub fn backend(args: BackendArgs, admin: AdminArgs, url_from_env: bool) -> ExitCode {
    match backend_command(args) {
        Ok(cmd) => client(admin, url_from_env, cmd),
        Err(why) => fail(&why),
    }
}

/// The client command of `crossbar backend ...`, or why the arguments don't make one.
fn backend_command(args: BackendArgs) -> Result<ClientCommand, String> {
    let BackendArgs {
        action,
        target,
        weight,
        force,
        wait,
    } = args;
    let waits = matches!(action, BackendAction::Drain | BackendAction::Disable);
    if wait.is_some() && !waits {
        return Err(
            "--wait goes with `drain` and `disable` (it waits for the last connection)".into(),
        );
    }
    let Some((service, backend)) = target.split_once('/') else {
        return Err(format!("expected SERVICE/BACKEND, got {target:?}"));
    };
    let (service, backend) = (service.to_string(), backend.to_string());
    let action = match (action, weight) {
        (BackendAction::Weight, Some(weight)) => {
            return Ok(ClientCommand::Weight {
                service,
                backend,
                weight,
                force,
            })
        }
        (BackendAction::Weight, None) => {
            return Err("give the weight: crossbar backend weight SERVICE/BACKEND N".into())
        }
        (_, Some(w)) => {
            return Err(format!(
                "a weight ({w}) goes with `crossbar backend weight` only"
            ))
        }
        (BackendAction::ShutdownSessions, None) => {
            return Ok(ClientCommand::ShutdownSessions { service, backend })
        }
        (BackendAction::Drain, None) => Action::Set(AdminState::Drain),
        (BackendAction::Enable, None) => Action::Set(AdminState::Enabled),
        (BackendAction::Disable, None) => Action::Set(AdminState::Disabled),
        (BackendAction::Reset, None) => Action::Reset,
    };
    Ok(ClientCommand::Backend {
        service,
        backend,
        action,
        force,
        wait,
    })
}

/// A multi-threaded runtime, with `workers` threads (default: one per core).
pub(super) fn runtime(workers: Option<usize>) -> Result<tokio::runtime::Runtime> {
    let mut b = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = workers {
        b.worker_threads(n);
    }
    b.enable_all().build().context("starting the runtime")
}
