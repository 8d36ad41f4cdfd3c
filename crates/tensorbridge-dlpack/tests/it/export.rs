//! Export: what the emitted managed tensor says, field by field.

use std::slice;
use std::sync::Arc;

use tensorbridge_core::{Access, DType, Device, DeviceType, Packing, RawTensor, Tensor};
use tensorbridge_dlpack::ffi::{
    DLDataTypeCode, DLDeviceType, DLManagedTensor, DLManagedTensorVersioned, DLPackVersion,
    DLTensor, DlpackFlags,
};
use tensorbridge_dlpack::{Error, ReadOnlyPolicy, export_legacy, export_versioned};
use tensorbridge_testkit::DropCounter;

use crate::producer;

/// A tensor at a fake address (never dereferenced) on `device`, with an owner counted by
/// `counter`.
fn fake(raw: RawTensor<'_>, counter: &DropCounter) -> Tensor {
    let desc = raw.validate().expect("valid descriptor");
    // SAFETY: fake addresses: nothing reads or writes through them in these tests.
    unsafe { Tensor::from_descriptor(desc, counter.owner()) }
}

/// The shape and strides an exported struct points at.
fn dims(dl: &DLTensor) -> (&[i64], &[i64]) {
    assert!(
        !dl.shape.is_null() && !dl.strides.is_null(),
        "always emitted"
    );
    let n = dl.ndim as usize;
    // SAFETY: exported structs point `shape` at `ndim` values that live until the deleter
    // runs, after `dl`'s borrow ends.
    let shape = unsafe { slice::from_raw_parts(dl.shape, n) };
    // SAFETY: the same for `strides`.
    let strides = unsafe { slice::from_raw_parts(dl.strides, n) };
    (shape, strides)
}

fn versioned_fields(t: &Tensor) -> (DLPackVersion, DlpackFlags, DLTensor, Vec<i64>, Vec<i64>) {
    let m = export_versioned(t).unwrap();
    // SAFETY: the export is alive while `m` is; nothing mutates it.
    let s: &DLManagedTensorVersioned = unsafe { &*m.as_ptr() };
    let (shape, strides) = dims(&s.dl_tensor);
    (
        s.version,
        s.flags,
        s.dl_tensor,
        shape.to_vec(),
        strides.to_vec(),
    )
}

#[test]
fn versioned_export_describes_the_tensor() {
    let t = producer::host_f32(&[2, 3]);
    let (version, flags, dl, shape, strides) = versioned_fields(&t);
    assert_eq!(version, DLPackVersion { major: 1, minor: 3 });
    assert_eq!(flags, DlpackFlags::empty());
    assert_eq!(dl.data.addr(), t.data());
    assert_eq!(
        (dl.device.device_type, dl.device.device_id),
        (DLDeviceType::CPU, 0)
    );
    assert_eq!(
        (dl.dtype.code, dl.dtype.bits, dl.dtype.lanes),
        (DLDataTypeCode::FLOAT, 32, 1)
    );
    assert_eq!((dl.ndim, dl.byte_offset), (2, 0));
    assert_eq!((shape, strides), (vec![2, 3], vec![3, 1]));
}

#[test]
fn strides_are_emitted_even_for_rank_0() {
    let t = producer::host_f32(&[]);
    let (_, _, dl, shape, strides) = versioned_fields(&t);
    assert_eq!(dl.ndim, 0);
    assert!(shape.is_empty() && strides.is_empty());
    let m = export_legacy(&t, ReadOnlyPolicy::Refuse).unwrap();
    // SAFETY: alive while `m` is.
    let s: &DLManagedTensor = unsafe { &*m.as_ptr() };
    assert!(!s.dl_tensor.strides.is_null());
}

#[test]
fn byte_offset_is_folded_for_address_devices() {
    let counter = DropCounter::new();
    let strides = [-1i64];
    for (kind, folded) in [
        (DeviceType::Cpu, true),
        (DeviceType::Cuda, true),
        (DeviceType::CudaManaged, true),
        (DeviceType::OpenCl, false),
        (DeviceType::Vulkan, false),
        (DeviceType::Metal, false),
    ] {
        let t = fake(
            RawTensor {
                device_type: kind.code(),
                strides: Some(&strides),
                byte_offset: 12,
                ..RawTensor::host(0x1000, DType::FLOAT32, &[4])
            },
            &counter,
        );
        let (_, _, dl, _, strides_out) = versioned_fields(&t);
        assert_eq!(strides_out, vec![-1]);
        if folded {
            assert_eq!((dl.data.addr(), dl.byte_offset), (0x100c, 0), "{kind}");
        } else {
            assert_eq!((dl.data.addr(), dl.byte_offset), (0x1000, 12), "{kind}");
        }
        // Either way, the same first element.
        assert_eq!(dl.data.addr() + dl.byte_offset as usize, t.data() + 12);
    }
}

#[test]
fn device_ids_and_vector_dtypes_are_carried() {
    let counter = DropCounter::new();
    let t = fake(
        RawTensor {
            device_type: DeviceType::Rocm.code(),
            device_id: 7,
            dtype_lanes: 4,
            ..RawTensor::host(0x1000, DType::BFLOAT16, &[3])
        },
        &counter,
    );
    let (_, _, dl, _, _) = versioned_fields(&t);
    assert_eq!(
        (dl.device.device_type, dl.device.device_id),
        (DLDeviceType::ROCM, 7)
    );
    assert_eq!(
        (dl.dtype.code, dl.dtype.bits, dl.dtype.lanes),
        (DLDataTypeCode::BFLOAT, 16, 4)
    );
}

#[test]
fn read_only_tensors_are_flagged_read_only() {
    let t = producer::host_f32(&[4]).into_readonly();
    let (_, flags, ..) = versioned_fields(&t);
    assert_eq!(flags, DlpackFlags::READ_ONLY);
}

#[test]
fn padded_subbyte_tensors_are_flagged_padded() {
    let counter = DropCounter::new();
    let raw = RawTensor::host(0x1000, DType::FLOAT4_E2M1FN, &[5]);
    let packed = fake(raw, &counter);
    assert_eq!(versioned_fields(&packed).1, DlpackFlags::empty());
    let padded = fake(
        RawTensor {
            packing: Packing::Padded,
            access: Access::ReadOnly,
            ..raw
        },
        &counter,
    );
    assert_eq!(
        versioned_fields(&padded).1,
        DlpackFlags::IS_SUBBYTE_TYPE_PADDED | DlpackFlags::READ_ONLY
    );
    assert_eq!(
        export_legacy(&padded, ReadOnlyPolicy::Discard).err(),
        Some(Error::PaddedToLegacy {
            dtype: DType::FLOAT4_E2M1FN
        })
    );
    // Packed sub-byte data is the legacy default.
    assert!(export_legacy(&packed, ReadOnlyPolicy::Refuse).is_ok());
}

#[test]
fn legacy_export_refuses_read_only_unless_told_to_discard() {
    let t = producer::host_f32(&[4]);
    let ro = t.clone().into_readonly();
    assert_eq!(
        export_legacy(&ro, ReadOnlyPolicy::Refuse).err(),
        Some(Error::ReadOnlyToLegacy)
    );
    let m = export_legacy(&ro, ReadOnlyPolicy::Discard).unwrap();
    // SAFETY: alive while `m` is.
    let s: &DLManagedTensor = unsafe { &*m.as_ptr() };
    assert_eq!(s.dl_tensor.data.addr(), t.data());
    assert_eq!(dims(&s.dl_tensor), (&[4i64][..], &[1i64][..]));
    // Writable tensors need no policy.
    assert!(export_legacy(&t, ReadOnlyPolicy::Refuse).is_ok());
}

#[test]
fn ordinals_dlpack_cannot_carry_are_refused() {
    let t = producer::host_f32(&[1]);
    let far = Device::new(DeviceType::Cuda, u32::MAX);
    let desc = tensorbridge_core::Descriptor::new(
        t.data(),
        far,
        t.dtype(),
        t.packing(),
        t.layout().clone(),
        t.access(),
    )
    .unwrap();
    // SAFETY: never dereferenced; `t`'s owner keeps the address meaningful anyway.
    let far = unsafe { Tensor::from_descriptor(desc, Arc::clone(t.owner())) };
    assert_eq!(
        export_versioned(&far).err(),
        Some(Error::Core(tensorbridge_core::Error::OrdinalTooLarge {
            ordinal: u32::MAX
        }))
    );
    assert!(matches!(
        export_legacy(&far, ReadOnlyPolicy::Refuse),
        Err(Error::Core(_))
    ));
}

#[test]
fn shape_and_strides_outlive_the_exported_tensor() {
    // Deeper than the 8 inline dimensions too, where the storage is on the heap.
    for rank in [3usize, 8, 9, 12] {
        let shape: Vec<i64> = (0..rank).map(|d| 1 + (d % 2) as i64).collect();
        let t = producer::host_f32(&shape);
        let expected_strides = t.strides_elems().to_vec();
        let m = export_versioned(&t).unwrap();
        drop(t);
        // SAFETY: alive while `m` is, although the tensor it came from is gone.
        let s: &DLManagedTensorVersioned = unsafe { &*m.as_ptr() };
        let (out_shape, out_strides) = dims(&s.dl_tensor);
        assert_eq!(out_shape, &shape[..]);
        assert_eq!(out_strides, &expected_strides[..]);
        // And the data too: the export's clone keeps the owner alive.
        let n = shape.iter().product::<i64>() as usize;
        // SAFETY: `n` compact f32 values that the export keeps alive, never written.
        let values = unsafe { slice::from_raw_parts(s.dl_tensor.data.cast::<f32>(), n) };
        assert_eq!(values[n - 1], (n - 1) as f32);
    }
}
