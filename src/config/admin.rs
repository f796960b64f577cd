//! `admin:` checked: the endpoint's address, token file, allowed `Host`s and
//! whether `/healthz` needs every service to have a backend.
use std::net::SocketAddr;

use super::checker::Checker;
use super::raw::{Nullable, RawAdmin};
use super::{AdminConfig, DEFAULT_ADMIN_LISTEN};

impl Checker<'_> {
    pub(super) fn admin(&mut self, raw: Option<&Nullable<RawAdmin>>) -> Option<AdminConfig> {
        let fallback = SocketAddr::from(([127, 0, 0, 1], 9140));
        let default_listen = DEFAULT_ADMIN_LISTEN.parse().unwrap_or(fallback);
        let admin = match raw {
            None => {
                return Some(AdminConfig {
                    listen: default_listen,
                    token_file: None,
                    allowed_hosts: Vec::new(),
                    healthz_needs_backends: false,
                })
            }
            Some(Nullable::Null) => {
                let msg = "`admin:` is empty: remove it for the default \
                           (127.0.0.1:9140), or write `admin: { enabled: false }` to disable";
                self.err("admin", msg);
                return None;
            }
            Some(Nullable::Value(a)) => a,
        };
        if admin.enabled == Some(false) {
            return None;
        }
        let listen = match &admin.listen {
            None => default_listen,
            Some(s) => self
                .socket_addr(s, "admin.listen")
                .unwrap_or(default_listen),
        };
        let allowed_hosts = admin
            .allowed_hosts
            .iter()
            .flatten()
            .enumerate()
            .filter_map(|(i, h)| self.allowed_host(h, &format!("admin.allowed_hosts[{i}]")))
            .collect();
        Some(AdminConfig {
            listen,
            token_file: admin.token_file.clone(),
            allowed_hosts,
            healthz_needs_backends: admin.healthz_needs_backends.unwrap_or(false),
        })
    }

    /// An `admin.allowed_hosts` entry: a DNS name or an IP address, nothing else
    /// (the port is never compared); lowercased, IPs in canonical form.
    fn allowed_host(&mut self, h: &str, path: &str) -> Option<String> {
        let trimmed = h.trim_end_matches('.');
        let bare = trimmed.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = bare.parse::<std::net::IpAddr>() {
            return Some(ip.to_string());
        }
        let is_name = !trimmed.is_empty()
            && trimmed.len() <= 253
            && trimmed.split('.').all(|label| {
                (1..=63).contains(&label.len())
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                    && !label.starts_with('-')
                    && !label.ends_with('-')
            });
        if is_name {
            return Some(trimmed.to_ascii_lowercase());
        }
        self.err(
            path,
            format!(
                "`{h}` is not a host name or IP address (no scheme, port or path: \
                 e.g. lb1.example.com)"
            ),
        );
        None
    }
}
