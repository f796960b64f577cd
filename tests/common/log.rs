//! This test process's log lines, kept in memory so a test can assert on what
//! crossbar logged (access-log `end=` reasons, warnings).
use std::sync::{Arc, Mutex};

/// Log output kept in memory; clones share one buffer.
#[derive(Clone, Default)]
pub struct LogBuffer(Arc<Mutex<Vec<u8>>>);

impl LogBuffer {
    /// Capture every log line of this test process (nextest runs one test per process).
    pub fn install() -> LogBuffer {
        let log = LogBuffer::default();
        tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(log.clone())
            .try_init()
            .expect("this test's process has no other subscriber (nextest)");
        log
    }

    /// How many lines logged so far contain `text`.
    pub fn count(&self, text: &str) -> usize {
        String::from_utf8_lossy(&self.0.lock().expect("log"))
            .lines()
            .filter(|l| l.contains(text))
            .count()
    }

    /// Whether any line logged so far contains `text`.
    pub fn contains(&self, text: &str) -> bool {
        String::from_utf8_lossy(&self.0.lock().expect("log")).contains(text)
    }

    /// The lines logged so far that contain `text`.
    pub fn lines_with(&self, text: &str) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().expect("log"))
            .lines()
            .filter(|l| l.contains(text))
            .map(str::to_string)
            .collect()
    }
}

impl std::io::Write for LogBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogBuffer {
    type Writer = LogBuffer;
    fn make_writer(&'a self) -> LogBuffer {
        self.clone()
    }
}
