//! Names and addresses as written in the file: service/backend names, server names,
//! listen addresses and backend addresses, each with an operator-friendly reason.
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use super::BackendAddress;

/// Service names: `[A-Za-z0-9_-]+`.
pub(super) fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Why a backend name is refused: it may hold letters, digits, `_`, `-` and `.`
/// (a host name such as `compile01.dc1.example.com`, or the `target-port` name a
/// discovered backend gets), and may not start with `.`, so that `.` and `..`,
/// which URLs and paths resolve away, are never a name.
pub(super) const BACKEND_NAME_RULE: &str =
    "may only use letters, digits, `_`, `-` and `.`, and may not start with `.` \
     (it names metrics and URLs)";

/// Backend names: `[A-Za-z0-9_-][A-Za-z0-9_.-]*` (see [`BACKEND_NAME_RULE`]).
pub(super) fn valid_backend_name(s: &str) -> bool {
    !s.starts_with('.')
        && !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
}

/// A DNS host name: dot-separated labels of letters, digits, `-` (and `_`, seen in
/// internal zones), each 1..=63 long, 253 in all.
pub(super) fn valid_hostname(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|label| {
            (1..=63).contains(&label.len())
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// A `server_names` entry, normalised: lower case, no trailing dot.
pub(super) fn server_name(s: &str) -> Result<String, String> {
    let n = s.strip_suffix('.').unwrap_or(s).to_ascii_lowercase();
    let host = n.strip_prefix("*.").unwrap_or(&n);
    if host.contains('*') {
        return Err(format!(
            "`{s}`: a wildcard must be the whole first label, as in `*.example.com`"
        ));
    }
    if host.parse::<IpAddr>().is_ok() || host.trim_matches(['[', ']']).parse::<Ipv6Addr>().is_ok() {
        return Err(format!(
            "`{s}`: clients never send an IP address as a server name (SNI)"
        ));
    }
    if !valid_hostname(host) || host.contains('_') {
        return Err(format!(
            "`{s}` is not a host name (letters, digits, `-` and `.`)"
        ));
    }
    Ok(n)
}

/// `ip:port` or `[v6]:port`, the port may be 0 (a free port, for tests).
pub(super) fn parse_socket_addr(s: &str) -> Result<SocketAddr, String> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    let Some((host, port)) = s.rsplit_once(':') else {
        return Err("missing `:port`, as in 10.0.0.10:8140".into());
    };
    if port.parse::<u16>().is_err() {
        return Err(format!("`{port}` is not a port (0..=65535)"));
    }
    if host.contains(':') && !host.starts_with('[') {
        return Err("an IPv6 address needs brackets, as in [::1]:8140".into());
    }
    Err(format!(
        "`{host}` is not an IP address (listeners bind IPs, not host names)"
    ))
}

/// `host:port`, `v4:port` or `[v6]:port`; host names are resolved at connect time.
pub(super) fn parse_backend_address(s: &str) -> Result<BackendAddress, String> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (v6, port) = rest
            .split_once("]:")
            .ok_or("write an IPv6 address as [2001:db8::1]:8140")?;
        v6.parse::<Ipv6Addr>()
            .map_err(|_| format!("`{v6}` is not an IPv6 address"))?;
        (v6, port)
    } else {
        let (host, port) = s
            .rsplit_once(':')
            .ok_or("missing `:port`, as in puppet1.example.com:8140")?;
        if host.contains(':') {
            return Err("an IPv6 address needs brackets, as in [2001:db8::1]:8140".into());
        }
        if host.parse::<IpAddr>().is_err() && !valid_hostname(host) {
            return Err(format!("`{host}` is neither an IP address nor a host name"));
        }
        (host, port)
    };
    match port.parse::<u16>() {
        Ok(p) if p >= 1 => Ok(BackendAddress {
            host: host.to_string(),
            port: p,
        }),
        _ => Err(format!("`{port}` is not a port (1..=65535)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_addresses() {
        let a = parse_backend_address("puppet1.example.com:8140").unwrap();
        assert_eq!((a.host.as_str(), a.port), ("puppet1.example.com", 8140));
        let a = parse_backend_address("[2001:db8::1]:8140").unwrap();
        assert_eq!(a.host, "2001:db8::1");
        assert_eq!(a.to_string(), "[2001:db8::1]:8140");
        assert!(parse_backend_address("10.0.0.1:8140")
            .unwrap()
            .as_socket_addr()
            .is_some());
        for bad in [
            "puppet1",
            "2001:db8::1:8140",
            "h:0",
            "h:70000",
            "bad host:1",
            "[zz]:1",
            ":8140",
        ] {
            assert!(parse_backend_address(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn listen_addresses_explain_themselves() {
        assert!(parse_socket_addr("[::]:8140").is_ok());
        assert!(parse_socket_addr("::1:8140")
            .unwrap_err()
            .contains("brackets"));
        assert!(parse_socket_addr("puppet:8140")
            .unwrap_err()
            .contains("not an IP"));
        assert!(parse_socket_addr("10.0.0.1")
            .unwrap_err()
            .contains("missing"));
    }

    #[test]
    fn backend_names_may_be_host_names() {
        for good in [
            "compile01.dc1.example.com",
            "compile2.lab.test-8140",
            "10.0.1.1-8140",
            "2001-db8--1-8140",
            "c_1",
            "x.",
        ] {
            assert!(valid_backend_name(good), "{good}");
        }
        for bad in [
            "", ".", "..", ".hidden", "a/b", "a b", "a%2e", "a:8140", "ä",
        ] {
            assert!(!valid_backend_name(bad), "{bad}");
        }
        // Service names keep the stricter rule: a dot is no service name.
        assert!(!valid_name("puppet.ca") && valid_name("puppet-ca"));
    }

    #[test]
    fn server_names_are_normalised() {
        assert_eq!(
            server_name("Puppet.Example.COM.").unwrap(),
            "puppet.example.com"
        );
        assert_eq!(server_name("*.ca.example.com").unwrap(), "*.ca.example.com");
        for bad in ["a.*.com", "10.0.0.1", "pup pet", "", "-x.com", "a_b.com"] {
            assert!(server_name(bad).is_err(), "{bad}");
        }
    }
}
