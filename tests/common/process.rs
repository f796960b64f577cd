//! `crossbar run` as a real child process: started from a config file, signalled,
//! and waited for (bounded); killed and reaped on drop like every [`ChildGuard`].
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tokio::net::TcpStream;

use super::tls::ChildGuard;
use super::{wait_until_async, Backend, WAIT};

/// How often a test looks whether a child has exited (a bounded poll: std offers no
/// wait with a timeout).
const EXIT_POLL: Duration = Duration::from_millis(20);

/// Start `crossbar run -c config` (with `--upgrade-socket` if given), logging
/// warnings to `stderr`.
pub fn crossbar_run(config: &Path, upgrade: Option<&Path>, stderr: Stdio) -> ChildGuard {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_crossbar"));
    cmd.arg("run").arg("-c").arg(config);
    if let Some(u) = upgrade {
        cmd.arg("--upgrade-socket").arg(u);
    }
    cmd.env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr);
    ChildGuard(cmd.spawn().expect("spawn crossbar"))
}

/// Run the `crossbar` binary with `args` (a CLI command: no admin address or token
/// from this process's environment) off the runtime's threads; (exit ok, stdout,
/// stderr).
pub async fn crossbar_cli(args: Vec<String>) -> (bool, String, String) {
    let (code, out, err) = crossbar_cli_exit(args).await;
    (code == Some(0), out, err)
}

/// [`crossbar_cli`] with the exit code (`None`: ended by a signal).
pub async fn crossbar_cli_exit(args: Vec<String>) -> (Option<i32>, String, String) {
    tokio::task::spawn_blocking(move || {
        let out = Command::new(env!("CARGO_BIN_EXE_crossbar"))
            .args(&args)
            .env_remove("CROSSBAR_ADMIN")
            .env_remove("CROSSBAR_TOKEN_FILE")
            .output()
            .expect("run crossbar");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    })
    .await
    .expect("the crossbar CLI's thread")
}

impl ChildGuard {
    /// Send the signal `sig` (`TERM`, `HUP`...) with kill(1).
    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.0.id().to_string())
            .status()
            .expect("kill");
        assert!(ok.success(), "kill -{sig} failed");
    }

    /// Wait (bounded by `limit`) for the process to exit; its exit code, `None`
    /// if it still runs (or was killed by a signal).
    pub async fn exited(&mut self, limit: Duration) -> Option<i32> {
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Some(st) = self.0.try_wait().expect("try_wait") {
                return st.code();
            }
            tokio::time::sleep(EXIT_POLL).await;
        }
        None
    }
}

/// A loopback address that was free a moment ago, below the kernel's ephemeral
/// range ([`crossbar::testbed::free_port`]), for a process that binds it itself.
pub fn free_port() -> SocketAddr {
    crossbar::testbed::free_port().expect("a free loopback port")
}

/// Wait (bounded by [`WAIT`]) until `addr` accepts connections.
pub async fn wait_listening(addr: SocketAddr) {
    wait_until_async(&format!("{addr} accepting"), || async move {
        TcpStream::connect(addr).await.is_ok()
    })
    .await;
}

/// Write `dir/crossbar.yaml`: a `mode: tcp` service `svc` on `listen` (with `extra`
/// settings) in front of the backend `echo` at `backend`, no health checks, no
/// admin endpoint ([`enable_admin`] adds one), a 10 s shutdown; its path.
pub fn tcp_config(dir: &Path, listen: SocketAddr, backend: SocketAddr, extra: &str) -> PathBuf {
    let yaml = format!(
        "admin: {{ enabled: false }}\n\
         defaults: {{ timeouts: {{ shutdown: 10s }} }}\n\
         services:\n  svc:\n    listen: [\"{listen}\"]\n    mode: tcp\n    health: {{ check: none }}\n{extra}\
         \x20   backends:\n      - {{ name: echo, address: \"{backend}\" }}\n"
    );
    let path = dir.join("crossbar.yaml");
    std::fs::write(&path, yaml).unwrap();
    path
}

/// An echo backend behind a [`tcp_config`] service (with `extra` settings) on a
/// free port, its config file in a temp dir: `(backend, dir, listen, config)`.
pub async fn echo_service(extra: &str) -> (Backend, tempfile::TempDir, SocketAddr, PathBuf) {
    let echo = Backend::echo("echo", false).await;
    let dir = tempfile::tempdir().unwrap();
    let listen = free_port();
    let cfg = tcp_config(dir.path(), listen, echo.addr, extra);
    (echo, dir, listen, cfg)
}

/// Turn on the admin endpoint of a [`tcp_config`] file, on a free port: its address.
pub fn enable_admin(cfg: &Path) -> SocketAddr {
    let admin = free_port();
    let yaml = std::fs::read_to_string(cfg).unwrap().replace(
        "admin: { enabled: false }",
        &format!("admin: {{ listen: \"{admin}\" }}"),
    );
    std::fs::write(cfg, yaml).unwrap();
    admin
}

/// `crossbar run` on `cfg`, once it accepts connections on `listen`.
pub async fn serving(cfg: &Path, upgrade: Option<&Path>, listen: SocketAddr) -> ChildGuard {
    let p = crossbar_run(cfg, upgrade, Stdio::inherit());
    wait_listening(listen).await;
    p
}

/// `crossbar run` on `cfg`, its stderr in a file in `dir`, once `listen` and `admin`
/// accept connections; the process and the file's path.
pub async fn run_logged(
    cfg: &Path,
    dir: &Path,
    listen: SocketAddr,
    admin: SocketAddr,
) -> (ChildGuard, PathBuf) {
    let log_path = dir.join("stderr.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let p = crossbar_run(cfg, None, Stdio::from(log));
    wait_listening(listen).await;
    wait_listening(admin).await;
    (p, log_path)
}

/// SIGTERM, then the process must exit 0 (within [`WAIT`]).
pub async fn terminate(mut p: ChildGuard) {
    p.signal("TERM");
    assert_eq!(p.exited(WAIT).await, Some(0), "exit status after SIGTERM");
}
