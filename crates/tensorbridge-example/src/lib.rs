//! `tensorbridge_example`: the extension the cookbook's Rust recipes describe
//! (README.md, "Cookbook"), built so that those recipes are
//! tested (`crates/tensorbridge-python/tests/test_cookbook.py`, `tests/gpu/`).
//!
//! - `total(x)`: the sum of a float32 host tensor from any framework, read in place through
//!   [`TensorArg`] (borrowed for the call).
//! - `ramp(n)`: a cudarc buffer holding `0..n` handed to Python zero-copy as a
//!   `tensorbridge.View`; consumers' streams wait for cudarc's on the GPU.
//! - `axpy(alpha, x, y)`: `y += alpha * x` in place, by our own CUDA kernel (NVRTC), on
//!   PyTorch, CuPy or JAX tensors of any layout, on the producer framework's current stream
//!   ([`tensorbridge_pyo3::kernel_call`]). The README's recipe "Your own CUDA kernel on
//!   PyTorch tensors".
//! - `axpy_ptr(alpha, x_ptr, y_ptr, n, stream)`: the same kernel on contiguous float32
//!   device pointers and a stream handle extracted beforehand, nothing checked or ordered:
//!   the benchmark's floor (`benches/python/compare.py`), not an API to copy.
//! - `nop3(x, y, z)` / `nop3_owned(x, y, z)` / `empty()` / `dlpark_nop3(x, y, z)`: three
//!   tensors of any framework taken as [`TensorArg`] (imported, validated, borrowed for the
//!   call) or as [`AnyTensor`] (owned), and their total element count returned; the same with
//!   no argument; the same three through dlpark 0.10's own PyO3 import. The per-call
//!   benchmark's subjects (`benches/python/compare.py`), next to tvm-ffi's `testing.nop`.
//!
//! `total` and `ramp` return `Result<_, tensorbridge_pyo3::Error>`: every error (the core's,
//! the CUDA layer's, cudarc's, Python's) converts with `?`, and PyO3 raises the Python
//! exception the crate's one mapping picks (`RuntimeError` for the driver, `TypeError`/
//! `ValueError` for bad input).

use cudarc::driver::{LaunchConfig, PushKernelArg};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use tensorbridge_cudarc::KernelLayout;
use tensorbridge_pyo3::{AnyTensor, Error, TensorArg};

/// Sums a float32 host tensor from any framework, without copying it.
#[pyfunction]
fn total(x: TensorArg<'_, '_>) -> Result<f32, Error> {
    Ok(x.as_ref().host_view::<f32>()?.iter().sum())
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
    Ok(tensorbridge_pyo3::export(py, tensor)?)
}

/// `y[i] += alpha * x[i]` for every index `i` of the shape, each layout read through
/// `tb_offset` (`tb_layout` and `tb_offset` are declared by `tensorbridge_cudarc::kernel`).
const AXPY: &str = r#"
extern "C" __global__ void axpy(float alpha, const float* x, tb_layout lx,
                                float* y, tb_layout ly, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[tb_offset(ly, i)] += alpha * x[tb_offset(lx, i)];
}
"#;

/// `y += alpha * x` in place on float32 CUDA tensors of one shape (any strides), from
/// PyTorch, CuPy, JAX...: our kernel, on the framework's current stream.
#[pyfunction]
fn axpy(alpha: f32, x: TensorArg<'_, '_>, y: TensorArg<'_, '_>) -> Result<(), Error> {
    tensorbridge_pyo3::kernel_call(&[&x, &y], |call| {
        call.same_shape(&[&x, &y])?; // ValueError naming both shapes
        let xv = call.input::<f32>(&x)?;
        let mut yv = call.output::<f32>(&y)?; // ValueError if y overlaps x or itself
        let n = yv.numel();
        if n == 0 {
            return Ok(());
        }
        let cfg = LaunchConfig::for_num_elems(u32::try_from(n).map_err(|_| {
            PyValueError::new_err(format!("{n} elements are more than one launch covers"))
        })?);
        let f = call.kernel(AXPY, "axpy")?; // NVRTC at first use, cached per context
        let (lx, ly, n) = (xv.layout()?, yv.layout()?, n as i64);
        // SAFETY: `axpy` takes (float, const float*, tb_layout, float*, tb_layout, long long),
        // reads `x` and writes `y` only at the offsets `tb_offset` gives for `i < n` (the
        // views' elements), and runs on the views' stream.
        unsafe {
            call.stream()
                .launch_builder(&f)
                .arg(&alpha)
                .arg(&xv)
                .arg(&lx)
                .arg(&mut yv)
                .arg(&ly)
                .arg(&n)
                .launch(cfg)
        }?;
        Ok(())
    })
}

/// The same kernel on contiguous float32 memory given as device addresses, `n` elements,
/// on the stream handle `stream` (0 or 1: the legacy default stream) of device 0. Nothing is
/// checked or ordered: the floor `axpy`'s host overhead is measured against.
#[pyfunction]
fn axpy_ptr(alpha: f32, x_ptr: u64, y_ptr: u64, n: i64, stream: usize) -> PyResult<()> {
    let to_py_err = |e: &dyn std::fmt::Display| PyRuntimeError::new_err(e.to_string());
    let stream = tensorbridge_cuda::stream_from_raw(std::ptr::without_provenance_mut(stream));
    let layout = KernelLayout::new(&[n], &[1]).map_err(|e| to_py_err(&e))?;
    let cfg = LaunchConfig::for_num_elems(u32::try_from(n.max(1)).unwrap_or(u32::MAX));
    let body = |s: &std::sync::Arc<cudarc::driver::CudaStream>| -> PyResult<()> {
        let f = tensorbridge_cudarc::kernel(s, AXPY, "axpy").map_err(|e| to_py_err(&e))?;
        // SAFETY: the benchmark passes two live, disjoint allocations of `n` floats on device
        // 0, written by nothing else meanwhile; the kernel's signature as in `axpy`.
        unsafe {
            s.launch_builder(&f)
                .arg(&alpha)
                .arg(&x_ptr)
                .arg(&layout)
                .arg(&y_ptr)
                .arg(&layout)
                .arg(&n)
                .launch(cfg)
        }
        .map_err(|e| to_py_err(&e))?;
        Ok(())
    };
    // SAFETY: the caller (the benchmark) passes a live stream of device 0 that PyTorch keeps.
    unsafe { tensorbridge_cuda::with_stream_raw(0, stream, None, body) }
        .map_err(|e| to_py_err(&e))?
}

/// Takes three tensors from any framework, zero-copy, borrowed for the call, and returns their
/// total element count: what it costs to cross into Rust with three framework tensors.
#[pyfunction]
fn nop3(x: TensorArg<'_, '_>, y: TensorArg<'_, '_>, z: TensorArg<'_, '_>) -> u64 {
    x.descriptor().numel() + y.descriptor().numel() + z.descriptor().numel()
}

/// [`nop3`] with owned tensors ([`AnyTensor`]: each kept by an owner that may outlive the
/// call), for the benchmark's comparison of the two modes.
#[pyfunction]
fn nop3_owned(x: AnyTensor, y: AnyTensor, z: AnyTensor) -> u64 {
    x.0.numel() + y.0.numel() + z.0.numel()
}

/// Nothing: the cost of calling into this extension at all, to take from `nop3`'s.
#[pyfunction]
fn empty() {}

/// `nop3` through dlpark 0.10's own import (its exchange-API path for PyTorch, `__dlpack__`
/// for the others, owning managed tensors), for the side-by-side benchmark.
#[pyfunction]
fn dlpark_nop3(x: &Bound<'_, PyAny>, y: &Bound<'_, PyAny>, z: &Bound<'_, PyAny>) -> PyResult<u64> {
    let mut total = 0u64;
    for obj in [x, y, z] {
        let imported = dlpark::python::from_dlpack(obj.as_borrowed(), None, None)?;
        let tensor = imported
            .validate()
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        total += tensor.num_elements() as u64;
    }
    Ok(total)
}

/// The module.
#[pymodule]
fn tensorbridge_example(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(total, m)?)?;
    m.add_function(wrap_pyfunction!(ramp, m)?)?;
    m.add_function(wrap_pyfunction!(axpy, m)?)?;
    m.add_function(wrap_pyfunction!(axpy_ptr, m)?)?;
    m.add_function(wrap_pyfunction!(nop3, m)?)?;
    m.add_function(wrap_pyfunction!(nop3_owned, m)?)?;
    m.add_function(wrap_pyfunction!(empty, m)?)?;
    m.add_function(wrap_pyfunction!(dlpark_nop3, m)?)?;
    Ok(())
}
