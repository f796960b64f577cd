//! Make before break (issue 41: replacing the SRV target with another name for the
//! same healthy server refused 19 agents over ~2 s): a backend that leaves DNS
//! keeps taking new connections until a replacement passes its checks, then
//! drains, and goes once idle.
use std::collections::BTreeSet;
use std::time::Duration;

use super::{compiler, departed, pool, SRV};
use crate::common::dns::{ScriptedDns, Zone};
use crate::common::*;
use crossbar::testbed::{self, TestCa, Versions};

/// The whole SRV set replaced (the same server under a new name, and a new server)
/// while an agent connects every 100 ms: no agent is refused; the departed backends
/// leave once the newcomers serve and they are idle; every discovered backend has
/// the `discover.backend` template's options.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_swap_of_the_srv_set_refuses_no_agent() {
    let ca = TestCa::new("discovery CA").expect("CA");
    let c1 = compiler(&ca, "c1", "127.0.0.71").await;
    let c2 = compiler(&ca, "c2", "127.0.0.72").await;
    let c3 = compiler(&ca, "c3", "127.0.0.73").await;
    let ip = |s: &str| s.parse().expect("ip");
    let hosts = Zone::default()
        .a("old1.test", ip("127.0.0.71"))
        .a("old2.test", ip("127.0.0.72"))
        .a("new1.test", ip("127.0.0.71"))
        .a("new3.test", ip("127.0.0.73"));
    let before = hosts
        .clone()
        .srv(SRV, "old1.test", c1.addr.port(), 10, 1)
        .srv(SRV, "old2.test", c2.addr.port(), 10, 1);
    let after = hosts.srv(SRV, "new1.test", c1.addr.port(), 10, 1).srv(
        SRV,
        "new3.test",
        c3.addr.port(),
        10,
        1,
    );
    let dns = ScriptedDns::start(&before).await;
    let yaml = format!(
        "admin: {{ enabled: false }}\nservices:\n  svc:\n    listen: [\"127.0.0.1:0\"]\n\
         \x20   health: {{ check: tls-hello, interval: 200ms, timeout: 1s, rise: 3, fall: 2 }}\n\
         \x20   discover: {{ srv: {SRV}, resolvers: [\"{}\"], min_ttl: 300ms, max_ttl: 1s,\n\
         \x20                backend: {{ max_connections: 50 }} }}\n",
        dns.addr()
    );
    let cb = Crossbar::start(&yaml).await;
    let name = |host: &str, port: u16| format!("{host}-{port}");
    let old = BTreeSet::from([
        name("old1.test", c1.addr.port()),
        name("old2.test", c2.addr.port()),
    ]);
    let new = BTreeSet::from([
        name("new1.test", c1.addr.port()),
        name("new3.test", c3.addr.port()),
    ]);
    super::serving(&cb, &old).await;

    let agent = || testbed::client_config(&ca, Versions::Both, false).expect("client config");
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let (mut served, mut refused) = (Vec::new(), Vec::new());
    let mut swapped = false;
    let mut settled = 0;
    for _ in 0..1200 {
        tick.tick().await;
        match within("agent", testbed::get(cb.addr("svc"), SNI, agent(), "/")).await {
            Ok(r) => served.push(r.backend),
            Err(e) => refused.push(format!("{e:#}")),
        }
        if !swapped && served.len() >= 5 {
            dns.set(&after);
            swapped = true;
        }
        let done = swapped && pool(&cb, "svc") == new && departed(&cb, "svc").is_empty();
        settled = if done { settled + 1 } else { 0 };
        if settled >= 5 {
            break;
        }
    }
    println!(
        "{} agents served, {} refused; by compiler: c1 {}, c2 {}, c3 {}",
        served.len(),
        refused.len(),
        served.iter().filter(|b| *b == "c1").count(),
        served.iter().filter(|b| *b == "c2").count(),
        served.iter().filter(|b| *b == "c3").count()
    );
    assert!(
        settled >= 5,
        "the swap never settled: pool {:?}",
        pool(&cb, "svc")
    );
    assert!(refused.is_empty(), "refused agents: {refused:?}");
    assert!(
        served.iter().any(|b| b == "c3"),
        "the new server took agents"
    );
    let svc = cb.service("svc").expect("svc");
    for b in svc.pool.backends.iter() {
        assert_eq!(
            b.config.max_connections,
            Some(50),
            "{}: the template",
            b.name
        );
    }
    drop(dns);
}
