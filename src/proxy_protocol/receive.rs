//! Receiving: the PROXY v1 or v2 header at the front of a connection from a trusted
//! tier, parsed by a pure function over the bytes read so far with three outcomes
//! (need more, invalid with a reason, found with its length), like the hello
//! detector. Every decision is taken on the fewest bytes that allow it (a TLS record
//! is "no header" from its first byte; a bad v2 version, command, family or length
//! from the 16-byte fixed part), and a longer prefix of the same stream never
//! decides differently.
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use super::{PP2_TYPE_AUTHORITY, V1_PREFIX, V2_SIGNATURE};

/// Longest v1 line, CRLF included (spec 2.1: "a 107-byte buffer").
pub const V1_MAX: usize = 107;
/// Largest v2 header accepted, the fixed 16 bytes included. The spec allows 64 KiB;
/// what real tiers send is far less: addresses (at most 36 bytes) plus TLVs (AWS
/// VPC endpoint IDs, Azure link IDs, GCP PSC IDs, HAProxy's SSL and unique-ID TLVs)
/// of a few hundred bytes. 4 KiB bounds what a tier's bug can make crossbar buffer.
pub const MAX_HEADER: usize = 4096;
/// The fixed part of a v2 header: signature, version/command, family, length.
const V2_FIXED: usize = 16;
/// v2 address block lengths (spec 2.2): two IPv4 addresses and ports, two IPv6.
const V2_INET_LEN: usize = 12;
const V2_INET6_LEN: usize = 36;
/// Longest authority (a DNS name) kept from the TLV; longer ones are ignored.
const MAX_AUTHORITY: usize = 253;

/// What a valid header says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyHeader {
    /// 1 or 2.
    pub version: u8,
    /// The client's address and port; `None` when the header describes the tier's
    /// own connection (v2 `LOCAL`, v2 `UNSPEC`, v1 `UNKNOWN`): the connection is then
    /// served as the tier's.
    pub source: Option<SocketAddr>,
    /// The address the client connected to (the tier's front), when `source` is set.
    pub destination: Option<SocketAddr>,
    /// The v2 PP2_TYPE_AUTHORITY TLV (the name the client asked the tier for), if it
    /// is a printable name of at most 253 bytes; other TLVs are skipped.
    pub authority: Option<String>,
}

/// Why the bytes are not an acceptable header; each is its own access-log `end=`
/// reason and metric label ([`ProxyError::reason`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ProxyError {
    /// The bytes start with neither the v1 nor the v2 signature.
    #[error("no PROXY header where one is required")]
    Missing,
    /// v2 with a version other than 2.
    #[error("unknown PROXY header version")]
    Version,
    /// v2 with a command other than LOCAL or PROXY.
    #[error("unknown PROXY v2 command")]
    Command,
    /// An address family or transport crossbar does not serve (UDP, UNIX sockets,
    /// an unknown v1 protocol word).
    #[error("unsupported PROXY address family or transport")]
    Family,
    /// Longer than [`V1_MAX`] (v1) or [`MAX_HEADER`] (v2).
    #[error("PROXY header too large")]
    TooLarge,
    /// Anything else that breaks the spec: bad characters, addresses, ports, lengths
    /// or TLVs.
    #[error("malformed PROXY header")]
    Malformed,
}

impl ProxyError {
    /// The reason word (access log `end=proxy_error:<reason>`, metric label
    /// `proxy_<reason>`).
    pub fn reason(self) -> &'static str {
        match self {
            ProxyError::Missing => "missing",
            ProxyError::Version => "version",
            ProxyError::Command => "command",
            ProxyError::Family => "family",
            ProxyError::TooLarge => "too_large",
            ProxyError::Malformed => "malformed",
        }
    }
}

/// The outcome of looking at the bytes read so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProxyParse {
    /// Not decided yet: read more.
    NeedMore,
    /// Not an acceptable header (decided; more bytes change nothing).
    Invalid(ProxyError),
    /// A header, and how many bytes it took; what follows is the client's.
    Found(ProxyHeader, usize),
}

/// Look for a PROXY header at the front of `buf`.
pub fn parse(buf: &[u8]) -> ProxyParse {
    let Some(&first) = buf.first() else {
        return ProxyParse::NeedMore;
    };
    let (sig, v2): (&[u8], bool) = match first {
        b'P' => (V1_PREFIX, false),
        b'\r' => (&V2_SIGNATURE, true),
        _ => return ProxyParse::Invalid(ProxyError::Missing),
    };
    let n = buf.len().min(sig.len());
    if buf[..n] != sig[..n] {
        return ProxyParse::Invalid(ProxyError::Missing);
    }
    if v2 {
        parse_v2(buf)
    } else {
        parse_v1(buf)
    }
}

/// How many more bytes the header at the front of `buf` needs at least, as far as
/// the bytes so far tell (a v1 line's end is unknown: up to [`V1_MAX`]). A reader
/// that reads no more than this never reads past a v2 header.
pub(crate) fn wanted(buf: &[u8]) -> usize {
    if buf.first() == Some(&b'\r') {
        if buf.len() < V2_FIXED {
            return V2_FIXED - buf.len();
        }
        let total = V2_FIXED + usize::from(u16::from_be_bytes([buf[14], buf[15]]));
        return total.saturating_sub(buf.len()).max(1);
    }
    V1_MAX.saturating_sub(buf.len()).max(1)
}

fn parse_v1(buf: &[u8]) -> ProxyParse {
    let window = &buf[..buf.len().min(V1_MAX)];
    // Every byte before the CRLF must be printable ASCII; a CR must be followed by LF.
    let mut end = None;
    for (i, &b) in window.iter().enumerate() {
        match b {
            b'\r' => match window.get(i + 1) {
                Some(b'\n') => {
                    end = Some(i);
                    break;
                }
                Some(_) => return ProxyParse::Invalid(ProxyError::Malformed),
                None => {}
            },
            0x20..=0x7e => {}
            _ => return ProxyParse::Invalid(ProxyError::Malformed),
        }
    }
    let Some(end) = end else {
        return if buf.len() >= V1_MAX {
            ProxyParse::Invalid(ProxyError::TooLarge)
        } else {
            ProxyParse::NeedMore
        };
    };
    // Printable ASCII only, checked above: the line is UTF-8.
    let line = std::str::from_utf8(&buf[..end]).unwrap_or_default();
    match v1_line(line) {
        Ok((source, destination)) => ProxyParse::Found(
            ProxyHeader {
                version: 1,
                source,
                destination,
                authority: None,
            },
            end + 2,
        ),
        Err(e) => ProxyParse::Invalid(e),
    }
}

/// `PROXY TCP4|TCP6 <src> <dst> <sport> <dport>` or `PROXY UNKNOWN[ anything]`.
fn v1_line(line: &str) -> Result<(Option<SocketAddr>, Option<SocketAddr>), ProxyError> {
    let rest = &line[V1_PREFIX.len()..];
    if rest == "UNKNOWN" || rest.starts_with("UNKNOWN ") {
        // Spec 2.1: the receiver ignores the rest of the line and uses the real
        // connection's addresses.
        return Ok((None, None));
    }
    let fields: Vec<&str> = rest.split(' ').collect();
    let [proto, src, dst, sport, dport] = fields.as_slice() else {
        return Err(match rest.split(' ').next() {
            Some("TCP4" | "TCP6") => ProxyError::Malformed,
            _ => ProxyError::Family,
        });
    };
    let ip = |s: &str| -> Result<IpAddr, ProxyError> {
        match *proto {
            "TCP4" => s.parse::<Ipv4Addr>().map(IpAddr::V4),
            "TCP6" => s.parse::<Ipv6Addr>().map(IpAddr::V6),
            _ => return Err(ProxyError::Family),
        }
        .map_err(|_| ProxyError::Malformed)
    };
    let (s, d) = (ip(src)?, ip(dst)?);
    Ok((
        Some(SocketAddr::new(s, v1_port(sport)?)),
        Some(SocketAddr::new(d, v1_port(dport)?)),
    ))
}

/// A v1 port: 1-5 decimal digits, no leading zero, at most 65535.
fn v1_port(s: &str) -> Result<u16, ProxyError> {
    let digits = !s.is_empty() && s.len() <= 5 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits || (s.len() > 1 && s.starts_with('0')) {
        return Err(ProxyError::Malformed);
    }
    s.parse().map_err(|_| ProxyError::Malformed)
}

fn parse_v2(buf: &[u8]) -> ProxyParse {
    if buf.len() < V2_SIGNATURE.len() + 1 {
        return ProxyParse::NeedMore;
    }
    let (version, command) = (buf[12] >> 4, buf[12] & 0x0f);
    if version != 2 {
        return ProxyParse::Invalid(ProxyError::Version);
    }
    let local = match command {
        0 => true,
        1 => false,
        _ => return ProxyParse::Invalid(ProxyError::Command),
    };
    let Some(&family) = buf.get(13) else {
        return ProxyParse::NeedMore;
    };
    // LOCAL: the spec says to ignore the family; PROXY: TCP over IPv4/IPv6, or UNSPEC
    // (addresses unknown: served as the tier's own connection).
    let addr_len = match (local, family) {
        (true, _) | (false, 0x00) => 0,
        (false, 0x11) => V2_INET_LEN,
        (false, 0x21) => V2_INET6_LEN,
        _ => return ProxyParse::Invalid(ProxyError::Family),
    };
    if buf.len() < V2_FIXED {
        return ProxyParse::NeedMore;
    }
    let len = usize::from(u16::from_be_bytes([buf[14], buf[15]]));
    if V2_FIXED + len > MAX_HEADER {
        return ProxyParse::Invalid(ProxyError::TooLarge);
    }
    if len < addr_len {
        return ProxyParse::Invalid(ProxyError::Malformed);
    }
    let Some(body) = buf.get(V2_FIXED..V2_FIXED + len) else {
        return ProxyParse::NeedMore;
    };
    let header = |source, destination, authority| ProxyHeader {
        version: 2,
        source,
        destination,
        authority,
    };
    if local || addr_len == 0 {
        // LOCAL's and UNSPEC's bytes after the fixed part are skipped unread.
        return ProxyParse::Found(header(None, None, None), V2_FIXED + len);
    }
    let (addrs, tlvs) = body.split_at(addr_len);
    let Some(authority) = authority_tlv(tlvs) else {
        return ProxyParse::Invalid(ProxyError::Malformed);
    };
    let (src, dst) = v2_addresses(addrs);
    ProxyParse::Found(header(Some(src), Some(dst), authority), V2_FIXED + len)
}

/// Source and destination from a v2 TCP4 (12 bytes) or TCP6 (36 bytes) block.
fn v2_addresses(a: &[u8]) -> (SocketAddr, SocketAddr) {
    let ip_len = (a.len() - 4) / 2;
    let ip = |b: &[u8]| -> IpAddr {
        match <[u8; 4]>::try_from(b) {
            Ok(v4) => IpAddr::from(v4),
            Err(_) => {
                let mut v6 = [0u8; 16];
                v6.copy_from_slice(b);
                IpAddr::from(v6)
            }
        }
    };
    let port = |at: usize| u16::from_be_bytes([a[at], a[at + 1]]);
    let p = 2 * ip_len;
    (
        SocketAddr::new(ip(&a[..ip_len]), port(p)),
        SocketAddr::new(ip(&a[ip_len..p]), port(p + 2)),
    )
}

/// Walk the TLVs (type, 2-byte length, value), bounded by the header's length:
/// `None` if one runs past the end; else the authority, if a usable one is there.
/// Every other type (ALPN, CRC32C, unique ID, SSL, NETNS, the AWS/Azure/GCP vendor
/// types) is skipped.
fn authority_tlv(mut tlvs: &[u8]) -> Option<Option<String>> {
    let mut authority = None;
    while !tlvs.is_empty() {
        let head = tlvs.get(..3)?;
        let len = usize::from(u16::from_be_bytes([head[1], head[2]]));
        let value = tlvs.get(3..3 + len)?;
        let printable = value.iter().all(|b| b.is_ascii_graphic());
        if head[0] == PP2_TYPE_AUTHORITY && printable && (1..=MAX_AUTHORITY).contains(&len) {
            authority = Some(String::from_utf8_lossy(value).into_owned());
        }
        tlvs = &tlvs[3 + len..];
    }
    Some(authority)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ProxyProtocol;
    use crate::proxy_protocol::{header, local};

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    /// Every strict prefix of `h` needs more, `h` is found with its own length, and
    /// bytes after it (a ClientHello) change nothing.
    fn found_exactly(h: &[u8]) -> ProxyHeader {
        for end in 0..h.len() {
            assert_eq!(
                parse(&h[..end]),
                ProxyParse::NeedMore,
                "prefix of {end} bytes of {h:?}"
            );
        }
        let ProxyParse::Found(got, len) = parse(h) else {
            panic!("not found: {:?} for {h:?}", parse(h));
        };
        assert_eq!(len, h.len());
        let mut more = h.to_vec();
        more.extend_from_slice(&[0x16, 0x03, 0x01, 0x02, 0x00]);
        assert_eq!(parse(&more), ProxyParse::Found(got.clone(), len));
        got
    }

    #[test]
    fn v1_tcp4_tcp6_and_unknown() {
        let h = found_exactly(b"PROXY TCP4 192.168.0.1 192.168.0.11 56324 443\r\n");
        assert_eq!(h.source, Some(sa("192.168.0.1:56324")));
        assert_eq!(h.destination, Some(sa("192.168.0.11:443")));
        let h = found_exactly(b"PROXY TCP6 2001:db8::1 ::1 65535 0\r\n");
        assert_eq!(h.source, Some(sa("[2001:db8::1]:65535")));
        let h = found_exactly(b"PROXY UNKNOWN\r\n");
        assert_eq!((h.version, h.source), (1, None));
        let h = found_exactly(b"PROXY UNKNOWN ffff:f...f:ffff 1.2.3.4 65535 65535\r\n");
        assert_eq!(h.source, None);
    }

    #[test]
    fn what_crossbar_sends_is_received_back() {
        for (src, dst, sni) in [
            ("10.1.2.3:4000", "10.0.0.10:8140", None),
            ("[2001:db8::7]:5", "[::1]:8140", Some("puppet.example.com")),
            ("10.1.2.3:4000", "[2001:db8::1]:8140", Some("x")),
        ] {
            for v in [ProxyProtocol::V1, ProxyProtocol::V2] {
                let h = found_exactly(&header(v, sa(src), sa(dst), sni));
                let s = h.source.unwrap();
                assert_eq!((s.ip().to_canonical(), s.port()), {
                    let w = sa(src);
                    (w.ip(), w.port())
                });
                let want = (v == ProxyProtocol::V2).then(|| sni.map(str::to_string));
                assert_eq!(h.authority, want.flatten());
            }
            assert_eq!(found_exactly(&local(ProxyProtocol::V1)).source, None);
            assert_eq!(found_exactly(&local(ProxyProtocol::V2)).source, None);
        }
    }

    fn v2(ver_cmd: u8, fam: u8, body: &[u8]) -> Vec<u8> {
        let mut h = V2_SIGNATURE.to_vec();
        h.extend_from_slice(&[ver_cmd, fam]);
        h.extend_from_slice(&(body.len() as u16).to_be_bytes());
        h.extend_from_slice(body);
        h
    }

    #[test]
    fn v2_tlvs_are_skipped_and_authority_kept() {
        let mut body = vec![10, 0, 0, 1, 10, 0, 0, 2, 0x1f, 0x90, 0x20, 0xcc];
        for (t, v) in [
            (0x01u8, &b"h2"[..]),
            (0x02, b"puppet"),
            (0xEA, &[0x01, b'v', b'p', b'c'][..]),
            (0x04, b""),
        ] {
            body.push(t);
            body.extend_from_slice(&(v.len() as u16).to_be_bytes());
            body.extend_from_slice(v);
        }
        let h = found_exactly(&v2(0x21, 0x11, &body));
        assert_eq!(h.source, Some(sa("10.0.0.1:8080")));
        assert_eq!(h.destination, Some(sa("10.0.0.2:8396")));
        assert_eq!(h.authority.as_deref(), Some("puppet"));
        // A TLV whose length runs past the header.
        let mut bad = body.clone();
        bad.extend_from_slice(&[0x05, 0x00, 0x09, 1]);
        assert_eq!(
            parse(&v2(0x21, 0x11, &bad)),
            ProxyParse::Invalid(ProxyError::Malformed)
        );
    }

    #[test]
    fn v2_local_and_unspec_are_the_tiers_own() {
        let h = found_exactly(&v2(0x20, 0x00, &[]));
        assert_eq!((h.version, h.source), (2, None));
        // LOCAL with addresses: ignored, skipped.
        assert_eq!(found_exactly(&v2(0x20, 0x11, &[0; 12])).source, None);
        assert_eq!(found_exactly(&v2(0x21, 0x00, &[1, 2, 3])).source, None);
    }

    #[test]
    fn each_bad_input_has_its_reason() {
        use ProxyError::*;
        let long_v1 = [&b"PROXY TCP4 "[..], &[b'1'; 100], b"\r\n"].concat();
        let cases: Vec<(Vec<u8>, ProxyError)> = vec![
            (vec![0x16, 0x03, 0x01], Missing),
            (b"GET / HTTP/1.1\r\n".to_vec(), Missing),
            (b"PROXX".to_vec(), Missing),
            (b"\r\n\r\n\0\r\nQUIX".to_vec(), Missing),
            (v2(0x11, 0x11, &[0; 12]), Version),
            (v2(0x22, 0x11, &[0; 12]), Command),
            (v2(0x21, 0x12, &[0; 12]), Family),
            (v2(0x21, 0x31, &[0; 216]), Family),
            (v2(0x21, 0x11, &[0; 11]), Malformed),
            (v2(0x21, 0x21, &[0; 12]), Malformed),
            (v2(0x21, 0x11, &[0; MAX_HEADER]), TooLarge),
            (b"PROXY UDP4 1.2.3.4 1.2.3.4 1 2\r\n".to_vec(), Family),
            (b"PROXY TCP4 1.2.3.4 1.2.3.4 1\r\n".to_vec(), Malformed),
            (b"PROXY TCP4 ::1 ::1 1 2\r\n".to_vec(), Malformed),
            (b"PROXY TCP4 1.2.3.4 1.2.3.4 01 2\r\n".to_vec(), Malformed),
            (
                b"PROXY TCP4 1.2.3.4 1.2.3.4 65536 2\r\n".to_vec(),
                Malformed,
            ),
            (b"PROXY TCP4 1.2.3.4  1.2.3.4 1 2\r\n".to_vec(), Malformed),
            (b"PROXY TCP4 1.2.3.4 1.2.3.4 1 2\n".to_vec(), Malformed),
            (b"PROXY TCP4 1.2.3.4\r1".to_vec(), Malformed),
            (b"PROXY TCP4 1.2.3.4\x00".to_vec(), Malformed),
            (long_v1, TooLarge),
        ];
        for (bytes, want) in cases {
            assert_eq!(parse(&bytes), ProxyParse::Invalid(want), "{bytes:?}");
        }
    }

    /// A v2 header's version, command, family and size are judged on its 16 fixed
    /// bytes, before its body is read; a TLS record on its first byte.
    #[test]
    fn decisions_come_early() {
        assert_eq!(parse(&[0x16]), ProxyParse::Invalid(ProxyError::Missing));
        let big = v2(0x21, 0x11, &[0; MAX_HEADER]);
        assert_eq!(parse(&big[..16]), ProxyParse::Invalid(ProxyError::TooLarge));
        assert_eq!(
            parse(&v2(0x21, 0x31, &[])[..14]),
            ProxyParse::Invalid(ProxyError::Family)
        );
        assert_eq!(wanted(&big[..3]), 13);
        let h = header(ProxyProtocol::V2, sa("1.2.3.4:5"), sa("5.6.7.8:9"), None);
        assert_eq!(wanted(&h[..16]), h.len() - 16);
    }
}
