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

/// Real memory with every alignment a dtype can ask for: where the array interface dict points
/// a zero-size array whose data pointer is null. Nothing reads or writes it (the array has no
/// element).
#[repr(align(64))]
struct EmptyTarget([u8; 64]);

static EMPTY_TARGET: EmptyTarget = EmptyTarget([0; 64]);

/// The address a NumPy consumer is given for an array of `shape` at `address`: `address`, or,
/// for a zero-size array at the null address, [`EMPTY_TARGET`]'s. NumPy before 2.4 reads `data: (0, ...)` as "no data" and takes
/// the object for a scalar (NumPy 2.4 no longer does), so `np.asarray` of the view of
/// an empty PyTorch tensor (PyTorch gives empty tensors a null pointer) raised `TypeError`
/// there. The Rust [`ArrayInterface`] keeps the tensor's own address; only the dict, which is
/// what NumPy reads, carries the stand-in. The CUDA Array Interface keeps its rule (0 for
/// zero-size arrays), which its consumers expect.
fn numpy_address(shape: &[i64], address: usize) -> usize {
    if address == 0 && shape.contains(&0) {
        EMPTY_TARGET.0.as_ptr() as usize
    } else {
        address
    }
}

/// The dict of an array interface export (pointer form; never a null pointer, see
/// [`numpy_address`]).
pub(crate) fn array_to_py<'py>(
    py: Python<'py>,
    ai: &ArrayInterface,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("shape", PyTuple::new(py, &ai.shape)?)?;
    d.set_item("typestr", ai.typestr.to_string())?;
    if let ArrayData::Pointer(p) = ai.data {
        d.set_item("data", (numpy_address(&ai.shape, p.address), p.readonly))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numpy_is_never_given_a_null_pointer() {
        // Zero-size at the null address (an empty PyTorch tensor): one non-null address
        // that every dtype's alignment divides, for every shape.
        let stand_in = numpy_address(&[0], 0);
        assert_ne!(stand_in, 0);
        assert_eq!(stand_in % 64, 0);
        for shape in [&[3, 0][..], &[0, 2, 5], &[1, 0]] {
            assert_eq!(numpy_address(shape, 0), stand_in);
        }
        // Anything else keeps its own address: zero-size elsewhere, and every array with
        // elements (a rank-0 array has one).
        for (shape, address) in [(&[0][..], 0x7000), (&[2][..], 0x7000), (&[][..], 0x40)] {
            assert_eq!(numpy_address(shape, address), address);
        }
    }
}
