//! The target Python's version cfgs (`Py_3_12` and the like), from the same configuration
//! pyo3 is built with: the exception stash in `ffi::attach` uses the 3.12 single-object calls
//! where the ABI has them (`PyErr_Fetch`/`PyErr_Restore` are deprecated from 3.12).
fn main() {
    pyo3_build_config::use_pyo3_cfgs();
}
