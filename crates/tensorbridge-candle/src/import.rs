//! candle -> [`Tensor`]: owned ([`import`], the candle tensor held as the owner) and
//! borrowed for a scope with candle's storage locked ([`lend`]).

use std::sync::Arc;

use candle_core::{CpuStorage, Storage};
use tensorbridge_core::{Access, Descriptor, Device, RawTensor, Ready, Tensor, TensorRef};

use crate::Error;

/// Dimensions converted for the core, inline up to rank 8.
type Dims = smallvec::SmallVec<[i64; 8]>;
use crate::dtype::dtype_of_candle;

/// The owner of an imported tensor: a clone of the candle tensor (an `Arc`), which keeps its
/// storage, and with it the memory, alive.
pub(crate) struct CandleOwner(pub(crate) candle_core::Tensor);

/// Where a storage's elements are: the address of element 0 of the storage and its length.
pub(crate) struct Extent {
    pub(crate) addr: usize,
    pub(crate) len: usize,
}

/// The host address and length of a CPU storage.
fn cpu_extent(storage: &CpuStorage) -> Result<Extent, Error> {
    macro_rules! ext {
        ($v:expr) => {
            Extent {
                addr: $v.as_ptr() as usize,
                len: $v.len(),
            }
        };
    }
    Ok(match storage {
        CpuStorage::U8(v) => ext!(v),
        CpuStorage::U32(v) => ext!(v),
        CpuStorage::I16(v) => ext!(v),
        CpuStorage::I32(v) => ext!(v),
        CpuStorage::I64(v) => ext!(v),
        CpuStorage::BF16(v) => ext!(v),
        CpuStorage::F16(v) => ext!(v),
        CpuStorage::F32(v) => ext!(v),
        CpuStorage::F64(v) => ext!(v),
        CpuStorage::F8E4M3(v) => ext!(v),
        CpuStorage::F8E8M0(v) => ext!(v),
        CpuStorage::F6E2M3(_) => return Err(Error::UnsupportedCandleDType { dtype: "f6e2m3" }),
        CpuStorage::F6E3M2(_) => return Err(Error::UnsupportedCandleDType { dtype: "f6e3m2" }),
        CpuStorage::F4(_) => return Err(Error::UnsupportedCandleDType { dtype: "f4" }),
    })
}

/// The address of a CPU storage's element 0.
pub(crate) fn cpu_base(storage: &CpuStorage) -> Result<usize, Error> {
    Ok(cpu_extent(storage)?.addr)
}

/// The descriptor of a candle tensor whose storage's element 0 is at `extent.addr` on
/// `device`: candle's shape, strides (elements) and start offset, checked against the
/// storage's length.
pub(crate) fn describe(
    tensor: &candle_core::Tensor,
    extent: &Extent,
    device: Device,
    access: Access,
) -> Result<Descriptor, Error> {
    let layout = tensor.layout();
    let dtype = dtype_of_candle(tensor.dtype())?;
    let overflow = |what| tensorbridge_core::Error::Overflow { what };
    // On the stack up to 8 dimensions: two heap vectors per import were a third of its
    // instructions (docs/BENCHMARKS.md, "Conversions at the metadata floor").
    let shape = layout
        .dims()
        .iter()
        .map(|&n| i64::try_from(n).map_err(|_| overflow("extent")))
        .collect::<Result<Dims, _>>()?;
    let strides = layout
        .stride()
        .iter()
        .map(|&s| i64::try_from(s).map_err(|_| overflow("stride")))
        .collect::<Result<Dims, _>>()?;
    // candle promises that its layout lies inside its storage; a tensor is a promise to every
    // consumer, so check it (u128: cannot overflow).
    let start = layout.start_offset() as u128;
    if layout.dims().iter().all(|&n| n > 0) {
        let reach = start
            + layout
                .dims()
                .iter()
                .zip(layout.stride())
                .map(|(&n, &s)| (n as u128 - 1) * s as u128)
                .sum::<u128>()
            + 1;
        if reach > extent.len as u128 {
            return Err(Error::OutsideStorage {
                reach,
                len: extent.len,
            });
        }
    }
    let byte_offset = u64::try_from(layout.start_offset())
        .ok()
        .and_then(|o| o.checked_mul(dtype.itemsize() as u64))
        .ok_or(overflow("byte offset"))?;
    let raw = RawTensor {
        strides: Some(&strides),
        byte_offset,
        access,
        ..RawTensor::new(extent.addr, device, dtype, &shape)
    };
    Ok(raw.validate()?)
}

/// A candle tensor as a [`Tensor`]: zero-copy, read-write, candle's shape, strides and start
/// offset (as the byte offset), CPU or CUDA (the `cuda` feature). The owner is a clone of the
/// candle tensor, so the memory lives as long as the last clone of either.
///
/// CUDA tensors carry candle's stream as their readiness: a consumer orders after
/// candle's work on the GPU ([`Ready::Stream`] of candle's stream when it is a stream of its
/// own or the legacy default stream; an event recorded on it for candle's default, the
/// per-thread default stream, which names another stream on every thread).
///
/// ```
/// use candle_core::{Device, Tensor};
/// let c = Tensor::arange(0f32, 6., &Device::Cpu)?.reshape((2, 3))?.t()?;
/// // SAFETY: no candle operation writes `c`'s storage in place while `t` is used.
/// let t = unsafe { tensorbridge_candle::import(&c) }?;
/// assert_eq!((t.shape(), t.strides_elems()), (&[3i64, 2][..], &[1i64, 3][..]));
/// assert_eq!(t.host_view::<f32>()?.get(&[2, 1])?, 5.0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Safety
/// candle writes some storages in place from safe code (`const_set`, `zero_set`,
/// `one_set`, `slice_set`, `scatter_set`, `scatter_add_set`, in-place custom ops,
/// `Var::set`), under its storage lock, which the returned tensor does not hold. The caller
/// guarantees, while the returned tensor or any clone or export of it is used:
/// 1. no such candle operation writes the storage while anyone reads the memory through the
///    tensor (host views, foreign consumers), and none reads or writes it while anyone writes
///    through the tensor. For CUDA tensors this is about the host: device work is ordered by
///    the readiness, and candle's later in-place kernels order after consumers only when the
///    caller orders them (as with any framework's tensor handed on).
pub unsafe fn import(tensor: &candle_core::Tensor) -> Result<Tensor, Error> {
    let (storage, _) = tensor.storage_and_layout();
    let (desc, ready) = match &*storage {
        Storage::Cpu(cpu) => (
            describe(tensor, &cpu_extent(cpu)?, Device::CPU, Access::ReadWrite)?,
            Ready::Now,
        ),
        #[cfg(feature = "cuda")]
        Storage::Cuda(cuda) => crate::cuda::describe_cuda(tensor, cuda)?,
        #[cfg(not(feature = "cuda"))]
        Storage::Cuda(_) => return Err(unsupported(tensor)),
        Storage::Metal(_) => return Err(unsupported(tensor)),
    };
    drop(storage);
    // SAFETY:
    // - from_descriptor 1: the span is candle's layout inside its storage (checked against the
    //   storage's length by `describe`), memory candle allocated on the tensor's device; the
    //   owner is a clone of the candle tensor, which holds the storage, and candle never
    //   moves a storage's memory while a tensor holds it (in-place operations write into it;
    //   nothing replaces it), so it stays valid until the last clone of the owner is dropped;
    // - from_descriptor 2: our caller's obligation 1.
    let t = unsafe { Tensor::from_descriptor(desc, Arc::new(CandleOwner(tensor.clone()))) };
    // SAFETY: `ready` is `Ready::Now` for host memory (candle's CPU operations are
    // synchronous), or what `describe_cuda` established (its comment says why obligations 1
    // to 3 of `with_ready` hold).
    Ok(unsafe { t.with_ready(ready) })
}

/// Lends a candle CPU tensor to `f` as a borrowed tensor ([`TensorRef`]), safely: zero-copy,
/// read-only, with candle's storage lock held for the call, so no candle operation writes the
/// storage in place meanwhile (one that tries, on another thread, waits; on this thread it
/// would deadlock: do not write the lent tensor's storage through candle inside `f`).
///
/// ```
/// use candle_core::{Device, Tensor};
/// let c = Tensor::new(&[[1f64, 2.], [3., 4.]], &Device::Cpu)?;
/// let sum = tensorbridge_candle::lend(&c, |t| {
///     Ok::<_, tensorbridge_candle::Error>(t.host_view::<f64>()?.iter().sum::<f64>())
/// })?;
/// assert_eq!(sum, 10.0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn lend<R, E>(
    tensor: &candle_core::Tensor,
    f: impl FnOnce(TensorRef<'_>) -> Result<R, E>,
) -> Result<R, E>
where
    E: From<Error>,
{
    let (storage, _) = tensor.storage_and_layout();
    let Storage::Cpu(cpu) = &*storage else {
        return Err(Error::NotHost {
            device: device_name(tensor.device()),
        }
        .into());
    };
    let desc = describe(tensor, &cpu_extent(cpu)?, Device::CPU, Access::ReadOnly)?;
    let ready = Ready::Now;
    // SAFETY: for the lifetime of the borrows of `desc` and `ready` (this frame, which
    // outlives `f`'s use of the reference):
    // - 1: the span is candle's layout inside the storage (checked), host memory the
    //   storage's `Vec` owns, which `storage` (a read guard) keeps in place and alive;
    // - 2: nobody writes it: candle's in-place writers take the storage's write lock, which
    //   the read guard excludes, and the tensor is read-only;
    // - 3: `Ready::Now`: candle's CPU operations are synchronous.
    let borrowed = unsafe { TensorRef::from_parts(&desc, &ready) };
    let out = f(borrowed);
    drop(storage);
    out
}

/// candle's device, as a name for messages.
pub(crate) fn device_name(device: &candle_core::Device) -> String {
    match device.location() {
        candle_core::DeviceLocation::Cpu => "cpu".to_owned(),
        candle_core::DeviceLocation::Cuda { gpu_id } => format!("cuda:{gpu_id}"),
        candle_core::DeviceLocation::Metal { gpu_id } => format!("metal:{gpu_id}"),
    }
}

fn unsupported(tensor: &candle_core::Tensor) -> Error {
    Error::UnsupportedDevice {
        device: device_name(tensor.device()),
    }
}
