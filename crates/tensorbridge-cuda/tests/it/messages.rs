//! Error messages: lowercase, no trailing period, expected vs found.

use cudarc::driver::sys::CUresult;
use tensorbridge_core::{Device, DeviceType};
use tensorbridge_cuda::{Error, MemoryType};

#[test]
fn messages_say_what_was_expected_and_found() {
    let too_large = tensorbridge_core::Error::OrdinalTooLarge { ordinal: u32::MAX }.to_string();
    let cases: Vec<(Error, &str)> = vec![
        (
            Error::NoDriver,
            "no CUDA driver: libcuda could not be loaded (expected an NVIDIA driver on this machine)",
        ),
        (
            Error::Driver {
                call: "cuStreamWaitEvent",
                result: CUresult::CUDA_ERROR_INVALID_HANDLE,
            },
            "the CUDA driver call cuStreamWaitEvent failed with CUDA_ERROR_INVALID_HANDLE",
        ),
        (
            Error::NotCudaMemory {
                device: Device::CPU,
            },
            "memory on cpu cannot be passed to a CUDA kernel (expected cuda or cuda_managed)",
        ),
        (
            Error::DeviceMismatch {
                tensor: Device::cuda(1),
                stream: 0,
            },
            "the tensor is on cuda:1 but the stream belongs to cuda:0 (expected the same device)",
        ),
        (
            Error::NotAllocation {
                addr: 0x1234_5678_9012_3456,
            },
            "address 0x1234567890123456 is not a CUDA allocation",
        ),
        (
            Error::MemoryTypeMismatch {
                addr: 0x7000,
                found: MemoryType::Host,
                expected: MemoryType::Device,
                device: Device::cuda(0),
            },
            "address 0x7000 is pinned host memory (expected device memory for a tensor on cuda:0)",
        ),
        (
            Error::OrdinalMismatch {
                addr: 0x7000,
                found: 1,
                device: Device::cuda(0),
            },
            "address 0x7000 is on cuda:1 (expected cuda:0)",
        ),
        (
            Error::PastAllocation {
                lo: 0x7f00_0000_1000,
                hi: 0x7f00_0000_2000,
                by: 4096,
                base: 0x7f00_0000_0000,
                end: 0x7f00_0000_1000,
                device: Device::cuda(0),
            },
            "bytes [0x7f0000001000, 0x7f0000002000) run 4096 bytes past the allocation [0x7f0000000000, 0x7f0000001000) on cuda:0",
        ),
        (
            Error::BeforeAllocation {
                lo: 0x7f00_0000_0f00,
                hi: 0x7f00_0000_1100,
                by: 256,
                base: 0x7f00_0000_1000,
                end: 0x7f00_0000_2000,
                device: Device::new(DeviceType::CudaManaged, 0),
            },
            "bytes [0x7f0000000f00, 0x7f0000001100) start 256 bytes before the allocation [0x7f0000001000, 0x7f0000002000) on cuda_managed",
        ),
        (
            Error::Core(tensorbridge_core::Error::OrdinalTooLarge { ordinal: u32::MAX }),
            &too_large,
        ),
    ];
    for (err, want) in cases {
        let got = err.to_string();
        assert_eq!(got, want);
        assert!(!got.ends_with('.'), "{got}");
        assert!(!got.starts_with(char::is_uppercase), "{got}");
    }
}

#[test]
fn foreign_signal_errors_keep_their_source() {
    let inner: Box<dyn std::error::Error + Send + Sync> = "the other adapter broke".into();
    let err = Error::Signal(std::sync::Arc::from(inner));
    assert_eq!(
        err.to_string(),
        "the tensor's ready signal failed: the other adapter broke"
    );
    assert!(std::error::Error::source(&err).is_some());
}
