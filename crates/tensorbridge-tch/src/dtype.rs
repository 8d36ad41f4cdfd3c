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
use tensorbridge::{DType, DTypeCode};

use crate::{Error, ScalarType};

/// A dtype the DLPack header allows (so [`DType::new`] cannot refuse it).
fn allowed(code: DTypeCode, bits: u8, lanes: u16) -> DType {
    DType::new(code, bits, lanes).expect("bits and lanes allowed by the DLPack header")
}

impl ScalarType {
    /// The core dtype with the same memory meaning, or [`Error::UnsupportedScalarType`]
    /// for scalar types DLPack has no code for (quantized, `Bits*`, sub-byte integers).
    #[inline]
    pub fn to_dtype(self) -> Result<DType, Error> {
        Ok(match self {
            ScalarType::BYTE => DType::UINT8,
            ScalarType::CHAR => DType::INT8,
            ScalarType::SHORT => DType::INT16,
            ScalarType::INT => DType::INT32,
            ScalarType::LONG => DType::INT64,
            ScalarType::HALF => DType::FLOAT16,
            ScalarType::FLOAT => DType::FLOAT32,
            ScalarType::DOUBLE => DType::FLOAT64,
            ScalarType::COMPLEX_HALF => DType::COMPLEX32,
            ScalarType::COMPLEX_FLOAT => DType::COMPLEX64,
            ScalarType::COMPLEX_DOUBLE => DType::COMPLEX128,
            ScalarType::BOOL => DType::BOOL,
            ScalarType::BFLOAT16 => DType::BFLOAT16,
            ScalarType::FLOAT8_E5M2 => DType::FLOAT8_E5M2,
            ScalarType::FLOAT8_E4M3FN => DType::FLOAT8_E4M3FN,
            ScalarType::FLOAT8_E5M2FNUZ => allowed(DTypeCode::Float8E5M2Fnuz, 8, 1),
            ScalarType::FLOAT8_E4M3FNUZ => allowed(DTypeCode::Float8E4M3Fnuz, 8, 1),
            ScalarType::UINT16 => DType::UINT16,
            ScalarType::UINT32 => DType::UINT32,
            ScalarType::UINT64 => DType::UINT64,
            ScalarType::FLOAT8_E8M0FNU => allowed(DTypeCode::Float8E8M0Fnu, 8, 1),
            ScalarType::FLOAT4_E2M1FN_X2 => allowed(DTypeCode::Float4E2M1Fn, 4, 2),
            scalar_type => return Err(Error::UnsupportedScalarType { scalar_type }),
        })
    }

    /// The libtorch scalar type for a core dtype: [`Error::SubByte`] for elements smaller
    /// than a byte (libtorch addresses whole bytes), [`Error::UnsupportedDType`] for dtypes
    /// libtorch has no scalar type for.
    #[inline]
    pub fn from_dtype(dtype: DType) -> Result<ScalarType, Error> {
        if dtype.is_subbyte() {
            return Err(Error::SubByte { dtype });
        }
        let found = match (dtype.code(), dtype.bits(), dtype.lanes()) {
            (DTypeCode::UInt, 8, 1) => ScalarType::BYTE,
            (DTypeCode::Int, 8, 1) => ScalarType::CHAR,
            (DTypeCode::Int, 16, 1) => ScalarType::SHORT,
            (DTypeCode::Int, 32, 1) => ScalarType::INT,
            (DTypeCode::Int, 64, 1) => ScalarType::LONG,
            (DTypeCode::Float, 16, 1) => ScalarType::HALF,
            (DTypeCode::Float, 32, 1) => ScalarType::FLOAT,
            (DTypeCode::Float, 64, 1) => ScalarType::DOUBLE,
            (DTypeCode::Complex, 32, 1) => ScalarType::COMPLEX_HALF,
            (DTypeCode::Complex, 64, 1) => ScalarType::COMPLEX_FLOAT,
            (DTypeCode::Complex, 128, 1) => ScalarType::COMPLEX_DOUBLE,
            (DTypeCode::Bool, 8, 1) => ScalarType::BOOL,
            (DTypeCode::Bfloat, 16, 1) => ScalarType::BFLOAT16,
            (DTypeCode::Float8E5M2, 8, 1) => ScalarType::FLOAT8_E5M2,
            (DTypeCode::Float8E4M3Fn, 8, 1) => ScalarType::FLOAT8_E4M3FN,
            (DTypeCode::Float8E5M2Fnuz, 8, 1) => ScalarType::FLOAT8_E5M2FNUZ,
            (DTypeCode::Float8E4M3Fnuz, 8, 1) => ScalarType::FLOAT8_E4M3FNUZ,
            (DTypeCode::UInt, 16, 1) => ScalarType::UINT16,
            (DTypeCode::UInt, 32, 1) => ScalarType::UINT32,
            (DTypeCode::UInt, 64, 1) => ScalarType::UINT64,
            (DTypeCode::Float8E8M0Fnu, 8, 1) => ScalarType::FLOAT8_E8M0FNU,
            (DTypeCode::Float4E2M1Fn, 4, 2) => ScalarType::FLOAT4_E2M1FN_X2,
            _ => return Err(Error::UnsupportedDType { dtype }),
        };
        Ok(found)
    }

    /// The scalar type of a tch [`Kind`] (every kind has one).
    pub fn from_kind(kind: Kind) -> ScalarType {
        match kind {
            Kind::Uint8 => ScalarType::BYTE,
            Kind::Int8 => ScalarType::CHAR,
            Kind::Int16 => ScalarType::SHORT,
            Kind::Int => ScalarType::INT,
            Kind::Int64 => ScalarType::LONG,
            Kind::Half => ScalarType::HALF,
            Kind::Float => ScalarType::FLOAT,
            Kind::Double => ScalarType::DOUBLE,
            Kind::ComplexHalf => ScalarType::COMPLEX_HALF,
            Kind::ComplexFloat => ScalarType::COMPLEX_FLOAT,
            Kind::ComplexDouble => ScalarType::COMPLEX_DOUBLE,
            Kind::Bool => ScalarType::BOOL,
            Kind::QInt8 => ScalarType::QINT8,
            Kind::QUInt8 => ScalarType::QUINT8,
            Kind::QInt32 => ScalarType::QINT32,
            Kind::BFloat16 => ScalarType::BFLOAT16,
            Kind::Float8e5m2 => ScalarType::FLOAT8_E5M2,
            Kind::Float8e4m3fn => ScalarType::FLOAT8_E4M3FN,
            Kind::Float8e5m2fnuz => ScalarType::FLOAT8_E5M2FNUZ,
            Kind::Float8e4m3fnuz => ScalarType::FLOAT8_E4M3FNUZ,
        }
    }

    /// The tch [`Kind`] of this scalar type, or `None` where tch 0.24 has none (`UInt16`,
    /// `UInt32`, `UInt64`, `Float8_e8m0fnu`, `Float4_e2m1fn_x2` and the scalar types DLPack
    /// has no code for either). tch's `Tensor::kind` panics on such tensors; `f_kind` returns
    /// an error.
    pub fn to_kind(self) -> Option<Kind> {
        Some(match self {
            ScalarType::BYTE => Kind::Uint8,
            ScalarType::CHAR => Kind::Int8,
            ScalarType::SHORT => Kind::Int16,
            ScalarType::INT => Kind::Int,
            ScalarType::LONG => Kind::Int64,
            ScalarType::HALF => Kind::Half,
            ScalarType::FLOAT => Kind::Float,
            ScalarType::DOUBLE => Kind::Double,
            ScalarType::COMPLEX_HALF => Kind::ComplexHalf,
            ScalarType::COMPLEX_FLOAT => Kind::ComplexFloat,
            ScalarType::COMPLEX_DOUBLE => Kind::ComplexDouble,
            ScalarType::BOOL => Kind::Bool,
            ScalarType::QINT8 => Kind::QInt8,
            ScalarType::QUINT8 => Kind::QUInt8,
            ScalarType::QINT32 => Kind::QInt32,
            ScalarType::BFLOAT16 => Kind::BFloat16,
            ScalarType::FLOAT8_E5M2 => Kind::Float8e5m2,
            ScalarType::FLOAT8_E4M3FN => Kind::Float8e4m3fn,
            ScalarType::FLOAT8_E5M2FNUZ => Kind::Float8e5m2fnuz,
            ScalarType::FLOAT8_E4M3FNUZ => Kind::Float8e4m3fnuz,
            _ => return None,
        })
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
