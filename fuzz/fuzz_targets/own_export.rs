//! `own_export`: see `tensorbridge_integration::fuzz::own_export`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tensorbridge_integration::fuzz::own_export(data));
