//! A small network of test hosts made of Linux network namespaces: a switch (a
//! bridge in its own namespace), a client host, two balancer nodes and a backend
//! host, joined by veth pairs on 192.0.2.0/24 (TEST-NET-1, documentation only).
//! Nothing is routed out of the namespaces; every process started in them is killed
//! by PID and every namespace deleted when the [`Lab`] is dropped, also when a test
//! fails half-way; a lab whose test process was killed (no `Drop`) is removed when
//! the next lab starts ([`remove_stale_labs`]).
//!
//! Code runs inside a host either as a process (`ip netns exec`) or as a thread that
//! joined the namespace (`setns`) and drives its own tokio runtime, so sockets it
//! creates live in that host.

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

pub use super::wire::Faults;
use super::wire::Wire;

/// The hosts of a lab.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Host {
    /// The switch: holds the bridge, no address.
    Switch,
    /// Where clients run: 192.0.2.10 (and any 198.18.0.0/16 source, see [`Lab::new`]).
    Client,
    /// Balancer node A: 192.0.2.1.
    NodeA,
    /// Balancer node B: 192.0.2.2.
    NodeB,
    /// Backends: 192.0.2.20, .21, .22.
    Backends,
}

impl Host {
    const ALL: [Host; 5] = [
        Host::Switch,
        Host::Client,
        Host::NodeA,
        Host::NodeB,
        Host::Backends,
    ];
    fn suffix(self) -> &'static str {
        match self {
            Host::Switch => "sw",
            Host::Client => "cli",
            Host::NodeA => "a",
            Host::NodeB => "b",
            Host::Backends => "be",
        }
    }
    /// The host's own address on the lab network.
    pub fn ip(self) -> Ipv4Addr {
        match self {
            Host::Switch => Ipv4Addr::UNSPECIFIED,
            Host::Client => Ipv4Addr::new(192, 0, 2, 10),
            Host::NodeA => Ipv4Addr::new(192, 0, 2, 1),
            Host::NodeB => Ipv4Addr::new(192, 0, 2, 2),
            Host::Backends => BACKEND_IPS[0],
        }
    }
    /// The other balancer node.
    pub fn peer(self) -> Host {
        if self == Host::NodeA {
            Host::NodeB
        } else {
            Host::NodeA
        }
    }
}

/// The backend host's addresses, one per backend.
pub const BACKEND_IPS: [Ipv4Addr; 3] = [
    Ipv4Addr::new(192, 0, 2, 20),
    Ipv4Addr::new(192, 0, 2, 21),
    Ipv4Addr::new(192, 0, 2, 22),
];
/// The floating address keepalived moves between the nodes.
pub const VIP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 100);
/// The address both nodes serve at once (active/active): a /32 on each node's
/// loopback, reached from the client host through a two-way multipath route.
pub const ANYCAST: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 200);
/// Client source addresses for the many-sources tests: the whole range is local to
/// the client host (an AnyIP route) and routed back to it by both nodes.
pub const SOURCES: (Ipv4Addr, u8) = (Ipv4Addr::new(198, 18, 0, 0), 16);

/// Guards every wait on a process or the network against hangs (not a threshold).
pub const LAB_WAIT: Duration = Duration::from_secs(60);

static LABS: AtomicUsize = AtomicUsize::new(0);

/// Every lab namespace is `cbha<pid>x<n>-<host>`: the PID of the test process that
/// made it, so a leftover can be told from a lab in use.
const LAB_PREFIX: &str = "cbha";

/// Delete the namespaces of labs whose test process is gone (killed, so its `Drop`
/// never ran), and kill what still runs in them (a keepalived, a crossbar). A lab
/// whose process still runs, this one's or a test's running beside it, is never
/// touched. Best effort: what can't be removed now is tried again at the next lab.
pub fn remove_stale_labs() -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/run/netns") else {
        return Vec::new(); // no named namespace at all
    };
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = lab_owner(&name) else {
            continue;
        };
        if pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists() {
            continue; // its test still runs
        }
        kill_all_in(&name);
        if run(&["ip", "netns", "del", &name]).is_ok() {
            removed.push(name);
        }
    }
    removed
}

/// The PID in a lab namespace's name (`cbha<pid>x<n>-<host>`), `None` for any
/// other name.
fn lab_owner(name: &str) -> Option<u32> {
    let (pid, rest) = name.strip_prefix(LAB_PREFIX)?.split_once('x')?;
    let (n, host) = rest.split_once('-')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let known = Host::ALL.iter().any(|h| h.suffix() == host);
    (digits(pid) && digits(n) && known).then(|| pid.parse().ok())?
}

/// Kill (SIGKILL) every process in namespace `ns` but this test process.
fn kill_all_in(ns: &str) {
    let Ok(out) = Command::new("ip").args(["netns", "pids", ns]).output() else {
        return;
    };
    let me = std::process::id().to_string();
    for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
        if pid == me {
            continue; // a thread of this test joined it: never kill the test
        }
        let _ = Command::new("kill").args(["-9", pid]).status(); // ok: best effort
    }
}

/// Whether network namespaces can be made here (root, `ip` present); a test that
/// needs them fails when they can't.
pub fn usable() -> Result<()> {
    let ok = Command::new("unshare")
        .args(["-n", "ip", "link", "set", "lo", "up"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if ok {
        Ok(())
    } else {
        bail!("network namespaces can't be made here (needs root and iproute2)")
    }
}

/// `tool --version`-style presence check for an external program.
pub fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A process started inside a lab host, with its output in a log file.
pub struct LabProcess {
    pub name: String,
    pub log: PathBuf,
    child: Child,
}

impl LabProcess {
    /// Its PID (the program itself: `ip netns exec` execs it).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
    /// Send a signal by PID.
    pub fn signal(&self, sig: &str) -> Result<()> {
        let st = Command::new("kill")
            .args([&format!("-{sig}"), &self.pid().to_string()])
            .status()?;
        if !st.success() {
            bail!("kill -{sig} {} failed", self.name);
        }
        Ok(())
    }
    /// Whether it has exited, and how.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }
    /// Wait for it to exit, at most `limit`.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let end = Instant::now() + limit;
        while Instant::now() < end {
            if let Some(st) = self.exited() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
    /// Its log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for LabProcess {
    fn drop(&mut self) {
        // Both fail only when the process is already gone: nothing left to clean up.
        let _ = self.child.kill(); // ok: see above
        let _ = self.child.wait(); // ok: see above
    }
}

/// One lab: its namespaces, its temporary directory, the MACs of the nodes' links.
pub struct Lab {
    prefix: String,
    pub dir: tempfile::TempDir,
    made: Vec<String>,
    /// The faulty cables of the hosts made with [`Lab::with_wires`].
    wires: Vec<(Host, Wire)>,
}

impl Lab {
    /// Make the namespaces, the bridge and the links, and give every host its
    /// addresses. The client host owns 198.18.0.0/16 as an AnyIP range and both
    /// nodes route it back to the client, so a test can connect from any of 65,536
    /// sources.
    pub fn new() -> Result<Lab> {
        Lab::with_wires(&[])
    }

    /// [`Lab::new`], with the hosts in `wired` joined to the switch by a faulty
    /// cable (tests/common/wire.rs) instead of a veth pair: [`Lab::faults`] then
    /// sets what that cable does to the frames crossing it.
    pub fn with_wires(wired: &[Host]) -> Result<Lab> {
        usable()?;
        remove_stale_labs();
        let n = LABS.fetch_add(1, Ordering::SeqCst);
        let prefix = format!("{LAB_PREFIX}{}x{n}", std::process::id());
        let mut lab = Lab {
            prefix,
            dir: tempfile::tempdir()?,
            made: Vec::new(),
            wires: Vec::new(),
        };
        for h in Host::ALL {
            let ns = lab.ns(h);
            run(&["ip", "netns", "add", &ns])?;
            lab.made.push(ns.clone());
            run(&["ip", "-n", &ns, "link", "set", "lo", "up"])?;
        }
        let sw = lab.ns(Host::Switch);
        run(&["ip", "-n", &sw, "link", "add", "br0", "type", "bridge"])?;
        run(&["ip", "-n", &sw, "link", "set", "br0", "up"])?;
        for h in &Host::ALL[1..] {
            let ns = lab.ns(*h);
            let port = format!("p-{}", h.suffix());
            if wired.contains(h) {
                lab.wires.push((*h, Wire::new(&ns, "eth0", &sw, &port)?));
            } else {
                run(&[
                    "ip", "-n", &sw, "link", "add", &port, "type", "veth", "peer", "name", "eth0",
                    "netns", &ns,
                ])?;
            }
            run(&["ip", "-n", &sw, "link", "set", &port, "master", "br0", "up"])?;
            run(&["ip", "-n", &ns, "link", "set", "eth0", "up"])?;
        }
        for h in [Host::Client, Host::NodeA, Host::NodeB] {
            lab.addr(h, &format!("{}/24", h.ip()), "eth0")?;
        }
        for ip in BACKEND_IPS {
            lab.addr(Host::Backends, &format!("{ip}/24"), "eth0")?;
        }
        let sources = format!("{}/{}", SOURCES.0, SOURCES.1);
        let cli = lab.ns(Host::Client);
        run(&[
            "ip", "-n", &cli, "route", "add", "local", &sources, "dev", "lo",
        ])?;
        for node in [Host::NodeA, Host::NodeB] {
            let ns = lab.ns(node);
            let via = Host::Client.ip().to_string();
            run(&["ip", "-n", &ns, "route", "add", &sources, "via", &via])?;
            // The anycast address is local on both nodes; the client reaches it by a
            // multipath route that hashes on ports too (policy 1), so one source
            // address spreads its connections over both nodes.
            lab.addr(node, &format!("{ANYCAST}/32"), "lo")?;
        }
        lab.sysctl(Host::Client, "net.ipv4.fib_multipath_hash_policy", "1")?;
        let (a, b) = (Host::NodeA.ip().to_string(), Host::NodeB.ip().to_string());
        run(&[
            "ip",
            "-n",
            &cli,
            "route",
            "add",
            &format!("{ANYCAST}/32"),
            "nexthop",
            "via",
            &a,
            "nexthop",
            "via",
            &b,
        ])?;
        Ok(lab)
    }

    /// Make `host`'s cable (see [`Lab::with_wires`]) apply `faults` from now on.
    pub fn faults(&self, host: Host, faults: Faults) -> Result<()> {
        match self.wires.iter().find(|(h, _)| *h == host) {
            Some((_, w)) => {
                w.set(faults);
                Ok(())
            }
            None => bail!("{host:?} has no faulty cable (see Lab::with_wires)"),
        }
    }

    /// The namespace name of `host`.
    pub fn ns(&self, host: Host) -> String {
        format!("{}-{}", self.prefix, host.suffix())
    }

    /// Add an address to an interface of `host`.
    pub fn addr(&self, host: Host, cidr: &str, dev: &str) -> Result<()> {
        run(&["ip", "-n", &self.ns(host), "addr", "add", cidr, "dev", dev])
    }

    /// Set a sysctl inside `host` (network sysctls are per namespace).
    pub fn sysctl(&self, host: Host, key: &str, value: &str) -> Result<()> {
        let path = format!("/proc/sys/{}", key.replace('.', "/"));
        self.exec(host, &["sh", "-c", &format!("echo {value} > {path}")])
    }

    /// Run a command inside `host` to completion; fails on a non-zero exit.
    pub fn exec(&self, host: Host, cmd: &[&str]) -> Result<()> {
        let ns = self.ns(host);
        let mut full = vec!["ip", "netns", "exec", &ns];
        full.extend_from_slice(cmd);
        run(&full)
    }

    /// Run a command inside `host` and return its output, whatever its exit.
    pub fn output(&self, host: Host, cmd: &[&str]) -> Result<Output> {
        Command::new("ip")
            .args(["netns", "exec", &self.ns(host)])
            .args(cmd)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running {cmd:?}"))
    }

    /// Start a long-running program inside `host`, in `cwd` (the lab dir when
    /// `None`), its stdout and stderr in `<name>.log` in the lab dir.
    pub fn spawn(
        &self,
        host: Host,
        name: &str,
        cmd: &[&str],
        cwd: Option<&Path>,
    ) -> Result<LabProcess> {
        let log = self.dir.path().join(format!("{name}.log"));
        let out = std::fs::File::create(&log)?;
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns(host)])
            .args(cmd)
            .current_dir(cwd.unwrap_or(self.dir.path()))
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        Ok(LabProcess {
            name: name.to_string(),
            log,
            child,
        })
    }

    /// The IPv4 addresses on `dev` of `host`.
    pub fn addrs(&self, host: Host, dev: &str) -> Vec<Ipv4Addr> {
        let Ok(out) = self.output(host, &["ip", "-4", "-o", "addr", "show", "dev", dev]) else {
            return Vec::new();
        };
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| {
                let cidr = l.split_whitespace().skip_while(|w| *w != "inet").nth(1)?;
                cidr.split('/').next()?.parse().ok()
            })
            .collect()
    }

    /// The MAC of `host`'s lab interface.
    pub fn mac(&self, host: Host) -> Result<String> {
        let out = self.output(host, &["cat", "/sys/class/net/eth0/address"])?;
        Ok(String::from_utf8(out.stdout)?.trim().to_string())
    }

    /// Run `fut` to completion on a thread that joined `host`'s network namespace,
    /// with its own single-threaded runtime: every socket it opens lives in `host`.
    pub fn block_in<T, F, Fut>(&self, host: Host, f: F) -> T
    where
        T: Send + 'static,
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = T>,
    {
        let path = PathBuf::from("/run/netns").join(self.ns(host));
        std::thread::spawn(move || {
            enter(&path);
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(f())
        })
        .join()
        .expect("lab thread panicked")
    }

    /// Run `fut` in the background on a thread inside `host` until the returned
    /// guard is dropped (servers a test talks to).
    pub fn serve_in<F, Fut>(&self, host: Host, f: F) -> Served
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = ()>,
    {
        let path = PathBuf::from("/run/netns").join(self.ns(host));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            enter(&path);
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                tokio::select! {
                    _ = f() => {}
                    _ = stopped => {}
                }
            });
        });
        Served {
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

/// A background server inside a lab host; stopped when dropped.
pub struct Served {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(()); // ok: the server may have ended on its own
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join(); // ok: a panic there was already reported
        }
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for ns in self.made.iter().rev() {
            // Kill whatever still runs in it, then delete it.
            kill_all_in(ns);
            let _ = Command::new("ip").args(["netns", "del", ns]).status(); // ok: best effort
        }
    }
}

/// Join the network namespace at `path` (this thread only).
fn enter(path: &Path) {
    let f = std::fs::File::open(path).expect("open netns");
    nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
}

/// Run a command to completion; its stderr becomes the error on failure.
pub fn run(cmd: &[&str]) -> Result<()> {
    let out = Command::new(cmd[0])
        .args(&cmd[1..])
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// A source address in [`SOURCES`] by index.
pub fn source(i: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(u32::from(SOURCES.0) + 1 + i))
}
