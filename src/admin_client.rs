//! `crossbar status | table | backend | connections | sources | reload`: clients of the admin API.
//!
//! One HTTP/1.1 request per command over hyper's client connection (no pooling:
//! a command is one request). Output is a compact aligned table, or the server's
//! JSON as is with `--json`. The admin address and token file come from `--admin`
//! and `--token-file`, else the environment, else the config file given with `-c`
//! ([`ClientOptions::new`]); when nothing answers there, the error says which
//! address was tried, where it came from and how to point at another.
use std::fmt::Write as _;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper::header::{AUTHORIZATION, HOST};
use hyper::{Method, Request, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpStream;

use crate::admin::{Action, Secret, WeightAsk};

/// The default admin URL (the admin endpoint's default listen address).
pub const DEFAULT_ADMIN_URL: &str = "http://127.0.0.1:9140";
pub use crate::config::admin_url;

/// Time for the whole request: connect, send, read the answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the admin address a command uses came from (said when nothing answers there).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminSource {
    /// Nothing given: [`DEFAULT_ADMIN_URL`].
    Default,
    /// `--admin`.
    Flag,
    /// `CROSSBAR_ADMIN` in the environment.
    Env,
    /// `admin.listen` of the config file given with `-c`.
    Config(PathBuf),
}

impl std::fmt::Display for AdminSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AdminSource::Default => write!(
                f,
                "the default (no -c FILE, --admin or CROSSBAR_ADMIN given)"
            ),
            AdminSource::Flag => write!(f, "the one given with --admin"),
            AdminSource::Env => write!(f, "the one in CROSSBAR_ADMIN (environment)"),
            AdminSource::Config(p) => write!(f, "admin.listen of {}", p.display()),
        }
    }
}

/// Where the admin API is and how to talk to it.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Base URL, `http://host:port`.
    pub admin: String,
    /// Where `admin` came from.
    pub source: AdminSource,
    /// File holding the bearer token for write commands.
    pub token_file: Option<PathBuf>,
    /// Print the server's JSON instead of a table.
    pub json: bool,
}

/// What the command line said about the admin endpoint.
#[derive(Debug, Clone, Default)]
pub struct Given {
    /// `--admin URL` or `CROSSBAR_ADMIN`.
    pub url: Option<String>,
    /// `url` came from the environment, not the flag.
    pub url_from_env: bool,
    /// `--token-file` or `CROSSBAR_TOKEN_FILE`.
    pub token_file: Option<PathBuf>,
    /// `--json`.
    pub json: bool,
}

/// `-c FILE` names a config without an admin endpoint.
#[derive(Debug, thiserror::Error)]
#[error("{} disables the admin endpoint (admin.enabled: false): there is no admin API to talk to (a reload is then SIGHUP: systemctl kill -s HUP crossbar)", .0.display())]
pub struct NoAdminEndpoint(pub PathBuf);

impl ClientOptions {
    /// The options of an admin command: `--admin`/`--token-file` (or their
    /// environment variables) first, then `admin.listen` and `admin.token_file` of
    /// `config` (the file given with `-c`, loaded), then the default address.
    pub fn new(
        given: Given,
        config: Option<(&Path, &crate::config::Config)>,
    ) -> Result<ClientOptions, NoAdminEndpoint> {
        let from_file = match config {
            Some((path, cfg)) => match &cfg.admin {
                Some(a) => Some((path, a)),
                None => return Err(NoAdminEndpoint(path.to_path_buf())),
            },
            None => None,
        };
        let (admin, source) = match (given.url, from_file) {
            (Some(url), _) if given.url_from_env => (url, AdminSource::Env),
            (Some(url), _) => (url, AdminSource::Flag),
            (None, Some((path, a))) => (admin_url(a.listen), AdminSource::Config(path.into())),
            (None, None) => (DEFAULT_ADMIN_URL.to_string(), AdminSource::Default),
        };
        let token_file = given
            .token_file
            .or_else(|| from_file.and_then(|(_, a)| a.token_file.clone()));
        Ok(ClientOptions {
            admin,
            source,
            token_file,
            json: given.json,
        })
    }
}

/// One client command.
#[derive(Debug, Clone)]
pub enum Command {
    /// Services, listeners and backends.
    Status,
    /// A stick table's most recent entries, or those of one key or client.
    TableShow {
        /// Service name.
        service: String,
        /// Entries to show (server default 1000).
        limit: Option<usize>,
        /// Only this entry or client's entries.
        pick: Option<Pick>,
    },
    /// Empty a stick table.
    TableFlush {
        /// Service name.
        service: String,
    },
    /// Delete one entry, or a client's entries.
    TableDelete {
        /// Service name.
        service: String,
        /// Which.
        pick: Pick,
    },
    /// Drain, enable or disable a backend.
    Backend {
        /// Service name.
        service: String,
        /// Backend name.
        backend: String,
        /// What to do.
        action: Action,
        /// Also when it is the service's last available backend.
        force: bool,
    },
    /// Set a backend's weight until the next reload or restart.
    Weight {
        /// Service name.
        service: String,
        /// Backend name.
        backend: String,
        /// The new weight, or a percentage of the configured one.
        weight: WeightAsk,
        /// Also weight 0 on the service's last backend taking new connections.
        force: bool,
    },
    /// The open connections (the oldest first).
    Connections {
        /// Only this service's.
        service: Option<String>,
        /// Only this client's.
        client: Option<IpAddr>,
        /// At most this many (server default 100).
        limit: Option<usize>,
    },
    /// The sources with the most open connections, per listener with `per_source`.
    Sources {
        /// At most this many per listener (server default 20).
        limit: Option<usize>,
    },
    /// Reload the configuration file.
    Reload,
}

/// Stick entries named by the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick {
    /// The entry with this key (the 16 hex digits `table show` prints).
    Key(u64),
    /// The entries learned from this client address.
    Client(IpAddr),
}

impl Pick {
    fn query(&self) -> String {
        match self {
            Pick::Key(k) => format!("key={k:016x}"),
            Pick::Client(ip) => format!("client={ip}"),
        }
    }
}

/// Parse a stick key as `table show` prints it (16 hex digits).
pub fn parse_key(s: &str) -> Result<u64, String> {
    u64::from_str_radix(s, 16)
        .ok()
        .filter(|_| s.len() == 16 && s.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| format!("expected the 16 hex digits `table show` prints, got {s:?}"))
}

/// A client command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// `--admin` is not an `http://host:port` URL.
    #[error("bad admin URL {0:?}: expected http://HOST:PORT")]
    BadUrl(String),
    /// The token file is unusable.
    #[error(transparent)]
    Token(#[from] crate::admin::TokenError),
    /// Connecting or talking to the admin endpoint failed.
    #[error("admin endpoint {url}: {reason}")]
    Transport {
        /// The URL.
        url: String,
        /// What went wrong.
        reason: String,
    },
    /// Nothing listens at the admin address.
    #[error("nothing answers at {url} (connection refused): is crossbar running?\n  \
             the address is {from}\n  \
             to use another: -c FILE (admin.listen and admin.token_file of crossbar's \
             config, e.g. -c {default_config}), --admin http://HOST:PORT or \
             CROSSBAR_ADMIN=http://HOST:PORT\n  \
             to see whether it runs: systemctl status crossbar (journalctl -u crossbar \
             says why it stopped)", default_config = crate::config::DEFAULT_CONFIG_PATH)]
    NotRunning {
        /// The URL tried.
        url: String,
        /// Where it came from.
        from: AdminSource,
    },
    /// The server answered with an error; `body` is its JSON error.
    #[error("{status}: {}", error_message(body))]
    Api {
        /// HTTP status.
        status: StatusCode,
        /// The response body (`{"error": "..."}`).
        body: String,
    },
    /// The server's answer is not the JSON expected.
    #[error("unexpected answer from the admin endpoint: {0}")]
    BadAnswer(String),
}

fn error_message(body: &str) -> String {
    serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|v| v.get("error")?.as_str().map(str::to_string))
        .unwrap_or_else(|| body.trim().to_string())
}

/// `?a&b` from the parameters given, or "".
fn query(params: &[Option<String>]) -> String {
    let given: Vec<&str> = params.iter().flatten().map(String::as_str).collect();
    if given.is_empty() {
        String::new()
    } else {
        format!("?{}", given.join("&"))
    }
}

impl Command {
    fn request(&self) -> (Method, String) {
        match self {
            Command::Status => (Method::GET, "/api/services".into()),
            Command::TableShow {
                service,
                limit,
                pick,
            } => {
                let q = query(&[limit.map(|n| format!("limit={n}")), pick.map(|p| p.query())]);
                (Method::GET, format!("/api/tables/{service}{q}"))
            }
            Command::TableFlush { service } => (Method::DELETE, format!("/api/tables/{service}")),
            Command::TableDelete { service, pick } => (
                Method::DELETE,
                format!("/api/tables/{service}?{}", pick.query()),
            ),
            Command::Backend {
                service,
                backend,
                action,
                force,
            } => (
                Method::POST,
                format!(
                    "/api/backends/{service}/{backend}/{}{}",
                    action.as_str(),
                    if *force { "?force=true" } else { "" }
                ),
            ),
            Command::Weight {
                service,
                backend,
                weight,
                force,
            } => {
                let w = match weight {
                    WeightAsk::Absolute(w) => format!("weight={w}"),
                    WeightAsk::Percent(p) => format!("weight={p}%25"),
                };
                let q = query(&[Some(w), force.then(|| "force=true".to_string())]);
                (
                    Method::POST,
                    format!("/api/backends/{service}/{backend}/weight{q}"),
                )
            }
            Command::Connections {
                service,
                client,
                limit,
            } => {
                let q = query(&[
                    service.as_ref().map(|s| format!("service={s}")),
                    client.map(|c| format!("client={c}")),
                    limit.map(|n| format!("limit={n}")),
                ]);
                (Method::GET, format!("/api/connections{q}"))
            }
            Command::Sources { limit } => {
                let q = query(&[limit.map(|n| format!("limit={n}"))]);
                (Method::GET, format!("/api/sources{q}"))
            }
            Command::Reload => (Method::POST, "/api/reload".into()),
        }
    }
}

/// Run a command; returns what to print on stdout.
pub async fn run(opts: &ClientOptions, cmd: &Command) -> Result<String, CliError> {
    let token = opts
        .token_file
        .as_deref()
        .map(Secret::from_file)
        .transpose()?;
    let (method, path) = cmd.request();
    let body = match request(&opts.admin, method, &path, token.as_ref()).await {
        Err(CliError::Transport { url, reason }) if reason.starts_with(REFUSED) => {
            return Err(CliError::NotRunning {
                url,
                from: opts.source.clone(),
            })
        }
        r => r?,
    };
    if opts.json {
        return Ok(body);
    }
    let v: Value =
        serde_json::from_str(&body).map_err(|e| CliError::BadAnswer(format!("{e}: {body}")))?;
    Ok(match cmd {
        Command::Status => status_table(&v),
        Command::TableShow { pick: None, .. } => table_view(&v),
        Command::TableShow { pick: Some(p), .. } => picked_view(&v, p),
        Command::TableFlush { service } => {
            format!("{service}: flushed {} entries\n", v["flushed"])
        }
        Command::TableDelete { service, .. } => {
            let mut out = String::new();
            for e in v["deleted"].as_array().into_iter().flatten() {
                let _ = writeln!(
                    out,
                    "{service}: deleted {} {} ({})",
                    text(&e["kind"]),
                    text(&e["key"]),
                    backend_cell(e)
                ); // ok: writing to a String
            }
            out
        }
        Command::Connections { .. } => connections_view(&v),
        Command::Sources { .. } => sources_view(&v),
        Command::Backend {
            service, backend, ..
        } => format!(
            "{service}/{backend}: {} ({} active connections)\n",
            v["state"].as_str().unwrap_or("?"),
            v["active_connections"]
        ),
        Command::Weight {
            service, backend, ..
        } => format!(
            "{service}/{backend}: weight {} (was {}; {}, {} active connections)\n  \
             until the next reload or restart, which return it to the configured weight {}\n",
            v["weight"],
            v["previous_weight"],
            v["state"].as_str().unwrap_or("?"),
            v["active_connections"],
            v["configured_weight"],
        ),
        Command::Reload => reloaded(&v),
    })
}

/// How a refused connect's transport error starts (told apart by [`run`]).
const REFUSED: &str = "connect refused: ";

/// Split `http://host:port[/prefix]` into what to connect to and the path prefix.
fn target(base: &str) -> Result<(String, u16, String), CliError> {
    let bad = || CliError::BadUrl(base.to_string());
    let uri: Uri = base.parse().map_err(|_| bad())?;
    if uri.scheme_str() != Some("http") {
        return Err(bad());
    }
    let auth = uri.authority().ok_or_else(bad)?;
    let host = auth.host().trim_start_matches('[').trim_end_matches(']');
    let prefix = uri.path().trim_end_matches('/').to_string();
    Ok((host.to_string(), auth.port_u16().unwrap_or(80), prefix))
}

/// Send one request; the body of a 2xx answer, else [`CliError::Api`].
pub async fn request(
    base: &str,
    method: Method,
    path: &str,
    token: Option<&Secret>,
) -> Result<String, CliError> {
    let (host, port, prefix) = target(base)?;
    let transport = |reason: String| CliError::Transport {
        url: base.to_string(),
        reason,
    };
    let exchange = async {
        let tcp = TcpStream::connect((host.as_str(), port))
            .await
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::ConnectionRefused => transport(format!("{REFUSED}{e}")),
                _ => transport(format!("connect: {e}")),
            })?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .map_err(|e| transport(e.to_string()))?;
        let driver = tokio::spawn(conn);
        // An IPv6 address in brackets, as RFC 9110 writes it (the admin endpoint
        // checks Host: it must name the address or a loopback/allowed host).
        let authority = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        let mut req = Request::builder()
            .method(method)
            .uri(format!("{prefix}{path}"))
            .header(HOST, authority);
        if let Some(t) = token {
            req = req.header(AUTHORIZATION, format!("Bearer {}", t.expose()));
        }
        let req = req
            .body(Empty::<Bytes>::new())
            .map_err(|e| transport(e.to_string()))?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| transport(e.to_string()))?;
        let status = resp.status();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| transport(e.to_string()))?
            .to_bytes();
        driver.abort();
        let body = String::from_utf8_lossy(&bytes).into_owned();
        if status.is_success() {
            Ok(body)
        } else {
            Err(CliError::Api { status, body })
        }
    };
    tokio::time::timeout(REQUEST_TIMEOUT, exchange)
        .await
        .map_err(|_| transport(format!("no answer within {REQUEST_TIMEOUT:?}")))?
}

/// Lay rows out in columns, each as wide as its widest cell.
pub(crate) fn columns(rows: &[Vec<String>]) -> String {
    let n = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..n)
        .map(|i| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for r in rows {
        let mut line = String::new();
        for (i, c) in r.iter().enumerate() {
            if i + 1 == r.len() {
                line.push_str(c);
            } else {
                let _ = write!(line, "{c:<w$}  ", w = widths[i]); // ok: writing to a String
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".to_string(),
        other => other.to_string(),
    }
}

/// `reloaded`, then each warning of the reload on a line of its own.
fn reloaded(v: &Value) -> String {
    let mut out = "reloaded\n".to_string();
    for w in v["warnings"].as_array().into_iter().flatten() {
        let _ = writeln!(out, "warning: {}", text(w)); // ok: writing to a String
    }
    out
}

/// The process line and the last reload's result (and why it failed, or what it
/// warned about), as the status page's header shows them.
fn process_lines(p: &Value) -> String {
    let mut out = format!(
        "crossbar {}, up {}; config {}\n",
        text(&p["version"]),
        crate::admin::page::human_secs(p["uptime_seconds"].as_u64().unwrap_or(0)),
        text(&p["config"]),
    );
    let r = &p["last_reload"];
    let ago = crate::admin::page::human_secs(r["seconds_ago"].as_u64().unwrap_or(0));
    let _ = match r["ok"].as_bool() {
        None => writeln!(out, "last reload: none since start"),
        Some(true) => writeln!(out, "last reload: OK {ago} ago"),
        Some(false) => writeln!(
            out,
            "last reload: FAILED {ago} ago, running configuration kept: {}",
            text(&r["error"]).replace('\n', "; ")
        ),
    }; // ok: writing to a String
    for w in r["warnings"].as_array().into_iter().flatten() {
        let _ = writeln!(out, "  warning: {}", text(w)); // ok: writing to a String
    }
    out
}

fn status_table(v: &Value) -> String {
    let mut out = process_lines(&v["crossbar"]);
    out.push('\n');
    let empty = Vec::new();
    for svc in v["services"].as_array().unwrap_or(&empty) {
        let listeners: Vec<String> = svc["listeners"]
            .as_array()
            .unwrap_or(&empty)
            .iter()
            .map(text)
            .collect();
        let _ = writeln!(
            out,
            "{} ({}, {}) on {}{}",
            text(&svc["name"]),
            text(&svc["mode"]),
            text(&svc["balance"]),
            listeners.join(", "),
            match svc["stick_table"].as_object() {
                Some(t) => format!("; stick table {}/{}", t["entries"], t["capacity"]),
                None => String::new(),
            }
        ); // ok: writing to a String
        if let Some(line) = discovery_line(&svc["discovery"], unix_now()) {
            let _ = writeln!(out, "  {line}"); // ok: writing to a String
        }
        let mut rows = vec![
            ["BACKEND", "ADDRESS", "STATE", "ACTIVE", "WEIGHT", "BACKUP"]
                .map(String::from)
                .to_vec(),
        ];
        for b in svc["backends"].as_array().unwrap_or(&empty) {
            rows.push(vec![
                text(&b["name"]),
                text(&b["address"]),
                text(&b["state"]),
                text(&b["active_connections"]),
                weight_cell(b),
                if b["backup"].as_bool() == Some(true) {
                    "yes"
                } else {
                    "no"
                }
                .to_string(),
            ]);
        }
        for line in columns(&rows).lines() {
            let _ = writeln!(out, "  {line}"); // ok: writing to a String
        }
    }
    out
}

/// Now in Unix seconds (0 if the clock is before 1970).
fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A service's backends from DNS (`/api/services`' `discovery`, `now` in Unix
/// seconds): `backends from DNS: srv _x8140._tcp.example, 3 backends, resolved 12s
/// ago, next lookup 30s after the last`, then `; STALE: ...` while lookups fail.
/// `None` for a service with listed backends.
fn discovery_line(d: &Value, now: u64) -> Option<String> {
    d.as_object()?;
    let ago = |k: &str| match d[k].as_u64() {
        Some(t) => format!("{}s ago", now.saturating_sub(t)),
        None => "never".to_string(),
    };
    let mut line = format!(
        "backends from DNS: {} {}, {} backend{}",
        text(&d["kind"]),
        text(&d["name"]),
        d["backends"].as_u64().unwrap_or(0),
        if d["backends"].as_u64() == Some(1) {
            ""
        } else {
            "s"
        }
    );
    if let Some(n) = d["dropped"].as_u64().filter(|n| *n > 0) {
        let _ = write!(line, " ({n} more records left out: max_backends)"); // ok: String
    }
    let _ = write!(line, ", resolved {}", ago("last_resolved")); // ok: String
    if let Some(ms) = d["next_in_ms"].as_u64() {
        let _ = write!(line, ", next lookup {}s after the last", ms.div_ceil(1000));
        // ok: String
    }
    if d["stale"].as_bool() == Some(true) {
        let _ = write!(
            line,
            "; STALE: the last lookup ({}) failed ({}): the last good set serves on",
            ago("last_attempt"),
            text(&d["error"])
        ); // ok: String
    }
    Some(line)
}

/// The weight, and the file's when one was set at run time: `10 (file 20)`.
fn weight_cell(b: &Value) -> String {
    let configured = &b["configured_weight"];
    if configured.is_null() || *configured == b["weight"] {
        text(&b["weight"])
    } else {
        format!("{} (file {})", text(&b["weight"]), text(configured))
    }
}

fn table_view(v: &Value) -> String {
    let s = &v["stats"];
    let entries = v["entries"].as_array().cloned().unwrap_or_default();
    let mut out = format!(
        "{}: {} entries (capacity {}, expired {}, evicted {}); showing {}\n",
        text(&v["service"]),
        s["entries"],
        s["capacity"],
        s["expired"],
        s["evicted"],
        entries.len()
    );
    out.push_str(&entry_rows(&entries));
    out
}

fn backend_cell(e: &Value) -> String {
    if e["backend"].is_null() {
        "(shared)".to_string()
    } else {
        text(&e["backend"])
    }
}

/// Stick entries as a table with its header.
fn entry_rows(entries: &[Value]) -> String {
    let mut rows = vec![["KIND", "KEY", "BACKEND", "AGE", "EXPIRES IN"]
        .map(String::from)
        .to_vec()];
    for e in entries {
        rows.push(vec![
            text(&e["kind"]),
            text(&e["key"]),
            backend_cell(e),
            format!("{}s", e["age_seconds"]),
            format!("{}s", e["expires_in_seconds"]),
        ]);
    }
    columns(&rows)
}

/// `table show --key/--client`: what was looked up, then the entries found.
fn picked_view(v: &Value, pick: &Pick) -> String {
    let entries = v["entries"].as_array().cloned().unwrap_or_default();
    let l = &v["lookup"];
    let mut out = match pick {
        Pick::Key(_) => format!("{}: key {}: ", text(&v["service"]), text(&l["key"])),
        Pick::Client(_) => format!(
            "{}: client {} (source prefix {}): ",
            text(&v["service"]),
            text(&l["client"]),
            text(&l["prefix"])
        ),
    };
    out.push_str(match entries.len() {
        0 => "no entry\n",
        1 => "1 entry\n",
        _ => "entries\n",
    });
    if !entries.is_empty() {
        out.push_str(&entry_rows(&entries));
    }
    if let Pick::Client(ip) = pick {
        let _ = writeln!(
            out,
            "(session, ticket and PSK entries keep no client address; `crossbar connections --client {ip}` shows its open connections and their backends)"
        ); // ok: writing to a String
    }
    out
}

/// `crossbar connections`: a count line, then one row per connection.
fn connections_view(v: &Value) -> String {
    let list = v["connections"].as_array().cloned().unwrap_or_default();
    let mut out = format!(
        "{} open connection(s); showing the {} oldest\n",
        v["total"],
        list.len()
    );
    let mut rows = vec![[
        "SERVICE",
        "CLIENT",
        "BACKEND",
        "AGE",
        "C->S BYTES",
        "S->C BYTES",
        "STATE",
    ]
    .map(String::from)
    .to_vec()];
    for c in &list {
        rows.push(vec![
            text(&c["service"]),
            text(&c["client"]),
            text(&c["backend"]),
            format!("{}s", c["age_seconds"]),
            text(&c["bytes"]["client_to_server"]),
            text(&c["bytes"]["server_to_client"]),
            text(&c["state"]),
        ]);
    }
    out.push_str(&columns(&rows));
    out
}

/// `crossbar sources`: per listener with `per_source`, a line with its limits, then
/// one row per source (the most open connections first).
fn sources_view(v: &Value) -> String {
    let listeners = v["listeners"].as_array().cloned().unwrap_or_default();
    if listeners.is_empty() {
        return "no listener has per_source limits\n".into();
    }
    let mut out = String::new();
    for l in &listeners {
        let lim = &l["limits"];
        out.push_str(&format!(
            "{}: max_connections {}, rate {}, burst {}; {} of {} sources tracked\n",
            text(&l["listener"]),
            text(&lim["max_connections"]),
            text(&lim["rate"]),
            text(&lim["burst"]),
            text(&l["tracked"]),
            text(&lim["table_size"]),
        ));
        let mut rows = vec![["SOURCE", "OPEN", "TOKENS", "ADMITTED", "REFUSED"]
            .map(String::from)
            .to_vec()];
        for s in l["sources"].as_array().into_iter().flatten() {
            rows.push(
                ["source", "open", "tokens", "admitted", "refused"]
                    .iter()
                    .map(|k| text(&s[*k]))
                    .collect(),
            );
        }
        out.push_str(&columns(&rows));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovery_says_where_the_backends_come_from_and_when_it_went_stale() {
        let fresh = serde_json::json!({"kind": "srv", "name": "_x8140._tcp.example",
            "last_resolved": 990, "last_attempt": 990, "stale": false, "error": null,
            "backends": 3, "dropped": 2, "next_in_ms": 30000});
        assert_eq!(
            discovery_line(&fresh, 1000).as_deref(),
            Some(
                "backends from DNS: srv _x8140._tcp.example, 3 backends (2 more records left out: \
                 max_backends), resolved 10s ago, next lookup 30s after the last"
            )
        );
        let stale = serde_json::json!({"kind": "host", "name": "pool.example",
            "last_resolved": 900, "last_attempt": 995, "stale": true,
            "error": "timed out", "backends": 1, "dropped": 0, "next_in_ms": 5000});
        assert_eq!(
            discovery_line(&stale, 1000).as_deref(),
            Some(
                "backends from DNS: host pool.example, 1 backend, resolved 100s ago, next lookup \
                 5s after the last; STALE: the last lookup (5s ago) failed (timed out): the last \
                 good set serves on"
            )
        );
        assert_eq!(discovery_line(&Value::Null, 1000), None);
    }

    #[test]
    fn sources_are_a_line_per_listener_then_rows() {
        let v = serde_json::json!({"listeners": [{
            "listener": "127.0.0.1:8140", "tracked": 2,
            "limits": {"max_connections": 4, "rate": null, "burst": 1, "table_size": 100},
            "sources": [{"source": "192.0.2.7", "open": 4, "tokens": null, "admitted": 4, "refused": 99}]}]});
        let out = sources_view(&v);
        assert!(
            out.starts_with(
                "127.0.0.1:8140: max_connections 4, rate -, burst 1; 2 of 100 sources tracked\n"
            ),
            "{out}"
        );
        assert!(out.contains("192.0.2.7"), "{out}");
        assert!(
            out.lines()
                .nth(2)
                .is_some_and(|l| l.split_whitespace().collect::<Vec<_>>()
                    == ["192.0.2.7", "4", "-", "4", "99"]),
            "{out}"
        );
        assert_eq!(
            sources_view(&serde_json::json!({"listeners": []})),
            "no listener has per_source limits\n"
        );
    }

    #[test]
    fn urls() {
        assert_eq!(
            target("http://127.0.0.1:9140").unwrap(),
            ("127.0.0.1".into(), 9140, String::new())
        );
        assert_eq!(
            target("http://[::1]:9/x/").unwrap(),
            ("::1".into(), 9, "/x".into())
        );
        assert!(target("https://h:1").is_err());
        assert!(target("h:1").is_err());
    }

    #[test]
    fn options_come_from_flags_then_env_then_the_config_file() {
        let cfg = crate::config::Config::from_str_at(
            "admin: { listen: \"0.0.0.0:9999\", token_file: /etc/t }\nservices:\n  s:\n    listen: [\"127.0.0.1:0\"]\n    backends:\n      - { name: a, address: \"127.0.0.1:1\" }\n",
            Path::new("c.yaml"),
        )
        .unwrap();
        let file = Some((Path::new("c.yaml"), &cfg));
        let o = ClientOptions::new(Given::default(), file).unwrap();
        assert_eq!(o.admin, "http://127.0.0.1:9999");
        assert_eq!(o.source, AdminSource::Config("c.yaml".into()));
        assert_eq!(o.token_file, Some(PathBuf::from("/etc/t")));
        let flag = Given {
            url: Some("http://[::1]:1".into()),
            token_file: Some("/x".into()),
            ..Given::default()
        };
        let o = ClientOptions::new(flag.clone(), file).unwrap();
        assert_eq!(
            (o.admin.as_str(), o.source, o.token_file),
            ("http://[::1]:1", AdminSource::Flag, Some("/x".into()))
        );
        let env = Given {
            url_from_env: true,
            ..flag
        };
        assert_eq!(
            ClientOptions::new(env, None).unwrap().source,
            AdminSource::Env
        );
        let o = ClientOptions::new(Given::default(), None).unwrap();
        assert_eq!(
            (o.admin.as_str(), o.source),
            (DEFAULT_ADMIN_URL, AdminSource::Default)
        );
        let off = crate::config::Config::from_str_at(
            "admin: { enabled: false }\nservices:\n  s:\n    listen: [\"127.0.0.1:0\"]\n    backends:\n      - { name: a, address: \"127.0.0.1:1\" }\n",
            Path::new("off.yaml"),
        )
        .unwrap();
        assert!(ClientOptions::new(Given::default(), Some((Path::new("off.yaml"), &off))).is_err());
    }

    #[test]
    fn keys_are_16_hex_digits() {
        assert_eq!(parse_key("00000000000000ff"), Ok(255));
        assert!(parse_key("ff").is_err());
        assert!(parse_key("+0000000000000ff").is_err());
        assert!(parse_key("0x000000000000ff").is_err());
    }

    #[test]
    fn aligned() {
        let rows = vec![
            vec!["A".to_string(), "BB".to_string(), "C".to_string()],
            vec!["aaa".to_string(), "b".to_string(), "c".to_string()],
        ];
        assert_eq!(columns(&rows), "A    BB  C\naaa  b   c\n");
    }
}
