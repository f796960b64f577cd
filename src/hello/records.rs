//! The server's records after its handshake showed: which of them prove that the
//! client completed its side (learning waits for one, `crate::stick::learn_when`).
use super::wire::{CONTENT_ALERT, RECORD_HEADER_LEN};

/// Record content type of application data, the outer type of every TLS 1.3
/// record once encrypted (RFC 8446 5.2).
const CONTENT_APPLICATION_DATA: u8 = 0x17;
/// Longest encrypted TLS 1.3 alert: the alert (2) and its inner content type (1)
/// under a 16-byte AEAD tag (every TLS 1.3 cipher suite's but CCM_8's, whose 8
/// bytes give 11). A server aborting a client's junk Finished sends one of these
/// (TLS <= 1.2 sends an alert record, type 21); servers don't pad alerts.
pub const MAX_ENCRYPTED_ALERT: u16 = 2 + 1 + 16;

/// What one record of the server, sent after the client's flight, says of that
/// flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerProof {
    /// Data longer than an alert: a NewSessionTicket or an answer, which a server
    /// only sends after it checked the client's Finished.
    Proven,
    /// An alert: the server refused the client's flight.
    Refused,
    /// Nothing either way (a ChangeCipherSpec, a record as short as an alert).
    Unknown,
}

/// Judge one server record by its header alone (its body is encrypted).
pub fn server_proof(content_type: u8, len: u16) -> ServerProof {
    match content_type {
        CONTENT_ALERT => ServerProof::Refused,
        CONTENT_APPLICATION_DATA if len > MAX_ENCRYPTED_ALERT => ServerProof::Proven,
        _ => ServerProof::Unknown,
    }
}

/// Follows the record boundaries of a byte stream, fed in pieces, without keeping
/// any record's body: 8 bytes of state, so it costs nothing to carry.
#[derive(Debug, Default, Clone)]
pub struct RecordScan {
    /// The header being read, while `have` < 5.
    header: [u8; RECORD_HEADER_LEN],
    /// Header bytes read of the current record.
    have: u8,
    /// Body bytes of the current record still to skip.
    left: u16,
}

impl RecordScan {
    /// Read `data`, calling `on_record(content type, length)` at each record header
    /// completed, until it returns true; returns whether it did.
    pub fn feed(&mut self, mut data: &[u8], mut on_record: impl FnMut(u8, u16) -> bool) -> bool {
        while !data.is_empty() {
            if self.left > 0 {
                let skip = data.len().min(usize::from(self.left));
                data = &data[skip..];
                // skip <= left, a u16.
                self.left -= skip as u16;
                continue;
            }
            let have = usize::from(self.have);
            let take = data.len().min(RECORD_HEADER_LEN - have);
            self.header[have..have + take].copy_from_slice(&data[..take]);
            data = &data[take..];
            self.have += take as u8; // <= 5
            if usize::from(self.have) < RECORD_HEADER_LEN {
                continue;
            }
            self.have = 0;
            let len = u16::from_be_bytes([self.header[3], self.header[4]]);
            self.left = len;
            if on_record(self.header[0], len) {
                return true;
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(kind: u8, len: u16) -> Vec<u8> {
        let mut r = vec![kind, 3, 3];
        r.extend_from_slice(&len.to_be_bytes());
        r.extend(std::iter::repeat_n(0xaa, usize::from(len)));
        r
    }

    /// Record headers are found whatever the pieces: one byte at a time too.
    #[test]
    fn headers_are_found_across_pieces() {
        let mut stream = record(0x16, 90);
        stream.extend(record(0x14, 1));
        stream.extend(record(0x17, 300));
        stream.extend(record(0x15, 19));
        for piece in [1, 3, 7, 5000] {
            let mut scan = RecordScan::default();
            let mut seen = Vec::new();
            for chunk in stream.chunks(piece) {
                scan.feed(chunk, |t, l| {
                    seen.push((t, l));
                    false
                });
            }
            assert_eq!(
                seen,
                [(0x16, 90), (0x14, 1), (0x17, 300), (0x15, 19)],
                "{piece}"
            );
        }
    }

    #[test]
    fn alerts_refuse_and_long_data_proves() {
        assert_eq!(server_proof(0x15, 2), ServerProof::Refused);
        assert_eq!(
            server_proof(0x17, MAX_ENCRYPTED_ALERT),
            ServerProof::Unknown
        );
        assert_eq!(
            server_proof(0x17, MAX_ENCRYPTED_ALERT + 1),
            ServerProof::Proven
        );
        assert_eq!(server_proof(0x14, 1), ServerProof::Unknown);
    }
}
