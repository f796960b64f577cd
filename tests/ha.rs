//! More than one crossbar, with nothing shared between the nodes, proven on a small
//! network of namespaces (tests/common/netns.rs): a client host, two balancer nodes
//! and a backend host on one bridge.
//!
//! - A keepalived VRRP pair (Debian's keepalived in each node's namespace, checking
//!   crossbar's `/healthz`): the VIP moves within 3 s when the active crossbar is
//!   killed; a SIGTERM drain moves it before the drain ends without cutting any
//!   established connection (the nodes hand each other's flows back, see
//!   docs/ha.md "Draining without cutting"); a node that comes back does not take
//!   the VIP back; resumptions begun on one node resume on the other.
//! - Active/active: both nodes serve at once; `balance: source` places every source
//!   the same way on both; TLS resumptions alternating between the nodes return to
//!   their backend; what happens while the nodes disagree about a backend's health.
//! - The lab itself: namespaces a killed test left behind are removed by the next
//!   lab, never those of a test still running.
//!
//! Run with `--nocapture` for the figures (the test output is the record; docs/ha.md
//! quotes it). Needs root, iproute2, keepalived, nftables, curl, openssl and a JDK
//! (tests/run.sh installs them): a missing one fails the test.
mod common;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use common::java::Java;
use common::metric_value;
use common::netns::{self, have, Host, Lab, LabProcess, BACKEND_IPS, LAB_WAIT, VIP};
use crossbar::testbed::TestCa;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

/// The admin endpoint on each node (inside its namespace; keepalived's check and
/// the test reach it there).
const ADMIN: &str = "127.0.0.1:9140";
/// `mode: tcp` echo service on the VIP (failover and drain).
const ECHO_PORT: u16 = 7000;
/// `mode: tcp`, `balance: source` service on every node address (agreement).
const SOURCE_PORT: u16 = 7100;
/// `mode: tcp`, `balance: source` without a stick table (placement by hash alone).
const HASH_PORT: u16 = 7200;
/// TLS services on JDK backends, one per resumption mode.
const JDK_PORTS: [(&str, u16); 3] = [("jsid", 8144), ("jticket", 8145), ("jtls13", 8146)];
/// TLS services, one per resumption mode, on every address.
const SID_PORT: u16 = 8141;
const TICKET_PORT: u16 = 8142;
const TLS13_PORT: u16 = 8143;
/// Share of resumptions that must land on the client's first backend.
const TARGET: f64 = 0.99;
/// keepalived's own failover time after the active crossbar dies (advert_int 1,
/// check every 1 s, fall 1: about 3 s). The test asserts the failover happened and
/// where the VIP went; the time is printed, and bounded only by
/// `FAILOVER_EXPECTED * GENEROUS` as a guard against "never" on a busy machine.
const FAILOVER_EXPECTED: Duration = Duration::from_secs(3);
/// How many times [`FAILOVER_EXPECTED`] a failover may take before it counts as
/// missing (not a performance claim: speed is measured in bench/, not asserted).
const GENEROUS: u32 = 10;
/// How long the returning node is watched for taking the VIP back.
const NO_FLAP_WATCH: Duration = Duration::from_secs(5);
/// Long-lived connections held across a drain.
const DRAIN_CONNS: usize = 16;
/// Sources for the agreement test.
const SOURCES: u32 = 1000;

/// Fails the test when the lab's tools or network namespaces are missing
/// (tests/run.sh installs the tools; namespaces need root).
fn lab_tools() {
    let missing: Vec<&str> = ["ip", "keepalived", "nft", "curl", "openssl"]
        .into_iter()
        .filter(|t| !have(t))
        .collect();
    let usable = netns::usable();
    if !missing.is_empty() || usable.is_err() {
        crossbar::testbed::missing_tool(
            "HA lab",
            &format!("missing {missing:?}; namespaces: {usable:?}"),
        );
    }
}

// ---------------------------------------------------------------------------
// The lab's parts

/// The node config, the same file on both nodes.
fn node_yaml() -> String {
    let be = |port: u16| -> String {
        BACKEND_IPS
            .iter()
            .enumerate()
            .map(|(i, ip)| format!("      - {{ name: be{i}, address: \"{ip}:{port}\" }}\n"))
            .collect()
    };
    format!(
        r#"admin: {{ listen: "{ADMIN}" }}
defaults:
  health: {{ check: tcp, interval: 1s, timeout: 500ms, rise: 1, fall: 2 }}
  timeouts: {{ shutdown: 30s }}
services:
  echo:
    mode: tcp
    listen: [{{ address: "{VIP}:{ECHO_PORT}", freebind: true }}]
    balance: roundrobin
    backends:
{echo}  source:
    mode: tcp
    listen: ["0.0.0.0:{SOURCE_PORT}"]
    balance: source
    stick: {{ on: [source] }}
    backends:
{echo}  hash:
    mode: tcp
    listen: ["0.0.0.0:{HASH_PORT}"]
    balance: source
    backends:
{echo}  sid:
    listen: ["0.0.0.0:{SID_PORT}"]
    balance: roundrobin
    stick: {{ on: [session_id, ticket, psk], probe_interval: 2s }}
    backends:
{sid}  ticket:
    listen: ["0.0.0.0:{TICKET_PORT}"]
    balance: roundrobin
    stick: {{ on: [session_id, ticket, psk], probe_interval: 2s }}
    backends:
{ticket}  tls13:
    listen: ["0.0.0.0:{TLS13_PORT}"]
    balance: roundrobin
    stick: {{ on: [session_id, ticket, psk], probe_interval: 2s }}
    backends:
{tls13}"#,
        echo = be(ECHO_PORT),
        sid = be(SID_PORT),
        ticket = be(TICKET_PORT),
        tls13 = be(TLS13_PORT),
    ) + &JDK_PORTS
        .iter()
        .map(|(name, port)| {
            format!(
                "  {name}:\n    listen: [\"0.0.0.0:{port}\"]\n    balance: roundrobin\n    stick: {{ on: [session_id, ticket, psk], probe_interval: 2s }}\n    backends:\n{}",
                be(*port)
            )
        })
        .collect::<String>()
}

/// JDK server properties and client properties per JDK service (the JDK's own
/// defaults otherwise: TLS 1.3 with stateful session tickets).
fn jdk_props(service: &str) -> (Vec<&'static str>, Vec<&'static str>) {
    match service {
        "jsid" => (
            vec![
                "-Djdk.tls.server.protocols=TLSv1.2",
                "-Djdk.tls.server.enableSessionTicketExtension=false",
            ],
            vec![
                "-Djdk.tls.client.protocols=TLSv1.2",
                "-Djdk.tls.client.enableSessionTicketExtension=false",
            ],
        ),
        "jticket" => (
            vec!["-Djdk.tls.server.protocols=TLSv1.2"],
            vec!["-Djdk.tls.client.protocols=TLSv1.2"],
        ),
        _ => (vec![], vec!["-Djdk.tls.client.protocols=TLSv1.3"]),
    }
}

/// One JVM per JDK service on the backend host, each serving `be0..be2` on the
/// backend addresses (own certificate per backend, default session settings).
fn jdk_backends(lab: &Lab, java: &Java, ca: &TestCa) -> Result<Vec<common::tls::ChildGuard>> {
    let ns = lab.ns(Host::Backends);
    let prefix = ["ip", "netns", "exec", ns.as_str()];
    let mut out = Vec::new();
    for (service, port) in JDK_PORTS {
        let list: Vec<(String, Option<SocketAddr>)> = BACKEND_IPS
            .iter()
            .enumerate()
            .map(|(i, ip)| (format!("be{i}"), Some(SocketAddr::new((*ip).into(), port))))
            .collect();
        let (guard, _) = java.servers_at(ca, &list, &jdk_props(service).0, &prefix)?;
        out.push(guard);
    }
    Ok(out)
}

/// JDK agents alternating between the nodes (their session cache keys sessions by
/// the name they dial, as behind one VIP): 9 agents, 1 full handshake on A + 10
/// attempts on B, A, B, ... Returns (kept, attempts, errors, first spread).
fn jdk_alternating(
    lab: &Lab,
    java: &Java,
    ca: &TestCa,
    service: &str,
    port: u16,
) -> Result<(usize, usize, Vec<String>, Spread)> {
    let ns = lab.ns(Host::Client);
    let prefix = ["ip", "netns", "exec", ns.as_str()];
    let addrs = [
        SocketAddr::new(Host::NodeA.ip().into(), port),
        SocketAddr::new(Host::NodeB.ip().into(), port),
    ];
    let (runs, errors) = java.clients(ca, 9, 10, &addrs, &jdk_props(service).1, &prefix)?;
    let (mut kept, mut n, mut firsts) = (0, 0, BTreeMap::new());
    for run in &runs {
        let Some((_, first)) = run.first() else {
            continue;
        };
        *firsts.entry(first.clone()).or_insert(0) += 1;
        for (resumed, be) in &run[1..] {
            n += 1;
            kept += usize::from(*resumed && be == first);
        }
    }
    Ok((kept, n.max(90), errors, firsts))
}

/// The keepalived.conf of one node (docs/ha.md shows the same file).
fn keepalived_conf(node: Host, dir: &Path) -> String {
    let (id, prio) = if node == Host::NodeA {
        ("a", 150)
    } else {
        ("b", 100)
    };
    format!(
        r#"global_defs {{
    router_id crossbar-{id}
    script_user root
    enable_script_security
    vrrp_garp_master_delay 0
}}
vrrp_script chk_crossbar {{
    script "/usr/bin/curl -fsS -m 1 -o /dev/null http://{ADMIN}/healthz"
    interval 1
    timeout 1
    fall 1
    rise 2
}}
vrrp_instance puppet {{
    state BACKUP
    nopreempt
    interface eth0
    virtual_router_id 51
    priority {prio}
    advert_int 1
    virtual_ipaddress {{ {VIP}/24 }}
    track_script {{ chk_crossbar }}
}}
# {dir:?}
"#
    )
}

/// The flow hand-back of one node (docs/ha.md "Draining without cutting"): the VIP
/// stays local on `lo` (answering ARP only where keepalived put it on eth0), and a
/// TCP segment for the VIP that opens no connection and belongs to none this node
/// has seen (conntrack: new, no SYN) is routed on to the peer, which holds it.
fn handback_rules(lab: &Lab, node: Host) -> Result<()> {
    let peer = node.peer();
    let peer_mac = lab.mac(peer)?;
    lab.addr(node, &format!("{VIP}/32"), "lo")?;
    for (k, v) in [
        ("net.ipv4.conf.all.arp_ignore", "1"),
        ("net.ipv4.conf.all.arp_announce", "2"),
        ("net.ipv4.ip_forward", "1"),
        ("net.ipv4.conf.all.send_redirects", "0"),
        ("net.ipv4.conf.eth0.send_redirects", "0"),
    ] {
        lab.sysctl(node, k, v)?;
    }
    let rules = format!(
        r#"table ip crossbar_handback {{
    chain prerouting {{
        type filter hook prerouting priority mangle; policy accept;
        iifname "eth0" ip daddr {VIP} ether saddr != {peer_mac} ct state new tcp flags & (syn | rst) == 0 ct mark set 0x1
        ct mark 0x1 meta mark set 0x1
    }}
}}
"#
    );
    let file = lab.dir.path().join(format!("handback-{node:?}.nft"));
    std::fs::write(&file, rules)?;
    lab.exec(node, &["nft", "-f", &file.to_string_lossy()])?;
    let peer_ip = peer.ip().to_string();
    lab.exec(
        node,
        &[
            "ip",
            "route",
            "add",
            &format!("{VIP}/32"),
            "via",
            &peer_ip,
            "table",
            "100",
        ],
    )?;
    lab.exec(
        node,
        &[
            "ip", "rule", "add", "pref", "10", "fwmark", "0x1", "lookup", "100",
        ],
    )?;
    lab.exec(
        node,
        &["ip", "rule", "add", "pref", "100", "lookup", "local"],
    )?;
    lab.exec(node, &["ip", "rule", "del", "pref", "0", "lookup", "local"])?;
    Ok(())
}

/// A tagged echo backend on every backend address and `port`: writes `be<i>\n`,
/// then echoes until EOF and half-closes.
async fn echo_backends(port: u16) {
    let mut tasks = Vec::new();
    for (i, ip) in BACKEND_IPS.iter().enumerate() {
        let l = TcpListener::bind((*ip, port))
            .await
            .expect("bind echo backend");
        tasks.push(tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = l.accept().await else {
                    continue;
                };
                tokio::spawn(async move {
                    if s.write_all(format!("be{i}\n").as_bytes()).await.is_err() {
                        return;
                    }
                    let (mut r, mut w) = s.split();
                    if tokio::io::copy(&mut r, &mut w).await.is_ok() {
                        let _ = w.shutdown().await; // ok: the peer may be gone
                    }
                });
            }
        }));
    }
    for t in tasks {
        let _ = t.await; // ok: runs until the lab stops it
    }
}

/// `openssl s_server -WWW` backends (answering `GET /who` with their name) on every
/// backend address, for one TLS mode.
fn openssl_backends(lab: &Lab, port: u16, extra: &[&str]) -> Result<Vec<LabProcess>> {
    let mut out = Vec::new();
    for (i, ip) in BACKEND_IPS.iter().enumerate() {
        let dir = lab.dir.path().join(format!("be{i}-{port}"));
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("who"), format!("be{i}\n"))?;
        let accept = format!("{ip}:{port}");
        let cert = lab.dir.path().join(format!("be{i}.cert.pem"));
        let key = lab.dir.path().join(format!("be{i}.key.pem"));
        let (cert, key) = (cert.to_string_lossy(), key.to_string_lossy());
        let mut cmd = vec![
            "openssl", "s_server", "-accept", &accept, "-WWW", "-cert", &cert, "-key", &key,
        ];
        cmd.extend_from_slice(extra);
        out.push(lab.spawn(
            Host::Backends,
            &format!("s_server-be{i}-{port}"),
            &cmd,
            Some(&dir),
        )?);
    }
    Ok(out)
}

/// Per-backend certificates from one test CA (each backend its own key).
fn backend_certs(lab: &Lab) -> Result<TestCa> {
    let ca = TestCa::new("crossbar HA test CA")?;
    for i in 0..BACKEND_IPS.len() {
        let pem = ca.issue_pem(&format!("be{i}"), &[common::SNI])?;
        std::fs::write(lab.dir.path().join(format!("be{i}.cert.pem")), &pem.cert)?;
        std::fs::write(lab.dir.path().join(format!("be{i}.key.pem")), &pem.key)?;
    }
    Ok(ca)
}

static STARTS: AtomicUsize = AtomicUsize::new(0);

/// Start crossbar on `node` with the shared config; waits until /healthz says ok.
fn start_node(lab: &Lab, node: Host) -> Result<LabProcess> {
    let cfg = lab.dir.path().join("crossbar.yaml");
    if !cfg.exists() {
        std::fs::write(&cfg, node_yaml())?;
    }
    let cfg = cfg.to_string_lossy().to_string();
    let p = lab.spawn(
        node,
        &format!(
            "crossbar-{node:?}-{}",
            STARTS.fetch_add(1, Ordering::SeqCst)
        ),
        &[env!("CARGO_BIN_EXE_crossbar"), "run", "-c", &cfg],
        None,
    )?;
    let end = Instant::now() + LAB_WAIT;
    while healthz(lab, node) != Some(200) {
        if Instant::now() > end {
            bail!(
                "crossbar on {node:?} never became healthy:\n{}",
                p.log_text()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(p)
}

/// Start keepalived on `node`.
fn start_keepalived(lab: &Lab, node: Host) -> Result<LabProcess> {
    let dir = lab.dir.path();
    let conf = dir.join(format!("keepalived-{node:?}.conf"));
    std::fs::write(&conf, keepalived_conf(node, dir))?;
    let pid = dir.join(format!("keepalived-{node:?}.pid"));
    let vrrp = dir.join(format!("vrrp-{node:?}.pid"));
    lab.spawn(
        node,
        &format!("keepalived-{node:?}"),
        &[
            "keepalived",
            "--dont-fork",
            "--log-console",
            "--log-detail",
            "--no-syslog",
            "--vrrp",
            "-f",
            &conf.to_string_lossy(),
            "-p",
            &pid.to_string_lossy(),
            "-r",
            &vrrp.to_string_lossy(),
        ],
        None,
    )
}

/// The HTTP status of `/healthz` on `node` (None: nothing answered).
fn healthz(lab: &Lab, node: Host) -> Option<u16> {
    let url = format!("http://{ADMIN}/healthz");
    let out = lab
        .output(
            node,
            &[
                "curl",
                "-s",
                "-m",
                "1",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                &url,
            ],
        )
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .ok()
        .filter(|c| *c != 0)
}

/// `GET` an admin path on `node`; the body.
fn admin_get(lab: &Lab, node: Host, path: &str) -> Result<String> {
    let out = lab.output(
        node,
        &["curl", "-fsS", "-m", "2", &format!("http://{ADMIN}{path}")],
    )?;
    if !out.status.success() {
        bail!(
            "GET {path} on {node:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8(out.stdout)?)
}

/// Which node holds the VIP on its eth0, if one does.
fn vip_holder(lab: &Lab) -> Option<Host> {
    [Host::NodeA, Host::NodeB]
        .into_iter()
        .find(|n| lab.addrs(*n, "eth0").contains(&VIP))
}

/// Wait until `cond` holds (polling every 20 ms), at most `limit`; how long it took.
fn wait_for(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) -> Result<Duration> {
    let t0 = Instant::now();
    while !cond() {
        if t0.elapsed() > limit {
            bail!("{what}: not within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(t0.elapsed())
}

/// Wait until every node's `service` table holds a ticket-key prefix per backend
/// (each node's own probe learned them: nothing is copied between nodes).
fn wait_prefixes(lab: &Lab, service: &str) -> Result<()> {
    for node in [Host::NodeA, Host::NodeB] {
        wait_for(
            &format!("{node:?} learns {service}'s key names"),
            LAB_WAIT,
            || {
                admin_get(lab, node, &format!("/api/tables/{service}"))
                    .is_ok_and(|b| b.matches("\"ticket_prefix\"").count() >= BACKEND_IPS.len())
            },
        )?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Clients

/// One `openssl s_client` run from the client host: (resumed?, backend name).
fn s_client(
    lab: &Lab,
    to: SocketAddr,
    args: &[&str],
    sess: (&str, &Path),
) -> Result<(bool, String)> {
    let to = to.to_string();
    let file = sess.1.to_string_lossy();
    let mut cmd = vec![
        "sh", "-c",
        "printf 'GET /who HTTP/1.0\\r\\n\\r\\n' | timeout 15 openssl s_client -ign_eof -servername \"$@\" 2>/dev/null",
        "s_client", common::SNI, "-connect", &to, sess.0, &file,
    ];
    cmd.extend_from_slice(args);
    let out = lab.output(Host::Client, &cmd)?;
    let text = String::from_utf8_lossy(&out.stdout);
    let reused = text.lines().any(|l| l.starts_with("Reused,"));
    if !reused && !text.lines().any(|l| l.starts_with("New,")) {
        bail!("s_client to {to} printed no session line:\n{text}");
    }
    let backend = text
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("be") && l.len() == 3)
        .with_context(|| format!("no backend name from {to}:\n{text}"))?
        .to_string();
    Ok((reused, backend))
}

/// Connect from `from` to `to` and read the tagged backend's name.
async fn who_from(from: IpAddr, to: SocketAddr) -> Result<(String, TcpStream)> {
    let sock = TcpSocket::new_v4()?;
    sock.bind(SocketAddr::new(from, 0))?;
    let mut s = tokio::time::timeout(LAB_WAIT, sock.connect(to)).await??;
    let mut name = Vec::new();
    let mut byte = [0u8; 1];
    while name.len() < 16 {
        if tokio::time::timeout(LAB_WAIT, s.read_exact(&mut byte))
            .await?
            .is_err()
        {
            bail!("connection to {to} closed before the backend's name");
        }
        if byte[0] == b'\n' {
            return Ok((String::from_utf8(name)?, s));
        }
        name.push(byte[0]);
    }
    bail!("no backend name from {to}")
}

// ---------------------------------------------------------------------------
// The keepalived pair

/// A long-lived echo connection through the VIP, exchanging 1 KiB every 20 ms until
/// told to stop, then half-closing and reading to EOF. Returns (rounds after the
/// VIP moved, error if it was cut).
async fn pinger(
    i: usize,
    stop: tokio::sync::watch::Receiver<bool>,
    moved: tokio::sync::watch::Receiver<bool>,
) -> (usize, Option<String>) {
    let src = netns::source(5000 + i as u32);
    let (_, mut s) = match who_from(src, SocketAddr::new(VIP.into(), ECHO_PORT)).await {
        Ok(v) => v,
        Err(e) => return (0, Some(format!("connect: {e}"))),
    };
    let data = common::payload(1024, i as u64);
    let mut after = 0;
    let mut back = vec![0u8; data.len()];
    loop {
        if *stop.borrow() {
            break;
        }
        let round = async {
            s.write_all(&data).await?;
            s.read_exact(&mut back).await?;
            anyhow::Ok(())
        };
        match tokio::time::timeout(Duration::from_secs(10), round).await {
            Ok(Ok(())) if back == data => {}
            Ok(Ok(())) => return (after, Some("echo differs".into())),
            Ok(Err(e)) => return (after, Some(format!("cut: {e}"))),
            Err(_) => return (after, Some("stalled 10 s".into())),
        }
        if *moved.borrow() {
            after += 1;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if let Err(e) = s.shutdown().await {
        return (after, Some(format!("half-close: {e}")));
    }
    let mut rest = Vec::new();
    match tokio::time::timeout(LAB_WAIT, s.read_to_end(&mut rest)).await {
        Ok(Ok(_)) if rest.is_empty() => (after, None),
        Ok(Ok(_)) => (after, Some("bytes after EOF".into())),
        Ok(Err(e)) => (after, Some(format!("at close: {e}"))),
        Err(_) => (after, Some("no EOF".into())),
    }
}

#[test]
fn keepalived_pair_moves_the_vip_drains_and_keeps_sessions() -> Result<()> {
    lab_tools();
    let lab = Lab::new()?;
    backend_certs(&lab)?;
    let _echo = lab.serve_in(Host::Backends, || echo_backends(ECHO_PORT));
    let _tls = openssl_backends(&lab, TLS13_PORT, &[])?;
    for node in [Host::NodeA, Host::NodeB] {
        handback_rules(&lab, node)?;
    }
    let mut cb_a = start_node(&lab, Host::NodeA)?;
    let _cb_b = start_node(&lab, Host::NodeB)?;
    let _ka_a = start_keepalived(&lab, Host::NodeA)?;
    // B starts a moment later so A (priority 150) wins the first election.
    let ka_b = start_keepalived(&lab, Host::NodeB)?;
    wait_for("A takes the VIP", LAB_WAIT, || {
        vip_holder(&lab) == Some(Host::NodeA)
    })?;
    wait_prefixes(&lab, "tls13")?;

    // Sessions begun on A (through the VIP), resumed on B after the drain below.
    let tls13 = SocketAddr::new(VIP.into(), TLS13_PORT);
    let clients = 9;
    let mut first = Vec::new();
    for c in 0..clients {
        let f = lab.dir.path().join(format!("sess-{c}"));
        let (reused, be) = s_client(&lab, tls13, &["-tls1_3"], ("-sess_out", &f))?;
        assert!(!reused);
        first.push((f, be));
    }

    // SIGTERM drain on A with DRAIN_CONNS established connections through the VIP.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let (moved_tx, moved_rx) = tokio::sync::watch::channel(false);
    let pingers = {
        let path = std::path::PathBuf::from("/run/netns").join(lab.ns(Host::Client));
        std::thread::spawn(move || {
            let f = std::fs::File::open(path).expect("netns");
            nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("rt");
            rt.block_on(async move {
                let hs: Vec<_> = (0..DRAIN_CONNS)
                    .map(|i| tokio::spawn(pinger(i, stop_rx.clone(), moved_rx.clone())))
                    .collect();
                let mut out = Vec::new();
                for h in hs {
                    out.push(h.await.expect("pinger"));
                }
                out
            })
        })
    };
    wait_for("the pingers connect through A", LAB_WAIT, || {
        admin_get(&lab, Host::NodeA, "/metrics").is_ok_and(|m| {
            metric_value(&m, "crossbar_active_connections", &[("service", "echo")]) as usize
                == DRAIN_CONNS
        })
    })?;
    let t0 = Instant::now();
    cb_a.signal("TERM")?;
    let saw_503 = wait_for("A's /healthz answers 503", LAB_WAIT, || {
        healthz(&lab, Host::NodeA) == Some(503)
    });
    let moved = wait_for("the VIP moves to B", LAB_WAIT, || {
        vip_holder(&lab) == Some(Host::NodeB)
    })?;
    let _ = moved_tx.send(true); // ok: the pingers may all have failed already
                                 // New connections now reach B.
    let (who, _) = lab.block_in(Host::Client, || async {
        who_from(netns::source(9000), SocketAddr::new(VIP.into(), ECHO_PORT)).await
    })?;
    let a_still_running = cb_a.exited().is_none();
    std::thread::sleep(Duration::from_secs(2));
    let _ = stop_tx.send(true); // ok: see above
    let results = pingers.join().expect("pingers");
    let a_exit = cb_a
        .wait_exit(LAB_WAIT)
        .context("A did not exit after its drain")?;
    let drain_took = t0.elapsed();
    let cut: Vec<_> = results.iter().filter_map(|(_, e)| e.clone()).collect();
    let rounds_after: usize = results.iter().map(|(n, _)| n).sum();
    println!(
        "drain: /healthz 503 {saw_503:?}, VIP on B after {moved:?}, new connection served ({who}), \
         {}/{} established connections intact ({rounds_after} echo rounds after the move), \
         A exited {a_exit} after {drain_took:?}",
        DRAIN_CONNS - cut.len(),
        DRAIN_CONNS
    );
    saw_503?;
    assert!(
        a_still_running,
        "A exited before the VIP moved: the drain ended first"
    );
    assert!(
        cut.is_empty(),
        "established connections cut by the drain: {cut:?}"
    );
    assert!(
        rounds_after >= DRAIN_CONNS,
        "connections did not carry traffic after the move"
    );
    assert!(a_exit.success(), "A's crossbar exit status {a_exit}");

    // Resumptions of A's sessions, now through B.
    let mut kept = 0;
    for (f, be) in &first {
        let (reused, now) = s_client(&lab, tls13, &["-tls1_3"], ("-sess_in", f))?;
        kept += usize::from(reused && &now == be);
    }
    println!("sessions from A resumed on B (TLS 1.3, OpenSSL): {kept}/{clients}");
    assert!(kept as f64 >= TARGET * clients as f64);

    // A comes back: it must not take the VIP back while B is healthy.
    let cb_a = start_node(&lab, Host::NodeA)?;
    let end = Instant::now() + NO_FLAP_WATCH;
    while Instant::now() < end {
        assert_eq!(
            vip_holder(&lab),
            Some(Host::NodeB),
            "A took the VIP back (flap)"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    println!("no flap: B kept the VIP for {NO_FLAP_WATCH:?} after A came back");

    // kill -9 of the active crossbar (B): the VIP moves back to A and new
    // connections succeed (in about FAILOVER_EXPECTED).
    let cb_b = _cb_b;
    let t0 = Instant::now();
    cb_b.signal("KILL")?;
    let served = lab.block_in(Host::Client, move || async move {
        let mut n = 0;
        loop {
            n += 1;
            let to = SocketAddr::new(VIP.into(), ECHO_PORT);
            let try_once = tokio::time::timeout(
                Duration::from_millis(300),
                who_from(netns::source(9100 + n), to),
            );
            if let Ok(Ok((be, mut s))) = try_once.await {
                let _ = s.shutdown().await; // ok: only the answer mattered
                return Ok::<_, anyhow::Error>((t0.elapsed(), be, n));
            }
            if t0.elapsed() > LAB_WAIT {
                bail!("no new connection through the VIP within {LAB_WAIT:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })?;
    let holder = vip_holder(&lab);
    println!(
        "kill -9 of the active crossbar: new connections served again after {:?} ({} tries; VIP on {holder:?})",
        served.0, served.2
    );
    assert!(
        served.0 <= FAILOVER_EXPECTED * GENEROUS,
        "failover took {:?}",
        served.0
    );
    assert_eq!(holder, Some(Host::NodeA));
    drop(ka_b);
    let _ = cb_a.signal("TERM"); // ok: the lab kills it anyway
    Ok(())
}

// ---------------------------------------------------------------------------
// Active/active

/// Which backend each node picks for each source, connecting to both nodes' own
/// addresses on `port`.
fn placements(lab: &Lab, port: u16) -> Result<Vec<(String, String)>> {
    lab.block_in(Host::Client, move || async move {
        let mut out = Vec::new();
        for i in 0..SOURCES {
            let src = netns::source(i);
            let mut pick = Vec::new();
            for node in [Host::NodeA, Host::NodeB] {
                let (be, mut s) = who_from(src, SocketAddr::new(node.ip().into(), port)).await?;
                s.shutdown().await?;
                pick.push(be);
            }
            out.push((pick[0].clone(), pick[1].clone()));
        }
        Ok(out)
    })
}

/// Connections per backend name.
type Spread = BTreeMap<String, usize>;

/// Per-backend counts of node A's picks, for the figures.
fn spread(p: &[(String, String)]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for (a, _) in p {
        *m.entry(a.clone()).or_insert(0) += 1;
    }
    m
}

/// Wait until `node` sees `backend` of `service` as up (`true`) or down.
fn wait_backend_up(lab: &Lab, node: Host, service: &str, backend: &str, up: bool) -> Result<()> {
    let want = if up { 1.0 } else { 0.0 };
    wait_for(
        &format!("{node:?} sees {service}/{backend} up={up}"),
        LAB_WAIT,
        || {
            admin_get(lab, node, "/metrics").is_ok_and(|m| {
                metric_value(
                    &m,
                    "crossbar_backend_up",
                    &[("service", service), ("backend", backend)],
                ) == want
            })
        },
    )
    .map(|_| ())
}

/// Resumptions that alternate between the nodes: every client first does one full
/// handshake on A; then, round by round and in an order that differs from the
/// first (so the nodes' round-robin counters can't line up by chance), each offers
/// its session on B, A, B, ... Returns (kept, attempts, first-connection spread).
fn alternating(
    lab: &Lab,
    port: u16,
    args: &[&str],
    clients: usize,
    rounds: usize,
) -> Result<(usize, usize, Spread)> {
    let mut firsts = BTreeMap::new();
    let mut sessions = Vec::new();
    for c in 0..clients {
        let f = lab.dir.path().join(format!("alt-{port}-{c}"));
        let a = SocketAddr::new(Host::NodeA.ip().into(), port);
        let (_, first) = s_client(lab, a, args, ("-sess_out", &f))?;
        *firsts.entry(first.clone()).or_insert(0) += 1;
        sessions.push((f, first));
    }
    let mut kept = 0;
    for r in 0..rounds {
        let node = if r % 2 == 0 { Host::NodeB } else { Host::NodeA };
        let to = SocketAddr::new(node.ip().into(), port);
        for k in 0..clients {
            let (f, first) = &sessions[(clients - 1 - k + r * 2) % clients];
            let (reused, be) = s_client(lab, to, args, ("-sess_in", f))?;
            kept += usize::from(reused && be == *first);
        }
    }
    Ok((kept, clients * rounds, firsts))
}

#[test]
fn active_active_nodes_agree_without_talking() -> Result<()> {
    lab_tools();
    let lab = Lab::new()?;
    let ca = backend_certs(&lab)?;
    let _echo = lab.serve_in(Host::Backends, || echo_backends(ECHO_PORT));
    let java = Java::compile();
    let _jdk = jdk_backends(&lab, &java, &ca)?;
    let _sid = openssl_backends(&lab, SID_PORT, &["-no_ticket"])?;
    let _ticket = openssl_backends(&lab, TICKET_PORT, &[])?;
    let _tls13 = openssl_backends(&lab, TLS13_PORT, &[])?;
    let _a = start_node(&lab, Host::NodeA)?;
    let _b = start_node(&lab, Host::NodeB)?;
    for service in ["source", "hash"] {
        for be in ["be0", "be1", "be2"] {
            for node in [Host::NodeA, Host::NodeB] {
                wait_backend_up(&lab, node, service, be, true)?;
            }
        }
    }

    // Every node places every source the same way.
    for (service, port) in [("source", SOURCE_PORT), ("hash", HASH_PORT)] {
        let p = placements(&lab, port)?;
        let agree = p.iter().filter(|(a, b)| a == b).count();
        println!(
            "{service}: {agree}/{SOURCES} sources placed alike by both nodes; spread {:?}",
            spread(&p)
        );
        assert_eq!(agree, SOURCES as usize, "{service}: nodes disagree");
    }

    // TLS resumptions alternating between the nodes (one client address).
    let mut failed = Vec::new();
    for (label, port, args) in [
        (
            "TLS 1.2 session ID",
            SID_PORT,
            &["-tls1_2", "-no_ticket"][..],
        ),
        ("TLS 1.2 ticket", TICKET_PORT, &["-tls1_2"][..]),
        ("TLS 1.3", TLS13_PORT, &["-tls1_3"][..]),
    ] {
        let (kept, n, firsts) = alternating(&lab, port, args, 9, 10)?;
        println!("resumed on the first backend, alternating nodes, OpenSSL, {label}: {kept}/{n}; first connections {firsts:?}");
        if (kept as f64) < TARGET * n as f64 {
            failed.push(label);
        }
        assert!(
            firsts.values().all(|v| *v <= 4),
            "{label}: first connections not spread"
        );
    }
    for (service, port) in JDK_PORTS {
        let (kept, n, errors, firsts) = jdk_alternating(&lab, &java, &ca, service, port)?;
        println!("resumed on the first backend, alternating nodes, JDK client and servers, {service}: {kept}/{n}; errors {}; first connections {firsts:?}", errors.len());
        if (kept as f64) < TARGET * n as f64 || !errors.is_empty() {
            failed.push(service);
        }
    }
    assert!(failed.is_empty(), "below {TARGET}: {failed:?}");

    // The nodes disagree about be1's health: B can't reach it, A can.
    lab.exec(
        Host::NodeB,
        &[
            "ip",
            "route",
            "add",
            "prohibit",
            &format!("{}/32", BACKEND_IPS[1]),
        ],
    )?;
    for service in ["source", "hash"] {
        wait_backend_up(&lab, Host::NodeB, service, "be1", false)?;
    }
    let mut during = BTreeMap::new();
    for (service, port) in [("source", SOURCE_PORT), ("hash", HASH_PORT)] {
        let p = placements(&lab, port)?;
        let on_be1 = p.iter().filter(|(a, _)| a == "be1").count();
        let moved = p.iter().filter(|(a, b)| a != b).count();
        let wrong = p.iter().filter(|(a, b)| a != b && a != "be1").count();
        println!("{service} while B sees be1 down: {moved}/{SOURCES} placed differently, all of them among the {on_be1} sources A places on be1");
        assert_eq!(wrong, 0, "{service}: sources not on be1 moved too");
        assert_eq!(
            moved, on_be1,
            "{service}: B still sends sources to a backend it sees down"
        );
        during.insert(service, p);
    }
    lab.exec(
        Host::NodeB,
        &[
            "ip",
            "route",
            "del",
            "prohibit",
            &format!("{}/32", BACKEND_IPS[1]),
        ],
    )?;
    for service in ["source", "hash"] {
        wait_backend_up(&lab, Host::NodeB, service, "be1", true)?;
    }
    // Once they agree again: the pure hash is back at once; the source table keeps
    // the sources B moved where it moved them until their entries expire.
    let p = placements(&lab, HASH_PORT)?;
    let agree = p.iter().filter(|(a, b)| a == b).count();
    println!("hash after B sees be1 up again: {agree}/{SOURCES} placed alike");
    assert_eq!(agree, SOURCES as usize);
    let p = placements(&lab, SOURCE_PORT)?;
    let agree = p.iter().filter(|(a, b)| a == b).count();
    let held = p.iter().filter(|(a, b)| a != b).count();
    println!("source (stick.on: [source]) after B sees be1 up again: {agree}/{SOURCES} placed alike; {held} stay where B's table put them until source_expire");
    assert!(p.iter().all(|(a, b)| a == b || a == "be1"));
    Ok(())
}

/// A test process killed mid-run (SIGKILL: its `Lab` is never dropped) leaves its
/// namespaces and what ran in them, a keepalived say. The next lab removes them and
/// kills what runs there; a lab whose test process still runs (a test beside this
/// one) is left alone.
#[test]
fn a_killed_tests_namespaces_are_removed_by_the_next_lab() -> Result<()> {
    lab_tools();
    let exists = |ns: &str| Path::new("/run/netns").join(ns).exists();
    // The killed test: its PID is free again.
    let mut killed = std::process::Command::new("true").spawn()?;
    let dead = killed.id();
    killed.wait()?;
    let stale = format!("cbha{dead}x0-a");
    netns::run(&["ip", "netns", "add", &stale])?;
    let mut leftover = std::process::Command::new("ip")
        .args(["netns", "exec", &stale, "sleep", "600"])
        .spawn()?;
    // A test still running.
    let mut running = std::process::Command::new("sleep").arg("600").spawn()?;
    let live = format!("cbha{}x0-a", running.id());
    netns::run(&["ip", "netns", "add", &live])?;

    let lab = Lab::new()?;
    let (stale_removed, live_kept) = (!exists(&stale), exists(&live));
    let end = Instant::now()
        + if stale_removed {
            LAB_WAIT
        } else {
            Duration::ZERO
        };
    let mut left = leftover.try_wait()?;
    while left.is_none() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
        left = leftover.try_wait()?;
    }
    // Clean up what this test made, whatever happened, then judge.
    for child in [&mut leftover, &mut running] {
        let _ = child.kill(); // ok: it may be gone already
        let _ = child.wait(); // ok: as above
    }
    for ns in [&stale, &live] {
        let _ = netns::run(&["ip", "netns", "del", ns]); // ok: may be gone already
    }
    drop(lab);
    assert!(stale_removed, "{stale} (owner gone) is still there");
    assert!(live_kept, "{live} was removed while its owner runs");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        left.and_then(|s| s.signal()),
        Some(9),
        "what ran in the stale namespace was killed"
    );
    Ok(())
}
