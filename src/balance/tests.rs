//! The pools' behaviour: shares, ramps, queues, reloads.

use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::config::{BackendConfig, Balance};

use crate::config::BackendAddress;
use crate::metrics::Metrics;

fn backend(name: &str, weight: u32, backup: bool, max: Option<u32>) -> BackendConfig {
    let address = BackendAddress {
        host: "127.0.0.1".into(),
        port: 1,
    };
    BackendConfig {
        weight,
        backup,
        max_connections: max,
        ..BackendConfig::new(name, address)
    }
}

fn pool(algo: Balance, backends: &[BackendConfig]) -> Pool {
    let m = Metrics::new();
    Pool::new(
        backends,
        PoolParams {
            algo,
            slow_start: Duration::ZERO,
            queue_size: 4,
            queue_timeout: Duration::from_millis(200),
        },
        |b| m.backend("t", &b.name),
        None,
    )
}

#[test]
fn first_choice_is_where_first_sends_the_next_connection() {
    let p = pool(
        Balance::First,
        &[
            backend("a", 1, false, Some(1)),
            backend("b", 1, false, None),
            backend("c", 1, true, None),
        ],
    );
    let first = |p: &Pool| p.first_choice().map(|b| b.name.to_string());
    assert_eq!(first(&p).as_deref(), Some("a"));
    let lease = p.try_pick(ip(1), &[]).expect("a slot");
    assert_eq!(&*lease.backend().name, "a");
    assert_eq!(first(&p).as_deref(), Some("b"), "a is full");
    drop(lease);
    p.backends[0].set_healthy(false);
    p.backends[1].set_admin_state(AdminState::Drain);
    assert_eq!(first(&p).as_deref(), Some("c"), "the backup");
    p.backends[2].set_healthy(false);
    assert_eq!(first(&p), None);
}

fn ip(n: u32) -> IpAddr {
    IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + n))
}

async fn names(p: &Pool, n: usize) -> Vec<String> {
    let mut out = Vec::new();
    for _ in 0..n {
        let l = p.acquire(ip(1), &[]).await.unwrap();
        out.push(l.backend().name.to_string());
    }
    out
}

#[tokio::test]
async fn round_robin_is_even_and_smooth() {
    let p = pool(
        Balance::RoundRobin,
        &[
            backend("a", 1, false, None),
            backend("b", 1, false, None),
            backend("c", 1, false, None),
        ],
    );
    let got = names(&p, 9).await;
    for n in ["a", "b", "c"] {
        assert_eq!(got.iter().filter(|x| *x == n).count(), 3, "{got:?}");
    }
    let p = pool(
        Balance::RoundRobin,
        &[
            backend("a", 5, false, None),
            backend("b", 1, false, None),
            backend("c", 1, false, None),
        ],
    );
    let got = names(&p, 7).await;
    assert_eq!(got.iter().filter(|x| *x == "a").count(), 5, "{got:?}");
    // Smooth: never three a's in a row within one cycle of 7.
    assert!(
        !got.windows(3).any(|w| w.iter().all(|x| x == "a")),
        "{got:?}"
    );
}

/// Picks from several threads at once give every backend exactly its share
/// per cycle, before and after the weights change at run time (the first pick
/// after the change rebuilds the schedule, the others wait for it).
#[test]
fn round_robin_from_many_threads_keeps_exact_shares_across_weight_changes() {
    let p = pool(
        Balance::RoundRobin,
        &[
            backend("a", 12, false, None),
            backend("b", 4, false, None),
            backend("c", 2, false, None),
        ],
    );
    let picks = |p: &Pool, per_thread: usize| {
        let counts: [AtomicUsize; 3] = Default::default();
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..per_thread {
                        let lease = p.try_pick(ip(1), &[]).expect("a free backend");
                        counts[lease.backend().index].fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
        });
        counts.map(|c| c.into_inner())
    };
    // 4 threads x 50 cycles of 18 picks.
    assert_eq!(picks(&p, 18 * 50), [2400, 800, 400]);
    p.backends[0].set_weight(1);
    p.backends[2].set_weight(3);
    // 4 threads x 100 cycles of 8 picks at 1:4:3.
    assert_eq!(picks(&p, 8 * 100), [400, 1600, 1200]);
}

/// A connection that already tried a backend is given the others in their
/// proportions; the schedule stepping over the tried one.
#[test]
fn round_robin_steps_over_a_tried_backend_keeping_proportions() {
    let p = pool(
        Balance::RoundRobin,
        &[
            backend("a", 4, false, None),
            backend("b", 2, false, None),
            backend("c", 1, false, None),
        ],
    );
    let mut counts = [0usize; 3];
    for _ in 0..7 * 30 {
        counts[p.try_pick(ip(1), &[0]).expect("b or c").backend().index] += 1;
    }
    assert_eq!(counts, [0, 140, 70]);
    // Everyone else still gets the full cycle.
    let mut counts = [0usize; 3];
    for _ in 0..7 * 30 {
        counts[p
            .try_pick(ip(1), &[])
            .expect("a free backend")
            .backend()
            .index] += 1;
    }
    assert_eq!(counts, [120, 60, 30]);
}

#[tokio::test]
async fn a_run_time_weight_applies_to_the_next_picks_and_zero_leaves_sticky_hits() {
    let p = pool(
        Balance::RoundRobin,
        &[backend("a", 1, false, None), backend("b", 1, false, None)],
    );
    p.backends[0].set_weight(3);
    let got = names(&p, 8).await;
    assert_eq!(got.iter().filter(|x| *x == "a").count(), 6, "{got:?}");
    p.backends[0].set_weight(0);
    assert_eq!(names(&p, 4).await, ["b", "b", "b", "b"]);
    assert_eq!(p.backends[0].state(), State::Up, "weight 0 is not a drain");
    let sticky = p.try_preferred(0).expect("a sticky hit still reaches it");
    assert_eq!(&*sticky.backend().name, "a");
    // Every primary at 0: the backup takes new connections, as when they are down.
    let p = pool(
        Balance::First,
        &[backend("a", 1, false, None), backend("bk", 1, true, None)],
    );
    p.backends[0].set_weight(0);
    assert_eq!(names(&p, 1).await, ["bk"]);
    assert_eq!(p.backends[0].metrics.weight.get(), 0);
    p.backends[0].set_weight(MAX_WEIGHT + 1);
    assert_eq!(p.backends[0].weight(), MAX_WEIGHT, "clamped");
}

#[tokio::test]
async fn a_reloaded_pool_starts_from_the_configured_weight() {
    let m = Metrics::new();
    let params = PoolParams {
        algo: Balance::RoundRobin,
        slow_start: Duration::ZERO,
        queue_size: 4,
        queue_timeout: Duration::from_secs(1),
    };
    let configs = [backend("a", 2, false, None)];
    let old = Pool::new(&configs, params, |b| m.backend("t", &b.name), None);
    old.backends[0].set_weight(0);
    old.backends[0].set_admin_state(AdminState::Drain);
    let new = Pool::new(&configs, params, |b| m.backend("t", &b.name), Some(&old));
    assert_eq!(new.backends[0].weight(), 2);
    assert_eq!(new.backends[0].metrics.weight.get(), 2);
    assert_eq!(new.backends[0].admin_state(), AdminState::Drain, "carried");
}

#[tokio::test]
async fn least_conn_prefers_the_idle_backend() {
    let p = pool(
        Balance::LeastConn,
        &[backend("a", 1, false, None), backend("b", 1, false, None)],
    );
    let first = p.acquire(ip(1), &[]).await.unwrap();
    let second = p.acquire(ip(1), &[]).await.unwrap();
    assert_ne!(first.backend().name, second.backend().name);
    let busy = first.backend().name.clone();
    drop(second);
    for _ in 0..5 {
        let l = p.acquire(ip(1), &[]).await.unwrap();
        assert_ne!(l.backend().name, busy);
    }
    drop(first);
}

#[tokio::test]
async fn first_and_backup_order() {
    let p = pool(
        Balance::First,
        &[
            backend("ca1", 1, false, None),
            backend("ca2", 1, true, None),
            backend("ca3", 1, true, None),
        ],
    );
    assert_eq!(names(&p, 3).await, ["ca1", "ca1", "ca1"]);
    p.backends[0].set_healthy(false);
    assert_eq!(names(&p, 2).await, ["ca2", "ca2"]);
    p.backends[1].set_admin_state(AdminState::Drain);
    assert_eq!(names(&p, 1).await, ["ca3"]);
    p.backends[0].set_healthy(true);
    assert_eq!(names(&p, 1).await, ["ca1"]);
}

#[tokio::test]
async fn backups_take_retries_once_every_primary_was_tried() {
    let p = pool(
        Balance::RoundRobin,
        &[backend("a", 1, false, None), backend("bk", 1, true, None)],
    );
    // Primary "a" refused this connection (tried): the retry goes to the backup.
    assert_eq!(&*p.acquire(ip(1), &[0]).await.unwrap().backend().name, "bk");
    assert_eq!(
        p.acquire(ip(1), &[0, 1]).await.unwrap_err(),
        PickError::NoBackendAvailable
    );
}

#[tokio::test]
async fn source_is_stable_and_moves_about_one_nth_when_adding() {
    let three = [
        backend("a", 1, false, None),
        backend("b", 1, false, None),
        backend("c", 1, false, None),
    ];
    let four = [
        three[0].clone(),
        three[1].clone(),
        three[2].clone(),
        backend("d", 1, false, None),
    ];
    let (p3, p4) = (pool(Balance::Source, &three), pool(Balance::Source, &four));
    let clients = 2000;
    let mut moved = 0;
    for c in 0..clients {
        let a = p3.acquire(ip(c), &[]).await.unwrap().backend().name.clone();
        let again = p3.acquire(ip(c), &[]).await.unwrap().backend().name.clone();
        assert_eq!(a, again);
        let b = p4.acquire(ip(c), &[]).await.unwrap().backend().name.clone();
        if a != b {
            assert_eq!(&*b, "d", "a client moved between old backends");
            moved += 1;
        }
    }
    let share = f64::from(moved) / f64::from(clients);
    assert!((0.18..0.32).contains(&share), "moved {share}");
}

#[tokio::test]
async fn max_connections_queue_and_timeout() {
    let p = pool(Balance::RoundRobin, &[backend("a", 1, false, Some(1))]);
    let held = p.acquire(ip(1), &[]).await.unwrap();
    assert_eq!(
        p.acquire(ip(1), &[]).await.unwrap_err(),
        PickError::QueueTimeout
    );
    // A queued connection gets the slot as soon as it is released.
    let p = Arc::new(p);
    let waiter = tokio::spawn({
        let p = p.clone();
        async move {
            p.acquire(ip(1), &[])
                .await
                .map(|l| l.backend().name.to_string())
        }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(p.queued(), 1);
    drop(held);
    assert_eq!(waiter.await.unwrap().unwrap(), "a");
}

/// Two queued connections, two full backends: one connection already tried `a`
/// (a retry), the other can use either. The slot `a` frees goes to the one that
/// can use it, at once, though the retry queued first; `b`'s goes to the retry.
#[tokio::test]
async fn a_freed_slot_wakes_a_waiter_that_can_use_it() {
    let m = Metrics::new();
    let p = Arc::new(Pool::new(
        &[
            backend("a", 1, false, Some(1)),
            backend("b", 1, false, Some(1)),
        ],
        PoolParams {
            algo: Balance::RoundRobin,
            slow_start: Duration::ZERO,
            queue_size: 4,
            queue_timeout: Duration::from_secs(60),
        },
        |b| m.backend("t", &b.name),
        None,
    ));
    let held_a = p.try_preferred(0).unwrap();
    let held_b = p.try_preferred(1).unwrap();
    let queue = |tried: Vec<usize>| {
        let p = p.clone();
        tokio::spawn(async move {
            p.acquire(ip(1), &tried)
                .await
                .map(|l| l.backend().name.to_string())
        })
    };
    let queued = |n| {
        let p = p.clone();
        async move {
            while p.queued() < n {
                tokio::task::yield_now().await;
            }
        }
    };
    let retry = queue(vec![0]);
    queued(1).await;
    let fresh = queue(vec![]);
    queued(2).await;
    drop(held_a);
    // Before the fix the retry, first in the queue, took this wakeup, could not
    // use `a` and waited on: `fresh` waited for its queue timeout.
    assert_eq!(fresh.await.unwrap(), Ok("a".to_string()));
    drop(held_b);
    assert_eq!(retry.await.unwrap(), Ok("b".to_string()));
}

#[tokio::test]
async fn a_reloaded_pool_shares_counts_and_queue_with_the_old_one() {
    let m = Metrics::new();
    let params = PoolParams {
        algo: Balance::RoundRobin,
        slow_start: Duration::ZERO,
        queue_size: 4,
        queue_timeout: Duration::from_secs(60),
    };
    let configs = [backend("a", 1, false, Some(1))];
    let old = Pool::new(&configs, params, |b| m.backend("t", &b.name), None);
    let held = old.acquire(ip(1), &[]).await.unwrap();
    old.backends[0].set_admin_state(AdminState::Drain);
    let new = Arc::new(Pool::new(
        &configs,
        params,
        |b| m.backend("t", &b.name),
        Some(&old),
    ));
    assert_eq!(new.backends[0].active(), 1, "the old connection counts");
    assert_eq!(new.backends[0].admin_state(), AdminState::Drain);
    new.backends[0].set_admin_state(AdminState::Enabled);
    let waiter = tokio::spawn({
        let new = new.clone();
        async move { new.acquire(ip(1), &[]).await.map(|l| l.backend().active()) }
    });
    for _ in 0..10_000 {
        if new.queued() == 1 {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(new.queued(), 1, "full: the new client queues");
    drop(held); // released on the old pool: wakes the client queued on the new one
    assert_eq!(waiter.await.unwrap(), Ok(1));
    // Another address is another server: it starts from nothing.
    let _kept = new.try_pick(ip(1), &[]).unwrap();
    let mut moved = configs[0].clone();
    moved.address.port = 2;
    let fresh = Pool::new(&[moved], params, |b| m.backend("t", &b.name), Some(&new));
    assert_eq!(fresh.backends[0].active(), 0);
}

#[tokio::test]
async fn slow_start_ramps_a_recovered_backend() {
    let m = Metrics::new();
    let p = Pool::new(
        &[backend("a", 1, false, None), backend("b", 1, false, None)],
        PoolParams {
            algo: Balance::RoundRobin,
            slow_start: Duration::from_secs(1),
            queue_size: 4,
            queue_timeout: Duration::from_millis(200),
        },
        |b| m.backend("t", &b.name),
        None,
    );
    p.backends[1].set_healthy(false);
    p.backends[1].set_healthy(true);
    // Just back: b's weight is a small fraction of a's.
    let early = names(&p, 40).await.iter().filter(|n| *n == "b").count();
    assert!(early <= 8, "b got {early}/40 right after recovery");
    // After the ramp: even again (time itself is what this test is about).
    tokio::time::sleep(Duration::from_millis(1050)).await;
    let late = names(&p, 40).await.iter().filter(|n| *n == "b").count();
    assert!((18..=22).contains(&late), "b got {late}/40 after the ramp");
}

#[tokio::test]
async fn queue_is_bounded() {
    let p = Arc::new(pool(
        Balance::RoundRobin,
        &[backend("a", 1, false, Some(1))],
    ));
    let _held = p.acquire(ip(1), &[]).await.unwrap();
    let waiters: Vec<_> = (0..4)
        .map(|_| {
            let p = p.clone();
            tokio::spawn(async move { p.acquire(ip(1), &[]).await.map(|_| ()) })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        p.acquire(ip(1), &[]).await.unwrap_err(),
        PickError::QueueFull
    );
    for w in waiters {
        assert_eq!(w.await.unwrap().unwrap_err(), PickError::QueueTimeout);
    }
}

#[tokio::test]
async fn every_algorithm_balances_by_the_weight_the_views_show() {
    use crate::feedback::cell::FACTOR_ONE;
    for algo in [Balance::RoundRobin, Balance::LeastConn, Balance::Source] {
        let p = pool(
            algo,
            &[backend("a", 3, false, None), backend("b", 1, false, None)],
        );
        // Feedback halves a (3 x 0.5 = 1.5) and leaves b at 1: 60 % / 40 %.
        p.backends[0]
            .feedback()
            .publish(FACTOR_ONE / 2, false, None);
        let shown: Vec<f64> = p.backends.iter().map(|b| p.weight_of(b).as_f64()).collect();
        assert_eq!(shown, [1.5, 1.0], "{algo:?}");
        let mut held = Vec::new();
        let mut a = 0;
        for n in 0..500u32 {
            let lease = p.acquire(ip(n), &[]).await.unwrap();
            a += usize::from(lease.backend().index == 0);
            if algo == Balance::LeastConn {
                held.push(lease); // leastconn balances open connections
            }
        }
        assert!(
            (270..=330).contains(&a),
            "{algo:?}: a took {a}/500, want ~300"
        );
    }
}

#[test]
fn the_weight_counts_a_factor_and_a_ramp_in_sixteenths() {
    use crate::feedback::cell::FACTOR_ONE;
    let p = pool(Balance::RoundRobin, &[backend("a", 4, false, None)]);
    let b = &p.backends[0];
    assert_eq!(p.weight_of(b).as_f64(), 4.0);
    b.feedback().publish(FACTOR_ONE * 124 / 100, false, None);
    // 1.24 is 19.84 sixteenths: 20, so 4 x 20/16 = 5.
    assert_eq!(p.weight_of(b).as_f64(), 5.0);
    b.feedback().publish(1, false, None);
    assert_eq!(p.weight_of(b).as_f64(), 0.25, "at least one sixteenth");
    b.set_weight(0);
    assert_eq!(
        p.weight_of(b).units(),
        0,
        "weight 0 is 0 whatever the factor"
    );
}
