//! The admin endpoint over plain HTTP/1.1 on loopback, as a test reads it: GET a
//! page (its body), GET a JSON document, POST a reload. One request per connection
//! (`Connection: close`), the answer read until the server closes, bounded by
//! [`WAIT`].
use std::net::SocketAddr;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{raw_request, status_of, WAIT};

/// The request line and headers of `METHOD path` with no body.
pub fn request(method: &str, path: &str) -> Vec<u8> {
    let length = if method == "GET" {
        ""
    } else {
        "Content-Length: 0\r\n"
    };
    format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\n{length}Connection: close\r\n\r\n")
        .into_bytes()
}

/// The body of a raw HTTP answer (empty if there is none).
pub fn body_of(answer: &str) -> &str {
    answer.split_once("\r\n\r\n").map_or("", |(_, b)| b)
}

/// The body of `GET path` on the admin endpoint at `admin`; fails the test on any
/// other status than 200.
pub async fn admin_get(admin: SocketAddr, path: &str) -> String {
    let (status, text) = raw_request(admin, &request("GET", path), WAIT).await;
    assert_eq!(status, Some(200), "GET {path}: {text}");
    body_of(&text).to_string()
}

/// `GET path` on the admin endpoint at `admin`, as JSON (200 asserted).
pub async fn admin_json(admin: SocketAddr, path: &str) -> Value {
    let body = admin_get(admin, path).await;
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: {e}: {body}"))
}

/// The body of `GET path` if the admin endpoint at `admin` can be reached and
/// answers 200; `None` otherwise (a process starting, stopping or gone).
pub async fn try_admin_get(admin: SocketAddr, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(admin).await.ok()?;
    s.write_all(&request("GET", path)).await.ok()?;
    let mut out = Vec::new();
    tokio::time::timeout(WAIT, s.read_to_end(&mut out))
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8(out).ok()?;
    (status_of(&text) == Some(200)).then(|| body_of(&text).to_string())
}

/// `POST /api/reload` on the admin endpoint at `admin` (what SIGHUP does): the
/// status and the body of the answer.
pub async fn api_reload(admin: SocketAddr) -> (Option<u16>, String) {
    let (status, text) = raw_request(admin, &request("POST", "/api/reload"), WAIT).await;
    (status, body_of(&text).to_string())
}
