//! floor: the cheapest single-threaded TCP relay we can write, once on epoll and
//! once on io_uring, to measure what a new connection costs a proxy that does
//! nothing but relay (bench/conn-cpu.sh runs it beside crossbar and HAProxy).
//!
//! ```text
//! floor --engine epoll|epoll-del|uring|tokio --route LISTEN=BACKEND[,BACKEND...] [--route ...]
//! ```
//!
//! `epoll-del` is `epoll` with an `epoll_ctl(DEL)` before each close, as tokio
//! makes; `tokio` is the same relay on tokio (one worker thread of the
//! work-stealing runtime, as crossbar's `workers: 1`, and `copy_bidirectional`):
//! beside crossbar, they split its cost into the kernel's floor, the runtime's
//! share and crossbar's own.
//!
//! One thread runs every route in one loop; each route round-robins over its
//! backends. `READY` is printed on stdout once every listener is bound; SIGTERM or
//! SIGINT ends the process (default disposition: nothing to flush or drain).
//!
//! Modules: `sys` (addresses, listeners, backend sockets), `pipe` (one direction's
//! buffer, shared by the two hand-written engines), `epoll` (readiness with raw libc
//! calls), `uring` (completions with the io-uring crate), `on_tokio`.

mod epoll;
mod on_tokio;
mod pipe;
mod sys;
mod uring;

use std::io::Write;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::process::ExitCode;

use sys::SockAddr;

const USAGE: &str =
    "usage: floor --engine epoll|epoll-del|uring|tokio --route LISTEN=BACKEND[,BACKEND...] [--route ...]";

/// Which event interface the relay runs on.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Engine {
    Epoll,
    EpollDel,
    Uring,
    Tokio,
}

/// One listener and the backends its connections go to, in turn.
pub struct Route {
    /// The listening socket (bound and listening before the loop starts).
    pub listener: RawFd,
    /// Backend addresses, converted once so a connect allocates nothing.
    pub backends: Vec<SockAddr>,
    /// Index of the next backend (round robin).
    next: usize,
}

impl Route {
    /// The next backend in turn.
    pub fn pick(&mut self) -> &SockAddr {
        let b = &self.backends[self.next];
        self.next = (self.next + 1) % self.backends.len();
        b
    }
}

/// The command line, before any socket exists.
#[derive(Debug)]
struct Args {
    engine: Engine,
    routes: Vec<(SocketAddr, Vec<SocketAddr>)>,
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut engine = None;
    let mut routes = Vec::new();
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--engine" => {
                engine = Some(match value()?.as_str() {
                    "epoll" => Engine::Epoll,
                    "epoll-del" => Engine::EpollDel,
                    "uring" => Engine::Uring,
                    "tokio" => Engine::Tokio,
                    other => {
                        return Err(format!(
                            "unknown engine {other:?} (epoll, epoll-del, uring or tokio)"
                        ))
                    }
                })
            }
            "--route" => routes.push(parse_route(&value()?)?),
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let engine = engine.ok_or("--engine is required")?;
    if routes.is_empty() {
        return Err("at least one --route is required".into());
    }
    Ok(Args { engine, routes })
}

/// `LISTEN=BACKEND[,BACKEND...]`, every part an IP:port.
fn parse_route(s: &str) -> Result<(SocketAddr, Vec<SocketAddr>), String> {
    let (listen, backends) = s
        .split_once('=')
        .ok_or(format!("route {s:?}: expected LISTEN=BACKEND[,BACKEND...]"))?;
    let addr = |a: &str| {
        a.parse::<SocketAddr>()
            .map_err(|e| format!("route {s:?}: address {a:?}: {e}"))
    };
    let backends = backends
        .split(',')
        .map(addr)
        .collect::<Result<Vec<_>, _>>()?;
    Ok((addr(listen)?, backends))
}

fn main() -> ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("floor: {e}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("floor: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Result<(), String> {
    if args.engine == Engine::Tokio {
        return on_tokio::run(&args.routes).map_err(|e| e.to_string());
    }
    let nonblocking = args.engine != Engine::Uring;
    let mut routes = Vec::new();
    for (listen, backends) in &args.routes {
        let listener =
            sys::listen(*listen, nonblocking).map_err(|e| format!("listen on {listen}: {e}"))?;
        let backends = backends.iter().map(|b| SockAddr::new(*b)).collect();
        routes.push(Route {
            listener,
            backends,
            next: 0,
        });
    }
    // The engine is set up before READY, so a failed epoll_create or io_uring
    // setup is an error at start, never a silent proxy that accepts nothing.
    let ready = || {
        let mut out = std::io::stdout().lock();
        writeln!(out, "READY").and_then(|()| out.flush())
    };
    let result = match args.engine {
        Engine::Uring => uring::Relay::new(routes).and_then(|r| r.run(ready)),
        // epoll or epoll-del (tokio returned above).
        _ => epoll::Relay::new(routes, args.engine == Engine::EpollDel).and_then(|r| r.run(ready)),
    };
    result.map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Args, String> {
        parse_args(s.split_whitespace().map(String::from))
    }

    #[test]
    fn routes_and_engine_parse() {
        let a = parse("--engine uring --route 127.0.0.1:7001=127.0.0.1:9001,[::1]:9002 --route 127.0.0.1:7002=127.0.0.1:9003").unwrap();
        assert_eq!(a.engine, Engine::Uring);
        assert_eq!(a.routes.len(), 2);
        assert_eq!(a.routes[0].1.len(), 2);
        assert_eq!(a.routes[0].1[1], "[::1]:9002".parse().unwrap());
    }

    #[test]
    fn bad_arguments_are_rejected() {
        for bad in [
            "",
            "--route 127.0.0.1:1=127.0.0.1:2",
            "--engine epoll",
            "--engine kqueue --route 127.0.0.1:1=127.0.0.1:2",
            "--engine epoll --route 127.0.0.1:1",
            "--engine epoll --route 127.0.0.1:1=",
            "--engine epoll --route 127.0.0.1:1=localhost:2",
            "--engine epoll --route",
            "--engine epoll --route 127.0.0.1:1=127.0.0.1:2 --bogus",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} was accepted");
        }
    }
}
