//! Read-only memory lent out and handed on without its flag: a consumer may drop DLPack's
//! `READ_ONLY` and give the memory back through a managed tensor of its own (tvm-ffi's
//! tensors keep no flags). While one of our read-only exports is alive, a foreign tensor
//! overlapping it imports read-only; nothing else is narrowed, and nothing is once the
//! export is gone.

use std::ptr::NonNull;

use tensorbridge_core::{DType, RawTensor, Tensor};
use tensorbridge_dlpack::{export_versioned, import_legacy, import_versioned, lent_readonly};
use tensorbridge_testkit::DropCounter;

use crate::producer::{self, Spec};

/// A foreign, flagless managed tensor over `t`'s memory (what a consumer that dropped the
/// flag hands back), imported.
fn foreign_import(t: &Tensor, counter: &DropCounter) -> Tensor {
    let mut spec = Spec::of(t);
    spec.flags = 0;
    let m = producer::versioned(&spec, (), counter);
    // SAFETY: a live test producer describing `t`'s memory, which the test keeps alive.
    unsafe { import_versioned(m) }.unwrap().into_tensor()
}

#[test]
fn a_flag_dropped_on_the_way_back_does_not_widen_access() {
    let buffer = Tensor::from_vec((0..8).map(|i| i as f32).collect(), &[8]).unwrap();
    let ro = buffer.clone().into_readonly();
    let counter = DropCounter::new();
    let export = export_versioned(&ro).unwrap();
    // The same bytes, and a part of them, come back read-only while the export lives.
    assert!(foreign_import(&buffer, &counter).is_readonly());
    let half = RawTensor::host(buffer.data_ptr() + 16, DType::FLOAT32, &[2])
        .validate()
        .unwrap();
    // SAFETY: bytes 16..24 of `buffer`, kept alive by its clone in the owner.
    let half = unsafe { Tensor::from_descriptor(half, buffer.owner().clone()) };
    assert!(foreign_import(&half, &counter).is_readonly());
    // Legacy structs too, whatever access the caller grants.
    let mut spec = Spec::of(&buffer);
    spec.flags = 0;
    let m = producer::legacy(&spec, (), &counter);
    // SAFETY: as in `foreign_import`.
    let legacy = unsafe { import_legacy(m, tensorbridge_core::Access::ReadWrite) }.unwrap();
    assert!(legacy.into_tensor().is_readonly());
    // Other memory is not narrowed.
    let other = Tensor::from_vec(vec![1.0f32; 4], &[4]).unwrap();
    assert!(!foreign_import(&other, &counter).is_readonly());
    // Callers that get flagless memory some other way ask the same question.
    assert!(lent_readonly(buffer.descriptor()) && lent_readonly(half.descriptor()));
    assert!(!lent_readonly(other.descriptor()));
    // Once the export is gone, nothing is lent: the memory's own access again.
    drop(export);
    assert!(!foreign_import(&buffer, &counter).is_readonly());
    assert!(!lent_readonly(buffer.descriptor()));
    assert_eq!(counter.drops(), 5, "every foreign tensor released once");
}

#[test]
fn writable_exports_lend_nothing() {
    let buffer = Tensor::from_vec(vec![0u8; 16], &[16]).unwrap();
    let counter = DropCounter::new();
    let export = export_versioned(&buffer).unwrap();
    assert!(!foreign_import(&buffer, &counter).is_readonly());
    drop(export);
    // An export handed straight back is the fast path's, unchanged.
    let raw = NonNull::new(
        export_versioned(&buffer.clone().into_readonly())
            .unwrap()
            .into_raw(),
    )
    .unwrap();
    // SAFETY: our own live export; ownership passes.
    let back = unsafe { import_versioned(raw) }.unwrap().into_tensor();
    assert!(back.is_readonly());
}
