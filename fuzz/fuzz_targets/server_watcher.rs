//! Arbitrary server bytes in arbitrary chunks: `ServerWatcher` never panics and
//! learns the same whatever the chunking (see `server_watcher`).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // First byte: chunk length 1..=128; second: a byte limit, small or the real one.
    let [seg, lim, data @ ..] = data else {
        return;
    };
    let step = usize::from(seg % 128) + 1;
    let limit = if lim % 4 == 0 { usize::from(*lim) * 16 } else { 64 * 1024 };
    let cuts: Vec<usize> = (1..data.len()).step_by(step).collect();
    crossbar_fuzz::server_watcher(data, &cuts, limit);
});
