//! DNS is never on the start or reload path (issue 41: 10 SRV targets whose address
//! lookups never answer meant 60 s with no listener at all), and the tools never
//! say OK over a service that would start with no backend.
use std::net::SocketAddr;
use std::time::Instant;

use crate::common::dns::{ScriptedDns, Zone};
use crate::common::*;

/// An SRV name with ten targets whose address queries are never answered.
fn ten_silent_targets(zone: Zone, name: &str) -> Zone {
    (0..10).fold(zone, |z, i| {
        let target = format!("{name}-t{i}.test");
        z.srv(name, &target, 8140, 10, 1).silent(&target)
    })
}

/// Lookups of any kind that have ended (answered or failed), all services.
fn lookups_ended(cb: &Crossbar) -> f64 {
    cb.metric("crossbar_discovery_lookups_total", &[])
}

fn yaml(dns: &ScriptedDns, srv: &str, echo: SocketAddr) -> String {
    format!(
        "admin: {{ enabled: false }}\nservices:\n\
         \x20 from-dns:\n    listen: [\"127.0.0.1:0\"]\n\
         \x20   health: {{ check: tls-hello, interval: 100ms, timeout: 1s }}\n\
         \x20   discover: {{ srv: {srv}, resolvers: [\"{}\"], timeout: 20s }}\n\
         \x20 static:\n    listen: [\"127.0.0.1:0\"]\n    mode: tcp\n    health: {{ check: none }}\n\
         \x20   backends:\n      - {{ name: echo, address: \"{echo}\" }}\n",
        dns.addr()
    )
}

/// Ten silent SRV targets (a lookup that would take 80 s: 20 s timeouts): crossbar
/// starts and every listener, the unrelated static service's too, serves before any
/// lookup has ended; a reload that changes `discover` to another silent name
/// answers before its lookup ends, and says it did not wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_silent_srv_targets_block_neither_start_nor_reload() {
    let zone = ten_silent_targets(Zone::default(), "_x-puppet._tcp.test");
    let zone = ten_silent_targets(zone, "_other._tcp.test");
    let dns = ScriptedDns::start(&zone).await;
    let echo = Backend::echo("echo", true).await;
    let started = Instant::now();
    let cb = Crossbar::start(&yaml(&dns, "_x-puppet._tcp.test", echo.addr)).await;
    let (name, _held) = who(cb.addr("static")).await;
    assert_eq!(name, "echo", "the static service relays");
    let _dns_listener = tokio::net::TcpStream::connect(cb.addr("from-dns"))
        .await
        .expect("the DNS service's listener accepts");
    println!(
        "both listeners served {:?} after start began",
        started.elapsed()
    );
    assert_eq!(lookups_ended(&cb), 0.0, "served before any lookup ended");

    let dir = cb.path.parent().expect("config dir").to_path_buf();
    let cfg = load_config(&dir, &yaml(&dns, "_other._tcp.test", echo.addr));
    let asked = Instant::now();
    let applied = cb.server.reload(cfg).await.expect("the reload applies");
    println!("the reload answered after {:?}", asked.elapsed());
    assert_eq!(lookups_ended(&cb), 0.0, "answered before its lookup ended");
    let warned = applied.warnings.join("\n");
    assert!(
        warned.contains("service from-dns: DNS srv _other._tcp.test: no answer yet")
            && warned.contains("the reload does not wait for DNS"),
        "{warned}"
    );
    let (name, _held) = who(cb.addr("static")).await;
    assert_eq!(name, "echo");
    drop(dns);
}

/// `check --resolve` and `doctor` of a service whose only backends come from DNS
/// fail, naming the service and the DNS reason, for a typo'd SRV name (REFUSED) and
/// for a resolver that is down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_and_doctor_fail_for_a_typod_srv_name_and_a_dead_resolver() {
    let zone = Zone::default().rcode("_x-pupet._tcp.test", "REFUSED");
    let dns = ScriptedDns::start(&zone).await;
    let dead = refusing_addr();
    let dir = tempfile::tempdir().expect("temp dir");
    let cases = [
        (dns.addr(), "_x-pupet._tcp.test", "refused"),
        (dead.to_string(), "_x-puppet._tcp.test", "timeout"),
    ];
    for (resolver, srv, reason) in cases {
        let path = dir.path().join("crossbar.yaml");
        let yaml = format!(
            "admin: {{ enabled: false }}\nservices:\n  svc:\n    listen: [\"127.0.0.1:0\"]\n\
             \x20   discover: {{ srv: {srv}, resolvers: [\"{resolver}\"], timeout: 300ms }}\n"
        );
        std::fs::write(&path, yaml).expect("write");
        let c = path.display().to_string();
        let want = format!("service svc: DNS srv {srv}: no backend: the lookup failed ({reason})");
        let check = ["check", "--resolve", "-c", &c].map(String::from).to_vec();
        let (ok, out, err) = crossbar_cli(check).await;
        assert!(!ok, "check --resolve passes ({reason}): {out}{err}");
        assert!(err.contains(&want), "{reason}: {out}{err}");
        let doctor = ["doctor", "-c", &c].map(String::from).to_vec();
        let (ok, out, err) = crossbar_cli(doctor).await;
        assert!(!ok, "doctor passes ({reason}): {out}{err}");
        assert!(
            out.contains("no backend") && out.contains(reason),
            "{reason}: {out}{err}"
        );
    }
    drop(dns);
}
