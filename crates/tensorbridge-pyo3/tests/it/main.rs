//! tensorbridge-pyo3's public API against an embedded interpreter: capsules consumed and
//! released exactly once, owners kept and dropped (also re-entered from foreign deleters with
//! the GIL released, and while a panic propagates), the import order, the Python exceptions.
//!
//! These tests need libpython at link and run time, so `cargo xtask ci` runs them inside the
//! managed Python environment (`PYO3_PYTHON`, `LD_LIBRARY_PATH`); they import nothing but
//! the standard library. The wheel's behaviour with real frameworks is the Python suite's
//! business (`crates/tensorbridge-python/tests`).

mod capsules;
mod import;
mod kernel;
mod layers;
mod python_api;
mod release;
mod streams;

use pyo3::prelude::*;

/// Runs `f` attached to an interpreter initialised once per process, one test at a time.
///
/// One at a time: the tests in `release.rs` release the GIL behind pyo3's back, and on
/// CPython before 3.12 the "current thread state" the C API reads then is process-wide, so
/// another test thread taking the GIL meanwhile would hide the crash they look for. The
/// tests hold the GIL throughout anyway, so little runs in parallel either way.
pub(crate) fn with_py<R>(f: impl for<'py> FnOnce(Python<'py>) -> R) -> R {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    // Taken before attaching, so a waiting test never holds the GIL; a failed test's poison
    // says nothing about the next one.
    let _turn = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    Python::initialize();
    Python::attach(f)
}

/// A module with `tensorbridge`'s functions, as the wheel registers them.
pub(crate) fn module(py: Python<'_>) -> Bound<'_, PyModule> {
    let m = PyModule::new(py, "tensorbridge").expect("a module");
    tensorbridge_pyo3::register(&m).expect("register");
    m
}

/// Evaluates a Python expression with `tb` (the module) and `env` in scope.
pub(crate) fn eval<'py>(
    py: Python<'py>,
    expr: &str,
    env: &[(&str, &Bound<'py, PyAny>)],
) -> PyResult<Bound<'py, PyAny>> {
    let globals = pyo3::types::PyDict::new(py);
    globals.set_item("tb", module(py))?;
    for (k, v) in env {
        globals.set_item(*k, v)?;
    }
    let code = std::ffi::CString::new(expr).expect("no NUL in test code");
    py.eval(&code, Some(&globals), None)
}
