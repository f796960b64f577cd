//! Puppet Server's `jruby-metrics` status document as a type, and the sample the
//! weight function reads from it (tests/fixtures/jruby-metrics holds documents
//! captured from Debian's puppetserver 7.9.5 by `bench/herd.sh --capture`).
//!
//! Only what the weight needs is read; every other field (lifetime averages,
//! timers) is skipped. The borrowed and requested lists are counted without
//! being kept: their items are skipped as they are parsed.
use serde::de::IgnoredAny;
use serde::Deserialize;

use super::weight::{PoolLock, PuppetSample};

/// The document (`GET /status/v1/services/jruby-metrics?level=debug`).
#[derive(Debug, Deserialize)]
struct Document {
    status: Status,
}

#[derive(Debug, Deserialize)]
struct Status {
    experimental: Experimental,
}

#[derive(Debug, Deserialize)]
struct Experimental {
    #[serde(rename = "jruby-pool-lock-status")]
    lock: Option<LockStatus>,
    metrics: Metrics,
}

#[derive(Debug, Deserialize)]
struct LockStatus {
    #[serde(rename = "current-state")]
    current_state: String,
}

/// A list whose items are skipped, counted.
#[derive(Debug, Default)]
struct Count(u32);

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Count, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Count;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a list")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Count, A::Error> {
                let mut n = 0u32;
                while seq.next_element::<IgnoredAny>()?.is_some() {
                    n = n.saturating_add(1);
                }
                Ok(Count(n))
            }
        }
        d.deserialize_seq(V)
    }
}

#[derive(Debug, Deserialize)]
struct Metrics {
    #[serde(rename = "num-jrubies")]
    num_jrubies: u32,
    #[serde(rename = "num-free-jrubies")]
    num_free_jrubies: u32,
    /// Present at `level=debug` only.
    #[serde(rename = "requested-instances", default)]
    requested: Option<Count>,
    #[serde(rename = "borrowed-instances", default)]
    borrowed: Option<Count>,
    #[serde(rename = "queue-limit-hit-count", default)]
    queue_limit_hit_count: u64,
}

/// Why a document was not a sample.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DocumentError {
    /// Not JSON, or not the jruby-metrics shape.
    #[error("not a jruby-metrics document: {0}")]
    Shape(String),
    /// No `requested-instances` list: the queue is not known.
    #[error("the document has no requested-instances list (the queue): ask with `?level=debug`")]
    NoQueue,
    /// A lock state Puppet does not document.
    #[error("unknown jruby-pool-lock-status `{0}`")]
    Lock(String),
}

/// Characters of a parse error quoted (serde_json names the line and column).
const QUOTE_ERROR: usize = 120;

/// Read a sample from a document's bytes.
pub fn sample(body: &[u8]) -> Result<PuppetSample, DocumentError> {
    let doc: Document = serde_json::from_slice(body)
        .map_err(|e| DocumentError::Shape(e.to_string().chars().take(QUOTE_ERROR).collect()))?;
    let e = doc.status.experimental;
    let lock = match e.lock.as_ref().map(|l| l.current_state.as_str()) {
        None | Some(":not-in-use") => PoolLock::NotInUse,
        Some(":requested") => PoolLock::Requested,
        Some(":acquired") => PoolLock::Acquired,
        Some(other) => {
            return Err(DocumentError::Lock(
                other.chars().take(QUOTE_ERROR).collect(),
            ))
        }
    };
    let m = e.metrics;
    let queued = m.requested.ok_or(DocumentError::NoQueue)?.0;
    Ok(PuppetSample {
        jrubies: m.num_jrubies,
        free: m.num_free_jrubies,
        queued,
        borrowed: m.borrowed.unwrap_or_default().0,
        lock,
        queue_limit_hits: m.queue_limit_hit_count,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A captured document (tests/fixtures/jruby-metrics).
    fn fixture(name: &str) -> Vec<u8> {
        let path = format!(
            "{}/tests/fixtures/jruby-metrics/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    #[test]
    fn an_idle_compiler_has_every_jruby_free_and_no_queue() {
        let s = sample(&fixture("idle-1-jruby.json")).unwrap();
        assert_eq!((s.jrubies, s.free, s.queued, s.borrowed), (1, 1, 0, 0));
        assert_eq!(s.lock, PoolLock::NotInUse);
        let s = sample(&fixture("idle-3-jrubies.json")).unwrap();
        assert_eq!((s.jrubies, s.free, s.queued), (3, 3, 0));
    }

    #[test]
    fn puppetserver_8_7_sends_the_same_document() {
        // Debian 13's puppetserver 8.7.0 (Jetty 9.4, JRuby 9.4, OpenJDK 21), idle, one
        // JRuby, fetched without a client certificate: 7.9.5's fields, read the same way
        let s = sample(&fixture("idle-1-jruby-puppetserver-8.7.0.json")).unwrap();
        assert_eq!(
            (s.jrubies, s.free, s.queued, s.borrowed, s.queue_limit_hits),
            (1, 1, 0, 0, 0)
        );
        assert_eq!(s.lock, PoolLock::NotInUse);
        assert_eq!(s.ready(), 1);
    }

    #[test]
    fn a_starting_compiler_has_its_size_but_not_its_jrubies() {
        let s = sample(&fixture("starting-3-jrubies-1-free.json")).unwrap();
        assert_eq!((s.jrubies, s.free, s.borrowed, s.ready()), (3, 1, 0, 1));
    }

    #[test]
    fn a_saturated_compiler_shows_its_borrowed_jruby_and_its_queue() {
        let s = sample(&fixture("saturated-1-jruby.json")).unwrap();
        assert_eq!((s.jrubies, s.free, s.borrowed), (1, 0, 1));
        assert!(s.queued >= 1, "{s:?}");
        let after = sample(&fixture("after-503s-1-jruby.json")).unwrap();
        assert!(after.queue_limit_hits > 0, "{after:?}");
    }

    #[test]
    fn the_lock_states_are_read() {
        let text = String::from_utf8(fixture("idle-1-jruby.json")).unwrap();
        for (state, lock) in [
            (":requested", PoolLock::Requested),
            (":acquired", PoolLock::Acquired),
        ] {
            let doc = text.replace(":not-in-use", state);
            assert_eq!(sample(doc.as_bytes()).unwrap().lock, lock);
        }
        let doc = text.replace(":not-in-use", ":exploded");
        assert_eq!(
            sample(doc.as_bytes()),
            Err(DocumentError::Lock(":exploded".into()))
        );
    }

    #[test]
    fn other_documents_are_refused_with_the_reason() {
        assert!(matches!(sample(b"running"), Err(DocumentError::Shape(_))));
        assert!(matches!(sample(b"{}"), Err(DocumentError::Shape(_))));
        assert!(matches!(sample(b"{\"status\":{\"experimental\":{\"metrics\":{\"num-jrubies\":-1,\"num-free-jrubies\":0}}}}"), Err(DocumentError::Shape(_))));
        let info = b"{\"status\":{\"experimental\":{\"metrics\":{\"num-jrubies\":2,\"num-free-jrubies\":2}}}}";
        assert_eq!(
            sample(info),
            Err(DocumentError::NoQueue),
            "level=info has no lists"
        );
        let huge = format!("{{\"status\":{{\"experimental\":{{\"metrics\":{{\"num-jrubies\":1,\"num-free-jrubies\":0,\"requested-instances\":[{}1]}}}}}}}}", "1,".repeat(100_000));
        assert_eq!(sample(huge.as_bytes()).unwrap().queued, 100_001);
        let text = String::from_utf8(fixture("idle-1-jruby.json")).unwrap();
        for n in (0..text.len()).step_by(7) {
            assert!(
                sample(&text.as_bytes()[..n]).is_err(),
                "a truncated document at {n}"
            );
        }
    }
}
