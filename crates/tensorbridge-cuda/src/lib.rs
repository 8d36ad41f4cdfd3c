//! tensorbridge's CUDA driver layer: the one place in the workspace that talks to the CUDA
//! driver. It orders CUDA streams for tensors of any origin on the GPU (never blocking the
//! host), keeps memory alive until the device is done with it, and asks the driver what an
//! address is. The cudarc, tch and Python adapters all use it; it depends only on the core and
//! on cudarc's driver bindings, whose `CudaContext` and `CudaStream` are the currency of Rust
//! CUDA code (and on libc, for the shared-memory files of [`ipc`], which is Linux only).
//!
//! | what | call | host blocked? |
//! |---|---|---|
//! | order a stream after a tensor's producer | [`make_ready_on`] (cudarc stream), `unsafe` [`make_ready_on_raw`] (raw handle) | no |
//! | the same, and a tensor ready on that stream | [`handoff`], `unsafe` [`handoff_raw`]; for a borrowed tensor, the readiness: [`handoff_ready`] | no |
//! | order one stream after another's work so far | [`join`], `unsafe` [`join_raw`] | no |
//! | where data produced on a cudarc stream is ready | [`ready_on`] | no |
//! | an event as a tensor's readiness | [`CudaSignal::record`], `unsafe` [`CudaSignal::record_raw`], [`record_ready`]; for a borrowed tensor, [`settle`] | no |
//! | wait on the host | [`synchronize`], [`wait_ready`] (borrowed), [`CudaSignal::synchronize`] | yes |
//! | keep owners until a stream's work is done, then release them (a reaper thread, asleep until the device is done) | [`retire_on`], [`retire_all_on`] (many owners, one event), `unsafe` [`retire_on_raw`], [`retire_all_on_raw`]; [`reclaim`] releases what is done now | no |
//! | raw address -> allocation | [`inspect`], [`check_span`], [`check_span_with`] | no |
//! | copies: device memory of its own, a tensor's bytes copied out after its readiness | [`copy::DeviceBuffer`], `unsafe` [`copy::to_host`], [`copy::on_device`] | `to_host`: yes |
//! | contexts | [`primary_context`], [`current_device`], [`ContextGuard`], [`driver_present`] | no |
//! | graph capture | [`capture_status`] | no |
//! | stream names | [`stream_of`], [`stream_from_raw`], [`raw_stream`] | no |
//! | a foreign stream (PyTorch's, CuPy's) as a cudarc stream, for a scope, as long as it lives ([`StreamLife`]) | `unsafe` [`with_stream_raw`] | no |
//! | a tensor shared with another process of this machine (Linux) | [`ipc::export`], [`ipc::import`], `unsafe` [`ipc::import_raw`] | no |
//!
//! ```no_run
//! use std::sync::Arc;
//! # fn demo(tensor: &tensorbridge_core::Tensor, stream: &Arc<cudarc::driver::CudaStream>)
//! #     -> Result<(), tensorbridge_cuda::Error> {
//! // `tensor` came from anywhere (PyTorch, CuPy, a C library), with its producer's readiness.
//! // Work enqueued on `stream` after this line sees the producer's writes; the host is free.
//! tensorbridge_cuda::make_ready_on(tensor, stream)?;
//! // Or: the same tensor, ready on `stream` (a pooled event that keeps `stream` alive).
//! let on_stream = tensorbridge_cuda::handoff(tensor, stream)?;
//! # Ok(()) }
//! ```
//!
//! Functions that only order or inspect take a `&Tensor` or a borrowed
//! [`TensorRef`](tensorbridge_core::TensorRef) (`tensor.as_ref()`, or an adapter's argument pinned
//! for one call): they need no owner. Those that return a tensor ([`handoff`],
//! [`record_ready`], [`synchronize`]) take a `&Tensor`; their borrowed forms return what
//! they would attach ([`handoff_ready`], [`settle`]) or nothing ([`wait_ready`]).
//!
//! # The stream model
//! A core [`Tensor`] carries a [`Ready`]: `Now` (nothing pending), `Stream(s)` (ready once the
//! work enqueued on `s` so far has run) or `Signal` (an event, this crate's [`CudaSignal`]).
//! A consumer that will use the data on stream `c` asks for it there: this crate records a
//! pooled `CU_EVENT_DISABLE_TIMING` event on the producer and makes `c` wait on it
//! (`cuStreamWaitEvent`), or does nothing when producer and consumer are one stream. The host
//! waits only in [`synchronize`] and [`CudaSignal::synchronize`].
//!
//! Where a stream is: a raw handle names its own stream, of whichever primary context (the
//! runtime API's, which PyTorch, CuPy and JAX use) it belongs to (`cuStreamGetCtx`); a handle
//! of another context is refused ([`Error::ForeignContext`]: use a cudarc stream of that
//! context). The default streams `0x1` (legacy) and `0x2` (per-thread) are those of the
//! tensor's device's primary context; pinned and managed memory carry ordinal 0 whatever GPU
//! works on them, so for them a default stream means the calling thread's current device
//! ([`current_device`]) and is refused when no context is current
//! ([`Error::UnknownStreamDevice`]). Cross-device hand-offs (a producer on one GPU, a
//! consumer stream on another) are events of the producer's device waited on by the
//! consumer's stream.
//!
//! # CUDA graph capture
//! Every hand-off is legal inside stream capture (`torch.cuda.graph`,
//! `CudaStream::begin_capture`): it queries no event, never waits on the host, and records
//! the ordering on the capturing stream.
//! - Producer and consumer on one stream: nothing is enqueued. Streams of one capture: an
//!   event and a wait, which the capture turns into graph edges.
//! - A producer outside the capture (data made before it): the capturing consumer waits with
//!   `CU_EVENT_WAIT_EXTERNAL` on a dedicated event recorded on the producer now, which the
//!   graph keeps alive; every replay waits (on the device) for that work, which has finished
//!   after the first.
//! - A producer inside a capture and a consumer outside it (or in another capture), a signal
//!   recorded in a capture waited on elsewhere, the legacy default stream while a stream it
//!   synchronises with is captured, and host waits for captured work: refused with
//!   [`Error::CaptureMismatch`], [`Error::LegacyDuringCapture`] or
//!   [`Error::HostWaitInCapture`], before anything is enqueued, so the capture stays valid.
//! - [`retire_on`] on a capturing stream keeps the owner as long as the graph (a CUDA user
//!   object the graph retains), released soon after the graph and its executable
//!   instances are destroyed.
//! - Event queries and host waits for retired owners ([`reclaim`], the reaper threads) run in
//!   the relaxed capture mode, so a capture in progress on any thread is not disturbed.
//!
//! Keeping a graph's inputs alive while it may be replayed is the caller's business, as in
//! PyTorch: a tensor handed to a captured kernel must outlive the graph's replays (views and
//! retired owners of this crate and the cudarc adapter do keep theirs).
//!
//! # Borrowed streams: kernels on a framework's stream
//! A kernel that reads and writes a framework's tensors in place is best run on that
//! framework's current stream ([`with_stream_raw`] makes it a cudarc stream for a scope):
//! then nothing needs ordering at all, in either direction, because the framework's earlier
//! work and its later reads are on the same stream. Inputs from other streams are ordered
//! before it with [`make_ready_on`] (the cudarc adapter's views do this), and a framework
//! whose stream is not the kernel's is made to wait for the kernel's writes with [`join`].
//! cudarc's `wrap_borrowed_stream` does not keep the stream alive, and an `Arc` can escape any
//! scope, so [`with_stream_raw`] is told how long the stream lives ([`StreamLife`]): forever
//! (default streams, PyTorch's pool streams: lent as they are), as long as an owner (a CuPy
//! `Stream`: lent, and the owner kept while any clone of the wrapper lives), or for the call
//! only (`torch.cuda.ExternalStream`: the closure gets a stream of this crate, never
//! destroyed, forked from the caller's and joined back to it with events, so no clone ever
//! names the caller's stream).
//!
//! # Contexts: the caller's state is left alone
//! The runtime API (and so every Python framework) reads "the current device" from the
//! calling thread's current driver context. Every public function of this crate leaves that
//! context exactly as it found it: calls that need a context bind it for their own duration
//! and put the caller's back (none, if there was none). cudarc does not do this (its calls
//! make their context current and leave it so); [`ContextGuard`] restores the caller's
//! context around code that calls cudarc directly.
//!
//! # Raw stream handles: the `_raw` suffix
//! The core's [`Stream`] follows the raw-pointer model: safe to make from any number,
//! `unsafe` to trust. The driver reports a live handle of another context as
//! `CUDA_ERROR_INVALID_HANDLE`, but a number that was never a stream, or a destroyed stream,
//! is undefined behaviour in the driver. So every function that hands a raw stream to the
//! driver is `unsafe`, named with the suffix `_raw`, and its caller vouches that the stream
//! is live (for the call, or as long as the result names it). Each has a safe counterpart
//! with the short name that takes a cudarc stream, live by construction. Functions that use
//! only a tensor's own readiness ([`record_ready`], [`synchronize`]) are safe: whoever
//! attached that readiness ([`Tensor::with_ready`], `unsafe`) vouched for its streams.
//!
//! ```compile_fail,E0133
//! # fn demo(tensor: &tensorbridge_core::Tensor) -> Result<(), tensorbridge_cuda::Error> {
//! use tensorbridge_core::{Stream, StreamHandle};
//! let made_up = Stream::Handle(StreamHandle::new(0xdead).unwrap()); // fine: a number
//! let handed = tensorbridge_cuda::handoff_raw(tensor, made_up)?; // refused: the driver trusts it
//! # Ok(()) }
//! ```
//!
//! # No driver
//! Without libcuda every function that needs the driver returns [`Error::NoDriver`]
//! ([`driver_present`] is checked first: cudarc panics instead), so CPU-only machines get an
//! error, never a panic.
//!
//! # Limitations
//! - A [`Ready::Stream`] names a stream of the tensor's device's primary context. Managed and
//!   pinned tensors carry ordinal 0 by DLPack's convention, so their producer streams are
//!   taken to be device 0's.
//! - [`Stream::PerThreadDefault`] names the calling thread's per-thread stream: a tensor
//!   whose readiness names it must be handed off on the thread that produced it, which
//!   whoever attached that readiness vouched for ([`Tensor::with_ready`], obligation 3). This
//!   crate records an event instead whenever it meets one on a cudarc stream, and its signals
//!   never name it.
//! - Retired owners are released by a thread per stream with pending owners (at most 16;
//!   more streams share them, which can only delay a release), asleep until the device is
//!   done; owners kept with a CUDA graph by a thread the graph's destruction wakes. The
//!   keepers of escaped borrowed-stream wrappers ([`with_stream_raw`]) are released by the
//!   next [`reclaim`] or [`with_stream_raw`].

#![cfg_attr(docsrs, feature(doc_cfg))]

// The modules, bottom-up: each uses only those above it in this list (cudarc's sys / result /
// safe split is the model). `raw` is the only one that calls the driver's `cu*` functions.
// - types:    MemoryType, CaptureStatus, DeviceUuid, raw stream handles <-> core streams; no
//             driver call
// - release:  releases in flight on the layer's own threads, which `reclaim` may wait for
// - error:    the one error type
// - raw:      libcuda's presence and initialisation, checked 1:1 driver calls (`unsafe fn`s)
// - context:  primary contexts, binding and restoring the caller's, the thread's capture mode
// - event:    pooled events and the two ways to wait on one
// - capture:  capture status, the capture rules (`plan_wait`, pure), owners kept with graphs
// - pointer:  what the driver knows of an address
// - handoff:  CudaSignal, make_ready_on*, handoff*, join*, record_ready, synchronize
// - retire:   owners kept until a stream's work is done, and the reaper that releases them
// - scope:    a foreign stream as a cudarc stream for a scope
// - copy:     device memory of its own, a tensor's bytes copied out after its readiness
// - reclaim:  `reclaim`, what the layer keeps released now, from the calling thread
// - ipc:      a tensor shared with another process (Linux): on the layers above, its driver
//             calls through `raw`, its events from `event`'s pool, its ordering through
//             `handoff` and `capture`; nothing below names it
// - lib.rs:   the re-exports
// `tests/it/layers.rs` checks both rules: only raw.rs names `sys::cu*`, and no module uses
// one below it in this list.
mod capture;
mod context;
pub mod copy;
mod error;
mod event;
mod handoff;
#[cfg(target_os = "linux")]
#[cfg_attr(docsrs, doc(cfg(target_os = "linux")))]
pub mod ipc;
mod pointer;
mod raw;
mod reclaim;
mod release;
mod retire;
mod scope;
mod types;

pub use capture::capture_status;
pub use context::{ContextGuard, current_device, primary_context};
pub use error::Error;
pub use handoff::{
    CudaSignal, handoff, handoff_raw, handoff_ready, join, join_raw, make_ready_on,
    make_ready_on_raw, ready_on, record_ready, settle, synchronize, wait_ready,
};
pub use pointer::{PointerInfo, check_span, check_span_with, inspect};
pub use raw::driver_present;
pub use reclaim::reclaim;
pub use retire::{retire_all_on, retire_all_on_raw, retire_on, retire_on_raw};
pub use scope::{StreamLife, with_stream_raw};
pub use types::{CaptureStatus, MemoryType, raw_stream, stream_from_raw, stream_of};

// Thread safety of the public types, checked at compile time:
// - `CudaSignal`: a CUDA event (`Event`'s `unsafe impl`s in `event.rs` say why events may be
//   recorded, waited on and destroyed from any thread: the driver API is thread-safe for
//   them, and the context is made current on the calling thread first), the stream names
//   (plain values) and the `Arc<CudaStream>` it keeps alive (cudarc's, Send + Sync).
// - `PointerInfo`, `MemoryType`, `Error`: plain data.
// - `ContextGuard` is deliberately neither: it restores the thread it was made on.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<CudaSignal>();
    assert_send_sync::<PointerInfo>();
    assert_send_sync::<MemoryType>();
    assert_send_sync::<Error>();
};

// For the docs' links.
#[cfg(doc)]
use tensorbridge_core::{Ready, Stream, Tensor};
