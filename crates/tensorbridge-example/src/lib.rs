//! `tensorbridge_example`: the extension the cookbook's Rust recipes describe
//! (docs/COOKBOOK.md), built so that those recipes are
//! tested (`crates/tensorbridge-python/tests/test_cookbook.py`, `tests/gpu/`).
//!
//! - `total(x)`: the sum of a float32 host tensor from any framework, read in place through
//!   [`TensorArg`] (borrowed for the call).
//! - `ramp(n)`: a cudarc buffer holding `0..n` handed to Python zero-copy as a
//!   `tensorbridge.View`; consumers' streams wait for cudarc's on the GPU.
//! - `axpy(alpha, x, y)`: `y += alpha * x` in place, by our own CUDA kernel (NVRTC), on
//!   PyTorch, CuPy or JAX tensors of any layout, on the producer framework's current stream
//!   ([`tensorbridge_pyo3::kernel_call`]). The cookbook's recipe "Your own CUDA kernel on
//!   PyTorch tensors".
//! - `axpy_on(alpha, x, y, stream)`: the same on a stream the caller chose
//!   ([`tensorbridge_pyo3::kernel_call_on`]).
//! - `axpy_unlaunchable(x, y)`: the same kernel launched with a block no GPU allows, for the
//!   test that a failed launch names its kernel.
//! - `add_transposed(a, b, out)`: `out = a + b.T`, a strided 2-D kernel (a 2-D grid, strides
//!   read from `tb_layout`), the second kernel recipe.
//! - `axpy_ptr(alpha, x_ptr, y_ptr, n, stream)`: the same kernel on contiguous float32
//!   device pointers and a stream handle extracted beforehand, nothing checked or ordered:
//!   the benchmark's floor (`benches/python/compare.py`), not an API to copy.
//! - `nop3(x, y, z)` / `nop3_owned(x, y, z)` / `empty()` / `dlpark_nop3(x, y, z)`: three
//!   tensors of any framework taken as [`TensorArg`] (imported, validated, borrowed for the
//!   call) or as [`AnyTensor`] (owned), and their total element count returned; the same with
//!   no argument; the same three through dlpark 0.10's own PyO3 import. The per-call
//!   benchmark's subjects (`benches/python/compare.py`), next to tvm-ffi's `testing.nop`.
//!
//! - `nd_grid`, `nd_ptr`, `nd_sum`, `nd_scale`: ndarray data to Python frameworks and back,
//!   zero-copy (module `ndarray_recipes`).
//! - `candle_busy_fill`, `candle_sum` (feature `candle-cuda`): candle CUDA tensors to Python
//!   frameworks and back, ordered on the GPU (module `candle_recipes`).
//!
//! `total` and `ramp` return `Result<_, tensorbridge_pyo3::Error>`: every error (the core's,
//! the CUDA layer's, cudarc's, Python's) converts with `?`, and PyO3 raises the Python
//! exception the crate's one mapping picks (`RuntimeError` for the driver, `TypeError`/
//! `ValueError` for bad input).

#[cfg(feature = "candle-cuda")]
mod candle_recipes;
mod ndarray_recipes;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
// The facade's paths, as the cookbook's recipes write them (`tensorbridge = { features =
// ["pyo3"] }`): the adapters and the cudarc they are built with, one dependency line.
use tensorbridge::cudarc::{Kernel, KernelLayout, grid_stride};
use tensorbridge::cudarc_crate::driver::{LaunchConfig, PushKernelArg};
use tensorbridge::pyo3::{AnyTensor, Error, TensorArg};

/// Sums a float32 host tensor from any framework, without copying it.
#[pyfunction]
fn total(x: TensorArg<'_, '_>) -> Result<f32, Error> {
    let view = x.as_ref().host_view::<f32>()?;
    Ok(match view.as_slice() {
        Some(contiguous) => contiguous.iter().sum(), // the fast path: a plain slice
        None => view.iter().sum(),                   // strided, transposed, broadcast
    })
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
/// `tb_offset`, in a grid-stride loop (`tb_layout`, `tb_offset`, `tb_index` and `tb_stride`
/// are declared for every kernel `tensorbridge_cudarc` compiles): right for any element count.
static AXPY: Kernel = Kernel::new(
    r#"
extern "C" __global__ void axpy(float alpha, const float* x, tb_layout lx,
                                float* y, tb_layout ly, long long n) {
    for (long long i = tb_index(); i < n; i += tb_stride())
        y[tb_offset(ly, i)] += alpha * x[tb_offset(lx, i)];
}
"#,
    "axpy",
);

/// The `axpy` recipe launched with 4,096 threads per block, which no GPU allows: the launch
/// fails, and the error names the kernel (`tests/gpu/test_gpu_kernel.py`). A test hook, not
/// a recipe.
#[pyfunction]
fn axpy_unlaunchable(x: TensorArg<'_, '_>, y: TensorArg<'_, '_>) -> Result<(), Error> {
    tensorbridge_pyo3::kernel_call(&[&x, &y], |call| {
        let xv = call.input::<f32>(&x)?;
        let mut yv = call.output::<f32>(&y)?;
        let n = yv.numel();
        let f = call.function(&AXPY)?;
        let (lx, ly) = (xv.layout()?, yv.layout()?);
        let too_wide = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (4096, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: as in `axpy`; the driver refuses the launch before anything runs.
        unsafe {
            call.stream()
                .launch_builder(&f)
                .arg(&1.0f32)
                .arg(&xv)
                .arg(&lx)
                .arg(&mut yv)
                .arg(&ly)
                .arg(&(n as i64))
                .launch(too_wide)
        }?;
        Ok(())
    })
}

/// `y += alpha * x` in place on float32 CUDA tensors of one shape (any strides), from
/// PyTorch, CuPy, JAX...: our kernel, on the framework's current stream.
#[pyfunction]
fn axpy(alpha: f32, x: TensorArg<'_, '_>, y: TensorArg<'_, '_>) -> Result<(), Error> {
    tensorbridge_pyo3::kernel_call(&[&x, &y], |call| {
        call.same_shape(&[&x, &y])?; // ValueError naming both shapes
        let xv = call.input::<f32>(&x)?;
        let mut yv = call.output::<f32>(&y)?; // ValueError if y overlaps x or itself
        let n = yv.numel();
        let f = call.function(&AXPY)?; // NVRTC at first use, kept per context
        let (lx, ly) = (xv.layout()?, yv.layout()?);
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
                .arg(&(n as i64))
                .launch(grid_stride(n))
        }?;
        Ok(())
    })
}

/// [`axpy`] on a stream the caller chose (`stream`: a `torch.cuda.Stream`, a CuPy stream,
/// anything with `__cuda_stream__`, or an int handle), as kernel libraries that take
/// `stream=` do; JAX inputs, whose framework has no current stream, are ordered onto it.
#[pyfunction]
fn axpy_on(
    alpha: f32,
    x: TensorArg<'_, '_>,
    y: TensorArg<'_, '_>,
    stream: &Bound<'_, PyAny>,
) -> Result<(), Error> {
    tensorbridge_pyo3::kernel_call_on(&[&x, &y], stream, |call| {
        call.same_shape(&[&x, &y])?;
        let xv = call.input::<f32>(&x)?;
        let mut yv = call.output::<f32>(&y)?;
        let n = yv.numel();
        let f = call.function(&AXPY)?;
        let (lx, ly) = (xv.layout()?, yv.layout()?);
        // SAFETY: as in `axpy`.
        unsafe {
            call.stream()
                .launch_builder(&f)
                .arg(&alpha)
                .arg(&xv)
                .arg(&lx)
                .arg(&mut yv)
                .arg(&ly)
                .arg(&(n as i64))
                .launch(grid_stride(n))
        }?;
        Ok(())
    })
}

/// The second example kernel: a strided 2-D one. `out[i, j] = a[i, j] + b[j, i]` for 2-D
/// float32 tensors `a` (m x n), `b` (n x m), `out` (m x n) of any strides (a transposed or
/// sliced argument is read in place), one thread per element of a 2-D grid: indices and
/// strides in elements, as `tb_layout` carries them.
static ADD_TRANSPOSED: Kernel = Kernel::new(
    r#"
extern "C" __global__ void add_transposed(const float* a, tb_layout la, const float* b,
                                          tb_layout lb, float* out, tb_layout lo) {
    long long rows = lo.shape[0], cols = lo.shape[1];
    for (long long i = blockIdx.y * (long long)blockDim.y + threadIdx.y; i < rows;
         i += (long long)gridDim.y * blockDim.y)
        for (long long j = blockIdx.x * (long long)blockDim.x + threadIdx.x; j < cols;
             j += (long long)gridDim.x * blockDim.x)
            out[i * lo.strides[0] + j * lo.strides[1]] =
                a[i * la.strides[0] + j * la.strides[1]] + b[j * lb.strides[0] + i * lb.strides[1]];
}
"#,
    "add_transposed",
);

/// `out = a + b.T` for 2-D float32 CUDA tensors (any strides): the strided 2-D recipe.
#[pyfunction]
fn add_transposed(
    a: TensorArg<'_, '_>,
    b: TensorArg<'_, '_>,
    out: TensorArg<'_, '_>,
) -> Result<(), Error> {
    tensorbridge_pyo3::kernel_call(&[&a, &b, &out], |call| {
        let (av, bv) = (call.input::<f32>(&a)?, call.input::<f32>(&b)?);
        let mut ov = call.output::<f32>(&out)?;
        let (sa, sb, so) = (
            av.shape().to_vec(),
            bv.shape().to_vec(),
            ov.shape().to_vec(),
        );
        if so.len() != 2 || sa != so || sb != [so[1], so[0]] {
            let msg = format!(
                "expected a (m, n), b (n, m) and out (m, n); found a {sa:?}, b {sb:?}, out {so:?}"
            );
            return Err(PyValueError::new_err(msg).into());
        }
        let f = call.function(&ADD_TRANSPOSED)?;
        let (la, lb, lo) = (av.layout()?, bv.layout()?, ov.layout()?);
        // 16 x 16 threads per block; grid-stride loops cover any shape.
        let blocks = |n: i64| u32::try_from(((n + 15) / 16).clamp(1, 65535)).unwrap_or(65535);
        let cfg = LaunchConfig {
            grid_dim: (blocks(so[1]), blocks(so[0]), 1),
            block_dim: (16, 16, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: `add_transposed` takes (const float*, tb_layout, const float*, tb_layout,
        // float*, tb_layout); it reads `a` and `b` and writes `out` only at element offsets of
        // their shapes (checked above: out (m, n), a (m, n), b (n, m)), on the views' stream.
        unsafe {
            call.stream()
                .launch_builder(&f)
                .arg(&av)
                .arg(&la)
                .arg(&bv)
                .arg(&lb)
                .arg(&mut ov)
                .arg(&lo)
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
    let cfg = grid_stride(u64::try_from(n.max(0)).unwrap_or(0));
    let body = |s: &std::sync::Arc<cudarc::driver::CudaStream>| -> PyResult<()> {
        let f = AXPY.function(s).map_err(|e| to_py_err(&e))?;
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
    // SAFETY: the caller (the benchmark) passes a live stream of device 0 that PyTorch keeps
    // (a pool or default stream: never destroyed).
    unsafe {
        tensorbridge_cuda::with_stream_raw(0, stream, tensorbridge_cuda::StreamLife::Immortal, body)
    }
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
    m.add_function(wrap_pyfunction!(axpy_on, m)?)?;
    m.add_function(wrap_pyfunction!(axpy_unlaunchable, m)?)?;
    m.add_function(wrap_pyfunction!(add_transposed, m)?)?;
    m.add_function(wrap_pyfunction!(axpy_ptr, m)?)?;
    m.add_function(wrap_pyfunction!(nop3, m)?)?;
    m.add_function(wrap_pyfunction!(nop3_owned, m)?)?;
    m.add_function(wrap_pyfunction!(empty, m)?)?;
    m.add_function(wrap_pyfunction!(dlpark_nop3, m)?)?;
    ndarray_recipes::register(m)?;
    #[cfg(feature = "candle-cuda")]
    candle_recipes::register(m)?;
    Ok(())
}
