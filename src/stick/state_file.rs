//! The saved form of a stick table (`state_file`): versioned, checksummed, written
//! atomically, and read back only if it is whole.
use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::hash::Hasher;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use siphasher::sip::SipHasher13;

use super::entry::*;
use super::{KeyKind, StickTable};

/// First bytes of a saved table.
pub(super) const STATE_MAGIC: [u8; 8] = *b"XBSTICK\0";
/// Version of the saved-table format; files of other versions are rejected.
pub(super) const STATE_VERSION: u32 = 1;
/// Fixed SipHash key of the file checksum: it detects corruption and truncation, it
/// authenticates nothing (whoever can write the file can recompute it).
pub(super) const CHECKSUM_KEY: (u64, u64) = (0x6372_6f73_7362_6172, 0x7374_6963_6b5f_7631);
/// Bytes of one saved entry: hash u64, kind u8, flags u8, backend u16, age u32, idle u32.
pub(super) const SAVED_ENTRY_BYTES: usize = 20;
/// Bytes of the trailing checksum.
pub(super) const CHECKSUM_BYTES: usize = 8;

/// Why a saved table was rejected; `load` returns it inside an `io::Error` of kind
/// `InvalidData` (get it back with `io::Error::get_ref` + `downcast_ref`).
#[derive(Debug, thiserror::Error)]
pub enum StateFileError {
    /// The file does not start with the stick-table magic.
    #[error("not a crossbar stick table file")]
    BadMagic,
    /// Written by a crossbar with another file format.
    #[error(
        "stick table file has format version {found}, this build reads version {STATE_VERSION}"
    )]
    UnsupportedVersion {
        /// The version in the file.
        found: u32,
    },
    /// The file ends before its header or entries do.
    #[error("stick table file is truncated")]
    Truncated,
    /// The checksum does not match: corrupt or truncated.
    #[error("stick table file checksum mismatch (corrupt or truncated)")]
    ChecksumMismatch,
    /// Bytes left between the last entry and the checksum.
    #[error("stick table file has {0} unexpected bytes after its entries")]
    TrailingBytes(usize),
    /// A backend name that is not UTF-8.
    #[error("stick table file backend name #{0} is not UTF-8")]
    BadName(usize),
    /// An entry with an unknown kind, flags or backend index.
    #[error("stick table file entry #{index}: {reason}")]
    BadEntry {
        /// Position of the entry in the file.
        index: usize,
        /// What is wrong with it.
        reason: &'static str,
    },
}

/// One entry as written to / read from a saved table.
pub(super) struct SavedEntry {
    pub(super) hash: u64,
    pub(super) kind: u8,
    pub(super) flags: u8,
    pub(super) backend: u16,
    /// Seconds since learned.
    pub(super) age: u32,
    /// Seconds since last used.
    pub(super) idle: u32,
}

/// A decoded saved table.
pub(super) struct StateFile {
    pub(super) hash_key: (u64, u64),
    pub(super) names: Vec<String>,
    pub(super) entries: Vec<SavedEntry>,
}

impl StickTable {
    /// Save the table atomically (temp file + rename).
    ///
    /// Writes `<path>.tmp` in the same directory (mode 0600 on Unix: the file holds the
    /// table's hash key), fsyncs it, renames it over `path` and fsyncs the directory.
    /// Each entry keeps its remaining lifetime (idle seconds are stored). Returns the
    /// number of entries saved. The format is versioned binary: magic, version, hash
    /// key, backend names, entries, SipHash checksum.
    pub fn save(&self, path: &Path) -> io::Result<usize> {
        let now = self.now();
        let entries: Vec<SavedEntry> = self
            .map
            .iter()
            .filter(|item| item.idle(now) <= self.ttl_of(item.kind))
            .map(|item| SavedEntry {
                hash: *item.key(),
                kind: item.kind,
                flags: item.flags.load(Relaxed) & SHARED,
                backend: item.backend,
                age: now.saturating_sub(item.learned),
                idle: item.idle(now),
            })
            .collect();
        // Names after entries: the interner only grows, so every index above is in it.
        let names = self.backends.names.load_full();
        let hash_key = (
            self.hash_key[0].load(Relaxed),
            self.hash_key[1].load(Relaxed),
        );
        let bytes = encode_state(hash_key, &names, &entries);
        write_atomically(path, &bytes)?;
        Ok(entries.len())
    }

    /// Load a saved table, keeping remaining lifetimes; returns entries loaded.
    ///
    /// Replaces the table's contents and adopts the saved hash key (hashes can't be
    /// recomputed without the raw keys), so call it at startup before traffic. Keeps the
    /// `size` most recently used unexpired entries. A missing file is the `NotFound`
    /// error of the read; a corrupt, truncated or other-version file is `InvalidData`
    /// (wrapping a [`StateFileError`]) and leaves the table unchanged.
    pub fn load(&self, path: &Path) -> io::Result<usize> {
        let bytes = fs::read(path)?;
        let file =
            decode_state(&bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        Ok(self.install(file))
    }

    /// Replaces the contents with a decoded file's (see `load`).
    pub(super) fn install(&self, file: StateFile) -> usize {
        let mut live: Vec<&SavedEntry> = file
            .entries
            .iter()
            .filter(|e| e.idle <= self.ttl_of(e.kind))
            .collect();
        live.sort_by_key(|e| e.idle);
        live.truncate(self.params.size);
        let backends: Vec<Option<u16>> =
            file.names.iter().map(|n| self.backends.intern(n)).collect();

        let mut queue = self.lock_queue();
        self.remove_where(|_| true);
        queue.records = VecDeque::new();
        self.hash_key[0].store(file.hash_key.0, Relaxed);
        self.hash_key[1].store(file.hash_key.1, Relaxed);
        let now = self.now();
        let limit = self.queue_limit();
        let mut loaded = 0;
        // Oldest first, so the queue front holds the least recently used.
        for saved in live.into_iter().rev() {
            let backend = if saved.backend == NO_BACKEND {
                NO_BACKEND
            } else {
                match backends.get(usize::from(saved.backend)).copied().flatten() {
                    Some(index) => index,
                    None => continue, // interner full
                }
            };
            let gen = queue.next_gen();
            let (learned, last_used) = (
                now.saturating_sub(saved.age),
                now.saturating_sub(saved.idle),
            );
            let entry = Entry::new(saved.kind, backend, gen, learned, last_used, saved.flags);
            self.count.fetch_add(1, Relaxed);
            if self.map.insert(saved.hash, entry).is_some() {
                self.count.fetch_sub(1, Relaxed); // duplicate hash in the file
            } else {
                loaded += 1;
            }
            queue.push(QueueRecord::new(saved.hash, gen), limit);
        }
        loaded
    }
}

pub(super) fn checksum(bytes: &[u8]) -> u64 {
    let mut hasher = SipHasher13::new_with_keys(CHECKSUM_KEY.0, CHECKSUM_KEY.1);
    hasher.write(bytes);
    hasher.finish()
}

/// Serialises a table: all integers little-endian.
///
/// ```text
/// magic [8] | version u32 | hash key u64 u64
/// name count u32 | per name: length u16, UTF-8 bytes
/// entry count u64 | per entry: hash u64, kind u8, flags u8, backend u16, age u32, idle u32
/// checksum u64 (SipHash-1-3 of everything before it)
/// ```
/// `backend` indexes the file's own name list (`0xffff` for a shared prefix), so the
/// file stores backends by name, independent of any table's interner.
pub(super) fn encode_state(
    hash_key: (u64, u64),
    names: &[Arc<str>],
    entries: &[SavedEntry],
) -> Vec<u8> {
    let names_len: usize = names.iter().map(|n| 2 + n.len()).sum();
    let mut out = Vec::with_capacity(48 + names_len + entries.len() * SAVED_ENTRY_BYTES);
    out.extend_from_slice(&STATE_MAGIC);
    out.extend_from_slice(&STATE_VERSION.to_le_bytes());
    out.extend_from_slice(&hash_key.0.to_le_bytes());
    out.extend_from_slice(&hash_key.1.to_le_bytes());
    out.extend_from_slice(&(names.len() as u32).to_le_bytes());
    for name in names {
        // Backend names come from the config and are short; cut defensively at u16::MAX.
        let bytes = &name.as_bytes()[..name.len().min(usize::from(u16::MAX))];
        out.extend_from_slice(&(bytes.len() as u16).to_le_bytes());
        out.extend_from_slice(bytes);
    }
    out.extend_from_slice(&(entries.len() as u64).to_le_bytes());
    for e in entries {
        out.extend_from_slice(&e.hash.to_le_bytes());
        out.push(e.kind);
        out.push(e.flags);
        out.extend_from_slice(&e.backend.to_le_bytes());
        out.extend_from_slice(&e.age.to_le_bytes());
        out.extend_from_slice(&e.idle.to_le_bytes());
    }
    let sum = checksum(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

/// Reads little-endian fields, failing with `Truncated` at the end of the input.
pub(super) struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], StateFileError> {
        let (head, rest) = self
            .bytes
            .split_at_checked(N)
            .ok_or(StateFileError::Truncated)?;
        self.bytes = rest;
        <[u8; N]>::try_from(head).map_err(|_| StateFileError::Truncated)
    }

    fn slice(&mut self, n: usize) -> Result<&'a [u8], StateFileError> {
        let (head, rest) = self
            .bytes
            .split_at_checked(n)
            .ok_or(StateFileError::Truncated)?;
        self.bytes = rest;
        Ok(head)
    }

    fn u16(&mut self) -> Result<u16, StateFileError> {
        self.take().map(u16::from_le_bytes)
    }

    fn u32(&mut self) -> Result<u32, StateFileError> {
        self.take().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Result<u64, StateFileError> {
        self.take().map(u64::from_le_bytes)
    }
}

/// Parses and validates a saved table (see `encode_state`) without touching any table.
pub(super) fn decode_state(bytes: &[u8]) -> Result<StateFile, StateFileError> {
    let mut header = Reader { bytes };
    if header.take::<8>()? != STATE_MAGIC {
        return Err(StateFileError::BadMagic);
    }
    let version = header.u32()?;
    if version != STATE_VERSION {
        return Err(StateFileError::UnsupportedVersion { found: version });
    }
    let body_len = bytes
        .len()
        .checked_sub(CHECKSUM_BYTES)
        .ok_or(StateFileError::Truncated)?;
    let (body, sum) = bytes.split_at(body_len);
    let stored = Reader { bytes: sum }.u64()?;
    if stored != checksum(body) {
        return Err(StateFileError::ChecksumMismatch);
    }
    let mut r = Reader {
        bytes: body.get(12..).ok_or(StateFileError::Truncated)?,
    };
    let hash_key = (r.u64()?, r.u64()?);
    let name_count = r.u32()? as usize;
    let mut names = Vec::with_capacity(name_count.min(r.bytes.len() / 2));
    for index in 0..name_count {
        let len = usize::from(r.u16()?);
        let name =
            std::str::from_utf8(r.slice(len)?).map_err(|_| StateFileError::BadName(index))?;
        names.push(name.to_owned());
    }
    let entry_count = usize::try_from(r.u64()?).map_err(|_| StateFileError::Truncated)?;
    match entry_count.checked_mul(SAVED_ENTRY_BYTES) {
        Some(n) if n <= r.bytes.len() => {}
        _ => return Err(StateFileError::Truncated),
    }
    let mut entries = Vec::with_capacity(entry_count);
    for index in 0..entry_count {
        let entry = SavedEntry {
            hash: r.u64()?,
            kind: r.take::<1>()?[0],
            flags: r.take::<1>()?[0],
            backend: r.u16()?,
            age: r.u32()?,
            idle: r.u32()?,
        };
        let bad = |reason| StateFileError::BadEntry { index, reason };
        if KeyKind::from_code(entry.kind).is_none() {
            return Err(bad("unknown key kind"));
        }
        if entry.flags & !SHARED != 0 {
            return Err(bad("unknown flags"));
        }
        let shared = entry.flags & SHARED != 0;
        if shared != (entry.backend == NO_BACKEND) {
            return Err(bad("shared flag and backend disagree"));
        }
        if !shared && usize::from(entry.backend) >= names.len() {
            return Err(bad("backend index out of range"));
        }
        entries.push(entry);
    }
    if !r.bytes.is_empty() {
        return Err(StateFileError::TrailingBytes(r.bytes.len()));
    }
    Ok(StateFile {
        hash_key,
        names,
        entries,
    })
}

/// `<path>.tmp`, in the same directory so the rename is atomic.
pub(super) fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".tmp");
    PathBuf::from(name)
}

/// Writes `bytes` to `path` via a fsynced temp file and a rename, then fsyncs the directory.
pub(super) fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = tmp_path(path);
    let result = (|| {
        let mut file = create_private(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        drop(file);
        fs::rename(&tmp, path)?;
        let dir = match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        if let Err(e) = fs::remove_file(&tmp) {
            if e.kind() != io::ErrorKind::NotFound {
                tracing::warn!(path = %tmp.display(), error = %e, "could not remove temporary stick table file");
            }
        }
    }
    result
}

/// Creates (truncating) a file readable only by its owner: it holds the hash key.
pub(super) fn create_private(path: &Path) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path)
}
