//! Hitless binary upgrade: a running crossbar hands its listening sockets (the
//! services' and the admin endpoint's) to its successor over a unix socket, then
//! drains and exits.
//!
//! This is the only way two crossbar processes ever share an address: sockets are
//! bound without SO_REUSEPORT, so a second `crossbar run` on the same addresses
//! fails at start ("address in use") instead of taking half the connections.
//!
//! With SO_REUSEPORT, connections waiting in the old process's accept queue
//! are reset when it closes its sockets. Handing the sockets themselves over (as
//! HAProxy's `-x` and Envoy's hot restart do) keeps every queued connection: the
//! same kernel socket is now accepted on by the new process.
//!
//! Protocol on `--upgrade-socket PATH` (one exchange per upgrade):
//! new -> old `TAKEOVER 1\n`; old -> new the listen addresses (JSON) with the
//! sockets attached (SCM_RIGHTS); the new process starts with them and sends
//! `READY\n`; the old one removes PATH, answers `BYE\n`, stops accepting and drains
//! like on SIGTERM; the new one then binds PATH for the next upgrade. If the new
//! process fails before READY, the old one keeps running as if nothing happened.
//!
//! Access: the socket is created 0600 in a directory only its owner (crossbar's
//! user or root) can write to, and both sides check the other's SO_PEERCRED: only
//! the same user or root may take the sockets or offer them. Every line read is
//! bounded, every read and write timed out; a peer that says nothing is dropped
//! after [`HELLO_TIMEOUT`], so it delays an upgrade by that much at most.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, IoSlice, IoSliceMut, Read, Write};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::socket::{
    getsockopt, recvmsg, sendmsg, sockopt, ControlMessage, ControlMessageOwned, MsgFlags,
};

use crate::server::Server;

/// How long either side waits for the other's next message once the exchange has
/// begun (the successor starts its services between the sockets and READY).
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the old process waits for a new connection's first line: a successor
/// sends it at once; takeovers are served one at a time, so this is all a silent
/// peer can delay the next one.
const HELLO_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest protocol line (`TAKEOVER 1`, `READY`, `BYE`), newline included.
const MAX_LINE: u64 = 64;
/// Mode of the socket file: only its owner (and root) can connect.
const SOCKET_MODE: u32 = 0o600;
/// Mode of the socket's directory when crossbar creates it.
const DIR_MODE: u32 = 0o700;
/// SCM_RIGHTS carries at most 253 descriptors per message (SCM_MAX_FD).
const MAX_FDS: usize = 253;
/// The address list is small JSON; bound what we accept.
const MAX_MESSAGE: usize = 64 * 1024;
const HELLO: &str = "TAKEOVER 1";

/// Listening sockets received from a predecessor, by configured address.
pub struct Handover {
    stream: UnixStream,
    path: PathBuf,
    /// The sockets, keyed by the address the old configuration listed.
    pub listeners: HashMap<SocketAddr, std::net::TcpListener>,
}

impl Handover {
    /// Tell the predecessor we serve now; wait for it to let go of `path`, then bind
    /// `path` ourselves for the next upgrade.
    pub fn confirm(mut self) -> io::Result<UnixListener> {
        self.stream.write_all(b"READY\n")?;
        let line = read_line(&mut BufReader::new(&self.stream))?;
        if line != "BYE" {
            return Err(io::Error::other(format!("predecessor answered {line:?}")));
        }
        bind(&self.path)
    }
}

/// Try to take the sockets of a crossbar running at `path`. `Ok(None)` when nothing
/// listens there (a fresh start).
pub fn take_over(path: &Path) -> io::Result<Option<Handover>> {
    check_dir(path)?;
    let stream = match UnixStream::connect(path) {
        Ok(s) => s,
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused
            ) =>
        {
            return Ok(None)
        }
        Err(e) => return Err(e),
    };
    // A crossbar answers there: what fails now fails the takeover.
    let from = |e: io::Error| {
        io::Error::new(
            e.kind(),
            format!("taking over from the crossbar at {}: {e}", path.display()),
        )
    };
    receive_handover(stream, path).map(Some).map_err(from)
}

/// The exchange with a predecessor that answered on the upgrade socket.
fn receive_handover(mut stream: UnixStream, path: &Path) -> io::Result<Handover> {
    check_peer(&stream)?;
    stream.set_read_timeout(Some(EXCHANGE_TIMEOUT))?;
    stream.set_write_timeout(Some(EXCHANGE_TIMEOUT))?;
    stream.write_all(format!("{HELLO}\n").as_bytes())?;
    let (payload, fds) = receive(&stream)?;
    let addrs: Vec<SocketAddr> = serde_json::from_slice(&payload).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("bad handover message: {e}"),
        )
    })?;
    if addrs.len() != fds.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "address and socket counts differ",
        ));
    }
    let mut listeners = HashMap::new();
    for (addr, fd) in addrs.into_iter().zip(fds) {
        let sock = std::net::TcpListener::from(fd);
        sock.set_nonblocking(true)?;
        listeners.insert(addr, sock);
    }
    Ok(Handover {
        stream,
        path: path.to_path_buf(),
        listeners,
    })
}

fn receive(stream: &UnixStream) -> io::Result<(Vec<u8>, Vec<OwnedFd>)> {
    let mut buf = vec![0u8; MAX_MESSAGE];
    let mut iov = [IoSliceMut::new(&mut buf)];
    let mut space = nix::cmsg_space!([RawFd; MAX_FDS]);
    let msg = recvmsg::<()>(
        stream.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(io::Error::from)?;
    let mut fds = Vec::new();
    for c in msg.cmsgs().map_err(io::Error::from)? {
        if let ControlMessageOwned::ScmRights(raw) = c {
            // SAFETY: descriptors received with SCM_RIGHTS are fresh fds of this
            // process that nothing else owns.
            fds.extend(
                raw.into_iter()
                    .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
            );
        }
    }
    if msg
        .flags
        .intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC)
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "handover message or its sockets truncated",
        ));
    }
    let n = msg.bytes;
    buf.truncate(n);
    Ok((buf, fds))
}

/// Bind the upgrade socket (mode 0600, in a private directory: see [`check_dir`]),
/// replacing a stale socket nobody listens on.
pub fn bind(path: &Path) -> io::Result<UnixListener> {
    check_dir(path)?;
    let listener = match UnixListener::bind(path) {
        Err(e) if e.kind() == io::ErrorKind::AddrInUse && UnixStream::connect(path).is_err() => {
            if !std::fs::symlink_metadata(path)?.file_type().is_socket() {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{} exists and is not a socket", path.display()),
                ));
            }
            std::fs::remove_file(path)?;
            UnixListener::bind(path)
        }
        other => other,
    }?;
    // The directory admits no one else meanwhile, and peers are checked anyway.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(SOCKET_MODE))?;
    Ok(listener)
}

/// The socket's directory must be private: owned by this user or root and not
/// writable by group or others (else another user could replace the socket). It is
/// created with mode 0700 when missing.
pub fn check_dir(path: &Path) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.exists() {
        std::fs::DirBuilder::new().mode(DIR_MODE).create(dir)?;
    }
    let meta = std::fs::metadata(dir)?;
    let me = euid();
    let owner_ok = meta.uid() == me || meta.uid() == 0;
    if !meta.is_dir() || !owner_ok || meta.mode() & 0o022 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "upgrade socket directory {} must be a directory owned by uid {me} or root and \
                 not writable by group or others (it is uid {}, mode {:o}); use e.g. /run/crossbar",
                dir.display(),
                meta.uid(),
                meta.mode() & 0o7777
            ),
        ));
    }
    Ok(())
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// The peer must run as our user or as root (SO_PEERCRED: for a connecting peer its
/// credentials at connect, for a listener's its credentials at listen).
fn check_peer(stream: &UnixStream) -> io::Result<()> {
    let cred = getsockopt(stream, sockopt::PeerCredentials).map_err(io::Error::from)?;
    peer_allowed(cred.uid(), euid())
        .then_some(())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "upgrade peer runs as uid {} (pid {}): only uid {} or root may take part",
                    cred.uid(),
                    cred.pid(),
                    euid()
                ),
            )
        })
}

/// Same user or root.
fn peer_allowed(peer: u32, me: u32) -> bool {
    peer == me || peer == 0
}

/// One protocol line, without its newline: at most [`MAX_LINE`] bytes, UTF-8.
fn read_line(reader: &mut impl BufRead) -> io::Result<String> {
    let mut line = String::new();
    reader.take(MAX_LINE).read_line(&mut line)?;
    match line.strip_suffix('\n') {
        Some(l) => Ok(l.trim_end_matches('\r').to_string()),
        None if line.len() as u64 >= MAX_LINE => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("line longer than {MAX_LINE} bytes"),
        )),
        None => Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("peer closed mid-line ({line:?})"),
        )),
    }
}

/// Serve takeover requests on `listener`; returns once a successor has confirmed
/// (the caller then drains and exits). Runs on a blocking thread. `extra`: other
/// listening sockets to hand over with the services' (the admin endpoint's), by
/// the address the configuration gives them.
pub fn serve(
    listener: UnixListener,
    path: PathBuf,
    server: Arc<Server>,
    extra: Vec<(SocketAddr, OwnedFd)>,
) {
    for conn in listener.incoming() {
        let stream = match conn {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("upgrade: accept failed: {e}");
                std::thread::sleep(ACCEPT_BACKOFF);
                continue;
            }
        };
        match hand_over(&stream, &server, &extra) {
            Ok(()) => {
                let _ = std::fs::remove_file(&path); // ok: the successor binds it anew
                if let Err(e) = (&stream).write_all(b"BYE\n") {
                    tracing::warn!("upgrade: successor vanished after READY: {e}");
                }
                tracing::info!("upgrade: sockets handed over; draining");
                return;
            }
            Err(e) => tracing::warn!("upgrade: handover aborted, still serving: {e}"),
        }
    }
}

/// Pause after a failed accept on the upgrade socket (EMFILE...).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

fn hand_over(
    stream: &UnixStream,
    server: &Server,
    extra: &[(SocketAddr, OwnedFd)],
) -> io::Result<()> {
    check_peer(stream)?;
    stream.set_read_timeout(Some(HELLO_TIMEOUT))?;
    stream.set_write_timeout(Some(EXCHANGE_TIMEOUT))?;
    let mut reader = BufReader::new(stream);
    let line = read_line(&mut reader)?;
    stream.set_read_timeout(Some(EXCHANGE_TIMEOUT))?;
    if line != HELLO {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("unexpected request {line:?}"),
        ));
    }
    let mut socks = server.listen_sockets();
    for (addr, fd) in extra {
        socks.push((*addr, fd.try_clone()?));
    }
    let addrs: Vec<SocketAddr> = socks.iter().map(|(a, _)| *a).collect();
    let payload = serde_json::to_vec(&addrs).map_err(io::Error::other)?;
    let fds: Vec<RawFd> = socks.iter().map(|(_, fd)| fd.as_raw_fd()).collect();
    sendmsg::<()>(
        stream.as_raw_fd(),
        &[IoSlice::new(&payload)],
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::empty(),
        None,
    )
    .map_err(io::Error::from)?;
    tracing::info!(
        sockets = fds.len(),
        "upgrade: successor took the listening sockets; waiting for READY"
    );
    let line = read_line(&mut reader)?;
    if line != "READY" {
        return Err(io::Error::other(format!(
            "successor did not confirm (said {line:?})"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_bounded() {
        let mut ok = io::Cursor::new(b"READY\r\nrest".to_vec());
        assert_eq!(read_line(&mut ok).unwrap(), "READY");
        let long = vec![b'x'; 1 << 20];
        let err = read_line(&mut io::Cursor::new(long)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
        let cut = read_line(&mut io::Cursor::new(b"TAKE".to_vec())).unwrap_err();
        assert_eq!(cut.kind(), io::ErrorKind::UnexpectedEof, "{cut}");
    }

    #[test]
    fn only_the_same_user_or_root() {
        assert!(peer_allowed(1000, 1000));
        assert!(peer_allowed(0, 1000));
        assert!(!peer_allowed(1001, 1000));
        assert!(!peer_allowed(1000, 0));
        // A real peer: this process, so allowed.
        let (a, _b) = UnixStream::pair().unwrap();
        check_peer(&a).unwrap();
    }

    #[test]
    fn the_socket_is_private() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run/upgrade.sock");
        let _l = bind(&path).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().mode() & 0o777;
        assert_eq!(mode(&path), SOCKET_MODE);
        assert_eq!(mode(path.parent().unwrap()), DIR_MODE);
        // A directory others can write to is refused, for binding and connecting.
        let open = dir.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = bind(&open.join("u.sock")).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "{err}");
        assert!(take_over(&open.join("u.sock")).is_err());
        // A file that is not a socket is never removed to make room.
        let plain = dir.path().join("run/not-a-socket");
        std::fs::write(&plain, "data").unwrap();
        assert!(bind(&plain).is_err());
        assert_eq!(std::fs::read_to_string(&plain).unwrap(), "data");
    }
}
