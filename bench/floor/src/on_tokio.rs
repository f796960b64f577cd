//! The same relay on tokio, as crossbar runs it: the work-stealing runtime with one
//! worker thread (crossbar's `workers: 1`), a task per accepted connection, the
//! backend dialled with `TcpStream::connect` and the bytes moved by
//! `copy_bidirectional` (which passes a half-close on with `shutdown`). Nothing
//! else: no hello read, no stick table, no metrics, no log. Beside `epoll-del` it
//! shows what the runtime adds to the kernel's work; beside crossbar, what
//! crossbar's own features add to the runtime's.

use std::io::{self, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};

/// Runs every route until the process is killed; `READY` once all are bound.
pub fn run(routes: &[(SocketAddr, Vec<SocketAddr>)]) -> io::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_io()
        .build()?;
    runtime.block_on(async {
        let mut tasks = Vec::new();
        for (listen, backends) in routes {
            let socket = match listen {
                SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
                SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
            };
            socket.set_reuseaddr(true)?;
            // Inherited by every accepted socket (as in the other engines).
            socket.set_nodelay(true)?;
            socket.bind(*listen)?;
            let listener = socket.listen(4096)?;
            tasks.push(tokio::spawn(accept(listener, Arc::new(backends.clone()))));
        }
        {
            let mut out = io::stdout().lock();
            writeln!(out, "READY")?;
            out.flush()?;
        }
        for t in tasks {
            t.await.map_err(io::Error::other)??;
        }
        Ok(())
    })
}

async fn accept(listener: TcpListener, backends: Arc<Vec<SocketAddr>>) -> io::Result<()> {
    let next = Arc::new(AtomicUsize::new(0));
    loop {
        let Ok((client, _)) = listener.accept().await else {
            // EMFILE and the like: the next accept may succeed.
            tokio::task::yield_now().await;
            continue;
        };
        let i = next.fetch_add(1, Ordering::Relaxed) % backends.len();
        let backend = backends[i];
        tokio::spawn(relay(client, backend));
    }
}

/// Dials the backend and moves bytes both ways; any error closes both sockets.
async fn relay(mut client: TcpStream, backend: SocketAddr) {
    let Ok(mut server) = TcpStream::connect(backend).await else {
        return;
    };
    if server.set_nodelay(true).is_err() {
        return;
    }
    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
}
