//! The `crossbar` binary: `check` on every shipped config and on a bad one, `demo`,
//! `--version` and `--help`.
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn crossbar(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_crossbar"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running the crossbar binary")
}

/// Where the Debian package keeps its files: what conf/crossbar.yaml names lives
/// there on a machine where the package is installed.
const PACKAGE_DIRS: [&str; 2] = ["/etc/crossbar", "/var/lib/crossbar"];

/// `crossbar ARGS` as on a machine without the Debian package: where the package's
/// directories exist, they are hidden behind empty tmpfs mounts in a private mount
/// namespace (`unshare -m`, root), so the test sees the same files everywhere.
fn crossbar_without_package(args: &[&str]) -> Output {
    let present: Vec<&str> = PACKAGE_DIRS
        .into_iter()
        .filter(|d| Path::new(d).exists())
        .collect();
    if present.is_empty() {
        return crossbar(args);
    }
    let mounts: String = present
        .iter()
        .map(|d| format!("mount -t tmpfs none {d} && "))
        .collect();
    Command::new("unshare")
        .args(["-m", "sh", "-c"])
        .arg(format!(r#"{mounts}exec "$0" "$@""#))
        .arg(env!("CARGO_BIN_EXE_crossbar"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("unshare (util-linux) runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn conf_files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("conf");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("conf/ exists")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    files
}

#[test]
fn check_accepts_every_shipped_config_and_prints_a_summary() {
    let files = conf_files();
    assert!(
        files.len() >= 3,
        "expected the shipped configs, found {files:?}"
    );
    for f in files {
        let path = f.to_str().expect("utf-8 path");
        // The files they name (token, CA, state directory) are the target host's.
        let out = crossbar(&["check", "--config-only", "-c", path]);
        let stdout = text(&out.stdout);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{path}:\n{stdout}\n{}",
            text(&out.stderr)
        );
        assert!(stdout.contains(&format!("{path}: OK")), "{stdout}");
        // The summary: a header with the count, then each service with its backends.
        assert!(stdout.starts_with(&format!("{path}: ")), "{stdout}");
        assert!(stdout.contains(" service(s)\n"), "{stdout}");
        assert!(stdout.contains("\nservice "), "{stdout}");
        for key in ["listen", "balance", "timeouts", "backends"] {
            assert!(
                stdout.contains(&format!("\n  {key}")),
                "no {key} line:\n{stdout}"
            );
        }
    }
}

#[test]
fn check_rejects_a_bad_file_with_file_line_col() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.yaml");
    std::fs::write(
        &path,
        "services:\n  puppet:\n    listen: [\"127.0.0.1:0\"]\n    bogus_key: 1\n    backends:\n      - { name: a, address: \"127.0.0.1:1\" }\n",
    )
    .unwrap();

    let out = crossbar(&["check", "-c", path.to_str().unwrap()]);

    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("{}:4:5: ", path.display())),
        "no file:line:col of the unknown key:\n{stderr}"
    );
    assert!(stderr.contains("bogus_key"), "{stderr}");
    assert!(!text(&out.stdout).contains("OK"));
}

/// A config naming the retired `relay: kernel` passes `crossbar check` (exit 0, as
/// a Puppet run validating an old catalog needs) with a warning at its
/// `file:line:col` on stderr, and the relay each non-default service gets is said
/// on stdout: `auto` chooses splice-auto.
#[test]
fn check_warns_about_a_retired_relay_kernel_and_says_what_auto_chooses() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.yaml");
    let backends = "    backends:\n      - { name: a, address: \"127.0.0.1:1\" }\n";
    std::fs::write(
        &path,
        format!("services:\n  svc:\n    listen: [\"127.0.0.1:0\"]\n    relay: auto\n{backends}  plain:\n    listen: [\"127.0.0.1:0\"]\n    relay: kernel\n{backends}"),
    )
    .unwrap();

    let out = crossbar(&["check", "-c", path.to_str().unwrap()]);

    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(
        stderr.contains(&format!(
            "{}:9:12: services.plain.relay: warning: `kernel` was retired",
            path.display()
        )),
        "{stderr}"
    );
    assert!(stderr.contains("using splice-auto"), "{stderr}");
    assert!(
        stdout.contains("relay: service svc uses splice-auto (relay: auto chooses splice-auto:"),
        "{stdout}"
    );
    assert!(!stdout.contains("uses kernel"), "{stdout}");
    assert!(
        stdout.contains(&format!("{}: OK", path.display())),
        "{stdout}"
    );
}

#[test]
fn check_of_a_missing_file_fails() {
    let out = crossbar(&["check", "-c", "/nonexistent/crossbar.yaml"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("/nonexistent/crossbar.yaml"));
}

/// Parse "resumed X/Y resumption attempts, Z/Y on the agent's first backend".
fn resumption_line(line: &str) -> Option<(u32, u32, u32, u32)> {
    let rest = line.trim().strip_prefix("resumed ")?;
    let (resumed, rest) = rest.split_once('/')?;
    let (attempts, rest) = rest.split_once(" resumption attempts, ")?;
    let (same, rest) = rest.split_once('/')?;
    let attempts2 = rest.strip_suffix(" on the agent's first backend")?;
    Some((
        resumed.parse().ok()?,
        attempts.parse().ok()?,
        same.parse().ok()?,
        attempts2.parse().ok()?,
    ))
}

#[test]
fn demo_runs_and_keeps_every_resumption_on_its_backend() {
    let out = crossbar(&["demo"]);
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        text(&out.stderr)
    );

    let counts: Vec<_> = stdout.lines().filter_map(resumption_line).collect();
    // One line for puppet (TLS 1.3 PSK) and one for puppetfiles (TLS 1.2 tickets):
    // 4 agents x 4 resumptions, all resumed, all on the agent's first backend.
    assert_eq!(counts, vec![(16, 16, 16, 16), (16, 16, 16, 16)], "{stdout}");
    assert!(!stdout.contains("not kept on their backend"), "{stdout}");
    // Failover to the backup once ca1 refuses.
    for line in [
        "agent1 -> ca1",
        "agent3 -> ca1",
        "agent4 -> ca2",
        "agent5 -> ca2",
    ] {
        assert!(stdout.contains(line), "no {line:?}:\n{stdout}");
    }
    assert!(stdout.contains("stick tables:"), "{stdout}");
    // The compilers' service is the preset docs/puppet.md recommends, its agents
    // each with an address of their own (so `source` stickiness means something).
    assert!(
        stdout.contains(
            "2. puppet (the compilers' preset of docs/puppet.md: leastconn, stick on \
             session_id/ticket/psk/source;"
        ) && stdout.contains("agents each from its own address"),
        "{stdout}"
    );

    // Each step once, in order; the CA step announces as many agents as it lists.
    let steps: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.split_once(". ").map(|(n, _)| n))
        .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        .collect();
    assert_eq!(steps, ["1", "2", "3", "4"], "{stdout}");
    let ca_step = stdout.split("\n2. ").next().unwrap_or_default();
    let agents = ca_step.lines().filter(|l| l.contains(" -> ca")).count();
    assert_eq!(agents, 5, "{stdout}");
    assert!(ca_step.contains("five agents"), "{stdout}");
    // It exits at once without --serve: no address to open in a browser.
    assert!(
        !stdout.contains("browser") && !stdout.contains("http://"),
        "{stdout}"
    );
    // The story reads alone: crossbar's own lines (the failover's warnings) are in
    // a log file the story names at its end, not between its steps.
    let stderr = text(&out.stderr);
    assert!(
        !stderr.contains("WARN"),
        "crossbar's lines in the story:\n{stderr}"
    );
    let last = stdout.lines().last().unwrap_or_default();
    let log = last
        .split_once("crossbar's own log: ")
        .and_then(|(_, rest)| rest.rsplit_once(", in "))
        .map(|(_, path)| PathBuf::from(path))
        .unwrap_or_else(|| panic!("no log file named at the end:\n{stdout}"));
    let logged = std::fs::read_to_string(&log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
    assert!(
        logged.contains("backend down") && logged.contains("ca1"),
        "{logged}"
    );
    std::fs::remove_file(&log).unwrap();
}

#[test]
fn version_and_help() {
    let out = crossbar(&["--version"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        text(&out.stdout).trim(),
        format!("crossbar {}", env!("CARGO_PKG_VERSION"))
    );

    let out = crossbar(&["--help"]);
    let help = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0));
    for cmd in ["run", "check", "demo"] {
        assert!(
            help.lines().any(|l| l.trim_start().starts_with(cmd)),
            "no {cmd} in help:\n{help}"
        );
    }
    assert!(help.contains("Usage: crossbar"), "{help}");

    let out = crossbar(&["check", "--help"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(text(&out.stdout).contains("--config"));

    // No subcommand is a usage error (clap exits 2).
    assert_eq!(crossbar(&[]).status.code(), Some(2));
}

#[test]
fn check_opens_the_files_the_config_names_and_names_their_lines() {
    // conf/crossbar.yaml names /etc/crossbar/admin.token (line 15), a CA bundle
    // (line 67) and a state file under /var/lib/crossbar (line 56), none of which
    // exist on a build machine, nor here where the package's directories are hidden
    // (the package installs the token); --config-only skips them (previous test).
    let conf = Path::new(env!("CARGO_MANIFEST_DIR")).join("conf/crossbar.yaml");
    let path = conf.to_str().unwrap();
    let out = crossbar_without_package(&["check", "-c", path]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "{path}:15:15: admin.token_file: cannot read /etc/crossbar/admin.token: "
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("{path}:67:16: services.puppet.health.ca_file: cannot read /etc/crossbar/puppet-ca.pem as PEM certificates: ")),
        "{stderr}"
    );
}

#[test]
fn check_without_c_reads_the_packaged_path() {
    let out = crossbar_without_package(&["check"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.starts_with("/etc/crossbar/crossbar.yaml: cannot read: "),
        "{stderr}"
    );
}

/// Five different mistakes in one file (a key written twice, an unknown key, a
/// port out of range, a duration without a unit, a file that does not exist):
/// one `check` run names all five, each at its line and column.
#[test]
fn check_lists_every_kind_of_problem_in_one_run() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/config/check/five_mistakes.yaml");
    let path = fixture.to_str().unwrap();
    let out = crossbar(&["check", "-c", path]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let want = [
        "6:14: services.puppet.listen[0]: `127.0.0.1:81400` is not a listen address",
        "8:26: services.puppet.timeouts.connect: a duration needs a unit",
        "11:16: services.puppet.health.ca_file: cannot read /nonexistent/crossbar-test/ca.pem",
        "13:48: services.puppet.backends[0].weigth: unknown key `weigth`",
        "14:5: services.puppet.balance: `balance` is written twice; the first is at line 7",
    ];
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), want.len(), "{stderr}");
    for (line, want) in lines.iter().zip(want) {
        assert!(
            line.starts_with(&format!("{path}:{want}")),
            "{want:?}:\n{stderr}"
        );
    }
}

/// `check` names the relay of every service, the default included.
#[test]
fn check_prints_the_relay_of_every_service() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ok.yaml");
    std::fs::write(
        &path,
        "admin: { enabled: false }\nservices:\n  puppet:\n    listen: [\"127.0.0.1:0\"]\n    backends:\n      - { name: a, address: \"127.0.0.1:1\" }\n",
    )
    .unwrap();
    let out = crossbar(&["check", "-c", path.to_str().unwrap()]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains("relay: service puppet uses splice-auto (the default)\n"),
        "{stdout}"
    );
}

/// An address nothing listens on (bound, then closed).
fn dead_addr() -> std::net::SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("local addr")
}

/// When nothing answers at the admin address, the error says which address was
/// tried, where it came from and how to point at another or check the service.
#[test]
fn admin_commands_say_where_the_address_came_from_when_nothing_answers() {
    let dead = dead_addr();
    let url = format!("http://{dead}");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crossbar.yaml");
    std::fs::write(
        &path,
        format!(
            "admin: {{ listen: \"{dead}\" }}\nservices:\n  s:\n    listen: [\"127.0.0.1:0\"]\n    \
             backends:\n      - {{ name: a, address: \"127.0.0.1:1\" }}\n"
        ),
    )
    .unwrap();
    let file = path.to_str().unwrap();
    let run = |args: &[&str], env: Option<&str>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_crossbar"));
        cmd.args(args)
            .stdin(Stdio::null())
            .env_remove("CROSSBAR_ADMIN")
            .env_remove("CROSSBAR_TOKEN_FILE");
        if let Some(e) = env {
            cmd.env("CROSSBAR_ADMIN", e);
        }
        cmd.output().expect("running the crossbar binary")
    };
    let cases: [(&[&str], Option<&str>, String); 5] = [
        (
            &["status", "--admin", &url],
            None,
            "the one given with --admin".into(),
        ),
        (
            &["connections"],
            Some(&url),
            "the one in CROSSBAR_ADMIN (environment)".into(),
        ),
        (
            &["status", "-c", file],
            None,
            format!("admin.listen of {file}"),
        ),
        (
            &["table", "show", "s", "-c", file],
            None,
            format!("admin.listen of {file}"),
        ),
        (
            &["backend", "drain", "s/a", "--force", "-c", file],
            None,
            format!("admin.listen of {file}"),
        ),
    ];
    for (args, env, from) in cases {
        let out = run(args, env);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.contains(&format!(
                "nothing answers at {url} (connection refused): is crossbar running?"
            )),
            "{args:?}: {stderr}"
        );
        assert!(
            stderr.contains(&format!("the address is {from}\n")),
            "{args:?}: {stderr}"
        );
        for hint in [
            "-c FILE",
            "--admin http://HOST:PORT",
            "CROSSBAR_ADMIN=",
            "systemctl status crossbar",
        ] {
            assert!(stderr.contains(hint), "{args:?}: no {hint:?} in {stderr}");
        }
    }
    // A config without an admin endpoint, or with errors, says so.
    std::fs::write(&path, "admin: { enabled: false }\nservices:\n  s:\n    listen: [\"127.0.0.1:0\"]\n    backends:\n      - { name: a, address: \"127.0.0.1:1\" }\n").unwrap();
    let out = run(&["status", "-c", file], None);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("disables the admin endpoint"),
        "{}",
        text(&out.stderr)
    );
    std::fs::write(&path, "services: {}\nbogus: 1\n").unwrap();
    let out = run(&["status", "-c", file], None);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("bogus") && stderr.contains("give --admin"),
        "{stderr}"
    );
}

/// The commands of `--help`: the first word of each line under `Commands:`.
fn commands_in(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_string)
        .collect()
}

/// README's command table has a row for every command the binary has, every
/// `backend` action and every `connections` subcommand.
#[test]
fn the_readme_command_table_lists_every_command() {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
        .expect("README.md");
    let rows: Vec<&str> = readme
        .lines()
        .skip_while(|l| *l != "## Command line")
        .take_while(|l| !l.starts_with("## Documentation"))
        .filter(|l| l.starts_with("| `crossbar "))
        .collect();
    let cmds = commands_in(&text(&crossbar(&["--help"]).stdout));
    assert!(cmds.len() >= 10, "{cmds:?}");
    let mut missing = Vec::new();
    for c in &cmds {
        if !rows
            .iter()
            .any(|r| r.starts_with(&format!("| `crossbar {c}")))
        {
            missing.push(c.clone());
        }
    }
    for c in commands_in(&text(&crossbar(&["connections", "--help"]).stdout)) {
        if !rows
            .iter()
            .any(|r| r.starts_with(&format!("| `crossbar connections {c}")))
        {
            missing.push(format!("connections {c}"));
        }
    }
    let backend = text(&crossbar(&["backend", "--help"]).stdout);
    let actions = backend
        .split("[possible values: ")
        .nth(1)
        .and_then(|s| s.split(']').next())
        .expect("the backend actions");
    for a in actions.split(", ") {
        let listed = rows
            .iter()
            .filter(|r| r.starts_with("| `crossbar backend "))
            .any(|r| r.split(" | ").next().is_some_and(|cell| cell.contains(a)));
        if !listed {
            missing.push(format!("backend {a}"));
        }
    }
    assert!(
        missing.is_empty(),
        "README.md's command table lacks {missing:?}"
    );
}

/// `check --help` says what `--resolve` does with a name that gives no backend: it
/// exits 1 (tests/discovery/off_the_path.rs runs it), not "never an error".
#[test]
fn check_help_says_resolve_fails_on_a_service_without_backend() {
    let help = text(&crossbar(&["check", "--help"]).stdout);
    let one_line = help.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(!one_line.contains("never an error"), "{help}");
    assert!(
        one_line.contains("exit 1 when a service would start with no backend"),
        "{help}"
    );
}

/// README's `crossbar check` example, run as written (the binary aside) on a
/// machine without the package's files, passes.
#[test]
fn the_readme_check_example_passes_as_written() {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
        .expect("README.md");
    let line = readme
        .lines()
        .find(|l| l.starts_with("target/release/crossbar check"))
        .expect("README's check example");
    let command = line.split('#').next().unwrap_or(line);
    let args: Vec<&str> = command.split_whitespace().skip(1).collect();
    let out = crossbar_without_package(&args);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{line}\n{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
}
