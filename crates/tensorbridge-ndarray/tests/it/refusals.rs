//! Every refusal: its variant and its message.

use ndarray::{Ix2, IxDyn};
use tensorbridge_core::{Device, RawTensor, Ready, Stream, Tensor};
use tensorbridge_ndarray::Error;
use tensorbridge_testkit::{DropCounter, HostBuffer};

#[test]
fn rank_mismatch() {
    let t = Tensor::from_vec(vec![0u8; 8], &[2, 2, 2]).unwrap();
    let e = tensorbridge_ndarray::view::<u8, Ix2>(&t).unwrap_err();
    assert_eq!(
        e,
        Error::RankMismatch {
            expected: 2,
            found: 3
        }
    );
    assert_eq!(
        e.to_string(),
        "the tensor has 3 dimensions (expected 2 for the requested ndarray dimension type; ask for IxDyn to take any rank)"
    );
}

#[test]
fn wrong_dtype() {
    let t = Tensor::from_vec(vec![0f32; 2], &[2]).unwrap();
    let e = tensorbridge_ndarray::view::<i32, IxDyn>(&t).unwrap_err();
    assert!(matches!(
        e,
        Error::Core(tensorbridge_core::Error::DTypeMismatch { .. })
    ));
    assert_eq!(
        e.to_string(),
        "dtype mismatch: expected int32, found float32"
    );
}

#[test]
fn device_memory() {
    let shape = [4i64];
    let desc = RawTensor::new(
        0x1000,
        Device::cuda(0),
        tensorbridge_core::DType::FLOAT32,
        &shape,
    )
    .validate()
    .unwrap();
    // SAFETY: never dereferenced: the view is refused before any access.
    let t = unsafe { Tensor::from_descriptor(desc, DropCounter::new().owner()) };
    let e = tensorbridge_ndarray::view::<f32, IxDyn>(&t).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Core(tensorbridge_core::Error::NotHostAccessible { .. })
        ),
        "{e}"
    );
}

#[test]
fn pending_work() {
    let t = Tensor::from_vec(vec![0f32; 2], &[2]).unwrap();
    // SAFETY: never used on a device; the view is refused because the data is not ready.
    let t = unsafe { t.with_ready(Ready::Stream(Stream::LegacyDefault)) };
    let e = tensorbridge_ndarray::view::<f32, IxDyn>(&t).unwrap_err();
    assert_eq!(e, Error::Core(tensorbridge_core::Error::NotReady));
}

#[test]
fn writable_views_of_read_only_or_broadcast_tensors() {
    let counter = DropCounter::new();
    let t = HostBuffer::new(&[2], &[1], |i| i as f32).into_tensor(&counter);
    // SAFETY: refused before any view exists.
    let e = unsafe { tensorbridge_ndarray::view_mut::<f32, IxDyn>(&t) }.unwrap_err();
    assert_eq!(e, Error::Core(tensorbridge_core::Error::ReadOnly));

    let one = Tensor::from_vec(vec![7i16], &[1]).unwrap();
    let shape = [3i64, 2];
    let strides = [0i64, 0];
    let raw = RawTensor {
        strides: Some(&strides),
        ..RawTensor::host(one.data_ptr(), tensorbridge_core::DType::INT16, &shape)
    };
    // SAFETY: every element is `one`'s single element, which `one`'s owner keeps alive.
    let b = unsafe { Tensor::from_descriptor(raw.validate().unwrap(), one.owner().clone()) };
    assert_eq!(
        tensorbridge_ndarray::view::<i16, Ix2>(&b).unwrap().sum(),
        42
    );
    // SAFETY: refused before any view exists.
    let e = unsafe { tensorbridge_ndarray::view_mut::<i16, Ix2>(&b) }.unwrap_err();
    assert!(
        matches!(e, Error::Core(tensorbridge_core::Error::SelfOverlap { .. })),
        "{e}"
    );
}
