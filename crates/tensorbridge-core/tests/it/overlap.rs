//! The non-overlap constraint and the disjointness of a call's arguments, against
//! brute-force enumeration of element offsets and byte spans.

use proptest::prelude::*;
use tensorbridge_core::{Constraint, DType, Device, Error, Layout, RawTensor};
use tensorbridge_testkit::{brute_offsets, small_layout};

proptest! {
    #![proptest_config(crate::config())]

    /// `NonOverlapping` accepts only layouts whose elements all have their own offset, and
    /// accepts every dense one (any permutation of a compact layout).
    #[test]
    fn non_overlapping_is_sound((shape, strides) in small_layout(5)) {
        let layout = Layout::new(&shape, Some(&strides), 0).unwrap();
        let mut offsets = brute_offsets(&shape, &strides);
        offsets.sort_unstable();
        let distinct = offsets.windows(2).all(|w| w[0] != w[1]);
        let accepted = layout.check(Constraint::NonOverlapping).is_ok();
        prop_assert_eq!(accepted, layout.is_non_overlapping());
        prop_assert!(!accepted || distinct, "accepted an overlapping layout: {:?} {:?}", shape, strides);
        prop_assert!(!layout.is_dense() || accepted, "refused a dense layout: {:?} {:?}", shape, strides);
        if let Err(e) = layout.check(Constraint::NonOverlapping) {
            let Error::SelfOverlap { dim, size, stride, .. } = e else {
                panic!("unexpected error {e:?}");
            };
            prop_assert_eq!((size, stride), (shape[dim], strides[dim]));
            prop_assert!(size > 1);
        }
    }

    /// Strides that grow faster than the span inside them (every transposition, slicing with
    /// steps, negative steps) are accepted, whatever their order and signs.
    #[test]
    fn spread_strides_are_accepted(
        shape in proptest::collection::vec(1i64..=4, 0..5),
        gaps in proptest::collection::vec(0i64..=3, 5),
        signs in proptest::collection::vec(any::<bool>(), 5),
        perm in (any::<u64>(), any::<u64>()),
    ) {
        let rank = shape.len();
        let mut strides = vec![0i64; rank];
        let mut span = 0i64;
        let mut order: Vec<usize> = (0..rank).collect();
        order.sort_by_key(|&d| (perm.0.rotate_left(d as u32) ^ perm.1) % 97);
        for (k, &d) in order.iter().enumerate() {
            let s = span + 1 + gaps[k];
            strides[d] = if signs[k] { -s } else { s };
            span += s * (shape[d] - 1);
        }
        let layout = Layout::new(&shape, Some(&strides), 0).unwrap();
        prop_assert!(layout.check(Constraint::NonOverlapping).is_ok(), "{:?} {:?}", shape, strides);
    }

    /// Two arguments are refused exactly when both have elements and their byte spans
    /// intersect; the answer does not depend on which one is written.
    #[test]
    fn disjoint_matches_span_intersection(
        a_off in 0usize..64, b_off in 0usize..64,
        (a_shape, a_strides) in small_layout(3), (b_shape, b_strides) in small_layout(3),
    ) {
        let base = 1usize << 20;
        let a = RawTensor {
            strides: Some(&a_strides),
            ..RawTensor::new(base + a_off * 4, Device::cuda(0), DType::FLOAT32, &a_shape)
        }.validate().unwrap();
        let b = RawTensor {
            strides: Some(&b_strides),
            ..RawTensor::new(base + b_off * 4, Device::cuda(0), DType::FLOAT32, &b_shape)
        }.validate().unwrap();
        let bytes = |d: &tensorbridge_core::Descriptor, shape: &[i64], strides: &[i64]| -> Vec<usize> {
            brute_offsets(shape, strides)
                .into_iter()
                .flat_map(|o| {
                    let first = (d.data_ptr() as i64 + o * 4) as usize;
                    first..first + 4
                })
                .collect()
        };
        let (ab, bb) = (bytes(&a, &a_shape, &a_strides), bytes(&b, &b_shape, &b_strides));
        let (alo, ahi) = (ab.iter().min(), ab.iter().max());
        let (blo, bhi) = (bb.iter().min(), bb.iter().max());
        let intersect = match (alo, ahi, blo, bhi) {
            (Some(alo), Some(ahi), Some(blo), Some(bhi)) => alo <= bhi && blo <= ahi,
            _ => false,
        };
        prop_assert_eq!(a.check_disjoint(0, &b, 1).is_err(), intersect);
        prop_assert_eq!(b.check_disjoint(1, &a, 0).is_err(), intersect);
        // Sharing an element is one way to intersect: never accepted.
        let shared = ab.iter().any(|x| bb.contains(x));
        prop_assert!(!shared || intersect);
    }
}

#[test]
fn the_same_tensor_twice_is_aliased_and_names_both_arguments() {
    let shape = [4i64];
    let d = RawTensor::new(0x1000, Device::cuda(0), DType::FLOAT32, &shape)
        .validate()
        .unwrap();
    let err = d.check_disjoint(2, &d, 1).unwrap_err();
    assert_eq!(
        err,
        Error::Aliased {
            written: 2,
            written_lo: 0x1000,
            written_hi: 0x1010,
            other: 1,
            other_lo: 0x1000,
            other_hi: 0x1010,
            device: Device::cuda(0),
        }
    );
    assert_eq!(
        err.to_string(),
        "argument 2 is written but its bytes [0x1000, 0x1010) overlap those of argument 1, [0x1000, 0x1010) on cuda:0 (expected an output disjoint from every other argument; pass a separate tensor, or a copy)"
    );
    // Adjacent halves of one buffer are disjoint.
    let shape2 = [2i64];
    let lo = RawTensor::new(0x1000, Device::cuda(0), DType::FLOAT32, &shape2)
        .validate()
        .unwrap();
    let hi = RawTensor::new(0x1008, Device::cuda(0), DType::FLOAT32, &shape2)
        .validate()
        .unwrap();
    assert_eq!(lo.check_disjoint(0, &hi, 1), Ok(()));
}

#[test]
fn broadcast_and_windows_are_self_overlapping() {
    let b = Layout::new(&[3, 4], Some(&[0, 1]), 0).unwrap();
    assert_eq!(
        b.check(Constraint::NonOverlapping),
        Err(Error::SelfOverlap {
            dim: 0,
            size: 3,
            stride: 0,
            inner: 0
        })
    );
    // Sliding windows of 3 over a row: stride 1 inside, 1 between windows.
    let w = Layout::new(&[5, 3], Some(&[1, 1]), 0).unwrap();
    let err = w.check(Constraint::NonOverlapping).unwrap_err();
    assert!(
        matches!(err, Error::SelfOverlap { stride: 1, .. }),
        "{err:?}"
    );
    assert_eq!(
        Error::SelfOverlap {
            dim: 0,
            size: 3,
            stride: 0,
            inner: 0
        }
        .to_string(),
        "dimension 0 (size 3, stride 0) may reach the same addresses as the dimensions inside it, which span 0 elements (expected a layout in which no two elements share an address: each stride, in increasing magnitude, larger than the span of the smaller ones)"
    );
    // Transposed and stepped layouts are fine.
    let t = Layout::new(&[3, 4], Some(&[1, 3]), 0).unwrap();
    assert!(t.is_non_overlapping());
    let s = Layout::new(&[3, 4], Some(&[-20, 2]), 0).unwrap();
    assert!(s.is_non_overlapping());
}
