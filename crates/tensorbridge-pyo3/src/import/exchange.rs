//! Reading a producer's DLPack C exchange API: a table of C functions a producer type
//! publishes as `type(obj).__dlpack_c_exchange_api__`, a capsule named
//! `dlpack_exchange_api` (DLPack 1.3), through which a consumer gets a tensor without a
//! Python-level `__dlpack__` call. PyTorch publishes it from 2.10.
//!
//! Only the capsule is trusted. DLPack 1.2's alias `__c_dlpack_exchange_api__` is the table's
//! address as a plain int, which any class can claim (`__c_dlpack_exchange_api__ = 16`), and
//! nothing can verify an address: it is never dereferenced. A capsule cannot be made from
//! plain Python; whoever makes one through ctypes can already read and write any memory.
//!
//! The table's functions do no stream synchronisation ("no_sync"): the producer's data is
//! ready on its current work stream, which `current_work_stream` names.

use std::ffi::{CStr, c_void};
use std::ptr::NonNull;

use pyo3::exceptions::PyAttributeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyCapsule, PyType};
use tensorbridge_core::Stream;
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

/// The exchange table `ty` publishes (its `__dlpack_c_exchange_api__` capsule, inherited
/// or its own), if it is one of a major version this crate reads. `Ok(None)`: no capsule,
/// or a table of another major version. A capsule of another name, or an attribute that is
/// not a capsule, is an error naming the type.
pub(crate) fn lookup(ty: &Bound<'_, PyType>) -> Result<Option<ExchangeApi>> {
    let py = ty.py();
    let problem = |problem| Error::Exchange {
        type_name: ty
            .qualname()
            .map(|n| n.to_string())
            .unwrap_or_else(|_| "?".to_owned()),
        problem,
    };
    let capsule = match ty.getattr(pyo3::intern!(py, "__dlpack_c_exchange_api__")) {
        Ok(capsule) => capsule,
        Err(e) if e.is_instance_of::<PyAttributeError>(py) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let capsule = capsule
        .cast::<PyCapsule>()
        .map_err(|_| problem("__dlpack_c_exchange_api__ is not a capsule"))?;
    let raw = capsule
        .pointer_checked(Some(CAPSULE_NAME))
        .map_err(|_| problem("the capsule is not named \"dlpack_exchange_api\""))?;
    // SAFETY: a capsule named "dlpack_exchange_api" holds a producer's static,
    // process-lifetime table (DLPack 1.3: "must stay alive throughout the lifetime of the
    // process"); only C code can make one, and C code is trusted as every DLPack consumer
    // trusts its producers.
    Ok(unsafe { compatible(raw.as_ptr().cast()) }.map(|api| ExchangeApi { api }))
}

/// Whether `api` is PyTorch's const exchange table (`torch._C._const_dlpack_exchange_api()`,
/// PyTorch 2.14 and later; its exports are read-only), compared by address with the table
/// PyTorch names, looked up once. `false` when PyTorch has no such table (2.13 and earlier)
/// or is not imported.
pub(crate) fn is_torch_const_table(py: Python<'_>, api: ExchangeApi) -> bool {
    static CONST: PyOnceLock<Option<usize>> = PyOnceLock::new();
    let table = CONST.get_or_init(py, || {
        let modules = py.import("sys").ok()?.getattr("modules").ok()?;
        let c = modules.get_item("torch._C").ok()?;
        let capsule = c.getattr("_const_dlpack_exchange_api").ok()?.call0().ok()?;
        let capsule = capsule.cast::<PyCapsule>().ok()?;
        let raw = capsule.pointer_checked(Some(CAPSULE_NAME)).ok()?;
        // SAFETY: as in `lookup`: a capsule of this name holds a producer's static table.
        unsafe { compatible(raw.as_ptr().cast()) }.map(|t| t.as_ptr() as usize)
    });
    *table == Some(api.api.as_ptr() as usize)
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

impl ExchangeApi {
    fn table(&self) -> &DLPackExchangeAPI {
        // SAFETY: a live, static table that nobody mutates (from `lookup`).
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
