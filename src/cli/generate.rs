//! `crossbar generate`: shell completions, and the man pages (crossbar(1) with its
//! examples, files and signals, and a page per subcommand), for packaging.
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::CommandFactory;
use clap_complete::env::EnvCompleter;

use super::args::{Cli, Generated, EXAMPLES};

/// `crossbar generate WHAT [DIR]`: the man pages into DIR, or a completion script on stdout.
pub fn generate(what: Generated, dir: Option<PathBuf>) -> ExitCode {
    let mut cmd = Cli::command();
    let mut out = std::io::stdout();
    let shell = match what {
        Generated::Man => {
            let dir = dir.unwrap_or_else(|| PathBuf::from("."));
            return super::outcome::report(
                man_pages(cmd, &dir)
                    .with_context(|| format!("writing man pages into {}", dir.display())),
            );
        }
        Generated::Bash => &clap_complete::env::Bash as &dyn EnvCompleter,
        Generated::Zsh => &clap_complete::env::Zsh,
        Generated::Fish => &clap_complete::env::Fish,
    };
    // The script asks `COMPLETE=<shell> crossbar` at each tab, so it completes
    // service and backend names from the running config (`complete.rs`) and always
    // matches the installed binary's arguments.
    cmd.build();
    let name = cmd.get_name().to_string();
    match shell.write_registration("COMPLETE", &name, &name, &name, &mut out) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => super::outcome::fail(&format!("writing the completion script: {e}")),
    }
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
The configuration (every command reads it without \fB-c\fR; the admin commands take the admin address and token from it).
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
