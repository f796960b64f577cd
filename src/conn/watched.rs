//! Steps 5-7: relay both ways while watching the server's handshake, learn stick
//! entries from it once the client has proven enough, and record how the relay
//! ended.
use std::net::IpAddr;
use std::sync::PoisonError;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::error::ConnError;
use crate::access_log::{AccessLog, End};
use crate::balance::Backend;
use crate::hello::{ClientHelloInfo, ServerHandshake, ServerWatcher};
use crate::open_connections::OpenConn;
use crate::relay::{self, ClientHook, RelayCounters, RelayEnd, RelayStats, Watch};
use crate::service::Service;
use crate::stick::LearnWhen;

/// How many bytes of the server's handshake the watcher may look at: a full TLS 1.2
/// flight carries the certificate chain (Puppet's is ~4 KiB; big chains ~16 KiB).
const SERVER_WATCH_LIMIT: usize = 64 * 1024;

/// Steps 5-6: relay both ways until both sides closed; in tls mode the server's
/// handshake is watched on the way and stick entries are learned from it, once the
/// client has proven enough ([`crate::stick::learn_when`]). Answer bytes read while
/// confirming the placement (`pending`) reach the client, and the watcher, first.
/// Returns the relay's outcome and the handshake kind (`full`/`resumed`) if it showed.
pub(super) async fn relay_watched(
    stream: &mut TcpStream,
    server: &mut TcpStream,
    (svc, backend, open): (&Service, &Backend, &OpenConn),
    (hello, ip, pending): (Option<&ClientHelloInfo>, IpAddr, &[u8]),
    hard_stop: &relay::HardStop,
) -> Result<(RelayStats, Option<&'static str>), ConnError> {
    let mut handshake = None;
    let flight = std::sync::Mutex::new(Flight::Waiting);
    let mut watch = hello.map(|h| {
        let seen = &mut handshake;
        let flight = &flight;
        let sticking = svc.sticking();
        Box::new(Watch {
            watcher: ServerWatcher::new(SERVER_WATCH_LIMIT),
            on_handshake: Box::new(move |hs: &ServerHandshake| {
                *seen = handshake_kind(backend, hs);
                open.handshake_seen();
                let Some(s) = svc.sticking() else { return };
                s.learn_handshake(h, hs, &backend.name);
                let mut f = flight.lock().unwrap_or_else(PoisonError::into_inner);
                *f = match crate::stick::learn_when(h, hs) {
                    LearnWhen::Now => {
                        s.learn_source(hs, ip, &backend.name);
                        Flight::Done
                    }
                    LearnWhen::AfterClientFlight => Flight::Held(Box::new(hs.clone())),
                    LearnWhen::Never => Flight::Done,
                };
            }) as Box<dyn FnOnce(&ServerHandshake) + Send + '_>,
            on_client: sticking.map(|_| {
                Box::new(move || {
                    let mut f = flight.lock().unwrap_or_else(PoisonError::into_inner);
                    match std::mem::replace(&mut *f, Flight::Done) {
                        // Bytes before the server's handshake answered nothing.
                        Flight::Waiting => {
                            *f = Flight::Waiting;
                            false
                        }
                        Flight::Held(hs) => {
                            if let Some(s) = svc.sticking() {
                                s.learn_source(&hs, ip, &backend.name);
                            }
                            true
                        }
                        Flight::Done => true,
                    }
                }) as ClientHook<'_>
            }),
        })
    });
    replay_pending(stream, pending, backend, &mut watch).await?;
    let counters = RelayCounters {
        c2s: &backend.metrics.bytes_c2s,
        s2c: &backend.metrics.bytes_s2c,
        conn: &open.bytes,
    };
    let timing = relay::Timing {
        idle: svc.config.timeouts.idle,
        backend_keepalive: svc.config.keepalive.as_ref(),
    };
    let stats = relay::relay_as(
        svc.config.relay,
        stream,
        server,
        timing,
        &counters,
        watch,
        hard_stop,
    )
    .await;
    Ok((stats, handshake))
}

/// Answer bytes read while confirming the placement (`pending`) reach the client
/// first, counted, and pass through the watcher, which may finish on them.
async fn replay_pending(
    stream: &mut TcpStream,
    pending: &[u8],
    backend: &Backend,
    watch: &mut Option<Box<Watch<'_>>>,
) -> Result<(), ConnError> {
    if pending.is_empty() {
        return Ok(());
    }
    stream
        .write_all(pending)
        .await
        .map_err(|_| ConnError::ClientGone)?;
    backend.metrics.bytes_s2c.inc_by(pending.len() as u64);
    if let Some(w) = watch.as_mut() {
        if w.watcher.feed(pending) && w.on_client.is_some() {
            // Done; the relay still runs `on_client` (the done watcher passes
            // the server's next bytes straight to a no-op).
            let on_handshake = std::mem::replace(&mut w.on_handshake, Box::new(|_| {}));
            on_handshake(w.watcher.info());
        } else if w.watcher.is_done() {
            if let Some(w) = watch.take() {
                (w.on_handshake)(w.watcher.info());
            }
        }
    }
    Ok(())
}

/// Where a connection is in proving its handshake ([`crate::stick::learn_when`]):
/// what it teaches of the client's address waits for the client's next flight.
enum Flight {
    /// The server's handshake not seen yet: client bytes now answer nothing.
    Waiting,
    /// The server's handshake, held until the client sends bytes after it.
    Held(Box<ServerHandshake>),
    /// Learned, or nothing to learn.
    Done,
}

/// Count a server handshake as full or resumed; its access-log word.
fn handshake_kind(backend: &Backend, hs: &ServerHandshake) -> Option<&'static str> {
    match hs.resumed {
        Some(true) => {
            backend.metrics.resumed.inc();
            Some("resumed")
        }
        Some(false) => {
            backend.metrics.full.inc();
            Some("full")
        }
        None => None,
    }
}

/// Step 7 (the part the relay decides): bytes, handshake kind and how it ended.
pub(super) fn record_relay(
    log: &mut AccessLog,
    stats: &RelayStats,
    handshake: Option<&'static str>,
    replayed: u64,
    svc: &Service,
    backend: &Backend,
) {
    log.handshake = handshake;
    log.c2s = stats.client_to_server + replayed;
    log.s2c = stats.server_to_client;
    log.end = End::word(stats.end.as_str());
    if let Some(kind) = &stats.error {
        log.error = Some(format!("{kind}"));
    }
    if let Some(abort) = stats.abort.filter(|a| !a.local) {
        svc.metrics.reset(abort.by);
    }
    if stats.end == RelayEnd::BackendReset && stats.server_to_client == 0 {
        tracing::warn!(service = %svc.name(), backend = %backend.name, "backend reset the connection before answering");
    }
}
