//! Without libcuda (this crate's CI machines) every driver-facing call says so with
//! `Error::NoDriver` instead of panicking inside cudarc; what needs no driver still works.

use std::sync::Arc;

use tensorbridge_core::{
    Access, DType, Descriptor, Device, DeviceType, Layout, Packing, Ready, Stream, StreamHandle,
    Tensor,
};
use tensorbridge_cuda::Error;

/// A pinned-host tensor over real host memory (so the owner's promise holds: every byte is
/// readable and writable) with a producer stream, so that hand-off must reach the driver.
///
/// The producer is the legacy default stream, not a made-up handle: attaching a readiness
/// vouches that its streams are live, and no handle is live on a machine without a driver.
fn host_tensor_with_stream() -> Tensor {
    let data: Arc<Vec<f32>> = Arc::new((0..16).map(|i| i as f32 + 0.5).collect());
    let desc = Descriptor::new(
        data.as_ptr() as usize,
        Device::new(DeviceType::CudaHost, 0),
        DType::FLOAT32,
        Packing::Packed,
        Layout::row_major(&[16]).unwrap(),
        Access::ReadOnly,
    )
    .unwrap();
    // SAFETY: the span is the vector's 16 elements, kept alive by the owner (the `Arc`) and
    // never written (read-only, and no one else holds the vector).
    let t = unsafe { Tensor::from_descriptor(desc, data) };
    // SAFETY:
    // - 1: nothing is pending on the data, so it is ready after any point of any stream;
    // - 2: the legacy default stream is no handle, and always a live stream;
    // - 3: not the per-thread default stream.
    unsafe { t.with_ready(Ready::Stream(Stream::LegacyDefault)) }
}

#[test]
fn made_up_handles_are_safe_to_make() {
    // A handle is only a number until something trusts it: making one, and a readiness that
    // names it, needs no `unsafe`. Attaching it (`Tensor::with_ready`) or handing it to the
    // driver (`tensorbridge_cuda::handoff_raw`, `tensorbridge_cuda::make_ready_on_raw`...) does.
    let made_up = Stream::Handle(StreamHandle::new(0x7f00_dead_b000).unwrap());
    let ready = Ready::Stream(made_up);
    assert_eq!(ready.producer_stream(), Some(made_up));
    assert_eq!(
        tensorbridge_cuda::stream_from_raw(tensorbridge_cuda::raw_stream(made_up)),
        made_up,
        "converting is not trusting"
    );
}

#[test]
fn driver_presence_agrees_with_cudarcs_loader() {
    // `driver_present` asks the dynamic loader, so that it also builds where cudarc links
    // libcuda (candle's CUDA half); where cudarc loads it, as in this crate's own builds,
    // cudarc's check must give the same answer, or "present" could still end in cudarc's
    // panic at the first call (and "absent" refuse a machine cudarc would have served).
    // SAFETY: `is_culib_present` only tries to load libcuda under cudarc's names (running its
    // initialisers, as any use of cudarc would) and drops the handle again.
    let cudarc_says = unsafe { cudarc::driver::sys::is_culib_present() };
    assert_eq!(tensorbridge_cuda::driver_present(), cudarc_says);
}

#[test]
fn driver_calls_report_no_driver() {
    if tensorbridge_cuda::driver_present() {
        println!("libcuda is present here: the no-driver path is covered on machines without it");
        return;
    }
    let t = host_tensor_with_stream();
    let consumer = Stream::PerThreadDefault;
    // SAFETY: the calling thread's per-thread default stream is always a live stream.
    let ordered = unsafe { tensorbridge_cuda::make_ready_on_raw(&t, consumer) };
    assert!(matches!(ordered, Err(Error::NoDriver)));
    // SAFETY: as above; the result (an error here) never leaves this thread.
    let handed = unsafe { tensorbridge_cuda::handoff_raw(&t, consumer) };
    assert!(matches!(handed, Err(Error::NoDriver)));
    assert!(matches!(
        tensorbridge_cuda::record_ready(&t),
        Err(Error::NoDriver)
    ));
    assert!(matches!(
        tensorbridge_cuda::synchronize(&t),
        Err(Error::NoDriver)
    ));
    // SAFETY: the legacy default stream is always a live stream.
    let recorded = unsafe { tensorbridge_cuda::CudaSignal::record_raw(0, Stream::LegacyDefault) };
    assert!(matches!(recorded, Err(Error::NoDriver)));
    assert!(matches!(
        tensorbridge_cuda::primary_context(0),
        Err(Error::NoDriver)
    ));
    assert!(matches!(
        tensorbridge_cuda::inspect(0x1234_5678_9012_3450),
        Err(Error::NoDriver)
    ));
    assert!(matches!(
        tensorbridge_cuda::check_span(t.descriptor()),
        Err(Error::NoDriver)
    ));
    assert!(matches!(
        tensorbridge_cuda::settle(t.as_ref()),
        Err(Error::NoDriver)
    ));
    assert!(matches!(
        tensorbridge_cuda::wait_ready(t.as_ref()),
        Err(Error::NoDriver)
    ));
    // SAFETY: the per-thread default stream is live; the tensor is borrowed for the call.
    let borrowed = unsafe { tensorbridge_cuda::make_ready_on_raw(t.as_ref(), consumer) };
    assert!(matches!(borrowed, Err(Error::NoDriver)));
    assert!(matches!(
        tensorbridge_cuda::copy::DeviceBuffer::alloc(0, 16),
        Err(Error::NoDriver)
    ));
    // Retired owners: no device work can be pending without a driver, so they go at once.
    let counter = tensorbridge_testkit::DropCounter::new();
    // SAFETY: the legacy default stream is always a live stream.
    unsafe {
        tensorbridge_cuda::retire_all_on_raw(
            0,
            Stream::LegacyDefault,
            [counter.owner(), counter.owner()],
        )
    };
    assert_eq!(counter.drops(), 2);
    assert_eq!(tensorbridge_cuda::reclaim(), 0);
    assert_eq!(
        Error::NoDriver.to_string(),
        "no CUDA driver: libcuda could not be loaded (expected an NVIDIA driver on this machine)"
    );
}

#[test]
fn ready_tensors_need_no_driver() {
    // SAFETY: 1: nothing is pending on the host data; 2 and 3: `Ready::Now` names no stream.
    let t = unsafe { host_tensor_with_stream().with_ready(Ready::Now) };
    // SAFETY: the legacy default stream is always a live stream.
    unsafe { tensorbridge_cuda::make_ready_on_raw(&t, Stream::LegacyDefault) }.unwrap();
    // SAFETY: this thread's per-thread default stream is live, and the result (ready now,
    // naming no stream) stays on this thread anyway.
    let handed = unsafe { tensorbridge_cuda::handoff_raw(&t, Stream::PerThreadDefault) }.unwrap();
    assert!(handed.ready().is_now());
    assert_eq!(handed.data_ptr(), t.data_ptr());
    assert!(
        tensorbridge_cuda::record_ready(&t)
            .unwrap()
            .ready()
            .is_now()
    );
    assert!(tensorbridge_cuda::synchronize(&t).unwrap().ready().is_now());
}

#[test]
fn same_stream_handoff_needs_no_driver() {
    let t = host_tensor_with_stream();
    let producer = t.ready().producer_stream().unwrap();
    // SAFETY: the producer is the legacy default stream, always live (and not per-thread).
    let handed = unsafe { tensorbridge_cuda::handoff_raw(&t, producer) }.unwrap();
    assert_eq!(handed.ready().producer_stream(), Some(producer));
}

#[test]
fn host_tensors_have_no_producer_device() {
    let t = Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap();
    // SAFETY: 1: nothing is pending on the host data, so any later point is ready; 2: the
    // legacy default stream is no handle; 3: not the per-thread default stream.
    let t = unsafe { t.with_ready(Ready::Stream(Stream::LegacyDefault)) };
    // SAFETY: this thread's per-thread default stream is live; the result (an error) stays
    // on this thread.
    let handed = unsafe { tensorbridge_cuda::handoff_raw(&t, Stream::PerThreadDefault) };
    assert!(matches!(
        handed,
        Err(Error::NotCudaMemory { device }) if device == Device::CPU
    ));
}

#[test]
fn empty_tensors_need_no_inspection() {
    let desc = Descriptor::new(
        0,
        Device::cuda(0),
        DType::FLOAT32,
        Packing::Packed,
        Layout::row_major(&[0, 4]).unwrap(),
        Access::ReadWrite,
    )
    .unwrap();
    assert_eq!(tensorbridge_cuda::check_span(&desc).unwrap(), None);
}
