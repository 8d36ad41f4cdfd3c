//! `View.dtype` as the Python object NumPy and JAX read: a `numpy.dtype` where NumPy (or
//! ml_dtypes, for bfloat16 and the fp8/fp6/fp4 types) has one, the core's name otherwise.
//!
//! NumPy's `np.result_type(x)` and JAX's `jnp.asarray(x)` (and `np.dtype(x)`) read `x.dtype`
//! first and refuse a string there; with a `numpy.dtype` they go on to the array interface.
//! `str(view.dtype)` is the core name either way (NumPy and ml_dtypes name their dtypes as
//! the core does), and a `numpy.dtype` compares equal to its name (`view.dtype == "float32"`).
//!
//! The objects are made once per process and cached: `asview` never touches NumPy, and the
//! first `view.dtype` of each element type imports NumPy (and ml_dtypes, only for its types)
//! once; later reads cost a lock and a reference count.

use std::sync::{Mutex, MutexGuard, PoisonError};

use pyo3::prelude::*;
use pyo3::types::PyString;
use tensorbridge_core::{DType, DTypeCode, Packing};

/// A dtype object and what it stands for.
type Entry = ((DType, Packing), Py<PyAny>);

/// The dtype objects made so far. A handful of entries (one per element type a process
/// meets), so a scan beats hashing.
static CACHE: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

fn cache() -> MutexGuard<'static, Vec<Entry>> {
    // Nothing panics while holding the lock; a poisoned cache is still a valid cache.
    CACHE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `View.dtype`: the `numpy.dtype` of `dtype` as stored with `packing` when NumPy has one,
/// else the core's name as a `str`.
pub(crate) fn dtype_object(py: Python<'_>, dtype: DType, packing: Packing) -> Py<PyAny> {
    let key = (dtype, packing);
    let cached = |cache: &[Entry]| {
        cache
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, obj)| obj.clone_ref(py))
    };
    if let Some(obj) = cached(&cache()) {
        return obj;
    }
    // Made without the lock: importing NumPy runs Python code, which may switch threads, and
    // another thread asking for a dtype meanwhile must not wait on a lock this one holds.
    let made = numpy_dtype(py, dtype, packing)
        .ok()
        .flatten()
        .unwrap_or_else(|| PyString::new(py, &dtype.to_string()).into_any())
        .unbind();
    let mut cache = cache();
    if let Some(first) = cached(&cache) {
        // Another thread made it first: everyone sees the same object.
        return first;
    }
    cache.push((key, made.clone_ref(py)));
    made
}

/// NumPy's dtype for `dtype` as stored with `packing`; `None` where NumPy has none: vector
/// types, complex32, opaque handles, packed fp6/fp4 (ml_dtypes stores one element per byte),
/// and ml_dtypes' types when ml_dtypes is not installed. `Err` when NumPy cannot be imported.
fn numpy_dtype<'py>(
    py: Python<'py>,
    dtype: DType,
    packing: Packing,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    if dtype.lanes() != 1 || (dtype.is_subbyte() && packing == Packing::Packed) {
        return Ok(None);
    }
    let name = dtype.to_string();
    let spec = match dtype.code() {
        DTypeCode::Int | DTypeCode::UInt | DTypeCode::Float | DTypeCode::Bool => {
            PyString::new(py, &name).into_any()
        }
        DTypeCode::Complex if dtype.bits() != 32 => PyString::new(py, &name).into_any(),
        DTypeCode::Bfloat
        | DTypeCode::Float8E3M4
        | DTypeCode::Float8E4M3
        | DTypeCode::Float8E4M3B11Fnuz
        | DTypeCode::Float8E4M3Fn
        | DTypeCode::Float8E4M3Fnuz
        | DTypeCode::Float8E5M2
        | DTypeCode::Float8E5M2Fnuz
        | DTypeCode::Float8E8M0Fnu
        | DTypeCode::Float6E2M3Fn
        | DTypeCode::Float6E3M2Fn
        | DTypeCode::Float4E2M1Fn => match py.import("ml_dtypes") {
            // An older ml_dtypes may lack the newer types: the name, then.
            Ok(ml) => match ml.getattr(name.as_str()) {
                Ok(ty) => ty,
                Err(_) => return Ok(None),
            },
            Err(_) => return Ok(None),
        },
        _ => return Ok(None),
    };
    let made = py.import("numpy")?.getattr("dtype")?.call1((spec,))?;
    // NumPy's name is the core's for every type above; a mismatch (a future NumPy renaming
    // one) falls back to the name rather than say something else.
    Ok((made.str()?.to_cow()? == name).then_some(made))
}
