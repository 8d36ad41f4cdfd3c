//! Every refusal: its variant, and the message a user sees.

use std::sync::Arc;

use tensorbridge_cai::{
    ArrayData, ArrayInterface, BufferRegion, CudaArrayInterface, DescrField, DescrFormat, Error,
    ImportOptions, Interface, TypeStr, TypeStrProblem,
};
use tensorbridge_core::{
    Access, DType, DTypeCode, Descriptor, Device, DeviceType, Layout, Packing, Ready, Stream,
    StreamConvention, Tensor,
};

use crate::{cai, host, plain, ts};
use tensorbridge_testkit::FakeSignal;

const GPU: Device = Device::cuda(0);

/// The error and its message.
fn refused<T: std::fmt::Debug>(r: Result<T, Error>) -> (Error, String) {
    let e = r.expect_err("a refusal");
    let msg = e.to_string();
    (e, msg)
}

#[test]
fn malformed_typestrs() {
    let cases = [
        ("", TypeStrProblem::Empty, "it is empty"),
        (
            "f4",
            TypeStrProblem::ByteOrder('f'),
            "byte order 'f' is not one of '<', '>', '=', '|'",
        ),
        (
            "<",
            TypeStrProblem::MissingKind,
            "no kind follows the byte order",
        ),
        (
            "<x4",
            TypeStrProblem::Kind('x'),
            "kind 'x' is not one of 't', 'b', 'i', 'u', 'f', 'c', 'm', 'M', 'O', 'S', 'U', 'V'",
        ),
        (
            "<f99999999999999999999",
            TypeStrProblem::Size,
            "the size is not an integer below 2^64",
        ),
        (
            "<f4[ns]",
            TypeStrProblem::Unit,
            "the bracketed unit is not a datetime unit such as [ns] or [10ms] on kind 'm' or 'M'",
        ),
        (
            "<M8[ks]",
            TypeStrProblem::Unit,
            "the bracketed unit is not a datetime unit such as [ns] or [10ms] on kind 'm' or 'M'",
        ),
        (
            "<f4 ",
            TypeStrProblem::Trailing,
            "characters follow the size",
        ),
    ];
    for (s, problem, says) in cases {
        let (e, msg) = refused(s.parse::<TypeStr>());
        assert_eq!(
            e,
            Error::MalformedTypeStr {
                typestr: s.to_owned(),
                problem
            }
        );
        assert_eq!(
            msg,
            format!(
                "malformed typestr {s:?}: {says} (expected <byteorder><kind><size>, like \"<f4\")"
            )
        );
    }
}

#[test]
fn typestrs_without_a_core_dtype() {
    for s in [
        "<f16", "<c32", "<c4", "<f1", "|O", "|O8", "<M8[ns]", "<m8", "|S4", "<U3", "|t8", "<f",
    ] {
        let t = ts(s);
        let (e, msg) = refused(cai(s, &[2], 0x1000).import(GPU, &plain()));
        assert_eq!(e, Error::UnsupportedTypeStr { typestr: t });
        assert_eq!(
            msg,
            format!(
                "typestr {s} has no core dtype (expected |b1, i or u of 1/2/4/8 bytes, f2/f4/f8, c8/c16, or V with ImportOptions::void_as)"
            )
        );
    }
}

#[cfg(target_endian = "little")]
#[test]
fn big_endian_typestrs() {
    for s in [">f4", ">i8", ">c16", ">u2"] {
        let (e, msg) = refused(host(s, &[2], 0x1000).import(&plain()));
        assert_eq!(e, Error::NonNativeByteOrder { typestr: ts(s) });
        assert_eq!(
            msg,
            format!(
                "typestr {s} is big-endian but this machine is little-endian (expected native byte order: '=', '|' or the machine's own)"
            )
        );
    }
}

#[test]
fn raw_bytes_without_a_dtype() {
    let (e, msg) = refused(cai("<V2", &[2], 0x1000).import(GPU, &plain()));
    assert_eq!(e, Error::VoidNeedsDType { typestr: ts("<V2") });
    assert_eq!(
        msg,
        "typestr <V2 is raw bytes that do not say which dtype they hold (expected ImportOptions::void_as, e.g. bfloat16 for <V2)"
    );
}

#[test]
fn raw_bytes_of_the_wrong_size() {
    let opts = ImportOptions::new().void_as(DType::FLOAT32);
    let (e, msg) = refused(cai("<V2", &[2], 0x1000).import(GPU, &opts));
    assert_eq!(
        e,
        Error::VoidSizeMismatch {
            typestr: ts("<V2"),
            dtype: DType::FLOAT32
        }
    );
    assert_eq!(
        msg,
        "typestr <V2 has items of 2 bytes but ImportOptions::void_as is float32 of 4 bytes"
    );
}

#[test]
fn dtypes_without_a_typestr() {
    let vector = DType::new(DTypeCode::Float, 32, 4).unwrap();
    for dt in [
        DType::FLOAT8_E4M3FN,
        DType::FLOAT8_E5M2,
        DType::FLOAT4_E2M1FN,
        DType::COMPLEX32,
        vector,
    ] {
        let (e, msg) = refused(TypeStr::from_dtype(dt));
        assert_eq!(e, Error::NoTypeStr { dtype: dt });
        assert_eq!(
            msg,
            format!(
                "dtype {dt} has no typestr: no convention exists (NumPy has no such type and neither CuPy nor PyTorch exports one)"
            )
        );
        let layout = Layout::row_major(&[2]).unwrap();
        let d =
            Descriptor::new(0x1000, GPU, dt, Packing::Packed, layout, Access::ReadWrite).unwrap();
        assert_eq!(
            CudaArrayInterface::export_descriptor(&d, &Ready::Now),
            Err(Error::NoTypeStr { dtype: dt })
        );
    }
}

#[test]
fn unsupported_versions() {
    for version in [4, -1, i64::MAX] {
        let mut c = cai("<f4", &[2], 0x1000);
        c.version = version;
        let (e, msg) = refused(c.import(GPU, &plain()));
        assert_eq!(e, Error::UnsupportedVersion { version });
        assert_eq!(
            msg,
            format!("interface version {version} is not supported (expected 0 to 3)")
        );
        let mut h = host("<f4", &[2], 0x1000);
        h.version = version;
        assert_eq!(
            h.import(&plain()),
            Err(Error::UnsupportedVersion { version })
        );
    }
}

#[test]
fn masks() {
    let mut c = cai("<f4", &[2], 0x1000);
    c.mask = true;
    let (e, msg) = refused(c.import(GPU, &plain()));
    assert_eq!(e, Error::Masked);
    assert_eq!(
        msg,
        "mask is set (expected None: masked arrays are not supported)"
    );
    let mut h = host("<f4", &[2], 0x1000);
    h.mask = true;
    assert_eq!(h.import(&plain()), Err(Error::Masked));
}

#[test]
fn structured_descrs() {
    let mut c = cai("|V8", &[2], 0x1000);
    let descr = vec![
        DescrField {
            name: "x".into(),
            format: DescrFormat::TypeStr(ts("<f4")),
            shape: None,
        },
        DescrField {
            name: "y".into(),
            format: DescrFormat::TypeStr(ts("<i4")),
            shape: None,
        },
    ];
    c.descr = Some(descr.clone());
    let opaque = DType::new(DTypeCode::OpaqueHandle, 64, 1).unwrap();
    let (e, msg) = refused(c.import(GPU, &ImportOptions::new().void_as(opaque)));
    assert_eq!(
        e,
        Error::StructuredDescr {
            descr,
            typestr: ts("|V8")
        }
    );
    assert_eq!(
        msg,
        "descr [('x', '<f4'), ('y', '<i4')] describes a structured dtype (expected None or [('', '|V8')])"
    );
}

#[test]
fn cai_streams_0_and_negative() {
    for value in [0, -1, -2, i64::MIN] {
        let mut c = cai("<f4", &[2], 0x1000);
        c.stream = Some(value);
        let (e, msg) = refused(c.import(GPU, &plain()));
        assert_eq!(e, Error::InvalidStream { value });
        assert_eq!(
            msg,
            format!(
                "stream {value} is not allowed by the CUDA Array Interface (expected None, 1, 2 or a stream handle above 2; 0 is disallowed)"
            )
        );
    }
}

#[test]
fn negative_offsets() {
    let mut h = host("<f4", &[2], 0);
    h.data = ArrayData::Buffer(BufferRegion {
        address: 0x1000,
        len: 64,
        readonly: false,
    });
    h.offset = -4;
    let (e, msg) = refused(h.import(&plain()));
    assert_eq!(e, Error::NegativeOffset { offset: -4 });
    assert_eq!(msg, "offset -4 is negative (expected a byte offset >= 0)");
}

#[test]
fn elements_outside_the_buffer() {
    let mut h = host("<f4", &[4], 0);
    h.data = ArrayData::Buffer(BufferRegion {
        address: 0x1000,
        len: 16,
        readonly: false,
    });
    h.offset = 4;
    let (e, msg) = refused(h.import(&plain()));
    assert_eq!(
        e,
        Error::OutsideBuffer {
            span: 0x1004..0x1014,
            buffer: 0x1000..0x1010
        }
    );
    assert_eq!(
        msg,
        "the array reaches bytes 0x1004..0x1014 but its buffer spans 0x1000..0x1010"
    );
    // Negative strides reaching before the buffer.
    h.offset = 0;
    h.strides = Some(vec![-4]);
    assert!(matches!(
        h.import(&plain()),
        Err(Error::OutsideBuffer { .. })
    ));
}

#[test]
fn devices_each_interface_cannot_describe() {
    let (e, msg) = refused(cai("<f4", &[2], 0x1000).import(Device::CPU, &plain()));
    assert_eq!(
        e,
        Error::UnsupportedDevice {
            device: Device::CPU,
            interface: Interface::Cuda
        }
    );
    assert_eq!(
        msg,
        "the CUDA Array Interface cannot describe memory on cpu (expected cuda, cuda_managed or cuda_host)"
    );

    let t = Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap();
    assert_eq!(
        CudaArrayInterface::export(&t),
        Err(Error::UnsupportedDevice {
            device: Device::CPU,
            interface: Interface::Cuda
        })
    );

    for device in [GPU, Device::new(DeviceType::CudaManaged, 0)] {
        let layout = Layout::row_major(&[2]).unwrap();
        let d = Descriptor::new(
            0x1000,
            device,
            DType::FLOAT32,
            Packing::Packed,
            layout,
            Access::ReadWrite,
        )
        .unwrap();
        let (e, msg) = refused(ArrayInterface::export_descriptor(&d, &Ready::Now));
        assert_eq!(
            e,
            Error::UnsupportedDevice {
                device,
                interface: Interface::Array
            }
        );
        assert_eq!(
            msg,
            format!(
                "the NumPy array interface cannot describe memory on {device} (expected cpu, cuda_host or rocm_host)"
            )
        );
    }
}

#[test]
fn signals_without_a_producer_stream() {
    let layout = Layout::row_major(&[2]).unwrap();
    let d = Descriptor::new(
        0x1000,
        GPU,
        DType::FLOAT32,
        Packing::Packed,
        layout,
        Access::ReadWrite,
    )
    .unwrap();
    let ready = Ready::Signal(Arc::new(FakeSignal::naming(None)));
    let (e, msg) = refused(CudaArrayInterface::export_descriptor(&d, &ready));
    assert_eq!(e, Error::NoProducerStream);
    assert_eq!(
        msg,
        "the tensor is ready per a signal with no producer stream (expected a stream: the CUDA Array Interface carries a stream, not an event)"
    );
}

#[test]
fn host_export_with_pending_work() {
    let t = Tensor::from_vec(vec![1i32, 2], &[2]).unwrap();
    // SAFETY: 1: nothing is pending on the host data, so it is ready after any point of any
    // stream; 2: the legacy default stream is no handle; 3: not the per-thread default stream.
    let t = unsafe { t.with_ready(Ready::Stream(Stream::LegacyDefault)) };
    let (e, msg) = refused(ArrayInterface::export(&t));
    assert_eq!(e, Error::Core(tensorbridge_core::Error::NotReady));
    assert_eq!(
        msg,
        "the tensor has pending device work (expected it ready; synchronize through its adapter first)"
    );
}

#[test]
fn handles_the_cai_cannot_carry() {
    // A handle above i64::MAX has no Python int in the CAI's signed convention.
    let h = tensorbridge_core::StreamHandle::new(usize::MAX).unwrap();
    let layout = Layout::row_major(&[2]).unwrap();
    let d = Descriptor::new(
        0x1000,
        GPU,
        DType::FLOAT32,
        Packing::Packed,
        layout,
        Access::ReadWrite,
    )
    .unwrap();
    let (e, msg) = refused(CudaArrayInterface::export_descriptor(
        &d,
        &Ready::Stream(Stream::Handle(h)),
    ));
    assert_eq!(
        e,
        Error::Core(tensorbridge_core::Error::StreamNotRepresentable {
            stream: Stream::Handle(h),
            convention: StreamConvention::CudaArrayInterface
        })
    );
    assert_eq!(
        msg,
        format!(
            "CUDA Array Interface v3 has no value for the stream {:#x} (expected one of: None, 1 (legacy default), 2 (per-thread default) or a stream handle; 0 is disallowed)",
            h.get()
        )
    );
}

// ---- refusals the core makes, passed through ----

#[test]
fn byte_strides_not_a_multiple_of_the_item_size() {
    let mut c = cai("<f8", &[2, 2], 0x1000);
    c.strides = Some(vec![16, 4]);
    let (e, msg) = refused(c.import(GPU, &plain()));
    assert_eq!(
        e,
        Error::Core(tensorbridge_core::Error::StrideNotMultiple {
            dim: 1,
            stride_bytes: 4,
            itemsize: 8
        })
    );
    assert_eq!(
        msg,
        "dimension 1 has byte stride 4, not a multiple of the item size 8"
    );
}

#[test]
fn misaligned_data() {
    let (e, msg) = refused(cai("<f4", &[2], 0x1002).import(GPU, &plain()));
    assert_eq!(
        e,
        Error::Core(tensorbridge_core::Error::Misaligned {
            addr: 0x1002,
            align: 4
        })
    );
    assert_eq!(msg, "data pointer 0x1002 is not aligned to 4 bytes");
}

#[test]
fn null_data_with_elements() {
    let (e, msg) = refused(cai("<f4", &[2, 3], 0).import(GPU, &plain()));
    assert_eq!(
        e,
        Error::Core(tensorbridge_core::Error::NullData { numel: 6 })
    );
    assert_eq!(
        msg,
        "data pointer is null but the tensor has 6 elements (null is allowed only when empty)"
    );
}

#[test]
fn strides_of_another_rank() {
    let mut h = host("<i4", &[2, 2], 0x1000);
    h.strides = Some(vec![4]);
    let (e, msg) = refused(h.import(&plain()));
    assert_eq!(
        e,
        Error::Core(tensorbridge_core::Error::RankMismatch {
            shape: 2,
            strides: 1
        })
    );
    assert_eq!(msg, "shape has 2 dimensions but strides has 1");
}

#[test]
fn negative_extents() {
    let (e, msg) = refused(host("<i4", &[2, -3], 0x1000).import(&plain()));
    assert_eq!(
        e,
        Error::Core(tensorbridge_core::Error::NegativeSize { dim: 1, size: -3 })
    );
    assert_eq!(msg, "dimension 1 has negative size -3");
}
