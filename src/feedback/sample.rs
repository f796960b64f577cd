//! What a backend said of its load: a Puppet compiler's pool (from its
//! jruby-metrics document, `puppet.rs`) or an HAProxy agent's words (`agent.rs`).
use super::agent::AgentReply;

/// The state of a compiler's JRuby pool lock (`jruby-pool-lock-status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolLock {
    /// `:not-in-use`: JRubies are lent as usual.
    NotInUse,
    /// `:requested`: a code deploy waits for every JRuby; new borrows wait behind it.
    Requested,
    /// `:acquired`: the pool is locked (file sync, code deploy): nothing compiles.
    Acquired,
}

impl PoolLock {
    /// The name on the wire, without Clojure's colon.
    pub fn as_str(self) -> &'static str {
        match self {
            PoolLock::NotInUse => "not-in-use",
            PoolLock::Requested => "requested",
            PoolLock::Acquired => "acquired",
        }
    }
}

/// What a Puppet compiler's `jruby-metrics` said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PuppetSample {
    /// `num-jrubies`: instances in the pool now.
    pub jrubies: u32,
    /// `num-free-jrubies`.
    pub free: u32,
    /// Requests waiting for a JRuby (`requested-instances`' length).
    pub queued: u32,
    /// JRubies lent out (`borrowed-instances`' length).
    pub borrowed: u32,
    /// `jruby-pool-lock-status.current-state`.
    pub lock: PoolLock,
    /// `queue-limit-hit-count`: requests refused (503) since the compiler started.
    pub queue_limit_hits: u64,
}

impl PuppetSample {
    /// JRubies that exist now: free or borrowed. A starting compiler answers
    /// `running` after its first (puppetserver#2844); `num-jrubies` is the pool's
    /// size from the start, and the instances still being created are neither free
    /// nor borrowed (measured on 7.9.5: 3 of 3, 1 free, 0 borrowed, for 28 s).
    pub fn ready(&self) -> u32 {
        self.free.saturating_add(self.borrowed).min(self.jrubies)
    }
}

/// One good answer of a backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reading {
    /// A Puppet compiler's JRuby metrics.
    Puppet(PuppetSample),
    /// An HAProxy agent's answer.
    Agent(AgentReply),
}

impl Reading {
    /// In words: `0/1 JRubies free, 2 queued, 1 borrowed, pool lock not-in-use,
    /// 5 refused (503) since start`, or an agent's words.
    pub fn describe(&self) -> String {
        match self {
            Reading::Puppet(s) => format!(
                "{}/{} JRubies free, {} queued, {} borrowed, pool lock {}, {} refused (503) since start",
                s.free, s.jrubies, s.queued, s.borrowed, s.lock.as_str(), s.queue_limit_hits
            ),
            Reading::Agent(a) => format!("agent: {}", a.words()),
        }
    }
}
