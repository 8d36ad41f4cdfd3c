//! The trust boundary: `RawTensor::validate` never panics, accepts every valid descriptor,
//! and rejects overflow instead of wrapping.

use proptest::prelude::*;
use tensorbridge_core::{DType, Error, RawTensor};
use tensorbridge_testkit::{any_raw, valid_raw};

proptest! {
    #![proptest_config(crate::config())]

    #[test]
    fn validate_never_panics(parts in any_raw()) {
        // The property is the absence of a panic; an accepted descriptor must also be
        // internally consistent.
        if let Ok(d) = parts.as_raw().validate() {
            prop_assert_eq!(d.shape(), &parts.shape[..]);
            prop_assert_eq!(d.ndim(), parts.shape.len());
            let span = d.byte_span();
            prop_assert!(span.start <= span.end);
        }
    }

    #[test]
    fn valid_descriptors_are_accepted(parts in valid_raw()) {
        let d = parts.as_raw().validate();
        prop_assert!(d.is_ok(), "{:?} -> {:?}", parts, d);
        let d = d.unwrap();
        prop_assert_eq!(d.device().kind.code(), parts.device_type);
        prop_assert_eq!(d.dtype().code().code(), parts.dtype_code);
        prop_assert_eq!(d.is_readonly(), parts.readonly);
        if let Some(strides) = &parts.strides {
            prop_assert_eq!(d.strides_elems(), &strides[..]);
        } else {
            prop_assert!(d.layout().is_c_contiguous());
        }
    }

    /// Whatever validation accepts agrees with exact (128-bit) arithmetic; whatever would
    /// overflow 64 bits is refused.
    #[test]
    fn overflow_is_rejected_never_wrapped(
        shape in proptest::collection::vec(prop_oneof![0i64..4, Just(1i64 << 31), Just(1i64 << 40), Just(i64::MAX)], 0..5),
        strides in proptest::collection::vec(prop_oneof![-3i64..4, Just(1i64 << 40), Just(-(1i64 << 54)), Just(i64::MAX), Just(i64::MIN)], 0..5),
        data in prop_oneof![Just(1usize << 12), Just(usize::MAX - 4095), Just(1usize << 62)],
        byte_offset in prop_oneof![Just(0u64), Just(8), Just(u64::MAX - 7)],
    ) {
        let raw = RawTensor {
            strides: Some(&strides),
            byte_offset,
            ..RawTensor::host(data, DType::FLOAT64, &shape)
        };
        let result = raw.validate();
        if shape.len() != strides.len() {
            prop_assert!(matches!(result, Err(Error::RankMismatch { .. })), "{:?}", result);
            return Ok(());
        }
        // Saturating: anything past 2^127 elements is refused either way.
        let numel: u128 = shape.iter().fold(1u128, |acc, &n| acc.saturating_mul(n as u128));
        let empty = shape.contains(&0);
        let (mut lo, mut hi) = (0i128, 0i128);
        if !empty {
            for (&n, &s) in shape.iter().zip(&strides) {
                // Saturating: sums of several 2^126 products leave i128; refused either way.
                let e = (n as i128 - 1) * s as i128;
                if e < 0 { lo = lo.saturating_add(e) } else { hi = hi.saturating_add(e) }
            }
        }
        match result {
            Ok(d) => {
                prop_assert_eq!(u128::from(d.numel()), if empty { 0 } else { numel });
                prop_assert_eq!(u128::from(d.nbytes()), if empty { 0 } else { numel.saturating_mul(8) });
                let first = data as i128 + byte_offset as i128;
                let span = d.byte_span();
                if empty {
                    prop_assert_eq!(span.len(), 0);
                } else {
                    prop_assert_eq!(span.start as i128, first + lo * 8);
                    prop_assert_eq!(span.end as i128, first + (hi + 1) * 8);
                }
            }
            Err(e) => {
                // Refusals must be for a reason that exact arithmetic confirms.
                let first = data as i128 + byte_offset as i128;
                let fits = (empty || numel.saturating_mul(8) <= u64::MAX as u128)
                    && strides.iter().all(|s| s.unsigned_abs() < (1u64 << 55))
                    && lo > -(1i128 << 55) && hi < (1i128 << 55)
                    && first <= usize::MAX as i128
                    && (empty || (first + lo.saturating_mul(8) >= 0 && first.saturating_add((hi + 1).saturating_mul(8)) <= usize::MAX as i128));
                prop_assert!(!fits, "refused a representable layout: {:?}", e);
                prop_assert!(
                    matches!(e, Error::Overflow { .. } | Error::OutOfAddressSpace { .. }),
                    "unexpected refusal {:?}", e
                );
            }
        }
    }
}

#[test]
fn refusals_carry_the_offending_values() {
    let shape = [2i64, 3];
    let base = RawTensor::host(0x1000, DType::FLOAT32, &shape);
    let cases: [(RawTensor<'_>, Error); 6] = [
        (
            RawTensor {
                device_type: 5,
                ..base
            },
            Error::UnknownDeviceType { code: 5 },
        ),
        (
            RawTensor {
                device_id: -2,
                ..base
            },
            Error::NegativeDeviceId { id: -2 },
        ),
        (
            RawTensor {
                dtype_code: 99,
                ..base
            },
            Error::UnknownDTypeCode { code: 99 },
        ),
        (RawTensor { data: 0, ..base }, Error::NullData { numel: 6 }),
        (
            RawTensor {
                byte_offset: 1,
                ..base
            },
            Error::Misaligned {
                addr: 0x1001,
                align: 4,
            },
        ),
        (
            RawTensor {
                strides: Some(&[3]),
                ..base
            },
            Error::RankMismatch {
                shape: 2,
                strides: 1,
            },
        ),
    ];
    for (raw, want) in cases {
        assert_eq!(raw.validate().unwrap_err(), want);
    }
    let err = RawTensor {
        byte_offset: 1,
        ..base
    }
    .validate()
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "data pointer 0x1001 is not aligned to 4 bytes"
    );
    let err = RawTensor {
        strides: Some(&[3]),
        ..base
    }
    .validate()
    .unwrap_err();
    assert_eq!(err.to_string(), "shape has 2 dimensions but strides has 1");
}
