//! The saved form of a stick table (`state_file`): versioned, checksummed, written
//! atomically, and read back only if it is whole.
use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::hash::Hasher;
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use nix::fcntl::{Flock, FlockArg};
use nix::unistd::geteuid;
use siphasher::sip::SipHasher13;

use super::entry::*;
use super::table::queue_of;
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
/// Bytes before the names: magic, version, hash key, name count.
const HEADER_BYTES: usize = 8 + 4 + 16 + 4;
/// Most backend names a file may list: entries index them with a `u16` below
/// `NO_BACKEND`.
const MAX_FILE_NAMES: usize = NO_BACKEND as usize;
/// Bytes of backend names a file may hold: 65535 names of 16 bytes; configured
/// names are a few dozen short words.
const MAX_NAME_BYTES: usize = 1 << 20;
/// Most entries a file may hold, as a multiple of the loading table's `size`: a table
/// shrunk to a quarter still takes its old file (keeping the most recent entries);
/// a bigger file is refused before it is read, so loading is bounded in memory and
/// time by the configured size.
const MAX_FILE_ENTRIES_PER_SIZE: usize = 4;
/// Attempts at a fresh temporary name (each one random): another only after a
/// leftover of a crashed save happens to have the same name.
const TEMP_NAME_TRIES: usize = 8;

/// One lock per state-file path: saves of one file (periodic, at reload, at
/// shutdown, from an old and a new table alike) run one at a time, and each takes
/// its snapshot under the lock, so the last one written is the newest.
static SAVE_LOCKS: LazyLock<Mutex<HashMap<PathBuf, Arc<Mutex<()>>>>> =
    LazyLock::new(Default::default);

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
    /// Larger than a table of this size can have written (see `load`).
    #[error("stick table file is {found} bytes, more than the {max} a table of this size writes")]
    TooLarge {
        /// The file's size.
        found: u64,
        /// The most accepted.
        max: u64,
    },
    /// More backend names than entries can refer to.
    #[error("stick table file lists {0} backend names (at most {MAX_FILE_NAMES})")]
    TooManyNames(usize),
    /// An entry with an unknown kind, flags or backend index.
    #[error("stick table file entry #{index}: {reason}")]
    BadEntry {
        /// Position of the entry in the file.
        index: usize,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The path names something else than a regular file (a FIFO, a socket, a
    /// directory, a device, a symbolic link): never opened for reading, so that a
    /// FIFO can't block start-up or a reload.
    #[error("{path} is {what}, not a regular file: crossbar reads the table back only from a regular file (and replaces the path at each save)")]
    NotRegular {
        /// The path.
        path: PathBuf,
        /// What it is ("a FIFO", ...).
        what: &'static str,
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
    /// Save the table atomically (temp file + rename), one save per path at a time.
    ///
    /// Writes a fresh temporary file next to `path` (`<path>.<random>.tmp`, created
    /// with `O_CREAT|O_EXCL|O_NOFOLLOW` and mode 0600: the file holds the table's hash
    /// key, and nothing already there, a symlink included, is ever opened), fsyncs it,
    /// renames it over `path` and fsyncs the directory. Concurrent saves to one path
    /// wait for each other (blocking: call it off the async workers). Each entry keeps
    /// its remaining lifetime (idle seconds are stored). Returns the number of entries
    /// saved. The format is versioned binary: magic, version, hash key, backend names,
    /// entries, SipHash checksum.
    pub fn save(&self, path: &Path) -> io::Result<usize> {
        let lock = save_lock(path);
        let _one_at_a_time = lock.lock().unwrap_or_else(PoisonError::into_inner);
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
    /// `size` most recently used unexpired entries, and only entries of the `backends`
    /// configured now: other names in the file are not learned (logged with how many
    /// entries they had), so a file can't fill the table's name list. The file is
    /// untrusted input, bounded before it is read: at most `4 × size` entries and 1 MiB
    /// of names. A missing file is the `NotFound` error of the open; a corrupt,
    /// truncated, oversized or other-version file is `InvalidData` (wrapping a
    /// [`StateFileError`]) and leaves the table unchanged; so is a path that is not a
    /// regular file, which is never read (the open never waits: `open_regular`).
    pub fn load(&self, path: &Path, backends: &[&str]) -> io::Result<usize> {
        self.load_discovering(path, backends, 0)
    }

    /// [`StickTable::load`] for a service that finds backends in DNS: the entries
    /// of up to `discovered` names the file lists beyond `backends` are kept too
    /// (its discovered backends are not known before the first DNS answer; an entry
    /// whose backend never appears is a miss, then expires), so a restart keeps the
    /// entries of a pool from SRV records. `discovered` is the service's
    /// `max_backends`: the name list stays bounded.
    pub fn load_discovering(
        &self,
        path: &Path,
        backends: &[&str],
        discovered: usize,
    ) -> io::Result<usize> {
        remove_stale_temps(path);
        let bytes = read_bounded(path, self.max_file_bytes())?;
        let file =
            decode_state(&bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        Ok(self.install(file, backends, discovered))
    }

    /// The largest state file this table accepts.
    fn max_file_bytes(&self) -> u64 {
        let entries = self.params.size.saturating_mul(MAX_FILE_ENTRIES_PER_SIZE);
        let bytes = entries
            .saturating_mul(SAVED_ENTRY_BYTES)
            .saturating_add(HEADER_BYTES + MAX_NAME_BYTES + 8 + CHECKSUM_BYTES);
        u64::try_from(bytes).unwrap_or(u64::MAX)
    }

    /// Replaces the contents with a decoded file's (see `load`).
    pub(super) fn install(&self, file: StateFile, configured: &[&str], discovered: usize) -> usize {
        let live = self.usable_entries(&file, configured, discovered);
        let mut queues = self.lock_queues();
        self.remove_where(|_| true);
        for queue in &mut queues {
            queue.clear();
        }
        self.hash_key[0].store(file.hash_key.0, Relaxed);
        self.hash_key[1].store(file.hash_key.1, Relaxed);
        let now = self.now();
        let limit = self.queue_share();
        let mut loaded = 0;
        // Oldest first, so the queue front holds the least recently used.
        for (saved, backend) in live.into_iter().rev() {
            let queue = &mut queues[queue_of(saved.hash, self.queues.len())];
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

    /// The entries of a file worth loading, each with its backend's index in this
    /// table: unexpired, of a configured backend (or a shared prefix), the `size` most
    /// recently used. Only configured names, and up to `discovered` others (a
    /// service's backends from DNS, not known yet), are interned; entries of other
    /// names are skipped with one log line.
    fn usable_entries<'f>(
        &self,
        file: &'f StateFile,
        configured: &[&str],
        discovered: usize,
    ) -> Vec<(&'f SavedEntry, u16)> {
        let mut others = discovered;
        let backends: Vec<Option<u16>> = file
            .names
            .iter()
            .map(|n| {
                if !configured.contains(&n.as_str()) {
                    others = others.checked_sub(1)?;
                }
                self.backends.intern(n)
            })
            .collect();
        let mut unknown = 0usize;
        // (idle << 32 | position in the file) of each usable entry: sorted as plain
        // integers, never through a pointer into the file (see `sort_by_idle`).
        let mut live: Vec<u64> = file
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.idle <= self.ttl_of(e.kind))
            .filter_map(|(at, e)| {
                let backend = match e.backend {
                    NO_BACKEND => Some(NO_BACKEND),
                    i => backends.get(usize::from(i)).copied().flatten(),
                };
                unknown += usize::from(backend.is_none());
                backend?;
                // A file has fewer than 2^32 entries (`max_file_bytes`).
                Some(u64::from(e.idle) << 32 | u64::from(u32::try_from(at).ok()?))
            })
            .collect();
        if unknown > 0 {
            let names = backends.iter().filter(|b| b.is_none()).count();
            tracing::warn!(
                names,
                entries = unknown,
                "stick table file: skipped the entries of backends that are not configured"
            );
        }
        sort_by_idle(&mut live);
        live.truncate(self.params.size);
        live.into_iter()
            .filter_map(|key| {
                let e = file.entries.get((key & u64::from(u32::MAX)) as usize)?;
                let backend = match e.backend {
                    NO_BACKEND => Some(NO_BACKEND),
                    i => backends.get(usize::from(i)).copied().flatten(),
                };
                Some((e, backend?))
            })
            .collect()
    }
}

/// Sorts `(idle << 32 | position)` keys by idle, keeping file order among equal idles
/// (what a stable sort by idle gives), in linear time: a least-significant-digit radix
/// sort on the idle's two 16-bit digits, a digit all keys share being skipped. A
/// comparison sort of 10M entries through pointers into the file took 2.4 s of a
/// 4.8 s load (a cache miss per comparison); this takes two passes over the keys.
fn sort_by_idle(keys: &mut Vec<u64>) {
    const DIGIT_BITS: u32 = 16;
    let mut spare = vec![0u64; keys.len()];
    for shift in [32, 32 + DIGIT_BITS] {
        let digit = |k: u64| ((k >> shift) & 0xffff) as usize;
        let mut starts = vec![0usize; 1 << DIGIT_BITS];
        for &k in keys.iter() {
            starts[digit(k)] += 1;
        }
        if starts.contains(&keys.len()) {
            continue; // every key has the same digit here: already in order
        }
        let mut next = 0;
        for slot in starts.iter_mut() {
            let count = *slot;
            *slot = next;
            next += count;
        }
        for &k in keys.iter() {
            let d = digit(k);
            spare[starts[d]] = k;
            starts[d] += 1;
        }
        std::mem::swap(keys, &mut spare);
    }
}

/// The lock of saves to `path` (see [`SAVE_LOCKS`]).
fn save_lock(path: &Path) -> Arc<Mutex<()>> {
    let mut locks = SAVE_LOCKS.lock().unwrap_or_else(PoisonError::into_inner);
    locks.entry(path.to_path_buf()).or_default().clone()
}

/// Read a whole file of at most `max` bytes; a longer one is `InvalidData`
/// ([`StateFileError::TooLarge`]) without reading it.
pub(crate) fn read_bounded(path: &Path, max: u64) -> io::Result<Vec<u8>> {
    let file = open_regular(path)?;
    let found = file.metadata()?.len();
    let too_large = |found| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            StateFileError::TooLarge { found, max },
        )
    };
    if found > max {
        return Err(too_large(found));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(found).unwrap_or(0));
    // Bounded again while reading: the file may grow after the size check.
    file.take(max.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(bytes)
}

/// Open an existing state file for reading without ever waiting: O_NONBLOCK (a FIFO
/// opens at once instead of waiting for a writer), O_NOFOLLOW (a symbolic link is
/// refused, not followed), then fstat: anything but a regular file is refused
/// ([`StateFileError::NotRegular`]) before a byte is read.
fn open_regular(path: &Path) -> io::Result<File> {
    let not_regular = |what| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            StateFileError::NotRegular {
                path: path.to_path_buf(),
                what,
            },
        )
    };
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => not_regular("a symbolic link"),
            _ => e,
        })?;
    let kind = file.metadata()?.file_type();
    if !kind.is_file() {
        return Err(not_regular(crate::config::describe_file_type(&kind)));
    }
    Ok(file)
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
    if name_count > MAX_FILE_NAMES {
        return Err(StateFileError::TooManyNames(name_count));
    }
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

/// A fresh temporary name next to `path` (the same directory, so the rename is
/// atomic): `<path>.<16 random hex digits>.tmp`.
pub(super) fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{:016x}.tmp", fastrand::u64(..)));
    PathBuf::from(name)
}

/// Writes `bytes` to `path` via a new fsynced temp file and a rename, then fsyncs
/// the directory. The temp file is removed if anything fails; it stays locked until
/// it is renamed (see [`remove_stale_temps`]).
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let (mut file, tmp) = create_temp(path)?;
    let result = (|| {
        file.write_all(bytes)?;
        file.sync_all()?;
        fs::rename(&tmp, path)?;
        drop(file);
        let dir = match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        remove_quietly(&tmp);
    }
    result
}

/// Creates a new temporary file for `path` (see [`create_private`]) and locks it
/// (`flock`, exclusive) for the whole save: a save in progress, in this process or
/// another, is never taken for a crashed one ([`remove_stale_temps`]). Retries with
/// another random name if one already exists, or if the new file was removed as
/// stale in the instant between its creation and the lock.
fn create_temp(path: &Path) -> io::Result<(Flock<File>, PathBuf)> {
    let mut last = None;
    for _ in 0..TEMP_NAME_TRIES {
        let tmp = tmp_path(path);
        let file = match create_private(&tmp) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                last = Some(e);
                continue;
            }
            Err(e) => return Err(e),
        };
        let locked = match Flock::lock(file, FlockArg::LockExclusive) {
            Ok(locked) => locked,
            Err((_, errno)) => {
                remove_quietly(&tmp);
                return Err(errno.into());
            }
        };
        if same_file(&locked.metadata()?, &tmp)? {
            return Ok((locked, tmp));
        }
        last = Some(io::Error::new(
            io::ErrorKind::NotFound,
            "the new temporary file was removed before it was locked",
        ));
    }
    Err(last.unwrap_or_else(|| io::Error::from(io::ErrorKind::AlreadyExists)))
}

/// Removes `tmp`, logging why if it can't (a leftover is cleaned at the next start).
fn remove_quietly(tmp: &Path) {
    if let Err(e) = fs::remove_file(tmp) {
        if e.kind() != io::ErrorKind::NotFound {
            tracing::warn!(path = %tmp.display(), error = %e, "could not remove temporary stick table file");
        }
    }
}

/// Creates a new file readable only by its owner (it holds the hash key): never an
/// existing file, and never through a symlink (`O_CREAT|O_EXCL|O_NOFOLLOW`, 0600).
pub(super) fn create_private(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .mode(0o600)
        .open(path)
}

/// Removes what crashed saves to `path` left behind (a save killed between creating
/// its temporary file and renaming it): the files next to `path` named as
/// [`tmp_path`] names them, that are regular files of this process's user and that
/// no save holds locked ([`create_temp`]: a save in progress, in this process or in
/// another such as the one a hitless upgrade takes over from, keeps its lock until
/// the rename). Anything else, a link above all, is never opened, followed or
/// removed. Returns how many were removed; each is logged.
pub(super) fn remove_stale_temps(path: &Path) -> usize {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return 0;
    };
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) => {
            if e.kind() != io::ErrorKind::NotFound {
                tracing::warn!(dir = %dir.display(), error = %e, "could not look for temporary files of interrupted stick table saves");
            }
            return 0;
        }
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        if !is_temp_name(name, &entry.file_name()) {
            continue;
        }
        let tmp = entry.path();
        match remove_if_stale(&tmp) {
            Ok(false) => {}
            Ok(true) => {
                removed += 1;
                tracing::info!(path = %tmp.display(), "removed the temporary file of an interrupted stick table save");
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(path = %tmp.display(), error = %e, "could not remove a leftover temporary stick table file")
            }
        }
    }
    removed
}

/// Whether `candidate` is `<name>.<16 hex digits>.tmp` ([`tmp_path`]).
fn is_temp_name(name: &OsStr, candidate: &OsStr) -> bool {
    let random = candidate
        .as_bytes()
        .strip_prefix(name.as_bytes())
        .and_then(|rest| rest.strip_prefix(b"."))
        .and_then(|rest| rest.strip_suffix(b".tmp"));
    random.is_some_and(|r| r.len() == 16 && r.iter().all(u8::is_ascii_hexdigit))
}

/// Removes `tmp` if it is a regular file of this user that no save holds locked.
/// Looks before it opens (lstat: a link, FIFO or device is never opened), opens
/// without following a link, and checks that it opened what it looked at.
fn remove_if_stale(tmp: &Path) -> io::Result<bool> {
    let seen = fs::symlink_metadata(tmp)?;
    if !seen.file_type().is_file() || seen.uid() != geteuid().as_raw() {
        return Ok(false);
    }
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(tmp)?;
    if !same_file(&file.metadata()?, tmp)? {
        return Ok(false); // replaced since it was looked at
    }
    let Ok(_unused) = Flock::lock(file, FlockArg::LockExclusiveNonblock) else {
        return Ok(false); // a save is writing it
    };
    fs::remove_file(tmp)?;
    Ok(true)
}

/// Whether `name` (not followed if a link) is the file `opened` describes.
fn same_file(opened: &fs::Metadata, name: &Path) -> io::Result<bool> {
    match fs::symlink_metadata(name) {
        Ok(m) => Ok((m.dev(), m.ino()) == (opened.dev(), opened.ino())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The radix sort orders like a stable sort by idle, over both digits, with
    /// shared digits skipped and ties kept in file order.
    #[test]
    fn sort_by_idle_is_a_stable_sort_by_idle() {
        let mut rng = fastrand::Rng::with_seed(7);
        for idle_range in [
            0..1u32,
            0..300,
            0..u32::MAX,
            65_536..65_540,
            1 << 20..1 << 21,
        ] {
            let keys: Vec<u64> = (0..5000u64)
                .map(|at| u64::from(rng.u32(idle_range.clone())) << 32 | at)
                .collect();
            let mut expected = keys.clone();
            expected.sort_by_key(|k| k >> 32);
            let mut got = keys;
            sort_by_idle(&mut got);
            assert_eq!(got, expected, "idles in {idle_range:?}");
        }
    }
}
