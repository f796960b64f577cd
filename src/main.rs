//! The `crossbar` command: parses the CLI, starts logging, loads the config and
//! calls into the library.
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use crossbar::admin::{Action, WeightAsk};
use crossbar::admin_client::{ClientOptions, Command as ClientCommand, Given, Pick};
use crossbar::config::{Config, DEFAULT_CONFIG_PATH};
use tracing_subscriber::fmt::writer::BoxMakeWriter;

/// Command lines shown by `--help` and in crossbar(1).
const EXAMPLES: &str = "\
Examples:
  crossbar demo                         # self-contained demo on loopback, exits when done
  crossbar check                        # /etc/crossbar/crossbar.yaml unless -c FILE
  crossbar run -c /etc/crossbar/crossbar.yaml
  crossbar doctor -c /etc/crossbar/crossbar.yaml --status   # before switching traffic
  crossbar reload -c /etc/crossbar/crossbar.yaml   # check, then reload and wait
  RUST_LOG=crossbar=debug crossbar run -c crossbar.yaml --log-format json
  crossbar status -c /etc/crossbar/crossbar.yaml   # admin address and token from the config
  crossbar backend drain puppet/compile1 -c /etc/crossbar/crossbar.yaml
  crossbar backend weight puppet/compile3 10 -c /etc/crossbar/crossbar.yaml   # until reload
  crossbar table show puppet --limit 20
  crossbar table show puppet --client 10.1.2.3     # where this agent's source entry points
  crossbar table delete puppet --key 3f2a0c9e51d7b864 -c /etc/crossbar/crossbar.yaml
  crossbar connections puppet                      # open connections, the oldest first
  crossbar sources                                 # per_source: the busiest client sources";

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
        /// Also look up every `discover` name now and print what it resolves to (a
        /// failed lookup is reported, never an error: the file is what is checked).
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
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Show, look up, delete or flush a service's stick entries (admin API client).
    Table {
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
    /// new connections while sticky clients still come back (not a drain). It
    /// holds until the next reload or restart, which return every backend to the
    /// weight in the file.
    Backend {
        /// What to do: drain (no new connections, open ones continue), enable,
        /// disable, weight.
        action: BackendAction,
        /// The backend, as SERVICE/BACKEND.
        target: String,
        /// For `weight`: the new weight, 0..=256, or N% of the configured weight.
        #[arg(required_if_eq("action", "weight"), value_parser = parse_weight)]
        weight: Option<WeightAsk>,
        /// Drain or disable it, or set weight 0, even when it is the last backend of
        /// its service taking new connections.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// The open connections, the oldest first: service, client, backend, age,
    /// bytes each way and state (admin API client; HAProxy's `show sess`).
    Connections {
        /// Only this service's connections.
        service: Option<String>,
        /// Only the connections from this client address.
        #[arg(long, value_name = "ADDR")]
        client: Option<std::net::IpAddr>,
        /// Connections to show (1..=10000; the server's default is 100).
        #[arg(long)]
        limit: Option<usize>,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// The client sources with the most open connections on each listener with
    /// `per_source` limits: open, tokens left, admitted, refused (admin API client).
    Sources {
        /// Sources to show per listener (1..=10000; the server's default is 20).
        #[arg(long)]
        limit: Option<usize>,
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
    /// the unit's ExecReload: `systemctl reload` fails on a bad file.
    Reload {
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
    /// The most recently used entries and the table's counters, or one entry
    /// (--key) or the entry a client address falls under (--client).
    Show {
        /// Service name.
        service: String,
        /// Entries to show (1..=10000; the server's default is 1000).
        #[arg(long)]
        limit: Option<usize>,
        /// Only the entry with this key (16 hex digits, as `table show` prints it).
        #[arg(long, value_parser = crossbar::admin_client::parse_key, conflicts_with = "client")]
        key: Option<u64>,
        /// Only the source entry this client address falls under (`source`
        /// stickiness, or the resume hint of its last full handshake). Session,
        /// ticket and PSK entries keep no client address.
        #[arg(long, value_name = "ADDR")]
        client: Option<std::net::IpAddr>,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Delete one entry (--key) or the source entry of a client address (--client):
    /// that client then lands wherever balancing puts it.
    #[command(group(clap::ArgGroup::new("which").required(true).args(["key", "client"])))]
    Delete {
        /// Service name.
        service: String,
        /// The entry's key (16 hex digits, as `table show` prints it).
        #[arg(long, value_parser = crossbar::admin_client::parse_key)]
        key: Option<u64>,
        /// The client address whose source entry goes.
        #[arg(long, value_name = "ADDR")]
        client: Option<std::net::IpAddr>,
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
    Weight,
}

/// `WEIGHT` of `crossbar backend weight`, checked before anything is sent.
fn parse_weight(s: &str) -> Result<WeightAsk, String> {
    crossbar::admin::parse_weight(s).map_err(|e| {
        let msg = e.to_string();
        msg.strip_prefix("bad query: ").unwrap_or(&msg).to_string()
    })
}

/// How to reach the admin API.
#[derive(clap::Args)]
struct AdminArgs {
    /// crossbar's configuration file: the admin address and token file come from
    /// its `admin:` section (--admin and --token-file override it).
    #[arg(short, long)]
    config: Option<PathBuf>,
    /// Admin endpoint URL [default: http://127.0.0.1:9140, or admin.listen of -c FILE].
    #[arg(long = "admin", env = "CROSSBAR_ADMIN", value_name = "URL")]
    url: Option<String>,
    /// File holding the bearer token (needed for writes when the server has admin.token_file).
    #[arg(long, env = "CROSSBAR_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// Print the server's JSON instead of a table.
    #[arg(long)]
    json: bool,
}

impl AdminArgs {
    /// The client options: --admin/--token-file (or their environment variables)
    /// over -c FILE's `admin:` section over the default. With `check`, FILE is
    /// checked like `crossbar check` (the files it names included) and its warnings
    /// are printed. On error, what to exit with (the reason is printed).
    fn options(self, url_from_env: bool, check: bool) -> Result<ClientOptions, ExitCode> {
        let given = Given {
            url: self.url,
            url_from_env,
            token_file: self.token_file,
            json: self.json,
        };
        let Some(path) = self.config else {
            return ClientOptions::new(given, None).map_err(|e| fail(&e));
        };
        let loaded = if check {
            Config::load_and_check_files(&path)
        } else {
            Config::load(&path)
        };
        let cfg = match loaded {
            Ok(cfg) => cfg,
            Err(e) => {
                eprintln!("{e}");
                if check {
                    eprintln!(
                        "reload refused: {} has errors; the running configuration stays",
                        path.display()
                    );
                } else {
                    eprintln!("error: the admin address comes from {}: fix it, or give --admin (and --token-file)", path.display());
                }
                return Err(ExitCode::FAILURE);
            }
        };
        if check {
            for w in &cfg.warnings {
                eprintln!("{w}");
            }
        }
        ClientOptions::new(given, Some((&path, &cfg))).map_err(|e| fail(&e))
    }
}

/// Print `error: E` and exit 1.
fn fail(e: &dyn std::fmt::Display) -> ExitCode {
    eprintln!("error: {e}");
    ExitCode::FAILURE
}

/// Did `--admin`'s value come from CROSSBAR_ADMIN (said when nothing answers there)?
fn admin_url_from_env(matches: &clap::ArgMatches) -> bool {
    let mut m = matches;
    while let Some((_, sub)) = m.subcommand() {
        m = sub;
    }
    m.ids().any(|id| id == "url")
        && m.value_source("url") == Some(clap::parser::ValueSource::EnvVariable)
}

/// Log to stderr through [`crossbar::log_writer`] (a worker never waits on the log
/// destination); the returned guard writes what is queued when dropped, so main
/// holds it to the end. Without a thread for the writer, synchronously.
fn init_logging(format: LogFormat, default: &str) -> Option<crossbar::log_writer::Flush> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
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

fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let url_from_env = admin_url_from_env(&matches);
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    // The demo prints its own story; its access log is there with RUST_LOG=info.
    let default_level = match cli.command {
        Command::Run { .. } | Command::Check { .. } => "info",
        _ => "warn",
    };
    let _flush = init_logging(cli.log_format, default_level);
    match cli.command {
        Command::Check {
            config,
            config_only,
            resolve,
        } => check(&config, config_only, resolve),
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
        Command::Status { admin } => client(admin, url_from_env, ClientCommand::Status),
        Command::Table { command } => table(command, url_from_env),
        Command::Connections {
            service,
            client: from,
            limit,
            admin,
        } => client(
            admin,
            url_from_env,
            ClientCommand::Connections {
                service,
                client: from,
                limit,
            },
        ),
        Command::Sources { limit, admin } => {
            client(admin, url_from_env, ClientCommand::Sources { limit })
        }
        Command::Backend {
            action,
            target,
            weight,
            force,
            admin,
        } => {
            let Some((service, backend)) = target.split_once('/') else {
                eprintln!("error: expected SERVICE/BACKEND, got {target:?}");
                return ExitCode::FAILURE;
            };
            let (service, backend) = (service.to_string(), backend.to_string());
            let action = match (action, weight) {
                (BackendAction::Weight, Some(weight)) => {
                    let cmd = ClientCommand::Weight {
                        service,
                        backend,
                        weight,
                        force,
                    };
                    return client(admin, url_from_env, cmd);
                }
                (BackendAction::Weight, None) => {
                    eprintln!("error: give the weight: crossbar backend weight SERVICE/BACKEND N");
                    return ExitCode::FAILURE;
                }
                (_, Some(w)) => {
                    eprintln!("error: a weight ({w}) goes with `crossbar backend weight` only");
                    return ExitCode::FAILURE;
                }
                (BackendAction::Drain, None) => Action::Drain,
                (BackendAction::Enable, None) => Action::Enable,
                (BackendAction::Disable, None) => Action::Disable,
            };
            let cmd = ClientCommand::Backend {
                service,
                backend,
                action,
                force,
            };
            client(admin, url_from_env, cmd)
        }
        Command::Reload { admin } => reload(admin, url_from_env),
    }
}

/// `crossbar table show|delete|flush`.
fn table(command: TableCommand, url_from_env: bool) -> ExitCode {
    let pick = |key: Option<u64>, addr: Option<std::net::IpAddr>| {
        key.map(Pick::Key).or(addr.map(Pick::Client))
    };
    match command {
        TableCommand::Show {
            service,
            limit,
            key,
            client: addr,
            admin,
        } => client(
            admin,
            url_from_env,
            ClientCommand::TableShow {
                service,
                limit,
                pick: pick(key, addr),
            },
        ),
        TableCommand::Delete {
            service,
            key,
            client: addr,
            admin,
        } => match pick(key, addr) {
            Some(pick) => client(
                admin,
                url_from_env,
                ClientCommand::TableDelete { service, pick },
            ),
            None => fail(&"give --key KEY or --client ADDR"),
        },
        TableCommand::Flush { service, admin } => {
            client(admin, url_from_env, ClientCommand::TableFlush { service })
        }
    }
}

/// `crossbar check`: the summary and every warning, or every problem.
fn check(config: &std::path::Path, config_only: bool, resolve: bool) -> ExitCode {
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
            if resolve {
                let mut cfg = cfg;
                match runtime(None) {
                    Ok(rt) => {
                        for line in rt.block_on(crossbar::discovery::resolve_into(&mut cfg)) {
                            println!("{line}");
                        }
                    }
                    Err(e) => eprintln!("no runtime to resolve names in: {e:#}"),
                }
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
fn client(args: AdminArgs, url_from_env: bool, cmd: ClientCommand) -> ExitCode {
    let opts = match args.options(url_from_env, false) {
        Ok(o) => o,
        Err(code) => return code,
    };
    send(&opts, &cmd)
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
    match rt.block_on(crossbar::admin_client::run(opts, cmd)) {
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
            for line in crossbar::discovery::resolve_into(&mut cfg).await {
                eprintln!("{line}");
            }
            crossbar::doctor::run(&cfg, opts).await
        }),
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
fn reload(admin: AdminArgs, url_from_env: bool) -> ExitCode {
    match admin.options(url_from_env, true) {
        Ok(opts) => send(&opts, &ClientCommand::Reload),
        Err(code) => code,
    }
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
SIGHUP reloads the configuration file (a file that does not check, or whose new
health settings no backend of a serving service passes, keeps the running one);
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
