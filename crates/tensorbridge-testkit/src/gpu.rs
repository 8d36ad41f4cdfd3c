//! GPU test scaffolding the CUDA-aware crates' GPU suites share (feature `cuda`): one test
//! at a time, a device's context with a clear failure when libcuda is missing, test kernels
//! compiled once with NVRTC (a spinning producer that keeps a stream busy for a chosen time,
//! then writes known values), launch and timing helpers, and exact comparisons.
//!
//! A hand-off test built from these: launch `Affine::fill(..).after(spin)` on a producer
//! stream (the data is not there for `spin` nanoseconds), hand the buffer over to a consumer
//! stream through the API under test, read it there, and compare with [`affine`]; the control
//! reads on the consumer without the hand-off and must see the race.

use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use anyhow::{Context as _, Result, ensure};
use cudarc::driver::{CudaContext, CudaFunction, CudaStream, LaunchConfig, PushKernelArg, sys};
use cudarc::nvrtc::Ptx;

/// One test at a time (see the module docs).
pub fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Device `ordinal`'s primary context. Checks for libcuda first: without it cudarc panics on
/// first use with a message that does not say a GPU was expected.
pub fn context(ordinal: usize) -> Result<Arc<CudaContext>> {
    ensure!(
        libcuda_present(),
        "libcuda not found: the gpu-tests feature expects an NVIDIA GPU and driver \
         (LD_LIBRARY_PATH={:?})",
        std::env::var("LD_LIBRARY_PATH").unwrap_or_default()
    );
    CudaContext::new(ordinal)
        .with_context(|| format!("creating a CUDA context on device {ordinal}"))
}

/// Whether the dynamic loader can open libcuda, by names cudarc's loader also tries (as the
/// CUDA layer's `driver_present` does, which this crate cannot use: the CUDA layer's own tests
/// use this crate). Asked of the loader because cudarc's `is_culib_present` exists only when
/// cudarc loads libcuda, not when a build links it.
fn libcuda_present() -> bool {
    ["libcuda.so.1", "libcuda.so"].into_iter().any(|name| {
        // SAFETY: opening libcuda runs its initialisers, as cudarc's first call would; the
        // handle is dropped at once and nothing of the library is called.
        unsafe { libloading::Library::new(name) }.is_ok()
    })
}

/// The test kernels (NVRTC, compiled once per process).
pub const KERNELS: &str = r#"
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

extern "C" __global__ void scale_in_place(float* x, unsigned long long n, float k) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        x[i] *= k;
    }
}

extern "C" __global__ void copy_bytes(const unsigned char* src, unsigned char* dst,
                                      unsigned long long n) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        dst[i] = src[i];
    }
}

// dst (rows x cols, row-major) = src read through element strides (s0, s1) from element 0.
extern "C" __global__ void gather2d(const float* src, long long rows, long long cols,
                                    long long s0, long long s1, float* dst) {
    long long total = rows * cols;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        long long r = i / cols, c = i % cols;
        dst[i] = src[r * s0 + c * s1];
    }
}
"#;

/// The kernels of [`KERNELS`], loaded into one context.
pub struct Kernels {
    /// `spin_affine(src, dst, n, scale, offset, spin_ns)`: see [`Affine`].
    pub spin_affine: CudaFunction,
    /// `scale_in_place(x, n, k)`: `x[i] *= k`.
    pub scale_in_place: CudaFunction,
    /// `copy_bytes(src, dst, n)`: `n` bytes.
    pub copy_bytes: CudaFunction,
    /// `gather2d(src, rows, cols, s0, s1, dst)`: a strided 2-D read into a row-major `dst`.
    pub gather2d: CudaFunction,
}

impl Kernels {
    /// Compiles [`KERNELS`] (once per process) and loads them into `ctx`.
    pub fn load(ctx: &Arc<CudaContext>) -> Result<Kernels> {
        static PTX: OnceLock<Result<Ptx, String>> = OnceLock::new();
        let ptx = PTX
            .get_or_init(|| cudarc::nvrtc::compile_ptx(KERNELS).map_err(|e| format!("{e:?}")))
            .clone()
            .map_err(|e| anyhow::anyhow!("NVRTC could not compile the test kernels: {e}"))?;
        let module = ctx.load_module(ptx).context("loading the test kernels")?;
        Ok(Kernels {
            spin_affine: module.load_function("spin_affine")?,
            scale_in_place: module.load_function("scale_in_place")?,
            copy_bytes: module.load_function("copy_bytes")?,
            gather2d: module.load_function("gather2d")?,
        })
    }
}

/// 64 blocks of 256 threads, grid-stride: every block is resident at once on an H100/H200
/// (132 SMs), so a spinning kernel takes its spin time once and leaves SMs for other streams.
pub fn grid() -> LaunchConfig {
    LaunchConfig {
        grid_dim: (64, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// `dst[i] = (src ? src[i] : i) * scale + offset`, after `spin_ns` nanoseconds.
#[derive(Clone, Copy, Debug)]
pub struct Affine {
    /// Device pointer of `n` floats, or 0 for `i` itself.
    pub src: u64,
    /// Device pointer of `n` floats.
    pub dst: u64,
    /// Element count.
    pub n: usize,
    /// Factor.
    pub scale: f32,
    /// Addend.
    pub offset: f32,
    /// Device-side spin before the writes, in nanoseconds.
    pub spin_ns: u64,
}

impl Affine {
    /// `dst[i] = i * scale + offset`, at once.
    pub fn fill(dst: u64, n: usize, scale: f32, offset: f32) -> Affine {
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
    pub fn copy(src: u64, dst: u64, n: usize) -> Affine {
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
    pub fn after(self, spin_ns: u64) -> Affine {
        Affine { spin_ns, ..self }
    }

    /// Launches it on `stream` with raw pointers: cudarc's event tracking is not involved, so
    /// nothing orders it but the streams.
    pub fn launch(self, k: &Kernels, stream: &Arc<CudaStream>) -> Result<()> {
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

/// `i * scale + offset` for `i` in `0..n`: the values the kernels write (never all zero).
pub fn affine(n: usize, scale: f32, offset: f32) -> Vec<f32> {
    (0..n).map(|i| i as f32 * scale + offset).collect()
}

/// Bit-for-bit equality, naming the first element that differs.
pub fn assert_exact(found: &[f32], expected: &[f32], what: &str) {
    assert_eq!(found.len(), expected.len(), "{what}: length");
    if let Some(i) = (0..found.len()).find(|&i| found[i].to_bits() != expected[i].to_bits()) {
        panic!(
            "{what}: element {i} is {} but {} was expected",
            found[i], expected[i]
        );
    }
}

/// A timing-enabled event recorded on `stream` now.
pub fn timing_event(stream: &CudaStream) -> Result<cudarc::driver::CudaEvent> {
    Ok(stream.record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))?)
}

/// Polls `done` every millisecond until it is true or `timeout` has passed; how long it took
/// (`None`: never). For releases that happen on another thread, a bounded time after an
/// event.
pub fn wait_until(
    timeout: std::time::Duration,
    done: impl Fn() -> bool,
) -> Option<std::time::Duration> {
    let start = std::time::Instant::now();
    loop {
        if done() {
            return Some(start.elapsed());
        }
        if start.elapsed() > timeout {
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// How many of `found` differ, bit for bit, from `expected`.
pub fn wrong(found: &[f32], expected: &[f32]) -> usize {
    assert_eq!(found.len(), expected.len(), "lengths");
    found
        .iter()
        .zip(expected)
        .filter(|(f, e)| f.to_bits() != e.to_bits())
        .count()
}
