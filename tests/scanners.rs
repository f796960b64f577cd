//! TLS scanners written by others, run against real TLS servers directly and through
//! crossbar: every finding must be the same both ways, except the fields that name
//! the address scanned (docs/security.md "TLS scanners").
//!
//! Servers: `openssl s_server` (OpenSSL 3.0) and a JDK 17 HTTPS server
//! (tests/java/JdkServers.java). Scanners, each in its own test: testssl.sh
//! (`--jsonfile`), sslscan (`--xml`) and sslyze (`--json_out`, from PyPI). The two
//! servers are scanned at once, each directly and then through crossbar. A difference fails the test unless
//! [`EXPLAINED`] names it (each entry is explained in docs/security.md).
//!
//! Run with `--nocapture` to see the figures (findings compared per scanner).
mod common;

use common::java::Java;
use common::tls::{ChildGuard, OpensslBackend};
use common::Crossbar;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use crossbar::testbed::TestCa;
use serde_json::Value;

/// Longest one scan may take before the test fails as hung (testssl.sh's run below
/// takes ~1.5 min on a busy 2-core machine).
const SCAN_LIMIT: Duration = Duration::from_secs(600);

/// Findings allowed to differ between the direct and the through scan, as
/// `(scanner, finding key)`; each is explained in docs/security.md "TLS scanners".
const EXPLAINED: &[(&str, &str)] = &[
    // testssl.sh 3.0.8's resumption probe fails now and then ("not supported",
    // "check failed because of connect problem") directly as often as through
    // crossbar; crossbar's resumption is judged by tests/client_stacks.rs.
    ("testssl.sh", "sessionresumption_"),
];

/// The scanner had no consistent answer without crossbar, so there is nothing to
/// compare with: testssl.sh 3.0.8's ticketbleed probe repeats its handshake and says
/// "test failed, non reproducible results" when the server's session IDs differ
/// between tries (seen once directly against the JDK, whose IDs are random).
fn no_direct_answer(direct: Option<&String>) -> bool {
    direct.is_some_and(|v| v.contains("test failed, non reproducible results"))
}

/// The two real servers, each behind its own crossbar service.
struct Bed {
    /// `(server, direct address, address through crossbar)`.
    targets: Vec<(&'static str, SocketAddr, SocketAddr)>,
    _openssl: OpensslBackend,
    _jdk: ChildGuard,
    _java: Java,
    _cb: Crossbar,
}

async fn bed() -> Bed {
    let ca = TestCa::new("scanners CA").expect("CA");
    let openssl = OpensslBackend::start(&ca, "openssl", &[]).expect("openssl s_server");
    let java = Java::compile();
    let (jdk, jdk_addrs) = java
        .servers(&ca, &["jdk".to_string()], &[])
        .expect("JDK server");
    let jdk_addr = jdk_addrs[0].1;
    let svc = |name: &str, addr: SocketAddr| {
        format!(
            "  {name}:\n    listen: [\"127.0.0.1:0\"]\n    mode: tls\n    health: {{ check: none }}\n    backends:\n{}",
            common::backend_line(name, addr, "")
        )
    };
    let yaml = format!(
        "admin: {{ enabled: false }}\nservices:\n{}{}",
        svc("openssl", openssl.addr),
        svc("jdk", jdk_addr)
    );
    let cb = Crossbar::start(&yaml).await;
    Bed {
        targets: vec![
            ("openssl", openssl.addr, cb.addr("openssl")),
            ("jdk", jdk_addr, cb.addr("jdk")),
        ],
        _openssl: openssl,
        _jdk: jdk,
        _java: java,
        _cb: cb,
    }
}

/// One finding: its key (unique within a scan) and everything it says.
type Findings = BTreeMap<String, String>;

/// Scan every target directly and through crossbar, all at once, with `scan`
/// (which writes the scanner's machine output for `addr` into `out` and parses it).
/// Compares each pair and fails on an unexplained difference.
async fn compare(
    scanner: &'static str,
    servers: &[&str],
    scan: fn(SocketAddr, &Path) -> Result<Findings>,
) {
    let log = common::LogBuffer::install();
    let mut bed = bed().await;
    bed.targets.retain(|(s, ..)| servers.contains(s));
    let dir = tempfile::tempdir().expect("temp dir");
    let started = Instant::now();
    // The servers are scanned at once; each server directly, then through crossbar
    // (openssl s_server serves one connection at a time: two scans of it at once
    // would each see the other's connections delay theirs).
    let mut jobs = Vec::new();
    for &(server, direct, through) in &bed.targets {
        let out = dir.path().to_path_buf();
        jobs.push((
            server,
            tokio::task::spawn_blocking(move || {
                let d = scan(direct, &out.join(format!("{server}-direct")));
                let t = scan(through, &out.join(format!("{server}-through")));
                (d, t)
            }),
        ));
    }
    let mut results: BTreeMap<(&str, &str), Findings> = BTreeMap::new();
    for (server, job) in jobs {
        let (d, t) = job.await.expect("scan task");
        for (way, found) in [("direct", d), ("through", t)] {
            let found = found.unwrap_or_else(|e| panic!("{scanner} {way} against {server}: {e:#}"));
            results.insert((server, way), found);
        }
    }
    let wall = started.elapsed();
    // How crossbar ended the scanners' connections (access log `end=`), to read a
    // difference by.
    let mut ends: BTreeMap<String, usize> = BTreeMap::new();
    for l in log.lines_with("crossbar::access") {
        let end = l
            .split(" end=")
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .unwrap_or("?");
        *ends.entry(end.to_string()).or_default() += 1;
    }
    println!("{scanner}: crossbar's connection ends: {ends:?}");
    let mut unexplained = Vec::new();
    for &(server, ..) in &bed.targets {
        let (direct, through) = (
            &results[&(server, "direct")],
            &results[&(server, "through")],
        );
        let keys: std::collections::BTreeSet<&String> =
            direct.keys().chain(through.keys()).collect();
        let mut differ = 0;
        for key in &keys {
            let (d, t) = (direct.get(*key), through.get(*key));
            if d == t {
                continue;
            }
            differ += 1;
            let explained = EXPLAINED
                .iter()
                .any(|(s, k)| *s == scanner && key.starts_with(k))
                || no_direct_answer(d);
            println!(
                "{scanner} {server} DIFFERS{}: {key}\n  direct:  {d:?}\n  through: {t:?}",
                if explained { " (explained)" } else { "" }
            );
            if !explained {
                unexplained.push(format!("{server}: {key}"));
            }
        }
        println!(
            "{scanner} against {server}: {} findings compared ({} direct, {} through), {differ} differ",
            keys.len(),
            direct.len(),
            through.len()
        );
        assert!(
            direct.len() > 50,
            "{scanner} found only {} things about {server}: did it scan at all?\n{direct:#?}",
            direct.len()
        );
    }
    println!(
        "{scanner}: {} scans ({} servers at once) took {:.0?} wall",
        2 * bed.targets.len(),
        bed.targets.len(),
        wall
    );
    assert!(
        unexplained.is_empty(),
        "{scanner}: findings differ through crossbar (not explained in docs/security.md): {unexplained:#?}"
    );
}

/// Run `cmd` to its end (bounded by [`SCAN_LIMIT`]); its stdout and stderr go to
/// `log`. A missing tool fails the test.
fn run(tool: &str, cmd: &mut Command, log: &Path) -> Result<std::process::ExitStatus> {
    let file = std::fs::File::create(log)?;
    let child = match cmd
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .spawn()
    {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            crossbar::testbed::missing_tool("the scanner comparison", &format!("no `{tool}`"))
        }
        Err(e) => return Err(e).context(format!("spawning {tool}")),
    };
    let mut guard = ChildGuard(child);
    let started = Instant::now();
    // A hang guard, not a readiness wait: poll the exit every 100 ms.
    while started.elapsed() < SCAN_LIMIT {
        if let Some(status) = guard.0.try_wait()? {
            return Ok(status);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!(
        "{tool} did not finish within {SCAN_LIMIT:?}; its output: {}",
        log.display()
    )
}

/// Replace the scanned address in `text` (its findings name it only there).
fn unaddress(text: &str, addr: SocketAddr) -> String {
    text.replace(&addr.to_string(), "ADDR")
        .replace(&format!("{}/{}", addr.ip(), addr.port()), "ADDR")
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

/// testssl.sh: protocols (SSLv2 and SSLv3 probes included), cipher categories,
/// forward secrecy with curves and DH groups, the server's preferences, every
/// cipher per protocol, the server defaults (certificate, session resumption by ID
/// and ticket) and every vulnerability check (Heartbleed, CCS, ticketbleed, ROBOT,
/// renegotiation, CRIME, BREACH, POODLE, fallback SCSV, SWEET32, FREAK, DROWN,
/// LOGJAM, BEAST, LUCKY13, RC4). Left out: the HTTP header checks (`-h`, not TLS)
/// and the client simulation (`-c`, many minutes; the client stacks test runs real
/// clients instead).
fn testssl(addr: SocketAddr, out: &Path) -> Result<Findings> {
    let json = out.with_extension("json");
    let status = run(
        "testssl",
        Command::new("testssl")
            .args([
                "--quiet",
                "--warnings",
                "batch",
                "--color",
                "0",
                "--ip",
                "one",
            ])
            .args(["-p", "-s", "-f", "-P", "-S", "-U", "-E"])
            .arg("--jsonfile")
            .arg(&json)
            .arg(addr.to_string()),
        &out.with_extension("log"),
    )?;
    // testssl.sh's exit status counts findings of high severity; the JSON is the result.
    let _ = status; // ok: see above
    let v: Value = serde_json::from_str(&read(&json)?).context("testssl JSON")?;
    let mut found = Findings::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for f in v.as_array().context("testssl JSON is a list")? {
        let id = f["id"].as_str().unwrap_or("?").to_string();
        if id == "scanTime" {
            continue; // how long it took, not what it found
        }
        let n = seen.entry(id.clone()).or_default();
        *n += 1;
        // ip and port name the address; the rest is the finding.
        let what = format!(
            "{} | {} | cve={} | cwe={}",
            f["severity"].as_str().unwrap_or(""),
            f["finding"].as_str().unwrap_or(""),
            f["cve"].as_str().unwrap_or(""),
            f["cwe"].as_str().unwrap_or("")
        );
        found.insert(format!("{id}#{n}"), unaddress(&what, addr));
    }
    Ok(found)
}

/// sslscan: protocols (SSLv2, SSLv3 included), renegotiation, Heartbleed per
/// version, every accepted cipher with its preference, key exchange groups and the
/// certificate (`--show-certificate`) and the signature algorithms the server
/// accepts (`--show-sigs`); one finding per XML element, in the order printed.
fn sslscan(addr: SocketAddr, out: &Path) -> Result<Findings> {
    let xml = out.with_extension("xml");
    let status = run(
        "sslscan",
        Command::new("sslscan")
            .args(["--no-colour", "--show-sigs", "--show-certificate"])
            .arg(format!("--xml={}", xml.display()))
            .arg(addr.to_string()),
        &out.with_extension("log"),
    )?;
    if !status.success() {
        bail!("sslscan failed: {status}");
    }
    let text = read(&xml)?;
    let mut found = Findings::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for line in text.lines().map(str::trim) {
        // Element lines only: not the XML declaration, the document element, the
        // element naming the target (`<ssltest host= sniname= port=>`) or closings.
        let Some(tag) = line.strip_prefix('<') else {
            continue;
        };
        let name: String = tag
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        if name.is_empty() || ["document", "ssltest", "certificates"].contains(&name.as_str()) {
            continue;
        }
        let n = seen.entry(name.clone()).or_default();
        *n += 1;
        found.insert(format!("{name}#{n:03}"), unaddress(line, addr));
    }
    Ok(found)
}

/// sslyze: every scan command it has for TLS (cipher suites of SSLv2 through TLS
/// 1.3, compression, early data, CCS injection, fallback SCSV, Heartbleed, ROBOT,
/// renegotiation, session resumption, curves, extended master secret, the
/// certificate); one finding per leaf of its JSON.
fn sslyze(addr: SocketAddr, out: &Path) -> Result<Findings> {
    let json = out.with_extension("json");
    let status = run(
        "sslyze",
        Command::new("sslyze")
            .args(["--quiet", "--json_out"])
            .arg(&json)
            .args(["--sslv2", "--sslv3", "--tlsv1", "--tlsv1_1", "--tlsv1_2"])
            .args([
                "--tlsv1_3",
                "--reneg",
                "--heartbleed",
                "--robot",
                "--openssl_ccs",
            ])
            .args([
                "--fallback",
                "--compression",
                "--early_data",
                "--elliptic_curves",
            ])
            .args(["--resum", "--ems", "--certinfo"])
            .arg(addr.to_string()),
        &out.with_extension("log"),
    )?;
    if !status.success() {
        bail!("sslyze failed: {status}");
    }
    let v: Value = serde_json::from_str(&read(&json)?).context("sslyze JSON")?;
    let server = &v["server_scan_results"][0];
    if server["scan_status"] != "COMPLETED" {
        bail!("sslyze did not complete: {server}");
    }
    let mut found = Findings::new();
    leaves(&server["scan_result"], String::new(), &mut found, addr);
    leaves(
        &server["connectivity_result"],
        "connectivity".into(),
        &mut found,
        addr,
    );
    Ok(found)
}

/// Every leaf of `v` under `path`, except fields that name the address or the time.
fn leaves(v: &Value, path: String, out: &mut Findings, addr: SocketAddr) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                if ["hostname", "ip_address", "port", "uuid", "server_location"]
                    .contains(&k.as_str())
                {
                    continue;
                }
                leaves(v, format!("{path}/{k}"), out, addr);
            }
        }
        // Lists in sslyze's output come in the order its concurrent probes ended:
        // compare them sorted.
        Value::Array(a) => {
            let mut a: Vec<&Value> = a.iter().collect();
            a.sort_by_key(|v| v.to_string());
            for (i, v) in a.into_iter().enumerate() {
                leaves(v, format!("{path}/{i:03}"), out, addr);
            }
        }
        // A cipher's OpenSSL name is an alias of its IANA `name` (compared), and
        // sslyze names some either way from run to run (EDH-DSS-DES-CBC3-SHA or
        // DHE-DSS-DES-CBC3-SHA, by which of its two OpenSSLs probed).
        _ if path.ends_with("/cipher_suite/openssl_name") => {}
        // The ephemeral key of each handshake is random (two direct scans differ too).
        _ if path.contains("/ephemeral_key/")
            && ["public_bytes", "x", "y"].iter().any(|k| path.ends_with(k)) => {}
        _ => {
            out.insert(path, unaddress(&v.to_string(), addr));
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn testssl_finds_the_same_through_crossbar_as_direct() {
    compare("testssl.sh", &["openssl", "jdk"], testssl).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sslscan_finds_the_same_through_crossbar_as_direct() {
    compare("sslscan", &["openssl", "jdk"], sslscan).await;
}

/// Against the JDK server too: its closes on some of sslyze's probes once took the
/// backend down through crossbar (docs/security.md "TLS scanners").
#[tokio::test(flavor = "multi_thread")]
async fn sslyze_finds_the_same_through_crossbar_as_direct() {
    compare("sslyze", &["openssl", "jdk"], sslyze).await;
}
