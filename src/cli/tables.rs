//! `crossbar table show|delete`: a stick table's entries as text.
use std::fmt::Write as _;

use crate::admin::human::{columns, human_secs, row};
use crate::admin::view::{DeleteView, EntryView, Lookup, TableView};

/// `table show`: the counters, then the entries.
pub fn table(v: &TableView) -> String {
    let s = &v.stats;
    let mut out = format!(
        "{}: {} entries (capacity {}, expired {}, evicted {}); showing {}\n",
        v.service,
        s.entries,
        s.capacity,
        s.expired,
        s.evicted,
        v.entries.len()
    );
    out.push_str(&entry_rows(&v.entries));
    out
}

/// An entry's backend, or `(shared)` for a ticket prefix several backends share.
fn backend_cell(e: &EntryView) -> String {
    e.backend.clone().unwrap_or_else(|| "(shared)".to_string())
}

/// Stick entries as a table with its header.
fn entry_rows(entries: &[EntryView]) -> String {
    let mut rows = vec![row(&[
        "KIND",
        "KEY",
        "BACKEND",
        "AGE",
        "EXPIRES IN",
        "CLIENT",
    ])];
    for e in entries {
        rows.push(vec![
            e.kind.clone(),
            e.key.clone(),
            backend_cell(e),
            human_secs(e.age_seconds),
            human_secs(e.expires_in_seconds),
            e.client.clone().unwrap_or_else(|| "-".into()),
        ]);
    }
    columns(&rows)
}

/// `table show --key/--client`: what was looked up, then the entries found.
pub fn picked(v: &TableView) -> String {
    let mut out = match &v.lookup {
        Some(Lookup::Key { key }) => format!("{}: key {key}: ", v.service),
        Some(Lookup::Client { client, prefix }) => format!(
            "{}: client {client} (source prefix {}): ",
            v.service,
            prefix.as_deref().unwrap_or("-")
        ),
        None => format!("{}: ", v.service),
    };
    out.push_str(match v.entries.len() {
        0 => "no entry\n",
        1 => "1 entry\n",
        _ => "entries\n",
    });
    if !v.entries.is_empty() {
        out.push_str(&entry_rows(&v.entries));
    }
    if let Some(Lookup::Client { client, .. }) = &v.lookup {
        let _ = writeln!(
            out,
            "(session, ticket and PSK entries keep no client address; `crossbar connections --client {client}` shows its open connections and their backends)"
        ); // ok: writing to a String
    }
    out
}

/// `table delete`: a line per entry removed.
pub fn deleted(service: &str, v: &DeleteView) -> String {
    let mut out = String::new();
    for e in &v.deleted {
        let _ = writeln!(
            out,
            "{service}: deleted {} {} ({})",
            e.kind,
            e.key,
            backend_cell(e)
        ); // ok: writing to a String
    }
    out
}
