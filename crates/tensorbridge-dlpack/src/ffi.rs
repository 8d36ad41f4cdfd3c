//! The DLPack ABI, as dlpark 0.10 defines it (the DLPack 1.3 header), and the little FFI glue
//! of our own: the context behind every exported managed tensor and its `extern "C"` deleter.
//!
//! The `#[repr(C)]` structs are dlpark's, re-exported, never redefined; dlpark's generated
//! bindings assert their full layout on 64-bit targets. The assertions here restate, on every
//! target, the parts of that layout this crate's code relies on.

use std::mem::{offset_of, size_of};
use std::panic::{AssertUnwindSafe, catch_unwind};

use std::ffi::c_void;
use std::ptr::NonNull;

use dlpark::ManagedTensorBase;
use tensorbridge::{Packing, Tensor};

use crate::Imported;

pub use dlpark::DlpackFlags;
pub use dlpark::ffi::{
    DLDataType, DLDataTypeCode, DLDevice, DLDeviceType, DLManagedTensor, DLManagedTensorVersioned,
    DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION, DLPackVersion, DLTensor,
};

/// What an exported managed tensor points into: the managed struct itself, first, then a
/// clone of the exported tensor (byte offset folded where the device has addresses), whose
/// owner keeps the data alive and whose layout stores the struct's `shape` and `strides`,
/// inside the [`Imported`] that importing the export gives back. One allocation per
/// export, freed by [`delete_export`].
///
/// Keeping the whole validated tensor (rather than only its owner) costs a copy of its
/// descriptor per export, and buys two things: the dimensions need no storage of their own
/// (up to 8 live inline in the tensor's layout, inside the box), and importing our own export
/// hands the tensor back without validating it again ([`take_own_export`]), with the
/// readiness it left with. Keeping it as the finished [`Imported`] makes that hand-back
/// one block copy, which the caller's next move of the result reads back through store
/// forwarding (a result assembled from a tensor copy and separate field stores stalled it).
#[repr(C)]
pub(crate) struct ExportCtx<M> {
    /// First, so that the pointer handed to consumers is also the pointer to the context
    /// (asserted below; [`delete_export`] relies on it).
    pub(crate) managed: M,
    /// The exported tensor, with what its import reports: never copied, and the version
    /// this crate exports ([`Exportable::VERSION`]). Never mutated or moved (the box does
    /// not move) while the context lives, so the struct's pointers into its shape and
    /// strides stay valid until the deleter runs.
    pub(crate) imported: Imported,
}

/// The deleter of every managed tensor we export: frees the context, which drops the owner
/// clone (and with it the exported memory, if that was the last user).
///
/// Never unwinds into the consumer: if dropping the owner panics (owners must not: a
/// panicking drop is a bug) the process aborts here, which is also what Rust does for any panic that
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

/// The two managed structs we export, each with the mark its exports carry.
///
/// An export is recognised by its `manager_ctx` (the producer's own field, which consumers
/// leave alone): it holds the address of a private static of this crate, one per struct
/// kind. Statics have one address each; functions do not (a generic or inlinable function
/// can be copied per codegen unit, so comparing with the deleter's address could miss, and
/// under Miri it always did).
pub(crate) trait Exportable: ManagedTensorBase + Sized {
    /// The version exports of this struct kind declare (`None`: legacy, unversioned).
    const VERSION: Option<DLPackVersion>;

    /// The `manager_ctx` of every export of this struct kind.
    fn mark() -> *mut c_void;
}

/// [`Exportable::mark`] of versioned exports. Never read or written: only its address
/// counts (a `u8`, since zero-sized statics need not have their own address).
static VERSIONED_MARK: u8 = 1;
/// [`Exportable::mark`] of legacy exports.
static LEGACY_MARK: u8 = 0;

impl Exportable for DLManagedTensorVersioned {
    const VERSION: Option<DLPackVersion> = Some(DLPackVersion::CURRENT);

    fn mark() -> *mut c_void {
        (&raw const VERSIONED_MARK).cast_mut().cast()
    }
}

impl Exportable for DLManagedTensor {
    const VERSION: Option<DLPackVersion> = None;

    fn mark() -> *mut c_void {
        (&raw const LEGACY_MARK).cast_mut().cast()
    }
}

/// The flags an export of `tensor` carries (the versioned struct only; the legacy struct
/// has none): read-only and padding as its descriptor says, never `IS_COPIED`.
pub(crate) fn export_flags(tensor: &Tensor) -> DlpackFlags {
    let mut flags = DlpackFlags::empty();
    if tensor.is_readonly() {
        flags |= DlpackFlags::READ_ONLY;
    }
    if tensor.packing() == Packing::Padded {
        // `Descriptor` keeps `Padded` only for sub-byte dtypes.
        flags |= DlpackFlags::IS_SUBBYTE_TYPE_PADDED;
    }
    flags
}

/// Takes back one of our own exports, when `managed` is one and still says what the export
/// wrote: returns it as an [`OwnExport`], whose `into_imported` frees its context (instead
/// of the deleter: the one release) and gives the exported tensor back, owner and readiness
/// included, with no second validation. Returns `None`, having changed nothing, for any
/// other managed tensor (the caller then imports it the general way). `wanted` may refuse
/// the kept tensor too (the legacy import cannot hand out a read-only tensor as writable
/// without a new validation).
///
/// The mark in `manager_ctx` identifies the producer ([`Exportable`]): `manager_ctx` is the
/// producer's private field, and only `export` stores this crate's private address there,
/// together with [`delete_export`] as the deleter, on an [`ExportCtx`] at the struct's own
/// address. A consumer that copied the struct elsewhere and passed the copy on would break
/// DLPack (the deleter must be called with the producer's own pointer) as surely as it
/// would break this check. Every field is then compared with the kept tensor, so a struct
/// that someone rewrote (another version, data pointer, shape pointer, offset or flags) is
/// imported the general way.
///
/// # Safety
/// 1. `managed` points to a live `M` whose major version is this crate's (or which is
///    legacy), readable as a whole, that the caller owns; obligation 1 of
///    [`crate::import_versioned`] / [`crate::import_legacy`] holds for it.
/// 2. On `Some`, ownership is consumed: the caller neither uses `managed` nor calls its
///    deleter afterwards. On `None`, the caller still owns it.
#[inline]
pub(crate) unsafe fn take_own_export<M: Exportable>(
    managed: NonNull<M>,
    wanted: impl FnOnce(&Tensor) -> bool,
) -> Option<OwnExport<M>> {
    let ptr = managed.as_ptr();
    // SAFETY: live and readable (obligation 1); the reference ends before the box is freed.
    let m = unsafe { managed.as_ref() };
    if m.manager_ctx() != M::mark() || m.deleter().is_none() {
        return None;
    }
    let ctx = ptr.cast::<ExportCtx<M>>();
    // SAFETY: `manager_ctx` holds our mark, which only `export` stores, on the managed
    // struct of an `ExportCtx<M>` (its first field, so at this address), live until its
    // deleter runs, which has not happened (obligation 2; see above for copies). The
    // reference ends before the box is freed.
    let kept: &Imported = unsafe { &(*ctx).imported };
    let version = kept.version;
    let kept: &Tensor = &kept.tensor;
    let dl = m.tensor();
    let flags = if version.is_some() {
        export_flags(kept)
    } else {
        DlpackFlags::empty()
    };
    let unchanged = m.version() == version
        && dl.data.addr() == kept.data()
        && dl.byte_offset == kept.byte_offset()
        && kept.device().to_dlpack().ok()
            == Some((dl.device.device_type.0 as i32, dl.device.device_id))
        && usize::try_from(dl.ndim).ok() == Some(kept.ndim())
        && (dl.dtype.code.0, dl.dtype.bits, dl.dtype.lanes)
            == (
                kept.dtype().code().code(),
                kept.dtype().bits(),
                kept.dtype().lanes(),
            )
        && std::ptr::eq(dl.shape.cast_const(), kept.shape().as_ptr())
        && std::ptr::eq(dl.strides.cast_const(), kept.strides_elems().as_ptr())
        && m.flags() == flags
        && wanted(kept);
    if !unchanged {
        return None;
    }
    // `ctx` is non-null: it is `managed`'s address.
    NonNull::new(ctx).map(OwnExport)
}

/// One of our own exports, recognised by [`take_own_export`] and owned: it holds the
/// context that the export's deleter would free.
pub(crate) struct OwnExport<M>(NonNull<ExportCtx<M>>);

impl<M> OwnExport<M> {
    /// The export's [`Imported`] (the exported tensor, not copied, the version exported),
    /// moved out of the context, which is freed (the one release of the managed tensor; its
    /// deleter is not called).
    #[inline(always)]
    pub(crate) fn into_imported(self) -> Imported {
        let ctx = self.0.as_ptr();
        // SAFETY: `ctx` is a live, fully initialised `ExportCtx<M>` that `export` boxed and
        // that this value owns (`take_own_export`'s obligation 2 passed ownership here); the
        // projection stays in bounds.
        let slot = unsafe { &raw const (*ctx).imported };
        // SAFETY: initialised and owned (above); moved out once, straight into the caller's
        // place, and never dropped in the box (below).
        let imported = unsafe { slot.read() };
        // SAFETY: the box's own pointer with its provenance (`managed` is the first field,
        // at offset 0); freed once, as `MaybeUninit` so that nothing is dropped: the tensor
        // was moved out above, and the managed struct is plain data.
        drop(unsafe { Box::from_raw(ctx.cast::<std::mem::MaybeUninit<ExportCtx<M>>>()) });
        imported
    }
}

// The layout this crate relies on, on every target.
const _: () = {
    // The import path reads `version` first, and for a foreign major version nothing but
    // `version` and `deleter` (DLPack 1.x keeps every field up to `flags` where it is across
    // majors, as the DLPack 1.x header promises).
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

// The offsets of the DLPack 1.3 header's structs on 64-bit targets (measured with gcc
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
