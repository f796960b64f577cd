//! Configuration files: everything in conf/ loads, every bad fixture fails where
//! and how its `.expect` file says, and defaults and merges resolve as documented.
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crossbar::config::{
    Balance, CheckKind, Config, ConfigError, Failback, Mode, OnNonTls, RelayMode, StickOn,
};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

fn load(text: &str) -> Result<Config, ConfigError> {
    Config::from_str_at(text, Path::new("test.yaml"))
}

fn ok(text: &str) -> Config {
    load(text).unwrap_or_else(|e| panic!("should load:\n{e}"))
}

#[test]
fn every_file_in_conf_loads() {
    let files = yaml_files(&root().join("conf"));
    assert!(files.len() >= 3, "conf/ has {files:?}");
    for f in files {
        let config = Config::load(&f).unwrap_or_else(|e| panic!("{}:\n{e}", f.display()));
        let summary = config.summary();
        for s in &config.services {
            assert!(
                summary.contains(&format!("service {}", s.name)),
                "{summary}"
            );
        }
    }
}

/// Each `bad/NAME.yaml` has a `bad/NAME.expect`: one `line:col fragment` per
/// expected diagnostic, in order (`-` for "no position"); the number must match.
#[test]
fn every_bad_fixture_fails_with_its_message_and_position() {
    let dir = root().join("tests/fixtures/config/bad");
    let files = yaml_files(&dir);
    assert!(files.len() >= 15);
    let mut failures = Vec::new();
    for f in files {
        let err = match Config::load(&f) {
            Ok(_) => {
                failures.push(format!("{}: loaded, but should fail", f.display()));
                continue;
            }
            Err(e) => e,
        };
        let expect_file = f.with_extension("expect");
        let expect = std::fs::read_to_string(&expect_file).unwrap_or_default();
        let expected: Vec<&str> = expect.lines().filter(|l| !l.trim().is_empty()).collect();
        let got = &err.diagnostics;
        let matches = expected.len() == got.len()
            && expected.iter().zip(got).all(|(want, d)| {
                let (pos, fragment) = want.split_once(' ').unwrap_or((want, ""));
                let at = d.position.map_or("-".into(), |(l, c)| format!("{l}:{c}"));
                at == pos && d.to_string().contains(fragment)
            });
        if !matches {
            failures.push(format!(
                "{}:\n  expected:\n    {}\n  got:\n    {}",
                f.display(),
                expected.join("\n    "),
                err.to_string().replace('\n', "\n    ")
            ));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn errors_print_file_line_col_path_message() {
    let err =
        load("services:\n  p:\n    listen: [\"10.0.0.1:8140\"]\n    backends: []\n").unwrap_err();
    assert_eq!(
        err.to_string(),
        "test.yaml:4:5: services.p.backends: no backends: a service needs at least one"
    );
}

#[test]
fn several_problems_are_all_reported_in_file_order() {
    let text = "\
services:
  a:
    listen: [\"10.0.0.1:8140\"]
    backends:
      - { name: x, address: \"nohost\" }
      - { name: y, address: \"10.0.1.1:8140\", weight: 0 }
  b:
    listen: [\"bad\"]
    timeouts: { connect: 3 }
    backends: []
";
    let err = load(text).unwrap_err();
    let lines: Vec<String> = err.diagnostics.iter().map(|d| d.to_string()).collect();
    assert_eq!(lines.len(), 5, "{err}");
    assert!(
        lines[0].starts_with("test.yaml:5:29: services.a.backends[0].address:"),
        "{err}"
    );
    assert!(
        lines[1].starts_with(
            "test.yaml:6:54: services.a.backends[1].weight: must be between 1 and 256"
        ),
        "{err}"
    );
    assert!(
        lines[2].starts_with("test.yaml:8:14: services.b.listen[0]:"),
        "{err}"
    );
    assert!(lines[3].contains("write 3s, not 3"), "{err}");
    assert!(
        lines[4].starts_with("test.yaml:10:5: services.b.backends: no backends"),
        "{err}"
    );
}

#[test]
fn defaults_are_applied_as_documented() {
    let c = ok("services:\n  p:\n    listen: [\"10.0.0.1:8140\"]\n    backends:\n      - { name: a, address: \"h.example.com:8140\" }\n");
    assert_eq!(c.workers, None);
    let admin = c.admin.as_ref().expect("admin is on by default");
    assert_eq!(
        admin.listen.to_string(),
        crossbar::config::DEFAULT_ADMIN_LISTEN
    );
    assert_eq!(admin.token_file, None);
    let s = c.service("p").unwrap();
    assert_eq!(s.mode, Mode::Tls);
    assert_eq!(s.on_non_tls, OnNonTls::Reject);
    assert!(s.server_names.is_empty() && !s.default);
    assert_eq!(s.balance, Balance::RoundRobin);
    assert_eq!(s.failback, Failback::Auto);
    assert_eq!(s.stick, None);
    assert_eq!(s.timeouts, Default::default());
    assert_eq!(s.max_hello_size, crossbar::config::DEFAULT_MAX_HELLO);
    assert_eq!(s.retries, crossbar::config::DEFAULT_RETRIES);
    assert_eq!(s.queue_size, crossbar::config::DEFAULT_QUEUE_SIZE);
    assert_eq!(s.slow_start, Duration::ZERO);
    let l = &s.listen[0];
    assert_eq!(l.backlog, crossbar::config::DEFAULT_BACKLOG);
    assert_eq!(
        l.max_connections,
        crossbar::config::DEFAULT_LISTENER_MAX_CONNECTIONS
    );
    assert!(!l.freebind);
    let b = &s.backends[0];
    assert_eq!((b.weight, b.backup, b.disabled), (1, false, false));
    assert_eq!((b.max_connections, b.proxy_protocol), (None, None));
    assert_eq!(b.health, Default::default());
    assert_eq!(b.health.check, CheckKind::Tcp);
}

#[test]
fn first_defaults_to_manual_failback_and_empty_stick_to_every_key() {
    let c = ok("\
services:
  ca:
    listen: [\"10.0.0.1:8140\"]
    balance: first
    stick: {}
    backends: [{ name: a, address: \"10.0.1.1:8140\" }]
  ssh:
    listen: [\"10.0.0.1:22\"]
    mode: tcp
    stick: {}
    backends: [{ name: a, address: \"10.0.1.1:22\" }]
");
    let ca = c.service("ca").unwrap();
    assert_eq!(ca.failback, Failback::Manual);
    let st = ca.stick.as_ref().unwrap();
    let all = [
        StickOn::SessionId,
        StickOn::Ticket,
        StickOn::Psk,
        StickOn::Source,
    ];
    assert_eq!(st.on, all);
    assert_eq!(
        (st.size, st.expire, st.source_expire),
        (
            100_000,
            Duration::from_secs(1800),
            Duration::from_secs(1800)
        )
    );
    assert_eq!(
        (st.source_prefix_v4, st.source_prefix_v6, st.ticket_prefix),
        (32, 64, 16)
    );
    assert_eq!(
        (st.state_file.clone(), st.save_interval),
        (None, Duration::from_secs(60))
    );
    assert_eq!(
        c.service("ssh").unwrap().stick.as_ref().unwrap().on,
        [StickOn::Source]
    );
}

#[test]
fn ipv6_listen_and_backend_addresses_parse() {
    let c = ok("\
services:
  p:
    listen: [\"[::]:8140\", { address: \"[2001:db8::10]:8140\", backlog: 512, freebind: true, max_connections: 5 }]
    backends:
      - { name: a, address: \"[2001:db8::1]:8140\" }
      - { name: b, address: \"10.0.1.2:8140\" }
");
    let s = c.service("p").unwrap();
    assert_eq!(s.listen[0].addr.to_string(), "[::]:8140");
    let l = &s.listen[1];
    assert_eq!(
        (
            l.addr.to_string().as_str(),
            l.backlog,
            l.freebind,
            l.max_connections
        ),
        ("[2001:db8::10]:8140", 512, true, 5)
    );
    assert_eq!(s.backends[0].address.host, "2001:db8::1");
    assert_eq!(
        s.backends[0].address.as_socket_addr().unwrap().to_string(),
        "[2001:db8::1]:8140"
    );
}

#[test]
fn health_merges_defaults_then_service_then_backend() {
    let c = ok("\
defaults:
  health: { check: tls-hello, interval: 5s, rise: 4 }
  timeouts: { connect: 1s, idle: 1h }
services:
  p:
    listen: [\"10.0.0.1:8140\"]
    timeouts: { idle: 2h }
    health: { check: https, path: /status/v1/services, fall: 5, client_cert: /c.pem, client_key: /k.pem }
    backends:
      - { name: a, address: \"10.0.1.1:8140\" }
      - { name: b, address: \"10.0.1.2:8140\", health: { interval: 10s, expect_body: \"\" } }
      - { name: c, address: \"10.0.1.3:8140\", health: { check: tcp } }
");
    let s = c.service("p").unwrap();
    assert_eq!(s.timeouts.connect, Duration::from_secs(1));
    assert_eq!(s.timeouts.idle, Duration::from_secs(7200));
    assert_eq!(s.timeouts.client_hello, Duration::from_secs(5));
    assert_eq!(
        s.timeouts.server_hello,
        Duration::from_secs(5),
        "a few seconds"
    );
    let a = &s.backends[0].health;
    assert_eq!(
        (a.interval, a.timeout, a.rise, a.fall),
        (Duration::from_secs(5), Duration::from_secs(1), 4, 5)
    );
    let CheckKind::Https(h) = &a.check else {
        panic!("{a:?}")
    };
    assert_eq!(h.path, "/status/v1/services");
    assert_eq!(
        (h.expect_status, h.expect_body.as_deref()),
        (200, Some("running"))
    );
    assert_eq!(h.client_cert, Some(("/c.pem".into(), "/k.pem".into())));
    let b = &s.backends[1].health;
    assert_eq!(
        (b.interval, b.rise, b.fall),
        (Duration::from_secs(10), 4, 5)
    );
    let CheckKind::Https(h) = &b.check else {
        panic!("{b:?}")
    };
    assert_eq!(
        (h.path.as_str(), h.expect_body.clone()),
        ("/status/v1/services", None)
    );
    assert_eq!(s.backends[2].health.check, CheckKind::Tcp);
    assert_eq!(s.backends[2].health.fall, 5);
}

#[test]
fn server_names_are_lower_cased_without_trailing_dot_and_admin_can_be_disabled() {
    let c = ok("\
admin: { enabled: false }
services:
  p:
    listen: [\"10.0.0.1:8140\"]
    server_names: [Puppet.Example.COM., \"*.Example.org\"]
    backends: [{ name: a, address: \"10.0.1.1:8140\" }]
");
    assert!(c.admin.is_none());
    assert_eq!(
        c.service("p").unwrap().server_names,
        ["puppet.example.com", "*.example.org"]
    );
}

#[test]
fn the_complete_example_in_the_docs_loads() {
    let doc = std::fs::read_to_string(root().join("docs/configuration.md")).unwrap();
    let example = doc.find("## Complete example").expect("the section");
    let start =
        example + doc[example..].find("```yaml\n").expect("a yaml block") + "```yaml\n".len();
    let len = doc[start..].find("```").unwrap();
    let c = ok(&doc[start..start + len]);
    assert_eq!(c.services.len(), 3);
}

#[test]
fn keepalive_is_on_by_default_and_merges_field_by_field() {
    use crossbar::config::Keepalive;
    use std::time::Duration;
    let c = ok("services:
  a:
    listen: [\"127.0.0.1:1\"]
    backends: [{ name: b, address: \"127.0.0.1:2\" }]
  tuned:
    listen: [\"127.0.0.1:3\"]
    keepalive: { interval: 10s }
    backends: [{ name: b, address: \"127.0.0.1:2\" }]
  off:
    listen: [\"127.0.0.1:4\"]
    keepalive: { enabled: false }
    backends: [{ name: b, address: \"127.0.0.1:2\" }]
");
    assert_eq!(c.services[0].keepalive, Some(Keepalive::default()));
    assert_eq!(
        c.services[1].keepalive,
        Some(Keepalive {
            interval: Duration::from_secs(10),
            ..Keepalive::default()
        })
    );
    assert_eq!(c.services[2].keepalive, None);

    let off = ok("defaults: { keepalive: { enabled: false } }
services:
  a:
    listen: [\"127.0.0.1:1\"]
    backends: [{ name: b, address: \"127.0.0.1:2\" }]
  on:
    listen: [\"127.0.0.1:3\"]
    keepalive: { enabled: true, time: 1m }
    backends: [{ name: b, address: \"127.0.0.1:2\" }]
");
    assert_eq!(off.services[0].keepalive, None);
    assert_eq!(
        off.services[1].keepalive.map(|k| k.time),
        Some(Duration::from_secs(60))
    );

    let e = load("defaults: { keepalive: { probes: 0, time: 5 } }\nservices:\n  a:\n    listen: [\"127.0.0.1:1\"]\n    backends: [{ name: b, address: \"127.0.0.1:2\" }]\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("defaults.keepalive.probes") && e.contains("defaults.keepalive.time"),
        "{e}"
    );
}

/// The whole text of `crossbar check`'s report for each kind of syntax, type and
/// key problem: every one reported, in crossbar's words (no Rust type names).
#[rstest::rstest]
#[case::tabs_named_as_tabs("tab_indent", &[
    "3:1: a tab character: YAML indents with spaces only; replace the tab with spaces",
    "5:1: a tab character: YAML indents with spaces only; replace the tab with spaces",
])]
#[case::duplicate_at_the_duplicate("duplicate_key", &[
    "7:5: services.puppet.balance: `balance` is written twice; the first is at line 4",
])]
#[case::every_type_and_key_problem("many_type_errors", &[
    "1:10: workers: must be a whole number, not the text \"lots\"",
    "4:3: admin.enabeld: unknown key `enabeld`: did you mean `enabled`?",
    "8:21: services.puppet.max_hello_size: must be a whole number, not the number -1",
    "9:38: services.puppet.stick.size: must be a whole number, not the text \"big\"",
    "9:45: services.puppet.stick.color: unknown key `color`; allowed here: on, size, expire, \
     source_expire, source_prefix_v4, source_prefix_v6, ticket_prefix, state_file, \
     save_interval, probe_interval, confirm, confirm_tries",
    "11:54: services.puppet.backends[0].backup: must be true or false, not the text \"maybe\"",
    "14:9: services.puppet.backends[1].weight: must be a whole number, not a list",
    "15:9: services.puppet.backends[2]: `address` is missing",
])]
#[case::unknown_variant("bad_enum_value", &[
    "4:14: services.puppet.balance: `random` is not one of: roundrobin, leastconn, first, source",
])]
#[case::null_where_a_mapping_goes("null_service", &["2:3: services.puppet: `listen` is missing"])]
#[case::syntax("malformed_yaml", &[
    "4:5: did not find expected ',' or ']', while parsing a flow sequence at line 3 column 13",
])]
fn error_messages_have_this_exact_text(#[case] fixture: &str, #[case] lines: &[&str]) {
    let path = root().join(format!("tests/fixtures/config/bad/{fixture}.yaml"));
    let err = Config::load(&path).unwrap_err().to_string();
    let want: Vec<String> = lines
        .iter()
        .map(|l| format!("{}:{l}", path.display()))
        .collect();
    assert_eq!(err, want.join("\n"));
    for rust in [
        "struct",
        "Raw",
        "u64",
        "u32",
        "invalid type",
        "unknown field",
    ] {
        assert!(!err.contains(rust), "{rust} leaks into: {err}");
    }
}

/// `relay: kernel` names the retired BPF sockmap relay: a config that still says
/// it loads (an upgrade must not stop the service or refuse its reload), reads as
/// `splice-auto`, and carries one warning per place it is written, at its
/// `file:line:col`; `auto` and `splice-auto` load as they are, without a warning.
#[test]
fn retired_relay_kernel_loads_as_splice_auto_with_a_warning() {
    let yaml = "defaults:\n  relay: kernel\nservices:\n  a:\n    listen: [\"127.0.0.1:1\"]\n    relay: kernel\n    backends: [{ name: x, address: \"127.0.0.1:2\" }]\n  b:\n    listen: [\"127.0.0.1:3\"]\n    backends: [{ name: x, address: \"127.0.0.1:2\" }]\n  c:\n    listen: [\"127.0.0.1:4\"]\n    relay: auto\n    backends: [{ name: x, address: \"127.0.0.1:2\" }]\n";
    let c = ok(yaml);
    let relays: Vec<RelayMode> = c.services.iter().map(|s| s.relay).collect();
    assert_eq!(
        relays,
        [
            RelayMode::SpliceAuto,
            RelayMode::SpliceAuto,
            RelayMode::Auto
        ]
    );
    let warnings: Vec<String> = c.warnings.iter().map(|w| w.to_string()).collect();
    let retired = "warning: `kernel` was retired (the BPF sockmap relay: more CPU than \
                   splice, and the kernel could deliver a segment twice; \
                   docs/performance.md); using splice-auto: write `relay: splice-auto` \
                   or remove the line";
    assert_eq!(
        warnings,
        [
            format!("test.yaml:2:10: defaults.relay: {retired}"),
            format!("test.yaml:6:12: services.a.relay: {retired}"),
        ]
    );
    let plain = ok(&yaml.replace("relay: kernel", "relay: splice-auto"));
    assert!(plain.warnings.is_empty(), "{:?}", plain.warnings);
}

/// `listen[].proxy_protocol`: networks, `required` (default true), nothing trusted
/// without the key, the summary names it, and trusting everything loads with a
/// warning.
#[test]
fn listen_proxy_protocol_loads_with_its_networks() {
    let yaml = "services:\n  a:\n    listen:\n      - { address: \"127.0.0.1:1\", proxy_protocol: { accept_from: [\"10.0.0.0/24\", \"2001:db8::/32\", \"192.0.2.7\"] } }\n      - { address: \"127.0.0.1:2\", proxy_protocol: { accept_from: [\"10.0.0.0/24\"], required: false } }\n      - \"127.0.0.1:3\"\n    backends: [{ name: x, address: \"127.0.0.1:9\" }]\n";
    let c = ok(yaml);
    let l = &c.services[0].listen;
    let p = l[0].proxy_protocol.as_ref().expect("policy");
    assert!(p.required);
    assert!(p.trusts("10.0.0.200".parse().unwrap()));
    assert!(p.trusts("2001:db8:5::1".parse().unwrap()));
    assert!(p.trusts("192.0.2.7".parse().unwrap()));
    assert!(!p.trusts("192.0.2.8".parse().unwrap()));
    assert!(!l[1].proxy_protocol.as_ref().unwrap().required);
    assert!(l[2].proxy_protocol.is_none(), "nothing trusted by default");
    let summary = c.summary();
    assert!(
        summary.contains("PROXY headers from 10.0.0.0/24, 2001:db8::/32, 192.0.2.7/32 (required)"),
        "{summary}"
    );
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    let all = ok(&yaml.replace("\"192.0.2.7\"", "\"0.0.0.0/0\""));
    let warnings: Vec<String> = all.warnings.iter().map(|w| w.to_string()).collect();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("0.0.0.0/0 trusts every address"),
        "{warnings:?}"
    );
}

/// Two services naming one state file would overwrite each other's table: `check`
/// refuses it at the second one's line.
#[test]
fn check_refuses_a_state_file_shared_by_two_services() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("shared.table");
    let yaml = format!(
        "admin: {{ enabled: false }}\nservices:\n  a:\n    listen: [\"127.0.0.1:0\"]\n    \
         stick: {{ state_file: {t} }}\n    backends: [{{ name: x, address: \"127.0.0.1:1\" }}]\n  \
         b:\n    listen: [\"127.0.0.1:0\"]\n    stick: {{ state_file: {t} }}\n    \
         backends: [{{ name: y, address: \"127.0.0.1:2\" }}]\n",
        t = table.display()
    );
    let path = dir.path().join("crossbar.yaml");
    std::fs::write(&path, yaml).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_crossbar"))
        .arg("check")
        .arg("-c")
        .arg(&path)
        .output()
        .expect("run crossbar check");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let at = format!("{}:9:", path.display());
    let what = format!(
        "services.b.stick.state_file: {} is already the state file of service a",
        table.display()
    );
    assert!(err.contains(&at) && err.contains(&what), "{err}");
}

/// A shared address's settings (one socket's) are written once: the first service
/// to write `proxy_protocol`, `per_source`, `backlog`, `freebind` or
/// `max_connections` gives it to the others, which name the address alone; a
/// service that writes the same value again is fine.
#[test]
fn a_shared_address_takes_its_settings_from_the_one_service_that_writes_them() {
    let yaml = "services:\n\
      \x20 puppet:\n    listen:\n      - { address: \"10.0.0.10:8140\", backlog: 2048, freebind: true, max_connections: 5000, proxy_protocol: { accept_from: [\"10.0.0.0/24\"] }, per_source: { max_connections: 20 } }\n    server_names: [puppet.example.com]\n    backends: [{ name: a, address: \"10.0.1.1:8140\" }]\n\
      \x20 puppetca:\n    listen: [\"10.0.0.10:8140\"]\n    server_names: [puppetca.example.com]\n    backends: [{ name: ca1, address: \"10.0.1.9:8140\" }]\n\
      \x20 puppetfiles:\n    listen:\n      - { address: \"10.0.0.10:8140\", max_connections: 5000 }\n    server_names: [puppetfiles.example.com]\n    backends: [{ name: f1, address: \"10.0.1.3:8140\" }]\n";
    let c = ok(yaml);
    let first = &c.services[0].listen[0];
    assert!(first.proxy_protocol.is_some() && first.per_source.is_some());
    for svc in &c.services[1..] {
        let l = &svc.listen[0];
        assert_eq!(
            (l.backlog, l.freebind, l.max_connections),
            (2048, true, 5000),
            "{}",
            svc.name
        );
        assert_eq!(l.proxy_protocol, first.proxy_protocol, "{}", svc.name);
        assert_eq!(l.per_source, first.per_source, "{}", svc.name);
    }
    // Another value for one of them: an error naming that setting, at its line.
    let err = load(&yaml.replace("max_connections: 5000 }", "max_connections: 6000 }"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(":13:")
            && err.contains("services.puppetfiles.listen[0].max_connections: 10.0.0.10:8140 is shared with puppet: its `max_connections` differs"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}
