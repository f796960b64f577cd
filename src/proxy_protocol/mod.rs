//! The PROXY protocol (v1 text, v2 binary): the header a proxy writes before a
//! client's bytes to name the client. crossbar [`send`]s one to backends that ask for
//! it, and [`receive`]s one from the trusted tiers in front of a listener
//! (`listen[].proxy_protocol`), then [`accept`] decides the connection's client
//! address from it, once, before the ClientHello is read.
//! Spec: <https://www.haproxy.org/download/2.9/doc/proxy-protocol.txt>.
mod accept;
mod receive;
mod send;

pub use accept::{header_signature, read_front, Front, FrontError, SIGNATURE_MAX};
pub use receive::{parse, ProxyError, ProxyHeader, ProxyParse, MAX_HEADER, V1_MAX};
pub use send::{header, local};

/// The 12-byte v2 signature.
pub const V2_SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";
/// The start of every v1 line.
pub const V1_PREFIX: &[u8; 6] = b"PROXY ";
/// TLV type carrying the host name the client asked for (its SNI).
pub const PP2_TYPE_AUTHORITY: u8 = 0x02;
