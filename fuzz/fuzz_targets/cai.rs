//! `cai`: see `tensorbridge_integration::fuzz::cai`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tensorbridge_integration::fuzz::cai(data));
