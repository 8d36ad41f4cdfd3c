// Included (`include!`) by the build scripts of the workspace packages whose binaries link
// libtorch through this crate (the benches' `tch` group, the demo's libtorch row). Link
// arguments from a library's build script reach only that library's own targets, so each such
// package repeats what this crate's `build.rs` gives its own binaries: an rpath to libtorch and
// `--no-as-needed -ltorch` (without it the linker drops libtorch_cuda and CUDA is invisible to
// libtorch). The library directory comes from this crate's `links` key.

/// Gives the package's binaries what they need to load libtorch, when its `tch` feature is
/// on.
fn link_libtorch() {
    println!("cargo:rerun-if-env-changed=DEP_TENSORBRIDGE_TCH_LIBTORCH_LIB");
    if std::env::var_os("CARGO_FEATURE_TCH").is_none() {
        return;
    }
    let lib = std::env::var("DEP_TENSORBRIDGE_TCH_LIBTORCH_LIB")
        .expect("tensorbridge-tch reports libtorch's lib directory when it is a dependency");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
    println!("cargo:rustc-link-arg=-ltorch");
    println!("cargo:rustc-link-search=native={lib}");
}
