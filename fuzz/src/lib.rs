//! Properties of crossbar's parsers of hostile input, shared by the cargo-fuzz targets
//! (`fuzz/fuzz_targets/*.rs`, nightly, run by `bench/fuzz.sh`) and the stable tests in
//! `tests/fuzz_props.rs` (which include this file with `#[path]`, so CI needs no
//! nightly and no extra crate). Each check panics, naming the property, when one fails.
//!
//! - [`client_hello`]: `parse_client_hello` over growing prefixes, as `conn.rs` reads.
//! - [`server_watcher`]: `ServerWatcher` fed in arbitrary chunks.
//! - [`proxy_header`]: `proxy_protocol::header` decoded back by [`decode_proxy`],
//!   a decoder written from the PROXY protocol spec, not from crossbar's encoder.
//! - [`proxy_accept`]: `proxy_protocol::parse` (receiving) over growing prefixes,
//!   checked against [`decode_proxy`] where both accept.
//! - [`config`]: `Config::from_str_at` on arbitrary text.
#![forbid(unsafe_code)]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;

use crossbar::config::{Config, ProxyProtocol};
use crossbar::hello::{parse_client_hello, ClientHelloInfo, HelloParse, ServerWatcher};
use crossbar::proxy_protocol::{self, ProxyParse};

/// TLS record header length: a hello that still needs bytes never holds more than
/// `max` plus one record header (conn.rs reads `max` + 1 KiB at most).
const RECORD_HEADER_LEN: usize = 5;

/// The hello limit conn.rs uses by default (`max_hello_size`).
pub const DEFAULT_MAX_HELLO: usize = 16 * 1024;

/// Stream byte counts at which a reader sees new data: the sorted, de-duplicated
/// `cuts` below `data.len()`, then the whole buffer.
fn prefix_ends(len: usize, cuts: &[usize]) -> Vec<usize> {
    let mut ends: Vec<usize> = cuts.iter().map(|&c| c % (len + 1)).collect();
    ends.push(len);
    ends.sort_unstable();
    ends.dedup();
    ends
}

/// `parse_client_hello` over the growing prefixes of `data` that a reader cut at
/// `cuts` would see, and over `data` whole:
///
/// - results go `NeedMore`* then one decided result that never changes again, and
///   that decided result is the one the whole buffer gives (so no prefix is `Found`
///   when the stream later turns out `Invalid`, nor the other way round);
/// - `NeedMore` only while fewer than `max` + one record header bytes are buffered
///   (the reader's buffer stays bounded);
/// - `Found` names `consumed` bytes: within the buffer and `max`, decided exactly
///   there (one byte less still needs more), and the same hello as the whole stream.
pub fn client_hello(data: &[u8], cuts: &[usize], max: usize) -> HelloParse {
    let whole = parse_client_hello(data, max);
    let mut decided: Option<HelloParse> = None;
    for end in prefix_ends(data.len(), cuts) {
        let r = parse_client_hello(&data[..end], max);
        match (&decided, &r) {
            (None, HelloParse::NeedMore) => {
                assert!(
                    end < max + RECORD_HEADER_LEN,
                    "NeedMore with {end} bytes buffered (max {max})"
                );
            }
            (None, _) => decided = Some(r.clone()),
            (Some(d), _) => assert_eq!(d, &r, "result changed at {end} bytes"),
        }
    }
    match &decided {
        Some(d) => assert_eq!(d, &whole, "a prefix decided differently from the whole"),
        None => assert_eq!(whole, HelloParse::NeedMore),
    }
    if let HelloParse::Found(h) = &whole {
        found_is_exact(data, h, max);
    }
    whole
}

/// A `Found` hello is decided exactly at `consumed` bytes.
fn found_is_exact(data: &[u8], h: &ClientHelloInfo, max: usize) {
    assert!(h.consumed <= data.len(), "consumed past the buffer");
    assert!(h.consumed <= max, "consumed {} > max {max}", h.consumed);
    assert_eq!(
        parse_client_hello(&data[..h.consumed], max),
        HelloParse::Found(h.clone()),
        "the hello's own bytes parse to the same hello"
    );
    if h.consumed > 0 {
        assert_eq!(
            parse_client_hello(&data[..h.consumed - 1], max),
            HelloParse::NeedMore,
            "one byte short of `consumed` still needs more"
        );
    }
}

/// The same handshake message carried in records of at most `sizes[i]` payload bytes
/// (cycling through `sizes`, each at least 1): a legal re-framing of `record` (one
/// complete TLS record). Returns `None` if `record` is not a single whole record.
pub fn reframe(record: &[u8], sizes: &[usize]) -> Option<Vec<u8>> {
    let header = record.get(..RECORD_HEADER_LEN)?;
    let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
    let body = record.get(RECORD_HEADER_LEN..RECORD_HEADER_LEN + len)?;
    let mut out = Vec::with_capacity(record.len() * 2);
    let mut rest = body;
    let mut i = 0usize;
    while !rest.is_empty() {
        let n = sizes
            .get(i % sizes.len().max(1))
            .copied()
            .unwrap_or(rest.len())
            .clamp(1, rest.len());
        let (chunk, tail) = rest.split_at(n);
        out.extend_from_slice(&header[..3]);
        out.extend_from_slice(&(n as u16).to_be_bytes());
        out.extend_from_slice(chunk);
        rest = tail;
        i += 1;
    }
    out.extend_from_slice(&record[RECORD_HEADER_LEN + len..]);
    Some(out)
}

/// Feed `data` to a fresh `ServerWatcher` (limit `limit`) in chunks ending at `cuts`,
/// and whole to another: no panic, both learn exactly the same, and once a watcher
/// says done it stays done.
pub fn server_watcher(data: &[u8], cuts: &[usize], limit: usize) {
    let mut whole = ServerWatcher::new(limit);
    let whole_done = whole.feed(data);
    let mut chunked = ServerWatcher::new(limit);
    let mut start = 0usize;
    let mut done = false;
    for end in prefix_ends(data.len(), cuts) {
        let now = chunked.feed(&data[start..end]);
        assert!(!done || now, "a done watcher came back to life");
        done = now;
        start = end;
    }
    assert_eq!(
        chunked.info(),
        whole.info(),
        "chunking changed what was learned"
    );
    assert_eq!(done, whole_done, "chunking changed when watching ended");
    assert_eq!(chunked.is_done(), done);
    if data.len() >= limit {
        assert!(whole_done, "past the byte limit the watcher must be done");
    }
    // After done, more bytes change nothing.
    if whole_done {
        let before = whole.info().clone();
        assert!(whole.feed(data));
        assert_eq!(whole.info(), &before);
    }
}

/// A decoded PROXY protocol header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyHeader {
    /// The source (client) address.
    pub src: SocketAddr,
    /// The destination (crossbar's listener) address.
    pub dst: SocketAddr,
    /// v2 PP2_TYPE_AUTHORITY (0x02) TLV value, if present.
    pub authority: Option<Vec<u8>>,
    /// Bytes the header took.
    pub len: usize,
}

/// Longest v1 line, CRLF included (spec 2.1: "107 characters").
const V1_MAX: usize = 107;
/// The v2 signature (spec 2.2).
const V2_SIG: &[u8; 12] = b"\x0D\x0A\x0D\x0A\x00\x0D\x0A\x51\x55\x49\x54\x0A";

/// Decode a PROXY v1 or v2 header from the front of `buf`, following the text of
/// <https://www.haproxy.org/download/2.9/doc/proxy-protocol.txt> (sections 2.1, 2.2).
/// Only TCP over IPv4/IPv6 with the PROXY command is accepted (what crossbar sends).
pub fn decode_proxy(buf: &[u8]) -> Result<ProxyHeader, String> {
    if buf.starts_with(V2_SIG) {
        decode_v2(buf)
    } else if buf.starts_with(b"PROXY ") {
        decode_v1(buf)
    } else {
        Err("no PROXY signature".into())
    }
}

fn decode_v1(buf: &[u8]) -> Result<ProxyHeader, String> {
    let window = &buf[..buf.len().min(V1_MAX)];
    let end = window
        .windows(2)
        .position(|w| w == b"\r\n")
        .ok_or("v1: no CRLF within 107 bytes")?;
    let line = std::str::from_utf8(&buf[..end]).map_err(|_| "v1: not ASCII")?;
    if !line.is_ascii() {
        return Err("v1: not ASCII".into());
    }
    let parts: Vec<&str> = line.split(' ').collect();
    let ["PROXY", proto, src, dst, sport, dport] = parts.as_slice() else {
        return Err(format!("v1: expected 6 space-separated fields: {line:?}"));
    };
    let ip = |s: &str| -> Result<IpAddr, String> {
        match *proto {
            "TCP4" => s.parse::<Ipv4Addr>().map(IpAddr::V4),
            "TCP6" => s.parse::<Ipv6Addr>().map(IpAddr::V6),
            _ => return Err(format!("v1: protocol {proto:?}")),
        }
        .map_err(|e| format!("v1: address {s:?}: {e}"))
    };
    let port = |s: &str| -> Result<u16, String> {
        // Decimal digits only, no leading zero (what strict receivers accept).
        if s.is_empty()
            || (s.len() > 1 && s.starts_with('0'))
            || !s.bytes().all(|b| b.is_ascii_digit())
        {
            return Err(format!("v1: port {s:?}"));
        }
        s.parse::<u16>().map_err(|e| format!("v1: port {s:?}: {e}"))
    };
    Ok(ProxyHeader {
        src: SocketAddr::new(ip(src)?, port(sport)?),
        dst: SocketAddr::new(ip(dst)?, port(dport)?),
        authority: None,
        len: end + 2,
    })
}

fn decode_v2(buf: &[u8]) -> Result<ProxyHeader, String> {
    let hdr = buf.get(..16).ok_or("v2: short header")?;
    let (ver, cmd) = (hdr[12] >> 4, hdr[12] & 0x0f);
    if ver != 2 || cmd != 1 {
        return Err(format!("v2: version {ver} command {cmd}, want 2 / PROXY"));
    }
    let (family, transport) = (hdr[13] >> 4, hdr[13] & 0x0f);
    if transport != 1 {
        return Err(format!("v2: transport {transport}, want STREAM"));
    }
    let len = usize::from(u16::from_be_bytes([hdr[14], hdr[15]]));
    let body = buf.get(16..16 + len).ok_or("v2: length past the buffer")?;
    let ip_len = match family {
        1 => 4,
        2 => 16,
        f => return Err(format!("v2: family {f}")),
    };
    let addrs = body
        .get(..2 * ip_len + 4)
        .ok_or("v2: short address block")?;
    let ip = |b: &[u8]| -> IpAddr {
        if ip_len == 4 {
            IpAddr::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3]))
        } else {
            let mut a = [0u8; 16];
            a.copy_from_slice(b);
            IpAddr::V6(Ipv6Addr::from(a))
        }
    };
    let p = 2 * ip_len;
    let src = SocketAddr::new(
        ip(&addrs[..ip_len]),
        u16::from_be_bytes([addrs[p], addrs[p + 1]]),
    );
    let dst = SocketAddr::new(
        ip(&addrs[ip_len..p]),
        u16::from_be_bytes([addrs[p + 2], addrs[p + 3]]),
    );
    let mut tlvs = &body[2 * ip_len + 4..];
    let mut authority = None;
    while !tlvs.is_empty() {
        let t = tlvs.get(..3).ok_or("v2: truncated TLV header")?;
        let n = usize::from(u16::from_be_bytes([t[1], t[2]]));
        let value = tlvs.get(3..3 + n).ok_or("v2: TLV past the header")?;
        if t[0] == 0x02 {
            if authority.is_some() {
                return Err("v2: two AUTHORITY TLVs".into());
            }
            authority = Some(value.to_vec());
        }
        tlvs = &tlvs[3 + n..];
    }
    Ok(ProxyHeader {
        src,
        dst,
        authority,
        len: 16 + len,
    })
}

/// What the header for (`src`, `dst`) must carry: both IPv4 (v4-mapped counts as
/// IPv4) stay IPv4, anything else becomes IPv6 with IPv4 mapped.
fn expected_family(src: SocketAddr, dst: SocketAddr) -> (SocketAddr, SocketAddr) {
    let (s, d) = (src.ip().to_canonical(), dst.ip().to_canonical());
    let six = |ip: IpAddr| match ip {
        IpAddr::V4(a) => IpAddr::V6(a.to_ipv6_mapped()),
        v6 => v6,
    };
    match (s, d) {
        (IpAddr::V4(_), IpAddr::V4(_)) => (
            SocketAddr::new(s, src.port()),
            SocketAddr::new(d, dst.port()),
        ),
        _ => (
            SocketAddr::new(six(s), src.port()),
            SocketAddr::new(six(d), dst.port()),
        ),
    }
}

/// Encode with crossbar, decode with [`decode_proxy`], compare: addresses and ports
/// survive (in the family rule above), the header is exactly as long as it says,
/// v1 fits in 107 bytes, and v2 carries the authority iff it is 1..=253 bytes.
pub fn proxy_header(src: SocketAddr, dst: SocketAddr, authority: Option<&str>) {
    let (want_src, want_dst) = expected_family(src, dst);
    for version in [ProxyProtocol::V1, ProxyProtocol::V2] {
        let h = crossbar::proxy_protocol::header(version, src, dst, authority);
        let got =
            decode_proxy(&h).unwrap_or_else(|e| panic!("{version:?} {src} {dst}: {e}: {h:?}"));
        assert_eq!(got.len, h.len(), "{version:?}: header length");
        assert_eq!(
            (got.src, got.dst),
            (want_src, want_dst),
            "{version:?} addresses"
        );
        let want_authority = match version {
            ProxyProtocol::V1 => None,
            ProxyProtocol::V2 => authority
                .filter(|a| !a.is_empty() && a.len() <= 253)
                .map(|a| a.as_bytes().to_vec()),
        };
        assert_eq!(got.authority, want_authority, "{version:?} authority");
        if version == ProxyProtocol::V1 {
            assert!(h.len() <= V1_MAX, "v1 line of {} bytes", h.len());
        }
    }
}

/// `proxy_protocol::parse` (the receiving parser) over the growing prefixes of `data`
/// a reader cut at `cuts` would see, and over `data` whole:
///
/// - `NeedMore`* then one decided result that never changes, the whole's;
/// - `NeedMore` only while fewer than the v2 limit (4 KiB) bytes are buffered;
/// - `Found(h, len)` is decided exactly at `len` (one byte less still needs more),
///   and a header with a client address says what [`decode_proxy`] (written from
///   the spec) reads from the same bytes, when it reads them.
pub fn proxy_accept(data: &[u8], cuts: &[usize]) -> ProxyParse {
    let whole = proxy_protocol::parse(data);
    let mut decided: Option<ProxyParse> = None;
    for end in prefix_ends(data.len(), cuts) {
        let r = proxy_protocol::parse(&data[..end]);
        match (&decided, &r) {
            (None, ProxyParse::NeedMore) => assert!(
                end < proxy_protocol::MAX_HEADER,
                "NeedMore with {end} bytes buffered"
            ),
            (None, _) => decided = Some(r.clone()),
            (Some(d), _) => assert_eq!(d, &r, "result changed at {end} bytes"),
        }
    }
    match &decided {
        Some(d) => assert_eq!(d, &whole, "a prefix decided differently from the whole"),
        None => assert_eq!(whole, ProxyParse::NeedMore),
    }
    if let ProxyParse::Found(h, len) = &whole {
        assert!(*len <= data.len() && *len <= proxy_protocol::MAX_HEADER);
        assert_eq!(proxy_protocol::parse(&data[..*len]), whole, "own bytes");
        assert_eq!(
            proxy_protocol::parse(&data[..len - 1]),
            ProxyParse::NeedMore,
            "one byte short"
        );
        if let (Some(src), Ok(d)) = (h.source, decode_proxy(&data[..*len])) {
            assert_eq!((src, d.len), (d.src, *len), "the spec decoder agrees");
        }
    }
    whole
}

/// Build (src, dst, authority) from raw fuzz bytes: a flag byte picks the families
/// (v4, v6, or v4-mapped v6), then 2 x 16 address bytes, 2 x 2 port bytes, and the
/// rest is the authority (lossy UTF-8; absent when the flag's top bit is clear).
pub fn proxy_input(data: &[u8]) -> (SocketAddr, SocketAddr, Option<String>) {
    let mut raw = [0u8; 37];
    let n = data.len().min(raw.len());
    raw[..n].copy_from_slice(&data[..n]);
    let flags = raw[0];
    let addr = |kind: u8, b: &[u8], port: [u8; 2]| {
        let mut a = [0u8; 16];
        a.copy_from_slice(b);
        let ip = match kind % 3 {
            0 => IpAddr::V4(Ipv4Addr::new(a[0], a[1], a[2], a[3])),
            1 => IpAddr::V6(Ipv6Addr::from(a)),
            _ => IpAddr::V6(Ipv4Addr::new(a[0], a[1], a[2], a[3]).to_ipv6_mapped()),
        };
        SocketAddr::new(ip, u16::from_be_bytes(port))
    };
    let src = addr(flags & 0x0f, &raw[1..17], [raw[33], raw[34]]);
    let dst = addr((flags >> 4) & 0x07, &raw[17..33], [raw[35], raw[36]]);
    let authority = (flags & 0x80 != 0)
        .then(|| String::from_utf8_lossy(data.get(37..).unwrap_or(&[])).into_owned());
    (src, dst, authority)
}

/// `Config::from_str_at` on arbitrary text: returns (never panics), and an error
/// has at least one diagnostic, each with a non-empty message, naming the file.
pub fn config(text: &str) -> bool {
    let path = Path::new("fuzz.yaml");
    match Config::from_str_at(text, path) {
        Ok(_) => true,
        Err(e) => {
            assert!(!e.diagnostics.is_empty(), "an error without a diagnostic");
            for d in &e.diagnostics {
                assert!(
                    !d.message.trim().is_empty(),
                    "empty message: {d:?} for {text:?}"
                );
                assert_eq!(d.file, path);
            }
            let shown = e.to_string();
            assert!(shown.starts_with("fuzz.yaml"), "{shown}");
            false
        }
    }
}
