//! Raw model -> validated `Config`: merge defaults, check every rule, collect every problem.
//!
//! One pass finds everything but what follows a YAML syntax error: keys written
//! twice, type and unknown-key problems (each offending node removed, so serde
//! goes on), then the [`Checker`] walks what is left completely, pushing a
//! [`Diagnostic`] (YAML path and line:col from the [`PositionIndex`]) for each
//! problem and carrying on with a fallback value, so one run of `crossbar check`
//! lists everything. `indent.rs` explains syntax errors and unknown keys that
//! are indentation mistakes, running this pass on its candidate fixes.
use std::collections::HashMap;
use std::net::SocketAddr;

use super::address::{
    parse_backend_address, parse_socket_addr, server_name, valid_backend_name, valid_name,
    BACKEND_NAME_RULE,
};
use super::checker::{join, Checker};
use super::health::Health;
use super::position::PositionIndex;
use super::raw::*;
use super::*;

/// Default `confirm_budget`: extra backend handshakes per second for confirming
/// placements. A resumption costs at most `confirm_tries - 1` of them, once per
/// session; 100/s is ~0.1-0.3 of a core spread over the backends.
const DEFAULT_CONFIRM_BUDGET: u64 = 100;
/// Largest `confirm_budget`; more extra handshakes per second than this is a typo.
const MAX_CONFIRM_BUDGET: u64 = 1_000_000;
/// Largest `workers`; more threads than this is a typo, not a machine.
const MAX_WORKERS: u64 = 1024;
/// Smallest `max_hello_size`: below this even a minimal ClientHello with SNI may not fit.
const MIN_HELLO: u64 = 512;
/// Largest `max_hello_size`: a TLS handshake message is capped at 2^24, but no real hello nears 1 MiB.
const MAX_HELLO: u64 = 1024 * 1024;
/// Largest `retries`: past this a down pool only multiplies the wait.
const MAX_RETRIES: u64 = 10;
/// Keepalive probes: Linux caps TCP_KEEPCNT at 127.
const MAX_KEEPALIVE_PROBES: u64 = 127;
/// Largest `queue_size`; every queued connection holds a socket.
const MAX_QUEUE: u64 = 1_000_000;
/// Largest backlog: listen(2) takes an int.
const MAX_BACKLOG: u64 = i32::MAX as u64;
/// The warning for a retired `relay: kernel`.
const RELAY_KERNEL_RETIRED: &str = "warning: `kernel` was retired (the BPF sockmap relay: \
     more CPU than splice, and the kernel could deliver a segment twice; \
     docs/performance.md); using splice-auto: write `relay: splice-auto` or remove the line";
/// Largest backend weight (shared with the run-time weight).
const MAX_WEIGHT: u64 = super::MAX_WEIGHT as u64;

/// Everything one pass over a file's text finds.
pub(super) struct Analysis {
    /// The configuration, when nothing was wrong.
    pub(super) config: Option<Config>,
    /// The problems, in file order.
    pub(super) diagnostics: Vec<Diagnostic>,
    /// The YAML parser stopped at a syntax error: nothing after it was checked.
    pub(super) syntax_error: bool,
}

impl Analysis {
    pub(super) fn into_result(self) -> Result<Config, ConfigError> {
        match self.config {
            Some(c) if self.diagnostics.is_empty() => Ok(c),
            _ => Err(ConfigError {
                diagnostics: self.diagnostics,
            }),
        }
    }

    fn failed(diagnostics: Vec<Diagnostic>) -> Analysis {
        Analysis {
            config: None,
            diagnostics,
            syntax_error: false,
        }
    }
}

/// Duplicate keys, type and unknown-key problems, then validation of what is
/// left, all in one pass. A syntax error (or tabs) stops it: the YAML parser
/// cannot go on after one; the caller looks for an indentation mistake then.
pub(super) fn analyse_syntax_ok(text: &str, file: &Path) -> Analysis {
    if let Err(e) = super::problems::tabs_check(text, file) {
        return Analysis::failed(e.diagnostics);
    }
    // Plain YAML first: a malformed or hostile file (deep nesting, alias bombs)
    // fails there, once, before the position index or the schema walk it.
    if let Err(e) = super::problems::syntax_check(text, file) {
        return Analysis {
            syntax_error: true,
            ..Analysis::failed(e.diagnostics)
        };
    }
    let index = PositionIndex::build(text);
    let mut diagnostics = super::problems::duplicates(file, &index);
    let first = match diagnostics.is_empty() {
        true => serde_yaml::from_str::<RawConfig>(text),
        false => Err(serde::de::Error::custom("duplicate keys")),
    };
    let (raw, removed) = match first {
        Ok(raw) => (Some(raw), Vec::new()),
        Err(first) => {
            let Some(doc) = super::problems::tolerant_value(text, &index) else {
                if diagnostics.is_empty() {
                    diagnostics.push(super::problems::syntax(&first, file));
                }
                return Analysis::failed(diagnostics);
            };
            let first_text = diagnostics.is_empty().then(|| first.to_string());
            let found = super::problems::deserialize(doc, first_text, file, &index);
            if found.raw.is_none() && found.diagnostics.is_empty() && diagnostics.is_empty() {
                diagnostics.push(super::problems::syntax(&first, file));
            }
            diagnostics.extend(found.diagnostics);
            (found.raw, found.removed)
        }
    };
    let Some(raw) = raw else {
        return Analysis::failed(sorted(diagnostics));
    };
    // A removed list item shifts the indices after it: validation's paths would
    // point at the wrong items, so it waits for the next run.
    if removed.iter().any(|(p, _)| p.ends_with(']')) {
        return Analysis::failed(sorted(diagnostics));
    }
    let mut checker = Checker {
        file,
        index,
        diagnostics: Vec::new(),
        warnings: Vec::new(),
    };
    let mut config = checker.config(&raw);
    config.warnings = checker.warnings;
    diagnostics.extend(
        checker
            .diagnostics
            .into_iter()
            .filter(|d| !caused_by_removal(d, &removed)),
    );
    Analysis {
        config: Some(config),
        diagnostics: sorted(diagnostics),
        syntax_error: false,
    }
}

/// A validation problem that only exists because a node already reported was
/// removed: at or under it, at its parent (a mapping left empty, a key missing),
/// or at the key its "did you mean" named.
fn caused_by_removal(d: &Diagnostic, removed: &[(String, String)]) -> bool {
    let Some(path) = &d.path else { return false };
    removed.iter().any(|(r, message)| {
        let under =
            path == r || path.starts_with(&format!("{r}.")) || path.starts_with(&format!("{r}["));
        let cut = r.rfind(['.', '[']).unwrap_or(0);
        let parent = &r[..cut];
        let meant = message
            .split_once("did you mean `")
            .and_then(|(_, rest)| rest.split_once('`'))
            .map(|(k, _)| {
                if parent.is_empty() {
                    k.to_string()
                } else {
                    format!("{parent}.{k}")
                }
            });
        under || path == parent || meant.as_deref() == Some(path.as_str())
    })
}

/// Sorted by position; anything without one goes last. The sort is stable.
fn sorted(mut diagnostics: Vec<Diagnostic>) -> Vec<Diagnostic> {
    diagnostics.sort_by_key(|d| d.position.unwrap_or((usize::MAX, usize::MAX)));
    diagnostics.dedup();
    diagnostics
}

/// Service-level settings that `defaults:` provides and a service may override.
#[derive(Debug, Clone)]
struct Tuning {
    timeouts: Timeouts,
    keepalive: Option<Keepalive>,
    health: Health,
    max_hello_size: usize,
    retries: u32,
    queue_size: usize,
    slow_start: Duration,
    relay: RelayMode,
}

/// Listener settings from `defaults:`.
#[derive(Debug, Clone, Copy)]
struct ListenDefaults {
    backlog: u32,
    max_connections: usize,
}

impl Checker<'_> {
    fn config(&mut self, raw: &RawConfig) -> Config {
        let workers = raw
            .workers
            .map(|w| self.int(Some(w), "workers", 1, 1, MAX_WORKERS) as usize);
        let confirm_budget = self.int(
            raw.confirm_budget,
            "confirm_budget",
            DEFAULT_CONFIRM_BUDGET,
            0,
            MAX_CONFIRM_BUDGET,
        ) as u32;
        let admin = self.admin(raw.admin.as_ref());
        let empty = RawDefaults::default();
        let defaults = raw.defaults.as_ref().unwrap_or(&empty);
        let (tuning, listen) = self.defaults(defaults);
        let services = self.services(raw.services.as_ref(), &tuning, listen);
        Config {
            source: self.file.to_path_buf(),
            workers,
            confirm_budget,
            admin,
            services,
            state_file: raw.state_file.clone(),
            warnings: Vec::new(),
        }
    }

    /// An IP socket address for binding, with a hint for the usual mistakes.
    pub(super) fn socket_addr(&mut self, s: &str, path: &str) -> Option<SocketAddr> {
        match parse_socket_addr(s) {
            Ok(a) => Some(a),
            Err(why) => {
                self.err(path, format!("`{s}` is not a listen address: {why}"));
                None
            }
        }
    }

    fn defaults(&mut self, raw: &RawDefaults) -> (Tuning, ListenDefaults) {
        let builtin = Tuning {
            timeouts: Timeouts::default(),
            keepalive: Some(Keepalive::default()),
            health: Health::default(),
            max_hello_size: DEFAULT_MAX_HELLO,
            retries: DEFAULT_RETRIES,
            queue_size: DEFAULT_QUEUE_SIZE,
            slow_start: Duration::ZERO,
            relay: RelayMode::SpliceAuto,
        };
        let layer = TuningLayer {
            timeouts: raw.timeouts.as_ref(),
            keepalive: raw.keepalive.as_ref(),
            health: raw.health.as_ref(),
            max_hello_size: raw.max_hello_size,
            retries: raw.retries,
            queue_size: raw.queue_size,
            slow_start: raw.slow_start.as_ref(),
            relay: raw.relay,
        };
        let tuning = self.tuning(&builtin, &layer, "defaults");
        let backlog = self.int(
            raw.backlog,
            "defaults.backlog",
            DEFAULT_BACKLOG.into(),
            1,
            MAX_BACKLOG,
        );
        let max_conn = self.int(
            raw.max_connections,
            "defaults.max_connections",
            DEFAULT_LISTENER_MAX_CONNECTIONS as u64,
            1,
            u64::MAX,
        );
        let listen = ListenDefaults {
            backlog: backlog as u32,
            max_connections: usize::try_from(max_conn).unwrap_or(usize::MAX),
        };
        (tuning, listen)
    }

    /// Apply one level (defaults or a service) of tuning over `base`.
    fn tuning(&mut self, base: &Tuning, raw: &TuningLayer<'_>, p: &str) -> Tuning {
        let hello = self.int(
            raw.max_hello_size,
            &join(p, "max_hello_size"),
            base.max_hello_size as u64,
            MIN_HELLO,
            MAX_HELLO,
        );
        let retries = self.int(
            raw.retries,
            &join(p, "retries"),
            base.retries.into(),
            0,
            MAX_RETRIES,
        );
        let queue = self.int(
            raw.queue_size,
            &join(p, "queue_size"),
            base.queue_size as u64,
            0,
            MAX_QUEUE,
        );
        let slow_start = self.duration(
            raw.slow_start,
            &join(p, "slow_start"),
            base.slow_start,
            false,
        );
        Tuning {
            timeouts: self.timeouts(&base.timeouts, raw.timeouts, &join(p, "timeouts")),
            keepalive: self.keepalive(base.keepalive, raw.keepalive, &join(p, "keepalive")),
            health: self.health(&base.health, raw.health, &join(p, "health")),
            max_hello_size: hello as usize,
            retries: retries as u32,
            queue_size: queue as usize,
            slow_start,
            relay: self.relay(base.relay, raw.relay, &join(p, "relay")),
        }
    }

    /// `relay:` over `base`. The retired `kernel` is read as `splice-auto` with a
    /// warning, not refused: a config that named it must keep starting and
    /// reloading after an upgrade (docs/configuration.md).
    fn relay(&mut self, base: RelayMode, raw: Option<RawRelay>, path: &str) -> RelayMode {
        match raw {
            None => base,
            Some(RawRelay::SpliceAuto) => RelayMode::SpliceAuto,
            Some(RawRelay::Auto) => RelayMode::Auto,
            Some(RawRelay::Kernel) => {
                self.warn(path, RELAY_KERNEL_RETIRED);
                RelayMode::SpliceAuto
            }
        }
    }

    /// `keepalive:` over `base` (`None` = off), field by field.
    fn keepalive(
        &mut self,
        base: Option<Keepalive>,
        raw: Option<&RawKeepalive>,
        p: &str,
    ) -> Option<Keepalive> {
        let Some(raw) = raw else { return base };
        let start = base.unwrap_or_default();
        let time = self.duration(raw.time.as_ref(), &join(p, "time"), start.time, true);
        let interval = self.duration(
            raw.interval.as_ref(),
            &join(p, "interval"),
            start.interval,
            true,
        );
        let probes = self.int(
            raw.probes,
            &join(p, "probes"),
            start.probes.into(),
            1,
            MAX_KEEPALIVE_PROBES,
        );
        let enabled = raw.enabled.unwrap_or(base.is_some());
        enabled.then_some(Keepalive {
            time,
            interval,
            probes: probes as u32,
        })
    }

    fn timeouts(&mut self, base: &Timeouts, raw: Option<&RawTimeouts>, p: &str) -> Timeouts {
        let Some(raw) = raw else { return *base };
        let mut d = |v: &Option<RawDuration>, key: &str, base: Duration| {
            self.duration(v.as_ref(), &join(p, key), base, true)
        };
        Timeouts {
            client_hello: d(&raw.client_hello, "client_hello", base.client_hello),
            connect: d(&raw.connect, "connect", base.connect),
            server_hello: d(&raw.server_hello, "server_hello", base.server_hello),
            idle: d(&raw.idle, "idle", base.idle),
            queue: d(&raw.queue, "queue", base.queue),
            shutdown: d(&raw.shutdown, "shutdown", base.shutdown),
        }
    }

    fn services(
        &mut self,
        raw: Option<&RawServices>,
        tuning: &Tuning,
        listen: ListenDefaults,
    ) -> Vec<ServiceConfig> {
        let list = raw.map(|s| s.0.as_slice()).unwrap_or_default();
        if list.is_empty() {
            self.err(
                "services",
                "no services: define at least one under `services:`",
            );
            return Vec::new();
        }
        let mut seen: HashMap<&str, usize> = HashMap::new();
        let mut services = Vec::new();
        for (name, svc) in list {
            let n = seen.entry(name).or_default();
            let p = format!("services.{name}");
            if *n > 0 {
                let pos = self.index.key_at(&p, *n);
                self.err_at(&p, pos, format!("service `{name}` is defined twice"));
            }
            *n += 1;
            services.push(self.service(name, svc, tuning, listen));
        }
        self.shared_listeners(&mut services, list);
        self.state_files(&services);
        self.own_addresses(&services);
        services
    }

    fn service(
        &mut self,
        name: &str,
        raw: &RawService,
        base: &Tuning,
        listen: ListenDefaults,
    ) -> ServiceConfig {
        let p = format!("services.{name}");
        if !valid_name(name) {
            let why = "may only use letters, digits, `_` and `-` (it names metrics and URLs)";
            self.err(&p, format!("service name `{name}` {why}"));
        }
        let mode = match raw.mode {
            Some(RawMode::Tcp) => Mode::Tcp,
            _ => Mode::Tls,
        };
        if mode == Mode::Tcp && raw.on_non_tls.is_some() {
            self.err(&join(&p, "on_non_tls"), "applies only to `mode: tls`");
        }
        let (balance, failback) = balance_of(raw);
        let layer = TuningLayer {
            timeouts: raw.timeouts.as_ref(),
            keepalive: raw.keepalive.as_ref(),
            health: raw.health.as_ref(),
            max_hello_size: raw.max_hello_size,
            retries: raw.retries,
            queue_size: raw.queue_size,
            slow_start: raw.slow_start.as_ref(),
            relay: raw.relay,
        };
        let tuning = self.tuning(base, &layer, &p);
        ServiceConfig {
            name: name.to_string(),
            listen: self.listeners(&raw.listen, listen, &p),
            mode,
            on_non_tls: match raw.on_non_tls {
                Some(RawOnNonTls::Forward) => OnNonTls::Forward,
                _ => OnNonTls::Reject,
            },
            server_names: self.server_names(raw.server_names.as_deref(), mode, &p),
            names: self.dialed_names(raw.names.as_deref(), &p),
            default: raw.default.unwrap_or(false),
            balance,
            failback,
            stick: self.stick(raw.stick.as_ref(), mode, primaries(raw), &join(&p, "stick")),
            backends: self.backends(&raw.backends, raw.discover.is_some(), &tuning.health, &p),
            discover: raw
                .discover
                .as_ref()
                .and_then(|d| self.discover(d, &tuning.health, &join(&p, "discover"))),
            feedback: raw
                .feedback
                .as_ref()
                .and_then(|f| self.feedback(f, &join(&p, "feedback"))),
            timeouts: tuning.timeouts,
            keepalive: tuning.keepalive,
            max_hello_size: tuning.max_hello_size,
            retries: tuning.retries,
            queue_size: tuning.queue_size,
            slow_start: tuning.slow_start,
            relay: tuning.relay,
            on_marked_down: match raw.on_marked_down {
                Some(RawOnMarkedDown::ShutdownSessions) => OnMarkedDown::ShutdownSessions,
                None | Some(RawOnMarkedDown::None) => OnMarkedDown::Nothing,
            },
            source: raw
                .source
                .as_deref()
                .and_then(|a| self.source_addr(a, &join(&p, "source"))),
        }
    }

    /// `source:`: an IP address to bind before connecting to a backend.
    pub(super) fn source_addr(&mut self, s: &str, path: &str) -> Option<std::net::IpAddr> {
        match s.parse::<std::net::IpAddr>() {
            Ok(ip) => Some(ip.to_canonical()),
            Err(_) => {
                let msg = format!(
                    "`{s}` is not an IP address (the local address connections to backends \
                     are made from, e.g. 10.0.1.250)"
                );
                self.err(path, msg);
                None
            }
        }
    }

    fn listeners(&mut self, raw: &[RawListen], d: ListenDefaults, p: &str) -> Vec<ListenConfig> {
        let lp = join(p, "listen");
        if raw.is_empty() {
            self.err(
                &lp,
                "no listen address: give at least one, e.g. \"10.0.0.10:8140\"",
            );
        }
        let mut out: Vec<ListenConfig> = Vec::new();
        for (i, item) in raw.iter().enumerate() {
            let ip = format!("{lp}[{i}]");
            let (addr, path) = match item {
                RawListen::Short(a) => (a, ip.clone()),
                RawListen::Long(l) => (&l.address, join(&ip, "address")),
            };
            let Some(addr) = self.socket_addr(addr, &path) else {
                continue;
            };
            let mut lc = ListenConfig {
                addr,
                backlog: d.backlog,
                freebind: false,
                max_connections: d.max_connections,
                proxy_protocol: None,
                per_source: None,
            };
            if let RawListen::Long(l) = item {
                lc.backlog = self.int(
                    l.backlog,
                    &join(&ip, "backlog"),
                    d.backlog.into(),
                    1,
                    MAX_BACKLOG,
                ) as u32;
                let max = self.int(
                    l.max_connections,
                    &join(&ip, "max_connections"),
                    lc.max_connections as u64,
                    1,
                    u64::MAX,
                );
                lc.max_connections = usize::try_from(max).unwrap_or(usize::MAX);
                lc.freebind = l.freebind.unwrap_or(false);
                if let Some(pp) = &l.proxy_protocol {
                    lc.proxy_protocol = self.proxy_accept(pp, &join(&ip, "proxy_protocol"));
                }
                if let Some(ps) = &l.per_source {
                    lc.per_source = self.per_source(ps, &join(&ip, "per_source"));
                }
            }
            // Port 0 asks the kernel for a free port: each is a listener of its own.
            if addr.port() != 0 && out.iter().any(|o| o.addr == addr) {
                self.err(&path, format!("{addr} is listed twice in this service"));
                continue;
            }
            out.push(lc);
        }
        out
    }

    fn server_names(&mut self, raw: Option<&[String]>, mode: Mode, p: &str) -> Vec<String> {
        let Some(raw) = raw else { return Vec::new() };
        let sp = join(p, "server_names");
        if mode == Mode::Tcp && !raw.is_empty() {
            self.err(
                &sp,
                "`mode: tcp` reads no ClientHello, so it cannot route by server name",
            );
        }
        let mut out: Vec<String> = Vec::new();
        for (i, name) in raw.iter().enumerate() {
            let ip = format!("{sp}[{i}]");
            match server_name(name) {
                Ok(n) if out.contains(&n) => self.err(&ip, format!("`{n}` is listed twice")),
                Ok(n) => out.push(n),
                Err(why) => self.err(&ip, why),
            }
        }
        out
    }

    /// `names:` — host names agents dial for this service (checked by `crossbar doctor`).
    fn dialed_names(&mut self, raw: Option<&[String]>, p: &str) -> Vec<String> {
        let Some(raw) = raw else { return Vec::new() };
        let np = join(p, "names");
        let mut out: Vec<String> = Vec::new();
        for (i, name) in raw.iter().enumerate() {
            let ip = format!("{np}[{i}]");
            // Agents configured by address check the certificate's IP SANs instead.
            let parsed = match name.parse::<std::net::IpAddr>() {
                Ok(addr) => Ok(addr.to_string()),
                Err(_) => server_name(name),
            };
            match parsed {
                Ok(n) if n.starts_with('*') => self.err(
                    &ip,
                    format!("`{n}`: agents dial a host name, not a wildcard"),
                ),
                Ok(n) if out.contains(&n) => self.err(&ip, format!("`{n}` is listed twice")),
                Ok(n) => out.push(n),
                Err(why) => self.err(&ip, why),
            }
        }
        out
    }

    fn backends(
        &mut self,
        raw: &[RawBackend],
        discover: bool,
        health: &Health,
        p: &str,
    ) -> Vec<BackendConfig> {
        let bp = join(p, "backends");
        if raw.is_empty() && !discover {
            self.err(&bp, "no backends: a service needs at least one");
            return Vec::new();
        }
        if !discover && raw.iter().all(|b| b.backup == Some(true)) {
            self.err(
                &bp,
                "every backend is `backup: true`: at least one must be a primary",
            );
        }
        let mut names: HashMap<&str, usize> = HashMap::new();
        let mut out = Vec::new();
        for (i, b) in raw.iter().enumerate() {
            let ip = format!("{bp}[{i}]");
            if let Some(first) = names.insert(&b.name, i) {
                let msg = format!(
                    "backend name `{}` is already used by backends[{first}]",
                    b.name
                );
                self.err(&join(&ip, "name"), msg);
                names.insert(&b.name, first);
            }
            if let Some(bc) = self.backend(b, health, &ip) {
                out.push(bc);
            }
        }
        out
    }

    fn backend(&mut self, raw: &RawBackend, health: &Health, p: &str) -> Option<BackendConfig> {
        if !valid_backend_name(&raw.name) {
            self.err(
                &join(p, "name"),
                format!("backend name `{}` {BACKEND_NAME_RULE}", raw.name),
            );
        }
        let weight = self.int(raw.weight, &join(p, "weight"), 1, 1, MAX_WEIGHT) as u32;
        let max = raw
            .max_connections
            .map(|m| self.int(Some(m), &join(p, "max_connections"), 1, 1, u32::MAX.into()) as u32);
        let health = self.health(health, raw.health.as_ref(), &join(p, "health"));
        let address = match parse_backend_address(&raw.address) {
            Ok(a) => a,
            Err(why) => {
                let msg = format!("`{}` is not a backend address: {why}", raw.address);
                self.err(&join(p, "address"), msg);
                return None;
            }
        };
        Some(BackendConfig {
            name: raw.name.clone(),
            address,
            weight,
            backup: raw.backup.unwrap_or(false),
            max_connections: max,
            proxy_protocol: raw.proxy_protocol.map(super::discover::proxy_protocol),
            health: health.to_config(),
            disabled: raw.disabled.unwrap_or(false),
            from_dns: None,
            left_dns: false,
            source: raw
                .source
                .as_deref()
                .and_then(|a| self.source_addr(a, &join(p, "source"))),
        })
    }
}

/// The settings one level (defaults or a service) may write.
struct TuningLayer<'a> {
    timeouts: Option<&'a RawTimeouts>,
    keepalive: Option<&'a RawKeepalive>,
    health: Option<&'a RawHealth>,
    max_hello_size: Option<u64>,
    retries: Option<u64>,
    queue_size: Option<u64>,
    slow_start: Option<&'a RawDuration>,
    relay: Option<RawRelay>,
}

/// A service's balance algorithm and failback (`first` fails back by hand unless
/// told otherwise; every other algorithm at once).
fn balance_of(raw: &RawService) -> (Balance, Failback) {
    let balance = match raw.balance {
        None | Some(RawBalance::RoundRobin) => Balance::RoundRobin,
        Some(RawBalance::LeastConn) => Balance::LeastConn,
        Some(RawBalance::First) => Balance::First,
        Some(RawBalance::Source) => Balance::Source,
    };
    let failback = match (raw.failback, balance) {
        (Some(RawFailback::Manual), _) | (None, Balance::First) => Failback::Manual,
        _ => Failback::Auto,
    };
    (balance, failback)
}

/// How many primary (non-backup) backends a service has, for its confirmation
/// tries; discovered primaries are not known yet: as many tries as allowed.
fn primaries(raw: &RawService) -> usize {
    if raw.discover.is_some() {
        return usize::MAX;
    }
    raw.backends
        .iter()
        .filter(|b| b.backup != Some(true))
        .count()
}
