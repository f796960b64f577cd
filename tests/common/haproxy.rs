//! Debian's HAProxy as a real peer in mode tcp: started from its frontend and
//! backend sections, killed and reaped on drop (a [`ChildGuard`]).
use std::net::SocketAddr;
use std::process::{Command, Stdio};

use super::tls::ChildGuard;
use super::wait_until;

/// A running HAProxy and the directory holding its configuration.
pub struct Haproxy {
    _child: ChildGuard,
    _dir: tempfile::TempDir,
}

/// Start HAProxy (mode tcp) with `proxies`, its frontend and backend sections, whose
/// frontend binds `front`; returns once `front` accepts. Without haproxy, `test`
/// fails (tests/run.sh installs it).
pub async fn start(test: &str, front: SocketAddr, proxies: &str) -> Haproxy {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("haproxy.cfg");
    std::fs::write(
        &cfg,
        format!(
            "global\n  maxconn 1000\ndefaults\n  mode tcp\n  timeout connect 5s\n  timeout client 60s\n  timeout server 60s\n{proxies}"
        ),
    )
    .unwrap();
    let child = match Command::new("haproxy")
        .arg("-db")
        .arg("-f")
        .arg(&cfg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
    {
        Ok(c) => ChildGuard(c),
        Err(e) => crossbar::testbed::missing_tool(
            test,
            &format!("haproxy does not run ({e}): apt-get install haproxy"),
        ),
    };
    wait_until("haproxy listening", || {
        std::net::TcpStream::connect(front).is_ok()
    })
    .await;
    Haproxy {
        _child: child,
        _dir: dir,
    }
}
