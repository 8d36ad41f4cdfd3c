//! candle recipes (feature `candle-cuda`): candle CUDA tensors to Python frameworks and back,
//! zero-copy, ordered on the GPU (`tests/gpu/test_gpu_candle.py`).
//!
//! - `candle_busy_fill(n, value, busy_ms, own_stream)`: a candle CUDA float32 tensor of `n`
//!   elements that a kernel on candle's stream fills with `value` after spinning `busy_ms`
//!   on the GPU's clock, handed to Python as a `tensorbridge.View` at once (the producer still
//!   busy); candle's default device (the calling thread's per-thread default stream) or one
//!   with a stream of its own.
//! - `candle_sum(x, ordered)`: the sum, computed by candle, of a float32 CUDA tensor from any
//!   framework, entering candle zero-copy (`export_leaked`: the tensor is kept for the
//!   process's life); candle's stream waits for the tensor's producer unless `ordered` is
//!   false (the control, which reads whatever is there).
//!
//! Both use one candle device of each kind per process, made at first use: making one (a
//! cuBLAS handle, a cuRAND generator, candle's kernels loaded as they are first used) costs
//! milliseconds of host time, which would hide in the host time the tests measure.
//!
//! Building it needs a CUDA toolkit: candle's kernels are compiled with nvcc, and candle-core
//! links the CUDA libraries (cudarc's `dynamic-linking`, which the workspace's cudarc takes
//! instead of loading: docs/BUILDING.md, "candle"). `cargo xtask test-gpu --bundle` builds
//! this wheel with `cargo xtask`'s toolkit.

use std::sync::{Mutex, PoisonError};

use candle_core::{DType, Device, Storage, Tensor as Candle};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use tensorbridge::cudarc::{Kernel, grid_stride};
use tensorbridge::cudarc_crate::driver::{DevicePtr, PushKernelArg};
use tensorbridge::pyo3::Error;

/// After `spin_ns` nanoseconds of the GPU's global timer (thread 0 of each block spins, then
/// the block goes on): `out[i] = value` for every `i < n`, grid-stride.
static SPIN_FILL: Kernel = Kernel::new(
    r#"
extern "C" __global__ void spin_fill(float* out, long long n, float value,
                                     unsigned long long spin_ns) {
    if (threadIdx.x == 0) {
        unsigned long long start, now;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
        do {
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
        } while (now - start < spin_ns);
    }
    __syncthreads();
    for (long long i = tb_index(); i < n; i += tb_stride())
        out[i] = value;
}
"#,
    "spin_fill",
);

/// candle's devices on GPU 0, made at first use and kept: `[0]` on the per-thread default
/// stream (`Device::new_cuda`), `[1]` with a stream of its own (`new_cuda_with_stream`).
static DEVICES: Mutex<[Option<Device>; 2]> = Mutex::new([None, None]);

fn device(own_stream: bool) -> PyResult<Device> {
    let mut devices = DEVICES.lock().unwrap_or_else(PoisonError::into_inner);
    let slot = &mut devices[usize::from(own_stream)];
    if let Some(device) = slot {
        return Ok(device.clone());
    }
    let device = if own_stream {
        Device::new_cuda_with_stream(0)
    } else {
        Device::new_cuda(0)
    }
    .map_err(runtime)?;
    *slot = Some(device.clone());
    Ok(device)
}

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
) -> Result<Bound<'_, PyAny>, Error> {
    let device = device(own_stream)?;
    let c = Candle::zeros(n, DType::F32, &device).map_err(runtime)?;
    {
        let (storage, _) = c.storage_and_layout();
        let Storage::Cuda(cuda) = &*storage else {
            return Err(PyValueError::new_err("expected a CUDA tensor").into());
        };
        let stream = cuda.device.cuda_stream();
        let f = SPIN_FILL.function(&stream)?;
        let slice = cuda.as_cuda_slice::<f32>().map_err(runtime)?;
        let (ptr, _record) = slice.device_ptr(&stream);
        let count = n as i64;
        let spin_ns = busy_ms.saturating_mul(1_000_000);
        // SAFETY: the kernel's signature is (float*, long long, float, unsigned long long); it
        // writes the `n` floats of candle's storage, which `c` keeps alive, on candle's
        // stream, the stream candle orders its own work on and the import reports.
        unsafe {
            stream
                .launch_builder(&f)
                .arg(&ptr)
                .arg(&count)
                .arg(&value)
                .arg(&spin_ns)
                .launch(grid_stride(n as u64))
        }
        .map_err(runtime)?;
    }
    // SAFETY: nothing writes `c`'s storage in place from the host while the tensor lives (the
    // kernel above is device work on candle's stream, which the readiness orders).
    let tensor = unsafe { tensorbridge_candle::import(&c) }.map_err(runtime)?;
    Ok(tensorbridge_pyo3::export(py, tensor)?)
}

/// The sum of a float32 CUDA tensor, computed by candle on memory it shares with `x`.
#[pyfunction]
fn candle_sum(x: &Bound<'_, PyAny>, ordered: bool) -> Result<f32, Error> {
    let tensor = tensorbridge_pyo3::import(x)?;
    let tensor = if ordered {
        tensor
    } else {
        // SAFETY: deliberately false, for the control: candle then reads while the producer
        // may still write (a race on the GPU; the host touches nothing).
        unsafe { tensor.with_ready(tensorbridge::Ready::Now) }
    };
    let device = device(true)?;
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
