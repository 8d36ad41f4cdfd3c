//! core -> candle: the round trip to the same candle tensor, copies of any strided host
//! tensor (proptest against the testkit's reference), and what is refused.

use candle_core::{Device, Tensor as Candle};
use proptest::prelude::*;
use tensorbridge_candle::Error;
use tensorbridge_testkit::{DropCounter, HostBuffer, small_layout};

proptest! {
    #[test]
    fn copies_match_reference((shape, strides) in small_layout(4)) {
        let buffer = HostBuffer::new(&shape, &strides, |i| i as f64 * 0.5);
        let want = buffer.expected_contiguous();
        let counter = DropCounter::new();
        let t = buffer.into_tensor(&counter);
        let c = tensorbridge_candle::export_copied(&t, &Device::Cpu).unwrap();
        let dims: Vec<usize> = shape.iter().map(|&n| n as usize).collect();
        prop_assert_eq!(c.dims(), &dims[..]);
        prop_assert!(c.is_contiguous());
        prop_assert_eq!(c.flatten_all().unwrap().to_vec1::<f64>().unwrap(), want);
        drop(t);
        // The copy does not hold the tensor.
        prop_assert_eq!(counter.drops(), 1);
    }
}

#[test]
fn the_round_trip_gives_the_same_candle_tensor() {
    let c = Candle::arange(0u8, 24, &Device::Cpu)
        .unwrap()
        .reshape((2, 3, 4))
        .unwrap()
        .transpose(0, 2)
        .unwrap();
    // SAFETY: nothing writes `c` in place.
    let t = unsafe { tensorbridge_candle::import(&c) }.unwrap();
    let back = tensorbridge_candle::export(&t).unwrap();
    assert_eq!(back.id(), c.id());
    // A read-only tensor would become writable in candle: refused.
    let e = tensorbridge_candle::export(&t.clone().into_readonly()).unwrap_err();
    assert!(matches!(e, Error::NotZeroCopy { .. }), "{e}");
}

#[test]
fn tensors_candle_did_not_make_are_refused_with_the_copy_named() {
    let t = tensorbridge_core::Tensor::from_vec(vec![1f32, 2.0], &[2]).unwrap();
    let e = tensorbridge_candle::export(&t).unwrap_err();
    assert_eq!(
        e.to_string(),
        "a tensor that is not an unchanged import of a candle tensor cannot become a candle tensor without a copy: candle tensors own their storage and hold no foreign owner (use export_copied, or export_leaked for contiguous CUDA memory kept until the process exits)"
    );
    let e = tensorbridge_candle::export_leaked(&t, &Device::Cpu).unwrap_err();
    assert_eq!(
        e.to_string(),
        "a host tensor cannot become a candle tensor without a copy: candle's CPU storage is a Vec candle allocated, and cannot hold other memory (use export_copied)"
    );
    let c = tensorbridge_candle::export_copied(&t, &Device::Cpu).unwrap();
    assert_eq!(c.to_vec1::<f32>().unwrap(), [1.0, 2.0]);
}

/// A read-only CUDA tensor (a JAX array, a read-only share) never becomes a candle tensor,
/// which safe candle code may write in place: refused before any device is touched, so this
/// runs without a GPU, on every build (the GPU suite checks the same on candle's CUDA half).
#[test]
fn export_leaked_refuses_read_only_tensors() {
    let shape = [4i64];
    let desc = tensorbridge_core::RawTensor::new(
        0x10000,
        tensorbridge_core::Device::cuda(0),
        tensorbridge_core::DType::FLOAT32,
        &shape,
    )
    .validate()
    .unwrap()
    .to_readonly();
    let counter = DropCounter::new();
    // SAFETY: never dereferenced: the export is refused before any memory is touched.
    let t = unsafe { tensorbridge_core::Tensor::from_descriptor(desc, counter.owner()) };
    // The CPU device: the refusal comes before the device is looked at.
    let e = tensorbridge_candle::export_leaked(&t, &Device::Cpu).unwrap_err();
    assert!(
        matches!(
            e,
            Error::NotZeroCopy {
                what: "a read-only tensor",
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(
        e.to_string(),
        "a read-only tensor cannot become a candle tensor without a copy: candle writes its storages in place from safe code (slice_set, const_set, in-place custom ops) and has no read-only flag (use export_copied)"
    );
    // Nothing was kept: the owner goes with the tensor.
    drop(t);
    assert_eq!(counter.drops(), 1);
}
