//! `crossbar status | table | backend | reload`: clients of the admin API.
//!
//! One HTTP/1.1 request per command over hyper's client connection (no pooling:
//! a command is one request). Output is a compact aligned table, or the server's
//! JSON as is with `--json`.
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper::header::{AUTHORIZATION, HOST};
use hyper::{Method, Request, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpStream;

use crate::admin::{Action, Secret};

/// The default admin URL (the admin endpoint's default listen address).
pub const DEFAULT_ADMIN_URL: &str = "http://127.0.0.1:9140";
pub use crate::config::admin_url;

/// Time for the whole request: connect, send, read the answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the admin API is and how to talk to it.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Base URL, `http://host:port`.
    pub admin: String,
    /// File holding the bearer token for write commands.
    pub token_file: Option<PathBuf>,
    /// Print the server's JSON instead of a table.
    pub json: bool,
}

/// One client command.
#[derive(Debug, Clone)]
pub enum Command {
    /// Services, listeners and backends.
    Status,
    /// A stick table's most recent entries.
    TableShow {
        /// Service name.
        service: String,
        /// Entries to show (server default 1000).
        limit: Option<usize>,
    },
    /// Empty a stick table.
    TableFlush {
        /// Service name.
        service: String,
    },
    /// Drain, enable or disable a backend.
    Backend {
        /// Service name.
        service: String,
        /// Backend name.
        backend: String,
        /// What to do.
        action: Action,
    },
    /// Reload the configuration file.
    Reload,
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

impl Command {
    fn request(&self) -> (Method, String) {
        match self {
            Command::Status => (Method::GET, "/api/services".into()),
            Command::TableShow { service, limit } => {
                let q = limit.map(|n| format!("?limit={n}")).unwrap_or_default();
                (Method::GET, format!("/api/tables/{service}{q}"))
            }
            Command::TableFlush { service } => (Method::DELETE, format!("/api/tables/{service}")),
            Command::Backend {
                service,
                backend,
                action,
            } => (
                Method::POST,
                format!("/api/backends/{service}/{backend}/{}", action_name(*action)),
            ),
            Command::Reload => (Method::POST, "/api/reload".into()),
        }
    }
}

fn action_name(a: Action) -> &'static str {
    match a {
        Action::Drain => "drain",
        Action::Enable => "enable",
        Action::Disable => "disable",
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
    let body = request(&opts.admin, method, &path, token.as_ref()).await?;
    if opts.json {
        return Ok(body);
    }
    let v: Value =
        serde_json::from_str(&body).map_err(|e| CliError::BadAnswer(format!("{e}: {body}")))?;
    Ok(match cmd {
        Command::Status => status_table(&v),
        Command::TableShow { .. } => table_view(&v),
        Command::TableFlush { service } => {
            format!("{service}: flushed {} entries\n", v["flushed"])
        }
        Command::Backend {
            service, backend, ..
        } => format!(
            "{service}/{backend}: {} ({} active connections)\n",
            v["state"].as_str().unwrap_or("?"),
            v["active_connections"]
        ),
        Command::Reload => "reloaded\n".to_string(),
    })
}

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
            .map_err(|e| transport(format!("connect: {e}")))?;
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

fn status_table(v: &Value) -> String {
    let mut out = String::new();
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
                text(&b["weight"]),
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
    let mut rows = vec![["KIND", "KEY", "BACKEND", "AGE", "EXPIRES IN"]
        .map(String::from)
        .to_vec()];
    for e in &entries {
        rows.push(vec![
            text(&e["kind"]),
            text(&e["key"]),
            if e["backend"].is_null() {
                "(shared)".to_string()
            } else {
                text(&e["backend"])
            },
            format!("{}s", e["age_seconds"]),
            format!("{}s", e["expires_in_seconds"]),
        ]);
    }
    out.push_str(&columns(&rows));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn aligned() {
        let rows = vec![
            vec!["A".to_string(), "BB".to_string(), "C".to_string()],
            vec!["aaa".to_string(), "b".to_string(), "c".to_string()],
        ];
        assert_eq!(columns(&rows), "A    BB  C\naaa  b   c\n");
    }
}
