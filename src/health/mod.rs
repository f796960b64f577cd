//! Backend health: active checks (tcp, tls-hello, https), passive failure counting
//! from the data path, and the rise/fall streaks that flip a backend up or down.
//!
//! One task per backend runs its check every `interval` (±10% jitter, so checks of
//! many backends spread out), each bounded by `timeout`. Results, and connect
//! failures seen by client connections, feed one streak per backend: `fall`
//! consecutive failures take an up backend down, `rise` consecutive passing checks
//! bring a down one back. A flip is logged and published once, when it happens.
//!
//! Backends start up (as HAProxy's servers do): a restart of crossbar never refuses
//! traffic while it waits for first checks; a dead backend is found by the first
//! connects (which retry elsewhere) and by `fall` checks.
//!
//! `failback: manual`: a primary that recovers while another backend is serving
//! (available, and given a connection since the primary went down) becomes
//! `standby` (healthy, no traffic) until an operator enables it, so a Puppet CA
//! keeps one active signer. Backends that were down together and come back
//! together start no failover: the backup took no connection, the primary resumes.
//!
//! [`predict`] runs one backend's check once with its failure explained in words
//! (`crossbar doctor` and reloads use it); [`gate`] is a reload's probe of new
//! health settings before they are committed.
mod cert;
mod checks;
mod error;
pub(crate) mod explain;
pub mod gate;
mod predict;
mod state;

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::balance::Backend;
use crate::config::{BackendConfig, CheckKind, ServiceConfig};
use crate::service::Service;

pub use crate::dial::tls::{server_name_for, NameSource};
pub use cert::CertInfo;
pub(crate) use checks::http_get;
pub use checks::{classify_answer, run_check, HelloReply, Target};
pub use error::CheckError;
pub use predict::{predict, Predicted};
pub use state::{observe, passive_failure, passive_success, Flip};

/// Checks run every `interval` ± this fraction, so many backends don't probe in step.
const JITTER: f64 = 0.1;

/// What the checks of backend `b` of `svc` connect to and the name they use.
pub fn target(svc: &ServiceConfig, b: &BackendConfig) -> Target {
    Target {
        address: b.address.clone(),
        server_name: server_name_for(svc, b).0,
        proxy_protocol: b.proxy_protocol,
    }
}

/// `d` ± 10%.
fn jittered(d: Duration) -> Duration {
    d.mul_f64(1.0 - JITTER + 2.0 * JITTER * fastrand::f64())
}

/// Start one check task per backend of `svc`; they end when `svc.tasks` is cancelled.
pub fn spawn_checks(svc: &Arc<Service>) {
    for b in &svc.pool.backends {
        tokio::spawn(check_loop(svc.clone(), b.clone(), svc.tasks.clone()));
    }
}

async fn check_loop(svc: Arc<Service>, b: Arc<Backend>, stop: CancellationToken) {
    let h = b.config.health.clone();
    let target = target(&svc.config, &b.config);
    let kind = check_label(&h.check);
    loop {
        let started = Instant::now();
        if h.check == CheckKind::None {
            // No probe: a backend taken down by failed connects is re-admitted after
            // `rise` intervals (it gets traffic again, and fails again if still dead).
            if !b.is_healthy() {
                state::observe_and_log(
                    &svc,
                    &b,
                    true,
                    &"no active check: re-admitted after rise x interval",
                );
            }
        } else {
            let result = tokio::select! {
                () = stop.cancelled() => return,
                r = run_check(&h.check, &target, h.timeout) => r,
            };
            match result {
                Ok(()) => {
                    b.metrics.check_ok.inc();
                    b.metrics.live.note_check(None);
                    state::observe_and_log(&svc, &b, true, &format_args!("{kind} check passed"));
                }
                Err(e) => {
                    b.metrics.check_fail.inc();
                    b.metrics.live.note_check(Some(&e));
                    tracing::debug!(service = %svc.name(), backend = %b.name, "{kind} check failed: {e}");
                    state::observe_and_log(&svc, &b, false, &format_args!("{kind} check: {e}"));
                }
            }
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep_until(started + jittered(h.interval)) => {}
        }
    }
}

/// A check as the doctor and a reload's refusal name it: `https /status/v1/simple`,
/// `tls-hello`, `tcp`, `none`.
pub fn check_description(c: &CheckKind) -> String {
    match c {
        CheckKind::Https(h) => format!("https {}", h.path),
        other => check_label(other).to_string(),
    }
}

/// The config spelling of a check kind.
pub fn check_label(c: &CheckKind) -> &'static str {
    match c {
        CheckKind::None => "none",
        CheckKind::Tcp => "tcp",
        CheckKind::TlsHello => "tls-hello",
        CheckKind::Https(_) => "https",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dial::tls::accept_any_config;
    use rustls::pki_types::ServerName;
    use rustls::ClientConnection;
    use std::io;

    use crate::balance::{AdminState, Pool, PoolParams};
    use crate::metrics::Metrics;

    const CLIENT: std::net::IpAddr = std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    /// A service `s` with primary `p` and backup `b` (no tasks started).
    fn service(check: &str, failback: &str) -> Service {
        let yaml = format!(
            "admin: {{ enabled: false }}\nservices:\n  s:\n    listen: [\"127.0.0.1:0\"]\n    \
             balance: first\n    failback: {failback}\n    \
             health: {{ check: {check}, rise: 2, fall: 3 }}\n    backends:\n      \
             - {{ name: p, address: \"127.0.0.1:1\" }}\n      \
             - {{ name: b, address: \"127.0.0.1:2\", backup: true }}\n"
        );
        let config = crate::config::Config::from_str_at(&yaml, std::path::Path::new("t.yaml"))
            .unwrap_or_else(|e| panic!("{e}"));
        let sc = config.services[0].clone();
        let m = Metrics::new();
        let pool = Pool::new(
            &sc.backends,
            PoolParams {
                algo: sc.balance,
                slow_start: sc.slow_start,
                queue_size: 1,
                queue_timeout: Duration::from_millis(10),
            },
            |b| m.backend("s", &b.name),
            None,
        );
        Service {
            metrics: m.service("s"),
            config: sc,
            pool,
            table: None,
            tasks: CancellationToken::new(),
            connections: Default::default(),
            discovery: None,
        }
    }

    fn primary_and_backup(svc: &Service) -> (Arc<Backend>, Arc<Backend>) {
        let get = |name| svc.pool.get(name).unwrap().clone();
        (get("p"), get("b"))
    }

    #[test]
    fn flips_once_after_fall_and_rise() {
        let svc = service("tcp", "auto");
        let p = svc.pool.get("p").unwrap().clone();
        assert_eq!(observe(&svc, &p, false), None);
        assert_eq!(observe(&svc, &p, false), None);
        assert_eq!(observe(&svc, &p, false), Some(Flip::Down));
        assert_eq!(observe(&svc, &p, false), None, "a flip is reported once");
        assert_eq!(p.state().as_str(), "down");
        assert_eq!(observe(&svc, &p, true), None);
        assert_eq!(observe(&svc, &p, true), Some(Flip::Up));
        assert_eq!(observe(&svc, &p, true), None);
        assert_eq!(p.state().as_str(), "up");
        // A pass in the middle breaks a failure streak.
        observe(&svc, &p, false);
        observe(&svc, &p, false);
        observe(&svc, &p, true);
        assert_eq!(observe(&svc, &p, false), None);
        assert!(p.is_healthy());
    }

    #[test]
    fn manual_failback_holds_a_recovered_primary_while_the_backup_serves() {
        let svc = service("tls-hello", "manual");
        let (p, b) = primary_and_backup(&svc);
        for _ in 0..3 {
            observe(&svc, &p, false);
        }
        assert!(b.is_available());
        // The backup serves while the primary is down: a failover.
        let lease = svc
            .pool
            .try_pick(CLIENT, &[])
            .expect("the backup takes over");
        assert_eq!(&*lease.backend().name, "b");
        drop(lease);
        observe(&svc, &p, true);
        assert_eq!(observe(&svc, &p, true), Some(Flip::Standby));
        assert_eq!(p.state().as_str(), "standby");
        assert!(!p.is_available());
        // Failing and recovering again keeps it held.
        for _ in 0..3 {
            observe(&svc, &p, false);
        }
        observe(&svc, &p, true);
        assert_eq!(observe(&svc, &p, true), Some(Flip::Standby));
        // The operator's enable releases it.
        p.set_admin_state(AdminState::Enabled);
        assert_eq!(p.state().as_str(), "up");
        // A backup is never held.
        for _ in 0..3 {
            observe(&svc, &b, false);
        }
        observe(&svc, &b, true);
        assert_eq!(observe(&svc, &b, true), Some(Flip::Up));
    }

    /// Issue #27: primary and backup down together (a broken CA file), the backup's
    /// checks pass first, no client reaches it before the primary's pass too: no
    /// failover started, the primary resumes (before: it was held in standby and
    /// the CA stayed on a backup that never signed anything).
    #[test]
    fn backends_down_together_and_back_together_start_no_failover() {
        let svc = service("tls-hello", "manual");
        let (p, b) = primary_and_backup(&svc);
        for _ in 0..3 {
            observe(&svc, &p, false);
            observe(&svc, &b, false);
        }
        assert_eq!((p.state().as_str(), b.state().as_str()), ("down", "down"));
        observe(&svc, &b, true);
        assert_eq!(observe(&svc, &b, true), Some(Flip::Up));
        observe(&svc, &p, true);
        assert_eq!(observe(&svc, &p, true), Some(Flip::Up));
        assert_eq!(p.state().as_str(), "up");
        let lease = svc.pool.try_pick(CLIENT, &[]).expect("a backend");
        assert_eq!(&*lease.backend().name, "p", "the primary resumes");
    }

    #[test]
    fn a_connect_ends_a_failure_streak_only_when_it_proves_as_much_as_the_check() {
        let err = io::Error::from(io::ErrorKind::ConnectionRefused);
        for (check, resets) in [("tcp", true), ("none", true), ("tls-hello", false)] {
            let svc = service(check, "auto");
            let p = svc.pool.get("p").unwrap().clone();
            passive_failure(&svc, &p, &err);
            passive_failure(&svc, &p, &err);
            passive_success(&p);
            assert_eq!(p.health().failures() == 0, resets, "{check}");
            passive_failure(&svc, &p, &err);
            assert_eq!(p.is_healthy(), resets, "{check}");
        }
    }

    #[test]
    fn classify_server_hello_alert_and_garbage() {
        // TLS 1.2 record header + ServerHello type.
        assert_eq!(
            classify_answer(&[0x16, 0x03, 0x03, 0x00, 0x5a, 0x02]),
            HelloReply::Tls
        );
        assert_eq!(
            classify_answer(&[0x15, 0x03, 0x03, 0x00, 0x02]),
            HelloReply::Tls
        );
        // A handshake record whose first message is not a ServerHello.
        assert_eq!(
            classify_answer(&[0x16, 0x03, 0x03, 0x00, 0x5a, 0x0b]),
            HelloReply::NotTls
        );
        assert_eq!(classify_answer(b"SSH-2.0-x\r\n"), HelloReply::NotTls);
        assert_eq!(classify_answer(b"HTTP/1.1 400"), HelloReply::NotTls);
        assert_eq!(classify_answer(&[0x16, 0x01]), HelloReply::NotTls);
        // Every prefix of a valid answer asks for more.
        let full = [0x16, 0x03, 0x03, 0x00, 0x5a, 0x02];
        for n in 0..full.len() {
            assert_eq!(
                classify_answer(&full[..n]),
                HelloReply::NeedMore,
                "prefix {n}"
            );
        }
        assert_eq!(classify_answer(&[0x15, 0x03, 0x03]), HelloReply::NeedMore);
    }

    #[test]
    fn jitter_stays_within_ten_percent() {
        let d = Duration::from_millis(1000);
        for _ in 0..1000 {
            let j = jittered(d);
            assert!(
                j >= Duration::from_millis(900) && j <= Duration::from_millis(1100),
                "{j:?}"
            );
        }
    }

    #[test]
    fn rustls_writes_a_modern_hello_with_sni() {
        let name = ServerName::try_from("puppet.example.com").unwrap();
        let mut conn = ClientConnection::new(accept_any_config().unwrap(), name).unwrap();
        let mut hello = Vec::new();
        while conn.wants_write() {
            conn.write_tls(&mut hello).unwrap();
        }
        match crate::hello::parse_client_hello(&hello, 16 * 1024) {
            crate::hello::HelloParse::Found(h) => {
                assert_eq!(h.sni.as_deref(), Some("puppet.example.com"));
                assert!(h.supported_versions.contains(&crate::hello::version::TLS13));
                assert!(h.supported_versions.contains(&crate::hello::version::TLS12));
            }
            _ => panic!("not a ClientHello"),
        }
    }
}
