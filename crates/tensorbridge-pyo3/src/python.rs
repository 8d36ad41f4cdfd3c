//! The functions of the `tensorbridge` Python module: `asview` and `from_ptr`.

use pyo3::prelude::*;
use tensorbridge::{
    Access, RawTensor, Ready, StreamConvention, StreamRequest, Tensor, stream_from_wire,
};

use crate::convert::{device_from_py, dtype_from_py, stream_from_py, type_name};
use crate::error::{Error, Result};
use crate::owner::Release;
use crate::view::View;

/// asview(obj, *, stream=None)
/// --
///
/// A zero-copy view of any tensor or array.
///
/// Tries, in this order: the DLPack C exchange API of ``type(obj)``;
/// ``obj.__dlpack__(max_version=(1, 3), stream=stream)`` (retried without ``max_version``
/// for producers older than DLPack 1.0); a DLPack capsule (consumed once: a used capsule
/// raises BufferError); ``__cuda_array_interface__`` (versions 0 to 3); ``__array_interface__``;
/// the buffer protocol. The producer object is kept alive as long as the view, or anything
/// made from it, lives.
///
/// ``stream`` is the CUDA stream the caller will use the data on, as an int with DLPack's
/// conventions: ``-1`` (no synchronisation), ``1`` (legacy default), ``2`` (per-thread
/// default) or a ``cudaStream_t`` handle; ``0`` raises ValueError. When the call returns,
/// work the caller enqueues on that stream sees the producer's data (the producer or
/// tensorbridge made the stream wait on the GPU; the host never blocks). A handle must stay
/// alive as long as the view lives. Host data ignores it. A ROCm producer gets it in ROCm's
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
    let stream = stream_from_py(stream)?;
    // SAFETY: the Python caller vouches for its stream (the DLPack protocol's contract for
    // `stream`, documented above): live on the data's device while the view lives.
    let tensor = unsafe { crate::import::import(obj, stream) }?;
    Ok(View::new(tensor))
}

/// from_ptr(ptr, shape, dtype, *, strides=None, device="cuda:0", owner=None, release=None, readonly=False, stream=None)
/// --
///
/// A view of memory given by its address: a CUDA allocation from any library, or host
/// memory from a C library through ctypes.
///
/// ``shape`` and ``strides`` (in ELEMENTS; ``None`` means C order) describe the layout;
/// ``dtype`` is a name ("float32", "bfloat16", "f4", ...), a NumPy, ml_dtypes or torch dtype,
/// or float/int/bool/complex; ``device`` is "cpu", "cuda", "cuda:N", a torch device or a
/// DLPack ``(device_type, device_id)`` tuple.
///
/// On CUDA devices the driver is asked whether the whole byte span lies inside one live
/// allocation on that device, and ValueError says what is wrong otherwise (an address that
/// is no allocation, a span past the allocation's end with its range, another device).
/// Host pointers CANNOT be checked: a wrong host address crashes the consumer.
///
/// ``owner`` is kept alive as long as the view or anything made from it lives. ``release``,
/// a callable taking no arguments, is called exactly once when the last user is gone (also
/// on another thread, or when a DLPack consumer drops its tensor); it is not called if
/// ``from_ptr`` raises. ``stream`` is the CUDA stream the data becomes ready on (the CUDA
/// Array Interface's conventions: ``None`` when nothing is pending, ``1`` legacy default,
/// ``2`` per-thread default, or a handle that stays alive while the view lives).
#[pyfunction]
#[pyo3(signature = (
    ptr, shape, dtype, *, strides=None, device=None, owner=None, release=None,
    readonly=false, stream=None
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
    stream: Option<&Bound<'_, PyAny>>,
) -> PyResult<View> {
    Ok(View::new(from_ptr_impl(
        ptr, &shape, dtype, strides, device, owner, release, readonly, stream,
    )?))
}

#[allow(clippy::too_many_arguments)] // The Python signature.
fn from_ptr_impl(
    ptr: &Bound<'_, PyAny>,
    shape: &[i64],
    dtype: &Bound<'_, PyAny>,
    strides: Option<Vec<i64>>,
    device: Option<&Bound<'_, PyAny>>,
    owner: Option<Py<PyAny>>,
    release: Option<Py<PyAny>>,
    readonly: bool,
    stream: Option<&Bound<'_, PyAny>>,
) -> Result<Tensor> {
    let addr = match ptr.extract::<usize>() {
        Ok(a) => a,
        Err(_) => match ptr.extract::<i64>() {
            Ok(negative) => return Err(Error::NegativePointer { value: negative }),
            Err(_) => {
                return Err(Error::NotAPointer {
                    type_name: type_name(ptr),
                });
            }
        },
    };
    let (dtype, packing) = dtype_from_py(dtype)?;
    let device = match device.filter(|d| !d.is_none()) {
        Some(d) => device_from_py(d)?,
        // The driver knows where a CUDA pointer is (as CuPy's `UnownedMemory` asks it); a
        // host pointer must say `device="cpu"`.
        None if addr != 0 && tensorbridge_cuda::driver_present() => {
            tensorbridge_cuda::inspect(addr)?.device()
        }
        None => tensorbridge::Device::cuda(crate::convert::current_cuda_ordinal()),
    };
    if device.kind == tensorbridge::DeviceType::Cpu && device.ordinal != 0 {
        return Err(Error::HostOrdinal { device });
    }
    if let Some(release) = &release
        && !release.bind(ptr.py()).is_callable()
    {
        return Err(Error::NotCallable {
            type_name: type_name(release.bind(ptr.py())),
        });
    }
    let stream = stream_from_py(stream)?;
    if let Some(value) = stream
        && !device.kind.is_cuda_accessible()
    {
        return Err(Error::StreamOnHost { value, device });
    }
    let request = stream_from_wire(StreamConvention::CudaArrayInterface, stream)?;
    let raw = RawTensor {
        strides: strides.as_deref(),
        access: if readonly {
            Access::ReadOnly
        } else {
            Access::ReadWrite
        },
        packing,
        ..RawTensor::new(addr, device, dtype, shape)
    };
    let desc = raw.validate()?;
    if device.kind.is_cuda_accessible() {
        if !tensorbridge_cuda::driver_present() && desc.numel() > 0 {
            return Err(Error::Unchecked {
                addr: desc.data_ptr(),
                device,
            });
        }
        tensorbridge_cuda::check_span(&desc)?;
    }
    let ready = match request {
        StreamRequest::NoSync => Ready::Now,
        StreamRequest::Stream(s) => Ready::Stream(s),
    };
    // SAFETY: the Python caller vouches for the memory, as every raw-pointer API does (the
    // docstring says so): valid on `device` until `release` is called / `owner` is dropped,
    // which happens only when the tensor's last clone drops this owner; on CUDA the driver
    // confirmed that the span lies in one live allocation of that device.
    let tensor = unsafe { Tensor::from_descriptor(desc, Release::owner(release, owner)) };
    // SAFETY: the caller vouches that `stream` is where the data becomes ready and that it
    // lives as long as the view (documented above); `None` means nothing is pending.
    let tensor = unsafe { tensor.with_ready(ready) };
    crate::import::settle(tensor)
}
