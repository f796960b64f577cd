//! The real client stacks agents and tools use, through crossbar to servers of each
//! stack (docs/security.md "Client stacks").
//!
//! Servers: `openssl s_server`, rustls (crossbar's testbed) and the JDK
//! (tests/java/JdkServers.java), two backends of each for each resumption mode:
//! TLS 1.2 with session IDs only, TLS 1.2 with tickets, TLS 1.3. Each (stack, mode)
//! is a crossbar service on ONE shared listener, routed by SNI
//! (`STACK-MODE.stacks.example.com`), round robin, stickiness on session state only
//! (`session_id, ticket, psk`, no `source`: every client is 127.0.0.1) and no
//! confirmation, so a resumption lands on its backend only if stickiness placed it.
//!
//! Clients, each making for every service one full handshake and two resumptions:
//! `openssl s_client` (-sess_out/-sess_in), curl (one run, three URLs), Ruby's
//! Net::HTTP (tests/stacks/client.rb), Python's ssl (tests/stacks/client.py), the
//! JDK client (tests/java/JdkClients.java), Go's crypto/tls (tests/stacks/client.go)
//! and headless Chromium. Clients reach crossbar through a tap in this test that
//! measures each ClientHello and passes it on in 256-byte writes (so every hello
//! spans several TCP segments).
//!
//! Judged per connection from crossbar's access log (service, backend, the server's
//! handshake kind, the stick key that placed it) and, where the stack tells, the
//! client's own resumption flag: the SNI picked the service; resumptions were
//! resumed, by the mode's key, on the backend of the full handshake.
//!
//! Run with `--nocapture` to see the matrix and the hello sizes.
mod common;

use common::java::Java;
use common::tls::{ChildGuard, OpensslBackend};
use common::{free_port, Crossbar, LogBuffer};

use std::collections::BTreeMap;
use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use crossbar::testbed::{BackendTls, TestCa, TlsBackend, Versions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Longest one client run may take (every service, three connections each).
const CLIENT_TIMEOUT: Duration = Duration::from_secs(180);
/// The tap passes each ClientHello on in writes of this size (a post-quantum hello
/// of ~1.6 KiB then spans 7 segments).
const TAP_CHUNK: usize = 256;
/// Largest hello the tap measures (bounded read).
const TAP_MAX_HELLO: usize = 16 * 1024;

/// How a service's backends resume sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Mode {
    /// TLS 1.2, no tickets: session IDs.
    Id,
    /// TLS 1.2 with session tickets.
    Ticket,
    /// TLS 1.3 (PSK from a ticket).
    Tls13,
}

impl Mode {
    const ALL: [Mode; 3] = [Mode::Id, Mode::Ticket, Mode::Tls13];

    fn word(self) -> &'static str {
        match self {
            Mode::Id => "id",
            Mode::Ticket => "ticket",
            Mode::Tls13 => "tls13",
        }
    }

    /// The stick key a resumption in this mode is placed by (access log `stick=`).
    fn key(self) -> &'static str {
        match self {
            Mode::Id => "session_id",
            Mode::Ticket => "ticket",
            Mode::Tls13 => "psk",
        }
    }
}

/// (client, server stack, mode) where the client offers its session, crossbar
/// places it on the backend holding it (a stick hit, in the access log), and the
/// server declines it with a full handshake: the server's choice, not crossbar's
/// (docs/security.md "Client stacks").
const SERVER_DECLINES: &[(&str, &str, Mode)] = &[("Go crypto/tls", "jdk", Mode::Ticket)];

/// One service: a server stack in one mode, two backends.
struct Svc {
    stack: &'static str,
    mode: Mode,
    sni: String,
    backends: Vec<(String, SocketAddr)>,
}

impl Svc {
    /// Placement confirmation (`stick.confirm`) for the JDK's services only: its
    /// session IDs are learnt, but its tickets carry no key name crossbar could
    /// learn (docs/stickiness.md), so only confirmation finds their holder behind
    /// one source address; the others must be placed by stickiness alone.
    fn confirm(&self) -> bool {
        self.stack == "jdk"
    }
}

/// Everything the clients talk to.
struct Bed {
    services: Vec<Svc>,
    /// The tap in front of crossbar's one listener (what clients dial).
    tap: SocketAddr,
    /// Hello sizes the tap measured, in connection order.
    hellos: Arc<Mutex<Vec<usize>>>,
    ca_pem: PathBuf,
    ca: TestCa,
    java: Java,
    log: LogBuffer,
    _keep: Vec<Box<dyn std::any::Any + Send>>,
    _dir: tempfile::TempDir,
    _cb: Crossbar,
}

async fn bed() -> Bed {
    let log = LogBuffer::install();
    let ca = TestCa::new("stacks CA").expect("CA");
    let dir = tempfile::tempdir().expect("temp dir");
    let ca_pem = dir.path().join("ca.pem");
    std::fs::write(&ca_pem, ca.cert_pem()).expect("write CA");
    let java = Java::compile();
    let mut keep: Vec<Box<dyn std::any::Any + Send>> = Vec::new();
    let mut services = Vec::new();
    for mode in Mode::ALL {
        let names = |stack: &str| -> Vec<String> {
            ["a", "b"]
                .iter()
                .map(|x| format!("{stack}-{}-{x}", mode.word()))
                .collect()
        };
        // openssl s_server
        let extra: &[&str] = match mode {
            Mode::Id => &["-tls1_2", "-no_ticket"],
            Mode::Ticket => &["-tls1_2"],
            Mode::Tls13 => &["-tls1_3"],
        };
        let mut backends = Vec::new();
        for n in names("openssl") {
            let b = OpensslBackend::start(&ca, &n, extra).expect("openssl s_server");
            backends.push((n, b.addr));
            keep.push(Box::new(b));
        }
        services.push(svc("openssl", mode, backends));
        // rustls
        let tls = BackendTls {
            versions: if mode == Mode::Tls13 {
                Versions::Tls13
            } else {
                Versions::Tls12
            },
            tickets: mode != Mode::Id,
        };
        let mut backends = Vec::new();
        for n in names("rustls") {
            let sni = format!("rustls-{}.stacks.example.com", mode.word());
            let b = TlsBackend::start(&ca, &n, &[&sni], tls, common::any_port())
                .await
                .expect("rustls backend");
            backends.push((n, b.addr));
            keep.push(Box::new(b));
        }
        services.push(svc("rustls", mode, backends));
        // JDK: one JVM per mode (the protocol and ticket settings are per JVM).
        // TLS 1.2 only: TLSv1.3 added to the disabled algorithms (a security
        // property, from a file); tickets by the JDK's own switch.
        let no13 = dir.path().join("no-tls13.security");
        std::fs::write(
            &no13,
            "jdk.tls.disabledAlgorithms=TLSv1.3, SSLv3, TLSv1, TLSv1.1, RC4, DES, MD5withRSA, DH keySize < 1024, EC keySize < 224, 3DES_EDE_CBC, anon, NULL\n",
        )
        .expect("write security file");
        let no13 = format!("-Djava.security.properties={}", no13.display());
        let props: Vec<&str> = match mode {
            Mode::Id => vec![&no13, "-Djdk.tls.server.enableSessionTicketExtension=false"],
            Mode::Ticket => vec![&no13, "-Djdk.tls.server.enableSessionTicketExtension=true"],
            Mode::Tls13 => vec![],
        };
        let (guard, backends) = java
            .servers(&ca, &names("jdk"), &props)
            .expect("JDK servers");
        keep.push(Box::new(guard));
        services.push(svc("jdk", mode, backends));
    }
    let listen = free_port();
    let mut yaml = String::from("admin: { enabled: false }\nservices:\n");
    for s in &services {
        yaml.push_str(&format!(
            "  {}-{}:\n    listen: [\"{listen}\"]\n    server_names: [\"{}\"]\n    health: {{ check: none }}\n    stick: {{ on: [session_id, ticket, psk], confirm: {} }}\n    backends:\n",
            s.stack,
            s.mode.word(),
            s.sni,
            s.confirm()
        ));
        for (n, a) in &s.backends {
            yaml.push_str(&common::backend_line(n, *a, ""));
        }
    }
    let cb = Crossbar::start(&yaml).await;
    let hellos = Arc::new(Mutex::new(Vec::new()));
    let tap = tap(listen, hellos.clone()).await;
    Bed {
        services,
        tap,
        hellos,
        ca_pem,
        ca,
        java,
        log,
        _keep: keep,
        _dir: dir,
        _cb: cb,
    }
}

fn svc(stack: &'static str, mode: Mode, backends: Vec<(String, SocketAddr)>) -> Svc {
    Svc {
        stack,
        mode,
        sni: format!("{stack}-{}.stacks.example.com", mode.word()),
        backends,
    }
}

/// A TCP relay to `to` that measures each connection's ClientHello (the handshake
/// message's length from its header) and passes the hello on in [`TAP_CHUNK`]-byte
/// writes with Nagle off, then relays both ways.
async fn tap(to: SocketAddr, hellos: Arc<Mutex<Vec<usize>>>) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind tap");
    let addr = l.local_addr().expect("tap addr");
    tokio::spawn(async move {
        while let Ok((mut c, _)) = l.accept().await {
            let hellos = hellos.clone();
            tokio::spawn(async move {
                let Ok(mut up) = TcpStream::connect(to).await else {
                    return;
                };
                let _ = up.set_nodelay(true); // ok: only changes segmenting
                                              // The first record header and handshake header: type 0x16, then the
                                              // hello's 3-byte length.
                let mut head = [0u8; 9];
                if c.read_exact(&mut head).await.is_err() {
                    return;
                }
                let len = if head[0] == 0x16 && head[5] == 1 {
                    4 + (usize::from(head[6]) << 16
                        | usize::from(head[7]) << 8
                        | usize::from(head[8]))
                } else {
                    0
                };
                hellos.lock().expect("hellos").push(len);
                // The hello spans 5-byte record headers too; pass on the record(s)
                // holding it: at least `len` + 5 bytes, at most TAP_MAX_HELLO.
                let mut first = head.to_vec();
                let want = (len + 5).min(TAP_MAX_HELLO);
                let mut buf = vec![0u8; want.saturating_sub(first.len())];
                if c.read_exact(&mut buf).await.is_err() {
                    return;
                }
                first.extend_from_slice(&buf);
                for chunk in first.chunks(TAP_CHUNK) {
                    if up.write_all(chunk).await.is_err() {
                        return;
                    }
                    // Each write its own segment: let the kernel send it first.
                    tokio::task::yield_now().await;
                }
                let _ = tokio::io::copy_bidirectional(&mut c, &mut up).await; // ok: either side may reset
            });
        }
    });
    addr
}

/// What one connection showed.
#[derive(Debug, Clone)]
struct Conn {
    /// The client's own resumption flag, when the stack reports one.
    client_resumed: Option<bool>,
    /// The backend whose name came back (None: the client could not read it).
    answer: Option<String>,
}

/// One access-log line's fields.
#[derive(Debug, Clone)]
struct Access {
    service: String,
    backend: String,
    handshake: String,
    stick: String,
    stick_result: String,
    confirm: String,
    end: String,
}

fn field(line: &str, key: &str) -> String {
    let at = format!(" {key}=");
    line.split(&at)
        .nth(1)
        .map(|r| {
            let v = r.split(' ').next().unwrap_or("");
            v.trim_matches('"').to_string()
        })
        .unwrap_or_default()
}

fn access_lines(log: &LogBuffer, sni: &str) -> Vec<Access> {
    log.lines_with("crossbar::access")
        .into_iter()
        .filter(|l| l.contains(&format!("sni=\"{sni}\"")))
        .map(|l| Access {
            service: field(&l, "service"),
            backend: field(&l, "backend"),
            handshake: field(&l, "handshake"),
            stick: field(&l, "stick"),
            stick_result: field(&l, "stick_result"),
            confirm: field(&l, "confirm"),
            end: field(&l, "end"),
        })
        .collect()
}

/// Run a command to its end within [`CLIENT_TIMEOUT`]; its stdout (and stderr).
fn run(tool: &str, cmd: &mut Command) -> Result<(String, String)> {
    let mut child = match cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            crossbar::testbed::missing_tool("the client stacks", &format!("no `{tool}`"))
        }
        Err(e) => return Err(e).context(format!("spawning {tool}")),
    };
    let mut out = child.stdout.take().context("stdout")?;
    let mut err = child.stderr.take().context("stderr")?;
    let guard = ChildGuard(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let (mut o, mut e) = (String::new(), String::new());
        let e_thread = std::thread::spawn(move || {
            let _ = err.read_to_string(&mut e); // ok: partial output is still shown
            e
        });
        let _ = out.read_to_string(&mut o); // ok: see above
        let e = e_thread.join().unwrap_or_default();
        let _ = tx.send((o, e)); // ok: the test may have given up
    });
    let got = rx
        .recv_timeout(CLIENT_TIMEOUT)
        .map_err(|_| anyhow!("{tool} did not finish within {CLIENT_TIMEOUT:?}"))?;
    drop(guard);
    Ok(got)
}

/// `RESULT sni attempt resumed backend` lines, per sni in attempt order.
fn results(out: &str) -> BTreeMap<String, Vec<Conn>> {
    let mut m: BTreeMap<String, Vec<Conn>> = BTreeMap::new();
    for l in out.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if let ["RESULT", sni, _a, resumed, rest @ ..] = &f[..] {
            m.entry(sni.to_string()).or_default().push(Conn {
                client_resumed: Some(*resumed == "true"),
                answer: rest.last().map(|s| s.to_string()),
            });
        }
    }
    m
}

impl Bed {
    fn snis(&self, stacks: &[&str]) -> Vec<String> {
        self.services
            .iter()
            .filter(|s| stacks.contains(&s.stack))
            .map(|s| s.sni.clone())
            .collect()
    }

    fn port(&self) -> String {
        self.tap.port().to_string()
    }

    fn url(&self, sni: &str) -> String {
        format!("https://{sni}:{}/who", self.port())
    }

    /// openssl s_client: per service, `-sess_out` then twice `-sess_in`/`-sess_out`.
    fn openssl(&self, snis: &[String]) -> Result<BTreeMap<String, Vec<Conn>>> {
        let mut m = BTreeMap::new();
        for sni in snis {
            let sess = self._dir.path().join(format!("{sni}.sess"));
            let mut v = Vec::new();
            for a in 0..3 {
                let mut cmd = Command::new("openssl");
                cmd.args([
                    "s_client",
                    "-connect",
                    &self.tap.to_string(),
                    "-servername",
                    sni,
                ])
                .arg("-CAfile")
                .arg(&self.ca_pem)
                .args(["-verify_return_error", "-ign_eof"]);
                if a > 0 {
                    cmd.arg("-sess_in").arg(&sess);
                }
                cmd.arg("-sess_out").arg(&sess);
                let (out, err) = run_with_input(cmd, "GET /who HTTP/1.0\r\n\r\n")?;
                let names: Vec<&String> = self
                    .services
                    .iter()
                    .flat_map(|s| s.backends.iter().map(|(n, _)| n))
                    .collect();
                let answer = out
                    .lines()
                    .map(str::trim)
                    .find(|l| names.iter().any(|n| n == l));
                if answer.is_none() {
                    bail!("s_client to {sni}: no backend name in its output:\n{out}\n{err}");
                }
                v.push(Conn {
                    client_resumed: Some(out.lines().any(|l| l.starts_with("Reused,"))),
                    answer: answer.map(str::to_string),
                });
            }
            m.insert(sni.clone(), v);
        }
        Ok(m)
    }
}

/// Run `cmd` with `input` on its stdin; its stdout and stderr.
fn run_with_input(mut cmd: Command, input: &str) -> Result<(String, String)> {
    use std::io::Write;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("spawning")?;
    let mut stdin = child.stdin.take().context("stdin")?;
    stdin.write_all(input.as_bytes())?;
    drop(stdin);
    let mut out = child.stdout.take().context("stdout")?;
    let mut err = child.stderr.take().context("stderr")?;
    let guard = ChildGuard(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let (mut o, mut e) = (String::new(), String::new());
        let _ = out.read_to_string(&mut o); // ok: partial output is still shown
        let _ = err.read_to_string(&mut e); // ok: see above
        let _ = tx.send((o, e)); // ok: the test may have given up
    });
    let got = rx
        .recv_timeout(Duration::from_secs(20))
        .map_err(|_| anyhow!("a client did not finish"))?;
    drop(guard);
    Ok(got)
}

fn src(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(name)
}

/// The verdict of one (client, service) cell.
#[derive(Debug)]
struct Cell {
    client: &'static str,
    stack: &'static str,
    mode: Mode,
    /// "ok (resumed 2/2 by KEY on BACKEND)", or what was seen when not supported.
    verdict: String,
    problems: Vec<String>,
}

/// Judge the connections of `client` to every service in `snis`: the service the SNI
/// names answered; the first was a full handshake; the others resumed on its backend
/// by the mode's key. `unsupported` modes may stay full handshakes (reported).
fn judge(
    bed: &Bed,
    client: &'static str,
    got: &BTreeMap<String, Vec<Conn>>,
    before: &BTreeMap<String, usize>,
    unsupported: &[Mode],
) -> Vec<Cell> {
    let mut cells = Vec::new();
    for s in bed.services.iter().filter(|s| got.contains_key(&s.sni)) {
        let conns = &got[&s.sni];
        let lines: Vec<Access> = access_lines(&bed.log, &s.sni)
            .into_iter()
            .skip(before.get(&s.sni).copied().unwrap_or(0))
            .collect();
        let mut problems = Vec::new();
        let svc = format!("{}-{}", s.stack, s.mode.word());
        if lines.len() != 3 || conns.len() != 3 {
            problems.push(format!(
                "{} connections logged, {} reported by the client (3 expected): {lines:?} {conns:?}",
                lines.len(),
                conns.len()
            ));
        }
        for (i, l) in lines.iter().enumerate() {
            if l.service != svc {
                problems.push(format!("#{i} routed to {} (SNI {})", l.service, s.sni));
            }
            if let Some(Some(a)) = conns.get(i).map(|c| c.answer.as_ref()) {
                if *a != l.backend {
                    problems.push(format!("#{i}: {a} answered, crossbar logged {}", l.backend));
                }
            }
        }
        let first = lines.first().map(|l| l.backend.clone()).unwrap_or_default();
        let resumed: Vec<bool> = lines
            .iter()
            .skip(1)
            .map(|l| l.handshake == "resumed")
            .collect();
        let all = resumed.len() == 2 && resumed.iter().all(|r| *r);
        // A resumption that offered no session state is the client's choice.
        let unoffered: Vec<usize> = (1..lines.len())
            .filter(|i| lines[*i].stick == "-")
            .collect();
        if let Some(l) = lines.first() {
            if l.handshake != "full" {
                problems.push(format!("first connection: handshake={}", l.handshake));
            }
        }
        let verdict = if all {
            for (i, l) in lines.iter().enumerate().skip(1) {
                if l.backend != first {
                    problems.push(format!(
                        "#{i} resumed on {}, its session is on {first}",
                        l.backend
                    ));
                }
                // A TLS 1.2 client offering a ticket may send a session ID with it,
                // looked up first: either places it.
                let key_ok =
                    l.stick == s.mode.key() || (s.mode == Mode::Ticket && l.stick == "session_id");
                let placed =
                    (key_ok && l.stick_result == "hit") || (s.confirm() && l.confirm != "-");
                if !placed {
                    problems.push(format!(
                        "#{i} placed by stick={} {} confirm={} (want {} hit)",
                        l.stick,
                        l.stick_result,
                        l.confirm,
                        s.mode.key()
                    ));
                }
                if conns.get(i).and_then(|c| c.client_resumed) == Some(false) {
                    problems.push(format!(
                        "#{i}: the server resumed, the client says it did not"
                    ));
                }
            }
            let mut how: Vec<String> = lines
                .iter()
                .skip(1)
                .map(|l| match l.confirm.as_str() {
                    "-" => format!("{} {}", l.stick, l.stick_result),
                    c => format!("{} {}, confirm {c}", l.stick, l.stick_result),
                })
                .collect();
            how.dedup();
            format!("resumed 2/2 on {first} ({})", how.join("; "))
        } else if !unoffered.is_empty()
            && lines.len() == 3
            && lines
                .iter()
                .skip(1)
                .all(|l| l.stick == "-" || (l.handshake == "resumed" && l.backend == first))
        {
            format!(
                "resumed {}/2 on {first}; the client offered no session on #{unoffered:?}",
                resumed.iter().filter(|r| **r).count()
            )
        } else if SERVER_DECLINES.contains(&(client, s.stack, s.mode))
            && lines.len() == 3
            && lines
                .iter()
                .skip(1)
                .all(|l| l.stick_result == "hit" && l.backend == first)
        {
            format!(
                "offered and placed on {first} (stick hit); the server declined: full handshakes"
            )
        } else if unsupported.contains(&s.mode) {
            format!(
                "not supported by the client: {} resumed of 2",
                resumed.iter().filter(|r| **r).count()
            )
        } else {
            problems.push(format!(
                "resumptions: {:?} (handshake, backend, stick: {:?}, ends {:?})",
                resumed,
                lines
                    .iter()
                    .map(|l| format!(
                        "{} {} {} {}",
                        l.handshake, l.backend, l.stick, l.stick_result
                    ))
                    .collect::<Vec<_>>(),
                lines.iter().map(|l| l.end.as_str()).collect::<Vec<_>>()
            ));
            "FAILED".to_string()
        };
        cells.push(Cell {
            client,
            stack: s.stack,
            mode: s.mode,
            verdict,
            problems,
        });
    }
    cells
}

fn marks(bed: &Bed) -> (BTreeMap<String, usize>, usize) {
    let m = bed
        .services
        .iter()
        .map(|s| (s.sni.clone(), access_lines(&bed.log, &s.sni).len()))
        .collect();
    (m, bed.hellos.lock().expect("hellos").len())
}

/// Wait until crossbar logged `n` more connections for each of `snis` (a connection's
/// line is written when it ends, just after the client's last read).
async fn settle(bed: &Bed, snis: &[String], before: &BTreeMap<String, usize>) {
    common::wait_until("crossbar logged every client connection", || {
        snis.iter()
            .all(|s| access_lines(&bed.log, s).len() >= before.get(s).copied().unwrap_or(0) + 3)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn every_client_stack_resumes_on_its_backend_through_crossbar() {
    let bed = bed().await;
    let all = bed.snis(&["openssl", "rustls", "jdk"]);
    let mut cells: Vec<Cell> = Vec::new();
    let mut sizes: Vec<(&str, Vec<usize>)> = Vec::new();
    let mut versions = Vec::new();

    type Runner<'a> =
        Box<dyn Fn(&Bed, &[String]) -> Result<(BTreeMap<String, Vec<Conn>>, String)> + 'a>;
    let go_bin = bed._dir.path().join("goclient");
    let clients: Vec<(&'static str, Vec<String>, &[Mode], Runner)> = vec![
        (
            "openssl s_client",
            all.clone(),
            &[],
            Box::new(|b: &Bed, s: &[String]| {
                let (v, _) = run("openssl", Command::new("openssl").arg("version"))?;
                Ok((b.openssl(s)?, v.trim().to_string()))
            }),
        ),
        (
            "curl",
            all.clone(),
            &[],
            Box::new(|b: &Bed, s: &[String]| curl(b, s)),
        ),
        (
            "ruby Net::HTTP",
            all.clone(),
            &[],
            Box::new(|b: &Bed, s: &[String]| script_client(b, s, "ruby", "stacks/client.rb")),
        ),
        (
            "python ssl",
            all.clone(),
            &[],
            Box::new(|b: &Bed, s: &[String]| script_client(b, s, "python3", "stacks/client.py")),
        ),
        (
            "JDK 17",
            all.clone(),
            &[],
            Box::new(|b: &Bed, s: &[String]| jdk(b, s)),
        ),
        // Go's client resumes by tickets only (crypto/tls has no client-side session
        // ID cache), so TLS 1.2 with session IDs stays a full handshake.
        (
            "Go crypto/tls",
            all.clone(),
            &[Mode::Id],
            Box::new(move |b: &Bed, s: &[String]| {
                let (_, err) = run(
                    "go",
                    Command::new("go")
                        .args(["build", "-o"])
                        .arg(&go_bin)
                        .arg(src("stacks/client.go"))
                        .env("GO111MODULE", "off"),
                )?;
                if !go_bin.exists() {
                    bail!("go build failed: {err}");
                }
                let (out, err) = run(
                    "goclient",
                    Command::new(&go_bin).arg(&b.ca_pem).arg(b.port()).args(s),
                )?;
                check_errors(&out, &err)?;
                Ok((results(&out), version(&out)))
            }),
        ),
        // Chromium keeps connections alive; the openssl and JDK servers close each
        // one, so its next load makes a new connection and resumes.
        (
            "Chromium",
            bed.snis(&["openssl", "jdk"]),
            &[],
            Box::new(|b: &Bed, s: &[String]| chromium(b, s)),
        ),
    ];
    for (name, snis, unsupported, runner) in &clients {
        let (before, hello_mark) = marks(&bed);
        let got = {
            let b = &bed;
            let s = snis.clone();
            tokio::task::block_in_place(|| runner(b, &s))
        };
        let (got, ver) = got.unwrap_or_else(|e| panic!("{name}: {e:#}"));
        settle(&bed, snis, &before).await;
        let h: Vec<usize> = bed.hellos.lock().expect("hellos")[hello_mark..].to_vec();
        sizes.push((name, h));
        versions.push(format!("{name}: {ver}"));
        // Clients that give no per-connection report (chromium) are judged from the
        // access log alone.
        let got = if got.is_empty() {
            snis.iter()
                .map(|s| {
                    (
                        s.clone(),
                        vec![
                            Conn {
                                client_resumed: None,
                                answer: None
                            };
                            3
                        ],
                    )
                })
                .collect()
        } else {
            got
        };
        cells.extend(judge(&bed, name, &got, &before, unsupported));
    }

    println!("| client | server | mode | result |\n|---|---|---|---|");
    for c in &cells {
        println!(
            "| {} | {} | {} | {}{} |",
            c.client,
            c.stack,
            c.mode.word(),
            c.verdict,
            if c.problems.is_empty() {
                ""
            } else {
                " PROBLEMS"
            }
        );
    }
    for (name, h) in &sizes {
        let (min, max) = (
            h.iter().min().copied().unwrap_or(0),
            h.iter().max().copied().unwrap_or(0),
        );
        println!(
            "hello sizes {name}: {} connections, {min}..{max} bytes (handshake message)",
            h.len()
        );
    }
    for v in &versions {
        println!("version {v}");
    }
    let bad: Vec<String> = cells
        .iter()
        .filter(|c| !c.problems.is_empty())
        .map(|c| {
            format!(
                "{} -> {} {}: {:?}",
                c.client,
                c.stack,
                c.mode.word(),
                c.problems
            )
        })
        .collect();
    assert!(
        bad.is_empty(),
        "client stacks through crossbar:\n{}",
        bad.join("\n")
    );
    assert!(bed.java.dir.path().exists());
    let _ = &bed.ca; // ok: kept alive with the servers it signed
}

fn version(out: &str) -> String {
    out.lines()
        .find_map(|l| l.strip_prefix("VERSION "))
        .unwrap_or("?")
        .to_string()
}

/// A client run that printed `ERROR` lines failed.
fn check_errors(out: &str, err: &str) -> Result<()> {
    let errors: Vec<&str> = out.lines().filter(|l| l.starts_with("ERROR")).collect();
    if !errors.is_empty() || !out.contains("VERSION") {
        bail!("client errors: {errors:?}\nstderr: {err}");
    }
    Ok(())
}

/// curl: one run per service, three URLs (curl keeps the session between them);
/// `Connection: close` makes each URL a new connection.
/// A client script of tests/stacks/ run by `interpreter` (Ruby's Net::HTTP, Python's
/// ssl): arguments the CA file, the port and the SNIs; results on stdout.
fn script_client(
    b: &Bed,
    snis: &[String],
    interpreter: &str,
    script: &str,
) -> Result<(BTreeMap<String, Vec<Conn>>, String)> {
    let (out, err) = run(
        interpreter,
        Command::new(interpreter)
            .arg(src(script))
            .arg(&b.ca_pem)
            .arg(b.port())
            .args(snis),
    )?;
    check_errors(&out, &err)?;
    Ok((results(&out), version(&out)))
}

fn curl(b: &Bed, snis: &[String]) -> Result<(BTreeMap<String, Vec<Conn>>, String)> {
    let mut m = BTreeMap::new();
    for sni in snis {
        let url = b.url(sni);
        let (out, err) = run(
            "curl",
            Command::new("curl")
                .args(["-sS", "-v", "--max-time", "15", "--cacert"])
                .arg(&b.ca_pem)
                .args(["--resolve", &format!("{sni}:{}:127.0.0.1", b.port())])
                .args(["-H", "Connection: close", "-w", "\\n"])
                .args([&url, &url, &url]),
        )?;
        let names: Vec<Conn> = out
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(|l| Conn {
                client_resumed: None,
                answer: Some(l.to_string()),
            })
            .collect();
        if names.len() != 3 {
            bail!("curl to {sni}: {out}\n{err}");
        }
        m.insert(sni.clone(), names);
    }
    let (v, _) = run("curl", Command::new("curl").arg("--version"))?;
    Ok((m, v.lines().next().unwrap_or("?").to_string()))
}

/// The JDK client (tests/java/JdkClients.java), one JVM per service.
fn jdk(b: &Bed, snis: &[String]) -> Result<(BTreeMap<String, Vec<Conn>>, String)> {
    let mut m = BTreeMap::new();
    for sni in snis {
        let (runs, errors) = b.java.clients_to(sni, &b.ca, 1, 2, &[b.tap], &[], &[])?;
        if !errors.is_empty() {
            bail!("JDK client to {sni}: {errors:?}");
        }
        let conns = runs
            .into_iter()
            .flatten()
            .enumerate()
            .map(|(i, (resumed, backend))| Conn {
                // JdkClients' flag compares with the previous session: meaningful
                // for resumptions only.
                client_resumed: (i > 0).then_some(resumed),
                answer: Some(backend),
            })
            .collect();
        m.insert(sni.clone(), conns);
    }
    Ok((m, "17 (JdkClients)".to_string()))
}

/// Headless Chromium loads each service's page three times in one browser (so its
/// session cache carries over), one load after the other, from a page that fetches
/// them in sequence; crossbar's log tells what happened.
fn chromium(b: &Bed, snis: &[String]) -> Result<(BTreeMap<String, Vec<Conn>>, String)> {
    let urls: Vec<String> = snis.iter().flat_map(|s| vec![b.url(s); 3]).collect();
    let list = urls
        .iter()
        .map(|u| format!("'{u}'"))
        .collect::<Vec<_>>()
        .join(",");
    let page = format!(
        "<html><body><script>(async()=>{{for(const u of [{list}]){{try{{await fetch(u,{{mode:'no-cors',cache:'no-store'}});}}catch(e){{}}}}document.title='done';}})();</script></body></html>"
    );
    let file = b._dir.path().join("page.html");
    std::fs::write(&file, page)?;
    let profile = b._dir.path().join("chromium-profile");
    let (out, err) = run(
        "chromium",
        Command::new("/usr/bin/chromium")
            .args([
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--ignore-certificate-errors",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("--host-resolver-rules=MAP *.stacks.example.com 127.0.0.1")
            .args(["--virtual-time-budget=60000", "--dump-dom"])
            .arg(format!("file://{}", file.display())),
    )?;
    if !out.contains("<title>done</title>") {
        bail!("chromium did not finish its loads: {out}\n{err}");
    }
    let (v, _) = run(
        "chromium",
        Command::new("/usr/bin/chromium").arg("--version"),
    )?;
    Ok((BTreeMap::new(), v.trim().to_string()))
}
