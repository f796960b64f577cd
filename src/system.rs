//! The process's place in the system: file-descriptor limits and systemd readiness.
use std::io;

/// Socket descriptors per relayed connection: the client's and the backend's (splice
/// pipes come on top, see [`fd_budget`]).
const SOCKETS_PER_CONNECTION: u64 = 2;
/// Descriptors kept for listeners, the admin server, health checks, logs and state files.
const FD_RESERVE: u64 = 256;

/// Descriptors crossbar may need with `max_connections` relayed at once on `workers`
/// runtime threads: two sockets and up to two splice pipes per connection, the
/// pipes each worker keeps pooled, and a reserve.
pub fn fd_budget(max_connections: u64, workers: u64) -> u64 {
    let (per_conn, per_worker) = crate::relay::pipe_fds();
    max_connections
        .saturating_mul(SOCKETS_PER_CONNECTION + per_conn)
        .saturating_add(workers.saturating_mul(per_worker))
        .saturating_add(FD_RESERVE)
}

/// Raise RLIMIT_NOFILE's soft limit to the hard limit and return the new soft limit.
/// Warns when `max_connections` (the sum over listeners) can't be reached with it
/// (see [`fd_budget`]; the worker count is the current runtime's); `drivers` names
/// the listeners' settings behind the sum, for the warning.
pub fn raise_nofile(max_connections: u64, drivers: &str) -> io::Result<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read/write the struct we pass; no aliasing.
    #[allow(unsafe_code)]
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return Err(io::Error::last_os_error());
        }
        if lim.rlim_cur < lim.rlim_max {
            let wanted = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &wanted) == 0 {
                lim.rlim_cur = lim.rlim_max;
            }
        }
    }
    #[allow(clippy::unnecessary_cast)] // rlim_t is not u64 on every platform
    let soft = lim.rlim_cur as u64;
    let workers = tokio::runtime::Handle::try_current()
        .map(|h| h.metrics().num_workers() as u64)
        .unwrap_or(1);
    let needed = fd_budget(max_connections, workers);
    if needed > soft {
        let (per_conn, per_worker) = crate::relay::pipe_fds();
        tracing::warn!(
            limit = soft,
            needed,
            "open-file limit {soft} is below the {needed} descriptors the listeners' \
             `max_connections` can need ({drivers}: {max_connections} connections x {} \
             + {workers} workers x {per_worker} pooled pipe ends + {FD_RESERVE} reserve): \
             raise LimitNOFILE (systemd) or `ulimit -n`, or lower `max_connections` \
             (per listener, or `defaults.max_connections`)",
            SOCKETS_PER_CONNECTION + per_conn,
        );
    }
    Ok(soft)
}

/// Tell systemd (Type=notify) about a state change: `READY=1`, `RELOADING=1`,
/// `STOPPING=1`. Does nothing when NOTIFY_SOCKET is not set.
pub fn sd_notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    if let Err(e) = notify_to(&path, state) {
        tracing::warn!("sd_notify({state}) failed: {e}");
    }
}

#[cfg(target_os = "linux")]
fn notify_to(path: &std::ffi::OsStr, state: &str) -> io::Result<()> {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    let bytes = path.as_bytes();
    let addr = match bytes.strip_prefix(b"@") {
        Some(abstract_name) => SocketAddr::from_abstract_name(abstract_name)?,
        None => SocketAddr::from_pathname(std::path::Path::new(path))?,
    };
    let sock = UnixDatagram::unbound()?;
    sock.send_to_addr(state.as_bytes(), &addr)?;
    Ok(())
}

#[cfg(not(target_os = "linux"))]
fn notify_to(_path: &std::ffi::OsStr, _state: &str) -> io::Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fd_budget_counts_splice_pipes() {
        // 10000 connections: 2 sockets + 2 pipes each, 64 pooled pipes on each of 4
        // workers, the reserve.
        let want = if cfg!(target_os = "linux") {
            10_000 * 6 + 4 * 128 + FD_RESERVE
        } else {
            10_000 * 2 + FD_RESERVE
        };
        assert_eq!(fd_budget(10_000, 4), want);
    }

    #[test]
    fn nofile_is_at_least_what_it_was() {
        let soft = raise_nofile(10, "test").unwrap();
        assert!(soft >= 64);
    }

    #[test]
    fn notify_reaches_a_datagram_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let sock = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        notify_to(path.as_os_str(), "READY=1").unwrap();
        let mut buf = [0u8; 64];
        let n = sock.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");
    }
}
