//! `stick:` blocks: defaults and limits of a service's stick table.
use super::checker::{join, Checker};
use super::raw::{Nullable, RawStick, RawStickOn};
use super::*;

/// Default stick table size: one entry per agent of a large Puppet site.
const DEFAULT_STICK_SIZE: u64 = 100_000;
/// Largest stick table size; beyond it a typo would reserve gigabytes.
const MAX_STICK_SIZE: u64 = 100_000_000;
/// Default stick expiry: Puppet agents run every 30 minutes.
const DEFAULT_STICK_EXPIRE: Duration = Duration::from_secs(30 * 60);
/// Default state file save interval.
const DEFAULT_SAVE_INTERVAL: Duration = Duration::from_secs(60);
/// Ticket-key probes: often enough to follow key rotation (nginx/OpenSSL rotate in
/// hours), rare enough to cost each backend one handshake a minute.
const DEFAULT_PROBE_INTERVAL: Duration = Duration::from_secs(60);
/// Default source prefixes: one client per IPv4 address, one site per IPv6 /64.
const DEFAULT_PREFIX_V4: u64 = 32;
const DEFAULT_PREFIX_V6: u64 = 64;
/// Default ticket key-name prefix: OpenSSL's 16-byte key name.
const DEFAULT_TICKET_PREFIX: u64 = 16;
/// Default most backends one ClientHello is offered to while confirming: more tries
/// cost more extra handshakes per miss, and a pool larger than this has its answer
/// from the hint or the balance order within the first few anyway.
const DEFAULT_CONFIRM_TRIES_CAP: usize = 4;
/// Largest `confirm_tries`.
const MAX_CONFIRM_TRIES: u64 = 16;
/// Largest ticket prefix worth comparing.
const MAX_TICKET_PREFIX: u64 = 64;

impl Checker<'_> {
    pub(super) fn stick(
        &mut self,
        raw: Option<&Nullable<RawStick>>,
        mode: Mode,
        primaries: usize,
        p: &str,
    ) -> Option<StickConfig> {
        let raw = match raw? {
            Nullable::Null => {
                self.err(
                    p,
                    "`stick:` is empty: write `stick: {}` for the defaults, or remove it",
                );
                return None;
            }
            Nullable::Value(s) => s,
        };
        let size = self.int(
            raw.size,
            &join(p, "size"),
            DEFAULT_STICK_SIZE,
            1,
            MAX_STICK_SIZE,
        );
        let expire = self.duration(
            raw.expire.as_ref(),
            &join(p, "expire"),
            DEFAULT_STICK_EXPIRE,
            true,
        );
        let source_expire = self.duration(
            raw.source_expire.as_ref(),
            &join(p, "source_expire"),
            expire,
            true,
        );
        let (v4, v6) = self.source_prefixes(raw, p);
        let ticket = self.int(
            raw.ticket_prefix,
            &join(p, "ticket_prefix"),
            DEFAULT_TICKET_PREFIX,
            0,
            MAX_TICKET_PREFIX,
        );
        let save = self.duration(
            raw.save_interval.as_ref(),
            &join(p, "save_interval"),
            DEFAULT_SAVE_INTERVAL,
            true,
        );
        let probe = self.duration(
            raw.probe_interval.as_ref(),
            &join(p, "probe_interval"),
            DEFAULT_PROBE_INTERVAL,
            false,
        );
        let (confirm, tries) = self.confirm(raw, mode, primaries, p);
        Some(StickConfig {
            on: self.stick_on(raw.on.as_deref(), mode, &join(p, "on")),
            size: size as usize,
            expire,
            source_expire,
            source_prefix_v4: v4 as u8,
            source_prefix_v6: v6 as u8,
            ticket_prefix: ticket as usize,
            state_file: raw.state_file.clone(),
            save_interval: save,
            probe_interval: (!probe.is_zero() && mode == Mode::Tls).then_some(probe),
            confirm: confirm && mode == Mode::Tls,
            confirm_tries: tries as usize,
        })
    }

    /// `source_prefix_v4` and `source_prefix_v6`: how much of a client address the
    /// source key keeps.
    fn source_prefixes(&mut self, raw: &RawStick, p: &str) -> (u64, u64) {
        let v4 = self.int(
            raw.source_prefix_v4,
            &join(p, "source_prefix_v4"),
            DEFAULT_PREFIX_V4,
            0,
            32,
        );
        let v6 = self.int(
            raw.source_prefix_v6,
            &join(p, "source_prefix_v6"),
            DEFAULT_PREFIX_V6,
            0,
            128,
        );
        (v4, v6)
    }

    /// `confirm` (on by default in tls mode, refused in tcp mode) and
    /// `confirm_tries` (by default the primaries, at most 4).
    fn confirm(&mut self, raw: &RawStick, mode: Mode, primaries: usize, p: &str) -> (bool, u64) {
        let confirm = raw.confirm.unwrap_or(mode == Mode::Tls);
        if confirm && mode == Mode::Tcp {
            self.err(
                &join(p, "confirm"),
                "`mode: tcp` reads no TLS handshake: there is nothing to confirm",
            );
        }
        let default_tries = primaries.clamp(1, DEFAULT_CONFIRM_TRIES_CAP) as u64;
        let tries = self.int(
            raw.confirm_tries,
            &join(p, "confirm_tries"),
            default_tries,
            1,
            MAX_CONFIRM_TRIES,
        );
        (confirm, tries)
    }

    /// Each `stick.state_file` belongs to one service: two tables saved to one file
    /// would overwrite each other, and each would load the other's entries. Paths are
    /// compared as written, normalised (`a//b`, `a/./b`), not through symlinks.
    pub(super) fn state_files(&mut self, services: &[ServiceConfig]) {
        let mut owners: Vec<(PathBuf, &str)> = Vec::new();
        for svc in services {
            let Some(file) = svc.stick.as_ref().and_then(|s| s.state_file.as_ref()) else {
                continue;
            };
            let normal: PathBuf = file.components().collect();
            match owners.iter().find(|(f, _)| *f == normal) {
                Some((_, owner)) => {
                    let p = format!("services.{}.stick.state_file", svc.name);
                    let msg = format!(
                        "{} is already the state file of service {owner}",
                        file.display()
                    );
                    self.err(&p, msg);
                }
                None => owners.push((normal, &svc.name)),
            }
        }
    }

    /// `stick.on`; the default is every key in `tls` mode and `[source]` in `tcp` mode.
    pub(super) fn stick_on(
        &mut self,
        raw: Option<&[RawStickOn]>,
        mode: Mode,
        p: &str,
    ) -> Vec<StickOn> {
        let Some(raw) = raw else {
            return match mode {
                Mode::Tls => vec![
                    StickOn::SessionId,
                    StickOn::Ticket,
                    StickOn::Psk,
                    StickOn::Source,
                ],
                Mode::Tcp => vec![StickOn::Source],
            };
        };
        if raw.is_empty() {
            self.err(
                p,
                "is empty: name at least one of session_id, ticket, psk, source",
            );
        }
        let mut out = Vec::new();
        for (i, k) in raw.iter().enumerate() {
            let on = match k {
                RawStickOn::SessionId => StickOn::SessionId,
                RawStickOn::Ticket => StickOn::Ticket,
                RawStickOn::Psk => StickOn::Psk,
                RawStickOn::Source => StickOn::Source,
            };
            let ip = format!("{p}[{i}]");
            if mode == Mode::Tcp && on != StickOn::Source {
                self.err(
                    &ip,
                    "`mode: tcp` reads no TLS handshake: only `source` applies",
                );
            } else if out.contains(&on) {
                self.err(&ip, "is listed twice");
            } else {
                out.push(on);
            }
        }
        out
    }
}
