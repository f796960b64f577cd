//! Stand-in Puppet compilers: real rustls TLS servers on loopback that answer
//! `/status/v1/simple` with `running`, `/status/v1/services/jruby-metrics` with the
//! document a real puppetserver 7.9.5 sent (tests/fixtures/jruby-metrics, captured
//! by `bench/herd.sh --capture`) with the pool figures the test sets, and anything
//! else with their own name, so a client knows which compiler answered. A test can
//! make one refuse (401), answer garbage, a huge or a never-ending body.
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crossbar::testbed::{server_config, BackendTls, TestCa};
use http_body_util::Full;
use hyper::body::{Bytes, Frame};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

/// What the compiler's jruby-metrics endpoint answers.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// The captured document with these figures.
    Pool {
        /// `num-jrubies`.
        jrubies: u32,
        /// `num-free-jrubies`.
        free: u32,
        /// Entries of `requested-instances` (the queue).
        queued: u32,
        /// `queue-limit-hit-count`.
        hits: u64,
        /// `jruby-pool-lock-status.current-state`, e.g. `:not-in-use`.
        lock: &'static str,
    },
    /// An error status with Puppet's text.
    Status(u16),
    /// These bytes, as a 200.
    Body(Vec<u8>),
    /// A 200 whose body never ends (a byte every 50 ms).
    Endless,
}

impl Answer {
    /// A pool of `jrubies` with `free` of them free and `queued` waiting.
    pub fn pool(jrubies: u32, free: u32, queued: u32) -> Answer {
        Answer::Pool {
            jrubies,
            free,
            queued,
            hits: 0,
            lock: ":not-in-use",
        }
    }
}

/// A running stand-in compiler.
pub struct Compiler {
    /// Its name (the body of every other answer).
    pub name: String,
    /// Where it listens.
    pub addr: SocketAddr,
    answer: Arc<Mutex<Answer>>,
    /// Answered once, to the next poll, before `answer` resumes.
    once: Arc<Mutex<Option<Answer>>>,
    polls: Arc<AtomicU64>,
    stop: CancellationToken,
}

impl Drop for Compiler {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The captured document the answers are made from (a compiler of 1 JRuby with a
/// request borrowed and two queued: real items to copy into any queue length).
pub fn captured() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/jruby-metrics/saturated-1-jruby.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The captured document with these figures: lists of the captured items, as long
/// as the figures say.
fn document(jrubies: u32, free: u32, queued: u32, hits: u64, lock: &str) -> Vec<u8> {
    let mut doc = captured();
    let e = &mut doc["status"]["experimental"];
    e["jruby-pool-lock-status"]["current-state"] = Value::from(lock);
    let m = &mut e["metrics"];
    let item = |list: &str| m[list][0].clone();
    let (requested, borrowed) = (item("requested-instances"), item("borrowed-instances"));
    m["num-jrubies"] = jrubies.into();
    m["num-free-jrubies"] = free.into();
    m["queue-limit-hit-count"] = hits.into();
    m["requested-instances"] = Value::Array(vec![requested; queued as usize]);
    m["borrowed-instances"] = Value::Array(vec![borrowed; jrubies.saturating_sub(free) as usize]);
    serde_json::to_vec(&doc).unwrap_or_default()
}

type Body = http_body_util::Either<Full<Bytes>, Endless>;

impl Compiler {
    /// Start a compiler `name` on `bind` (port 0 for any) with a certificate from
    /// `ca` for `names`, answering an idle pool of one JRuby until told otherwise.
    pub async fn start(ca: &TestCa, name: &str, names: &[&str], bind: SocketAddr) -> Compiler {
        let cfg =
            server_config(ca, name, names, BackendTls::default()).expect("compiler TLS config");
        let listener = TcpListener::bind(bind).await.expect("bind a compiler");
        let addr = listener.local_addr().expect("compiler address");
        let c = Compiler {
            name: name.to_string(),
            addr,
            answer: Arc::new(Mutex::new(Answer::pool(1, 1, 0))),
            once: Arc::new(Mutex::new(None)),
            polls: Arc::new(AtomicU64::new(0)),
            stop: CancellationToken::new(),
        };
        let (answer, polls, stop) = (
            (c.answer.clone(), c.once.clone()),
            c.polls.clone(),
            c.stop.clone(),
        );
        let (acceptor, name) = (TlsAcceptor::from(cfg), name.to_string());
        tokio::spawn(async move {
            loop {
                let (tcp, _) = tokio::select! {
                    r = listener.accept() => match r { Ok(a) => a, Err(_) => continue },
                    () = stop.cancelled() => return,
                };
                let (acceptor, name, answer, polls) = (
                    acceptor.clone(),
                    name.clone(),
                    answer.clone(),
                    polls.clone(),
                );
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let svc = hyper::service::service_fn(
                        move |req: hyper::Request<hyper::body::Incoming>| {
                            let reply = respond(req.uri().path(), &name, &answer, &polls);
                            async move { Ok::<_, Infallible>(reply) }
                        },
                    );
                    let conn = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), svc);
                    let _ = conn.await; // ok: a client that goes away ends its connection
                });
            }
        });
        c
    }

    /// What jruby-metrics answers from now on.
    pub fn answer(&self, a: Answer) {
        *self.answer.lock().unwrap() = a;
    }

    /// What jruby-metrics answers to the next poll only (one sample), before the
    /// answer set with [`Compiler::answer`] resumes.
    pub fn answer_once(&self, a: Answer) {
        *self.once.lock().unwrap() = Some(a);
    }

    /// jruby-metrics requests answered so far.
    pub fn polls(&self) -> u64 {
        self.polls.load(Ordering::Relaxed)
    }
}

fn respond(
    path: &str,
    name: &str,
    (answer, once): &(Arc<Mutex<Answer>>, Arc<Mutex<Option<Answer>>>),
    polls: &AtomicU64,
) -> hyper::Response<Body> {
    let full = |status: u16, body: Vec<u8>| {
        let b = Body::Left(Full::new(Bytes::from(body)));
        hyper::Response::builder().status(status).body(b).unwrap()
    };
    if path == "/status/v1/simple" {
        return full(200, b"running".to_vec());
    }
    if !path.starts_with("/status/v1/services/jruby-metrics") {
        return full(200, format!("{name}\n").into_bytes());
    }
    polls.fetch_add(1, Ordering::Relaxed);
    let next = once.lock().unwrap().take();
    match next.unwrap_or_else(|| answer.lock().unwrap().clone()) {
        Answer::Pool {
            jrubies,
            free,
            queued,
            hits,
            lock,
        } => full(200, document(jrubies, free, queued, hits, lock)),
        Answer::Status(s) => {
            let text = "Forbidden request: /status/v1/services/jruby-metrics (method :get). \
                        Please see the server logs for details.";
            full(s, text.as_bytes().to_vec())
        }
        Answer::Body(b) => full(200, b),
        Answer::Endless => {
            let tick = tokio::time::interval(std::time::Duration::from_millis(50));
            let b = Body::Right(Endless(tick));
            hyper::Response::builder().status(200).body(b).unwrap()
        }
    }
}

/// A body that never ends: a byte every 50 ms, for ever.
pub struct Endless(tokio::time::Interval);

impl hyper::body::Body for Endless {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0
            .poll_tick(cx)
            .map(|_| Some(Ok(Frame::data(Bytes::from_static(b" ")))))
    }
}
