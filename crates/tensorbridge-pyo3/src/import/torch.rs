//! PyTorch's tensors: read through the exchange table's non-owning `DLTensor`
//! (`dltensor_from_py_object_no_sync`, no allocation, no deleter), the memory pinned by a
//! reference to the tensor's STORAGE, never by the tensor object.
//!
//! # Why the storage
//! A tensor object can change what memory it shows while keeping its identity:
//! `torch.utils.swap_tensors(t, u)` swaps two objects' insides, `t.set_(other)` and
//! `t.data = other` rebind its storage. Each drops the object's reference to its old storage,
//! which frees the old memory when nothing else holds it, so an owner that holds the object
//! (or its `TensorImpl`, as PyTorch's own owning export does) follows the rebinding and lets
//! the memory go under every view made before. A reference to the storage itself
//! (`t.untyped_storage()`, a `StorageImpl` reference) keeps that memory whatever the object
//! does afterwards. (Growing a storage in place, `t.resize_(larger)`, moves its memory; no
//! reference can pin the old memory then. PyTorch documents the same for its own sharing;
//! API.md says so for views.)
//!
//! # The storage is verified, not believed
//! `untyped_storage()` is an answer, and a Python-level answer can lie: a subclass may
//! override the method, and a `__torch_function__` mode intercepts it for every tensor
//! (`torch.overrides.TorchFunctionMode`), each free to return some other storage. Pinning
//! that one would leave the tensor's memory unpinned (a later `swap_tensors` freed it under
//! the view: a segfault). So PyTorch's C implementations are called directly
//! (`torch._C.TensorBase.untyped_storage`, no Python override is reached that way), and what
//! comes back is checked: it must be a real storage (`torch._C.StorageBase`'s own `data_ptr`
//! and `nbytes` read it, and refuse anything else), and its bytes must hold every byte of
//! the span the `DLTensor` describes. A storage that does not is refused
//! ([`Error::Rebound`]), never pinned; nothing falls back to an owner that holds only the
//! tensor (`__dlpack__`'s), which a later rebinding would defeat.
//!
//! # The storage through PyTorch's C shim
//! Where the shim is verified for this PyTorch (`import::shim`) and no `TorchFunctionMode` is
//! on, the same pin and check are made in C, with no Python call: the `DLTensor` is read, then
//! a storage alias of the tensor made (an `at::Tensor` of our own holding the `StorageImpl`),
//! and the alias's storage must hold the span. No Python code runs between the two (the shim
//! runs none and keeps the GIL), so the alias holds the storage the table read from; the check
//! stays. Under a mode the questions go through Python, where the mode sees them.
//!
//! # PyTorch's const table
//! `ReadOnlyTensorWrapper` (PyTorch 2.14) publishes a const table whose exports are read-only
//! ([`TorchTable::ReadOnly`]) and answers every torch function, PyTorch's C getters
//! included, with an error. Its tensors come out read-only (`requires_grad` is not asked) and
//! its questions are asked with subclass torch-function handling off
//! (`torch._C.DisableTorchFunctionSubclass`).
//!
//! The other questions (`requires_grad`, `is_neg()`, `is_conj()`) go to PyTorch's C
//! implementations the same way, so a subclass's Python override is not asked. A mode may
//! still answer them; a lie there changes what the values mean (a sign, a conjugate, a write
//! autograd does not see), never which memory is reached.
//!
//! # The order of the questions (\[borrow\])
//! PyTorch's `is_neg()` and `is_conj()` release the GIL, so another thread may run (and
//! rebind the tensor) inside them. `is_neg()` is asked first; the storage is taken next; the
//! `DLTensor` is read right after it and described at once (its shape and strides are the
//! tensor's own arrays), with no Python code in between; the span is then checked against
//! the storage. A rebinding that slipped in before the read (through a finalizer the
//! storage object's allocation ran, say) shows as a span outside the storage, and the import
//! starts over. `is_conj()`, asked last and only for complex tensors, can no longer change
//! what is pinned or read.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;
use tensorbridge_core::{Access, DTypeCode, Descriptor, Ready, Stream};

use crate::convert::type_name;
use crate::error::{Error, Result};
use crate::import::exchange::ExchangeApi;
use crate::import::route::TorchTable;
use crate::import::shim;
use crate::import::{Consumer, Current, Imported, Pin, order_consumer};

/// How often the import starts over when the storage does not hold the span.
const ATTEMPTS: usize = 3;

/// PyTorch's C implementations, taken once from its C types, whose attributes no Python code
/// can replace: calling them reaches no subclass override.
struct Methods {
    /// `torch._C.TensorBase.requires_grad.__get__`: the getter, whatever a subclass defines.
    requires_grad: Py<PyAny>,
    /// `torch._C.TensorBase.is_neg`.
    is_neg: Py<PyAny>,
    /// `torch._C.TensorBase.is_conj`.
    is_conj: Py<PyAny>,
    /// `torch._C.TensorBase.untyped_storage`.
    untyped_storage: Py<PyAny>,
    /// `torch._C.StorageBase.data_ptr`.
    data_ptr: Py<PyAny>,
    /// `torch._C.StorageBase.nbytes`.
    nbytes: Py<PyAny>,
    /// `torch.UntypedStorage`, what `untyped_storage()` returns: its length is
    /// `torch._C.StorageBase`'s C slot (it defines no `__len__` of its own).
    untyped: Py<PyType>,
    /// `torch.Tensor`, whose `requires_grad` is `TensorBase`'s getter (it defines none).
    tensor: Py<PyType>,
    /// `torch._C.DisableTorchFunctionSubclass`.
    subclasses_off: Py<PyAny>,
}

/// [`Methods`], looked up the first time a PyTorch tensor is imported (PyTorch is imported
/// then: the tensor's type publishes its table).
fn methods(py: Python<'_>) -> Result<&Methods> {
    static METHODS: PyOnceLock<Methods> = PyOnceLock::new();
    Ok(METHODS.get_or_try_init(py, || -> PyResult<Methods> {
        let c = py.import(pyo3::intern!(py, "torch._C"))?;
        let tensor = c.getattr(pyo3::intern!(py, "TensorBase"))?;
        let storage = c.getattr(pyo3::intern!(py, "StorageBase"))?;
        Ok(Methods {
            requires_grad: tensor
                .getattr(pyo3::intern!(py, "requires_grad"))?
                .getattr(pyo3::intern!(py, "__get__"))?
                .unbind(),
            is_neg: tensor.getattr(pyo3::intern!(py, "is_neg"))?.unbind(),
            is_conj: tensor.getattr(pyo3::intern!(py, "is_conj"))?.unbind(),
            untyped_storage: tensor
                .getattr(pyo3::intern!(py, "untyped_storage"))?
                .unbind(),
            data_ptr: storage.getattr(pyo3::intern!(py, "data_ptr"))?.unbind(),
            nbytes: storage.getattr(pyo3::intern!(py, "nbytes"))?.unbind(),
            untyped: py
                .import(pyo3::intern!(py, "torch"))?
                .getattr(pyo3::intern!(py, "UntypedStorage"))?
                .cast_into::<PyType>()?
                .unbind(),
            tensor: py
                .import(pyo3::intern!(py, "torch"))?
                .getattr(pyo3::intern!(py, "Tensor"))?
                .cast_into::<PyType>()?
                .unbind(),
            subclasses_off: c
                .getattr(pyo3::intern!(py, "DisableTorchFunctionSubclass"))?
                .unbind(),
        })
    })?)
}

/// `obj`, a PyTorch tensor, imported through its table. `Ok(None)`: a tensor PyTorch's
/// `__dlpack__` refuses before exporting (a lazily conjugated one): the caller asks
/// `__dlpack__`, whose refusal is PyTorch's own.
///
/// A tensor that requires grad comes out read-only, and its views refuse it where PyTorch's
/// own protocols do (`crate::floor::access::torch`: a write would bypass autograd; reading it,
/// as a kernel's input does, is fine), and every tensor of a type that publishes PyTorch's
/// const table comes out read-only ([`TorchTable::ReadOnly`]: `ReadOnlyTensorWrapper`, whose
/// own `__dlpack__` exports read-only, with the flag). A lazily negated tensor is refused
/// ([`Error::NegativeBit`]): its memory holds the negated values, and PyTorch's exports (2.11)
/// hand that memory over as it is.
///
/// The storage is pinned and checked through PyTorch's C shim when it is verified for this
/// PyTorch and no `TorchFunctionMode` is on (`import::shim`), else through Python.
pub(crate) fn import(
    obj: &Bound<'_, PyAny>,
    api: ExchangeApi,
    table: TorchTable,
    consumer: Consumer,
) -> Result<Option<Imported>> {
    let py = obj.py();
    let torch = methods(py)?;
    // `ReadOnlyTensorWrapper` answers every torch function with an error, PyTorch's C
    // getters included (they ask the subclass's `__torch_function__` first): its questions
    // are asked with subclass handling off, as PyTorch's C++ would read the tensor.
    let _off = match table {
        TorchTable::ReadOnly => Some(SubclassesOff::enter(torch, py)?),
        TorchTable::Ordinary => None,
    };
    let (access, provenance) = match table {
        // Read-only whatever `requires_grad` says: PyTorch exports such a tensor read-only,
        // with the flag, unless it requires grad, which PyTorch refuses (wrapper or not).
        TorchTable::ReadOnly => {
            let requires_grad = torch.requires_grad.bind(py).call1((obj,))?;
            let (_, provenance) = crate::floor::access::torch(requires_grad.is_truthy()?);
            (Access::ReadOnly, provenance)
        }
        TorchTable::Ordinary => {
            // Exactly `torch.Tensor`: the attribute is `TensorBase`'s getter (cheaper than
            // calling it); a subclass may define its own, so its getter is called directly.
            let requires_grad = if obj.get_type().is(torch.tensor.bind(py)) {
                obj.getattr(pyo3::intern!(py, "requires_grad"))?
            } else {
                torch.requires_grad.bind(py).call1((obj,))?
            };
            crate::floor::access::torch(requires_grad.is_truthy()?)
        }
    };
    if torch.is_neg.bind(py).call1((obj,))?.is_truthy()? {
        return Err(Error::NegativeBit {
            type_name: type_name(obj),
        });
    }
    let shim = shim::shim(py).filter(|shim| !shim.mode_on());
    for _ in 0..ATTEMPTS {
        let step = match shim {
            Some(shim) => pin_in_c(obj, api, access, shim, torch.tensor.bind(py))?,
            None => Step::Unreached,
        };
        let (desc, pin) = match step {
            Step::Pinned(desc, pin) => (desc, pin),
            Step::NoTable => return Ok(None),
            Step::Outside => continue,
            // The shim could not reach the storage: Python is asked, for PyTorch's own answer.
            Step::Unreached => {
                let storage = torch.untyped_storage.bind(py).call1((obj,));
                // A table error (a sparse, quantized or meta tensor, which has no storage
                // either) goes to the caller, which asks `__dlpack__` for PyTorch's own
                // message.
                let Some(dl) = api.dltensor(obj)? else {
                    return Ok(None);
                };
                // SAFETY: `dl`'s shape and strides are the tensor's own arrays, unchanged
                // while the tensor is and no Python code runs: read right here, with nothing
                // in between.
                let desc =
                    unsafe { tensorbridge_dlpack::describe_borrowed(&dl, api.version(), access) }?;
                // The table exported it, yet no storage came: refused, not handed to
                // `__dlpack__`, whose owner would hold only the tensor.
                let storage = storage.map_err(|e| Error::Unpinned {
                    type_name: type_name(obj),
                    cause: e.to_string(),
                })?;
                if !holds(torch, &storage, &desc) {
                    continue;
                }
                (desc, Pin::Object(storage.unbind()))
            }
        };
        // Only complex tensors carry the conjugate bit (PyTorch: `is_conj()` is false for
        // every other dtype), so only they pay for the question.
        if desc.dtype().code() == DTypeCode::Complex
            && torch.is_conj.bind(py).call1((obj,))?.is_truthy()?
        {
            return Ok(None);
        }
        let mut imported = Imported {
            desc,
            ready: Ready::Now,
            pin,
            current: None,
            provenance,
        };
        if matches!(
            imported.desc.device().kind,
            tensorbridge_core::DeviceType::Cuda | tensorbridge_core::DeviceType::CudaManaged
        ) {
            let (device_type, device_id) = imported.desc.device().to_dlpack()?;
            let stream = api.current_work_stream(obj, device_type, device_id)?;
            let (ready, immortal) = readiness(py, stream, device_id)?;
            imported.ready = ready;
            imported.current = Some(Current { stream, immortal });
            order_consumer(&imported.desc, &imported.ready, consumer)?;
        }
        return Ok(Some(imported));
    }
    Err(Error::Rebound {
        type_name: type_name(obj),
        attempts: ATTEMPTS,
    })
}

/// One attempt at the storage through the shim.
#[allow(clippy::large_enum_variant)] // Returned once per attempt, moved out at once: no box.
enum Step {
    /// Read, and pinned by a storage that holds the span.
    Pinned(Descriptor, Pin),
    /// The table could not export it: the caller asks `__dlpack__`.
    NoTable,
    /// The storage does not hold the span: a rebinding slipped in; read again.
    Outside,
    /// The shim could not reach the storage (or there is no shim): asked through Python.
    Unreached,
}

/// Reads `obj` through the table and pins its storage through the shim (see the module docs).
fn pin_in_c(
    obj: &Bound<'_, PyAny>,
    api: ExchangeApi,
    access: Access,
    shim: &shim::Shim,
    tensor: &Bound<'_, PyType>,
) -> Result<Step> {
    let Some(dl) = api.dltensor(obj)? else {
        return Ok(Step::NoTable);
    };
    // SAFETY: `dl`'s shape and strides are the tensor's own arrays, unchanged while the tensor
    // is and no Python code runs: read right here.
    let desc = unsafe { tensorbridge_dlpack::describe_borrowed(&dl, api.version(), access) }?;
    // No Python code ran since the read (the shim's calls run none and keep the GIL): the
    // alias holds the storage the table read from, checked all the same.
    let Some(alias) = shim.alias(obj, tensor) else {
        return Ok(Step::Unreached);
    };
    let held = shim
        .storage(&alias)
        .is_some_and(|span| span_inside(&desc, span.base, span.len));
    Ok(if held {
        Step::Pinned(desc, Pin::Owner(std::sync::Arc::new(alias)))
    } else {
        Step::Outside
    })
}

/// PyTorch's torch-function handling for subclasses turned off on this thread
/// (`torch._C.DisableTorchFunctionSubclass`, entered), restored when dropped.
struct SubclassesOff<'py> {
    guard: Bound<'py, PyAny>,
}

impl<'py> SubclassesOff<'py> {
    fn enter(torch: &Methods, py: Python<'py>) -> Result<SubclassesOff<'py>> {
        let guard = torch.subclasses_off.bind(py).call0()?;
        guard.call_method0(pyo3::intern!(py, "__enter__"))?;
        Ok(SubclassesOff { guard })
    }
}

impl Drop for SubclassesOff<'_> {
    fn drop(&mut self) {
        let py = self.guard.py();
        let none = py.None();
        // Restoring a thread-local cannot fail; were it to raise, the error is not this
        // import's: it is reported as unraisable rather than lost or raised later.
        if let Err(e) = self
            .guard
            .call_method1(pyo3::intern!(py, "__exit__"), (&none, &none, &none))
        {
            e.write_unraisable(py, Some(&self.guard));
        }
    }
}

/// Whether `storage` is a real PyTorch storage whose bytes hold all of `desc`'s span
/// (\[owner\], \[span\]): read by `torch._C.StorageBase`'s own methods, which raise
/// `TypeError` for anything that is not one (then: no). A tensor without elements reaches no
/// byte; a device without addresses cannot be compared (no).
fn holds(torch: &Methods, storage: &Bound<'_, PyAny>, desc: &Descriptor) -> bool {
    let py = storage.py();
    let read = |method: &Py<PyAny>| -> Option<usize> {
        method.bind(py).call1((storage,)).ok()?.extract().ok()
    };
    // Exactly `torch.UntypedStorage`: `len()` is then `StorageBase`'s C slot (a subclass
    // could define `__len__`), cheaper than calling `nbytes`.
    let len = if storage.get_type().is(torch.untyped.bind(py)) {
        storage.len().ok()
    } else {
        read(&torch.nbytes)
    };
    let (Some(base), Some(len)) = (read(&torch.data_ptr), len) else {
        return false;
    };
    span_inside(desc, base, len)
}

/// Whether the `len` bytes from `base` (a storage's) hold all of `desc`'s span. A tensor
/// without elements reaches no byte; a device without addresses cannot be compared (no).
fn span_inside(desc: &Descriptor, base: usize, len: usize) -> bool {
    if desc.numel() == 0 {
        return true;
    }
    // Addresses (host, CUDA, managed: what the table exports) compare with the storage's.
    if !desc.device().kind.has_addresses() {
        return false;
    }
    let span = desc.byte_span();
    base <= span.start && span.end <= base.saturating_add(len)
}

/// Where a PyTorch tensor's data is ready, given that it is ready on `current`, PyTorch's
/// current stream of the device, now (\[ready\]).
///
/// - No consumer stream: the tensor is ready on `current` when PyTorch never destroys that
///   stream (its default stream, the streams of its pools); otherwise (a stream made current
///   from outside, `torch.cuda.ExternalStream`, which its creator may destroy while the view
///   lives) an event recorded on it now, while it is certainly alive.
///
/// A consumer's stream is then made to wait for that on the GPU (by the caller): the readiness
/// names `current` (or the event), never the consumer's stream, which only its caller keeps
/// alive.
///
/// Also says whether PyTorch never destroys `current` (a kernel call lends it as it is then;
/// otherwise only for the call).
fn readiness(py: Python<'_>, current: Stream, device_id: i32) -> Result<(Ready, bool)> {
    let ordinal = u32::try_from(device_id).unwrap_or(0);
    let record = || -> Result<Ready> {
        // SAFETY: PyTorch's current stream is live now (it is current), and the per-thread
        // stream is the calling thread's, used on it now.
        let signal = unsafe { tensorbridge_cuda::CudaSignal::record_raw(ordinal, current) }?;
        Ok(signal.into_ready())
    };
    Ok(match current {
        Stream::LegacyDefault => (Ready::Stream(current), true),
        // Immortal, but thread-bound: an event says where the data is for other threads.
        Stream::PerThreadDefault => (record()?, true),
        Stream::Handle(h) => {
            if immortal(py, h.get(), device_id)? {
                (Ready::Stream(current), true)
            } else {
                (record()?, false)
            }
        }
    })
}

/// Stream handles PyTorch's current stream had that belong to its pools (never destroyed).
static POOL: crate::import::HandleSet = crate::import::HandleSet::new();

/// Whether PyTorch never destroys stream `handle` of device `device_id`: one of its pool
/// streams. Asked of PyTorch (`torch.cuda.current_stream(device).stream_id`: 0 for the
/// default stream, odd for pool streams, the even handle itself for external streams) the
/// first time a handle is seen, and remembered only when it is a pool stream: a handle value
/// an external stream had can be reused after that stream is destroyed, a pool stream's
/// never is.
fn immortal(py: Python<'_>, handle: usize, device_id: i32) -> Result<bool> {
    if POOL.contains(handle) {
        return Ok(true);
    }
    let current = py
        .import(pyo3::intern!(py, "torch.cuda"))?
        .call_method1(pyo3::intern!(py, "current_stream"), (device_id,))?;
    let id: i64 = current.getattr(pyo3::intern!(py, "stream_id"))?.extract()?;
    let now: usize = current
        .getattr(pyo3::intern!(py, "cuda_stream"))?
        .extract()?;
    let pool = now == handle && (id == 0 || id & 1 == 1);
    if pool {
        POOL.insert(handle);
    }
    Ok(pool)
}
