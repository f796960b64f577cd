//! The doctor's rules: what in the backends' inspections will make agents fail,
//! with the severity and the fix.
use super::inspect::{TicketKey, CA_CERT_PATH};
use super::{BackendReport, Finding, Severity, EXPIRY_WARNING_DAYS};
use crate::config::{Balance, CheckKind, Config, Failback, Mode, ServiceConfig, StickOn};
use crate::health::explain::{dialed_names, grouped, Failure};

/// Every finding for every service of `config`.
pub fn judge(config: &Config, backends: &[BackendReport]) -> Vec<Finding> {
    let mut out = Vec::new();
    for svc in &config.services {
        let mine: Vec<&BackendReport> = backends.iter().filter(|b| b.service == svc.name).collect();
        let mut add = |severity, backend: Option<&str>, message: String| {
            out.push(Finding {
                severity,
                service: svc.name.clone(),
                backend: backend.map(str::to_string),
                message,
            })
        };
        if dialed_names(svc).is_empty() {
            add(
                Severity::Info,
                None,
                "no names to check: list the names agents dial for this service under `names:`"
                    .into(),
            );
        }
        for l in &svc.listen {
            if let Some(p) = &l.proxy_protocol {
                add(Severity::Info, None, format!("listen {}: {p}", l.addr));
            }
        }
        let listens = crate::config::listen_addresses(&config.services);
        for b in &svc.backends {
            let Some(sa) = b.address.as_socket_addr() else {
                continue;
            };
            if let Some(why) =
                crate::config::own_address(sa, &listens, crate::config::is_local_address)
            {
                add(
                    Severity::Error,
                    Some(&b.name),
                    format!(
                        "`{}`: {why}: remove the backend, or give the address of another host",
                        b.address
                    ),
                );
            }
        }
        let none_pass = no_backend_passes(&mine);
        for b in &mine {
            for (sev, msg) in backend_findings(svc, b)
                .into_iter()
                .chain(feedback_findings(b))
            {
                add(sev, Some(&b.backend), msg);
            }
            if !none_pass {
                for (sev, msg) in check_findings(svc, b) {
                    add(sev, Some(&b.backend), msg);
                }
            }
        }
        if none_pass {
            add(Severity::Error, None, all_fail(&svc.name, &mine));
        }
        for (sev, msg) in issuers(&mine)
            .into_iter()
            .chain(shared_expiry(&mine))
            .chain(ca_certificates(svc, &mine))
        {
            add(sev, None, msg);
        }
    }
    out
}

/// Every backend of the service fails its configured check: `run` would serve
/// the service with every backend down.
fn no_backend_passes(backends: &[&BackendReport]) -> bool {
    !backends.is_empty() && backends.iter().all(|b| !b.inspection.check.passed)
}

/// "no backend of SERVICE will pass its health check", with the reasons: once for
/// backends that fail alike (the same words but for their own certificate).
fn all_fail(service: &str, backends: &[&BackendReport]) -> String {
    let check = backends
        .first()
        .map(|b| b.inspection.check.check.clone())
        .unwrap_or_default();
    let failures: Vec<Failure<'_>> = backends
        .iter()
        .map(|b| Failure {
            backend: &b.backend,
            reason: b.inspection.check.reason.as_deref().unwrap_or_default(),
            subject: b.inspection.chain.first().map(|c| c.subject.as_str()),
        })
        .collect();
    format!(
        "no backend of {service} will pass its health check ({check}): `crossbar run` \
         would mark every backend down and refuse every client. {}",
        grouped(&failures)
    )
}

/// One backend's failed or slow check (when others of its service pass). A check
/// that fails on a name agents dial which the certificate lacks has the cause and
/// the fix of that name's error: said as the same cause, the fix once.
fn check_findings(svc: &ServiceConfig, b: &BackendReport) -> Vec<(Severity, String)> {
    let c = &b.inspection.check;
    if b.inspection.unreachable.is_some() {
        return Vec::new(); // said already, as unreachable
    }
    let name = b.inspection.server_name.as_str();
    let missing = b
        .inspection
        .chain
        .first()
        .is_some_and(|leaf| dialed_names(svc).contains(&name) && !leaf.covers(name));
    if !c.passed && missing {
        let msg = format!(
            "its health check ({}) fails for the same cause, `{name}` missing from its \
             certificate, so it stays down until the certificate is re-issued",
            c.check
        );
        return vec![(Severity::Warning, msg)];
    }
    if !c.passed {
        let why = c.reason.as_deref().unwrap_or("failed");
        let msg = format!(
            "its health check ({}) fails, so it stays down: {why}",
            c.check
        );
        return vec![(Severity::Warning, msg)];
    }
    match c.slow_ms {
        Some(ms) => vec![(
            Severity::Warning,
            format!(
                "its health check ({}) passed but took {ms} ms, more than `health.timeout`: \
                 `crossbar run` counts that as a failure",
                c.check
            ),
        )],
        None => Vec::new(),
    }
}

/// A load feedback poll that fails: `run` balances the backend by its configured
/// weight meanwhile, and warns; the fix names the one setting to change.
fn feedback_findings(b: &BackendReport) -> Vec<(Severity, String)> {
    let Some(f) = b.inspection.feedback.as_ref().filter(|f| !f.ok) else {
        return Vec::new();
    };
    if let Some(name) = &f.missing_name {
        // The certificate finding names the one fix (re-issue with dns_alt_names);
        // a setting to change here would hide the broken certificate.
        let msg = format!(
            "load feedback ({}) fails for the same cause, `{name}` missing from its \
             certificate: `crossbar run` balances it by its configured weight until the \
             certificate is re-issued",
            f.kind
        );
        return vec![(Severity::Warning, msg)];
    }
    let msg = format!(
        "load feedback ({}) fails: {}; `crossbar run` balances it by its configured weight \
         meanwhile. Fix: {}",
        f.kind,
        f.reason.as_deref().unwrap_or("failed"),
        f.fix.as_deref().unwrap_or("see the reason")
    );
    vec![(Severity::Warning, msg)]
}

fn backend_findings(svc: &ServiceConfig, b: &BackendReport) -> Vec<(Severity, String)> {
    let seen = &b.inspection;
    let mut out = Vec::new();
    if let Some(e) = &seen.unreachable {
        if svc.backends.len() == 1 && svc.discover.is_none() {
            // There is no other backend: the service's own finding says what follows.
            let msg = format!("unreachable ({e}): nothing else was checked");
            return vec![(Severity::Warning, msg)];
        }
        let msg = format!(
            "unreachable ({e}): agents are sent to the other backends; nothing else was checked"
        );
        return vec![(Severity::Warning, msg)];
    }
    if let Some(e) = &seen.tls_error {
        // `mode: tcp` passes any protocol: a backend that speaks no TLS may be right.
        let severity = match svc.mode {
            Mode::Tcp => Severity::Info,
            Mode::Tls => Severity::Error,
        };
        return vec![(severity, format!("no TLS handshake: {e}"))];
    }
    let Some(leaf) = seen.chain.first() else {
        return vec![(Severity::Error, "presented no certificate".into())];
    };
    // The leaf is this backend's own; the rest of the chain (the CA) is shared by
    // the service's backends and said once for them ([`shared_expiry`]).
    for c in seen.chain.iter().take(1) {
        if c.days_left < 0 {
            let msg = format!("certificate {} expired on {}", c.subject, c.not_after);
            out.push((Severity::Error, msg));
        } else if c.days_left < EXPIRY_WARNING_DAYS {
            let msg = format!(
                "certificate {} expires in {} days ({}): renew it",
                c.subject, c.days_left, c.not_after
            );
            out.push((Severity::Warning, msg));
        }
    }
    for name in dialed_names(svc) {
        if !leaf.covers(name) {
            out.push((Severity::Error, missing_name(name, &leaf.sans)));
        }
    }
    // A failed https check is reported as the check's finding.
    let https = svc
        .backends
        .iter()
        .any(|c| c.name == b.backend && matches!(c.health.check, CheckKind::Https(_)));
    if let Some(s) = seen.status.as_ref().filter(|s| !s.ok && !https) {
        let msg = format!(
            "status {}: {}: its health check keeps it down",
            s.path, s.answer
        );
        out.push((Severity::Warning, msg));
    }
    out.extend(stickiness(svc, b));
    out
}

fn missing_name(name: &str, sans: &[String]) -> String {
    let have = if sans.is_empty() {
        "none".to_string()
    } else {
        sans.join(", ")
    };
    format!(
        "`{name}` is not in the certificate's subject alternative names ({have}): agents \
         dialing it fail verification. Fix: add it to `dns_alt_names` in this master's \
         puppet.conf and re-issue its certificate (signed with allow-subject-alt-names)"
    )
}

/// How the service's stick keys will work with this backend.
fn stickiness(svc: &ServiceConfig, b: &BackendReport) -> Vec<(Severity, String)> {
    let Some(stick) = &svc.stick else {
        return Vec::new();
    };
    let on = |k| stick.on.contains(&k);
    let seen = &b.inspection;
    let mut out = Vec::new();
    if (on(StickOn::Ticket) || on(StickOn::Psk)) && matches!(seen.ticket_key, TicketKey::NotFound) {
        out.push((
            Severity::Info,
            "TLS 1.3 tickets carry no key name: resumptions are placed by server confirmation"
                .into(),
        ));
    }
    if on(StickOn::SessionId) && seen.session_id_resumption == Some(false) {
        out.push((
            Severity::Info,
            "TLS 1.2 session IDs are not resumed: `session_id` stickiness learns nothing here"
                .into(),
        ));
    }
    out
}

/// A `balance: first`, `failback: manual` service (the Puppet CA layout) where no
/// backend that completed a handshake serves a CA certificate.
fn no_ca_served(svc: &ServiceConfig, backends: &[&BackendReport]) -> Vec<(Severity, String)> {
    let answered = backends
        .iter()
        .any(|b| b.inspection.unreachable.is_none() && b.inspection.tls_error.is_none());
    if svc.balance != Balance::First || svc.failback != Failback::Manual || !answered {
        return Vec::new();
    }
    vec![(
        Severity::Warning,
        format!(
            "no backend serves a Puppet CA certificate at {CA_CERT_PATH}: agents sent to \
             this `balance: first`, `failback: manual` service (the Puppet CA layout) cannot \
             get certificates signed; point its backends at the Puppet CA servers (or, if \
             it is not a CA, use `failback: auto`)"
        ),
    )]
}

/// Expired or expiring certificates of the backends' chains above their leaves
/// (the Puppet CA every compiler serves): one finding per certificate, naming the
/// backends that serve it, not one per backend.
fn shared_expiry(backends: &[&BackendReport]) -> Vec<(Severity, String)> {
    // (certificate, its servers), in the order first seen
    let mut seen: Vec<(&super::CertInfo, Vec<&str>)> = Vec::new();
    for b in backends {
        for c in b.inspection.chain.iter().skip(1) {
            let same = |s: &&mut (&super::CertInfo, Vec<&str>)| {
                s.0.subject == c.subject && s.0.serial == c.serial
            };
            match seen.iter_mut().find(|s| same(s)) {
                Some((_, servers)) => servers.push(&b.backend),
                None => seen.push((c, vec![&b.backend])),
            }
        }
    }
    let mut out = Vec::new();
    for (c, servers) in seen {
        let by = servers.join(", ");
        if c.days_left < 0 {
            let msg = format!(
                "certificate {} expired on {} (served by {by})",
                c.subject, c.not_after
            );
            out.push((Severity::Error, msg));
        } else if c.days_left < EXPIRY_WARNING_DAYS {
            let msg = format!(
                "certificate {} expires in {} days ({}): renew it (served by {by})",
                c.subject, c.days_left, c.not_after
            );
            out.push((Severity::Warning, msg));
        }
    }
    out
}

/// Backends of one service whose leaf certificates come from different CAs.
fn issuers(backends: &[&BackendReport]) -> Vec<(Severity, String)> {
    let ids: Vec<(&str, String)> = backends
        .iter()
        .filter_map(|b| Some((b.backend.as_str(), b.inspection.chain.first()?.issuer_id())))
        .collect();
    let Some((_, first)) = ids.first() else {
        return Vec::new();
    };
    if ids.iter().all(|(_, id)| id == first) {
        return Vec::new();
    }
    let list: Vec<String> = ids.iter().map(|(b, id)| format!("{b}: {id}")).collect();
    vec![(
        Severity::Warning,
        format!(
            "backends' certificates are issued by different CAs ({}): agents trust one CA \
             and fail on the backends of the others",
            list.join("; ")
        ),
    )]
}

/// The Puppet CA certificates the backends serve: they must be one CA; for a
/// `balance: first` (CA) service, every reachable backend must serve it.
fn ca_certificates(svc: &ServiceConfig, backends: &[&BackendReport]) -> Vec<(Severity, String)> {
    let serving: Vec<(&str, &super::CaCert)> = backends
        .iter()
        .filter_map(|b| Some((b.backend.as_str(), b.inspection.ca_certificate.as_ref()?)))
        .collect();
    let Some((first_name, first)) = serving.first() else {
        return no_ca_served(svc, backends);
    };
    let describe = |c: &super::CaCert| format!("{} serial {}", c.first.subject, c.first.serial);
    if serving.iter().any(|(_, c)| c.der != first.der) {
        let list: Vec<String> = serving
            .iter()
            .map(|(b, c)| format!("{b}: {}", describe(c)))
            .collect();
        let msg = format!(
            "backends serve different Puppet CA certificates ({}): a standby CA must be an \
             `rsync -a --delete` copy of the primary's cadir, made before its first start",
            list.join("; ")
        );
        return vec![(Severity::Error, msg)];
    }
    if svc.balance != Balance::First {
        return Vec::new();
    }
    let missing: Vec<&str> = backends
        .iter()
        .filter(|b| b.inspection.tls_error.is_none() && b.inspection.unreachable.is_none())
        .filter(|b| b.inspection.ca_certificate.is_none())
        .map(|b| b.backend.as_str())
        .collect();
    if !missing.is_empty() {
        let msg = format!(
            "{} serve no CA certificate at {CA_CERT_PATH} while {first_name} does: they \
             cannot take over as the CA",
            missing.join(", ")
        );
        return vec![(Severity::Warning, msg)];
    }
    let names: Vec<&str> = serving.iter().map(|(b, _)| *b).collect();
    vec![(
        Severity::Info,
        format!(
            "{} serve the same CA certificate ({})",
            names.join(" and "),
            describe(first)
        ),
    )]
}
