//! candle tensors as tensorbridge [`Tensor`]s and back: a candle tensor, on the CPU or on CUDA
//! (the `cuda` feature), goes out zero-copy with candle's stream carried as its readiness, so
//! it reaches Python frameworks, libtorch, DLPack consumers and your own kernels ordered on
//! the GPU; into candle goes what candle's public API can take without a copy, and everything
//! else through a function whose name says it copies, never silently.
//!
//! | direction | call | data | stream |
//! |---|---|---|---|
//! | candle `Tensor` -> [`Tensor`], owned | `unsafe` [`import`] (CPU, CUDA) | zero-copy: candle's storage, shape, strides and start offset; the candle tensor is the owner | CPU: ready now. CUDA: [`Ready::Stream`](tensorbridge_core::Ready::Stream) of candle's stream, or an event recorded on it when that is the per-thread default stream (candle's default) |
//! | candle CPU `Tensor` -> tensor, lent for a scope | [`lend`] (safe: candle's storage lock held) | zero-copy, read-only | ready now |
//! | [`Tensor`] -> candle, the tensor it came from | [`export`] | zero-copy: the original candle tensor | as it was |
//! | host [`Tensor`] -> candle (any device) | [`export_copied`] | **a copy**, C order, from any strides | ready now (candle copies to its device itself) |
//! | contiguous writable CUDA [`Tensor`] -> candle | [`export_leaked`] (`cuda`) | zero-copy; the memory and its owner **kept until the process exits**; read-only tensors refused (candle writes in place from safe code) | candle's stream waits on the GPU for the tensor's readiness |
//!
//! ```
//! use candle_core::{Device, Tensor};
//! let c = Tensor::arange(0f32, 12., &Device::Cpu)?.reshape((3, 4))?.narrow(1, 1, 2)?;
//! // SAFETY: no candle operation writes `c`'s storage in place while `t` is used.
//! let t = unsafe { tensorbridge_candle::import(&c) }?; // shares candle's memory
//! assert_eq!((t.shape(), t.strides_elems(), t.byte_offset()), (&[3i64, 2][..], &[4i64, 1][..], 4));
//! // ... hand `t` to DLPack, Python (tensorbridge_pyo3::export), libtorch, a kernel ...
//! assert_eq!(tensorbridge_candle::export(&t)?.id(), c.id()); // and back: the same tensor
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Ownership
//! - **Out of candle** ([`import`]): the owner is a clone of the candle tensor (an `Arc`), so
//!   candle's storage, CPU `Vec` or cudarc slice, lives until the last clone of the tensor
//!   and of the candle tensor is gone; candle frees it as it always does (a cudarc slice
//!   asynchronously, on candle's stream).
//! - **Lent** ([`lend`]): the storage's read lock is held for the closure, and the borrowed
//!   tensor cannot leave it.
//! - **Back into candle** ([`export`]): the candle tensor itself, another `Arc` clone.
//! - **Copied** ([`export_copied`]): candle owns the copy.
//! - **Leaked** ([`export_leaked`]): candle gets a cudarc slice over the foreign memory, and
//!   would free it when the storage dies; so the storage never dies (a clone of the candle
//!   tensor is forgotten) and the foreign owner is never released (a clone of the tensor is
//!   forgotten). Nothing is freed twice and nothing early; the memory stays until exit.
//!
//! # Soundness of the exports
//! A candle tensor is writable from safe code (`slice_set`, `const_set`, in-place custom
//! ops), so no export widens access: [`export`] hands back the candle tensor only for a
//! writable tensor (an unchanged import, whose `unsafe` [`import`] already promised that
//! candle's in-place writes race no reader), [`export_leaked`] refuses read-only tensors
//! before anything else (a JAX array or a read-only share would become writable), and
//! [`export_copied`] gives candle a copy it owns. A writable CUDA tensor's other holders see
//! candle's writes as device work, ordered by streams; CUDA device memory has no host view
//! for safe code to hold across them.
//!
//! # Safety of [`import`]
//! candle writes some storages in place from safe code (`const_set`, `slice_set`,
//! `scatter_set`, in-place custom ops, `Var::set`), under a lock that an imported tensor
//! cannot hold; so the import is `unsafe`, as `tensorbridge_tch::import` is: the caller
//! promises that no such write races a reader of the tensor. [`lend`] is the safe form for
//! host work: it holds the lock.
//!
//! # CUDA and candle's cudarc
//! candle-core 0.11 uses cudarc 0.19, the workspace's version, so candle's `CudaSlice`,
//! `CudaStream` and `CudaEvent` are the very types this crate names: no conversion between
//! two cudarc versions is needed, and none is done by reinterpreting one type as another.
//! Were the versions ever to differ, the bridge would be raw values only (the device pointer
//! and the `CUstream` handle, with the candle tensor held as the owner), which is all
//! [`import`] reads. candle's default CUDA device runs on the per-thread default stream
//! (`CudaDevice::new`); `CudaDevice::new_with_stream` gives it a stream of its own, which an
//! import then names directly.
//!
//! # Limitations, and the upstream changes that would lift them
//! - **Host memory cannot enter candle without a copy.** `CpuStorage` is an enum of `Vec<T>`
//!   (candle-core `cpu_backend/mod.rs`). Needed upstream: a CPU storage variant over foreign
//!   memory with a keep-alive owner, e.g. `CpuStorage::from_foreign(ptr, len, dtype, owner:
//!   Arc<dyn Any + Send + Sync>)`.
//! - **Foreign CUDA memory enters candle only leaked** ([`export_leaked`]). cudarc's
//!   `CudaStream::upgrade_device_ptr` makes an *owning* `CudaSlice` whose `Drop` frees the
//!   memory (`cuMemFreeAsync`), and `CudaStorage::wrap_cuda_slice` takes only such a slice.
//!   Needed upstream: in cudarc, an externally managed slice that does not free on drop and
//!   holds an owner instead (cudarc 0.19 has none, and `CudaSlice`'s fields are crate-private, so
//!   no such slice can be built outside cudarc); in candle, a `CudaStorage` constructor that takes
//!   one, e.g. `CudaStorage::from_foreign(ptr, len, dtype, device, owner)`.
//! - **Strided memory cannot enter candle.** `Tensor::from_storage` always builds contiguous
//!   strides (candle-core `tensor.rs`, `from_storage`), and `Layout`-taking constructors are
//!   private. Needed upstream: a public `Tensor::from_storage_with_layout(storage, Layout,
//!   ...)`.
//! - **candle cannot run on another framework's stream.** `CudaDevice::new` uses the
//!   per-thread default stream, `new_with_stream` a fresh one; the constructor that takes an
//!   existing stream, `from_context_and_stream`, is private (candle-core
//!   `cuda_backend/device.rs`). Needed upstream: a public `CudaDevice::from_stream(Arc<
//!   CudaStream>)`, with cudarc's `CudaContext::wrap_borrowed_stream` (0.19.10) for a stream
//!   someone else owns. Until then candle orders after others by GPU-side waits, which
//!   [`export_leaked`] enqueues.
//! - candle's fp6/fp4 dtypes (`F6E2M3`, `F6E3M2`, `F4`) are raw bytes in candle's own layout
//!   and are refused ([`Error::UnsupportedCandleDType`]); float8 tensors are imported but
//!   not copied back ([`export_copied`] copies the core's host-view element types).
//! - The `cuda` feature turns on candle-core's `cuda`, which compiles candle's kernels with
//!   nvcc at build time and builds cudarc with `dynamic-linking` (libcuda, cuBLAS, cuRAND and
//!   the CUDA runtime linked, not loaded at the first call): building needs a CUDA toolkit,
//!   and the binary (or extension module) the driver and those libraries to start. It takes
//!   over the workspace's `fallback-dynamic-loading`, so the rest of tensorbridge's CUDA
//!   crates link too in such a build, and work the same (the example extension's
//!   `candle-cuda` build is one). This crate's CUDA half still makes its few driver calls
//!   itself, on candle's cudarc, rather than through `tensorbridge-cuda`.
//! - Only candle's CPU and CUDA devices: Metal tensors are refused
//!   ([`Error::UnsupportedDevice`]).

#![cfg_attr(docsrs, feature(doc_cfg))]

// `Send + Sync`, checked at compile time: `Error` is plain data and strings, and candle's
// error type, which is `Send + Sync` itself.
// The `allow`: clippy reads the comments above a file's first item back to the top of the
// file, and takes the safety comment of the crate docs' example for this item's. Kept first
// so that no module (whose contents an `allow` would cover) is.
#[allow(clippy::unnecessary_safety_comment)]
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Error>();
};

#[cfg(feature = "cuda")]
mod cuda;
mod dtype;
mod error;
mod export;
mod import;

pub use dtype::{candle_dtype_of, dtype_of_candle};
pub use error::Error;
pub use export::{export, export_copied, export_leaked};
pub use import::{import, lend};

#[cfg(doc)]
use tensorbridge_core::Tensor;
