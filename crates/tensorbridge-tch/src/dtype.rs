//! Element types: libtorch's scalar types <-> the core's [`DType`], and tch's [`Kind`] <->
//! libtorch's scalar types (tch keeps that mapping private).
//!
//! | libtorch | core `DType` | tch `Kind` |
//! |---|---|---|
//! | `Bool` | `bool` | `Bool` |
//! | `Byte`, `Char`, `Short`, `Int`, `Long` | `uint8`, `int8`, `int16`, `int32`, `int64` | `Uint8`, `Int8`, `Int16`, `Int`, `Int64` |
//! | `UInt16`, `UInt32`, `UInt64` | `uint16`, `uint32`, `uint64` | none |
//! | `Half`, `Float`, `Double`, `BFloat16` | `float16`, `float32`, `float64`, `bfloat16` | `Half`, `Float`, `Double`, `BFloat16` |
//! | `ComplexHalf`, `ComplexFloat`, `ComplexDouble` | `complex32`, `complex64`, `complex128` | `ComplexHalf`, `ComplexFloat`, `ComplexDouble` |
//! | `Float8_e5m2`, `Float8_e4m3fn`, `Float8_e5m2fnuz`, `Float8_e4m3fnuz` | the same fp8 codes | `Float8e5m2`, `Float8e4m3fn`, `Float8e5m2fnuz`, `Float8e4m3fnuz` |
//! | `Float8_e8m0fnu` | `float8_e8m0fnu` | none |
//! | `Float4_e2m1fn_x2` (two fp4 per byte) | `float4_e2m1fnx2` (4 bits, 2 lanes: one whole byte) | none |
//! | `QInt8`, `QUInt8`, `QInt32`, `QUInt4x2`, `QUInt2x4`, `Bits*`, `UInt1`..`UInt7`, `Int1`..`Int7` | none: refused | `QInt8`, `QUInt8`, `QInt32` (or none) |
//!
//! Core dtypes without a libtorch scalar type (fp8 `e3m4`, `e4m3`, `e4m3b11fnuz`, opaque
//! handles, other vector types) and sub-byte ones (packed or padded fp6 and fp4) are refused
//! on the way to libtorch.

use tch::Kind;
use tensorbridge_core::DType;

use crate::{Error, ScalarType};

/// libtorch's scalar types that have a core dtype, a tch [`Kind`], or both: the one table
/// every conversion below reads (scalar types not listed have neither).
const TABLE: &[(ScalarType, Option<DType>, Option<Kind>)] = &[
    (ScalarType::BYTE, Some(DType::UINT8), Some(Kind::Uint8)),
    (ScalarType::CHAR, Some(DType::INT8), Some(Kind::Int8)),
    (ScalarType::SHORT, Some(DType::INT16), Some(Kind::Int16)),
    (ScalarType::INT, Some(DType::INT32), Some(Kind::Int)),
    (ScalarType::LONG, Some(DType::INT64), Some(Kind::Int64)),
    (ScalarType::HALF, Some(DType::FLOAT16), Some(Kind::Half)),
    (ScalarType::FLOAT, Some(DType::FLOAT32), Some(Kind::Float)),
    (ScalarType::DOUBLE, Some(DType::FLOAT64), Some(Kind::Double)),
    (
        ScalarType::COMPLEX_HALF,
        Some(DType::COMPLEX32),
        Some(Kind::ComplexHalf),
    ),
    (
        ScalarType::COMPLEX_FLOAT,
        Some(DType::COMPLEX64),
        Some(Kind::ComplexFloat),
    ),
    (
        ScalarType::COMPLEX_DOUBLE,
        Some(DType::COMPLEX128),
        Some(Kind::ComplexDouble),
    ),
    (ScalarType::BOOL, Some(DType::BOOL), Some(Kind::Bool)),
    (ScalarType::QINT8, None, Some(Kind::QInt8)),
    (ScalarType::QUINT8, None, Some(Kind::QUInt8)),
    (ScalarType::QINT32, None, Some(Kind::QInt32)),
    (
        ScalarType::BFLOAT16,
        Some(DType::BFLOAT16),
        Some(Kind::BFloat16),
    ),
    (
        ScalarType::FLOAT8_E5M2,
        Some(DType::FLOAT8_E5M2),
        Some(Kind::Float8e5m2),
    ),
    (
        ScalarType::FLOAT8_E4M3FN,
        Some(DType::FLOAT8_E4M3FN),
        Some(Kind::Float8e4m3fn),
    ),
    (
        ScalarType::FLOAT8_E5M2FNUZ,
        Some(DType::FLOAT8_E5M2FNUZ),
        Some(Kind::Float8e5m2fnuz),
    ),
    (
        ScalarType::FLOAT8_E4M3FNUZ,
        Some(DType::FLOAT8_E4M3FNUZ),
        Some(Kind::Float8e4m3fnuz),
    ),
    (ScalarType::UINT16, Some(DType::UINT16), None),
    (ScalarType::UINT32, Some(DType::UINT32), None),
    (ScalarType::UINT64, Some(DType::UINT64), None),
    (
        ScalarType::FLOAT8_E8M0FNU,
        Some(DType::FLOAT8_E8M0FNU),
        None,
    ),
    (
        ScalarType::FLOAT4_E2M1FN_X2,
        Some(DType::FLOAT4_E2M1FNX2),
        None,
    ),
];

impl ScalarType {
    /// The core dtype with the same memory meaning, or [`Error::UnsupportedScalarType`]
    /// for scalar types DLPack has no code for (quantized, `Bits*`, sub-byte integers).
    #[inline]
    pub fn to_dtype(self) -> Result<DType, Error> {
        TABLE
            .iter()
            .find(|(st, _, _)| *st == self)
            .and_then(|(_, dtype, _)| *dtype)
            .ok_or(Error::UnsupportedScalarType { scalar_type: self })
    }

    /// The libtorch scalar type for a core dtype: [`Error::SubByte`] for elements smaller
    /// than a byte (libtorch addresses whole bytes), [`Error::UnsupportedDType`] for dtypes
    /// libtorch has no scalar type for.
    #[inline]
    pub fn from_dtype(dtype: DType) -> Result<ScalarType, Error> {
        if dtype.is_subbyte() {
            return Err(Error::SubByte { dtype });
        }
        TABLE
            .iter()
            .find(|(_, d, _)| *d == Some(dtype))
            .map(|(st, _, _)| *st)
            .ok_or(Error::UnsupportedDType { dtype })
    }

    /// The scalar type of a tch [`Kind`] (every kind has one).
    pub fn from_kind(kind: Kind) -> ScalarType {
        TABLE
            .iter()
            .find(|(_, _, k)| *k == Some(kind))
            .map(|(st, _, _)| *st)
            .expect("every tch Kind is in TABLE (tests/it/dtypes.rs walks every Kind)")
    }

    /// The tch [`Kind`] of this scalar type, or `None` where tch 0.24 has none (`UInt16`,
    /// `UInt32`, `UInt64`, `Float8_e8m0fnu`, `Float4_e2m1fn_x2` and the scalar types DLPack
    /// has no code for either). tch's `Tensor::kind` panics on such tensors; `f_kind` returns
    /// an error.
    pub fn to_kind(self) -> Option<Kind> {
        TABLE
            .iter()
            .find(|(st, _, _)| *st == self)
            .and_then(|(_, _, kind)| *kind)
    }
}

/// The core dtype of a tch [`Kind`]; [`Error::UnsupportedScalarType`] for the quantized
/// kinds, which DLPack has no code for.
pub fn dtype_of_kind(kind: Kind) -> Result<DType, Error> {
    ScalarType::from_kind(kind).to_dtype()
}

/// The tch [`Kind`] of a core dtype: [`ScalarType::from_dtype`]'s refusals, and
/// [`Error::NoKind`] for the scalar types tch 0.24 has no `Kind` for.
pub fn kind_of_dtype(dtype: DType) -> Result<Kind, Error> {
    let scalar_type = ScalarType::from_dtype(dtype)?;
    scalar_type
        .to_kind()
        .ok_or(Error::NoKind { dtype, scalar_type })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every code libtorch 2.11 defines.
    fn all_codes() -> impl Iterator<Item = ScalarType> {
        (0..=45).map(ScalarType)
    }

    #[test]
    fn scalar_types_round_trip_through_dtypes() {
        let mut shared = 0;
        for st in all_codes() {
            match st.to_dtype() {
                Ok(dtype) => {
                    shared += 1;
                    assert_eq!(ScalarType::from_dtype(dtype).unwrap(), st, "{dtype}");
                    assert_eq!(dtype.itemsize(), itemsize(st), "{st}");
                }
                Err(e) => assert!(matches!(e, Error::UnsupportedScalarType { .. })),
            }
        }
        // 5 signed, 4 unsigned, 4 float, 3 complex, bool, 5 fp8, fp4x2.
        assert_eq!(shared, 22);
    }

    /// libtorch's `elementSize` for the codes that have a dtype.
    fn itemsize(st: ScalarType) -> usize {
        match st.0 {
            0 | 1 | 11 | 23..=26 | 44 | 45 => 1,
            2 | 5 | 15 | 27 => 2,
            3 | 6 | 8 | 28 => 4,
            4 | 7 | 9 | 29 => 8,
            10 => 16,
            _ => unreachable!("{st} has no dtype"),
        }
    }

    /// Every row names its scalar type, dtype and kind once, so each lookup direction has
    /// one answer. (That every tch `Kind` has a row is `tests/it/dtypes.rs`'s job: it walks
    /// every `Kind` against an exhaustive, independently written match.)
    #[test]
    fn every_kind_is_in_the_table_once() {
        for kind in TABLE.iter().filter_map(|(_, _, k)| *k) {
            let st = ScalarType::from_kind(kind);
            assert_eq!(st.to_kind(), Some(kind));
            assert_eq!(TABLE.iter().filter(|(_, _, k)| *k == Some(kind)).count(), 1);
        }
        for (st, dtype, _) in TABLE {
            assert_eq!(TABLE.iter().filter(|(s, _, _)| s == st).count(), 1, "{st}");
            if dtype.is_some() {
                assert_eq!(
                    TABLE.iter().filter(|(_, d, _)| d == dtype).count(),
                    1,
                    "{st}"
                );
            }
        }
    }

    #[test]
    fn kinds_round_trip_through_scalar_types() {
        for st in all_codes() {
            if let Some(kind) = st.to_kind() {
                assert_eq!(ScalarType::from_kind(kind), st);
                // tch's own size table agrees with libtorch's where a dtype exists.
                if let Ok(dtype) = st.to_dtype() {
                    assert_eq!(kind.elt_size_in_bytes(), dtype.itemsize(), "{kind:?}");
                }
            }
        }
    }

    #[test]
    fn every_code_has_a_name() {
        for st in all_codes() {
            assert!(st.name().is_some(), "{}", st.0);
        }
        assert_eq!(ScalarType(46).name(), None);
        assert_eq!(ScalarType(-1).to_string(), "unknown scalar type -1");
        assert_eq!(ScalarType::FLOAT.to_string(), "Float (6)");
    }
}
