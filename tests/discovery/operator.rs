//! File < DNS < operator: a DNS change keeps every backend's run-time state (issue
//! 41: changing only an SRV weight put a file-disabled backend the operator had
//! enabled back to disabled, and every agent was refused), and the last-backend
//! guard sees every DNS commit.
use std::collections::BTreeSet;
use std::net::SocketAddr;

use crossbar::balance::AdminState;

use super::{compiler, Dns, SRV};
use crate::common::api::request;
use crate::common::*;
use crossbar::testbed::TestCa;

/// `POST /api/backends/svc/NAME/ACTION`: the status.
async fn write(admin: SocketAddr, backend: &str, action: &str) -> Option<u16> {
    let path = format!("/api/backends/svc/{backend}/{action}");
    raw_request(admin, &request("POST", &path), WAIT).await.0
}

/// b2 is `disabled: true` in the file and enabled at run time, the two discovered
/// compilers drained: across 10 DNS changes (c1's SRV weight), b2 stays enabled,
/// the drains stay, draining b2 (the last backend taking new connections) is
/// refused with 409 every time, and every agent is served (by b2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_disabled_backend_enabled_at_run_time_stays_enabled_across_dns_changes() {
    let ca = TestCa::new("discovery CA").expect("CA");
    let c1 = compiler(&ca, "c1", "127.0.0.61").await;
    let c3 = compiler(&ca, "c3", "127.0.0.63").await;
    let b2 = compiler(&ca, "b2", "127.0.0.62").await;
    let records = |w: u16| {
        format!(
            "host-record=c1.test,127.0.0.61\nhost-record=c3.test,127.0.0.63\n\
             srv-host={SRV},c1.test,{},10,{w}\nsrv-host={SRV},c3.test,{},10,1\n",
            c1.addr.port(),
            c3.addr.port()
        )
    };
    let mut dns = Dns::start(&records(1)).await;
    let extra = format!(
        "    backends:\n      - {{ name: b2, address: \"{}\", disabled: true }}\n",
        b2.addr
    );
    let cb = Crossbar::start(&super::service_yaml(&dns, &format!("srv: {SRV}"), &extra)).await;
    let admin = cb.serve_admin(None).await;
    let (n1, n3) = (
        format!("c1.test-{}", c1.addr.port()),
        format!("c3.test-{}", c3.addr.port()),
    );
    let all = BTreeSet::from([n1.clone(), n3.clone(), "b2".to_string()]);
    wait_until("the answer listed", || super::pool(&cb, "svc") == all).await;
    assert_eq!(write(admin.addr, "b2", "enable").await, Some(200));
    wait_until("b2 up", || cb.backend("svc", "b2").is_available()).await;
    assert_eq!(write(admin.addr, &n1, "drain").await, Some(200));
    assert_eq!(write(admin.addr, &n3, "drain").await, Some(200));
    for w in 2..12u16 {
        dns.serve(&records(w)).await;
        wait_until(&format!("c1 weight {w} applied"), || {
            cb.backend("svc", &n1).config.weight == u32::from(w)
        })
        .await;
        let state = |n: &str| cb.backend("svc", n).admin_state();
        assert_eq!(state("b2"), AdminState::Enabled, "change {w}: b2");
        assert_eq!(state(&n1), AdminState::Drain, "change {w}: c1");
        assert_eq!(state(&n3), AdminState::Drain, "change {w}: c3");
        assert_eq!(
            write(admin.addr, "b2", "drain").await,
            Some(409),
            "change {w}: the last backend guard"
        );
        let cfg = crossbar::testbed::client_config(&ca, crossbar::testbed::Versions::Both, false)
            .expect("client config");
        let r = within(
            "agent",
            crossbar::testbed::get(cb.addr("svc"), SNI, cfg, "/"),
        )
        .await;
        assert_eq!(r.expect("an agent is served").backend, "b2", "change {w}");
    }
    drop(dns);
}

/// The operator's word wins over a record's departure until `backend reset`: c1,
/// drained by the operator, leaves DNS and the pool, keeps its drain in the record
/// while gone (its `enable` refused: only DNS brings it back), and comes back
/// drained when DNS lists it again; agents go to c3 meanwhile; `reset` enables it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_outlives_the_records_departure_and_return_until_reset() {
    let ca = TestCa::new("discovery CA").expect("CA");
    let c1 = compiler(&ca, "c1", "127.0.0.71").await;
    let c3 = compiler(&ca, "c3", "127.0.0.73").await;
    let both = format!(
        "host-record=c1.test,127.0.0.71\nhost-record=c3.test,127.0.0.73\n\
         srv-host={SRV},c1.test,{},10,1\nsrv-host={SRV},c3.test,{},10,1\n",
        c1.addr.port(),
        c3.addr.port()
    );
    let c3_only = format!(
        "host-record=c3.test,127.0.0.73\nsrv-host={SRV},c3.test,{},10,1\n",
        c3.addr.port()
    );
    let mut dns = Dns::start(&both).await;
    let cb = Crossbar::start(&super::service_yaml(&dns, &format!("srv: {SRV}"), "")).await;
    let admin = cb.serve_admin(None).await;
    let (n1, n3) = (
        format!("c1.test-{}", c1.addr.port()),
        format!("c3.test-{}", c3.addr.port()),
    );
    let pair = BTreeSet::from([n1.clone(), n3.clone()]);
    wait_until("both listed", || super::pool(&cb, "svc") == pair).await;
    wait_until("c3 up", || cb.backend("svc", &n3).is_available()).await;
    assert_eq!(write(admin.addr, &n1, "drain").await, Some(200));
    let held = |cb: &Crossbar| cb.operator_state().get("svc", &n1).and_then(|o| o.state);

    dns.serve(&c3_only).await;
    let alone = BTreeSet::from([n3.clone()]);
    wait_until("c1 gone from the pool", || super::pool(&cb, "svc") == alone).await;
    assert_eq!(
        held(&cb),
        Some(AdminState::Drain),
        "kept while its record is gone"
    );

    dns.serve(&both).await;
    wait_until("c1 listed again", || super::pool(&cb, "svc") == pair).await;
    assert_eq!(
        cb.backend("svc", &n1).admin_state(),
        AdminState::Drain,
        "back drained"
    );
    assert_eq!(held(&cb), Some(AdminState::Drain));
    let cfg = crossbar::testbed::client_config(&ca, crossbar::testbed::Versions::Both, false)
        .expect("client config");
    for _ in 0..4 {
        let r = within(
            "agent",
            crossbar::testbed::get(cb.addr("svc"), SNI, cfg.clone(), "/"),
        )
        .await;
        assert_eq!(
            r.expect("an agent is served").backend,
            "c3",
            "c1 stays drained"
        );
    }

    assert_eq!(write(admin.addr, &n1, "reset").await, Some(200));
    assert_eq!(
        cb.backend("svc", &n1).admin_state(),
        AdminState::Enabled,
        "reset"
    );
    assert_eq!(held(&cb), None);
    drop(dns);
}
