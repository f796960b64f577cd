//! Raw serde model of the YAML file: exactly what was written, nothing merged.
//!
//! Every struct denies unknown keys; everything with a default is an `Option`.
//! Values that need a friendlier error than serde's (durations, listen entries)
//! are kept loosely typed here and checked in `validate.rs`, where every problem
//! is collected instead of stopping at the first.
use std::fmt;
use std::path::PathBuf;

use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

/// The whole file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    pub workers: Option<u64>,
    /// Absent: admin on its default address. `null` is refused (ambiguous).
    #[serde(default, deserialize_with = "present")]
    pub admin: Option<Nullable<RawAdmin>>,
    pub defaults: Option<RawDefaults>,
    pub services: Option<RawServices>,
    pub confirm_budget: Option<u64>,
    pub state_file: Option<PathBuf>,
}

/// A key that was written, possibly as an explicit `null`.
#[derive(Debug)]
pub(super) enum Nullable<T> {
    Null,
    Value(T),
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Nullable<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(match Option::<T>::deserialize(d)? {
            None => Nullable::Null,
            Some(v) => Nullable::Value(v),
        })
    }
}

/// Lets an `Option<Nullable<T>>` field tell "absent" (None) from "null".
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<Nullable<T>>, D::Error> {
    Nullable::deserialize(d).map(Some)
}

/// `admin:`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAdmin {
    pub enabled: Option<bool>,
    pub listen: Option<String>,
    pub token_file: Option<PathBuf>,
    pub allowed_hosts: Option<Vec<String>>,
    pub healthz_needs_backends: Option<bool>,
}

/// `defaults:` — service settings and listener defaults.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDefaults {
    pub timeouts: Option<RawTimeouts>,
    pub keepalive: Option<RawKeepalive>,
    pub health: Option<RawHealth>,
    pub max_hello_size: Option<u64>,
    pub retries: Option<u64>,
    pub queue_size: Option<u64>,
    pub slow_start: Option<RawDuration>,
    pub relay: Option<RawRelay>,
    pub backlog: Option<u64>,
    pub max_connections: Option<u64>,
}

/// `keepalive:` (defaults or service): TCP keepalive on client and backend sockets.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawKeepalive {
    pub enabled: Option<bool>,
    pub time: Option<RawDuration>,
    pub interval: Option<RawDuration>,
    pub probes: Option<u64>,
}

/// `timeouts:` (defaults or service).
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTimeouts {
    pub client_hello: Option<RawDuration>,
    pub connect: Option<RawDuration>,
    pub server_hello: Option<RawDuration>,
    pub idle: Option<RawDuration>,
    pub queue: Option<RawDuration>,
    pub shutdown: Option<RawDuration>,
}

/// `check:` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum RawCheck {
    None,
    Tcp,
    TlsHello,
    Https,
}

/// `health:` (defaults, service or backend); each level overrides field by field.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHealth {
    pub check: Option<RawCheck>,
    pub interval: Option<RawDuration>,
    pub timeout: Option<RawDuration>,
    pub rise: Option<u64>,
    pub fall: Option<u64>,
    pub path: Option<String>,
    pub expect_status: Option<u64>,
    pub expect_body: Option<String>,
    pub ca_file: Option<PathBuf>,
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
    pub server_name: Option<String>,
}

impl RawHealth {
    /// The keys that only make sense with `check: https`, with their values' presence.
    pub fn https_keys(&self) -> [(&'static str, bool); 7] {
        [
            ("path", self.path.is_some()),
            ("expect_status", self.expect_status.is_some()),
            ("expect_body", self.expect_body.is_some()),
            ("ca_file", self.ca_file.is_some()),
            ("client_cert", self.client_cert.is_some()),
            ("client_key", self.client_key.is_some()),
            ("server_name", self.server_name.is_some()),
        ]
    }
}

/// `services:` in file order (a map, but order matters for messages and summary).
#[derive(Debug, Default)]
pub(super) struct RawServices(pub Vec<(String, RawService)>);

impl<'de> Deserialize<'de> for RawServices {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawServices;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a mapping of service name to service")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawServices, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, RawService>()? {
                    out.push((k, v));
                }
                Ok(RawServices(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// `mode:`
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum RawMode {
    Tls,
    Tcp,
}

/// `on_non_tls:`
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum RawOnNonTls {
    Reject,
    Forward,
}

/// `relay:`
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum RawRelay {
    SpliceAuto,
    /// Retired (the BPF sockmap relay): read as `splice-auto`, with a warning.
    Kernel,
    Auto,
}

/// `balance:`
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum RawBalance {
    RoundRobin,
    LeastConn,
    First,
    Source,
}

/// `on_marked_down:`
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum RawOnMarkedDown {
    None,
    ShutdownSessions,
}

/// `failback:`
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum RawFailback {
    Manual,
    Auto,
}

/// One service.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawService {
    pub listen: Vec<RawListen>,
    pub mode: Option<RawMode>,
    pub on_non_tls: Option<RawOnNonTls>,
    pub server_names: Option<Vec<String>>,
    pub names: Option<Vec<String>>,
    pub default: Option<bool>,
    pub balance: Option<RawBalance>,
    pub failback: Option<RawFailback>,
    /// Absent: no stickiness; `{}`: stickiness with defaults; `null` is refused.
    #[serde(default, deserialize_with = "present")]
    pub stick: Option<Nullable<RawStick>>,
    pub timeouts: Option<RawTimeouts>,
    pub keepalive: Option<RawKeepalive>,
    pub health: Option<RawHealth>,
    pub max_hello_size: Option<u64>,
    pub retries: Option<u64>,
    pub queue_size: Option<u64>,
    pub slow_start: Option<RawDuration>,
    pub relay: Option<RawRelay>,
    pub on_marked_down: Option<RawOnMarkedDown>,
    pub source: Option<String>,
    /// Absent: only `discover` supplies backends (validation wants one of the two).
    #[serde(default)]
    pub backends: Vec<RawBackend>,
    pub discover: Option<RawDiscover>,
    pub feedback: Option<RawFeedback>,
}

/// `feedback:` kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum RawFeedbackKind {
    Puppet,
    Agent,
}

/// `feedback:` load feedback of a service's backends (JRuby metrics or agent-check).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFeedback {
    pub kind: Option<RawFeedbackKind>,
    pub interval: Option<RawDuration>,
    pub timeout: Option<RawDuration>,
    pub blackout: Option<RawDuration>,
    pub expiry: Option<RawDuration>,
    pub smoothing: Option<RawDuration>,
    pub floor: Option<RawPercent>,
    pub saturated_sticky: Option<bool>,
    pub path: Option<String>,
    pub ca_file: Option<PathBuf>,
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
    pub server_name: Option<String>,
    pub jrubies: Option<u64>,
    pub queue_limit: Option<u64>,
    pub by_pool_size: Option<bool>,
    pub port: Option<u64>,
    pub send: Option<String>,
}

impl RawFeedback {
    /// The keys that only make sense with `kind: puppet`, with their presence.
    pub fn puppet_keys(&self) -> [(&'static str, bool); 8] {
        [
            ("path", self.path.is_some()),
            ("ca_file", self.ca_file.is_some()),
            ("client_cert", self.client_cert.is_some()),
            ("client_key", self.client_key.is_some()),
            ("server_name", self.server_name.is_some()),
            ("jrubies", self.jrubies.is_some()),
            ("queue_limit", self.queue_limit.is_some()),
            ("by_pool_size", self.by_pool_size.is_some()),
        ]
    }
}

/// A percentage as written: `5%`, or a bare number (refused with a hint).
#[derive(Debug, Clone, PartialEq)]
pub(super) enum RawPercent {
    Text(String),
    Bare(String),
}

impl<'de> Deserialize<'de> for RawPercent {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = RawPercent;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a percentage such as \"5%\"")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawPercent, E> {
                Ok(RawPercent::Text(v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<RawPercent, E> {
                Ok(RawPercent::Bare(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<RawPercent, E> {
                Ok(RawPercent::Bare(v.to_string()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<RawPercent, E> {
                Ok(RawPercent::Bare(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

/// `discover:` backends from DNS (SRV, or a host name's A/AAAA records).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDiscover {
    pub srv: Option<String>,
    pub host: Option<String>,
    pub port: Option<u64>,
    pub resolvers: Option<Vec<String>>,
    pub min_ttl: Option<RawDuration>,
    pub max_ttl: Option<RawDuration>,
    pub max_backends: Option<u64>,
    pub timeout: Option<RawDuration>,
    /// Settings every discovered backend gets (`server-template`'s options).
    pub backend: Option<RawDiscoverBackend>,
}

/// `discover.backend:` the options of every backend an answer gives.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDiscoverBackend {
    pub max_connections: Option<u64>,
    pub proxy_protocol: Option<RawProxyProtocol>,
    pub health: Option<RawHealth>,
    pub source: Option<String>,
}

/// `stick.on` items.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum RawStickOn {
    SessionId,
    Ticket,
    Psk,
    Source,
}

/// `stick:`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStick {
    pub on: Option<Vec<RawStickOn>>,
    pub size: Option<u64>,
    pub expire: Option<RawDuration>,
    pub source_expire: Option<RawDuration>,
    pub source_prefix_v4: Option<u64>,
    pub source_prefix_v6: Option<u64>,
    pub ticket_prefix: Option<u64>,
    pub state_file: Option<PathBuf>,
    pub save_interval: Option<RawDuration>,
    pub probe_interval: Option<RawDuration>,
    pub confirm: Option<bool>,
    pub confirm_tries: Option<u64>,
}

/// `proxy_protocol:`
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum RawProxyProtocol {
    V1,
    V2,
}

/// One backend.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBackend {
    pub name: String,
    pub address: String,
    pub weight: Option<u64>,
    pub backup: Option<bool>,
    pub max_connections: Option<u64>,
    pub proxy_protocol: Option<RawProxyProtocol>,
    pub health: Option<RawHealth>,
    pub disabled: Option<bool>,
    pub source: Option<String>,
}

/// A listen entry: `"10.0.0.1:8140"` or `{ address: ..., backlog: ..., ... }`.
#[derive(Debug)]
pub(super) enum RawListen {
    Short(String),
    Long(RawListenLong),
}

/// The long form of a listen entry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawListenLong {
    pub address: String,
    pub backlog: Option<u64>,
    pub freebind: Option<bool>,
    pub max_connections: Option<u64>,
    pub proxy_protocol: Option<RawProxyAccept>,
    pub per_source: Option<RawPerSource>,
}

/// `listen[].per_source:` (per-source admission limits).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPerSource {
    pub max_connections: Option<u64>,
    pub rate: Option<u64>,
    pub burst: Option<u64>,
    pub source_prefix_v4: Option<u64>,
    pub source_prefix_v6: Option<u64>,
    pub allow: Option<Vec<String>>,
    pub table_size: Option<u64>,
}

/// `listen[].proxy_protocol:` (receiving PROXY headers from the tiers in front).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawProxyAccept {
    pub accept_from: Vec<String>,
    pub required: Option<bool>,
}

impl<'de> Deserialize<'de> for RawListen {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawListen;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an address such as \"10.0.0.1:8140\" or a mapping with `address`")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawListen, E> {
                Ok(RawListen::Short(v.to_string()))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RawListen, A::Error> {
                RawListenLong::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(RawListen::Long)
            }
        }
        d.deserialize_any(V)
    }
}

/// A duration as written: humantime text, or a bare number (refused with a hint).
#[derive(Debug, Clone, PartialEq)]
pub(super) enum RawDuration {
    Text(String),
    Bare(String),
}

impl<'de> Deserialize<'de> for RawDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = RawDuration;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a duration such as \"5s\", \"30m\" or \"1h 30m\"")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawDuration, E> {
                Ok(RawDuration::Text(v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<RawDuration, E> {
                Ok(RawDuration::Bare(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<RawDuration, E> {
                Ok(RawDuration::Bare(v.to_string()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<RawDuration, E> {
                Ok(RawDuration::Bare(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}
