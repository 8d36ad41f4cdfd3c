//! [`Tensor`] -> candle: the candle tensor a tensor came from ([`export`]), a copy
//! ([`export_copied`]), and contiguous CUDA memory kept for the process's life
//! ([`export_leaked`], the `cuda` feature).

use candle_core::Storage;
use tensorbridge_core::{Access, Device, Tensor};

use crate::Error;
use crate::import::{CandleOwner, device_name};

/// The candle tensor a [`Tensor`] was imported from ([`import`](crate::import)), zero-copy,
/// when the tensor still describes exactly that candle tensor's elements and is writable;
/// [`Error::NotZeroCopy`] otherwise, naming the functions that do take other tensors.
///
/// candle tensors own their storage (a `Vec` on the host, a cudarc slice that frees its
/// memory when dropped on CUDA) and hold no foreign owner, so memory that candle did not
/// allocate can only be copied ([`export_copied`]) or, for contiguous CUDA memory, kept
/// until the process exits ([`export_leaked`]).
///
/// ```
/// use candle_core::{Device, Tensor};
/// let c = Tensor::arange(0u32, 4, &Device::Cpu)?;
/// // SAFETY: no candle operation writes `c`'s storage in place while `t` is used.
/// let t = unsafe { tensorbridge_candle::import(&c) }?;
/// let back = tensorbridge_candle::export(&t)?; // the same candle tensor
/// assert_eq!(back.id(), c.id());
/// assert!(tensorbridge_candle::export(&tensorbridge_core::Tensor::from_vec(vec![1u32], &[1])?).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn export(tensor: &Tensor) -> Result<candle_core::Tensor, Error> {
    if let Some(CandleOwner(candle)) = tensor.owner().downcast_ref::<CandleOwner>()
        && tensor.access() == Access::ReadWrite
        && describes(tensor, candle)?
    {
        return Ok(candle.clone());
    }
    Err(Error::NotZeroCopy {
        what: "a tensor that is not an unchanged import of a candle tensor",
        why: "candle tensors own their storage and hold no foreign owner",
        instead: "export_copied, or export_leaked for contiguous CUDA memory kept until the process exits",
    })
}

/// Whether `tensor` describes exactly `candle`'s elements: the same element 0, shape,
/// strides, dtype and device.
fn describes(tensor: &Tensor, candle: &candle_core::Tensor) -> Result<bool, Error> {
    let layout = candle.layout();
    let (storage, _) = candle.storage_and_layout();
    let base = match &*storage {
        Storage::Cpu(cpu) => {
            if tensor.device() != Device::CPU {
                return Ok(false);
            }
            crate::import::cpu_base(cpu)?
        }
        #[cfg(feature = "cuda")]
        Storage::Cuda(cuda) => crate::cuda::base(cuda)?,
        _ => return Ok(false),
    };
    let dtype = crate::dtype::dtype_of_candle(candle.dtype())?;
    let first = base + layout.start_offset() * dtype.itemsize();
    let same_dims = |a: &[usize], b: &[i64]| {
        a.len() == b.len() && a.iter().zip(b).all(|(&x, &y)| x as i64 == y)
    };
    Ok(tensor.dtype() == dtype
        && tensor.data_ptr() == first
        && same_dims(layout.dims(), tensor.shape())
        && same_dims(layout.stride(), tensor.strides_elems()))
}

/// A candle tensor on `device` with a copy of a host tensor's elements, in C order, from any
/// strides: the explicitly named copy, for tensors candle cannot share.
///
/// The tensor must be in host-accessible memory and ready (the core's `NotHostAccessible` and
/// `NotReady` otherwise); its dtype one candle has (float8 types aside: candle's `F8E4M3` is
/// not one of the core's host-view element types).
///
/// ```
/// let t = tensorbridge_core::Tensor::from_vec(vec![1f32, 2., 3., 4.], &[2, 2])?;
/// let c = tensorbridge_candle::export_copied(&t, &candle_core::Device::Cpu)?;
/// assert_eq!(c.to_vec2::<f32>()?, [[1., 2.], [3., 4.]]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn export_copied(
    tensor: &Tensor,
    device: &candle_core::Device,
) -> Result<candle_core::Tensor, Error> {
    use half::{bf16, f16};
    use tensorbridge_core::DType as T;
    let shape: Vec<usize> = tensor.shape().iter().map(|&n| n as usize).collect();
    macro_rules! copy {
        ($t:ty) => {
            candle_core::Tensor::from_vec(
                tensor.host_view::<$t>()?.to_contiguous(),
                shape,
                &candle_core::Device::Cpu,
            )?
        };
    }
    let host = match tensor.dtype() {
        T::UINT8 => copy!(u8),
        T::UINT32 => copy!(u32),
        T::INT16 => copy!(i16),
        T::INT32 => copy!(i32),
        T::INT64 => copy!(i64),
        T::BFLOAT16 => copy!(bf16),
        T::FLOAT16 => copy!(f16),
        T::FLOAT32 => copy!(f32),
        T::FLOAT64 => copy!(f64),
        other => return Err(Error::UnsupportedDType { dtype: other }),
    };
    if device.is_cpu() {
        Ok(host)
    } else {
        Ok(host.to_device(device)?)
    }
}

/// A contiguous CUDA tensor as a candle tensor on `device`, zero-copy, with the memory and
/// its owner **kept until the process exits** (the `cuda` feature).
///
/// candle's only way into foreign CUDA memory is its cudarc slice wrapper
/// (`CudaStorage::wrap_cuda_slice` over cudarc's `upgrade_device_ptr`), and a cudarc slice
/// frees its memory when dropped, with no slot for an owner to release instead. So this
/// never lets candle drop it: one clone of the candle tensor and one of `tensor` (its owner)
/// are forgotten. Use it for memory that lives as long as the program anyway (model weights
/// loaded once); everything else is copied ([`export_copied`]). candle's stream waits (on the
/// GPU) for the tensor's readiness first, so candle's kernels see the producer's writes.
///
/// Refused, first and on every build: read-only tensors ([`Error::NotZeroCopy`]): candle
/// writes its storages in place from safe code (`slice_set`, `const_set`, in-place custom
/// ops) and has no read-only flag, so a read-only share or a JAX array would become
/// writable; copy it instead. Then host tensors and tensors on another device than `device`
/// ([`Error::DeviceMismatch`]), strided tensors ([`Error::NotZeroCopy`]: candle builds
/// storage tensors contiguous), dtypes candle's CUDA storage lacks. Builds without the
/// `cuda` feature refuse every tensor ([`Error::UnsupportedDevice`]).
///
/// A writable tensor's other holders see candle's writes as they would any consumer's:
/// device work, ordered by streams, never under a host reference (CUDA device memory has no
/// host view).
pub fn export_leaked(
    tensor: &Tensor,
    device: &candle_core::Device,
) -> Result<candle_core::Tensor, Error> {
    refuse_read_only(tensor)?;
    match device {
        #[cfg(feature = "cuda")]
        candle_core::Device::Cuda(cuda) => crate::cuda::export_leaked(tensor, cuda),
        _ if tensor.device() == Device::CPU => Err(Error::NotZeroCopy {
            what: "a host tensor",
            why: "candle's CPU storage is a Vec candle allocated, and cannot hold other memory",
            instead: "export_copied",
        }),
        candle_core::Device::Cpu => Err(Error::DeviceMismatch {
            tensor: tensor.device(),
            candle: "cpu".to_owned(),
        }),
        other => Err(Error::UnsupportedDevice {
            device: device_name(other),
        }),
    }
}

/// [`export_leaked`]'s first refusal: a read-only tensor never becomes a candle tensor,
/// which safe candle code may write in place.
pub(crate) fn refuse_read_only(tensor: &Tensor) -> Result<(), Error> {
    if tensor.is_readonly() {
        return Err(Error::NotZeroCopy {
            what: "a read-only tensor",
            why: "candle writes its storages in place from safe code (slice_set, const_set, in-place custom ops) and has no read-only flag",
            instead: "export_copied",
        });
    }
    Ok(())
}
