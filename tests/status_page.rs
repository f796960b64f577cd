//! The status page (`GET /` on the admin endpoint) in real headless Chromium, driven
//! over WebDriver by chromedriver: a `crossbar run` process with one backend up,
//! one down, one draining and one in standby; the rendered table must agree with
//! `/api/services`, the config path (which contains `<b>&amp;`) must show as text,
//! and a screenshot is saved under `target/test-output/`. A second test checks the
//! page at 1280x900 (nothing cut off, health under DRAIN/DISABLED, the no-backend
//! banner, the active backend of `balance: first`, red counts only while failing,
//! a weight set at run time)
//! and saves the screenshot docs/status-page.png is taken from.
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
/// The page must fit a 1280 px wide screen; the screenshot is 1280x900.
const VIEWPORT: (u32, u32) = (1280, 900);
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
/// `find` returns something (bounded by [`WAIT`]). The other stream goes to the
/// test's own output, and a process that ends or stays silent first fails the test
/// with its exit status and the lines it printed (a chromedriver that quit at start
/// once failed a run with nothing to say why).
fn spawn_and_find<T: Send + 'static>(
    mut cmd: Command,
    stderr: bool,
    find: fn(&str) -> Option<T>,
) -> (Proc, T) {
    /// Lines kept for the failure message.
    const KEPT_LINES: usize = 40;
    if stderr {
        cmd.stderr(Stdio::piped()).stdout(Stdio::inherit());
    } else {
        cmd.stdout(Stdio::piped()).stderr(Stdio::inherit());
    }
    let mut child = cmd.stdin(Stdio::null()).spawn().expect("spawn");
    let out: Box<dyn std::io::Read + Send> = if stderr {
        Box::new(child.stderr.take().expect("piped"))
    } else {
        Box::new(child.stdout.take().expect("piped"))
    };
    let mut proc = Proc(child);
    let (tx, rx) = mpsc::channel();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let lines = seen.clone();
    std::thread::spawn(move || {
        let mut sent = false;
        // Keep draining so the child never blocks on a full pipe.
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if !sent {
                if let Some(v) = find(&line) {
                    let _ = tx.send(v); // ok: the test may have given up
                    sent = true;
                } else if let Ok(mut l) = lines.lock() {
                    if l.len() < KEPT_LINES {
                        l.push(line);
                    }
                }
            }
        }
    });
    let v = match rx.recv_timeout(WAIT) {
        Ok(v) => v,
        Err(e) => {
            let status = proc.0.try_wait();
            let printed = seen.lock().map(|l| l.join("\n")).unwrap_or_default();
            panic!("no expected output line ({e}); exit status {status:?}; it printed:\n{printed}")
        }
    };
    (proc, v)
}

/// One HTTP/1.1 request over a fresh loopback connection.
async fn http(
    addr: SocketAddr,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, HeaderMap, String) {
    http_with(addr, method, path, body, None).await
}

/// [`http`] with a bearer token.
async fn http_with(
    addr: SocketAddr,
    method: Method,
    path: &str,
    body: Option<Value>,
    token: Option<&str>,
) -> (StatusCode, HeaderMap, String) {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string())
        .header("content-type", "application/json");
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let req = req.body(Full::new(Bytes::from(body))).expect("request");
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
/// A loopback address that refuses connections for the whole test: a socket bound
/// there and never listening holds the port, so no other test's listener can be
/// given it (a port merely freed can be, and a check then passes: seen in CI).
fn dead_addr() -> SocketAddr {
    let sock =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    sock.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
        .expect("bind");
    let addr = sock
        .local_addr()
        .expect("addr")
        .as_socket()
        .expect("an IP address");
    Box::leak(Box::new(sock)); // held until the test process ends
    addr
}

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
            "--window-size=1280,900",
            &format!("--user-data-dir={}", profile.path().display()),
        ];
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": CHROMIUM, "args": args},
        }}});
        let v = Browser::call(driver, Method::POST, "/session", Some(caps)).await;
        let session = v["sessionId"].as_str().expect("session id").to_string();
        let browser = Browser {
            driver,
            session,
            _profile: profile,
            _proc: proc,
        };
        // The window size includes what headless Chromium counts as its frame:
        // set the viewport itself.
        let metrics = json!({"cmd": "Emulation.setDeviceMetricsOverride", "params": {
            "width": VIEWPORT.0, "height": VIEWPORT.1, "deviceScaleFactor": 1, "mobile": false,
        }});
        browser
            .cmd(Method::POST, "goog/cdp/execute", Some(metrics))
            .await;
        browser
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
  sources: document.querySelector('table[data-sources] caption')?.innerText ?? '',
};
"#;

fn output_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-output");
    std::fs::create_dir_all(&dir).expect("output dir");
    dir
}

/// What `crossbar status --admin http://ADMIN` prints (it must succeed).
fn crossbar_status(admin: SocketAddr) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_crossbar"))
        .args(["status", "--admin", &format!("http://{admin}")])
        .env_remove("CROSSBAR_ADMIN")
        .env_remove("CROSSBAR_TOKEN_FILE")
        .stdin(Stdio::null())
        .output()
        .expect("crossbar status runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The cells of backend `name`'s row in the state table of `crossbar status` (the
/// first row that starts with it), split where the columns are: two spaces or more.
fn status_row(status: &str, name: &str) -> Vec<String> {
    let line = status
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("{name} ")))
        .unwrap_or_else(|| panic!("no row of {name} in\n{status}"));
    line.split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(String::from)
        .collect()
}

/// `crossbar status`'s state-table row of a backend against its page row (cells:
/// Backend, Address, State, Wt, Bck, Cur, ..., Last check): the same address, state,
/// health under DRAIN and DISABLED, weight (and the file's), backup, open
/// connections and check result.
fn status_agrees_with_the_page(status: &str, page_row: &[String]) {
    let name = page_row[0].split_whitespace().next().unwrap_or("");
    let cli = status_row(status, name);
    let who = format!("{name}: status {cli:?}, page {page_row:?}");
    // BACKEND ADDRESS STATE ACTIVE WEIGHT BACKUP FROM HEALTH FOR LAST CHECK
    assert_eq!(cli[1], page_row[1], "{who}");
    let state = page_row[2].split_whitespace().next().unwrap_or("");
    assert!(cli[2].starts_with(&state.to_lowercase()), "{who}");
    if page_row[2].contains("health DOWN") {
        assert_eq!(cli[7], "DOWN", "{who}");
    } else if page_row[2].contains("health up") {
        assert_eq!(cli[7], "up", "{who}");
    }
    let digits = |s: &str| -> Vec<String> {
        s.split(|c: char| !c.is_ascii_digit())
            .filter(|d| !d.is_empty())
            .map(String::from)
            .collect()
    };
    assert_eq!(digits(&cli[4]), digits(&page_row[3]), "{who}: weight");
    let backup = if page_row[4] == "Y" { "yes" } else { "no" };
    assert_eq!(cli[5], backup, "{who}");
    assert_eq!(cli[3], page_row[5], "{who}: open connections");
    let result = |s: &str| {
        s.split(" ago")
            .next()
            .unwrap_or("")
            .split_whitespace()
            .take(2)
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(result(&cli[9]), result(&page_row[12]), "{who}: last check");
    // The error up to any quoted peer bytes (a tls-hello check quotes the answer's
    // first bytes, which differ at every check).
    let error = |s: &str| {
        let e = s.split_once(" ago: ").map_or("", |(_, e)| e);
        e.split('"')
            .next()
            .unwrap_or("")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(
        error(&cli[9]),
        error(&page_row[12]),
        "{who}: the check's error"
    );
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
    let gone = dead_addr();
    let back = closed_addr();

    // The config lives under a directory whose name is markup.
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("conf <b>&amp; 'x\"");
    std::fs::create_dir(&dir).expect("dir");
    let config = dir.join("crossbar.yaml");
    let yaml = format!(
        "admin: {{ listen: \"127.0.0.1:0\" }}\n\
         services:\n  web:\n    mode: tcp\n\
         \x20   listen: [{{ address: \"127.0.0.1:0\", per_source: {{ max_connections: 50 }}, \
         proxy_protocol: {{ accept_from: [\"192.0.2.0/24\"] }} }}]\n\
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
    let sources = page["sources"].as_str().unwrap_or("");
    assert!(
        sources.contains(&format!("sources on {listen}"))
            && sources.contains("per source: open 50"),
        "the per-source table: {sources:?}"
    );

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

    // `crossbar status` shows what the page shows: the PROXY listener, each row,
    // the hints, the per-source table.
    assert!(
        caption.contains("PROXY headers from 192.0.2.0/24 (required)"),
        "{caption}"
    );
    let status = crossbar_status(admin);
    assert!(
        status.contains("  listener 127.0.0.1:0 PROXY headers from 192.0.2.0/24 (required)\n"),
        "{status}"
    );
    for row in &rows {
        status_agrees_with_the_page(&status, row);
    }
    for hint in ["enable web/drained", "enable web/back"] {
        assert!(
            status.contains(&format!(
                "next: crossbar backend {hint} --admin http://{admin}"
            )),
            "{status}"
        );
    }
    let per_source = status
        .lines()
        .find(|l| l.starts_with(&format!("{listen}: ")))
        .unwrap_or_else(|| panic!("no per-source line in\n{status}"));
    assert!(
        per_source.starts_with(&format!("{listen}: max_connections 50, rate -, burst 1; "))
            && per_source.ends_with(" of 100000 sources tracked"),
        "{per_source}"
    );

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
        page["width"].as_u64().unwrap_or(u64::MAX) <= 1280,
        "fits the window: {page}"
    );
}

/// What the 1280 px test reads out of the page: per service, its caption, banner
/// and rows; every box whose content overflows it (clipped text) with the tooltip
/// of its cell; every column head word broken across lines; the page's width.
const EXTRACT_1280: &str = r#"
const cell = c => c.innerText.trim();
const tables = {};
for (const t of document.querySelectorAll('table[data-service]')) {
  const banner = t.querySelector('caption .none');
  tables[t.dataset.service] = {
    caption: t.caption.innerText,
    banner: banner ? banner.innerText : null,
    banner_colour: banner ? getComputedStyle(banner).backgroundColor : null,
    rows: [...t.querySelectorAll('tr[class]:not(.tot)')].map(r => ({
      cells: [...r.cells].map(cell),
      active: r.classList.contains('act'),
      count_colours: [r.cells[10], r.cells[11]].map(c => getComputedStyle(c).color),
    })),
  };
}
const clipped = [];
for (const e of document.querySelectorAll('header, caption, th, td, td *, footer')) {
  if (getComputedStyle(e).display === 'inline') continue;
  if (e.scrollWidth > e.clientWidth + 1 || e.scrollHeight > e.clientHeight + 1) {
    const c = e.closest('th, td') || e;
    clipped.push({text: e.innerText, title: e.title || c.title || ''});
  }
}
const broken = [];
for (const th of document.querySelectorAll('th')) {
  const node = th.firstChild;
  let i = 0;
  for (const w of node.textContent.split(' ')) {
    const r = document.createRange();
    r.setStart(node, i);
    r.setEnd(node, i + w.length);
    if (r.getClientRects().length > 1) broken.push(w);
    i += w.length + 1;
  }
}
return {
  tables, clipped, broken,
  width: document.documentElement.scrollWidth,
  viewport: [window.innerWidth, window.innerHeight],
  red: (() => { const d = document.createElement('td'); d.className = 'err';
    document.querySelector('table tr').appendChild(d);
    const c = getComputedStyle(d).color; d.remove(); return c; })(),
};
"#;

/// Start `crossbar run -c config`; its admin address.
fn start_crossbar(config: &Path) -> (Proc, SocketAddr) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_crossbar"));
    cmd.args(["--log-format", "json", "run", "-c"])
        .arg(config)
        .env("RUST_LOG", "info");
    spawn_and_find(cmd, true, |l| {
        let v: Value = serde_json::from_str(l).ok()?;
        (v["message"] == "admin endpoint listening").then_some(())?;
        v["listen"].as_str()?.parse::<SocketAddr>().ok()
    })
}

/// The backend `name` of service `svc` in an `/api/services` answer.
fn svc_backend<'a>(v: &'a Value, svc: &str, name: &str) -> &'a Value {
    v["services"]
        .as_array()
        .and_then(|l| l.iter().find(|s| s["name"] == svc))
        .and_then(|s| s["backends"].as_array())
        .and_then(|l| l.iter().find(|b| b["name"] == name))
        .unwrap_or_else(|| panic!("backend {svc}/{name} in {v}"))
}

/// Width and height from a PNG's IHDR chunk.
fn png_size(png: &[u8]) -> (u32, u32) {
    assert!(
        png.len() > 24 && png.starts_with(b"\x89PNG\r\n\x1a\n"),
        "a PNG"
    );
    let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    (be(&png[16..20]), be(&png[20..24]))
}

/// Long backend names: they must wrap, not be cut.
const C1: &str = "compile-01-fra-dc2-rack14";
const C2: &str = "compile-02-fra-dc2-rack14";
const C3: &str = "compile-03-fra-dc2-rack15";

/// At 1280 px: nothing cut off, health under DRAIN and DISABLED, a banner on the
/// service with no backend available, the active backend of a `balance: first`
/// service marked, and failure counts red only while failing. Saves the
/// screenshot (1280x900) that docs/status-page.png is taken from.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_page_at_1280_shows_what_matters() {
    browser_present();
    let c1 = echo_backend().await;
    let c2 = dead_addr(); // drained by the operator, and failing its checks
    let c3 = closed_addr(); // fails, then comes back: past failures
    let ca1 = dead_addr();
    let ca2 = echo_backend().await;
    let db1 = echo_backend().await; // speaks no TLS: fails its tls-hello check
    let db2 = echo_backend().await; // disabled in the config, healthy

    let tmp = tempfile::tempdir().expect("tempdir");
    let token = "status-page-test-token";
    let token_file = tmp.path().join("admin.token");
    std::fs::write(&token_file, token).expect("token");
    std::fs::set_permissions(
        &token_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .expect("chmod");
    let config = tmp.path().join("crossbar.yaml");
    let health = "{ check: tcp, interval: 100ms, timeout: 1s, rise: 1, fall: 1 }";
    let yaml = format!(
        "admin: {{ listen: \"127.0.0.1:0\", token_file: \"{}\" }}\n\
         services:\n\
         \x20 puppet:\n    mode: tcp\n    listen: [\"127.0.0.1:0\"]\n    balance: roundrobin\n\
         \x20   retries: 0\n    health: {health}\n    backends:\n\
         \x20     - {{ name: {C1}, address: \"{c1}\" }}\n\
         \x20     - {{ name: {C2}, address: \"{c2}\" }}\n\
         \x20     - {{ name: {C3}, address: \"{c3}\" }}\n\
         \x20 puppetca:\n    mode: tcp\n    listen: [\"127.0.0.1:0\"]\n    balance: first\n\
         \x20   retries: 0\n    health: {health}\n    backends:\n\
         \x20     - {{ name: ca1, address: \"{ca1}\" }}\n\
         \x20     - {{ name: ca2, address: \"{ca2}\", backup: true }}\n\
         \x20 puppetdb:\n    mode: tcp\n    listen: [\"127.0.0.1:0\"]\n    balance: leastconn\n\
         \x20   retries: 0\n\
         \x20   health: {health}\n    backends:\n\
         \x20     - {{ name: db1, address: \"{db1}\", health: {{ check: tls-hello }} }}\n\
         \x20     - {{ name: db2, address: \"{db2}\", disabled: true }}\n",
        token_file.display()
    );
    std::fs::write(&config, yaml).expect("write config");
    let (_crossbar, admin) = start_crossbar(&config);

    let failed = |v: &Value, svc: &str, b: &str| {
        let b = svc_backend(v, svc, b);
        b["state"] == "down" && b["last_check"]["result"] == "fail"
    };
    wait_api(admin, "the failing backends down", |v| {
        failed(v, "puppet", C2)
            && failed(v, "puppet", C3)
            && failed(v, "puppetca", "ca1")
            && failed(v, "puppetdb", "db1")
            && svc_backend(v, "puppetdb", "db2")["last_check"]["result"] == "ok"
    })
    .await;
    let path = format!("/api/backends/puppet/{C2}/drain");
    let (status, _, body) = http_with(admin, Method::POST, &path, None, Some(token)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let path = format!("/api/backends/puppet/{C1}/weight?weight=4");
    let (status, _, body) = http_with(admin, Method::POST, &path, None, Some(token)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // compile03 comes back: its failures are history.
    let sock = tokio::net::TcpSocket::new_v4().expect("socket");
    sock.set_reuseaddr(true).expect("reuseaddr");
    sock.bind(c3).expect("rebind compile03's address");
    tokio::spawn(echo_server(sock.listen(64).expect("listen")));
    let v = wait_api(admin, "compile03 back up", |v| {
        let b = svc_backend(v, "puppet", C3);
        b["state"] == "up" && b["last_check"]["result"] == "ok"
    })
    .await;
    // A connection to the CA goes to the backup, the active one.
    let ca_listen: SocketAddr = v["services"][1]["listeners"][0]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("puppetca listener");
    drop(echo_through(ca_listen, 7).await);
    let before = wait_api(admin, "the CA connection on ca2", |v| {
        svc_backend(v, "puppetca", "ca2")["connections_total"] == 1
    })
    .await;
    assert_eq!(before["services"][1]["active_backend"], "ca2");
    assert_eq!(before["services"][0]["active_backend"], Value::Null);
    assert!(num(svc_backend(&before, "puppet", C3), "check_failures") > 0);

    let browser = Browser::start().await;
    let url = format!("http://{admin}/?refresh=0");
    browser
        .cmd(Method::POST, "url", Some(json!({ "url": url })))
        .await;
    let page = browser
        .cmd(
            Method::POST,
            "execute/sync",
            Some(json!({"script": EXTRACT_1280, "args": []})),
        )
        .await;
    let png = browser.cmd(Method::GET, "screenshot", None).await;
    let png = base64::engine::general_purpose::STANDARD
        .decode(png.as_str().expect("screenshot"))
        .expect("base64 PNG");
    let shot = output_dir().join("status_page_1280.png");
    std::fs::write(&shot, &png).expect("save screenshot");
    eprintln!("screenshot: {}", shot.display());
    assert_eq!(png_size(&png), (1280, 900), "screenshot size");
    assert_eq!(page["viewport"], json!([1280, 900]), "{page}");

    // 1. Fits 1280 px; nothing cut off without its full text as the tooltip; no
    // column head broken inside a word.
    assert!(
        page["width"].as_u64().unwrap_or(u64::MAX) <= 1280,
        "wider than the window: {}",
        page["width"]
    );
    for c in page["clipped"].as_array().expect("clipped") {
        let (text, title) = (
            c["text"].as_str().unwrap_or(""),
            c["title"].as_str().unwrap_or(""),
        );
        let rest = text.split_once(" ago: ").map_or(text, |(_, e)| e);
        assert!(
            !title.is_empty() && title.contains(rest.trim()),
            "cut off without its text as the tooltip: {c}"
        );
    }
    assert_eq!(
        page["broken"],
        json!([]),
        "column heads broken inside a word"
    );

    let t = &page["tables"];
    let rows = |svc: &str| -> Vec<Value> { t[svc]["rows"].as_array().cloned().unwrap_or_default() };
    let row = |svc: &str, name: &str| -> Value {
        rows(svc)
            .into_iter()
            .find(|r| r["cells"][0].as_str().is_some_and(|c| c.starts_with(name)))
            .unwrap_or_else(|| panic!("row {svc}/{name} in {t:#}"))
    };
    let cell = |r: &Value, i: usize| r["cells"][i].as_str().unwrap_or("").to_string();
    for svc in ["puppet", "puppetca", "puppetdb"] {
        for r in rows(svc) {
            let addr = cell(&r, 1);
            let name = cell(&r, 0);
            let api = svc_backend(&before, svc, name.split(' ').next().unwrap_or("").trim());
            assert_eq!(
                addr,
                api["address"].as_str().unwrap_or("?"),
                "{svc}: whole address"
            );
        }
    }
    // Long names and the CLI hint are there in full (wrapped, not cut).
    assert_eq!(cell(&row("puppet", C1), 0), C1);
    let hint = cell(&row("puppet", C2), 15);
    let want = format!(
        "crossbar backend enable puppet/{C2} --token-file {}",
        token_file.display()
    );
    assert_eq!(hint.split_whitespace().collect::<Vec<_>>().join(" "), want);
    // A weight set at run time: highlighted with the file's, and how to go back.
    let c1 = row("puppet", C1);
    assert_eq!(
        cell(&c1, 3).split_whitespace().collect::<Vec<_>>(),
        ["4", "operator;", "file", "1"]
    );
    let want = format!(
        "crossbar backend reset puppet/{C1} --token-file {}",
        token_file.display()
    );
    assert_eq!(
        cell(&c1, 15)
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" "),
        want
    );

    // 2. Health under DRAIN and DISABLED.
    let c2_state = cell(&row("puppet", C2), 2);
    assert!(
        c2_state.starts_with("DRAIN") && c2_state.contains("health DOWN"),
        "drained and failing: {c2_state:?}"
    );
    let db2_state = cell(&row("puppetdb", "db2"), 2);
    assert!(
        db2_state.starts_with("DISABLED") && db2_state.contains("health up"),
        "disabled and healthy: {db2_state:?}"
    );
    let c1_state = cell(&row("puppet", C1), 2);
    assert!(
        !c1_state.contains("health"),
        "UP needs no second word: {c1_state:?}"
    );

    // 3. A banner on the service with no backend available, saying why; none
    // where a backend is available (a drained or down one beside it included).
    let banner = t["puppetdb"]["banner"].as_str().unwrap_or("");
    assert!(banner.starts_with("NO BACKEND AVAILABLE"), "{t:#}");
    assert!(banner.contains("refused"), "{banner}");
    assert!(
        banner.contains("db1 DOWN: its tls-hello check fails;"),
        "db1's reason: {banner}"
    );
    assert!(
        banner.contains("db2 DISABLED in the file (health up)"),
        "db2's reason: {banner}"
    );
    assert_eq!(
        t["puppet"]["banner"],
        Value::Null,
        "puppet has two backends up"
    );
    assert_eq!(
        t["puppetca"]["banner"],
        Value::Null,
        "puppetca has its backup"
    );

    // 4. The active backend of `balance: first`, and only there.
    let ca = t["puppetca"]["caption"].as_str().unwrap_or("");
    assert!(ca.contains("active: ca2"), "{ca}");
    let active: Vec<String> = ["puppet", "puppetca", "puppetdb"]
        .iter()
        .flat_map(|s| rows(s))
        .filter(|r| r["active"] == true)
        .map(|r| cell(&r, 0))
        .collect();
    assert_eq!(active, ["ca2 ACTIVE"], "rows marked active");
    assert!(t["puppetdb"]["caption"]
        .as_str()
        .is_some_and(|c| !c.contains("active:")));

    // 5. `crossbar status` shows the same: each row (health under drain and
    // disabled, the last check and its error), the banner and its reasons, the
    // active backend, the weight set at run time and the way back.
    let status = crossbar_status(admin);
    for svc in ["puppet", "puppetca", "puppetdb"] {
        for r in rows(svc) {
            let cells: Vec<String> = serde_json::from_value(r["cells"].clone()).expect("cells");
            status_agrees_with_the_page(&status, &cells);
        }
    }
    let banner_line = status
        .lines()
        .find(|l| l.contains("NO BACKEND AVAILABLE"))
        .unwrap_or_else(|| panic!("no banner in\n{status}"));
    for why in [
        "db1 DOWN: its tls-hello check fails",
        "db2 DISABLED in the file (health up)",
    ] {
        assert!(
            banner.contains(why) && banner_line.contains(why),
            "{banner_line}"
        );
    }
    assert_eq!(
        status.matches("NO BACKEND AVAILABLE").count(),
        1,
        "puppetdb only: {status}"
    );
    assert!(status.contains("\n  active: ca2 "), "{status}");
    assert_eq!(status_row(&status, "ca2")[2], "up (active)");
    assert_eq!(status_row(&status, C1)[4], "4 (operator; file 1)");
    for next in [
        format!("reset puppet/{C1}"),
        format!("enable puppet/{C2}"),
        "enable puppetdb/db2".to_string(),
    ] {
        assert!(
            status.contains(&format!(
                "next: crossbar backend {next} --admin http://{admin}"
            )),
            "{next}: {status}"
        );
    }

    // 6. Failure counts red while failing, neutral once passing.
    let red = page["red"].as_str().expect("red");
    let colours = |r: &Value| -> Vec<String> {
        serde_json::from_value(r["count_colours"].clone()).expect("colours")
    };
    let c3_row = row("puppet", C3);
    assert!(
        cell(&c3_row, 11).parse::<u64>().is_ok_and(|n| n > 0),
        "{c3_row}"
    );
    assert_ne!(
        colours(&c3_row)[1],
        red,
        "past check failures in red: {c3_row}"
    );
    for (svc, b) in [("puppet", C2), ("puppetca", "ca1"), ("puppetdb", "db1")] {
        let r = row(svc, b);
        assert!(cell(&r, 11).parse::<u64>().is_ok_and(|n| n > 0), "{r}");
        assert_eq!(colours(&r)[1], red, "{svc}/{b} failing now: {r}");
    }
}
