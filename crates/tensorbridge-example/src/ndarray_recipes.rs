//! ndarray recipes: Rust `ndarray` data handed to Python frameworks zero-copy, and any
//! framework's host tensor read and written in place as an ndarray view
//! (`tests/test_ndarray.py`).
//!
//! - `nd_grid(rows, cols, reversed)`: a float64 ndarray `Array2` (`10 * i + j`, rows
//!   reversed when asked: negative strides), moved into a `tensorbridge.View` without a copy;
//!   returns the view and the address of its element 0 as Rust saw it.
//! - `nd_ptr(x)`: the address of element 0 of an ndarray view over any framework's float64
//!   host tensor, to compare with the framework's own pointer.
//! - `nd_sum(x)`: its sum, read through the ndarray view.
//! - `nd_scale(x, k)`: `x *= k` in place through a writable ndarray view.

use ndarray::{Array1, Array2, Axis, IxDyn, s};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use tensorbridge_pyo3::{AnyTensor, Error};

/// The ndarray adapter's errors as Python exceptions: the core's through the one mapping of
/// `tensorbridge_pyo3::Error`, the rest (a rank the call does not take) as `ValueError`.
fn nd(e: tensorbridge_ndarray::Error) -> PyErr {
    match e {
        tensorbridge_ndarray::Error::Core(core) => Error::from(core).into(),
        other => PyValueError::new_err(other.to_string()),
    }
}

/// A `rows x cols` float64 array whose first element is 64-byte aligned (JAX shares host
/// memory only at that alignment, and copies otherwise).
fn aligned_grid(rows: usize, cols: usize) -> Array2<f64> {
    let n = rows * cols;
    let v = vec![0.0f64; n + 8];
    let off = (64 - v.as_ptr() as usize % 64) % 64 / 8;
    let mut a = Array1::from_vec(v)
        .slice_move(s![off..off + n])
        .into_shape_with_order((rows, cols))
        .expect("n elements");
    for ((i, j), x) in a.indexed_iter_mut() {
        *x = (10 * i + j) as f64;
    }
    a
}

/// An ndarray `Array2` handed to Python zero-copy, and the address of its element 0.
#[pyfunction]
fn nd_grid(
    py: Python<'_>,
    rows: usize,
    cols: usize,
    reversed: bool,
) -> PyResult<(Bound<'_, PyAny>, usize)> {
    let mut a = aligned_grid(rows, cols);
    if reversed {
        a.invert_axis(Axis(0));
    }
    let first = a.as_ptr() as usize;
    // The array moves into the tensor's owner; the View keeps it alive for every consumer.
    let tensor = tensorbridge_ndarray::import(a).map_err(|e| nd(e.into()))?;
    Ok((tensorbridge_pyo3::export(py, tensor)?, first))
}

/// The address of element 0 of an ndarray view over a float64 host tensor.
#[pyfunction]
fn nd_ptr(x: AnyTensor) -> PyResult<usize> {
    let v = tensorbridge_ndarray::view::<f64, IxDyn>(&x.0).map_err(nd)?;
    Ok(v.as_ptr() as usize)
}

/// The sum of a float64 host tensor, read through an ndarray view.
#[pyfunction]
fn nd_sum(x: AnyTensor) -> PyResult<f64> {
    Ok(tensorbridge_ndarray::view::<f64, IxDyn>(&x.0)
        .map_err(nd)?
        .sum())
}

/// `x *= k` in place, through a writable ndarray view of a float64 host tensor.
#[pyfunction]
fn nd_scale(x: AnyTensor, k: f64) -> PyResult<()> {
    // SAFETY: the view is the only access to the tensor's bytes while it lives: the GIL is
    // held for the whole call (nothing here releases it), so no Python code reads or writes
    // the producer's memory meanwhile, and no other view of this import exists.
    let mut v = unsafe { tensorbridge_ndarray::view_mut::<f64, IxDyn>(&x.0) }.map_err(nd)?;
    v.mapv_inplace(|e| e * k);
    Ok(())
}

/// Adds the ndarray recipes to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(nd_grid, m)?)?;
    m.add_function(wrap_pyfunction!(nd_ptr, m)?)?;
    m.add_function(wrap_pyfunction!(nd_sum, m)?)?;
    m.add_function(wrap_pyfunction!(nd_scale, m)?)?;
    Ok(())
}
