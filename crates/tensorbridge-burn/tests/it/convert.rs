//! Round trips between burn-flex and the core.

use burn_tensor::{Float, Int, Tensor as Burn};
use proptest::prelude::*;
use tensorbridge_burn::Error;
use tensorbridge_core::{Access, DType, RawTensor, Tensor};
use tensorbridge_testkit::{DropCounter, HostBuffer, all_indices, small_layout};

/// burn's own copy of a tensor's values, in logical C order.
fn burn_values<const D: usize>(b: &Burn<D, Int>) -> Vec<i64> {
    b.to_data().try_to_vec::<i64>().expect("i64 data")
}

proptest! {
    #[test]
    fn exports_match_reference_and_come_back_zero_copy((shape, strides) in small_layout(4)) {
        // Rank 0..=4; burn's dispatching tensor has a compile-time rank, so go through the
        // primitive for any rank and the high-level API for rank 2 below.
        let buffer = HostBuffer::new(&shape, &strides, |i| i as i64 * 3 - 7);
        let want = buffer.expected_contiguous();
        let counter = DropCounter::new();
        let t = buffer.into_tensor(&counter);
        let flex = tensorbridge_burn::export_primitive(&t).unwrap();
        // Zero-copy: burn's element 0 is the tensor's.
        if t.numel() > 0 {
            let first = flex.bytes().as_ptr() as usize + 8 * flex.layout().start_offset();
            prop_assert_eq!(first, t.data_ptr());
        }
        // And back: the same memory, shape and values.
        let back = tensorbridge_burn::import_primitive(&flex).unwrap();
        prop_assert_eq!(back.shape(), t.shape());
        prop_assert!(back.is_readonly());
        if t.numel() > 0 {
            prop_assert_eq!(back.data_ptr(), t.data_ptr());
            prop_assert_eq!(back.strides_elems(), t.strides_elems());
        }
        let view = back.host_view::<i64>().unwrap();
        for (index, w) in all_indices(&shape).iter().zip(&want) {
            prop_assert_eq!(view.get(index).unwrap(), *w);
        }
        // The owner goes once, after burn and the round trip are gone.
        drop(t);
        drop(back);
        prop_assert_eq!(counter.drops(), 0);
        drop(flex);
        prop_assert_eq!(counter.drops(), 1);
    }
}

#[test]
fn burn_reads_and_computes_on_the_shared_memory() {
    let buffer = HostBuffer::new(&[3, 4], &[1, -3], |i| i as i64);
    let want = buffer.expected_contiguous();
    let counter = DropCounter::new();
    let t = buffer.into_tensor(&counter);
    let b: Burn<2, Int> = tensorbridge_burn::export(&t).unwrap();
    assert_eq!(burn_values(&b), want);
    assert_eq!(
        b.clone().sum().into_scalar::<i64>(),
        want.iter().sum::<i64>()
    );
    // A burn view (transpose) back to the core: still the same memory.
    let back = tensorbridge_burn::import(b.clone().transpose()).unwrap();
    assert_eq!(back.data_ptr(), t.data_ptr());
    assert_eq!(back.strides_elems(), [-3, 1]);
    drop((b, back, t));
    assert_eq!(counter.drops(), 1);
}

/// Safe code only: a shared tensor's `&[f32]`, host view and clone stay alive across burn's
/// in-place operation and still read the old values; burn computed in a copy.
#[test]
fn shared_views_never_see_burns_in_place_writes() {
    let t = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[4]).unwrap();
    let clone = t.clone();
    let slice: &[f32] = t.as_ref().as_slice().unwrap();
    let view = clone.host_view::<f32>().unwrap();
    // burn holds its storage alone, contiguous from offset 0: its in-place fast path.
    let b = tensorbridge_burn::export::<1, Float>(&t)
        .unwrap()
        .add_scalar(10.0);
    assert_eq!(
        b.to_data().try_to_vec::<f32>().unwrap(),
        [11.0, 12.0, 13.0, 14.0]
    );
    assert_eq!(
        slice,
        [1.0, 2.0, 3.0, 4.0],
        "a live &[f32] saw burn's write"
    );
    assert_eq!(view.to_contiguous(), [1.0, 2.0, 3.0, 4.0]);
    let after = tensorbridge_burn::import(b).unwrap();
    assert_ne!(after.data_ptr(), t.data_ptr(), "burn wrote a copy");
    // Writable or not, a shared tensor's export is copy-on-write; reading stays zero-copy.
    let b = tensorbridge_burn::export::<1, Float>(&t).unwrap();
    assert_eq!(
        tensorbridge_burn::import(b).unwrap().data_ptr(),
        t.data_ptr()
    );
}

/// A strided shared tensor (negative strides) keeps its values across burn's write too.
#[test]
fn shared_strided_exports_are_copy_on_write() {
    let buffer = HostBuffer::new(&[3, 4], &[1, -3], |i| i as i64);
    let want = buffer.expected_contiguous();
    let counter = DropCounter::new();
    let t = buffer.into_tensor(&counter);
    let view = t.host_view::<i64>().unwrap();
    let b = tensorbridge_burn::export::<2, Int>(&t)
        .unwrap()
        .add_scalar(1);
    assert_eq!(
        burn_values(&b),
        want.iter().map(|v| v + 1).collect::<Vec<_>>()
    );
    assert_eq!(view.to_contiguous(), want);
    drop((b, view));
    drop(t);
    assert_eq!(counter.drops(), 1);
}

/// The exclusive path writes in place, zero-copy (pointer equality), and the owner is
/// released once; a read-only exclusive tensor is still copied at burn's first write.
#[test]
fn exclusive_exports_write_in_place_and_read_only_ones_copy() {
    let counter = DropCounter::new();
    let data: Vec<f32> = vec![1.0, 2.0, 3.0, 4.0];
    let ptr = data.as_ptr() as usize;
    let shape = [4i64];
    let raw = RawTensor {
        access: Access::ReadWrite,
        ..RawTensor::host(ptr, DType::FLOAT32, &shape)
    };
    // SAFETY: the span is `data`'s, moved into the owner; read and written only through
    // the tensor.
    let t = unsafe { Tensor::from_descriptor(raw.validate().unwrap(), counter.owner_with(data)) };
    let t = t.into_exclusive().expect("the only holder");
    let b: Burn<1, Float> = tensorbridge_burn::export_exclusive(t).unwrap();
    let b = b.add_scalar(10.0);
    let after = tensorbridge_burn::import(b.clone()).unwrap();
    assert_eq!(
        after.data_ptr(),
        ptr,
        "burn computed in place, in the tensor's memory"
    );
    let seen = after.host_view::<f32>().unwrap().to_contiguous();
    assert_eq!(seen, [11.0, 12.0, 13.0, 14.0]);
    drop((b, after));
    assert_eq!(counter.drops(), 1);

    // Read-only memory is never written: burn's write goes to a private copy.
    let t = Tensor::from_vec(vec![1.0f32, 2.0], &[2])
        .unwrap()
        .into_readonly();
    let ptr = t.data_ptr();
    let only = t.into_exclusive().expect("the only holder");
    let b: Burn<1, Float> = tensorbridge_burn::export_exclusive(only).unwrap();
    let b = b.mul_scalar(2.0);
    assert_eq!(b.to_data().try_to_vec::<f32>().unwrap(), [2.0, 4.0]);
    assert_ne!(tensorbridge_burn::import(b).unwrap().data_ptr(), ptr);
}

#[test]
fn refusals() {
    let t = Tensor::from_vec(vec![1u8, 0], &[2]).unwrap();
    let bools = RawTensor::host(t.data_ptr(), DType::BOOL, &[2])
        .validate()
        .unwrap();
    // SAFETY: `t`'s memory, kept alive by `t`'s owner; read only by the refused export.
    let b = unsafe { Tensor::from_descriptor(bools, t.owner().clone()) };
    let e = tensorbridge_burn::export_primitive(&b).unwrap_err();
    assert_eq!(
        e.to_string(),
        "dtype bool has no burn-flex equivalent (expected float64, float32, float16, bfloat16, int8..int64 or uint8..uint64)"
    );
    let t = Tensor::from_vec(vec![1.0f32; 6], &[2, 3]).unwrap();
    let e = tensorbridge_burn::export::<3, Float>(&t).unwrap_err();
    assert_eq!(
        e.to_string(),
        "a tensor of 2 dimensions (expected as many dimensions as the burn tensor's rank D)"
    );
    assert!(matches!(e, Error::WrongBurnTensor { .. }));
    let e = tensorbridge_burn::export::<2, Int>(&t).unwrap_err();
    assert_eq!(
        e.to_string(),
        "a float32 tensor asked for as a burn Int tensor (expected Float for floating-point dtypes, Int for integer dtypes)"
    );
}
