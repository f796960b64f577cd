//! Arbitrary UTF-8 as a configuration file: `Config::from_str_at` never panics and
//! every error carries a message (see `config`).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        crossbar_fuzz::config(text);
    }
});
