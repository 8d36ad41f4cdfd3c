//! burn's CPU backend, burn-flex, and tensorbridge [`Tensor`]s, both ways zero-copy: a burn
//! tensor reaches DLPack, Python frameworks, libtorch and ndarray without a copy, and any host
//! tensor (NumPy's, PyTorch's, an ndarray, a candle tensor) becomes a burn tensor over the
//! same memory, its owner kept by burn's byte storage.
//!
//! | direction | call | data | stream |
//! |---|---|---|---|
//! | burn `Tensor<D, K>` (Flex) -> [`Tensor`] | [`import`], [`import_primitive`] (a `FlexTensor`) | zero-copy, read-only: burn's shape, strides (negative ones included), start offset; a clone of the burn tensor is the owner | ready now (burn-flex runs on the host) |
//! | host [`Tensor`] -> burn `Tensor<D, K>` (Flex) | [`export`], [`export_primitive`] | zero-copy reads: burn's storage is the tensor's memory, through a byte controller that holds a clone of the tensor; copy-on-write: burn's in-place operations write a copy made at the first write | needs the tensor ready now |
//! | exclusive tensor ([`ExclusiveTensor`](tensorbridge_core::ExclusiveTensor)) -> burn `Tensor<D, K>` (Flex) | [`export_exclusive`], [`export_primitive_exclusive`] | zero-copy both ways: burn's in-place operations write a writable tensor's memory (read-only memory is copied first) | needs the tensor ready now |
//!
//! ```
//! use burn_tensor::{Int, Tensor as Burn};
//! let t = tensorbridge_core::Tensor::from_vec((0..6i64).collect(), &[2, 3])?;
//! let b: Burn<2, Int> = tensorbridge_burn::export(&t)?; // burn over the same memory
//! let back = tensorbridge_burn::import(b.clone().transpose())?; // and a transposed view back
//! assert_eq!((back.data_ptr(), back.strides_elems()), (t.data_ptr(), &[1i64, 3][..]));
//! assert_eq!(back.host_view::<i64>()?.get(&[2, 1])?, 5);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Ownership
//! - **Out of burn** ([`import`]): the owner is a clone of the burn tensor, sharing its
//!   `Arc<Bytes>`; the memory lives until the last clone of either is dropped. The tensor is
//!   read-only: burn-flex shares storage copy-on-write, so other burn tensors read it.
//! - **Into burn** ([`export`]): burn's `Bytes` are built on a controller (burn-std's
//!   `Bytes::from_controller`) that holds a clone of the tensor, so the tensor's owner is
//!   released once, when burn drops the last tensor sharing the bytes. burn-flex writes a
//!   storage in place only when one burn tensor holds it alone; the controller then hands out
//!   a private copy made at that first write (refused with `AccessError::WouldCopy` where
//!   burn forbids copies), or the tensor's memory itself only when the tensor is writable
//!   and was exported exclusive.
//!
//! # Soundness
//! Safe code never writes under a live shared borrow. A `&Tensor` may have clones, `&[T]`
//! slices, host views, ndarray views and exports reading the same bytes, so [`export`]
//! never lets burn write them: its storage is copy-on-write whatever the tensor's access.
//! [`export_exclusive`] takes an [`ExclusiveTensor`](tensorbridge_core::ExclusiveTensor), the
//! proof (`Tensor::into_exclusive`) that the tensor is the only holder of its owner and is
//! borrowed by nothing; it moves into burn's storage, which burn then writes alone.
//!
//! # Limitations
//! - **burn's GPU backends (CubeCL: CUDA, ROCm, wgpu, Metal) cannot take foreign memory or a
//!   foreign stream.** A `CubeTensor`'s handle comes only from CubeCL's memory manager, and
//!   CubeCL creates its CUDA streams itself; exporting one to a `Tensor` is possible (the
//!   device pointer from `ComputeClient::get_resource` and the strides), but not importing,
//!   and without a stream to order on, not safely for a consumer on another stream either.
//!   Needed upstream, in CubeCL: "register an external allocation (pointer, size, owner
//!   released when the handle dies)" and "run on this `CUstream` / wait on this event"
//!   (burn has no DLPack interop; these two are what it would be built on).
//! - **burn's libtorch backend** (`burn-tch`) wraps a `tch::Tensor` (`TchTensor::new`, the
//!   public `tensor` field), so `tensorbridge-tch` already converts its tensors, zero-copy.
//!   But burn-tch is deprecated in burn 0.23 and its last release, 0.22.1, requires tch 0.22
//!   (with `download-libtorch`), outside `tensorbridge-tch`'s 0.24 to 0.26; torch-sys allows
//!   one tch per build, so the two cannot be built together.
//! - burn-flex only (burn 0.23, a pre-release, whose versions are pinned exactly): booleans
//!   go out of burn but not into it (DLPack's `bool` byte may hold values other than 0 and
//!   1), quantized tensors not at all; host memory only.
//! - Views ([`import`]) are read-only; write through burn instead.

#![cfg_attr(docsrs, feature(doc_cfg))]

mod convert;
mod dtype;
mod error;

pub use convert::{
    export, export_exclusive, export_primitive, export_primitive_exclusive, import,
    import_primitive,
};
pub use dtype::{burn_dtype_of, dtype_of_burn};
pub use error::Error;

#[cfg(doc)]
use tensorbridge_core::Tensor;

// `Send + Sync`, checked at compile time: `Error` is plain data and strings.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Error>();
};
