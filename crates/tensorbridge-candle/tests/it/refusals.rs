//! Refusals: their variants and messages.

use candle_core::{DType as D, Device, Tensor as Candle};
use tensorbridge_candle::Error;
use tensorbridge_core::{DType, RawTensor, Tensor};

#[test]
fn candle_fp4_is_refused() {
    // candle's own constructors refuse F4; its storage constructor takes raw bytes.
    let c = Candle::from_storage(
        candle_core::Storage::Cpu(candle_core::CpuStorage::F4(vec![0u8; 4])),
        4,
        candle_core::op::BackpropOp::none(),
        false,
    );
    assert_eq!(c.dtype(), D::F4);
    // SAFETY: refused before any access.
    let e = unsafe { tensorbridge_candle::import(&c) }.unwrap_err();
    assert!(
        matches!(e, Error::UnsupportedCandleDType { dtype: "f4" }),
        "{e}"
    );
    assert_eq!(
        e.to_string(),
        "candle dtype f4 has no tensorbridge equivalent (expected u8, u32, i16, i32, i64, bf16, f16, f32, f64, f8e4m3 or f8e8m0; candle stores the fp6/fp4 types as raw bytes of its own layout)"
    );
}

#[test]
fn dtypes_candle_lacks_are_refused() {
    let t = Tensor::from_vec(vec![1i8, 2], &[2]).unwrap();
    let e = tensorbridge_candle::export_copied(&t, &Device::Cpu).unwrap_err();
    assert_eq!(
        e.to_string(),
        "dtype int8 has no candle equivalent (expected uint8, uint32, int16, int32, int64, bfloat16, float16, float32, float64, float8_e4m3fn or float8_e8m0fnu)"
    );
}

#[test]
fn copies_need_host_memory() {
    let shape = [2i64];
    let desc = RawTensor::new(
        0x1000,
        tensorbridge_core::Device::cuda(0),
        DType::FLOAT32,
        &shape,
    )
    .validate()
    .unwrap();
    // SAFETY: never dereferenced: refused before any access.
    let t = unsafe { Tensor::from_descriptor(desc, std::sync::Arc::new(())) };
    let e = tensorbridge_candle::export_copied(&t, &Device::Cpu).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Core(tensorbridge_core::Error::NotHostAccessible { .. })
        ),
        "{e}"
    );
    let e = tensorbridge_candle::export_leaked(&t, &Device::Cpu).unwrap_err();
    assert_eq!(
        e.to_string(),
        "the tensor is on cuda:0 but the candle device is cpu (expected the same device)"
    );
}
