//! The caller's current context is left alone: every public call of the CUDA layer, made
//! with a context of the test's own current (not a primary context, as a second GPU's would
//! be for device-0 work), and with none current, leaves exactly that current. (The cudarc
//! adapter's calls: its own suite.) On one GPU this is how a multi-GPU caller's state is checked: the calls bind
//! device 0's primary context for their work, which is "another device's" context here.

use std::ptr::null_mut;
use std::sync::Arc;

use anyhow::{Result, ensure};
use cudarc::driver::sys;
use tensorbridge_core::{
    Access, DType, Descriptor, Device, DeviceType, Layout, Packing, Ready, Stream, Tensor,
};
use tensorbridge_cuda::StreamLife;

use crate::{Kernels, affine, context, dptr, serial, tensor_over};

/// The calling thread's current context.
fn current() -> sys::CUcontext {
    let mut ctx = null_mut();
    // SAFETY: libcuda is loaded (a context exists); one handle written to a live local.
    let rc = unsafe { sys::cuCtxGetCurrent(&mut ctx) };
    assert_eq!(rc, sys::CUresult::CUDA_SUCCESS);
    ctx
}

/// Makes `ctx` (or none) current.
fn set_current(ctx: sys::CUcontext) {
    // SAFETY: `ctx` is null or a context the test created and has not destroyed.
    let rc = unsafe { sys::cuCtxSetCurrent(ctx) };
    assert_eq!(rc, sys::CUresult::CUDA_SUCCESS);
}

/// A context of the test's own on device 0 (`cuCtxCreate`), not its primary context.
struct OwnContext(sys::CUcontext);

impl OwnContext {
    fn new() -> Result<OwnContext> {
        let mut ctx = null_mut();
        // SAFETY: device 0 exists (a primary context was made first); default parameters.
        let rc = unsafe { sys::cuCtxCreate_v4(&mut ctx, null_mut(), 0, 0) };
        ensure!(rc == sys::CUresult::CUDA_SUCCESS, "cuCtxCreate: {rc:?}");
        // cuCtxCreate makes it current; the test sets what it wants itself.
        Ok(OwnContext(ctx))
    }
}

impl Drop for OwnContext {
    fn drop(&mut self) {
        // SAFETY: created above, destroyed once.
        unsafe { sys::cuCtxDestroy_v2(self.0) };
    }
}

#[test]
fn public_calls_leave_the_callers_current_context_as_they_found_it() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let _k = Kernels::load(&ctx)?;
    let producer = ctx.new_stream()?;
    let consumer = ctx.new_stream()?;
    let own = OwnContext::new()?;
    for (what, state) in [("a non-primary context", own.0), ("no context", null_mut())] {
        // cudarc calls bind their own context: made before the state under test is set.
        let tensor = tensor_over(producer.clone_htod(&affine(1024, 1.0, 0.0))?, &producer)?;
        let spare = producer.clone_htod(&affine(256, 1.0, 0.0))?;
        let ptr = dptr(&spare);
        let owner = tensor.owner().clone();
        let mut host = vec![0.0f32; 1024];
        let external = ctx.new_stream()?;
        let external_name = tensorbridge_cuda::stream_of(&external);
        set_current(state);
        let check = |call: &str| {
            assert_eq!(
                current(),
                state,
                "{call} changed the current context (it was {what})"
            );
        };
        tensorbridge_cuda::handoff(&tensor, &consumer)?;
        check("handoff");
        tensorbridge_cuda::handoff_ready(tensor.as_ref(), &consumer)?;
        check("handoff_ready");
        tensorbridge_cuda::make_ready_on(&tensor, &consumer)?;
        check("make_ready_on");
        tensorbridge_cuda::make_ready_on(tensor.as_ref(), &consumer)?;
        check("make_ready_on (borrowed)");
        // SAFETY: the legacy default stream is always live.
        unsafe { tensorbridge_cuda::make_ready_on_raw(&tensor, Stream::LegacyDefault) }?;
        check("make_ready_on_raw");
        // SAFETY: as above.
        drop(unsafe { tensorbridge_cuda::handoff_raw(&tensor, Stream::LegacyDefault) }?);
        check("handoff_raw");
        let signal = tensorbridge_cuda::record_ready(&tensor)?;
        check("record_ready");
        drop(tensorbridge_cuda::settle(tensor.as_ref())?);
        check("settle");
        tensorbridge_cuda::synchronize(&signal)?;
        check("synchronize");
        tensorbridge_cuda::wait_ready(tensor.as_ref())?;
        check("wait_ready");
        let recorded = tensorbridge_cuda::CudaSignal::record(&consumer)?;
        check("CudaSignal::record");
        recorded.wait_on(&producer)?;
        check("CudaSignal::wait_on");
        // SAFETY: as above.
        unsafe { recorded.wait_on_raw(Stream::LegacyDefault) }?;
        check("CudaSignal::wait_on_raw");
        tensorbridge_cuda::join(&consumer, &producer)?;
        check("join");
        tensorbridge_cuda::inspect(ptr as usize)?;
        check("inspect");
        tensorbridge_cuda::check_span(tensor.descriptor())?;
        check("check_span");
        tensorbridge_cuda::primary_context(0)?;
        check("primary_context");
        let device = tensorbridge_cuda::current_device()?;
        check("current_device");
        assert_eq!(
            device,
            (!state.is_null()).then_some(0),
            "current_device with {what}"
        );
        tensorbridge_cuda::capture_status(&consumer)?;
        check("capture_status");
        tensorbridge_cuda::retire_on(&consumer, owner.clone());
        check("retire_on");
        tensorbridge_cuda::retire_all_on(&consumer, [owner.clone(), owner.clone()]);
        check("retire_all_on");
        // SAFETY: device 0's legacy default stream is always live.
        unsafe { tensorbridge_cuda::retire_on_raw(0, Stream::LegacyDefault, owner.clone()) };
        check("retire_on_raw");
        // SAFETY: as above.
        unsafe { tensorbridge_cuda::retire_all_on_raw(0, Stream::LegacyDefault, [owner.clone()]) };
        check("retire_all_on_raw");
        for life in [StreamLife::Immortal, StreamLife::CallOnly] {
            // SAFETY: `external` is held for the whole loop, longer than any clone lives.
            unsafe {
                tensorbridge_cuda::with_stream_raw(0, external_name, life, |s| {
                    tensorbridge_cuda::make_ready_on(&tensor, s).map(drop)
                })
            }??;
            check("with_stream_raw");
        }
        let buffer = tensorbridge_cuda::copy::DeviceBuffer::alloc(0, 4096)?;
        check("DeviceBuffer::alloc");
        // SAFETY: the tensor's whole span (its own bytes, 4096 of them) into `host`, which
        // holds 4096 bytes.
        unsafe {
            tensorbridge_cuda::copy::to_host(
                &tensor,
                tensor.data_ptr(),
                host.as_mut_ptr().cast(),
                4096,
            )
        }?;
        check("copy::to_host");
        // SAFETY: the span into a buffer of its size; the legacy stream is live; the host
        // waits for the copy.
        unsafe {
            tensorbridge_cuda::copy::on_device(
                &tensor,
                tensor.data_ptr(),
                &buffer,
                Stream::LegacyDefault,
                true,
            )
        }?;
        check("copy::on_device");
        drop(buffer);
        check("DeviceBuffer's drop");
        tensorbridge_cuda::reclaim();
        check("reclaim");
        drop(tensor);
        drop(signal);
        drop(recorded);
        check("dropping tensors and signals");
        set_current(null_mut());
        drop((spare, external));
        set_current(state);
    }
    set_current(null_mut());
    Ok(())
}

/// Pinned memory carries ordinal 0 whatever GPU its work runs on: a default-stream readiness
/// on it means the calling thread's current device, and is refused when none is current.
#[test]
fn default_streams_of_pinned_memory_follow_the_current_device_or_are_refused() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let consumer = ctx.new_stream()?;
    let mut host: *mut std::ffi::c_void = null_mut();
    let bytes = 1024 * 4;
    {
        let _keep = tensorbridge_cuda::ContextGuard::save()?;
        ctx.bind_to_thread()?;
        // SAFETY: a context is current; one pointer written to a live local.
        let rc = unsafe { sys::cuMemHostAlloc(&mut host, bytes, 0) };
        ensure!(rc == sys::CUresult::CUDA_SUCCESS, "cuMemHostAlloc: {rc:?}");
    }
    struct Pinned(usize);
    impl Drop for Pinned {
        fn drop(&mut self) {
            // SAFETY: allocated above, freed once, after every tensor over it is gone.
            unsafe { sys::cuMemFreeHost(std::ptr::with_exposed_provenance_mut(self.0)) };
        }
    }
    let pinned = Arc::new(Pinned(host.expose_provenance()));
    let desc = Descriptor::new(
        host.expose_provenance(),
        Device::new(DeviceType::CudaHost, 0),
        DType::FLOAT32,
        Packing::Packed,
        Layout::row_major(&[1024])?,
        Access::ReadWrite,
    )?;
    // SAFETY: the owner keeps the pinned allocation of 1024 floats alive; nothing writes it.
    let t = unsafe { Tensor::from_descriptor(desc, pinned) };
    // SAFETY:
    // - 1: nothing is pending on it (true after any point of any stream);
    // - 2 and 3: the legacy default stream, always live, not the per-thread one.
    let t = unsafe { t.with_ready(Ready::Stream(Stream::LegacyDefault)) };
    set_current(null_mut());
    let refused = tensorbridge_cuda::make_ready_on(&t, &consumer);
    assert!(
        matches!(
            refused,
            Err(tensorbridge_cuda::Error::UnknownStreamDevice { .. })
        ),
        "no current context: {refused:?}"
    );
    println!("{}", refused.unwrap_err());
    ctx.bind_to_thread()?;
    tensorbridge_cuda::make_ready_on(&t, &consumer)?;
    let signal = tensorbridge_cuda::record_ready(&t)?;
    assert_eq!(
        signal.ready().producer_stream(),
        None,
        "a sentinel on pinned memory names no stream for other threads"
    );
    set_current(null_mut());
    Ok(())
}
