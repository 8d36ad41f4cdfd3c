//! DLPack for tensorbridge: converts between the core [`Tensor`](tensorbridge_core::Tensor) and
//! DLPack managed tensors, both the versioned `DLManagedTensorVersioned` (DLPack 1.x, with
//! flags) and the legacy `DLManagedTensor`, zero-copy and with exact ownership: every
//! producer's deleter runs exactly once, when the last user is done. The C ABI is dlpark's
//! (its `#[repr(C)]` structs, flags and managed-tensor trait, re-exported in [`ffi`]); this
//! crate adds the mapping to the core model, the trust boundary and the ownership.
//!
//! | direction | function | data | stream |
//! |---|---|---|---|
//! | import, DLPack 1.x | [`import_versioned`] | zero-copy | none in the C struct: the tensor is [`Ready::Now`](tensorbridge_core::Ready::Now) (our own exports come back with the readiness they left with) |
//! | import, legacy | [`import_legacy`] | zero-copy | the same |
//! | export, DLPack 1.3 | [`export_versioned`] | zero-copy | none in the C struct: not ordered |
//! | export, legacy | [`export_legacy`] | zero-copy | the same |
//!
//! DLPack's C structs carry no stream. Stream hand-off belongs to the Python protocol's
//! `__dlpack__(stream=...)`, which the Python layer (tensorbridge-python) implements: the
//! producer makes the data ready on the consumer's stream *before* handing the struct over.
//! So an imported tensor is ready now, and an export does not look at
//! [`Tensor::ready`](tensorbridge_core::Tensor::ready): whoever hands the struct to a consumer
//! orders the consumer's stream first.
//!
//! ```
//! use tensorbridge_core::Tensor;
//! use tensorbridge_dlpack::ffi::DlpackFlags;
//! use tensorbridge_dlpack::export_versioned;
//!
//! let t = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?.into_readonly();
//! let managed = export_versioned(&t)?;
//! // What any DLPack consumer sees (here dlpark's, through the handle):
//! assert_eq!(managed.flags(), DlpackFlags::READ_ONLY);
//! assert_eq!(managed.validate()?.strides(), Some(&[3i64, 1][..]));
//! // `managed.into_raw()` hands the struct over; dropping it instead releases the tensor.
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! [`import_versioned`] shows the way back.
//!
//! # Ownership
//! - **Import** takes ownership of the managed tensor. The resulting tensor's owner holds
//!   it and calls the producer's deleter exactly once, when the last clone of the tensor is
//!   dropped, on whichever thread that happens (DLPack deleters may run on any thread). A
//!   NULL deleter is allowed: then there is nothing to call.
//! - **A refused import** gives the managed tensor back: the [`ImportError`] holds it, and
//!   [`ImportError::into_inner`] returns it untouched, for the caller to retry, hand on, or
//!   release. Dropping the error (or converting it into [`Error`], as `?` does) releases it:
//!   the deleter runs once. The single exception is a versioned tensor of another major
//!   version: DLPack requires the consumer to call its deleter and read nothing else, which
//!   the import does before returning, so there is nothing to give back. Either way a
//!   refused import never leaks the tensor and never frees it twice.
//! - **Export** boxes, in one allocation, the managed struct, the struct's `shape` and
//!   `strides` arrays (a second allocation above 8 dimensions), and, out of consumers' reach,
//!   a copy of the struct as written and a clone of the tensor (its offset folded where the
//!   device has addresses), whose owner keeps the data alive. The struct's deleter frees
//!   that box exactly once, dropping the clone; the returned
//!   [`dlpark::Managed`] calls it when dropped, unless [`into_raw`](dlpark::Managed::into_raw)
//!   handed the struct to a consumer, which then calls the deleter itself. The deleter never
//!   unwinds into the consumer.
//! - **Importing our own export** (recognised by a mark in `manager_ctx`, the producer's
//!   private field, then checked field by field against the private copies in the box:
//!   every field of the struct, and the values behind `shape` and `strides` against the kept
//!   tensor's own layout) gives the exported tensor back itself: the same owner and
//!   readiness, no second validation, no wrapper allocation; the box is freed then, once,
//!   instead of by the deleter. A struct that someone changed after the export, in any field
//!   or any dimension, is imported the general way (validated as it reads now; its deleter,
//!   whatever it is now, runs once).
//!
//! # Soundness of exports
//! An export hands memory to a consumer as DLPack describes it; nothing in safe Rust reads
//! or writes through it (dlpark's slice accessors are `unsafe`), so an export never writes
//! under a live shared borrow itself. Access is never widened silently: a read-only tensor
//! carries `READ_ONLY` in the versioned struct, and the legacy struct, which cannot say it,
//! refuses it ([`Error::ReadOnlyToLegacy`]) unless the caller picks
//! [`ReadOnlyPolicy::Discard`], taking on the foreign consumer's writes as its own risk.
//!
//! # Limitations
//! - DLPack carries no stream (see above) and no allocation bounds: importing is `unsafe`
//!   because only the caller can vouch that the data pointer is valid for what the
//!   descriptor reaches.
//! - Versioned imports accept DLPack 1.x of any minor version whose field values this crate
//!   understands: device and dtype codes of DLPack 1.3, the three flags of 1.3. Null strides
//!   are accepted (as compact row-major) from legacy and 1.0/1.1 producers and refused from
//!   1.2 on, as the 1.2 header requires ([`Error::NullStrides`]).
//! - The legacy struct has no flags: [`import_legacy`] takes the access from the caller,
//!   [`export_legacy`] refuses read-only tensors unless told to drop the flag
//!   ([`ReadOnlyPolicy`]), and refuses padded sub-byte data ([`Error::PaddedToLegacy`]).
//! - Exports never set `IS_COPIED` (they never copy); imports report it in
//!   [`Imported::is_copied`].
//! - Python capsules (names, the consumed-once protocol) belong to the Python layer; this
//!   crate works on the C structs.

#![cfg_attr(docsrs, feature(doc_cfg))]

mod error;
mod export;
pub mod ffi;
mod import;
mod lent;

pub use error::{Error, ImportError};
pub use export::{ReadOnlyPolicy, borrowed_dltensor, export_legacy, export_versioned};
pub use import::{Imported, describe_borrowed, import_legacy, import_versioned};

/// Whether `desc` overlaps memory this crate has lent read-only and not had back (the span of
/// a live export of a read-only tensor, on the same device). A caller that gets memory with
/// no flag saying whether it may be written (a legacy capsule, a borrowed `DLTensor`) learns
/// here that it was lent read-only, whoever hands it back; the imports of this crate already
/// make such memory read-only. One atomic load while no read-only export is alive.
pub fn lent_readonly(desc: &tensorbridge_core::Descriptor) -> bool {
    lent::overlaps_readonly(desc)
}

// Thread safety of the public types, checked at compile time:
// - `Imported`: a core `Tensor` (Send + Sync, see the core's list) and plain flags.
// - `ImportError<M>`: an `Error` (plain data) and the owned managed tensor, whose owner may
//   call the producer's deleter from any thread (DLPack allows it; see `ManagedOwner`'s
//   `unsafe impl`s in `import.rs`, the one place this crate asserts thread safety by hand).
// - `Error`, `ReadOnlyPolicy`: plain data.
// The exported `dlpark::Managed` handles are dlpark's own (Send + Sync by its `unsafe impl`s:
// a handle only releases the struct once, from whichever thread drops it).
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Imported>();
    assert_send_sync::<ImportError<ffi::DLManagedTensorVersioned>>();
    assert_send_sync::<ImportError<ffi::DLManagedTensor>>();
    assert_send_sync::<Error>();
    assert_send_sync::<ReadOnlyPolicy>();
};

/// The dlpark version this crate's ABI types come from, for callers who want its
/// consumer and producer tools ([`dlpark::Managed`], capsules with its `pyo3` feature).
pub use dlpark;
