//! [`Tensor`] -> DLPack managed tensor, keeping the tensor's owner alive until the deleter
//! runs.

use std::ptr;
use std::sync::Arc;

use dlpark::{Managed, ManagedTensorBase, legacy, versioned};
use tensorbridge::{Packing, Tensor};

use crate::Error;
use crate::ffi::{
    DLDataType, DLDataTypeCode, DLDevice, DLDeviceType, DLManagedTensor, DLManagedTensorVersioned,
    DLPACK_MAJOR_VERSION, DLPackVersion, DLTensor, DlpackFlags, ExportCtx, ExportDims,
    delete_export,
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
    let mut flags = DlpackFlags::empty();
    if tensor.is_readonly() {
        flags |= DlpackFlags::READ_ONLY;
    }
    if tensor.packing() == Packing::Padded {
        // `Descriptor` keeps `Padded` only for sub-byte dtypes.
        flags |= DlpackFlags::IS_SUBBYTE_TYPE_PADDED;
    }
    export::<DLManagedTensorVersioned>(tensor, flags)
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
fn export<M: ManagedTensorBase>(tensor: &Tensor, flags: DlpackFlags) -> Result<Managed<M>, Error> {
    let (device_type, device_id) = tensor.device().to_dlpack()?;
    let rank = tensor.ndim();
    let ndim = i32::try_from(rank).map_err(|_| Error::RankTooLarge { ndim: rank })?;
    // The offset folded into the pointer where the device has addresses, as
    // `Descriptor::with_offset_folded` does (without cloning the descriptor): `data_ptr` is
    // the address of element 0 there, and the handle itself on other devices.
    let byte_offset = if tensor.device().kind.has_addresses() {
        0
    } else {
        tensor.byte_offset()
    };
    let dtype = tensor.dtype();
    let proto = DLTensor {
        // Exposed provenance: the tensor's address came from an exposed pointer (or is a
        // handle on devices without addresses, never dereferenced here).
        data: ptr::with_exposed_provenance_mut(tensor.data_ptr()),
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
        // Pointed into the box below.
        shape: ptr::null_mut(),
        strides: ptr::null_mut(),
        byte_offset,
    };
    // Shape and strides can only be pointed at once the dimensions have their final address
    // in the box (up to 8 dimensions live inline and move with the context): box the
    // context first, with a placeholder struct, and write the real one in place after.
    let ctx = Box::into_raw(Box::new(ExportCtx {
        managed: M::from_parts(DLTensor::default(), ptr::null_mut(), None),
        owner: Arc::clone(tensor.owner()),
        dims: ExportDims::new(tensor.shape(), tensor.strides_elems()),
    }));
    // SAFETY: `ctx` is the live allocation just made, owned here alone; this shared reference
    // to its dimensions is the only reference into the box while it is in use.
    let dims: &ExportDims = unsafe { &(*ctx).dims };
    // The pointers aim into the boxed dimensions, which nothing moves or mutates until
    // `delete_export` frees the box; consumers only read them. Never null, rank 0 included
    // ("always emit strides"). `rank` is within the `2 * rank` stored values.
    let shape = dims.as_ptr().cast_mut();
    let dl = DLTensor {
        shape,
        strides: shape.wrapping_add(rank),
        ..proto
    };
    // `manager_ctx` is informative (for C code and debuggers); `delete_export` does not read it.
    let mut managed = M::from_parts(dl, ctx.cast(), Some(delete_export::<M>));
    // SAFETY: `flags` describe the tensor: read-only and padding as its descriptor says,
    // never `IS_COPIED` (this export is zero-copy).
    unsafe { managed.set_flags_unchecked(flags) };
    // SAFETY: `ctx` is live, so the projection stays in bounds; the raw place keeps the
    // box's provenance, which `delete_export` needs to free the whole box.
    let raw = unsafe { &raw mut (*ctx).managed };
    // SAFETY: live, aligned and ours alone; `managed` (plain `Copy` data) replaces the
    // placeholder, which needs no drop.
    unsafe { raw.write(managed) };
    // SAFETY: `raw` is non-null and points to an initialised managed struct that we own
    // alone. Its data stays valid until the deleter runs (the boxed owner), shape and strides
    // stay readable and unchanged until then (above), strides are explicit, and the deleter
    // (`delete_export`, which frees the box) may run once on any thread without unwinding.
    // `M::from_parts` declared `DLPackVersion::CURRENT`, so `from_raw` cannot fail; were it
    // to, it would already have called the deleter, and the error says why.
    unsafe { Managed::from_raw(raw) }.map_err(|_| Error::UnsupportedMajorVersion {
        found: DLPackVersion::CURRENT.major,
        expected: DLPACK_MAJOR_VERSION,
    })
}
