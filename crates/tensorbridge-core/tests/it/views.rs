//! Typed host views: strided reads equal the brute-force oracle, writes land where the
//! strides say, refusals are typed.

use proptest::prelude::*;
use tensorbridge_core::{
    Bool8, DType, Device, DeviceType, Error, RawTensor, Ready, Stream, Tensor,
};
use tensorbridge_testkit::{DropCounter, HostBuffer, all_indices, small_layout};

proptest! {
    #![proptest_config(crate::config())]

    /// `to_contiguous` and `get` over real strided memory (negative and zero strides
    /// included) equal an independent computation from the buffer.
    #[test]
    fn host_view_matches_reference((shape, strides) in small_layout(4)) {
        let buf = HostBuffer::<f64>::new(&shape, &strides, |i| i as f64 * 1.5 + 1.0);
        let expected = buf.expected_contiguous();
        let probes: Vec<(Vec<i64>, f64)> = all_indices(&shape).into_iter().map(|ix| {
            let v = buf.expected(&ix);
            (ix, v)
        }).collect();
        let counter = DropCounter::new();
        let t = buf.into_tensor(&counter);
        let view = t.host_view::<f64>().unwrap();
        prop_assert_eq!(view.to_contiguous(), expected);
        for (ix, v) in probes {
            prop_assert_eq!(view.get(&ix).unwrap(), v);
        }
        drop(t);
        prop_assert_eq!(counter.drops(), 1);
    }

    /// `TensorRef::as_slice` is the same memory as the tensor (pointer equality) holding the
    /// reference elements, for every C-contiguous layout, and refuses every other layout with
    /// the constraint's error.
    #[test]
    fn as_slice_is_the_row_major_memory_or_refused((shape, strides) in small_layout(4)) {
        let buf = HostBuffer::<f64>::new(&shape, &strides, |i| i as f64 - 3.0);
        let expected = buf.expected_contiguous();
        let counter = DropCounter::new();
        let t = buf.into_tensor(&counter);
        let row_major = t.layout().check(tensorbridge_core::Constraint::RowMajor).is_ok();
        match t.as_ref().as_slice::<f64>() {
            Ok(slice) => {
                prop_assert!(row_major);
                if !slice.is_empty() {
                    prop_assert_eq!(slice.as_ptr() as usize, t.data_ptr());
                }
                prop_assert_eq!(slice.to_vec(), expected);
            }
            Err(e) => {
                prop_assert!(!row_major);
                let is_not_row_major = matches!(e, Error::NotRowMajor { .. });
                prop_assert!(is_not_row_major, "{e:?}");
            }
        }
        drop(t);
        prop_assert_eq!(counter.drops(), 1);
    }
}

#[test]
fn as_slice_refuses_what_host_view_refuses() {
    let t = Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap();
    assert!(matches!(
        t.as_ref().as_slice::<i32>(),
        Err(Error::DTypeMismatch { .. })
    ));
    assert_eq!(t.as_ref().as_slice::<f32>().unwrap(), &[1.0, 2.0]);
    let cuda = RawTensor::new(0x1000, Device::cuda(0), DType::FLOAT32, &[2])
        .validate()
        .unwrap();
    let ready = Ready::Now;
    // SAFETY: nothing reads the address: the refusal comes first.
    let r = unsafe { tensorbridge_core::TensorRef::from_parts(&cuda, &ready) };
    assert!(matches!(
        r.as_slice::<f32>(),
        Err(Error::NotHostAccessible { .. })
    ));
}

#[test]
fn writes_through_a_mutable_view_are_visible_to_readers() {
    let t = Tensor::from_vec(vec![0i32; 6], &[2, 3]).unwrap();
    let ptr = t.data_ptr();
    {
        // SAFETY: no other view of `t` exists while this one lives.
        let mut w = unsafe { t.host_view_mut::<i32>() }.unwrap();
        w.set(&[1, 2], 42).unwrap();
        w.set(&[0, 0], -1).unwrap();
        assert!(matches!(
            w.set(&[2, 0], 1),
            Err(Error::IndexOutOfBounds { .. })
        ));
    }
    let r = t.host_view::<i32>().unwrap();
    assert_eq!(r.to_contiguous(), vec![-1, 0, 0, 0, 0, 42]);
    // The same memory, seen through the pointer: zero-copy.
    assert_eq!(t.data_ptr(), ptr);
}

#[test]
fn zero_size_views_never_read_the_pointer() {
    // An address nothing is mapped at: any read would fault (and Miri would report it).
    let shape = [3i64, 0, 2];
    let desc = RawTensor::host(0x10, DType::FLOAT32, &shape)
        .validate()
        .unwrap();
    // SAFETY: the span is empty: there are no bytes to keep valid.
    let t = unsafe { Tensor::from_descriptor(desc, std::sync::Arc::new(())) };
    let v = t.host_view::<f32>().unwrap();
    assert_eq!(v.to_contiguous(), Vec::<f32>::new());
    assert_eq!(v.iter().count(), 0);
    assert!(matches!(
        v.get(&[0, 0, 0]),
        Err(Error::IndexOutOfBounds { .. })
    ));
    let null = RawTensor::host(0, DType::FLOAT32, &shape)
        .validate()
        .unwrap();
    assert!(null.layout().is_c_contiguous());
    assert_eq!(null.byte_span(), 0..0);
}

#[test]
fn rank_zero_views_hold_one_element() {
    let t = Tensor::from_vec(vec![7u16], &[]).unwrap();
    let v = t.host_view::<u16>().unwrap();
    assert_eq!(v.get(&[]).unwrap(), 7);
    assert_eq!(v.to_contiguous(), vec![7]);
}

#[test]
fn view_refusals_are_typed() {
    let t = Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap();
    assert_eq!(
        t.host_view::<i32>().err(),
        Some(Error::DTypeMismatch {
            expected: DType::INT32,
            found: DType::FLOAT32
        })
    );
    let ro = t.clone().into_readonly();
    // SAFETY: no other view exists; the call is refused before any access anyway.
    let refused = unsafe { ro.host_view_mut::<f32>() };
    assert_eq!(refused.err(), Some(Error::ReadOnly));
    // SAFETY:
    // - 1: host memory with nothing pending is ready after any point of any stream, so
    //   "ready once the legacy default stream's work so far has finished" is true;
    // - 2: it names no stream handle, only the legacy default stream;
    // - 3: it does not name the per-thread default stream.
    let pending = unsafe { t.clone().with_ready(Ready::Stream(Stream::LegacyDefault)) };
    assert_eq!(pending.host_view::<f32>().err(), Some(Error::NotReady));

    let shape = [2i64];
    let cuda = RawTensor {
        device_type: DeviceType::Cuda.code(),
        device_id: 1,
        ..RawTensor::host(0x1000, DType::FLOAT32, &shape)
    }
    .validate()
    .unwrap();
    // SAFETY: never dereferenced: the view is refused.
    let cuda = unsafe { Tensor::from_descriptor(cuda, std::sync::Arc::new(())) };
    assert_eq!(
        cuda.host_view::<f32>().err(),
        Some(Error::NotHostAccessible {
            device: Device::cuda(1)
        })
    );
}

#[test]
fn bool_elements_are_bytes() {
    let t = Tensor::from_vec(vec![Bool8(0), Bool8(1), Bool8(2)], &[3]).unwrap();
    assert_eq!(t.dtype(), DType::BOOL);
    let v: Vec<bool> = t
        .host_view::<Bool8>()
        .unwrap()
        .iter()
        .map(Bool8::get)
        .collect();
    assert_eq!(v, vec![false, true, true]);
}
