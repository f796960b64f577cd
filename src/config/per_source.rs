//! `listen[].per_source`: how much one client address (grouped by prefix) may take
//! of a listen address: open connections and new connections per second.
//!
//! Per listen address, not per service: the client is known at the front, before
//! the ClientHello names a service, and the check runs there (at accept, or right
//! after a trusted tier's PROXY header) so a refused source costs no hello read.
use super::checker::{join, Checker};
use super::raw::RawPerSource;
use super::IpNet;

/// Sources tracked by default: ~100 B each, so ~10 MiB at most.
pub const DEFAULT_TABLE_SIZE: u64 = 100_000;
/// The most sources a table may be told to track (~100 MiB).
const MAX_TABLE_SIZE: u64 = 1_000_000;
/// IPv4 sources are counted one address each by default (like `stick.source_prefix_v4`).
const DEFAULT_PREFIX_V4: u64 = 32;
/// IPv6 sources are counted per /64 by default: one host usually holds a whole /64.
const DEFAULT_PREFIX_V6: u64 = 64;

/// A listen address's per-source limits (`listen[].per_source`); off when absent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PerSource {
    /// Open connections one source may hold; `None`: not limited.
    pub max_connections: Option<u32>,
    /// New connections one source may open per second, on average; `None`: not limited.
    pub rate: Option<u32>,
    /// New connections one source may open at once after a quiet period (the token
    /// bucket's size; default: `rate`).
    pub burst: u32,
    /// Prefix length that groups IPv4 sources (default 32: one address).
    pub source_prefix_v4: u8,
    /// Prefix length that groups IPv6 sources (default 64).
    pub source_prefix_v6: u8,
    /// Networks never limited nor tracked (monitoring, the masters themselves).
    pub allow: Vec<IpNet>,
    /// Most sources kept without an open connection (for their bucket); beyond, new
    /// sources share one overflow entry. A source holding a connection is always
    /// tracked (`admission.rs`).
    pub table_size: usize,
}

/// One line, as `check` says it: `per source: 20 open, 10/s (burst 40), /32 /64, 100000 tracked`.
impl std::fmt::Display for PerSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("per source:")?;
        if let Some(m) = self.max_connections {
            write!(f, " {m} open,")?;
        }
        if let Some(r) = self.rate {
            write!(f, " {r}/s (burst {}),", self.burst)?;
        }
        write!(
            f,
            " prefixes /{} /{}, {} tracked",
            self.source_prefix_v4, self.source_prefix_v6, self.table_size
        )?;
        if !self.allow.is_empty() {
            let allow: Vec<String> = self.allow.iter().map(|n| n.to_string()).collect();
            write!(f, ", never limited: {}", allow.join(", "))?;
        }
        Ok(())
    }
}

impl Checker<'_> {
    /// `listen[i].per_source` at `p`.
    pub(super) fn per_source(&mut self, raw: &RawPerSource, p: &str) -> Option<PerSource> {
        let max = raw
            .max_connections
            .map(|v| self.int(Some(v), &join(p, "max_connections"), 1, 1, u32::MAX.into()) as u32);
        let rate = raw
            .rate
            .map(|v| self.int(Some(v), &join(p, "rate"), 1, 1, 1_000_000) as u32);
        if max.is_none() && rate.is_none() {
            self.err(
                p,
                "limits nothing: set `max_connections` (open at once) and/or `rate` (new per second)",
            );
        }
        let burst = match (raw.burst, rate) {
            (Some(_), None) => {
                self.err(&join(p, "burst"), "`burst` needs `rate`");
                1
            }
            (b, r) => {
                let r = u64::from(r.unwrap_or(1));
                self.int(b, &join(p, "burst"), r, 1, 10_000_000) as u32
            }
        };
        let v4 = self.int(
            raw.source_prefix_v4,
            &join(p, "source_prefix_v4"),
            DEFAULT_PREFIX_V4,
            0,
            32,
        ) as u8;
        let v6 = self.int(
            raw.source_prefix_v6,
            &join(p, "source_prefix_v6"),
            DEFAULT_PREFIX_V6,
            0,
            128,
        ) as u8;
        let size = self.int(
            raw.table_size,
            &join(p, "table_size"),
            DEFAULT_TABLE_SIZE,
            1,
            MAX_TABLE_SIZE,
        );
        let allow = self.allow_list(raw.allow.as_deref().unwrap_or_default(), &join(p, "allow"));
        Some(PerSource {
            max_connections: max,
            rate,
            burst,
            source_prefix_v4: v4,
            source_prefix_v6: v6,
            allow,
            table_size: size as usize,
        })
    }

    fn allow_list(&mut self, raw: &[String], p: &str) -> Vec<IpNet> {
        let mut out: Vec<IpNet> = Vec::new();
        for (i, s) in raw.iter().enumerate() {
            match s.parse::<IpNet>() {
                Ok(n) if out.contains(&n) => {
                    self.err(&format!("{p}[{i}]"), format!("{n} is listed twice"))
                }
                Ok(n) => out.push(n),
                Err(why) => self.err(&format!("{p}[{i}]"), why),
            }
        }
        if let Some(all) = out.iter().find(|n| n.prefix == 0) {
            let msg = format!("warning: {all} allows every address: nothing is limited");
            self.warn(p, msg);
        }
        out
    }
}
