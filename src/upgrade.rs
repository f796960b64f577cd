//! Hitless binary upgrade: a running crossbar hands its listening sockets to its
//! successor over a unix socket, then drains and exits.
//!
//! With SO_REUSEPORT alone, connections waiting in the old process's accept queue
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
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, IoSlice, IoSliceMut, Write};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};

use crate::server::Server;

/// How long either side waits for the other's next message.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(30);
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
        let mut line = String::new();
        BufReader::new(&self.stream).read_line(&mut line)?;
        if line.trim() != "BYE" {
            return Err(io::Error::other(format!("predecessor answered {line:?}")));
        }
        bind(&self.path)
    }
}

/// Try to take the sockets of a crossbar running at `path`. `Ok(None)` when nothing
/// listens there (a fresh start).
pub fn take_over(path: &Path) -> io::Result<Option<Handover>> {
    let mut stream = match UnixStream::connect(path) {
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
    stream.set_read_timeout(Some(EXCHANGE_TIMEOUT))?;
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
    Ok(Some(Handover {
        stream,
        path: path.to_path_buf(),
        listeners,
    }))
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
    let n = msg.bytes;
    buf.truncate(n);
    Ok((buf, fds))
}

/// Bind the upgrade socket, replacing a stale file nobody listens on.
pub fn bind(path: &Path) -> io::Result<UnixListener> {
    match UnixListener::bind(path) {
        Err(e) if e.kind() == io::ErrorKind::AddrInUse && UnixStream::connect(path).is_err() => {
            std::fs::remove_file(path)?;
            UnixListener::bind(path)
        }
        other => other,
    }
}

/// Serve takeover requests on `listener`; returns once a successor has confirmed
/// (the caller then drains and exits). Runs on a blocking thread.
pub fn serve(listener: UnixListener, path: PathBuf, server: Arc<Server>) {
    for conn in listener.incoming() {
        let Ok(stream) = conn else { continue };
        match hand_over(&stream, &server) {
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

fn hand_over(stream: &UnixStream, server: &Server) -> io::Result<()> {
    stream.set_read_timeout(Some(EXCHANGE_TIMEOUT))?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    if line.trim() != HELLO {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("unexpected request {line:?}"),
        ));
    }
    let socks = server.listen_sockets();
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
    line.clear();
    reader.read_line(&mut line)?;
    if line.trim() != "READY" {
        return Err(io::Error::other(format!(
            "successor did not confirm (said {line:?})"
        )));
    }
    Ok(())
}
