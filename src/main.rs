//! The `crossbar` command: parses the CLI, starts logging, loads the config and
//! calls into the library.
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{CommandFactory, Parser, Subcommand, ValueEnum};
use crossbar::admin::Action;
use crossbar::admin_client::{ClientOptions, Command as ClientCommand, DEFAULT_ADMIN_URL};
use crossbar::config::{Config, DEFAULT_CONFIG_PATH};

/// Command lines shown by `--help` and in crossbar(1).
const EXAMPLES: &str = "\
Examples:
  crossbar demo                         # self-contained demo on loopback, exits when done
  crossbar check                        # /etc/crossbar/crossbar.yaml unless -c FILE
  crossbar run -c /etc/crossbar/crossbar.yaml
  crossbar doctor -c /etc/crossbar/crossbar.yaml --status   # before switching traffic
  crossbar reload -c /etc/crossbar/crossbar.yaml   # check, then reload and wait
  RUST_LOG=crossbar=debug crossbar run -c crossbar.yaml --log-format json
  crossbar status                       # services and backends, from the admin API
  crossbar backend drain puppet/compile1 --token-file /etc/crossbar/admin.token
  crossbar table show puppet --limit 20";

/// Layer-4 TLS-passthrough load balancer for Puppet masters.
#[derive(Parser)]
#[command(version, about, long_about = None, after_help = EXAMPLES)]
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
    /// Reload the running configuration file and wait until it is live (admin API client).
    ///
    /// With -c FILE, FILE is checked first (like `crossbar check`, files it names
    /// included) and nothing is sent when it has errors; the admin address and
    /// token file then come from FILE unless --admin/--token-file are given. This is
    /// the unit's ExecReload: `systemctl reload` fails on a bad file.
    Reload {
        /// Check this configuration file first; take the admin endpoint from it.
        #[arg(short, long)]
        config: Option<PathBuf>,
        #[command(flatten)]
        admin: AdminArgs,
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
enum Generated {
    /// crossbar(1) and a page per subcommand, in roff.
    Man,
    /// bash completions.
    Bash,
    /// zsh completions.
    Zsh,
    /// fish completions.
    Fish,
}

#[derive(Clone, Copy, ValueEnum)]
enum ReportFormat {
    Table,
    Json,
}

/// `crossbar doctor`'s exit code when the configuration itself is invalid.
const DOCTOR_CONFIG_ERROR: u8 = 2;

#[derive(Subcommand)]
enum TableCommand {
    /// The most recently used entries and the table's counters.
    Show {
        /// Service name.
        service: String,
        /// Entries to show (1..=10000; the server's default is 1000).
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
    // Colour only for a person at a terminal: journald and files store escape codes as is.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
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
        Command::Check {
            config,
            config_only,
        } => check(&config, config_only),
        Command::Generate { what, dir } => generate(what, dir),
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
        Command::Doctor {
            config,
            format,
            status,
            wide,
        } => doctor(&config, format, crossbar::doctor::Options { status, wide }),
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
        Command::Reload { config, admin } => reload(config, admin),
    }
}

/// `crossbar check`: the summary and every warning, or every problem.
fn check(config: &std::path::Path, config_only: bool) -> ExitCode {
    let loaded = if config_only {
        Config::load(config)
    } else {
        Config::load_and_check_files(config)
    };
    match loaded {
        Ok(cfg) => {
            for w in &cfg.warnings {
                eprintln!("{w}");
            }
            print!("{}", cfg.summary());
            for s in &cfg.services {
                let plan = crossbar::relay::plan(s.relay).describe();
                println!("relay: service {} uses {plan}", s.name);
            }
            println!("{}: OK", config.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
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

/// `crossbar doctor`: the report on stdout, its verdict as the exit code.
fn doctor(
    config: &std::path::Path,
    format: ReportFormat,
    opts: crossbar::doctor::Options,
) -> ExitCode {
    let cfg = match Config::load(config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(DOCTOR_CONFIG_ERROR);
        }
    };
    let report = match runtime(None) {
        Ok(rt) => rt.block_on(crossbar::doctor::run(&cfg, opts)),
        Err(e) => return report(Err(e)),
    };
    match format {
        ReportFormat::Table => print!("{}", report.table()),
        ReportFormat::Json => println!("{}", report.json()),
    }
    ExitCode::from(report.exit_code)
}

/// `crossbar reload [-c FILE]`: check FILE first, then reload through the admin API
/// (which answers once the new config is live, or with the reason it was refused).
fn reload(config: Option<PathBuf>, mut admin: AdminArgs) -> ExitCode {
    if let Some(path) = config {
        let cfg = match Config::load_and_check_files(&path) {
            Ok(cfg) => {
                for w in &cfg.warnings {
                    eprintln!("{w}");
                }
                cfg
            }
            Err(e) => {
                eprintln!("{e}");
                eprintln!(
                    "reload refused: {} has errors; the running configuration stays",
                    path.display()
                );
                return ExitCode::FAILURE;
            }
        };
        let Some(a) = cfg.admin else {
            eprintln!("error: {} disables the admin endpoint: reload with SIGHUP (systemctl kill -s HUP crossbar)", path.display());
            return ExitCode::FAILURE;
        };
        if admin.url == DEFAULT_ADMIN_URL {
            admin.url = crossbar::admin_client::admin_url(a.listen);
        }
        if admin.token_file.is_none() {
            admin.token_file = a.token_file;
        }
    }
    client(admin, ClientCommand::Reload)
}

/// `crossbar generate WHAT [DIR]`: the man pages into DIR, or a completion script on stdout.
fn generate(what: Generated, dir: Option<PathBuf>) -> ExitCode {
    let mut cmd = Cli::command();
    let mut out = std::io::stdout();
    let shell = match what {
        Generated::Man => {
            let dir = dir.unwrap_or_else(|| PathBuf::from("."));
            return report(
                man_pages(cmd, &dir)
                    .with_context(|| format!("writing man pages into {}", dir.display())),
            );
        }
        Generated::Bash => clap_complete::Shell::Bash,
        Generated::Zsh => clap_complete::Shell::Zsh,
        Generated::Fish => clap_complete::Shell::Fish,
    };
    clap_complete::generate(shell, &mut cmd, "crossbar", &mut out);
    ExitCode::SUCCESS
}

/// crossbar(1) and crossbar-SUBCOMMAND(1) into `dir`. The main page gets EXAMPLES
/// kept as lines (clap_mangen would reflow them), FILES and SEE ALSO.
fn man_pages(cmd: clap::Command, dir: &std::path::Path) -> Result<()> {
    clap_mangen::generate_to(cmd.clone(), dir)?;
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    let man = clap_mangen::Man::new(cmd);
    let mut page = Vec::new();
    man.render_title(&mut page)?;
    man.render_name_section(&mut page)?;
    man.render_synopsis_section(&mut page)?;
    man.render_description_section(&mut page)?;
    man.render_options_section(&mut page)?;
    man.render_subcommands_section(&mut page)?;
    page.extend_from_slice(MAN_TAIL.replace('-', "\\-").as_bytes());
    let examples = EXAMPLES
        .trim_start_matches("Examples:\n")
        .replace('-', "\\-");
    let page = String::from_utf8_lossy(&page).replace("@EXAMPLES@", &examples);
    std::fs::write(dir.join("crossbar.1"), page)?;
    Ok(())
}

/// The end of crossbar(1), in roff; `@EXAMPLES@` is replaced by [`EXAMPLES`].
const MAN_TAIL: &str = r#".SH EXAMPLES
.nf
@EXAMPLES@
.fi
.SH FILES
.TP
/etc/crossbar/crossbar.yaml
The configuration (crossbar-run, crossbar-check and crossbar-reload read it without \fB-c\fR).
.TP
/var/lib/crossbar/
Stick-table state files (stick.state_file).
.TP
/run/crossbar/
The hitless-upgrade socket (run \fB--upgrade-socket\fR /run/crossbar/upgrade.sock).
.SH SIGNALS
SIGHUP reloads the configuration file (a bad file keeps the running one);
SIGTERM and SIGINT stop accepting and drain established connections for up to
timeouts.shutdown, a second one exits at once.
.SH SEE ALSO
/usr/share/doc/crossbar/ (configuration.md, operations.md, metrics.md),
systemctl(1), journalctl(1)
"#;

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
