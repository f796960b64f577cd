//! What a running crossbar shows through its admin API, read whole, to compare
//! before and after a reload that must change nothing (a reload is a transaction).
//!
//! Compared byte for byte, except values that change by themselves or record the
//! reload attempt itself, each masked as `"<masked>"`:
//! - time passing: `uptime_seconds`, a backend's `state_seconds`, `seconds_ago`, a
//!   stick entry's `age_seconds` and `expires_in_seconds` (the caller checks the
//!   remaining lifetimes itself: see [`Snapshot::expires_in`]);
//! - the attempt: `last_reload` of `/api/services` and the metric family
//!   `crossbar_config_reloads_total` (they record the failed reload; that is how an
//!   operator sees it failed).
//!
//! `/metrics` is compared for its `crossbar_*` families; the `process_*` ones
//! (CPU seconds, memory, open files) change by themselves. No `crossbar_*` family
//! changes with time alone.
use std::net::SocketAddr;
use std::time::Duration;

use serde_json::Value;

use super::{admin_get as get, metric_value, WAIT};

/// The metric family that counts reload attempts (left out of the compare).
pub const ATTEMPT_METRIC: &str = "crossbar_config_reloads_total";

/// JSON keys whose values change with time alone or record the reload attempt.
const MASKED_KEYS: [&str; 6] = [
    "uptime_seconds",
    "state_seconds",
    "seconds_ago",
    "age_seconds",
    "expires_in_seconds",
    "last_reload",
];

/// `/api/services`, `/metrics` (crossbar_* families) and the stick-table dumps.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// `/api/services`, masked, pretty-printed (one value a line, for diffs).
    pub services: String,
    /// The `crossbar_*` samples of `/metrics`, but for the families left out.
    pub metrics: String,
    /// `/api/tables/{service}` per table, masked, pretty-printed.
    pub tables: Vec<String>,
    /// Unmasked table dumps, for [`Snapshot::expires_in`].
    raw_tables: Vec<Value>,
}

fn mask(v: &mut Value) {
    match v {
        Value::Object(m) => {
            for (k, child) in m.iter_mut() {
                if MASKED_KEYS.contains(&k.as_str()) {
                    *child = Value::String("<masked>".into());
                } else {
                    mask(child);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(mask),
        _ => {}
    }
}

fn masked(body: &str) -> (String, Value) {
    let raw: Value = serde_json::from_str(body).expect("JSON from the admin API");
    let mut v = raw.clone();
    mask(&mut v);
    // A table dump lists entries used within the same second in no particular order.
    if let Some(entries) = v.get_mut("entries").and_then(Value::as_array_mut) {
        entries.sort_by_key(|e| (e["kind"].to_string(), e["key"].to_string()));
    }
    (serde_json::to_string_pretty(&v).expect("JSON"), raw)
}

/// Keep the `crossbar_*` samples and their HELP/TYPE lines, but for
/// [`ATTEMPT_METRIC`].
fn crossbar_metrics(text: &str) -> String {
    text.lines()
        .filter(|l| {
            let name = l
                .trim_start_matches("# HELP ")
                .trim_start_matches("# TYPE ")
                .split(['{', ' '])
                .next()
                .unwrap_or("");
            name.starts_with("crossbar_") && name != ATTEMPT_METRIC
        })
        .map(|l| format!("{l}\n"))
        .collect()
}

impl Snapshot {
    /// Read everything through the admin endpoint at `admin`; `tables` are the
    /// services with a stick table.
    pub async fn take(admin: SocketAddr, tables: &[&str]) -> Snapshot {
        let (services, _) = masked(&get(admin, "/api/services").await);
        let metrics = crossbar_metrics(&get(admin, "/metrics").await);
        let mut dumps = Vec::new();
        let mut raw_tables = Vec::new();
        for t in tables {
            let (text, raw) = masked(&get(admin, &format!("/api/tables/{t}")).await);
            dumps.push(text);
            raw_tables.push(raw);
        }
        Snapshot {
            services,
            metrics,
            tables: dumps,
            raw_tables,
        }
    }

    /// A snapshot once nothing moves: `open` connections open and two reads in a
    /// row alike (a connection that just ended finishes its accounting on its own
    /// task). Polls, bounded by [`WAIT`].
    pub async fn settled(admin: SocketAddr, tables: &[&str], open: usize) -> Snapshot {
        let mut last = Snapshot::take(admin, tables).await;
        for _ in 0..(WAIT.as_millis() / 10) {
            tokio::time::sleep(Duration::from_millis(10)).await;
            let now = Snapshot::take(admin, tables).await;
            let active = metric_value(&now.metrics, "crossbar_active_connections", &[]);
            if now.same_as(&last) && active == open as f64 {
                return now;
            }
            last = now;
        }
        panic!("the admin API at {admin} never showed a settled state");
    }

    /// Alike, but for the masked values.
    pub fn same_as(&self, other: &Snapshot) -> bool {
        (&self.services, &self.metrics, &self.tables)
            == (&other.services, &other.metrics, &other.tables)
    }

    /// Every stick entry's `expires_in_seconds`, per table.
    pub fn expires_in(&self) -> Vec<Vec<u64>> {
        self.raw_tables
            .iter()
            .map(|t| {
                t["entries"]
                    .as_array()
                    .map(|es| {
                        es.iter()
                            .filter_map(|e| e["expires_in_seconds"].as_u64())
                            .collect()
                    })
                    .unwrap_or_default()
            })
            .collect()
    }

    /// Fail the test naming the first differing line of each part that differs.
    pub fn assert_same(&self, after: &Snapshot, what: &str) {
        let parts = [
            ("/api/services", &self.services, &after.services),
            ("/metrics", &self.metrics, &after.metrics),
        ];
        let tables = self
            .tables
            .iter()
            .zip(&after.tables)
            .map(|(b, a)| ("/api/tables", b, a));
        let mut diffs = Vec::new();
        for (name, before, now) in parts.into_iter().chain(tables) {
            if before != now {
                diffs.push(format!("{name}:\n{}", first_difference(before, now)));
            }
        }
        assert!(
            diffs.is_empty(),
            "{what}: the running state changed:\n{}",
            diffs.join("\n")
        );
    }
}

/// The lines that differ (by position when both have as many lines, else the lines
/// only one of them has), for a readable failure.
fn first_difference(before: &str, after: &str) -> String {
    let (b, a): (Vec<&str>, Vec<&str>) = (before.lines().collect(), after.lines().collect());
    if b.len() == a.len() {
        return b
            .iter()
            .zip(&a)
            .enumerate()
            .filter(|(_, (x, y))| x != y)
            .map(|(i, (x, y))| {
                format!("  line {}: before {x}\n  line {}: after  {y}", i + 1, i + 1)
            })
            .collect::<Vec<_>>()
            .join("\n");
    }
    let gone: Vec<&str> = b.iter().copied().filter(|l| !a.contains(l)).collect();
    let new: Vec<&str> = a.iter().copied().filter(|l| !b.contains(l)).collect();
    format!(
        "  before only:\n    {}\n  after only:\n    {}",
        gone.join("\n    "),
        new.join("\n    ")
    )
}
