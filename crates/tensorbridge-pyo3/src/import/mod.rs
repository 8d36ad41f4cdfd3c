//! Any Python object -> [`Tensor`], trying the protocols in a fixed order.

pub(crate) mod buffer;
pub(crate) mod capsule;
pub(crate) mod exchange;
pub(crate) mod interfaces;

use pyo3::exceptions::{PyAttributeError, PyBufferError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict, PyString};
use tensorbridge::{
    Access, DType, DTypeCode, Device, DeviceType, Owner, Ready, StreamConvention, StreamRequest,
    Tensor, stream_from_wire, stream_to_wire,
};
use tensorbridge_cai::{ArrayData, BufferRegion, ImportOptions, TypeKind, TypeStr};
use tensorbridge_dlpack::{import_legacy, import_versioned};

use crate::convert::{dtype_from_py, type_name};
use crate::error::{Error, Result};
use crate::export::view::View;
use crate::import::capsule::{Consumed, consume};
use crate::import::interfaces::{ArrayDataSource, Which, as_dict, read_array, read_cai};
use crate::owner::KeepAlive;

/// The DLPack version this crate asks producers for.
const MAX_VERSION: (u32, u32) = (1, 3);

/// Imports `obj`, zero-copy; see [`crate::import_on_raw`] for the order and the contract.
///
/// # Safety
/// 1. `stream`, when it names a stream (neither `None` nor `-1`), is a live stream of the
///    device the tensor turns out to be on (its primary context), for the call and for as
///    long as the returned tensor or a clone of it lives.
#[inline]
pub(crate) unsafe fn import(obj: &Bound<'_, PyAny>, stream: Option<i64>) -> Result<Tensor> {
    // SAFETY: forwarded obligation 1.
    let mut t = unsafe { import_unsettled(obj, stream) }?;
    settle(&mut t)?;
    Ok(t)
}

/// A readiness that names a stream only on this thread, or only with this thread's current
/// device, becomes an event recorded now, so the tensor can cross threads (Views do): the
/// per-thread default stream (`2`), and default streams of pinned and managed memory (whose
/// device names no GPU). Anything else is kept as it is. In place: a `Tensor` is a few
/// hundred bytes, and most imports need no settling (no copy for them).
pub(crate) fn settle(t: &mut Tensor) -> Result<()> {
    if needs_settling(t.ready(), t.device().kind) {
        *t = tensorbridge_cuda::record_ready(t)?;
    }
    Ok(())
}

/// Whether [`settle`] would turn `ready` into an event for memory on a `kind` device: the
/// per-thread default stream, or a default-stream sentinel for pinned or managed memory.
pub(crate) fn needs_settling(ready: &Ready, kind: DeviceType) -> bool {
    use tensorbridge::Stream;
    match ready {
        Ready::Stream(Stream::PerThreadDefault) => true,
        Ready::Stream(Stream::LegacyDefault) => kind != DeviceType::Cuda,
        _ => false,
    }
}

/// [`import`] before [`settle`].
///
/// # Safety
/// As [`import`].
unsafe fn import_unsettled(obj: &Bound<'_, PyAny>, stream: Option<i64>) -> Result<Tensor> {
    // Checked before any producer is asked, so a bad value is refused whatever the object.
    stream_from_wire(StreamConvention::DlpackCuda, stream)?;
    if let Ok(view) = obj.cast::<View>() {
        let t = view.get().tensor().clone();
        // SAFETY: forwarded obligation 1.
        unsafe { order_consumer(&t, stream) }?;
        return Ok(t);
    }
    let info = exchange::type_info(obj)?;
    if info.masked {
        refuse_masked(obj)?;
    }
    if info.ndarray
        && let Some(t) = buffer::ndarray(obj)?
    {
        return Ok(t);
    }
    // A producer that refuses with `BufferError` (data DLPack cannot describe, such as
    // NumPy's ml_dtypes arrays) may still offer an interface or a buffer: try those, and
    // raise its refusal only if none is left.
    let mut refused = None;
    let table = info.table;
    if let exchange::Table::Usable(api) = table {
        // SAFETY: forwarded obligation 1.
        match unsafe { from_exchange(obj, api, &info, stream) } {
            // Not eligible (see `exchange::eligible`): `__dlpack__` says why.
            Ok(None) => {}
            Ok(Some(t)) => return Ok(t),
            // The table's functions skip the checks of the producer's `__dlpack__` and
            // report what they cannot export as C++ errors with their backtrace (PyTorch:
            // sparse, mkldnn, quantized, bit and meta tensors, where `__dlpack__` raises
            // `BufferError` with a one-line message). Ask `__dlpack__`: it raises the
            // producer's own exception (or exports what the table could not). Ours, without
            // the C++ frames, is kept for a producer without `__dlpack__`.
            Err(Error::Python(e)) => {
                refused = Some(Error::Python(exchange::without_cpp_frames(obj.py(), e)));
            }
            Err(e) => return Err(e),
        }
    }
    if obj.cast::<PyCapsule>().is_err() && obj.hasattr(pyo3::intern!(obj.py(), "__dlpack__"))? {
        // SAFETY: forwarded obligation 1.
        match unsafe { from_dlpack(obj, stream) } {
            // A producer whose type publishes an exchange table (PyTorch) implements DLPack
            // completely: its refusal is final (its other interfaces would refuse with
            // another exception type, or export what DLPack refused).
            Err(Error::Python(e))
                if e.is_instance_of::<PyBufferError>(obj.py()) && !table.published() =>
            {
                refused = Some(Error::Python(e));
            }
            // A capsule whose description does not validate, from a producer that also offers
            // an array interface: CuPy 14.2 exports negative strides through DLPack as
            // `(u64)byte_stride / itemsize` (2**62 - 1 for -4 bytes of float32), while its
            // `__cuda_array_interface__` says -4. The capsule is already given back (its
            // deleter ran once); the interface is validated on its own below, and its error is
            // the one raised if it fails too.
            Err(e @ Error::Dlpack(tensorbridge_dlpack::Error::Core(_)))
                if !table.published() && has_interface(obj)? =>
            {
                refused = Some(e);
            }
            result => return result,
        }
    }
    if let Ok(capsule) = obj.cast::<PyCapsule>()
        && crate::import::capsule::is_dlpack_capsule(capsule)
    {
        // A capsule carries no stream: its producer ordered whatever it had to when it made
        // it, so there is nothing to wait for.
        return from_capsule(capsule);
    }
    if let Some(cai) = attribute(obj, pyo3::intern!(obj.py(), "__cuda_array_interface__"))? {
        // SAFETY: forwarded obligation 1.
        return unsafe { from_cai(obj, &cai, stream) };
    }
    if let Some(ai) = attribute(obj, pyo3::intern!(obj.py(), "__array_interface__"))? {
        return from_array_interface(obj, &ai);
    }
    if let Some(held) = buffer::hold(obj)? {
        return buffer::tensor(held);
    }
    Err(refused.unwrap_or_else(|| Error::NotATensor {
        type_name: type_name(obj),
    }))
}

/// Whether `obj` offers `__cuda_array_interface__` or `__array_interface__`.
fn has_interface(obj: &Bound<'_, PyAny>) -> Result<bool> {
    let py = obj.py();
    Ok(obj.hasattr(pyo3::intern!(py, "__cuda_array_interface__"))?
        || obj.hasattr(pyo3::intern!(py, "__array_interface__"))?)
}

/// Refuses a NumPy masked array (`obj`'s type is one) that masks elements: it inherits
/// `__dlpack__` and `__array_interface__` from `ndarray`, and neither carries the mask, so a
/// view would show masked elements as valid. Arrays without a mask (`nomask`, or all `False`)
/// pass.
fn refuse_masked(obj: &Bound<'_, PyAny>) -> Result<()> {
    let Some(mask) = attribute(obj, pyo3::intern!(obj.py(), "mask"))? else {
        return Ok(());
    };
    let masked: u64 = mask.call_method0("sum")?.extract()?;
    if masked == 0 {
        return Ok(());
    }
    let total: u64 = obj.getattr(pyo3::intern!(obj.py(), "size"))?.extract()?;
    Err(Error::Masked { masked, total })
}

/// ml_dtypes gives `float8_e5m2` the typestr `<f1` (kind `f`, one byte) where its other
/// 8-bit types say `<V1`: when the object's own `dtype` names a one-byte dtype the core knows,
/// read `f1` as raw bytes of that dtype, as for `V1` (`descr` repeated the typestr; it goes
/// too). NumPy itself has no one-byte float.
fn one_byte_float(
    obj: &Bound<'_, PyAny>,
    typestr: &mut TypeStr,
    descr: &mut Option<Vec<tensorbridge_cai::DescrField>>,
) {
    if typestr.kind != TypeKind::Float || typestr.size != Some(1) {
        return;
    }
    let named = obj
        .getattr("dtype")
        .ok()
        .and_then(|d| dtype_from_py(&d).ok())
        .is_some_and(|(d, _)| d.itemsize() == 1 && d.code() != tensorbridge::DTypeCode::Float);
    if named {
        *typestr = TypeStr::new(
            tensorbridge_cai::ByteOrder::NotApplicable,
            TypeKind::Void,
            1,
        );
        *descr = None;
    }
}

/// `obj.<name>`, or `None` when it has no such attribute.
fn attribute<'py>(
    obj: &Bound<'py, PyAny>,
    name: &Bound<'py, PyString>,
) -> Result<Option<Bound<'py, PyAny>>> {
    match obj.getattr(name) {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.is_instance_of::<PyAttributeError>(obj.py()) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The same tensor, with `obj` kept alive as long as it (and its clones) live.
fn keep_alive(t: Tensor, obj: &Bound<'_, PyAny>) -> Tensor {
    let owner: Owner = KeepAlive::owner(obj.clone().unbind(), Some(t.owner().clone()));
    let ready = t.ready().clone();
    // SAFETY: the new owner holds the old one, so every guarantee the old owner gave for
    // the descriptor holds as long as the new one lives.
    let kept = unsafe { Tensor::from_descriptor(t.descriptor().clone(), owner) };
    // SAFETY: the readiness the tensor had, for the same memory: still true, and the streams
    // it names stay live under the same promise as before.
    unsafe { kept.with_ready(ready) }
}

/// Whether a device's memory is ordered by CUDA streams (and so carries a readiness).
fn is_stream_ordered(device: Device) -> bool {
    matches!(device.kind, DeviceType::Cuda | DeviceType::CudaManaged)
}

/// Makes the caller's `stream` wait (on the GPU) until `t` is ready, when one was given
/// and `t` is CUDA memory.
///
/// # Safety
/// 1. A `stream` that names a stream is live on `t`'s device for the call.
unsafe fn order_consumer(t: &Tensor, stream: Option<i64>) -> Result<()> {
    if stream.is_none() || !t.device().kind.is_cuda_accessible() || t.ready().is_now() {
        return Ok(());
    }
    if let StreamRequest::Stream(consumer) = stream_from_wire(StreamConvention::DlpackCuda, stream)?
    {
        // SAFETY: obligation 1.
        unsafe { tensorbridge_cuda::make_ready_on_raw(t, consumer) }?;
    }
    Ok(())
}

/// A consumed DLPack capsule's tensor (its deleter runs when the last clone is dropped).
fn from_capsule(capsule: &Bound<'_, PyCapsule>) -> Result<Tensor> {
    match consume(capsule)? {
        // SAFETY:
        // - 1 and 3: the capsule's producer follows the DLPack contract (the protocol this
        //   import trusts, as every DLPack consumer does);
        // - 2: the capsule was renamed `used_*`, so its destructor no longer releases the
        //   tensor: ownership is ours and passes to the import (a refusal releases it).
        Consumed::Versioned(m) => Ok(unsafe { import_versioned(m) }
            .map_err(tensorbridge_dlpack::Error::from)?
            .into_tensor()),
        // Legacy capsules have no read-only flag; producers that care (NumPy) refuse to
        // export read-only data through them, so they are read-write.
        // SAFETY: as above.
        Consumed::Legacy(m) => Ok(unsafe { import_legacy(m, Access::ReadWrite) }
            .map_err(tensorbridge_dlpack::Error::from)?
            .into_tensor()),
    }
}

/// `obj.__dlpack__(max_version=(1, 3), stream=...)`, with the legacy call as the fallback.
///
/// # Safety
/// As [`import`].
unsafe fn from_dlpack(obj: &Bound<'_, PyAny>, stream: Option<i64>) -> Result<Tensor> {
    let py = obj.py();
    // Only device memory with streams takes one (the array API: CPU takes only None), and
    // always explicitly: a producer's own default need not be the protocol's `None`
    // (PyTorch's is -1, no synchronisation), and the readiness below relies on what `None`
    // means. `Some(None)` passes `stream=None`; `None` passes no `stream` at all. A caller
    // without a stream passes `stream=None`, which every device takes, without asking the
    // device first.
    let passed: Option<Option<i64>> = if stream.is_none() {
        Some(None)
    } else {
        match dlpack_device(obj)? {
            Some((2 | 13, _)) => Some(stream),
            Some((10, _)) => Some(rocm_stream(stream)?),
            _ => None,
        }
    };
    let method = pyo3::intern!(py, "__dlpack__");
    let kwargs = PyDict::new(py);
    kwargs.set_item(pyo3::intern!(py, "max_version"), max_version(py))?;
    if let Some(s) = passed {
        kwargs.set_item(pyo3::intern!(py, "stream"), s)?;
    }
    let result = match obj.call_method(method, (), Some(&kwargs)) {
        Ok(r) => r,
        // A producer that predates DLPack 1.0 does not know `max_version`; one that predates
        // streams (and says no device) does not know `stream` either.
        Err(e) if e.is_instance_of::<PyTypeError>(py) => {
            let legacy = PyDict::new(py);
            if let Some(s) = passed {
                legacy.set_item(pyo3::intern!(py, "stream"), s)?;
            }
            match obj.call_method(method, (), Some(&legacy)) {
                Err(e) if e.is_instance_of::<PyTypeError>(py) && stream.is_none() => {
                    obj.call_method0(method)?
                }
                other => other?,
            }
        }
        Err(e) => return Err(e.into()),
    };
    let capsule = result.cast::<PyCapsule>().map_err(|_| Error::NotACapsule {
        type_name: type_name(obj),
        found: type_name(&result),
    })?;
    let t = keep_alive(from_capsule(capsule)?, obj);
    let t = if is_stream_ordered(t.device())
        && let Some(passed) = passed
    {
        // The producer made the stream we passed (None: the legacy default stream) wait
        // for its work: the data is ready there. (A CUDA producer got the caller's stream
        // unchanged.)
        match stream_from_wire(StreamConvention::DlpackCuda, passed)? {
            // SAFETY:
            // - 1: the producer ordered `s` after its work (the protocol's promise);
            // - 2 and 3: a default stream is always live; a handle is the caller's stream,
            //   live while the tensor lives (obligation 1); the per-thread stream is the
            //   caller's thread's, which is where the caller uses it.
            StreamRequest::Stream(s) => unsafe { t.with_ready(Ready::Stream(s)) },
            // -1: the caller opted out of synchronisation.
            StreamRequest::NoSync => t,
        }
    } else {
        // The producer did not say its device (so got no stream): it synchronised as for
        // `None`, on the legacy default stream; order the caller's stream after that.
        let t = if is_stream_ordered(t.device()) {
            // SAFETY: as above, for the legacy default stream, which is always live.
            unsafe { t.with_ready(Ready::Stream(tensorbridge::Stream::LegacyDefault)) }
        } else {
            t
        };
        // SAFETY: forwarded obligation 1.
        unsafe { order_consumer(&t, stream) }?;
        t
    };
    Ok(t)
}

/// `obj.__dlpack_device__()`, or `None` when it has none or fails to name the device.
fn dlpack_device(obj: &Bound<'_, PyAny>) -> Result<Option<(i32, i32)>> {
    let py = obj.py();
    Ok(
        match attribute(obj, pyo3::intern!(py, "__dlpack_device__"))? {
            Some(f) => match f.call0().and_then(|d| d.extract()) {
                Ok(d) => Some(d),
                // A producer may fail to name the device of what it cannot export (PyTorch's
                // meta tensors raise ValueError, mkldnn ones NotImplementedError); its
                // `__dlpack__` says why with the refusal it means (`BufferError`). Asked as a
                // producer that does not say its device.
                Err(e) if e.is_instance_of::<pyo3::exceptions::PyException>(py) => None,
                Err(e) => return Err(e.into()),
            },
            None => None,
        },
    )
}

/// [`MAX_VERSION`] as a Python tuple, made once.
fn max_version(py: Python<'_>) -> &Bound<'_, PyAny> {
    static TUPLE: pyo3::sync::PyOnceLock<Py<PyAny>> = pyo3::sync::PyOnceLock::new();
    TUPLE
        .get_or_init(py, || {
            pyo3::types::PyTuple::new(py, [MAX_VERSION.0, MAX_VERSION.1])
                .expect("a tuple of two ints")
                .into_any()
                .unbind()
        })
        .bind(py)
}

/// The caller's stream (DLPack's CUDA values, as `asview` and [`crate::import_on_raw`] take
/// it) as a ROCm producer's `__dlpack__` reads it: `None` and -1 unchanged, the legacy
/// default stream (`1`) as ROCm's default stream `0`, handles unchanged. CUDA's per-thread
/// default stream (`2`) has no ROCm value and is refused: ROCm producers read `1` and `2`
/// as errors or as handles.
fn rocm_stream(stream: Option<i64>) -> Result<Option<i64>> {
    if stream.is_none() {
        return Ok(None);
    }
    let request = stream_from_wire(StreamConvention::DlpackCuda, stream)?;
    Ok(stream_to_wire(StreamConvention::DlpackRocm, request)?)
}

/// The DLPack C exchange API: no Python call, no synchronisation by the producer; the
/// caller's stream (None: the legacy default stream) is made to wait for the producer's
/// current work stream here. `Ok(None)`: the table may not be used for `obj`
/// ([`exchange::eligible`]), `__dlpack__` decides.
///
/// PyTorch's tensors are read through the table's non-owning `DLTensor`
/// (`dltensor_from_py_object_no_sync`), with the tensor object itself as the owner: PyTorch's
/// owning export holds the same `TensorImpl` the object holds (its memory is what the
/// object's storage is, no more: a `set_` on the object releases it under either), and marks
/// nothing read-only ([`exchange::TypeInfo::torch`]), so both say the same, and the
/// non-owning one costs no allocation and no deleter. Other producers' owning exports are
/// imported as they are (their flags may say read-only).
///
/// # Safety
/// As [`import`].
unsafe fn from_exchange(
    obj: &Bound<'_, PyAny>,
    api: exchange::ExchangeApi,
    info: &exchange::TypeInfo,
    stream: Option<i64>,
) -> Result<Option<Tensor>> {
    let borrowed = if info.torch { api.dltensor(obj)? } else { None };
    let t = match borrowed {
        Some(dl) => {
            // The description goes straight into the tensor, made before the questions below
            // (a `Tensor` is a few hundred bytes: a binding in between costs a copy); a
            // refusal below drops it, which drops only the new reference to `obj`.
            let owner = KeepAlive::owner(obj.clone().unbind(), None);
            // SAFETY: `dl`'s shape and strides are the producer's arrays, unchanged while
            // `obj` is and nothing else runs (read right here, before any Python call).
            let described = unsafe {
                tensorbridge_dlpack::describe_borrowed(&dl, api.version(), Access::ReadWrite)
            };
            let t = described.map(|desc| {
                // SAFETY:
                // - 1 and 2: the memory is the tensor object's storage, which the object
                //   keeps alive (and PyTorch writable) as long as it lives; the owner holds
                //   the object, as PyTorch's own owning export holds its `TensorImpl` (see
                //   above);
                // - 3 and 4: the readiness is set below (the producer's current work stream).
                unsafe { Tensor::from_descriptor(desc, owner) }
            })?;
            if !exchange::eligible(obj, info, Some(t.dtype().code() == DTypeCode::Complex))? {
                return Ok(None);
            }
            t
        }
        None => {
            if !exchange::eligible(obj, info, None)? {
                return Ok(None);
            }
            let managed = api.managed_tensor(obj)?;
            // SAFETY: as in `from_capsule`: the table's producer follows the DLPack contract,
            // and `managed_tensor_from_py_object_no_sync` hands over an owning tensor.
            let t = unsafe { import_versioned(managed) }
                .map_err(tensorbridge_dlpack::Error::from)?
                .into_tensor();
            keep_alive(t, obj)
        }
    };
    if !is_stream_ordered(t.device()) {
        return Ok(Some(t));
    }
    let (device_type, device_id) = t.device().to_dlpack()?;
    let producer = api.current_work_stream(obj, device_type, device_id)?;
    if stream.is_none() {
        // No consumer stream: the tensor is ready on the producer's current work stream, and
        // each consumer orders its own stream against it when it takes the tensor (nothing is
        // enqueued here, so nothing touches the legacy default stream: capture-safe).
        // SAFETY:
        // - 1: the exchange API's producer has its data ready on its current work stream;
        // - 2: PyTorch's current streams are its default stream or streams of its pools,
        //   which it never destroys; a stream a caller made current from outside
        //   (`torch.cuda.ExternalStream`) must outlive the work that uses it, which PyTorch
        //   itself requires;
        // - 3: a per-thread default stream is turned into an event by `settle` before the
        //   tensor leaves this thread's call.
        return Ok(Some(unsafe { t.with_ready(Ready::Stream(producer)) }));
    }
    match stream_from_wire(StreamConvention::DlpackCuda, stream)? {
        StreamRequest::Stream(consumer) => {
            // SAFETY: the producer's current work stream is live now (it is current), for
            // this call only: the readiness that names it never leaves this function.
            let pending = unsafe { t.clone().with_ready(Ready::Stream(producer)) };
            // SAFETY: `consumer` is live for the call (obligation 1).
            unsafe { tensorbridge_cuda::make_ready_on_raw(&pending, consumer) }?;
            // SAFETY:
            // - 1: `consumer` now waits for the producer's work;
            // - 2 and 3: obligation 1 (or the always-live legacy default stream).
            Ok(Some(unsafe { t.with_ready(Ready::Stream(consumer)) }))
        }
        // -1: the caller opted out of synchronisation.
        StreamRequest::NoSync => Ok(Some(t)),
    }
}

/// What `V` (raw bytes) typestrs mean: the object's own `dtype` attribute when it names a
/// dtype of that size (a CuPy or NumPy array of an ml_dtypes type), else bfloat16 for `V2`
/// (the one convention; see tensorbridge-cai).
fn void_options(obj: &Bound<'_, PyAny>, typestr: TypeStr) -> ImportOptions {
    if typestr.kind != TypeKind::Void {
        return ImportOptions::new();
    }
    let size = typestr.size.unwrap_or(0);
    let named = obj
        .getattr("dtype")
        .ok()
        .and_then(|d| dtype_from_py(&d).ok())
        .map(|(d, _)| d)
        .filter(|d| d.storage_bits(tensorbridge::Packing::Padded) / 8 == size);
    match (named, size) {
        (Some(d), _) => ImportOptions::new().void_as(d),
        (None, 2) => ImportOptions::new().void_as(DType::BFLOAT16),
        _ => ImportOptions::new(),
    }
}

/// `__cuda_array_interface__`: the device comes from the driver, which also checks that the
/// span lies inside one allocation; without a driver a pointer cannot be checked and is
/// refused (only a null pointer, for zero-size arrays, is taken, on `cuda:0`).
///
/// # Safety
/// As [`import`].
unsafe fn from_cai(
    obj: &Bound<'_, PyAny>,
    cai: &Bound<'_, PyAny>,
    stream: Option<i64>,
) -> Result<Tensor> {
    let mut cai = read_cai(&as_dict(Which::Cuda, cai)?)?;
    one_byte_float(obj, &mut cai.typestr, &mut cai.descr);
    let options = void_options(obj, cai.typestr);
    let checked = cai.data.address != 0;
    if checked && !tensorbridge_cuda::driver_present() {
        return Err(Error::Unchecked {
            addr: cai.data.address,
            device: Device::cuda(0),
        });
    }
    let device = if checked {
        tensorbridge_cuda::inspect(cai.data.address)?.device()
    } else {
        Device::cuda(0)
    };
    let validated = cai.import(device, &options)?;
    if checked {
        tensorbridge_cuda::check_span(validated.descriptor())?;
    }
    let owner = KeepAlive::owner(obj.clone().unbind(), None);
    // SAFETY:
    // - 1 and 2: the exporter describes memory it keeps valid while it lives (the CAI's
    //   contract), and `owner` keeps it alive; the driver confirmed the span lies in one
    //   allocation when it could be asked;
    // - 3 and 4: the exported stream lives as long as the exporting object (CAI v3), which
    //   `owner` holds, and is where the exporter's pending work is.
    let t = unsafe { validated.into_tensor(owner) };
    // SAFETY: forwarded obligation 1.
    unsafe { order_consumer(&t, stream) }?;
    Ok(t)
}

/// `__array_interface__`: host memory, as a pointer or as a buffer the dict names.
fn from_array_interface(obj: &Bound<'_, PyAny>, ai: &Bound<'_, PyAny>) -> Result<Tensor> {
    let (mut ai, source) = read_array(&as_dict(Which::Array, ai)?)?;
    let held = match source {
        ArrayDataSource::Pointer(_) => None,
        ArrayDataSource::Buffer(target) => {
            let target = target.unwrap_or_else(|| obj.clone());
            let held = buffer::hold(&target)?.ok_or_else(|| Error::InterfaceKey {
                interface: "__array_interface__",
                key: "data",
                expected: "an (int, bool) tuple, or an object with a buffer",
                found: format!("a {} without a buffer", type_name(&target)),
            })?;
            let view = held.view();
            ai.data = ArrayData::Buffer(BufferRegion {
                address: view.buf.expose_provenance(),
                len: usize::try_from(view.len).unwrap_or(0),
                readonly: view.readonly != 0,
            });
            Some(held)
        }
    };
    one_byte_float(obj, &mut ai.typestr, &mut ai.descr);
    let options = void_options(obj, ai.typestr);
    let validated = ai.import(&options)?;
    let inner = held.map(|h| h as Owner);
    let owner = KeepAlive::owner(obj.clone().unbind(), inner);
    // SAFETY:
    // - 1 and 2: the exporter's memory stays valid while it lives (the interface's contract;
    //   a buffer it names is held until the tensor is dropped), and `owner` keeps both;
    //   concurrent Python writes are the caller's business, as with NumPy views;
    // - 3 and 4: the array interface has no stream: nothing is pending.
    Ok(unsafe { validated.into_tensor(owner) })
}
