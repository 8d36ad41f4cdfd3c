//! Every cudarc element type maps to the core dtype of the same name and size.

use tensorbridge_core::DType;
use tensorbridge_cudarc::CudaElement;

fn check<T: CudaElement>(name: &str) {
    assert_eq!(T::DTYPE, name.parse::<DType>().unwrap(), "{name}");
    assert_eq!(T::DTYPE.to_string(), name);
    assert_eq!(size_of::<T>(), T::DTYPE.itemsize(), "{name}");
    assert!(align_of::<T>() <= T::DTYPE.alignment(), "{name}");
}

#[test]
fn every_element_type_maps_to_its_dtype() {
    check::<i8>("int8");
    check::<i16>("int16");
    check::<i32>("int32");
    check::<i64>("int64");
    check::<u8>("uint8");
    check::<u16>("uint16");
    check::<u32>("uint32");
    check::<u64>("uint64");
    check::<f32>("float32");
    check::<f64>("float64");
    check::<bool>("bool");
}

#[cfg(feature = "half")]
#[test]
fn half_types_map_to_float16_and_bfloat16() {
    check::<half::f16>("float16");
    check::<half::bf16>("bfloat16");
}

#[test]
fn element_dtypes_are_distinct() {
    let all = [
        i8::DTYPE,
        i16::DTYPE,
        i32::DTYPE,
        i64::DTYPE,
        u8::DTYPE,
        u16::DTYPE,
        u32::DTYPE,
        u64::DTYPE,
        f32::DTYPE,
        f64::DTYPE,
        bool::DTYPE,
    ];
    for (i, a) in all.iter().enumerate() {
        for b in &all[i + 1..] {
            assert_ne!(a, b);
        }
    }
}
