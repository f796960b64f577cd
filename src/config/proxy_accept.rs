//! `listen[].proxy_protocol`: which sources may put a PROXY header in front of their
//! connections on a listen address, and whether they must.
use std::net::IpAddr;
use std::str::FromStr;

use super::checker::{join, Checker};
use super::raw::RawProxyAccept;

/// An IP network: an address and a prefix length (`10.0.0.0/8`, `2001:db8::/32`; a
/// bare address is the one host).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpNet {
    /// The network address (host bits zero).
    pub addr: IpAddr,
    /// Prefix length: 0..=32 for IPv4, 0..=128 for IPv6.
    pub prefix: u8,
}

impl IpNet {
    /// Is `ip` in this network? IPv4-mapped IPv6 addresses count as IPv4.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip.to_canonical()) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(a) & mask == u32::from(n)
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(a) & mask == u128::from(n)
            }
            _ => false,
        }
    }
}

impl FromStr for IpNet {
    type Err = String;

    /// `ADDRESS` or `ADDRESS/PREFIX`; host bits after the prefix are refused (a typo
    /// in a trust list must not widen or shift it silently).
    fn from_str(s: &str) -> Result<IpNet, String> {
        let (a, p) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = a
            .parse()
            .map_err(|_| format!("`{a}` is not an IP address (no brackets, no port)"))?;
        let addr = addr.to_canonical();
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match p {
            None => max,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|n| *n <= max)
                .ok_or_else(|| format!("`/{p}` is not a prefix length (0..={max})"))?,
        };
        let base = network(addr, prefix);
        if base != addr {
            return Err(format!(
                "`{s}` has host bits set after /{prefix}: did you mean {base}/{prefix}?"
            ));
        }
        Ok(IpNet { addr, prefix })
    }
}

/// `addr` with the bits after `prefix` cleared.
fn network(addr: IpAddr, prefix: u8) -> IpAddr {
    match addr {
        IpAddr::V4(a) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::from((u32::from(a) & mask).to_be_bytes())
        }
        IpAddr::V6(a) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::from((u128::from(a) & mask).to_be_bytes())
        }
    }
}

impl std::fmt::Display for IpNet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// A listen address's PROXY policy: headers are read from `accept_from` only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyAccept {
    /// The networks of the tiers in front (load balancers, firewalls, another
    /// crossbar) whose headers are read. Nothing else is trusted; a header from
    /// anywhere else is never parsed.
    pub accept_from: Vec<IpNet>,
    /// A trusted source must send a header (default `true`); `false` also serves
    /// trusted sources without one, as themselves (a migration period).
    pub required: bool,
}

impl ProxyAccept {
    /// May `ip` send a header?
    pub fn trusts(&self, ip: IpAddr) -> bool {
        self.accept_from.iter().any(|n| n.contains(ip))
    }
}

/// One line, as `check`, `doctor` and the status page say it:
/// `PROXY headers from 10.0.0.0/24, 10.0.1.5/32 (required)`.
impl std::fmt::Display for ProxyAccept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let from: Vec<String> = self.accept_from.iter().map(|n| n.to_string()).collect();
        let mode = if self.required {
            "required"
        } else {
            "optional: migration mode"
        };
        write!(f, "PROXY headers from {} ({mode})", from.join(", "))
    }
}

impl Checker<'_> {
    /// `listen[i].proxy_protocol` at `p`.
    pub(super) fn proxy_accept(&mut self, raw: &RawProxyAccept, p: &str) -> Option<ProxyAccept> {
        let fp = join(p, "accept_from");
        let mut accept_from: Vec<IpNet> = Vec::new();
        for (i, s) in raw.accept_from.iter().enumerate() {
            match s.parse::<IpNet>() {
                Ok(n) if accept_from.contains(&n) => {
                    self.err(&format!("{fp}[{i}]"), format!("{n} is listed twice"))
                }
                Ok(n) => accept_from.push(n),
                Err(why) => self.err(&format!("{fp}[{i}]"), why),
            }
        }
        if raw.accept_from.is_empty() {
            self.err(
                &fp,
                "empty: list the networks of the tiers that send PROXY headers, e.g. [\"10.0.0.0/24\"] \
                 (or remove `proxy_protocol` to accept none)",
            );
            return None;
        }
        if let Some(all) = accept_from.iter().find(|n| n.prefix == 0) {
            self.warn(
                &fp,
                format!(
                    "warning: {all} trusts every address: any client can claim any address \
                     (and so pick its stickiness and source hash); list only the tiers in front"
                ),
            );
        }
        Some(ProxyAccept {
            accept_from,
            required: raw.required.unwrap_or(true),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn networks_parse_and_match() {
        let n: IpNet = "10.0.0.0/8".parse().unwrap();
        assert!(n.contains("10.200.1.1".parse().unwrap()));
        assert!(n.contains("::ffff:10.1.1.1".parse().unwrap()));
        assert!(!n.contains("11.0.0.1".parse().unwrap()));
        assert!(!n.contains("::1".parse().unwrap()));
        let h: IpNet = "127.0.0.2".parse().unwrap();
        assert!(h.contains("127.0.0.2".parse().unwrap()));
        assert!(!h.contains("127.0.0.3".parse().unwrap()));
        let v6: IpNet = "2001:db8::/32".parse().unwrap();
        assert!(v6.contains("2001:db8:1::5".parse().unwrap()));
        let all: IpNet = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains("192.0.2.1".parse().unwrap()));
        for bad in ["10.0.0.1/8", "10.0.0.0/33", "10.0.0.0/x", "host", "[::1]"] {
            assert!(bad.parse::<IpNet>().is_err(), "{bad}");
        }
        assert_eq!(
            "10.0.0.1/8".parse::<IpNet>().unwrap_err(),
            "`10.0.0.1/8` has host bits set after /8: did you mean 10.0.0.0/8?"
        );
    }
}
