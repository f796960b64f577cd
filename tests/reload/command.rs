//! The unit's reload path without systemd: a real `crossbar run` with NOTIFY_SOCKET
//! on a datagram socket this test creates, and `crossbar reload -c FILE` (the unit's
//! ExecReload). A bad file fails the command, sends nothing to the running process
//! and leaves the old config serving; a good one is live when the command returns,
//! with RELOADING=1 ... READY=1 sent in between.
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use crate::common::snapshot::Snapshot;
use crate::common::*;
use crate::{crossbar, text};

/// The systemd side of sd_notify: a datagram socket in a temporary directory.
struct Notify(UnixDatagram);

impl Notify {
    fn bind(dir: &Path) -> Notify {
        let sock = UnixDatagram::bind(dir.join("notify")).expect("bind the notify socket");
        sock.set_read_timeout(Some(WAIT)).unwrap();
        Notify(sock)
    }

    /// The next message; fails the test if none comes within [`WAIT`].
    fn next(&self) -> String {
        let mut buf = [0u8; 512];
        let n = self.0.recv(&mut buf).expect("an sd_notify message in time");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    /// Messages already queued, without waiting.
    fn pending(&self) -> Vec<String> {
        self.0.set_nonblocking(true).unwrap();
        let mut out = Vec::new();
        let mut buf = [0u8; 512];
        while let Ok(n) = self.0.recv(&mut buf) {
            out.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
        self.0.set_nonblocking(false).unwrap();
        out
    }
}

fn config(listen: std::net::SocketAddr, admin: std::net::SocketAddr, backend: &Backend) -> String {
    format!(
        "admin: {{ listen: \"{admin}\" }}\nservices:\n  s:\n    mode: tcp\n    listen: [\"{listen}\"]\n    \
         health: {{ check: none }}\n    backends:\n      - {{ name: {}, address: \"{}\" }}\n",
        backend.name, backend.addr
    )
}

/// `crossbar reload -c file`, to the end.
fn reload(file: &Path) -> Output {
    crossbar(&["reload", "-c", file.to_str().expect("a UTF-8 path")])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_file_fails_the_reload_command_and_the_old_config_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("crossbar.yaml");
    let notify = Notify::bind(dir.path());
    let (a, b) = (
        Backend::echo("a", true).await,
        Backend::echo("b", true).await,
    );
    let (listen, admin) = (free_port(), free_port());
    std::fs::write(&file, config(listen, admin, &a)).unwrap();
    let _proc = ChildGuard(
        Command::new(env!("CARGO_BIN_EXE_crossbar"))
            .arg("run")
            .arg("-c")
            .arg(&file)
            .env("NOTIFY_SOCKET", dir.path().join("notify"))
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn crossbar"),
    );
    assert_eq!(notify.next(), "READY=1");
    assert_eq!(who(listen).await.0, "a");
    let before = Snapshot::settled(admin, &[], 0).await;

    // A bad file: the command fails with the diagnostics and sends nothing.
    std::fs::write(
        &file,
        config(listen, admin, &b).replace("mode: tcp", "mode: tcp\n    bogus: 1"),
    )
    .unwrap();
    let out = reload(&file);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(
        stderr,
        format!(
            "{f}:5:5: services.s.bogus: unknown key `bogus`; allowed here: listen, mode, on_non_tls, server_names, names, default, balance, failback, stick, timeouts, keepalive, health, max_hello_size, retries, queue_size, slow_start, relay, on_marked_down, source, backends, discover, feedback\n\
             reload refused: {f} has errors; the running configuration stays\n",
            f = file.display()
        )
    );
    assert_eq!(
        notify.pending(),
        Vec::<String>::new(),
        "nothing reached the server"
    );
    before.assert_same(&Snapshot::take(admin, &[]).await, "a bad file");
    assert_eq!(who(listen).await.0, "a", "the old config keeps serving");
    let before = Snapshot::settled(admin, &[], 0).await;

    // A file that checks but can't be applied (its new listener's port is taken):
    // the server refuses it, the command fails with the server's reason.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let extra = taken.local_addr().unwrap();
    std::fs::write(
        &file,
        config(listen, admin, &b).replace(
            &format!("listen: [\"{listen}\"]"),
            &format!("listen: [\"{listen}\", \"{extra}\"]"),
        ),
    )
    .unwrap();
    let out = reload(&file);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.starts_with("error: 422")
            && stderr.contains(&format!("cannot listen on {extra}"))
            && stderr.contains("keeping the running configuration"),
        "{stderr}"
    );
    assert_eq!(notify.pending(), ["RELOADING=1", "READY=1"]);
    // Not only the routing: backend `b` of the refused file left no trace.
    before.assert_same(&Snapshot::take(admin, &[]).await, "an address in use");
    assert_eq!(who(listen).await.0, "a", "the old config keeps serving");
    drop(taken);

    // A good file: live when the command returns.
    std::fs::write(&file, config(listen, admin, &b)).unwrap();
    let out = reload(&file);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "reloaded\n");
    assert_eq!(notify.pending(), ["RELOADING=1", "READY=1"]);
    assert_eq!(who(listen).await.0, "b", "the new config serves");
}
