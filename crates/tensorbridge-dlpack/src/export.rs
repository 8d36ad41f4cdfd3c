//! [`Tensor`] -> DLPack managed tensor, keeping the tensor's owner alive until the deleter
//! runs.

use std::ptr;

use dlpark::{Managed, legacy, versioned};
use tensorbridge_core::{Packing, Tensor};

use crate::Error;
use crate::ffi::{
    DLDataType, DLDataTypeCode, DLDevice, DLDeviceType, DLManagedTensor, DLManagedTensorVersioned,
    DLPACK_MAJOR_VERSION, DLPackVersion, DLTensor, DlpackFlags, ExportCtx, Exportable,
    export_flags,
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
    let head = borrowed_dltensor(tensor)?;
    // `kept` is the clone in the box (offset folded where the device has addresses, as in
    // `head`); the pointers aim at the box's shown dimensions, a copy of its layout that
    // nothing moves until the deleter frees the box. Never null, rank 0 included ("always
    // emit strides").
    let describe = |_kept: &Tensor, shape: *mut i64, strides: *mut i64| DLTensor {
        shape,
        strides,
        ..head
    };
    let raw = ExportCtx::<M>::boxed(tensor, flags, describe);
    // SAFETY: `raw` points to an initialised managed struct that we own alone. Its data stays
    // valid until the deleter runs (the boxed tensor's owner), shape and strides stay
    // readable until then (the box's shown dimensions), strides are explicit, and the
    // deleter (`delete_export`, which frees the box) may run once on any thread without
    // unwinding.
    // `M::from_parts` declared `DLPackVersion::CURRENT`, so `from_raw` cannot fail; were it
    // to, it would already have called the deleter, and the error says why.
    unsafe { Managed::from_raw(raw.as_ptr()) }.map_err(|_| Error::UnsupportedMajorVersion {
        found: DLPackVersion::CURRENT.major,
        expected: DLPACK_MAJOR_VERSION,
    })
}

/// The `DLTensor` of `t`, borrowing its shape and strides: device, rank and dtype in DLPack's
/// codes, and the byte offset folded into the data pointer where the device has addresses
/// (as every export from this crate shows it). `shape` and `strides` point into `t` (never
/// null, rank 0 included: DLPack 1.2+ requires strides) and stay valid while `t` is neither
/// moved nor dropped; consumers only read them. Fails for an ordinal or a rank DLPack
/// cannot carry.
pub fn borrowed_dltensor(t: &Tensor) -> Result<DLTensor, Error> {
    let (device_type, device_id) = t.device().to_dlpack()?;
    let rank = t.ndim();
    let ndim = i32::try_from(rank).map_err(|_| Error::RankTooLarge { ndim: rank })?;
    let (data, byte_offset) = if t.device().kind.has_addresses() {
        (t.data_ptr(), 0)
    } else {
        (t.data(), t.byte_offset())
    };
    let dtype = t.dtype();
    Ok(DLTensor {
        // Exposed provenance: the tensor's address came from an exposed pointer (or is a
        // handle on devices without addresses, never dereferenced here).
        data: ptr::with_exposed_provenance_mut(data),
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
        shape: t.shape().as_ptr().cast_mut(),
        strides: t.strides_elems().as_ptr().cast_mut(),
        byte_offset,
    })
}
