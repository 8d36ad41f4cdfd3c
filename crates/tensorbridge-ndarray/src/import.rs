//! ndarray -> [`Tensor`]: owned ([`import`]), shared ([`import_shared`]) and lent for a
//! scope ([`lend`], [`lend_mut`]).

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use ndarray::{ArcArray, Array, ArrayBase, Data, DataMut, Dimension, RawData};
use tensorbridge_core::{Access, Descriptor, Element, RawTensor, Tensor, TensorRef};

use crate::{Error, ImportError};

/// The descriptor of an array's elements: `first` is the address of its logical element 0
/// (`as_ptr`), the shape and strides its own (strides in elements, signed).
fn describe<T: Element>(
    first: *const T,
    shape: &[usize],
    strides: &[isize],
    access: Access,
) -> Result<Descriptor, Error> {
    let overflow = |what| tensorbridge_core::Error::Overflow { what };
    let shape = shape
        .iter()
        .map(|&n| i64::try_from(n).map_err(|_| overflow("extent")))
        .collect::<Result<Vec<i64>, _>>()?;
    let strides = strides
        .iter()
        .map(|&s| i64::try_from(s).map_err(|_| overflow("stride")))
        .collect::<Result<Vec<i64>, _>>()?;
    let raw = RawTensor {
        strides: Some(&strides),
        access,
        ..RawTensor::host(first as usize, T::DTYPE, &shape)
    };
    Ok(raw.validate()?)
}

/// The owner of an imported array: the array itself.
struct ArrayOwner<T, D>(Array<T, D>);

/// Moves an array into a tensor that owns it: zero-copy, read-write, the array's own shape
/// and strides (negative ones included), dtype from `T`, on the host, ready now. The array
/// (its buffer) is dropped when the last clone of the tensor is.
///
/// ```
/// use ndarray::array;
/// let a = array![[1.0f64, 2.0], [3.0, 4.0]];
/// let ptr = a.as_ptr() as usize;
/// let t = tensorbridge_ndarray::import(a.reversed_axes())?; // a transpose: no copy
/// assert_eq!((t.data_ptr(), t.strides_elems()), (ptr, &[1i64, 2][..]));
/// # Ok::<(), tensorbridge_ndarray::Error>(())
/// ```
///
/// Fails only where the shape or strides do not fit the core's 64-bit arithmetic, giving the
/// array back ([`ImportError::into_inner`]).
// The error carries the array back (a failed consuming conversion returns its input).
#[allow(clippy::result_large_err)]
pub fn import<T: Element, D: Dimension + 'static>(
    array: Array<T, D>,
) -> Result<Tensor, ImportError<Array<T, D>>> {
    let desc = match describe(
        array.as_ptr(),
        array.shape(),
        array.strides(),
        Access::ReadWrite,
    ) {
        Ok(desc) => desc,
        Err(e) => return Err(ImportError::new(e, array)),
    };
    // SAFETY:
    // - 1: the descriptor is the array's own elements (its pointer to element 0, its shape and
    //   strides), inside its buffer, on the host; the buffer is heap memory that moving the
    //   array does not move, readable and writable, and the owner is the array, so it stays
    //   allocated until the last clone of the owner is dropped;
    // - 2: after the move nothing reaches the array but this tensor's owner, which never
    //   touches the elements; host views are then the only readers and writers and carry
    //   their own obligations.
    Ok(unsafe { Tensor::from_descriptor(desc, Arc::new(ArrayOwner(array))) })
}

/// Takes the array back out of a tensor made by [`import`], when this is the last clone of
/// it (and of its owner) and `T`, `D` are its element and dimension types; the tensor comes
/// back otherwise. The array is the one imported, with its own shape and strides, and the
/// values written meanwhile.
// The error is the tensor itself, given back whole.
#[allow(clippy::result_large_err)]
pub fn try_into_array<T: Element, D: Dimension + 'static>(
    tensor: Tensor,
) -> Result<Array<T, D>, Tensor> {
    let Ok(typed) = tensor.owner().clone().downcast::<ArrayOwner<T, D>>() else {
        return Err(tensor);
    };
    // The tensor and `typed`: nobody else holds the owner.
    if Arc::strong_count(&typed) != 2 {
        return Err(tensor);
    }
    let desc = tensor.descriptor().clone();
    drop(tensor);
    match Arc::try_unwrap(typed) {
        Ok(ArrayOwner(array)) => Ok(array),
        // Someone upgraded a weak reference in between: rebuild the tensor.
        Err(typed) => {
            let owner: tensorbridge_core::Owner = typed;
            // SAFETY: the same description and owner as the tensor dropped just above, whose
            // guarantees (made in `import`) hold for as long as the owner lives; host memory,
            // ready now, as the dropped tensor was.
            Err(unsafe { Tensor::from_descriptor(desc, owner) })
        }
    }
}

/// Shares an `ArcArray`'s elements as a read-only tensor: zero-copy, the owner a clone of the
/// array. Read-only because the array's other clones may read the same buffer; they cannot
/// write it while the tensor lives (a shared `ArcArray` copies on write, and the tensor's
/// owner is one of the sharers).
pub fn import_shared<T: Element, D: Dimension + 'static>(
    array: &ArcArray<T, D>,
) -> Result<Tensor, Error> {
    let desc = describe(
        array.as_ptr(),
        array.shape(),
        array.strides(),
        Access::ReadOnly,
    )?;
    let owner = array.clone();
    // SAFETY:
    // - 1: the array's own elements, in its reference-counted heap buffer, which the owner (a
    //   clone sharing the buffer) keeps allocated until the last clone of the owner is
    //   dropped; read-only access is all that is given;
    // - 2: nobody writes the buffer while the owner shares it: `ArcArray` makes a writer's
    //   copy unique first (`ensure_unique`), copying whenever another clone, such as the
    //   owner, shares the buffer.
    Ok(unsafe { Tensor::from_descriptor(desc, Arc::new(owner)) })
}

/// The owner of a lent tensor. It keeps nothing alive: the borrow does, and the tensor never
/// leaves its [`Lent`] but through the `unsafe` [`Lent::as_tensor`].
struct BorrowOwner;

/// An ndarray array or view lent as a [`Tensor`] for the duration of a [`lend`] or
/// [`lend_mut`] call.
///
/// It does not dereference to the tensor: a `Tensor` is `'static` and cheap to clone, so a
/// clone would outlive the borrow and let safe code read freed memory. It gives out what
/// cannot escape: the [`Descriptor`], a [`TensorRef`] borrowed from it (host views, ndarray
/// views through [`view_ref`](crate::view_ref), anything that takes a borrowed tensor), and
/// the tensor itself only through the `unsafe` [`Lent::as_tensor`].
pub struct Lent<'a, T> {
    tensor: Tensor,
    _borrow: PhantomData<&'a [T]>,
}

impl<T> Lent<'_, T> {
    /// The tensor's description.
    pub fn descriptor(&self) -> &Descriptor {
        self.tensor.descriptor()
    }

    /// The tensor, borrowed: it cannot outlive this `Lent`, so it is safe.
    pub fn as_ref(&self) -> TensorRef<'_> {
        self.tensor.as_ref()
    }

    /// The tensor itself, for adapters that take a `&Tensor`.
    ///
    /// # Safety
    /// The caller guarantees:
    /// 1. no clone of the tensor or of its owner outlives the [`lend`] (or [`lend_mut`])
    ///    call: the owner keeps nothing alive; the borrow does. Exports that hand the tensor
    ///    to foreign code (DLPack, Python) must therefore be released before the closure
    ///    returns.
    pub unsafe fn as_tensor(&self) -> &Tensor {
        &self.tensor
    }
}

impl<T> fmt::Debug for Lent<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lent")
            .field("tensor", &self.tensor)
            .finish_non_exhaustive()
    }
}

/// Lends an array or view to `f` as a read-only tensor: zero-copy, the array's shape and
/// strides, on the host, ready now. A scope rather than a returned value, like
/// `std::thread::scope`: the tensor must not outlive the borrow.
///
/// ```
/// use ndarray::{Array2, Ix2, s};
/// let a = Array2::<f32>::ones((4, 6));
/// let shape = tensorbridge_ndarray::lend(&a.slice(s![.., 1..;2]), |lent| {
///     let v = tensorbridge_ndarray::view_ref::<f32, Ix2>(lent.as_ref())?; // and back
///     assert_eq!(v.strides(), [6, 2]);
///     Ok::<_, tensorbridge_ndarray::Error>(lent.descriptor().shape().to_vec())
/// })?;
/// assert_eq!(shape, [4, 3]);
/// # Ok::<(), tensorbridge_ndarray::Error>(())
/// ```
pub fn lend<'a, S, D, R, E>(
    array: &'a ArrayBase<S, D>,
    f: impl FnOnce(&Lent<'a, S::Elem>) -> Result<R, E>,
) -> Result<R, E>
where
    S: Data,
    S::Elem: Element,
    D: Dimension,
    E: From<Error>,
{
    let desc = describe(
        array.as_ptr(),
        array.shape(),
        array.strides(),
        Access::ReadOnly,
    )?;
    // SAFETY:
    // - 1: the array's own elements, which the shared borrow `'a` keeps valid and readable;
    //   the owner keeps nothing alive, so the tensor and every clone of its owner stay inside
    //   the `Lent`, which cannot outlive `'a` (`as_tensor`, the one way out, is `unsafe`
    //   with that obligation); read-only access is all that is given;
    // - 2: nobody writes the elements while the shared borrow lasts (ndarray's element
    //   types here are `Element`s, plain numbers without interior mutability).
    let tensor = unsafe { Tensor::from_descriptor(desc, Arc::new(BorrowOwner)) };
    f(&Lent {
        tensor,
        _borrow: PhantomData,
    })
}

/// [`lend`] with write access: the tensor is read-write, the array borrowed exclusively. A
/// shared `ArcArray` is made unique first (ndarray copies it then), as any write to it does.
pub fn lend_mut<'a, S, D, R, E>(
    array: &'a mut ArrayBase<S, D>,
    f: impl FnOnce(&Lent<'a, S::Elem>) -> Result<R, E>,
) -> Result<R, E>
where
    S: DataMut + RawData,
    S::Elem: Element,
    D: Dimension,
    E: From<Error>,
{
    let first = array.as_mut_ptr();
    let desc = describe(first, array.shape(), array.strides(), Access::ReadWrite)?;
    // SAFETY:
    // - 1: as in `lend`, with the exclusive borrow `'a` making the elements writable through
    //   the tensor (`as_mut_ptr` made a shared `ArcArray` unique first);
    // - 2: nobody else reads or writes them while the exclusive borrow lasts; host views of
    //   the tensor carry their own obligations among themselves.
    let tensor = unsafe { Tensor::from_descriptor(desc, Arc::new(BorrowOwner)) };
    f(&Lent {
        tensor,
        _borrow: PhantomData,
    })
}
