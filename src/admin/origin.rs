//! Where a request comes from, as a browser tells it: the checks that keep a web
//! page from using the admin endpoint through an operator's browser.
//!
//! Two attacks, both possible because operators open the status page in a browser
//! on the balancer or through `ssh -L`:
//! - **DNS rebinding**: a page at `evil.example` makes its name resolve to the admin
//!   address; the browser then treats the admin endpoint as the page's own origin
//!   and lets it read `/api` and post writes. Its requests carry
//!   `Host: evil.example`, so every request (reads too: `/api` shows the topology)
//!   must name the admin address, a loopback name or address, or a host the
//!   operator listed in `admin.allowed_hosts`.
//! - **Cross-site request forgery**: any page can make the browser send a form
//!   POST or a no-cors `fetch` to `http://127.0.0.1:9140`; it can't read the
//!   answer, but the write happens. Writes are refused when the browser marks them
//!   `Sec-Fetch-Site: cross-site`/`same-site`, when their `Origin` (or, without one,
//!   `Referer`) is another origin than the `Host` they were sent to, and when they
//!   carry an HTML form's content type (no endpoint takes a body, so a form can
//!   never trigger a write, even from a browser that sends neither header).
//!
//! A request without these headers (the `crossbar` CLI, curl, keepalived) is not a
//! browser's and passes; a browser always sends `Host`, and `Origin` on a POST.
//! The same rules as Go's `net/http.CrossOriginProtection`, plus the Host check.
//!
//! Which host a request names is RFC 9112's answer ([`request_host`]): the
//! authority of an absolute-form target (`GET http://host/path`), which replaces
//! `Host`, else the one `Host` line; two `Host` lines, or one that is not a host,
//! are a bad request (400), whatever they say.
use std::net::IpAddr;

use hyper::header::{CONTENT_TYPE, HOST, ORIGIN, REFERER};
use hyper::http::request::Parts;
use hyper::{HeaderMap, Uri};

/// Why a request was refused before it reached its endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// `Host` names another host than the admin address, loopback or an allowed host.
    Host,
    /// A write's `Origin` (or `Referer`) is not the origin it was sent to.
    Origin,
    /// A write the browser marked as coming from another site.
    FetchSite,
    /// A write with an HTML form's content type.
    FormContentType,
    /// Two `Host` lines, or one that is not a host and port (RFC 9112 3.2: 400).
    BadHost,
}

impl Refused {
    /// The metric label (`crossbar_admin_requests_refused_total{reason}`).
    pub fn reason(self) -> &'static str {
        match self {
            Refused::Host => "host",
            Refused::Origin => "origin",
            Refused::FetchSite => "fetch_site",
            Refused::FormContentType => "form_content_type",
            Refused::BadHost => "bad_host",
        }
    }

    /// What the 403 answer says.
    pub fn message(self) -> &'static str {
        match self {
            Refused::Host => {
                "Host header names neither this admin address, a loopback name or address, \
                 nor a host in admin.allowed_hosts (DNS rebinding guard)"
            }
            Refused::Origin => {
                "write refused: its Origin (or Referer) is another origin than this admin \
                 endpoint (cross-site request guard)"
            }
            Refused::FetchSite => {
                "write refused: the browser marked it as sent from another site \
                 (Sec-Fetch-Site; cross-site request guard)"
            }
            Refused::FormContentType => {
                "write refused: it has an HTML form's content type; no endpoint takes a \
                 body (cross-site request guard)"
            }
            Refused::BadHost => {
                "bad request: more than one Host header line, or a Host that is not a \
                 host and port (RFC 9112 3.2)"
            }
        }
    }
}

/// Content types an HTML form (or a no-cors `fetch`) can send without a preflight.
const FORM_TYPES: [&str; 3] = [
    "application/x-www-form-urlencoded",
    "multipart/form-data",
    "text/plain",
];

/// A host and optional port, normalized for comparison: lowercase, no trailing
/// dot, IP addresses in canonical form (IPv6 without brackets).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Authority {
    host: String,
    port: Option<u16>,
}

impl Authority {
    /// Parse `host`, `host:port`, `[v6]` or `[v6]:port`; `None` if malformed.
    fn parse(text: &str) -> Option<Authority> {
        let (host, port) = match text.strip_prefix('[') {
            Some(rest) => {
                let (v6, after) = rest.split_once(']')?;
                let port = match after {
                    "" => None,
                    p => Some(p.strip_prefix(':')?),
                };
                (v6, port)
            }
            None => match text.rsplit_once(':') {
                Some((h, p)) if !h.contains(':') => (h, Some(p)),
                Some(_) => return None, // an IPv6 address must be in brackets
                None => (text, None),
            },
        };
        let port = match port {
            None => None,
            Some(p) => Some(p.parse::<u16>().ok()?),
        };
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        if host.is_empty() {
            return None;
        }
        let host = match host.parse::<IpAddr>() {
            Ok(ip) => ip.to_string(),
            Err(_) => host,
        };
        Some(Authority { host, port })
    }

    fn ip(&self) -> Option<IpAddr> {
        self.host.parse().ok()
    }
}

/// The host a request names (RFC 9112 3.2): the authority of an absolute-form
/// target, which replaces `Host` (3.2.2: a server MUST ignore `Host` then), else
/// the one `Host` line; `None` without either (not a browser's request). More than
/// one `Host` line, or one whose value is not a host and optional port, is
/// [`Refused::BadHost`]; an empty one names no host (refused by [`check_host`]).
pub fn request_host(parts: &Parts) -> Result<Option<String>, Refused> {
    let mut lines = parts.headers.get_all(HOST).iter();
    let host = lines.next();
    if lines.next().is_some() {
        return Err(Refused::BadHost);
    }
    if let Some(a) = parts.uri.authority() {
        // userinfo (`user@host`, deprecated by RFC 9110 4.2.4) is not the host.
        let text = a.as_str();
        return Ok(Some(text.rsplit('@').next().unwrap_or(text).to_string()));
    }
    let Some(value) = host else {
        return Ok(None);
    };
    let text = value.to_str().map_err(|_| Refused::BadHost)?;
    // `uri-host [ ":" port ]` (RFC 9110 7.2): RFC 3986's characters, no userinfo.
    let valid = text.parse::<hyper::http::uri::Authority>().is_ok()
        && !text.contains('@')
        && Authority::parse(text).is_some();
    if !text.is_empty() && !valid {
        return Err(Refused::BadHost);
    }
    Ok(Some(text.to_string()))
}

/// Is `host` (from [`request_host`]) one this endpoint answers as: the address the
/// client connected to (`local`), a loopback address, `localhost` or a name under
/// it, or one of `allowed` (as `admin.allowed_hosts` normalizes them)? The port is not compared: `ssh -L`
/// forwards from any local port. A request that names no host is not a browser's.
pub fn check_host(host: Option<&str>, local: IpAddr, allowed: &[String]) -> Result<(), Refused> {
    let Some(text) = host else {
        return Ok(());
    };
    let host = Authority::parse(text).ok_or(Refused::Host)?;
    let ok = match host.ip() {
        Some(ip) => {
            let ip = ip.to_canonical();
            ip.is_loopback() || ip == local.to_canonical()
        }
        None => host.host == "localhost" || host.host.ends_with(".localhost"),
    } || allowed.iter().any(|a| a.eq_ignore_ascii_case(&host.host));
    ok.then_some(()).ok_or(Refused::Host)
}

/// May this write (POST, DELETE) to `host` (from [`request_host`]) proceed as far
/// as its browser headers tell? See the module notes for the rules.
pub fn check_write(headers: &HeaderMap, host: Option<&str>) -> Result<(), Refused> {
    if let Some(site) = headers.get("sec-fetch-site") {
        if !matches!(site.as_bytes(), b"same-origin" | b"none") {
            return Err(Refused::FetchSite);
        }
    }
    if let Some(ct) = headers.get(CONTENT_TYPE) {
        let media = ct.to_str().unwrap_or("").split(';').next().unwrap_or("");
        if FORM_TYPES
            .iter()
            .any(|f| media.trim().eq_ignore_ascii_case(f))
        {
            return Err(Refused::FormContentType);
        }
    }
    let source = headers.get(ORIGIN).or_else(|| headers.get(REFERER));
    let Some(source) = source else {
        return Ok(());
    };
    let target = host.and_then(Authority::parse);
    match (origin_of(source.as_bytes()), target) {
        (Some(from), Some(to)) if from == to => Ok(()),
        _ => Err(Refused::Origin),
    }
}

/// The authority of an `Origin` or `Referer` value (`http://host:port[/...]`), the
/// scheme's default port dropped as a browser does in `Host`; `None` for `null`
/// or anything that is not an http(s) URL.
fn origin_of(value: &[u8]) -> Option<Authority> {
    let uri = Uri::try_from(value).ok()?;
    let default = match uri.scheme_str()? {
        "http" => 80,
        "https" => 443,
        _ => return None,
    };
    let mut a = Authority::parse(uri.authority()?.as_str())?;
    if a.port == Some(default) {
        a.port = None;
    }
    Some(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn authorities() {
        let a = |s: &str| Authority::parse(s).map(|a| (a.host, a.port));
        assert_eq!(a("LocalHost.:80"), Some(("localhost".into(), Some(80))));
        assert_eq!(a("[::1]:9"), Some(("::1".into(), Some(9))));
        assert_eq!(a("[0:0::1]"), Some(("::1".into(), None)));
        assert_eq!(a("127.0.0.1"), Some(("127.0.0.1".into(), None)));
        for bad in ["", ":80", "::1:80", "h:x", "h:99999", "[::1", "[::1]x"] {
            assert_eq!(a(bad), None, "{bad}");
        }
    }

    #[test]
    fn hosts() {
        let local: IpAddr = "10.0.0.5".parse().unwrap();
        let allowed = vec!["lb1.example.com".to_string(), "192.0.2.7".to_string()];
        let check = |host: &str| check_host(Some(host), local, &allowed);
        for ok in [
            "127.0.0.1:9140",
            "127.1.2.3",
            "[::1]:8080",
            "localhost:8080",
            "admin.localhost",
            "10.0.0.5:9140",
            "lb1.example.com:9140",
            "LB1.example.com.",
            "192.0.2.7:80",
        ] {
            assert_eq!(check(ok), Ok(()), "{ok}");
        }
        for bad in [
            "attacker.example",
            "10.0.0.6:9140",
            "localhost.attacker.example",
            "example.com",
            "",
            "x y",
        ] {
            assert_eq!(check(bad), Err(Refused::Host), "{bad}");
        }
        assert_eq!(check_host(None, local, &[]), Ok(()));
    }

    #[test]
    fn the_host_a_request_names() {
        let parts = |target: &str, hosts: &[&str]| {
            let mut r = hyper::Request::builder().uri(target);
            for h in hosts {
                r = r.header(HOST, *h);
            }
            r.body(()).unwrap().into_parts().0
        };
        let host = |target: &str, hosts: &[&str]| request_host(&parts(target, hosts));
        assert_eq!(
            host("/api", &["localhost:9140"]),
            Ok(Some("localhost:9140".into()))
        );
        assert_eq!(host("/api", &[]), Ok(None));
        assert_eq!(host("/api", &[""]), Ok(Some(String::new())));
        for bad in [
            &["localhost", "localhost"][..],
            &["a", "b"],
            &["x y"],
            &["h:99999"],
            &["u@localhost"],
            &["local<host>"],
        ] {
            assert_eq!(host("/api", bad), Err(Refused::BadHost), "{bad:?}");
        }
        // Absolute form: the target's authority, whatever Host says.
        assert_eq!(
            host("http://evil.example:80/api", &["localhost"]),
            Ok(Some("evil.example:80".into()))
        );
        assert_eq!(
            host("http://u@127.0.0.1/api", &["evil.example"]),
            Ok(Some("127.0.0.1".into()))
        );
        assert_eq!(
            host("http://127.0.0.1/api", &["a", "b"]),
            Err(Refused::BadHost)
        );
    }

    #[test]
    fn writes() {
        let host = ("host", "127.0.0.1:9140");
        let ok = |h: &[(&'static str, &str)]| {
            let h = headers(h);
            check_write(&h, h.get(HOST).and_then(|v| v.to_str().ok()))
        };
        assert_eq!(ok(&[host]), Ok(()));
        assert_eq!(ok(&[]), Ok(()));
        assert_eq!(ok(&[host, ("origin", "http://127.0.0.1:9140")]), Ok(()));
        assert_eq!(
            ok(&[("host", "localhost"), ("origin", "http://localhost:80")]),
            Ok(())
        );
        assert_eq!(
            ok(&[host, ("referer", "http://127.0.0.1:9140/?refresh=5")]),
            Ok(())
        );
        assert_eq!(ok(&[host, ("sec-fetch-site", "same-origin")]), Ok(()));
        assert_eq!(ok(&[host, ("content-type", "application/json")]), Ok(()));
        for (h, why) in [
            (("origin", "http://evil.example"), Refused::Origin),
            (("origin", "http://127.0.0.1:9141"), Refused::Origin),
            (("origin", "null"), Refused::Origin),
            (("referer", "http://evil.example/x"), Refused::Origin),
            (("sec-fetch-site", "cross-site"), Refused::FetchSite),
            (("sec-fetch-site", "same-site"), Refused::FetchSite),
            (("content-type", "text/plain"), Refused::FormContentType),
            (
                (
                    "content-type",
                    "Application/X-WWW-Form-Urlencoded; charset=x",
                ),
                Refused::FormContentType,
            ),
            (
                ("content-type", "multipart/form-data; boundary=a"),
                Refused::FormContentType,
            ),
        ] {
            assert_eq!(ok(&[host, h]), Err(why), "{h:?}");
        }
        // An Origin without a Host to compare with is not same-origin.
        assert_eq!(
            ok(&[("origin", "http://127.0.0.1:9140")]),
            Err(Refused::Origin)
        );
    }
}
