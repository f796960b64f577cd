//! A DNS server each test starts and scripts (`scripted_dns.py` beside this file,
//! on Debian's python3-dnslib): the test writes the zone as JSON, and every query
//! reads it again, so answers change without a restart; a name can answer SERVFAIL,
//! REFUSED or NXDOMAIN, answer late, or never answer.
use std::net::{IpAddr, SocketAddr};
use std::process::{Command, Stdio};

use serde_json::{json, Map, Value};

use super::tls::ChildGuard;

/// The interpreter with Debian's python3-dnslib (tests/run.sh installs it).
const PYTHON: &str = "/usr/bin/python3";
/// Where Debian installs dnslib.
const DNSLIB: &str = "/usr/lib/python3/dist-packages/dnslib";

/// The records and rules of a [`ScriptedDns`].
#[derive(Debug, Clone, Default)]
pub struct Zone {
    records: Map<String, Value>,
    rules: Map<String, Value>,
}

/// `name` as the zone file keys it: lower case, a final dot.
fn fqdn(name: &str) -> String {
    let n = name.to_ascii_lowercase();
    if n.ends_with('.') {
        n
    } else {
        format!("{n}.")
    }
}

impl Zone {
    fn push(&mut self, name: &str, record: Value) {
        let list = self.records.entry(fqdn(name)).or_insert_with(|| json!([]));
        if let Value::Array(a) = list {
            a.push(record);
        }
    }

    /// An A (or AAAA) record.
    pub fn a(mut self, name: &str, ip: IpAddr) -> Zone {
        let kind = if ip.is_ipv4() { "A" } else { "AAAA" };
        self.push(name, json!({"type": kind, "address": ip.to_string()}));
        self
    }

    /// An SRV record of `name` for `target:port`.
    pub fn srv(mut self, name: &str, target: &str, port: u16, priority: u16, weight: u16) -> Zone {
        let rec = json!({"type": "SRV", "priority": priority, "weight": weight,
                         "port": port, "target": fqdn(target)});
        self.push(name, rec);
        self
    }

    /// Every query of `name` answers `rcode` (`SERVFAIL`, `REFUSED`, `NXDOMAIN`).
    pub fn rcode(mut self, name: &str, rcode: &str) -> Zone {
        self.rules.insert(fqdn(name), json!({"rcode": rcode}));
        self
    }

    /// Queries of `name` are never answered.
    pub fn silent(mut self, name: &str) -> Zone {
        self.rules.insert(fqdn(name), json!({"silent": true}));
        self
    }

    fn text(&self) -> String {
        json!({"records": self.records, "rules": self.rules}).to_string()
    }
}

/// The running server: UDP and TCP on one free loopback port.
pub struct ScriptedDns {
    dir: tempfile::TempDir,
    /// Its port.
    pub port: u16,
    _child: ChildGuard,
}

impl ScriptedDns {
    /// Start it answering `zone`; returns once its TCP socket accepts.
    pub async fn start(zone: &Zone) -> ScriptedDns {
        if !std::path::Path::new(DNSLIB).exists() {
            crossbar::testbed::missing_tool(
                "a scripted DNS server",
                "python3-dnslib (apt-get install python3-dnslib)",
            );
        }
        let dir = tempfile::tempdir().expect("temp dir");
        let port = super::free_port().port();
        let zone_file = dir.path().join("zone.json");
        std::fs::write(&zone_file, zone.text()).expect("write the zone");
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/common/scripted_dns.py");
        let child = Command::new(PYTHON)
            .arg(script)
            .arg(port.to_string())
            .arg(&zone_file)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the scripted DNS server");
        let dns = ScriptedDns {
            dir,
            port,
            _child: ChildGuard(child),
        };
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        super::wait_listening(addr).await;
        dns
    }

    /// `ip:port` for `discover.resolvers`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Answer `zone` from the next query on (written to a new file, renamed over
    /// the old: no query reads half a file).
    pub fn set(&self, zone: &Zone) {
        let tmp = self.dir.path().join("zone.json.new");
        std::fs::write(&tmp, zone.text()).expect("write the zone");
        std::fs::rename(&tmp, self.dir.path().join("zone.json")).expect("replace the zone");
    }
}
