//! Host tensors of every small strided layout as ndarray views, against the testkit's
//! reference (values computed from the buffer, not through the core).

use ndarray::{ArrayViewD, Ix2, IxDyn};
use proptest::prelude::*;
use tensorbridge_core::{Access, Constraint, Layout, RawTensor, Tensor};
use tensorbridge_testkit::{DropCounter, HostBuffer, all_indices, small_layout};

fn ix(index: &[i64]) -> Vec<usize> {
    index.iter().map(|&i| i as usize).collect()
}

/// A read-write tensor over a fresh buffer spanning the layout, and the buffer's values.
fn writable(shape: &[i64], strides: &[i64], counter: &DropCounter) -> Tensor {
    let layout = Layout::new(shape, Some(strides), 0).unwrap();
    let (lo, hi) = layout.elem_reach();
    let len = if layout.is_empty() {
        0
    } else {
        (hi - lo + 1) as usize
    };
    let buf: Vec<i64> = (0..len as i64).map(|i| 1000 + i).collect();
    let data = if len == 0 {
        0
    } else {
        buf.as_ptr() as usize + (-lo) as usize * 8
    };
    let raw = RawTensor {
        strides: Some(strides),
        access: Access::ReadWrite,
        ..RawTensor::host(data, tensorbridge_core::DType::INT64, shape)
    };
    let desc = raw.validate().unwrap();
    // SAFETY: the span is exactly the buffer, moved into the owner (a Vec's heap block does
    // not move); the tests read and write it only through views, one at a time.
    unsafe { Tensor::from_descriptor(desc, counter.owner_with(buf)) }
}

proptest! {
    #[test]
    fn views_match_reference((shape, strides) in small_layout(4)) {
        let buffer = HostBuffer::new(&shape, &strides, |i| i as i32 * 7 - 3);
        let expected: Vec<i32> = all_indices(&shape).iter().map(|i| buffer.expected(i)).collect();
        let counter = DropCounter::new();
        let t = buffer.into_tensor(&counter);
        {
            let v = tensorbridge_ndarray::view::<i32, IxDyn>(&t).unwrap();
            prop_assert_eq!(v.shape(), &ix(&shape)[..]);
            // The tensor's own strides, signs included (size-1 and empty dimensions too).
            let strides_isize: Vec<isize> = strides.iter().map(|&s| s as isize).collect();
            if t.numel() > 0 {
                prop_assert_eq!(v.strides(), &strides_isize[..]);
            }
            for (index, want) in all_indices(&shape).iter().zip(&expected) {
                prop_assert_eq!(v[&ix(index)[..]], *want);
            }
            // Zero-copy: element 0 is the tensor's element 0.
            if t.numel() > 0 {
                prop_assert_eq!(v.as_ptr() as usize, t.data_ptr());
            }
            // ndarray's own iteration agrees with the reference, in logical order.
            let got: Vec<i32> = v.iter().copied().collect();
            prop_assert_eq!(got, expected);
        }
        drop(t);
        prop_assert_eq!(counter.drops(), 1);
    }

    #[test]
    fn writable_views_match_reference_and_write_both_ways((shape, strides) in small_layout(4)) {
        let counter = DropCounter::new();
        let t = writable(&shape, &strides, &counter);
        let overlapping = t.layout().check(Constraint::NonOverlapping).is_err();
        // SAFETY: no other view of `t` lives while this one does.
        let r = unsafe { tensorbridge_ndarray::view_mut::<i64, IxDyn>(&t) };
        if overlapping {
            let refused = matches!(
                r,
                Err(tensorbridge_ndarray::Error::Core(tensorbridge_core::Error::SelfOverlap { .. }))
            );
            prop_assert!(refused, "{:?}", r.map(|_| ()));
            return Ok(());
        }
        let mut v = r.unwrap();
        let indices = all_indices(&shape);
        // ndarray writes, the core reads.
        for (k, index) in indices.iter().enumerate() {
            v[&ix(index)[..]] = -(k as i64);
        }
        drop(v);
        {
            let core = t.host_view::<i64>().unwrap();
            for (k, index) in indices.iter().enumerate() {
                prop_assert_eq!(core.get(index).unwrap(), -(k as i64));
            }
        }
        // The core writes, ndarray reads.
        {
            // SAFETY: no other view of `t` lives while this one does.
            let mut core = unsafe { t.host_view_mut::<i64>() }.unwrap();
            for (k, index) in indices.iter().enumerate() {
                core.set(index, 5 * k as i64).unwrap();
            }
        }
        let v = tensorbridge_ndarray::view::<i64, IxDyn>(&t).unwrap();
        for (k, index) in indices.iter().enumerate() {
            prop_assert_eq!(v[&ix(index)[..]], 5 * k as i64);
        }
        drop(v);
        drop(t);
        prop_assert_eq!(counter.drops(), 1);
    }
}

#[test]
fn fixed_rank_views() {
    let t = Tensor::from_vec((0..6).map(|i| i as f32).collect(), &[2, 3]).unwrap();
    let v = tensorbridge_ndarray::view::<f32, Ix2>(&t).unwrap();
    assert_eq!(v[[1, 2]], 5.0);
    assert_eq!(v.t()[[2, 1]], 5.0);
}

#[test]
fn views_of_borrowed_tensors_live_as_long_as_the_borrow() {
    let t = Tensor::from_vec(vec![1u8, 2, 3], &[3]).unwrap();
    let r = t.as_ref();
    let v: ArrayViewD<'_, u8> = tensorbridge_ndarray::view_ref(r).unwrap();
    assert_eq!(v.sum(), 6);
}

#[test]
fn a_clone_keeps_the_memory_while_the_view_of_it_lives() {
    let counter = DropCounter::new();
    let buffer = HostBuffer::new(&[3, 2], &[-2, 1], |i| i as u16);
    let t = buffer.into_tensor(&counter);
    let keep = t.clone();
    drop(t);
    let v = tensorbridge_ndarray::view::<u16, Ix2>(&keep).unwrap();
    assert_eq!(v[[0, 0]], 4);
    assert_eq!(v.strides(), [-2, 1]);
    assert_eq!(counter.drops(), 0);
    drop(keep);
    assert_eq!(counter.drops(), 1);
}
