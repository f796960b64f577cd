//! Rules for services that share a listen address and are told apart by SNI, and
//! the address's own settings (backlog, freebind, max_connections, proxy_protocol,
//! per_source: one socket's), written once in any of them and the same for all.
use std::collections::HashMap;
use std::net::SocketAddr;

use super::checker::{join, Checker};
use super::raw::{RawListen, RawListenLong, RawService};
use super::*;

/// Whether a long-form listen entry wrote one setting.
type Written = fn(&RawListenLong) -> bool;

/// The settings of a listen address, by name: whether a long-form entry wrote it.
const LISTEN_SETTINGS: [(&str, Written); 5] = [
    ("backlog", |l| l.backlog.is_some()),
    ("freebind", |l| l.freebind.is_some()),
    ("max_connections", |l| l.max_connections.is_some()),
    ("proxy_protocol", |l| l.proxy_protocol.is_some()),
    ("per_source", |l| l.per_source.is_some()),
];

/// Copy setting `name` of `from` to `to`.
fn copy_setting(name: &str, from: &ListenConfig, to: &mut ListenConfig) {
    match name {
        "backlog" => to.backlog = from.backlog,
        "freebind" => to.freebind = from.freebind,
        "max_connections" => to.max_connections = from.max_connections,
        "proxy_protocol" => to.proxy_protocol = from.proxy_protocol.clone(),
        _ => to.per_source = from.per_source.clone(),
    }
}

/// Setting `name` is the same in `a` and `b`.
fn same_setting(name: &str, a: &ListenConfig, b: &ListenConfig) -> bool {
    match name {
        "backlog" => a.backlog == b.backlog,
        "freebind" => a.freebind == b.freebind,
        "max_connections" => a.max_connections == b.max_connections,
        "proxy_protocol" => a.proxy_protocol == b.proxy_protocol,
        _ => a.per_source == b.per_source,
    }
}

/// One service's entry for a shared address: where it is in `services` (service,
/// listener), its YAML path, and the long form it was written in, if it was.
struct Member<'r> {
    at: (usize, usize),
    path: String,
    long: Option<&'r RawListenLong>,
}

impl Checker<'_> {
    /// Rules for services that share a listen address (routing by SNI); the
    /// address's settings written in one of them are given to the others.
    pub(super) fn shared_listeners(
        &mut self,
        services: &mut [ServiceConfig],
        raw: &[(String, RawService)],
    ) {
        let mut groups: Vec<(SocketAddr, Vec<(usize, usize)>)> = Vec::new();
        for (s, svc) in services.iter().enumerate() {
            for (l, lc) in svc.listen.iter().enumerate() {
                if lc.addr.port() == 0 {
                    continue;
                }
                match groups.iter_mut().find(|(a, _)| *a == lc.addr) {
                    Some((_, members)) => members.push((s, l)),
                    None => groups.push((lc.addr, vec![(s, l)])),
                }
            }
        }
        for (addr, members) in groups.iter().filter(|(_, m)| m.len() > 1) {
            self.shared_group(services, *addr, members);
            let members = members_as_written(services, raw, members);
            self.shared_settings(services, *addr, &members);
        }
    }

    /// Each setting of the address `addr`: the first service to write it gives it
    /// to those that don't; one that writes another value is an error naming the
    /// setting and where the first was written.
    fn shared_settings(
        &mut self,
        services: &mut [ServiceConfig],
        addr: SocketAddr,
        members: &[Member<'_>],
    ) {
        for (name, written) in LISTEN_SETTINGS {
            let writers: Vec<&Member<'_>> = members
                .iter()
                .filter(|m| m.long.is_some_and(written))
                .collect();
            let Some(first) = writers.first() else {
                continue;
            };
            let (fs, fl) = first.at;
            let value = services[fs].listen[fl].clone();
            for m in &writers[1..] {
                let (s, l) = m.at;
                if !same_setting(name, &services[s].listen[l], &value) {
                    let msg = format!(
                        "{addr} is shared with {}: its `{name}` differs from the one {} \
                         writes (the address is one socket: write its settings once, in one \
                         service; the others may name the address alone)",
                        services[fs].name, first.path
                    );
                    self.err(&join(&m.path, name), msg);
                }
            }
            for m in members.iter().filter(|m| !m.long.is_some_and(written)) {
                let (s, l) = m.at;
                copy_setting(name, &value, &mut services[s].listen[l]);
            }
        }
    }

    /// The routing rules of one shared address: `mode: tls`, names or default, one
    /// default, no name claimed twice.
    fn shared_group(
        &mut self,
        services: &[ServiceConfig],
        addr: SocketAddr,
        members: &[(usize, usize)],
    ) {
        let names: Vec<&str> = members
            .iter()
            .map(|&(s, _)| services[s].name.as_str())
            .collect();
        let mut default_owner: Option<&str> = None;
        let mut claimed: HashMap<&str, (&str, String)> = HashMap::new();
        for &(s, _) in members {
            let svc = &services[s];
            let p = format!("services.{}", svc.name);
            let others = names
                .iter()
                .filter(|n| **n != svc.name)
                .copied()
                .collect::<Vec<_>>()
                .join(", ");
            if svc.mode != Mode::Tls {
                self.err(
                    &join(&p, "mode"),
                    format!("shares {addr} with {others}: a shared listener needs `mode: tls`"),
                );
            }
            if svc.server_names.is_empty() && !svc.default {
                self.err(
                    &p,
                    format!(
                        "shares {addr} with {others}: give it `server_names` or `default: true`"
                    ),
                );
            }
            if svc.default {
                match default_owner {
                    Some(owner) => self.err(
                        &join(&p, "default"),
                        format!("{owner} is already the default on {addr}"),
                    ),
                    None => default_owner = Some(&svc.name),
                }
            }
            for (i, n) in svc.server_names.iter().enumerate() {
                let here = format!("{p}.server_names[{i}]");
                match claimed.get(n.as_str()) {
                    Some((owner, there)) => {
                        let there = there.clone();
                        let owner = *owner;
                        self.err(
                            &here,
                            format!("`{n}` on {addr} is also claimed by {owner} ({there})"),
                        );
                        self.err(
                            &there,
                            format!("`{n}` on {addr} is also claimed by {} ({here})", svc.name),
                        );
                    }
                    None => {
                        claimed.insert(n, (&svc.name, here));
                    }
                }
            }
        }
    }
}

/// The members of a shared address with the entries they were written as: each
/// service's raw listen entry naming the address (found by parsing it again, since
/// an entry that did not parse has no listener).
fn members_as_written<'r>(
    services: &[ServiceConfig],
    raw: &'r [(String, RawService)],
    members: &[(usize, usize)],
) -> Vec<Member<'r>> {
    members
        .iter()
        .filter_map(|&(s, l)| {
            let addr = services[s].listen[l].addr;
            let (_, svc) = raw.get(s)?;
            let (i, entry) = svc.listen.iter().enumerate().find(|(_, e)| {
                let text = match e {
                    RawListen::Short(a) => a,
                    RawListen::Long(long) => &long.address,
                };
                super::address::parse_socket_addr(text).ok() == Some(addr)
            })?;
            let long = match entry {
                RawListen::Long(long) => Some(long),
                RawListen::Short(_) => None,
            };
            let path = format!("services.{}.listen[{i}]", services[s].name);
            Some(Member {
                at: (s, l),
                path,
                long,
            })
        })
        .collect()
}
