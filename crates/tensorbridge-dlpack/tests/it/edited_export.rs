//! Our own export, edited by a consumer and handed back: the fast path that hands our own
//! exports back unvalidated must take only what it can prove unchanged. Every field a
//! consumer can write is edited, one at a time, on versioned and legacy exports (rank 2, and
//! rank 9 whose dimensions live in an allocation of their own); each edit must take the
//! general path (a new owner wrapping the struct, whose deleter runs once), and the tensor
//! must say what the edited struct says, its element count included, as long as it stays
//! inside the bytes the export lent, on its device; an edit that reaches past them (more
//! elements, another device, a moved pointer) is refused (`EditedExport`), the export
//! released once. Runs under Miri (no FFI): a write through the struct's `shape` into memory
//! the export only lent as read-only is reported there as undefined behaviour.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tensorbridge_core::{Access, DType, Tensor};
use tensorbridge_dlpack::ffi::{
    DLDeviceType, DLManagedTensorVersioned, DLPackVersion, DLTensor, DlpackFlags,
};
use tensorbridge_dlpack::{
    Error, ReadOnlyPolicy, export_legacy, export_versioned, import_legacy, import_versioned,
};
use tensorbridge_testkit::DropCounter;

/// A 2x3 float32 tensor over the first 6 of 12 floats (so edits that move or widen it stay
/// inside real memory), whose owner is counted.
fn counted_2x3(counter: &DropCounter) -> Tensor {
    let buffer = Tensor::from_vec((0..12).map(|i| i as f32).collect(), &[12]).unwrap();
    let raw = tensorbridge_core::RawTensor::host(buffer.data_ptr(), DType::FLOAT32, &[2, 3]);
    // SAFETY: the first 6 floats of `buffer`, which the counted owner keeps alive.
    unsafe { Tensor::from_descriptor(raw.validate().unwrap(), counter.owner_with(buffer)) }
}

/// One edit of the plain `DLTensor` fields (shared by both struct kinds), and what the
/// imported tensor must then show (`None`: the edit reaches outside what the export lent,
/// and the import is refused).
struct Edit {
    name: &'static str,
    /// Edits the struct's tensor; `scratch` outlives the import (for pointer edits).
    apply: fn(&mut DLTensor, &mut [i64; 2]),
    check: Option<fn(&Tensor)>,
}

/// Writes `value` at `index` of the array `p` points to.
///
/// # Safety
/// 1. `p` points to at least `index + 1` writable `i64`s.
unsafe fn poke(p: *mut i64, index: usize, value: i64) {
    // SAFETY: obligation 1.
    unsafe { p.wrapping_add(index).write(value) };
}

fn tensor_edits() -> Vec<Edit> {
    vec![
        Edit {
            name: "data",
            apply: |dl, _| dl.data = dl.data.cast::<f32>().wrapping_add(1).cast(),
            check: None,
        },
        Edit {
            name: "byte_offset",
            apply: |dl, _| dl.byte_offset = 4,
            check: None,
        },
        Edit {
            name: "device",
            apply: |dl, _| dl.device.device_type = DLDeviceType(3),
            check: None,
        },
        Edit {
            name: "ndim",
            apply: |dl, _| dl.ndim = 1,
            check: Some(|t| assert_eq!((t.shape(), t.strides_elems()), (&[2i64][..], &[3i64][..]))),
        },
        Edit {
            name: "dtype",
            apply: |dl, _| dl.dtype.code.0 = 0,
            check: Some(|t| assert_eq!(t.dtype(), DType::INT32)),
        },
        Edit {
            name: "shape value (smaller)",
            // SAFETY: the export's shape holds `ndim` (2) values.
            apply: |dl, _| unsafe { poke(dl.shape, 0, 1) },
            check: Some(|t| {
                assert_eq!(t.shape(), [1, 3]);
                assert_eq!(
                    t.host_view::<f32>().unwrap().to_contiguous(),
                    [0.0, 1.0, 2.0]
                );
            }),
        },
        Edit {
            name: "shape value (huge)",
            // SAFETY: as above.
            apply: |dl, _| unsafe { poke(dl.shape, 0, 1 << 40) },
            // Never read (the edit lies about the memory): only the bookkeeping must agree.
            check: None,
        },
        Edit {
            name: "strides value",
            // SAFETY: the export's strides hold `ndim` (2) values.
            apply: |dl, _| unsafe { poke(dl.strides, 0, 6) },
            check: None,
        },
        Edit {
            name: "shape pointer",
            apply: |dl, scratch| {
                *scratch = [3, 2];
                dl.shape = scratch.as_mut_ptr();
            },
            check: None,
        },
        Edit {
            name: "strides pointer",
            apply: |dl, scratch| {
                *scratch = [1, 2];
                dl.strides = scratch.as_mut_ptr();
            },
            check: Some(|t| assert_eq!(t.host_view::<f32>().unwrap().get(&[1, 2]).unwrap(), 5.0)),
        },
    ]
}

/// The checks every edited import passes: the general path (a new owner, not the export's
/// kept tensor), an element count that agrees with the shape, then the edit's own check.
fn check_general(back: &Tensor, original: &Tensor, edit: &str) {
    assert!(
        !Arc::ptr_eq(back.owner(), original.owner()),
        "{edit}: an edited export must be validated anew"
    );
    let product: i64 = back.shape().iter().product();
    assert_eq!(back.numel(), product as u64, "{edit}: element count");
}

#[test]
fn every_edited_field_of_a_versioned_export_takes_the_general_path() {
    for edit in tensor_edits() {
        let counter = DropCounter::new();
        let t = counted_2x3(&counter);
        let mut scratch = [0i64; 2];
        let raw = export_versioned(&t).unwrap().into_raw();
        // SAFETY: a live export that we own; nothing else references the struct.
        (edit.apply)(unsafe { &mut (*raw).dl_tensor }, &mut scratch);
        // SAFETY: a live managed tensor within `t`'s buffer (or never read); ownership passes.
        let result = unsafe { import_versioned(NonNull::new(raw).unwrap()) };
        let Some(check) = edit.check else {
            let err = result
                .err()
                .unwrap_or_else(|| panic!("{}: accepted", edit.name));
            assert!(
                matches!(err.error(), Error::EditedExport { .. }),
                "{}: {err}",
                edit.name
            );
            drop((err, t));
            assert_eq!(counter.drops(), 1, "{}: released once", edit.name);
            continue;
        };
        let back = result
            .unwrap_or_else(|e| panic!("{}: {e}", edit.name))
            .into_tensor();
        check_general(&back, &t, edit.name);
        check(&back);
        drop(t);
        assert_eq!(
            counter.drops(),
            0,
            "{}: kept alive by the import",
            edit.name
        );
        drop(back);
        assert_eq!(counter.drops(), 1, "{}: the deleter ran once", edit.name);
    }
}

#[test]
fn every_edited_field_of_a_legacy_export_takes_the_general_path() {
    for edit in tensor_edits() {
        let counter = DropCounter::new();
        let t = counted_2x3(&counter);
        let mut scratch = [0i64; 2];
        let raw = export_legacy(&t, ReadOnlyPolicy::Refuse)
            .unwrap()
            .into_raw();
        // SAFETY: a live export that we own; nothing else references the struct.
        (edit.apply)(unsafe { &mut (*raw).dl_tensor }, &mut scratch);
        // SAFETY: as for the versioned export; writable, as exported.
        let result = unsafe { import_legacy(NonNull::new(raw).unwrap(), Access::ReadWrite) };
        let Some(check) = edit.check else {
            let err = result
                .err()
                .unwrap_or_else(|| panic!("{}: accepted", edit.name));
            assert!(
                matches!(err.error(), Error::EditedExport { .. }),
                "{}: {err}",
                edit.name
            );
            drop((err, t));
            assert_eq!(counter.drops(), 1, "{}: released once", edit.name);
            continue;
        };
        let back = result
            .unwrap_or_else(|e| panic!("{}: {e}", edit.name))
            .into_tensor();
        check_general(&back, &t, edit.name);
        check(&back);
        drop((t, back));
        assert_eq!(counter.drops(), 1, "{}: the deleter ran once", edit.name);
    }
}

#[test]
fn edited_version_flags_and_manager_ctx_take_the_general_path() {
    type Head = fn(&mut DLManagedTensorVersioned);
    let edits: [(&str, Head); 3] = [
        ("version", |m| {
            m.version = DLPackVersion { major: 1, minor: 1 }
        }),
        ("flags", |m| m.flags = DlpackFlags::READ_ONLY),
        ("manager_ctx", |m| m.manager_ctx = std::ptr::null_mut()),
    ];
    for (name, apply) in edits {
        let counter = DropCounter::new();
        let t = counted_2x3(&counter);
        let raw = export_versioned(&t).unwrap().into_raw();
        // SAFETY: a live export that we own.
        apply(unsafe { &mut *raw });
        // SAFETY: a live managed tensor of `t`'s buffer; ownership passes.
        let back = unsafe { import_versioned(NonNull::new(raw).unwrap()) }.unwrap();
        check_general(&back.tensor, &t, name);
        match name {
            "version" => assert_eq!(back.version, Some(DLPackVersion { major: 1, minor: 1 })),
            "flags" => assert!(back.tensor.is_readonly()),
            _ => assert_eq!(back.tensor.descriptor(), t.descriptor()),
        }
        drop((t, back));
        assert_eq!(counter.drops(), 1, "{name}: the deleter ran once");
    }
}

/// The deleter a consumer installs in place of ours: counts, then calls ours.
type Deleter = unsafe extern "C" fn(*mut DLManagedTensorVersioned);
static WRAPPED: Mutex<Option<Deleter>> = Mutex::new(None);
static WRAPPER_CALLS: AtomicUsize = AtomicUsize::new(0);

unsafe extern "C" fn wrapper(m: *mut DLManagedTensorVersioned) {
    WRAPPER_CALLS.fetch_add(1, Ordering::SeqCst);
    let inner = WRAPPED.lock().map(|g| *g).unwrap_or(None);
    if let Some(inner) = inner {
        // SAFETY: the export's own deleter, for the export it came from, called once (by
        // this wrapper, which its owner calls once).
        unsafe { inner(m) };
    }
}

#[test]
fn an_edited_deleter_is_called_exactly_once() {
    let counter = DropCounter::new();
    let t = counted_2x3(&counter);
    let raw = export_versioned(&t).unwrap().into_raw();
    // SAFETY: a live export that we own: its deleter moves into the wrapper.
    *WRAPPED.lock().unwrap() = unsafe { (*raw).deleter.replace(wrapper as Deleter) };
    // SAFETY: a live managed tensor of `t`'s buffer; ownership passes.
    let back = unsafe { import_versioned(NonNull::new(raw).unwrap()) }
        .unwrap()
        .into_tensor();
    check_general(&back, &t, "deleter");
    drop((t, back));
    assert_eq!(
        WRAPPER_CALLS.load(Ordering::SeqCst),
        1,
        "the consumer's deleter ran once"
    );
    assert_eq!(counter.drops(), 1, "and it released the export once");
}

#[test]
fn rank_9_exports_come_back_and_their_edits_are_seen() {
    let counter = DropCounter::new();
    let shape = [1i64, 2, 1, 1, 3, 1, 1, 1, 1];
    let t = Tensor::from_vec((0..6).map(|i| i as f32).collect(), &shape).unwrap();
    // SAFETY: `t`'s buffer, kept alive by the counted owner, which holds `t` itself.
    let t = unsafe { Tensor::from_descriptor(t.descriptor().clone(), counter.owner_with(t)) };

    // Unchanged: the fast path, the export's own tensor.
    let raw = export_versioned(&t).unwrap().into_raw();
    // SAFETY: a live export; ownership passes.
    let back = unsafe { import_versioned(NonNull::new(raw).unwrap()) }.unwrap();
    assert!(Arc::ptr_eq(back.tensor.owner(), t.owner()));
    drop(back);

    // The last dimension's shape and stride edited (in the spilled arrays).
    let raw = export_versioned(&t).unwrap().into_raw();
    // SAFETY: a live export that we own.
    let dl = unsafe { &mut (*raw).dl_tensor };
    // SAFETY: the export's shape holds 9 values.
    unsafe { poke(dl.shape, 8, 0) };
    // SAFETY: the export's strides hold 9 values.
    unsafe { poke(dl.strides, 8, -5) };
    // SAFETY: as above; empty now, so nothing is read.
    let back = unsafe { import_versioned(NonNull::new(raw).unwrap()) }
        .unwrap()
        .into_tensor();
    check_general(&back, &t, "rank 9");
    assert_eq!(
        (back.shape()[8], back.strides_elems()[8], back.numel()),
        (0, -5, 0)
    );
    drop((t, back));
    assert_eq!(counter.drops(), 1);
}
