//! Stable, bounded versions of the fuzz targets in `fuzz/` (which need nightly): the
//! same property checks (`fuzz/src/lib.rs`, included below) driven by a seeded PRNG
//! over captured hellos and server flights, their mutations and random bytes, plus
//! segmentation invariance of real hellos and regressions found by fuzzing.
//!
//! Each property runs a fixed number of cases, the same on every machine however
//! fast or loaded (no clock decides how many, or whether it passed: a slow run is
//! only slow). A failure prints the seed; `FUZZ_PROPS_SEED=<n>` replays it.
use std::path::{Path, PathBuf};
use std::time::Instant;

use crossbar::config::Config;
use crossbar::hello::{parse_client_hello, ClientHelloInfo, HelloError, HelloParse};

#[path = "../fuzz/src/lib.rs"]
#[allow(dead_code)]
mod checks;

/// Cases per property: a few thousand each, about 2 s of CPU for the slowest
/// property (config mutations) in a debug build.
const CASES: usize = 3000;

/// The PRNG seed: fixed (reproducible CI), or `FUZZ_PROPS_SEED` to replay or explore.
fn seed() -> u64 {
    std::env::var("FUZZ_PROPS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x00c0_ffee_b0a7)
}

/// Run `case` [`CASES`] times, each with its own RNG seeded from the base seed and
/// the case number; a panic names the case's seed.
fn run_cases(name: &str, mut case: impl FnMut(&mut fastrand::Rng)) {
    let started = Instant::now();
    let base = seed();
    for n in 0..CASES {
        let s = base.wrapping_add(n as u64);
        let mut rng = fastrand::Rng::with_seed(s);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| case(&mut rng)));
        if let Err(e) = r {
            eprintln!("{name}: case {n} failed (replay with FUZZ_PROPS_SEED={s} and case 0)");
            std::panic::resume_unwind(e);
        }
    }
    println!("{name}: {CASES} cases in {:?}", started.elapsed());
}

fn fixtures(dir: &str, suffix: &str) -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(suffix))
        .map(|p: PathBuf| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&p).unwrap())
        })
        .collect();
    out.sort();
    assert!(!out.is_empty(), "no {suffix} fixtures in {}", dir.display());
    out
}

fn hellos() -> Vec<(String, Vec<u8>)> {
    fixtures("tests/fixtures/hellos", ".bin")
}

fn flights() -> Vec<(String, Vec<u8>)> {
    fixtures("tests/fixtures/server_flights", ".server.bin")
}

fn found(data: &[u8]) -> ClientHelloInfo {
    match parse_client_hello(data, checks::DEFAULT_MAX_HELLO) {
        HelloParse::Found(h) => h,
        other => panic!("expected a hello: {other:?}"),
    }
}

/// Random cut points (sorted by the check itself).
fn cuts(rng: &mut fastrand::Rng, len: usize) -> Vec<usize> {
    let n = rng.usize(0..=8.min(len + 1));
    (0..n).map(|_| rng.usize(0..=len)).collect()
}

/// One random mutation of `data`: flip, overwrite a length-ish byte, insert, delete,
/// truncate, duplicate a span, or splice in random bytes.
fn mutate(rng: &mut fastrand::Rng, data: &mut Vec<u8>) {
    if data.is_empty() {
        data.push(rng.u8(..));
        return;
    }
    let i = rng.usize(..data.len());
    match rng.u8(0..7) {
        0 => data[i] ^= 1 << rng.u8(0..8),
        1 => {
            data[i] = *[0x00, 0x01, 0x7f, 0x80, 0xff, 0x16, 0x03]
                .get(rng.usize(..7))
                .unwrap()
        }
        2 => data.insert(i, rng.u8(..)),
        3 => {
            data.remove(i);
        }
        4 => data.truncate(i),
        5 => {
            let j = rng.usize(i..=data.len().min(i + 64));
            let span = data[i..j].to_vec();
            data.splice(i..i, span);
        }
        _ => {
            let n = rng.usize(1..=16).min(data.len() - i);
            for b in &mut data[i..i + n] {
                *b = rng.u8(..);
            }
        }
    }
}

// ---------------------------------------------------------------------------
// client_hello

#[test]
fn client_hello_every_prefix_of_every_real_hello() {
    for (name, hello) in hellos() {
        let every: Vec<usize> = (0..hello.len()).collect();
        let r = checks::client_hello(&hello, &every, checks::DEFAULT_MAX_HELLO);
        assert!(matches!(r, HelloParse::Found(_)), "{name}: {r:?}");
    }
}

#[test]
fn client_hello_mutated_real_hellos() {
    let hellos = hellos();
    run_cases("client_hello/mutated", |rng| {
        let (_, base) = &hellos[rng.usize(..hellos.len())];
        let mut data = base.clone();
        for _ in 0..rng.usize(1..=4) {
            mutate(rng, &mut data);
        }
        let max = if rng.bool() {
            checks::DEFAULT_MAX_HELLO
        } else {
            rng.usize(5..1024)
        };
        let c = cuts(rng, data.len());
        checks::client_hello(&data, &c, max);
    });
}

#[test]
fn client_hello_random_bytes() {
    run_cases("client_hello/random", |rng| {
        let len = rng.usize(0..600);
        let mut data: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
        // Most inputs start like a handshake record, so the parser gets past byte 2.
        if rng.u8(0..4) != 0 && data.len() >= 2 {
            data[0] = 0x16;
            data[1] = 0x03;
        }
        let c = cuts(rng, data.len());
        checks::client_hello(&data, &c, checks::DEFAULT_MAX_HELLO);
    });
}

#[test]
fn client_hello_reframed_into_many_records() {
    let hellos = hellos();
    run_cases("client_hello/reframed", |rng| {
        let (name, base) = &hellos[rng.usize(..hellos.len())];
        let want = found(base);
        let sizes: Vec<usize> = (0..rng.usize(1..6)).map(|_| rng.usize(1..300)).collect();
        let framed = checks::reframe(base, &sizes).expect("fixture is one record");
        let c = cuts(rng, framed.len());
        match checks::client_hello(&framed, &c, checks::DEFAULT_MAX_HELLO) {
            HelloParse::Found(got) => {
                assert_eq!(got.consumed, framed.len(), "{name} {sizes:?}");
                assert_eq!(
                    ClientHelloInfo { consumed: 0, ..got },
                    ClientHelloInfo {
                        consumed: 0,
                        ..want.clone()
                    },
                    "{name} in records of {sizes:?}"
                );
            }
            other => panic!("{name} in records of {sizes:?}: {other:?}"),
        }
    });
}

/// Segmentation invariance: every split of a real hello into two TCP reads, and
/// random splits into many, give exactly what the whole gives, once complete.
#[test]
fn segmentation_invariance_of_real_hellos() {
    for (name, hello) in hellos() {
        let whole = found(&hello);
        for cut in 1..hello.len() {
            let r = checks::client_hello(&hello, &[cut], checks::DEFAULT_MAX_HELLO);
            assert_eq!(r, HelloParse::Found(whole.clone()), "{name} split at {cut}");
        }
    }
    let hellos = hellos();
    run_cases("segmentation/random", |rng| {
        let (name, hello) = &hellos[rng.usize(..hellos.len())];
        // Bytes pipelined after the hello (early data) must not change it either.
        let mut data = hello.clone();
        let extra = rng.usize(0..64);
        data.extend((0..extra).map(|_| rng.u8(..)));
        let c: Vec<usize> = (0..rng.usize(1..40))
            .map(|_| rng.usize(1..data.len()))
            .collect();
        let r = checks::client_hello(&data, &c, checks::DEFAULT_MAX_HELLO);
        assert_eq!(r, HelloParse::Found(found(hello)), "{name} cut at {c:?}");
    });
}

#[test]
fn client_hello_length_claims_are_bounded() {
    // A record or message length claiming more than the limit is refused before its
    // bytes arrive; an empty record is malformed.
    let (_, hello) = hellos().into_iter().next().unwrap();
    run_cases("client_hello/lengths", |rng| {
        let mut data = hello.clone();
        let max = rng.usize(64..=checks::DEFAULT_MAX_HELLO);
        let record_len = rng.u16(..);
        data[3..5].copy_from_slice(&record_len.to_be_bytes());
        if rng.bool() {
            let msg_len = rng.u32(..1 << 24);
            data[6..9].copy_from_slice(&msg_len.to_be_bytes()[1..]);
        }
        data.truncate(rng.usize(5..=data.len()));
        let r = checks::client_hello(&data, &[], max);
        if usize::from(record_len) + 5 > max
            && record_len != 0
            && usize::from(record_len) <= 16384 + 2048
        {
            assert_eq!(
                r,
                HelloParse::Invalid(HelloError::TooLarge),
                "record {record_len} max {max}"
            );
        }
        if record_len == 0 {
            assert_eq!(r, HelloParse::Invalid(HelloError::Malformed));
        }
    });
}

// ---------------------------------------------------------------------------
// server_watcher

#[test]
fn server_watcher_real_flights_any_chunking() {
    let flights = flights();
    for (name, flight) in &flights {
        let every: Vec<usize> = (0..flight.len()).collect();
        checks::server_watcher(flight, &every, 64 * 1024);
        println!("{name}: byte-by-byte ok");
    }
    run_cases("server_watcher/chunked", |rng| {
        let (_, flight) = &flights[rng.usize(..flights.len())];
        let c = cuts(rng, flight.len());
        let limit = if rng.bool() {
            64 * 1024
        } else {
            rng.usize(0..2048)
        };
        checks::server_watcher(flight, &c, limit);
    });
}

#[test]
fn server_watcher_mutated_and_random() {
    let flights = flights();
    run_cases("server_watcher/mutated", |rng| {
        let mut data = if rng.u8(0..4) == 0 {
            let mut d: Vec<u8> = (0..rng.usize(0..800)).map(|_| rng.u8(..)).collect();
            if d.len() >= 2 {
                d[0] = *[0x14, 0x15, 0x16].get(rng.usize(..3)).unwrap();
                d[1] = 0x03;
            }
            d
        } else {
            flights[rng.usize(..flights.len())].1.clone()
        };
        for _ in 0..rng.usize(0..=4) {
            mutate(rng, &mut data);
        }
        let c = cuts(rng, data.len());
        let limit = if rng.bool() {
            64 * 1024
        } else {
            rng.usize(0..2048)
        };
        checks::server_watcher(&data, &c, limit);
    });
}

// ---------------------------------------------------------------------------
// proxy_header

#[test]
fn proxy_header_round_trips_edge_cases() {
    let long = "a".repeat(253);
    let too_long = "a".repeat(254);
    let cases: &[(&str, &str, Option<&str>)] = &[
        ("0.0.0.0:0", "255.255.255.255:65535", None),
        (
            "[::]:0",
            "[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:65535",
            Some("x"),
        ),
        (
            "[::ffff:10.0.0.1]:1",
            "[::ffff:10.0.0.2]:2",
            Some("puppet.example.com"),
        ),
        ("[::ffff:10.0.0.1]:1", "[2001:db8::1]:2", Some("")),
        ("10.0.0.1:1", "[::1]:8140", Some(&long)),
        ("10.0.0.1:1", "10.0.0.2:8140", Some(&too_long)),
        (
            "[fe80::1]:5",
            "[::ffff:255.255.255.255]:6",
            Some("héllo\r\nPROXY TCP4 1.1.1.1"),
        ),
    ];
    for (src, dst, authority) in cases {
        checks::proxy_header(src.parse().unwrap(), dst.parse().unwrap(), *authority);
    }
}

#[test]
fn proxy_header_round_trips_random() {
    run_cases("proxy_header/random", |rng| {
        let len = 37 + rng.usize(0..300);
        let data: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
        let (src, dst, authority) = checks::proxy_input(&data);
        checks::proxy_header(src, dst, authority.as_deref());
    });
}

#[test]
fn proxy_decoder_rejects_broken_headers() {
    // The decoder is a test oracle: make sure it is not a yes-man.
    assert!(checks::decode_proxy(b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\n").is_ok());
    for bad in [
        &b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n"[..],
        b"PROXY TCP4 ::1 5.6.7.8 1 2\r\n",
        b"PROXY TCP6 1.2.3.4 ::1 1 2\r\n",
        b"PROXY TCP4 1.2.3.4 5.6.7.8 01 2\r\n",
        b"PROXY TCP4 1.2.3.4 5.6.7.8 65536 2\r\n",
        b"PROXY UDP4 1.2.3.4 5.6.7.8 1 2\r\n",
        b"\r\n\r\n\0\r\nQUIT\n\x21\x11\x00\x0b",
        b"\r\n\r\n\0\r\nQUIT\n\x20\x11\x00\x0c\0\0\0\0\0\0\0\0\0\0\0\0",
    ] {
        assert!(
            checks::decode_proxy(bad).is_err(),
            "{:?}",
            String::from_utf8_lossy(bad)
        );
    }
}

// ---------------------------------------------------------------------------
// proxy_accept

/// Valid headers of every kind: crossbar's own, v2 LOCAL/UNSPEC, v1 UNKNOWN, v2
/// with TLVs.
fn proxy_headers() -> Vec<Vec<u8>> {
    use crossbar::config::ProxyProtocol::{V1, V2};
    use crossbar::proxy_protocol::{header, local};
    let sa = |s: &str| s.parse::<std::net::SocketAddr>().unwrap();
    let mut out = vec![
        header(V1, sa("10.1.2.3:4000"), sa("10.0.0.1:8140"), None),
        header(V1, sa("[2001:db8::1]:1"), sa("[::1]:65535"), None),
        header(V2, sa("10.1.2.3:4000"), sa("10.0.0.1:8140"), Some("puppet")),
        header(V2, sa("[2001:db8::1]:1"), sa("[::1]:8140"), None),
        local(V1),
        local(V2),
        b"PROXY UNKNOWN 1.2.3.4 5.6.7.8 1 2\r\n".to_vec(),
        b"\r\n\r\n\0\r\nQUIT\n\x21\x00\x00\x03abc".to_vec(),
    ];
    let mut tlvs = header(V2, sa("10.1.2.3:4000"), sa("10.0.0.1:8140"), Some("x"));
    tlvs.extend_from_slice(&[0x01, 0x00, 0x02, b'h', b'2', 0xEA, 0x00, 0x01, 0x01]);
    let len = u16::from_be_bytes([tlvs[14], tlvs[15]]) + 9;
    tlvs[14..16].copy_from_slice(&len.to_be_bytes());
    out.push(tlvs);
    out
}

#[test]
fn proxy_accept_every_split_of_valid_headers() {
    let hello = hellos().remove(0).1;
    for h in proxy_headers() {
        let data = [&h[..], &hello].concat();
        let cuts: Vec<usize> = (1..data.len()).collect();
        match checks::proxy_accept(&data, &cuts) {
            crossbar::proxy_protocol::ProxyParse::Found(_, len) => assert_eq!(len, h.len()),
            other => panic!("{other:?} for {h:?}"),
        }
    }
}

#[test]
fn proxy_accept_mutations_and_random_bytes() {
    let headers = proxy_headers();
    run_cases("proxy_accept/mutations", |rng| {
        let mut data = headers[rng.usize(..headers.len())].clone();
        for _ in 0..rng.usize(1..4) {
            match rng.u8(..3) {
                0 if !data.is_empty() => {
                    let i = rng.usize(..data.len());
                    data[i] = rng.u8(..);
                }
                1 if !data.is_empty() => {
                    data.truncate(rng.usize(..data.len()));
                }
                _ => {
                    let at = rng.usize(..=data.len());
                    data.insert(at, rng.u8(..));
                }
            }
        }
        let extra: Vec<u8> = (0..rng.usize(0..64)).map(|_| rng.u8(..)).collect();
        data.extend_from_slice(&extra);
        let c = cuts(rng, data.len());
        checks::proxy_accept(&data, &c);
    });
    run_cases("proxy_accept/random", |rng| {
        let sig: &[u8] = match rng.u8(..3) {
            0 => b"PROXY ",
            1 => b"\r\n\r\n\0\r\nQUIT\n",
            _ => b"",
        };
        let mut data = sig.to_vec();
        data.extend((0..rng.usize(0..200)).map(|_| rng.u8(..)));
        let c = cuts(rng, data.len());
        checks::proxy_accept(&data, &c);
    });
}

// ---------------------------------------------------------------------------
// config

fn config_texts() -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = Vec::new();
    for dir in ["conf", "tests/fixtures/config/bad"] {
        for e in std::fs::read_dir(root.join(dir)).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "yaml") {
                out.push(std::fs::read_to_string(&p).unwrap());
            }
        }
    }
    out.sort();
    out
}

/// Values that stress the scalar parsers (durations, sizes, addresses, enums).
const NASTY_SCALARS: &[&str] = &[
    "~",
    "null",
    "-1",
    "0",
    "1e999",
    "18446744073709551616",
    "99999999999999999999s",
    "0s",
    "1ns",
    "584542046091y",
    "\"\"",
    "[]",
    "{}",
    "!!binary aGVsbG8=",
    "*nope",
    "\"[::1]:99999\"",
    "\"256.0.0.1:1\"",
    "\"host:-1\"",
    "\":\"",
    "\"\\u0000\"",
    "yes",
    "0x10",
    ".inf",
    "-.inf",
    ".nan",
    "\"é\"",
    "'a: b'",
    "|\n  block",
    "&x 1",
];

#[test]
fn config_mutated_real_files() {
    let texts = config_texts();
    let mut accepted = 0usize;
    run_cases("config/mutated", |rng| {
        let base = &texts[rng.usize(..texts.len())];
        let mut lines: Vec<String> = base.lines().map(str::to_string).collect();
        for _ in 0..rng.usize(1..=3) {
            if lines.is_empty() {
                break;
            }
            let i = rng.usize(..lines.len());
            match rng.u8(0..5) {
                0 => {
                    lines.remove(i);
                }
                1 => {
                    let l = lines[i].clone();
                    lines.insert(i, l);
                }
                2 => {
                    // Replace a value with a nasty scalar.
                    if let Some((k, _)) = lines[i].split_once(": ") {
                        let v = NASTY_SCALARS[rng.usize(..NASTY_SCALARS.len())];
                        lines[i] = format!("{k}: {v}");
                    }
                }
                3 => {
                    let mut b = std::mem::take(&mut lines[i]).into_bytes();
                    mutate(rng, &mut b);
                    lines[i] = String::from_utf8_lossy(&b).into_owned();
                }
                _ => {
                    // Re-indent: YAML structure errors.
                    let shift = rng.usize(0..4);
                    lines[i] = format!("{}{}", " ".repeat(shift), lines[i].trim_start());
                }
            }
        }
        let text = lines.join("\n");
        accepted += usize::from(checks::config(&text));
    });
    println!("config/mutated: {accepted} mutants still valid");
}

#[test]
fn config_random_text_and_pathological_yaml() {
    let alphabet: Vec<char> =
        " \n\t:-[]{},#&*!|>'\"%@`?abcdefghijklmnopqrstuvwxyz0123456789.é\u{0}"
            .chars()
            .collect();
    run_cases("config/random", |rng| {
        let len = rng.usize(0..300);
        let mut text: String = (0..len)
            .map(|_| alphabet[rng.usize(..alphabet.len())])
            .collect();
        if rng.bool() {
            text.insert_str(0, "services:\n  s:\n    ");
        }
        checks::config(&text);
    });
    // Deep nesting, alias bombs, huge keys: each stopped by a limit of the YAML
    // parser, which the error names (without the limit the alias bomb would expand
    // to 10^30 nodes and never end: the test would fail by nextest's timeout, not by
    // a clock of its own, which a loaded machine could trip).
    let deep_flow = format!("services: {}{}", "[".repeat(10_000), "]".repeat(10_000));
    let deep_block: String = (0..2000)
        .map(|i| format!("{}k{i}:\n", " ".repeat(i)))
        .collect();
    let mut bomb = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..30 {
        let p = i - 1;
        bomb.push_str(&format!(
            "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
        ));
    }
    bomb.push_str("services: *a29\n");
    let huge_key = format!("{}: 1\nservices: {{}}\n", "k".repeat(1 << 20));
    for (name, text, limit) in [
        ("deep flow", deep_flow, "recursion limit exceeded"),
        ("deep block", deep_block, "recursion limit exceeded"),
        ("alias bomb", bomb, "repetition limit exceeded"),
        // A simple key may be 1,024 characters at most (YAML 1.2, 7.4.2).
        ("huge key", huge_key, "mapping values are not allowed"),
    ] {
        let started = Instant::now();
        let err = match Config::from_str_at(&text, Path::new("fuzz.yaml")) {
            Ok(_) => panic!("{name} accepted"),
            Err(e) => e.to_string(),
        };
        println!("{name}: rejected in {:?}: {err}", started.elapsed());
        assert!(
            err.contains(limit),
            "{name}: not stopped by its limit: {err}"
        );
        assert!(
            !checks::config(&text),
            "{name}: accepted by the property check"
        );
    }
}

/// Regression for the stick-table flood fixed with tests/hostile_clients.rs: a TLS 1.2
/// full handshake is marked complete (`server_ccs`) only at the server's
/// ChangeCipherSpec, which the server sends after the client's Finished; crossbar
/// learns nothing from a full handshake before that.
#[test]
fn server_ccs_marks_only_completed_tls12_handshakes() {
    use crossbar::hello::ServerWatcher;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/server_flights");
    let read = |n: &str| std::fs::read(dir.join(n)).unwrap();
    for (name, resumed, ccs) in [
        ("openssl3_tls12_full.server.bin", false, true),
        ("openssl3_tls12_resumed.server.bin", true, true),
        ("openssl3_tls13_full.server.bin", false, false),
        ("openssl3_tls13_resumed.server.bin", true, false),
    ] {
        let flight = read(name);
        let mut w = ServerWatcher::new(64 * 1024);
        let mut done_at = None;
        for (i, b) in flight.iter().enumerate() {
            if w.feed(std::slice::from_ref(b)) {
                done_at = Some(i);
                break;
            }
            assert!(
                !w.info().server_ccs,
                "{name}: server_ccs before done, at {i}"
            );
        }
        assert!(done_at.is_some(), "{name}: watcher never done");
        assert_eq!(w.info().resumed, Some(resumed), "{name}");
        assert_eq!(w.info().server_ccs, ccs, "{name}");
    }
}
