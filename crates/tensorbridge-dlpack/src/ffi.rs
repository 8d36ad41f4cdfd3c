//! The DLPack ABI, as dlpark 0.10 defines it (the DLPack 1.3 header), and the little FFI glue
//! of our own: the context behind every exported managed tensor and its `extern "C"` deleter.
//!
//! The `#[repr(C)]` structs are dlpark's, re-exported, never redefined; dlpark's generated
//! bindings assert their full layout on 64-bit targets. The assertions here restate, on every
//! target, the parts of that layout this crate's code relies on.

use std::mem::{MaybeUninit, offset_of, size_of};

use std::ffi::c_void;
use std::ptr::{self, NonNull};

use dlpark::ManagedTensorBase;
use tensorbridge_core::{Packing, Tensor};

use crate::Imported;

pub use dlpark::DlpackFlags;
pub use dlpark::ffi::{
    DLDataType, DLDataTypeCode, DLDevice, DLDeviceType, DLManagedTensor, DLManagedTensorVersioned,
    DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION, DLPackVersion, DLTensor,
};

/// What an exported managed tensor points into: the managed struct itself, first; a private
/// copy of that struct as the export wrote it; the shape and strides the struct points at;
/// then a clone of the exported tensor (byte offset folded where the device has addresses),
/// whose owner keeps the data alive, inside the [`Imported`] that importing the export gives
/// back. One allocation per export (two above [`SHOWN_INLINE`] dimensions), freed by
/// [`delete_export`].
///
/// Keeping the whole validated tensor (rather than only its owner) costs a copy of its
/// descriptor per export, and buys importing our own export back without validating it
/// again ([`take_own_export`]), with the readiness it left with. Keeping it as the finished
/// [`Imported`] makes that hand-back one block copy, which the caller's next move of the
/// result reads back through store forwarding (a result assembled from a tensor copy and
/// separate field stores stalled it).
///
/// Everything a consumer can reach (`managed` and `shown`) is kept apart from what the fast
/// path trusts (`sent` and `imported`): a consumer that writes `shape[0]` through the struct
/// it was given writes `shown`, never the kept tensor's own layout, and the edit shows up as
/// a difference between the two.
#[repr(C)]
pub(crate) struct ExportCtx<M> {
    /// First, so that the pointer handed to consumers is also the pointer to the context
    /// (asserted below; [`delete_export`] relies on it).
    pub(crate) managed: M,
    /// `managed` as the export wrote it, never handed out: what [`take_own_export`] compares
    /// every field with (the deleter included, whose address is only stable as a copy).
    pub(crate) sent: M,
    /// The struct's `shape` and `strides` arrays (consumer-visible).
    pub(crate) shown: ShownDims,
    /// The exported tensor, with what its import reports: never copied, and the version
    /// this crate exports ([`Exportable::VERSION`]). Never mutated, moved (the box does not
    /// move) or handed out while the context lives.
    pub(crate) imported: Imported,
    /// The token of the span this export lends read-only ([`crate::lent`]), if it does:
    /// unregistered when the export is deleted or taken back.
    pub(crate) lent: Option<u64>,
}

/// Ranks up to this keep the shown shape and strides inside the export's box; larger ranks
/// get an allocation of their own.
pub(crate) const SHOWN_INLINE: usize = 8;

/// The shape and strides an export's struct points at: memory the consumer may reach, and
/// so, unlike the kept tensor's layout, memory the consumer may (against DLPack's word)
/// write. Shape first, then strides, `ndim` values each: inline, or in `spilled` above
/// [`SHOWN_INLINE`] dimensions.
pub(crate) struct ShownDims {
    /// Only the first `2 * ndim` values are written (and ever read).
    inline: [MaybeUninit<i64>; 2 * SHOWN_INLINE],
    /// A `Box<[i64]>` turned raw (so that nothing retags it while consumers hold pointers
    /// into it), freed by `Drop`; `None` when the dimensions are inline.
    spilled: Option<NonNull<[i64]>>,
}

impl ShownDims {
    /// Writes `shape` and then `strides` (of equal length) into `place` and returns where
    /// each starts. The pointers carry `place`'s provenance (or the spilled allocation's),
    /// so consumers may read them (and writes through them are no undefined behaviour).
    ///
    /// # Safety
    /// 1. `place` is valid for writes of a `ShownDims`, uninitialised (nothing is dropped),
    ///    and does not move until the written value is dropped in place.
    unsafe fn write(place: *mut ShownDims, shape: &[i64], strides: &[i64]) -> (*mut i64, *mut i64) {
        let n = shape.len();
        debug_assert_eq!(n, strides.len());
        let spilled = if n > SHOWN_INLINE {
            let heap: Box<[i64]> = shape.iter().chain(strides).copied().collect();
            // Never `None`: a box is never null.
            NonNull::new(Box::into_raw(heap))
        } else {
            None
        };
        // SAFETY: `place` is valid (obligation 1), so the projection stays in bounds; the raw
        // place keeps `place`'s provenance, with no reference in between.
        let spilled_field = unsafe { &raw mut (*place).spilled };
        // SAFETY: aligned, uninitialised (obligation 1): written once. The inline values need
        // no initialisation (`MaybeUninit`): only the ones written below are read.
        unsafe { spilled_field.write(spilled) };
        let base: *mut i64 = match spilled {
            Some(heap) => heap.as_ptr().cast(),
            None => {
                // SAFETY: as for `spilled` above.
                let inline: *mut i64 = unsafe { &raw mut (*place).inline }.cast();
                // SAFETY: `n <= SHOWN_INLINE`: `2 * n` values fit the inline array; `shape`
                // and `strides` are the caller's, not in the uninitialised place.
                unsafe { ptr::copy_nonoverlapping(shape.as_ptr(), inline, n) };
                // SAFETY: as above, the second `n` values.
                unsafe { ptr::copy_nonoverlapping(strides.as_ptr(), inline.wrapping_add(n), n) };
                inline
            }
        };
        // `n <= 2 * SHOWN_INLINE` or the spilled allocation holds `2 * n`: in bounds.
        (base, base.wrapping_add(n))
    }
}

impl Drop for ShownDims {
    fn drop(&mut self) {
        if let Some(heap) = self.spilled.take() {
            // SAFETY: `Box::into_raw` of a `Box<[i64]>` in `ShownDims::write`, freed once,
            // here (`take` leaves `None`).
            drop(unsafe { Box::from_raw(heap.as_ptr()) });
        }
    }
}

impl<M: Exportable> ExportCtx<M> {
    /// Boxes the context of an export of `tensor` and returns its managed struct, fully
    /// initialised in place (a `Tensor` is a few hundred bytes; building the context on the
    /// stack and moving it into a box copied it twice more, a third of the round trip's
    /// instructions were `memcpy`, measured with callgrind). The only owner of the box is
    /// the returned struct's deleter, [`delete_export`].
    ///
    /// `describe` fills the struct's tensor from the kept tensor (offset folded where the
    /// device has addresses) and the shown `shape` and `strides` pointers; `flags` are
    /// ignored by the legacy struct, which has none.
    pub(crate) fn boxed(
        tensor: &Tensor,
        flags: DlpackFlags,
        describe: impl FnOnce(&Tensor, *mut i64, *mut i64) -> DLTensor,
    ) -> NonNull<M> {
        let ctx: *mut ExportCtx<M> = Box::into_raw(Box::<ExportCtx<M>>::new_uninit()).cast();
        // SAFETY: `ctx` is the live, uninitialised allocation just made, owned here alone;
        // the projection stays in bounds. Each field below is written once, through raw
        // places that keep the box's provenance.
        let imported = unsafe { &raw mut (*ctx).imported };
        // SAFETY: in bounds, aligned, uninitialised and ours alone.
        unsafe { write_kept(imported, tensor, M::VERSION) };
        // SAFETY: initialised just above; this shared reference to the kept tensor is the
        // only reference into it, and nothing writes it until `delete_export`.
        let kept: &Tensor = unsafe { &(*imported).tensor };
        // SAFETY: `ctx` is live: the projection stays in bounds.
        let lent = unsafe { &raw mut (*ctx).lent };
        // SAFETY: aligned, uninitialised and ours alone: written once.
        unsafe { lent.write(crate::lent::register(kept.descriptor())) };
        // SAFETY: `ctx` is live: the projection stays in bounds.
        let shown = unsafe { &raw mut (*ctx).shown };
        // SAFETY: valid for writes, uninitialised, and never moved (the box does not move)
        // until `delete_export` or `OwnExport::into_imported` drops it in place.
        let (shape, strides) =
            unsafe { ShownDims::write(shown, kept.shape(), kept.strides_elems()) };
        // `manager_ctx` marks the struct as ours (`take_own_export` checks it);
        // `delete_export` does not read it: the context is at the struct's own address.
        let mut managed = M::from_parts(
            describe(kept, shape, strides),
            M::mark(),
            Some(delete_export::<M>),
        );
        // SAFETY: `flags` describe the tensor (the caller's `export_flags`): read-only and
        // padding as its descriptor says, never `IS_COPIED` (exports are zero-copy).
        unsafe { managed.set_flags_unchecked(flags) };
        // SAFETY: `ctx` is live, so the projection stays in bounds.
        let sent = unsafe { &raw mut (*ctx).sent };
        // SAFETY: as above.
        let shared = unsafe { &raw mut (*ctx).managed };
        // SAFETY: aligned, uninitialised and ours alone: written once.
        unsafe { sent.write(managed) };
        // SAFETY: as above. The context is now fully initialised.
        unsafe { shared.write(managed) };
        // SAFETY: `ctx` came from `Box::into_raw`, never null. The cast keeps the box's
        // provenance, which `delete_export` needs to free the whole box (`managed` is at
        // offset 0).
        unsafe { NonNull::new_unchecked(ctx.cast::<M>()) }
    }
}

/// Writes, into `place`, what importing an export of `tensor` reports: a clone of the tensor
/// with its offset folded into the pointer where the device has addresses (`data` is then the
/// address of element 0 and `byte_offset` 0, which consumers that ignore `byte_offset`
/// need; handle devices keep their offset), never copied, and `version`.
///
/// # Safety
/// 1. `place` is valid for writes of an `Imported`, aligned and uninitialised (nothing is
///    dropped), and no reference into it lives during the call.
unsafe fn write_kept(place: *mut Imported, tensor: &Tensor, version: Option<DLPackVersion>) {
    // SAFETY: valid (obligation 1): the projection stays in bounds.
    let slot = unsafe { &raw mut (*place).tensor };
    // SAFETY: as above.
    let is_copied = unsafe { &raw mut (*place).is_copied };
    // SAFETY: as above.
    let kept_version = unsafe { &raw mut (*place).version };
    // SAFETY: in bounds, aligned and uninitialised; this unique reference to the field is
    // the only one while it lives. The clone is written in place, not moved in.
    tensor.clone_into_uninit(unsafe { &mut *slot.cast::<MaybeUninit<Tensor>>() });
    if tensor.device().kind.has_addresses() && tensor.byte_offset() != 0 {
        // SAFETY: initialised just above and ours alone; the value read out is written back
        // (folded) at once, so it is neither dropped twice nor lost.
        let unfolded = unsafe { slot.read() };
        // SAFETY: as above.
        unsafe { slot.write(unfolded.into_offset_folded()) };
    }
    // SAFETY: aligned, uninitialised, ours alone; written once.
    unsafe { is_copied.write(false) };
    // SAFETY: as above.
    unsafe { kept_version.write(version) };
}

/// The deleter of every managed tensor we export: frees the context, which drops the owner
/// clone (and with it the exported memory, if that was the last user).
///
/// Never unwinds into the consumer, and never aborts: if dropping the owner panics (owners
/// must not: a panicking drop is a bug), the panic is caught and reported, and what was left
/// to release leaks (`tensorbridge_core::callback`, the one policy for such entries).
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
    if let Some(token) = boxed.lent {
        crate::lent::unregister(token);
    }
    tensorbridge_core::callback::foreign_entry(
        "a DLPack deleter (tensorbridge-dlpack)",
        (),
        move || drop(boxed),
    );
}

/// The two managed structs we export, each with the mark its exports carry.
///
/// An export is recognised by its `manager_ctx` (the producer's own field, which consumers
/// leave alone): it holds the address of a private static of this crate, one per struct
/// kind. Statics have one address each; functions do not (a generic or inlinable function
/// can be copied per codegen unit, so comparing with the deleter's address could miss, and
/// under Miri it always did).
pub(crate) trait Exportable: ManagedTensorBase + Copy {
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
/// on an [`ExportCtx`] at the struct's own address. A consumer that copied the struct
/// elsewhere and passed the copy on would break DLPack (the deleter must be called with the
/// producer's own pointer) as surely as it would break this check.
///
/// The fast path then takes only what it can prove unchanged. Every field a consumer could
/// have written (version, `manager_ctx`, deleter, flags, data pointer, device, rank, dtype,
/// `shape` and `strides` pointers, byte offset) is compared with the private copy the export
/// kept ([`ExportCtx::sent`]), and the values behind `shape` and `strides` with the kept
/// tensor's own layout, which no consumer can reach. Any difference (a consumer that wrote
/// `shape[0] = 1 << 40`, another deleter, another offset) sends the struct down the general
/// path, which validates what it says now.
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
    if m.manager_ctx() != M::mark() {
        return None;
    }
    let ctx = ptr.cast::<ExportCtx<M>>();
    // SAFETY: `manager_ctx` holds our mark, which only `export` stores, on the managed
    // struct of an `ExportCtx<M>` (its first field, so at this address), live until its
    // deleter runs, which has not happened (obligation 2; see above for copies). The
    // context's private fields are ours: no consumer was given a pointer to them. The
    // references end before the box is freed.
    let sent = unsafe { &(*ctx).sent };
    // SAFETY: as above.
    let kept = unsafe { &(*ctx).imported.tensor };
    if !same_fields(m, sent) || !wanted(kept) {
        return None;
    }
    let dl = m.tensor();
    let ndim = kept.ndim();
    // SAFETY: the pointers are the ones the export wrote (compared above), to `ndim` values
    // each in the context's shown dimensions (`ShownDims::write`), live with the context;
    // the consumer that handed the struct back no longer writes them (obligation 1: the
    // fields do not change while the import reads them).
    let shape = unsafe { std::slice::from_raw_parts(dl.shape.cast_const(), ndim) };
    // SAFETY: as for `shape`.
    let strides = unsafe { std::slice::from_raw_parts(dl.strides.cast_const(), ndim) };
    if shape != kept.shape() || strides != kept.strides_elems() {
        return None;
    }
    // `ctx` is non-null: it is `managed`'s address.
    NonNull::new(ctx).map(OwnExport)
}

/// What one of our own exports lent: the kept tensor's device, the bytes it spans, and
/// whether it was lent read-only.
pub(crate) struct Extent {
    pub(crate) device: tensorbridge_core::Device,
    pub(crate) span: std::ops::Range<usize>,
    pub(crate) readonly: bool,
}

/// The [`Extent`] of `managed` when it is one of our own exports (its `manager_ctx` holds our
/// mark), whatever its other fields say now: a consumer may have edited them (through ctypes,
/// say), and an edited export of ours is checked against what we know we lent.
///
/// # Safety
/// 1. As [`take_own_export`]'s obligation 1; the struct is not consumed.
pub(crate) unsafe fn own_extent<M: Exportable>(managed: NonNull<M>) -> Option<Extent> {
    // SAFETY: live and readable (obligation 1); the reference ends here.
    let m = unsafe { managed.as_ref() };
    if m.manager_ctx() != M::mark() {
        return None;
    }
    let ctx = managed.as_ptr().cast::<ExportCtx<M>>();
    // SAFETY: marked: an `ExportCtx<M>` at this address whose deleter has not run (as in
    // `take_own_export`); the kept tensor is ours and unchanged; the reference ends here.
    let kept = unsafe { &(*ctx).imported.tensor };
    Some(Extent {
        device: kept.device(),
        span: kept.byte_span(),
        readonly: kept.is_readonly(),
    })
}

/// Whether two managed structs hold the same value in every field (pointers compared by
/// address, the deleter too: both sides are copies of the one value the export wrote).
fn same_fields<M: ManagedTensorBase>(a: &M, b: &M) -> bool {
    let (x, y) = (a.tensor(), b.tensor());
    a.version() == b.version()
        && a.manager_ctx() == b.manager_ctx()
        && a.deleter().map(|f| f as usize) == b.deleter().map(|f| f as usize)
        && a.flags() == b.flags()
        && x.data.addr() == y.data.addr()
        && x.device == y.device
        && x.ndim == y.ndim
        && x.dtype == y.dtype
        && x.shape.addr() == y.shape.addr()
        && x.strides.addr() == y.strides.addr()
        && x.byte_offset == y.byte_offset
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
        // SAFETY: live and initialised (above); a plain `Option<u64>`.
        if let Some(token) = unsafe { (*ctx).lent } {
            crate::lent::unregister(token);
        }
        // SAFETY: live (above): the projection stays in bounds.
        let shown = unsafe { &raw mut (*ctx).shown };
        // SAFETY: initialised and owned, dropped once here, in place (it frees the spilled
        // dimensions, if any); nothing reads it afterwards.
        unsafe { std::ptr::drop_in_place(shown) };
        // SAFETY: the box's own pointer with its provenance (`managed` is the first field,
        // at offset 0); freed once, as `MaybeUninit` so that nothing is dropped again: the
        // tensor was moved out and the dimensions dropped above, and the managed structs are
        // plain data.
        drop(unsafe { Box::from_raw(ctx.cast::<MaybeUninit<ExportCtx<M>>>()) });
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
