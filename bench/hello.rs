//! ClientHello parsing cost (`cargo bench --bench hello`). Target: <= 2 µs per hello,
//! including a 2 KiB post-quantum-sized one.
//!
//! Inputs are real captured hellos from tests/fixtures/hellos, plus one built here: the
//! curl/OpenSSL 3 hello with an X25519MLKEM768 key share (1,216-byte client share, as
//! Chrome and OpenSSL 3.5 send) prepended to its key_share extension and its padding
//! extension resized so the whole record is exactly 2,048 bytes.
use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use crossbar::hello::{parse_client_hello, HelloParse};

/// The limit crossbar uses by default (`max_hello_size`).
const MAX_HELLO: usize = 16 * 1024;
/// Size of the synthetic post-quantum hello, record header included.
const PQ_HELLO_LEN: usize = 2048;
/// IANA group X25519MLKEM768 and its client key share length (1184 + 32 bytes).
const X25519_MLKEM768: u16 = 0x11ec;
const X25519_MLKEM768_SHARE: usize = 1216;
const EXT_PADDING: u16 = 21;
const EXT_KEY_SHARE: u16 = 51;
const EXT_PRE_SHARED_KEY: u16 = 41;

const OPENSSL3_TLS13: &[u8] = include_bytes!("../tests/fixtures/hellos/openssl3_tls13.bin");
const CURL7_OPENSSL3: &[u8] = include_bytes!("../tests/fixtures/hellos/curl7_openssl3.bin");

fn be16(b: &[u8], at: usize) -> usize {
    usize::from(u16::from_be_bytes([b[at], b[at + 1]]))
}

fn push16(out: &mut Vec<u8>, v: usize) {
    out.extend_from_slice(&u16::try_from(v).expect("fits u16").to_be_bytes());
}

/// `hello` (one record, one ClientHello) with a post-quantum key share added and a
/// padding extension sized so the record is `PQ_HELLO_LEN` bytes.
fn post_quantum_hello(hello: &[u8]) -> Vec<u8> {
    let body = &hello[9..];
    // legacy_version, random, session_id, cipher_suites, compression_methods.
    let mut p = 2 + 32;
    p += 1 + usize::from(body[p]);
    p += 2 + be16(body, p);
    p += 1 + usize::from(body[p]);
    let fixed = &body[..p];
    let ext_end = p + 2 + be16(body, p);
    let mut exts: Vec<(u16, Vec<u8>)> = Vec::new();
    let mut q = p + 2;
    while q < ext_end {
        let (t, l) = (be16(body, q) as u16, be16(body, q + 2));
        exts.push((t, body[q + 4..q + 4 + l].to_vec()));
        q += 4 + l;
    }
    exts.retain(|(t, _)| *t != EXT_PADDING);
    for (t, data) in &mut exts {
        if *t == EXT_KEY_SHARE {
            let mut shares = Vec::new();
            push16(&mut shares, X25519_MLKEM768 as usize);
            push16(&mut shares, X25519_MLKEM768_SHARE);
            shares.extend((0..X25519_MLKEM768_SHARE).map(|i| (i * 7 + 3) as u8));
            shares.extend_from_slice(&data[2..]);
            let mut new = Vec::new();
            push16(&mut new, shares.len());
            new.extend(shares);
            *data = new;
        }
    }
    let encoded =
        |exts: &[(u16, Vec<u8>)]| -> usize { exts.iter().map(|(_, d)| 4 + d.len()).sum() };
    // record hdr 5 + handshake hdr 4 + fixed + ext list length 2 + extensions + padding.
    let without_padding = 5 + 4 + fixed.len() + 2 + encoded(&exts) + 4;
    let pad = PQ_HELLO_LEN
        .checked_sub(without_padding)
        .expect("hello too big");
    // pre_shared_key must stay last (RFC 8446 4.2.11): pad before it.
    let at = exts
        .iter()
        .position(|(t, _)| *t == EXT_PRE_SHARED_KEY)
        .unwrap_or(exts.len());
    exts.insert(at, (EXT_PADDING, vec![0; pad]));
    let mut ext_bytes = Vec::new();
    for (t, d) in &exts {
        push16(&mut ext_bytes, usize::from(*t));
        push16(&mut ext_bytes, d.len());
        ext_bytes.extend_from_slice(d);
    }
    let mut hs_body = fixed.to_vec();
    push16(&mut hs_body, ext_bytes.len());
    hs_body.extend(ext_bytes);
    let mut out = vec![0x16, hello[1], hello[2]];
    push16(&mut out, hs_body.len() + 4);
    out.push(1);
    out.extend_from_slice(&(hs_body.len() as u32).to_be_bytes()[1..]);
    out.extend(hs_body);
    assert_eq!(out.len(), PQ_HELLO_LEN);
    out
}

fn parse(bytes: &[u8]) -> HelloParse {
    parse_client_hello(black_box(bytes), MAX_HELLO)
}

fn bench_hello(c: &mut Criterion) {
    let pq = post_quantum_hello(CURL7_OPENSSL3);
    // The synthetic hello must be a hello crossbar accepts, with the same SNI.
    let (HelloParse::Found(orig), HelloParse::Found(big)) = (parse(CURL7_OPENSSL3), parse(&pq))
    else {
        panic!("fixture or synthetic post-quantum hello does not parse");
    };
    assert_eq!(orig.sni, big.sni);
    assert_eq!(big.consumed, PQ_HELLO_LEN);

    let mut g = c.benchmark_group("parse_client_hello");
    g.warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    for (name, bytes) in [
        ("openssl3_tls13_324B", OPENSSL3_TLS13),
        ("curl7_openssl3_517B", CURL7_OPENSSL3),
        ("post_quantum_2048B", pq.as_slice()),
    ] {
        g.throughput(Throughput::Bytes(bytes.len() as u64));
        g.bench_function(name, |b| b.iter(|| parse(bytes)));
    }
    // The hello split in two TCP reads: crossbar parses the first part (NeedMore), then
    // the whole buffer again.
    g.throughput(Throughput::Bytes(pq.len() as u64));
    g.bench_function("post_quantum_2048B_two_reads", |b| {
        b.iter(|| {
            let first = parse(&pq[..1400]);
            (first, parse(&pq))
        })
    });
    g.finish();
}

criterion_group!(benches, bench_hello);
criterion_main!(benches);
