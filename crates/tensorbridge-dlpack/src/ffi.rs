//! The DLPack ABI, as dlpark 0.10 defines it (the DLPack 1.3 header), and the little FFI glue
//! of our own: the context behind every exported managed tensor and its `extern "C"` deleter.
//!
//! The `#[repr(C)]` structs are dlpark's, re-exported, never redefined; dlpark's generated
//! bindings assert their full layout on 64-bit targets. The assertions here restate, on every
//! target, the parts of that layout this crate's code relies on.

use std::mem::{offset_of, size_of};
use std::panic::{AssertUnwindSafe, catch_unwind};

use tensorbridge::Owner;

pub use dlpark::DlpackFlags;
pub use dlpark::ffi::{
    DLDataType, DLDataTypeCode, DLDevice, DLDeviceType, DLManagedTensor, DLManagedTensorVersioned,
    DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION, DLPackVersion, DLTensor,
};

/// Storage for an export's `shape` then `strides`: inline up to 8 dimensions (no second
/// allocation), on the heap beyond.
pub(crate) enum ExportDims {
    /// `ndim <= 8`: the first `2 * ndim` values are used.
    Inline([i64; 16]),
    /// `ndim > 8`: exactly `2 * ndim` values.
    Heap(Box<[i64]>),
}

impl ExportDims {
    pub(crate) fn new(shape: &[i64], strides: &[i64]) -> ExportDims {
        let n = shape.len();
        if n <= 8 {
            let mut a = [0i64; 16];
            a[..n].copy_from_slice(shape);
            a[n..2 * n].copy_from_slice(strides);
            ExportDims::Inline(a)
        } else {
            ExportDims::Heap(shape.iter().chain(strides).copied().collect())
        }
    }

    /// The first value; `ndim` values of shape, then `ndim` of strides, follow.
    pub(crate) fn as_ptr(&self) -> *const i64 {
        match self {
            ExportDims::Inline(a) => a.as_ptr(),
            ExportDims::Heap(b) => b.as_ptr(),
        }
    }
}

/// What an exported managed tensor points into: the managed struct itself, first, then a
/// clone of the exported tensor's owner, which keeps the data alive, and the storage of the
/// struct's `shape` and `strides`. One allocation per export (two above 8 dimensions), freed
/// by [`delete_export`].
///
/// The owner and the dimensions are all an export needs of the tensor; cloning the whole
/// `Tensor` (its validated descriptor and readiness) would copy three times as many bytes.
#[repr(C)]
pub(crate) struct ExportCtx<M> {
    /// First, so that the pointer handed to consumers is also the pointer to the context
    /// (asserted below; [`delete_export`] relies on it).
    pub(crate) managed: M,
    /// Keeps the exported tensor's memory alive until the deleter runs.
    pub(crate) owner: Owner,
    /// `ndim` extents, then `ndim` strides in elements. Never mutated or moved (the box does
    /// not move) while the context lives, so the struct's pointers into it stay valid until
    /// the deleter runs.
    pub(crate) dims: ExportDims,
}

/// The deleter of every managed tensor we export: frees the context, which drops the owner
/// clone (and with it the exported memory, if that was the last user).
///
/// Never unwinds into the consumer: if dropping the owner panics (owners must not, see
/// STYLE.md) the process aborts here, which is also what Rust does for any panic that
/// reaches an `extern "C"` boundary.
///
/// # Safety
/// 1. `managed` is null, or a pointer that [`crate::export_versioned`] or
///    [`crate::export_legacy`] produced for this `M` and whose deleter has not run yet.
pub(crate) unsafe extern "C" fn delete_export<M>(managed: *mut M) {
    if managed.is_null() {
        return;
    }
    let ctx = managed.cast::<ExportCtx<M>>();
    // SAFETY: by obligation 1 `managed` came from `Box::into_raw` of an `ExportCtx<M>`
    // (`managed` is its first field, at offset 0: asserted below, so the cast gives back the
    // box's own pointer, with the box's provenance), and this is the one call that turns
    // it back into a box: DLPack deleters run exactly once.
    let boxed = unsafe { Box::from_raw(ctx) };
    if catch_unwind(AssertUnwindSafe(move || drop(boxed))).is_err() {
        std::process::abort();
    }
}

// The layout this crate relies on, on every target.
const _: () = {
    // The import path reads `version` first, and for a foreign major version nothing but
    // `version` and `deleter` (DLPack 1.x keeps every field up to `flags` where it is across
    // majors, PROTOCOLS.md section 1.2).
    assert!(offset_of!(DLManagedTensorVersioned, version) == 0);
    assert!(size_of::<DLPackVersion>() == 8);
    assert!(
        offset_of!(DLManagedTensorVersioned, manager_ctx)
            < offset_of!(DLManagedTensorVersioned, deleter)
    );
    assert!(
        offset_of!(DLManagedTensorVersioned, deleter) < offset_of!(DLManagedTensorVersioned, flags)
    );
    assert!(
        offset_of!(DLManagedTensorVersioned, flags)
            < offset_of!(DLManagedTensorVersioned, dl_tensor)
    );
    // `flags` is a plain `uint64_t` (dlpark's `DlpackFlags` is a transparent `u64`, and every
    // bit pattern is a valid value of it, unknown bits included).
    assert!(size_of::<DlpackFlags>() == 8);
    // The legacy struct starts with its tensor.
    assert!(offset_of!(DLManagedTensor, dl_tensor) == 0);
    // A NULL deleter is `None`: the function pointer option has the size of a pointer.
    assert!(size_of::<Option<unsafe extern "C" fn(*mut DLManagedTensor)>>() == size_of::<usize>());
    // `delete_export` casts the managed pointer back to the context.
    assert!(offset_of!(ExportCtx<DLManagedTensorVersioned>, managed) == 0);
    assert!(offset_of!(ExportCtx<DLManagedTensor>, managed) == 0);
};

// The offsets PROTOCOLS.md sections 1.6 to 1.8 give for 64-bit targets (measured with gcc
// against the C header), restated so a dlpark upgrade that moved a field fails to compile.
#[cfg(target_pointer_width = "64")]
const _: () = {
    assert!(size_of::<DLTensor>() == 48);
    assert!(offset_of!(DLTensor, shape) == 24);
    assert!(offset_of!(DLTensor, strides) == 32);
    assert!(offset_of!(DLTensor, byte_offset) == 40);
    assert!(size_of::<DLManagedTensor>() == 64);
    assert!(offset_of!(DLManagedTensor, manager_ctx) == 48);
    assert!(offset_of!(DLManagedTensor, deleter) == 56);
    assert!(size_of::<DLManagedTensorVersioned>() == 80);
    assert!(offset_of!(DLManagedTensorVersioned, manager_ctx) == 8);
    assert!(offset_of!(DLManagedTensorVersioned, deleter) == 16);
    assert!(offset_of!(DLManagedTensorVersioned, flags) == 24);
    assert!(offset_of!(DLManagedTensorVersioned, dl_tensor) == 32);
};

#[cfg(test)]
mod tests {
    use super::*;
    use tensorbridge::Tensor;

    #[test]
    fn delete_export_frees_the_context_once_and_ignores_null() {
        let counter = tensorbridge_testkit::DropCounter::new();
        let t = Tensor::from_vec(vec![1u8, 2], &[2]).unwrap();
        // SAFETY: `t`'s memory, kept alive by the counted owner, which holds a clone of `t`.
        let t = unsafe { Tensor::from_descriptor(t.descriptor().clone(), counter.owner_with(t)) };
        let raw = crate::export_versioned(&t).unwrap().into_raw();
        drop(t);
        assert_eq!(counter.drops(), 0, "the export keeps the owner");
        // SAFETY: an export whose deleter has not run, released once (obligation 1).
        unsafe { delete_export(raw) };
        assert_eq!(counter.drops(), 1);
        // SAFETY: null is allowed by obligation 1.
        unsafe { delete_export::<DLManagedTensorVersioned>(std::ptr::null_mut()) };
        assert_eq!(counter.drops(), 1);
    }

    fn stored(dims: &ExportDims, ndim: usize) -> Vec<i64> {
        // SAFETY: `ExportDims::new` stores `2 * ndim` values from `as_ptr`.
        unsafe { std::slice::from_raw_parts(dims.as_ptr(), 2 * ndim) }.to_vec()
    }

    #[test]
    fn export_dims_store_shape_then_strides() {
        let inline = ExportDims::new(&[2, 3], &[3, 1]);
        assert!(matches!(inline, ExportDims::Inline(_)));
        assert_eq!(stored(&inline, 2), [2, 3, 3, 1]);
        let shape: Vec<i64> = (1..=9).collect();
        let strides: Vec<i64> = (-9..0).collect();
        let heap = ExportDims::new(&shape, &strides);
        assert!(matches!(heap, ExportDims::Heap(_)));
        assert_eq!(stored(&heap, 9), [shape, strides].concat());
        assert!(!ExportDims::new(&[], &[]).as_ptr().is_null());
    }

    #[test]
    fn header_version_is_1_3() {
        assert_eq!((DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION), (1, 3));
        assert_eq!(DLPackVersion::CURRENT, DLPackVersion { major: 1, minor: 3 });
    }

    #[test]
    fn flag_bits_match_the_header() {
        assert_eq!(DlpackFlags::READ_ONLY.bits(), 1);
        assert_eq!(DlpackFlags::IS_COPIED.bits(), 2);
        assert_eq!(DlpackFlags::IS_SUBBYTE_TYPE_PADDED.bits(), 4);
        assert_eq!(DlpackFlags::all().bits(), 7);
    }
}
