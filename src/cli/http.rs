//! One HTTP/1.1 request to the admin API over hyper's client connection (no
//! pooling: a command is one or two requests), and what can go wrong with it.
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper::header::{AUTHORIZATION, HOST};
use hyper::{Method, Request, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::options::{AdminSource, TokenSource};
use crate::admin::view::ErrorView;
use crate::admin::Secret;

/// Time for the whole request: connect, send, read the answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// How a refused connect's transport error starts (told apart by
/// [`super::client::run`]).
pub(super) const REFUSED: &str = "connect refused: ";

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
    /// The server refused the token sent (or asked for one).
    #[error("{status}: {}\n  \
             the token: {from}\n  \
             to send another: --token-file FILE (or CROSSBAR_TOKEN_FILE), or -c FILE \
             whose admin.token_file holds it (without -c, the admin address and token \
             come from {default_config} when it exists)", error_message(body),
             default_config = crate::config::DEFAULT_CONFIG_PATH)]
    Unauthorized {
        /// HTTP status (401).
        status: StatusCode,
        /// The response body (`{"error": "..."}`).
        body: String,
        /// Where the token came from.
        from: TokenSource,
    },
    /// The server answered with an error; `body` is its JSON error.
    #[error("{status}: {}", error_message(body))]
    Api {
        /// HTTP status.
        status: StatusCode,
        /// The response body (`{"error": "..."}`).
        body: String,
    },
    /// `--wait` ran out of time with connections left (which it names).
    #[error("{0}")]
    WaitTimedOut(String),
    /// `--wait` was interrupted (Ctrl-C); what was set stays.
    #[error("{0}")]
    WaitInterrupted(String),
    /// The server's answer is not the document this command reads.
    #[error(
        "unexpected answer from the admin endpoint to {path}: {reason} (a crossbar of \
             another version? `crossbar --version`, and --json prints the answer as it is)"
    )]
    BadAnswer {
        /// The path asked.
        path: String,
        /// Why it could not be read.
        reason: String,
    },
}

/// The `error` of an API error's body, or the body as it is.
fn error_message(body: &str) -> String {
    serde_json::from_str::<ErrorView>(body)
        .map(|e| e.error)
        .unwrap_or_else(|_| body.trim().to_string())
}

/// Split `http://host:port[/prefix]` into what to connect to and the path prefix.
pub(super) fn target(base: &str) -> Result<(String, u16, String), CliError> {
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
    fn api_errors_say_the_servers_message() {
        let e = CliError::Api {
            status: StatusCode::NOT_FOUND,
            body: "{\"error\":\"unknown service \\\"x\\\"\"}\n".into(),
        };
        assert_eq!(e.to_string(), "404 Not Found: unknown service \"x\"");
        let e = CliError::Api {
            status: StatusCode::BAD_GATEWAY,
            body: "<html>proxy</html>\n".into(),
        };
        assert_eq!(e.to_string(), "502 Bad Gateway: <html>proxy</html>");
    }
}
