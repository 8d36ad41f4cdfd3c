//! The `tensorbridge` Python package's extension module, `tensorbridge._native`: everything
//! is in `tensorbridge-pyo3`; this crate only names the module. The Python side
//! (`python/tensorbridge/`) re-exports it, with type stubs.

use pyo3::prelude::*;

/// `tensorbridge._native`: `View`, `asview`, `from_ptr`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    tensorbridge_pyo3::register(m)
}
