//! The floor both wings stand on: what the import (Python -> the core) and the export (the
//! core -> Python) share, so neither uses the other. Readiness and a consumer's stream
//! ([`ready`]), the DLPack capsule names ([`capsule`]), the one reader of a Python `stream=`
//! argument ([`stream`]), the `View` object ([`view`]; its Python methods are the export's)
//! and reading a Python object's optional attributes.

pub(crate) mod access;
pub(crate) mod capsule;
pub(crate) mod ready;
pub(crate) mod stream;
pub(crate) mod view;

use pyo3::exceptions::PyAttributeError;
use pyo3::prelude::*;
use pyo3::types::PyString;

use crate::error::Result;

/// `obj.<name>`, or `None` when it has no such attribute.
pub(crate) fn attribute<'py>(
    obj: &Bound<'py, PyAny>,
    name: &Bound<'py, PyString>,
) -> Result<Option<Bound<'py, PyAny>>> {
    match obj.getattr(name) {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.is_instance_of::<PyAttributeError>(obj.py()) => Ok(None),
        Err(e) => Err(e.into()),
    }
}
