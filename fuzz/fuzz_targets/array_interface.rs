//! `array_interface`: see `tensorbridge_integration::fuzz::array_interface`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tensorbridge_integration::fuzz::array_interface(data));
