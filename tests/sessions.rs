//! Closing open connections, HAProxy's runtime commands: one by id or by client
//! (`crossbar connections kill`), all of a backend's (`crossbar backend
//! shutdown-sessions`), and on its health checks marking it down
//! (`on_marked_down: shutdown-sessions`); and `source:`, the local address
//! connections to backends come from. The real binary against a running crossbar,
//! tagged echo backends, clients that see their connection close.
mod common;

use std::net::SocketAddr;

use common::{backend_line, crossbar_cli, who, within, Backend, Crossbar};
use crossbar::admin::view::ConnectionsView;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The CLI against the admin endpoint at `admin`; (ok, stdout, stderr).
async fn cli(admin: SocketAddr, args: &[&str]) -> (bool, String, String) {
    let mut all: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    all.extend(["--admin".into(), format!("http://{admin}")]);
    crossbar_cli(all).await
}

/// The connection is closed by crossbar: a read sees EOF or a reset (bounded).
async fn sees_close(s: &mut TcpStream) {
    let mut b = [0u8; 16];
    let n = within("the connection to close", s.read(&mut b)).await;
    assert!(matches!(n, Ok(0) | Err(_)), "still open: read {n:?}");
}

/// The connection still relays: a byte goes to the echo backend and comes back.
async fn still_relays(s: &mut TcpStream) {
    s.write_all(b"x").await.expect("write");
    let mut b = [0u8; 1];
    within("the echo", s.read_exact(&mut b))
        .await
        .expect("echo");
    assert_eq!(&b, b"x");
}

/// The open connections as the CLI reads them (`--json`).
async fn listed(admin: SocketAddr) -> ConnectionsView {
    let (ok, out, err) = cli(admin, &["connections", "--json"]).await;
    assert!(ok, "{err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// The id of the connection whose client is `s`'s local address.
fn id_of(v: &ConnectionsView, s: &TcpStream) -> u64 {
    let me = s.local_addr().unwrap().to_string();
    v.connections
        .iter()
        .find(|c| c.client == me)
        .unwrap_or_else(|| panic!("{me} not listed: {v:?}"))
        .id
}

/// One connection by id, one by client address, then all of a backend's: each
/// client sees its connection close, the others relay on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_are_killed_from_the_cli_one_or_all_of_a_backends() {
    let (e1, e2) = (
        Backend::echo("e1", true).await,
        Backend::echo("e2", true).await,
    );
    let yaml = format!(
        "admin: {{ enabled: false }}\nservices:\n  svc:\n    listen: [\"127.0.0.1:0\"]\n    mode: tcp\n    health: {{ check: none }}\n    backends:\n{}{}",
        backend_line("e1", e1.addr, ""),
        backend_line("e2", e2.addr, "")
    );
    let lb = Crossbar::start(&yaml).await;
    let admin = lb.serve_admin(None).await;
    let mut on = std::collections::BTreeMap::<String, Vec<TcpStream>>::new();
    for _ in 0..6 {
        let (name, s) = who(lb.addr("svc")).await;
        on.entry(name).or_default().push(s);
    }
    let (mut one, mut two) = (on.remove("e1").unwrap(), on.remove("e2").unwrap());
    assert_eq!((one.len(), two.len()), (3, 3), "round robin");
    let v = listed(admin.addr).await;
    assert_eq!(v.total, 6, "{v:?}");

    // By id.
    let id = id_of(&v, &one[0]);
    let (ok, out, err) = cli(admin.addr, &["connections", "kill", &id.to_string()]).await;
    assert!(ok, "{err}");
    assert!(out.starts_with("closed 1 connection(s)\n"), "{out}");
    sees_close(&mut one[0]).await;
    still_relays(&mut one[1]).await;
    // By client address and port.
    let client = one[1].local_addr().unwrap().to_string();
    let (ok, out, err) = cli(admin.addr, &["connections", "kill", "--client", &client]).await;
    assert!(ok && out.contains(&client), "{out}{err}");
    sees_close(&mut one[1]).await;
    still_relays(&mut one[2]).await;
    // A connection that is not there: 404.
    let (ok, _, err) = cli(admin.addr, &["connections", "kill", &id.to_string()]).await;
    assert!(
        !ok && err.contains("404") && err.contains(&format!("no open connection with id {id}")),
        "{err}"
    );

    // All of a backend's.
    let (ok, out, err) = cli(admin.addr, &["backend", "shutdown-sessions", "svc/e2"]).await;
    assert!(ok, "{err}");
    assert!(out.starts_with("closed 3 connection(s)\n"), "{out}");
    for s in &mut two {
        sees_close(s).await;
    }
    still_relays(&mut one[2]).await;
    assert_eq!(listed(admin.addr).await.total, 1);
}

/// `on_marked_down: shutdown-sessions`: when a backend's checks mark it down, its
/// open connections are closed; a service without it keeps them (the default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_marked_down_loses_its_connections_only_where_asked() {
    let (a, b) = (
        Backend::echo("a", true).await,
        Backend::echo("b", true).await,
    );
    let svc = |name: &str, extra: &str, be: &Backend| {
        format!(
            "  {name}:\n    listen: [\"127.0.0.1:0\"]\n    mode: tcp\n{extra}    health: {{ check: tcp, interval: 100ms, timeout: 1s, fall: 1, rise: 1 }}\n    backends:\n{}",
            backend_line(&be.name, be.addr, "")
        )
    };
    let yaml = format!(
        "admin: {{ enabled: false }}\nservices:\n{}{}",
        svc("cut", "    on_marked_down: shutdown-sessions\n", &a),
        svc("kept", "", &b)
    );
    let lb = Crossbar::start(&yaml).await;
    let (_, mut cut) = who(lb.addr("cut")).await;
    let (_, mut kept) = who(lb.addr("kept")).await;
    // Both backends stop listening: their checks fail, their connections live on.
    a.stop().await;
    b.stop().await;
    sees_close(&mut cut).await;
    common::wait_until("b marked down", || !lb.backend("kept", "b").is_healthy()).await;
    still_relays(&mut kept).await;
}

/// `source:`: connections to backends come from the service's address, or the
/// backend's own; the backend sees it as the peer (any of 127.0.0.0/8 is loopback).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backends_see_the_source_address() {
    let mut addrs = Vec::new();
    for _ in 0..2 {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        addrs.push(l.local_addr().unwrap());
        tokio::spawn(async move {
            while let Ok((mut s, peer)) = l.accept().await {
                tokio::spawn(async move {
                    let _ = s.write_all(format!("{}\n", peer.ip()).as_bytes()).await; // ok: the test reads it
                    let mut sink = Vec::new();
                    let _ = s.read_to_end(&mut sink).await; // ok: until the client goes
                });
            }
        });
    }
    let yaml = format!(
        "admin: {{ enabled: false }}\nservices:\n  svc:\n    listen: [\"127.0.0.1:0\"]\n    mode: tcp\n    source: 127.0.0.2\n    health: {{ check: none }}\n    backends:\n{}{}",
        backend_line("s1", addrs[0], ""),
        backend_line("s2", addrs[1], "source: 127.0.0.3")
    );
    let lb = Crossbar::start(&yaml).await;
    let mut seen = std::collections::BTreeSet::new();
    let mut held = Vec::new();
    for _ in 0..2 {
        let (peer, s) = who(lb.addr("svc")).await;
        seen.insert(peer);
        held.push(s);
    }
    let want: std::collections::BTreeSet<String> =
        ["127.0.0.2".to_string(), "127.0.0.3".to_string()].into();
    assert_eq!(seen, want);
}
