//! `__cuda_array_interface__` and `__array_interface__` dicts <-> the CAI adapter's plain
//! values. Everything read here is untrusted: the adapter validates it.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};
use tensorbridge_cai::{
    ArrayData, ArrayInterface, CudaArrayInterface, DataPointer, DescrField, DescrFormat, TypeStr,
};

use crate::convert::type_name;
use crate::error::{Error, Result};

/// Which dict a message is about.
#[derive(Clone, Copy)]
pub(crate) enum Which {
    Cuda,
    Array,
}

impl Which {
    fn name(self) -> &'static str {
        match self {
            Which::Cuda => "__cuda_array_interface__",
            Which::Array => "__array_interface__",
        }
    }
}

fn bad(which: Which, key: &'static str, expected: &'static str, found: String) -> Error {
    Error::InterfaceKey {
        interface: which.name(),
        key,
        expected,
        found,
    }
}

fn describe(obj: &Bound<'_, PyAny>) -> String {
    match obj.repr() {
        Ok(r) => {
            let r = r.to_string();
            if r.len() > 80 {
                format!("a {}", type_name(obj))
            } else {
                r
            }
        }
        Err(_) => format!("a {}", type_name(obj)),
    }
}

/// The interface dict itself.
pub(crate) fn as_dict<'py>(which: Which, obj: &Bound<'py, PyAny>) -> Result<Bound<'py, PyDict>> {
    obj.cast::<PyDict>()
        .cloned()
        .map_err(|_| Error::InterfaceNotDict {
            interface: which.name(),
            found: type_name(obj),
        })
}

fn get<'py>(dict: &Bound<'py, PyDict>, key: &str) -> Result<Option<Bound<'py, PyAny>>> {
    Ok(dict.get_item(key)?.filter(|v| !v.is_none()))
}

fn required<'py>(
    which: Which,
    dict: &Bound<'py, PyDict>,
    key: &'static str,
    expected: &'static str,
) -> Result<Bound<'py, PyAny>> {
    get(dict, key)?.ok_or_else(|| Error::MissingKey {
        interface: which.name(),
        key,
        expected,
    })
}

fn ints(which: Which, key: &'static str, obj: &Bound<'_, PyAny>) -> Result<Vec<i64>> {
    let expected = "a tuple of ints";
    let tuple = obj
        .cast::<PyTuple>()
        .map_err(|_| bad(which, key, expected, describe(obj)))?;
    tuple
        .iter()
        .map(|v| {
            v.extract::<i64>()
                .map_err(|_| bad(which, key, expected, describe(obj)))
        })
        .collect()
}

fn typestr(which: Which, dict: &Bound<'_, PyDict>) -> Result<TypeStr> {
    let obj = required(which, dict, "typestr", "a typestr like '<f4'")?;
    let s = obj
        .cast::<PyString>()
        .map_err(|_| bad(which, "typestr", "a str like '<f4'", describe(&obj)))?;
    Ok(s.to_cow()?.parse::<TypeStr>()?)
}

fn pointer(which: Which, obj: &Bound<'_, PyAny>) -> Result<DataPointer> {
    let (address, readonly): (usize, bool) = obj
        .extract()
        .map_err(|_| bad(which, "data", "an (int, bool) tuple", describe(obj)))?;
    Ok(DataPointer { address, readonly })
}

fn descr(which: Which, obj: &Bound<'_, PyAny>) -> Result<Vec<DescrField>> {
    let expected = "a list of (name, format[, shape]) tuples";
    let list = obj
        .cast::<PyList>()
        .map_err(|_| bad(which, "descr", expected, describe(obj)))?;
    list.iter()
        .map(|item| {
            let t = item
                .cast::<PyTuple>()
                .map_err(|_| bad(which, "descr", expected, describe(&item)))?;
            if !(2..=3).contains(&t.len()) {
                return Err(bad(which, "descr", expected, describe(&item)));
            }
            // A NumPy `(title, name)` pair is given by its name.
            let name_obj = t.get_item(0)?;
            let name = match name_obj.cast::<PyTuple>() {
                Ok(pair) if pair.len() == 2 => pair.get_item(1)?.str()?.to_string(),
                _ => name_obj.str()?.to_string(),
            };
            let format_obj = t.get_item(1)?;
            let format = if let Ok(s) = format_obj.cast::<PyString>() {
                DescrFormat::TypeStr(s.to_cow()?.parse::<TypeStr>()?)
            } else {
                DescrFormat::Fields(descr(which, &format_obj)?)
            };
            let shape = if t.len() == 3 {
                Some(ints(which, "descr", &t.get_item(2)?)?)
            } else {
                None
            };
            Ok(DescrField {
                name,
                format,
                shape,
            })
        })
        .collect()
}

fn version(which: Which, dict: &Bound<'_, PyDict>) -> Result<i64> {
    match get(dict, "version")? {
        // Version 0 producers may leave it out.
        None => Ok(0),
        Some(v) => v
            .extract::<i64>()
            .map_err(|_| bad(which, "version", "an int", describe(&v))),
    }
}

/// Reads a `__cuda_array_interface__` dict.
pub(crate) fn read_cai(dict: &Bound<'_, PyDict>) -> Result<CudaArrayInterface> {
    let which = Which::Cuda;
    let stream = match get(dict, "stream")? {
        None => None,
        Some(v) => Some(
            v.extract::<i64>()
                .map_err(|_| bad(which, "stream", "None or an int", describe(&v)))?,
        ),
    };
    Ok(CudaArrayInterface {
        shape: ints(
            which,
            "shape",
            &required(which, dict, "shape", "a tuple of ints")?,
        )?,
        typestr: typestr(which, dict)?,
        data: pointer(
            which,
            &required(which, dict, "data", "an (int, bool) tuple")?,
        )?,
        strides: get(dict, "strides")?
            .map(|s| ints(which, "strides", &s))
            .transpose()?,
        descr: get(dict, "descr")?.map(|d| descr(which, &d)).transpose()?,
        mask: get(dict, "mask")?.is_some(),
        version: version(which, dict)?,
        stream,
    })
}

/// What `data` of an `__array_interface__` names, before the buffer form is resolved.
pub(crate) enum ArrayDataSource<'py> {
    Pointer(DataPointer),
    /// The buffer of this object (the dict's owner when `data` is `None` or absent).
    Buffer(Option<Bound<'py, PyAny>>),
}

/// Reads an `__array_interface__` dict; the buffer form comes back unresolved, with an
/// empty region the caller replaces.
pub(crate) fn read_array<'py>(
    dict: &Bound<'py, PyDict>,
) -> Result<(ArrayInterface, ArrayDataSource<'py>)> {
    let which = Which::Array;
    let source = match get(dict, "data")? {
        None => ArrayDataSource::Buffer(None),
        Some(d) if d.cast::<PyTuple>().is_ok() => ArrayDataSource::Pointer(pointer(which, &d)?),
        Some(d) => ArrayDataSource::Buffer(Some(d)),
    };
    let data = match &source {
        ArrayDataSource::Pointer(p) => ArrayData::Pointer(*p),
        ArrayDataSource::Buffer(_) => ArrayData::Buffer(tensorbridge_cai::BufferRegion {
            address: 0,
            len: 0,
            readonly: true,
        }),
    };
    let offset = match get(dict, "offset")? {
        None => 0,
        Some(v) => v
            .extract::<i64>()
            .map_err(|_| bad(which, "offset", "an int", describe(&v)))?,
    };
    let ai = ArrayInterface {
        shape: ints(
            which,
            "shape",
            &required(which, dict, "shape", "a tuple of ints")?,
        )?,
        typestr: typestr(which, dict)?,
        data,
        strides: get(dict, "strides")?
            .map(|s| ints(which, "strides", &s))
            .transpose()?,
        descr: get(dict, "descr")?.map(|d| descr(which, &d)).transpose()?,
        mask: get(dict, "mask")?.is_some(),
        offset,
        version: version(which, dict)?,
    };
    Ok((ai, source))
}

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
