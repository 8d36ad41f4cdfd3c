//! tch -> [`Tensor`]: describe through the shim, validate in the core, keep a detached alias.

use std::ptr;
use std::slice;

use tensorbridge::{Access, Descriptor, Device, RawTensor, Ready, Stream, Tensor};

use crate::ffi::{self, TensorInfo};
use crate::{Error, TorchDevice, TorchDeviceType, TorchLayout};

/// Keeps a tensor of its own over the shared storage alive: a detached alias of the source
/// (a new `TensorImpl`, the same `StorageImpl`), so that `set_`, `set_data` or
/// `set_source_tensor_` on the source, which rebind the source's `TensorImpl`, leave this
/// one's storage in place.
struct TchOwner(
    /// Never read: held so that the storage lives until the last clone of the core tensor
    /// is dropped.
    #[allow(dead_code)] // Read by no one on purpose; see the field's docs.
    tch::Tensor,
);

// SAFETY: `tch::Tensor` is `Send` but not `Sync` because its methods may not be called from
// two threads at once through `&`. The owner never gives out a reference to the tensor: it is
// only ever dropped, once, by whichever thread drops the last clone of the `Arc`, which
// `Send` allows. Shared references to a `TchOwner` therefore permit nothing.
unsafe impl Sync for TchOwner {}

/// The shim's description of `t`.
fn describe(t: &tch::Tensor) -> Result<TensorInfo, Error> {
    let mut info = TensorInfo::zeroed();
    let mut err = ptr::null_mut();
    // SAFETY: `t.as_ptr()` is a live `C_tensor` (a heap `at::Tensor`) borrowed for the call;
    // `info` and `err` are live locals the shim writes once each.
    let status = unsafe { ffi::tb_tch_describe(t.as_ptr(), &mut info, &mut err) };
    // SAFETY: `err` is what this call stored.
    unsafe { ffi::check("tb_tch_describe", status, err) }?;
    Ok(info)
}

/// libtorch's current stream of CUDA device `index` on this thread, as the core names it (a
/// raw handle; the default stream, null, is the legacy default stream).
pub(crate) fn current_cuda_stream(index: i8) -> Result<Stream, Error> {
    let mut handle = ptr::null_mut();
    let mut err = ptr::null_mut();
    // SAFETY: plain values and two live out-parameters the shim writes once each.
    let status =
        unsafe { ffi::tb_tch_current_stream(TorchDeviceType::CUDA, index, &mut handle, &mut err) };
    // SAFETY: `err` is what this call stored.
    unsafe { ffi::check("tb_tch_current_stream", status, err) }?;
    Ok(tensorbridge_cuda::stream_from_raw(handle.cast()))
}

/// Runs `f` with libtorch's current stream of CUDA device `ordinal` on this thread (tch has
/// no stream API, so from Rust this is libtorch's default stream unless C++ code set
/// another), borrowed as a cudarc stream: a cudarc kernel launched on it is ordered after the
/// libtorch work enqueued before it and before the libtorch work enqueued after it, with no
/// event and no host wait, like a libtorch operation. With [`import`] for the arguments and
/// the cudarc adapter's `KernelArgs` for checked views, that is a kernel of your own on tch
/// tensors, read and written in place.
///
/// The caller's CUDA context is restored after `f`. Without libcuda, the CUDA layer's
/// `NoDriver`; an ordinal above 127, [`Error::OrdinalOutOfRange`].
///
/// ```no_run
/// # fn demo(x: &tch::Tensor, y: &tch::Tensor, f: &cudarc::driver::CudaFunction)
/// #     -> Result<(), Box<dyn std::error::Error>> {
/// use cudarc::driver::{LaunchConfig, PushKernelArg};
/// // SAFETY: nothing resizes x's or y's storage while xt and yt live.
/// let (xt, yt) = unsafe { (tensorbridge_tch::import(x)?, tensorbridge_tch::import(y)?) };
/// tensorbridge_tch::with_current_stream(0, |stream| {
///     let args = tensorbridge_cudarc::KernelArgs::new(stream);
///     let (xv, mut yv) = (args.input::<f32>(&xt)?, args.output::<f32>(&yt)?);
///     let n = yv.numel() as u32;
///     // SAFETY: `f` is `(const float*, float*, unsigned)` over `n` contiguous floats.
///     unsafe { stream.launch_builder(f).arg(&xv).arg(&mut yv).arg(&n)
///         .launch(LaunchConfig::for_num_elems(n))? };
///     Ok::<(), tensorbridge_cudarc::Error>(())
/// })??;
/// // libtorch's next operations on y run after the kernel, on the same stream.
/// # Ok(()) }
/// ```
pub fn with_current_stream<R>(
    ordinal: u32,
    f: impl FnOnce(&std::sync::Arc<cudarc::driver::CudaStream>) -> R,
) -> Result<R, Error> {
    let index = i8::try_from(ordinal).map_err(|_| Error::OrdinalOutOfRange {
        device: Device::cuda(ordinal),
    })?;
    let stream = current_cuda_stream(index)?;
    // SAFETY: libtorch's current streams are its default stream (always live) or streams of
    // its pools, which it never destroys; a stream set from C++ outside the pools must
    // outlive the work that uses it, which libtorch itself requires. So the stream is live
    // for the process, and no keeper is needed.
    Ok(unsafe { tensorbridge_cuda::with_stream_raw(ordinal, stream, None, f) }?)
}

/// A tch tensor as a core [`Tensor`], zero-copy: same memory, same shape, strides in
/// elements and storage offset (as the byte offset), read-write.
///
/// The tensor's owner is a detached alias of `t` (a tensor of its own over `t`'s storage,
/// one more libtorch reference to it), so the storage stays alive until the last clone of
/// the returned tensor is dropped, however long `t` itself lives, and whatever `set_`,
/// `set_data` or `set_source_tensor_` later rebind `t` to. On CUDA the tensor is
/// [`Ready::Stream`] of libtorch's current stream for its device on this thread, where
/// PyTorch's convention places pending work.
///
/// Refused with a typed error: undefined tensors, non-strided layouts (sparse, MKL-DNN),
/// tensors whose conjugate or negative bit is set, scalar types without a DLPack code
/// (quantized, `Bits*`, sub-byte integers), devices other than CPU and CUDA (meta, MPS...).
///
/// ```
/// let t = tch::Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]).reshape([2, 3]);
/// let col = t.narrow(1, 1, 1); // a view libtorch made: offset 1, strides [3, 1]
/// // SAFETY: nothing resizes `t`'s storage while `shared` lives.
/// let shared = unsafe { tensorbridge_tch::import(&col) }?;
/// assert_eq!(shared.shape(), [2, 1]);
/// assert_eq!(shared.byte_offset(), 4); // the storage offset, in bytes
/// assert_eq!(shared.data_ptr(), col.data_ptr() as usize); // the same memory
/// assert_eq!(shared.host_view::<f32>()?.to_contiguous(), [2.0, 5.0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Safety
/// 1. Until the last clone of the returned tensor is dropped, nothing reallocates or frees
///    the memory of `t`'s storage: no `resize_` (or `resize_as_`, or an `out=` operation
///    that resizes its output) that grows a tensor sharing that storage, and no resize of
///    the storage itself (`untyped_storage().resize_(...)` in Python). libtorch grows a
///    storage by allocating new memory, moving the storage's data pointer there and freeing
///    the old memory at once; the storage (which the owner keeps alive) survives, the memory
///    the returned tensor describes does not. Holding the storage cannot prevent that, and
///    tch's safe API allows it, so the promise is the caller's (see ARCHITECTURE.md, "tch
///    imports are `unsafe`"). Storages libtorch refuses to resize (those of tensors
///    [`export`](crate::export) made, or `from_blob`'s) meet this by construction.
pub unsafe fn import(t: &tch::Tensor) -> Result<Tensor, Error> {
    let info = describe(t)?;
    let desc = validate(&info)?;
    let ready = readiness(desc.device(), info.device_index)?;
    let owner = std::sync::Arc::new(TchOwner(t.f_detach().map_err(|e| Error::Torch {
        call: "detach",
        message: e.to_string(),
    })?));
    // SAFETY: from_descriptor:
    // - 1: the span is the part of `t`'s storage that its sizes, strides and offset reach,
    //   which libtorch keeps allocated, on the device it reports, while the detached alias
    //   in the owner holds the storage and nothing reallocates it (the caller's obligation
    //   1); libtorch tensors are writable;
    // - 2: host views of the result read while libtorch may write through other tensors of
    //   the same storage only if safe tch code writes from another thread at the same time,
    //   which tch itself allows for its own shallow clones: this crate adds no race that tch
    //   does not have (see the crate's `# Soundness`).
    let tensor = unsafe { Tensor::from_descriptor(desc, owner) };
    Ok(match ready {
        Ready::Now => tensor,
        // SAFETY: with_ready:
        // - 1: PyTorch's convention is that the work producing a tensor is enqueued on the
        //   current stream of its device; the data is ready once that stream's work so far
        //   has finished;
        // - 2: the stream is libtorch's current stream of the tensor's device: its default
        //   stream or a stream of its pool, which libtorch never destroys (the device's
        //   primary context, as libtorch uses the runtime API). An external stream made
        //   current by C++ or Python code is that code's to keep alive (tch cannot);
        // - 3: a per-thread default stream became an event in `readiness`; a signal names
        //   none.
        ready => unsafe { tensor.with_ready(ready) },
    })
}

/// The core's device for libtorch's, refusing every device but CPU and CUDA.
fn core_device(info: &TensorInfo) -> Result<Device, Error> {
    match (info.device_type, u32::try_from(info.device_index)) {
        (TorchDeviceType::CPU, _) => Ok(Device::CPU),
        (TorchDeviceType::CUDA, Ok(ordinal)) => Ok(Device::cuda(ordinal)),
        _ => Err(Error::UnsupportedTorchDevice {
            device: TorchDevice {
                kind: info.device_type,
                index: info.device_index,
            },
        }),
    }
}

/// The shim's description as a validated core descriptor: the typed refusals (undefined,
/// device, layout, conjugate and negative bits, scalar type), then the core's validation.
fn validate(info: &TensorInfo) -> Result<Descriptor, Error> {
    if info.defined == 0 {
        return Err(Error::Undefined);
    }
    let device = core_device(info)?;
    if info.layout != TorchLayout::STRIDED {
        return Err(Error::NotStrided {
            layout: info.layout,
        });
    }
    if info.is_conj != 0 {
        return Err(Error::ConjugateBit);
    }
    if info.is_neg != 0 {
        return Err(Error::NegativeBit);
    }
    let dtype = info.scalar_type.to_dtype()?;
    let ndim = usize::try_from(info.ndim).unwrap_or(0);
    let (sizes, strides): (&[i64], &[i64]) = if ndim == 0 {
        (&[], &[])
    } else {
        // SAFETY: for a defined strided tensor the shim points `sizes` and `strides`
        // at the tensor's own `ndim` extents and strides, which live as long as the tensor
        // is not resized; the caller borrows the tensor (not `Sync`) for the whole import,
        // so nothing resizes it before the core has copied them (`validate` below).
        let sizes = unsafe { slice::from_raw_parts(info.sizes, ndim) };
        // SAFETY: as for `sizes` just above.
        let strides = unsafe { slice::from_raw_parts(info.strides, ndim) };
        (sizes, strides)
    };
    let data = info.data as usize;
    // libtorch's `data_ptr()` is the storage's start plus the storage offset: describe it as
    // such, unless the arithmetic does not hold (tensors without elements may have a null
    // pointer whatever their offset), in which case the offset is folded in.
    let offset = u64::try_from(info.storage_offset)
        .ok()
        .and_then(|o| o.checked_mul(u64::try_from(info.itemsize).ok()?))
        .filter(|&bytes| usize::try_from(bytes).is_ok_and(|b| b <= data));
    let (base, byte_offset) = match offset {
        Some(bytes) => (data - bytes as usize, bytes),
        None => (data, 0),
    };
    let raw = RawTensor {
        strides: Some(strides),
        byte_offset,
        access: Access::ReadWrite,
        ..RawTensor::new(base, device, dtype, sizes)
    };
    Ok(raw.validate()?)
}

/// When the data of a tensor libtorch describes is ready: on CUDA, after the work so far on
/// libtorch's current stream of its device (an event, for the per-thread default stream);
/// at once on the host.
fn readiness(device: Device, device_index: i8) -> Result<Ready, Error> {
    if device.kind != tensorbridge::DeviceType::Cuda {
        return Ok(Ready::Now);
    }
    Ok(match current_cuda_stream(device_index)? {
        // Only an external stream that is the per-thread sentinel gets here; it names
        // another stream on every thread, so the tensor carries an event instead.
        // SAFETY: the calling thread's per-thread default stream, live for the call.
        Stream::PerThreadDefault => unsafe {
            tensorbridge_cuda::CudaSignal::record_raw(device.ordinal, Stream::PerThreadDefault)
        }?
        .into_ready(),
        stream => Ready::Stream(stream),
    })
}
