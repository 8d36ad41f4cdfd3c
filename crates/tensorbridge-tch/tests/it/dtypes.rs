//! Every tch `Kind` <-> core `DType`, and every core dtype to libtorch and back.

use proptest::prelude::*;
use tch::{Device as TchDevice, Kind};
use tensorbridge_core::{Access, DType, DTypeCode, Device};
use tensorbridge_tch::{Error, ExportOptions, ScalarType, dtype_of_kind, kind_of_dtype};

use crate::{claimed, import};

const KINDS: [Kind; 20] = [
    Kind::Uint8,
    Kind::Int8,
    Kind::Int16,
    Kind::Int,
    Kind::Int64,
    Kind::Half,
    Kind::Float,
    Kind::Double,
    Kind::ComplexHalf,
    Kind::ComplexFloat,
    Kind::ComplexDouble,
    Kind::Bool,
    Kind::QInt8,
    Kind::QUInt8,
    Kind::QInt32,
    Kind::BFloat16,
    Kind::Float8e5m2,
    Kind::Float8e4m3fn,
    Kind::Float8e5m2fnuz,
    Kind::Float8e4m3fnuz,
];

fn fp8(code: DTypeCode) -> DType {
    DType::new(code, 8, 1).unwrap()
}

/// The table the crate promises, written out independently.
fn expected(kind: Kind) -> Option<DType> {
    Some(match kind {
        Kind::Uint8 => DType::UINT8,
        Kind::Int8 => DType::INT8,
        Kind::Int16 => DType::INT16,
        Kind::Int => DType::INT32,
        Kind::Int64 => DType::INT64,
        Kind::Half => DType::FLOAT16,
        Kind::Float => DType::FLOAT32,
        Kind::Double => DType::FLOAT64,
        Kind::ComplexHalf => DType::COMPLEX32,
        Kind::ComplexFloat => DType::COMPLEX64,
        Kind::ComplexDouble => DType::COMPLEX128,
        Kind::Bool => DType::BOOL,
        Kind::QInt8 | Kind::QUInt8 | Kind::QInt32 => return None,
        Kind::BFloat16 => DType::BFLOAT16,
        Kind::Float8e5m2 => DType::FLOAT8_E5M2,
        Kind::Float8e4m3fn => DType::FLOAT8_E4M3FN,
        Kind::Float8e5m2fnuz => fp8(DTypeCode::Float8E5M2Fnuz),
        Kind::Float8e4m3fnuz => fp8(DTypeCode::Float8E4M3Fnuz),
    })
}

#[test]
fn every_kind_maps_to_its_dtype_and_back() {
    for kind in KINDS {
        match (dtype_of_kind(kind), expected(kind)) {
            (Ok(dtype), Some(want)) => {
                assert_eq!(dtype, want, "{kind:?}");
                assert_eq!(kind_of_dtype(dtype).unwrap(), kind);
                assert_eq!(dtype.itemsize(), kind.elt_size_in_bytes(), "{kind:?}");
            }
            (Err(Error::UnsupportedScalarType { scalar_type }), None) => {
                assert_eq!(scalar_type, ScalarType::from_kind(kind));
            }
            (found, want) => panic!("{kind:?}: {found:?}, expected {want:?}"),
        }
    }
}

#[test]
fn every_kind_round_trips_through_tensors() {
    for kind in KINDS {
        let Some(dtype) = expected(kind) else {
            continue;
        };
        let t = tch::Tensor::empty([2, 3], (kind, TchDevice::Cpu));
        let shared = import(&t).unwrap();
        assert_eq!(shared.dtype(), dtype, "{kind:?}");
        assert_eq!(shared.device(), Device::CPU);
        // SAFETY: no view of the tensor lives while libtorch writes it.
        let back = unsafe { tensorbridge_tch::export(&shared) }.unwrap();
        assert_eq!(back.kind(), kind);
        assert_eq!(back.data_ptr(), t.data_ptr());
    }
}

#[test]
fn quantized_kinds_are_refused_with_their_scalar_type() {
    let q = tch::Tensor::from_slice(&[0.5f32, 1.0]).quantize_per_tensor(0.1, 0, Kind::QInt8);
    let err = import(&q).unwrap_err();
    assert!(matches!(
        err,
        Error::UnsupportedScalarType {
            scalar_type: ScalarType::QINT8
        }
    ));
    assert_eq!(
        err.to_string(),
        "scalar type QInt8 (12) has no DLPack type code (expected bool, integers, floats, \
         bfloat16, complex, fp8 or float4_e2m1fn_x2)"
    );
}

#[test]
fn dtypes_tch_has_no_kind_for_still_cross() {
    // libtorch has them; tch 0.24's `Kind` does not.
    let fp4x2 = DType::new(DTypeCode::Float4E2M1Fn, 4, 2).unwrap();
    for dtype in [
        DType::UINT16,
        DType::UINT32,
        DType::UINT64,
        fp8(DTypeCode::Float8E8M0Fnu),
        fp4x2,
    ] {
        let t = claimed(Device::CPU, dtype, &[2, 2], Access::ReadWrite);
        // SAFETY: no view of the tensor lives while libtorch writes it.
        let torch = unsafe { tensorbridge_tch::export(&t) }.unwrap();
        assert!(torch.f_kind().is_err(), "{dtype}: tch has no Kind");
        assert!(matches!(kind_of_dtype(dtype), Err(Error::NoKind { .. })));
        let back = import(&torch).unwrap();
        assert_eq!(back.dtype(), dtype);
        assert_eq!(back.data_ptr(), t.data_ptr());
    }
    assert_eq!(
        kind_of_dtype(DType::UINT16).unwrap_err().to_string(),
        "dtype uint16 is libtorch's UInt16 (27), which tch 0.24 has no Kind for (expected a \
         dtype with a tch::Kind)"
    );
}

proptest! {
    /// Every dtype the core knows either becomes a libtorch tensor of the same dtype, or is
    /// refused as sub-byte or unsupported; never a panic, never another dtype.
    #[test]
    fn export_of_any_dtype_round_trips_or_is_refused(dtype in tensorbridge_testkit::dtype()) {
        let t = claimed(Device::CPU, dtype, &[2], Access::ReadOnly);
        // SAFETY: nothing writes through the libtorch tensor.
        let options = unsafe { ExportOptions::new().allow_read_only() };
        // SAFETY: no view of the tensor lives while libtorch writes it.
        match unsafe { tensorbridge_tch::export_with(&t, options) } {
            Ok(torch) => {
                prop_assert_eq!(import(&torch).unwrap().dtype(), dtype);
                prop_assert!(ScalarType::from_dtype(dtype).is_ok());
            }
            Err(Error::SubByte { dtype: d }) => prop_assert!(d == dtype && dtype.is_subbyte()),
            Err(Error::UnsupportedDType { dtype: d }) => prop_assert_eq!(d, dtype),
            Err(e) => prop_assert!(false, "{dtype}: unexpected {e}"),
        }
    }
}
