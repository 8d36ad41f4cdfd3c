//! `__cuda_array_interface__` and `__array_interface__` dicts of a view, from the CAI
//! adapter's plain values.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use tensorbridge_cai::{ArrayData, ArrayInterface, CudaArrayInterface, DescrField, DescrFormat};

fn descr_to_py<'py>(py: Python<'py>, fields: &[DescrField]) -> PyResult<Bound<'py, PyList>> {
    let list = PyList::empty(py);
    for f in fields {
        let format = match &f.format {
            DescrFormat::TypeStr(t) => t.to_string().into_pyobject(py)?.into_any(),
            DescrFormat::Fields(nested) => descr_to_py(py, nested)?.into_any(),
        };
        let item = match &f.shape {
            Some(shape) => PyTuple::new(
                py,
                [
                    f.name.as_str().into_pyobject(py)?.into_any(),
                    format,
                    PyTuple::new(py, shape)?.into_any(),
                ],
            )?,
            None => PyTuple::new(py, [f.name.as_str().into_pyobject(py)?.into_any(), format])?,
        };
        list.append(item)?;
    }
    Ok(list)
}

/// The dict of a CUDA Array Interface export.
pub(crate) fn cai_to_py<'py>(
    py: Python<'py>,
    cai: &CudaArrayInterface,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("shape", PyTuple::new(py, &cai.shape)?)?;
    d.set_item("typestr", cai.typestr.to_string())?;
    d.set_item("data", (cai.data.address, cai.data.readonly))?;
    d.set_item("version", cai.version)?;
    match &cai.strides {
        Some(s) => d.set_item("strides", PyTuple::new(py, s)?)?,
        None => d.set_item("strides", py.None())?,
    }
    if let Some(descr) = &cai.descr {
        d.set_item("descr", descr_to_py(py, descr)?)?;
    }
    d.set_item("stream", cai.stream)?;
    Ok(d)
}

/// The dict of an array interface export (pointer form).
pub(crate) fn array_to_py<'py>(
    py: Python<'py>,
    ai: &ArrayInterface,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("shape", PyTuple::new(py, &ai.shape)?)?;
    d.set_item("typestr", ai.typestr.to_string())?;
    if let ArrayData::Pointer(p) = ai.data {
        d.set_item("data", (p.address, p.readonly))?;
    }
    d.set_item("version", ai.version)?;
    match &ai.strides {
        Some(s) => d.set_item("strides", PyTuple::new(py, s)?)?,
        None => d.set_item("strides", py.None())?,
    }
    if let Some(descr) = &ai.descr {
        d.set_item("descr", descr_to_py(py, descr)?)?;
    }
    Ok(d)
}
