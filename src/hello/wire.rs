//! TLS wire basics shared by both sides: record and handshake constants, a
//! bounds-checked reader, and a bounded walk of the extension list that borrows
//! from the hello and allocates nothing.
#[cfg(test)]
use tls_parser::{
    parse_tls_client_hello_extensions, parse_tls_server_hello_extensions, TlsExtension,
};

use super::inline::Versions;

/// TLS record header: content type (1), legacy version (2), length (2).
pub(super) const RECORD_HEADER_LEN: usize = 5;
/// Handshake message header: type (1), length (3).
pub(super) const HANDSHAKE_HEADER_LEN: usize = 4;
/// Largest record body we accept: 2^14 plaintext (RFC 8446 5.1) plus the 2048 bytes of
/// expansion TLS 1.2 allows for ciphertext (RFC 5246 6.2.3); anything longer is garbage.
pub(super) const MAX_RECORD_LEN: usize = 16384 + 2048;

/// Record content types (RFC 8446 5.1).
pub(super) const CONTENT_CHANGE_CIPHER_SPEC: u8 = 0x14;
pub(super) const CONTENT_ALERT: u8 = 0x15;
pub(super) const CONTENT_HANDSHAKE: u8 = 0x16;
/// Major byte of every SSL 3.0 / TLS record version (0x0300..=0x0304).
pub(super) const RECORD_VERSION_MAJOR: u8 = 0x03;

/// Handshake message types (RFC 8446 4, RFC 5246 7.4).
pub(super) const HS_CLIENT_HELLO: u8 = 1;
pub(super) const HS_SERVER_HELLO: u8 = 2;
pub(super) const HS_NEW_SESSION_TICKET: u8 = 4;
pub(super) const HS_CERTIFICATE: u8 = 11;
pub(super) const HS_SERVER_KEY_EXCHANGE: u8 = 12;
pub(super) const HS_CERTIFICATE_REQUEST: u8 = 13;
pub(super) const HS_SERVER_HELLO_DONE: u8 = 14;

/// Extension types we read (IANA "TLS ExtensionType Values").
pub(super) const EXT_SERVER_NAME: u16 = 0;
pub(super) const EXT_ALPN: u16 = 16;
pub(super) const EXT_SESSION_TICKET: u16 = 35;
pub(super) const EXT_PRE_SHARED_KEY: u16 = 41;
pub(super) const EXT_EARLY_DATA: u16 = 42;
pub(super) const EXT_SUPPORTED_VERSIONS: u16 = 43;
/// server_name NameType host_name (RFC 6066 3).
pub(super) const SNI_HOST_NAME: u8 = 0;

/// The ServerHello.random that marks a HelloRetryRequest: SHA-256("HelloRetryRequest")
/// (RFC 8446 4.1.3). A test recomputes it.
pub(super) const HELLO_RETRY_RANDOM: [u8; 32] = [
    0xcf, 0x21, 0xad, 0x74, 0xe5, 0x9a, 0x61, 0x11, 0xbe, 0x1d, 0x8c, 0x02, 0x1e, 0x65, 0xb8, 0x91,
    0xc2, 0xa2, 0x11, 0x16, 0x7a, 0xbb, 0x8c, 0x5e, 0x07, 0x9e, 0x09, 0xe2, 0xc8, 0xa8, 0x33, 0x9c,
];

/// Which hello an extension list belongs to (supported_versions differs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Side {
    Client,
    Server,
}

/// The extension contents we care about, borrowed from the hello.
#[derive(Debug, Default)]
pub(super) struct Extensions<'a> {
    /// First host_name of server_name.
    pub(super) sni: Option<&'a [u8]>,
    /// SessionTicket contents (maybe empty).
    pub(super) ticket: Option<&'a [u8]>,
    /// Raw pre_shared_key contents (client: identities + binders; server: u16 index).
    pub(super) psk: Option<&'a [u8]>,
    /// supported_versions (client: the offered list; server: the selected one).
    pub(super) versions: Versions,
    /// early_data is present.
    pub(super) early_data: bool,
}

/// Read the extensions we need with tls-parser, for tests that check
/// [`walk_extensions`] against it (tls-parser allocates a Vec per list it reads:
/// ~20 allocator calls per hello, issue #32).
#[cfg(test)]
pub(super) fn read_extensions(ext: &[u8], side: Side) -> Option<Extensions<'_>> {
    let parsed = match side {
        Side::Client => parse_tls_client_hello_extensions(ext),
        Side::Server => parse_tls_server_hello_extensions(ext),
    };
    match parsed {
        // tls-parser's list parser stops silently at the first extension it can't
        // parse and returns the rest: only an empty rest means it read them all.
        Ok((&[], list)) => Some(from_tls_parser(&list)),
        _ => walk_extensions(ext, side),
    }
}

/// Pick our fields out of tls-parser's extension list.
#[cfg(test)]
pub(super) fn from_tls_parser<'a>(list: &[TlsExtension<'a>]) -> Extensions<'a> {
    let mut out = Extensions::default();
    for ext in list {
        match ext {
            TlsExtension::SNI(names) if out.sni.is_none() => {
                out.sni = names
                    .iter()
                    .find(|(kind, _)| kind.0 == SNI_HOST_NAME)
                    .map(|&(_, name)| name);
            }
            TlsExtension::SessionTicket(t) => out.ticket = Some(t),
            TlsExtension::PreSharedKey(p) => out.psk = Some(p),
            TlsExtension::SupportedVersions(v) => {
                out.versions = Versions::default();
                v.iter().for_each(|v| out.versions.push(v.0));
            }
            TlsExtension::EarlyData(_) => out.early_data = true,
            _ => {}
        }
    }
    out
}

/// Walk `extensions<..>` and decode only the five we need, borrowing from `ext`.
/// `None` if the list itself or one of those five (or ALPN) is malformed. Lenient
/// where tls-parser is strict about extensions we don't use, so an odd extension
/// from a real client does not cost the connection; every length is checked.
pub(super) fn walk_extensions(ext: &[u8], side: Side) -> Option<Extensions<'_>> {
    let mut out = Extensions::default();
    let mut r = Reader::new(ext);
    while !r.is_empty() {
        let kind = r.u16()?;
        let data = r.vec16()?;
        let mut d = Reader::new(data);
        match kind {
            EXT_SERVER_NAME if side == Side::Client && out.sni.is_none() => {
                let mut names = Reader::new(d.vec16()?);
                while !names.is_empty() {
                    let name_type = names.u8()?;
                    let name = names.vec16()?;
                    if name_type == SNI_HOST_NAME && out.sni.is_none() {
                        out.sni = Some(name);
                    }
                }
            }
            EXT_SESSION_TICKET => out.ticket = Some(data),
            EXT_PRE_SHARED_KEY => out.psk = Some(data),
            EXT_EARLY_DATA => out.early_data = true,
            EXT_SUPPORTED_VERSIONS => {
                out.versions = Versions::default();
                let mut list = match side {
                    Side::Client => Reader::new(d.vec8()?),
                    Side::Server => d,
                };
                while !list.is_empty() {
                    out.versions.push(list.u16()?);
                }
            }
            EXT_ALPN => {
                // Not used, but a malformed list makes the hello malformed.
                let mut names = Reader::new(d.vec16()?);
                while !names.is_empty() {
                    names.vec8()?;
                }
            }
            _ => {}
        }
    }
    Some(out)
}

/// Big-endian u16 at `at`, if there.
pub(super) fn read_u16(buf: &[u8], at: usize) -> Option<u16> {
    let b = buf.get(at..at.checked_add(2)?)?;
    Some(u16::from_be_bytes([b[0], b[1]]))
}

/// Big-endian u24 at `at`, if there.
pub(super) fn read_u24(buf: &[u8], at: usize) -> Option<usize> {
    let b = buf.get(at..at.checked_add(3)?)?;
    Some(usize::from(b[0]) << 16 | usize::from(b[1]) << 8 | usize::from(b[2]))
}

/// A bounds-checked cursor over TLS wire structures: every read is an `Option`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Reader<'a> {
    pub(super) buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(super) fn new(buf: &'a [u8]) -> Self {
        Reader { buf }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    pub(super) fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.buf.len() {
            return None;
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Some(head)
    }

    pub(super) fn u8(&mut self) -> Option<u8> {
        self.take(1)?.first().copied()
    }

    pub(super) fn u16(&mut self) -> Option<u16> {
        let b = self.take(2)?;
        read_u16(b, 0)
    }

    /// `opaque x<0..2^8-1>`.
    pub(super) fn vec8(&mut self) -> Option<&'a [u8]> {
        let n = self.u8()?;
        self.take(usize::from(n))
    }

    /// `opaque x<0..2^16-1>`.
    pub(super) fn vec16(&mut self) -> Option<&'a [u8]> {
        let n = self.u16()?;
        self.take(usize::from(n))
    }
}
