//! Backend names with dots (a host name, or the `target-port` name a discovered
//! backend gets) through every place that parses or prints `SERVICE/BACKEND`:
//! `crossbar check`, the CLI (`status`, `table show`, `backend drain|weight`), the
//! admin API's paths and `/api/services`, metric labels, the status page, and the
//! stick table's state file across a restart. The real binary, real TLS backends.
mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;

use common::{crossbar_cli, crossbar_run, free_port, raw_request, within, ChildGuard, SNI, WAIT};
use crossbar::testbed::{self, BackendTls, TestCa, TlsBackend, Versions};
use rustls::ClientConfig;
use serde_json::Value;

/// A backend named as Puppet names its compile servers (its certname).
const FQDN: &str = "compile01.dc1.example.com";
/// A backend named as `discover` names the one an SRV record gives.
const LIKE_DNS: &str = "compile2.lab.test-8140";
const TOKEN: &str = "names-token";

/// `crossbar run` on `cfg`, once its listener accepts.
async fn serving(cfg: &Path, listen: SocketAddr) -> ChildGuard {
    let p = crossbar_run(cfg, None, Stdio::inherit());
    common::wait_until(&format!("{listen} accepting"), || {
        std::net::TcpStream::connect(listen).is_ok()
    })
    .await;
    p
}

/// An admin request with the token; (status, body).
async fn admin(addr: SocketAddr, method: &str, path: &str) -> (Option<u16>, String) {
    let req = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {TOKEN}\r\n\
         content-length: 0\r\nconnection: close\r\n\r\n"
    );
    let (status, text) = within("admin request", raw_request(addr, req.as_bytes(), WAIT)).await;
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (status, body)
}

/// The CLI with the admin address and token file given; (ok, stdout, stderr).
async fn cli(url: &str, token: &Path, args: &[&str]) -> (bool, String, String) {
    let mut all: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    all.extend(["--admin".into(), url.to_string()]);
    all.extend(["--token-file".into(), token.display().to_string()]);
    crossbar_cli(all).await
}

/// What bash's completion (the script `crossbar generate bash` prints, as the
/// package installs it) offers for the last word of `line`, with the admin API at
/// `url`; sorted.
fn bash_completes(url: &str, line: &str) -> Vec<String> {
    let bin = Path::new(env!("CARGO_BIN_EXE_crossbar"));
    let words: Vec<&str> = line.split(' ').collect();
    let script = format!(
        "source <(crossbar generate bash)\nCOMP_WORDS=({line})\nCOMP_CWORD={}\nCOMP_TYPE=9\n\
         _clap_complete_crossbar crossbar {} {}\nprintf '%s\\n' \"${{COMPREPLY[@]}}\"\n",
        words.len() - 1,
        words[words.len() - 1],
        words[words.len() - 2],
    );
    let path = format!(
        "{}:{}",
        bin.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(&script)
        .env("PATH", path)
        .env("CROSSBAR_ADMIN", url)
        .output()
        .expect("bash runs");
    let mut got: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect();
    got.sort();
    got
}

/// The config names of the backends answering each agent (a fresh session each).
async fn placed(listen: SocketAddr, agents: &[Arc<ClientConfig>]) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    for a in agents {
        let r = testbed::get(listen, SNI, a.clone(), "/").await.unwrap();
        out.push((config_name(&r.backend).to_string(), r.resumed));
    }
    out
}

/// The (kind, key, backend) rows `crossbar table show` prints.
fn entries(table: &str) -> std::collections::BTreeSet<(String, String, String)> {
    table
        .lines()
        .skip(2)
        .filter_map(|l| {
            let mut w = l.split_whitespace().map(str::to_string);
            Some((w.next()?, w.next()?, w.next()?))
        })
        .collect()
}

/// The configured name of the TLS backend that calls itself `server`.
fn config_name(server: &str) -> &'static str {
    match server {
        "b1" => FQDN,
        "b2" => LIKE_DNS,
        other => panic!("unknown backend {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dotted_backend_names_work_in_every_view() {
    let ca = TestCa::new("backend names").unwrap();
    // TLS 1.2 session IDs: learned at the full handshake, so the table has entries
    // for both backends at once, and a resumption proves where the entry points.
    let tls = BackendTls {
        versions: Versions::Tls12,
        tickets: false,
    };
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let b1 = TlsBackend::start(&ca, "b1", &[SNI], tls, any)
        .await
        .unwrap();
    let b2 = TlsBackend::start(&ca, "b2", &[SNI], tls, any)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (listen, admin_addr) = (free_port(), free_port());
    let token = dir.path().join("admin.token");
    std::fs::write(&token, format!("{TOKEN}\n")).unwrap();
    std::fs::set_permissions(&token, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let state = dir.path().join("puppet.table");
    let yaml = format!(
        "admin: {{ listen: \"{admin_addr}\", token_file: \"{}\" }}\n\
         services:\n  puppet:\n    listen: [\"{listen}\"]\n    balance: roundrobin\n\
         \x20   health: {{ check: none }}\n\
         \x20   stick: {{ on: [session_id], state_file: \"{}\" }}\n    backends:\n\
         \x20     - {{ name: {FQDN}, address: \"{}\" }}\n\
         \x20     - {{ name: {LIKE_DNS}, address: \"{}\" }}\n",
        token.display(),
        state.display(),
        b1.addr,
        b2.addr,
    );
    let cfg = dir.path().join("crossbar.yaml");
    std::fs::write(&cfg, yaml).unwrap();
    let url = format!("http://{admin_addr}");

    let (ok, out, err) =
        crossbar_cli(vec!["check".into(), "-c".into(), cfg.display().to_string()]).await;
    assert!(
        ok && out.contains(FQDN) && out.contains(LIKE_DNS),
        "{out}{err}"
    );

    let p = serving(&cfg, listen).await;
    let agents: Vec<_> = (0..4)
        .map(|_| testbed::client_config(&ca, Versions::Tls12, false).unwrap())
        .collect();
    let first = placed(listen, &agents).await;
    let names: Vec<&str> = first.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, [FQDN, LIKE_DNS, FQDN, LIKE_DNS], "round robin");

    // The CLI prints and parses the names.
    let (ok, out, err) = cli(&url, &token, &["status"]).await;
    assert!(ok, "{err}");
    for n in [FQDN, LIKE_DNS] {
        let row = out.lines().find(|l| l.trim_start().starts_with(n));
        assert!(row.is_some_and(|r| r.contains(" up ")), "{n}: {out}");
    }
    let (ok, out, err) = cli(&url, &token, &["table", "show", "puppet"]).await;
    assert!(ok, "{err}");
    for n in [FQDN, LIKE_DNS] {
        assert_eq!(
            out.matches(n).count(),
            2,
            "two session entries on {n}: {out}"
        );
    }
    let target = format!("puppet/{FQDN}");
    let (ok, out, err) = cli(&url, &token, &["backend", "drain", &target]).await;
    assert!(ok, "{err}");
    assert_eq!(out, format!("{target}: drain (0 active connections)\n"));
    let fresh = testbed::client_config(&ca, Versions::Tls12, false).unwrap();
    assert_eq!(placed(listen, &[fresh]).await[0].0, LIKE_DNS, "drained");
    let target2 = format!("puppet/{LIKE_DNS}");
    let (ok, _, err) = cli(&url, &token, &["backend", "weight", &target2, "7"]).await;
    assert!(ok, "{err}");
    // Bash completes service and backend names from the running crossbar (its
    // admin address from CROSSBAR_ADMIN here: no config at the default path).
    for (words, want) in [
        (
            "crossbar backend drain pu",
            vec![format!("puppet/{FQDN}"), format!("puppet/{LIKE_DNS}")],
        ),
        (
            "crossbar backend weight puppet/compile2",
            vec![format!("puppet/{LIKE_DNS}")],
        ),
        ("crossbar table show pu", vec!["puppet".to_string()]),
        ("crossbar connections p", vec!["puppet".to_string()]),
    ] {
        assert_eq!(bash_completes(&url, words), want, "{words}");
    }
    // A name asked short, or misspelt: every 404 suggests the one meant.
    for (args, meant) in [
        (vec!["backend", "weight", "puppet/compile2", "5"], LIKE_DNS),
        (vec!["backend", "drain", "puppet/compile01"], FQDN),
        (vec!["table", "show", "pupet"], "puppet"),
        (vec!["connections", "puppte"], "puppet"),
    ] {
        let (ok, _, err) = cli(&url, &token, &args).await;
        assert!(
            !ok && err.contains("404") && err.contains(&format!("did you mean \"{meant}\"?")),
            "{args:?}: {err}"
        );
    }

    // The API: the names in /api/services, and as path segments.
    let (status, body) = admin(admin_addr, "GET", "/api/services").await;
    assert_eq!(status, Some(200), "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    let backends = v["services"][0]["backends"].as_array().unwrap().clone();
    let by_name = |n: &str| backends.iter().find(|b| b["name"] == n).cloned().unwrap();
    assert_eq!(by_name(FQDN)["state"], "drain", "{body}");
    assert_eq!(by_name(LIKE_DNS)["weight"], 7, "{body}");
    let (status, body) = admin(
        admin_addr,
        "POST",
        &format!("/api/backends/{target}/enable"),
    )
    .await;
    assert_eq!(status, Some(200), "{body}");

    // Metric labels.
    let (_, metrics) = admin(admin_addr, "GET", "/metrics").await;
    let connections = |n: &str| {
        common::metric_value(
            &metrics,
            "crossbar_connections_total",
            &[("service", "puppet"), ("backend", n)],
        )
    };
    assert_eq!(
        (connections(FQDN), connections(LIKE_DNS)),
        (2.0, 3.0),
        "{metrics}"
    );
    let weight = common::metric_value(
        &metrics,
        "crossbar_backend_weight",
        &[("service", "puppet"), ("backend", LIKE_DNS)],
    );
    assert_eq!(weight, 7.0);

    // The status page: each name, and the command that undoes the run-time weight.
    let (status, page) = admin(admin_addr, "GET", "/").await;
    assert_eq!(status, Some(200));
    assert!(page.contains(&format!("<td>{FQDN}</td>")), "{page}");
    assert!(
        page.contains(&format!("crossbar backend weight {target2} 1")),
        "{page}"
    );

    // The state file keeps the entries under their names across a restart: in
    // reverse order a fresh round robin would swap every agent's backend.
    let saved = entries(&cli(&url, &token, &["table", "show", "puppet"]).await.1);
    assert!(saved.iter().any(|(_, _, b)| b == FQDN), "{saved:?}");
    p.signal("TERM");
    let mut p = p;
    assert_eq!(p.exited(WAIT).await, Some(0), "exit status after SIGTERM");
    assert!(state.exists(), "table saved at shutdown");
    let _p = serving(&cfg, listen).await;
    let (ok, out, err) = cli(&url, &token, &["table", "show", "puppet"]).await;
    assert!(ok, "{err}");
    assert_eq!(
        entries(&out),
        saved,
        "every entry loaded under its backend's name"
    );
    for (a, (want, _)) in agents.iter().zip(&first).rev() {
        let got = placed(listen, std::slice::from_ref(a)).await.remove(0);
        assert_eq!((&got.0, got.1), (want, true), "resumed on its backend");
    }
}
