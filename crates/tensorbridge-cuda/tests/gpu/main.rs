//! GPU tests of tensorbridge-cuda, the CUDA driver layer: compiled only with the `gpu-tests`
//! feature, run by `cargo xtask test-gpu` (here, or from its bundle on a GPU machine). They
//! expect an NVIDIA GPU and driver and fail, rather than skip, without one. One module per
//! area; the helpers they share are below. (The cudarc adapter's suite drives the layer
//! through views and kernels; this one calls it directly.)
//!
//! Every test holds [`serial`] for its whole run: the hand-off tests time the host and the
//! device, and kernels or driver calls of other tests running at the same time would blur
//! what they measure. `first_call` re-runs this binary in fresh processes.

// Tests fail through assertions; `Result` only carries driver errors out with their context.
#![allow(clippy::panic_in_result_fn)]

mod contexts;
mod copy;
mod first_call;
mod graphs;
mod handoff;
mod pointer;
mod reaper;
mod scope;

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use tensorbridge_core::{Access, DType, Descriptor, Device, Layout, Packing, Ready, Tensor};
#[allow(unused_imports)] // each test module takes what it needs through `super::`
use tensorbridge_testkit::gpu::{
    Affine, KERNELS, Kernels, affine, assert_exact, context, grid, serial, timing_event, wait_until,
};

/// The device pointer of a slice (cudarc records a read on the slice's own stream).
fn dptr<T>(slice: &CudaSlice<T>) -> u64 {
    let (ptr, _record) = slice.device_ptr(slice.stream());
    ptr
}

/// A float32 tensor over a cudarc slice of device 0 (moved into its owner), ready on
/// `stream`, as another framework would hand one over.
fn tensor_over(slice: CudaSlice<f32>, stream: &Arc<CudaStream>) -> anyhow::Result<Tensor> {
    let desc = Descriptor::new(
        dptr(&slice) as usize,
        Device::cuda(0),
        DType::FLOAT32,
        Packing::Packed,
        Layout::row_major(&[slice.len() as i64])?,
        Access::ReadWrite,
    )?;
    // The owner keeps the stream alive too, so the readiness below names a live stream.
    let owner: tensorbridge_core::Owner = Arc::new((slice, stream.clone()));
    // SAFETY: the span is the slice's elements, device memory the owner keeps allocated.
    let t = unsafe { Tensor::from_descriptor(desc, owner) };
    // SAFETY:
    // - 1: the slice's writers are cudarc's, enqueued on its stream (here `stream`);
    // - 2: the owner holds `stream`, so it outlives every clone of the tensor;
    // - 3: a stream of its own, not the per-thread default stream.
    Ok(unsafe { t.with_ready(Ready::Stream(tensorbridge_cuda::stream_of(stream))) })
}
