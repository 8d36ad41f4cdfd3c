//! candle's dtypes <-> the core's.

use candle_core::DType as CandleDType;
use tensorbridge_core::DType;

use crate::Error;

/// The core dtype of a candle dtype: every candle dtype with a fixed byte layout.
pub fn dtype_of_candle(dtype: CandleDType) -> Result<DType, Error> {
    Ok(match dtype {
        CandleDType::U8 => DType::UINT8,
        CandleDType::U32 => DType::UINT32,
        CandleDType::I16 => DType::INT16,
        CandleDType::I32 => DType::INT32,
        CandleDType::I64 => DType::INT64,
        CandleDType::BF16 => DType::BFLOAT16,
        CandleDType::F16 => DType::FLOAT16,
        CandleDType::F32 => DType::FLOAT32,
        CandleDType::F64 => DType::FLOAT64,
        // float8's `F8E4M3` is OCP's E4M3: no infinities, NaN at 0x7f/0xff (`float8_e4m3fn`).
        CandleDType::F8E4M3 => DType::FLOAT8_E4M3FN,
        // One byte per element, the exponent only (OCP MX scale): `float8_e8m0fnu`.
        CandleDType::F8E8M0 => DType::FLOAT8_E8M0FNU,
        other => {
            return Err(Error::UnsupportedCandleDType {
                dtype: other.as_str(),
            });
        }
    })
}

/// The candle dtype of a core dtype.
pub fn candle_dtype_of(dtype: DType) -> Result<CandleDType, Error> {
    Ok(match dtype {
        DType::UINT8 => CandleDType::U8,
        DType::UINT32 => CandleDType::U32,
        DType::INT16 => CandleDType::I16,
        DType::INT32 => CandleDType::I32,
        DType::INT64 => CandleDType::I64,
        DType::BFLOAT16 => CandleDType::BF16,
        DType::FLOAT16 => CandleDType::F16,
        DType::FLOAT32 => CandleDType::F32,
        DType::FLOAT64 => CandleDType::F64,
        DType::FLOAT8_E4M3FN => CandleDType::F8E4M3,
        DType::FLOAT8_E8M0FNU => CandleDType::F8E8M0,
        other => return Err(Error::UnsupportedDType { dtype: other }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mapped_dtype_roundtrips_with_its_size() {
        use CandleDType::*;
        for d in [U8, U32, I16, I32, I64, BF16, F16, F32, F64, F8E4M3, F8E8M0] {
            let core = dtype_of_candle(d).unwrap();
            assert_eq!(core.itemsize(), d.size_in_bytes(), "{d:?}");
            assert_eq!(candle_dtype_of(core).unwrap(), d);
        }
        for d in [F6E2M3, F6E3M2, F4] {
            assert!(dtype_of_candle(d).is_err(), "{d:?}");
        }
        assert!(candle_dtype_of(DType::UINT16).is_err());
    }
}
