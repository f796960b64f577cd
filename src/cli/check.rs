//! `crossbar check`: load a configuration file as `run` would (the files it names
//! opened too, unless `--config-only`), print its summary and warnings, or every
//! problem with its `file:line:col`; `--resolve` also looks up its `discover` names.
use std::path::Path;
use std::process::ExitCode;

use crate::config::Config;

/// `crossbar check`: the summary and every warning, or every problem.
pub fn check(config: &Path, config_only: bool, resolve: bool) -> ExitCode {
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
            if let Some(w) = cfg.state_file.as_deref().filter(|_| !config_only) {
                if let Some(why) = crate::server::state_file_problem(w) {
                    eprintln!("{}: state_file: warning: {why}", config.display());
                }
            }
            print!("{}", cfg.summary());
            for s in &cfg.services {
                let plan = crate::relay::plan(s.relay).describe();
                println!("relay: service {} uses {plan}", s.name);
            }
            if resolve && !resolved(cfg) {
                eprintln!("{}: FAILED", config.display());
                return ExitCode::FAILURE;
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

/// `crossbar reload --strict`: FILE's `discover` names resolve today (what each
/// resolves to printed); else each reason and "reload refused" on stderr, and what
/// to exit with. A file with errors passes here: the reload's own check says why.
pub fn resolves(config: &Path) -> Result<(), ExitCode> {
    let Ok(cfg) = Config::load(config) else {
        return Ok(());
    };
    if cfg.services.iter().all(|s| s.discover.is_none()) || resolved(cfg) {
        return Ok(());
    }
    eprintln!(
        "reload refused (--strict): a `discover` name of {} gives a service no backend; \
         the running configuration stays",
        config.display()
    );
    Err(ExitCode::FAILURE)
}

/// `--resolve`: what each `discover` name resolves to today; false (each reason
/// on stderr) when a service would start with no backend, or a record names
/// crossbar itself.
fn resolved(mut cfg: Config) -> bool {
    // A runtime of its own (one thread: the lookups run concurrently anyway).
    let built = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let rt = match built {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("no runtime to resolve names in: {e}");
            return false;
        }
    };
    let r = rt.block_on(crate::discovery::resolve_into(&mut cfg));
    for line in &r.lines {
        println!("{line}");
    }
    for (_, why) in r.no_backend.iter().chain(&r.own) {
        eprintln!("error: {why}");
    }
    r.no_backend.is_empty() && r.own.is_empty()
}
