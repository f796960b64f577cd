//! The admin API's JSON documents as types: `/api/*` serialises them, the status
//! page renders them and the `crossbar` CLI deserialises them, so whatever the page
//! shows the CLI can show, and a renamed field is a compile error, not a blank.
//!
//! One struct per document and per object inside one, its fields named as on the
//! wire. Values the readers branch on (a backend's state, the balance algorithm, a
//! check's result) are enums; times are [`std::time::SystemTime`] written as
//! [`time`] says (RFC 3339, or Unix seconds for discovery's). What a reader derives
//! from a backend (failing now, why it takes no new connection, the operator's next
//! step) is here too, once.

/// Top sources by open connections the page shows per listener with `per_source`
/// (and `GET /api/services` carries).
pub const PAGE_SOURCES: usize = 10;

mod answers;
mod backend;
mod feedback;
mod origin;
mod services;
mod tables;
pub mod time;
mod traffic;

/// The domain's own types on the wire: a backend's state, a service's `mode:` and
/// `balance:`, where a backend's load feedback stands.
pub use crate::balance::State;
pub use crate::config::{Balance, Mode};
pub use crate::feedback::weight::Phase as FeedbackPhase;
pub use answers::{BackendStateView, ErrorView, ReloadAnswer, WeightView};
pub use backend::{
    BackendSource, BackendView, CheckKind, CheckResult, CheckView, NextStep, RampView,
};
pub use feedback::{FeedbackKind, FeedbackSample, FeedbackSettings, FeedbackView};
pub use origin::{HeldView, OperatorView, Origin, ResetView};
pub use services::{
    Bytes, DiscoveryView, Handshakes, Lookups, ProcessView, ProxyListenerView, ReloadView,
    ServiceView, ServicesView, StickTableView, TableCounts, Totals,
};
pub use tables::{DeleteView, EntryView, FlushView, Lookup, TableView};
pub use traffic::{
    ConnState, ConnectionView, ConnectionsView, KilledView, ListenerSourcesView, SourceLimitsView,
    SourceView, SourcesView,
};

#[cfg(test)]
pub(crate) mod fixture;

#[cfg(test)]
mod tests {
    use super::fixture::*;
    use super::*;
    use serde::de::DeserializeOwned;
    use serde::Serialize;
    use serde_json::Value;

    /// `v` serialised, read back and serialised again: the same value, the same text.
    fn round_trip<V: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(v: &V) -> Value {
        let text = serde_json::to_string(v).unwrap();
        let back: V = serde_json::from_str(&text).unwrap();
        assert_eq!(&back, v, "{text}");
        assert_eq!(serde_json::to_string(&back).unwrap(), text);
        serde_json::from_str(&text).unwrap()
    }

    /// The keys of a JSON object, sorted.
    fn keys(v: &Value) -> Vec<&str> {
        let mut k: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        k.sort_unstable();
        k
    }

    #[test]
    fn every_document_round_trips() {
        round_trip(&everything());
        round_trip(&ServicesView::default());
        round_trip(&sources());
        round_trip(&ConnectionsView {
            limit: 100,
            total: 2,
            connections: vec![ConnectionView {
                id: 7,
                service: "puppet".into(),
                client: "[2001:db8::7]:51234".into(),
                backend: "compile1".into(),
                since: at(3),
                age_seconds: 1950,
                state: ConnState::Relaying,
                bytes: Bytes {
                    client_to_server: 18_234,
                    server_to_client: 912_003,
                },
            }],
        });
        let entry = EntryView {
            kind: "ticket_prefix".into(),
            key: "03a4b5c6d7e8f901".into(),
            backend: None,
            age_seconds: 640,
            expires_in_seconds: 1790,
            client: None,
        };
        let table = TableView {
            service: "puppet".into(),
            limit: 1000,
            lookup: None,
            stats: TableCounts::default(),
            entries: vec![entry.clone()],
        };
        assert!(
            round_trip(&table).get("lookup").is_none(),
            "no lookup asked"
        );
        for lookup in [
            Lookup::Key {
                key: "77aa01b2c3d4e5f6".into(),
            },
            Lookup::Client {
                client: "10.2.0.17".into(),
                prefix: Some("10.2.0.17/32".into()),
            },
            Lookup::Client {
                client: "10.2.0.17".into(),
                prefix: None,
            },
        ] {
            let picked = TableView {
                lookup: Some(lookup.clone()),
                ..table.clone()
            };
            round_trip(&picked);
            round_trip(&DeleteView {
                service: "puppet".into(),
                lookup,
                deleted: vec![entry.clone()],
            });
        }
        round_trip(&FlushView {
            service: "puppet".into(),
            flushed: 5012,
        });
        round_trip(&BackendStateView {
            state: State::Drain,
            ..BackendStateView::default()
        });
        round_trip(&WeightView::default());
        round_trip(&ReloadAnswer {
            reloaded: true,
            warnings: vec!["w".into()],
            unchanged: false,
            kept: vec![HeldView {
                service: "puppet".into(),
                backend: "compile1".into(),
                state: Some(State::Drain),
                weight: None,
                why: None,
            }],
            reset: vec![HeldView {
                service: "puppet".into(),
                backend: "compile2".into(),
                state: None,
                weight: Some(5),
                why: Some("the reload changed the backend: weight 2 -> 3 in the file".into()),
            }],
        });
        round_trip(&ErrorView {
            error: "unknown service \"x\"".into(),
        });
    }

    /// The field names and value shapes of the documents as they were written with
    /// `json!` before they had types (docs/admin-api.md documents them).
    #[test]
    fn documents_keep_their_field_names() {
        let v = round_trip(&everything());
        assert_eq!(keys(&v), ["crossbar", "per_source", "services"]);
        let p = &v["crossbar"];
        assert_eq!(
            keys(p),
            [
                "config",
                "last_reload",
                "started_at",
                "uptime_seconds",
                "version"
            ]
        );
        assert_eq!(p["started_at"], "2026-11-23T09:12:40Z");
        assert_eq!(
            keys(&p["last_reload"]),
            [
                "at",
                "error",
                "kept",
                "ok",
                "reset",
                "seconds_ago",
                "warnings"
            ]
        );
        let s = &v["services"][0];
        assert_eq!(
            keys(s),
            [
                "active_backend",
                "backends",
                "balance",
                "discovery",
                "feedback",
                "handshakes",
                "listeners",
                "mode",
                "name",
                "proxy_protocol",
                "queue_size",
                "queue_timeout_ms",
                "queued",
                "stick_table"
            ]
        );
        assert_eq!(
            (&s["mode"], &s["balance"]),
            (&"tls".into(), &"leastconn".into())
        );
        assert_eq!(v["services"][2]["balance"], "roundrobin");
        assert_eq!(
            keys(&s["proxy_protocol"][0]),
            ["accept_from", "listen", "required", "text"]
        );
        assert_eq!(
            keys(&s["stick_table"]),
            [
                "capacity",
                "entries",
                "evicted",
                "expired",
                "hit_ratio",
                "lookups"
            ]
        );
        assert_eq!(keys(&s["stick_table"]["lookups"]), ["hit", "miss"]);
        assert_eq!(keys(&s["handshakes"]), ["full", "resumed"]);
        let d = &s["discovery"];
        assert_eq!(
            keys(d),
            [
                "backends",
                "dropped",
                "error",
                "failures",
                "kind",
                "last_attempt",
                "last_resolved",
                "name",
                "next_in_ms",
                "own",
                "serving",
                "stale",
                "stale_since"
            ]
        );
        // ISO 8601 like every other time of the document (Unix seconds before).
        assert_eq!(d["last_resolved"], "2026-11-23T09:13:30Z");
    }

    #[test]
    fn backends_keep_their_field_names() {
        let v = round_trip(&everything());
        let s = &v["services"][0];
        let b = &s["backends"][0];
        assert_eq!(
            keys(b),
            [
                "active_connections",
                "address",
                "available",
                "backup",
                "bytes",
                "check",
                "check_failures",
                "configured_weight",
                "connect_errors",
                "connections_total",
                "dns_name",
                "effective_origin",
                "effective_weight",
                "feedback",
                "handshakes",
                "healthy",
                "last_check",
                "left_dns",
                "max_connections",
                "name",
                "operator",
                "peak_connections",
                "source",
                "state",
                "state_origin",
                "state_seconds",
                "state_since",
                "weight",
                "weight_origin"
            ]
        );
        assert_eq!(
            (
                &b["weight_origin"],
                &b["state_origin"],
                &b["effective_origin"]
            ),
            (&"operator".into(), &"file".into(), &"feedback".into())
        );
        assert_eq!(
            keys(&b["feedback"]),
            [
                "error",
                "expected_jrubies",
                "factor",
                "failing_seconds",
                "max_connections",
                "phase",
                "refused_since_last",
                "sample",
                "sample_age_ms",
                "saturated"
            ]
        );
        assert_eq!(
            keys(&b["feedback"]["sample"]),
            [
                "borrowed",
                "free",
                "jrubies",
                "kind",
                "lock",
                "queue_limit_hits",
                "queued"
            ]
        );
        assert_eq!(
            keys(&s["feedback"]),
            ["floor_percent", "interval_ms", "kind", "saturated_sticky"]
        );
        assert_eq!((&b["source"], &b["state"]), (&"dns".into(), &"up".into()));
        assert_eq!(b["check"], "tls-hello");
        assert_eq!(keys(&b["bytes"]), ["client_to_server", "server_to_client"]);
        assert_eq!(
            keys(&b["last_check"]),
            ["at", "error", "result", "seconds_ago"]
        );
        assert_eq!(s["backends"][1]["last_check"]["result"], "fail");
        assert_eq!(v["services"][2]["backends"][0]["check"], "none");
    }

    #[test]
    fn sources_keep_their_field_names() {
        let l = round_trip(&sources());
        let l = &l["listeners"][0];
        assert_eq!(keys(l), ["limits", "listener", "sources", "tracked"]);
        assert_eq!(
            keys(&l["limits"]),
            [
                "allow",
                "burst",
                "max_connections",
                "rate",
                "source_prefix_v4",
                "source_prefix_v6",
                "table_size"
            ]
        );
        assert_eq!(
            keys(&l["sources"][0]),
            ["admitted", "open", "refused", "source", "tokens"]
        );
        assert!(l["sources"][2]["tokens"].is_null());
    }

    #[test]
    fn readers_agree_on_what_a_backend_says() {
        let v = everything();
        let [puppet, ca, db] = &v.services[..] else {
            panic!("three services")
        };
        assert!(!puppet.none_available() && !ca.none_available());
        assert!(db.none_available(), "disabled, and up at weight 0");
        assert!(ca.is_active(&ca.backends[1]) && !ca.is_active(&ca.backends[0]));
        let drained = &puppet.backends[1];
        assert!(drained.failing() && drained.state.hides_health());
        assert_eq!(
            drained.why_unavailable(),
            "DRAINED by the operator (its tls-hello check fails)"
        );
        assert_eq!(
            db.backends[1].why_unavailable(),
            "at WEIGHT 0 by the operator (sticky clients only)"
        );
        assert_eq!(
            puppet.backends[0].next_step("puppet").map(|s| s.command),
            Some("reset puppet/compile1".into())
        );
        assert_eq!(
            puppet.backends[2].next_step("puppet").map(|s| s.command),
            Some("enable puppet/compile3".into())
        );
        assert_eq!(ca.backends[1].next_step("puppetca"), None);
        let t = puppet.totals();
        assert_eq!((t.up, t.backends, t.check_failures), (1, 3, 14));
    }

    /// A backend that left DNS: no `enable` hint (enable is refused for it); a
    /// weight the operator set over the SRV record's says `dns`, and its reset
    /// returns it to DNS's; a set kept without any answer yet does not say `0
    /// backends` beside `the last good set serves on` (issue #53 item 5).
    #[test]
    fn dns_departures_and_dns_weights_are_told_as_they_are() {
        let v = everything();
        let busy = &v.services[0].backends[0];
        assert_eq!(busy.source, BackendSource::Dns);
        assert_eq!(busy.weight_note().as_deref(), Some("operator; dns 2"));
        let step = busy.next_step("puppet").expect("a reset hint");
        assert!(step.why.ends_with("to return to DNS's"), "{}", step.why);
        let left = BackendView {
            state: State::Drain,
            state_origin: Origin::Dns,
            left_dns: true,
            available: false,
            ..busy.clone()
        };
        assert!(left.draining_out_of_dns());
        assert_eq!(left.next_step("puppet"), None);
        let from_file = backend("b1", State::Up);
        let weighted = BackendView {
            weight: 5,
            weight_origin: Origin::Operator,
            ..from_file
        };
        assert_eq!(weighted.weight_note().as_deref(), Some("operator; file 1"));
        let step = weighted.next_step("puppet").expect("a reset hint");
        assert!(
            step.why.ends_with("to return to the file's"),
            "{}",
            step.why
        );

        let kept = DiscoveryView {
            last_resolved: None,
            stale: true,
            backends: 0,
            serving: 2,
            ..DiscoveryView::default()
        };
        let said = format!("{}; {}", kept.set_text("never"), kept.meanwhile());
        assert!(
            !said.contains("0 backends") && !said.contains("never"),
            "{said}"
        );
        assert!(said.contains("2 backends of the last good set"), "{said}");
        let none = DiscoveryView { serving: 0, ..kept };
        let said = format!("{}; {}", none.set_text("never"), none.meanwhile());
        assert!(!said.contains("last good set"), "{said}");
    }
}
