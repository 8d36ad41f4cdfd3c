//! Importing our own export: the tensor comes back as it left (owner, readiness), freed once;
//! a struct someone rewrote after the export is imported the general way.

use std::ptr::NonNull;
use std::sync::Arc;

use tensorbridge_core::{Access, DType, Device, DeviceType, RawTensor, Ready, Stream, Tensor};
use tensorbridge_dlpack::ffi::DLPackVersion;
use tensorbridge_dlpack::{
    ReadOnlyPolicy, export_legacy, export_versioned, import_legacy, import_versioned,
};
use tensorbridge_testkit::DropCounter;

/// A host tensor over a real buffer whose owner is counted.
fn counted_host(counter: &DropCounter) -> Tensor {
    let t = Tensor::from_vec((0..6).map(|i| i as f32).collect(), &[2, 3]).unwrap();
    // SAFETY: `t`'s buffer, kept alive by the counted owner, which holds `t` itself.
    unsafe { Tensor::from_descriptor(t.descriptor().clone(), counter.owner_with(t)) }
}

#[test]
fn own_versioned_export_comes_back_with_its_owner_and_readiness() {
    let counter = DropCounter::new();
    let shape = [4i64, 2];
    let raw = RawTensor {
        byte_offset: 64,
        ..RawTensor::new(
            0x7000_0000,
            Device::new(DeviceType::Cuda, 1),
            DType::FLOAT32,
            &shape,
        )
    };
    let desc = raw.validate().unwrap();
    // SAFETY: a fake address, never dereferenced; the stream is never enqueued on (no CUDA
    // code runs in this test), so the readiness is only carried.
    let t = unsafe { Tensor::from_descriptor(desc, counter.owner()) };
    // SAFETY: as above: carried, never acted on.
    let t = unsafe { t.with_ready(Ready::Stream(Stream::LegacyDefault)) };
    let exported = NonNull::new(export_versioned(&t).unwrap().into_raw()).unwrap();
    // SAFETY: a live export; ownership passes to the import.
    let back = unsafe { import_versioned(exported) }.unwrap();
    assert!(
        Arc::ptr_eq(back.tensor.owner(), t.owner()),
        "the same owner, not a wrapper"
    );
    assert!(matches!(
        back.tensor.ready(),
        Ready::Stream(Stream::LegacyDefault)
    ));
    assert_eq!(back.tensor.descriptor(), &t.with_offset_folded());
    assert_eq!(back.tensor.data_ptr(), 0x7000_0000 + 64);
    drop(t);
    assert_eq!(counter.drops(), 0, "the import keeps the owner");
    drop(back);
    assert_eq!(counter.drops(), 1);
}

#[test]
fn own_legacy_export_comes_back_with_the_access_it_was_exported_with() {
    let counter = DropCounter::new();
    let t = counted_host(&counter);

    // Writable export, imported by a caller that knows nothing of its producer (ReadOnly):
    // ours, so the fast path, the same owner, and the access it was lent with.
    let raw = NonNull::new(
        export_legacy(&t, ReadOnlyPolicy::Refuse)
            .unwrap()
            .into_raw(),
    )
    .unwrap();
    // SAFETY: a live export of `t`'s buffer; never written through.
    let back = unsafe { import_legacy(raw, Access::ReadOnly) }
        .unwrap()
        .into_tensor();
    assert!(Arc::ptr_eq(back.owner(), t.owner()));
    assert!(!back.is_readonly());
    drop(back);

    // Read-only export (flag discarded), imported writable on the caller's word: still
    // read-only, as it was lent: an export of ours never comes back wider.
    let ro = t.clone().into_readonly();
    let raw = NonNull::new(
        export_legacy(&ro, ReadOnlyPolicy::Discard)
            .unwrap()
            .into_raw(),
    )
    .unwrap();
    // SAFETY: a live export of `t`'s buffer; the caller (this test) vouches for writes, and
    // none happen.
    let back = unsafe { import_legacy(raw, Access::ReadWrite) }
        .unwrap()
        .into_tensor();
    assert!(Arc::ptr_eq(back.owner(), t.owner()));
    assert!(back.is_readonly());
    assert_eq!(back.data_ptr(), t.data_ptr());
    drop((ro, t));
    assert_eq!(counter.drops(), 0, "the import keeps the memory alive");
    drop(back);
    assert_eq!(counter.drops(), 1);
}

#[test]
fn a_rewritten_export_is_imported_the_general_way() {
    let counter = DropCounter::new();
    let t = counted_host(&counter);
    // A consumer that "reshapes" the struct it was given into 3x2 (points shape and strides
    // elsewhere) before handing it on.
    let mut shape = [3i64, 2];
    let mut strides = [2i64, 1];
    let raw = export_versioned(&t).unwrap().into_raw();
    // SAFETY: a live export that we own; the new arrays outlive the import's use of them
    // (the import copies them into the descriptor before returning).
    let dl = unsafe { &mut (*raw).dl_tensor };
    dl.shape = shape.as_mut_ptr();
    dl.strides = strides.as_mut_ptr();
    // SAFETY: a live managed tensor describing `t`'s buffer; ownership passes to the import.
    let back = unsafe { import_versioned(NonNull::new(raw).unwrap()) }
        .unwrap()
        .into_tensor();
    assert_eq!(back.shape(), [3, 2]);
    assert!(
        !Arc::ptr_eq(back.owner(), t.owner()),
        "validated anew, own owner"
    );
    assert_eq!(back.host_view::<f32>().unwrap().get(&[2, 1]).unwrap(), 5.0);
    drop(t);
    assert_eq!(counter.drops(), 0);
    drop(back);
    assert_eq!(counter.drops(), 1, "the export's deleter ran once");

    // Another data pointer (one element further, shape unchanged but one shorter).
    let counter = DropCounter::new();
    let t = counted_host(&counter);
    let raw = export_versioned(&t).unwrap().into_raw();
    let mut shape = [5i64];
    let mut strides = [1i64];
    // SAFETY: as above; the new data pointer stays inside `t`'s 6 floats.
    let dl = unsafe { &mut (*raw).dl_tensor };
    dl.data = dl.data.cast::<f32>().wrapping_add(1).cast();
    dl.ndim = 1;
    dl.shape = shape.as_mut_ptr();
    dl.strides = strides.as_mut_ptr();
    // SAFETY: as above.
    let back = unsafe { import_versioned(NonNull::new(raw).unwrap()) }
        .unwrap()
        .into_tensor();
    assert_eq!(
        back.host_view::<f32>().unwrap().to_contiguous(),
        [1.0, 2.0, 3.0, 4.0, 5.0]
    );
    drop((t, back));
    assert_eq!(counter.drops(), 1);

    // Another minor version: reported as the struct declares it, not as we exported it.
    let counter = DropCounter::new();
    let t = counted_host(&counter);
    let raw = export_versioned(&t).unwrap().into_raw();
    // SAFETY: a live export that we own.
    unsafe { (*raw).version.minor = 1 };
    // SAFETY: as above.
    let back = unsafe { import_versioned(NonNull::new(raw).unwrap()) }.unwrap();
    assert_eq!(back.version, Some(DLPackVersion { major: 1, minor: 1 }));
    assert!(
        !Arc::ptr_eq(back.tensor.owner(), t.owner()),
        "validated anew, own owner"
    );
    assert_eq!(back.tensor.descriptor(), t.descriptor());
    drop((t, back));
    assert_eq!(counter.drops(), 1);
}
