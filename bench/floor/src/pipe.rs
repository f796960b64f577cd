//! One direction of a relayed connection, the same in both engines: a fixed buffer
//! of bytes read from one side and not yet written to the other, and how its end
//! was passed on.

/// Bytes held per direction: one TLS record of 16 KiB fits, as in crossbar's relay.
pub const BUF: usize = 16 * 1024;

/// Bytes read from one side, not yet written to the other.
pub struct Pipe {
    pub buf: Box<[u8; BUF]>,
    start: usize,
    end: usize,
    /// The source side said EOF.
    pub eof: bool,
    /// The EOF was passed on (or needs no shutdown: the close that follows sends
    /// it).
    pub shut: bool,
}

impl Pipe {
    pub fn new() -> Pipe {
        Pipe {
            buf: Box::new([0; BUF]),
            start: 0,
            end: 0,
            eof: false,
            shut: false,
        }
    }

    /// Empty again, for a new connection in a reused slot (the buffer is kept).
    pub fn reset(&mut self) {
        (self.start, self.end, self.eof, self.shut) = (0, 0, false, false);
    }

    /// What was read and not yet written.
    pub fn pending(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    /// A read put `n` bytes at the start of the (empty) buffer.
    pub fn filled(&mut self, n: usize) {
        (self.start, self.end) = (0, n);
    }

    /// A write took `n` of the pending bytes.
    pub fn sent(&mut self, n: usize) {
        self.start += n;
        if self.start == self.end {
            (self.start, self.end) = (0, 0);
        }
    }
}
