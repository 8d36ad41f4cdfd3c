//! The functions of the `tensorbridge` Python module: `asview` and `from_ptr`.

use pyo3::prelude::*;
use tensorbridge_core::{Access, Descriptor, Device, DeviceType, RawTensor, Ready, Stream, Tensor};

use crate::convert::{current_cuda_ordinal, device_from_py, dtype_from_py, type_name};
use crate::error::{Error, Result};
use crate::floor::stream::StreamArg;
use crate::floor::view::View;
use crate::owner::Release;

/// asview(obj, *, stream=None)
/// --
///
/// A zero-copy view of any tensor or array.
///
/// Tries, in this order: the DLPack C exchange API of ``type(obj)``;
/// ``obj.__dlpack__(max_version=(1, 3), stream=stream)`` (retried without ``max_version``
/// for producers older than DLPack 1.0); a DLPack capsule (consumed once: a used capsule
/// raises BufferError); ``__cuda_array_interface__`` (versions 0 to 3); ``__array_interface__``;
/// the buffer protocol. An exact ``numpy.ndarray`` whose dimensions are all longer than 1 is
/// read through the buffer protocol first: the same view its ``__dlpack__`` gives, without
/// the Python call. The producer object is kept alive as long as the view, or anything made
/// from it, lives.
///
/// ``stream`` is the CUDA stream the caller will use the data on, read as every ``stream=``
/// of tensorbridge reads it: a stream object (``torch.cuda.Stream``, ``cupy.cuda.Stream``,
/// anything with ``__cuda_stream__``) or an int with DLPack's meanings: ``-1`` (no
/// synchronisation), ``1`` (legacy default), ``2`` (per-thread default) or a ``cudaStream_t``
/// handle; ``0`` raises ValueError (ambiguous: pass ``1`` or the stream object). When the call returns,
/// work the caller enqueues on that stream sees the producer's data (the producer or
/// tensorbridge made the stream wait on the GPU; the host never blocks). A handle need only
/// be alive during the call: the view never names it. Host data ignores it. A ROCm producer gets it in ROCm's
/// values (``1`` becomes ROCm's default stream ``0``; ``2`` raises ValueError).
///
/// With ``stream=None`` (the default) nothing is enqueued: the view remembers where the
/// producer's data is ready (PyTorch's current stream, through the DLPack C exchange API; the
/// legacy default stream for producers asked through ``__dlpack__``; the CUDA Array
/// Interface's ``stream``), and every consumer that takes the view (``torch.from_dlpack``,
/// CuPy, a Rust kernel) orders its own stream against that, on the GPU, when it takes it.
/// That keeps ``asview`` legal inside CUDA graph capture.
///
/// Raises TypeError, naming the type, for objects that implement none of the protocols.
#[pyfunction]
#[pyo3(signature = (obj, *, stream=None))]
pub(crate) fn asview(obj: &Bound<'_, PyAny>, stream: Option<&Bound<'_, PyAny>>) -> PyResult<View> {
    let stream = StreamArg::read(stream)?;
    // SAFETY: the Python caller vouches for its stream (the DLPack protocol's contract for
    // `stream`, documented above): live on the data's device for the call. The view never
    // names it (`Consumer`).
    let consumer = unsafe { crate::floor::ready::Consumer::assume_arg(&stream) };
    let mut imported = crate::import::import(obj, consumer)?;
    crate::import::settle(&mut imported)?;
    // Why it is read-only travels with the view (`crate::floor::access`).
    let provenance = imported.provenance;
    Ok(View::with_provenance(imported.into_tensor(obj), provenance))
}

/// from_ptr(ptr, shape, dtype, *, strides=None, device=None, owner=None, release=None, readonly=False, producer_stream=None)
/// --
///
/// A view of memory given by its address: a CUDA allocation from any library, or host
/// memory from a C library through ctypes.
///
/// ``shape`` and ``strides`` (in ELEMENTS; ``None`` means C order) describe the layout;
/// ``dtype`` is a name ("float32", "bfloat16", "f4", ...), a NumPy, ml_dtypes or torch dtype,
/// or float/int/bool/complex; ``device`` is "cpu", "cuda", "cuda:N", "cuda_host",
/// "cuda_managed", a torch device or a DLPack ``(device_type, device_id)`` tuple. With
/// ``device=None`` the CUDA driver says where the pointer lives (host pointers need
/// ``device="cpu"``).
///
/// On CUDA devices the driver is asked whether the whole byte span lies inside one live
/// allocation on that device, and ValueError says what is wrong otherwise (an address that
/// is no allocation, a span past the allocation's end with its range, another device).
/// Host pointers CANNOT be checked: a wrong host address crashes the consumer.
///
/// ``owner`` is kept alive as long as the view or anything made from it lives. ``release``,
/// a callable taking no arguments, is called exactly once when the last user is gone (also
/// on another thread, or when a DLPack consumer drops its tensor); it is not called if
/// ``from_ptr`` raises.
///
/// ``producer_stream`` is the CUDA stream the PRODUCER is still writing the data on, read as
/// every ``stream=`` of tensorbridge reads it: ``None`` (or ``-1``) when nothing is pending,
/// ``1`` legacy default, ``2`` per-thread default, a handle or a stream object alive during
/// the call (an event is recorded on it at once, and the view names that event, not the
/// stream); ``0`` raises ValueError. Consumers wait for
/// it on the GPU. It is not ``asview``'s ``stream``, which is the
/// stream the CONSUMER will read on (DLPack's conventions).
#[pyfunction]
#[pyo3(signature = (
    ptr, shape, dtype, *, strides=None, device=None, owner=None, release=None,
    readonly=false, producer_stream=None
))]
#[allow(clippy::too_many_arguments)] // The Python signature.
pub(crate) fn from_ptr(
    ptr: &Bound<'_, PyAny>,
    shape: Vec<i64>,
    dtype: &Bound<'_, PyAny>,
    strides: Option<Vec<i64>>,
    device: Option<&Bound<'_, PyAny>>,
    owner: Option<Py<PyAny>>,
    release: Option<Py<PyAny>>,
    readonly: bool,
    producer_stream: Option<&Bound<'_, PyAny>>,
) -> PyResult<View> {
    let raw = RawPtr {
        ptr,
        shape: &shape,
        dtype,
        strides: strides.as_deref(),
        device,
        readonly,
        producer_stream,
    };
    Ok(View::new(from_ptr_impl(raw, owner, release)?))
}

/// `from_ptr`'s arguments that describe the memory, as Python passed them.
struct RawPtr<'a, 'py> {
    ptr: &'a Bound<'py, PyAny>,
    shape: &'a [i64],
    dtype: &'a Bound<'py, PyAny>,
    strides: Option<&'a [i64]>,
    device: Option<&'a Bound<'py, PyAny>>,
    readonly: bool,
    producer_stream: Option<&'a Bound<'py, PyAny>>,
}

/// `from_ptr`: every argument checked (the address, the device, `release`, the producer
/// stream, the layout, and on CUDA the span, by the driver) before the memory is trusted.
/// Nothing is called or kept on failure: `release` stays the caller's.
fn from_ptr_impl(
    raw: RawPtr<'_, '_>,
    owner: Option<Py<PyAny>>,
    release: Option<Py<PyAny>>,
) -> Result<Tensor> {
    let py = raw.ptr.py();
    let addr = address(raw.ptr)?;
    let (dtype, packing) = dtype_from_py(raw.dtype)?;
    let device = resolve_device(raw.device, addr)?;
    if let Some(release) = &release
        && !release.bind(py).is_callable()
    {
        return Err(Error::NotCallable {
            type_name: type_name(release.bind(py)),
        });
    }
    let ready = producer_ready(raw.producer_stream, device)?;
    let desc = RawTensor {
        strides: raw.strides,
        access: if raw.readonly {
            Access::ReadOnly
        } else {
            Access::ReadWrite
        },
        packing,
        ..RawTensor::new(addr, device, dtype, raw.shape)
    }
    .validate()?;
    check_device_span(&desc)?;
    // A readiness that names a stream handle or a thread's own stream becomes an event
    // recorded on it now, while the caller vouches that it is alive: the view then names no
    // stream its creator may destroy (`[ready]`). That may fail, and `release` must not run
    // for a `from_ptr` that raises (it stays the caller's), so the owner holding it is made
    // only after everything that can fail.
    let ready = match ready {
        Ready::Stream(Stream::Handle(_)) | Ready::Stream(Stream::PerThreadDefault) => {
            crate::floor::ready::settled(&desc, &ready)?
        }
        ready if crate::floor::ready::needs_settling(&ready, desc.device().kind) => {
            crate::floor::ready::settled(&desc, &ready)?
        }
        ready => ready,
    };
    // SAFETY: the Python caller vouches for the memory, as every raw-pointer API does (the
    // docstring says so): valid on `device` until `release` is called / `owner` is dropped,
    // which happens only when the tensor's last clone drops this owner; on CUDA the driver
    // confirmed that the span lies in one live allocation of that device.
    let tensor = unsafe { Tensor::from_descriptor(desc, Release::owner(release, owner)) };
    // SAFETY: the caller vouches that `producer_stream` is where the data becomes ready and
    // that it is alive now; a handle became an event recorded on it just above, and the
    // default streams always live; `None` means nothing is pending.
    Ok(unsafe { tensor.with_ready(ready) })
}

/// The address in `ptr`: a non-negative int.
fn address(ptr: &Bound<'_, PyAny>) -> Result<usize> {
    if let Ok(addr) = ptr.extract::<usize>() {
        return Ok(addr);
    }
    match ptr.extract::<i64>() {
        Ok(value) => Err(Error::NegativePointer { value }),
        Err(_) => Err(Error::NotAPointer {
            type_name: type_name(ptr),
        }),
    }
}

/// The device `from_ptr` was given, or, for `device=None`, the one the CUDA driver places
/// `addr` on (as CuPy's `UnownedMemory` asks it; a host pointer must say `device="cpu"`),
/// or the current CUDA device when there is nothing to ask (no driver, a null pointer).
fn resolve_device(device: Option<&Bound<'_, PyAny>>, addr: usize) -> Result<Device> {
    let device = match device.filter(|d| !d.is_none()) {
        Some(d) => device_from_py(d)?,
        None if addr != 0 && tensorbridge_cuda::driver_present() => {
            tensorbridge_cuda::inspect(addr)?.device()
        }
        None => Device::cuda(current_cuda_ordinal()),
    };
    if device.kind == DeviceType::Cpu && device.ordinal != 0 {
        return Err(Error::HostOrdinal { device });
    }
    Ok(device)
}

/// Where the data becomes ready: `producer_stream` read by the one reader ([`StreamArg`]:
/// `None` and `-1` mean nothing is pending); only memory CUDA can reach has streams.
fn producer_ready(producer_stream: Option<&Bound<'_, PyAny>>, device: Device) -> Result<Ready> {
    match StreamArg::read(producer_stream)? {
        StreamArg::Absent | StreamArg::NoSync => Ok(Ready::Now),
        StreamArg::Stream { value, .. } if !device.kind.is_cuda_accessible() => {
            Err(Error::StreamOnHost { value, device })
        }
        StreamArg::Stream { stream, .. } => Ok(Ready::Stream(stream)),
    }
}

/// On memory CUDA can reach, asks the driver that the whole span lies in one live allocation
/// of the descriptor's device; refuses (rather than trusts) a non-empty span when no driver
/// can be loaded. Host memory cannot be checked.
fn check_device_span(desc: &Descriptor) -> Result<()> {
    let device = desc.device();
    if !device.kind.is_cuda_accessible() {
        return Ok(());
    }
    if !tensorbridge_cuda::driver_present() && desc.numel() > 0 {
        return Err(Error::Unchecked {
            addr: desc.data_ptr(),
            device,
        });
    }
    tensorbridge_cuda::check_span(desc)?;
    Ok(())
}
