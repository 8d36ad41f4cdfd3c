//! [`Tensor`] -> DLPack managed tensor, keeping the tensor's owner alive until the deleter
//! runs.

use std::mem::MaybeUninit;
use std::ptr;

use dlpark::{Managed, legacy, versioned};
use tensorbridge::{Packing, Tensor};

use crate::Error;
use crate::ffi::{
    DLDataType, DLDataTypeCode, DLDevice, DLDeviceType, DLManagedTensor, DLManagedTensorVersioned,
    DLPACK_MAJOR_VERSION, DLPackVersion, DLTensor, DlpackFlags, ExportCtx, Exportable,
    delete_export, export_flags,
};

/// What [`export_legacy`] does with a read-only tensor, since the legacy struct cannot say
/// "read-only".
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReadOnlyPolicy {
    /// Fail with [`Error::ReadOnlyToLegacy`] (what NumPy does, raising `BufferError`).
    Refuse,
    /// Export anyway and let the consumer believe it may write: the caller accepts that
    /// risk (the array API's advice to consumers that cannot represent read-only).
    Discard,
}

/// Exports a tensor as a versioned (DLPack 1.3) managed tensor, zero-copy.
///
/// The struct always carries strides (also for rank 0); on devices with plain pointers the
/// byte offset is folded into `data` (`byte_offset` is 0, which consumers that ignore it
/// need), while handle devices (OpenCL, Vulkan, Metal...) keep it. Flags: `READ_ONLY` for
/// read-only tensors, `IS_SUBBYTE_TYPE_PADDED` for padded fp6/fp4, never `IS_COPIED`.
///
/// The result owns a clone of the tensor's owner, which keeps the data alive: dropping the
/// result, or calling the deleter of the struct that [`Managed::into_raw`] hands to a
/// consumer, drops that clone, once. The struct carries no stream: order the consumer
/// against [`Tensor::ready`] before handing it over.
///
/// Fails only for device ordinals above `i32::MAX` ([`Error::Core`]) and ranks above
/// `i32::MAX` ([`Error::RankTooLarge`]).
pub fn export_versioned(tensor: &Tensor) -> Result<versioned::Dlpack, Error> {
    export::<DLManagedTensorVersioned>(tensor, export_flags(tensor))
}

/// Exports a tensor as a legacy (unversioned) managed tensor, zero-copy, for consumers that
/// predate DLPack 1.0 (a `__dlpack__` call without `max_version`).
///
/// As [`export_versioned`], except that the legacy struct has no flags: a read-only tensor
/// is refused unless `read_only` is [`ReadOnlyPolicy::Discard`], and padded sub-byte data
/// is refused ([`Error::PaddedToLegacy`]; legacy sub-byte data is packed).
pub fn export_legacy(tensor: &Tensor, read_only: ReadOnlyPolicy) -> Result<legacy::Dlpack, Error> {
    if tensor.is_readonly() && read_only == ReadOnlyPolicy::Refuse {
        return Err(Error::ReadOnlyToLegacy);
    }
    if tensor.packing() == Packing::Padded {
        return Err(Error::PaddedToLegacy {
            dtype: tensor.dtype(),
        });
    }
    export::<DLManagedTensor>(tensor, DlpackFlags::empty())
}

/// Builds the managed struct inside one boxed [`ExportCtx`]; `flags` are ignored by the
/// legacy struct, which has none.
fn export<M: Exportable>(tensor: &Tensor, flags: DlpackFlags) -> Result<Managed<M>, Error> {
    let (device_type, device_id) = tensor.device().to_dlpack()?;
    let rank = tensor.ndim();
    let ndim = i32::try_from(rank).map_err(|_| Error::RankTooLarge { ndim: rank })?;
    let dtype = tensor.dtype();
    // The context keeps the tensor with its offset folded into the pointer where the device
    // has addresses: `data` is then the address of element 0 and `byte_offset` 0, which
    // consumers that ignore `byte_offset` need; handle devices keep their offset. It is
    // written in place: a `Tensor` is a few hundred bytes, and building the context on the
    // stack and moving it into a box copied it twice more (a third of the round trip's
    // instructions were `memcpy`, measured with callgrind).
    let ctx: *mut ExportCtx<M> = Box::into_raw(Box::<ExportCtx<M>>::new_uninit()).cast();
    // SAFETY: `ctx` is the live, uninitialised allocation just made, owned here alone; the
    // projection stays in bounds. (`managed` is written once the dimensions have their final
    // address, below.)
    let slot = unsafe { &raw mut (*ctx).imported.tensor };
    // SAFETY: in bounds, aligned and uninitialised; this unique reference to the field is
    // the only one while it lives.
    tensor.clone_into_uninit(unsafe { &mut *slot.cast::<MaybeUninit<Tensor>>() });
    if tensor.device().kind.has_addresses() && tensor.byte_offset() != 0 {
        // SAFETY: initialised just above and ours alone; the value read out is written back
        // (folded) below, so it is neither dropped twice nor lost.
        let unfolded = unsafe { slot.read() };
        // SAFETY: as above.
        unsafe { slot.write(unfolded.into_offset_folded()) };
    }
    // SAFETY: `ctx` is the live allocation just made: the projection stays in bounds.
    let is_copied = unsafe { &raw mut (*ctx).imported.is_copied };
    // SAFETY: as above.
    let version = unsafe { &raw mut (*ctx).imported.version };
    // SAFETY: aligned, uninitialised, ours alone; written once each. With the tensor above,
    // the import's report is complete.
    unsafe { is_copied.write(false) };
    // SAFETY: as above.
    unsafe { version.write(M::VERSION) };
    // SAFETY: `ctx` is the live allocation just made, owned here alone, its tensor
    // initialised; this shared reference to it is the only reference into the box while it
    // is in use.
    let kept: &Tensor = unsafe { &(*ctx).imported.tensor };
    // The pointers aim into the boxed tensor's layout, which nothing moves or mutates until
    // `delete_export` frees the box; consumers only read them. Never null, rank 0 included
    // ("always emit strides"): the layout's inline storage is in the box even for rank 0.
    let dl = DLTensor {
        // Exposed provenance: the tensor's address came from an exposed pointer (or is a
        // handle on devices without addresses, never dereferenced here).
        data: ptr::with_exposed_provenance_mut(kept.data()),
        device: DLDevice {
            // Known codes are 1 to 18; see `import::describe` for the `u32`.
            device_type: DLDeviceType(device_type as u32),
            device_id,
        },
        ndim,
        dtype: DLDataType {
            code: DLDataTypeCode(dtype.code().code()),
            bits: dtype.bits(),
            lanes: dtype.lanes(),
        },
        shape: kept.shape().as_ptr().cast_mut(),
        strides: kept.strides_elems().as_ptr().cast_mut(),
        byte_offset: kept.byte_offset(),
    };
    // `manager_ctx` marks the struct as ours (`take_own_export` checks it); `delete_export`
    // does not read it: the context is at the struct's own address.
    let mut managed = M::from_parts(dl, M::mark(), Some(delete_export::<M>));
    // SAFETY: `flags` describe the tensor: read-only and padding as its descriptor says,
    // never `IS_COPIED` (this export is zero-copy).
    unsafe { managed.set_flags_unchecked(flags) };
    // SAFETY: `ctx` is live, so the projection stays in bounds; the raw place keeps the
    // box's provenance, which `delete_export` needs to free the whole box.
    let raw = unsafe { &raw mut (*ctx).managed };
    // SAFETY: live, aligned, uninitialised and ours alone: written once. The context is now
    // fully initialised.
    unsafe { raw.write(managed) };
    // SAFETY: `raw` is non-null and points to an initialised managed struct that we own
    // alone. Its data stays valid until the deleter runs (the boxed tensor's owner), shape
    // and strides stay readable and unchanged until then (above), strides are explicit, and
    // the deleter (`delete_export`, which frees the box) may run once on any thread without
    // unwinding.
    // `M::from_parts` declared `DLPackVersion::CURRENT`, so `from_raw` cannot fail; were it
    // to, it would already have called the deleter, and the error says why.
    unsafe { Managed::from_raw(raw) }.map_err(|_| Error::UnsupportedMajorVersion {
        found: DLPackVersion::CURRENT.major,
        expected: DLPACK_MAJOR_VERSION,
    })
}
