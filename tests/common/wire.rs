//! A faulty cable for the namespace lab (tests/common/netns.rs): a host's `eth0` and
//! its switch port are two TAP devices, and two threads of the test carry every
//! Ethernet frame between them, applying netem's fault model on the way: loss,
//! duplication, reordering, delay with jitter, a rate limit, and a pulled cable.
//!
//! Why not `tc qdisc ... netem`: the CI machine's kernel has no `sch_netem` (nor
//! modules to load), and a test that needs a missing tool fails. The model follows
//! netem's: each direction on its own, a frame lost or duplicated by probability,
//! held back for `delay ± jitter` (uniform; jitter reorders frames, as netem's does),
//! sent at once with probability `reorder` while the others wait `delay`, and
//! serialised at `rate` bits/s behind a queue of [`QUEUE_LIMIT`] frames.
#![allow(unsafe_code)] // the TUNSETIFF ioctl and poll(2)

use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// Frames a direction holds back at most (netem's own default); more are dropped.
const QUEUE_LIMIT: usize = 1000;
/// Line time a rate-limited direction queues at most, like `tbf ... latency`: a
/// frame that would wait longer is dropped (1000 frames would be 12 s at 1 Mbit/s).
const RATE_BACKLOG: Duration = Duration::from_millis(400);
/// Longest a pump waits without a frame before it looks at `stop` again.
const IDLE_POLL: Duration = Duration::from_millis(50);
/// Largest frame read (MTU 1500 plus headers; TAP without offloads gets no GSO).
const FRAME_MAX: usize = 65536;

/// What one cable does to the frames crossing it, in both directions alike.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Faults {
    /// Share of frames lost (0.01 = 1 %).
    pub loss: f64,
    /// Share of frames sent twice.
    pub duplicate: f64,
    /// Share of frames sent at once while the others wait `delay` (netem `reorder`).
    pub reorder: f64,
    /// Time every frame is held back.
    pub delay: Duration,
    /// Uniform spread around `delay` (± this).
    pub jitter: Duration,
    /// Bits per second at most (0: unlimited).
    pub rate_bps: u64,
    /// The cable is pulled: every frame is lost.
    pub down: bool,
}

impl Faults {
    /// How `tc qdisc ... netem` would say it (for the figures).
    pub fn describe(&self) -> String {
        let mut out = Vec::new();
        let pct = |x: f64| format!("{}%", x * 100.0);
        if self.down {
            out.push("down".to_string());
        }
        if self.loss > 0.0 {
            out.push(format!("loss {}", pct(self.loss)));
        }
        if self.duplicate > 0.0 {
            out.push(format!("duplicate {}", pct(self.duplicate)));
        }
        if !self.delay.is_zero() {
            out.push(format!("delay {:?} {:?}", self.delay, self.jitter));
        }
        if self.reorder > 0.0 {
            out.push(format!("reorder {}", pct(self.reorder)));
        }
        if self.rate_bps > 0 {
            out.push(format!("rate {}kbit", self.rate_bps / 1000));
        }
        if out.is_empty() {
            "none".into()
        } else {
            out.join(" ")
        }
    }
}

/// One cable: two TAP devices and the two threads pumping frames between them.
pub struct Wire {
    faults: Arc<Mutex<Faults>>,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Wire {
    /// Make TAP device `host_dev` in namespace `host_ns` and `port_dev` in `port_ns`
    /// (the switch), and start pumping between them without faults. The devices are
    /// left down; the caller brings them up and bridges the port.
    pub fn new(host_ns: &str, host_dev: &str, port_ns: &str, port_dev: &str) -> Result<Wire> {
        let host = tap_in(host_ns, host_dev)?;
        let port = tap_in(port_ns, port_dev)?;
        let faults = Arc::new(Mutex::new(Faults::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for (from, to, seed) in [(host.try_clone()?, port.try_clone()?, 1), (port, host, 2)] {
            let (faults, stop) = (faults.clone(), stop.clone());
            threads.push(std::thread::spawn(move || {
                pump(from, to, &faults, &stop, seed)
            }));
        }
        Ok(Wire {
            faults,
            stop,
            threads,
        })
    }

    /// Apply `faults` from now on (frames already held back keep their times).
    pub fn set(&self, faults: Faults) {
        *self.faults.lock().unwrap_or_else(|p| p.into_inner()) = faults;
    }

    /// The faults applied now.
    pub fn get(&self) -> Faults {
        *self.faults.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for Wire {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join(); // ok: a pump that panicked already printed why
        }
    }
}

/// A frame held back until `at`.
struct Held {
    at: Instant,
    seq: u64,
    frame: Vec<u8>,
}

impl PartialEq for Held {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Held {}
impl PartialOrd for Held {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Held {
    // A max-heap: the earliest release (then the earliest arrival) on top.
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

/// Carry frames `from` -> `to` until `stop`, applying the current faults.
fn pump(mut from: File, mut to: File, faults: &Mutex<Faults>, stop: &AtomicBool, seed: u64) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut held: BinaryHeap<Held> = BinaryHeap::new();
    let mut seq = 0u64;
    let mut line_free = Instant::now();
    let mut buf = vec![0u8; FRAME_MAX];
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        while held.peek().is_some_and(|h| h.at <= now) {
            if let Some(h) = held.pop() {
                // A frame the kernel refuses is a frame lost on the wire.
                let _ = to.write(&h.frame); // ok: see above
            }
        }
        let wait = held
            .peek()
            .map_or(IDLE_POLL, |h| h.at.saturating_duration_since(now))
            .min(IDLE_POLL);
        if !readable(&from, wait) {
            continue;
        }
        let n = match from.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return, // the device is gone: the lab is being taken down
        };
        let f = *faults.lock().unwrap_or_else(|p| p.into_inner());
        if f.down || rng.f64() < f.loss || held.len() >= QUEUE_LIMIT {
            continue;
        }
        let copies = if rng.f64() < f.duplicate { 2 } else { 1 };
        let now = Instant::now();
        let mut at = now;
        if let Some(us) = (n as u64 * 8 * 1_000_000).checked_div(f.rate_bps) {
            if line_free.saturating_duration_since(now) > RATE_BACKLOG {
                continue;
            }
            line_free = line_free.max(now) + Duration::from_micros(us);
            at = line_free;
        }
        if !(f.reorder > 0.0 && rng.f64() < f.reorder) {
            at += jittered(&mut rng, f.delay, f.jitter);
        }
        for _ in 0..copies {
            seq += 1;
            held.push(Held {
                at,
                seq,
                frame: buf[..n].to_vec(),
            });
        }
    }
}

/// `delay ± jitter`, uniform.
fn jittered(rng: &mut fastrand::Rng, delay: Duration, jitter: Duration) -> Duration {
    if jitter.is_zero() {
        return delay;
    }
    let j = jitter.as_micros() as i64;
    let us = delay.as_micros() as i64 + rng.i64(-j..=j);
    Duration::from_micros(us.max(0) as u64)
}

/// Whether `f` has a frame to read within `wait`.
fn readable(f: &File, wait: Duration) -> bool {
    let mut pfd = libc::pollfd {
        fd: f.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = libc::c_int::try_from(wait.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: poll reads and writes the one pollfd we own, for the fd `f` keeps open.
    let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
    rc > 0 && pfd.revents & libc::POLLIN != 0
}

/// TUNSETIFF (`_IOW('T', 202, int)`).
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
/// `IFF_TAP | IFF_NO_PI`: Ethernet frames, no packet-info header.
const TAP_FLAGS: libc::c_short = 0x0002 | 0x1000;

/// Make TAP device `dev` in network namespace `ns` and return its queue: the device
/// lives in the namespace of the thread that makes it, the descriptor works anywhere.
fn tap_in(ns: &str, dev: &str) -> Result<File> {
    if dev.len() >= 16 {
        bail!("interface name {dev} is too long");
    }
    let path = PathBuf::from("/run/netns").join(ns);
    let dev = dev.to_string();
    std::thread::spawn(move || -> Result<File> {
        let nsf = File::open(&path).with_context(|| format!("opening {path:?}"))?;
        nix::sched::setns(nsf, nix::sched::CloneFlags::CLONE_NEWNET).context("setns")?;
        let tun = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/net/tun")
            .context("opening /dev/net/tun")?;
        // struct ifreq: the name (16 bytes), then the flags (a short) in the union.
        let mut ifr = [0u8; 40];
        ifr[..dev.len()].copy_from_slice(dev.as_bytes());
        ifr[16..18].copy_from_slice(&TAP_FLAGS.to_ne_bytes());
        // SAFETY: TUNSETIFF reads (and writes back the name into) the 40-byte ifreq
        // we own, on the tun fd we just opened.
        let rc = unsafe { libc::ioctl(tun.as_raw_fd(), TUNSETIFF as _, ifr.as_mut_ptr()) };
        if rc != 0 {
            bail!("TUNSETIFF {dev}: {}", std::io::Error::last_os_error());
        }
        Ok(tun)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("TAP thread panicked"))?
}
