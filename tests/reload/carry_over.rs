//! What a reload carries over from the running config: the connections each
//! backend holds (a full backend stays full, `leastconn` remembers the load), the
//! stick entries already learned (with the new lifetimes at once), and the
//! listeners' sockets: a reload under continuous load refuses no connection.
use std::time::Duration;

use crate::common::*;
use tokio::net::TcpStream;

/// Backend `a` is full (`max_connections: 2`, two held connections) when the config
/// is reloaded: new clients queue instead of getting a third slot (before: the new
/// pool counted from 0 and let two more in), releasing one held connection lets
/// exactly one queued client in, and the active-connections gauge stays exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_keeps_a_full_backend_full() {
    let a = Backend::echo("a", true).await;
    let config = |extra: &str| {
        one_service(
            &format!("    mode: tcp\n    queue_size: 4\n    timeouts: {{ queue: 1h }}\n{extra}"),
            &[backend_line("a", a.addr, "max_connections: 2")],
        )
    };
    let lb = Crossbar::start(&config("")).await;
    let admin = lb.serve_admin(None).await;
    let gauge = |lb: &Crossbar| lb.metric("crossbar_active_connections", &[("backend", "a")]);
    let mut held = Vec::new();
    for _ in 0..2 {
        let (name, s) = who(lb.addr("svc")).await;
        assert_eq!(name, "a");
        held.push(s);
    }
    assert_eq!(gauge(&lb), 2.0);

    std::fs::write(&lb.path, config("    retries: 3\n")).unwrap();
    assert_eq!(api_reload(admin.addr).await.0, Some(200), "reload");
    assert_eq!(lb.config().services[0].retries, 3, "the new config runs");
    assert_eq!(
        lb.active("svc", "a"),
        2,
        "the new pool counts the old connections"
    );
    assert_eq!(gauge(&lb), 2.0);

    let mut waiting = Vec::new();
    for _ in 0..2 {
        waiting.push(TcpStream::connect(lb.addr("svc")).await.unwrap());
    }
    let queued = || lb.service("svc").map_or(0, |s| s.pool.queued());
    wait_until("both new clients queued (or let in)", || {
        queued() == 2 || a.accepted() > 2
    })
    .await;
    assert_eq!(
        a.accepted(),
        2,
        "a full backend took a connection after the reload"
    );
    assert_eq!(gauge(&lb), 2.0);

    drop(held.pop());
    wait_until("a queued client gets the freed slot", || a.accepted() == 3).await;
    wait_until("the other stays queued", || queued() == 1).await;
    assert_eq!(lb.active("svc", "a"), 2, "exactly one queued client let in");
    assert_eq!(gauge(&lb), 2.0);

    drop(held);
    wait_until("the last queued client gets a slot", || a.accepted() == 4).await;
    drop(waiting);
    wait_until("every connection closed", || {
        lb.active("svc", "a") == 0 && queued() == 0
    })
    .await;
    assert_eq!(gauge(&lb), 0.0, "the gauge ends exactly at 0");
}

/// `leastconn` remembers the load across a reload: `a` holds two connections when
/// `b` is added, so the next two connections both go to `b` (before: both counted 0
/// and one of them went to `a`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_keeps_leastconn_load() {
    let a = Backend::echo("a", true).await;
    let b = Backend::echo("b", true).await;
    let lines = |with_b: bool| {
        let mut l = vec![backend_line("a", a.addr, "")];
        if with_b {
            l.push(backend_line("b", b.addr, ""));
        }
        one_service("    mode: tcp\n    balance: leastconn\n", &l)
    };
    let lb = Crossbar::start(&lines(false)).await;
    let admin = lb.serve_admin(None).await;
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(who(lb.addr("svc")).await);
    }
    std::fs::write(&lb.path, lines(true)).unwrap();
    assert_eq!(api_reload(admin.addr).await.0, Some(200), "reload");
    for i in 0..2 {
        let (name, s) = who(lb.addr("svc")).await;
        assert_eq!(name, "b", "connection {i} after the reload");
        held.push((name, s));
    }
    assert_eq!(lb.active("svc", "a"), 2);
    assert_eq!(lb.active("svc", "b"), 2);
}

/// The remaining lifetime of the only entry of `svc`'s table.
fn only_entry_expires_in(lb: &Crossbar) -> Duration {
    let svc = lb.service("svc").expect("svc");
    let entries = svc.table.as_ref().expect("a stick table").entries(10);
    assert_eq!(entries.len(), 1, "{entries:?}");
    entries[0].expires_in
}

/// `source_expire` shortened by a reload that keeps the table (same size and
/// expire) applies to the entry already learned at once (before: the old lifetime
/// stayed in force until restart), and lengthened again, too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_applies_a_new_source_lifetime() {
    let a = Backend::echo("a", true).await;
    let config = |source_expire: &str| {
        one_service(
            &format!("    mode: tcp\n    stick: {{ on: [source], expire: 2h, source_expire: {source_expire} }}\n"),
            &[backend_line("a", a.addr, "")],
        )
    };
    let lb = Crossbar::start(&config("1h")).await;
    let (name, _held) = who(lb.addr("svc")).await;
    assert_eq!(name, "a");
    let table = lb.service("svc").unwrap().table.clone().unwrap();
    assert!(only_entry_expires_in(&lb) > Duration::from_secs(50 * 60));

    lb.reload(&config("10s")).await;
    let kept = lb.service("svc").unwrap().table.clone().unwrap();
    assert!(std::sync::Arc::ptr_eq(&table, &kept), "the table is kept");
    let left = only_entry_expires_in(&lb);
    assert!(
        left <= Duration::from_secs(10),
        "expires in {left:?} after the reload"
    );

    lb.reload(&config("3h")).await;
    let left = only_entry_expires_in(&lb);
    assert!(
        left > Duration::from_secs(2 * 3600),
        "expires in {left:?} after the second reload"
    );
}

/// A reload that adds one backend and removes another, under continuous load through
/// the library API: zero failed connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_under_load_refuses_nothing() {
    let (a, b, c) = (
        Backend::echo("a", false).await,
        Backend::echo("b", false).await,
        Backend::echo("c", false).await,
    );
    let yaml = |x: &Backend, y: &Backend| {
        one_service(
            "    mode: tcp\n",
            &[
                backend_line(&x.name, x.addr, ""),
                backend_line(&y.name, y.addr, ""),
            ],
        )
    };
    let lb = Crossbar::start(&yaml(&a, &b)).await;
    let addr = lb.addr("svc");
    let load = load(addr, 4);
    for i in 0..6 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        if i % 2 == 0 {
            lb.reload(&yaml(&a, &c)).await;
        } else {
            lb.reload(&yaml(&a, &b)).await;
        }
        assert_eq!(lb.addr("svc"), addr, "the listener kept its socket");
    }
    let (ok, failed) = load.finish().await;
    println!(
        "reload under load: {ok} round trips, {} failed",
        failed.len()
    );
    assert!(failed.is_empty(), "{failed:?}");
    assert!(c.accepted() > 0, "the added backend took traffic");
}
