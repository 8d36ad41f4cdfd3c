//! Typed host views over validated tensors: strided reads, writes and iteration, and the
//! reference `to_contiguous` copy that tests use as their oracle.
//!
//! Safe code never gets a writable view under a shared borrow: read-only views come from a
//! shared tensor (`Tensor::host_view`, `TensorRef::as_slice`), writable ones only from the
//! `unsafe` `Tensor::host_view_mut` (its caller promises exclusivity) or from
//! `ExclusiveTensor::host_view_mut`, which borrows the owner's only holder mutably.

use std::marker::PhantomData;

#[cfg(doc)]
use crate::Tensor;
use crate::{DType, Descriptor, Error};

/// A Rust type that can stand for a tensor element of dtype [`Element::DTYPE`].
///
/// # Safety
/// Implementors guarantee:
/// 1. every bit pattern of `size_of::<Self>()` bytes is a valid `Self` (no padding bytes, no
///    invalid values; this is why `bool` is not an `Element`, see [`Bool8`]);
/// 2. `size_of::<Self>() == Self::DTYPE.itemsize()` and
///    `align_of::<Self>() <= Self::DTYPE.alignment()`;
/// 3. `Self::DTYPE` is not a sub-byte type.
pub unsafe trait Element: Copy + Send + Sync + 'static {
    /// The dtype this type stands for.
    const DTYPE: DType;
}

macro_rules! element {
    ($($t:ty => $dt:expr),* $(,)?) => {$(
        // SAFETY: a primitive number: every bit pattern valid, size and alignment equal to
        // the dtype's (checked by the `element_impls_match_their_dtype` test), whole bytes.
        unsafe impl Element for $t {
            const DTYPE: DType = $dt;
        }
    )*};
}

element! {
    i8 => DType::INT8, i16 => DType::INT16, i32 => DType::INT32, i64 => DType::INT64,
    u8 => DType::UINT8, u16 => DType::UINT16, u32 => DType::UINT32, u64 => DType::UINT64,
    f32 => DType::FLOAT32, f64 => DType::FLOAT64,
}

#[cfg(feature = "half")]
element! { half::f16 => DType::FLOAT16, half::bf16 => DType::BFLOAT16 }

#[cfg(feature = "num-complex")]
element! {
    num_complex::Complex<f32> => DType::COMPLEX64,
    num_complex::Complex<f64> => DType::COMPLEX128,
}

/// A DLPack `bool` element: one byte, 0 for false and anything else for true.
///
/// Rust's `bool` cannot be an [`Element`]: foreign memory may hold bytes other than 0 and 1,
/// and reading those as `bool` is undefined behaviour.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[repr(transparent)]
pub struct Bool8(pub u8);

impl Bool8 {
    /// The truth value (any non-zero byte is true).
    pub fn get(self) -> bool {
        self.0 != 0
    }
}

impl From<bool> for Bool8 {
    fn from(b: bool) -> Self {
        Bool8(u8::from(b))
    }
}

// SAFETY: a transparent `u8`: every bit pattern valid, one byte, alignment 1.
unsafe impl Element for Bool8 {
    const DTYPE: DType = DType::BOOL;
}

/// What both view kinds share: the first element's pointer and the description it came from.
struct Strided<'a, T> {
    tensor: &'a Descriptor,
    first: *mut T,
}

impl<'a, T: Element> Strided<'a, T> {
    /// # Safety
    /// 1. `tensor` is host-accessible, ready, and its dtype is `T::DTYPE`; its span stays
    ///    valid for `'a` (a [`Tensor`]'s owner or a [`TensorRef`](crate::TensorRef)'s borrow).
    unsafe fn new(tensor: &'a Descriptor) -> Self {
        Strided {
            tensor,
            first: tensor.data_ptr() as *mut T,
        }
    }

    fn offset_of(&self, index: &[i64]) -> Result<isize, Error> {
        let shape = self.tensor.shape();
        if index.len() != shape.len() || index.iter().zip(shape).any(|(&i, &n)| i < 0 || i >= n) {
            return Err(Error::IndexOutOfBounds {
                index: index.to_vec(),
                shape: shape.to_vec(),
            });
        }
        // In range and bounded by the validated element reach (|reach| < 2^55).
        let off: i64 = index
            .iter()
            .zip(self.tensor.strides_elems())
            .map(|(&i, &s)| i * s)
            .sum();
        Ok(off as isize)
    }

    fn ptr_at(&self, offset: isize) -> *mut T {
        // `wrapping_offset` is safe to compute; the result is only dereferenced for offsets of
        // in-bounds indices, which lie inside the validated span.
        self.first.wrapping_offset(offset)
    }

    fn read(&self, offset: isize) -> T {
        // SAFETY: `offset` is the offset of an in-bounds index, so the element lies inside the
        // tensor's byte span, which `Tensor::from_descriptor`'s contract keeps valid and
        // unwritten by others while `self.tensor` is borrowed; `first` is aligned for `T`
        // (validated alignment of element 0 plus `Element` obligation 2) and every stride is a
        // whole number of elements; any bit pattern is a valid `T` (`Element` obligation 1).
        unsafe { self.ptr_at(offset).read() }
    }

    /// The number of elements when the layout is C-contiguous (so they are exactly the
    /// `len` elements from `first`), `None` otherwise.
    fn contiguous_len(&self) -> Option<usize> {
        if !self.tensor.layout().is_c_contiguous() {
            return None;
        }
        usize::try_from(self.tensor.numel()).ok()
    }

    /// The elements as a slice, when C-contiguous.
    ///
    /// # Safety
    /// 1. The span is valid and unwritten by others for `'s`.
    unsafe fn as_slice<'s>(&self) -> Option<&'s [T]> {
        let len = self.contiguous_len()?;
        if len == 0 {
            return Some(&[]);
        }
        // SAFETY: C-contiguous, so the `len` elements from `first` are exactly the validated
        // span; `first` is non-null (validation refuses null data with elements) and aligned
        // for `T` (validated alignment, `Element` obligation 2); any bit pattern is a valid
        // `T` (`Element` obligation 1); valid and unwritten for `'s` (obligation 1).
        Some(unsafe { std::slice::from_raw_parts(self.first, len) })
    }

    fn iter(&self) -> Iter<'_, T> {
        let shape = self.tensor.shape();
        Iter {
            view: self,
            index: vec![0; shape.len()],
            offset: 0,
            remaining: self.tensor.numel(),
        }
    }
}

/// A typed read-only view over a host tensor, from [`Tensor::host_view`].
pub struct HostView<'a, T> {
    inner: Strided<'a, T>,
}

impl<'a, T: Element> HostView<'a, T> {
    /// # Safety
    /// 1. `tensor` is host-accessible, ready, and its dtype is `T::DTYPE`; its span stays
    ///    valid and unwritten by others for `'a`.
    pub(crate) unsafe fn new(tensor: &'a Descriptor) -> Self {
        HostView {
            // SAFETY: forwarded caller obligation 1.
            inner: unsafe { Strided::new(tensor) },
        }
    }

    /// The element at `index` (one entry per dimension).
    pub fn get(&self, index: &[i64]) -> Result<T, Error> {
        let off = self.inner.offset_of(index)?;
        Ok(self.inner.read(off))
    }

    /// Elements in row-major (C) order of the logical index, whatever the strides.
    pub fn iter(&self) -> Iter<'_, T> {
        self.inner.iter()
    }

    /// The elements as a slice, in row-major order, when the layout is C-contiguous
    /// ([`Layout::is_c_contiguous`](crate::Layout::is_c_contiguous)); `None` for any other
    /// layout (a transposed, sliced or broadcast view: [`iter`](Self::iter) reads those).
    /// The fast path for summing or copying: no per-element offset arithmetic.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use tensorbridge_core::{DType, RawTensor, Tensor};
    /// let data = Arc::new(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]);
    /// let desc = RawTensor::host(data.as_ptr() as usize, DType::FLOAT32, &[2, 3]).validate()?;
    /// // SAFETY: `data` owns the six floats and nobody writes them.
    /// let t = unsafe { Tensor::from_descriptor(desc, data.clone()) };
    /// let view = t.host_view::<f32>()?;
    /// let total: f32 = match view.as_slice() {
    ///     Some(slice) => slice.iter().sum(), // contiguous: one pass over memory
    ///     None => view.iter().sum(),         // any other layout
    /// };
    /// assert_eq!(total, 21.0);
    /// assert_eq!(view.as_slice().map(<[f32]>::as_ptr), Some(data.as_ptr())); // zero-copy
    /// # Ok::<(), tensorbridge_core::Error>(())
    /// ```
    pub fn as_slice(&self) -> Option<&'a [T]> {
        // SAFETY: forwarded constructor obligation 1: the span is valid and unwritten by
        // others for `'a`.
        unsafe { self.inner.as_slice() }
    }

    /// A compact row-major copy: the reference result every conversion is checked against.
    pub fn to_contiguous(&self) -> Vec<T> {
        self.iter().collect()
    }
}

/// A typed writable view over a host tensor, from [`Tensor::host_view_mut`].
pub struct HostViewMut<'a, T> {
    inner: Strided<'a, T>,
    // Not Send/Sync, like the raw pointer inside; spelled out for readers.
    _not_send: PhantomData<*mut T>,
}

impl<'a, T: Element> HostViewMut<'a, T> {
    /// # Safety
    /// 1. `tensor` is host-accessible, writable, ready, and its dtype is `T::DTYPE`;
    /// 2. nothing else reads or writes its bytes while the view lives; its span stays valid
    ///    for `'a`.
    pub(crate) unsafe fn new(tensor: &'a Descriptor) -> Self {
        HostViewMut {
            // SAFETY: forwarded caller obligation 1.
            inner: unsafe { Strided::new(tensor) },
            _not_send: PhantomData,
        }
    }

    /// The element at `index`.
    pub fn get(&self, index: &[i64]) -> Result<T, Error> {
        let off = self.inner.offset_of(index)?;
        Ok(self.inner.read(off))
    }

    /// Writes `value` at `index`.
    pub fn set(&mut self, index: &[i64], value: T) -> Result<(), Error> {
        let off = self.inner.offset_of(index)?;
        // SAFETY: in-bounds and aligned as in `Strided::read`; writable (the tensor is not
        // read-only, so its owner vouched for writes) and exclusive (constructor obligation 2).
        unsafe { self.inner.ptr_at(off).write(value) };
        Ok(())
    }

    /// Elements in row-major order of the logical index.
    pub fn iter(&self) -> Iter<'_, T> {
        self.inner.iter()
    }

    /// The elements as a slice when the layout is C-contiguous, `None` otherwise (as
    /// [`HostView::as_slice`]).
    pub fn as_slice(&self) -> Option<&[T]> {
        // SAFETY: constructor obligation 2: nothing else reads or writes the span while the
        // view lives; the slice borrows the view, so no write through it meanwhile.
        unsafe { self.inner.as_slice() }
    }

    /// The elements as a writable slice when the layout is C-contiguous, `None` otherwise.
    pub fn as_mut_slice(&mut self) -> Option<&mut [T]> {
        let len = self.inner.contiguous_len()?;
        if len == 0 {
            return Some(&mut []);
        }
        // SAFETY: C-contiguous, so the `len` elements from `first` are exactly the span,
        // which is valid, writable and exclusive to this view (constructor obligations 1 and
        // 2); `first` is non-null and aligned (as in `Strided::read`); any bit pattern is a
        // valid `T` (`Element` obligation 1); the slice borrows the view mutably.
        Some(unsafe { std::slice::from_raw_parts_mut(self.inner.first, len) })
    }

    /// A compact row-major copy.
    pub fn to_contiguous(&self) -> Vec<T> {
        self.iter().collect()
    }
}

/// Row-major iteration over a strided view.
pub struct Iter<'v, T> {
    view: &'v Strided<'v, T>,
    index: Vec<i64>,
    offset: isize,
    remaining: u64,
}

impl<T: Element> Iterator for Iter<'_, T> {
    type Item = T;

    fn next(&mut self) -> Option<T> {
        if self.remaining == 0 {
            return None;
        }
        self.remaining -= 1;
        let value = self.view.read(self.offset);
        // Advance the odometer: the last dimension fastest.
        let shape = self.view.tensor.shape();
        let strides = self.view.tensor.strides_elems();
        for d in (0..self.index.len()).rev() {
            self.index[d] += 1;
            self.offset += strides[d] as isize;
            if self.index[d] < shape[d] {
                break;
            }
            self.offset -= (strides[d] * shape[d]) as isize;
            self.index[d] = 0;
        }
        Some(value)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = usize::try_from(self.remaining).unwrap_or(usize::MAX);
        (n, usize::try_from(self.remaining).ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, size_of};

    fn check<T: Element>() {
        assert_eq!(size_of::<T>(), T::DTYPE.itemsize(), "{}", T::DTYPE);
        assert!(align_of::<T>() <= T::DTYPE.alignment(), "{}", T::DTYPE);
        assert!(!T::DTYPE.is_subbyte());
    }

    #[test]
    fn element_impls_match_their_dtype() {
        check::<i8>();
        check::<i16>();
        check::<i32>();
        check::<i64>();
        check::<u8>();
        check::<u16>();
        check::<u32>();
        check::<u64>();
        check::<f32>();
        check::<f64>();
        check::<Bool8>();
        #[cfg(feature = "half")]
        {
            check::<half::f16>();
            check::<half::bf16>();
        }
        #[cfg(feature = "num-complex")]
        {
            check::<num_complex::Complex<f32>>();
            check::<num_complex::Complex<f64>>();
        }
    }

    /// A host tensor over `data` (which it keeps alive) with `shape` and `strides`.
    fn over(
        data: &std::sync::Arc<Vec<f32>>,
        shape: &[i64],
        strides: Option<&[i64]>,
    ) -> crate::Tensor {
        let desc = crate::RawTensor {
            strides,
            ..crate::RawTensor::host(data.as_ptr() as usize, DType::FLOAT32, shape)
        }
        .validate()
        .unwrap();
        // SAFETY: `data` owns every element the layouts below reach, and the tests write
        // only through exclusive views.
        unsafe { crate::Tensor::from_descriptor(desc, data.clone()) }
    }

    #[test]
    fn as_slice_is_the_memory_itself_for_c_contiguous_views_only() {
        let data = std::sync::Arc::new((0..12).map(|i| i as f32).collect::<Vec<f32>>());
        let c = over(&data, &[3, 4], None);
        let view = c.host_view::<f32>().unwrap();
        let slice = view.as_slice().expect("a C-contiguous view is a slice");
        assert_eq!(slice.as_ptr(), data.as_ptr(), "zero-copy");
        assert_eq!(slice, view.to_contiguous().as_slice());
        // Size-1 dimensions may have any stride: still contiguous.
        let ones = over(&data, &[1, 12, 1], Some(&[99, 1, 7]));
        assert_eq!(ones.host_view::<f32>().unwrap().as_slice(), Some(&data[..]));
        // Empty: an empty slice.
        let empty = over(&data, &[0, 4], None);
        assert_eq!(empty.host_view::<f32>().unwrap().as_slice(), Some(&[][..]));
        // Transposed, sliced (a gap between rows), broadcast (stride 0): no slice.
        for (shape, strides) in [
            (&[4i64, 3][..], &[1i64, 4][..]),
            (&[3, 2], &[4, 1]),
            (&[3, 4], &[0, 1]),
        ] {
            let t = over(&data, shape, Some(strides));
            let view = t.host_view::<f32>().unwrap();
            assert!(view.as_slice().is_none(), "{shape:?} {strides:?}");
            assert!(view.iter().count() > 0);
        }
    }

    #[test]
    fn as_mut_slice_writes_the_memory_itself() {
        let data = std::sync::Arc::new(vec![0.0f32; 6]);
        let t = over(&data, &[2, 3], None);
        drop(data); // the tensor is now the only holder of its owner
        let mut exclusive = t.into_exclusive().expect("the only holder");
        let mut view = exclusive.host_view_mut::<f32>().unwrap();
        let ptr = view.as_slice().unwrap().as_ptr();
        view.as_mut_slice()
            .unwrap()
            .copy_from_slice(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        assert_eq!(view.get(&[1, 2]).unwrap(), 6.0);
        assert_eq!(view.as_mut_slice().unwrap().as_ptr(), ptr.cast_mut());
        let t = over(
            &std::sync::Arc::new(vec![0.0f32; 6]),
            &[3, 2],
            Some(&[1, 3]),
        );
        let mut exclusive = t.into_exclusive().expect("the only holder");
        assert!(
            exclusive
                .host_view_mut::<f32>()
                .unwrap()
                .as_mut_slice()
                .is_none()
        );
    }
}
