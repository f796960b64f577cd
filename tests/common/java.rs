//! JDK TLS peers (the stack Puppet Server and PuppetDB run on): the programs in
//! tests/java compiled with javac into a temp dir, PKCS#12 key and trust stores made
//! from a test CA, HTTPS servers in one JVM and agents with the JDK's own session
//! cache. A `prefix` runs the JVM through another command first (`ip netns exec NS`
//! for the namespace tests; empty for loopback).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc::Sender;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use crossbar::testbed::TestCa;

use super::tls::{ChildGuard, SNI};

/// Longest a JVM may take to start its servers or finish its agents.
pub const JVM_TIMEOUT: Duration = Duration::from_secs(120);

/// The compiled Java programs, in a temp dir of this test.
pub struct Java {
    pub dir: tempfile::TempDir,
}

/// One agent connection: (resumed by the JDK's own account, backend that answered).
pub type JdkAttempt = (bool, String);

impl Java {
    /// Compile the programs. Without a JDK the test fails (tests/run.sh installs
    /// openjdk-17-jdk-headless).
    pub fn compile() -> Java {
        let found = Command::new("javac")
            .arg("-version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            crossbar::testbed::missing_tool(
                "JDK peers",
                "no `javac` (apt-get install openjdk-17-jdk-headless)",
            );
        }
        let dir = tempfile::tempdir().expect("temp dir");
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/java");
        let status = Command::new("javac")
            .arg("-d")
            .arg(dir.path())
            .arg(src.join("JdkServers.java"))
            .arg(src.join("JdkClients.java"))
            .status()
            .expect("running javac");
        assert!(status.success(), "javac failed");
        Java { dir }
    }

    /// A PKCS#12 keystore holding a certificate for `name` issued by `ca`.
    pub fn keystore(&self, ca: &TestCa, name: &str) -> Result<PathBuf> {
        let pem = ca.issue_pem(name, &[SNI, "localhost", super::STACKS])?;
        let d = self.dir.path();
        std::fs::write(d.join(format!("{name}.crt")), &pem.cert)?;
        std::fs::write(d.join(format!("{name}.key")), &pem.key)?;
        let out = d.join(format!("{name}.p12"));
        run_tool(
            Command::new("openssl")
                .args([
                    "pkcs12",
                    "-export",
                    "-passout",
                    "pass:changeit",
                    "-name",
                    name,
                ])
                .arg("-in")
                .arg(d.join(format!("{name}.crt")))
                .arg("-inkey")
                .arg(d.join(format!("{name}.key")))
                .arg("-out")
                .arg(&out),
        )?;
        Ok(out)
    }

    /// A PKCS#12 truststore holding `ca`.
    pub fn truststore(&self, ca: &TestCa) -> Result<PathBuf> {
        let d = self.dir.path();
        std::fs::write(d.join("ca.crt"), ca.cert_pem())?;
        let out = d.join("trust.p12");
        if !out.exists() {
            run_tool(
                Command::new("keytool")
                    .args(["-importcert", "-noprompt", "-alias", "ca"])
                    .args(["-storetype", "PKCS12", "-storepass", "changeit"])
                    .arg("-file")
                    .arg(d.join("ca.crt"))
                    .arg("-keystore")
                    .arg(&out),
            )?;
        }
        Ok(out)
    }

    /// One JVM serving `names` on free loopback ports, each with its own certificate.
    pub fn servers(
        &self,
        ca: &TestCa,
        names: &[String],
        props: &[&str],
    ) -> Result<(ChildGuard, Vec<(String, SocketAddr)>)> {
        let list: Vec<(String, Option<SocketAddr>)> =
            names.iter().map(|n| (n.clone(), None)).collect();
        self.servers_at(ca, &list, props, &[])
    }

    /// One JVM (run through `prefix`) serving each `(name, address)`; an address of
    /// `None` is a free loopback port.
    pub fn servers_at(
        &self,
        ca: &TestCa,
        list: &[(String, Option<SocketAddr>)],
        props: &[&str],
        prefix: &[&str],
    ) -> Result<(ChildGuard, Vec<(String, SocketAddr)>)> {
        let mut args = Vec::new();
        for (n, at) in list {
            let ks = self.keystore(ca, n)?;
            args.push(match at {
                Some(a) => format!("{n}={}@{}:{}", ks.display(), a.ip(), a.port()),
                None => format!("{n}={}", ks.display()),
            });
        }
        let hosts: BTreeMap<String, std::net::IpAddr> = list
            .iter()
            .map(|(n, at)| (n.clone(), at.map_or([127, 0, 0, 1].into(), |a| a.ip())))
            .collect();
        let stdin = Stdio::piped(); // held open: the servers run until it closes
        self.run_class(
            prefix,
            props,
            "JdkServers",
            &args,
            stdin,
            move |lines, tx| {
                let mut found = Vec::new();
                for line in lines {
                    if line == "READY" {
                        let _ = tx.send(found.clone()); // ok: the test may have given up
                    }
                    let f: Vec<&str> = line.split(' ').collect();
                    if let ["LISTEN", name, port] = f[..] {
                        if let (Ok(p), Some(ip)) = (port.parse::<u16>(), hosts.get(name)) {
                            found.push((name.to_string(), SocketAddr::new(*ip, p)));
                        }
                    }
                }
            },
        )
        .map_err(|e| e.context("JdkServers printed no READY line"))
    }

    /// Run `clients` JDK agents (through `prefix`), each doing 1 + `resumptions`
    /// connections alternating over `addrs`; every agent's attempts in order, and
    /// the error lines.
    pub fn clients(
        &self,
        ca: &TestCa,
        clients: usize,
        resumptions: usize,
        addrs: &[SocketAddr],
        props: &[&str],
        prefix: &[&str],
    ) -> Result<(Vec<Vec<JdkAttempt>>, Vec<String>)> {
        self.clients_to(SNI, ca, clients, resumptions, addrs, props, prefix)
    }

    /// [`Java::clients`] sending the server name `sni`.
    #[allow(clippy::too_many_arguments)] // clients' parameters and the name
    pub fn clients_to(
        &self,
        sni: &str,
        ca: &TestCa,
        clients: usize,
        resumptions: usize,
        addrs: &[SocketAddr],
        props: &[&str],
        prefix: &[&str],
    ) -> Result<(Vec<Vec<JdkAttempt>>, Vec<String>)> {
        let trust = self.truststore(ca)?;
        let mut args = vec![trust.display().to_string(), sni.to_string()];
        args.extend([clients.to_string(), resumptions.to_string()]);
        args.extend(addrs.iter().map(|a| a.to_string()));
        let (guard, lines) = self
            .run_class(
                prefix,
                props,
                "JdkClients",
                &args,
                Stdio::null(),
                |lines, tx| {
                    let _ = tx.send(lines.collect::<Vec<String>>()); // ok: the test may have given up
                },
            )
            .map_err(|e| e.context("JdkClients did not finish"))?;
        drop(guard);
        if !lines.iter().any(|l| l == "DONE") {
            bail!("JdkClients ended early: {lines:?}");
        }
        let mut by_client: BTreeMap<usize, Vec<(usize, bool, String)>> = BTreeMap::new();
        let mut errors = Vec::new();
        for l in &lines {
            let f: Vec<&str> = l.split(' ').collect();
            match f[..] {
                ["RESULT", c, a, resumed, backend, ..] => {
                    by_client.entry(c.parse()?).or_default().push((
                        a.parse()?,
                        resumed == "true",
                        backend.to_string(),
                    ));
                }
                ["ERROR", ..] => errors.push(l.clone()),
                _ => {}
            }
        }
        let runs = by_client
            .into_values()
            .map(|mut v| {
                v.sort_by_key(|(a, _, _)| *a);
                v.into_iter().map(|(_, r, b)| (r, b)).collect()
            })
            .collect();
        Ok((runs, errors))
    }
}

impl Java {
    /// Start the program `class` with `args` in a JVM (through `prefix`), its stdout
    /// read line by line on a thread by `read`, which sends what the caller waits
    /// for (within [`JVM_TIMEOUT`]) and may go on reading to keep the pipe drained.
    fn run_class<T: Send + 'static>(
        &self,
        prefix: &[&str],
        props: &[&str],
        class: &str,
        args: &[String],
        stdin: Stdio,
        read: impl FnOnce(&mut dyn Iterator<Item = String>, &Sender<T>) + Send + 'static,
    ) -> Result<(ChildGuard, T)> {
        let mut child = jvm(prefix)
            .args(props)
            .arg("-cp")
            .arg(self.dir.path())
            .arg(class)
            .args(args)
            .stdin(stdin)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("spawning java")?;
        let stdout = child.stdout.take().context("java stdout")?;
        let guard = ChildGuard(child);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines().map_while(|l| l.ok());
            read(&mut lines, &tx);
        });
        let got = rx
            .recv_timeout(JVM_TIMEOUT)
            .map_err(|_| anyhow!("no answer from {class} within {JVM_TIMEOUT:?}"))?;
        Ok((guard, got))
    }
}

/// `java`, or `prefix... java`.
fn jvm(prefix: &[&str]) -> Command {
    match prefix.split_first() {
        None => Command::new("java"),
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg("java");
            c
        }
    }
}

/// Run a tool to completion; its failure is the test's error.
pub fn run_tool(cmd: &mut Command) -> Result<()> {
    let out = cmd.output().context("running a tool")?;
    if !out.status.success() {
        bail!("{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}
