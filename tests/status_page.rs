//! The status page (`GET /` on the admin endpoint) in real headless Chromium, driven
//! over WebDriver by chromedriver: a `crossbar run` process with one backend up,
//! one down, one draining and one in standby; the rendered table must agree with
//! `/api/services`, the config path (which contains `<b>&amp;`) must show as text,
//! and a screenshot is saved under `target/test-output/`.
//!
//! Needs `/usr/bin/chromium` and `/usr/bin/chromedriver` (tests/run.sh installs
//! them); without them the test fails.
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use base64::Engine;
use crossbar::admin::page::human_bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{HeaderMap, Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// Longest any single wait in this test may take (a cold Chromium start is ~2 s).
const WAIT: Duration = Duration::from_secs(30);
/// Bytes each client connection echoes through crossbar.
const PING: usize = 100;
/// Client connections relayed, of which `HELD` are open at once.
const CONNECTIONS: usize = 5;
const HELD: usize = 3;

/// A child process killed and reaped on drop (also when the test fails).
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill(); // ok: it may have exited already
        let _ = self.0.wait(); // ok: see above
    }
}

/// Start `cmd` with stdout or stderr piped, and return the first line on which
/// `find` returns something (bounded by [`WAIT`]).
fn spawn_and_find<T: Send + 'static>(
    mut cmd: Command,
    stderr: bool,
    find: fn(&str) -> Option<T>,
) -> (Proc, T) {
    if stderr {
        cmd.stderr(Stdio::piped()).stdout(Stdio::null());
    } else {
        cmd.stdout(Stdio::piped()).stderr(Stdio::null());
    }
    let mut child = cmd.stdin(Stdio::null()).spawn().expect("spawn");
    let out: Box<dyn std::io::Read + Send> = if stderr {
        Box::new(child.stderr.take().expect("piped"))
    } else {
        Box::new(child.stdout.take().expect("piped"))
    };
    let proc = Proc(child);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut sent = false;
        // Keep draining so the child never blocks on a full pipe.
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if !sent {
                if let Some(v) = find(&line) {
                    let _ = tx.send(v); // ok: the test may have given up
                    sent = true;
                }
            }
        }
    });
    let v = rx.recv_timeout(WAIT).expect("the expected output line");
    (proc, v)
}

/// One HTTP/1.1 request over a fresh loopback connection.
async fn http(
    addr: SocketAddr,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, HeaderMap, String) {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string())
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .expect("request");
    let resp = tokio::time::timeout(WAIT, send.send_request(req))
        .await
        .expect("answer in time")
        .expect("answer");
    let (parts, body) = resp.into_parts();
    let bytes = body.collect().await.expect("body").to_bytes();
    (
        parts.status,
        parts.headers,
        String::from_utf8_lossy(&bytes).into_owned(),
    )
}

async fn services(admin: SocketAddr) -> Value {
    let (status, _, body) = http(admin, Method::GET, "/api/services", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    serde_json::from_str(&body).expect("JSON")
}

fn backend<'a>(v: &'a Value, name: &str) -> &'a Value {
    v["services"][0]["backends"]
        .as_array()
        .and_then(|l| l.iter().find(|b| b["name"] == name))
        .unwrap_or_else(|| panic!("backend {name} in {v}"))
}

/// Poll `/api/services` until `cond` holds (bounded by [`WAIT`]).
async fn wait_api(admin: SocketAddr, what: &str, cond: impl Fn(&Value) -> bool) -> Value {
    let start = std::time::Instant::now();
    loop {
        let v = services(admin).await;
        if cond(&v) {
            return v;
        }
        assert!(start.elapsed() < WAIT, "{what}: not after {WAIT:?}: {v:#}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An echo server on loopback; runs until the test ends.
async fn echo_server(listener: TcpListener) {
    loop {
        let Ok((mut s, _)) = listener.accept().await else {
            return;
        };
        tokio::spawn(async move {
            let mut buf = [0u8; 4096];
            while let Ok(n) = s.read(&mut buf).await {
                if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        });
    }
}

async fn echo_backend() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = l.local_addr().expect("addr");
    tokio::spawn(echo_server(l));
    addr
}

/// An address nothing listens on (yet): bound once for a free port, then closed.
fn closed_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr")
}

/// One echo exchange through crossbar, the connection left open.
async fn echo_through(addr: SocketAddr, seed: u8) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let data: Vec<u8> = (0..PING).map(|i| seed.wrapping_add(i as u8)).collect();
    s.write_all(&data).await.expect("write");
    let mut got = vec![0u8; PING];
    tokio::time::timeout(WAIT, s.read_exact(&mut got))
        .await
        .expect("echo in time")
        .expect("echo");
    assert_eq!(got, data, "bytes intact");
    s
}

/// Fails the test when the browser or its driver is missing.
fn browser_present() {
    if !(Path::new(CHROMIUM).exists() && Path::new(CHROMEDRIVER).exists()) {
        crossbar::testbed::missing_tool(
            "status page in Chromium",
            &format!(
                "{CHROMIUM} or {CHROMEDRIVER} missing (apt-get install chromium chromium-driver)"
            ),
        );
    }
}

/// A WebDriver session on a headless Chromium with a fresh profile.
struct Browser {
    driver: SocketAddr,
    session: String,
    _profile: tempfile::TempDir,
    _proc: Proc,
}

impl Browser {
    async fn start() -> Browser {
        let mut cmd = Command::new(CHROMEDRIVER);
        cmd.arg("--port=0");
        let (proc, port) = spawn_and_find(cmd, false, |l| {
            l.split("started successfully on port ")
                .nth(1)?
                .trim_end_matches('.')
                .parse::<u16>()
                .ok()
        });
        let driver = SocketAddr::from(([127, 0, 0, 1], port));
        let profile = tempfile::tempdir().expect("profile dir");
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--window-size=1500,820",
            &format!("--user-data-dir={}", profile.path().display()),
        ];
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": CHROMIUM, "args": args},
        }}});
        let v = Browser::call(driver, Method::POST, "/session", Some(caps)).await;
        let session = v["sessionId"].as_str().expect("session id").to_string();
        Browser {
            driver,
            session,
            _profile: profile,
            _proc: proc,
        }
    }

    async fn call(driver: SocketAddr, method: Method, path: &str, body: Option<Value>) -> Value {
        let body = body.or_else(|| (method == Method::POST).then(|| json!({})));
        let (status, _, text) = http(driver, method, path, body).await;
        assert_eq!(status, StatusCode::OK, "WebDriver {path}: {text}");
        let v: Value = serde_json::from_str(&text).expect("WebDriver JSON");
        v["value"].clone()
    }

    async fn cmd(&self, method: Method, what: &str, body: Option<Value>) -> Value {
        let path = format!("/session/{}/{what}", self.session);
        Browser::call(self.driver, method, &path, body).await
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // chromedriver is killed right after; its Chromium dies with the session's
        // process group only if asked, so end the session first when we can.
        let (driver, path) = (self.driver, format!("/session/{}", self.session));
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            if let Ok(rt) = rt {
                rt.block_on(async {
                    let _ = tokio::time::timeout(
                        Duration::from_secs(5),
                        http(driver, Method::DELETE, &path, None),
                    )
                    .await; // ok: best effort, the process is killed next
                });
            }
        })
        .join(); // ok: a panic in cleanup must not mask the test's own
    }
}

/// What the test reads out of the rendered page (innerText, as a reader sees it).
const EXTRACT: &str = r#"
const cell = c => c.innerText.trim();
const t = document.querySelector('table[data-service]');
return {
  config: document.getElementById('config').innerText,
  config_children: document.getElementById('config').children.length,
  reload: document.getElementById('reload').innerText,
  scripts: document.scripts.length,
  caption: t.caption.innerText,
  head: [...t.querySelectorAll('th')].map(cell),
  rows: [...t.querySelectorAll('tr[class]:not(.tot)')].map(r => [...r.cells].map(cell)),
  colours: [...t.querySelectorAll('tr[class]:not(.tot) td:nth-child(3)')]
      .map(c => getComputedStyle(c).backgroundColor),
  width: document.documentElement.scrollWidth,
};
"#;

fn output_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-output");
    std::fs::create_dir_all(&dir).expect("output dir");
    dir
}

/// A JSON counter of `b` at `key` (or a nested `key.sub`).
fn num(b: &Value, key: &str) -> u64 {
    key.split('.')
        .fold(b, |v, k| &v[k])
        .as_u64()
        .unwrap_or_else(|| panic!("{key} in {b}"))
}

/// The page's cell for a counter that may grow while the page loads must lie
/// between the API's answers before and after.
fn between(cell: &str, before: &Value, after: &Value, key: &str, who: &str) {
    let v: u64 = cell
        .parse()
        .unwrap_or_else(|_| panic!("{who} {key}: {cell:?}"));
    assert!(
        (num(before, key)..=num(after, key)).contains(&v),
        "{who} {key}: page {v}, API {} .. {}",
        num(before, key),
        num(after, key)
    );
}

fn check_row(row: &[String], before: &Value, after: &Value) {
    let who = before["name"].as_str().unwrap_or("?");
    assert_eq!(row.len(), 16, "{who}: {row:?}");
    assert_eq!(row[0], who);
    assert_eq!(row[1], before["address"].as_str().unwrap_or(""));
    let state = before["state"].as_str().unwrap_or("?");
    assert_eq!(state, after["state"], "{who} state moved during the test");
    assert!(
        row[2].starts_with(&state.to_uppercase()),
        "{who}: state cell {:?}, API {state}",
        row[2]
    );
    assert_eq!(row[3], before["weight"].to_string());
    let bck = if before["backup"] == true { "Y" } else { "-" };
    assert_eq!(row[4], bck);
    for (i, key) in [
        (5, "active_connections"),
        (6, "peak_connections"),
        (7, "connections_total"),
        (10, "connect_errors"),
        (11, "check_failures"),
        (13, "handshakes.resumed"),
        (14, "handshakes.full"),
    ] {
        between(&row[i], before, after, key, who);
    }
    assert_eq!(row[8], human_bytes(num(before, "bytes.client_to_server")));
    assert_eq!(row[9], human_bytes(num(before, "bytes.server_to_client")));
    let result = if state == "down" { "FAIL" } else { "OK" };
    assert!(
        row[12].starts_with(&format!("tcp {result}")),
        "{who} last check {:?}",
        row[12]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_page_in_chromium_matches_the_api() {
    browser_present();
    let up = echo_backend().await;
    let drained = echo_backend().await;
    let gone = closed_addr();
    let back = closed_addr();

    // The config lives under a directory whose name is markup.
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("conf <b>&amp; 'x\"");
    std::fs::create_dir(&dir).expect("dir");
    let config = dir.join("crossbar.yaml");
    let yaml = format!(
        "admin: {{ listen: \"127.0.0.1:0\" }}\n\
         services:\n  web:\n    mode: tcp\n    listen: [\"127.0.0.1:0\"]\n\
         \x20   balance: roundrobin\n    failback: manual\n    retries: 0\n\
         \x20   health: {{ check: tcp, interval: 100ms, timeout: 1s, rise: 1, fall: 1 }}\n\
         \x20   backends:\n\
         \x20     - {{ name: up1, address: \"{up}\", weight: 3 }}\n\
         \x20     - {{ name: drained, address: \"{drained}\" }}\n\
         \x20     - {{ name: gone, address: \"{gone}\" }}\n\
         \x20     - {{ name: back, address: \"{back}\", weight: 2 }}\n"
    );
    std::fs::write(&config, yaml).expect("write config");

    let mut cmd = Command::new(env!("CARGO_BIN_EXE_crossbar"));
    cmd.args(["--log-format", "json", "run", "-c"])
        .arg(&config)
        .env("RUST_LOG", "info");
    let (_crossbar, admin) = spawn_and_find(cmd, true, |l| {
        let v: Value = serde_json::from_str(l).ok()?;
        (v["message"] == "admin endpoint listening").then_some(())?;
        v["listen"].as_str()?.parse::<SocketAddr>().ok()
    });

    // gone and back fail their checks; drained is drained by the operator; up1
    // serves a connection (a failover from back); then back returns and, with
    // `failback: manual`, waits in standby.
    wait_api(admin, "gone and back down", |v| {
        backend(v, "gone")["state"] == "down" && backend(v, "back")["state"] == "down"
    })
    .await;
    let (status, _, body) =
        http(admin, Method::POST, "/api/backends/web/drained/drain", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let v = services(admin).await;
    let listen: SocketAddr = v["services"][0]["listeners"][0]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("listener");
    drop(echo_through(listen, 0).await);
    let sock = tokio::net::TcpSocket::new_v4().expect("socket");
    sock.set_reuseaddr(true).expect("reuseaddr");
    sock.bind(back).expect("rebind back's address");
    tokio::spawn(echo_server(sock.listen(64).expect("listen")));
    wait_api(admin, "back in standby", |v| {
        backend(v, "back")["state"] == "standby"
    })
    .await;
    let (status, _, body) = http(admin, Method::POST, "/api/reload", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");

    // Traffic: everything goes to up1, the only available backend (one connection
    // more: the one that made back's return a failback).
    let mut before = Value::Null;
    for batch in [0..HELD, HELD..CONNECTIONS] {
        let mut held = Vec::new();
        for i in batch {
            held.push(echo_through(listen, i as u8).await);
        }
        drop(held);
        before = wait_api(admin, "connections closed", |v| {
            backend(v, "up1")["active_connections"] == 0
        })
        .await;
    }
    let up1 = backend(&before, "up1");
    assert_eq!(num(up1, "connections_total"), CONNECTIONS as u64 + 1);
    assert_eq!(num(up1, "peak_connections"), HELD as u64);
    assert_eq!(
        num(up1, "bytes.client_to_server"),
        ((CONNECTIONS + 1) * PING) as u64
    );
    assert_eq!(
        num(up1, "bytes.server_to_client"),
        ((CONNECTIONS + 1) * PING) as u64
    );
    assert_eq!(before["crossbar"]["last_reload"]["ok"], true);

    // Headers, straight from the endpoint.
    let (status, headers, html) = http(admin, Method::GET, "/?refresh=0", None).await;
    assert_eq!(status, StatusCode::OK);
    let h = |n: &str| headers.get(n).and_then(|v| v.to_str().ok()).unwrap_or("");
    assert_eq!(h("content-type"), "text/html; charset=utf-8");
    assert_eq!(h("cache-control"), "no-store");
    assert_eq!(h("x-content-type-options"), "nosniff");
    let csp = h("content-security-policy");
    assert!(csp.starts_with("default-src 'none';"), "{csp}");
    assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
    assert!(
        !csp.contains("http") && !csp.contains('*'),
        "no remote source: {csp}"
    );
    assert!(!html.contains("<script"), "no script at all");
    let (status, _, _) = http(admin, Method::GET, "/?refresh=abc", None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _, _) = http(admin, Method::POST, "/", None).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);

    // The page as Chromium renders it.
    let browser = Browser::start().await;
    let url = format!("http://{admin}/?refresh=0");
    browser
        .cmd(Method::POST, "url", Some(json!({ "url": url })))
        .await;
    let page = browser
        .cmd(
            Method::POST,
            "execute/sync",
            Some(json!({"script": EXTRACT, "args": []})),
        )
        .await;
    let png = browser.cmd(Method::GET, "screenshot", None).await;
    let after = services(admin).await;

    let png = base64::engine::general_purpose::STANDARD
        .decode(png.as_str().expect("screenshot"))
        .expect("base64 PNG");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG");
    let shot = output_dir().join("status_page.png");
    std::fs::write(&shot, &png).expect("save screenshot");
    eprintln!("screenshot: {}", shot.display());

    // Outside text shows as text: the path with its markup, no element made of it.
    assert_eq!(page["config"], config.display().to_string());
    assert_eq!(
        page["config_children"], 0,
        "markup in the path became elements"
    );
    assert_eq!(page["scripts"], 0);
    let reload = page["reload"].as_str().unwrap_or("");
    assert!(reload.starts_with("OK"), "reload cell {reload:?}");
    let caption = page["caption"].as_str().unwrap_or("");
    assert!(caption.starts_with("web"), "{caption}");
    assert!(caption.contains("balance roundrobin"), "{caption}");
    assert!(caption.contains(&listen.to_string()), "{caption}");

    // Every backend row against the API, in config order.
    let rows: Vec<Vec<String>> = serde_json::from_value(page["rows"].clone()).expect("rows");
    let names: Vec<&str> = rows.iter().map(|r| r[0].as_str()).collect();
    assert_eq!(names, ["up1", "drained", "gone", "back"]);
    for row in &rows {
        check_row(row, backend(&before, &row[0]), backend(&after, &row[0]));
    }
    assert!(
        rows[1][15].contains("crossbar backend enable web/drained"),
        "{:?}",
        rows[1]
    );
    assert!(
        rows[3][15].contains("crossbar backend enable web/back"),
        "{:?}",
        rows[3]
    );
    assert_eq!(rows[0][15], "", "no hint for a backend that is up");

    // Colour-coded: four states, four different colours (and the text labels above).
    let colours: Vec<&str> = page["colours"]
        .as_array()
        .expect("colours")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let distinct: std::collections::BTreeSet<&str> = colours.iter().copied().collect();
    assert_eq!(distinct.len(), 4, "{colours:?}");
    assert!(
        page["width"].as_u64().unwrap_or(u64::MAX) <= 1500,
        "fits the window: {page}"
    );
}
