//! Views for unit tests: a backend or service in a given state, and one document
//! with every optional part present (what the page and the CLI must both show).
use std::time::SystemTime;

use super::time::from_unix_seconds;
use super::*;

/// 2026-11-23T09:12:40Z, a whole second (RFC 3339 keeps whole seconds).
pub const T0: u64 = 1_795_425_160;

/// A time `secs` after [`T0`].
pub fn at(secs: u64) -> SystemTime {
    from_unix_seconds(T0 + secs)
}

/// A backend in `state`: available when up, healthy unless down.
pub fn backend(name: &str, state: State) -> BackendView {
    BackendView {
        name: name.into(),
        address: format!("{name}.example:8140"),
        state,
        state_since: at(0),
        available: state == State::Up,
        healthy: state != State::Down,
        state_origin: match state.hides_health() {
            true => super::Origin::Operator,
            false => super::Origin::File,
        },
        ..BackendView::default()
    }
}

/// A failed check `seconds_ago` with `error`.
pub fn failed_check(error: &str) -> Option<CheckView> {
    Some(CheckView {
        at: at(100),
        seconds_ago: 2,
        result: CheckResult::Fail,
        error: Some(error.into()),
    })
}

/// A service of `backends` balanced by `balance`.
pub fn service(name: &str, balance: Balance, backends: Vec<BackendView>) -> ServiceView {
    ServiceView {
        name: name.into(),
        balance,
        queue_size: 1024,
        queue_timeout_ms: 10_000,
        backends,
        ..ServiceView::default()
    }
}

/// A process that started at [`T0`].
pub fn process() -> ProcessView {
    ProcessView {
        version: "0.1.0".into(),
        started_at: at(0),
        uptime_seconds: 20_113,
        config: "/etc/crossbar/crossbar.yaml".into(),
        last_reload: Some(ReloadView {
            at: at(4_000),
            seconds_ago: 1_950,
            ok: true,
            error: None,
            warnings: vec!["services.puppet.relay: warning: `kernel` was retired".into()],
            kept: vec!["puppet/compile2 drain".into()],
            reset: vec![],
        }),
    }
}

/// Every part of `/api/services` present at least once, with distinct numbers, so
/// a test can look for each field's value in what a reader renders.
pub fn everything() -> ServicesView {
    ServicesView {
        crossbar: process(),
        services: vec![compilers(), ca(), db()],
        per_source: sources().listeners,
    }
}

/// A backend from DNS with every counter above 0 and a weight set at run time.
fn busy() -> BackendView {
    BackendView {
        source: BackendSource::Dns,
        dns_name: Some("_x-puppet._tcp.example".into()),
        state_seconds: 725,
        active_connections: 12,
        peak_connections: 87,
        max_connections: Some(20),
        connections_total: 30_512,
        weight: 4,
        configured_weight: 2,
        weight_origin: super::Origin::Operator,
        effective_weight: 1.24,
        effective_origin: super::Origin::Feedback,
        feedback: Some(saturated()),
        bytes: Bytes {
            client_to_server: 912_345_678,
            server_to_client: 8_123_456_789,
        },
        connect_errors: 3,
        check_failures: 5,
        last_check: Some(CheckView {
            at: at(110),
            seconds_ago: 1,
            result: CheckResult::Ok,
            error: None,
        }),
        handshakes: Handshakes {
            resumed: 40_100,
            full: 5_431,
        },
        ..backend("compile1", State::Up)
    }
}

/// A compiler's load feedback: its one JRuby borrowed, two requests queued, 503s.
pub fn saturated() -> FeedbackView {
    FeedbackView {
        phase: FeedbackPhase::Active,
        factor: 0.31,
        saturated: true,
        sample: Some(FeedbackSample::Puppet {
            jrubies: 1,
            free: 0,
            queued: 2,
            borrowed: 1,
            lock: "not-in-use".into(),
            queue_limit_hits: 5,
        }),
        sample_age_ms: Some(412),
        refused_since_last: true,
        expected_jrubies: Some(1),
        max_connections: None,
        error: None,
        failing_seconds: None,
    }
}

/// Compilers: a DNS-discovered backend with every counter, a drained one that fails
/// its checks and one in standby; PROXY headers, a stick table and a stale lookup.
fn compilers() -> ServiceView {
    let compile1 = busy();
    let compile2 = BackendView {
        healthy: false,
        check_failures: 9,
        last_check: failed_check("connection refused (os error 111)"),
        ..backend("compile2", State::Drain)
    };
    ServiceView {
        listeners: vec!["10.0.0.10:8140".into()],
        proxy_protocol: vec![ProxyListenerView {
            listen: "10.0.0.10:8140".into(),
            accept_from: vec!["10.0.2.0/24".into()],
            required: true,
            text: "10.0.0.10:8140 PROXY headers from 10.0.2.0/24 (required)".into(),
        }],
        stick_table: Some(StickTableView {
            counts: TableCounts {
                entries: 5_012,
                capacity: 100_000,
                expired: 812,
                evicted: 0,
            },
            lookups: Lookups {
                hit: 40_211,
                miss: 1_320,
            },
            hit_ratio: Some(0.968),
        }),
        queued: 7,
        handshakes: Handshakes {
            resumed: 40_100,
            full: 5_431,
        },
        feedback: Some(FeedbackSettings {
            kind: FeedbackKind::Puppet,
            interval_ms: 1000,
            floor_percent: 5,
            saturated_sticky: true,
        }),
        discovery: Some(DiscoveryView {
            kind: "srv".into(),
            name: "_x-puppet._tcp.example".into(),
            last_resolved: Some(at(50)),
            last_attempt: Some(at(90)),
            stale: true,
            error: Some("timed out".into()),
            backends: 1,
            dropped: 2,
            next_in_ms: Some(5_000),
            stale_since: Some(at(60)),
            failures: 3,
            serving: 1,
            ..DiscoveryView::default()
        }),
        ..service(
            "puppet",
            Balance::LeastConn,
            vec![compile1, compile2, backend("compile3", State::Standby)],
        )
    }
}

/// A `balance: first` pool: its primary down, its backup active.
fn ca() -> ServiceView {
    ServiceView {
        active_backend: Some("ca2".into()),
        ..service(
            "puppetca",
            Balance::First,
            vec![
                BackendView {
                    last_check: failed_check("certificate expired"),
                    ..backend("ca1", State::Down)
                },
                BackendView {
                    backup: true,
                    check: CheckKind::Tcp,
                    slow_start: Some(RampView {
                        percent: 40,
                        seconds_left: 36,
                        seconds_total: 60,
                    }),
                    ..backend("ca2", State::Up)
                },
            ],
        )
    }
}

/// No backend available: one disabled without an active check, one at weight 0.
fn db() -> ServiceView {
    service(
        "puppetdb",
        Balance::RoundRobin,
        vec![
            BackendView {
                check: CheckKind::None,
                ..backend("db1", State::Disabled)
            },
            BackendView {
                weight: 0,
                ..backend("db2", State::Up)
            },
        ],
    )
}

/// A per-source listener with a limited source, a grouped one and the overflow.
pub fn sources() -> SourcesView {
    SourcesView {
        listeners: vec![ListenerSourcesView {
            listener: "10.0.0.10:8140".into(),
            limits: SourceLimitsView {
                max_connections: Some(20),
                rate: Some(10),
                burst: 40,
                source_prefix_v4: 32,
                source_prefix_v6: 64,
                allow: vec!["10.0.5.0/24".into()],
                table_size: 100_000,
            },
            tracked: 1_734,
            sources: vec![
                SourceView {
                    source: "192.0.2.7".into(),
                    open: 20,
                    tokens: Some(0.0),
                    admitted: 311,
                    refused: 18_220,
                },
                SourceView {
                    source: "2001:db8:4:1::/64".into(),
                    open: 3,
                    tokens: Some(37.0),
                    admitted: 9,
                    refused: 0,
                },
                SourceView {
                    source: "overflow".into(),
                    open: 1,
                    tokens: None,
                    admitted: 1,
                    refused: 0,
                },
            ],
        }],
    }
}
