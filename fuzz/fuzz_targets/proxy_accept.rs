//! Arbitrary bytes, read in arbitrary segments, as the PROXY header a trusted tier
//! sends: `proxy_protocol::parse` never panics, decides once and for all, and
//! agrees with the whole buffer and with a decoder written from the spec (see
//! `proxy_accept`).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The first byte picks the segmentation (1..=64-byte segments). The input is
    // also tried behind each valid signature, so mutations reach what follows it.
    let Some((&seg, data)) = data.split_first() else {
        return;
    };
    let step = usize::from(seg % 64) + 1;
    let cuts: Vec<usize> = (1..data.len()).step_by(step).collect();
    crossbar_fuzz::proxy_accept(data, &cuts);
    for sig in [&b"PROXY "[..], b"\r\n\r\n\0\r\nQUIT\n"] {
        let framed = [sig, data].concat();
        crossbar_fuzz::proxy_accept(&framed, &cuts);
    }
});
