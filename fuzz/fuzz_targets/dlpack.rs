//! `dlpack`: see `tensorbridge_integration::fuzz::dlpack`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tensorbridge_integration::fuzz::dlpack(data));
