//! With the `tch` feature, gives this package's binaries (the `tch` bench) what they need to
//! load libtorch, as tensorbridge-tch's own build script does for its targets (BUILD.md
//! gotchas 2 and 3): link arguments from a library's build script reach only that library's
//! package, so each package whose binaries link libtorch repeats them. The library directory
//! comes from tensorbridge-tch (its `links` key).

use std::env;

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_TENSORBRIDGE_TCH_LIBTORCH_LIB");
    if env::var_os("CARGO_FEATURE_TCH").is_none() {
        return;
    }
    let lib = env::var("DEP_TENSORBRIDGE_TCH_LIBTORCH_LIB")
        .expect("tensorbridge-tch reports libtorch's lib directory when it is a dependency");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
    println!("cargo:rustc-link-arg=-ltorch");
    println!("cargo:rustc-link-search=native={lib}");
}
