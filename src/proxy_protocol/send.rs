//! Sending: the PROXY v1 or v2 header crossbar writes to a backend before the client's
//! bytes, so a backend (or an intermediate proxy) sees the agent's real address.
use std::net::{IpAddr, SocketAddr};

use super::{PP2_TYPE_AUTHORITY, V2_SIGNATURE};
use crate::config::ProxyProtocol;

/// v2, command PROXY.
const V2_VER_CMD_PROXY: u8 = 0x21;
/// v2, command LOCAL (a connection of the proxy's own).
const V2_VER_CMD_LOCAL: u8 = 0x20;
/// AF_UNSPEC, UNSPEC transport (with LOCAL).
const V2_UNSPEC: u8 = 0x00;
/// AF_INET + STREAM.
const V2_TCP4: u8 = 0x11;
/// AF_INET6 + STREAM.
const V2_TCP6: u8 = 0x21;
/// A DNS name is at most 253 bytes; longer SNI values are not sent.
const MAX_AUTHORITY: usize = 253;

/// Both addresses in one family: IPv4 when both are IPv4 (or v4-mapped), else IPv6.
fn same_family(src: SocketAddr, dst: SocketAddr) -> (SocketAddr, SocketAddr) {
    let (s, d) = (src.ip().to_canonical(), dst.ip().to_canonical());
    match (s, d) {
        (IpAddr::V4(_), IpAddr::V4(_)) => (
            SocketAddr::new(s, src.port()),
            SocketAddr::new(d, dst.port()),
        ),
        _ => {
            let v6 = |ip: IpAddr| match ip {
                IpAddr::V4(a) => IpAddr::V6(a.to_ipv6_mapped()),
                v6 => v6,
            };
            (
                SocketAddr::new(v6(s), src.port()),
                SocketAddr::new(v6(d), dst.port()),
            )
        }
    }
}

/// The header for a connection from `src` (the client) to `dst` (crossbar's listener).
/// `authority` (the SNI) is sent as a PP2_TYPE_AUTHORITY TLV in v2.
pub fn header(
    version: ProxyProtocol,
    src: SocketAddr,
    dst: SocketAddr,
    authority: Option<&str>,
) -> Vec<u8> {
    let (src, dst) = same_family(src, dst);
    match version {
        ProxyProtocol::V1 => v1(src, dst),
        ProxyProtocol::V2 => v2(src, dst, authority),
    }
}

/// The header for a connection crossbar opens on its own behalf (health checks, the
/// ticket-key probe): v2 command LOCAL, v1 `PROXY UNKNOWN`. The backend then uses
/// the real connection addresses, as the spec intends for such connections.
pub fn local(version: ProxyProtocol) -> Vec<u8> {
    match version {
        ProxyProtocol::V1 => b"PROXY UNKNOWN\r\n".to_vec(),
        ProxyProtocol::V2 => {
            let mut out = V2_SIGNATURE.to_vec();
            out.extend_from_slice(&[V2_VER_CMD_LOCAL, V2_UNSPEC, 0, 0]);
            out
        }
    }
}

fn v1(src: SocketAddr, dst: SocketAddr) -> Vec<u8> {
    let fam = if src.is_ipv4() { "TCP4" } else { "TCP6" };
    format!(
        "PROXY {fam} {} {} {} {}\r\n",
        src.ip(),
        dst.ip(),
        src.port(),
        dst.port()
    )
    .into_bytes()
}

fn v2(src: SocketAddr, dst: SocketAddr, authority: Option<&str>) -> Vec<u8> {
    let mut addrs = Vec::with_capacity(36);
    let fam = match (src.ip(), dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            addrs.extend_from_slice(&s.octets());
            addrs.extend_from_slice(&d.octets());
            V2_TCP4
        }
        (s, d) => {
            let six = |ip: IpAddr| match ip {
                IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
                IpAddr::V6(a) => a.octets(),
            };
            addrs.extend_from_slice(&six(s));
            addrs.extend_from_slice(&six(d));
            V2_TCP6
        }
    };
    addrs.extend_from_slice(&src.port().to_be_bytes());
    addrs.extend_from_slice(&dst.port().to_be_bytes());
    if let Some(a) = authority.filter(|a| !a.is_empty() && a.len() <= MAX_AUTHORITY) {
        addrs.push(PP2_TYPE_AUTHORITY);
        addrs.extend_from_slice(&(a.len() as u16).to_be_bytes());
        addrs.extend_from_slice(a.as_bytes());
    }
    let mut out = Vec::with_capacity(16 + addrs.len());
    out.extend_from_slice(&V2_SIGNATURE);
    out.push(V2_VER_CMD_PROXY);
    out.push(fam);
    out.extend_from_slice(&(addrs.len() as u16).to_be_bytes());
    out.extend_from_slice(&addrs);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn v1_tcp4_matches_the_spec_example_form() {
        let h = header(
            ProxyProtocol::V1,
            sa("192.168.0.1:56324"),
            sa("192.168.0.11:443"),
            None,
        );
        assert_eq!(h, b"PROXY TCP4 192.168.0.1 192.168.0.11 56324 443\r\n");
    }

    #[test]
    fn v1_mixed_families_become_tcp6() {
        let h = header(
            ProxyProtocol::V1,
            sa("[2001:db8::1]:1000"),
            sa("10.0.0.1:8140"),
            None,
        );
        assert_eq!(h, b"PROXY TCP6 2001:db8::1 ::ffff:10.0.0.1 1000 8140\r\n");
    }

    #[test]
    fn v2_tcp4_layout() {
        let h = header(
            ProxyProtocol::V2,
            sa("10.1.2.3:4000"),
            sa("10.0.0.10:8140"),
            None,
        );
        assert_eq!(&h[..12], &V2_SIGNATURE);
        assert_eq!(h[12], 0x21);
        assert_eq!(h[13], 0x11);
        assert_eq!(u16::from_be_bytes([h[14], h[15]]), 12);
        assert_eq!(&h[16..20], &[10, 1, 2, 3]);
        assert_eq!(&h[20..24], &[10, 0, 0, 10]);
        assert_eq!(u16::from_be_bytes([h[24], h[25]]), 4000);
        assert_eq!(u16::from_be_bytes([h[26], h[27]]), 8140);
        assert_eq!(h.len(), 28);
    }

    #[test]
    fn local_headers() {
        assert_eq!(local(ProxyProtocol::V1), b"PROXY UNKNOWN\r\n");
        let v2 = local(ProxyProtocol::V2);
        assert_eq!(&v2[..12], &V2_SIGNATURE);
        assert_eq!(&v2[12..], &[0x20, 0x00, 0, 0]);
    }

    #[test]
    fn v2_tcp6_with_authority_tlv() {
        let h = header(
            ProxyProtocol::V2,
            sa("[::1]:5"),
            sa("[::1]:8140"),
            Some("puppet.example.com"),
        );
        assert_eq!(h[13], 0x21);
        let len = u16::from_be_bytes([h[14], h[15]]) as usize;
        assert_eq!(h.len(), 16 + len);
        let tlv = &h[16 + 36..];
        assert_eq!(tlv[0], PP2_TYPE_AUTHORITY);
        assert_eq!(
            u16::from_be_bytes([tlv[1], tlv[2]]) as usize,
            "puppet.example.com".len()
        );
        assert_eq!(&tlv[3..], b"puppet.example.com");
    }
}
