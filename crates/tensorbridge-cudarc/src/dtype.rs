//! Which cudarc element types stand for which core dtypes.

use cudarc::driver::DeviceRepr;
use tensorbridge_core::DType;

/// A cudarc element type ([`DeviceRepr`]) with the core dtype it stands for.
///
/// Implemented for every `DeviceRepr` type that has a DLPack dtype: `i8`..`i64`,
/// `u8`..`u64`, `f32`, `f64`, `bool`, and with the `half` feature `half::f16` and
/// `half::bf16`. Not for `isize`/`usize` (their width is the target's, so a tensor would
/// change meaning between machines), `i128`/`u128` (no DLPack code), arrays `[T; N]` (a
/// tensor's shape says that), nor cudarc's `f8`/`f4` types (their crates are not pinned
/// here; see the crate docs' limitations).
///
/// # Safety
/// Implementors guarantee:
/// 1. `size_of::<Self>() == Self::DTYPE.itemsize()` and
///    `align_of::<Self>() <= Self::DTYPE.alignment()`, so a slice of `len` elements holds
///    exactly the bytes a tensor of `len` elements of `DTYPE` spans;
/// 2. `Self::DTYPE` is a single-lane, whole-byte dtype.
pub unsafe trait CudaElement: DeviceRepr + Copy + Send + Sync + 'static {
    /// The dtype this type stands for.
    const DTYPE: DType;
}

macro_rules! element {
    ($($t:ty => $dt:expr),* $(,)?) => {$(
        // SAFETY: a primitive of the dtype's size and alignment, single lane, whole bytes
        // (checked by the `every_element_matches_its_dtype` test).
        unsafe impl CudaElement for $t {
            const DTYPE: DType = $dt;
        }
    )*};
}

element! {
    i8 => DType::INT8, i16 => DType::INT16, i32 => DType::INT32, i64 => DType::INT64,
    u8 => DType::UINT8, u16 => DType::UINT16, u32 => DType::UINT32, u64 => DType::UINT64,
    f32 => DType::FLOAT32, f64 => DType::FLOAT64,
    // DLPack `bool` is one byte, like Rust's; see the crate docs on reading foreign bytes.
    bool => DType::BOOL,
}

#[cfg(feature = "half")]
element! { half::f16 => DType::FLOAT16, half::bf16 => DType::BFLOAT16 }

#[cfg(test)]
mod tests {
    use super::*;

    fn check<T: CudaElement>() {
        assert_eq!(size_of::<T>(), T::DTYPE.itemsize(), "{}", T::DTYPE);
        assert!(align_of::<T>() <= T::DTYPE.alignment(), "{}", T::DTYPE);
        assert_eq!(T::DTYPE.lanes(), 1);
        assert!(!T::DTYPE.is_subbyte());
    }

    #[test]
    fn every_element_matches_its_dtype() {
        check::<i8>();
        check::<i16>();
        check::<i32>();
        check::<i64>();
        check::<u8>();
        check::<u16>();
        check::<u32>();
        check::<u64>();
        check::<f32>();
        check::<f64>();
        check::<bool>();
        #[cfg(feature = "half")]
        {
            check::<half::f16>();
            check::<half::bf16>();
        }
    }
}
