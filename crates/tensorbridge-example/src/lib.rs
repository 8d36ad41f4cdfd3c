//! `tensorbridge_example`: the extension the cookbook's Rust recipes describe
//! (README.md, "Cookbook"), built so that those recipes are
//! tested (`crates/tensorbridge-python/tests/test_cookbook.py`, `tests/gpu/`).
//!
//! - `total(x)`: the sum of a float32 host tensor from any framework, read in place through
//!   [`AnyTensor`].
//! - `ramp(n)`: a cudarc buffer holding `0..n` handed to Python zero-copy as a
//!   `tensorbridge.View`; consumers' streams wait for cudarc's on the GPU.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use tensorbridge_pyo3::AnyTensor;

/// Sums a float32 host tensor from any framework, without copying it.
#[pyfunction]
fn total(x: AnyTensor) -> PyResult<f32> {
    let view =
        x.0.host_view::<f32>()
            .map_err(tensorbridge_pyo3::Error::from)?;
    Ok(view.iter().sum())
}

/// `0.0, 1.0, ..., n - 1` in a new cudarc buffer on device 0, as a `tensorbridge.View`.
#[pyfunction]
fn ramp(py: Python<'_>, n: usize) -> PyResult<Bound<'_, PyAny>> {
    let to_py_err = |e: &dyn std::fmt::Display| PyRuntimeError::new_err(e.to_string());
    // Not `CudaContext::new`: without libcuda that panics, this is an error.
    let ctx = tensorbridge_cuda::primary_context(0).map_err(|e| to_py_err(&e))?;
    let stream = ctx.new_stream().map_err(|e| to_py_err(&e))?;
    let host: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let slice = stream.clone_htod(&host).map_err(|e| to_py_err(&e))?;
    // Zero-copy: the slice moves into the tensor's owner; its stream is where the data is
    // ready, and the owner keeps that stream alive.
    let tensor = tensorbridge_cudarc::import(slice).map_err(|e| to_py_err(e.error()))?;
    tensorbridge_pyo3::export(py, tensor)
}

/// The module.
#[pymodule]
fn tensorbridge_example(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(total, m)?)?;
    m.add_function(wrap_pyfunction!(ramp, m)?)?;
    Ok(())
}
