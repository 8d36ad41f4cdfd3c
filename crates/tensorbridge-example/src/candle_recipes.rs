//! candle recipes (feature `candle-cuda`): candle CUDA tensors to Python frameworks and back,
//! zero-copy, ordered on the GPU (`tests/gpu/test_gpu_candle.py`).
//!
//! - `candle_busy_fill(n, value, busy_ms, own_stream)`: a candle CUDA float32 tensor of `n`
//!   elements that a kernel on candle's stream fills with `value` after spinning `busy_ms`
//!   on the GPU clock, handed to Python as a `tensorbridge.View` at once (the producer still
//!   busy); candle's default device (the per-thread default stream) or one with a stream of
//!   its own.
//! - `candle_sum(x, ordered)`: the sum, computed by candle, of a float32 CUDA tensor from any
//!   framework, entering candle zero-copy (`export_leaked`: the tensor is kept for the
//!   process's life); candle's stream waits for the tensor's producer unless `ordered` is
//!   false (the control, which reads whatever is there).
//!
//! Building it needs a CUDA toolkit (candle's kernels, `cargo xtask`'s `cuda_toolkit`) and a
//! workspace whose CUDA layer builds under cudarc's `dynamic-linking` (docs/BUILDING.md,
//! "candle").

use candle_core::{DType, Device, Storage, Tensor as Candle};
use cudarc::driver::{DevicePtr, LaunchConfig, PushKernelArg, sys};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

const SPIN_FILL: &str = r#"
extern "C" __global__ void spin_fill(float* out, long long n, float value, long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        out[i] = value;
    }
}"#;

fn runtime(e: impl std::fmt::Display) -> PyErr {
    PyRuntimeError::new_err(e.to_string())
}

/// A float32 candle CUDA tensor filled with `value` by a kernel that first keeps candle's
/// stream busy for `busy_ms`, exported to Python without waiting for it.
#[pyfunction]
fn candle_busy_fill(
    py: Python<'_>,
    n: usize,
    value: f32,
    busy_ms: u64,
    own_stream: bool,
) -> PyResult<Bound<'_, PyAny>> {
    let device = if own_stream {
        Device::new_cuda_with_stream(0)
    } else {
        Device::new_cuda(0)
    }
    .map_err(runtime)?;
    let c = Candle::zeros(n, DType::F32, &device).map_err(runtime)?;
    {
        let (storage, _) = c.storage_and_layout();
        let Storage::Cuda(cuda) = &*storage else {
            return Err(PyValueError::new_err("expected a CUDA tensor"));
        };
        let stream = cuda.device.cuda_stream();
        let slice = cuda.as_cuda_slice::<f32>().map_err(runtime)?;
        let (ptr, _record) = slice.device_ptr(&stream);
        let ctx = stream.context();
        let ptx = cudarc::nvrtc::compile_ptx(SPIN_FILL).map_err(runtime)?;
        let f = ctx
            .load_module(ptx)
            .and_then(|m| m.load_function("spin_fill"))
            .map_err(runtime)?;
        let khz = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CLOCK_RATE)
            .map_err(runtime)? as i64;
        let cycles = khz * busy_ms as i64;
        let n = n as i64;
        let cfg = LaunchConfig {
            grid_dim: (64, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the kernel's signature is (float*, long long, float, long long); it writes
        // the `n` floats of candle's storage, which `c` keeps alive, on candle's stream.
        unsafe {
            stream
                .launch_builder(&f)
                .arg(&ptr)
                .arg(&n)
                .arg(&value)
                .arg(&cycles)
                .launch(cfg)
        }
        .map_err(runtime)?;
    }
    // SAFETY: nothing writes `c`'s storage in place from the host while the tensor lives (the
    // kernel above is device work, which the readiness orders).
    let tensor = unsafe { tensorbridge_candle::import(&c) }.map_err(runtime)?;
    Ok(tensorbridge_pyo3::export(py, tensor)?)
}

/// The sum of a float32 CUDA tensor, computed by candle on memory it shares with `x`.
#[pyfunction]
fn candle_sum(x: &Bound<'_, PyAny>, ordered: bool) -> PyResult<f32> {
    let tensor = tensorbridge_pyo3::import(x)?;
    let tensor = if ordered {
        tensor
    } else {
        // SAFETY: deliberately false, for the control: candle then reads while the producer
        // may still write (a GPU race, no host access).
        unsafe { tensor.with_ready(tensorbridge::Ready::Now) }
    };
    let device = Device::new_cuda_with_stream(0).map_err(runtime)?;
    let c = tensorbridge_candle::export_leaked(&tensor, &device).map_err(runtime)?;
    let sum = c
        .sum_all()
        .and_then(|s| s.to_scalar::<f32>())
        .map_err(runtime)?;
    Ok(sum)
}

/// Adds the candle recipes to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(candle_busy_fill, m)?)?;
    m.add_function(wrap_pyfunction!(candle_sum, m)?)?;
    Ok(())
}
