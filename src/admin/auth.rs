//! Who may write: the bearer token (read once at start) or, without a token file,
//! loopback peers only. Reads are open to whoever reaches the admin address (and
//! names it in `Host`); what a browser may send is checked in `origin.rs`.
use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use hyper::header::AUTHORIZATION;
use hyper::HeaderMap;

/// A bearer token. Prints as `MASKED` in Debug so it never reaches a log line.
#[derive(Clone)]
pub struct Secret(String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MASKED")
    }
}

/// The token file could not be used; crossbar refuses to start rather than run with
/// writes open or closed by surprise.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The file could not be read.
    #[error("admin token file {path}: {error}")]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// The file holds only whitespace.
    #[error("admin token file {path} is empty")]
    Empty {
        /// The file.
        path: PathBuf,
    },
}

impl Secret {
    /// A token from its text, surrounding whitespace (the trailing newline) trimmed;
    /// `None` if nothing is left.
    pub fn new(text: &str) -> Option<Secret> {
        let t = text.trim();
        (!t.is_empty()).then(|| Secret(t.to_string()))
    }

    /// Read a token file (trimmed); an empty or unreadable file is an error.
    pub fn from_file(path: &Path) -> Result<Secret, TokenError> {
        let text = std::fs::read_to_string(path).map_err(|error| TokenError::Unreadable {
            path: path.to_path_buf(),
            error,
        })?;
        Secret::new(&text).ok_or_else(|| TokenError::Empty {
            path: path.to_path_buf(),
        })
    }

    /// The token text, for a client to send.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Does `candidate` equal the token? Constant time in the token's content.
    pub fn matches(&self, candidate: &[u8]) -> bool {
        constant_time_eq(self.0.as_bytes(), candidate)
    }
}

/// Compare two byte strings without an early exit: the time depends only on the
/// longer length, never on where the first difference is.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let len = a.len().max(b.len());
    // Differing lengths make the accumulator non-zero without a branch on content.
    let mut diff = u8::from(a.len() != b.len());
    for i in 0..len {
        diff |= a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0);
    }
    diff == 0
}

/// Why a write was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    /// A token is configured and the request had none, or a wrong one (401).
    BadToken,
    /// No token is configured and the peer is not on loopback (403).
    NotLoopback,
}

impl Denied {
    /// The metric label (`crossbar_admin_requests_refused_total{reason}`).
    pub fn reason(self) -> &'static str {
        match self {
            Denied::BadToken => "token",
            Denied::NotLoopback => "not_loopback",
        }
    }
}

/// May this request write? With a token: `Authorization: Bearer <token>` must match.
/// Without: only loopback peers (IPv4-mapped loopback included).
pub fn check_write(
    token: Option<&Secret>,
    headers: &HeaderMap,
    peer: IpAddr,
) -> Result<(), Denied> {
    let Some(token) = token else {
        return if peer.to_canonical().is_loopback() {
            Ok(())
        } else {
            Err(Denied::NotLoopback)
        };
    };
    let presented = headers
        .get(AUTHORIZATION)
        .map(|v| v.as_bytes())
        .and_then(bearer);
    match presented {
        Some(p) if token.matches(p) => Ok(()),
        _ => Err(Denied::BadToken),
    }
}

/// The credentials of a `Bearer` authorization value (scheme case-insensitive).
fn bearer(value: &[u8]) -> Option<&[u8]> {
    const SCHEME: &[u8] = b"bearer ";
    if value.len() < SCHEME.len() || !value[..SCHEME.len()].eq_ignore_ascii_case(SCHEME) {
        return None;
    }
    Some(value[SCHEME.len()..].trim_ascii())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compare() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
        assert!(!constant_time_eq(b"", b"a"));
        assert!(constant_time_eq(b"", b""));
    }

    #[test]
    fn secret_is_masked_and_trimmed() {
        let s = Secret::new("  s3cret\n").unwrap();
        assert_eq!(format!("{s:?}"), "MASKED");
        assert_eq!(s.expose(), "s3cret");
        assert!(Secret::new(" \n").is_none());
    }

    #[test]
    fn write_rules() {
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        let mapped: IpAddr = "::ffff:127.0.0.1".parse().unwrap();
        let far: IpAddr = "10.0.0.1".parse().unwrap();
        let none = HeaderMap::new();
        assert_eq!(check_write(None, &none, lo), Ok(()));
        assert_eq!(check_write(None, &none, mapped), Ok(()));
        assert_eq!(check_write(None, &none, far), Err(Denied::NotLoopback));
        let t = Secret::new("tok").unwrap();
        assert_eq!(check_write(Some(&t), &none, lo), Err(Denied::BadToken));
        let mut h = HeaderMap::new();
        h.insert(AUTHORIZATION, "bearer tok".parse().unwrap());
        assert_eq!(check_write(Some(&t), &h, far), Ok(()));
        h.insert(AUTHORIZATION, "Bearer tok2".parse().unwrap());
        assert_eq!(check_write(Some(&t), &h, lo), Err(Denied::BadToken));
        h.insert(AUTHORIZATION, "Basic tok".parse().unwrap());
        assert_eq!(check_write(Some(&t), &h, lo), Err(Denied::BadToken));
    }
}
