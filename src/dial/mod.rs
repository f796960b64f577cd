//! Dialing a backend: the one way crossbar opens a TCP connection to a backend, for
//! client connections, health checks and the ticket-key learner alike, and what it
//! is sent before its first relayed byte.
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use socket2::{Domain, Protocol, Socket, Type};
use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::TcpStream;

use crate::config::{BackendAddress, ProxyProtocol};

pub mod tls;

/// Connect to a backend address within `timeout`, from the local address `source`
/// if given (`source:`; the port is the system's); host names are resolved now, so
/// DNS changes are picked up, and each resolved address is tried in turn.
pub async fn connect_to(
    addr: &BackendAddress,
    timeout: Duration,
    source: Option<IpAddr>,
) -> io::Result<TcpStream> {
    let attempt = async {
        let stream = match addr.as_socket_addr() {
            Some(sa) => connect_addr(sa, source).await?,
            None => {
                let mut last = io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("{} resolves to no address", addr.host),
                );
                let mut found = None;
                for sa in tokio::net::lookup_host((addr.host.as_str(), addr.port)).await? {
                    match connect_addr(sa, source).await {
                        Ok(s) => {
                            found = Some(s);
                            break;
                        }
                        Err(e) => last = e,
                    }
                }
                found.ok_or(last)?
            }
        };
        stream.set_nodelay(true)?;
        Ok(stream)
    };
    tokio::time::timeout(timeout, attempt).await.map_err(|_| {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!("no answer within {timeout:?}"),
        )
    })?
}

/// Open a TCP connection to `sa`: a non-blocking socket, connect(2), and the
/// readiness epoll reports once the handshake is over. A connect that succeeded
/// shows writable and nothing else; one that failed shows an error or a hang-up,
/// and only then is `SO_ERROR` read, to say why. (`TcpStream::connect` reads
/// `SO_ERROR` after every connect: one system call per connection that HAProxy,
/// nginx and this don't make.)
async fn connect_addr(sa: SocketAddr, source: Option<IpAddr>) -> io::Result<TcpStream> {
    #[cfg(target_os = "linux")]
    let socket = Socket::new(
        Domain::for_address(sa),
        Type::STREAM.nonblocking(),
        Some(Protocol::TCP),
    )?;
    #[cfg(not(target_os = "linux"))]
    let socket = {
        let s = Socket::new(Domain::for_address(sa), Type::STREAM, Some(Protocol::TCP))?;
        s.set_nonblocking(true)?;
        s
    };
    if let Some(ip) = source {
        bind_source(&socket, ip, sa)?;
    }
    match socket.connect(&sa.into()) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(e) => return Err(e),
    }
    let stream = TcpStream::from_std(socket.into())?;
    let ready = stream.ready(Interest::WRITABLE | Interest::ERROR).await?;
    if ready.is_error() || ready.is_write_closed() {
        return Err(stream.take_error()?.unwrap_or_else(|| {
            io::Error::new(io::ErrorKind::NotConnected, "closed while connecting")
        }));
    }
    Ok(stream)
}

/// Bind `socket` to the local address `ip` (any port) before connecting to `to`:
/// `source:`, the address backends see connections come from (a firewall or a
/// backend's allow list names it). Of another family than `to`, it cannot be.
fn bind_source(socket: &Socket, ip: IpAddr, to: SocketAddr) -> io::Result<()> {
    if ip.is_ipv4() != to.is_ipv4() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("source {ip} is not of the address family of {to}"),
        ));
    }
    // The port is chosen at connect, per destination: binding port 0 would take
    // one for good and run out at 28,000 connections from one source address.
    #[cfg(target_os = "linux")]
    nix::sys::socket::setsockopt(
        socket,
        nix::sys::socket::sockopt::IpBindAddressNoPort,
        &true,
    )
    .map_err(io::Error::from)?;
    socket
        .bind(&SocketAddr::new(ip, 0).into())
        .map_err(|e| io::Error::new(e.kind(), format!("binding the source address {ip}: {e}")))
}

/// Connect for a connection of crossbar's own (health checks, the ticket-key
/// probe): [`connect_to`], then a PROXY `LOCAL` header if the backend expects PROXY
/// protocol, so it doesn't reject the connection.
pub async fn connect_own(
    addr: &BackendAddress,
    timeout: Duration,
    proxy: Option<ProxyProtocol>,
) -> io::Result<TcpStream> {
    let mut tcp = connect_to(addr, timeout, None).await?;
    if let Some(v) = proxy {
        tcp.write_all(&crate::proxy_protocol::local(v)).await?;
    }
    Ok(tcp)
}

/// The addresses (local, remote) of crossbar's own open connections to backends:
/// a connection that arrives from one of them is crossbar talking to itself (a
/// backend that is its own listener) and is refused at once, so that one client
/// connection can't become a cascade of them. Both ends are compared: the kernel
/// gives the same local port to connections towards different hosts, so a
/// client's address alone may equal one of ours. One per running server; an entry
/// lives as long as its [`OwnSocket`].
#[derive(Debug, Default)]
pub struct OwnSockets {
    open: dashmap::DashSet<(SocketAddr, SocketAddr)>,
}

impl OwnSockets {
    /// Note `stream`'s two ends until the returned guard is dropped (`None` when
    /// the socket has no address any more: it is closing anyway).
    pub fn hold(self: &std::sync::Arc<Self>, stream: &TcpStream) -> Option<OwnSocket> {
        let ends = (
            canonical(stream.local_addr().ok()?),
            canonical(stream.peer_addr().ok()?),
        );
        self.open.insert(ends);
        Some(OwnSocket {
            owner: self.clone(),
            ends,
        })
    }

    /// A connection from `peer` accepted at `local` is one of our own open backend
    /// connections.
    pub fn is_ours(&self, peer: SocketAddr, local: SocketAddr) -> bool {
        self.open.contains(&(canonical(peer), canonical(local)))
    }
}

/// `a` with an IPv4-mapped IPv6 address as plain IPv4 (as a dual-stack listener
/// sees an IPv4 peer).
fn canonical(a: SocketAddr) -> SocketAddr {
    SocketAddr::new(a.ip().to_canonical(), a.port())
}

/// One open backend connection's entry in [`OwnSockets`], removed on drop.
#[derive(Debug)]
pub struct OwnSocket {
    owner: std::sync::Arc<OwnSockets>,
    ends: (SocketAddr, SocketAddr),
}

impl Drop for OwnSocket {
    fn drop(&mut self) {
        self.owner.open.remove(&self.ends);
    }
}

/// Write what goes to a backend before the relay: the PROXY header (if `proxy`
/// names a version) and the bytes read while looking at the hello.
pub async fn send_prelude(
    server: &mut TcpStream,
    client: &TcpStream,
    peer: SocketAddr,
    proxy: Option<ProxyProtocol>,
    sni: Option<&str>,
    buf: &[u8],
) -> io::Result<()> {
    if let Some(v) = proxy {
        let local = client.local_addr().unwrap_or(peer);
        let header = crate::proxy_protocol::header(v, peer, local, sni);
        server.write_all(&header).await?;
    }
    if !buf.is_empty() {
        server.write_all(buf).await?;
    }
    Ok(())
}
