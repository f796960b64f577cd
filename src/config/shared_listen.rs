//! Rules for services that share a listen address and are told apart by SNI.
use std::collections::HashMap;
use std::net::SocketAddr;

use super::checker::{join, Checker};
use super::*;

impl Checker<'_> {
    /// Rules for services that share a listen address (routing by SNI).
    pub(super) fn shared_listeners(&mut self, services: &[ServiceConfig]) {
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
        }
    }

    /// Rules for one shared address `addr` and its `members` (service, listen entry).
    pub(super) fn shared_group(
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
        let first = &services[members[0].0].listen[members[0].1];
        for &(s, l) in members {
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
            self.claim_names(svc, addr, &mut claimed);
            let lc = &svc.listen[l];
            if (
                lc.backlog,
                lc.freebind,
                lc.max_connections,
                &lc.proxy_protocol,
                &lc.per_source,
            ) != (
                first.backlog,
                first.freebind,
                first.max_connections,
                &first.proxy_protocol,
                &first.per_source,
            ) {
                let msg = format!("{addr} is shared with {others}: its backlog, freebind, max_connections, proxy_protocol and per_source must be the same everywhere");
                self.err(&format!("{p}.listen[{l}]"), msg);
            }
        }
    }

    /// `svc`'s `server_names` on the shared address `addr`: a name another service
    /// there claimed already is an error at both places; else it is `claimed` now
    /// (name -> service and YAML path).
    fn claim_names<'a>(
        &mut self,
        svc: &'a ServiceConfig,
        addr: SocketAddr,
        claimed: &mut HashMap<&'a str, (&'a str, String)>,
    ) {
        let p = format!("services.{}", svc.name);
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
