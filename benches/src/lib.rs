//! Criterion benches for tensorbridge live in `benches/`; run them with `cargo xtask bench`.
//! One bench target per adapter, one criterion group per conversion path, peers in the same
//! group where a Rust peer exists.
