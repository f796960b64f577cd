//! `crossbar connections` and `crossbar sources`: open connections and the
//! busiest client sources as text.
use crate::admin::human::{columns, human_secs, row};
use crate::admin::page::tokens;
use crate::admin::view::{ConnectionsView, KilledView, ListenerSourcesView, SourcesView};

/// `crossbar connections`: a count line, then one row per connection, the oldest
/// first (as the API lists them); no table when there is none.
pub fn connections(v: &ConnectionsView) -> String {
    let shown = v.connections.len();
    let mut out = match (v.total, shown) {
        (0, _) => return "no open connection\n".to_string(),
        (total, shown) if shown >= total => {
            format!("{total} open connection(s), the oldest first\n")
        }
        (total, shown) => {
            format!("{total} open connection(s); showing the {shown} oldest (--limit for more)\n")
        }
    };
    let mut rows = vec![row(&[
        "ID",
        "SERVICE",
        "CLIENT",
        "BACKEND",
        "AGE",
        "C->S BYTES",
        "S->C BYTES",
        "STATE",
    ])];
    for c in &v.connections {
        rows.push(vec![
            c.id.to_string(),
            c.service.clone(),
            c.client.clone(),
            c.backend.clone(),
            human_secs(c.age_seconds),
            c.bytes.client_to_server.to_string(),
            c.bytes.server_to_client.to_string(),
            c.state.to_string(),
        ]);
    }
    out.push_str(&columns(&rows));
    out
}

/// `crossbar connections kill`, `crossbar backend shutdown-sessions`: a line per
/// connection closed.
pub fn killed(v: &KilledView) -> String {
    let mut out = format!("closed {} connection(s)\n", v.killed.len());
    for c in &v.killed {
        out.push_str(&format!(
            "  {} {} {} -> {} ({} old)\n",
            c.id,
            c.service,
            c.client,
            c.backend,
            human_secs(c.age_seconds)
        ));
    }
    out
}

/// `crossbar sources`: per listener with `per_source`, a line with its limits, then
/// one row per source (the most open connections first).
pub fn sources(v: &SourcesView) -> String {
    if v.listeners.is_empty() {
        return "no listener has per_source limits\n".into();
    }
    v.listeners.iter().map(listener).collect()
}

/// One listener's limits line and its sources' rows.
fn listener(l: &ListenerSourcesView) -> String {
    let lim = &l.limits;
    let or_dash = |v: Option<u32>| v.map_or("-".to_string(), |v| v.to_string());
    let mut out = format!(
        "{}: max_connections {}, rate {}, burst {}; {} of {} sources tracked\n",
        l.listener,
        or_dash(lim.max_connections),
        or_dash(lim.rate),
        lim.burst,
        l.tracked,
        lim.table_size,
    );
    let mut rows = vec![row(&["SOURCE", "OPEN", "TOKENS", "ADMITTED", "REFUSED"])];
    for s in &l.sources {
        rows.push(vec![
            s.source.clone(),
            s.open.to_string(),
            tokens(s.tokens),
            s.admitted.to_string(),
            s.refused.to_string(),
        ]);
    }
    out.push_str(&columns(&rows));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::view::{Bytes, ConnState, ConnectionView, SourceLimitsView, SourceView};

    /// Ages are said as a person reads them: `2m13s`, `3h05m`.
    #[test]
    fn connection_ages_are_human() {
        let conn = |age_seconds| ConnectionView {
            id: 1,
            service: "puppet".into(),
            client: "10.2.0.17:51234".into(),
            backend: "compile1".into(),
            since: std::time::SystemTime::UNIX_EPOCH,
            age_seconds,
            state: ConnState::Relaying,
            bytes: Bytes::default(),
        };
        let v = ConnectionsView {
            limit: 100,
            total: 2,
            connections: vec![conn(133), conn(11_100)],
        };
        let out = connections(&v);
        let ages: Vec<&str> = out
            .lines()
            .skip(2)
            .filter_map(|l| l.split_whitespace().nth(4))
            .collect();
        assert_eq!(ages, ["2m13s", "3h05m"], "{out}");
    }

    #[test]
    fn sources_are_a_line_per_listener_then_rows() {
        let v = SourcesView {
            listeners: vec![ListenerSourcesView {
                listener: "127.0.0.1:8140".into(),
                tracked: 2,
                limits: SourceLimitsView {
                    max_connections: Some(4),
                    rate: None,
                    burst: 1,
                    table_size: 100,
                    ..SourceLimitsView::default()
                },
                sources: vec![SourceView {
                    source: "192.0.2.7".into(),
                    open: 4,
                    tokens: None,
                    admitted: 4,
                    refused: 99,
                }],
            }],
        };
        let out = sources(&v);
        assert!(
            out.starts_with(
                "127.0.0.1:8140: max_connections 4, rate -, burst 1; 2 of 100 sources tracked\n"
            ),
            "{out}"
        );
        assert!(
            out.lines()
                .nth(2)
                .is_some_and(|l| l.split_whitespace().collect::<Vec<_>>()
                    == ["192.0.2.7", "4", "-", "4", "99"]),
            "{out}"
        );
        assert_eq!(
            sources(&SourcesView::default()),
            "no listener has per_source limits\n"
        );
    }
}
