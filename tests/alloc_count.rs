//! Allocations on the connection path, counted (not timed): the ClientHello parse
//! and the server-flight watcher on captured real handshakes must not allocate more
//! than the figures below (they once took ~25 allocator calls per TLS connection,
//! a Vec per extension, cipher, group and version list).
//!
//! A counting global allocator counts the calls made on the test's own thread, so
//! tests running beside it on other threads do not change the figure: it is
//! deterministic.
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use crossbar::hello::{parse_client_hello, HelloParse, ServerWatcher};

struct Counting;

thread_local! {
    /// Allocator calls (alloc, alloc_zeroed, realloc) on this thread while counting.
    static CALLS: Cell<usize> = const { Cell::new(0) };
    static ON: Cell<bool> = const { Cell::new(false) };
}

fn count() {
    // `try_with`: the allocator also runs while thread-locals are torn down.
    let _ = ON.try_with(|on| {
        if on.get() {
            let _ = CALLS.try_with(|c| c.set(c.get() + 1));
        }
    });
}

// SAFETY: every call forwards to the system allocator unchanged; counting touches
// only const-initialised thread-locals, which never allocate.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: forwarded as received.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: forwarded as received.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: forwarded as received.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as received.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Allocator calls `f` makes on this thread.
fn allocations<T>(f: impl FnOnce() -> T) -> (usize, T) {
    CALLS.with(|c| c.set(0));
    ON.with(|on| on.set(true));
    let out = f();
    ON.with(|on| on.set(false));
    (CALLS.with(Cell::get), out)
}

fn fixture(path: &str) -> Vec<u8> {
    let path = format!("{}/tests/fixtures/{path}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Most allocator calls parsing a captured full-handshake ClientHello may take:
/// the normalised SNI (the name the access log and routing keep).
const HELLO_ALLOCATIONS: usize = 1;
/// ... a resuming one: the SNI plus the offered ticket or PSK identity it is
/// placed by (the list of identities and one identity).
const RESUMING_HELLO_ALLOCATIONS: usize = 3;
/// Most allocator calls watching a captured server flight may take: a record cut
/// by a read is reassembled (one buffer, reserved whole), a TLS 1.2
/// NewSessionTicket's ticket is kept to learn it; the TLS 1.2 full flight here
/// takes one of them, the others none.
const WATCH_ALLOCATIONS: usize = 1;

#[test]
fn client_hello_parse_allocates_only_what_it_keeps() {
    let cases = [
        ("hellos/openssl3_tls13.bin", HELLO_ALLOCATIONS),
        ("hellos/openssl3_tls12.bin", HELLO_ALLOCATIONS),
        ("hellos/curl7_openssl3.bin", HELLO_ALLOCATIONS),
        ("hellos/java17.bin", HELLO_ALLOCATIONS),
        ("hellos/java17_tls12.bin", HELLO_ALLOCATIONS),
        ("hellos/wget_gnutls_localhost.bin", HELLO_ALLOCATIONS),
        ("hellos/openssl3_tls13_psk.bin", RESUMING_HELLO_ALLOCATIONS),
        (
            "hellos/openssl3_tls12_ticket.bin",
            RESUMING_HELLO_ALLOCATIONS,
        ),
    ];
    let mut failed = Vec::new();
    for (name, most) in cases {
        let hello = fixture(name);
        let (n, parsed) = allocations(|| parse_client_hello(&hello, 16 * 1024));
        assert!(matches!(parsed, HelloParse::Found(_)), "{name}: {parsed:?}");
        println!("{name}: {n} allocator calls");
        if n > most {
            failed.push(format!("{name}: {n} allocator calls (at most {most})"));
        }
    }
    assert!(failed.is_empty(), "{failed:#?}");
}

#[test]
fn server_watcher_allocates_only_what_it_keeps() {
    let mut failed = Vec::new();
    for name in [
        "openssl3_tls13_full",
        "openssl3_tls13_resumed",
        "openssl3_tls12_full",
        "openssl3_tls12_resumed",
    ] {
        let server = fixture(&format!("server_flights/{name}.server.bin"));
        // As the relay feeds it: in reads of at most 16 KiB, here cut at odd places.
        let (n, done) = allocations(|| {
            let mut w = ServerWatcher::new(64 * 1024);
            let mut done = false;
            for chunk in server.chunks(1000) {
                done = w.feed(chunk);
                if done {
                    break;
                }
            }
            done
        });
        assert!(done, "{name}: the watcher should finish on a whole flight");
        println!("{name}: {n} allocator calls");
        if n > WATCH_ALLOCATIONS {
            failed.push(format!(
                "{name}: {n} allocator calls (at most {WATCH_ALLOCATIONS})"
            ));
        }
    }
    assert!(failed.is_empty(), "{failed:#?}");
}
