//! Without libcuda (this crate's CI machines) every driver-facing call says so with
//! `Error::NoDriver` instead of panicking inside cudarc; what needs no driver still works.

use std::sync::Arc;

use tensorbridge::{
    Access, DType, Descriptor, Device, DeviceType, Layout, Packing, Ready, Stream, StreamHandle,
    Tensor,
};
use tensorbridge_cudarc::{self as tbc, Error};

/// A pinned-host tensor over real host memory (so the owner's promise holds: every byte is
/// readable and writable) with a producer stream, so that hand-off must reach the driver.
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
    let producer = Stream::Handle(StreamHandle::new(0x7f00_dead_b000).unwrap());
    // SAFETY: the span is the vector's 16 elements, kept alive by the owner (the `Arc`) and
    // never written (read-only, and no one else holds the vector).
    unsafe { Tensor::from_descriptor(desc, data) }.with_ready(Ready::Stream(producer))
}

#[test]
fn driver_calls_report_no_driver() {
    if tbc::driver_present() {
        println!("libcuda is present here: the no-driver path is covered on machines without it");
        return;
    }
    let t = host_tensor_with_stream();
    let consumer = Stream::PerThreadDefault;
    assert!(matches!(
        tbc::make_ready_on(&t, consumer),
        Err(Error::NoDriver)
    ));
    assert!(matches!(tbc::handoff(&t, consumer), Err(Error::NoDriver)));
    assert!(matches!(tbc::record_ready(&t), Err(Error::NoDriver)));
    assert!(matches!(tbc::synchronize(&t), Err(Error::NoDriver)));
    assert!(matches!(
        tbc::CudaSignal::record(0, Stream::LegacyDefault),
        Err(Error::NoDriver)
    ));
    assert!(matches!(tbc::primary_context(0), Err(Error::NoDriver)));
    assert!(matches!(
        tbc::inspect(0x1234_5678_9012_3450),
        Err(Error::NoDriver)
    ));
    assert!(matches!(
        tbc::check_span(t.descriptor()),
        Err(Error::NoDriver)
    ));
    assert_eq!(tbc::reclaim(), 0);
    assert_eq!(
        Error::NoDriver.to_string(),
        "no CUDA driver: libcuda could not be loaded (expected an NVIDIA driver on this machine)"
    );
}

#[test]
fn ready_tensors_need_no_driver() {
    let t = host_tensor_with_stream().with_ready(Ready::Now);
    tbc::make_ready_on(&t, Stream::LegacyDefault).unwrap();
    let handed = tbc::handoff(&t, Stream::PerThreadDefault).unwrap();
    assert!(handed.ready().is_now());
    assert_eq!(handed.data_ptr(), t.data_ptr());
    assert!(tbc::record_ready(&t).unwrap().ready().is_now());
    assert!(tbc::synchronize(&t).unwrap().ready().is_now());
}

#[test]
fn same_stream_handoff_needs_no_driver() {
    let t = host_tensor_with_stream();
    let producer = t.ready().producer_stream().unwrap();
    let handed = tbc::handoff(&t, producer).unwrap();
    assert_eq!(handed.ready().producer_stream(), Some(producer));
}

#[test]
fn host_tensors_have_no_producer_device() {
    let t = Tensor::from_vec(vec![1.0f32, 2.0], &[2])
        .unwrap()
        .with_ready(Ready::Stream(Stream::LegacyDefault));
    assert!(matches!(
        tbc::handoff(&t, Stream::PerThreadDefault),
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
    assert_eq!(tbc::check_span(&desc).unwrap(), None);
}
