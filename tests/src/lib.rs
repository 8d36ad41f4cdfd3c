//! Cross-adapter integration tests for tensorbridge and the demo (`cargo xtask demo`).
//!
//! The GPU tests live in the `gpu` test binary (`gpu/main.rs`, one module per area), compiled
//! only with the `gpu-tests` feature and run by `cargo xtask test-gpu`. This library holds
//! what the test binaries and the demo share.

pub mod fuzz;

/// `len` distinct-looking, non-zero `f32` values, each exactly representable, so a copy that
/// drops, zeroes or reorders elements cannot compare equal by accident.
pub fn f32_pattern(len: usize) -> Vec<f32> {
    // i mod 65521 (a prime) has at most 16 bits, so halving and adding 1 stays exact.
    (0..len).map(|i| (i % 65_521) as f32 * 0.5 + 1.0).collect()
}
