//! The metric families, registered by family: each group's fields and the one
//! function that registers them, so no constructor lists every family.
use prometheus::{HistogramVec, IntCounterVec, IntGaugeVec, Registry};

use super::{counter_vec, gauge_vec, histogram_vec, CONNECT_BUCKETS, DURATION_BUCKETS};

/// The stick tables' families: lookups, learned entries, placement confirmations.
pub(super) struct StickFamilies {
    /// `crossbar_stick_lookups_total`.
    pub(super) lookups: IntCounterVec,
    /// `crossbar_stick_learned_total`.
    pub(super) learned: IntCounterVec,
    /// `crossbar_stick_confirm_total`.
    pub(super) confirm: IntCounterVec,
    /// `crossbar_stick_confirm_extra_handshakes_total`.
    pub(super) confirm_extra: IntCounterVec,
}

impl StickFamilies {
    pub(super) fn register(r: &Registry) -> StickFamilies {
        StickFamilies {
            lookups: counter_vec(
                r,
                "crossbar_stick_lookups_total",
                "Stick table lookups by key kind and result.",
                &["service", "key", "result"],
            ),
            learned: counter_vec(
                r,
                "crossbar_stick_learned_total",
                "Stick entries learned from the server's handshake, by key kind.",
                &["service", "key"],
            ),
            confirm: counter_vec(
                r,
                "crossbar_stick_confirm_total",
                "Placement confirmations of offered sessions, by result (first, \
                 retried_resumed, none_resumed, budget_empty, not_eligible, hello_retry, \
                 ended).",
                &["service", "result"],
            ),
            confirm_extra: counter_vec(
                r,
                "crossbar_stick_confirm_extra_handshakes_total",
                "ClientHellos offered to a backend beyond the first while confirming a \
                 placement (each costs that backend a handshake).",
                &["service", "backend"],
            ),
        }
    }
}

/// Per-backend families: connections, bytes, state, weight, health, handshakes.
pub(super) struct BackendFamilies {
    /// `crossbar_tls_handshakes_total`.
    pub(super) tls_handshakes: IntCounterVec,
    /// `crossbar_connections_total`.
    pub(super) connections: IntCounterVec,
    /// `crossbar_active_connections`.
    pub(super) active: IntGaugeVec,
    /// `crossbar_backend_up`.
    pub(super) up: IntGaugeVec,
    /// `crossbar_backend_weight`.
    pub(super) weight: IntGaugeVec,
    /// `crossbar_backend_state`.
    pub(super) state: IntGaugeVec,
    /// `crossbar_bytes_total`.
    pub(super) bytes: IntCounterVec,
    /// `crossbar_connect_errors_total`.
    pub(super) connect_errors: IntCounterVec,
    /// `crossbar_server_hello_timeouts_total`.
    pub(super) server_hello_timeouts: IntCounterVec,
    /// `crossbar_connect_duration_seconds`.
    pub(super) connect_duration: HistogramVec,
    /// `crossbar_health_checks_total`.
    pub(super) health_checks: IntCounterVec,
}

impl BackendFamilies {
    pub(super) fn register(r: &Registry) -> BackendFamilies {
        BackendFamilies {
            tls_handshakes: counter_vec(
                r,
                "crossbar_tls_handshakes_total",
                "TLS handshakes seen in the ServerHello, by kind (resumed|full).",
                &["service", "backend", "kind"],
            ),
            connections: counter_vec(
                r,
                "crossbar_connections_total",
                "Connections relayed to a backend.",
                &["service", "backend"],
            ),
            active: gauge_vec(
                r,
                "crossbar_active_connections",
                "Connections open to a backend now.",
                &["service", "backend"],
            ),
            up: gauge_vec(
                r,
                "crossbar_backend_up",
                "1 if the backend takes new connections (healthy and enabled), else 0.",
                &["service", "backend"],
            ),
            weight: gauge_vec(
                r,
                "crossbar_backend_weight",
                "The weight before load feedback: the configured one, or the one set at \
                 run time (0: no new connections, sticky hits only).",
                &["service", "backend"],
            ),
            state: gauge_vec(
                r,
                "crossbar_backend_state",
                "1 for the backend's current state (up|down|drain|disabled|standby).",
                &["service", "backend", "state"],
            ),
            bytes: counter_vec(
                r,
                "crossbar_bytes_total",
                "Bytes relayed, by direction.",
                &["service", "backend", "direction"],
            ),
            connect_errors: counter_vec(
                r,
                "crossbar_connect_errors_total",
                "Failed connect attempts to a backend.",
                &["service", "backend"],
            ),
            server_hello_timeouts: counter_vec(
                r,
                "crossbar_server_hello_timeouts_total",
                "Backends that sent nothing within timeouts.server_hello of the ClientHello (tls mode; the next backend is tried).",
                &["service", "backend"],
            ),
            connect_duration: histogram_vec(
                r,
                "crossbar_connect_duration_seconds",
                "Time to connect to a backend.",
                &["service", "backend"],
                CONNECT_BUCKETS,
            ),
            health_checks: counter_vec(
                r,
                "crossbar_health_checks_total",
                "Active health checks by result (ok|fail).",
                &["service", "backend", "result"],
            ),
        }
    }
}

/// Per-service families of the connection path: unusable hellos, refusals, queue timeouts, resets, lifetimes; and reloads.
pub(super) struct ServiceFamilies {
    /// `crossbar_client_hello_errors_total`.
    pub(super) hello_errors: IntCounterVec,
    /// `crossbar_connection_duration_seconds`.
    pub(super) connection_duration: HistogramVec,
    /// `crossbar_route_refused_total`.
    pub(super) routing_refused: IntCounterVec,
    /// `crossbar_queue_timeouts_total`.
    pub(super) queue_timeouts: IntCounterVec,
    /// `crossbar_connection_resets_total`.
    pub(super) resets: IntCounterVec,
    /// `crossbar_config_reloads_total`.
    pub(super) config_reloads: IntCounterVec,
}

impl ServiceFamilies {
    pub(super) fn register(r: &Registry) -> ServiceFamilies {
        ServiceFamilies {
            hello_errors: counter_vec(
                r,
                "crossbar_client_hello_errors_total",
                "Connections closed because the ClientHello was unusable, by reason.",
                &["service", "reason"],
            ),
            connection_duration: histogram_vec(
                r,
                "crossbar_connection_duration_seconds",
                "Lifetime of relayed connections.",
                &["service"],
                DURATION_BUCKETS,
            ),
            routing_refused: counter_vec(
                r,
                "crossbar_route_refused_total",
                "Connections refused by routing or because no backend could take them, by reason.",
                &["service", "reason"],
            ),
            queue_timeouts: counter_vec(
                r,
                "crossbar_queue_timeouts_total",
                "Connections that waited for a backend slot and gave up.",
                &["service"],
            ),
            resets: counter_vec(
                r,
                "crossbar_connection_resets_total",
                "Relayed connections a peer aborted (reset or error), by the side that aborted; crossbar reset the other side in turn.",
                &["service", "side"],
            ),
            config_reloads: counter_vec(
                r,
                "crossbar_config_reloads_total",
                "Configuration reloads by result (ok|error).",
                &["result"],
            ),
        }
    }
}

/// Per-listener families: accepts, refusals, per-source tracking, PROXY probes.
pub(super) struct ListenerFamilies {
    /// `crossbar_listener_accepts_total`.
    pub(super) accepts: IntCounterVec,
    /// `crossbar_listener_refused_total`.
    pub(super) refused: IntCounterVec,
    /// `crossbar_listener_sources_tracked`.
    pub(super) sources_tracked: IntGaugeVec,
    /// `crossbar_proxy_probes_total`.
    pub(super) proxy_probes: IntCounterVec,
}

impl ListenerFamilies {
    pub(super) fn register(r: &Registry) -> ListenerFamilies {
        ListenerFamilies {
            accepts: counter_vec(
                r,
                "crossbar_listener_accepts_total",
                "Connections accepted by a listener.",
                &["listener"],
            ),
            refused: counter_vec(
                r,
                "crossbar_listener_refused_total",
                "Connections a listener refused, by reason.",
                &["listener", "reason"],
            ),
            sources_tracked: gauge_vec(
                r,
                "crossbar_listener_sources_tracked",
                "Client sources a listener's per_source table tracks (updated each second).",
                &["listener"],
            ),
            proxy_probes: counter_vec(
                r,
                "crossbar_proxy_probes_total",
                "Health checks of a trusted tier: a PROXY header for its own connection (v2 LOCAL) and a close, neither an error nor logged.",
                &["listener"],
            ),
        }
    }
}
