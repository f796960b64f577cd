//! Health blocks: merging defaults -> service -> backend and the `https` check's rules.
use super::address::server_name;
use super::checker::{join, Checker};
use super::raw::{RawCheck, RawHealth};
use super::*;

/// Largest rise/fall: 1000 checks at the default 2s interval is over half an hour.
const MAX_RISE_FALL: u64 = 1000;
/// Default https check.
const DEFAULT_CHECK_PATH: &str = "/status/v1/simple";
const DEFAULT_EXPECT_STATUS: u64 = 200;
const DEFAULT_EXPECT_BODY: &str = "running";

/// A health block merged so far (defaults -> service -> backend), https options included.
#[derive(Debug, Clone)]
pub(super) struct Health {
    check: RawCheck,
    interval: Duration,
    timeout: Duration,
    rise: u32,
    fall: u32,
    path: String,
    expect_status: u16,
    expect_body: Option<String>,
    ca_file: Option<PathBuf>,
    client_cert: Option<PathBuf>,
    client_key: Option<PathBuf>,
    server_name: Option<String>,
}

impl Default for Health {
    fn default() -> Self {
        let d = HealthConfig::default();
        Health {
            check: RawCheck::Tcp,
            interval: d.interval,
            timeout: d.timeout,
            rise: d.rise,
            fall: d.fall,
            path: DEFAULT_CHECK_PATH.into(),
            expect_status: DEFAULT_EXPECT_STATUS as u16,
            expect_body: Some(DEFAULT_EXPECT_BODY.into()),
            ca_file: None,
            client_cert: None,
            client_key: None,
            server_name: None,
        }
    }
}

impl Health {
    pub(super) fn to_config(&self) -> HealthConfig {
        let check = match self.check {
            RawCheck::None => CheckKind::None,
            RawCheck::Tcp => CheckKind::Tcp,
            RawCheck::TlsHello => CheckKind::TlsHello,
            RawCheck::Https => CheckKind::Https(HttpsCheck {
                path: self.path.clone(),
                expect_status: self.expect_status,
                expect_body: self.expect_body.clone(),
                ca_file: self.ca_file.clone(),
                client_cert: self.client_cert.clone().zip(self.client_key.clone()),
                server_name: self.server_name.clone(),
            }),
        };
        HealthConfig {
            check,
            interval: self.interval,
            timeout: self.timeout,
            rise: self.rise,
            fall: self.fall,
        }
    }
}

pub(super) fn check_name(c: RawCheck) -> &'static str {
    match c {
        RawCheck::None => "none",
        RawCheck::Tcp => "tcp",
        RawCheck::TlsHello => "tls-hello",
        RawCheck::Https => "https",
    }
}

impl Checker<'_> {
    /// Merge one health block over `base`, field by field.
    pub(super) fn health(&mut self, base: &Health, raw: Option<&RawHealth>, p: &str) -> Health {
        let Some(raw) = raw else { return base.clone() };
        let mut h = base.clone();
        h.check = raw.check.unwrap_or(base.check);
        h.interval = self.duration(
            raw.interval.as_ref(),
            &join(p, "interval"),
            base.interval,
            true,
        );
        h.timeout = self.duration(
            raw.timeout.as_ref(),
            &join(p, "timeout"),
            base.timeout,
            true,
        );
        h.rise = self.int(
            raw.rise,
            &join(p, "rise"),
            base.rise.into(),
            1,
            MAX_RISE_FALL,
        ) as u32;
        h.fall = self.int(
            raw.fall,
            &join(p, "fall"),
            base.fall.into(),
            1,
            MAX_RISE_FALL,
        ) as u32;
        self.https_options(&mut h, raw, p);
        h
    }

    /// The `https` check's options: only in a block whose check is `https`.
    pub(super) fn https_options(&mut self, h: &mut Health, raw: &RawHealth, p: &str) {
        if h.check != RawCheck::Https {
            for (key, set) in raw.https_keys() {
                if set {
                    let msg = format!(
                        "`{key}` applies only to `check: https` (the check here is `{}`)",
                        check_name(h.check)
                    );
                    self.err(&join(p, key), msg);
                }
            }
            return;
        }
        if let Some(path) = &raw.path {
            if path.starts_with('/') {
                h.path = path.clone();
            } else {
                self.err(&join(p, "path"), format!("`{path}` must start with `/`"));
            }
        }
        let status = self.int(
            raw.expect_status,
            &join(p, "expect_status"),
            h.expect_status.into(),
            100,
            599,
        );
        h.expect_status = status as u16;
        if let Some(body) = &raw.expect_body {
            h.expect_body = (!body.is_empty()).then(|| body.clone());
        }
        if let Some(sn) = &raw.server_name {
            match server_name(sn) {
                Ok(sn) if !sn.starts_with('*') => h.server_name = Some(sn),
                Ok(_) => self.err(
                    &join(p, "server_name"),
                    "a check's server name cannot be a wildcard",
                ),
                Err(why) => self.err(&join(p, "server_name"), why),
            }
        }
        h.ca_file = raw.ca_file.clone().or(h.ca_file.take());
        h.client_cert = raw.client_cert.clone().or(h.client_cert.take());
        h.client_key = raw.client_key.clone().or(h.client_key.take());
        let touched = raw.client_cert.is_some() || raw.client_key.is_some();
        if touched {
            self.cert_and_key(h.client_cert.is_some(), h.client_key.is_some(), p);
        }
    }

    /// `client_cert` and `client_key` at YAML path `p`: both or neither.
    pub(super) fn cert_and_key(&mut self, cert: bool, key: bool, p: &str) {
        if cert == key {
            return;
        }
        let (set, missing) = if cert {
            ("client_cert", "client_key")
        } else {
            ("client_key", "client_cert")
        };
        self.err(
            &join(p, set),
            format!("`{set}` needs `{missing}` too (both or neither)"),
        );
    }
}
