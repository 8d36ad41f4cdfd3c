//! cudarc 0.19 buffers as tensorbridge [`Tensor`]s and back, without copies, and the place
//! where the workspace talks to the CUDA driver: GPU-side stream hand-off to cudarc streams
//! (safe) and to any raw stream handle, including streams other frameworks own (`unsafe`),
//! and pointer inspection. The tch and Python crates reuse both.
//!
//! | direction | call | data | stream |
//! |---|---|---|---|
//! | `&CudaSlice`, `&CudaView` -> tensor, borrowed for a scope | [`with_slice`], [`with_slice_shaped`] | zero-copy, read-only | the slice's stream waits for cudarc's pending writes; [`Ready::Stream`] of it; at the scope's end it waits for every view's stream |
//! | `&mut CudaSlice`, `&mut CudaViewMut` -> tensor, borrowed for a scope | the same | zero-copy, read-write | as above, after pending reads too |
//! | `CudaSlice` -> [`Tensor`], owned | [`into_tensor`], [`into_tensor_shaped`]; back with [`try_into_slice`] | zero-copy, the slice moves into the owner | as above |
//! | any CUDA [`Tensor`] -> cudarc launch argument | [`view`], `unsafe` [`view_mut`] | zero-copy | the view's stream waits (on the GPU) for the tensor's [`Ready`] |
//! | hand-off to a cudarc stream | [`handoff_to`], [`make_ready_on_stream`] | none | event recorded on the producer, `cuStreamWaitEvent` on the consumer; [`handoff_to`] then records a [`CudaSignal`] on the consumer (it keeps the stream alive); host never blocked |
//! | hand-off to a raw stream handle | `unsafe` [`handoff`], [`make_ready_on`] | none | the same; [`handoff`] gives [`Ready::Stream`] of the consumer, which the caller keeps alive |
//! | [`Ready::Stream`] -> [`Ready::Signal`] | [`record_ready`] | none | a pooled event recorded now ([`CudaSignal`]) |
//! | owner released after a raw stream's work | `unsafe` [`retire_on`], then [`reclaim`] | none | an event recorded on the stream; the owner drops once it completed |
//! | raw address -> allocation | [`inspect`], [`check_span`] | none | none |
//!
//! A slice whose stream is a per-thread default stream, or belongs to a non-primary context,
//! gets a [`CudaSignal`] recorded on that stream instead of a [`Ready::Stream`]: a raw handle
//! plus an ordinal names a stream of the device's primary context, and `0x2` names a
//! different stream on every host thread. Such a signal names no stream
//! ([`ReadySignal::producer_stream`](tensorbridge::ReadySignal::producer_stream) is `None`).
//!
//! ```no_run
//! use cudarc::driver::{CudaContext, LaunchConfig, PushKernelArg};
//! use tensorbridge_cudarc as tbc;
//!
//! # fn demo(kernel: &cudarc::driver::CudaFunction) -> Result<(), Box<dyn std::error::Error>> {
//! let ctx = CudaContext::new(0)?;
//! let producer = ctx.new_stream()?;
//! let consumer = ctx.new_stream()?;
//! let slice = producer.clone_htod(&[1.0f32, 2.0, 3.0, 4.0])?;
//!
//! let tensor = tbc::into_tensor(slice)?; // owned, Ready::Stream(producer)
//! // ... hand `tensor` to any adapter (tch, DLPack, Python) ...
//! let x = tbc::view::<f32>(&tensor, &consumer)?; // `consumer` now waits for `producer`
//! let n = x.numel() as u32;
//! // The launch is sound: `kernel` is `(const float* x, unsigned n)`, reads `x[0..n)` and
//! // runs on the view's stream.
//! unsafe { consumer.launch_builder(kernel).arg(&x).arg(&n).launch(LaunchConfig::for_num_elems(n))? };
//! # Ok(()) }
//! ```
//!
//! # Ownership
//! - **Borrowed** ([`with_slice`]): the closure gets a [`Borrowed`], which holds the borrow
//!   of the cudarc buffer and the tensor that describes it. It does not dereference to the
//!   tensor: a [`Tensor`] is `'static` and cheap to clone, so a clone would outlive the borrow
//!   and let safe code read freed memory. It hands out the
//!   [`Descriptor`](tensorbridge::Descriptor), views (borrowed from it, so they cannot leave
//!   the closure) and hand-off; the tensor itself only through the `unsafe`
//!   [`Borrowed::as_tensor`]. When the closure returns (or unwinds), the buffer's stream is
//!   made to wait (on the GPU) for the work enqueued on every stream a view was made for, and
//!   cudarc's read (write) event is recorded after that, so cudarc's own tracking orders the
//!   buffer's next write or free after every consumer. A scope, not a returned guard, so
//!   that `mem::forget` cannot skip this (the reason `std::thread::scope` is a closure).
//! - **Owned** ([`into_tensor`]): the `CudaSlice` moves into the tensor's owner. Dropping the
//!   last clone drops the slice, which cudarc frees asynchronously on its stream after the
//!   work it tracked. [`try_into_slice`] takes it back when no one else holds the tensor.
//! - **Views** ([`view`]) borrow the tensor, so its owner outlives them on the host; when a
//!   view is dropped, a clone of the owner is kept (a pooled event recorded on the view's
//!   stream) until the device has finished the work enqueued there so far, and released by
//!   the next [`view`] or [`reclaim`]. So memory is never freed under a running kernel,
//!   whatever the owner is (a DLPack deleter, a Python object, a cudarc slice). A view that
//!   is `mem::forget`-ten keeps its owner clone forever: a leak, never a use after free.
//!
//! # Soundness
//! cudarc can only enter foreign memory by pretending to own it:
//! `CudaStream::upgrade_device_ptr` makes an owning `CudaSlice`, whose `Drop` would free
//! memory cudarc never allocated, so users `leak()` it again after borrowing a view. PEERS.md
//! (dlpark's `interop/cudarc`) records why that is unsound: `leak()` drops the slice's events
//! that the borrowed `CudaView` still refers to, the slice waits on them and carries a stream
//! that is not the producer's, and `upgrade_device_ptr` itself `unwrap`s driver errors.
//!
//! [`TensorView`] owns nothing and pretends nothing. It holds the address of element 0 (a
//! `CUdeviceptr` field), a borrow of the [`Tensor`] (so the tensor's owner, which guarantees
//! the memory, outlives the view on the host), and the consumer stream. Its launch-argument
//! impl (`PushKernelArg<&TensorView>` for cudarc's `LaunchArgs`) pushes a pointer to that
//! field through cudarc's own impl for `&u64`, the same thing cudarc's impl for `&CudaView`
//! pushes, with the lifetime bound `'view: 'args` that keeps the field alive while the
//! builder holds it. No cudarc object is created over the memory, so no `Drop` frees it and no
//! event is torn down. Device-side lifetime is covered by the owner retention above, and
//! ordering by the wait enqueued when the view was made. Read-only tensors give only
//! read-only views; [`view_mut`] is `unsafe` because a `Tensor` is cheap to clone and cannot
//! promise exclusive access (the core's host views make the same choice), while
//! [`Borrowed::view_mut`] is safe (an exclusive cudarc borrow behind `&mut self`).
//! As with any cudarc launch, the launch itself is `unsafe`: the kernel's signature, bounds,
//! and use of the view's stream are the caller's promise.
//!
//! # Stream hand-off
//! All on the driver API ([`cudarc::driver::sys`]), so it works for any raw stream handle,
//! which cudarc's safe layer cannot adopt: a [`Ready::Stream`] producer gets a pooled
//! `CU_EVENT_DISABLE_TIMING` event recorded on it in the device's primary context, and the
//! consumer gets `cuStreamWaitEvent`; [`Stream::LegacyDefault`](tensorbridge::Stream) and
//! `PerThreadDefault` become `CU_STREAM_LEGACY` (`0x1`) and `CU_STREAM_PER_THREAD` (`0x2`).
//! The host blocks only in [`synchronize`] and [`CudaSignal::synchronize`] (and where
//! [`make_ready_on_stream`] must wait for another adapter's signal on a stream that signal
//! cannot be given). Driver errors
//! are [`Error::Driver`] (the call's name and its `CUresult`); without libcuda every such
//! function returns [`Error::NoDriver`] ([`driver_present`] is checked first: cudarc panics
//! instead).
//!
//! # Raw stream handles
//! The core's [`Stream`](tensorbridge::Stream) follows the raw-pointer model: safe to make
//! from any number, `unsafe` to trust. The driver reports a live handle of another context as
//! `CUDA_ERROR_INVALID_HANDLE`, but a number that was never a stream, or a destroyed stream,
//! is undefined behaviour in the driver, so every way a raw stream reaches it is `unsafe`:
//! - **Readiness**: the core's `unsafe` [`Tensor::with_ready`] (and the adapters' `unsafe`
//!   constructors) vouch that a tensor's [`Ready`] is true and that the streams it names are
//!   live streams of the tensor's device's primary context while a clone of the tensor names
//!   them, and that a per-thread default stream is used only on its own thread. This crate's
//!   functions that use only a tensor's own readiness ([`record_ready`], [`synchronize`],
//!   [`view`]) are therefore safe, and so are the readiness values it attaches itself: a
//!   slice's stream is kept alive by the slice (owned) or the [`Borrowed`] (borrowed), and a
//!   [`CudaSignal`] made by [`CudaSignal::record_on`] holds its stream.
//! - **Consumer and producer arguments**: functions that take a raw
//!   [`Stream`](tensorbridge::Stream) and hand it to the driver are `unsafe`, and the caller
//!   vouches that it is live for the call ([`make_ready_on`], [`CudaSignal::record`],
//!   [`CudaSignal::wait_on`], [`Borrowed::make_ready_on`], [`Borrowed::join`],
//!   [`retire_on`]), or, where the result names it, for as long as that result does
//!   ([`handoff`]). Each has a safe
//!   counterpart that takes a cudarc stream, live for the call by construction:
//!   [`make_ready_on_stream`], [`handoff_to`], [`CudaSignal::record_on`],
//!   [`CudaSignal::wait_on_stream`], [`Borrowed::make_ready_on_stream`],
//!   [`Borrowed::join_stream`].
//!
//! Raw handles should come from the framework that owns the stream (the tch and Python
//! adapters do this) and stay alive while tensors name them.
//!
//! ```compile_fail,E0133
//! # fn demo(tensor: &tensorbridge::Tensor) -> Result<(), tensorbridge_cudarc::Error> {
//! use tensorbridge::{Stream, StreamHandle};
//! let made_up = Stream::Handle(StreamHandle::new(0xdead).unwrap()); // fine: a number
//! let handed = tensorbridge_cudarc::handoff(tensor, made_up)?; // refused: the driver trusts it
//! # Ok(()) }
//! ```
//!
//! # Limitations
//! - Element types: `i8`..`i64`, `u8`..`u64`, `f32`, `f64`, `bool`, and `half::f16`/`bf16`
//!   with the `half` feature ([`CudaElement`]). Not `isize`/`usize` (their width is the
//!   target's), `i128`/`u128` (no DLPack code), nor cudarc's `f8`/`f4` types (their crates
//!   are not pinned in this workspace). A `bool` tensor from foreign code may hold bytes
//!   other than 0 and 1; kernels see them as the bytes they are.
//! - A view is for the stream it was made for: cudarc's `LaunchArgs` does not say which
//!   stream it launches on, so a view launched elsewhere is unordered (the `unsafe` launch's
//!   business). Views are not cudarc `DevicePtr`s, so cudarc's memcpy functions do not take
//!   them; copy through a kernel, or through the source slice.
//! - A [`Ready::Stream`] names a stream of the tensor's device's primary context (the
//!   runtime API's context, which PyTorch, CuPy and JAX use). Managed and pinned tensors carry
//!   ordinal 0, so their producer streams are taken to be device 0's.
//! - [`Stream::PerThreadDefault`](tensorbridge::Stream) names the calling thread's
//!   per-thread stream: a tensor whose [`Ready`] is `Stream(PerThreadDefault)` must be
//!   handed off on the thread that produced it, which whoever attached that readiness vouched
//!   for ([`Tensor::with_ready`], obligation 3). This crate records an event instead when it
//!   meets one on a cudarc slice or view, and its signals never name it.
//! - Driver calls make the context they need current on the calling thread and leave it so
//!   (as cudarc does).
//! - Owners kept for dropped views are released lazily, by the next [`view`],
//!   [`try_into_slice`] or [`reclaim`].

#![cfg_attr(docsrs, feature(doc_cfg))]

mod driver;
mod dtype;
mod error;
mod handoff;
mod pointer;
mod slice;
mod view;

pub use driver::{
    driver_present, primary_context, raw_stream, reclaim, retire_on, stream_from_raw, stream_of,
};
pub use dtype::CudaElement;
pub use error::{Error, IntoTensorError};
pub use handoff::{
    CudaSignal, handoff, handoff_to, make_ready_on, make_ready_on_stream, record_ready, synchronize,
};
pub use pointer::{MemoryType, PointerInfo, check_span, check_span_with, inspect};
pub use slice::{
    Borrowed, Source, check_fits, into_tensor, into_tensor_shaped, try_into_slice, with_slice,
    with_slice_shaped,
};
pub use view::{TensorView, TensorViewMut, view, view_mut};

// Thread safety of the public types, checked at compile time:
// - `CudaSignal`: a CUDA event (`Event`'s `unsafe impl`s in `driver.rs` say why events may be
//   recorded, waited on and destroyed from any thread: the driver API is thread-safe for
//   them, and the context is made current on the calling thread first), the stream names
//   (plain values) and the `Arc<CudaStream>` it keeps alive (cudarc's, Send + Sync).
// - `Borrowed<S>`: a core `Tensor`, the lent slice (`S: Source`, Send + Sync when its
//   element type is), the stream, and the consumers under a `Mutex`.
// - `TensorView`, `TensorViewMut`: a device address (an integer), a borrowed `Tensor`, the
//   stream and a guard; they cross threads with the borrow. (Kernels that use them are
//   ordered by their stream, not by the host thread.)
// - `PointerInfo`, `MemoryType`, `Error`: plain data. `IntoTensorError<S>` carries the slice
//   back, so it is as thread-safe as the slice.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<CudaSignal>();
    assert_send_sync::<Borrowed<&'static cudarc::driver::CudaSlice<f32>>>();
    assert_send_sync::<TensorView<'static, f32>>();
    assert_send_sync::<TensorViewMut<'static, f32>>();
    assert_send_sync::<PointerInfo>();
    assert_send_sync::<MemoryType>();
    assert_send_sync::<Error>();
    assert_send_sync::<IntoTensorError<cudarc::driver::CudaSlice<f32>>>();
};

// For the docs' links.
#[cfg(doc)]
use tensorbridge::{Ready, Tensor};
