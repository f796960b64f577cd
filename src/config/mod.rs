//! Configuration: the typed, validated runtime model that the rest of crossbar uses.
//!
//! The YAML file is read into raw serde structs (`raw.rs`, `deny_unknown_fields`),
//! then `validate.rs` turns them into the types below, collecting every problem with
//! its `file:line:col` and YAML path. Nothing downstream holds an "Option that must
//! be Some": defaults are merged here.

mod address;
mod admin;
mod checker;
mod discover;
mod error;
mod feedback;
mod files;
mod health;
mod indent;
mod nearest;
mod own_address;
mod per_source;
mod position;
mod problems;
mod proxy_accept;
mod raw;
mod shared_listen;
pub mod state;
mod stick_rules;
mod summary;
mod validate;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use discover::{DiscoverConfig, DiscoverQuery, DiscoveredBackend};
pub use error::{ConfigError, Diagnostic};
pub(crate) use feedback::MAX_JRUBIES;
pub use feedback::{AgentFeedback, FeedbackConfig, FeedbackSource, PuppetFeedback};
pub(crate) use files::describe_file_type;
pub use nearest::nearest;
pub use own_address::{is_local_address, listen_addresses, own_address, OwnAddress};
pub use per_source::PerSource;
pub use proxy_accept::{IpNet, ProxyAccept};

/// Where `crossbar run`, `check` and `reload` look without `-c` (the Debian package's conffile).
pub const DEFAULT_CONFIG_PATH: &str = "/etc/crossbar/crossbar.yaml";
/// Default largest ClientHello we buffer; a hello with post-quantum key shares is ~2 KiB.
pub const DEFAULT_MAX_HELLO: usize = 16 * 1024;
/// Default listen backlog; Linux caps it at net.core.somaxconn anyway.
pub const DEFAULT_BACKLOG: u32 = 1024;
/// Default per-listener connection limit.
pub const DEFAULT_LISTENER_MAX_CONNECTIONS: usize = 10_000;
/// Default connect retries after the first attempt (HAProxy's `retries` default is 3).
pub const DEFAULT_RETRIES: u32 = 2;
/// Default number of connections that may wait for a full backend pool.
pub const DEFAULT_QUEUE_SIZE: usize = 1024;
/// Largest weight, configured (1..=256) or set at run time (0..=256): weights are
/// relative, 256 levels are plenty (HAProxy's range).
pub const MAX_WEIGHT: u32 = 256;
/// Default admin listen address (loopback only).
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:9140";

/// A whole, validated configuration file.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file this was read from (for messages and reloads).
    pub source: PathBuf,
    /// Worker threads of the runtime; `None` means one per core.
    pub workers: Option<usize>,
    /// `confirm_budget`: extra backend handshakes per second that placement
    /// confirmation may cost, all services together (default 100; 0 = none).
    pub confirm_budget: u32,
    /// The admin HTTP endpoint, if enabled.
    pub admin: Option<AdminConfig>,
    /// Services in file order.
    pub services: Vec<ServiceConfig>,
    /// The server-state file (`state_file:`): the operator's run-time state of every
    /// backend and its last known health, kept across restarts; `None`: not kept.
    pub state_file: Option<PathBuf>,
    /// What the file asks for that crossbar accepts but no longer does as written
    /// (a retired `relay: kernel`), each with its position: `crossbar check` prints
    /// them, `crossbar run` logs them at start and at every reload.
    pub warnings: Vec<Diagnostic>,
}

/// `admin:` — the HTTP endpoint for /metrics, /healthz and /api.
#[derive(Clone)]
pub struct AdminConfig {
    /// Address to bind; default 127.0.0.1:9140.
    pub listen: SocketAddr,
    /// File holding the bearer token needed for write operations.
    pub token_file: Option<PathBuf>,
    /// `allowed_hosts`: more names (or addresses) a request's `Host` may give
    /// besides the admin address and loopback (lowercase; IPs in canonical form).
    /// Others are refused as DNS rebinding; see docs/security.md.
    pub allowed_hosts: Vec<String>,
    /// `/healthz` fails while a service has no backend that takes new connections
    /// (HAProxy's `monitor fail if nbsrv lt 1`), so keepalived moves the VIP to a
    /// node that can serve; off by default.
    pub healthz_needs_backends: bool,
}

/// The URL a client on this host uses for an admin endpoint bound to `listen`
/// (a wildcard address is reached on loopback).
pub fn admin_url(listen: std::net::SocketAddr) -> String {
    let ip = match listen.ip() {
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => std::net::Ipv4Addr::LOCALHOST.into(),
        std::net::IpAddr::V6(ip) if ip.is_unspecified() => std::net::Ipv6Addr::LOCALHOST.into(),
        ip => ip,
    };
    format!("http://{}", std::net::SocketAddr::new(ip, listen.port()))
}

impl std::fmt::Debug for AdminConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminConfig")
            .field("listen", &self.listen)
            .field("token_file", &self.token_file.as_ref().map(|_| "MASKED"))
            .field("allowed_hosts", &self.allowed_hosts)
            .finish()
    }
}

/// Timeouts of one service (`defaults.timeouts` merged with the service's own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// How long a client may take to send its complete ClientHello (default 5s).
    pub client_hello: Duration,
    /// How long one connect attempt to a backend may take (default 3s).
    pub connect: Duration,
    /// `mode: tls`: how long a backend has to start answering the ClientHello once
    /// it is sent (default 5s, like `client_hello`); then it counts as failed and the
    /// next backend is tried, as after a refused connect. Not applied in `mode: tcp`,
    /// where a server may rightly wait for the client to speak first.
    pub server_hello: Duration,
    /// Close a connection after this long with no bytes either way (default 30m,
    /// longer than a big site's catalog compile).
    pub idle: Duration,
    /// How long a connection may wait for a backend slot when all are full (default 10s).
    pub queue: Duration,
    /// How long established connections may run on after shutdown/reload (default 30s).
    pub shutdown: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            client_hello: Duration::from_secs(5),
            connect: Duration::from_secs(3),
            server_hello: Duration::from_secs(5),
            idle: Duration::from_secs(30 * 60),
            queue: Duration::from_secs(10),
            shutdown: Duration::from_secs(30),
        }
    }
}

/// TCP keepalive on client and backend sockets: keeps NAT and firewall state of
/// connections that are silent for minutes (a long catalog compile) and finds dead
/// peers. On by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keepalive {
    /// Idle time before the first probe (default 5m).
    pub time: Duration,
    /// Time between probes (default 30s).
    pub interval: Duration,
    /// Unanswered probes before the connection is dropped (default 4).
    pub probes: u32,
}

impl Default for Keepalive {
    fn default() -> Self {
        Keepalive {
            time: Duration::from_secs(300),
            interval: Duration::from_secs(30),
            probes: 4,
        }
    }
}

/// Which active health check a backend gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckKind {
    /// No active check: the backend is always considered up (passive failures still count).
    None,
    /// A TCP connect.
    Tcp,
    /// Send a modern ClientHello and expect a ServerHello or a TLS alert.
    TlsHello,
    /// A real TLS handshake and an HTTP GET.
    Https(HttpsCheck),
}

/// Parameters of the `https` check (Puppet's documented load-balancer check).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpsCheck {
    /// Path to GET (default `/status/v1/simple`).
    pub path: String,
    /// Expected status (default 200).
    pub expect_status: u16,
    /// Expected body, compared whole after trimming whitespace (default `running`);
    /// `None` accepts any body.
    pub expect_body: Option<String>,
    /// CA bundle to verify the backend certificate; `None` skips verification.
    pub ca_file: Option<PathBuf>,
    /// Client certificate and key (PEM) to present.
    pub client_cert: Option<(PathBuf, PathBuf)>,
    /// Server name to send and verify (default: the service's first server name, else the backend host).
    pub server_name: Option<String>,
}

/// `health:` — active check settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthConfig {
    /// The check to run.
    pub check: CheckKind,
    /// Time between checks (default 2s); each run is jittered by up to 10%.
    pub interval: Duration,
    /// Time one check may take (default 1s).
    pub timeout: Duration,
    /// Consecutive successes that bring a down backend up (default 2).
    pub rise: u32,
    /// Consecutive failures that bring an up backend down (default 3).
    pub fall: u32,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            check: CheckKind::Tcp,
            interval: Duration::from_secs(2),
            timeout: Duration::from_secs(1),
            rise: 2,
            fall: 3,
        }
    }
}

/// `mode:` of a service (in the views too: `tls`, `tcp`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Read the ClientHello, route by SNI, stick on TLS session state (default).
    #[default]
    Tls,
    /// Plain layer 4: choose the backend at accept, no inspection.
    Tcp,
}

impl Mode {
    /// The YAML spelling and the name on the wire: `tls` or `tcp`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Tls => "tls",
            Mode::Tcp => "tcp",
        }
    }
}

/// `on_non_tls:` — what a `tls` service does with bytes that are not a TLS handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnNonTls {
    /// Close the connection (default).
    Reject,
    /// Forward to the service's pool without inspection.
    Forward,
}

/// `relay:` — how bytes move once the handshake has been seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RelayMode {
    /// Copy small messages, splice(2) bulk data (default).
    #[default]
    SpliceAuto,
    /// crossbar chooses: `SpliceAuto`, the only relay since the kernel (BPF
    /// sockmap) relay was retired (docs/performance.md). A retired `relay: kernel`
    /// is read as `SpliceAuto`, with a warning.
    Auto,
}

impl RelayMode {
    /// The YAML spelling.
    pub fn as_str(&self) -> &'static str {
        match self {
            RelayMode::SpliceAuto => "splice-auto",
            RelayMode::Auto => "auto",
        }
    }
}

/// `balance:` algorithm (in the views too: `roundrobin`, `leastconn`, `first`,
/// `source`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Balance {
    /// Smooth weighted round robin (default).
    #[default]
    RoundRobin,
    /// Fewest active connections relative to weight.
    LeastConn,
    /// The first available backend in config order (active/passive).
    First,
    /// Weighted rendezvous hash of the client address.
    Source,
}

impl Balance {
    /// The YAML spelling and the name on the wire: `roundrobin`, `leastconn`,
    /// `first`, `source`.
    pub fn as_str(self) -> &'static str {
        match self {
            Balance::RoundRobin => "roundrobin",
            Balance::LeastConn => "leastconn",
            Balance::First => "first",
            Balance::Source => "source",
        }
    }
}

/// `on_marked_down:` — what a backend's health checks marking it down does to the
/// connections it has open (HAProxy's `on-marked-down`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OnMarkedDown {
    /// They go on (the default: a failed check may be the check's own problem).
    #[default]
    Nothing,
    /// They are closed (`shutdown-sessions`), for a backend down for good.
    ShutdownSessions,
}

/// `failback:` — what happens when a primary comes back after a failover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failback {
    /// Stay on the standby until the operator enables the primary.
    Manual,
    /// Return to the primary once it has passed `rise` checks.
    Auto,
}

/// One stick key kind, in `stick.on` priority order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StickOn {
    /// TLS <= 1.2 session ID assigned by the server.
    SessionId,
    /// RFC 5077 session ticket (and its key-name prefix).
    Ticket,
    /// TLS 1.3 pre_shared_key identity (and its key-name prefix).
    Psk,
    /// The client's source address (optionally masked to a prefix).
    Source,
}

/// `stick:` — stick table settings of a service.
#[derive(Debug, Clone, PartialEq)]
pub struct StickConfig {
    /// Key kinds to look up, in priority order.
    pub on: Vec<StickOn>,
    /// Maximum entries; least recently used are evicted beyond it (default 100000).
    pub size: usize,
    /// Entries unused for this long expire (default 30m).
    pub expire: Duration,
    /// Expiry of source entries (default: the same as `expire`).
    pub source_expire: Duration,
    /// Prefix length that groups IPv4 sources (default 32).
    pub source_prefix_v4: u8,
    /// Prefix length that groups IPv6 sources (default 64).
    pub source_prefix_v6: u8,
    /// Bytes at the front of a ticket that name the issuer's key (default 16; 0 disables).
    pub ticket_prefix: usize,
    /// Where the table is saved across restarts.
    pub state_file: Option<PathBuf>,
    /// How often the table is saved when `state_file` is set (default 60s).
    pub save_interval: Duration,
    /// How often crossbar asks each backend for session tickets to learn its
    /// ticket-key name (`tls` mode with `ticket` or `psk`); `None` (`0s`) disables.
    pub probe_interval: Option<Duration>,
    /// Confirm an uncertain placement of a resumption by offering the ClientHello to
    /// further backends until one resumes it (`tls` mode; default on).
    pub confirm: bool,
    /// Most backends one ClientHello is offered to, the first included (default:
    /// every primary backend, at most 4).
    pub confirm_tries: usize,
}

/// `proxy_protocol:` version sent to a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyProtocol {
    /// Human-readable v1 line.
    V1,
    /// Binary v2 header.
    V2,
}

/// One listen address of a service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenConfig {
    /// The socket address to bind.
    pub addr: SocketAddr,
    /// listen(2) backlog.
    pub backlog: u32,
    /// IP_FREEBIND: bind an address not (yet) on an interface (keepalived VIP).
    pub freebind: bool,
    /// Concurrent connections accepted on this address; more are refused.
    pub max_connections: usize,
    /// PROXY headers read from the tiers in front (`None`: from nobody).
    pub proxy_protocol: Option<ProxyAccept>,
    /// Per-source admission limits (`None`: off, the default).
    pub per_source: Option<PerSource>,
}

/// Where a backend lives: a host name (resolved at each connect) or an IP.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BackendAddress {
    /// Host name or IP literal (without brackets).
    pub host: String,
    /// TCP port.
    pub port: u16,
}

impl BackendAddress {
    /// The address as an IP socket address when `host` is an IP literal.
    pub fn as_socket_addr(&self) -> Option<SocketAddr> {
        self.host
            .parse::<std::net::IpAddr>()
            .ok()
            .map(|ip| SocketAddr::new(ip, self.port))
    }
}

impl std::fmt::Display for BackendAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// One backend of a service.
#[derive(Debug, Clone, PartialEq)]
pub struct BackendConfig {
    /// Unique name within the service (used in metrics, logs, stick tables and the API).
    pub name: String,
    /// Where to connect.
    pub address: BackendAddress,
    /// Relative weight, 1..=256 (default 1).
    pub weight: u32,
    /// Serve only when no primary backend is available.
    pub backup: bool,
    /// Concurrent connections this backend takes; more wait in the service queue.
    pub max_connections: Option<u32>,
    /// PROXY protocol header sent before the client's bytes.
    pub proxy_protocol: Option<ProxyProtocol>,
    /// The backend's health settings (service/defaults merged with its own).
    pub health: HealthConfig,
    /// Start in the disabled (maintenance) state.
    pub disabled: bool,
    /// The DNS name (`discover:`) this backend was found under; `None`: the file.
    pub from_dns: Option<String>,
    /// Found in DNS, and no longer in the answer: it stays in the pool, taking new
    /// connections only while no backend DNS still lists can (make before break),
    /// and leaves once drained and idle.
    pub left_dns: bool,
    /// The local address connections to it are made from, its own `source:`
    /// (over the service's [`ServiceConfig::source`]; neither: the system's choice).
    pub source: Option<std::net::IpAddr>,
}

impl BackendConfig {
    /// Backend `name` at `address` with every other setting at its default: weight
    /// 1, no backup, no limit, no PROXY header, the default health settings, in
    /// rotation, from the file.
    pub fn new(name: &str, address: BackendAddress) -> BackendConfig {
        BackendConfig {
            name: name.into(),
            address,
            weight: 1,
            backup: false,
            max_connections: None,
            proxy_protocol: None,
            health: HealthConfig::default(),
            disabled: false,
            from_dns: None,
            left_dns: false,
            source: None,
        }
    }
}

/// One service: listeners, routing names, algorithm, stickiness and backends.
#[derive(Debug, Clone, PartialEq)]
pub struct ServiceConfig {
    /// The service name (the key under `services:`).
    pub name: String,
    /// Addresses this service accepts on.
    pub listen: Vec<ListenConfig>,
    /// `tls` (inspect the hello) or `tcp`.
    pub mode: Mode,
    /// What to do with non-TLS bytes in `tls` mode.
    pub on_non_tls: OnNonTls,
    /// SNI names (lower case, no trailing dot; `*.suffix` wildcards) for shared listeners.
    pub server_names: Vec<String>,
    /// More names agents dial for this service (VIP names in DNS, not used for
    /// routing): `crossbar doctor` checks that every backend's certificate carries
    /// them, together with the exact `server_names`.
    pub names: Vec<String>,
    /// The service chosen on a shared listener when no server name matches.
    pub default: bool,
    /// The balance algorithm.
    pub balance: Balance,
    /// Failback policy (default manual for `first`, auto otherwise).
    pub failback: Failback,
    /// Stick table settings; `None` disables stickiness.
    pub stick: Option<StickConfig>,
    /// Backends in config order: the file's, then those found by `discover`
    /// (added by the running server, see `crate::discovery`).
    pub backends: Vec<BackendConfig>,
    /// Backends found in DNS, re-resolved on the records' TTL.
    pub discover: Option<DiscoverConfig>,
    /// Load feedback that scales the backends' weights (`None`: off, the default).
    pub feedback: Option<FeedbackConfig>,
    /// Timeouts.
    pub timeouts: Timeouts,
    /// TCP keepalive on client and backend sockets; `None` disables.
    pub keepalive: Option<Keepalive>,
    /// Largest ClientHello accepted (default 16 KiB).
    pub max_hello_size: usize,
    /// Connect retries to other backends after a failed attempt.
    pub retries: u32,
    /// Connections that may wait when every backend is full.
    pub queue_size: usize,
    /// How bytes are relayed (default `splice-auto`).
    pub relay: RelayMode,
    /// A recovered backend's weight ramps up over this period (zero: off).
    pub slow_start: Duration,
    /// What marking a backend down does to its open connections.
    pub on_marked_down: OnMarkedDown,
    /// The local address connections to its backends are made from (`source:`;
    /// a backend's own wins; `None`: the system's choice).
    pub source: Option<std::net::IpAddr>,
}

impl Config {
    /// Read and validate a configuration file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::io(path, e))?;
        Config::from_str_at(&text, path)
    }

    /// Read and validate a configuration file and open every file it names (token
    /// file, certificates, state-file directories) as `crossbar check` does; the
    /// problems of both, in file order.
    pub fn load_and_check_files(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::io(path, e))?;
        let config = Config::from_str_at(&text, path);
        match (config, files::check(&text, path)) {
            (Ok(config), Ok(())) => Ok(config),
            (config, files) => {
                let mut diagnostics = config.err().map(|e| e.diagnostics).unwrap_or_default();
                diagnostics.extend(files.err().map(|e| e.diagnostics).unwrap_or_default());
                diagnostics.sort_by_key(|d| d.position.unwrap_or((usize::MAX, usize::MAX)));
                Err(ConfigError { diagnostics })
            }
        }
    }

    /// Validate configuration text; `path` is used in messages only.
    pub fn from_str_at(text: &str, path: &Path) -> Result<Config, ConfigError> {
        // Syntax errors and unknown keys that are indentation mistakes are
        // explained (indent.rs) before the checks run (validate.rs).
        indent::analyse(text, path, true).into_result()
    }

    /// Log each of [`Config::warnings`] (at start and at every reload).
    pub fn log_warnings(&self) {
        for w in &self.warnings {
            tracing::warn!("{w}");
        }
    }

    /// Look up a service by name.
    pub fn service(&self, name: &str) -> Option<&ServiceConfig> {
        self.services.iter().find(|s| s.name == name)
    }
}
