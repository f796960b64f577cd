//! Continuous load on a `mode: tcp` echo service: clients pinging back to back
//! until stopped, every failure kept with its reason, for "under load, not one
//! connection fails" (upgrades, reloads).
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Each ping sends this many bytes and expects them echoed.
const PING: usize = 64;
/// Longest a load runs, whatever happens (every load loop is bounded).
const LOAD_CAP: Duration = Duration::from_secs(30);

/// One echo round trip on a fresh connection.
pub async fn ping(addr: SocketAddr) -> Result<(), String> {
    let mut s = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let data = [7u8; PING];
    s.write_all(&data)
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut got = [0u8; PING];
    s.read_exact(&mut got)
        .await
        .map_err(|e| format!("read: {e}"))?;
    if got != data {
        return Err("echo differs".into());
    }
    Ok(())
}

/// Clients pinging until [`Load::finish`] (or [`LOAD_CAP`]).
pub struct Load {
    ok: Arc<AtomicUsize>,
    failed: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// `clients` tasks pinging `addr` back to back until stopped (or [`LOAD_CAP`]).
pub fn load(addr: SocketAddr, clients: usize) -> Load {
    let ok = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let tasks = (0..clients)
        .map(|_| {
            let (ok, failed, stop) = (ok.clone(), failed.clone(), stop.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) && started.elapsed() < LOAD_CAP {
                    match ping(addr).await {
                        Ok(()) => ok.fetch_add(1, Ordering::Relaxed),
                        Err(e) => {
                            failed.lock().unwrap().push(e);
                            0
                        }
                    };
                }
            })
        })
        .collect();
    Load {
        ok,
        failed,
        stop,
        tasks,
    }
}

impl Load {
    /// Stop the clients: the round trips that succeeded and every failure's reason.
    pub async fn finish(self) -> (usize, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            t.await.unwrap();
        }
        let failed = self.failed.lock().unwrap().clone();
        (self.ok.load(Ordering::Relaxed), failed)
    }
}
