//! Compiles the C++ shim against the libtorch that torch-sys found, and gives every binary
//! of this package (lib tests, integration tests, doctests) what it needs to load libtorch
//! at run time (docs/BUILDING.md, "libtorch"):
//! - an rpath to libtorch's `lib` directory: torch-sys sets none, and the pip wheel's
//!   libraries are not on the loader's path;
//! - `--no-as-needed -ltorch`: `--as-needed` would drop `libtorch.so`, and with it
//!   `libtorch_cuda.so`, so CUDA would look unavailable on a GPU machine.
//!
//! Link arguments reach only this package's own targets; dependents that link this crate
//! into a binary (benches, other tests) read the directory from
//! `DEP_TENSORBRIDGE_TCH_LIBTORCH_LIB` (this package's `links` key) and emit the same.

use std::env;
use std::path::PathBuf;

const SHIM: &str = "shim/tensorbridge_tch.cpp";

fn main() {
    println!("cargo:rerun-if-changed={SHIM}");
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    // docs.rs (which sets `DOCS_RS`, and builds with tch's `doc-only`): no libtorch to
    // compile the shim against or to link; rustdoc needs neither.
    println!("cargo:rerun-if-env-changed=DOCS_RS");
    if env::var_os("DOCS_RS").is_some() {
        return;
    }
    // torch-sys found libtorch (from `LIBTORCH`, or a Python environment with
    // `LIBTORCH_USE_PYTORCH=1`) and says where its libraries are.
    let lib = PathBuf::from(env::var_os("DEP_TCH_LIBTORCH_LIB").expect(
        "torch-sys did not report libtorch's lib directory (DEP_TCH_LIBTORCH_LIB): build \
         through `cargo xtask`, or set LIBTORCH to a torch installation",
    ));
    let root = lib
        .parent()
        .expect("libtorch's lib directory has a parent")
        .to_path_buf();
    let include = root.join("include");

    let mut build = cc::Build::new();
    build
        .cpp(true)
        .pic(true)
        .std("c++17")
        .file(SHIM)
        // The ABI of the PyPI wheels (torch._C._GLIBCXX_USE_CXX11_ABI), as torch-sys uses.
        .define("_GLIBCXX_USE_CXX11_ABI", "1")
        .define("GLOG_USE_GLOG_EXPORT", None)
        .warnings(true)
        .extra_warnings(true);
    // libtorch's headers as system headers: their warnings are not ours.
    build
        .flag("-isystem")
        .flag(include.to_str().expect("a UTF-8 path"));
    build.compile("tensorbridge_tch_shim");

    let lib = lib.display();
    println!("cargo:rustc-link-search=native={lib}");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
    println!("cargo:rustc-link-arg=-ltorch");
    println!("cargo:libtorch_lib={lib}");
}
