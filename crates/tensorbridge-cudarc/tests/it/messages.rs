//! Error messages: lowercase, no trailing period, expected vs found; the CUDA layer's pass
//! through unchanged.

use tensorbridge_core::{DType, Device};
use tensorbridge_cudarc::Error;

#[test]
fn messages_say_what_was_expected_and_found() {
    let cases: Vec<(Error, &str)> = vec![
        (
            Error::OutsideSlice {
                lo: -8,
                hi: 32,
                len: 6,
                nbytes: 24,
            },
            "the layout reaches bytes [-8, 32) from the start of the slice (expected within [0, 24), the slice's 6 elements)",
        ),
        (
            Error::Core(tensorbridge_core::Error::DTypeMismatch {
                expected: DType::FLOAT32,
                found: DType::INT32,
            }),
            "dtype mismatch: expected float32, found int32",
        ),
        (
            Error::Cuda(tensorbridge_cuda::Error::NotCudaMemory {
                device: Device::CPU,
            }),
            "memory on cpu cannot be passed to a CUDA kernel (expected cuda or cuda_managed)",
        ),
    ];
    for (err, want) in cases {
        let got = err.to_string();
        assert_eq!(got, want);
        assert!(!got.ends_with('.'), "{got}");
        assert!(!got.starts_with(char::is_uppercase), "{got}");
    }
}
