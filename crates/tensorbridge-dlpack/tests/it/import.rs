//! Import: what each field and flag of a managed tensor becomes, and what is refused.

use std::ptr;

use proptest::prelude::*;
use tensorbridge_core::{Access, DType, DTypeCode, Device, DeviceType, Packing};
use tensorbridge_dlpack::ffi::{
    DLDataType, DLDataTypeCode, DLDeviceType, DLPackVersion, DlpackFlags,
};
use tensorbridge_dlpack::{Error, Imported, import_legacy, import_versioned};
use tensorbridge_testkit::{DropCounter, HostBuffer, any_raw};

use crate::producer::{self, Spec};

/// Imports a versioned tensor built from `spec` over nothing (fake addresses).
fn import(spec: &Spec, counter: &DropCounter) -> Result<Imported, Error> {
    let p = producer::versioned(spec, (), counter);
    // SAFETY: a live managed tensor from the test producer, ownership passed; fake addresses
    // are never dereferenced (no host view is made of them).
    unsafe { import_versioned(p) }.map_err(Error::from)
}

fn import_legacy_rw(spec: &Spec, counter: &DropCounter) -> Result<Imported, Error> {
    let p = producer::legacy(spec, (), counter);
    // SAFETY: as in `import`.
    unsafe { import_legacy(p, Access::ReadWrite) }.map_err(Error::from)
}

#[test]
fn versioned_host_tensor_keeps_pointer_layout_and_values() {
    let counter = DropCounter::new();
    let t = producer::host_f32(&[2, 3]);
    let p = producer::versioned(&Spec::of(&t), t.clone(), &counter);
    // SAFETY: the test producer's struct describes `t`'s memory, which its payload keeps
    // alive until the deleter runs; nothing writes it.
    let imported = unsafe { import_versioned(p) }.unwrap();
    assert_eq!(imported.version, Some(DLPackVersion::CURRENT));
    assert!(!imported.is_copied);
    let back = imported.into_tensor();
    assert_eq!(back.descriptor(), t.descriptor());
    assert_eq!(back.data_ptr(), t.data_ptr());
    let view = back.host_view::<f32>().unwrap();
    assert_eq!(view.to_contiguous(), vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    assert_eq!(view.get(&[1, 0]).unwrap(), 3.0);
}

#[test]
fn strided_host_tensor_reads_the_producers_values() {
    // Transposed, with a negative stride: the values must come out in logical order.
    let buf = HostBuffer::<i32>::new(&[3, 2], &[-1, 3], |i| i as i32 * 10);
    let expected = buf.expected_contiguous();
    let counter = DropCounter::new();
    let t = buf.into_tensor(&counter);
    let p = producer::versioned(&Spec::of(&t), t.clone(), &counter);
    // SAFETY: describes `t`'s buffer, kept alive by the payload; read-only, never written.
    let back = unsafe { import_versioned(p) }.unwrap().into_tensor();
    assert!(back.is_readonly());
    assert_eq!(back.host_view::<i32>().unwrap().to_contiguous(), expected);
}

#[test]
fn byte_offset_is_kept_and_reaches_the_right_element() {
    let counter = DropCounter::new();
    let t = producer::host_f32(&[8]);
    let mut spec = Spec::of(&t);
    spec.byte_offset = 8;
    spec.shape = Some(vec![3]);
    spec.strides = Some(vec![2]);
    let p = producer::versioned(&spec, t.clone(), &counter);
    // SAFETY: elements 2, 4, 6 of `t`'s buffer, kept alive by the payload.
    let back = unsafe { import_versioned(p) }.unwrap().into_tensor();
    assert_eq!(back.byte_offset(), 8);
    assert_eq!(back.data(), t.data());
    assert_eq!(
        back.host_view::<f32>().unwrap().to_contiguous(),
        vec![2.0, 4.0, 6.0]
    );
}

#[test]
fn read_only_flag_gives_a_read_only_tensor() {
    let counter = DropCounter::new();
    let mut spec = Spec::fake_f32(&[4]);
    let rw = import(&spec, &counter).unwrap().tensor;
    assert_eq!(rw.access(), Access::ReadWrite);
    spec.flags = DlpackFlags::READ_ONLY.bits();
    let ro = import(&spec, &counter).unwrap().tensor;
    assert_eq!(ro.access(), Access::ReadOnly);
}

#[test]
fn is_copied_is_reported() {
    let counter = DropCounter::new();
    let mut spec = Spec::fake_f32(&[4]);
    assert!(!import(&spec, &counter).unwrap().is_copied);
    spec.flags = (DlpackFlags::IS_COPIED | DlpackFlags::READ_ONLY).bits();
    let imported = import(&spec, &counter).unwrap();
    assert!(imported.is_copied);
    assert!(imported.tensor.is_readonly());
}

#[test]
fn subbyte_padded_flag_selects_padded_packing() {
    let counter = DropCounter::new();
    let mut spec = Spec::fake_f32(&[5]);
    spec.dtype = DLDataType {
        code: DLDataTypeCode::FLOAT4_E2M1FN,
        bits: 4,
        lanes: 1,
    };
    let packed = import(&spec, &counter).unwrap().tensor;
    assert_eq!((packed.packing(), packed.nbytes()), (Packing::Packed, 3));
    spec.flags = DlpackFlags::IS_SUBBYTE_TYPE_PADDED.bits();
    let padded = import(&spec, &counter).unwrap().tensor;
    assert_eq!((padded.packing(), padded.nbytes()), (Packing::Padded, 5));
    assert_eq!(padded.dtype(), DType::FLOAT4_E2M1FN);
}

#[test]
fn null_strides_mean_row_major_for_legacy_and_minor_0_and_1() {
    let counter = DropCounter::new();
    let mut spec = Spec::fake_f32(&[2, 3, 4]);
    spec.strides = None;
    let legacy = import_legacy_rw(&spec, &counter).unwrap();
    assert_eq!(legacy.tensor.strides_elems(), &[12, 4, 1]);
    assert_eq!(legacy.version, None);
    for minor in [0, 1] {
        spec.version = DLPackVersion { major: 1, minor };
        let t = import(&spec, &counter).unwrap().tensor;
        assert_eq!(t.strides_elems(), &[12, 4, 1], "1.{minor}");
    }
}

#[test]
fn null_strides_are_refused_from_minor_2_on() {
    let counter = DropCounter::new();
    let mut spec = Spec::fake_f32(&[2, 3]);
    spec.strides = None;
    for minor in [2, 3, 4] {
        spec.version = DLPackVersion { major: 1, minor };
        assert_eq!(
            import(&spec, &counter).unwrap_err(),
            Error::NullStrides {
                major: 1,
                minor,
                ndim: 2
            }
        );
    }
    // Rank 0 needs no strides in any version.
    let mut scalar = Spec::fake_f32(&[]);
    scalar.strides = None;
    assert_eq!(import(&scalar, &counter).unwrap().tensor.numel(), 1);
}

#[test]
fn null_shape_is_a_scalar_only_when_ndim_is_0() {
    let counter = DropCounter::new();
    let mut spec = Spec::fake_f32(&[]);
    spec.shape = None;
    spec.strides = None;
    let t = import(&spec, &counter).unwrap().tensor;
    assert_eq!((t.ndim(), t.numel()), (0, 1));
    let mut spec = Spec::fake_f32(&[3]);
    spec.shape = None;
    assert_eq!(
        import(&spec, &counter).unwrap_err(),
        Error::NullShape { ndim: 1 }
    );
}

#[test]
fn negative_ndim_is_refused() {
    let counter = DropCounter::new();
    let mut spec = Spec::fake_f32(&[3]);
    spec.ndim = -2;
    assert_eq!(
        import(&spec, &counter).unwrap_err(),
        Error::NegativeRank { ndim: -2 }
    );
    assert_eq!(
        import_legacy_rw(&spec, &counter).unwrap_err(),
        Error::NegativeRank { ndim: -2 }
    );
}

#[test]
fn zero_size_tensors_may_have_null_data() {
    let counter = DropCounter::new();
    let mut spec = Spec::fake_f32(&[0, 3]);
    spec.data = ptr::null_mut();
    let t = import(&spec, &counter).unwrap().tensor;
    assert_eq!((t.numel(), t.data(), t.nbytes()), (0, 0, 0));
    assert!(t.host_view::<f32>().unwrap().to_contiguous().is_empty());
}

#[test]
fn null_data_with_elements_is_refused_by_the_core() {
    let counter = DropCounter::new();
    let mut spec = Spec::fake_f32(&[2]);
    spec.data = ptr::null_mut();
    assert_eq!(
        import(&spec, &counter).unwrap_err(),
        Error::Core(tensorbridge_core::Error::NullData { numel: 2 })
    );
}

#[test]
fn misaligned_data_is_refused_by_the_core() {
    let counter = DropCounter::new();
    let mut spec = Spec::fake_f32(&[2]);
    spec.byte_offset = 2;
    assert_eq!(
        import(&spec, &counter).unwrap_err(),
        Error::Core(tensorbridge_core::Error::Misaligned {
            addr: (1 << 20) + 2,
            align: 4
        })
    );
}

#[test]
fn every_device_type_of_the_core_model_imports() {
    let counter = DropCounter::new();
    let mut spec = Spec::fake_f32(&[2]);
    let mut seen = 0;
    for code in 0u32..=20 {
        spec.device.device_type = DLDeviceType(code);
        spec.device.device_id = 3;
        match DeviceType::from_code(code as i32) {
            Ok(kind) => {
                let t = import(&spec, &counter).unwrap().tensor;
                assert_eq!(t.device(), Device::new(kind, 3));
                seen += 1;
            }
            Err(core) => assert_eq!(import(&spec, &counter).unwrap_err(), Error::Core(core)),
        }
    }
    assert_eq!(seen, 16);
    spec.device.device_type = DLDeviceType(u32::MAX);
    assert_eq!(
        import(&spec, &counter).unwrap_err(),
        Error::Core(tensorbridge_core::Error::UnknownDeviceType { code: -1 })
    );
    spec.device.device_type = DLDeviceType::CUDA;
    spec.device.device_id = -1;
    assert_eq!(
        import(&spec, &counter).unwrap_err(),
        Error::Core(tensorbridge_core::Error::NegativeDeviceId { id: -1 })
    );
}

#[test]
fn every_dtype_code_of_the_core_model_imports() {
    let counter = DropCounter::new();
    let mut spec = Spec::fake_f32(&[4]);
    for code in 0u8..=17 {
        let kind = DTypeCode::from_code(code).unwrap();
        for &bits in kind.allowed_bits() {
            for lanes in [1u16, 2] {
                spec.dtype = DLDataType {
                    code: DLDataTypeCode(code),
                    bits,
                    lanes,
                };
                let t = import(&spec, &counter).unwrap().tensor;
                assert_eq!(t.dtype(), DType::new(kind, bits, lanes).unwrap());
            }
        }
    }
    spec.dtype = DLDataType {
        code: DLDataTypeCode(18),
        bits: 8,
        lanes: 1,
    };
    assert_eq!(
        import(&spec, &counter).unwrap_err(),
        Error::Core(tensorbridge_core::Error::UnknownDTypeCode { code: 18 })
    );
    spec.dtype = DLDataType {
        code: DLDataTypeCode::FLOAT4_E2M1FN,
        bits: 8,
        lanes: 1,
    };
    assert!(matches!(
        import(&spec, &counter).unwrap_err(),
        Error::Core(tensorbridge_core::Error::InvalidBits { bits: 8, .. })
    ));
}

#[test]
fn unknown_flag_bits_are_refused() {
    let counter = DropCounter::new();
    let mut spec = Spec::fake_f32(&[2]);
    spec.flags = 1 << 3 | 1;
    assert_eq!(
        import(&spec, &counter).unwrap_err(),
        Error::UnknownFlags { flags: 0b1001 }
    );
}

#[test]
fn newer_minor_versions_are_read_when_understood() {
    let counter = DropCounter::new();
    let mut spec = Spec::fake_f32(&[2, 2]);
    spec.version = DLPackVersion { major: 1, minor: 7 };
    let imported = import(&spec, &counter).unwrap();
    assert_eq!(imported.version, Some(spec.version));
    assert_eq!(imported.tensor.shape(), &[2, 2]);
}

#[test]
fn foreign_major_versions_are_refused() {
    let counter = DropCounter::new();
    for major in [0, 2, u32::MAX] {
        let p = producer::future_major(major, &counter);
        // SAFETY: the stable prefix of a managed tensor, ownership passed.
        let err = unsafe { import_versioned(p) }.unwrap_err();
        assert!(!err.holds_managed());
        assert_eq!(
            err.into_error(),
            Error::UnsupportedMajorVersion {
                found: major,
                expected: 1
            }
        );
    }
}

#[test]
fn legacy_access_is_the_callers() {
    let counter = DropCounter::new();
    let spec = Spec::fake_f32(&[2]);
    for access in [Access::ReadOnly, Access::ReadWrite] {
        let p = producer::legacy(&spec, (), &counter);
        // SAFETY: a live managed tensor, ownership passed; fake address never read.
        let imported = unsafe { import_legacy(p, access) }.unwrap();
        assert_eq!(imported.tensor.access(), access);
        assert!(!imported.is_copied);
    }
}

#[test]
fn messages_say_expected_and_found() {
    let e = Error::UnsupportedMajorVersion {
        found: 2,
        expected: 1,
    };
    assert_eq!(
        e.to_string(),
        "DLPack major version 2 is not supported (expected 1)"
    );
    assert_eq!(
        Error::NegativeRank { ndim: -1 }.to_string(),
        "ndim is -1 (expected ndim >= 0)"
    );
    let core = Error::from(tensorbridge_core::Error::NullData { numel: 3 });
    assert_eq!(
        core.to_string(),
        tensorbridge_core::Error::NullData { numel: 3 }.to_string()
    );
}

proptest! {
    #![proptest_config(crate::proptest_config())]

    /// Any descriptor, valid or not, imports or is refused without panicking, and the
    /// deleter runs exactly once either way.
    #[test]
    fn import_never_panics(parts in any_raw(), versioned in any::<bool>(), ro in any::<bool>()) {
        let counter = DropCounter::new();
        let spec = Spec {
            data: ptr::without_provenance_mut(parts.data),
            device: tensorbridge_dlpack::ffi::DLDevice {
                device_type: DLDeviceType(parts.device_type as u32),
                device_id: parts.device_id,
            },
            dtype: DLDataType {
                code: DLDataTypeCode(parts.dtype_code),
                bits: parts.dtype_bits,
                lanes: parts.dtype_lanes,
            },
            ndim: parts.shape.len() as i32,
            strides: parts.strides.clone().filter(|s| s.len() == parts.shape.len()),
            shape: Some(parts.shape.clone()),
            byte_offset: parts.byte_offset,
            version: DLPackVersion { major: 1, minor: 1 },
            flags: if parts.readonly { 1 } else { 0 } | if parts.padded { 4 } else { 0 },
        };
        let result = if versioned {
            import(&spec, &counter)
        } else {
            let access = if ro { Access::ReadOnly } else { Access::ReadWrite };
            let p = producer::legacy(&spec, (), &counter);
            // SAFETY: a live managed tensor; fake addresses are never read.
            unsafe { import_legacy(p, access) }.map_err(Error::from)
        };
        // What the core says about the same descriptor is what the import says.
        let mut raw = parts.as_raw();
        raw.strides = spec.strides.as_deref();
        if !versioned {
            raw.access = if ro { Access::ReadOnly } else { Access::ReadWrite };
            raw.packing = Packing::Packed;
        }
        match (result, raw.validate()) {
            (Ok(imported), Ok(desc)) => {
                prop_assert_eq!(imported.tensor.descriptor(), &desc);
                prop_assert_eq!(counter.drops(), 0);
            }
            (Err(Error::Core(e)), Err(core)) => prop_assert_eq!(e, core),
            (r, core) => prop_assert!(false, "import {:?} but core {:?}", r.map(|i| i.tensor), core),
        }
        prop_assert_eq!(counter.drops(), 1);
    }
}
