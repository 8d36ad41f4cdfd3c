//! Shapes, strides in elements, byte offsets, and the questions consumers ask about them.

use std::fmt;

use smallvec::SmallVec;

use crate::Error;

/// Inline room for this many dimensions; deeper tensors spill to the heap.
const INLINE_DIMS: usize = 8;

pub(crate) type Dims = SmallVec<[i64; INLINE_DIMS]>;

/// A validated layout: extents, strides **in units of elements** (negative and zero
/// allowed) and a byte offset from the data pointer to element 0.
///
/// Built only by [`Layout::new`] (or [`Layout::row_major`]), which guarantees: shape and
/// strides have the same length, every extent is >= 0, the number of elements fits in `u64`,
/// and strides and the element offsets they reach are at most `2^55 - 1` in absolute value
/// (see [`Layout::new`]). After that, the queries below cannot fail or overflow.
///
/// Contiguity follows what consumers do (NumPy, PyTorch and CuPy all ignore the stride of a
/// dimension of size 1 and call empty tensors contiguous): strides of
/// dimensions of size 1 are ignored, and a tensor with a dimension of size 0 counts as
/// contiguous in every sense.
#[derive(PartialEq, Eq, Hash)]
pub struct Layout {
    shape: Dims,
    strides: Dims,
    byte_offset: u64,
    numel: u64,
    /// Lowest and highest element offsets reached, relative to element 0; `(0, 0)` when
    /// empty.
    reach: (i64, i64),
}

/// Largest absolute stride and element offset we accept (2^55 - 1). Keeps all element
/// arithmetic, including the contiguity scans' running products, inside `i64`; byte
/// arithmetic, which also depends on the element width, is checked in `i128` by the
/// descriptor's validation.
pub(crate) const MAX_ELEM_REACH: i64 = i64::MAX >> 8;

impl Layout {
    /// A layout from a shape, strides in elements (`None` means compact row-major, as in
    /// DLPack before 1.2) and a byte offset.
    ///
    /// Fails on rank disagreement, negative extents, and any overflow: the number of
    /// elements must fit in `u64`, and every stride and every reachable element offset must
    /// lie within `±(i64::MAX >> 8)`.
    #[inline]
    pub fn new(shape: &[i64], strides: Option<&[i64]>, byte_offset: u64) -> Result<Layout, Error> {
        let mut storage = Dims::new();
        let strides = strides_or_row_major(shape, strides, &mut storage)?;
        Layout::from_slices(shape, strides, byte_offset)
    }

    /// The compact row-major (C order) layout of `shape`, byte offset 0.
    pub fn row_major(shape: &[i64]) -> Result<Layout, Error> {
        Layout::new(shape, None, 0)
    }

    /// The compact column-major (Fortran order) layout of `shape`, byte offset 0.
    pub fn column_major(shape: &[i64]) -> Result<Layout, Error> {
        check_extents(shape)?;
        let mut strides: Dims = SmallVec::from_elem(0, shape.len());
        let mut acc: i64 = 1;
        for (d, &n) in shape.iter().enumerate() {
            strides[d] = acc;
            acc = acc.checked_mul(n.max(1)).ok_or(Error::Overflow {
                what: "column-major strides",
            })?;
        }
        Layout::from_slices(shape, &strides, 0)
    }

    #[inline]
    fn from_slices(shape: &[i64], strides: &[i64], byte_offset: u64) -> Result<Layout, Error> {
        let facts = Facts::check(shape, strides)?;
        Ok(Layout::from_checked(shape, strides, byte_offset, facts))
    }

    /// Builds a layout from dimensions that passed [`Facts::check`], copying them once.
    #[inline]
    pub(crate) fn from_checked(
        shape: &[i64],
        strides: &[i64],
        byte_offset: u64,
        facts: Facts,
    ) -> Layout {
        Layout {
            shape: dims_from_slice(shape),
            strides: dims_from_slice(strides),
            byte_offset,
            numel: facts.numel,
            reach: facts.reach,
        }
    }

    /// The facts validation established.
    #[inline]
    pub(crate) fn facts(&self) -> Facts {
        Facts {
            numel: self.numel,
            reach: self.reach,
        }
    }

    /// Number of dimensions.
    #[inline]
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }

    /// Extents, all >= 0.
    #[inline]
    pub fn shape(&self) -> &[i64] {
        &self.shape
    }

    /// Strides in units of elements.
    #[inline]
    pub fn strides_elems(&self) -> &[i64] {
        &self.strides
    }

    /// Bytes from the data pointer to element 0.
    #[inline]
    pub fn byte_offset(&self) -> u64 {
        self.byte_offset
    }

    /// Number of elements.
    #[inline]
    pub fn numel(&self) -> u64 {
        self.numel
    }

    /// Whether the tensor has no elements.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.numel == 0
    }

    /// Lowest and highest element offsets the strides reach, relative to element 0
    /// (inclusive both; `(0, 0)` for a single element or an empty tensor).
    #[inline]
    pub fn elem_reach(&self) -> (i64, i64) {
        self.reach
    }

    /// The same layout with another byte offset.
    pub fn with_byte_offset(&self, byte_offset: u64) -> Layout {
        Layout {
            byte_offset,
            ..self.clone()
        }
    }

    pub(crate) fn set_byte_offset(&mut self, byte_offset: u64) {
        self.byte_offset = byte_offset;
    }

    /// Whether the layout is compact row-major (C order), ignoring dimensions of size 1.
    pub fn is_c_contiguous(&self) -> bool {
        self.first_not_row_major().is_none()
    }

    /// Whether the layout is compact column-major (Fortran order), ignoring dimensions of
    /// size 1.
    pub fn is_f_contiguous(&self) -> bool {
        self.first_not_column_major().is_none()
    }

    /// Whether the layout is a permutation of a compact layout: every element of a block of
    /// `numel` elements is reached exactly once, with non-negative strides.
    pub fn is_dense(&self) -> bool {
        self.first_not_dense().is_none()
    }

    /// `(dim, stride, expected)` of the first dimension (from the last) that breaks row-major.
    fn first_not_row_major(&self) -> Option<(usize, i64, i64)> {
        if self.is_empty() {
            return None;
        }
        let mut expected: i64 = 1;
        for d in (0..self.ndim()).rev() {
            let n = self.shape[d];
            if n == 1 {
                continue;
            }
            if self.strides[d] != expected {
                return Some((d, self.strides[d], expected));
            }
            // Bounded: expected <= reach + 1 while strides match.
            expected *= n;
        }
        None
    }

    fn first_not_column_major(&self) -> Option<(usize, i64, i64)> {
        if self.is_empty() {
            return None;
        }
        let mut expected: i64 = 1;
        for d in 0..self.ndim() {
            let n = self.shape[d];
            if n == 1 {
                continue;
            }
            if self.strides[d] != expected {
                return Some((d, self.strides[d], expected));
            }
            expected *= n;
        }
        None
    }

    fn first_not_dense(&self) -> Option<(usize, i64)> {
        if self.is_empty() {
            return None;
        }
        let mut dims: SmallVec<[usize; INLINE_DIMS]> =
            (0..self.ndim()).filter(|&d| self.shape[d] != 1).collect();
        if let Some(&d) = dims.iter().find(|&&d| self.strides[d] <= 0) {
            return Some((d, self.strides[d]));
        }
        // Innermost first; ties broken by larger dimension index innermost, like C order.
        dims.sort_unstable_by_key(|&d| (self.strides[d], std::cmp::Reverse(d)));
        let mut expected: i64 = 1;
        for d in dims {
            if self.strides[d] != expected {
                return Some((d, self.strides[d]));
            }
            expected *= self.shape[d];
        }
        None
    }

    /// Checks one restriction a consumer states, naming the offending dimension on failure.
    pub fn check(&self, constraint: Constraint) -> Result<(), Error> {
        match constraint {
            Constraint::RowMajor => match self.first_not_row_major() {
                None => Ok(()),
                Some((dim, stride, expected)) => Err(Error::NotRowMajor {
                    dim,
                    stride,
                    expected,
                }),
            },
            Constraint::ColumnMajor => match self.first_not_column_major() {
                None => Ok(()),
                Some((dim, stride, expected)) => Err(Error::NotColumnMajor {
                    dim,
                    stride,
                    expected,
                }),
            },
            Constraint::Dense => match self.first_not_dense() {
                None => Ok(()),
                Some((dim, stride)) => Err(Error::NotDense { dim, stride }),
            },
            Constraint::NonNegativeStrides => self
                .significant_dims()
                .find(|&d| self.strides[d] < 0)
                .map_or(Ok(()), |dim| {
                    Err(Error::NegativeStride {
                        dim,
                        stride: self.strides[dim],
                    })
                }),
            Constraint::NoBroadcast => self
                .significant_dims()
                .find(|&d| self.strides[d] == 0)
                .map_or(Ok(()), |dim| {
                    Err(Error::ZeroStride {
                        dim,
                        size: self.shape[dim],
                    })
                }),
            Constraint::ZeroByteOffset => match self.byte_offset {
                0 => Ok(()),
                byte_offset => Err(Error::NonZeroByteOffset { byte_offset }),
            },
            Constraint::NonOverlapping => self.first_overlap().map_or(Ok(()), |(dim, inner)| {
                Err(Error::SelfOverlap {
                    dim,
                    size: self.shape[dim],
                    stride: self.strides[dim],
                    inner,
                })
            }),
        }
    }

    /// Whether no two elements share an address, proven by the sufficient condition of
    /// [`Constraint::NonOverlapping`]. Conservative: a few exotic layouts that do not overlap
    /// (strides that interleave without colliding) are reported as overlapping.
    pub fn is_non_overlapping(&self) -> bool {
        self.first_overlap().is_none()
    }

    /// `(dim, inner)`: the first dimension, by increasing stride magnitude, whose stride does
    /// not exceed the span `inner` (in elements) the dimensions with smaller strides reach.
    ///
    /// When every stride exceeds that span, the offset `sum(i_d * s_d)` determines every
    /// index (as digits of a mixed-radix number do), so no two elements share an address.
    fn first_overlap(&self) -> Option<(usize, i64)> {
        let mut dims: SmallVec<[usize; INLINE_DIMS]> = self.significant_dims().collect();
        dims.sort_unstable_by_key(|&d| (self.strides[d].unsigned_abs(), d));
        // The sum of |stride| * (size - 1) is the reach's width, which validation bounded.
        let mut inner: i64 = 0;
        for d in dims {
            let stride = self.strides[d].unsigned_abs();
            if stride <= inner.unsigned_abs() {
                return Some((d, inner));
            }
            inner = inner.saturating_add(
                i64::try_from(stride)
                    .unwrap_or(i64::MAX)
                    .saturating_mul(self.shape[d] - 1),
            );
        }
        None
    }

    /// Checks every restriction in `constraints`, failing on the first one broken.
    pub fn check_all(&self, constraints: &[Constraint]) -> Result<(), Error> {
        constraints.iter().try_for_each(|&c| self.check(c))
    }

    /// Dimensions whose stride matters: size > 1, none at all when the tensor is empty.
    fn significant_dims(&self) -> impl Iterator<Item = usize> + '_ {
        let all = if self.is_empty() { 0 } else { self.ndim() };
        (0..all).filter(|&d| self.shape[d] > 1)
    }

    /// Element strides from byte strides: each must be a multiple of `itemsize`.
    ///
    /// The inverse of multiplying by the item size; used by the CUDA Array Interface and
    /// NumPy adapters, whose strides count bytes.
    pub fn strides_from_bytes(strides_bytes: &[i64], itemsize: usize) -> Result<Vec<i64>, Error> {
        let mut out = vec![0; strides_bytes.len()];
        Layout::strides_from_bytes_into(strides_bytes, itemsize, &mut out)?;
        Ok(out)
    }

    /// [`Layout::strides_from_bytes`] into `out` (of the same length as `strides_bytes`),
    /// so that a caller converts into a buffer of its own (on the stack) instead of a new
    /// vector per conversion. Power-of-two item sizes divide by a shift. Fails with
    /// [`Error::RankMismatch`] (`shape`: the room in `out`) when the lengths differ.
    pub fn strides_from_bytes_into(
        strides_bytes: &[i64],
        itemsize: usize,
        out: &mut [i64],
    ) -> Result<(), Error> {
        if out.len() != strides_bytes.len() {
            return Err(Error::RankMismatch {
                shape: out.len(),
                strides: strides_bytes.len(),
            });
        }
        let size = i64::try_from(itemsize).map_err(|_| Error::Overflow { what: "item size" })?;
        let not_multiple = |dim, stride_bytes| Error::StrideNotMultiple {
            dim,
            stride_bytes,
            itemsize,
        };
        if size > 0 && size.count_ones() == 1 {
            let (mask, shift) = (size - 1, size.trailing_zeros());
            for (dim, (&b, o)) in strides_bytes.iter().zip(out.iter_mut()).enumerate() {
                if b & mask != 0 {
                    return Err(not_multiple(dim, b));
                }
                // Exact: `b` is a multiple of `size`, and the shift is arithmetic.
                *o = b >> shift;
            }
            return Ok(());
        }
        for (dim, (&b, o)) in strides_bytes.iter().zip(out.iter_mut()).enumerate() {
            if size == 0 || b % size != 0 {
                return Err(not_multiple(dim, b));
            }
            *o = b / size;
        }
        Ok(())
    }
}

/// What checking a shape and strides establishes, computed on borrowed slices so the
/// trust boundary copies the dimensions only once, into the final descriptor.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Facts {
    /// Number of elements.
    pub(crate) numel: u64,
    /// Lowest and highest element offsets reached relative to element 0.
    pub(crate) reach: (i64, i64),
}

impl Facts {
    /// Rank agreement, extents >= 0, element count in `u64`, strides and reach within
    /// `±MAX_ELEM_REACH`.
    #[inline]
    pub(crate) fn check(shape: &[i64], strides: &[i64]) -> Result<Facts, Error> {
        if strides.len() != shape.len() {
            return Err(Error::RankMismatch {
                shape: shape.len(),
                strides: strides.len(),
            });
        }
        // One pass, 64-bit checked arithmetic. Overflow of the element count or of the reach
        // only matters for tensors with elements, so it is remembered, not returned, until
        // the pass has seen every extent (a later 0 makes the tensor empty).
        let mut numel: u64 = 1;
        let mut empty = false;
        let mut overflowed: Option<&'static str> = None;
        let (mut lo, mut hi): (i64, i64) = (0, 0);
        for (dim, (&n, &s)) in shape.iter().zip(strides).enumerate() {
            if n < 0 {
                return Err(Error::NegativeSize { dim, size: n });
            }
            if s.unsigned_abs() > MAX_ELEM_REACH as u64 {
                return Err(Error::Overflow {
                    what: "element offset reach",
                });
            }
            if n == 0 {
                empty = true;
                continue;
            }
            match numel.checked_mul(n as u64) {
                Some(v) => numel = v,
                None => overflowed = overflowed.or(Some("number of elements")),
            }
            // Saturating: a saturated sum is past the bound and flagged just below, so it
            // never wraps into range.
            match (n - 1).checked_mul(s) {
                Some(ext) if ext < 0 => lo = lo.saturating_add(ext),
                Some(ext) => hi = hi.saturating_add(ext),
                None => overflowed = overflowed.or(Some("element offset reach")),
            }
            if lo < -MAX_ELEM_REACH || hi > MAX_ELEM_REACH {
                overflowed = overflowed.or(Some("element offset reach"));
                // Clamp: the overflow is recorded; later sums start from the bound again.
                lo = lo.max(-MAX_ELEM_REACH);
                hi = hi.min(MAX_ELEM_REACH);
            }
        }
        if empty {
            return Ok(Facts {
                numel: 0,
                reach: (0, 0),
            });
        }
        if let Some(what) = overflowed {
            return Err(Error::Overflow { what });
        }
        Ok(Facts {
            numel,
            reach: (lo, hi),
        })
    }
}

/// `dims` as [`Dims`]: up to [`INLINE_DIMS`], a fixed-length copy into the inline buffer.
///
/// `SmallVec::from_slice` copies through a `memcpy` call of variable length (a library call
/// per vector, two per descriptor built, ~11 instructions each plus the call); a loop over
/// the whole fixed buffer compiles to a few vector moves instead.
#[inline]
fn dims_from_slice(dims: &[i64]) -> Dims {
    if dims.len() > INLINE_DIMS {
        return SmallVec::from_slice(dims);
    }
    let mut buf = [0i64; INLINE_DIMS];
    for (i, slot) in buf.iter_mut().enumerate() {
        if let Some(&v) = dims.get(i) {
            *slot = v;
        }
    }
    SmallVec::from_buf_and_len(buf, dims.len())
}

/// `strides`, or, when absent (DLPack's NULL, CAI's None), the compact row-major strides of
/// `shape` computed into `storage`.
#[inline]
pub(crate) fn strides_or_row_major<'a>(
    shape: &[i64],
    strides: Option<&'a [i64]>,
    storage: &'a mut Dims,
) -> Result<&'a [i64], Error> {
    match strides {
        Some(s) => Ok(s),
        None => {
            check_extents(shape)?;
            *storage = row_major_strides(shape)?;
            Ok(&storage[..])
        }
    }
}

/// Computes compact row-major strides; extents must already be non-negative.
#[inline]
fn row_major_strides(shape: &[i64]) -> Result<Dims, Error> {
    let mut strides: Dims = SmallVec::from_elem(0, shape.len());
    let mut acc: i64 = 1;
    for d in (0..shape.len()).rev() {
        strides[d] = acc;
        acc = acc.checked_mul(shape[d].max(1)).ok_or(Error::Overflow {
            what: "row-major strides",
        })?;
    }
    Ok(strides)
}

#[inline]
fn check_extents(shape: &[i64]) -> Result<(), Error> {
    match shape.iter().position(|&n| n < 0) {
        Some(dim) => Err(Error::NegativeSize {
            dim,
            size: shape[dim],
        }),
        None => Ok(()),
    }
}

// By hand: `SmallVec::clone` goes through an iterator; `from_slice` is a plain copy, and
// tensors are cloned on every hand-off.
impl Layout {
    /// Whether both dimension vectors live inline (up to 8 dimensions): then the layout
    /// owns no heap memory and a bitwise copy of it is an independent, equal layout.
    #[inline]
    pub(crate) fn is_inline(&self) -> bool {
        !self.shape.spilled() && !self.strides.spilled()
    }
}

impl Clone for Layout {
    #[inline]
    fn clone(&self) -> Self {
        if self.is_inline() {
            // Up to 8 dimensions (nearly every tensor) live inline: one plain copy of the
            // struct, instead of two element loops. Tensors are cloned on every export, so
            // this is on the hot path of every conversion.
            // SAFETY: every field is plain `Copy` data except the two `SmallVec`s, and an
            // inline (not spilled) `SmallVec` of `i64` owns no heap memory: its elements and
            // length sit in its own bytes, and dropping it frees nothing. A bitwise copy is
            // therefore an independent, valid `Layout` equal to `self`, and dropping both
            // the copy and the original is fine.
            return unsafe { std::ptr::read(self) };
        }
        Layout {
            shape: SmallVec::from_slice(&self.shape),
            strides: SmallVec::from_slice(&self.strides),
            byte_offset: self.byte_offset,
            numel: self.numel,
            reach: self.reach,
        }
    }
}

impl fmt::Debug for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Layout")
            .field("shape", &&self.shape[..])
            .field("strides_elems", &&self.strides[..])
            .field("byte_offset", &self.byte_offset)
            .finish()
    }
}

/// A restriction a consumer places on layouts, checked by [`Layout::check`].
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Constraint {
    /// Compact row-major only (TensorFlow, XLA without layouts).
    RowMajor,
    /// Compact column-major only.
    ColumnMajor,
    /// A permutation of a compact layout (JAX >= 0.8 takes these).
    Dense,
    /// No negative strides (PyTorch, TensorFlow).
    NonNegativeStrides,
    /// No zero strides on dimensions of size > 1.
    NoBroadcast,
    /// `byte_offset` must be 0 (for consumers that ignore it, as several DLPack consumers do).
    ZeroByteOffset,
    /// No two elements at the same address (a kernel's in-place output, which every thread
    /// writes without atomics): each stride, taken in increasing magnitude over the
    /// dimensions of size > 1, is larger than the span the smaller ones reach. Broadcasts
    /// (stride 0) and overlapping strides (`as_strided`, sliding windows) are refused; so,
    /// conservatively, are the rare interleaved layouts that never collide.
    NonOverlapping,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_and_column_major_strides() {
        let c = Layout::row_major(&[2, 3, 4]).unwrap();
        assert_eq!(c.strides_elems(), &[12, 4, 1]);
        assert!(c.is_c_contiguous() && c.is_dense() && !c.is_f_contiguous());
        let f = Layout::column_major(&[2, 3, 4]).unwrap();
        assert_eq!(f.strides_elems(), &[1, 2, 6]);
        assert!(f.is_f_contiguous() && f.is_dense() && !f.is_c_contiguous());
    }

    #[test]
    fn size_one_dims_and_empty_tensors_are_ignored() {
        let l = Layout::new(&[1, 3, 1], Some(&[99, 1, -7]), 0).unwrap();
        assert!(l.is_c_contiguous() && l.is_f_contiguous() && l.is_dense());
        let e = Layout::new(&[0, 3], Some(&[-5, 0]), 0).unwrap();
        assert!(e.is_c_contiguous() && e.is_f_contiguous() && e.is_dense());
        assert_eq!(e.numel(), 0);
        assert!(e.check(Constraint::NonNegativeStrides).is_ok());
    }

    #[test]
    fn constraint_errors_name_the_dimension() {
        let l = Layout::new(&[2, 3], Some(&[1, 2]), 8).unwrap();
        assert_eq!(
            l.check(Constraint::RowMajor),
            Err(Error::NotRowMajor {
                dim: 1,
                stride: 2,
                expected: 1
            })
        );
        assert_eq!(l.check(Constraint::ColumnMajor), Ok(()));
        assert_eq!(
            l.check(Constraint::ZeroByteOffset),
            Err(Error::NonZeroByteOffset { byte_offset: 8 })
        );
        let n = Layout::new(&[2, 3], Some(&[3, -1]), 0).unwrap();
        assert_eq!(
            n.check(Constraint::NonNegativeStrides),
            Err(Error::NegativeStride { dim: 1, stride: -1 })
        );
        let b = Layout::new(&[2, 3], Some(&[0, 1]), 0).unwrap();
        assert_eq!(
            b.check(Constraint::NoBroadcast),
            Err(Error::ZeroStride { dim: 0, size: 2 })
        );
        assert_eq!(
            b.check(Constraint::Dense),
            Err(Error::NotDense { dim: 0, stride: 0 })
        );
    }

    #[test]
    fn reach_and_overflow() {
        let l = Layout::new(&[3, 4], Some(&[-4, 1]), 0).unwrap();
        assert_eq!(l.elem_reach(), (-8, 3));
        assert!(matches!(
            Layout::new(&[i64::MAX, 3], None, 0),
            Err(Error::Overflow { .. })
        ));
        assert!(matches!(
            Layout::new(&[2, 2], Some(&[i64::MAX, 1]), 0),
            Err(Error::Overflow { .. })
        ));
        assert!(matches!(
            Layout::new(&[2], Some(&[1, 1]), 0),
            Err(Error::RankMismatch {
                shape: 1,
                strides: 2
            })
        ));
        assert!(matches!(
            Layout::new(&[2, -1], None, 0),
            Err(Error::NegativeSize { dim: 1, size: -1 })
        ));
    }

    /// Found by `overflow_is_rejected_never_wrapped`: the reach of the second dimension alone
    /// fits in i64, but adding it to the first one's did not (a panic in debug builds).
    #[test]
    fn reach_sums_are_checked_too() {
        assert_eq!(
            Layout::new(&[1 << 31, i64::MAX], Some(&[1, 1]), 0),
            Err(Error::Overflow {
                what: "number of elements"
            })
        );
        assert!(matches!(
            Layout::new(
                &[2, 2, 2],
                Some(&[-(1 << 54) - 1, -(1 << 54), -(1 << 54)]),
                0
            ),
            Err(Error::Overflow {
                what: "element offset reach"
            })
        ));
    }

    #[test]
    fn byte_strides_must_be_multiples() {
        assert_eq!(
            Layout::strides_from_bytes(&[48, -4, 0], 4).unwrap(),
            vec![12, -1, 0]
        );
        assert_eq!(
            Layout::strides_from_bytes(&[48, 6], 4),
            Err(Error::StrideNotMultiple {
                dim: 1,
                stride_bytes: 6,
                itemsize: 4
            })
        );
    }

    /// The shift for power-of-two item sizes and the division for the others agree with
    /// plain division, remainders and errors included, negative strides too.
    #[test]
    fn strides_from_bytes_into_matches_reference() {
        let bytes = [
            0i64,
            1,
            -1,
            6,
            -6,
            48,
            -48,
            4096,
            -4096,
            i64::MIN,
            i64::MAX,
            i64::MIN + 8,
        ];
        for itemsize in 0..=17usize {
            for &b in &bytes {
                let reference = if itemsize == 0 || b % itemsize as i64 != 0 {
                    Err(Error::StrideNotMultiple {
                        dim: 1,
                        stride_bytes: b,
                        itemsize,
                    })
                } else {
                    Ok(vec![0, b / itemsize as i64])
                };
                let mut out = [7i64; 2];
                let got = Layout::strides_from_bytes_into(&[0, b], itemsize, &mut out)
                    .map(|()| out.to_vec());
                // Item size 0: the first stride already fails.
                let reference = if itemsize == 0 {
                    Err(Error::StrideNotMultiple {
                        dim: 0,
                        stride_bytes: 0,
                        itemsize,
                    })
                } else {
                    reference
                };
                assert_eq!(got, reference, "stride {b} bytes, item size {itemsize}");
            }
        }
        let mut short = [0i64; 1];
        assert_eq!(
            Layout::strides_from_bytes_into(&[4, 4], 4, &mut short),
            Err(Error::RankMismatch {
                shape: 1,
                strides: 2
            })
        );
    }
}
