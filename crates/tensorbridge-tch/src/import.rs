//! tch -> [`Tensor`]: describe through the shim (one call, which also takes a reference to
//! the storage), validate in the core, keep the storage reference as the owner.

use std::ffi::c_void;
use std::ptr::{self, NonNull};
use std::slice;
use std::sync::Arc;

use tensorbridge_core::{Access, Descriptor, Device, RawTensor, Ready, Stream, Tensor};

use crate::ffi::{self, TensorInfo};
use crate::{Error, TorchDevice, TorchDeviceType, TorchLayout};

/// One reference to the `c10::StorageImpl` of an imported tensor (what a `c10::Storage`
/// copy holds: one count of the storage's atomic reference count), given back to libtorch
/// exactly once, when dropped.
///
/// The storage owns the memory's `DataPtr`, so the memory lives as long as this reference
/// does, unless the storage itself is resized (see [`import`]'s safety section). `set_`,
/// `set_data` and `set_source_tensor_` on the source tensor make the source's `TensorImpl`
/// point at another storage and drop the source's reference to this one; they never touch
/// a storage's count held elsewhere, so they free nothing under an import.
struct StorageRef(NonNull<c_void>);

impl Drop for StorageRef {
    fn drop(&mut self) {
        // SAFETY: the pointer is a reference `tb_tch_describe` took and handed over (see
        // `describe`), owned by this value alone and released only here, once.
        unsafe { ffi::tb_tch_storage_release(self.0.as_ptr()) };
    }
}

// SAFETY: the value is a count of an atomically reference-counted `StorageImpl`; giving it
// back from any thread is what libtorch does whenever a tensor is dropped on another thread
// (tch tensors are `Send`). The storage is never read or written through it.
unsafe impl Send for StorageRef {}

// SAFETY: a shared `&StorageRef` permits nothing (no method reads the storage); only the
// drop, which takes the value, uses the pointer.
unsafe impl Sync for StorageRef {}

/// The shim's description of `t`, and the reference to its storage the shim took when it
/// could describe `t` as strided memory (every other case is refused by `validate`).
fn describe(t: &tch::Tensor) -> Result<(TensorInfo, Option<StorageRef>), Error> {
    let mut info = TensorInfo::zeroed();
    let mut err = ptr::null_mut();
    // SAFETY: `t.as_ptr()` is a live `C_tensor` (a heap `at::Tensor`) borrowed for the call;
    // `info` and `err` are live locals the shim writes once each.
    let status = unsafe { ffi::tb_tch_describe(t.as_ptr(), &mut info, &mut err) };
    // Owned from here on, whatever happens next: the shim takes the reference last, after
    // everything that can fail, so a failed call leaves it null; a non-null one is released
    // exactly once, by this guard's drop (on a refusal) or the owner's.
    let storage = NonNull::new(info.storage).map(StorageRef);
    // SAFETY: `err` is what this call stored.
    unsafe { ffi::check("tb_tch_describe", status, err) }?;
    Ok((info, storage))
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

/// libtorch's current stream of CUDA device `index` on this thread, and whether it is an
/// external stream (made from a handle libtorch does not own: `torch.cuda.ExternalStream`,
/// `getStreamFromExternal`), which nothing promises to keep alive past the call.
fn current_cuda_stream_life(index: i8) -> Result<(Stream, bool), Error> {
    let mut handle = ptr::null_mut();
    let mut id = 0i64;
    let mut err = ptr::null_mut();
    // SAFETY: plain values and three live out-parameters the shim writes once each.
    let status = unsafe {
        ffi::tb_tch_current_stream_id(TorchDeviceType::CUDA, index, &mut handle, &mut id, &mut err)
    };
    // SAFETY: `err` is what this call stored.
    unsafe { ffi::check("tb_tch_current_stream_id", status, err) }?;
    Ok((
        tensorbridge_cuda::stream_from_raw(handle.cast()),
        is_external_stream_id(id),
    ))
}

/// Whether a c10/cuda `StreamId` names an external stream: its id is the stream's handle, an
/// even, nonzero number (the default stream is 0; libtorch's pool streams have the low bit
/// set, which no aligned handle has).
pub(crate) fn is_external_stream_id(id: i64) -> bool {
    id != 0 && id & 1 == 0
}

/// Runs `f` with libtorch's current stream of CUDA device `ordinal` on this thread (tch has
/// no stream API, so from Rust this is libtorch's default stream unless C++ code set
/// another), as a cudarc stream: a cudarc kernel launched on it is ordered after the libtorch
/// work enqueued before it and before the libtorch work enqueued after it, with no host
/// wait, like a libtorch operation. With [`import`] for the arguments and the cudarc
/// adapter's `KernelArgs` for checked views, that is a kernel of your own on tch tensors,
/// read and written in place.
///
/// libtorch's default stream and its pool streams live for the process: `f` gets the stream
/// itself (no event at all). An external stream (made current from a handle libtorch does not
/// own: `getStreamFromExternal`, Python's `torch.cuda.ExternalStream`) may be destroyed as
/// soon as the call returns, so `f` gets a stream of the CUDA layer instead, forked from it
/// and joined back to it on the GPU (`tensorbridge_cuda::StreamLife::CallOnly`): the same
/// order, and no clone of the stream `f` sees, kept however long, ever names the external
/// stream.
///
/// The caller's CUDA context is restored after `f`. Without libcuda, the CUDA layer's
/// `NoDriver`; an ordinal above 127, [`Error::OrdinalOutOfRange`].
///
/// ```no_run
/// # fn demo(x: &tch::Tensor, y: &tch::Tensor, f: &cudarc::driver::CudaFunction)
/// #     -> Result<(), Box<dyn std::error::Error>> {
/// use cudarc::driver::PushKernelArg;
/// // SAFETY: nothing resizes x's or y's storage while xt and yt live, and no other thread
/// // changes x or y during the imports.
/// let (xt, yt) = unsafe { (tensorbridge_tch::import(x)?, tensorbridge_tch::import(y)?) };
/// tensorbridge_tch::with_current_stream(0, |stream| {
///     let args = tensorbridge_cudarc::KernelArgs::new(stream);
///     let (xv, mut yv) = (args.input::<f32>(&xt)?, args.output::<f32>(&yt)?);
///     let n = yv.numel();
///     // SAFETY: `f` is `(const float*, float*, long long)`, a grid-stride loop over `n`
///     // contiguous floats.
///     unsafe { stream.launch_builder(f).arg(&xv).arg(&mut yv).arg(&(n as i64))
///         .launch(tensorbridge_cudarc::grid_stride(n))? };
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
    let (stream, external) = current_cuda_stream_life(index)?;
    let life = if external {
        tensorbridge_cuda::StreamLife::CallOnly
    } else {
        tensorbridge_cuda::StreamLife::Immortal
    };
    // SAFETY: libtorch's current stream is live now (it is current). Its default stream and
    // pool streams are never destroyed (`Immortal`); an external one is promised nothing
    // past the call, and is used only for it (`CallOnly`).
    Ok(unsafe { tensorbridge_cuda::with_stream_raw(ordinal, stream, life, f) }?)
}

/// A tch tensor as a core [`Tensor`], zero-copy: same memory, same shape, strides in
/// elements and storage offset (as the byte offset), read-write.
///
/// The tensor's owner is one reference to `t`'s storage (a `c10::Storage` copy: one atomic
/// increment, no tensor and no libtorch allocation), so the storage stays alive until the
/// last clone of the returned tensor is dropped, however long `t` itself lives, and
/// whatever `set_`, `set_data` or `set_source_tensor_` later rebind `t` to. On CUDA the
/// tensor is [`Ready::Stream`] of libtorch's current stream for its device on this thread,
/// where PyTorch's convention places pending work.
///
/// Refused with a typed error: undefined tensors, non-strided layouts (sparse, MKL-DNN),
/// tensors whose conjugate or negative bit is set, scalar types without a DLPack code
/// (quantized, `Bits*`, sub-byte integers), devices other than CPU and CUDA (meta, MPS...).
///
/// ```
/// let t = tch::Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]).reshape([2, 3]);
/// let col = t.narrow(1, 1, 1); // a view libtorch made: offset 1, strides [3, 1]
/// // SAFETY: nothing resizes `t`'s storage while `shared` lives; `col` is on this thread only.
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
/// 2. While `import` runs, nothing changes `t`'s shape, strides, offset or storage on another
///    thread: no in-place metadata change (`resize_`, `set_`, `set_data`, `as_strided_`,
///    `transpose_`, `squeeze_`, `unsqueeze_`...) through any tensor that shares `t`'s
///    `TensorImpl`. Borrowing `t` does not promise that: `tch::Tensor` is `Send`, and a
///    `shallow_clone` (the same `TensorImpl`) moved to another thread changes `t` too,
///    through tch's safe API. The import reads the sizes and strides where libtorch keeps
///    them, and libtorch does not synchronise such changes with readers (for libtorch's own
///    readers too it is a data race).
pub unsafe fn import(t: &tch::Tensor) -> Result<Tensor, Error> {
    let (info, storage) = describe(t)?;
    // A refusal from here on drops `storage`, which gives the reference back.
    let desc = validate(&info)?;
    let ready = readiness(desc.device(), info.device_index)?;
    // `validate` accepted a defined strided tensor, for which a successful describe always
    // takes the reference; a shim that did not is reported, never trusted.
    let owner = Arc::new(storage.ok_or_else(|| Error::Torch {
        call: "tb_tch_describe",
        message: "no storage reference for a strided tensor".to_owned(),
    })?);
    // The descriptor is moved once, straight into the returned `Tensor` (a few hundred
    // bytes: building the tensor first and moving it into the result copied it twice).
    Ok(match ready {
        // SAFETY: from_descriptor:
        // - 1: the span is the part of `t`'s storage that its sizes, strides and offset
        //   reach, which libtorch keeps allocated, on the device it reports, while the
        //   reference in the owner holds the storage (whose `DataPtr` owns the memory) and
        //   nothing reallocates it (the caller's obligation 1); libtorch tensors are
        //   writable;
        // - 2: host views of the result read while libtorch may write through other tensors
        //   of the same storage only if safe tch code writes from another thread at the same
        //   time, which tch itself allows for its own shallow clones: this crate adds no race
        //   that tch does not have (see the crate's `# Soundness`).
        Ready::Now => unsafe { Tensor::from_descriptor(desc, owner) },
        ready => {
            // SAFETY: from_descriptor, as in the arm above.
            let tensor = unsafe { Tensor::from_descriptor(desc, owner) };
            // SAFETY: with_ready:
            // - 1: PyTorch's convention is that the work producing a tensor is enqueued on
            //   the current stream of its device; the data is ready once that stream's work
            //   so far has finished;
            // - 2: the stream is libtorch's current stream of the tensor's device: its
            //   default stream or a stream of its pool, which libtorch never destroys (the
            //   device's primary context, as libtorch uses the runtime API). An external
            //   stream made current by C++ or Python code is that code's to keep alive (tch
            //   cannot);
            // - 3: a per-thread default stream became an event in `readiness`; a signal
            //   names none.
            unsafe { tensor.with_ready(ready) }
        }
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
        // at the tensor's own `ndim` extents and strides, which live as long as its
        // metadata is not changed; this thread borrows the tensor for the whole import and
        // no other thread changes it meanwhile (obligation 2 of `import`: a shared borrow
        // alone would not do, since a shallow clone on another thread shares the
        // `TensorImpl`), so they stay in place until the core has copied them
        // (`validate` below).
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
    if device.kind != tensorbridge_core::DeviceType::Cuda {
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

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device as TchDevice, Kind};

    /// c10/cuda's stream ids: 0 is the default stream, odd ids are libtorch's pool streams
    /// (`(index << 5 | type << 1) | 1`, by `CUDAStream.cpp`), an external stream's id is its
    /// handle (even: a pointer).
    #[test]
    fn external_streams_are_told_by_their_id() {
        assert!(!is_external_stream_id(0), "the default stream");
        for pool in [1, 0b11, (3 << 5) | (1 << 1) | 1, (31 << 5) | (2 << 1) | 1] {
            assert!(!is_external_stream_id(pool), "pool stream id {pool:#x}");
        }
        for handle in [0x5555_0000_1000_i64, 0x7f12_3456_7890, 2 << 40] {
            assert!(is_external_stream_id(handle), "external stream {handle:#x}");
        }
    }

    /// The reference count of `t`'s storage, as libtorch keeps it.
    fn use_count(t: &tch::Tensor) -> i64 {
        // SAFETY: `t.as_ptr()` is a live `C_tensor` borrowed for the call.
        unsafe { ffi::tb_tch_storage_use_count(t.as_ptr()) }
    }

    /// The owner is exactly one reference to the storage, shared by every clone of the
    /// import and given back once, with the last of them. With a detached alias as owner the
    /// count also rose by one; with no owner it would not rise; a double release would drop it
    /// below 1 (and free the storage under `t`).
    #[test]
    fn the_owner_is_one_storage_reference_released_once() {
        let t = tch::Tensor::arange(6, (Kind::Float, TchDevice::Cpu));
        let view = t.narrow(0, 1, 3);
        let base = use_count(&t);
        assert_eq!(base, 2, "one reference per TensorImpl over the storage");
        // SAFETY: nothing resizes `t`'s storage in this test.
        let a = unsafe { import(&view) }.unwrap();
        assert_eq!(use_count(&t), base + 1);
        // SAFETY: as above.
        let b = unsafe { import(&t) }.unwrap();
        assert_eq!(use_count(&t), base + 2, "one reference per import");
        let clones = [a.clone(), a.clone()];
        assert_eq!(
            use_count(&t),
            base + 2,
            "clones share their import's reference"
        );
        drop(a);
        assert_eq!(use_count(&t), base + 2);
        drop(clones);
        assert_eq!(use_count(&t), base + 1, "released with the last clone");
        let on_another_thread = std::thread::spawn(move || drop(b));
        on_another_thread.join().unwrap();
        assert_eq!(
            use_count(&t),
            base,
            "released on the thread that dropped it"
        );
    }

    /// Refusals the Rust side makes after the shim took the reference (conjugate and
    /// negative bits, scalar types without a DLPack code) give it back; refusals the shim
    /// makes (undefined, not strided) never took one.
    #[test]
    fn refusals_give_the_reference_back() {
        let z = tch::Tensor::zeros([2], (Kind::ComplexFloat, TchDevice::Cpu));
        let x = tch::Tensor::zeros([2], (Kind::Float, TchDevice::Cpu));
        let q = tch::Tensor::from_slice(&[0.5f32, 1.0]).quantize_per_tensor(0.1, 0, Kind::QInt8);
        for (name, t) in [
            ("conj", z.conj()),
            ("neg", x.internal_neg_view()),
            ("qint8", q.shallow_clone()),
        ] {
            let before = use_count(&t);
            // SAFETY: refused; nothing is resized.
            let err = unsafe { import(&t) }.unwrap_err();
            assert!(
                matches!(
                    err,
                    Error::ConjugateBit | Error::NegativeBit | Error::UnsupportedScalarType { .. }
                ),
                "{name}: {err}"
            );
            assert_eq!(use_count(&t), before, "{name}: no reference kept");
        }
        let (info, storage) = describe(&tch::Tensor::new()).unwrap();
        assert!(info.defined == 0 && storage.is_none());
        let sparse = tch::Tensor::eye(2, (Kind::Float, TchDevice::Cpu)).to_sparse(
            None,
            None::<&[i64]>,
            None,
        );
        let (info, storage) = describe(&sparse).unwrap();
        assert!(info.layout != TorchLayout::STRIDED && storage.is_none());
    }
}
