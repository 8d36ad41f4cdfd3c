//! The tensorbridge core: a validated, zero-copy description of tensor memory that someone
//! else may own, and the shared model every adapter converts to and from.
//!
//! Adapter crates (DLPack, the CUDA Array Interface, cudarc, libtorch, Python, ndarray,
//! candle, burn) each convert
//! one foreign representation into a [`Tensor`] and back; any pair of formats therefore
//! converts through this crate. The core itself depends on no CUDA, libtorch or Python
//! library.
//!
//! # The model
//! - [`DType`]: every DLPack type code (ints, uints, floats, bfloat16, complex, bool, opaque,
//!   the fp8/fp6/fp4 family) with bits and lanes; parsed from and printed as the names users
//!   type (`"float32"`, `"bfloat16"`, `"float8_e4m3fn"`).
//! - [`Device`]: every DLPack device type with its ordinal.
//! - [`Layout`]: shape, strides **in elements** (negative and zero allowed), byte offset, and
//!   the questions consumers ask (contiguity, density, span, [`Constraint`]s).
//! - [`Access`], [`Ready`] (where data becomes ready: now, a producer [`Stream`], or an
//!   adapter's [`ReadySignal`]) and the keep-alive [`Owner`].
//!
//! # The trust boundary
//! Foreign descriptors arrive as a [`RawTensor`] (raw codes, borrowed shape and strides). Its
//! one fallible conversion, [`RawTensor::validate`], checks rank agreement, overflow-free
//! arithmetic, null data only when empty, alignment and the address span, and yields a
//! [`Descriptor`]. [`Tensor::from_descriptor`] (the only constructor that trusts a pointer,
//! hence `unsafe`) attaches the owner. After that, nothing can fail.
//!
//! Readiness crosses the same boundary. A [`Ready`], and the [`Stream`]s and
//! [`StreamHandle`]s it names, is a plain value that safe code may make from any number, like
//! a raw pointer; trusting it is `unsafe`. [`Tensor::with_ready`] attaches it, and its caller
//! vouches that it is true (host views need [`Ready::Now`]) and that every stream it names is
//! live (CUDA-aware adapters hand those streams to the driver from safe functions).
//! [`ReadySignal::enqueue_wait`], which takes a consumer stream, is `unsafe` for the same
//! reason.
//!
//! ```
//! use tensorbridge_core::{Constraint, DType, Tensor};
//!
//! let t = Tensor::from_vec((0..6).map(|i| i as f32).collect(), &[2, 3])?;
//! assert_eq!(t.dtype(), "float32".parse::<DType>()?);
//! assert!(t.layout().is_c_contiguous());
//! t.layout().check(Constraint::RowMajor)?;
//! let view = t.host_view::<f32>()?;
//! assert_eq!(view.get(&[1, 2])?, 5.0);
//! # Ok::<(), tensorbridge_core::Error>(())
//! ```
//!
//! # Entry points of every adapter
//! One scheme in every crate: `import` brings a foreign tensor into the core (a [`Tensor`]),
//! `export` hands a [`Tensor`] out as a foreign one, and `view`/`lend` borrow for a scope.
//! Safe functions have the short names; a variant that trusts a raw handle (a pointer, a
//! stream integer) is `unsafe` and ends in `_raw`.
//!
//! | crate | into the core (`Tensor`) | out of the core | borrowed for a scope | trusts a raw handle |
//! |---|---|---|---|---|
//! | `tensorbridge-dlpack` | `import_versioned`, `import_legacy` | `export_versioned`, `export_legacy` | | the imports (`unsafe`: a raw managed-tensor pointer) |
//! | `tensorbridge-cai` | `CudaArrayInterface::import`, `ArrayInterface::import` | `CudaArrayInterface::export`, `ArrayInterface::export` | | |
//! | `tensorbridge-cudarc` | `import`, `import_shaped` | `try_into_slice` | `lend`, `lend_shaped`, `view`, `view_mut`, `KernelArgs` | `Lent::make_ready_on_raw`, `Lent::join_raw` |
//! | `tensorbridge-tch` | `import` | `export_exclusive` (an [`ExclusiveTensor`]), `export`, `export_with` (`unsafe`: a shared tensor, which safe tch code could write under a live view) | `with_current_stream` (libtorch's stream, for your kernel) | |
//! | `tensorbridge-pyo3` | `import`, `AnyTensor` | `export` (a `View`) | `kernel_call` (the arguments and their framework's stream, for your kernel) | `import_on_raw` (a raw stream integer) |
//! | `tensorbridge-ndarray` | `import` (an `Array`), `import_shared` (an `ArcArray`) | `view`, `view_mut` (`unsafe`), `try_into_array` | `lend`, `lend_mut`, `view_ref`, `view_mut_ref` | |
//! | `tensorbridge-burn` | `import` (burn's `Tensor<D, K>`), `import_primitive` (a `FlexTensor`) | `export`, `export_primitive` (copy-on-write), `export_exclusive`, `export_primitive_exclusive` (an [`ExclusiveTensor`], written in place) | | |
//! | `tensorbridge-candle` | `import` (`unsafe`: candle's in-place writes) | `export` (the candle tensor it came from), `export_copied` (a copy), `export_leaked` (CUDA, kept until exit) | `lend` (CPU, candle's storage lock held) | |
//! | `tensorbridge-cuda` (not an adapter) | | | | every `_raw` function: `handoff_raw`, `make_ready_on_raw`, `join_raw`, `CudaSignal::record_raw`, `wait_on_raw`, `retire_on_raw`, `with_stream_raw` |
//!
//! # Ownership
//! A [`Tensor`] holds an [`Owner`] (`Arc<dyn Any + Send + Sync>`). Cloning the tensor clones
//! the `Arc`; dropping the last clone drops the owner, which releases the memory exactly
//! once (a DLPack deleter, a Python reference, a `Vec`).
//!
//! Safe code never writes under a shared borrow: a writer (a mutable host view, an export to
//! a framework that writes in place) needs an [`ExclusiveTensor`], a tensor proven to be the
//! only holder of its owner ([`Tensor::into_exclusive`]); a shared [`Tensor`] gives writers
//! a copy-on-write or read-only export, or nothing without `unsafe`.
//!
//! # Threads
//! Every value type is `Send + Sync` (checked at compile time below, with the reason for
//! each): tensors are shared across threads by cloning, and the last clone may drop on any
//! thread, so owners must be `Send + Sync` too. The typed host views ([`HostView`],
//! [`HostViewMut`], [`Iter`]) are neither: they hold raw pointers into the memory and borrow
//! one tensor; make one per thread from a shared [`Tensor`].
//!
//! # Limitations
//! - Host views read through raw pointers and need `T: Element`; packed fp6/fp4 tensors have
//!   no typed view.
//! - The core does not synchronise devices: [`Ready`] records where data becomes ready and
//!   the CUDA-aware adapter orders streams.

#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod callback;
mod device;
mod dtype;
mod error;
mod layout;
mod stream;
mod tensor;
mod view;

pub use device::{Device, DeviceType};
pub use dtype::{DType, DTypeCode, Packing};
pub use error::Error;
pub use layout::{Constraint, Layout};
pub use stream::{
    Ready, ReadySignal, SignalError, Stream, StreamConvention, StreamHandle, StreamRequest,
    stream_from_wire, stream_to_wire,
};
pub use tensor::{Access, Descriptor, ExclusiveTensor, Owner, RawTensor, Tensor, TensorRef};
pub use view::{Bool8, Element, HostView, HostViewMut, Iter};

// Thread safety of the public types, checked at compile time. Why each one may cross and be
// shared between threads:
// - `DType`, `DTypeCode`, `Packing`, `Device`, `DeviceType`, `Access`, `Constraint`, `Stream`,
//   `StreamHandle`, `StreamRequest`, `StreamConvention`, `Bool8`: plain values (integers and
//   enums); a `StreamHandle` is a number that names a stream and is never dereferenced here.
// - `Layout`, `Descriptor`, `RawTensor`: plain data (inline or boxed integer vectors, borrowed
//   slices for `RawTensor`); an address is a `usize`, not a pointer, so sharing one shares
//   no access.
// - `Tensor`: a descriptor, an `Owner` (`Arc<dyn Any + Send + Sync>`, so dropping the last
//   clone on any thread is allowed by its type) and a `Ready` (its signal is
//   `Arc<dyn ReadySignal>`, and `ReadySignal: Send + Sync`). Access to the memory goes
//   through `unsafe` or checked views whose contracts cover concurrent use.
// - `ExclusiveTensor`: a `Tensor`; its mutable view needs `&mut self`, so sharing it
//   across threads shares only reads.
// - `Error`, `SignalError`: plain data and strings.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<DType>();
    assert_send_sync::<DTypeCode>();
    assert_send_sync::<Packing>();
    assert_send_sync::<Device>();
    assert_send_sync::<DeviceType>();
    assert_send_sync::<Access>();
    assert_send_sync::<Constraint>();
    assert_send_sync::<Stream>();
    assert_send_sync::<StreamHandle>();
    assert_send_sync::<StreamRequest>();
    assert_send_sync::<StreamConvention>();
    assert_send_sync::<Bool8>();
    assert_send_sync::<Layout>();
    assert_send_sync::<Descriptor>();
    assert_send_sync::<RawTensor<'static>>();
    assert_send_sync::<Tensor>();
    assert_send_sync::<ExclusiveTensor>();
    assert_send_sync::<TensorRef<'static>>();
    assert_send_sync::<Ready>();
    assert_send_sync::<Owner>();
    assert_send_sync::<Error>();
    assert_send_sync::<SignalError>();
};
