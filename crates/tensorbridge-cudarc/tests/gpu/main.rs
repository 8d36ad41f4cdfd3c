//! GPU tests of tensorbridge-cudarc: compiled only with the `gpu-tests` feature, run by
//! `cargo xtask test-gpu` (here, or from its bundle on a GPU machine). They expect an NVIDIA
//! GPU and driver and fail, rather than skip, without one. One module per area; the helpers
//! they share are below.
//!
//! Every test holds [`serial`] for its whole run: the hand-off tests time the host and the
//! device, and kernels or driver calls of other tests running at the same time would blur
//! what they measure.

// Tests fail through assertions; `Result` only carries driver errors out with their context.
#![allow(clippy::panic_in_result_fn)]

mod borrowed;
mod contexts;
mod devices;
mod dtypes;
mod graphs;
#[cfg(target_os = "linux")]
mod ipc;
mod kernels;
mod roundtrip;

use cudarc::driver::{CudaSlice, DevicePtr};
#[allow(unused_imports)] // each test module takes what it needs through `super::`
use tensorbridge_testkit::gpu::{
    Affine, KERNELS, Kernels, affine, assert_exact, context, grid, serial, timing_event,
};

/// The device pointer of a slice (cudarc records a read on the slice's own stream).
fn dptr<T>(slice: &CudaSlice<T>) -> u64 {
    let (ptr, _record) = slice.device_ptr(slice.stream());
    ptr
}
