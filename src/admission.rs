//! Per-source admission (`listen[].per_source`): how many connections one client
//! address (grouped by prefix) holds open and opens per second on a listen address,
//! checked once the client is known (at accept, or right after a trusted tier's
//! PROXY header) and before anything is read from it.
//!
//! The state is one bounded [`DashMap`] per listen address (its shards are the only
//! locks on the path) and one sweeper task. An entry is removed only when it carries
//! nothing: no open connection and a full token bucket. So a flood of distinct
//! addresses can never evict what the table knows of a source.
//!
//! A source with an open connection always has an entry of its own: those are
//! bounded by the listener's `max_connections` already, and a flood of connections
//! held from many sources (each within its limits) must not leave a new agent
//! nothing. `table_size` bounds the entries *without* an open connection, kept only
//! for their refilling bucket: while that many are kept, a new source shares one
//! overflow entry held to the limits of a single source (what a flood of distinct
//! sources draining their buckets leaves a newcomer), and a source whose last
//! connection ends is forgotten rather than kept past the bound.
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use dashmap::mapref::entry::Entry;
use dashmap::DashMap;
use prometheus::{IntCounter, IntGauge};

use crate::config::PerSource;
use crate::metrics::Metrics;

/// How often the sweeper drops entries that carry nothing; also how stale the
/// tracked-sources gauge may be.
const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// A source as counted: its network under the configured prefix, or the overflow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// An IPv4 network and its prefix length.
    V4(Ipv4Addr, u8),
    /// An IPv6 network and its prefix length.
    V6(Ipv6Addr, u8),
    /// Every source that found the table full.
    Overflow,
}

impl Source {
    /// `ip` under `limits`' prefixes (IPv4-mapped IPv6 counts as IPv4).
    fn of(ip: IpAddr, limits: &PerSource) -> Source {
        match ip.to_canonical() {
            IpAddr::V4(a) => {
                let p = limits.source_prefix_v4;
                let mask = u32::MAX.checked_shl(32 - u32::from(p)).unwrap_or(0);
                Source::V4(Ipv4Addr::from(u32::from(a) & mask), p)
            }
            IpAddr::V6(a) => {
                let p = limits.source_prefix_v6;
                let mask = u128::MAX.checked_shl(128 - u32::from(p)).unwrap_or(0);
                Source::V6(Ipv6Addr::from(u128::from(a) & mask), p)
            }
        }
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::V4(a, 32) => write!(f, "{a}"),
            Source::V6(a, 128) => write!(f, "{a}"),
            Source::V4(a, p) => write!(f, "{a}/{p}"),
            Source::V6(a, p) => write!(f, "{a}/{p}"),
            Source::Overflow => f.write_str("overflow"),
        }
    }
}

/// Why a source's connection was refused; each is its own reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The source holds `max_connections` open connections already.
    #[error("source has its per_source.max_connections open")]
    Connections,
    /// The source spent its burst and opens faster than `rate`.
    #[error("source opens connections faster than per_source.rate")]
    Rate,
    /// `table_size` sources were kept without an open connection, and the overflow
    /// entry, shared by every source without an entry then, is at its limits.
    #[error(
        "per_source table full (table_size sources kept) and its overflow entry at its limits"
    )]
    Overflow,
}

impl Refusal {
    /// The reason word: access log `end=refused:<reason>`, metric
    /// `crossbar_listener_refused_total{reason=<reason>}`.
    pub fn reason(self) -> &'static str {
        match self {
            Refusal::Connections => "source_connections",
            Refusal::Rate => "source_rate",
            Refusal::Overflow => "source_overflow",
        }
    }
}

/// A listener's per-source admission counters, taken once per table.
#[derive(Debug, Clone)]
pub struct SourceMetrics {
    /// `crossbar_listener_refused_total`, one per [`Refusal`] in declaration order.
    refused: [IntCounter; 3],
    /// `crossbar_listener_sources_tracked`.
    pub tracked: IntGauge,
}

impl SourceMetrics {
    /// The handles of the listener labelled `listener`.
    pub fn new(metrics: &Metrics, listener: &str) -> SourceMetrics {
        let refused = [Refusal::Connections, Refusal::Rate, Refusal::Overflow];
        SourceMetrics {
            refused: refused.map(|r| metrics.listener_refused(listener, r.reason())),
            tracked: metrics.sources_tracked(listener),
        }
    }

    /// The refusal counter for `r`.
    fn refused(&self, r: Refusal) -> &IntCounter {
        &self.refused[match r {
            Refusal::Connections => 0,
            Refusal::Rate => 1,
            Refusal::Overflow => 2,
        }]
    }
}

/// What is known of one source.
#[derive(Debug, Clone, Copy)]
struct SourceState {
    /// Its connections admitted and not yet ended.
    open: u32,
    /// Counted among the entries without an open connection ([`Admission::idle`]):
    /// set when its last connection ended and it was kept, cleared when it opens one.
    kept_idle: bool,
    /// Its token bucket: new connections it may open now.
    tokens: f64,
    /// When `tokens` was last brought up to date.
    refreshed: Instant,
    /// Connections admitted since it was first tracked.
    admitted: u64,
    /// Connections refused since it was first tracked.
    refused: u64,
}

impl SourceState {
    fn new(limits: &PerSource, now: Instant) -> SourceState {
        SourceState {
            open: 0,
            kept_idle: false,
            tokens: f64::from(limits.burst),
            refreshed: now,
            admitted: 0,
            refused: 0,
        }
    }

    /// Refill the bucket for the time since the last refill.
    fn refill(&mut self, limits: &PerSource, now: Instant) {
        if let Some(rate) = limits.rate {
            let secs = now.saturating_duration_since(self.refreshed).as_secs_f64();
            self.tokens = (self.tokens + secs * f64::from(rate)).min(f64::from(limits.burst));
        }
        self.refreshed = now;
    }

    /// Admit one more connection, or say why not.
    fn take(&mut self, limits: &PerSource, now: Instant) -> Result<(), Refusal> {
        self.refill(limits, now);
        let full = limits.max_connections.is_some_and(|m| self.open >= m);
        let spent = limits.rate.is_some() && self.tokens < 1.0;
        if full || spent {
            self.refused += 1;
            return Err(if full {
                Refusal::Connections
            } else {
                Refusal::Rate
            });
        }
        if limits.rate.is_some() {
            self.tokens -= 1.0;
        }
        self.open += 1;
        self.admitted += 1;
        Ok(())
    }

    /// Does the entry carry nothing a fresh one would not (so it may go)?
    fn idle(&mut self, limits: &PerSource, now: Instant) -> bool {
        self.refill(limits, now);
        self.open == 0 && (limits.rate.is_none() || self.tokens >= f64::from(limits.burst))
    }
}

/// One source in a listing ([`Admission::top`]).
#[derive(Debug, Clone)]
pub struct SourceView {
    /// The source (network under the prefix, or the overflow).
    pub source: Source,
    /// Its open connections.
    pub open: u32,
    /// New connections it may open now (`None` without a `rate`).
    pub tokens: Option<f64>,
    /// Connections admitted since it was first tracked.
    pub admitted: u64,
    /// Connections refused since it was first tracked.
    pub refused: u64,
}

/// One listen address's per-source table and limits; kept across reloads while the
/// listener keeps `per_source` (so open connections stay counted).
pub struct Admission {
    limits: ArcSwap<PerSource>,
    table: DashMap<Source, SourceState>,
    /// Entries in `table` other than the overflow.
    tracked: AtomicUsize,
    /// Of those, the ones kept without an open connection (`kept_idle`): bounded by
    /// `table_size`.
    idle: AtomicUsize,
    metrics: SourceMetrics,
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admission")
            .field("limits", &self.limits.load())
            .field("tracked", &self.tracked())
            .finish()
    }
}

impl Admission {
    /// A table for `limits`, with its sweeper (when called inside a runtime; the
    /// sweeper ends once the table is dropped).
    pub fn new(limits: PerSource, metrics: SourceMetrics) -> Arc<Admission> {
        let a = Arc::new(Admission {
            limits: ArcSwap::from_pointee(limits),
            table: DashMap::new(),
            tracked: AtomicUsize::new(0),
            idle: AtomicUsize::new(0),
            metrics,
        });
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(sweeper(Arc::downgrade(&a)));
        }
        a
    }

    /// The table a reload hands on: `old` with `limits` applied (open connections
    /// stay counted), a new one if there was none, nothing when `per_source` is gone.
    pub fn carry(
        old: Option<Arc<Admission>>,
        limits: Option<&PerSource>,
        metrics: impl FnOnce() -> SourceMetrics,
    ) -> Option<Arc<Admission>> {
        let limits = limits?;
        match old {
            Some(a) => {
                if **a.limits.load() != *limits {
                    a.limits.store(Arc::new(limits.clone()));
                }
                Some(a)
            }
            None => Some(Admission::new(limits.clone(), metrics())),
        }
    }

    /// The limits in force.
    pub fn limits(&self) -> Arc<PerSource> {
        self.limits.load_full()
    }

    /// Sources tracked now (the overflow entry not included).
    pub fn tracked(&self) -> usize {
        self.tracked.load(Ordering::Relaxed)
    }

    /// Admit a connection from `ip`: its slot (`None` for an allowed network, which
    /// is neither limited nor tracked), or why not (counted on the listener).
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<Option<SourceSlot>, Refusal> {
        let limits = self.limits.load();
        if limits.allow.iter().any(|n| n.contains(ip)) {
            return Ok(None);
        }
        let source = Source::of(ip, &limits);
        let now = Instant::now();
        let taken = match self.table.entry(source) {
            Entry::Occupied(mut e) => {
                let s = e.get_mut();
                let r = s.take(&limits, now);
                if r.is_ok() && std::mem::take(&mut s.kept_idle) {
                    self.idle.fetch_sub(1, Ordering::AcqRel);
                }
                r.map(|()| source)
            }
            // A new source with a connection to hold: always tracked while fewer than
            // `table_size` entries are kept without one.
            Entry::Vacant(v) if self.idle.load(Ordering::Acquire) < limits.table_size => {
                let mut s = SourceState::new(&limits, now);
                let r = s.take(&limits, now);
                v.insert(s);
                self.tracked.fetch_add(1, Ordering::AcqRel);
                r.map(|()| source)
            }
            Entry::Vacant(v) => {
                drop(v);
                let mut e = self
                    .table
                    .entry(Source::Overflow)
                    .or_insert_with(|| SourceState::new(&limits, now));
                e.take(&limits, now)
                    .map(|()| Source::Overflow)
                    .map_err(|_| Refusal::Overflow)
            }
        };
        match taken {
            Ok(source) => Ok(Some(SourceSlot {
                admission: self.clone(),
                source,
            })),
            Err(r) => {
                self.metrics.refused(r).inc();
                Err(r)
            }
        }
    }

    /// A connection of `source` ended. Its entry, now without an open connection,
    /// is kept (for its bucket) while fewer than `table_size` are kept so; past that
    /// it is forgotten: its next connection finds the table as any new source does.
    fn release(&self, source: Source) {
        let limits = self.limits.load();
        let forget = match self.table.get_mut(&source) {
            None => false,
            Some(mut e) => {
                e.open = e.open.saturating_sub(1);
                if source == Source::Overflow || e.open > 0 {
                    false
                } else if e.idle(&limits, Instant::now()) {
                    // A full bucket (or none): nothing to keep.
                    true
                } else {
                    // Counted under the entry's lock: `admit` uncounts it under the same.
                    e.kept_idle = self
                        .idle
                        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                            (n < limits.table_size).then_some(n + 1)
                        })
                        .is_ok();
                    !e.kept_idle
                }
            }
        };
        // Unless a new connection took it meanwhile.
        if forget
            && self
                .table
                .remove_if(&source, |_, s| s.open == 0 && !s.kept_idle)
                .is_some()
        {
            self.tracked.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Drop the entries that carry nothing (no open connection, a full bucket).
    pub fn sweep(&self) {
        let limits = self.limits.load();
        let now = Instant::now();
        let (mut removed, mut removed_idle) = (0, 0);
        self.table.retain(|source, s| {
            let keep = !s.idle(&limits, now);
            if !keep && *source != Source::Overflow {
                removed += 1;
                removed_idle += usize::from(s.kept_idle);
            }
            keep
        });
        self.idle.fetch_sub(removed_idle, Ordering::AcqRel);
        let left = self.tracked.fetch_sub(removed, Ordering::AcqRel) - removed;
        self.metrics
            .tracked
            .set(i64::try_from(left).unwrap_or(i64::MAX));
    }

    /// The `n` sources with the most open connections (then the most refused). One
    /// walk of the table holding `n` at most (a min-heap), so a page view of a full
    /// table costs no copy of it.
    pub fn top(&self, n: usize) -> Vec<SourceView> {
        use std::cmp::Reverse;
        use std::collections::BinaryHeap;
        let limits = self.limits.load();
        // Smallest (open, refused) on top, so it is the one to drop.
        let mut heap: BinaryHeap<Reverse<(u32, u64, usize)>> = BinaryHeap::with_capacity(n + 1);
        let mut kept: Vec<Option<SourceView>> = Vec::with_capacity(n + 1);
        let mut free: Vec<usize> = Vec::new();
        for e in self.table.iter() {
            let rank = (e.open, e.refused);
            if heap.len() == n && heap.peek().is_some_and(|Reverse(m)| (m.0, m.1) >= rank) {
                continue;
            }
            let view = SourceView {
                source: *e.key(),
                open: e.open,
                tokens: limits.rate.map(|_| e.tokens),
                admitted: e.admitted,
                refused: e.refused,
            };
            let slot = match free.pop() {
                Some(i) => {
                    kept[i] = Some(view);
                    i
                }
                None => {
                    kept.push(Some(view));
                    kept.len() - 1
                }
            };
            heap.push(Reverse((rank.0, rank.1, slot)));
            if heap.len() > n {
                if let Some(Reverse((_, _, i))) = heap.pop() {
                    kept[i] = None;
                    free.push(i);
                }
            }
        }
        let mut all: Vec<SourceView> = kept.into_iter().flatten().collect();
        all.sort_by_key(|v| (Reverse(v.open), Reverse(v.refused)));
        all
    }
}

/// One admitted connection's place in its source's count; released on drop.
#[derive(Debug)]
pub struct SourceSlot {
    admission: Arc<Admission>,
    source: Source,
}

impl Drop for SourceSlot {
    fn drop(&mut self) {
        self.admission.release(self.source);
    }
}

/// Sweep every [`SWEEP_INTERVAL`] while the table lives.
async fn sweeper(table: Weak<Admission>) {
    let mut tick = tokio::time::interval(SWEEP_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(t) = table.upgrade() else { return };
        t.sweep();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max: Option<u32>, rate: Option<u32>, burst: u32, size: usize) -> PerSource {
        PerSource {
            max_connections: max,
            rate,
            burst,
            source_prefix_v4: 32,
            source_prefix_v6: 64,
            allow: vec!["10.9.0.0/16".parse().unwrap()],
            table_size: size,
        }
    }

    fn table(l: PerSource) -> Arc<Admission> {
        let m = Metrics::new();
        Admission::new(l, SourceMetrics::new(&m, "test"))
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn open_connections_are_held_to_the_limit_and_released() {
        let a = table(limits(Some(2), None, 1, 10));
        let s1 = a.admit(ip("192.0.2.1")).unwrap();
        let _s2 = a.admit(ip("192.0.2.1")).unwrap();
        assert_eq!(a.admit(ip("192.0.2.1")).unwrap_err(), Refusal::Connections);
        assert!(a.admit(ip("192.0.2.2")).is_ok(), "another source");
        drop(s1);
        assert!(a.admit(ip("192.0.2.1")).is_ok());
    }

    #[test]
    fn the_bucket_allows_a_burst_then_the_rate() {
        let l = limits(None, Some(1), 3, 10);
        let now = Instant::now();
        let mut s = SourceState::new(&l, now);
        for _ in 0..3 {
            s.take(&l, now).unwrap();
        }
        assert_eq!(s.take(&l, now), Err(Refusal::Rate));
        assert!(!s.idle(&l, now));
        s.take(&l, now + Duration::from_millis(1100)).unwrap();
        assert_eq!(
            s.take(&l, now + Duration::from_millis(1100)),
            Err(Refusal::Rate)
        );
        s.open = 0;
        assert!(s.idle(&l, now + Duration::from_secs(5)), "refilled");
    }

    #[test]
    fn allowed_networks_are_neither_limited_nor_tracked() {
        let a = table(limits(Some(1), Some(1), 1, 10));
        let slots: Vec<_> = (0..50).map(|_| a.admit(ip("10.9.3.4")).unwrap()).collect();
        assert!(slots.iter().all(Option::is_none));
        assert_eq!(a.tracked(), 0);
    }

    #[test]
    fn prefixes_group_sources() {
        let mut l = limits(Some(1), None, 1, 10);
        l.source_prefix_v4 = 24;
        let a = table(l);
        let _s = a.admit(ip("192.0.2.1")).unwrap();
        assert_eq!(
            a.admit(ip("192.0.2.200")).unwrap_err(),
            Refusal::Connections
        );
        assert_eq!(
            a.admit(ip("::ffff:192.0.2.9")).unwrap_err(),
            Refusal::Connections
        );
        let _v6 = a.admit(ip("2001:db8::1")).unwrap();
        assert_eq!(
            a.admit(ip("2001:db8::2")).unwrap_err(),
            Refusal::Connections
        );
        assert_eq!(a.top(5)[0].source.to_string(), "192.0.2.0/24");
        assert_eq!(a.top(5).len(), 2);
        assert_eq!(a.top(1).len(), 1);
        assert!(a.top(0).is_empty());
    }

    #[test]
    fn top_keeps_the_busiest() {
        let a = table(limits(Some(100), None, 1, 1000));
        let mut held = Vec::new();
        for i in 0..200u32 {
            let ip = IpAddr::from([192, 0, 2, (i % 50) as u8]);
            held.push(a.admit(ip).unwrap());
        }
        // 192.0.2.0..49 hold 4 each; one more for .7 and two for .9.
        held.push(a.admit(ip("192.0.2.7")).unwrap());
        held.extend((0..2).map(|_| a.admit(ip("192.0.2.9")).unwrap()));
        let top = a.top(3);
        let got: Vec<(String, u32)> = top.iter().map(|v| (v.source.to_string(), v.open)).collect();
        assert_eq!(got[..2], [("192.0.2.9".into(), 6), ("192.0.2.7".into(), 5)]);
        assert_eq!(got[2].1, 4);
    }

    /// Sources holding connections never fill the table: `table_size` 3, and ten
    /// sources each hold one, each with an entry of its own and its own limits.
    #[test]
    fn held_connections_never_send_a_newcomer_to_the_overflow() {
        let a = table(limits(Some(2), None, 1, 3));
        let held: Vec<_> = (1..=10u8)
            .map(|i| a.admit(IpAddr::from([192, 0, 2, i])).unwrap())
            .collect();
        assert!(held
            .iter()
            .all(|s| s.as_ref().is_some_and(|s| s.source != Source::Overflow)));
        assert_eq!(a.tracked(), 10);
        let _second = a.admit(ip("192.0.2.1")).unwrap();
        assert_eq!(a.admit(ip("192.0.2.1")).unwrap_err(), Refusal::Connections);
        // Ended without a rate: nothing to keep, forgotten at once.
        drop(held);
        assert_eq!(a.tracked(), 1, "192.0.2.1 still holds one");
    }

    /// What `table_size` bounds: sources kept without an open connection, for their
    /// refilling bucket. Once that many are kept, a newcomer shares the overflow
    /// entry (held to one source's limits) and a source whose last connection ends is
    /// forgotten; a tracked source is never evicted.
    #[test]
    fn kept_buckets_fill_the_table_and_newcomers_share_the_overflow() {
        let a = table(limits(Some(2), Some(1), 1, 3));
        for i in 1..=3u8 {
            drop(a.admit(IpAddr::from([192, 0, 2, i])).unwrap());
        }
        assert_eq!((a.tracked(), a.idle.load(Ordering::Relaxed)), (3, 3));
        // A drained bucket is kept: its source is still held to its rate.
        assert_eq!(a.admit(ip("192.0.2.1")).unwrap_err(), Refusal::Rate);
        let o1 = a.admit(ip("198.51.100.1")).unwrap().unwrap();
        assert_eq!(o1.source, Source::Overflow);
        assert_eq!(a.admit(ip("198.51.100.2")).unwrap_err(), Refusal::Overflow);
        // Past the bound a source's entry is forgotten when its connection ends.
        let b = table(limits(Some(2), Some(1), 1, 1));
        let first = b.admit(ip("192.0.2.1")).unwrap();
        let second = b.admit(ip("192.0.2.2")).unwrap();
        drop(first);
        drop(second);
        assert_eq!((b.tracked(), b.idle.load(Ordering::Relaxed)), (1, 1));
        assert!(b.top(5).iter().all(|v| v.source.to_string() == "192.0.2.1"));
        drop(o1);
    }
}
