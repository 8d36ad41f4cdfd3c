//! Drop counting on every path: each deleter runs exactly once, whatever happens.

use std::ptr::NonNull;
use std::thread;

use tensorbridge_core::Access;
use tensorbridge_dlpack::ffi::{DLDataType, DLDataTypeCode, DLDeviceType, DLPackVersion};
use tensorbridge_dlpack::{
    Error, ImportError, ReadOnlyPolicy, export_legacy, export_versioned, import_legacy,
    import_versioned,
};
use tensorbridge_testkit::DropCounter;

use crate::producer::{self, Spec};

#[test]
fn success_releases_once_after_the_last_clone() {
    let counter = DropCounter::new();
    let p = producer::versioned(&Spec::fake_f32(&[3]), (), &counter);
    // SAFETY: a live managed tensor, ownership passed; never dereferenced.
    let t = unsafe { import_versioned(p) }.unwrap().into_tensor();
    let clones = vec![t.clone(), t.clone()];
    drop(t);
    assert_eq!(counter.drops(), 0);
    drop(clones);
    assert_eq!(counter.drops(), 1);

    let p = producer::legacy(&Spec::fake_f32(&[3]), (), &counter);
    // SAFETY: as above.
    let t = unsafe { import_legacy(p, Access::ReadOnly) }
        .unwrap()
        .into_tensor();
    let c = t.clone();
    drop(t);
    assert_eq!(counter.drops(), 1);
    drop(c);
    assert_eq!(counter.drops(), 2);
}

#[test]
fn the_last_clone_may_be_dropped_on_another_thread() {
    let counter = DropCounter::new();
    let p = producer::versioned(&Spec::fake_f32(&[3]), (), &counter);
    // SAFETY: as in `success_releases_once_after_the_last_clone`.
    let t = unsafe { import_versioned(p) }.unwrap().into_tensor();
    let c = t.clone();
    thread::spawn(move || drop(c)).join().unwrap();
    assert_eq!(counter.drops(), 0);
    thread::spawn(move || drop(t)).join().unwrap();
    assert_eq!(counter.drops(), 1);
}

/// Every way an import can be refused, each with the error it gives.
fn refusals() -> Vec<(&'static str, Spec, Error)> {
    let ok = Spec::fake_f32(&[2, 3]);
    let mut v = Vec::new();
    let mut s = ok.clone();
    s.dtype = DLDataType {
        code: DLDataTypeCode(99),
        bits: 32,
        lanes: 1,
    };
    v.push((
        "unknown dtype",
        s,
        tensorbridge_core::Error::UnknownDTypeCode { code: 99 }.into(),
    ));
    let mut s = ok.clone();
    s.device.device_type = DLDeviceType(5);
    v.push((
        "bad device",
        s,
        tensorbridge_core::Error::UnknownDeviceType { code: 5 }.into(),
    ));
    let mut s = ok.clone();
    s.ndim = -1;
    v.push(("negative ndim", s, Error::NegativeRank { ndim: -1 }));
    let mut s = ok.clone();
    s.byte_offset = 1;
    v.push((
        "misaligned",
        s,
        tensorbridge_core::Error::Misaligned {
            addr: (1 << 20) + 1,
            align: 4,
        }
        .into(),
    ));
    let mut s = ok.clone();
    s.data = std::ptr::null_mut();
    v.push((
        "null data with elements",
        s,
        tensorbridge_core::Error::NullData { numel: 6 }.into(),
    ));
    let mut s = ok.clone();
    s.shape = None;
    v.push(("null shape", s, Error::NullShape { ndim: 2 }));
    let mut s = ok.clone();
    s.strides = None;
    v.push((
        "null strides from 1.3",
        s,
        Error::NullStrides {
            major: 1,
            minor: 3,
            ndim: 2,
        },
    ));
    let mut s = ok.clone();
    s.flags = 1 << 63;
    v.push(("unknown flags", s, Error::UnknownFlags { flags: 1 << 63 }));
    let mut s = ok;
    s.shape = Some(vec![2, -3]);
    v.push((
        "negative extent",
        s,
        tensorbridge_core::Error::NegativeSize { dim: 1, size: -3 }.into(),
    ));
    v
}

#[test]
fn a_dropped_import_error_releases_once() {
    for (what, spec, expected) in refusals() {
        let counter = DropCounter::new();
        let p = producer::versioned(&spec, (), &counter);
        // SAFETY: a live managed tensor, ownership passed; never dereferenced.
        let err = unsafe { import_versioned(p) }.unwrap_err();
        assert_eq!(err.error(), &expected, "{what}");
        assert!(err.holds_managed(), "{what}");
        assert_eq!(counter.drops(), 0, "{what}: held by the error");
        drop(err);
        assert_eq!(counter.drops(), 1, "{what}");
    }
}

#[test]
fn into_error_and_question_mark_release_once() {
    fn fails(p: NonNull<tensorbridge_dlpack::ffi::DLManagedTensorVersioned>) -> Result<(), Error> {
        // SAFETY: the caller passes a live managed tensor and ownership.
        unsafe { import_versioned(p) }?;
        Ok(())
    }
    for (what, spec, expected) in refusals() {
        let counter = DropCounter::new();
        let p = producer::versioned(&spec, (), &counter);
        assert_eq!(fails(p), Err(expected.clone()), "{what}");
        assert_eq!(counter.drops(), 1, "{what}");

        let p = producer::versioned(&spec, (), &counter);
        // SAFETY: as above.
        let e = unsafe { import_versioned(p) }.unwrap_err().into_error();
        assert_eq!(e, expected, "{what}");
        assert_eq!(counter.drops(), 2, "{what}");
    }
}

#[test]
fn a_given_back_tensor_is_untouched_and_the_callers_again() {
    for (what, spec, _) in refusals() {
        let counter = DropCounter::new();
        let p = producer::versioned(&spec, (), &counter);
        // SAFETY: a live managed tensor, ownership passed.
        let err = unsafe { import_versioned(p) }.unwrap_err();
        let back = err.into_inner().expect("given back");
        assert_eq!(back, p, "{what}: the same struct");
        assert_eq!(counter.drops(), 0, "{what}: not released");
        // SAFETY: `into_inner` returned ownership to us.
        unsafe { producer::release(back) };
        assert_eq!(counter.drops(), 1, "{what}");
    }
    // The legacy import has the same policy.
    let counter = DropCounter::new();
    let mut spec = Spec::fake_f32(&[2]);
    spec.ndim = -5;
    let p = producer::legacy(&spec, (), &counter);
    // SAFETY: as above.
    let err: ImportError<_> = unsafe { import_legacy(p, Access::ReadWrite) }.unwrap_err();
    let back = err.into_inner().expect("given back");
    assert_eq!(counter.drops(), 0);
    // SAFETY: ownership returned by `into_inner`.
    unsafe { producer::release(back) };
    assert_eq!(counter.drops(), 1);
}

#[test]
fn a_refused_import_can_be_retried_once_fixed() {
    // The producer's own struct (the test is the producer, so it may fix it): refused for
    // misalignment, given back, corrected, imported again, released once.
    let counter = DropCounter::new();
    let mut spec = Spec::fake_f32(&[4]);
    spec.byte_offset = 2;
    let p = producer::versioned(&spec, (), &counter);
    // SAFETY: a live managed tensor, ownership passed.
    let err = unsafe { import_versioned(p) }.unwrap_err();
    assert!(matches!(
        err.error(),
        Error::Core(tensorbridge_core::Error::Misaligned { .. })
    ));
    let back = err.into_inner().expect("given back");
    // SAFETY: ours again (given back), not shared with anyone.
    unsafe { (*back.as_ptr()).dl_tensor.byte_offset = 4 };
    // SAFETY: a live managed tensor, ownership passed again.
    let t = unsafe { import_versioned(back) }.unwrap().into_tensor();
    assert_eq!(t.data_ptr(), (1 << 20) + 4);
    assert_eq!(counter.drops(), 0);
    drop(t);
    assert_eq!(counter.drops(), 1);
}

#[test]
fn a_foreign_major_version_is_released_before_the_error_returns() {
    let counter = DropCounter::new();
    let p = producer::future_major(2, &counter);
    // SAFETY: the stable prefix of a managed tensor, ownership passed.
    let err = unsafe { import_versioned(p) }.unwrap_err();
    assert_eq!(counter.drops(), 1, "released during the import");
    assert_eq!(err.into_inner(), None);
    assert_eq!(counter.drops(), 1, "not twice");
}

#[test]
fn a_null_deleter_is_never_called() {
    let counter = DropCounter::new();
    let (p, reclaim) = producer::versioned_without_deleter(&Spec::fake_f32(&[2]), &counter);
    // SAFETY: a live managed tensor, ownership passed (there is nothing to release).
    let t = unsafe { import_versioned(p) }.unwrap().into_tensor();
    drop(t);
    assert_eq!(counter.drops(), 0);
    // The producer kept ownership; it frees its struct itself.
    // SAFETY: the tensor is gone; nobody uses the struct.
    unsafe { reclaim.free() };
    assert_eq!(counter.drops(), 1);

    let mut spec = Spec::fake_f32(&[2]);
    spec.ndim = -1;
    let (p, reclaim) = producer::versioned_without_deleter(&spec, &counter);
    // SAFETY: as above.
    drop(unsafe { import_versioned(p) }.unwrap_err());
    assert_eq!(counter.drops(), 1);
    // SAFETY: the error is gone.
    unsafe { reclaim.free() };
    assert_eq!(counter.drops(), 2);
}

#[test]
fn an_export_releases_its_clone_once() {
    let counter = DropCounter::new();
    let t = producer::host_f32(&[2]);
    let t = {
        // Count the owner of the data through a tensor that shares it.
        let owner = counter.owner_with(t.clone());
        // SAFETY: the same memory as `t`, kept alive by `owner` (which holds `t`).
        unsafe { tensorbridge_core::Tensor::from_descriptor(t.descriptor().clone(), owner) }
    };
    // Dropped without being handed on.
    drop(export_versioned(&t).unwrap());
    drop(export_legacy(&t, ReadOnlyPolicy::Refuse).unwrap());
    assert_eq!(counter.drops(), 0);
    // Handed on, outliving the tensor; the consumer's deleter call releases it.
    let v = export_versioned(&t).unwrap().into_raw();
    let l = export_legacy(&t, ReadOnlyPolicy::Refuse)
        .unwrap()
        .into_raw();
    drop(t);
    assert_eq!(counter.drops(), 0);
    // SAFETY: live exports; each deleter is called once, here, as a consumer would.
    unsafe { producer::release(NonNull::new(v).unwrap()) };
    assert_eq!(counter.drops(), 0);
    // SAFETY: as above.
    unsafe { producer::release(NonNull::new(l).unwrap()) };
    assert_eq!(counter.drops(), 1);
}

#[test]
fn a_consumer_may_call_our_deleter_from_another_thread() {
    struct SendPtr(*mut tensorbridge_dlpack::ffi::DLManagedTensorVersioned);
    // SAFETY: test only: the pointer is handed to one thread, which alone uses it.
    unsafe impl Send for SendPtr {}
    let counter = DropCounter::new();
    let t = producer::host_f32(&[2]);
    // SAFETY: `t`'s memory, kept alive by the counted owner, which holds a clone of `t`.
    let t = unsafe {
        tensorbridge_core::Tensor::from_descriptor(
            t.descriptor().clone(),
            counter.owner_with(t.clone()),
        )
    };
    let raw = SendPtr(export_versioned(&t).unwrap().into_raw());
    drop(t);
    thread::spawn(move || {
        let raw = raw;
        // SAFETY: a live export, its deleter called once.
        unsafe { producer::release(NonNull::new(raw.0).unwrap()) };
    })
    .join()
    .unwrap();
    assert_eq!(counter.drops(), 1);
}

#[test]
fn importing_our_own_export_chains_the_owners() {
    let counter = DropCounter::new();
    let p = producer::versioned(&Spec::fake_f32(&[2, 2]), (), &counter);
    // SAFETY: a live managed tensor, ownership passed; never dereferenced.
    let first = unsafe { import_versioned(p) }.unwrap().into_tensor();
    // Re-export the import (as a Python layer would), and import that.
    let raw = NonNull::new(export_versioned(&first).unwrap().into_raw()).unwrap();
    drop(first);
    // SAFETY: a live export, ownership passed.
    let second = unsafe { import_versioned(raw) }.unwrap();
    assert_eq!(second.version, Some(DLPackVersion::CURRENT));
    assert_eq!(counter.drops(), 0);
    drop(second);
    assert_eq!(counter.drops(), 1, "the original producer's deleter, once");
}
