//! Real TLS peers for the stickiness and hostile-hello tests: `openssl s_server`
//! backends and `openssl s_client` runs (as child processes that are always killed),
//! and the YAML list of their addresses.
//!
//! Part of the one test-helper module: `mod common;` then `common::tls`.
#![allow(dead_code)] // each test binary uses a different subset

use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use crossbar::testbed::TestCa;

/// The SNI every stickiness client sends (the backend certificates carry it).
pub use super::SNI;
/// Longest one `openssl s_client` run may take (a loopback handshake takes ~10 ms).
const S_CLIENT_TIMEOUT: Duration = Duration::from_secs(15);
/// Longest an `openssl s_server` may take to print its `ACCEPT` line.
const S_SERVER_START_TIMEOUT: Duration = Duration::from_secs(15);

/// A child process killed (and reaped) when dropped, whatever path the test takes.
pub struct ChildGuard(pub Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        // Both fail only when the process already exited: nothing left to clean up.
        let _ = self.0.kill(); // ok: see above
        let _ = self.0.wait(); // ok: see above
    }
}

/// An `openssl s_server -WWW` answering `GET /who` with its own name, from its own
/// directory, with its own certificate, session cache and ticket key.
pub struct OpensslBackend {
    /// Name (the body of `/who`).
    pub name: String,
    /// Where it listens.
    pub addr: SocketAddr,
    _child: ChildGuard,
    _dir: tempfile::TempDir,
}

impl OpensslBackend {
    /// Start one on a free loopback port; `extra` are more s_server options
    /// (e.g. `-no_ticket`).
    pub fn start(ca: &TestCa, name: &str, extra: &[&str]) -> Result<OpensslBackend> {
        let dir = tempfile::tempdir()?;
        let pem = ca.issue_pem(name, &[SNI, "localhost", super::STACKS])?;
        std::fs::write(dir.path().join("cert.pem"), &pem.cert)?;
        std::fs::write(dir.path().join("key.pem"), &pem.key)?;
        std::fs::write(dir.path().join("who"), format!("{name}\n"))?;
        let mut child = Command::new("openssl")
            .args(["s_server", "-accept", "127.0.0.1:0", "-WWW"])
            .args(["-cert", "cert.pem", "-key", "key.pem"])
            .args(extra)
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("spawning openssl s_server")?;
        let stdout = child.stdout.take().context("s_server stdout")?;
        let guard = ChildGuard(child);
        // Readiness: s_server prints "ACCEPT 127.0.0.1:PORT" once it listens. The
        // thread then keeps draining stdout so the server never blocks on a full pipe.
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            let mut tx = Some(tx);
            for line in lines.by_ref().map_while(|l| l.ok()) {
                if let Some(rest) = line.strip_prefix("ACCEPT ") {
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(rest.trim().to_string()); // ok: test may have given up
                    }
                }
            }
        });
        let addr = rx
            .recv_timeout(S_SERVER_START_TIMEOUT)
            .map_err(|_| anyhow!("openssl s_server {name} printed no ACCEPT line"))?
            .parse()
            .context("s_server ACCEPT address")?;
        Ok(OpensslBackend {
            name: name.to_string(),
            addr,
            _child: guard,
            _dir: dir,
        })
    }
}

/// What one `openssl s_client` run showed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SClientRun {
    /// s_client printed "Reused," (its own resumption flag).
    pub reused: bool,
    /// The backend whose name came back in the HTTP body.
    pub backend: String,
}

/// Session file handling of one s_client run.
pub enum Sess<'a> {
    /// `-sess_out FILE`: full handshake, save the session.
    Out(&'a Path),
    /// `-sess_in FILE`: offer the saved session.
    In(&'a Path),
    /// `-sess_in FILE -sess_out FILE`: offer the saved session, save the new one
    /// (single-use tickets: stateful TLS 1.3 servers accept each ticket once).
    InOut(&'a Path),
}

/// `openssl s_client` agents, each with its own session file: every agent's full
/// handshake in parallel (to `addrs[0]`), then each agent's `resumptions` in
/// sequence, agents in parallel, resumption `a` (from 1) to `addrs[a % addrs.len()]`.
/// `save_resumed`: each resumption saves the session it got (single-use tickets),
/// else all offer the first one. Every connection's result, per agent, in order.
pub async fn openssl_agents(
    addrs: &[SocketAddr],
    args: &'static [&'static str],
    names: &[String],
    agents: usize,
    resumptions: usize,
    save_resumed: bool,
) -> Result<Vec<Vec<Result<SClientRun>>>> {
    let dir = std::sync::Arc::new(tempfile::tempdir()?);
    let file = |i: usize| dir.path().join(format!("agent{i}.sess"));
    let names = std::sync::Arc::new(names.to_vec());
    let addrs = std::sync::Arc::new(addrs.to_vec());
    let mut firsts = Vec::new();
    for i in 0..agents {
        let (file, names, addr) = (file(i), names.clone(), addrs[0]);
        firsts.push(tokio::task::spawn_blocking(move || {
            s_client(addr, args, Sess::Out(&file), &names)
        }));
    }
    let mut out = Vec::new();
    for t in firsts {
        out.push(vec![t.await?]);
    }
    let mut rest = Vec::new();
    for i in 0..agents {
        let (file, names, addrs) = (file(i), names.clone(), addrs.clone());
        rest.push(tokio::task::spawn_blocking(move || {
            (1..=resumptions)
                .map(|a| {
                    let sess = match save_resumed {
                        true => Sess::InOut(&file),
                        false => Sess::In(&file),
                    };
                    s_client(addrs[a % addrs.len()], args, sess, &names)
                })
                .collect::<Vec<_>>()
        }));
    }
    for (runs, t) in out.iter_mut().zip(rest) {
        runs.extend(t.await?);
    }
    Ok(out)
}

/// Run `openssl s_client` once: handshake, send `GET /who`, read the answer until
/// the server closes (so TLS 1.3 post-handshake tickets reach `-sess_out`), and say
/// whether it resumed and which of `names` answered. Killed after `S_CLIENT_TIMEOUT`.
pub fn s_client(
    addr: SocketAddr,
    args: &[&str],
    sess: Sess,
    names: &[String],
) -> Result<SClientRun> {
    let (flag, file, out) = match sess {
        Sess::Out(f) => ("-sess_out", f, None),
        Sess::In(f) => ("-sess_in", f, None),
        Sess::InOut(f) => ("-sess_in", f, Some(f)),
    };
    let mut child = Command::new("openssl")
        .args([
            "s_client",
            "-connect",
            &addr.to_string(),
            "-servername",
            SNI,
        ])
        .args(["-ign_eof", flag])
        .arg(file)
        .args(
            out.map(|f| [Path::new("-sess_out"), f])
                .into_iter()
                .flatten(),
        )
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("spawning openssl s_client")?;
    let mut stdin = child.stdin.take().context("s_client stdin")?;
    let mut stdout = child.stdout.take().context("s_client stdout")?;
    let guard = ChildGuard(child);
    stdin.write_all(b"GET /who HTTP/1.0\r\n\r\n")?;
    drop(stdin);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut out = String::new();
        let r = stdout.read_to_string(&mut out).map(|_| out);
        let _ = tx.send(r); // ok: the test may have timed out
    });
    let out = rx
        .recv_timeout(S_CLIENT_TIMEOUT)
        .map_err(|_| anyhow!("openssl s_client to {addr} did not finish"))??;
    drop(guard);
    let reused = out.lines().any(|l| l.starts_with("Reused,"));
    if !reused && !out.lines().any(|l| l.starts_with("New,")) {
        bail!("s_client printed no session line:\n{out}");
    }
    let backend = out
        .lines()
        .map(str::trim)
        .find(|l| names.iter().any(|n| n == l))
        .with_context(|| format!("no backend name in s_client output:\n{out}"))?
        .to_string();
    Ok(SClientRun { reused, backend })
}

/// The YAML list of backends `name -> address`.
pub fn backends_yaml(backends: &[(String, SocketAddr)]) -> String {
    backends
        .iter()
        .map(|(n, a)| super::backend_line(n, *a, ""))
        .collect()
}
