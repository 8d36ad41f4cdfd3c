//! The library's soname is `libcuda.so.1`, as the real driver's, so a process that opens it
//! under both names (`libcuda.so` and `libcuda.so.1`) loads it once.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
}
