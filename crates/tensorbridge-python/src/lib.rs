//! The `tensorbridge` Python package's extension module, `tensorbridge._native`: everything
//! is in `tensorbridge-pyo3`; this crate only names the module. The Python side
//! (`python/tensorbridge/`) re-exports it, with type stubs.

use pyo3::prelude::*;

/// `tensorbridge._native`: `View`, `asview`, `from_ptr`.
///
/// `gil_used = false` (pyo3 0.30's default, written out because it is a promise): nothing in
/// `tensorbridge-pyo3` relies on the GIL for mutual exclusion. Capsule consumption is a
/// critical section on the capsule; `View` is frozen and builds its interface dicts in
/// `PyOnceLock`s; the exchange-table cache is a `Mutex`; owners are Rust `Arc`s whose drops
/// attach to the interpreter themselves (see the pyo3 crate's `attach` module); the CUDA
/// layer's state is behind its own locks. On GIL builds this changes nothing; on
/// free-threaded builds (3.13t, 3.14t; built without `abi3`, which those builds lack) the
/// module does not re-enable the GIL when imported.
#[pymodule(gil_used = false)]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    tensorbridge_pyo3::register(m)
}
