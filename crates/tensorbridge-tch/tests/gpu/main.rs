//! GPU tests of tensorbridge-tch: compiled only with the `gpu-tests` feature, run by
//! `cargo xtask test-gpu` (here, or from its bundle on a GPU machine). They expect an NVIDIA
//! GPU, its driver and a CUDA build of libtorch, and fail, rather than skip, without them.
//! One module per area; the helpers they share are below.
//!
//! Every test holds [`serial`] for its whole run: the hand-off tests time the host and the
//! device, and other tests' kernels running at the same time would blur what they measure.
//!
//! libtorch's current stream is its default stream, the legacy default stream (null): tch has
//! no stream API. The tests launch "libtorch-side" kernels on cudarc's handle of that stream
//! ([`cudarc::driver::CudaContext::default_stream`]), which is the same stream.

// Tests fail through assertions; `Result` only carries errors out with their context.
#![allow(clippy::panic_in_result_fn)]

mod handoff;
mod release;
mod roundtrip;

use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use anyhow::{Context as _, Result, ensure};
use cudarc::driver::{CudaContext, CudaFunction, CudaStream, LaunchConfig, PushKernelArg, sys};
use cudarc::nvrtc::Ptx;

/// The crate's `from_tch`, for tests that never resize the storage of a tensor they import
/// while the import lives (its safety obligation). The tests about resizing (`pinning`) call
/// the crate's function themselves.
fn from_tch(t: &tch::Tensor) -> Result<tensorbridge::Tensor, tensorbridge_tch::Error> {
    // SAFETY: no test that calls this resizes the imported storage (see above).
    unsafe { tensorbridge_tch::from_tch(t) }
}

/// One test at a time (see the module docs).
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Device `ordinal`'s primary context, after checking that libcuda loads (cudarc panics
/// otherwise) and that libtorch sees CUDA (it does not when the link dropped
/// `libtorch_cuda.so`: BUILD.md gotcha 3).
fn context(ordinal: usize) -> Result<Arc<CudaContext>> {
    ensure!(
        tensorbridge_cuda::driver_present(),
        "libcuda not found: the gpu-tests feature expects an NVIDIA GPU and driver \
         (LD_LIBRARY_PATH={:?})",
        std::env::var("LD_LIBRARY_PATH").unwrap_or_default()
    );
    ensure!(
        tch::Cuda::is_available(),
        "libtorch sees no CUDA device although libcuda loads: is libtorch_cuda.so linked \
         (--no-as-needed -ltorch) and a CUDA build of libtorch on the library path?"
    );
    CudaContext::new(ordinal)
        .with_context(|| format!("creating a CUDA context on device {ordinal}"))
}

/// The test kernel (NVRTC, compiled once per process).
const KERNELS: &str = r#"
__device__ unsigned long long now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// After `spin_ns` nanoseconds (thread 0 of each block spins, then the block goes on):
// dst[i] = (src ? src[i] : i) * scale + offset, grid-stride.
extern "C" __global__ void spin_affine(const float* src, float* dst, unsigned long long n,
                                       float scale, float offset, unsigned long long spin_ns) {
    if (spin_ns > 0) {
        if (threadIdx.x == 0) {
            unsigned long long start = now_ns();
            while (now_ns() - start < spin_ns) { }
        }
        __syncthreads();
    }
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        float v = src ? src[i] : (float)i;
        dst[i] = v * scale + offset;
    }
}
"#;

/// The kernel of [`KERNELS`], loaded into one context.
struct Kernels {
    spin_affine: CudaFunction,
}

impl Kernels {
    fn load(ctx: &Arc<CudaContext>) -> Result<Kernels> {
        static PTX: OnceLock<Result<Ptx, String>> = OnceLock::new();
        let ptx = PTX
            .get_or_init(|| cudarc::nvrtc::compile_ptx(KERNELS).map_err(|e| format!("{e:?}")))
            .clone()
            .map_err(|e| anyhow::anyhow!("NVRTC could not compile the test kernel: {e}"))?;
        let module = ctx.load_module(ptx).context("loading the test kernel")?;
        Ok(Kernels {
            spin_affine: module.load_function("spin_affine")?,
        })
    }
}

/// 64 blocks of 256 threads, grid-stride: every block is resident at once on an H100/H200,
/// so a spinning kernel takes its spin time once and leaves SMs for other streams.
fn grid() -> LaunchConfig {
    LaunchConfig {
        grid_dim: (64, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// `dst[i] = (src ? src[i] : i) * scale + offset`, after `spin_ns` nanoseconds.
#[derive(Clone, Copy, Debug)]
struct Affine {
    /// Device pointer of `n` floats, or 0 for `i` itself.
    src: u64,
    dst: u64,
    n: usize,
    scale: f32,
    offset: f32,
    spin_ns: u64,
}

impl Affine {
    /// `dst[i] = i * scale + offset`, at once.
    fn fill(dst: u64, n: usize, scale: f32, offset: f32) -> Affine {
        Affine {
            src: 0,
            dst,
            n,
            scale,
            offset,
            spin_ns: 0,
        }
    }

    /// `dst[i] = src[i]`, at once.
    fn copy(src: u64, dst: u64, n: usize) -> Affine {
        Affine {
            src,
            dst,
            n,
            scale: 1.0,
            offset: 0.0,
            spin_ns: 0,
        }
    }

    /// The same, after spinning `spin_ns` nanoseconds on the device.
    fn after(self, spin_ns: u64) -> Affine {
        Affine { spin_ns, ..self }
    }

    /// Launches it on `stream` with raw pointers: nothing orders it but the streams.
    fn launch(self, k: &Kernels, stream: &Arc<CudaStream>) -> Result<()> {
        let n = self.n as u64;
        // SAFETY: `spin_affine(const float*, float*, u64, float, float, u64)`; `src` (or
        // null) and `dst` hold `n` floats that the caller keeps alive until it has
        // synchronized `stream`.
        unsafe {
            stream
                .launch_builder(&k.spin_affine)
                .arg(&self.src)
                .arg(&self.dst)
                .arg(&n)
                .arg(&self.scale)
                .arg(&self.offset)
                .arg(&self.spin_ns)
                .launch(grid())
        }?;
        Ok(())
    }
}

/// `i * scale + offset` for `i` in `0..n`: the values the kernel writes (never all zero).
fn affine(n: usize, scale: f32, offset: f32) -> Vec<f32> {
    (0..n).map(|i| i as f32 * scale + offset).collect()
}

/// How many of `found` differ, bit for bit, from `expected`.
fn wrong(found: &[f32], expected: &[f32]) -> usize {
    assert_eq!(found.len(), expected.len(), "lengths");
    found
        .iter()
        .zip(expected)
        .filter(|(f, e)| f.to_bits() != e.to_bits())
        .count()
}

/// A tensor's values in row-major order, copied to the host by libtorch (on its current
/// stream, which it then synchronises).
fn torch_values(t: &tch::Tensor) -> Vec<f32> {
    let n = t.numel();
    let mut out = vec![0.0f32; n];
    t.copy_data(&mut out, n);
    out
}

/// A timing-enabled event recorded on `stream` now.
fn timing_event(stream: &CudaStream) -> Result<cudarc::driver::CudaEvent> {
    Ok(stream.record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))?)
}
