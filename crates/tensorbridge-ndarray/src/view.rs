//! Host tensors as ndarray views, every stride included.

use std::ptr::NonNull;

use ndarray::{ArrayView, ArrayViewMut, Axis, Dimension, ShapeBuilder, StrideShape};
use tensorbridge_core::{Constraint, Descriptor, Element, Tensor, TensorRef};

use crate::Error;

/// A read-only ndarray view of a host tensor: zero-copy, with the tensor's shape and strides
/// (negative and zero strides included; a tensor without elements gets ndarray's C-order
/// strides, since none is reachable), borrowed from the tensor (whose owner keeps the memory
/// alive).
///
/// `D` is the dimension type: `Ix1`..`Ix6` for a fixed rank ([`Error::RankMismatch`]
/// otherwise), `IxDyn` for any. Fails, with the core's error, unless the tensor is in
/// host-accessible memory, of dtype `T`, and ready ([`Ready::Now`](tensorbridge_core::Ready::Now)).
///
/// ```
/// use ndarray::IxDyn;
/// let t = tensorbridge_core::Tensor::from_vec(vec![1i32, 2, 3, 4, 5, 6], &[2, 3])?;
/// let v = tensorbridge_ndarray::view::<i32, IxDyn>(&t)?;
/// assert_eq!(v.t()[[2, 1]], 6);
/// # Ok::<(), tensorbridge_ndarray::Error>(())
/// ```
pub fn view<T: Element, D: Dimension>(tensor: &Tensor) -> Result<ArrayView<'_, T, D>, Error> {
    view_ref(tensor.as_ref())
}

/// [`view`] of a borrowed tensor (a [`TensorRef`]: [`Tensor::as_ref`], a lent array's
/// [`Lent::as_ref`](crate::Lent::as_ref), an argument pinned for one call), for as long as
/// the borrow.
pub fn view_ref<'a, T: Element, D: Dimension>(
    tensor: TensorRef<'a>,
) -> Result<ArrayView<'a, T, D>, Error> {
    // The core's checks: host-accessible, dtype `T`, ready.
    tensor.host_view::<T>()?;
    let parts = Parts::<T, D>::of(tensor.descriptor())?;
    // SAFETY: ndarray's `from_shape_ptr` obligations:
    // - the elements the shape and strides reach from `ptr` are exactly the tensor's elements
    //   (`Parts::of`: `ptr` is the element at the lowest address along every dimension with a
    //   negative stride, and the strides are the magnitudes), inside its validated byte span,
    //   which the borrow keeps valid for `'a`, and nobody writes them meanwhile (obligation 2
    //   of `Tensor::from_descriptor`, or of `TensorRef::from_parts`);
    // - `ptr` is non-null and aligned: element 0 of a validated, non-empty host tensor of
    //   dtype `T` is non-null and aligned for the dtype, hence for `T` (`Element` obligation
    //   2), and every stride is a whole number of elements; empty tensors get a dangling,
    //   aligned pointer;
    // - offsets stay inside the span, whose size validation bounds (below 2^55 elements, so
    //   no count overflows `isize` on 64-bit targets; `Parts::of` checks the conversions);
    // - strides are non-negative (their magnitudes; the sign comes back through `invert_axis`).
    let mut v = unsafe { ArrayView::from_shape_ptr(parts.shape, parts.ptr) };
    for axis in negative(tensor.descriptor()) {
        v.invert_axis(Axis(axis));
    }
    Ok(v)
}

/// A writable ndarray view of a host tensor; see [`view`]. Refuses read-only tensors (the
/// core's `ReadOnly`) and layouts in which two elements may share an address (zero strides,
/// overlapping strides: the core's `SelfOverlap`), which ndarray's mutable views must not
/// have.
///
/// # Safety
/// The caller guarantees:
/// 1. while the view lives, nothing else reads or writes the tensor's bytes: no other view
///    of this tensor or of a clone, no foreign code (the obligation of the core's
///    `Tensor::host_view_mut`; a [`Tensor`] is cheap to clone and cannot promise it).
pub unsafe fn view_mut<T: Element, D: Dimension>(
    tensor: &Tensor,
) -> Result<ArrayViewMut<'_, T, D>, Error> {
    // SAFETY: forwarded obligation 1.
    unsafe { view_mut_ref(tensor.as_ref()) }
}

/// [`view_mut`] of a borrowed tensor, for as long as the borrow.
///
/// # Safety
/// The caller guarantees:
/// 1. while the view lives, nothing else reads or writes the tensor's bytes (as for
///    [`view_mut`]).
pub unsafe fn view_mut_ref<'a, T: Element, D: Dimension>(
    tensor: TensorRef<'a>,
) -> Result<ArrayViewMut<'a, T, D>, Error> {
    // SAFETY: only the core's checks (read-only, host-accessible, dtype, ready); the view it
    // returns is dropped at once. Exclusivity is our caller's obligation 1.
    unsafe { tensor.host_view_mut::<T>() }?;
    tensor.layout().check(Constraint::NonOverlapping)?;
    let parts = Parts::<T, D>::of(tensor.descriptor())?;
    // SAFETY: as in `view_ref`, and in addition:
    // - the elements may be written: the tensor is read-write (checked), so whoever vouched
    //   for the memory vouched for writes, and no one else reads or writes it meanwhile (our
    //   caller's obligation 1);
    // - no two elements share an address (`Constraint::NonOverlapping`, checked), as
    //   ndarray's mutable views require.
    let mut v = unsafe { ArrayViewMut::from_shape_ptr(parts.shape, parts.ptr as *mut T) };
    for axis in negative(tensor.descriptor()) {
        v.invert_axis(Axis(axis));
    }
    Ok(v)
}

/// What `from_shape_ptr` takes: the lowest-address pointer, the extents and the stride
/// magnitudes ([`negative`] says which dimensions to reverse afterwards).
struct Parts<T, D> {
    ptr: *const T,
    shape: StrideShape<D>,
}

impl<T: Element, D: Dimension> Parts<T, D> {
    fn of(desc: &Descriptor) -> Result<Self, Error> {
        let ndim = desc.ndim();
        if let Some(expected) = D::NDIM
            && expected != ndim
        {
            return Err(Error::RankMismatch {
                expected,
                found: ndim,
            });
        }
        let overflow = |what| tensorbridge_core::Error::Overflow { what };
        let mut dim = D::zeros(ndim);
        let mut strides = D::zeros(ndim);
        let empty = desc.numel() == 0;
        // Element 0, moved (below) to the lowest address along each negative dimension.
        let mut ptr = desc.data_ptr() as *const T;
        // Written through the slices: `IxDyn`'s `IndexMut` dispatches on its inline or heap
        // storage per index (a third of the view's instructions when indexed per element).
        let (dim_out, strides_out) = (dim.slice_mut(), strides.slice_mut());
        let dims = desc.shape().iter().zip(desc.strides_elems());
        for ((&n, &s), (d, st)) in dims.zip(dim_out.iter_mut().zip(strides_out.iter_mut())) {
            *d = usize::try_from(n).map_err(|_| overflow("extent"))?;
            *st = usize::try_from(s.unsigned_abs()).map_err(|_| overflow("stride"))?;
            if s < 0 && !empty {
                // The last element of this dimension lies lowest. In bounds: validation
                // checked the span every index reaches (|offset| < 2^55 elements).
                let last = isize::try_from((n - 1) * s).map_err(|_| overflow("stride"))?;
                ptr = ptr.wrapping_offset(last);
            }
        }
        if empty {
            // No element is reachable: a dangling (aligned, non-null) pointer and ndarray's
            // own default strides (ndarray's overlap check refuses custom zero strides in
            // front of an empty dimension). The view's strides are then not the tensor's.
            return Ok(Parts {
                ptr: NonNull::<T>::dangling().as_ptr(),
                shape: dim.into(),
            });
        }
        Ok(Parts {
            ptr,
            shape: dim.strides(strides),
        })
    }
}

/// The dimensions that [`Parts::of`] built with the magnitude of a negative stride (none for
/// tensors without elements).
fn negative(desc: &Descriptor) -> impl Iterator<Item = usize> + '_ {
    let strides = desc.strides_elems();
    let n = if desc.numel() == 0 { 0 } else { strides.len() };
    (0..n).filter(move |&i| strides[i] < 0)
}
