//! Arbitrary bytes, read in arbitrary segments: `parse_client_hello` never panics,
//! decides once and for all, and agrees with the whole buffer (see `client_hello`).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The first byte picks the segmentation: a segment length of 1..=64 bytes, so
    // every input is also read the way a trickling client would send it.
    let Some((&seg, data)) = data.split_first() else {
        return;
    };
    let step = usize::from(seg % 64) + 1;
    let cuts: Vec<usize> = (1..data.len()).step_by(step).collect();
    crossbar_fuzz::client_hello(data, &cuts, crossbar_fuzz::DEFAULT_MAX_HELLO);
    // A small limit exercises the too_large paths with short inputs.
    crossbar_fuzz::client_hello(data, &cuts, 512);
});
