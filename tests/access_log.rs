//! The access log is written off the connection path (src/log_writer.rs): every
//! connection's line is in the log after a clean stop, and a log destination that
//! stops reading does not stop connections. The lines crossbar formats itself (plain
//! text, `access_log.rs`) still obey `RUST_LOG`. The line times the queue and the
//! connect, in text and JSON.
mod common;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{
    admin_get, free_port, metric_value, wait_listening, wait_until_async, within, Backend,
    ChildGuard,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Hang guard for a whole test (never a measure of speed).
const WAIT: Duration = Duration::from_secs(120);
/// Connections per test: their lines (~250 bytes each) are several times what a
/// pipe holds (64 KiB), so a writer that waited on a full pipe would stall.
const CONNECTIONS: usize = 1000;

/// `RUST_LOG` with the access log on (and little else).
const ACCESS_LOG_ON: &str = "warn,crossbar::access=info";

/// `crossbar run` with `RUST_LOG=filter`, its stderr to `stderr`.
fn run_with_filter(
    dir: &Path,
    listen: SocketAddr,
    backend: SocketAddr,
    stderr: Stdio,
    filter: &str,
) -> ChildGuard {
    let yaml = format!(
        "admin: {{ enabled: false }}\n\
         services:\n  svc:\n    listen: [\"{listen}\"]\n    mode: tcp\n    health: {{ check: none }}\n\
         \x20   backends:\n      - {{ name: echo, address: \"{backend}\" }}\n"
    );
    let cfg = dir.join("crossbar.yaml");
    std::fs::write(&cfg, yaml).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_crossbar"))
        .arg("run")
        .arg("-c")
        .arg(&cfg)
        .env("RUST_LOG", filter)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("spawn crossbar");
    ChildGuard(child)
}

/// One echo round trip on a fresh connection; the client's address.
async fn ping(addr: SocketAddr) -> std::io::Result<SocketAddr> {
    let mut s = TcpStream::connect(addr).await?;
    let me = s.local_addr()?;
    s.write_all(b"ping").await?;
    let mut got = [0u8; 4];
    s.read_exact(&mut got).await?;
    assert_eq!(&got, b"ping");
    Ok(me)
}

/// Connect until the listener answers (its first lines are not counted).
async fn wait_serving(addr: SocketAddr) {
    within("crossbar serving", async {
        while ping(addr).await.is_err() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

/// `CONNECTIONS` echo round trips, one after another; their clients' addresses.
async fn round_trips(addr: SocketAddr) -> Vec<SocketAddr> {
    let mut clients = Vec::with_capacity(CONNECTIONS);
    for _ in 0..CONNECTIONS {
        clients.push(ping(addr).await.expect("a round trip through crossbar"));
    }
    clients
}

/// Run crossbar with `RUST_LOG=filter` and its stderr in a file, put `traffic`
/// through its listen address, stop it cleanly (SIGTERM, exit 0) and return what it
/// logged with what `traffic` returned.
async fn logged_run<T, F: std::future::Future<Output = T>>(
    filter: &str,
    traffic: impl FnOnce(SocketAddr) -> F,
) -> (String, T) {
    let echo = Backend::echo("echo", false).await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("stderr.log");
    let listen = free_port();
    let file = std::fs::File::create(&log).unwrap();
    let mut p = run_with_filter(dir.path(), listen, echo.addr, Stdio::from(file), filter);
    wait_serving(listen).await;
    let out = traffic(listen).await;
    p.signal("TERM");
    assert_eq!(p.exited(WAIT).await, Some(0), "exit status after SIGTERM");
    (std::fs::read_to_string(&log).unwrap(), out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_connection_is_logged_by_a_clean_stop() {
    let traffic = |listen| within("round trips", round_trips(listen));
    let (text, clients) = logged_run(ACCESS_LOG_ON, traffic).await;
    let logged: HashSet<&str> = text
        .lines()
        .filter(|l| l.contains("crossbar::access"))
        .filter_map(|l| l.split("client=").nth(1)?.split(' ').next())
        .collect();
    let missing: Vec<_> = clients
        .iter()
        .filter(|c| !logged.contains(c.to_string().as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "{} of {CONNECTIONS} connections have no access-log line, e.g. {:?}",
        missing.len(),
        missing.first()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_log_destination_does_not_stall_connections() {
    let echo = Backend::echo("echo", false).await;
    let dir = tempfile::tempdir().unwrap();
    let listen = free_port();
    // A pipe nobody reads: full after a few hundred lines.
    let mut p = run_with_filter(dir.path(), listen, echo.addr, Stdio::piped(), ACCESS_LOG_ON);
    let unread = p.0.stderr.take();
    wait_serving(listen).await;
    let clients = within("round trips with the log stalled", round_trips(listen)).await;
    assert_eq!(clients.len(), CONNECTIONS);
    drop(unread);
    p.signal("TERM");
    // Its stderr is gone: the exit status is not what this test is about.
    p.exited(WAIT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_log_still_silences_the_access_log() {
    let traffic = |listen| async move {
        for _ in 0..10 {
            ping(listen).await.expect("a round trip through crossbar");
        }
    };
    let (text, ()) = logged_run("info,crossbar::access=warn", traffic).await;
    // Other info lines are there (the filter works, the log is written)...
    assert!(text.contains("shutdown complete"), "{text}");
    // ...and the drain line counts connections, not the listener's accept loop:
    // every round trip had ended.
    let draining = text
        .lines()
        .find(|l| l.contains("shutting down: no new connections"))
        .unwrap_or_else(|| panic!("no drain line: {text}"));
    assert!(
        draining.contains(" connections=0") && !draining.contains("open="),
        "{draining}"
    );
    // ...but no access line.
    assert!(!text.contains("crossbar::access"), "{text}");
}

/// The fields of the access-log line of the connection from `client` in `log`,
/// text (`name=value`) or JSON, as strings: absent fields are absent.
fn line_of(log: &str, client: SocketAddr) -> HashMap<String, String> {
    let client = client.to_string();
    let line = log
        .lines()
        .filter(|l| l.contains("crossbar::access"))
        .find(|l| {
            l.contains(&format!("client={client} "))
                || l.contains(&format!("\"client\":\"{client}\""))
        })
        .unwrap_or_else(|| panic!("no access-log line of {client} in\n{log}"));
    if line.starts_with('{') {
        let v: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
        let o = v.as_object().expect("a JSON object");
        return o
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().map_or(v.to_string(), str::to_string)))
            .collect();
    }
    // Text: the fields after the target, `name=value` (the values these tests read
    // hold no spaces).
    let fields = line.split("crossbar::access: ").nth(1).unwrap_or("");
    fields
        .split(' ')
        .filter_map(|f| f.split_once('='))
        .map(|(k, v)| (k.to_string(), v.trim_matches('"').to_string()))
        .collect()
}

/// A number field of a line, if there.
fn number(line: &HashMap<String, String>, key: &str) -> Option<u64> {
    line.get(key).map(|v| {
        v.parse()
            .unwrap_or_else(|e| panic!("{key}={v}: not a number ({e}): {line:?}"))
    })
}

/// `crossbar run` on `yaml` in `dir`, logging in `format` (`text`, `json`) with
/// the access log on, its stderr in a file: the process and the file's path.
fn run_in(dir: &Path, format: &str, yaml: &str) -> (ChildGuard, std::path::PathBuf) {
    let cfg = dir.join("crossbar.yaml");
    std::fs::write(&cfg, yaml).unwrap();
    let log = dir.join("stderr.log");
    let p = ChildGuard(
        Command::new(env!("CARGO_BIN_EXE_crossbar"))
            .args(["--log-format", format, "run", "-c"])
            .arg(&cfg)
            .env("RUST_LOG", ACCESS_LOG_ON)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
            .spawn()
            .expect("spawn crossbar"),
    );
    (p, log)
}

/// `crossbar run` (log format `format`) in front of one echo backend that takes one
/// connection at a time, with a queue of one place: a first client holds the slot,
/// a second queues behind it, a third finds the queue full; the first leaves and
/// the second is served. The three clients' lines, after a clean stop.
async fn queued_behind_a_limit(format: &str) -> [HashMap<String, String>; 3] {
    let echo = Backend::echo("echo", false).await;
    let dir = tempfile::tempdir().unwrap();
    let (listen, admin) = (free_port(), free_port());
    let yaml = format!(
        "admin: {{ listen: \"{admin}\" }}\n\
         services:\n  svc:\n    listen: [\"{listen}\"]\n    mode: tcp\n    health: {{ check: none }}\n\
         \x20   queue_size: 1\n    timeouts: {{ queue: 1m }}\n\
         \x20   backends:\n      - {{ name: echo, address: \"{}\", max_connections: 1 }}\n",
        echo.addr
    );
    let (mut p, log) = run_in(dir.path(), format, &yaml);
    wait_serving(listen).await;
    wait_listening(admin).await;
    let waiting = |n: f64| async move {
        let text = admin_get(admin, "/metrics").await;
        metric_value(&text, "crossbar_queue_waiting", &[("service", "svc")]) == n
    };

    let mut first = TcpStream::connect(listen).await.unwrap();
    first.write_all(b"ping").await.unwrap();
    let mut got = [0u8; 4];
    within("the first echo", first.read_exact(&mut got))
        .await
        .unwrap();
    let mut second = TcpStream::connect(listen).await.unwrap();
    second.write_all(b"ping").await.unwrap();
    wait_until_async("the second connection queued", || waiting(1.0)).await;
    // The queue's one place is taken: refused at once, no backend reached.
    let mut third = TcpStream::connect(listen).await.unwrap();
    let mut rest = Vec::new();
    let _ = within("the third refused", third.read_to_end(&mut rest)).await; // ok: closed or reset
    let clients = [&first, &second, &third].map(|s| s.local_addr().unwrap());
    drop(first);
    within("the queued echo", second.read_exact(&mut got))
        .await
        .unwrap();
    assert_eq!(&got, b"ping");
    drop(second);
    wait_until_async("the queue empty", || waiting(0.0)).await;
    p.signal("TERM");
    assert_eq!(p.exited(WAIT).await, Some(0), "exit status after SIGTERM");
    let text = std::fs::read_to_string(&log).unwrap();
    clients.map(|c| line_of(&text, c))
}

/// `queue_ms` and `connect_ms` (HAProxy's `Tw` and `Tc`), in text and in JSON:
/// present for a connection served at once, `queue_ms` above 0 for one that
/// queued, and for one refused with the queue full `queue_ms=0` (it never
/// queued) and no `connect_ms` (no backend dialled) (issue #53 item 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_times_the_queue_and_the_connect() {
    for format in ["text", "json"] {
        let [first, second, third] = queued_behind_a_limit(format).await;
        // The first may have queued for a moment behind the readiness probe's
        // connection, still closing: only there.
        assert!(number(&first, "queue_ms").is_some(), "{format}: {first:?}");
        assert!(
            number(&first, "connect_ms").is_some(),
            "{format}: {first:?}"
        );
        assert!(
            number(&second, "queue_ms").is_some_and(|ms| ms > 0),
            "{format}: the queued one: {second:?}"
        );
        assert!(
            number(&second, "connect_ms").is_some(),
            "{format}: {second:?}"
        );
        assert_eq!(
            third.get("end").map(String::as_str),
            Some("refused:queue_full"),
            "{format}: {third:?}"
        );
        assert_eq!(number(&third, "queue_ms"), Some(0), "{format}: {third:?}");
        assert_eq!(
            number(&third, "connect_ms"),
            None,
            "{format}: no backend reached: {third:?}"
        );
    }
}

/// A dial that fails is timed too (`connect_ms` counts every try, as HAProxy's
/// `Tc` counts retries): the line of a connection whose only backend refuses ends
/// `connect_failed` and says how long its dial took; `queue_ms` is 0 (a slot was
/// free, it never queued).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_dial_is_timed() {
    // Bound, never listening: refuses every connect, and no other test's listener
    // can be given its port meanwhile.
    let refusing =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    refusing
        .bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
        .expect("bind");
    let dead = refusing
        .local_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .expect("an address");
    for format in ["text", "json"] {
        let dir = tempfile::tempdir().unwrap();
        let listen = free_port();
        let yaml = format!(
            "admin: {{ enabled: false }}\n\
             services:\n  svc:\n    listen: [\"{listen}\"]\n    mode: tcp\n    health: {{ check: none }}\n\
             \x20   retries: 0\n    backends:\n      - {{ name: dead, address: \"{dead}\" }}\n"
        );
        let (mut p, log) = run_in(dir.path(), format, &yaml);
        wait_listening(listen).await;
        let mut client = TcpStream::connect(listen).await.unwrap();
        let me = client.local_addr().unwrap();
        let mut rest = Vec::new();
        let _ = within(
            "closed after the failed dial",
            client.read_to_end(&mut rest),
        )
        .await; // ok: closed or reset
        p.signal("TERM");
        assert_eq!(p.exited(WAIT).await, Some(0), "exit status after SIGTERM");
        let line = line_of(&std::fs::read_to_string(&log).unwrap(), me);
        assert_eq!(
            line.get("end").map(String::as_str),
            Some("connect_failed"),
            "{format}: {line:?}"
        );
        assert!(number(&line, "connect_ms").is_some(), "{format}: {line:?}");
        assert_eq!(number(&line, "queue_ms"), Some(0), "{format}: {line:?}");
    }
}
