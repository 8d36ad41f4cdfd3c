//! DLPack managed tensor -> [`Tensor`]: version check, flags, then the core's validation.

use std::ptr::NonNull;
use std::slice;
use std::sync::Arc;

use dlpark::ManagedTensorBase;
use tensorbridge_core::{Access, Descriptor, Packing, RawTensor, Tensor};

use crate::Error;
use crate::error::ImportError;
use crate::ffi::{
    DLManagedTensor, DLManagedTensorVersioned, DLPACK_MAJOR_VERSION, DLPackVersion, DLTensor,
    DlpackFlags, Extent, own_extent, take_own_export,
};

/// A successful import: the tensor, and what the producer said about it besides its layout.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Imported {
    /// The validated tensor. Its owner calls the producer's deleter, once, when the last
    /// clone is dropped.
    pub tensor: Tensor,
    /// The producer's `IS_COPIED` flag: it made this copy for the consumer, so nobody else
    /// references the memory and the consumer may keep or modify it freely (within
    /// [`Access`]). Always `false` for legacy imports, which have no flags.
    pub is_copied: bool,
    /// The DLPack version the producer declared; `None` for legacy imports.
    pub version: Option<DLPackVersion>,
}

// Imports return this by value, and callers move it on: at up to 256 bytes glibc's `memcpy`
// copies it in straight-line code (see the size assertion on `Tensor` in the core).
#[cfg(target_pointer_width = "64")]
const _: () = assert!(std::mem::size_of::<Imported>() <= 256);

impl Imported {
    /// The tensor alone.
    pub fn into_tensor(self) -> Tensor {
        self.tensor
    }
}

/// Imports a versioned (DLPack 1.x) managed tensor, taking ownership of it.
///
/// Reads `version` first. For another major version it calls the deleter, reads no other
/// field, and fails with [`Error::UnsupportedMajorVersion`]. Otherwise it maps the flags
/// (`READ_ONLY` to [`Access::ReadOnly`], `IS_SUBBYTE_TYPE_PADDED` to [`Packing::Padded`],
/// `IS_COPIED` to [`Imported::is_copied`]; undefined bits are refused), reads the tensor
/// (null `strides` mean compact row-major for minor versions 0 and 1 and are refused from
/// 1.2 on, as the 1.2 header requires; null `shape` is allowed for `ndim == 0`, as 1.3 does)
/// and validates it through the core's [`RawTensor::validate`].
///
/// On success the returned tensor owns the managed tensor. On failure the error gives it back
/// ([`ImportError::into_inner`]) or, when dropped, releases it; see the crate docs.
///
/// ```
/// use std::ptr::NonNull;
/// use tensorbridge_core::Tensor;
/// use tensorbridge_dlpack::{export_versioned, import_versioned};
///
/// let t = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
/// // Any DLPack producer's struct will do; here, our own export.
/// let raw = NonNull::new(export_versioned(&t)?.into_raw()).expect("never null");
/// // SAFETY: a live managed tensor whose ownership moves here; its memory (the Vec) stays
/// // valid until its deleter runs, and nothing writes it meanwhile.
/// let back = unsafe { import_versioned(raw) }?.into_tensor();
/// assert_eq!(back.descriptor(), t.descriptor());
/// assert_eq!(back.host_view::<f32>()?.get(&[1, 2])?, 6.0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Safety
/// 1. `managed` points to a live managed tensor from a producer that follows the DLPack
///    contract: the struct is readable (at least the fields up to `flags` when its major
///    version is not 1; the whole 1.x struct when it is); `shape` and non-null `strides`
///    point to `ndim` readable values that do not change until the deleter runs; the
///    deleter, when not null, may be called once, from any thread, and does not unwind.
/// 2. Ownership passes to this call: the caller neither uses `managed` nor calls its deleter
///    afterwards, unless an [`ImportError`] gives it back.
/// 3. Until the deleter runs, every byte the tensor reaches is valid memory on its device,
///    readable, and writable too unless `READ_ONLY` is set; and while a host view of the
///    tensor reads (writes) those bytes, nobody else writes (reads or writes) them. This is
///    [`Tensor::from_descriptor`]'s contract, which the import relies on.
pub unsafe fn import_versioned(
    managed: NonNull<DLManagedTensorVersioned>,
) -> Result<Imported, ImportError<DLManagedTensorVersioned>> {
    let ptr = managed.as_ptr();
    // Fields are read through raw places, without a reference to the whole 1.x struct,
    // which a foreign major version's struct may not be.
    // SAFETY: `version` is the first field in every DLPack major version (asserted in `ffi`)
    // of a live struct (obligation 1): the projection stays in bounds.
    let version_field = unsafe { &raw const (*ptr).version };
    // SAFETY: readable and aligned (obligation 1).
    let version = unsafe { version_field.read() };
    if version.major != DLPACK_MAJOR_VERSION {
        // SAFETY: `deleter` lies in the prefix every major keeps (obligation 1), so the
        // projection stays in bounds; reading nothing else is what DLPack asks of a consumer.
        let deleter_field = unsafe { &raw const (*ptr).deleter };
        // SAFETY: readable and aligned (obligation 1).
        let deleter = unsafe { deleter_field.read() };
        if let Some(deleter) = deleter {
            // SAFETY: we own the tensor (obligation 2) and call its deleter once, as the
            // DLPack header requires for a major version mismatch (docs/PROTOCOLS.md,
            // "Versions").
            unsafe { deleter(ptr) };
        }
        return Err(ImportError::released(Error::UnsupportedMajorVersion {
            found: version.major,
            expected: DLPACK_MAJOR_VERSION,
        }));
    }
    // SAFETY: major version 1 (checked above): a live, readable 1.x struct that we own
    // (obligations 1 and 2); on `None` we still own it.
    if let Some(own) = unsafe { take_own_export(managed, |_| true) } {
        // The version exported, checked equal to `version` by `take_own_export`.
        return Ok(own.into_imported());
    }
    // SAFETY: as above; the struct is only read.
    let extent = unsafe { own_extent(managed) };
    let owner = ManagedOwner(managed);
    // SAFETY: major version 1: the whole struct is a live `DLManagedTensorVersioned` whose
    // fields do not change until the deleter runs (obligation 1); the reference does not
    // outlive this function, and `owner` does not run the deleter before `describe` ends.
    let m = unsafe { managed.as_ref() };
    let flags = m.flags;
    let result = if !DlpackFlags::all().contains(flags) {
        Err(Error::UnknownFlags {
            flags: flags.bits(),
        })
    } else {
        let access = if flags.contains(DlpackFlags::READ_ONLY) {
            Access::ReadOnly
        } else {
            Access::ReadWrite
        };
        let packing = if flags.contains(DlpackFlags::IS_SUBBYTE_TYPE_PADDED) {
            Packing::Padded
        } else {
            Packing::Packed
        };
        let strides_required = (version.minor >= 2).then_some(version);
        // SAFETY: `m.dl_tensor` is the tensor of a live managed tensor (obligation 1).
        unsafe { describe(&m.dl_tensor, strides_required, access, packing) }
            .and_then(|desc| within(desc, extent.as_ref()))
    };
    match result {
        Ok(desc) => Ok(Imported {
            // SAFETY: obligation 3 is `Tensor::from_descriptor`'s contract for the bytes
            // `desc` reaches, until `owner` (moved into the tensor) calls the deleter.
            tensor: unsafe { owner.into_tensor(desc) },
            is_copied: flags.contains(DlpackFlags::IS_COPIED),
            version: Some(version),
        }),
        Err(error) => Err(ImportError::given_back(error, owner)),
    }
}

/// Imports a legacy (unversioned, pre-1.0) managed tensor, taking ownership of it.
///
/// A legacy struct has no flags, so the caller says whether consumers may write through the
/// tensor: pass [`Access::ReadOnly`] unless the producer is known to allow writes (NumPy
/// imports legacy capsules read-only for that reason). One of this crate's own exports is
/// known: it comes back with the access it was exported with, whatever `access` says. Sub-byte data is packed, null
/// `strides` mean compact row-major, and the tensor is validated through the core's
/// [`RawTensor::validate`].
///
/// On success the returned tensor owns the managed tensor. On failure the error gives it back
/// ([`ImportError::into_inner`]) or, when dropped, releases it; see the crate docs.
///
/// # Safety
/// 1. `managed` points to a live, readable `DLManagedTensor` from a producer that follows
///    the DLPack contract: `shape` and non-null `strides` point to `ndim` readable values
///    that do not change until the deleter runs; the deleter, when not null, may be called
///    once, from any thread, and does not unwind.
/// 2. Ownership passes to this call: the caller neither uses `managed` nor calls its deleter
///    afterwards, unless an [`ImportError`] gives it back.
/// 3. Until the deleter runs, every byte the tensor reaches is valid memory on its device,
///    readable, and writable too when `access` is [`Access::ReadWrite`]; and while a host
///    view of the tensor reads (writes) those bytes, nobody else writes (reads or writes)
///    them ([`Tensor::from_descriptor`]'s contract).
pub unsafe fn import_legacy(
    managed: NonNull<DLManagedTensor>,
    access: Access,
) -> Result<Imported, ImportError<DLManagedTensor>> {
    // Our own export comes back as it left, with the access it was exported with: this crate
    // is its producer and knows what it lent, which the caller's `access` (what it knows of
    // an unknown producer) cannot widen or need narrow.
    // SAFETY: a live, readable `DLManagedTensor` that we own (obligations 1 and 2); on
    // `None` we still own it.
    if let Some(own) = unsafe { take_own_export(managed, |_| true) } {
        // Unversioned and not copied, as the legacy export left it.
        return Ok(own.into_imported());
    }
    // SAFETY: as above; the struct is only read.
    let extent = unsafe { own_extent(managed) };
    // An edited export of ours: the access it lent (`within` checks the rest).
    let access = match &extent {
        Some(extent) if extent.readonly => Access::ReadOnly,
        Some(_) => Access::ReadWrite,
        None => access,
    };
    let owner = ManagedOwner(managed);
    // SAFETY: a live `DLManagedTensor` whose fields do not change until the deleter runs
    // (obligation 1); the reference ends with this function, before `owner` can release it.
    let m = unsafe { managed.as_ref() };
    // SAFETY: `m.dl_tensor` is the tensor of a live managed tensor (obligation 1).
    match unsafe { describe(&m.dl_tensor, None, access, Packing::Packed) }
        .and_then(|desc| within(desc, extent.as_ref()))
    {
        Ok(desc) => Ok(Imported {
            // SAFETY: obligation 3, as in `import_versioned`.
            tensor: unsafe { owner.into_tensor(desc) },
            is_copied: false,
            version: None,
        }),
        Err(error) => Err(ImportError::given_back(error, owner)),
    }
}

/// What a general import may hand out for `desc`, checked against what we know we lent:
/// - one of our own exports that a consumer edited (`extent`) may describe only bytes inside
///   the exported tensor's span, on its device, and no wider access than it had
///   ([`Error::EditedExport`]);
/// - any other producer's tensor that overlaps one of our live read-only exports comes back
///   read-only (a consumer that dropped the flag and handed the memory on: [`crate::lent`]).
fn within(desc: Descriptor, extent: Option<&Extent>) -> Result<Descriptor, Error> {
    match extent {
        Some(extent) => {
            let span = desc.byte_span();
            let inside = desc.numel() == 0
                || (desc.device() == extent.device
                    && extent.span.start <= span.start
                    && span.end <= extent.span.end);
            if !inside {
                return Err(Error::EditedExport {
                    found_device: desc.device(),
                    found_lo: span.start,
                    found_hi: span.end,
                    lent_device: extent.device,
                    lent_lo: extent.span.start,
                    lent_hi: extent.span.end,
                });
            }
            Ok(if extent.readonly {
                desc.to_readonly()
            } else {
                desc
            })
        }
        None if crate::lent::overlaps_readonly(&desc) => Ok(desc.to_readonly()),
        None => Ok(desc),
    }
}

/// Validates a borrowed `DLTensor` (no managed tensor, no deleter): what the DLPack C
/// exchange API's `dltensor_from_py_object_no_sync` fills in for a producer object that keeps
/// the memory alive itself. The caller makes the returned descriptor a [`Tensor`] with an
/// owner that keeps that object alive.
///
/// `version` is the version the producer follows (its exchange table's): from 1.2 on, null
/// `strides` are refused for `ndim != 0`. A `DLTensor` has no flags: the caller says whether
/// the memory may be written (`access`); sub-byte types are packed.
///
/// # Safety
/// 1. A non-null `dl.shape` points to `dl.ndim` readable `i64`s, and so does a non-null
///    `dl.strides`, neither changing during the call.
pub unsafe fn describe_borrowed(
    dl: &DLTensor,
    version: DLPackVersion,
    access: Access,
) -> Result<Descriptor, Error> {
    let strides_required = (version.major > 1 || version.minor >= 2).then_some(version);
    // SAFETY: obligation 1.
    unsafe { describe(dl, strides_required, access, Packing::Packed) }
}

/// Reads a `DLTensor` into the core's untrusted [`RawTensor`] and validates it.
///
/// `strides_required` is the declared version when it forbids null strides for
/// `ndim != 0` (1.2 and later).
///
/// # Safety
/// 1. A non-null `dl.shape` points to `dl.ndim` readable `i64`s, and so does a non-null
///    `dl.strides`, neither changing while `dl` is borrowed.
#[inline]
unsafe fn describe(
    dl: &DLTensor,
    strides_required: Option<DLPackVersion>,
    access: Access,
    packing: Packing,
) -> Result<Descriptor, Error> {
    let ndim = usize::try_from(dl.ndim).map_err(|_| Error::NegativeRank { ndim: dl.ndim })?;
    let shape: &[i64] = if ndim == 0 {
        // DLPack 1.3 allows a null `shape` here; never read it.
        &[]
    } else if dl.shape.is_null() {
        return Err(Error::NullShape { ndim: dl.ndim });
    } else {
        // SAFETY: non-null, `ndim` values, unchanging (obligation 1); `ndim <= i32::MAX`
        // keeps the byte length far below `isize::MAX`.
        unsafe { slice::from_raw_parts(dl.shape, ndim) }
    };
    let strides: Option<&[i64]> = if ndim == 0 {
        Some(&[])
    } else if dl.strides.is_null() {
        if let Some(v) = strides_required {
            return Err(Error::NullStrides {
                major: v.major,
                minor: v.minor,
                ndim: dl.ndim,
            });
        }
        None
    } else {
        // SAFETY: as for `shape`.
        Some(unsafe { slice::from_raw_parts(dl.strides, ndim) })
    };
    let raw = RawTensor {
        // Exposed: host views turn the address back into a pointer.
        data: dl.data.expose_provenance(),
        // The header's `DLDeviceType` is a C++ `enum : int32_t`; bindgen typed it `u32`. Same
        // four bytes, reinterpreted, so a nonsense code stays visible in the error.
        device_type: dl.device.device_type.0 as i32,
        device_id: dl.device.device_id,
        dtype_code: dl.dtype.code.0,
        dtype_bits: dl.dtype.bits,
        dtype_lanes: dl.dtype.lanes,
        shape,
        strides,
        byte_offset: dl.byte_offset,
        access,
        packing,
    };
    raw.validate().map_err(Error::Core)
}

/// Owns an imported managed tensor: dropping it calls the producer's deleter, once (a null
/// deleter means there is nothing to call). Never panics: the deleter is an `extern "C"`
/// function, which cannot unwind into us.
///
/// Becomes the [`Tensor`]'s owner on success, or travels in the [`ImportError`] on failure.
pub(crate) struct ManagedOwner<M: ManagedTensorBase>(NonNull<M>);

impl<M: ManagedTensorBase> ManagedOwner<M> {
    /// Gives the managed tensor back without calling its deleter.
    pub(crate) fn into_raw(self) -> NonNull<M> {
        let ptr = self.0;
        std::mem::forget(self);
        ptr
    }

    /// Attaches this owner to a validated description of the managed tensor's data.
    ///
    /// # Safety
    /// 1. [`Tensor::from_descriptor`]'s obligations hold for `desc` until the deleter runs.
    unsafe fn into_tensor(self, desc: Descriptor) -> Tensor
    where
        M: 'static,
    {
        // SAFETY: forwarded obligation 1; the owner calls the deleter only when the tensor's
        // last clone drops it.
        unsafe { Tensor::from_descriptor(desc, Arc::new(self)) }
    }
}

impl<M: ManagedTensorBase> Drop for ManagedOwner<M> {
    fn drop(&mut self) {
        // SAFETY: the pointer is a live managed tensor we own (import obligations 1 and 2),
        // its version already checked; this is the only release: `into_raw` forgets the
        // owner instead. dlpark's `drop_raw` calls the deleter unless it is null.
        unsafe { M::drop_raw(self.0.as_ptr()) };
    }
}

// SAFETY: the owner does one thing, calling the producer's deleter once from whichever
// thread drops it (the tensor's last clone may be dropped anywhere). DLPack allows that:
// deleters may run on any thread (the DLPack header: deleters may be
// called from any thread; Python producers' deleters take the GIL themselves), and the import contract says so
// (obligation 1 of `import_versioned` and `import_legacy`). Nothing else reads the struct
// after the import.
unsafe impl<M: ManagedTensorBase> Send for ManagedOwner<M> {}
// SAFETY: `&ManagedOwner` gives access to nothing: no method reads the pointer through a
// shared reference, so sharing one between threads cannot race.
unsafe impl<M: ManagedTensorBase> Sync for ManagedOwner<M> {}

// Owners, and the import errors that carry them, cross threads (checked at compile time).
const _: () = {
    const fn assert_send_sync<T: Send + Sync + 'static>() {}
    assert_send_sync::<ManagedOwner<DLManagedTensorVersioned>>();
    assert_send_sync::<ManagedOwner<DLManagedTensor>>();
    assert_send_sync::<ImportError<DLManagedTensorVersioned>>();
    assert_send_sync::<ImportError<DLManagedTensor>>();
};

#[cfg(test)]
mod tests {
    use super::*;

    fn dl(shape: &mut [i64], strides: Option<&mut [i64]>) -> DLTensor {
        DLTensor {
            data: std::ptr::null_mut(),
            device: crate::ffi::DLDevice::CPU,
            ndim: shape.len() as i32,
            dtype: crate::ffi::DLDataType::F32,
            shape: shape.as_mut_ptr(),
            strides: strides.map_or(std::ptr::null_mut(), |s| s.as_mut_ptr()),
            byte_offset: 0,
        }
    }

    #[test]
    fn describe_maps_null_strides_by_version() {
        let mut shape = [2i64, 0, 3];
        let t = dl(&mut shape, None);
        let v = |minor| DLPackVersion { major: 1, minor };
        // SAFETY: `shape` holds `ndim` values; strides are null.
        let d = unsafe { describe(&t, None, Access::ReadWrite, Packing::Packed) }.unwrap();
        assert_eq!(d.strides_elems(), &[3, 3, 1]);
        // SAFETY: as above.
        let e = unsafe { describe(&t, Some(v(2)), Access::ReadWrite, Packing::Packed) };
        assert_eq!(
            e,
            Err(Error::NullStrides {
                major: 1,
                minor: 2,
                ndim: 3
            })
        );
    }

    #[test]
    fn describe_never_reads_shape_or_strides_of_rank_0() {
        let t = DLTensor {
            data: std::ptr::without_provenance_mut(64),
            device: crate::ffi::DLDevice::CPU,
            ndim: 0,
            dtype: crate::ffi::DLDataType::F32,
            // Dangling on purpose: Miri would catch a read.
            shape: std::ptr::without_provenance_mut(8),
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        };
        let strict = Some(DLPackVersion::CURRENT);
        // SAFETY: ndim is 0, so obligation 1 asks nothing of the pointers.
        let d = unsafe { describe(&t, strict, Access::ReadOnly, Packing::Packed) }.unwrap();
        assert_eq!((d.ndim(), d.numel(), d.data()), (0, 1, 64));
        assert!(d.is_readonly());
    }

    #[test]
    fn describe_refuses_negative_rank_and_null_shape() {
        let mut shape = [1i64];
        let mut t = dl(&mut shape, None);
        t.ndim = -1;
        // SAFETY: negative rank: the pointers are not read.
        let e = unsafe { describe(&t, None, Access::ReadWrite, Packing::Packed) };
        assert_eq!(e, Err(Error::NegativeRank { ndim: -1 }));
        t.ndim = 1;
        t.shape = std::ptr::null_mut();
        // SAFETY: null shape: refused before any read.
        let e = unsafe { describe(&t, None, Access::ReadWrite, Packing::Packed) };
        assert_eq!(e, Err(Error::NullShape { ndim: 1 }));
    }
}
