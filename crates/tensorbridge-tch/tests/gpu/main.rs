//! GPU tests of tensorbridge-tch: compiled only with the `gpu-tests` feature, run by
//! `cargo xtask test-gpu` (here, or from its bundle on a GPU machine). They expect an NVIDIA
//! GPU, its driver and a CUDA build of libtorch, and fail, rather than skip, without them.
//! One module per area; the helpers they share are below.
//!
//! Every test holds [`serial`] for its whole run: the hand-off tests time the host and the
//! device, and other tests' kernels running at the same time would blur what they measure.
//!
//! libtorch's current stream is its default stream, the legacy default stream (null): tch has
//! no stream API. The tests launch "libtorch-side" kernels on cudarc's handle of that stream
//! ([`cudarc::driver::CudaContext::default_stream`]), which is the same stream.

// Tests fail through assertions; `Result` only carries errors out with their context.
#![allow(clippy::panic_in_result_fn)]

mod handoff;
mod kernel;
mod release;
mod roundtrip;

use std::sync::Arc;

use anyhow::{Result, ensure};
use cudarc::driver::CudaContext;

#[allow(unused_imports)] // each test module takes what it needs through `super::`
use tensorbridge_testkit::gpu::{Affine, Kernels, affine, grid, serial, timing_event, wrong};

/// The crate's `tensorbridge_tch::import`, for tests that never resize the storage of a tensor
/// they import while the import lives (its safety obligation). The tests about resizing (`pinning`) call
/// the crate's function themselves.
fn import(t: &tch::Tensor) -> Result<tensorbridge_core::Tensor, tensorbridge_tch::Error> {
    // SAFETY: no test that calls this resizes the imported storage (see above).
    unsafe { tensorbridge_tch::import(t) }
}

/// Device `ordinal`'s primary context ([`tensorbridge_testkit::gpu::context`]), after also
/// checking that libtorch sees CUDA (it does not when the link dropped `libtorch_cuda.so`:
/// docs/BUILDING.md, "libtorch").
fn context(ordinal: usize) -> Result<Arc<CudaContext>> {
    let ctx = tensorbridge_testkit::gpu::context(ordinal)?;
    ensure!(
        tch::Cuda::is_available(),
        "libtorch sees no CUDA device although libcuda loads: is libtorch_cuda.so linked \
         (--no-as-needed -ltorch) and a CUDA build of libtorch on the library path?"
    );
    Ok(ctx)
}

/// A tensor's values in row-major order, copied to the host by libtorch (on its current
/// stream, which it then synchronises).
fn torch_values(t: &tch::Tensor) -> Vec<f32> {
    let n = t.numel();
    let mut out = vec![0.0f32; n];
    t.copy_data(&mut out, n);
    out
}
