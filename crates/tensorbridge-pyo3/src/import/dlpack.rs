//! DLPack producers: `obj.__dlpack__(...)`, bare DLPack capsules, and the owning export of an
//! exchange table that is not PyTorch's. The managed tensor is the pin (\[owner\]); its
//! deleter runs once when the last clone of the owner is dropped.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict};
use tensorbridge_core::{
    Access, Ready, Stream, StreamConvention, StreamRequest, stream_from_wire, stream_to_wire,
};
use tensorbridge_dlpack::{import_legacy, import_versioned};

use crate::convert::type_name;
use crate::error::{Error, Result};
use crate::floor::access::Provenance;
use crate::import::capsule::{Consumed, consume};
use crate::import::exchange::ExchangeApi;
use crate::import::route::TypeFacts;
use crate::import::{Consumer, Imported, Pin, attribute, is_stream_ordered, order_consumer};

/// The DLPack version this crate asks producers for.
const MAX_VERSION: (u32, u32) = (1, 3);

/// A consumed DLPack capsule's tensor. `legacy_access` is what a legacy capsule (which has no
/// read-only flag) grants: read-write only for producers known to hand out writable memory
/// that way (\[access\]); a versioned capsule says it itself. A legacy capsule imported
/// read-only was handed out without a flag by its producer: views of it may be too
/// (`crate::floor::access::flagless`).
pub(crate) fn from_capsule(
    capsule: &Bound<'_, PyCapsule>,
    legacy_access: Access,
) -> Result<Imported> {
    let (tensor, provenance) = match consume(capsule)? {
        Consumed::Versioned(m) => {
            // SAFETY:
            // - 1 and 3: the capsule's producer follows the DLPack contract (the protocol
            //   this import trusts, as every DLPack consumer does);
            // - 2: the capsule was renamed `used_*`, so its destructor no longer releases the
            //   tensor: ownership is ours and passes to the import (a refusal releases it).
            let tensor = unsafe { import_versioned(m) }
                .map_err(tensorbridge_dlpack::Error::from)?
                .into_tensor();
            // The producer's own flag says it.
            (tensor, Provenance::Flagged)
        }
        Consumed::Legacy(m) => {
            // SAFETY: as above.
            let tensor = unsafe { import_legacy(m, legacy_access) }
                .map_err(tensorbridge_dlpack::Error::from)?
                .into_tensor();
            let provenance = crate::floor::access::flagless(tensor.descriptor());
            (tensor, provenance)
        }
    };
    Ok(Imported {
        desc: tensor.descriptor().clone(),
        ready: tensor.ready().clone(),
        pin: Pin::Owner(tensor.owner().clone()),
        current: None,
        provenance,
    })
}

/// `obj.__dlpack__(max_version=(1, 3), stream=...)`, with the legacy call as the fallback.
///
/// Streams (\[ready\]): a caller without a stream passes `stream=None` explicitly (every
/// device takes it, and a producer's own default need not be the protocol's `None`:
/// PyTorch's is -1), and the producer orders the legacy default stream after its work: the
/// data is ready there. A caller's stream is passed only for device memory (asking
/// `__dlpack_device__` first), and the producer orders it; the readiness is then an event
/// recorded on it now, never the caller's stream itself.
pub(crate) fn from_dlpack(
    obj: &Bound<'_, PyAny>,
    facts: &TypeFacts,
    consumer: Consumer,
) -> Result<Imported> {
    let py = obj.py();
    // `Some(None)` passes `stream=None`; `None` passes no `stream` at all.
    let passed: Option<Option<i64>> = if consumer.request().is_none() {
        Some(None)
    } else {
        match dlpack_device(obj)? {
            Some((2 | 13, _)) => Some(consumer.wire()?),
            Some((10, _)) => Some(rocm_stream(consumer.wire()?)?),
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
                Err(e) if e.is_instance_of::<PyTypeError>(py) && consumer.request().is_none() => {
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
    let legacy_access = if facts.writable_legacy {
        Access::ReadWrite
    } else {
        Access::ReadOnly
    };
    // The provenance of a producer that hands out flagless arrays itself is its caller's
    // to set (`import::general`, for every protocol alike).
    let mut imported = from_capsule(capsule, legacy_access)?;
    if !is_stream_ordered(imported.desc.device().kind) {
        return Ok(imported);
    }
    match passed {
        // The producer ordered the legacy default stream after its work.
        Some(None) => imported.ready = Ready::Stream(Stream::LegacyDefault),
        // The producer ordered the caller's stream: the data is ready there, and an event
        // recorded on it now says so without naming it. (-1: the caller opted out of
        // synchronisation, and the readiness stays as the capsule's.)
        Some(Some(_)) => {
            if let Some(StreamRequest::Stream(s)) = consumer.request() {
                let ordinal = imported.desc.device().ordinal;
                // SAFETY: the caller's stream is live for the call (`Consumer::assume`), on
                // this thread if it is the per-thread default stream.
                let signal = unsafe { tensorbridge_cuda::CudaSignal::record_raw(ordinal, s) }?;
                imported.ready = signal.into_ready();
            }
        }
        // The producer did not say its device (so got no stream): it synchronised as for
        // `None`, on the legacy default stream; the caller's stream is ordered after that.
        None => {
            imported.ready = Ready::Stream(Stream::LegacyDefault);
            order_consumer(&imported.desc, &imported.ready, consumer)?;
        }
    }
    Ok(imported)
}

/// The owning export of a producer's exchange table (not PyTorch's, which `torch` reads
/// without one): no Python call, no synchronisation by the producer; the data is ready on
/// the producer's current work stream, which is named only while the call lasts: the
/// readiness is an event recorded on it now (\[ready\]: nothing says another producer keeps
/// its current stream alive), and a consumer's stream waits for it.
pub(crate) fn from_exchange(
    obj: &Bound<'_, PyAny>,
    api: ExchangeApi,
    facts: &TypeFacts,
    consumer: Consumer,
) -> Result<Imported> {
    let managed = api.managed_tensor(obj)?;
    // SAFETY: as in `from_capsule`: the table's producer follows the DLPack contract, and
    // `managed_tensor_from_py_object_no_sync` hands over an owning tensor.
    let tensor = unsafe { import_versioned(managed) }
        .map_err(tensorbridge_dlpack::Error::from)?
        .into_tensor();
    let mut imported = Imported {
        desc: tensor.descriptor().clone(),
        ready: Ready::Now,
        pin: Pin::Owner(tensor.owner().clone()),
        current: None,
        provenance: if facts.flagless_readonly {
            crate::floor::access::flagless_producer(tensor.descriptor())
        } else {
            Provenance::Flagged
        },
    };
    if is_stream_ordered(imported.desc.device().kind) {
        let (device_type, device_id) = imported.desc.device().to_dlpack()?;
        let current = api.current_work_stream(obj, device_type, device_id)?;
        let ordinal = imported.desc.device().ordinal;
        // SAFETY: the producer's current work stream is live now (it is current), and on
        // this thread if it is the per-thread default stream.
        let signal = unsafe { tensorbridge_cuda::CudaSignal::record_raw(ordinal, current) }?;
        imported.ready = signal.into_ready();
        order_consumer(&imported.desc, &imported.ready, consumer)?;
    }
    Ok(imported)
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

/// The caller's stream (DLPack's CUDA values) as a ROCm producer's `__dlpack__` reads it:
/// `None` and -1 unchanged, the legacy default stream (`1`) as ROCm's default stream `0`,
/// handles unchanged. CUDA's per-thread default stream (`2`) has no ROCm value and is
/// refused: ROCm producers read `1` and `2` as errors or as handles.
fn rocm_stream(stream: Option<i64>) -> Result<Option<i64>> {
    if stream.is_none() {
        return Ok(None);
    }
    let request = stream_from_wire(StreamConvention::DlpackCuda, stream)?;
    Ok(stream_to_wire(StreamConvention::DlpackRocm, request)?)
}
