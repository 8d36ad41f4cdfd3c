//! `tensorbridge_example`: the extension the cookbook's Rust recipes describe
//! (`crates/tensorbridge-python/examples/COOKBOOK.md`), built so that those recipes are
//! tested (`crates/tensorbridge-python/tests/test_cookbook.py`, `tests/gpu/`).
//!
//! - `total(x)`: the sum of a float32 host tensor from any framework, read in place through
//!   [`AnyTensor`].
//! - `ramp(n)`: a cudarc buffer holding `0..n` handed to Python zero-copy as a
//!   `tensorbridge.View`; consumers' streams wait for cudarc's on the GPU.
//!
//! Both return `Result<_, tensorbridge_pyo3::Error>`: every error (the core's, the CUDA
//! layer's, cudarc's, Python's) converts with `?`, and PyO3 raises the Python exception the
//! crate's one mapping picks (`RuntimeError` for the driver, `TypeError`/`ValueError` for bad
//! input).

use pyo3::prelude::*;
use tensorbridge_pyo3::{AnyTensor, Error};

/// Sums a float32 host tensor from any framework, without copying it.
#[pyfunction]
fn total(x: AnyTensor) -> Result<f32, Error> {
    Ok(x.0.host_view::<f32>()?.iter().sum())
}

/// `0.0, 1.0, ..., n - 1` in a new cudarc buffer on device 0, as a `tensorbridge.View`.
#[pyfunction]
fn ramp(py: Python<'_>, n: usize) -> Result<Bound<'_, PyAny>, Error> {
    // Not `CudaContext::new`: without libcuda that panics, this is an error.
    let ctx = tensorbridge_cuda::primary_context(0)?;
    let stream = ctx.new_stream()?;
    let host: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let slice = stream.clone_htod(&host)?;
    // Zero-copy: the slice moves into the tensor's owner; its stream is where the data is
    // ready, and the owner keeps that stream alive.
    let tensor = tensorbridge_cudarc::import(slice)?;
    Ok(tensorbridge_pyo3::into_py(py, tensor)?)
}

/// The module.
#[pymodule]
fn tensorbridge_example(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(total, m)?)?;
    m.add_function(wrap_pyfunction!(ramp, m)?)?;
    Ok(())
}
