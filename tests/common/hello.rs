//! Captured ClientHellos made hostile: parse a fixture, forge its session state.
use crossbar::hello::{parse_client_hello, ClientHelloInfo, HelloParse};

/// A captured hello, parsed (a fixture that does not parse fails the test).
pub fn parsed(hello: &[u8]) -> ClientHelloInfo {
    match parse_client_hello(hello, 16384) {
        HelloParse::Found(h) => h,
        other => panic!("fixture does not parse: {other:?}"),
    }
}

/// Overwrite every occurrence of `what` in `hello` with the same random bytes, and
/// return them; `what` must occur.
pub fn forge(hello: &mut [u8], what: &[u8], rng: &mut fastrand::Rng) -> Vec<u8> {
    let fake: Vec<u8> = (0..what.len()).map(|_| rng.u8(..)).collect();
    let mut found = false;
    let mut i = 0;
    while i + what.len() <= hello.len() {
        if &hello[i..i + what.len()] == what {
            hello[i..i + what.len()].copy_from_slice(&fake);
            found = true;
            i += what.len();
        } else {
            i += 1;
        }
    }
    assert!(found, "value not in hello");
    fake
}
