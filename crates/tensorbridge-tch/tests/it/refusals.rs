//! Every typed refusal, with its message.

use tch::{Device as TchDevice, Kind};
use tensorbridge_core::{Access, DType, DTypeCode, Device, DeviceType};
use tensorbridge_tch::{Error, TorchDevice, TorchDeviceType, TorchLayout};

use crate::{claimed, import};

// ---- tch -> Tensor ----

#[test]
fn undefined_tensors() {
    let err = import(&tch::Tensor::new()).unwrap_err();
    assert!(matches!(err, Error::Undefined));
    assert_eq!(
        err.to_string(),
        "the tch tensor is undefined (expected a tensor with data)"
    );
}

#[test]
fn sparse_tensors() {
    let dense = tch::Tensor::eye(3, (Kind::Float, TchDevice::Cpu));
    let sparse = dense.to_sparse(None, None::<&[i64]>, None);
    let err = import(&sparse).unwrap_err();
    assert!(matches!(
        err,
        Error::NotStrided {
            layout: TorchLayout(1)
        }
    ));
    assert_eq!(
        err.to_string(),
        "layout torch.sparse_coo has no strides (expected torch.strided; call to_dense() first)"
    );
}

#[test]
fn conjugate_and_negative_bits() {
    let z = tch::Tensor::zeros([2], (Kind::ComplexFloat, TchDevice::Cpu));
    let err = import(&z.conj()).unwrap_err();
    assert!(matches!(err, Error::ConjugateBit));
    assert_eq!(
        err.to_string(),
        "the tensor's conjugate bit is set, so its memory holds the unconjugated values \
         (expected a materialised tensor; call resolve_conj() first)"
    );
    assert!(import(&z.conj().resolve_conj()).is_ok());

    let x = tch::Tensor::zeros([2], (Kind::Float, TchDevice::Cpu));
    let err = import(&x.internal_neg_view()).unwrap_err();
    assert!(matches!(err, Error::NegativeBit));
    assert_eq!(
        err.to_string(),
        "the tensor's negative bit is set, so its memory holds the values before negation \
         (expected a materialised tensor; call resolve_neg() first)"
    );
}

#[test]
fn devices_without_memory() {
    // tch cannot make a meta tensor; the message is what such a tensor gets.
    let err = Error::UnsupportedTorchDevice {
        device: TorchDevice {
            kind: TorchDeviceType::META,
            index: -1,
        },
    };
    assert_eq!(
        err.to_string(),
        "a tensor on meta cannot be shared (expected cpu or cuda)"
    );
    let mps = TorchDevice {
        kind: TorchDeviceType(13),
        index: 0,
    };
    assert_eq!(mps.to_string(), "mps:0");
    assert_eq!(TorchDeviceType(99).to_string(), "unknown device type 99");
}

// ---- Tensor -> tch ----

#[test]
fn read_only_tensors() {
    let t = claimed(Device::CPU, DType::FLOAT32, &[4], Access::ReadOnly);
    // SAFETY: no view of the tensor lives while libtorch writes it.
    let err = unsafe { tensorbridge_tch::export(&t) }.unwrap_err();
    assert!(matches!(err, Error::ReadOnly));
    assert_eq!(
        err.to_string(),
        "the tensor is read-only but libtorch has no read-only tensors (expected a writable \
         tensor, or ExportOptions::allow_read_only to share it knowingly)"
    );
}

#[test]
fn negative_strides() {
    let base = claimed(Device::CPU, DType::FLOAT32, &[8], Access::ReadWrite);
    let strides = [-2i64];
    let raw = tensorbridge_core::RawTensor {
        strides: Some(&strides),
        byte_offset: 28,
        ..tensorbridge_core::RawTensor::host(base.data(), DType::FLOAT32, &[4])
    };
    // SAFETY: elements 7, 5, 3 and 1 of `base`'s buffer, whose owner is shared; refused
    // before anything reads them.
    let t = unsafe {
        tensorbridge_core::Tensor::from_descriptor(raw.validate().unwrap(), base.owner().clone())
    };
    // SAFETY: no view of the tensor lives while libtorch writes it.
    let err = unsafe { tensorbridge_tch::export(&t) }.unwrap_err();
    assert!(matches!(err, Error::NegativeStride { dim: 0, stride: -2 }));
    assert_eq!(
        err.to_string(),
        "stride -2 of dimension 0 is negative (libtorch takes only strides >= 0)"
    );
}

#[test]
fn sub_byte_and_unsupported_dtypes() {
    let fp4 = DType::FLOAT4_E2M1FN;
    let err =
        // SAFETY: no view of the tensor lives while libtorch writes it.
        unsafe { tensorbridge_tch::export(&claimed(Device::CPU, fp4, &[4], Access::ReadWrite)) }.unwrap_err();
    assert!(matches!(err, Error::SubByte { dtype } if dtype == fp4));
    assert_eq!(
        err.to_string(),
        "dtype float4_e2m1fn has elements smaller than a byte (libtorch takes whole-byte \
         elements only)"
    );

    let e3m4 = DType::new(DTypeCode::Float8E3M4, 8, 1).unwrap();
    let err =
        // SAFETY: no view of the tensor lives while libtorch writes it.
        unsafe { tensorbridge_tch::export(&claimed(Device::CPU, e3m4, &[4], Access::ReadWrite)) }.unwrap_err();
    assert!(matches!(err, Error::UnsupportedDType { dtype } if dtype == e3m4));
    assert_eq!(
        err.to_string(),
        "dtype float8_e3m4 has no libtorch scalar type (expected bool, integers, floats, \
         bfloat16, complex, an fp8 type libtorch has, or float4_e2m1fnx2)"
    );
    let vector = DType::new(DTypeCode::Float, 32, 4).unwrap();
    // SAFETY: no view of the tensor lives while libtorch writes it.
    let err =
        unsafe { tensorbridge_tch::export(&claimed(Device::CPU, vector, &[2], Access::ReadWrite)) }
            .unwrap_err();
    assert!(matches!(err, Error::UnsupportedDType { .. }), "{err}");
}

#[test]
fn devices_libtorch_cannot_take() {
    for kind in [DeviceType::Vulkan, DeviceType::Rocm, DeviceType::OpenCl] {
        let device = Device::new(kind, 0);
        let err =
            // SAFETY: no view of the tensor lives while libtorch writes it.
            unsafe { tensorbridge_tch::export(&claimed(device, DType::FLOAT32, &[4], Access::ReadWrite)) }
                .unwrap_err();
        assert!(matches!(err, Error::UnsupportedDevice { device: d } if d == device));
    }
    // SAFETY: no view of the tensor lives while libtorch writes it.
    let err = unsafe {
        tensorbridge_tch::export(&claimed(
            Device::new(DeviceType::Metal, 0),
            DType::FLOAT32,
            &[4],
            Access::ReadWrite,
        ))
    }
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "memory on metal:0 cannot become a libtorch tensor (expected cpu, cuda_host, cuda or \
         cuda_managed)"
    );

    let device = Device::cuda(200);
    // SAFETY: no view of the tensor lives while libtorch writes it.
    let err = unsafe {
        tensorbridge_tch::export(&claimed(device, DType::FLOAT32, &[4], Access::ReadWrite))
    }
    .unwrap_err();
    assert!(matches!(err, Error::OrdinalOutOfRange { device: d } if d == device));
    assert_eq!(
        err.to_string(),
        "device cuda:200 has an ordinal above 127, libtorch's largest device index"
    );
}

#[test]
fn libtorch_failures_carry_its_message() {
    if tch::Cuda::is_available() {
        return; // The GPU suite covers CUDA; this is the no-GPU path.
    }
    let t = claimed(Device::cuda(0), DType::FLOAT32, &[4], Access::ReadWrite);
    // SAFETY: no view of the tensor lives while libtorch writes it.
    let err = unsafe { tensorbridge_tch::export(&t) }.unwrap_err();
    let Error::Torch { call, message } = &err else {
        panic!("expected a libtorch failure, got {err}");
    };
    assert_eq!(*call, "tb_tch_current_stream");
    assert!(!message.is_empty() && !message.contains("Exception raised from"));
    assert!(
        err.to_string()
            .starts_with("libtorch failed in tb_tch_current_stream: ")
    );
    println!("{err}");
}
