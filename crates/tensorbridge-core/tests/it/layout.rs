//! Layout queries against brute-force enumeration of element offsets.

use proptest::prelude::*;
use tensorbridge_core::{Constraint, DType, Error, Layout, RawTensor};
use tensorbridge_testkit::{brute_offsets, byte_dtype, small_layout};

proptest! {
    #![proptest_config(crate::config())]

    /// Span, C/F contiguity and density agree with enumerating every element's offset.
    #[test]
    fn layout_queries_match_reference((shape, strides) in small_layout(5), dtype in byte_dtype()) {
        let layout = Layout::new(&shape, Some(&strides), 0).unwrap();
        let offsets = brute_offsets(&shape, &strides);
        let n = offsets.len() as i64;
        prop_assert_eq!(layout.numel(), offsets.len() as u64);

        // Row-major: the offsets in C order of the index are exactly 0, 1, 2, ...
        let c = offsets.iter().copied().eq(0..n);
        prop_assert_eq!(layout.is_c_contiguous(), c);
        prop_assert_eq!(layout.check(Constraint::RowMajor).is_ok(), c);

        // Column-major: the same in Fortran order of the index.
        let mut f_offsets = vec![];
        let rev_shape: Vec<i64> = shape.iter().rev().copied().collect();
        let rev_strides: Vec<i64> = strides.iter().rev().copied().collect();
        f_offsets.extend(brute_offsets(&rev_shape, &rev_strides));
        let f = f_offsets.iter().copied().eq(0..n);
        prop_assert_eq!(layout.is_f_contiguous(), f);
        prop_assert_eq!(layout.check(Constraint::ColumnMajor).is_ok(), f);

        // Dense: the offsets, in any order, are exactly 0..n.
        let mut sorted = offsets.clone();
        sorted.sort_unstable();
        let dense = sorted.iter().copied().eq(0..n);
        prop_assert_eq!(layout.is_dense(), dense);
        prop_assert_eq!(layout.check(Constraint::Dense).is_ok(), dense);
        prop_assert!(!c || dense, "C-contiguous implies dense");
        prop_assert!(!f || dense, "F-contiguous implies dense");

        // The byte span is [min, max + 1) elements, in bytes, relative to element 0.
        let raw = RawTensor {
            strides: Some(&strides),
            ..RawTensor::host(1 << 40, dtype, &shape)
        };
        let d = raw.validate().unwrap();
        let item = dtype.itemsize() as i64;
        let want = match (offsets.iter().min(), offsets.iter().max()) {
            (Some(&lo), Some(&hi)) => (lo * item, (hi + 1) * item),
            _ => (0, 0),
        };
        prop_assert_eq!(d.byte_span_from_first(), want);
        prop_assert_eq!(d.byte_span().len() as i64, want.1 - want.0);

        // Negative and broadcast strides, on dimensions that matter.
        let negative = shape.iter().zip(&strides).any(|(&n, &s)| n > 1 && s < 0) && n > 0;
        prop_assert_eq!(layout.check(Constraint::NonNegativeStrides).is_err(), negative);
        let broadcast = shape.iter().zip(&strides).any(|(&n, &s)| n > 1 && s == 0) && n > 0;
        prop_assert_eq!(layout.check(Constraint::NoBroadcast).is_err(), broadcast);
        prop_assert_eq!(d.strides_bytes().unwrap(), strides.iter().map(|s| s * item).collect::<Vec<_>>());
    }

    /// Empty tensors are contiguous in every sense, whatever their strides.
    #[test]
    fn zero_size_tensors_are_contiguous((shape, strides) in small_layout(4), zero_dim in 0usize..4) {
        let mut shape = shape;
        if shape.is_empty() {
            return Ok(());
        }
        let d = zero_dim % shape.len();
        shape[d] = 0;
        let layout = Layout::new(&shape, Some(&strides), 0).unwrap();
        prop_assert!(layout.is_empty());
        prop_assert!(layout.is_c_contiguous() && layout.is_f_contiguous() && layout.is_dense());
        prop_assert!(layout.check_all(&[Constraint::NonNegativeStrides, Constraint::NoBroadcast]).is_ok());
    }

    /// Element strides -> bytes -> elements is the identity; byte strides that are not
    /// multiples of the item size are refused with the offending dimension.
    #[test]
    fn byte_stride_conversion_roundtrip(
        strides in proptest::collection::vec(-1000i64..1000, 0..8),
        dtype in byte_dtype(),
        bump in 1i64..64,
        which in any::<proptest::sample::Index>(),
    ) {
        let item = dtype.itemsize();
        let bytes: Vec<i64> = strides.iter().map(|s| s * item as i64).collect();
        prop_assert_eq!(Layout::strides_from_bytes(&bytes, item).unwrap(), strides.clone());
        if !bytes.is_empty() && bump % item as i64 != 0 {
            let mut bad = bytes.clone();
            let dim = which.index(bad.len());
            bad[dim] += bump;
            prop_assert_eq!(
                Layout::strides_from_bytes(&bad, item),
                Err(Error::StrideNotMultiple { dim, stride_bytes: bad[dim], itemsize: item })
            );
        }
    }
}

#[test]
fn offset_constraint_and_folding() {
    let shape = [4i64];
    let raw = RawTensor {
        byte_offset: 16,
        ..RawTensor::host(0x1000, DType::FLOAT32, &shape)
    };
    let d = raw.validate().unwrap();
    assert_eq!(
        d.layout().check(Constraint::ZeroByteOffset),
        Err(Error::NonZeroByteOffset { byte_offset: 16 })
    );
    let folded = d.with_offset_folded();
    assert_eq!(folded.layout().check(Constraint::ZeroByteOffset), Ok(()));
    assert_eq!(folded.data(), 0x1010);
    assert_eq!(folded.data_ptr(), d.data_ptr());
}
