//! The one-screen summary `crossbar check` prints for a valid configuration.
use std::fmt;

use super::*;

fn dur(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

fn check(h: &HealthConfig) -> String {
    let kind = match &h.check {
        CheckKind::None => return "no check".into(),
        CheckKind::Tcp => "tcp".to_string(),
        CheckKind::TlsHello => "tls-hello".to_string(),
        CheckKind::Https(c) => format!("https {} -> {}", c.path, c.expect_status),
    };
    format!(
        "{kind} every {} (rise {}, fall {})",
        dur(h.interval),
        h.rise,
        h.fall
    )
}

fn stick_on(on: &StickOn) -> &'static str {
    match on {
        StickOn::SessionId => "session_id",
        StickOn::Ticket => "ticket",
        StickOn::Psk => "psk",
        StickOn::Source => "source",
    }
}

impl Config {
    /// A human summary of the whole configuration, one block per service.
    ///
    /// Shows what the defaults resolved to, so an operator sees what will run.
    pub fn summary(&self) -> String {
        Summary(self).to_string()
    }
}

struct Summary<'a>(&'a Config);

impl fmt::Display for Summary<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = self.0;
        let workers = c
            .workers
            .map_or("one per core".to_string(), |w| w.to_string());
        let admin = match &c.admin {
            None => "disabled".to_string(),
            Some(a) => {
                let token = if a.token_file.is_some() {
                    "token file set"
                } else {
                    "no token file"
                };
                format!("{} ({token})", a.listen)
            }
        };
        writeln!(f, "{}: {} service(s)", c.source.display(), c.services.len())?;
        writeln!(
            f,
            "workers: {workers}; admin: {admin}; confirm budget: {}/s",
            c.confirm_budget
        )?;
        for s in &c.services {
            writeln!(f)?;
            service(f, s)?;
        }
        Ok(())
    }
}

/// One service's lines.
fn service(f: &mut fmt::Formatter<'_>, s: &ServiceConfig) -> fmt::Result {
    let mode = match (s.mode, s.on_non_tls) {
        (Mode::Tcp, _) => "tcp",
        (Mode::Tls, OnNonTls::Reject) => "tls, non-TLS rejected",
        (Mode::Tls, OnNonTls::Forward) => "tls, non-TLS forwarded",
    };
    writeln!(f, "service {} ({mode})", s.name)?;
    if s.relay != RelayMode::SpliceAuto {
        writeln!(
            f,
            "  relay     {} (splice-auto: the only relay)",
            s.relay.as_str()
        )?;
    }
    for l in &s.listen {
        let freebind = if l.freebind { ", freebind" } else { "" };
        writeln!(
            f,
            "  listen    {} (backlog {}, max {} connections{freebind})",
            l.addr, l.backlog, l.max_connections
        )?;
        if let Some(p) = &l.proxy_protocol {
            writeln!(f, "            {p}")?;
        }
        if let Some(p) = &l.per_source {
            writeln!(f, "            {p}")?;
        }
    }
    if !s.server_names.is_empty() || s.default {
        let mut names = s.server_names.join(", ");
        if s.default {
            names.push_str(if names.is_empty() {
                "default"
            } else {
                " (and default)"
            });
        }
        writeln!(f, "  names     {names}")?;
    }
    if !s.names.is_empty() {
        writeln!(f, "  dialed    {}", s.names.join(", "))?;
    }
    writeln!(f, "  balance   {}", balance(s))?;
    writeln!(f, "  stick     {}", stick(s.stick.as_ref()))?;
    if let Some(fb) = &s.feedback {
        writeln!(f, "  feedback  {}", feedback(fb))?;
    }
    let t = &s.timeouts;
    writeln!(
        f,
        "  timeouts  hello {}, connect {}, server hello {}, idle {}, queue {}, shutdown {}",
        dur(t.client_hello),
        dur(t.connect),
        dur(t.server_hello),
        dur(t.idle),
        dur(t.queue),
        dur(t.shutdown)
    )?;
    backends(f, &s.backends)?;
    if let Some(d) = &s.discover {
        discover(f, d)?;
    }
    Ok(())
}

/// The `from DNS` lines of a `discover` service: the name looked up, how, and what
/// every backend it gives is configured with (the answer itself: `--resolve`).
fn discover(f: &mut fmt::Formatter<'_>, d: &DiscoverConfig) -> fmt::Result {
    let what = match &d.query {
        DiscoverQuery::Srv(name) => format!("SRV {name}"),
        DiscoverQuery::Host { name, port } => format!("A/AAAA {name}, port {port}"),
    };
    let resolvers = if d.resolvers.is_empty() {
        "/etc/resolv.conf".to_string()
    } else {
        d.resolvers
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    writeln!(
        f,
        "    from DNS  {what} (not resolved: `crossbar check --resolve` looks it up)"
    )?;
    writeln!(
        f,
        "              asking {resolvers}, every {}..{} by the TTL, timeout {}, at most {} backends",
        dur(d.min_ttl),
        dur(d.max_ttl),
        dur(d.timeout),
        d.max_backends
    )?;
    let b = &d.backend;
    let mut each = vec!["weight from the record".to_string()];
    if let Some(m) = b.max_connections {
        each.push(format!("max {m}"));
    }
    if let Some(p) = b.proxy_protocol {
        each.push(if p == ProxyProtocol::V1 {
            "proxy v1".into()
        } else {
            "proxy v2".into()
        });
    }
    if let Some(s) = b.source {
        each.push(format!("source {s}"));
    }
    writeln!(
        f,
        "              each backend: {}; {}",
        each.join(", "),
        check(&d.health)
    )
}

/// The `balance` line: the algorithm (and failback for `first`).
fn balance(s: &ServiceConfig) -> String {
    match s.balance {
        Balance::RoundRobin => "roundrobin".to_string(),
        Balance::LeastConn => "leastconn".to_string(),
        Balance::Source => "source".to_string(),
        Balance::First => format!(
            "first, failback {}",
            if s.failback == Failback::Manual {
                "manual"
            } else {
                "auto"
            }
        ),
    }
}

/// The `stick` line: keys, size, expiry, state file and confirmation.
fn stick(stick: Option<&StickConfig>) -> String {
    match stick {
        None => "off".to_string(),
        Some(t) => {
            let on: Vec<&str> = t.on.iter().map(stick_on).collect();
            let file = t
                .state_file
                .as_ref()
                .map_or(String::new(), |f| format!(", saved to {}", f.display()));
            let confirm = if t.confirm {
                format!(", confirm up to {} backends", t.confirm_tries)
            } else {
                String::new()
            };
            format!(
                "{}; {} entries, expire {}{file}{confirm}",
                on.join(", "),
                t.size,
                dur(t.expire)
            )
        }
    }
}

/// The `feedback` line: what is polled, how often, and the weight function's settings.
fn feedback(fb: &FeedbackConfig) -> String {
    let what = match &fb.source {
        FeedbackSource::Puppet(p) => {
            let cert = if p.client_cert.is_some() {
                "with a client certificate"
            } else {
                "anonymous"
            };
            let queue = p
                .queue_limit
                .map_or(String::new(), |q| format!(", queue limit {q}"));
            format!("puppet {} ({cert}{queue})", p.path)
        }
        FeedbackSource::Agent(a) => format!("agent on port {}", a.port),
    };
    let sticky = if fb.saturated_sticky {
        ", saturated compilers' resumptions placed anew"
    } else {
        ""
    };
    format!(
        "{what} every {}; blackout {}, expiry {}, smoothing {}, floor {}%{sticky}",
        dur(fb.interval),
        dur(fb.blackout),
        dur(fb.expiry),
        dur(fb.smoothing),
        fb.floor_percent
    )
}

fn backends(f: &mut fmt::Formatter<'_>, backends: &[BackendConfig]) -> fmt::Result {
    writeln!(f, "  backends")?;
    let name_w = backends.iter().map(|b| b.name.len()).max().unwrap_or(0);
    let addr_w = backends
        .iter()
        .map(|b| b.address.to_string().len())
        .max()
        .unwrap_or(0);
    for b in backends {
        let mut flags = format!("weight {}", b.weight);
        if let Some(m) = b.max_connections {
            flags.push_str(&format!(", max {m}"));
        }
        if b.backup {
            flags.push_str(", backup");
        }
        if b.disabled {
            flags.push_str(", disabled");
        }
        if let Some(p) = b.proxy_protocol {
            flags.push_str(if p == ProxyProtocol::V1 {
                ", proxy v1"
            } else {
                ", proxy v2"
            });
        }
        writeln!(
            f,
            "    {:name_w$}  {:addr_w$}  {flags}; {}",
            b.name,
            b.address.to_string(),
            check(&b.health)
        )?;
    }
    Ok(())
}
