//! The core's public API, one module per area (one integration binary per crate: one link, one test process).

mod layout;
mod names;
mod overlap;
mod ownership;
mod validation;
mod views;

/// Proptest configuration shared by every property: no failure persistence (Miri runs these
/// tests with file-system isolation), and the case count from `PROPTEST_CASES` when set.
pub(crate) fn config() -> proptest::test_runner::Config {
    proptest::test_runner::Config {
        failure_persistence: None,
        ..proptest::test_runner::Config::default()
    }
}
