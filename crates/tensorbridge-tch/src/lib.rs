//! libtorch through tch 0.24 for tensorbridge: converts between `tch::Tensor` and the core
//! [`Tensor`] without copies, in both directions, on the CPU and on CUDA devices. tch's own
//! `Tensor::from_blob` takes no deleter, so memory handed to libtorch has to be kept alive
//! by hand; this crate gives libtorch a real one, through a small C++ shim over
//! `at::for_blob` (the machinery behind `at::from_blob`), so the memory lives exactly as long
//! as libtorch uses it.
//!
//! | direction | function | data | stream |
//! |---|---|---|---|
//! | `&tch::Tensor` -> [`Tensor`] | [`import`] (`unsafe`: the caller promises not to resize the storage meanwhile) | zero-copy, read-write; every dtype with a DLPack code, CPU and CUDA, strides and storage offset kept | CUDA: [`Ready::Stream`] of libtorch's current stream for the device (read through the shim); CPU: [`Ready::Now`] |
//! | [`Tensor`] -> `tch::Tensor` | [`export_exclusive`] (safe: a [`tensorbridge_core::ExclusiveTensor`]); `unsafe` [`export`], [`export_with`] (a shared `&Tensor`: the caller promises no Rust view reads while libtorch writes) | zero-copy; the byte offset folded into the data pointer | CUDA: libtorch's current stream waits on the GPU for the tensor's [`Ready`] (an event, no host wait); a host tensor that is not ready is waited for on the host |
//! | `tch::Kind` <-> [`DType`](tensorbridge_core::DType) | [`dtype_of_kind`], [`kind_of_dtype`], [`ScalarType`] | none | none |
//! | libtorch's current stream -> cudarc stream, for a scope | [`with_current_stream`] | none | your own cudarc kernel on tch tensors runs where libtorch's next operation will, ordered both ways with no event |
//!
//! ```
//! use tensorbridge_core::Tensor;
//!
//! let t = Tensor::from_vec((0..6).map(|i| i as f32).collect(), &[2, 3])?;
//! // Sound (`export`'s obligation 1): nothing writes through `torch` while views read below.
//! let torch = unsafe { tensorbridge_tch::export(&t) }?.transpose(0, 1); // libtorch's own view
//! // Sound: `export` made the storage, which libtorch refuses to resize, and no other thread
//! // holds `torch`.
//! let back = unsafe { tensorbridge_tch::import(&torch) }?;
//! assert_eq!(back.data_ptr(), t.data_ptr()); // one buffer all along
//! assert_eq!(back.strides_elems(), [1, 3]);
//! assert_eq!(back.host_view::<f32>()?.to_contiguous(), [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Ownership
//! - **tch -> [`Tensor`]**: the tensor's owner is one reference to the tch tensor's storage
//!   (a `c10::Storage` copy the shim takes while describing the tensor: one atomic
//!   increment, no tensor of its own, given back once). The storage lives until the last
//!   clone of the [`Tensor`] is dropped, whatever the tch tensor is rebound to meanwhile
//!   (`set_`, `set_data`). Its memory lives as long only if nothing resizes the storage:
//!   libtorch grows a storage by moving it to new memory and freeing the old at once, which
//!   no reference to the storage prevents; hence [`import`] is `unsafe` (see
//!   `# Soundness`).
//! - **[`Tensor`] -> tch**: libtorch's storage holds a clone of the tensor's owner in its
//!   `DataPtr` context. libtorch calls the context's deleter exactly once, when it frees the
//!   storage: after the returned tensor and every view, shallow clone and DLPack export that
//!   libtorch made of it are gone (the tests count it). On CUDA the deleter does not drop
//!   the owner at once: it records an event on the stream the tensor was handed to and keeps
//!   the owner until that work has finished (`tensorbridge_cuda::retire_on_raw`; released by
//!   [`tensorbridge_cuda::reclaim`], which [`export`] and cudarc views call), as
//!   libtorch's caching allocator does with its own blocks. The deleter never unwinds into
//!   libtorch (a panicking owner aborts the process). A refused or failed conversion keeps
//!   no clone.
//! - Both directions compose: a tensor that goes to tch and back is owned by a reference to
//!   a libtorch storage that holds the original owner.
//!
//! # Soundness
//! - The shim catches every C++ exception: libtorch failures are [`Error::Torch`], never an
//!   unwind through Rust frames.
//! - [`import`] is `unsafe`: tch's safe `resize_` (and `out=` operations, which resize
//!   their output) can move a storage to new memory and free the old memory, which a
//!   [`Tensor`] describes by address. The caller promises that nothing resizes the storage
//!   of an imported tensor while the import lives. Rebinding the tch tensor (`set_`,
//!   `set_data`, `set_source_tensor_`) is harmless: it makes the tch tensor point at another
//!   storage and leaves the import's reference to the old one alone. Storages [`export`] made cannot be resized at all.
//! - [`import`] reads the tch tensor's sizes and strides where libtorch keeps them, so its
//!   caller also promises that no other thread changes that tensor's metadata or storage
//!   during the call. Borrowing the tensor does not guarantee it: `tch::Tensor` is `Send`
//!   and a `shallow_clone` (the same `TensorImpl`) can be resized or rebound on another
//!   thread through safe tch code.
//! - tch's safe API lets two shallow clones of one storage live on two threads, and write
//!   through one while the other reads: tch does not prevent data races on tensor memory.
//!   [`import`] and [`export`] make the same promise on the same terms: a [`Tensor`] shared with
//!   libtorch is another alias of memory tch code may write. Reading it through a core host
//!   view while safe tch code writes to it on another thread is a race, exactly as between
//!   two tch tensors; keep such work on one thread, or ordered.
//! - **Safe code never writes under a live shared borrow.** libtorch has no read-only or
//!   copy-on-write tensors, and tch's in-place operations (`fill_`, `add_`) are safe: a
//!   tch tensor over a shared [`Tensor`]'s memory would let safe code change the bytes under
//!   a live `&[T]` slice or host view of it (or of a clone), which Rust's aliasing rules
//!   forbid even on one thread. So the safe export, [`export_exclusive`], takes a
//!   [`tensorbridge_core::ExclusiveTensor`] (the only holder of its owner, borrowed by nothing),
//!   which moves into libtorch's storage; [`export`] and [`export_with`] take a shared
//!   `&Tensor` and are `unsafe`, their caller promising that no Rust view reads the memory
//!   while libtorch writes it.
//! - Read-only tensors have no libtorch equivalent: [`export`] refuses them, and accepting
//!   them is the `unsafe` [`ExportOptions::allow_read_only`], whose caller promises that
//!   nothing writes through the result.
//! - Streams: libtorch's current streams are its default stream (the legacy one) or streams
//!   of its pool, which it never destroys, all in the device's primary context; so the
//!   readiness [`import`] attaches, and the hand-off [`export`] makes, name live streams.
//!   tch has no stream API; C++ or Python code in the same process that makes an external
//!   stream current (`torch.cuda.ExternalStream`) must keep it alive while tensors made
//!   meanwhile are in use, as libtorch itself requires. An external stream that is the
//!   per-thread sentinel (`0x2`) names another stream on every thread: [`import`] records
//!   an event on it instead, and the deleter waits on the legacy stream.
//!
//! # Limitations
//! - Dtypes ([`ScalarType`] has the table): every libtorch scalar type with a DLPack code,
//!   in both directions; `Float4_e2m1fn_x2` is the core's `float4_e2m1fn` with 2 lanes (one
//!   byte). Quantized and `Bits*` types are refused on the way in, sub-byte dtypes (packed
//!   or padded fp6/fp4) and fp8 formats libtorch lacks on the way out. tch 0.24's `Kind` has
//!   no `UInt16`/`UInt32`/`UInt64`, `Float8_e8m0fnu` or `Float4_e2m1fn_x2`: for such
//!   tensors tch's `kind()` panics and `f_kind()` returns an error; the tensors themselves
//!   work.
//! - Devices: CPU and CUDA from tch; to tch also pinned host memory (as a CPU tensor) and
//!   managed memory (as a CUDA tensor of its ordinal). No ROCm, MPS or other backends.
//! - Layouts: strided tensors only (no sparse or MKL-DNN), without a pending conjugate or
//!   negative bit (call `resolve_conj()`/`resolve_neg()`). libtorch has no negative strides:
//!   tensors with one on a dimension of more than one element are refused, not copied; on
//!   dimensions that reach no memory (size 1, or a tensor without elements) the stride is
//!   passed as its absolute value. The byte offset is folded into the data pointer
//!   on the way to tch (storage offset 0); the way back reports libtorch's storage offset
//!   as the byte offset.
//! - Tensors made by [`export`] have fixed-size storage: libtorch refuses to resize them in
//!   place (as for tch's `from_blob`).
//! - A tch tensor that requires grad is shared as plain memory: writes through the core
//!   tensor are invisible to autograd.
//! - Build: the crate links libtorch from the managed Python environment (`LIBTORCH`, see
//!   `cargo xtask`), and its build script gives every target of this package an rpath to
//!   it. Other packages whose binaries link this crate need the same link arguments; the
//!   build script exports the library directory to them as `DEP_TENSORBRIDGE_TCH_LIBTORCH_LIB`.

#![cfg_attr(docsrs, feature(doc_cfg))]

mod dtype;
mod error;
mod export;
mod ffi;
mod import;
#[cfg(test)]
mod libtorch_dlpack;

pub use dtype::{dtype_of_kind, kind_of_dtype};
pub use error::Error;
pub use export::{ExportOptions, export, export_exclusive, export_with};
pub use ffi::{ScalarType, TorchDevice, TorchDeviceType, TorchLayout};
pub use import::{import, with_current_stream};

/// The tch this crate is built against, for callers who want the same version.
pub use tch;

// For the docs' links.
#[cfg(doc)]
use tensorbridge_core::{Ready, Tensor};
