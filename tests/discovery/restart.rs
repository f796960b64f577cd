//! A restart of a crossbar whose compilers come from SRV records: the stick
//! entries of the discovered compilers are kept although they are not known
//! before the first DNS answer, and the compilers come back up together from the
//! state file's last known health (by name and address) instead of one by one as
//! their first checks pass (before: the entries were skipped, `entries=14` -> 0,
//! and the first compiler up took 26 of the first 30 agents).
use std::collections::BTreeMap;

use super::*;

/// The service of [`service_yaml`] with a stick table on TLS 1.2 session IDs, its
/// state file and the server-state file in `dir`, checked with `health`.
fn yaml(dns: &Dns, dir: &std::path::Path, health: &str) -> String {
    let stick = format!(
        "    balance: roundrobin\n    stick: {{ on: [session_id], state_file: \"{}\" }}\n",
        dir.join("svc.table").display()
    );
    let text = service_yaml(dns, &format!("srv: {SRV}"), &stick).replace(
        "health: { check: tls-hello, interval: 100ms, timeout: 1s, rise: 2, fall: 2 }",
        health,
    );
    format!(
        "state_file: \"{}\"\n{text}",
        dir.join("crossbar.state").display()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_keeps_the_stick_entries_and_the_health_of_srv_compilers() {
    let log = LogBuffer::install();
    let ca = Arc::new(TestCa::new("discovery CA").expect("CA"));
    let ips = ["127.0.0.21", "127.0.0.22", "127.0.0.23"];
    let mut c = Vec::new();
    for (i, ip) in ips.iter().enumerate() {
        c.push(compiler(&ca, &format!("c{}", i + 1), ip).await);
    }
    let mut records = String::new();
    for (i, ip) in ips.iter().enumerate() {
        records.push_str(&a(&format!("c{}", i + 1), ip.parse().expect("ip")));
        records.push_str(&srv(&format!("c{}", i + 1), c[i].addr.port(), 10, 1));
    }
    let names: BTreeSet<String> = (0..3)
        .map(|i| format!("c{}.test-{}", i + 1, c[i].addr.port()))
        .collect();
    let dns = Dns::start(&records).await;
    let dir = tempfile::tempdir().expect("temp dir");

    // First run: checks pass fast, six agents learn their homes.
    let fast = "health: { check: tls-hello, interval: 100ms, timeout: 1s, rise: 2, fall: 2 }";
    let cb = Crossbar::start(&yaml(&dns, dir.path(), fast)).await;
    serving(&cb, &names).await;
    const AGENTS: usize = 6;
    let clients: Vec<_> = (0..AGENTS)
        .map(|_| testbed::client_config(&ca, Versions::Tls12, false).expect("client config"))
        .collect();
    let mut home = Vec::new();
    for client in &clients {
        let r = testbed::get(cb.addr("svc"), SNI, client.clone(), "/").await;
        home.push(r.expect("a first request").backend);
    }
    cb.server.shutdown(std::time::Duration::from_secs(2)).await;

    // Restart with checks an hour apart that need two passes: only the state file
    // can bring a compiler up within the test.
    let slow = "health: { check: tls-hello, interval: 1h, timeout: 1s, rise: 2, fall: 2 }";
    let cb = Crossbar::start(&yaml(&dns, dir.path(), slow)).await;
    serving(&cb, &names).await;
    assert!(
        !log.contains("skipped the entries of backends that are not configured"),
        "the discovered compilers' entries are kept"
    );
    for (i, client) in clients.iter().enumerate() {
        let r = testbed::get(cb.addr("svc"), SNI, client.clone(), "/").await;
        let r = r.expect("a resumption after the restart");
        assert_eq!(
            (r.backend.as_str(), r.resumed),
            (home[i].as_str(), true),
            "agent {i} resumes at home"
        );
    }
    let mut first_30: BTreeMap<String, usize> = BTreeMap::new();
    for _ in 0..30 {
        let fresh = testbed::client_config(&ca, Versions::Tls12, false).expect("client config");
        let r = testbed::get(cb.addr("svc"), SNI, fresh, "/").await;
        *first_30.entry(r.expect("a new agent").backend).or_default() += 1;
    }
    assert!(
        first_30.len() == 3 && first_30.values().all(|&n| n <= 15),
        "no compiler takes more than half of the first 30 agents: {first_30:?}"
    );
    cb.server.shutdown(std::time::Duration::from_secs(2)).await;
}
