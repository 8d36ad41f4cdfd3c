//! burn-flex tensors <-> [`Tensor`], both ways zero-copy.

use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::Arc;

use burn_flex::{Flex, FlexTensor, Layout as FlexLayout};
use burn_std::{AccessError, AccessPolicy, AllocationController, AllocationProperty, Bytes, Shape};
use tensorbridge_core::{Access, Descriptor, ExclusiveTensor, RawTensor, Ready, Tensor};

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
    let overflow = |what| tensorbridge_core::Error::Overflow { what };
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

/// What keeps an exported tensor's memory alive: a clone of a shared tensor, or the one
/// holder of an exclusive one.
enum Keep {
    Shared(#[allow(dead_code)] Tensor),
    Exclusive(#[allow(dead_code)] ExclusiveTensor),
}

/// The memory of a [`Tensor`] as burn-flex bytes: the span the tensor reaches, from its
/// lowest byte, kept alive by the tensor. Written in place when burn asks only for a
/// writable [`ExclusiveTensor`]; every other tensor is copied first (copy-on-write), or
/// refused where burn forbids the copy.
struct TensorController {
    /// The owner of the memory (and the readiness, which is `Now`).
    _keep: Keep,
    /// The lowest byte the tensor reaches.
    base: NonNull<u8>,
    /// Bytes from `base` to one past the highest byte reached.
    len: usize,
    /// The element size, which the span's start is aligned to.
    align: usize,
    /// Whether burn may write the memory in place: the tensor is writable and exclusive
    /// (nobody else holds its owner, so no view or clone reads underneath).
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
        // SAFETY: the tensor is writable (whoever vouched for its memory vouched for writes,
        // `Tensor::from_descriptor` obligation 1) and exclusive: `_keep` is the only holder of
        // its owner, so no other tensor, view or export reads the bytes; its span is
        // `base..base + len`, kept alive by `_keep`, and `&mut self` makes this the only
        // borrow of the bytes through burn.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr().cast(), self.len) })
    }
}

/// A host [`Tensor`] as a burn-flex tensor, zero-copy: burn's storage is the tensor's memory
/// (its owner kept by burn's byte controller), with the tensor's shape, strides (negative
/// ones included) and element 0 as burn's start offset.
///
/// burn reads the memory where it lies. When burn writes (its in-place operations), it
/// writes a private copy made at its first write (copy-on-write), whatever the tensor's
/// access: the tensor is shared (`&Tensor`), so clones, views (`&[T]`, ndarray views) and
/// exports of it may be reading. [`export_primitive_exclusive`] writes in place.
///
/// Refused: memory the host cannot touch and pending device work (the core's
/// `NotHostAccessible`, `NotReady`), dtypes burn-flex lacks ([`Error::UnsupportedDType`],
/// booleans included).
pub fn export_primitive(tensor: &Tensor) -> Result<FlexTensor, Error> {
    export_with(
        tensor.descriptor(),
        tensor.ready(),
        Keep::Shared(tensor.clone()),
    )
}

/// A tensor proven to have no other holder ([`Tensor::into_exclusive`]) as a burn-flex
/// tensor, zero-copy as [`export_primitive`], with burn's in-place operations writing the
/// tensor's memory itself when the tensor is writable (read-only ones are copied at burn's
/// first write). Nothing else can read the memory meanwhile: the exclusive tensor moves into
/// burn's storage, and the owner has no other holder.
///
/// ```
/// use burn_tensor::{Float, Tensor as Burn};
/// let t = tensorbridge_core::Tensor::from_vec(vec![1f32, 2.], &[2])?;
/// let ptr = t.data_ptr();
/// let only = t.into_exclusive().expect("no other clone");
/// let b: Burn<1, Float> = tensorbridge_burn::export_exclusive(only)?.add_scalar(10.0);
/// let back = tensorbridge_burn::import(b)?;
/// assert_eq!(back.data_ptr(), ptr); // written in place
/// assert_eq!(back.host_view::<f32>()?.to_contiguous(), [11., 12.]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn export_primitive_exclusive(tensor: ExclusiveTensor) -> Result<FlexTensor, Error> {
    let (desc, ready) = (tensor.descriptor().clone(), tensor.ready().clone());
    export_with(&desc, &ready, Keep::Exclusive(tensor))
}

/// [`export_primitive`] and [`export_primitive_exclusive`]: `desc` and `ready` are `keep`'s.
fn export_with(desc: &Descriptor, ready: &Ready, keep: Keep) -> Result<FlexTensor, Error> {
    let dtype = burn_dtype_of(desc.dtype())?;
    let size = desc.dtype().itemsize();
    // Host access and readiness, as a host view needs them.
    if !desc.device().kind.is_host_accessible() {
        return Err(tensorbridge_core::Error::NotHostAccessible {
            device: desc.device(),
        }
        .into());
    }
    if !ready.is_now() {
        return Err(tensorbridge_core::Error::NotReady.into());
    }
    let overflow = |what| tensorbridge_core::Error::Overflow { what };
    let (first, last) = desc.layout().elem_reach();
    let empty = desc.numel() == 0;
    let (base, len, start) = if empty {
        (NonNull::<u64>::dangling().cast::<u8>(), 0, 0)
    } else {
        let lo = desc.data_ptr() as isize + first as isize * size as isize;
        let len = usize::try_from((last - first + 1) as i128 * size as i128)
            .map_err(|_| overflow("byte span"))?;
        let base = NonNull::new(lo as *mut u8).ok_or(overflow("data pointer"))?;
        (
            base,
            len,
            usize::try_from(-first).map_err(|_| overflow("start offset"))?,
        )
    };
    let dims: Vec<usize> = desc.shape().iter().map(|&n| n as usize).collect();
    let strides: Vec<isize> = if empty {
        // burn needs no particular strides where nothing is reachable.
        FlexLayout::contiguous(Shape::from(dims.clone()))
            .strides()
            .to_vec()
    } else {
        desc.strides_elems().iter().map(|&s| s as isize).collect()
    };
    let writable = matches!(keep, Keep::Exclusive(_)) && !desc.is_readonly();
    let controller = TensorController {
        _keep: keep,
        base,
        len,
        align: size,
        writable,
        copy: None,
    };
    // SAFETY: `len` bytes are initialised in the controller: the tensor's span, which its
    // owner keeps valid (and the private copy, once made, holds the same `len` bytes).
    let bytes = unsafe { Bytes::from_controller(Box::new(controller), len) };
    let layout = FlexLayout::new(Shape::from(dims), strides, start);
    Ok(FlexTensor::new(bytes, layout, dtype))
}

/// A host [`Tensor`] as a burn (dispatching) tensor on the Flex backend, of rank `D` and kind
/// `K` (`Float` for floating dtypes, `Int` for integers): [`export_primitive`], wrapped
/// (copy-on-write: burn's in-place operations write a copy).
pub fn export<const D: usize, K>(tensor: &Tensor) -> Result<burn_tensor::Tensor<D, K>, Error>
where
    K: burn_tensor::kind::Basic
        + burn_tensor::kind::TensorKind
        + burn_tensor::BackendPrimitive<Flex, Primitive = FlexTensor>,
{
    check_kind::<D, K>(tensor.descriptor())?;
    let primitive = export_primitive(tensor)?;
    Ok(burn_tensor::Tensor::from_primitive::<Flex>(primitive))
}

/// An exclusive host tensor as a burn (dispatching) tensor on the Flex backend, of rank `D`
/// and kind `K`: [`export_primitive_exclusive`], wrapped (burn's in-place operations write
/// a writable tensor's memory).
pub fn export_exclusive<const D: usize, K>(
    tensor: ExclusiveTensor,
) -> Result<burn_tensor::Tensor<D, K>, Error>
where
    K: burn_tensor::kind::Basic
        + burn_tensor::kind::TensorKind
        + burn_tensor::BackendPrimitive<Flex, Primitive = FlexTensor>,
{
    check_kind::<D, K>(tensor.descriptor())?;
    let primitive = export_primitive_exclusive(tensor)?;
    Ok(burn_tensor::Tensor::from_primitive::<Flex>(primitive))
}

/// Whether a tensor described by `desc` fits burn's `Tensor<D, K>`.
fn check_kind<const D: usize, K>(desc: &Descriptor) -> Result<(), Error>
where
    K: burn_tensor::kind::Basic + burn_tensor::kind::TensorKind,
{
    if desc.ndim() != D {
        return Err(Error::WrongBurnTensor {
            what: format!("a tensor of {} dimensions", desc.ndim()),
            expected: "as many dimensions as the burn tensor's rank D",
        });
    }
    use burn_tensor::kind::Kind;
    use tensorbridge_core::DTypeCode;
    let code = desc.dtype().code();
    let fits = match K::KIND {
        Kind::Float => matches!(code, DTypeCode::Float | DTypeCode::Bfloat),
        Kind::Int => matches!(code, DTypeCode::Int | DTypeCode::UInt),
        _ => false,
    };
    if !fits {
        return Err(Error::WrongBurnTensor {
            what: format!(
                "a {} tensor asked for as a burn {} tensor",
                desc.dtype(),
                K::name()
            ),
            expected: "Float for floating-point dtypes, Int for integer dtypes",
        });
    }
    Ok(())
}
