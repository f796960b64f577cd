//! The admin endpoint's connection slots, and who gives one up when they are full.
//!
//! [`MAX_CONNECTIONS`](super::MAX_CONNECTIONS) regular slots serve every endpoint;
//! [`RESERVED_CONNECTIONS`](super::RESERVED_CONNECTIONS) more answer only `/healthz`
//! and `/metrics`. A connection that holds a slot without a request in progress
//! (silent since it connected, or idle between keep-alive requests) is worth
//! nothing to anyone: when every slot is taken, the oldest such connection is
//! closed to make room (as nginx reuses idle keep-alive connections). A client that
//! opens connections and says nothing therefore pushes out only its own, and a
//! health probe always gets a slot; only when every slot holds a request in
//! progress is a new connection refused.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

/// Which pool an admin connection's slot came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// Every endpoint, keep-alive.
    Regular,
    /// `/healthz` and `/metrics` only, one request.
    Reserved,
}

struct Held {
    id: u64,
    slot: Slot,
    busy: Arc<AtomicBool>,
    evict: CancellationToken,
}

struct Inner {
    next_id: u64,
    /// In accept order: the first idle one is the oldest.
    held: Vec<Held>,
}

/// Every slot, shared by the accept loop and the connections holding them.
pub struct Slots {
    regular: usize,
    reserved: usize,
    inner: Mutex<Inner>,
}

/// A new connection's place.
pub struct Admitted {
    /// Its slot, given back when dropped.
    pub lease: Lease,
    /// Whether an idle connection was closed to make room.
    pub evicted: bool,
}

impl Slots {
    /// `regular` + `reserved` slots.
    pub fn new(regular: usize, reserved: usize) -> Arc<Slots> {
        Arc::new(Slots {
            regular,
            reserved,
            inner: Mutex::new(Inner {
                next_id: 0,
                held: Vec::new(),
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A slot for a new connection: a free regular one, else an idle regular
    /// connection's, else a free reserved one, else an idle reserved connection's;
    /// `None` when every slot holds a request in progress.
    pub fn admit(self: &Arc<Slots>) -> Option<Admitted> {
        let mut inner = self.lock();
        let mut evicted = false;
        let mut place = None;
        for (slot, cap) in [
            (Slot::Regular, self.regular),
            (Slot::Reserved, self.reserved),
        ] {
            if inner.held.iter().filter(|h| h.slot == slot).count() < cap {
                place = Some(slot);
                break;
            }
            let idle = inner
                .held
                .iter()
                .position(|h| h.slot == slot && !h.busy.load(Ordering::Acquire));
            if let Some(i) = idle {
                inner.held.remove(i).evict.cancel();
                evicted = true;
                place = Some(slot);
                break;
            }
        }
        let slot = place?;
        let id = inner.next_id;
        inner.next_id += 1;
        let lease = Lease {
            id,
            slot,
            busy: Arc::new(AtomicBool::new(false)),
            evict: CancellationToken::new(),
            slots: self.clone(),
        };
        inner.held.push(Held {
            id,
            slot,
            busy: lease.busy.clone(),
            evict: lease.evict.clone(),
        });
        Some(Admitted { lease, evicted })
    }
}

/// A connection's slot: marks its requests in progress, tells it when it was
/// closed to make room, and frees the slot when dropped.
pub struct Lease {
    id: u64,
    /// Regular or reserved.
    pub slot: Slot,
    busy: Arc<AtomicBool>,
    evict: CancellationToken,
    slots: Arc<Slots>,
}

impl Lease {
    /// Fires when the connection is to close at once (its slot went to another).
    pub fn evicted(&self) -> CancellationToken {
        self.evict.clone()
    }

    /// Mark a request in progress until the guard is dropped; meanwhile the
    /// connection is never closed to make room.
    pub fn busy(&self) -> Busy {
        self.busy.store(true, Ordering::Release);
        Busy(self.busy.clone())
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut inner = self.slots.lock();
        if let Some(i) = inner.held.iter().position(|h| h.id == self.id) {
            inner.held.remove(i);
        }
    }
}

/// A request in progress (see [`Lease::busy`]).
pub struct Busy(Arc<AtomicBool>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_connections_make_room_oldest_first() {
        let slots = Slots::new(2, 1);
        let a = slots.admit().unwrap();
        let b = slots.admit().unwrap();
        assert_eq!((a.lease.slot, b.lease.slot), (Slot::Regular, Slot::Regular));
        assert!(!a.evicted && !b.evicted);
        // Both regular slots idle: the oldest (a) makes room.
        let c = slots.admit().unwrap();
        assert_eq!(c.lease.slot, Slot::Regular);
        assert!(c.evicted && a.lease.evicted().is_cancelled());
        assert!(!b.lease.evicted().is_cancelled());
        // Busy connections are never closed: the reserve is used, then its idle one.
        let _b_busy = b.lease.busy();
        let _c_busy = c.lease.busy();
        let d = slots.admit().unwrap();
        assert_eq!((d.lease.slot, d.evicted), (Slot::Reserved, false));
        let e = slots.admit().unwrap();
        assert_eq!((e.lease.slot, e.evicted), (Slot::Reserved, true));
        assert!(d.lease.evicted().is_cancelled());
        let _e_busy = e.lease.busy();
        assert!(slots.admit().is_none(), "every slot busy");
        // A request done: that connection is idle again; a dropped lease frees its slot.
        drop(_b_busy);
        assert!(slots.admit().unwrap().evicted);
        drop(a);
        drop(e);
        assert!(!slots.admit().unwrap().evicted);
    }
}
