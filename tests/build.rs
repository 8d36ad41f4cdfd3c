//! With the `tch` feature, gives this package's binaries (the demo's libtorch row) what they
//! need to load libtorch: see `crates/tensorbridge-tch/dependents_build.rs`.

include!("../crates/tensorbridge-tch/dependents_build.rs");

fn main() {
    link_libtorch();
}
