//! burn-flex tensors <-> [`Tensor`], both ways zero-copy.

use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::Arc;

use burn_flex::{Flex, FlexTensor, Layout as FlexLayout};
use burn_std::{AccessError, AccessPolicy, AllocationController, AllocationProperty, Bytes, Shape};
use tensorbridge::{Access, RawTensor, Tensor};

use crate::Error;
use crate::dtype::{burn_dtype_of, dtype_of_burn};

/// The owner of an imported burn tensor: a clone of it (an `Arc` of its bytes), held, never
/// read.
struct FlexOwner(#[allow(dead_code)] FlexTensor);

/// A burn-flex tensor as a read-only [`Tensor`]: zero-copy, burn's shape, strides (negative
/// ones included) and start offset, on the host, ready now. The owner is a clone of the
/// burn tensor, which holds its storage.
///
/// Read-only because burn-flex storage is shared copy-on-write: other clones of the burn
/// tensor read it, and burn writes into it only when one tensor holds it alone (which, while
/// the owner is a clone, none does).
pub fn import_primitive(tensor: &FlexTensor) -> Result<Tensor, Error> {
    let dtype = dtype_of_burn(tensor.dtype())?;
    let bytes = tensor.bytes();
    let layout = tensor.layout();
    let overflow = |what| tensorbridge::Error::Overflow { what };
    let shape = layout
        .shape()
        .as_slice()
        .iter()
        .map(|&n| i64::try_from(n).map_err(|_| overflow("extent")))
        .collect::<Result<Vec<i64>, _>>()?;
    let strides = layout
        .strides()
        .iter()
        .map(|&s| i64::try_from(s).map_err(|_| overflow("stride")))
        .collect::<Result<Vec<i64>, _>>()?;
    let size = dtype.itemsize();
    let start = layout.start_offset();
    let data = (bytes.as_ptr() as usize)
        .checked_add(start.checked_mul(size).ok_or(overflow("start offset"))?)
        .ok_or(overflow("start offset"))?;
    let raw = RawTensor {
        strides: Some(&strides),
        access: Access::ReadOnly,
        ..RawTensor::host(data, dtype, &shape)
    };
    let desc = raw.validate()?;
    // burn promises that its layout lies inside its storage; a tensor is a promise to every
    // consumer, so check it (in i128: no overflow).
    if desc.numel() > 0 {
        let (first, last) = desc.layout().elem_reach();
        let size = size as i128;
        let lo = (start as i128 + i128::from(first)) * size;
        let hi = (start as i128 + i128::from(last) + 1) * size;
        if lo < 0 || hi > bytes.len() as i128 {
            return Err(Error::OutsideStorage {
                lo,
                hi,
                len: bytes.len(),
            });
        }
    }
    // SAFETY:
    // - 1: the span lies inside the burn tensor's bytes (checked just above), host memory its
    //   `Arc<Bytes>` keeps resident and in place (burn replaces a storage only through
    //   `Arc::make_mut` / `Arc::get_mut`, which copy, or fail, while the owner's clone shares
    //   it) until the last clone of the owner is dropped; read-only access is all that is
    //   given;
    // - 2: nobody writes it meanwhile: burn writes a storage in place only when one tensor
    //   holds it alone, and the owner is a second holder.
    Ok(unsafe { Tensor::from_descriptor(desc, Arc::new(FlexOwner(tensor.clone()))) })
}

/// A burn (dispatching) tensor on the Flex backend as a read-only [`Tensor`]
/// ([`import_primitive`] of its primitive). Consumes the handle; burn tensors are cheap to
/// clone.
pub fn import<const D: usize, K>(tensor: burn_tensor::Tensor<D, K>) -> Result<Tensor, Error>
where
    K: burn_tensor::kind::Basic + burn_tensor::BackendPrimitive<Flex, Primitive = FlexTensor>,
{
    let primitive = tensor
        .try_into_primitive::<Flex>()
        .map_err(|e| Error::WrongBurnTensor {
            what: format!("{e:?}"),
            expected: "a tensor of burn's Flex backend",
        })?;
    import_primitive(&primitive)
}

/// The memory of a [`Tensor`] as burn-flex bytes: the span the tensor reaches, from its
/// lowest byte, kept alive by the tensor. Writable tensors are written in place when burn
/// asks; read-only ones are copied first (copy-on-write), or refused where burn forbids the
/// copy.
struct TensorController {
    /// The owner of the memory (and the readiness, which is `Now`).
    _tensor: Tensor,
    /// The lowest byte the tensor reaches.
    base: NonNull<u8>,
    /// Bytes from `base` to one past the highest byte reached.
    len: usize,
    /// The element size, which the span's start is aligned to.
    align: usize,
    writable: bool,
    /// The private copy of a read-only tensor, made at the first write.
    copy: Option<Bytes>,
}

fn as_uninit(bytes: &[u8]) -> &[MaybeUninit<u8>] {
    // SAFETY: `u8` and `MaybeUninit<u8>` have the same layout, and every byte is initialised.
    unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast(), bytes.len()) }
}

impl AllocationController for TensorController {
    fn alloc_align(&self) -> usize {
        if self.copy.is_some() { 8 } else { self.align }
    }

    fn property(&self) -> AllocationProperty {
        AllocationProperty::Other
    }

    fn capacity(&self) -> usize {
        self.len
    }

    fn memory(&self, _policy: AccessPolicy) -> Result<&[MaybeUninit<u8>], AccessError> {
        if let Some(copy) = &self.copy {
            return Ok(as_uninit(&copy[..self.len]));
        }
        // SAFETY: `base..base + len` is the tensor's span (`export_primitive`), host memory
        // its owner (`_tensor`, held by `self`) keeps valid and readable; nobody writes it
        // while this borrow of `self` lasts (the tensor's obligation 2, and writes through
        // burn go through `memory_mut`, which needs `&mut self`).
        Ok(unsafe { std::slice::from_raw_parts(self.base.as_ptr().cast(), self.len) })
    }

    unsafe fn memory_mut(
        &mut self,
        policy: AccessPolicy,
    ) -> Result<&mut [MaybeUninit<u8>], AccessError> {
        if self.copy.is_none() && !self.writable {
            if !policy.copy_allowed() {
                return Err(AccessError::WouldCopy);
            }
            // Copy-on-write: 8-byte-aligned storage (u64 words) for any element type.
            let words = self.len.div_ceil(8);
            let mut buf = vec![0u64; words];
            // SAFETY: `buf` holds `words * 8 >= len` bytes, and the tensor's span is `len`
            // readable bytes (as in `memory`); the two do not overlap (`buf` is new).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.base.as_ptr(),
                    buf.as_mut_ptr().cast::<u8>(),
                    self.len,
                )
            };
            self.copy = Some(Bytes::from_elems(buf));
        }
        if let Some(copy) = &mut self.copy {
            let len = self.len;
            let bytes: &mut [u8] = &mut copy[..len];
            // SAFETY: as in `as_uninit`, mutably; our caller writes only initialised bytes.
            return Ok(unsafe {
                std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast(), bytes.len())
            });
        }
        // SAFETY: the tensor is writable: whoever vouched for its memory vouched for writes
        // (`Tensor::from_descriptor` obligation 1), its span is `base..base + len`, kept alive
        // by `_tensor`, and `&mut self` makes this the only borrow of the bytes through burn.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr().cast(), self.len) })
    }
}

/// A host [`Tensor`] as a burn-flex tensor, zero-copy: burn's storage is the tensor's memory
/// (its owner kept by burn's byte controller), with the tensor's shape, strides (negative
/// ones included) and element 0 as burn's start offset.
///
/// burn reads the memory where it lies. When burn writes a tensor it holds alone (its
/// in-place operations), a writable tensor's memory is written in place, as a consumer of
/// the tensor would; a read-only tensor is copied first (copy-on-write).
///
/// Refused: memory the host cannot touch and pending device work (the core's
/// `NotHostAccessible`, `NotReady`), dtypes burn-flex lacks ([`Error::UnsupportedDType`],
/// booleans included).
pub fn export_primitive(tensor: &Tensor) -> Result<FlexTensor, Error> {
    let dtype = burn_dtype_of(tensor.dtype())?;
    let size = tensor.dtype().itemsize();
    // Host access and readiness, as a host view needs them (the view is discarded).
    let r = tensor.as_ref();
    if !tensor.device().kind.is_host_accessible() {
        return Err(tensorbridge::Error::NotHostAccessible {
            device: tensor.device(),
        }
        .into());
    }
    if !r.ready().is_now() {
        return Err(tensorbridge::Error::NotReady.into());
    }
    let overflow = |what| tensorbridge::Error::Overflow { what };
    let (first, last) = tensor.layout().elem_reach();
    let empty = tensor.numel() == 0;
    let (base, len, start) = if empty {
        (NonNull::<u64>::dangling().cast::<u8>(), 0, 0)
    } else {
        let lo = tensor.data_ptr() as isize + first as isize * size as isize;
        let len = usize::try_from((last - first + 1) as i128 * size as i128)
            .map_err(|_| overflow("byte span"))?;
        let base = NonNull::new(lo as *mut u8).ok_or(overflow("data pointer"))?;
        (
            base,
            len,
            usize::try_from(-first).map_err(|_| overflow("start offset"))?,
        )
    };
    let dims: Vec<usize> = tensor.shape().iter().map(|&n| n as usize).collect();
    let strides: Vec<isize> = if empty {
        // burn needs no particular strides where nothing is reachable.
        FlexLayout::contiguous(Shape::from(dims.clone()))
            .strides()
            .to_vec()
    } else {
        tensor.strides_elems().iter().map(|&s| s as isize).collect()
    };
    let controller = TensorController {
        _tensor: tensor.clone(),
        base,
        len,
        align: size,
        writable: !tensor.is_readonly(),
        copy: None,
    };
    // SAFETY: `len` bytes are initialised in the controller: the tensor's span, which its
    // owner keeps valid (and the private copy, once made, holds the same `len` bytes).
    let bytes = unsafe { Bytes::from_controller(Box::new(controller), len) };
    let layout = FlexLayout::new(Shape::from(dims), strides, start);
    Ok(FlexTensor::new(bytes, layout, dtype))
}

/// A host [`Tensor`] as a burn (dispatching) tensor on the Flex backend, of rank `D` and kind
/// `K` (`Float` for floating dtypes, `Int` for integers): [`export_primitive`], wrapped.
pub fn export<const D: usize, K>(tensor: &Tensor) -> Result<burn_tensor::Tensor<D, K>, Error>
where
    K: burn_tensor::kind::Basic
        + burn_tensor::kind::TensorKind
        + burn_tensor::BackendPrimitive<Flex, Primitive = FlexTensor>,
{
    if tensor.ndim() != D {
        return Err(Error::WrongBurnTensor {
            what: format!("a tensor of {} dimensions", tensor.ndim()),
            expected: "as many dimensions as the burn tensor's rank D",
        });
    }
    use burn_tensor::kind::Kind;
    use tensorbridge::DTypeCode;
    let code = tensor.dtype().code();
    let fits = match K::KIND {
        Kind::Float => matches!(code, DTypeCode::Float | DTypeCode::Bfloat),
        Kind::Int => matches!(code, DTypeCode::Int | DTypeCode::UInt),
        _ => false,
    };
    if !fits {
        return Err(Error::WrongBurnTensor {
            what: format!(
                "a {} tensor asked for as a burn {} tensor",
                tensor.dtype(),
                K::name()
            ),
            expected: "Float for floating-point dtypes, Int for integer dtypes",
        });
    }
    let primitive = export_primitive(tensor)?;
    Ok(burn_tensor::Tensor::from_primitive::<Flex>(primitive))
}
