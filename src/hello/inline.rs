//! Small values of a handshake held inline rather than on the heap: a session ID
//! (at most 32 bytes) and the first offered versions. Parsing a hello allocates
//! only what a connection keeps beyond the buffer it came in (issue #32).
use std::ops::Deref;

/// Longest legacy_session_id (RFC 8446 4.1.2, RFC 5246 7.4.1.2).
pub const MAX_SESSION_ID: usize = 32;

/// A legacy_session_id, 0..=32 bytes, inline; derefs to its bytes.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionId {
    bytes: [u8; MAX_SESSION_ID],
    len: u8,
}

impl SessionId {
    /// The ID, if `bytes` is a valid one (at most 32 bytes).
    pub fn new(bytes: &[u8]) -> Option<SessionId> {
        let mut id = SessionId::default();
        id.bytes.get_mut(..bytes.len())?.copy_from_slice(bytes);
        id.len = u8::try_from(bytes.len()).ok()?;
        Some(id)
    }
}

impl Deref for SessionId {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

impl std::fmt::Debug for SessionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.deref().fmt(f)
    }
}

impl PartialEq<Vec<u8>> for SessionId {
    fn eq(&self, other: &Vec<u8>) -> bool {
        self.deref() == other.as_slice()
    }
}

/// Offered versions kept in order (a real client offers 2-4 plus a GREASE value).
pub const KEPT_VERSIONS: usize = 8;

/// supported_versions: the first [`KEPT_VERSIONS`] offered, inline, and whether
/// TLS 1.3 was offered anywhere in the list (all that routing and stickiness ask).
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct Versions {
    first: [u16; KEPT_VERSIONS],
    len: u8,
    tls13: bool,
}

impl Versions {
    /// Add the next version of the list.
    pub(super) fn push(&mut self, v: u16) {
        if let Some(slot) = self.first.get_mut(usize::from(self.len)) {
            *slot = v;
            self.len += 1;
        }
        self.tls13 |= v == super::version::TLS13;
    }

    /// Whether `v` was offered: TLS 1.3 anywhere in the list, others among the
    /// first [`KEPT_VERSIONS`].
    pub fn contains(&self, v: &u16) -> bool {
        (*v == super::version::TLS13 && self.tls13) || self.deref().contains(v)
    }
}

impl Deref for Versions {
    type Target = [u16];
    fn deref(&self) -> &[u16] {
        &self.first[..usize::from(self.len)]
    }
}

impl std::fmt::Debug for Versions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.deref().fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_id_holds_up_to_32_bytes() {
        assert_eq!(&*SessionId::new(&[7; 32]).unwrap(), &[7; 32]);
        assert!(SessionId::new(&[7; 33]).is_none());
        assert!(SessionId::new(&[]).unwrap().is_empty());
    }

    #[test]
    fn versions_keep_the_first_and_remember_tls13() {
        let mut v = Versions::default();
        for x in 0..20u16 {
            v.push(0x0a0a + x);
        }
        v.push(super::super::version::TLS13);
        assert_eq!(v.len(), KEPT_VERSIONS);
        assert!(v.contains(&0x0304));
        assert!(!v.contains(&0x0303));
    }
}
