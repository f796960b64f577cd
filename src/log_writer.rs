//! Where log lines go: a bounded queue in front of stderr, drained by a thread of
//! its own, so a worker never waits on a slow or stalled log destination (journald
//! behind, a full pipe). Lines are written in batches, buffered, flushed whenever the
//! queue runs dry, at most once per [`BATCH_PAUSE`] while lines keep coming, and
//! every queued line is written before a clean exit ([`Flush`]), for at most
//! [`FINAL_FLUSH`]: a destination that takes nothing then (a pipe nobody reads)
//! can't keep the process from exiting; what it did not take is dropped and counted.
//! When the queue is full a line is dropped and counted
//! (`crossbar_log_lines_dropped_total`), never waited for. Error access-log lines
//! are bounded before that, by [`LogLimiter`] (a flood must not fill a disk).
use std::io::Write;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use prometheus::IntCounter;

/// Lines queued before new ones are dropped: about a second of access-log lines at
/// 4,000 connections per second, ~1.5 MiB at most.
pub const QUEUE_LINES: usize = 4096;
/// The writer thread's buffer: one write(2) for many lines.
const WRITE_BUFFER: usize = 64 * 1024;
/// After writing a batch the writer thread sleeps this long before it takes the
/// next: lines queued meanwhile wake nobody (a worker's send makes no system call
/// while the writer is not waiting on the queue) and go out in one write(2).
/// Waking the writer for every line cost each connection a futex wake and, on a busy
/// core, two context switches (docs/performance.md, "Access log"). At most this
/// much delay before a line reaches stderr; the queue holds 4,096 lines, ~400k
/// lines a second at this pause before any is dropped.
pub const BATCH_PAUSE: std::time::Duration = std::time::Duration::from_millis(10);
/// Longest the final flush at exit may take. After SIGTERM the process has drained
/// its connections within `timeouts.shutdown`; a log destination that takes nothing
/// (a full pipe whose reader stalled, a stuck journald) must not hold it longer: under
/// systemd that was a window with nothing listening until SIGKILL. Lines still
/// queued then are dropped and counted (`crossbar_log_lines_dropped_total`), with a
/// note on stderr if it takes one without waiting.
pub const FINAL_FLUSH: Duration = Duration::from_secs(2);
/// How often the final flush looks whether the writer thread is done.
const FINAL_FLUSH_POLL: Duration = Duration::from_millis(5);

/// Where the queue is in its life ([`QueuedWriter::state`]).
const OPEN: u8 = 0;
/// The writer thread wrote every line and stopped: lines go to stderr directly.
const CLOSED: u8 = 1;
/// The final flush gave up on a stalled destination: lines are dropped and counted.
const STALLED: u8 = 2;

/// Room a line's buffer starts with: an access-log line is 250-450 bytes, so most
/// lines take one allocation instead of growing through seven.
pub(crate) const LINE_CAPACITY: usize = 512;

/// Lines dropped because the log destination did not keep up (process-wide: the
/// registry of every server registers it).
pub fn dropped_lines() -> &'static IntCounter {
    static DROPPED: OnceLock<IntCounter> = OnceLock::new();
    DROPPED.get_or_init(|| {
        IntCounter::new(
            "crossbar_log_lines_dropped_total",
            "Log lines dropped because the log destination (stderr) did not keep up.",
        )
        .expect("static metric definition") // ok: static
    })
}

/// The queue text lines may be put on directly, formatted by their writer rather than
/// by tracing-subscriber (the access log's, `access_log.rs`): set by main when the
/// log is plain text (no JSON, no colour) going through a [`QueuedWriter`].
static DIRECT: OnceLock<QueuedWriter> = OnceLock::new();

/// Let plain-text lines be queued on `writer` directly ([`direct`]); the first call
/// wins.
pub fn allow_direct_lines(writer: &QueuedWriter) {
    let _ = DIRECT.set(writer.clone());
}

/// Where a plain-text line may be queued without tracing-subscriber's formatter, if
/// anywhere.
pub(crate) fn direct() -> Option<&'static QueuedWriter> {
    DIRECT.get()
}

/// A `tracing_subscriber` writer: each event's line goes to the queue.
#[derive(Clone)]
pub struct QueuedWriter {
    tx: SyncSender<Vec<u8>>,
    dropped: IntCounter,
    /// `OPEN`, then `CLOSED` (lines written directly) or `STALLED` (dropped) once
    /// [`Flush`] stopped the thread.
    state: Arc<AtomicU8>,
    /// Lines queued and not yet written out (what a final flush that gives up drops).
    pending: Arc<AtomicU64>,
}

/// Stops the writer thread after it wrote every queued line, within
/// [`FINAL_FLUSH`]; drop it last in main.
pub struct Flush {
    tx: SyncSender<Vec<u8>>,
    state: Arc<AtomicU8>,
    pending: Arc<AtomicU64>,
    dropped: IntCounter,
    thread: Option<JoinHandle<()>>,
}

/// A queued writer in front of stderr, and the guard that flushes it.
pub fn stderr() -> std::io::Result<(QueuedWriter, Flush)> {
    to(std::io::stderr(), dropped_lines().clone())
}

/// A queued writer in front of `out`, counting dropped lines in `dropped`.
pub fn to<W: Write + Send + 'static>(
    out: W,
    dropped: IntCounter,
) -> std::io::Result<(QueuedWriter, Flush)> {
    let (tx, rx) = sync_channel(QUEUE_LINES);
    let state = Arc::new(AtomicU8::new(OPEN));
    let pending = Arc::new(AtomicU64::new(0));
    let (counter, written) = (dropped.clone(), pending.clone());
    let thread = std::thread::Builder::new()
        .name("crossbar-log".into())
        .spawn(move || drain(rx, out, &counter, &written))?;
    let writer = QueuedWriter {
        tx: tx.clone(),
        dropped: dropped.clone(),
        state: state.clone(),
        pending: pending.clone(),
    };
    let flush = Flush {
        tx,
        state,
        pending,
        dropped,
        thread: Some(thread),
    };
    Ok((writer, flush))
}

/// The writer thread: write what is queued, flush when the queue is empty, pause
/// [`BATCH_PAUSE`], wait for the next line; stop at the empty line [`Flush`] sends
/// (or when every sender is gone). Each batch flushed (or failed) leaves `pending`.
fn drain<W: Write>(rx: Receiver<Vec<u8>>, out: W, dropped: &IntCounter, pending: &AtomicU64) {
    let mut out = std::io::BufWriter::with_capacity(WRITE_BUFFER, out);
    let mut first = true;
    loop {
        if !std::mem::take(&mut first) {
            std::thread::sleep(BATCH_PAUSE);
        }
        let Ok(line) = rx.recv() else { break };
        let mut next = Some(line);
        let mut batch = 0;
        while let Some(line) = next.take() {
            if line.is_empty() {
                flush(&mut out, dropped);
                done(pending, batch);
                return;
            }
            batch += 1;
            if out.write_all(&line).is_err() {
                // Nowhere to say it: the line is counted as dropped.
                dropped.inc();
            }
            next = rx.try_recv().ok();
        }
        flush(&mut out, dropped);
        done(pending, batch);
    }
    flush(&mut out, dropped);
}

/// `batch` lines left the writer (written, or counted as dropped). Saturating: a
/// final flush that gave up already counted them all.
fn done(pending: &AtomicU64, batch: u64) {
    // Never fails: the closure always returns a value.
    let _ = pending.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
        Some(n.saturating_sub(batch))
    }); // ok: see above
}

fn flush<W: Write>(out: &mut W, dropped: &IntCounter) {
    if out.flush().is_err() {
        dropped.inc();
    }
}

impl Flush {
    /// Stop the writer thread once it wrote every queued line, waiting at most
    /// `within`. Returns the lines dropped because the destination took nothing in
    /// that time: they are counted, said on stderr if it takes a note without
    /// waiting, and every later line is dropped and counted too (the thread stays
    /// blocked in its write until the process exits).
    pub fn finish(mut self, within: Duration) -> u64 {
        self.stop(within)
    }

    fn stop(&mut self, within: Duration) -> u64 {
        let Some(thread) = self.thread.take() else {
            return 0;
        };
        let deadline = Instant::now() + within;
        // The stop marker, behind every queued line; the queue may be full.
        let mut marker = Vec::new();
        loop {
            match self.tx.try_send(marker) {
                Ok(()) | Err(TrySendError::Disconnected(_)) => break,
                Err(TrySendError::Full(m)) if Instant::now() < deadline => {
                    marker = m;
                    std::thread::sleep(FINAL_FLUSH_POLL);
                }
                Err(TrySendError::Full(_)) => break,
            }
        }
        while !thread.is_finished() && Instant::now() < deadline {
            std::thread::sleep(FINAL_FLUSH_POLL);
        }
        if thread.is_finished() {
            if thread.join().is_err() {
                eprintln!("the log writer thread panicked");
            }
            self.state.store(CLOSED, Ordering::Release);
            return 0;
        }
        self.state.store(STALLED, Ordering::Release);
        let left = self.pending.swap(0, Ordering::AcqRel);
        self.dropped.inc_by(left);
        stderr_note_without_waiting(&format!(
            "crossbar: the log destination (stderr) took nothing for {within:?} at exit: \
             {left} log lines dropped\n"
        ));
        left
    }
}

impl Drop for Flush {
    fn drop(&mut self) {
        self.stop(FINAL_FLUSH);
    }
}

/// Write `note` to stderr only if it takes it at once: stderr is the destination
/// that just stalled. A socket (journald's stream) is sent to without waiting; a
/// pipe is written through a non-blocking descriptor of its own (never all or none
/// of a note this short: pipes write up to PIPE_BUF atomically); anything else gets
/// no note.
fn stderr_note_without_waiting(note: &str) {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let Ok(meta) = std::fs::metadata("/proc/self/fd/2") else {
        return;
    };
    let kind = meta.file_type();
    if kind.is_socket() {
        let flags =
            nix::sys::socket::MsgFlags::MSG_DONTWAIT | nix::sys::socket::MsgFlags::MSG_NOSIGNAL;
        // Nowhere left to say that it failed.
        let _ = nix::sys::socket::send(2, note.as_bytes(), flags); // ok: see above
    } else if kind.is_fifo() {
        let pipe = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open("/proc/self/fd/2");
        if let Ok(mut pipe) = pipe {
            let _ = pipe.write(note.as_bytes()); // ok: nowhere left to say that it failed
        }
    }
}

/// One event's line, queued when the formatter is done with it.
pub struct Line<'a> {
    writer: &'a QueuedWriter,
    buf: Vec<u8>,
}

impl Write for Line<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for Line<'_> {
    fn drop(&mut self) {
        self.writer.queue(std::mem::take(&mut self.buf));
    }
}

impl QueuedWriter {
    /// Queue one whole line (its newline included); dropped and counted if the
    /// queue is full, written to stderr directly after the clean stop.
    pub(crate) fn queue(&self, line: Vec<u8>) {
        if line.is_empty() {
            return;
        }
        match self.state.load(Ordering::Acquire) {
            OPEN => {}
            CLOSED => {
                // After the clean stop: nothing drains the queue any more.
                if std::io::stderr().write_all(&line).is_err() {
                    self.dropped.inc();
                }
                return;
            }
            _ => {
                // The destination stalled at exit: writing would wait for it.
                self.dropped.inc();
                return;
            }
        }
        // Counted before it is sent: the thread may take it out at once.
        self.pending.fetch_add(1, Ordering::AcqRel);
        match self.tx.try_send(line) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.pending.fetch_sub(1, Ordering::AcqRel);
                self.dropped.inc();
            }
        }
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for QueuedWriter {
    type Writer = Line<'a>;

    fn make_writer(&'a self) -> Line<'a> {
        Line {
            writer: self,
            buf: Vec::with_capacity(LINE_CAPACITY),
        }
    }
}

/// Bounds error log lines (garbage floods must not fill a disk): at most
/// `LOG_PER_SECOND` per second, then one line saying how many were suppressed.
pub struct LogLimiter {
    window: AtomicU64,
    count: AtomicU64,
    suppressed: AtomicU64,
    epoch: Instant,
}

/// Error access-log lines allowed per second before suppression.
const LOG_PER_SECOND: u64 = 50;

impl LogLimiter {
    /// A fresh limiter.
    pub fn new() -> LogLimiter {
        LogLimiter {
            window: AtomicU64::new(0),
            count: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    /// May one more error line be logged now?
    pub fn allow(&self) -> bool {
        let now = self.epoch.elapsed().as_secs();
        if self.window.swap(now, Ordering::AcqRel) != now {
            self.count.store(0, Ordering::Release);
            let n = self.suppressed.swap(0, Ordering::AcqRel);
            if n > 0 {
                tracing::warn!(target: "crossbar::access", suppressed = n, "error log lines suppressed in the last second(s)");
            }
        }
        if self.count.fetch_add(1, Ordering::AcqRel) < LOG_PER_SECOND {
            true
        } else {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            false
        }
    }
}

impl Default for LogLimiter {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Mutex, PoisonError};
    use tracing_subscriber::fmt::MakeWriter;

    #[test]
    fn limiter_caps_a_burst() {
        let l = LogLimiter::new();
        let allowed = (0..1000).filter(|_| l.allow()).count() as u64;
        assert!(allowed <= LOG_PER_SECOND * 2, "allowed {allowed}");
    }

    /// A destination the test can read, or hold stalled.
    #[derive(Clone, Default)]
    struct Sink {
        bytes: Arc<Mutex<Vec<u8>>>,
    }

    impl Write for Sink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            let mut bytes = self.bytes.lock().unwrap_or_else(PoisonError::into_inner);
            bytes.extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn line(w: &QueuedWriter, i: usize) {
        let mut l = w.make_writer();
        writeln!(l, "line {i}").unwrap();
    }

    /// A line of `LONG` bytes: the writer's buffer holds few of them.
    const LONG: usize = 1024;

    fn long_line(w: &QueuedWriter) {
        let mut l = w.make_writer();
        l.write_all(&[b'x'; LONG - 1]).unwrap();
        l.write_all(b"\n").unwrap();
    }

    #[test]
    fn every_line_is_written_by_a_clean_stop() {
        let sink = Sink::default();
        let dropped = IntCounter::new("d", "d").unwrap();
        let (w, flush) = to(sink.clone(), dropped.clone()).unwrap();
        // Fewer than the queue holds, in a burst the thread can't keep up with.
        for i in 0..QUEUE_LINES / 2 {
            line(&w, i);
        }
        drop(flush);
        let text = String::from_utf8(sink.bytes.lock().unwrap().clone()).unwrap();
        let want: String = (0..QUEUE_LINES / 2)
            .map(|i| format!("line {i}\n"))
            .collect();
        assert_eq!(text, want);
        assert_eq!(dropped.get(), 0);
    }

    /// The final flush of a destination that takes nothing gives up in time: every
    /// line is either written or counted as dropped, later lines are dropped and
    /// counted instead of written, and nothing waits for the destination.
    #[test]
    fn a_stalled_destination_at_exit_is_given_up_and_counted() {
        let sink = Sink::default();
        let held = sink.bytes.lock().unwrap();
        let dropped = IntCounter::new("d", "d").unwrap();
        let (w, flush) = to(sink.clone(), dropped.clone()).unwrap();
        let lines = 300;
        for _ in 0..lines {
            long_line(&w);
        }
        let started = Instant::now();
        let given_up = flush.finish(Duration::from_millis(200));
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(
            given_up, lines as u64,
            "nothing was written: every line dropped"
        );
        assert_eq!(dropped.get(), lines as u64);
        long_line(&w);
        assert_eq!(
            dropped.get(),
            lines as u64 + 1,
            "a later line is dropped, not written"
        );
        drop(held);
    }

    /// A destination that keeps up is flushed whole, however short the bound.
    #[test]
    fn a_flush_that_completes_drops_nothing() {
        let sink = Sink::default();
        let dropped = IntCounter::new("d", "d").unwrap();
        let (w, flush) = to(sink.clone(), dropped.clone()).unwrap();
        for i in 0..100 {
            line(&w, i);
        }
        assert_eq!(flush.finish(FINAL_FLUSH), 0);
        assert_eq!(dropped.get(), 0);
        let written = sink
            .bytes
            .lock()
            .unwrap()
            .iter()
            .filter(|&&b| b == b'\n')
            .count();
        assert_eq!(written, 100);
    }

    #[test]
    fn a_stalled_destination_drops_and_counts_instead_of_blocking() {
        let sink = Sink::default();
        // Hold the destination: the writer thread blocks on its first write.
        let held = sink.bytes.lock().unwrap();
        let dropped = IntCounter::new("d", "d").unwrap();
        let (w, flush) = to(sink.clone(), dropped.clone()).unwrap();
        let extra = 200;
        // Every call returns; the thread takes out at most what its buffer holds,
        // the line it blocks writing and one more, the queue holds the rest.
        for _ in 0..QUEUE_LINES + extra {
            long_line(&w);
        }
        let taken = WRITE_BUFFER / LONG + 2;
        assert!(
            dropped.get() >= (extra - taken) as u64,
            "dropped {}",
            dropped.get()
        );
        drop(held);
        drop(flush);
        let written = sink
            .bytes
            .lock()
            .unwrap()
            .iter()
            .filter(|&&b| b == b'\n')
            .count() as u64;
        assert_eq!(written + dropped.get(), (QUEUE_LINES + extra) as u64);
    }
}
