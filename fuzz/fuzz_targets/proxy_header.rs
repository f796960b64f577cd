//! Arbitrary addresses and authority: crossbar's PROXY v1/v2 header decodes back,
//! with a decoder written from the spec, to the same addresses (see `proxy_header`).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (src, dst, authority) = crossbar_fuzz::proxy_input(data);
    crossbar_fuzz::proxy_header(src, dst, authority.as_deref());
});
