//! `validate`: see `tensorbridge_integration::fuzz::validate`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tensorbridge_integration::fuzz::validate(data));
