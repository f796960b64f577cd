//! `crossbar run` as a real child process: started from a config file, signalled,
//! and waited for (bounded); killed and reaped on drop like every [`ChildGuard`].
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::tls::ChildGuard;

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
    tokio::task::spawn_blocking(move || {
        let out = Command::new(env!("CARGO_BIN_EXE_crossbar"))
            .args(&args)
            .env_remove("CROSSBAR_ADMIN")
            .env_remove("CROSSBAR_TOKEN_FILE")
            .output()
            .expect("run crossbar");
        (
            out.status.success(),
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
