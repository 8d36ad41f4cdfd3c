//! ndarray arrays and views as tensorbridge [`Tensor`]s and back, without copies: any host
//! tensor (from DLPack, NumPy, PyTorch, JAX, libtorch, candle) becomes an [`ArrayView`] or
//! [`ArrayViewMut`] of any strides, negative ones included; an owned [`Array`] moves into a
//! tensor that any adapter hands on; a borrowed array or view is lent as a tensor for a scope.
//!
//! | direction | call | data | stream |
//! |---|---|---|---|
//! | host [`Tensor`] -> `ArrayView`, borrowed | [`view`], [`view_ref`] (a [`TensorRef`]) | zero-copy, every stride (negative, zero) | needs [`Ready::Now`](tensorbridge_core::Ready::Now): ndarray reads from the host at once |
//! | host [`Tensor`] -> `ArrayViewMut`, borrowed | `unsafe` [`view_mut`], [`view_mut_ref`] | zero-copy; layouts in which two elements share an address are refused | as above |
//! | `Array` -> [`Tensor`], owned | [`import`]; back with [`try_into_array`] | zero-copy, the array moves into the owner, read-write | ready now (host memory) |
//! | `ArcArray` -> [`Tensor`], shared | [`import_shared`] | zero-copy, read-only (the other clones may read it) | ready now |
//! | `&ArrayBase` -> tensor, lent for a scope | [`lend`] (read-only), [`lend_mut`] (read-write) | zero-copy | ready now |
//!
//! ```
//! use ndarray::{Array2, Ix2, s};
//!
//! // An array out to a tensor (zero-copy): hand it to DLPack, Python, libtorch...
//! let a = Array2::from_shape_fn((3, 4), |(i, j)| (10 * i + j) as f32);
//! let first = a.as_ptr() as usize;
//! let t = tensorbridge_ndarray::import(a.slice_move(s![..;-1, ..]))?; // rows reversed
//! assert_eq!(t.strides_elems(), [-4, 1]);
//! // ...and any host tensor back as a view, negative strides included.
//! let v = tensorbridge_ndarray::view::<f32, Ix2>(&t)?;
//! assert_eq!(v[[0, 1]], 21.0);
//! assert_eq!(v.as_ptr() as usize, first + 8 * 4); // element [0, 0] is the old row 2
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Strides
//! ndarray's `from_shape_ptr` takes only non-negative strides. A tensor with negative ones is
//! viewed the way rust-numpy views NumPy arrays: the view is built from the element at the
//! lowest address of each such dimension with the stride's magnitude, then that dimension is
//! reversed (`invert_axis`), which gives back the tensor's own strides and first element.
//! Zero strides (broadcasts) are allowed in read-only views and refused in writable ones.
//!
//! # Ownership
//! - **Views** ([`view`]) borrow the tensor, so its owner (a DLPack deleter, a Python
//!   object, a libtorch storage) outlives them; they never copy.
//! - **Owned** ([`import`]): the array moves into the tensor's owner and is dropped (its
//!   buffer freed, once) when the last clone of the tensor is dropped. [`try_into_array`]
//!   takes it back when no one else holds the tensor.
//! - **Shared** ([`import_shared`]): the owner is a clone of the `ArcArray`; the buffer is
//!   freed when the last clone of either is gone.
//! - **Lent** ([`lend`], [`lend_mut`]): the closure gets a [`Lent`] that borrows the array for
//!   the call. It does not dereference to its tensor: a [`Tensor`] is `'static` and cheap to
//!   clone, so a clone could outlive the borrow. It gives the [`Descriptor`], a
//!   [`TensorRef`] (whose host views cannot leave the closure), and the tensor itself only
//!   through the `unsafe` [`Lent::as_tensor`].
//!
//! # Soundness
//! No safe function writes under a shared borrow. [`view`] and [`view_ref`] are read-only;
//! the mutable views ([`view_mut`], [`view_mut_ref`]) are `unsafe`, since a [`Tensor`] is
//! cheap to clone and a borrow of one proves nothing about its clones; [`lend_mut`] borrows
//! the array exclusively for the closure; [`try_into_array`] gives the array back, writable,
//! only to the last holder of its owner (`Arc::try_unwrap`); [`import_shared`] is
//! read-only, since the `ArcArray`'s other clones read the buffer.
//!
//! # Limitations
//! - Host memory only (`cpu`, `cuda_host`, `rocm_host`): ndarray has no device arrays.
//! - Element types are the core's [`Element`]s (`i8`..`u64`, `f32`, `f64`, [`Bool8`]
//!   for DLPack `bool`, `f16`/`bf16` and complex with the core's `half` and `num-complex`
//!   features). ndarray's `bool` is not one: foreign memory may hold bytes other than 0 and 1.
//! - ndarray cannot own foreign memory: its storage traits are sealed, so a tensor from
//!   another owner is only ever viewed, never turned into an `Array` (upstream: ndarray
//!   0.17 has no storage type that holds a foreign owner; one was proposed, not merged).
//! - [`view_mut`] is `unsafe` for the reason the core's `host_view_mut` is: a [`Tensor`] is
//!   cheap to clone and cannot promise that nobody else reads or writes meanwhile.
//!
//! [`Bool8`]: tensorbridge_core::Bool8

#![cfg_attr(docsrs, feature(doc_cfg))]

mod error;
mod import;
mod view;

pub use error::{Error, ImportError};
pub use import::{Lent, import, import_shared, lend, lend_mut, try_into_array};
pub use view::{view, view_mut, view_mut_ref, view_ref};

#[cfg(doc)]
use ndarray::{Array, ArrayView, ArrayViewMut};
#[cfg(doc)]
use tensorbridge_core::{Descriptor, Element, Tensor, TensorRef};

// `Send + Sync`, checked at compile time: `Lent` holds a `Tensor` (Send + Sync, see the core) and a `PhantomData` of a
// borrow of the array's elements, which is Send/Sync exactly when a reference to them is.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Lent<'static, f32>>();
    assert_send_sync::<Error>();
};
