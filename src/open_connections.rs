//! The registry of open connections, per service, for `GET /api/connections` and
//! `crossbar connections` (HAProxy's `show sess`): client, backend, age, bytes.
//!
//! A connection is listed once its backend is chosen (one insert) and unlisted
//! when its guard drops (one remove). An operator may close one, or all of a
//! backend's (`crossbar connections kill`, `crossbar backend shutdown-sessions`,
//! `on_marked_down: shutdown-sessions`): both of its sockets are shut down, so its
//! relay sees both ends close and finishes as usual, and the client sees its
//! connection close. The list is a [`DashMap`] per service,
//! keyed by the address of the connection's entry (unique while it is listed),
//! so connections of one service touch one of its shards each, never a
//! process-wide lock or counter. The bytes are the relay's own per-connection
//! totals ([`ConnBytes`]): nothing more is counted per byte.
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Instant, SystemTime};

use dashmap::DashMap;

use crate::relay::ConnBytes;

/// The next connection id (process-wide, never reused: an id an operator read
/// names that connection or none).
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// One open connection, as the admin API shows it.
#[derive(Debug)]
pub struct OpenConn {
    /// Its id, for `crossbar connections kill ID`.
    pub id: u64,
    /// The client's address (after a PROXY header, the one it carried).
    pub client: SocketAddr,
    /// The backend it is relayed to.
    pub backend: Arc<str>,
    /// When it was accepted.
    pub started: Instant,
    /// Bytes each way so far, the replayed ClientHello included.
    pub bytes: ConnBytes,
    /// The backend's side of the TLS handshake has been seen (always true in tcp
    /// mode, where there is no handshake to watch).
    handshaken: AtomicBool,
    /// The client's and the backend's sockets while the connection owns them;
    /// taken (under the lock) before they are closed, so a kill never shuts down a
    /// descriptor number reused by another socket.
    sockets: Mutex<Option<(RawFd, RawFd)>>,
    /// An operator (or `on_marked_down`) closed it.
    killed: AtomicBool,
}

impl OpenConn {
    /// Close the connection: shut down both of its sockets (its relay then sees
    /// both ends close and ends, the client sees its connection close). False when
    /// it is closing already, or was killed before (a second kill in the few
    /// milliseconds before its relay ends reports nothing).
    pub fn kill(&self) -> bool {
        let sockets = self.sockets.lock().unwrap_or_else(PoisonError::into_inner);
        let Some((client, server)) = *sockets else {
            return false;
        };
        if self.killed.swap(true, Ordering::Relaxed) {
            return false;
        }
        for fd in [client, server] {
            // Fails only on a socket closed already by its peer: nothing to do then.
            let _ = nix::sys::socket::shutdown(fd, nix::sys::socket::Shutdown::Both);
            // ok: see above
        }
        true
    }

    /// It was closed by [`OpenConn::kill`].
    pub fn was_killed(&self) -> bool {
        self.killed.load(Ordering::Relaxed)
    }

    /// The connection is about to close its sockets: no kill touches them from now.
    pub fn release_sockets(&self) {
        *self.sockets.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// The server's handshake went by: the connection now only relays.
    pub fn handshake_seen(&self) {
        self.handshaken.store(true, Ordering::Relaxed);
    }

    /// `handshake` until the backend's handshake went by (tls mode), then `relaying`.
    pub fn state(&self) -> &'static str {
        if self.handshaken.load(Ordering::Relaxed) {
            "relaying"
        } else {
            "handshake"
        }
    }
}

/// The open connections of one service. Handed over by a reload to the
/// same-named service, so connections accepted before it stay listed.
#[derive(Debug, Default)]
pub struct OpenConnections {
    map: DashMap<usize, Arc<OpenConn>>,
}

/// What a new entry starts with.
#[derive(Debug, Clone, Copy)]
pub struct Opening<'a> {
    /// The client's address.
    pub client: SocketAddr,
    /// The backend's name.
    pub backend: &'a Arc<str>,
    /// When the connection was accepted.
    pub started: Instant,
    /// Bytes already sent each way before the relay (the replayed hello; answer
    /// bytes read while confirming the placement).
    pub sent: (u64, u64),
    /// The connection is TLS and its server handshake is still to come.
    pub tls: bool,
    /// The client's and the backend's sockets (for a kill), if it may be killed.
    pub sockets: Option<(RawFd, RawFd)>,
}

impl<'a> Opening<'a> {
    /// `sent` is (client -> server bytes, server -> client bytes, tls).
    pub fn new(
        client: SocketAddr,
        backend: &'a Arc<str>,
        started: Instant,
        (c2s, s2c, tls): (u64, u64, bool),
    ) -> Opening<'a> {
        Opening {
            client,
            backend,
            started,
            sent: (c2s, s2c),
            tls,
            sockets: None,
        }
    }

    /// With the two sockets a kill shuts down.
    pub fn with_sockets(self, client: RawFd, server: RawFd) -> Opening<'a> {
        Opening {
            sockets: Some((client, server)),
            ..self
        }
    }
}

impl OpenConnections {
    /// List a connection until the returned guard drops.
    pub fn open(&self, o: Opening<'_>) -> Listed<'_> {
        let conn = Arc::new(OpenConn {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            client: o.client,
            backend: o.backend.clone(),
            started: o.started,
            bytes: ConnBytes {
                c2s: o.sent.0.into(),
                s2c: o.sent.1.into(),
            },
            handshaken: AtomicBool::new(!o.tls),
            sockets: Mutex::new(o.sockets),
            killed: AtomicBool::new(false),
        });
        self.map.insert(id(&conn), conn.clone());
        Listed { list: self, conn }
    }

    /// Connections listed now.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Nothing listed.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Up to `limit` connections that `keep` accepts, oldest first, and how many
    /// it accepted in all. Walks the map one shard read lock at a time: for the
    /// admin API, not for the connection path.
    pub fn oldest(
        &self,
        limit: usize,
        keep: impl Fn(&OpenConn) -> bool,
    ) -> (Vec<Arc<OpenConn>>, usize) {
        // Max-heap on the start time: its top is the youngest kept so far.
        let mut heap = std::collections::BinaryHeap::new();
        let mut matched = 0;
        for item in self.map.iter() {
            let c = item.value();
            if !keep(c) {
                continue;
            }
            matched += 1;
            heap.push(ByStart(c.clone()));
            if heap.len() > limit {
                heap.pop();
            }
        }
        let list = heap.into_sorted_vec().into_iter().map(|c| c.0).collect();
        (list, matched)
    }
}

impl OpenConnections {
    /// Kill every listed connection `pick` accepts; those killed (a connection
    /// closing already is not).
    pub fn kill(&self, pick: impl Fn(&OpenConn) -> bool) -> Vec<Arc<OpenConn>> {
        // Collected first: a kill takes no map lock while it shuts sockets down.
        let picked: Vec<Arc<OpenConn>> = self
            .map
            .iter()
            .filter(|c| pick(c.value()))
            .map(|c| c.value().clone())
            .collect();
        picked.into_iter().filter(|c| c.kill()).collect()
    }
}

/// A listed connection: unlisted when dropped.
#[derive(Debug)]
pub struct Listed<'a> {
    list: &'a OpenConnections,
    conn: Arc<OpenConn>,
}

impl Listed<'_> {
    /// The entry, for the relay to count into.
    pub fn conn(&self) -> &OpenConn {
        &self.conn
    }
}

impl Drop for Listed<'_> {
    fn drop(&mut self) {
        self.conn.release_sockets();
        self.list.map.remove(&id(&self.conn));
    }
}

/// The map key of an entry: its address, unique while the entry is alive (the
/// guard holds it until after the remove).
fn id(conn: &Arc<OpenConn>) -> usize {
    Arc::as_ptr(conn) as usize
}

/// Orders entries by start time (then address, so equal times stay distinct).
struct ByStart(Arc<OpenConn>);

impl PartialEq for ByStart {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == std::cmp::Ordering::Equal
    }
}

impl Eq for ByStart {}

impl PartialOrd for ByStart {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ByStart {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.0.started, id(&self.0)).cmp(&(other.0.started, id(&other.0)))
    }
}

/// Wall-clock time `started` corresponds to (for the API's `since`).
pub fn wall_clock(started: Instant) -> SystemTime {
    let now = SystemTime::now();
    now.checked_sub(started.elapsed()).unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opening(backend: &Arc<str>, started: Instant, port: u16) -> Opening<'_> {
        Opening {
            client: SocketAddr::from(([127, 0, 0, 1], port)),
            backend,
            started,
            sent: (517, 0),
            tls: true,
            sockets: None,
        }
    }

    #[test]
    fn listed_while_the_guard_lives_oldest_first() {
        let list = OpenConnections::default();
        let b: Arc<str> = Arc::from("b1");
        let t0 = Instant::now();
        let young = list.open(opening(&b, t0 + std::time::Duration::from_secs(2), 2));
        let old = list.open(opening(&b, t0, 1));
        let mid = list.open(opening(&b, t0 + std::time::Duration::from_secs(1), 3));
        assert_eq!(list.len(), 3);
        let (two, all) = list.oldest(2, |_| true);
        assert_eq!(all, 3);
        let ports: Vec<u16> = two.iter().map(|c| c.client.port()).collect();
        assert_eq!(ports, [1, 3]);
        assert_eq!(two[0].bytes.c2s.load(Ordering::Relaxed), 517);
        assert_eq!(two[0].state(), "handshake");
        old.conn().handshake_seen();
        assert_eq!(two[0].state(), "relaying");
        let (only, n) = list.oldest(10, |c| c.client.port() == 2);
        assert_eq!((only.len(), n), (1, 1));
        drop(old);
        drop(mid);
        assert_eq!(list.len(), 1);
        drop(young);
        assert!(list.is_empty());
    }

    /// A connection killed twice before its relay released its sockets (a double
    /// click, two operators, `kill` then `shutdown-sessions`) is reported closed
    /// once: the second kill finds it closing.
    #[test]
    fn a_connection_killed_twice_is_reported_once() {
        use std::os::fd::AsRawFd;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let client = std::net::TcpStream::connect(addr).expect("connect");
        let (server, _) = listener.accept().expect("accept");
        let list = OpenConnections::default();
        let b: Arc<str> = Arc::from("b1");
        let o = opening(&b, Instant::now(), 1).with_sockets(client.as_raw_fd(), server.as_raw_fd());
        let listed = list.open(o);
        assert_eq!(list.kill(|_| true).len(), 1, "the first kill closes it");
        assert_eq!(list.kill(|_| true).len(), 0, "the second finds it closing");
        assert!(listed.conn().was_killed());
        let mut byte = [0u8; 1];
        let read = std::io::Read::read(&mut &client, &mut byte).expect("read after shutdown");
        assert_eq!(read, 0, "the client sees its connection close");
    }
}
