//! The DLPack C exchange API: a table of C functions a producer type publishes
//! (`type(obj).__dlpack_c_exchange_api__`, a capsule named `dlpack_exchange_api`, DLPack 1.3;
//! or `__c_dlpack_exchange_api__`, the table's address as an int, DLPack 1.2), through which
//! a consumer gets a managed tensor without a Python-level `__dlpack__` call. PyTorch 2.11
//! publishes both.
//!
//! The table's functions do no stream synchronisation ("no_sync"): the producer's data is
//! ready on its current work stream, which `current_work_stream` names. The importer orders
//! the caller's stream after that stream before the call returns, while the stream is
//! certainly alive.

use std::ffi::{CStr, c_void};
use std::ptr::NonNull;

use pyo3::exceptions::PyAttributeError;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyInt};
use tensorbridge::Stream;
use tensorbridge_dlpack::dlpark::ffi::{DLPackExchangeAPI, DLPackExchangeAPIHeader};
use tensorbridge_dlpack::ffi::{DLDeviceType, DLManagedTensorVersioned, DLTensor};

use crate::convert::type_name;
use crate::error::{Error, Result};

const CAPSULE_NAME: &CStr = c"dlpack_exchange_api";

/// A producer type's exchange table, of a major version this crate reads.
#[derive(Clone, Copy)]
pub(crate) struct ExchangeApi {
    /// Static, process-lifetime storage (the protocol's promise); read-only.
    api: NonNull<DLPackExchangeAPI>,
}

// SAFETY: the table is static, process-lifetime and never written (the protocol's promise):
// sharing its address between threads shares nothing mutable.
unsafe impl Send for ExchangeApi {}
// SAFETY: as for `Send`.
unsafe impl Sync for ExchangeApi {}

/// Walks `prev_api` from the newest table to one of major version 1, if any.
///
/// # Safety
/// 1. `api` is null or points to a producer's exchange table that lives for the process,
///    whose `prev_api` chain does the same.
unsafe fn compatible(api: *mut DLPackExchangeAPI) -> Option<NonNull<DLPackExchangeAPI>> {
    // A bound against a (spec-violating) cyclic chain.
    const MAX_DEPTH: usize = 16;
    let mut header = api.cast::<DLPackExchangeAPIHeader>();
    for _ in 0..MAX_DEPTH {
        let h = NonNull::new(header)?;
        // SAFETY: a live table's header (obligation 1).
        let h = unsafe { h.as_ref() };
        if h.version.major == tensorbridge_dlpack::ffi::DLPACK_MAJOR_VERSION {
            return NonNull::new(header.cast());
        }
        header = h.prev_api;
    }
    None
}

/// What `type(obj)` publishes.
#[derive(Clone, Copy)]
pub(crate) enum Table {
    /// No table (or none of a major version this crate reads): the importer uses
    /// `__dlpack__`, which such producers implement too.
    None,
    /// A table the importer may use for objects of this type.
    Usable(ExchangeApi),
    /// A table inherited by a subclass that overrides the Python protocol the table stands
    /// for (`__dlpack__`, `__dlpack_device__`, or PyTorch's `__torch_function__`, through
    /// which `torch.Tensor.__dlpack__` dispatches to subclasses): the table would bypass the
    /// subclass, so the importer calls its `__dlpack__`.
    Overridden,
}

impl Table {
    /// Whether the type publishes a table at all: its `__dlpack__` is then a complete
    /// DLPack producer, and a refusal from it is final.
    pub(crate) fn published(self) -> bool {
        !matches!(self, Table::None)
    }
}

/// The Python protocol methods a subclass may override to change what the producer's
/// table would export.
const PROTOCOL: [&str; 3] = ["__dlpack__", "__dlpack_device__", "__torch_function__"];

/// What an import needs to know about `type(obj)`, decided once per type.
#[derive(Clone, Copy)]
pub(crate) struct TypeInfo {
    /// The type's DLPack C exchange table.
    pub(crate) table: Table,
    /// The table's publisher is PyTorch (`torch.Tensor`), whose exports never carry
    /// `READ_ONLY` (PyTorch has no read-only tensors; checked on 2.11 with tensors over
    /// read-only NumPy arrays and `bytes`): its non-owning `dltensor_from_py_object_no_sync`
    /// then says everything its owning export says.
    pub(crate) torch: bool,
    /// A NumPy masked array type (`numpy.ma`): its mask travels in no protocol.
    pub(crate) masked: bool,
    /// Exactly `numpy.ndarray` (no subclass): its buffer-protocol export describes the same
    /// memory, dtype and writability as its `__dlpack__`, without a Python call.
    pub(crate) ndarray: bool,
    /// The lazy-state questions [`eligible`] asks objects of this type.
    pub(crate) asks: Asks,
    /// A CuPy type (its module is `cupy` or in it): CuPy has a current stream.
    pub(crate) cupy: bool,
}

/// `type(obj)`'s [`TypeInfo`]: its exchange table, if it publishes a usable one, and what
/// kind of producer it is.
///
/// A table of a major version this crate does not read is no table: the importer falls back
/// to `__dlpack__`, which such producers implement too. A subclass that overrides the
/// Python protocol ([`PROTOCOL`]) of the class that publishes the table gets
/// [`Table::Overridden`].
///
/// Remembered per type: the capsule is a type attribute with static, process-lifetime
/// storage, which consumers may cache per type (docs/PROTOCOLS.md, "The DLPack C exchange
/// API"), and a type's module and name do not change. Looking the table up costs two failed
/// attribute lookups (two `AttributeError`s raised and cleared, about a microsecond) for
/// every type without one, CuPy's and NumPy's included.
///
/// The cache holds a strong reference to each type (so its address cannot be reused by
/// another type) and at most [`TYPE_CACHE`] types; past that, lookups are not cached. A type
/// that gains or loses the attribute after its first import keeps its first answer. Errors
/// are never cached.
pub(crate) fn type_info(obj: &Bound<'_, PyAny>) -> Result<TypeInfo> {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

    use pyo3::types::PyType;

    type Entry = (Py<PyType>, TypeInfo);
    /// Entries published in order: `len` counts the filled slots. Readers take no lock (an
    /// import asks on every call); writers append under `WRITE`. Entries are never removed
    /// or changed, and leaked with the process (at most [`TYPE_CACHE`]).
    static SLOTS: [AtomicPtr<Entry>; TYPE_CACHE] =
        [const { AtomicPtr::new(std::ptr::null_mut()) }; TYPE_CACHE];
    static LEN: AtomicUsize = AtomicUsize::new(0);
    static WRITE: Mutex<()> = Mutex::new(());

    let ty = obj.get_type_ptr();
    let cached = |len: usize| {
        SLOTS[..len].iter().find_map(|slot| {
            let entry = slot.load(Ordering::Acquire);
            // SAFETY: a slot below `LEN` holds an entry from `Box::into_raw`, fully written
            // before it was published (Release, read here with Acquire) and never freed.
            let (t, info) = unsafe { &*entry };
            (t.as_ptr().cast() == ty).then_some(*info)
        })
    };
    if let Some(info) = cached(LEN.load(Ordering::Acquire)) {
        return Ok(info);
    }
    let found = classify(obj)?;
    // Poisoning cannot leave the slots inconsistent (an entry is published whole).
    let _write = WRITE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let len = LEN.load(Ordering::Acquire);
    if len < TYPE_CACHE && cached(len).is_none() {
        let entry = Box::into_raw(Box::new((obj.get_type().unbind(), found)));
        SLOTS[len].store(entry, Ordering::Release);
        LEN.store(len + 1, Ordering::Release);
    }
    Ok(found)
}

/// The most types [`type_info`] remembers.
const TYPE_CACHE: usize = 64;

/// [`type_info`] without the cache.
fn classify(obj: &Bound<'_, PyAny>) -> Result<TypeInfo> {
    let ty = obj.get_type();
    // A class made without a module (`type(...)` under globals without `__name__`) has no
    // `__module__`: it is none of the kinds below.
    let module = ty
        .module()
        .ok()
        .and_then(|m| m.to_cow().ok().map(|m| m.into_owned()))
        .unwrap_or_default();
    let (table, torch) = lookup(obj)?;
    Ok(TypeInfo {
        table,
        torch,
        masked: module.starts_with("numpy.ma"),
        ndarray: module == "numpy"
            && ty
                .qualname()
                .is_ok_and(|q| q.to_cow().is_ok_and(|q| q == "ndarray")),
        cupy: module.starts_with("cupy"),
        asks: if table.published() {
            Asks::of(&ty)?
        } else {
            Asks::default()
        },
    })
}

/// The type's exchange table, read now, and whether PyTorch publishes it.
fn lookup(obj: &Bound<'_, PyAny>) -> Result<(Table, bool)> {
    let py = obj.py();
    let ty = obj.get_type();
    let problem = |problem| Error::Exchange {
        type_name: type_name(obj),
        problem,
    };
    let mut name = pyo3::intern!(py, "__dlpack_c_exchange_api__");
    let raw: *mut c_void = match ty.getattr(name) {
        Ok(capsule) => {
            let capsule = capsule
                .cast::<PyCapsule>()
                .map_err(|_| problem("__dlpack_c_exchange_api__ is not a capsule"))?;
            capsule
                .pointer_checked(Some(CAPSULE_NAME))
                .map_err(|_| problem("the capsule is not named \"dlpack_exchange_api\""))?
                .as_ptr()
        }
        Err(e) if e.is_instance_of::<PyAttributeError>(py) => {
            name = pyo3::intern!(py, "__c_dlpack_exchange_api__");
            match ty.getattr(name) {
                Ok(int) => {
                    let addr: usize = int
                        .cast::<PyInt>()
                        .map_err(|_| problem("__c_dlpack_exchange_api__ is not an int"))?
                        .extract()
                        .map_err(|_| problem("__c_dlpack_exchange_api__ is not an address"))?;
                    std::ptr::with_exposed_provenance_mut(addr)
                }
                Err(e) if e.is_instance_of::<PyAttributeError>(py) => {
                    return Ok((Table::None, false));
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(e) => return Err(e.into()),
    };
    // SAFETY: the producer type publishes a static, process-lifetime table (DLPack 1.2/1.3:
    // "must stay alive throughout the lifetime of the process"), or null.
    let Some(api) = (unsafe { compatible(raw.cast()) }) else {
        return Ok((Table::None, false));
    };
    let (overridden, publisher) = overrides_protocol(&ty, name)?;
    let torch = match &publisher {
        Some(class) => class
            .getattr(pyo3::intern!(py, "__module__"))
            .and_then(|m| m.extract::<String>())
            .is_ok_and(|m| m == "torch" || m.starts_with("torch.")),
        None => false,
    };
    if overridden {
        return Ok((Table::Overridden, torch));
    }
    Ok((Table::Usable(ExchangeApi { api }), torch))
}

/// Whether `ty` overrides a [`PROTOCOL`] method of the class that publishes its table
/// (attribute `table`): whether a class that defines one comes before the publisher in
/// `ty`'s method resolution order. `torch.Tensor` defines them all itself; a subclass that
/// defines none inherits them. Also the publisher, when it comes first.
fn overrides_protocol<'py>(
    ty: &Bound<'py, pyo3::types::PyType>,
    table: &Bound<'py, pyo3::types::PyString>,
) -> Result<(bool, Option<Bound<'py, PyAny>>)> {
    let mro = ty.mro();
    let defines = |class: &Bound<'_, PyAny>, name: &Bound<'_, PyAny>| -> Result<bool> {
        Ok(class
            .getattr(pyo3::intern!(ty.py(), "__dict__"))?
            .contains(name)?)
    };
    for class in mro.iter() {
        if defines(&class, table.as_any())? {
            // The publisher, reached before any override.
            return Ok((false, Some(class)));
        }
        for name in PROTOCOL {
            if defines(&class, pyo3::types::PyString::new(ty.py(), name).as_any())? {
                return Ok((true, None));
            }
        }
    }
    Ok((false, None))
}

/// A producer's exception with C++ frames cut off: PyTorch's C++ errors carry the
/// libtorch backtrace in their message (`Exception raised from ... frame #0: ...`). The
/// exception keeps its type and its first lines; anything else passes unchanged.
pub(crate) fn without_cpp_frames(py: Python<'_>, err: PyErr) -> PyErr {
    let Ok(text) = err.value(py).str().map(|s| s.to_string()) else {
        return err;
    };
    let Some(cut) = text.find("\nException raised from ") else {
        return err;
    };
    match err.get_type(py).call1((text[..cut].trim_end(),)) {
        Ok(value) => PyErr::from_value(value),
        Err(_) => err,
    }
}

/// Whether the exchange API may be used for `obj`: not for tensors the producer's
/// `__dlpack__` refuses before it builds a tensor (PyTorch: tensors that require grad, and
/// tensors with a lazy conjugate bit, whose memory does not hold the values the tensor
/// shows). The table's functions skip those checks, so such tensors take `__dlpack__`,
/// which raises PyTorch's own `BufferError`. The other refusals (layouts, dtypes, devices)
/// fail inside the table and take `__dlpack__` then (see the importer).
///
/// A tensor with a lazy negative bit (`x.conj().imag`) is refused here: its memory holds
/// the negated values, and PyTorch 2.11's `__dlpack__` exports that memory as it is.
///
/// `complex` says whether the tensor's dtype is complex, when the caller already knows it:
/// only complex tensors can carry the conjugate bit, so `Some(false)` skips that question.
/// The attributes are asked only of types that have them ([`TypeInfo`]).
pub(crate) fn eligible(
    obj: &Bound<'_, PyAny>,
    info: &TypeInfo,
    complex: Option<bool>,
) -> Result<bool> {
    let py = obj.py();
    if info.asks.requires_grad
        && obj
            .getattr(pyo3::intern!(py, "requires_grad"))?
            .is_truthy()?
    {
        return Ok(false);
    }
    if info.asks.is_conj
        && complex != Some(false)
        && obj
            .call_method0(pyo3::intern!(py, "is_conj"))?
            .is_truthy()?
    {
        return Ok(false);
    }
    if info.asks.is_neg && obj.call_method0(pyo3::intern!(py, "is_neg"))?.is_truthy()? {
        return Err(Error::NegativeBit {
            type_name: type_name(obj),
        });
    }
    Ok(true)
}

/// Which of PyTorch's lazy-state questions a type can answer (its class has the attribute):
/// asked per object only then, so other producers pay for no failed lookup.
#[derive(Clone, Copy, Default)]
pub(crate) struct Asks {
    requires_grad: bool,
    is_conj: bool,
    is_neg: bool,
}

impl Asks {
    fn of(ty: &Bound<'_, pyo3::types::PyType>) -> Result<Asks> {
        let py = ty.py();
        Ok(Asks {
            requires_grad: ty.hasattr(pyo3::intern!(py, "requires_grad"))?,
            is_conj: ty.hasattr(pyo3::intern!(py, "is_conj"))?,
            is_neg: ty.hasattr(pyo3::intern!(py, "is_neg"))?,
        })
    }
}

impl ExchangeApi {
    fn table(&self) -> &DLPackExchangeAPI {
        // SAFETY: a live, static table that nobody mutates (see `find`).
        unsafe { self.api.as_ref() }
    }

    /// The version of DLPack the table's producer follows.
    pub(crate) fn version(&self) -> tensorbridge_dlpack::ffi::DLPackVersion {
        self.table().header.version
    }

    /// `obj`'s non-owning `DLTensor` (`dltensor_from_py_object_no_sync`), when the table has
    /// that function. Its shape and strides arrays are the producer's, valid while `obj` is
    /// alive and unchanged; read them before anything else runs.
    pub(crate) fn dltensor(&self, obj: &Bound<'_, PyAny>) -> Result<Option<DLTensor>> {
        let Some(from_py) = self.table().dltensor_from_py_object_no_sync else {
            return Ok(None);
        };
        let mut out = DLTensor {
            data: std::ptr::null_mut(),
            device: tensorbridge_dlpack::ffi::DLDevice {
                device_type: DLDeviceType(0),
                device_id: 0,
            },
            ndim: 0,
            dtype: tensorbridge_dlpack::ffi::DLDataType {
                code: tensorbridge_dlpack::ffi::DLDataTypeCode(0),
                bits: 0,
                lanes: 0,
            },
            shape: std::ptr::null_mut(),
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        };
        // SAFETY: attached; `obj` is a live object of the type the table came from (the
        // protocol's requirement), `out` a live local the function fills.
        let rc = unsafe { from_py(obj.as_ptr().cast(), &mut out) };
        if rc != 0 {
            return Err(PyErr::take(obj.py()).map(Error::from).unwrap_or_else(|| {
                Error::Exchange {
                    type_name: type_name(obj),
                    problem: "dltensor_from_py_object_no_sync failed without an exception",
                }
            }));
        }
        Ok(Some(out))
    }

    /// An owning managed tensor of `obj`, whose type the table was found on.
    pub(crate) fn managed_tensor(
        &self,
        obj: &Bound<'_, PyAny>,
    ) -> Result<NonNull<DLManagedTensorVersioned>> {
        let missing = |problem| Error::Exchange {
            type_name: type_name(obj),
            problem,
        };
        let from_py = self
            .table()
            .managed_tensor_from_py_object_no_sync
            .ok_or_else(|| missing("managed_tensor_from_py_object_no_sync is null"))?;
        let mut out: *mut DLManagedTensorVersioned = std::ptr::null_mut();
        // SAFETY: attached; `obj` is a live object of the type the table came from (the
        // protocol's requirement), `out` a live local the function writes one pointer to.
        let rc = unsafe { from_py(obj.as_ptr().cast(), &mut out) };
        if rc != 0 {
            return Err(PyErr::take(obj.py()).map(Error::from).unwrap_or_else(|| {
                missing("managed_tensor_from_py_object_no_sync failed without an exception")
            }));
        }
        NonNull::new(out)
            .ok_or_else(|| missing("managed_tensor_from_py_object_no_sync returned a null tensor"))
    }

    /// The producer's current work stream on a CUDA device, as the core names it (null and
    /// `0x1` are the legacy default stream, `0x2` the per-thread one, as the runtime API
    /// that PyTorch and CuPy use reads them).
    pub(crate) fn current_work_stream(
        &self,
        obj: &Bound<'_, PyAny>,
        device_type: i32,
        device_id: i32,
    ) -> Result<Stream> {
        let missing = |problem| Error::Exchange {
            type_name: type_name(obj),
            problem,
        };
        let current = self
            .table()
            .current_work_stream
            .ok_or_else(|| missing("current_work_stream is null"))?;
        let mut out: *mut c_void = std::ptr::null_mut();
        // Known device codes are 1 to 18: the cast keeps them.
        let device_type = DLDeviceType(device_type as u32);
        // SAFETY: attached; `out` is a live local the function writes one pointer to.
        let rc = unsafe { current(device_type, device_id, &mut out) };
        if rc != 0 {
            return Err(PyErr::take(obj.py())
                .map(Error::from)
                .unwrap_or_else(|| missing("current_work_stream failed without an exception")));
        }
        Ok(tensorbridge_cuda::stream_from_raw(out.cast()))
    }
}

#[cfg(test)]
mod tests {
    use pyo3::exceptions::{PyBufferError, PyRuntimeError};

    use super::*;

    #[test]
    fn cpp_frames_are_cut_and_the_type_kept() {
        Python::initialize();
        Python::attach(|py| {
            // PyTorch 2.11's message through the exchange table, as measured (shortened).
            let err = PyRuntimeError::new_err(
                "Bit types are not supported by dlpack\nException raised from getDLDataType at \
                 /pytorch/aten/src/ATen/DLConvertor.cpp:99 (most recent call first):\nframe \
                 #0: c10::Error::Error(c10::SourceLocation, std::string)\nframe #1: ...",
            );
            let cut = without_cpp_frames(py, err);
            assert!(cut.is_instance_of::<PyRuntimeError>(py));
            assert_eq!(
                cut.value(py).to_string(),
                "Bit types are not supported by dlpack"
            );
            let plain = without_cpp_frames(py, PyBufferError::new_err("one line\nand two"));
            assert!(plain.is_instance_of::<PyBufferError>(py));
            assert_eq!(plain.value(py).to_string(), "one line\nand two");
        });
    }
}
