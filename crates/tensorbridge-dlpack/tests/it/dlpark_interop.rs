//! Cross-implementation: our exports read by dlpark's own consumer, dlpark's own exports
//! imported by us, deleters counted on both sides.

use std::ptr::NonNull;

use dlpark::metadata::{Dynamic, Fixed};
use dlpark::{Managed, tensor};
use tensorbridge_core::{Access, DType, Tensor};
use tensorbridge_dlpack::ffi::{
    DLDataType, DLDevice, DLManagedTensor, DLManagedTensorVersioned, DLPackVersion, DlpackFlags,
};
use tensorbridge_dlpack::{
    ReadOnlyPolicy, export_legacy, export_versioned, import_legacy, import_versioned,
};
use tensorbridge_testkit::DropCounter;

use crate::producer;

/// A host tensor over `0..n` whose owner `counter` counts.
fn counted_host(shape: &[i64], counter: &DropCounter) -> Tensor {
    let t = producer::host_f32(shape);
    // SAFETY: `t`'s memory, kept alive by the counted owner, which holds a clone of `t`.
    unsafe { Tensor::from_descriptor(t.descriptor().clone(), counter.owner_with(t.clone())) }
}

#[test]
fn dlpark_consumes_our_versioned_export() {
    let counter = DropCounter::new();
    let t = counted_host(&[2, 3], &counter);
    let raw = export_versioned(&t).unwrap().into_raw();
    drop(t);
    // SAFETY: a live export; ownership moves to dlpark's handle.
    let managed = unsafe { Managed::<DLManagedTensorVersioned>::from_raw(raw) }.unwrap();
    assert_eq!(managed.version(), DLPackVersion::CURRENT);
    assert_eq!(managed.flags(), DlpackFlags::empty());
    // dlpark's stricter check for locally produced tensors (explicit strides) passes too.
    let view = managed.validate_export().unwrap();
    assert_eq!(view.shape(), &[2, 3]);
    assert_eq!(view.strides(), Some(&[3i64, 1][..]));
    assert_eq!(view.dtype(), DLDataType::F32);
    assert_eq!(view.device(), DLDevice::CPU);
    assert_eq!(view.byte_offset(), 0);
    // SAFETY: compact f32 host memory that the export keeps alive; nobody writes it.
    let values = unsafe { view.cpu_slice::<f32>() }.unwrap();
    assert_eq!(values, &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    assert_eq!(counter.drops(), 0);
    drop(managed);
    assert_eq!(counter.drops(), 1);
}

#[test]
fn dlpark_sees_read_only_and_refuses_to_write() {
    let counter = DropCounter::new();
    let t = counted_host(&[4], &counter).into_readonly();
    let raw = export_versioned(&t).unwrap().into_raw();
    // SAFETY: a live export; ownership moves to dlpark's handle.
    let mut managed = unsafe { Managed::<DLManagedTensorVersioned>::from_raw(raw) }.unwrap();
    assert_eq!(managed.flags(), DlpackFlags::READ_ONLY);
    assert!(matches!(
        managed.validate_mut(),
        Err(tensor::Error::ReadOnly)
    ));
    drop(managed);
    drop(t);
    assert_eq!(counter.drops(), 1);
}

#[test]
fn dlpark_consumes_our_legacy_export_with_folded_offset() {
    let counter = DropCounter::new();
    let base = counted_host(&[6], &counter);
    // Elements 2..5 through a byte offset: exported with the offset folded into `data`.
    let raw = tensorbridge_core::RawTensor {
        byte_offset: 8,
        ..tensorbridge_core::RawTensor::host(base.data(), DType::FLOAT32, &[3])
    };
    // SAFETY: inside `base`'s buffer, kept alive by its owner.
    let t = unsafe { Tensor::from_descriptor(raw.validate().unwrap(), base.owner().clone()) };
    drop(base);
    let exported = export_legacy(&t, ReadOnlyPolicy::Refuse)
        .unwrap()
        .into_raw();
    drop(t);
    // SAFETY: a live export; ownership moves to dlpark's handle.
    let managed = unsafe { Managed::<DLManagedTensor>::from_raw(exported) }.unwrap();
    let view = managed.validate_export().unwrap();
    assert_eq!(view.byte_offset(), 0);
    // SAFETY: compact f32 host memory kept alive by the export.
    let values = unsafe { view.cpu_slice::<f32>() }.unwrap();
    assert_eq!(values, &[2.0, 3.0, 4.0]);
    drop(managed);
    assert_eq!(counter.drops(), 1);
}

#[test]
fn we_import_dlparks_versioned_export() {
    let counter = DropCounter::new();
    let mut values: Vec<f32> = (0..6).map(|i| i as f32 * 2.0).collect();
    let data = values.as_mut_ptr().cast();
    // dlpark's producer: runtime-rank metadata copied into its allocation, the Vec (and a
    // counted owner) as its context. Transposed strides.
    let mut init = Dynamic::new(vec![3i64, 2], vec![1i64, 3])
        .initialize(Box::new((counter.owner(), values)))
        .unwrap();
    init.set_data(data)
        .set_dtype(DLDataType::F32)
        .set_device(DLDevice::CPU)
        .set_flags(DlpackFlags::READ_ONLY)
        .unwrap();
    // SAFETY: the descriptor covers the Vec that the context owns until the deleter runs.
    let managed: dlpark::versioned::Dlpack = unsafe { init.finish() };
    let raw = NonNull::new(managed.into_raw()).unwrap();
    // SAFETY: a live managed tensor from dlpark, ownership passed; its memory stays valid
    // until its deleter runs and nobody writes it.
    let imported = unsafe { import_versioned(raw) }.unwrap();
    assert_eq!(imported.version, Some(DLPackVersion::CURRENT));
    let t = imported.into_tensor();
    assert_eq!(t.access(), Access::ReadOnly);
    assert_eq!(
        (t.shape(), t.strides_elems()),
        (&[3i64, 2][..], &[1i64, 3][..])
    );
    assert_eq!(
        t.host_view::<f32>().unwrap().to_contiguous(),
        vec![0.0, 6.0, 2.0, 8.0, 4.0, 10.0]
    );
    assert_eq!(counter.drops(), 0);
    drop(t);
    assert_eq!(counter.drops(), 1);
}

#[test]
fn we_import_dlparks_legacy_export() {
    let counter = DropCounter::new();
    let mut values: Vec<i64> = (0..6).collect();
    let data = values.as_mut_ptr().cast();
    let mut init = Fixed::new([2i64, 3], [3i64, 1])
        .initialize_as::<DLManagedTensor>(Box::new((counter.owner(), values)))
        .unwrap();
    init.set_data(data)
        .set_dtype(DLDataType::I64)
        .set_device(DLDevice::CPU);
    // SAFETY: the descriptor covers the Vec that the context owns until the deleter runs.
    let managed: dlpark::legacy::Dlpack = unsafe { init.finish() };
    let raw = NonNull::new(managed.into_raw()).unwrap();
    // SAFETY: as in `we_import_dlparks_versioned_export`; writable, and nobody else uses it.
    let t = unsafe { import_legacy(raw, Access::ReadWrite) }
        .unwrap()
        .into_tensor();
    assert_eq!(t.dtype(), DType::INT64);
    // SAFETY: the only view of the tensor; the producer does not touch the memory.
    let mut view = unsafe { t.host_view_mut::<i64>() }.unwrap();
    view.set(&[1, 2], 50).unwrap();
    assert_eq!(view.to_contiguous(), vec![0, 1, 2, 3, 4, 50]);
    drop(t);
    assert_eq!(counter.drops(), 1);
}

#[test]
fn a_refused_dlpark_export_goes_back_to_dlpark() {
    let counter = DropCounter::new();
    let mut init = Dynamic::new(vec![2i64], vec![1i64])
        .initialize(Box::new(counter.owner()))
        .unwrap();
    // Unknown device type 6: dlpark builds it; the core refuses it.
    init.set_dtype(DLDataType::F32).set_device(DLDevice {
        device_type: dlpark::ffi::DLDeviceType(6),
        device_id: 0,
    });
    init.set_data(std::ptr::without_provenance_mut(64));
    // SAFETY: never dereferenced.
    let managed: dlpark::versioned::Dlpack = unsafe { init.finish() };
    let raw = NonNull::new(managed.into_raw()).unwrap();
    // SAFETY: a live managed tensor, ownership passed.
    let err = unsafe { import_versioned(raw) }.unwrap_err();
    let back = err.into_inner().unwrap();
    // SAFETY: given back to us; dlpark's handle takes it and releases it once.
    let managed = unsafe { Managed::from_raw(back.as_ptr()) }.unwrap();
    assert_eq!(counter.drops(), 0);
    drop(managed);
    assert_eq!(counter.drops(), 1);
}
