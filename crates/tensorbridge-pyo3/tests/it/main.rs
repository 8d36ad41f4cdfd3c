//! tensorbridge-pyo3's public API against an embedded interpreter: capsules consumed and
//! released exactly once, owners kept and dropped, the import order, the Python exceptions.
//!
//! These tests need libpython at link and run time, so `cargo xtask ci` runs them inside the
//! managed Python environment (`PYO3_PYTHON`, `LD_LIBRARY_PATH`); they import nothing but
//! the standard library. The wheel's behaviour with real frameworks is the Python suite's
//! business (`crates/tensorbridge-python/tests`).

mod capsules;
mod import;
mod kernel;
mod python_api;

use pyo3::prelude::*;

/// Runs `f` attached to an interpreter initialised once per process.
pub(crate) fn with_py<R>(f: impl for<'py> FnOnce(Python<'py>) -> R) -> R {
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
