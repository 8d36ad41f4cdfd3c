//! The functions foreign code calls into this crate (the exchange table's entries, capsule
//! destructors) go through these two shims, which apply the workspace's one policy
//! (`tensorbridge_core::callback`): a panic is caught, reported, and never unwinds across the C
//! boundary or aborts the process.

use std::ffi::c_int;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use tensorbridge_core::callback::foreign_entry;

use crate::error::Result;

/// An entry that reports failure as -1 with a Python exception set (the DLPack C exchange
/// API's convention): `body` runs attached to the interpreter; 0 when it succeeds, -1 with
/// its error raised when it fails, and -1 with a `RuntimeError` naming `name` when it panics
/// (no exception where the interpreter is gone).
pub(crate) fn python_entry(
    name: &'static str,
    body: impl FnOnce(Python<'_>) -> Result<()>,
) -> c_int {
    let status = foreign_entry(name, None, || {
        Some(Python::attach(|py| match body(py) {
            Ok(()) => 0,
            Err(e) => {
                PyErr::from(e).restore(py);
                -1
            }
        }))
    });
    status.unwrap_or_else(|| {
        foreign_entry(name, (), || {
            Python::try_attach(|py| {
                PyRuntimeError::new_err(format!(
                    "a Rust panic in {name}; this is a bug in tensorbridge"
                ))
                .restore(py);
            });
        });
        -1
    })
}

/// An entry that returns nothing (a capsule destructor, a deleter): `body`'s panic is caught
/// and reported, and what it was releasing may leak.
pub(crate) fn void_entry(name: &'static str, body: impl FnOnce()) {
    foreign_entry(name, (), body)
}
