//! burn's dtypes <-> the core's.

use burn_std::{BoolStore, DType as BurnDType};
use tensorbridge_core::DType;

use crate::Error;

/// The core dtype of a burn dtype: every burn dtype stored as plain elements.
pub fn dtype_of_burn(dtype: BurnDType) -> Result<DType, Error> {
    Ok(match dtype {
        BurnDType::F64 => DType::FLOAT64,
        // burn's relaxed-precision float: stored as `f32`.
        BurnDType::F32 | BurnDType::Flex32 => DType::FLOAT32,
        BurnDType::F16 => DType::FLOAT16,
        BurnDType::BF16 => DType::BFLOAT16,
        BurnDType::I64 => DType::INT64,
        BurnDType::I32 => DType::INT32,
        BurnDType::I16 => DType::INT16,
        BurnDType::I8 => DType::INT8,
        BurnDType::U64 => DType::UINT64,
        BurnDType::U32 => DType::UINT32,
        BurnDType::U16 => DType::UINT16,
        BurnDType::U8 => DType::UINT8,
        // burn-flex stores booleans as one byte, 0 or 1.
        BurnDType::Bool(BoolStore::Native | BoolStore::U8) => DType::BOOL,
        other => {
            return Err(Error::UnsupportedBurnDType {
                dtype: format!("{other:?}"),
            });
        }
    })
}

/// The burn dtype of a core dtype. Booleans are refused: DLPack's `bool` is a byte that may
/// hold values other than 0 and 1, which burn's kernels do not expect.
pub fn burn_dtype_of(dtype: DType) -> Result<BurnDType, Error> {
    Ok(match dtype {
        DType::FLOAT64 => BurnDType::F64,
        DType::FLOAT32 => BurnDType::F32,
        DType::FLOAT16 => BurnDType::F16,
        DType::BFLOAT16 => BurnDType::BF16,
        DType::INT64 => BurnDType::I64,
        DType::INT32 => BurnDType::I32,
        DType::INT16 => BurnDType::I16,
        DType::INT8 => BurnDType::I8,
        DType::UINT64 => BurnDType::U64,
        DType::UINT32 => BurnDType::U32,
        DType::UINT16 => BurnDType::U16,
        DType::UINT8 => BurnDType::U8,
        other => return Err(Error::UnsupportedDType { dtype: other }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mapped_dtype_roundtrips_with_its_size() {
        use BurnDType::*;
        for d in [F64, F32, F16, BF16, I64, I32, I16, I8, U64, U32, U16, U8] {
            let core = dtype_of_burn(d).unwrap();
            assert_eq!(core.itemsize(), d.size(), "{d:?}");
            assert_eq!(burn_dtype_of(core).unwrap(), d);
        }
        assert_eq!(dtype_of_burn(Bool(BoolStore::U8)).unwrap(), DType::BOOL);
        assert!(dtype_of_burn(Bool(BoolStore::U32)).is_err());
        assert!(burn_dtype_of(DType::BOOL).is_err());
    }
}
