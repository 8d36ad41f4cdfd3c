//! The public API of tensorbridge-dlpack, one module per area. `producer` is a test-only
//! DLPack producer with counted deleters.

mod dlpark_interop;
mod edited_export;
mod export;
mod import;
mod lent;
mod own_export;
mod ownership;
mod producer;
mod roundtrip;

use proptest::test_runner::Config;

/// Proptest settings for every property here: `PROPTEST_CASES` as usual, but only 4 cases
/// under Miri (about 1000x slower) unless `cargo xtask ci` sets it inside the interpreter;
/// no failure persistence (Miri's isolation forbids the file system).
pub(crate) fn proptest_config() -> Config {
    let base = Config::default();
    let unset = std::env::var_os("PROPTEST_CASES").is_none();
    Config {
        cases: if cfg!(miri) && unset { 4 } else { base.cases },
        failure_persistence: None,
        ..base
    }
}
